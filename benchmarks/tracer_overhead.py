"""Tracer overhead on the GPU: iteration time traced / untraced, CUDA graphs and the plan stream on (target <= 1.02),
with torch.profiler (CPU + CUDA activities) on an untraced engine as the anchor.

Each cell (model pair, batch size) builds three engines once (backend/session.py open_session; graph capture
included), sharing one copy of the model weights (benchmarks/engine_speed.py's Bench loads each model once): "off"
(no trace), "on" (specscope's trace into a temporary file, with the live checker), and "profiler" (no trace; each of
its rounds runs under torch.profiler). Then `--rounds` rounds: a round runs one whole workload (every request
arrives at once, fixed length, EOS ignored; the same prompts in every round and arm) on each engine in turn, the
order alternating (off, on, profiler; then profiler, on, off; ...), each run followed by a device synchronize.
Per arm and round: the median wall time of steady iterations (the whole batch decoding, no prefill, the first 3
dropped). The first round of each arm is warm-up and dropped. Per measured round: the ratios on / off and
profiler / off of that round's runs, seconds apart. Per cell: median [min–max] of those round ratios (the verdict
takes the median), the ratio of the arms' medians over all measured rounds, and each arm's median [min–max] wall.
After each traced run its recorder and trace writer are flushed (outside the timed iterations), so the trace's
backlog does not run into the next arm's run; the live checker is a separate process and may still be catching up.

    python benchmarks/tracer_overhead.py                       # tiny and the 8B shape, bs 1/16/64, 15 rounds
    python benchmarks/tracer_overhead.py --quick --rounds 7    # shorter requests, fewer rounds
    python benchmarks/tracer_overhead.py --quick --rounds 9 --no-profiler --ab-ablate floor
                                                               # a second traced engine in the same rounds, recording
                                                               # through the graphs' nodes alone (no host recording)
    python benchmarks/tracer_overhead.py --cpu --quick --models tiny --batch-sizes 1,4 --rounds 5 --out /tmp/t.json
                                                               # a CPU dry run of the harness (numbers meaningless)

Writes benchmarks/results/tracer_overhead.json and .md (GPU, versions, date, command inside) after every cell.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
from engine_speed import Bench, BenchError, Preset, load_torch, presets, steady, summarize, versions  # noqa: E402
from recorder_ablation import LEVELS, recorder_class  # noqa: E402

TARGET = 1.02
ARMS = ("off", "on", "profiler")  # "onB" (--ab-ablate) and --no-profiler change the list per run
WARMUP_ROUNDS = 1  # per arm: the first round is dropped
COMMAND = "benchmarks/tracer_overhead.py"


def order(i: int, arms: tuple[str, ...] = ARMS) -> tuple[str, ...]:
    """The arms' order in round `i`: off, on, profiler, then reversed, alternating (every arm sits at the same
    mean position over two rounds)."""
    return arms if i % 2 == 0 else tuple(reversed(arms))


def cell_config(bench: Bench, p: Preset, bs: int, plan_stream: bool) -> Any:
    """The cell's engine settings: bs requests arriving at once, fixed length (EOS ignored), graphs for bs."""
    from specscope.backend.engine_config import EngineConfig

    return EngineConfig(model=p.model, draft=p.draft, device=bench.device, dtype=bench.dtype, batch_size=bs,
                        num_requests=bs, max_new_tokens=p.new_tokens, spec_steps=bench.spec_steps, page_size=64,
                        cuda_graph=True, plan_stream=plan_stream, seed=0, prompt_len=p.prompt, arrival_gap=(0, 0),
                        ignore_eos=True, graph_batch_sizes=(bs,), fused_ops=bench.ops_setting())


@contextlib.contextmanager
def open_arms(bench: Bench, p: Preset, bs: int, plan_stream: bool, tmp: str,
              live_check: bool = True, arm_names: tuple[str, ...] = ARMS,
              ab_ablate: str | None = None) -> Iterator[dict[str, Any]]:
    """The engines of a cell, built once (off, on, profiler; "onB": traced through the measurement-only recorder
    of `ab_ablate`, recorder_ablation.py), sharing the cached model weights; on exit they are closed (each trace
    with its live checker's verdict) and the trace files removed."""
    bench._arm = "fused"  # the engine's default ops (flashinfer's fused kernels where they exist)
    bench._loaded = []
    paths = {a: os.path.join(tmp, f"{a}-{Path(p.model).name}-bs{bs}.db") for a in ("on", "onB")}
    try:
        with contextlib.ExitStack() as stack:
            arms: dict[str, Any] = {}
            for arm in arm_names:
                extra = {"recorder": recorder_class(ab_ablate)} if arm == "onB" and ab_ablate else {}
                arms[arm] = stack.enter_context(bench.session.open_session(
                    cell_config(bench, p, bs, plan_stream), paths.get(arm), command=COMMAND, overwrite=True,
                    random_weights=p.random_weights, check=live_check, **extra))
            yield arms
    finally:
        for path in paths.values():
            with contextlib.suppress(OSError):
                os.remove(path)


def run_round(bench: Bench, s: Any, arm: str, bs: int, seed: int) -> tuple[float, float | None, list[list[int]]]:
    """One whole workload on engine `s` in `arm`; returns the median wall ms of its steady iterations, for the
    traced arm the ms its trace flush took afterwards (untimed), and the requests' outputs."""
    torch = bench.torch
    cuda = bench.device == "cuda"
    prof = None
    if arm == "profiler":
        acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
        prof = torch.profiler.profile(activities=acts)
    with prof if prof is not None else contextlib.nullcontext():
        reqs = s.fresh_requests(seed)
        stats = s.run(reqs)
        if cuda:
            torch.cuda.synchronize()
    flush_ms = None
    if s.writer is not None:
        t = time.perf_counter()
        s.engine.recorder.flush_pending()
        s.writer.flush()
        flush_ms = (time.perf_counter() - t) * 1e3
    idx = steady(stats, bs)
    if not idx:
        raise BenchError(f"bs {bs} ({arm}): no steady iterations (raise the request length)")
    return statistics.median(stats.iteration_s[i] * 1e3 for i in idx), flush_ms, [r.output for r in reqs]


def _check_ops(bench: Bench) -> str:
    """The op set the loaded models ran; a BenchError unless it is the device's fused set."""
    torch = bench.torch
    dev = torch.device("cuda", torch.cuda.current_device()) if bench.device == "cuda" else torch.device("cpu")
    ops = {m.ops_name(dev) for m in bench._loaded}
    if ops != {bench.fused_ops}:
        raise BenchError(f"the engines ran ops {sorted(ops)} (want {bench.fused_ops})")
    return bench.fused_ops


def run_cell(bench: Bench, p: Preset, bs: int, rounds: int, plan_stream: bool, tmp: str,
             live_check: bool = True, profiler: bool = True, ab_ablate: str | None = None) -> dict[str, Any]:
    """The arms' engines built once, `rounds` alternating rounds on them; ratios are taken within a round."""
    if rounds <= WARMUP_ROUNDS:
        raise BenchError(f"--rounds must be more than the {WARMUP_ROUNDS} warm-up round")
    ab = bool(ab_ablate)
    names = ("off", "on", *(("onB",) if ab else ()), *(("profiler",) if profiler else ()))
    walls: dict[str, list[float]] = {a: [] for a in names}
    flush: list[float] = []
    # Every run's tokens: one workload on engines sharing weights, so the same greedy outputs are expected (a
    # diagnostic, not a verdict: a difference would point at an engine reading state it does not own).
    outputs: list[list[list[int]]] = []
    checks: dict[str, Any] = {}
    with open_arms(bench, p, bs, plan_stream, tmp, live_check, names, ab_ablate) as arms:
        for i in range(rounds):
            for arm in order(i, names):
                wall, f, out = run_round(bench, arms[arm], arm, bs, seed=0)
                walls[arm].append(wall)
                outputs.append(out)
                if f is not None:
                    flush.append(f)
        ops = _check_ops(bench)
        traced = {a: arms[a] for a in ("on", "onB") if a in arms}
    # Leaving open_arms closed the traces: the live checker's verdict on every traced round is in.
    for a, session in traced.items():
        cr = session.check_result
        checks[a] = None if cr is None else dict(checked_through=cr.checked_through, errors=cr.num_errors,
                                                 warnings=cr.num_warnings)
    del arms, traced
    gc.collect()
    if bench.device == "cuda":
        bench.torch.cuda.empty_cache()
    warm = {a: v[:WARMUP_ROUNDS] for a, v in walls.items()}
    runs = {a: v[WARMUP_ROUNDS:] for a, v in walls.items()}

    def ratios(arm: str, base: str = "off") -> list[float]:
        return [a / b for a, b in zip(runs[arm], runs[base], strict=True)]

    ratio_on = ratios("on")
    med = {a: statistics.median(v) for a, v in runs.items()}
    row = dict(model=p.label, batch_size=bs, plan_stream=plan_stream, rounds=rounds, warmup_rounds=WARMUP_ROUNDS,
               repeats=len(ratio_on), wall_ms={a: summarize(v) for a, v in runs.items()}, run_ms=runs,
               warmup_ms=warm, ratio_traced=summarize(ratio_on), ratio_profiler=None,
               round_ratios=dict(traced=ratio_on),
               ratio_of_medians=dict(traced=med["on"] / med["off"]),
               trace_flush_ms=summarize(flush[WARMUP_ROUNDS:]) if len(flush) > WARMUP_ROUNDS else None,
               trace_check=checks.get("on"),
               outputs_identical=all(o == outputs[0] for o in outputs),
               meets_target=statistics.median(ratio_on) <= TARGET, ops=ops)
    if profiler:
        row["ratio_profiler"] = summarize(ratios("profiler"))
        row["round_ratios"]["profiler"] = ratios("profiler")
        row["ratio_of_medians"]["profiler"] = med["profiler"] / med["off"]
    if ab:
        # The B build of the traced engine, in the same rounds: B / untraced, and the paired A / B (the "on" arm
        # over the "onB" arm of the same round: below 1 when the default build costs less).
        row.update(ab_ablate=ab_ablate, ratio_traced_b=summarize(ratios("onB")),
                   ratio_a_over_b=summarize(ratios("on", "onB")), trace_check_b=checks.get("onB"))
        row["round_ratios"].update(traced_b=ratios("onB"), a_over_b=ratios("on", "onB"))
        row["ratio_of_medians"].update(traced_b=med["onB"] / med["off"], a_over_b=med["on"] / med["onB"])
    return row


def b_settings(d: dict[str, Any]) -> str:
    """What the onB engine of a results document or row was built with ("" without one)."""
    if d.get("ab_ablate"):
        return f"the measurement-only recorder {d['ab_ablate']!r} (recorder_ablation.py)"
    return ""


def _fmt(s: dict[str, float], prec: int = 3) -> str:
    return f"{s['median']:.{prec}f} [{s['min']:.{prec}f}–{s['max']:.{prec}f}]"


def markdown(doc: dict[str, Any]) -> str:
    """The results as a markdown table with the provenance above it."""
    v = doc["versions"]
    acts = "CPU only: a CPU dry run" if doc.get("cpu_dry_run") else "CPU + CUDA"
    ab, prof = b_settings(doc), doc.get("profiler", True)
    names = ["off", "on", *(["onB"] if ab else []), *(["profiler"] if prof else [])]
    kinds = ["untraced (off)", "traced (on)"]
    if ab:
        kinds.append(f"traced, built with {ab} (onB)")
    if prof:
        kinds.append(f"untraced under torch.profiler ({acts})")
    out = ["# Tracer overhead (`benchmarks/tracer_overhead.py`)", "",
           f"- GPU: {doc['gpu']} (SM {doc['capability']}), {doc['date']}",
           f"- versions: torch {v.get('torch')}, CUDA {v.get('cuda')}, flashinfer {v.get('flashinfer')}, "
           f"Python {v.get('python')}, specscope commit {v.get('git_commit')}",
           f"- command: `{doc['command']}`",
           f"- CUDA graphs on, plan stream {'on' if doc['plan_stream'] else 'off'}, live checker "
           f"{'on' if doc.get('live_check', True) else 'off'}, {doc['spec_steps']} draft steps. "
           f"Per cell {len(names)} engines are built once and share the model weights: {', '.join(kinds)}. "
           f"{doc['rounds']} rounds; a round runs the same whole workload (bs requests at once, fixed length, EOS "
           f"ignored) on each engine, in alternating order ({', '.join(names)} / {', '.join(reversed(names))}), "
           "each run followed by a device synchronize; after a traced run the trace is flushed, untimed.",
           f"- wall = median of a run's steady iterations (whole batch decoding, no prefill, first 3 dropped); the "
           f"first {doc['warmup_rounds']} round(s) of each arm are warm-up and dropped, so {doc['repeats']} rounds "
           "are measured. Wall columns: median [min–max] over those rounds.",
           "- round ratio = arm / untraced within one round; the ratio columns give median [min–max] of the round "
           "ratios (the verdict uses the median), then the ratio of the arms' medians over all measured rounds.",
           "- live check: the traced engine's live checker over every traced round; same tokens: every run of the "
           "cell (all arms and rounds, one workload) generated the same outputs.",
           f"- target: traced / untraced ≤ {TARGET}.", "",
           "| model | bs | untraced ms | traced ms | profiler ms | traced / untraced: rounds | of medians "
           "| profiler / untraced: rounds | of medians | ≤ 1.02 | live check | same tokens |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    def check(tc: dict[str, Any] | None) -> str:
        return "—" if tc is None else f"{tc['errors']} errors, {tc['warnings']} warnings"

    for r in doc["rows"]:
        w, rom = r["wall_ms"], r["ratio_of_medians"]
        has_prof = bool(r.get("ratio_profiler"))
        ms_prof = _fmt(w["profiler"], 2) if has_prof else "—"
        ratio_prof = f"{_fmt(r['ratio_profiler'])} | {rom['profiler']:.3f}" if has_prof else "— | —"
        out.append(f"| {r['model']} | {r['batch_size']} | {_fmt(w['off'], 2)} | {_fmt(w['on'], 2)} | "
                   f"{ms_prof} | {_fmt(r['ratio_traced'])} | {rom['traced']:.3f} | {ratio_prof} | "
                   f"{'yes' if r['meets_target'] else '**no**'} | {check(r.get('trace_check'))} | "
                   f"{'yes' if r['outputs_identical'] else '**no**'} |")
    ab = [r for r in doc["rows"] if r.get("ab_ablate")]
    if ab:
        out += ["", "A/B in the same rounds: the traced engine built with the default settings (A, the \"traced\" "
                "column above) and one built with these settings (B); A / B below 1 means A costs less.", "",
                "| model | bs | B settings | B ms | B / untraced: rounds | of medians | A / B: rounds | of medians "
                "| B live check |", "|---|---|---|---|---|---|---|---|---|"]
        for r in ab:
            rom = r["ratio_of_medians"]
            out.append(f"| {r['model']} | {r['batch_size']} | `{b_settings(r)}` | {_fmt(r['wall_ms']['onB'], 2)} | "
                       f"{_fmt(r['ratio_traced_b'])} | {rom['traced_b']:.3f} | {_fmt(r['ratio_a_over_b'])} | "
                       f"{rom['a_over_b']:.3f} | {check(r.get('trace_check_b'))} |")
    out.append("")
    return "\n".join(out)


def write(args: argparse.Namespace, argv: list[str], torch: Any, rows: list[dict[str, Any]], t0: float) -> None:
    """The JSON and markdown results of the cells measured so far."""
    cuda = not args.cpu
    doc = dict(benchmark="tracer_overhead", target_ratio=TARGET, gpu=torch.cuda.get_device_name() if cuda else "cpu",
               capability=".".join(map(str, torch.cuda.get_device_capability())) if cuda else None,
               versions=versions(torch),
               date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
               command="python benchmarks/tracer_overhead.py " + shlex.join(argv), rounds=args.rounds,
               warmup_rounds=WARMUP_ROUNDS, repeats=args.rounds - WARMUP_ROUNDS,
               plan_stream=not args.no_plan_stream, live_check=not args.no_live_check, spec_steps=args.spec_steps,
               quick=args.quick, ab_ablate=args.ab_ablate, profiler=not args.no_profiler,
               cpu_dry_run=args.cpu, seconds=round(time.perf_counter() - t0, 1), rows=rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    out.with_suffix(".md").write_text(markdown(doc))


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command line (torch-free, so --help works anywhere)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--models", default="tiny,llama3-8b", help="comma list of: tiny, llama3-8b")
    ap.add_argument("--batch-sizes", default="1,16,64")
    ap.add_argument("--rounds", "--repeats", dest="rounds", type=int, default=15,
                    help=f"rounds per cell, each running every arm once (>= 5; the first {WARMUP_ROUNDS} is "
                         "warm-up). --repeats is an alias")
    ap.add_argument("--no-plan-stream", action="store_true", help="plan stream off (it is on by default)")
    ap.add_argument("--spec-steps", type=int, default=3)
    ap.add_argument("--no-live-check", action="store_true",
                    help="trace without the live checker process beside the writer (it is on, as in `specscope run`)")
    ap.add_argument("--quick", action="store_true", help="shorter requests (engine_speed's quick presets)")
    ap.add_argument("--ab-ablate", default=None, choices=LEVELS,
                    help="A/B: add a second traced engine (arm onB, in the same alternating rounds) that records "
                         "through a measurement-only recorder with part of the host-side recording off "
                         "(benchmarks/recorder_ablation.py): what that part costs")
    ap.add_argument("--no-profiler", action="store_true", help="leave out the torch.profiler arm")
    ap.add_argument("--cpu", action="store_true",
                    help="a CPU dry run of the harness (float32, fused-torch ops; needs --out, numbers meaningless)")
    ap.add_argument("--out", default=None, help="results JSON (default benchmarks/results/tracer_overhead.json)")
    args = ap.parse_args(argv)
    if args.rounds < 5:
        ap.error(f"--rounds must be at least 5, got {args.rounds}")
    if args.cpu and args.out is None:
        ap.error("--cpu needs --out (a dry run must not overwrite the GPU results)")
    args.out = args.out or str(HERE / "results" / "tracer_overhead.json")
    try:
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        ap.error(f"--batch-sizes must be a comma list of integers, got {args.batch_sizes!r}")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in presets(False)]
    if unknown:
        ap.error(f"unknown model preset {unknown[0]!r} (use tiny, llama3-8b)")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the cells and write the results; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        if args.cpu:
            import torch
        else:
            torch = load_torch()
        bench = Bench(torch, args.spec_steps)
        if args.cpu:
            bench.device, bench.dtype, bench.fused_setting, bench.fused_ops = "cpu", "float32", "fused-torch", \
                "fused-torch"
        table = presets(args.quick)
        rows: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.models:
                p = table[name]
                for bs in args.batch_sizes:
                    row = run_cell(bench, p, bs, args.rounds, not args.no_plan_stream, tmp, not args.no_live_check,
                                   not args.no_profiler, args.ab_ablate)
                    rows.append(row)
                    rom = row["ratio_of_medians"]
                    line = (f"{p.label[:26]:26s} bs {bs:3d}  off {row['wall_ms']['off']['median']:7.3f} ms  "
                            f"traced {_fmt(row['ratio_traced'])} (of medians {rom['traced']:.3f})")
                    if row.get("ratio_profiler"):
                        line += f"  profiler {_fmt(row['ratio_profiler'])} (of medians {rom['profiler']:.3f})"
                    if args.ab_ablate:
                        line += (f"  B {_fmt(row['ratio_traced_b'])} (of medians {rom['traced_b']:.3f})  "
                                 f"A/B {_fmt(row['ratio_a_over_b'])} (of medians {rom['a_over_b']:.3f})")
                    print(line, flush=True)
                    write(args, argv, torch, rows, t0)  # after every cell: a time limit keeps what was measured
                bench.drop_models()
    except BenchError as e:
        print(f"tracer_overhead: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} and its .md in {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
