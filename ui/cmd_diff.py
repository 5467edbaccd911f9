"""`specscope diff A B`: where two traces of the same workload first diverge, and the acceptance of each."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

# Run settings that make the workload: the requests served (their prompts, arrivals, lengths) and the models that
# serve them. Engine settings (batch size, K, graphs, plan stream, faults, temperature) are what a diff compares.
WORKLOAD_KEYS = ("seed", "num_requests", "max_new_tokens", "prompt_len", "arrival_gap", "ignore_eos")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `diff`."""
    p = subparsers.add_parser(
        "diff", help="first diverging step of two traces of the same workload",
        description="Pair the steps of two traces of the same workload (e.g. a run with --inject against the "
                    "clean run) and report the first step whose metadata, tokens or acceptance differ, what "
                    "differs there, and the acceptance of each overall. Traces of different workloads (models, "
                    "seed, requests, prompts) are compared all the same, with a warning. Exit 0 when nothing "
                    "differs, 1 when they diverge, 2 for unusable input.")
    p.add_argument("a", metavar="A", help="trace (.db) or bundle (.zip), e.g. the fault run")
    p.add_argument("b", metavar="B", help="trace (.db) or bundle (.zip), e.g. the clean run")
    p.add_argument("--json", action="store_true",
                   help="print the report as JSON (workload_differences lists what makes the workloads differ)")
    p.set_defaults(run=run)


def workload_differences(ra: Any, rb: Any) -> list[str]:
    """What makes the two traces' workloads differ (models, workload settings, the prompts served); [] when the
    same. Settings only one of the runs recorded (an SGLang trace has no seed) are not compared."""
    out: list[str] = []
    a, b = ra.run, rb.run
    if a.target_model != b.target_model:
        out.append(f"target model {a.target_model} vs {b.target_model}")
    if (a.draft_model or None) != (b.draft_model or None):
        out.append(f"draft model {a.draft_model or '-'} vs {b.draft_model or '-'}")
    for k in WORKLOAD_KEYS:
        if k in a.config and k in b.config and a.config[k] != b.config[k]:
            out.append(f"{k} {_show(a.config[k])} vs {_show(b.config[k])}")
    pa = {r.request_id: tuple(r.prompt_tokens) for r in ra.requests()}
    pb = {r.request_id: tuple(r.prompt_tokens) for r in rb.requests()}
    common = sorted(set(pa) & set(pb))
    differ = [i for i in common if pa[i] != pb[i]]
    if differ:
        out.append(f"prompts of {len(differ)} of {len(common)} requests (first: request {differ[0]})")
    return out


def _show(v: Any) -> str:
    return ",".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)


def run(args: argparse.Namespace) -> int:
    """Diff the two traces."""
    from specscope.tracer.bundle_file import open_trace_or_bundle
    from specscope.tracer.diff import diff_traces, format_report
    from specscope.tracer.store import TraceReader

    with open_trace_or_bundle(args.a) as pa, open_trace_or_bundle(args.b) as pb, \
            TraceReader(pa) as ra, TraceReader(pb) as rb:
        rep = diff_traces(ra, rb)
        workload = workload_differences(ra, rb)
    rep.a, rep.b = args.a, args.b
    if workload:
        print(f"specscope: warning: {args.a} and {args.b} are not the same workload ({'; '.join(workload)}): "
              "their steps pair by position, so differences may say nothing about a bug", file=sys.stderr)
    if args.json:
        d = rep.to_dict()
        d["workload_differences"] = workload
        json.dump(d, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_report(rep))
    differ = rep.first is not None or rep.outputs.get("differing") or rep.a_steps != rep.b_steps
    return 1 if differ else 0
