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

Paired trees (`--base-tree DIR`): the recorder of an older commit beside the working tree's, in the same rounds.
Two versions of the package cannot share a process, so each tree's engines live in a long-lived worker process of
their own (benchmarks/overhead_worker.py, driven over a pipe; its writer and checker children load the same tree).
Per cell each worker builds off and on (the new tree's worker also the profiler arm), then the rounds alternate
old:off, old:on, new:on, new:off, new:profiler and back; each tree's on / off divides by its own worker's off of the
same round, new on / old on pairs the two traced arms of a round. Both trees run identical prompts (checked) and
every run's tokens are compared. Results go to benchmarks/results/tracer_overhead_paired.json and .md; `--merge`
joins the results of several calls (e.g. tiny and 8B) into one.

    bash scripts/base_tree.sh 25cc3e3 .bench/base-25cc3e3      # the old commit's package folders (git-ignored)
    python benchmarks/tracer_overhead.py --quick --rounds 15 --models tiny --base-tree .bench/base-25cc3e3 \
        --out /tmp/paired_tiny.json
    python benchmarks/tracer_overhead.py --merge /tmp/paired_tiny.json /tmp/paired_8b.json \
        --out benchmarks/results/tracer_overhead_paired.json
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
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
from engine_speed import Bench, BenchError, Preset, load_torch, presets, steady, summarize, versions  # noqa: E402

# recorder_ablation is imported where used, not here: benchmarks/overhead_worker.py imports this module inside an
# older tree's process, whose tracer may lack what the measurement-only recorders build on.

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
                extra = {}
                if arm == "onB" and ab_ablate:
                    from recorder_ablation import recorder_class

                    extra = {"recorder": recorder_class(ab_ablate)}
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


# ---- paired arms of two trees (--base-tree) ----------------------------------------------------------------------

TREES = ("new", "old")  # the working tree, the --base-tree copy of an older commit


def paired_arms(profiler: bool) -> tuple[str, ...]:
    """The paired run's arms as `worker:arm`, in a round's order: each traced arm beside its worker's untraced one,
    the two traced arms side by side; the profiler runs in the new tree's worker."""
    return ("old:off", "old:on", "new:on", "new:off", *(("new:profiler",) if profiler else ()))


def tree_commit(tree: Path, label: str | None = None) -> str:
    """What a tree is: `label` if given, else its COMMIT file (scripts/base_tree.sh), its git-archive stamp
    (backend/archive_commit.txt), or git's HEAD with a note of uncommitted changes in the package folders."""
    if label:
        return label
    with contextlib.suppress(OSError):
        text = (tree / "COMMIT").read_text().strip()
        if text:
            return text[:12]
    with contextlib.suppress(OSError):
        text = (tree / "backend" / "archive_commit.txt").read_text().strip()
        if text and not text.startswith("$Format"):
            return text[:12]
    if (tree / ".git").exists():
        git = ["git", "--no-optional-locks", "-C", str(tree)]
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            head = subprocess.run([*git, "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                                  timeout=10, check=True).stdout.strip()
            changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no", "--", "tracer",
                                      "backend", "ui", "integrations"], capture_output=True, text=True,
                                     timeout=30, check=True).stdout.split("\n")
            n = sum(1 for line in changed if line.strip())
            return f"{head} + uncommitted changes in {n} package files" if n else head
    return "not recorded (no git and no COMMIT file here)"


def _driver_version() -> str:
    """The NVIDIA driver's version from nvidia-smi (the driver process touches no CUDA context)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout.split()
        if out:
            return out[0]
    return "not recorded"


def _load() -> str:
    a, b, c = os.getloadavg()
    return f"{a:.2f} / {b:.2f} / {c:.2f}"


def paired_cell(workers: dict[str, Any], name: str, p: Preset, bs: int, args: argparse.Namespace,
                names: tuple[str, ...], drop: bool) -> dict[str, Any]:
    """One cell on both trees: each worker builds its engines, `args.rounds` alternating rounds over all arms,
    then each worker closes its engines (and with `drop` frees the model weights)."""
    per_tree = {w: [a for a in ARMS if f"{w}:{a}" in names] for w in TREES}  # built in today's order
    opened: dict[str, dict[str, Any]] = {}
    walls: dict[str, list[float]] = {a: [] for a in names}
    flush: dict[str, list[float]] = {w: [] for w in TREES}
    outputs: dict[str, set[str]] = {a: set() for a in names}
    # One worker after the other: the second finds the kernels the first JIT-compiled (one cache on disk). On an
    # error the driver stops both workers, which closes whatever they hold.
    for w in TREES:
        opened[w] = workers[w].call(cmd="open", model=name, bs=bs, arms=per_tree[w], quick=args.quick,
                                    plan_stream=not args.no_plan_stream, live_check=not args.no_live_check)
    prompts = {f"{w}:{a}": d for w, o in opened.items() for a, d in o["prompts"].items()}
    if len(set(prompts.values())) != 1:
        raise BenchError(f"{p.label} bs {bs}: the arms' workloads differ (prompt digests {prompts})")
    for i in range(args.rounds):
        for a in order(i, names):
            w, arm = a.split(":")
            r = workers[w].call(cmd="run", arm=arm, seed=0)
            walls[a].append(r["wall_ms"])
            outputs[a].add(r["outputs"])
            if r["flush_ms"] is not None and i >= WARMUP_ROUNDS:
                flush[w].append(r["flush_ms"])
    closed = {w: workers[w].call(cmd="close", drop=drop) for w in TREES}
    runs = {a: v[WARMUP_ROUNDS:] for a, v in walls.items()}

    def ratios(num: str, den: str) -> list[float]:
        return [x / y for x, y in zip(runs[num], runs[den], strict=True)]

    new_oo, old_oo = ratios("new:on", "new:off"), ratios("old:on", "old:off")
    series = {"new_on/new_off": new_oo, "old_on/old_off": old_oo, "new_on/old_on": ratios("new:on", "old:on"),
              "new_overhead/old_overhead": [n / o for n, o in zip(new_oo, old_oo, strict=True)],
              "new_off/old_off": ratios("new:off", "old:off")}
    if "new:profiler" in runs:
        series["profiler/new_off"] = ratios("new:profiler", "new:off")
    med = {a: statistics.median(v) for a, v in runs.items()}
    of_medians = {"new_on/new_off": med["new:on"] / med["new:off"], "old_on/old_off": med["old:on"] / med["old:off"],
                  "new_on/old_on": med["new:on"] / med["old:on"],
                  "new_overhead/old_overhead": (med["new:on"] / med["new:off"]) / (med["old:on"] / med["old:off"]),
                  "new_off/old_off": med["new:off"] / med["old:off"]}
    if "new:profiler" in runs:
        of_medians["profiler/new_off"] = med["new:profiler"] / med["new:off"]
    digests = {d for v in outputs.values() for d in v}
    return dict(model=p.label, batch_size=bs, plan_stream=not args.no_plan_stream, rounds=args.rounds,
                warmup_rounds=WARMUP_ROUNDS, repeats=args.rounds - WARMUP_ROUNDS, arms=list(names),
                wall_ms={a: summarize(v) for a, v in runs.items()}, run_ms=runs,
                warmup_ms={a: v[:WARMUP_ROUNDS] for a, v in walls.items()},
                ratios={k: summarize(v) for k, v in series.items()}, round_ratios=series,
                ratio_of_medians=of_medians,
                trace_flush_ms={w: summarize(v) if v else None for w, v in flush.items()},
                trace_check={w: closed[w]["checks"].get("on") for w in TREES},
                ops={w: closed[w]["ops"] for w in TREES},
                build_s={w: round(o["build_s"], 2) for w, o in opened.items()},
                peak_memory_gib={w: closed[w]["peak_memory"] for w in TREES},
                gpu_free_gib_after_builds=opened["old"]["gpu_free_gib"],
                prompts_identical=True, outputs_identical=len(digests) == 1,
                output_digests={a: sorted(v) for a, v in outputs.items()},
                meets_target=statistics.median(new_oo) <= TARGET)


def paired_header(doc: dict[str, Any]) -> dict[str, Any]:
    """The results header (benchmarks/results/README.md): hardware, versions, both trees, date, load, command."""
    h = doc["workers"]["new"]
    if doc.get("cpu_dry_run"):
        hardware = f"CPU dry run ({os.cpu_count()} CPUs): numbers meaningless"
    else:
        hardware = f"one {h['gpu']} (SM {h['capability']}, {h['gpu_memory_mib']:,} MiB), driver {doc['driver']}"
    trees = {w: dict(commit=doc["commits"][w], path=v["tree"], loaded_from=v["files"]["specscope.tracer"],
                     children_loaded_from=v["files"]["child specscope.tracer"])
             for w, v in doc["workers"].items()}
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("SPECSCOPE_")}
    return dict(hardware=hardware, versions=h["versions"], trees=trees,
                date=f"{doc['started']}–{doc['date'][11:]}", machine_load=doc["machine_load"],
                command=doc["command"], environment=env or "no SPECSCOPE_* variable set")


def markdown_paired(doc: dict[str, Any]) -> str:
    """The paired results as markdown tables with the provenance above them."""
    hd = doc["header"]
    v, t = hd["versions"], hd["trees"]
    env = hd["environment"]
    names = doc["arms"]
    prof = any(a.endswith(":profiler") for a in names)
    dev, acts = ("CPU", "CPU only: a CPU dry run") if doc.get("cpu_dry_run") else ("GPU", "CPU + CUDA")
    out = ["# Tracer overhead, two trees in paired arms (`benchmarks/tracer_overhead.py --base-tree`)", "",
           f"- hardware: {hd['hardware']}",
           f"- versions: Python {v.get('python')}, torch {v.get('torch')}, CUDA {v.get('cuda')}, flashinfer "
           f"{v.get('flashinfer')}",
           f"- trees: new = {t['new']['commit']} (`{t['new']['loaded_from']}`); old = {t['old']['commit']} "
           f"(`{t['old']['loaded_from']}`); each worker's writer and checker children loaded from the same tree",
           f"- date: {hd['date']}",
           f"- machine load (1 / 5 / 15 min): {hd['machine_load']}",
           f"- command: `{hd['command']}`",
           "- environment: " + (", ".join(f"{k}={val}" for k, val in env.items()) if isinstance(env, dict) else env),
           f"- CUDA graphs on, plan stream {'on' if doc['plan_stream'] else 'off'}, live checker "
           f"{'on' if doc['live_check'] else 'off'}, {doc['spec_steps']} draft steps. Each tree runs in its own "
           f"long-lived worker process (benchmarks/overhead_worker.py) on the same {dev}, one run at a time; per "
           "cell each worker builds its engines once, sharing its own copy of the model weights: untraced (off) "
           "and traced (on) in both" + (f", untraced under torch.profiler ({acts}) in the new tree's" if prof else "")
           + f". {doc['rounds']} rounds; a round runs the same whole workload (bs requests at once, fixed length, "
           f"EOS ignored, identical prompts in every arm of both trees) on each arm, in alternating order "
           f"({', '.join(names)} / {', '.join(reversed(names))}), each run followed by a device synchronize; after "
           "a traced run its trace is flushed, untimed.",
           f"- wall = median of a run's steady iterations (whole batch decoding, no prefill, first 3 dropped); the "
           f"first {doc['warmup_rounds']} round(s) are warm-up and dropped, so {doc['repeats']} rounds are measured.",
           "- each tree's on / off divides by **that worker's own** untraced arm of the same round (two processes "
           "share the GPU: off / off across them is shown as a check); new on / old on is the paired ratio of the "
           "two traced arms, run side by side; new overhead / old overhead = (new on / new off) / (old on / old off) "
           "per round. Ratio columns: median [min–max] of the round ratios, then the ratio of the arms' medians.",
           f"- target (the new tree): new on / new off ≤ {TARGET}.",
           *(f"- note: {n}" for n in doc.get("notes", ())), "",
           "| model | bs | rounds | off ms new / old | on ms new / old | new on / off | old on / off | new on / old on "
           "| new overhead / old overhead | off new / old | profiler / off | new ≤ 1.02 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        w, q, m = r["wall_ms"], r["ratios"], r["ratio_of_medians"]

        def cell(k: str, q: dict[str, Any] = q, m: dict[str, Any] = m) -> str:
            return f"{_fmt(q[k])} ({m[k]:.3f})" if k in q else "—"

        out.append(f"| {r['model']} | {r['batch_size']} | {r['repeats']} | {w['new:off']['median']:.2f} / "
                   f"{w['old:off']['median']:.2f} "
                   f"| {w['new:on']['median']:.2f} / {w['old:on']['median']:.2f} | {cell('new_on/new_off')} "
                   f"| {cell('old_on/old_off')} | {cell('new_on/old_on')} | {cell('new_overhead/old_overhead')} "
                   f"| {cell('new_off/old_off')} | {cell('profiler/new_off')} "
                   f"| {'yes' if r['meets_target'] else '**no**'} |")

    def check(tc: dict[str, Any] | None) -> str:
        return "—" if tc is None else f"{tc['errors']} errors, {tc['warnings']} warnings"

    def mem(pm: dict[str, Any] | None) -> str:
        return "—" if not pm else f"{pm['reserved_gib']:.1f}"

    out += ["", "Per cell: the live checker over every traced round of each tree, whether every run of the cell "
            "(all arms, both trees, all rounds) generated the same tokens, the engines' op sets, the build time "
            "(graph capture included) and each worker's peak reserved GPU memory.", "",
            "| model | bs | live check new | live check old | same tokens | ops new / old | build s new / old "
            "| peak GiB new / old | GPU free GiB after both builds |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["rows"]:
        pm, free = r["peak_memory_gib"], r.get("gpu_free_gib_after_builds")
        out.append(f"| {r['model']} | {r['batch_size']} | {check(r['trace_check']['new'])} "
                   f"| {check(r['trace_check']['old'])} | {'yes' if r['outputs_identical'] else '**no**'} "
                   f"| {r['ops']['new']} / {r['ops']['old']} | {r['build_s'].get('new', 0):.1f} / "
                   f"{r['build_s'].get('old', 0):.1f} | {mem(pm['new'])} / {mem(pm['old'])} "
                   f"| {'—' if free is None else f'{free:.1f}'} |")
    out.append("")
    return "\n".join(out)


def write_paired(doc: dict[str, Any], out: Path) -> None:
    """The paired JSON and markdown results of the cells measured so far."""
    doc["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    doc["machine_load"] = f"{doc['load_start']} at the start, {_load()} at the end ({os.cpu_count()} CPUs)"
    doc["header"] = paired_header(doc)
    doc = {"header": doc.pop("header"), **doc}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1))
    out.with_suffix(".md").write_text(markdown_paired(doc))


def run_paired(args: argparse.Namespace, argv: list[str]) -> int:
    """Both trees' engines in their own workers, paired arms in the same alternating rounds; returns the exit
    status."""
    from overhead_worker import Worker, WorkerError

    base = Path(args.base_tree).resolve()
    trees = {"new": Path(args.new_tree).resolve(), "old": base}
    names = paired_arms(not args.no_profiler)
    t0 = time.perf_counter()
    doc: dict[str, Any] = dict(
        benchmark="tracer_overhead_paired", target_ratio=TARGET,
        started=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
        load_start=_load(), command="python benchmarks/tracer_overhead.py " + shlex.join(argv),
        commits={"new": tree_commit(trees["new"], args.new_label), "old": tree_commit(base)},
        driver="cpu" if args.cpu else _driver_version(), rounds=args.rounds, warmup_rounds=WARMUP_ROUNDS,
        repeats=args.rounds - WARMUP_ROUNDS, arms=list(names), plan_stream=not args.no_plan_stream,
        live_check=not args.no_live_check, spec_steps=args.spec_steps, quick=args.quick, profiler=not args.no_profiler,
        cpu_dry_run=args.cpu, rows=[])
    workers: dict[str, Worker] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="overhead-shims-") as shims:
            try:
                for w in TREES:  # both start (import torch, check their tree) at once
                    workers[w] = Worker(w, trees[w], Path(shims), args.cpu, args.spec_steps)
                for w in TREES:
                    hello = workers[w].receive()
                    workers[w].hello = hello
                    print(f"tree {w} ({doc['commits'][w]}): specscope.tracer from {hello['files']['specscope.tracer']}"
                          f"; its children's from {hello['files']['child specscope.tracer']}", flush=True)
                doc["workers"] = {w: workers[w].hello for w in TREES}
                table = presets(args.quick)
                for name in args.models:
                    for j, bs in enumerate(args.batch_sizes):
                        row = paired_cell(workers, name, table[name], bs, args, names,
                                          drop=j == len(args.batch_sizes) - 1)
                        doc["rows"].append(row)
                        q, wall = row["ratios"], row["wall_ms"]
                        line = (f"{table[name].label[:26]:26s} bs {bs:3d}  off new {wall['new:off']['median']:7.3f}"
                                f" old {wall['old:off']['median']:7.3f} ms  new on/off "
                                f"{_fmt(q['new_on/new_off'])}  old on/off {_fmt(q['old_on/old_off'])}  new/old on "
                                f"{_fmt(q['new_on/old_on'])}")
                        if "profiler/new_off" in q:
                            line += f"  profiler/off {_fmt(q['profiler/new_off'])}"
                        if not row["outputs_identical"]:
                            line += "  TOKENS DIFFER across arms"
                        print(line, flush=True)
                        doc["seconds"] = round(time.perf_counter() - t0, 1)
                        write_paired(doc, Path(args.out))  # after every cell: a time limit keeps what was measured
            finally:
                for w in workers.values():
                    w.stop()
    except (BenchError, WorkerError, FileNotFoundError) as e:
        print(f"tracer_overhead: error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} and its .md in {time.perf_counter() - t0:.1f} s")
    return 0


def merge_paired(files: list[str], out: str, notes: Sequence[str] = ()) -> int:
    """Several paired results of the same two trees and settings (e.g. the tiny and the 8B calls) as one, with
    `notes` for the markdown."""
    docs = [json.loads(Path(f).read_text()) for f in files]
    if any(d.get("benchmark") != "tracer_overhead_paired" for d in docs):
        print("tracer_overhead: error: --merge takes paired results (--base-tree) only", file=sys.stderr)
        return 2
    # Rounds and arms may differ per call (each row carries its own); what the rows measure may not.
    same = ("commits", "plan_stream", "live_check", "spec_steps", "quick", "cpu_dry_run")
    for d in docs[1:]:
        diff = [k for k in same if d.get(k) != docs[0].get(k)]
        if diff:
            print(f"tracer_overhead: error: the results differ in {', '.join(diff)}", file=sys.stderr)
            return 2
    doc = dict(docs[0])
    doc["arms"] = list(dict.fromkeys(a for d in docs for a in d["arms"]))
    for k in ("rounds", "repeats"):
        vals = list(dict.fromkeys(d[k] for d in docs))
        doc[k] = vals[0] if len(vals) == 1 else " / ".join(map(str, vals)) + " (per call; see each row)"
    doc["notes"] = [*doc.get("notes", ()), *notes]
    hs = [d["header"] for d in docs]
    doc["header"] = dict(hs[0], date=[h["date"] for h in hs], machine_load=[h["machine_load"] for h in hs],
                         command=[h["command"] for h in hs], hardware=sorted({h["hardware"] for h in hs}),
                         note="one paired run per command (each a gpu_batch call); rows in command order")
    doc["rows"] = [r for d in docs for r in d["rows"]]
    doc["merged_from"] = files
    text = markdown_paired(dict(doc, header=dict(doc["header"], date="; ".join(doc["header"]["date"]),
                                                  machine_load="; ".join(doc["header"]["machine_load"]),
                                                  hardware="; ".join(doc["header"]["hardware"]),
                                                  command="`; `".join(doc["header"]["command"]))))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(doc, indent=1))
    Path(out).with_suffix(".md").write_text(text)
    print(f"merged {len(docs)} results ({len(doc['rows'])} cells) into {out} and its .md")
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command line (specscope-free: the paired driver loads no tree of its own)."""
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
    ap.add_argument("--ab-ablate", default=None, metavar="{floor,eager-spans}",
                    help="A/B: add a second traced engine (arm onB, in the same alternating rounds) that records "
                         "through a measurement-only recorder with part of the host-side recording off "
                         "(benchmarks/recorder_ablation.py): what that part costs")
    ap.add_argument("--no-profiler", action="store_true", help="leave out the torch.profiler arm")
    ap.add_argument("--base-tree", default=None, metavar="DIR",
                    help="paired arms of two trees: DIR is an older commit's package folders (scripts/base_tree.sh "
                         "COMMIT DIR); each tree's engines run in a worker process of their own "
                         "(benchmarks/overhead_worker.py), off and on in both, the profiler in the working tree's; "
                         "results default to benchmarks/results/tracer_overhead_paired.json")
    ap.add_argument("--new-tree", default=str(HERE.parent), metavar="DIR",
                    help="with --base-tree: the tree measured as 'new' (default: this checkout, the working tree)")
    ap.add_argument("--new-label", default=None,
                    help="with --base-tree: what the working tree is, for the header (default: git's HEAD, or "
                         "'not recorded' on a host without git)")
    ap.add_argument("--note", action="append", default=[], metavar="TEXT",
                    help="with --merge: a line for the merged results' header (repeatable)")
    ap.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                    help="merge paired results of the same trees and settings (e.g. the tiny and the 8B calls) "
                         "into --out, and exit")
    ap.add_argument("--cpu", action="store_true",
                    help="a CPU dry run of the harness (float32, fused-torch ops; needs --out, numbers meaningless)")
    ap.add_argument("--out", default=None, help="results JSON (default benchmarks/results/tracer_overhead.json)")
    args = ap.parse_args(argv)
    if args.merge:
        if args.out is None:
            ap.error("--merge needs --out")
        return args
    if args.ab_ablate:
        from recorder_ablation import LEVELS

        if args.ab_ablate not in LEVELS:
            ap.error(f"--ab-ablate must be one of {', '.join(LEVELS)}, got {args.ab_ablate!r}")
    if args.rounds < (WARMUP_ROUNDS + 1 if args.cpu else 5):  # a CPU dry run checks the harness, not a verdict
        ap.error(f"--rounds must be at least 5, got {args.rounds}")
    if args.cpu and args.out is None:
        ap.error("--cpu needs --out (a dry run must not overwrite the GPU results)")
    if args.base_tree is not None:
        if args.ab_ablate:
            ap.error("--ab-ablate and --base-tree do not mix (the measurement-only recorders build on today's tracer)")
        for flag, tree in (("--base-tree", args.base_tree), ("--new-tree", args.new_tree)):
            if not (Path(tree) / "tracer" / "__init__.py").is_file():
                ap.error(f"{flag} {tree}: no tracer/__init__.py there (make one with scripts/base_tree.sh)")
    name = "tracer_overhead_paired.json" if args.base_tree else "tracer_overhead.json"
    args.out = args.out or str(HERE / "results" / name)
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
    if args.merge:
        return merge_paired(args.merge, args.out, args.note)
    if args.base_tree is not None:
        return run_paired(args, argv)
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
