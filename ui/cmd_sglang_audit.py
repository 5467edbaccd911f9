"""`specscope sglang-audit`: would an SGLang server raise at its first verify with the overlap plan stream on?

Reads SGLang's source statically (the installed package, `--sglang DIR|WHEEL`, or `--version X` from the wheel
cache) and reports every `AttentionBackend` subclass with where `update_verify_buffers_to_fill_after_draft`
resolves, the registered backend names, the call sites; given server arguments, where the verify's call lands
through the wrappers and whether it raises. Exit 0: safe; 1: would raise; 2: the input cannot be read or judged.
Server arguments may be given as flags here or as a whole launch command after `--`:

    specscope sglang-audit --plan-stream --prefill-attention-backend fa3 --decode-attention-backend trtllm_mha
    specscope sglang-audit --version 0.5.23 -- SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1 python -m sglang.launch_server ...
"""

from __future__ import annotations

import argparse
import sys

from specscope.tracer import user_env

PLAN_ENV = user_env.SGLANG_PLAN_STREAM
EXIT_UNREADABLE = 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `sglang-audit`."""
    p = subparsers.add_parser(
        "sglang-audit", help="will SGLang's plan-stream fix-up hook raise on this server? (static, no torch)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_argument_group("the SGLang to read (default: the sglang installed here)")
    src.add_argument("--sglang", metavar="DIR|WHEEL",
                     help="an sglang package folder, a folder holding one (site-packages, an unpacked wheel) or a "
                          ".whl file")
    src.add_argument("--version", dest="sglang_version", metavar="X",
                     help="release X: its wheel from $SPECSCOPE_SGLANG_WHEELS or .sglang-wheels/ "
                          "(.ci/sglang-wheels.sh fills it), else the installed sglang if it is X")
    srv = p.add_argument_group("server arguments (as for python -m sglang.launch_server)")
    for flag in ("--attention-backend", "--prefill-attention-backend", "--decode-attention-backend",
                 "--speculative-attention-mode", "--speculative-algorithm"):
        srv.add_argument(flag, metavar="X", default=None)
    srv.add_argument("--disable-overlap-schedule", action="store_true", default=None)
    srv.add_argument("--enable-multi-layer-eagle", action="store_true", default=None)
    plan = srv.add_mutually_exclusive_group()
    plan.add_argument("--plan-stream", dest="plan_stream", action="store_true", default=None,
                      help=f"judge with {PLAN_ENV}=1 (default: the variable as set in this environment)")
    plan.add_argument("--no-plan-stream", dest="plan_stream", action="store_false", help=f"judge with {PLAN_ENV}=0")
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print the whole audit as JSON")
    out.add_argument("-q", "--quiet", action="store_true",
                     help="text: the counts and the verdict only (no class table, registry, call sites)")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                   help="a launch command (env assignments, python -m sglang.launch_server and its flags); the "
                        "flags above are picked out of it, the rest is ignored")
    p.set_defaults(run=run)


def _error(msg: str) -> None:
    print(f"specscope: error: {' '.join(msg.split())}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Audit the SGLang source; print the report; exit 0 safe, 1 would raise, 2 unreadable or undecidable."""
    import json

    from specscope.integrations.sglang_audit import load
    from specscope.integrations.sglang_audit_args import SERVER_ARGS, parse_server_command
    from specscope.integrations.sglang_audit_report import report_json, report_text
    from specscope.integrations.sglang_audit_source import AuditInputError
    from specscope.integrations.sglang_audit_verdict import EXIT_SAFE, judge

    if args.sglang and args.sglang_version:
        _error("--sglang and --version name the source twice: give one")
        return EXIT_UNREADABLE
    tokens = list(args.command or [])
    if tokens and tokens[0] == "--":
        tokens = tokens[1:]
    try:
        cfg = parse_server_command(tokens)
        for key in SERVER_ARGS:
            v = getattr(args, key, None)
            if v is not None:
                setattr(cfg, key, v)
        if args.plan_stream is not None:
            cfg.plan_stream = "1" if args.plan_stream else "0"
        elif cfg.plan_stream is None:
            cfg.plan_stream = user_env.get(PLAN_ENV)
        audit = load(args.sglang, args.sglang_version)
        asked = any(getattr(cfg, k) is not None for k in SERVER_ARGS)
        verdict = judge(audit, cfg) if asked else None
        if args.json:
            data = report_json(audit, verdict)
        else:
            lines = report_text(audit, verdict, full=not args.quiet)
    except AuditInputError as e:
        _error(str(e))
        return EXIT_UNREADABLE
    if args.json:
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    else:
        sys.stdout.write("\n".join(lines) + "\n")
    return verdict.exit_code if verdict is not None else EXIT_SAFE
