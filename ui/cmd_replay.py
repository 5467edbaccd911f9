"""`specscope replay TRACE|BUNDLE --step N`: re-run a recorded attention call through the kernel and the reference."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from .args import add_step, conflict, real

if TYPE_CHECKING:  # annotations only: run() imports the engine's modules itself, once its flags are checked
    from specscope.backend.replay import HeadDiff, ReplayResult
    from specscope.tracer.schema import RunInfo, Step

EXIT_AGREE, EXIT_DISAGREE, EXIT_UNUSABLE = 0, 1, 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `replay`."""
    p = subparsers.add_parser(
        "replay", help="re-run a recorded attention call: kernel vs reference",
        description="Rebuild layer 0's attention call of a step recorded with --record-attention (q, the KV pages "
                    "it read, the metadata it was handed), run the same kernel entry point on --device and the "
                    "pure-torch reference, and print max abs / relative difference per request and head. Exit 0 "
                    "when everything agrees within tolerance, 1 when not, 2 for unusable input.")
    p.add_argument("trace", metavar="TRACE|BUNDLE", help="trace file (.db) or bug-report bundle (.zip)")
    add_step(p, "step index (as `specscope info` lists)", required=True)
    p.add_argument("--device", default="cpu", help="cpu (reference kernels) or cuda[:i] (the run's flashinfer "
                                                    "kernels, from the trace's attention_kernel) (default: cpu)")
    p.add_argument("--tol", **real(0.0), default=None, metavar="REL",
                   help="relative tolerance, a finite number >= 0 (default: the differential check's)")
    p.add_argument("--json", action="store_true", help="print the result as JSON (every head's differences)")
    p.add_argument("--all-heads", action="store_true", help="print every head (default: the worst head per request)")
    p.set_defaults(run=run)


def _fail(msg: str) -> int:
    print(f"specscope: error: {msg}", file=sys.stderr)
    return EXIT_UNUSABLE


def run(args: argparse.Namespace) -> int:
    """Replay the step; print the comparison table."""
    from specscope.tracer.attention_call import NoRecordedCall, recorded_call
    from specscope.tracer.bundle_file import open_trace_or_bundle
    from specscope.tracer.errors import TraceIndexError
    from specscope.tracer.store import TraceReader

    if args.json and args.all_heads:
        return _fail(conflict("--all-heads", "--json", "the JSON lists every head already"))
    if not (args.device == "cpu" or args.device == "cuda" or args.device.startswith("cuda:")):
        return _fail(f"--device {args.device!r}: expected cpu, cuda or cuda:N")
    with open_trace_or_bundle(args.trace) as path, TraceReader(path) as reader:
        try:
            step = reader.step(args.step)
        except TraceIndexError:
            # By index: a bundle keeps the original run's numbers, so its steps can start late and skip.
            return _fail(f"{args.trace}: has no step {args.step} ({reader.steps_text()}, {reader.num_steps()} in all)")
        try:  # a bundle's delta-coded KV pages resolve through the earlier calls of this reader
            call = recorded_call(step, fetch=reader.kv_base)
        except NoRecordedCall as e:
            return _fail(f"{args.trace}: {e}")
        run_info = reader.run
    try:  # the kernels run in the engine's package (torch); this command only reads the trace and reports
        from specscope.backend.replay import REL_TOL, device_problem, replay
    except ImportError:
        return _fail("replay needs torch: pip install 'specscope[engine]'")
    problem = device_problem(args.device)
    if problem is not None:
        return _fail(problem)
    try:
        res = replay(call, args.device, run_info.attention_kernel, run_info.config.get("dtype"),
                     REL_TOL if args.tol is None else args.tol)
    except ImportError as e:
        return _fail(str(e))
    from specscope.tracer.bundle_file import original_step, read_manifest

    manifest = read_manifest(args.trace)
    orig = None if manifest is None else original_step(manifest, args.step)
    if args.json:
        d = _as_json(res, step)
        d["original_step"] = orig
        json.dump(d, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        text = format_result(res, step, run_info, args.all_heads)
        if manifest is not None and orig is not None:
            text = text.replace("\n", f" — step {orig} of {manifest.get('source_trace')}\n", 1)
        sys.stdout.write(text)
    return EXIT_AGREE if res.agrees else EXIT_DISAGREE


def _as_json(res: ReplayResult, step: Step) -> dict[str, Any]:
    from specscope.tracer.attention_call import COMPARISONS

    return {"step": res.step, "model": step.model, "mode": step.mode.value, "kernel": res.kernel, "device": res.device,
            "entry": res.entry, "args": res.args, "args_recorded": res.args_recorded, "tol": res.tol,
            "agrees": res.agrees, "notes": res.notes,
            "worst": {c: res.worst(c) for c in COMPARISONS},
            "diffs": [d.__dict__ for d in res.diffs]}


def format_result(res: ReplayResult, step: Step, run_info: RunInfo, all_heads: bool = False) -> str:
    """The one-screen replay report."""
    from specscope.tracer.attention_call import COMPARISONS

    lines = [f"step {step.index}: {step.model} {step.mode.value} ({step.graph.value}), bs {step.batch_size} "
             f"padded {step.padded_batch_size}, T {step.tokens_per_request}, K {step.num_draft_tokens}",
             f"recorded on {run_info.device} with {run_info.attention_kernel}; replayed {res.entry} on {res.device} "
             f"with {res.kernel}",
             "kernel arguments (" + ("recorded at the call" if res.args_recorded else "derived from mode and scalars: "
                                     "this trace predates attn_call") + "): "
             + ", ".join(f"{k}={v}" for k, v in res.args.items() if v is not None)]
    for n in res.notes:
        lines.append(f"note: {n}")
    head = f"{'request':>8} {'row':>4} {'head':>4}  " + "  ".join(f"{c:>26}" for c in COMPARISONS)
    lines += ["", "max abs / relative difference (rel = ||a-b|| / ||b|| over the request's tokens)", head]
    by: dict[tuple[int, int, int], dict[str, HeadDiff]] = {}
    for d in res.diffs:
        by.setdefault((d.row, d.request_id, d.head), {})[d.comparison] = d
    rows = sorted(by.items())
    if not all_heads:
        worst: dict[tuple[int, int], tuple[tuple[int, int, int], dict[str, HeadDiff]]] = {}
        for key, cmp in rows:
            score = max(getattr(x, "rel", 0.0) for x in cmp.values())
            k2 = key[:2]
            if k2 not in worst or score > max(getattr(x, "rel", 0.0) for x in worst[k2][1].values()):
                worst[k2] = (key, cmp)
        rows = sorted(worst.values())
    for (row, rid, h), cmp in rows:
        cells = []
        for c in COMPARISONS:
            hd = cmp.get(c)
            if hd is None:
                cells.append(f"{'-':>26}")
                continue
            flag = " !" if hd.rel > res.tol else "  "
            cells.append(f"{hd.max_abs:>11.3g} / {hd.rel:>9.3g}{flag}")
        lines.append(f"{rid:>8} {row:>4} {h if all_heads else str(h) + '*':>4}  " + "  ".join(cells))
    if not all_heads and rows:
        lines.append("(* the worst head of each request; --all-heads prints every head)")
    verdict = "agree" if res.agrees else "DISAGREE"
    worst_s = ", ".join(f"{c} {res.worst(c):.3g}" for c in COMPARISONS)
    lines += ["", f"{verdict} within rel. tolerance {res.tol:g} (worst: {worst_s})"]
    return "\n".join(lines) + "\n"
