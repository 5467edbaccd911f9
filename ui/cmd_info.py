"""`specscope info TRACE`: what a trace holds (run, steps by mode, acceptance, text, violations); for a recorded SGLang
server also its provenance, what its backend does not give the recorder, the features specscope does not model,
and anything the recorder failed to record."""

from __future__ import annotations

import argparse
from typing import Any

from .args import conflict


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the `info` subcommand."""
    p = subparsers.add_parser("info", help="summarize a trace file", description=__doc__)
    p.add_argument("trace", metavar="TRACE", help="trace file (.db) written by `specscope run`")
    p.add_argument("--json", action="store_true", help="print the summary as JSON (every request's prompt tail "
                                                       "and output decoded where a tokenizer is known)")
    p.add_argument("--text", action="store_true",
                   help="also print each request's prompt tail and output as text (--json always holds them)")
    p.add_argument("--no-check", action="store_true",
                   help="do not run the invariant catalogue when the trace holds no verdicts for all its steps "
                        "(info runs it on traces of up to 2,000 steps; verdicts that `run` or `check --write` "
                        "stored are used as they are)")
    p.set_defaults(run=run)


def stored_verdicts_cover(reader: Any) -> bool:
    """Whether the catalogue's stored verdicts (the run's live checker, `check --write`, `upgrade`) reach the
    trace's last step: then `info` reads them instead of running the catalogue again."""
    through = reader.checked_through()
    if through is None:
        return False
    last = next(iter(reader.iter_summaries(backward=True)), None)
    return last is None or through >= last.index


# The run-config keys the SGLang section prints itself (the `config` line would show them as one long dict).
_SGLANG_KEYS = ("sglang", "not_recorded")


def _json_meta(meta: dict[str, str], key: str) -> Any:
    """A JSON meta row; text that is not JSON is kept as it is (said, not lost)."""
    import json

    raw = meta.get(key)
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return {"unreadable": raw}


def sglang_section(run: dict[str, Any], meta: dict[str, str]) -> dict[str, Any] | None:
    """What `info` says about a recorded SGLang server (None for other traces): the run config's `sglang`
    provenance, `not_recorded`, and the unmodelled features, those found after the trace opened included."""
    config = run.get("config") or {}
    if config.get("source") != "sglang":
        return None
    sg = dict(config.get("sglang") or {})
    if not sg:
        sg["provenance"] = "not recorded (a trace from a recorder before provenance was recorded)"
    late = _json_meta(meta, "unmodelled_features")
    if isinstance(late, list):
        sg["unmodelled"] = late
    if config.get("not_recorded"):
        sg["not_recorded"] = config["not_recorded"]
    return sg


def format_sglang(sg: dict[str, Any] | None, problems: Any) -> str:
    """The SGLang and recording-problem lines of the text summary ("" when there are none)."""
    out: list[str] = []
    if sg is not None:
        if "provenance" in sg:
            out.append(f"sglang   provenance {sg['provenance']}")
        else:
            tested = "tested" if sg.get("tested") else (sg.get("untested") or f"untested SGLang {sg.get('version')}")
            out.append(f"sglang   {sg.get('version')} ({tested})   backend {sg.get('backend_file') or '-'}")
            if not sg.get("tested"):
                out.append("         recorded what it could: specscope is not tested against this release")
        if sg.get("server_args"):
            out.append("server   " + "  ".join(f"{k}={v}" for k, v in sg["server_args"].items()))
        if "env" in sg:
            env = sg["env"]
            out.append("env      " + ("  ".join(f"{k}={v}" for k, v in env.items()) if env else
                                      "no SGLang spec-decoding variable set"))
        par = sg.get("parallel")
        if par:
            size = par.get("tp_size", par.get("world_size"))
            out.append(f"rank     tp {par.get('tp_rank')}" + (f" of {size}" if size else "")
                       + (f", pp {par['pp_rank']}" if "pp_rank" in par and par.get("pp_size", 1) > 1 else "")
                       + (f", dp {par['dp_rank']}" if "dp_rank" in par and par.get("dp_size", 1) > 1 else "")
                       + f"   (source: {par.get('source')})")
        if sg.get("kernels"):
            out.append("kernels  " + "  ".join(f"{k} {v}" for k, v in sg["kernels"].items()))
        for f in sg.get("unmodelled") or []:
            out.append(f"unmodelled {f.get('feature')}: {f.get('detail')} (from {f.get('source')})")
        nr = sg.get("not_recorded") or {}
        for name, why in (nr.get("fields") or {}).items():
            out.append(f"not recorded {name}: {why}")
        if nr.get("replay_metadata"):
            out.append(f"not recorded graph replays' metadata: {nr['replay_metadata']} (replay steps hold their "
                       "header, requests and spans)")
    if isinstance(problems, list):
        for p in problems:
            first = p.get("first_step")
            at = f", first at step {first}" if first is not None else ""
            out.append(f"problem  {p.get('what')}: {p.get('count')}x{at}: {p.get('detail')}")
    elif problems is not None:
        out.append(f"problem  recording_problems unreadable: {problems}")
    return "\n".join(out) + "\n" if out else ""


def run(args: argparse.Namespace) -> int:
    """Print the summary of `args.trace`."""
    import json
    import sys

    from specscope.tracer.store import TraceReader
    from specscope.tracer.summary import format_summary, format_texts, summarize
    from specscope.tracer.tokens import tokenizer_for

    if args.json and args.text:
        print("specscope: error: " + conflict("--text", "--json", "the JSON holds every request's prompt tail and "
                                              "output text already (requests[].prompt_tail_text, output_text)"),
              file=sys.stderr)
        return 2
    with TraceReader(args.trace) as reader:
        kind, decode = tokenizer_for(reader.run.target_model)
        stored = stored_verdicts_cover(reader)
        d: dict[str, Any] = summarize(reader, decode=decode, tokenizer=kind,
                                      run_checks=not (args.no_check or stored))
        if stored:  # a clean check stores no rows, only how far it got: its verdicts are the (empty) table
            d["violations_source"] = "trace"
        d["checked_through"] = reader.checked_through()
        meta = reader.meta()
    sg = sglang_section(d["run"], meta)
    if sg is not None:
        d["sglang"] = sg
    problems = _json_meta(meta, "recording_problems")
    if problems is not None:
        d["recording_problems"] = problems
    if args.json:
        sys.stdout.write(json.dumps(d, indent=2, ensure_ascii=False) + "\n")
    else:
        shown = dict(d, run=dict(d["run"], config={k: v for k, v in (d["run"].get("config") or {}).items()
                                                   if k not in _SGLANG_KEYS}))
        text = format_summary(shown)
        extra = format_sglang(sg, problems)
        if extra:
            # After the run's lines (the first blank line), before the steps.
            head, sep, rest = text.partition("\n\n")
            text = head + "\n" + extra.rstrip("\n") + sep + rest
        sys.stdout.write(text + ("\n" + format_texts(d) if args.text else ""))
    return 0
