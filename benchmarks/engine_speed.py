"""Engine speed on the GPU: wall time and GPU kernel time per iteration, GPU busy share, tokens/s, accept length.

For each model (the embedded tiny pair; a Llama-3-8B-shaped target + one-layer draft with random weights), batch
size and mode (speculative decoding, plain decode) the same workload runs with fused ops off and on, alternating
(ABBA order, >= 5 pairs). Every request arrives at once and runs a fixed length (EOS ignored), CUDA graphs on,
no trace. Per run: the median wall time of steady iterations (the whole batch decoding, no prefill, the first 3
dropped). Per cell: median and min-max of those run medians. GPU kernel time comes from one extra run per arm
under torch.profiler (CUDA activity only): a marker kernel launched after every iteration splits the GPU
timeline, and the union of kernel intervals between two markers is that iteration's GPU busy time (memcpy and
memset excluded). Busy share = GPU kernel time / unprofiled wall time.

    python benchmarks/engine_speed.py --quick      # ~3 min on an H200 (after the JIT kernels are built)
    python benchmarks/engine_speed.py              # 7 pairs, longer runs, bs 1/16/64

Writes benchmarks/results/engine_speed.json and engine_speed.md (GPU, versions, date, command inside).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import datetime
import gc
import json
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
WARMUP_ITERATIONS = 3
MARKER = "spin_kernel"  # torch.cuda._sleep's kernel: launched after every iteration to split the GPU timeline
TARGETS = {"busy_share_8b": 0.85, "tiny_bs1_ms": 2.0}


@dataclass(frozen=True)
class Preset:
    """A model pair and the workload it runs."""

    label: str
    model: str
    draft: str
    random_weights: bool
    new_tokens: int
    prompt: tuple[int, int]


def presets(quick: bool) -> dict[str, Preset]:
    """The two model pairs (tiny, Llama-3-8B shape); --quick runs shorter requests."""
    cfg = HERE / "configs"
    tiny_new, big_new = (64, 32) if quick else (128, 64)
    return {
        "tiny": Preset("tiny", "tiny", "tiny-draft", False, tiny_new, (64, 128)),
        "llama3-8b": Preset("llama3-8b (random weights)", str(cfg / "llama3-8b"), str(cfg / "llama3-8b-draft"), True,
                            big_new, (256, 512) if not quick else (128, 256)),
    }


class BenchError(Exception):
    """Unusable host or arguments: one line for the user."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command line (torch-free, so --help works anywhere)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n".join(__doc__.splitlines()[2:]))
    ap.add_argument("--quick", action="store_true", help="5 pairs, bs 1 and 64, shorter requests (~3 min)")
    ap.add_argument("--pairs", type=int, default=None,
                    help="off/on pairs per cell (default 5 quick, 7 full; at least 5 for a verdict)")
    ap.add_argument("--models", default="tiny,llama3-8b", help="comma list of: tiny, llama3-8b")
    ap.add_argument("--batch-sizes", default=None, help="comma list (default 1,64 quick, 1,16,64 full)")
    ap.add_argument("--modes", default="spec,decode", help="comma list of: spec (3 draft steps), decode")
    ap.add_argument("--spec-steps", type=int, default=3)
    ap.add_argument("--no-profile", action="store_true", help="skip the profiled runs (no GPU kernel time)")
    ap.add_argument("--out-dir", default=str(HERE / "results"), help="where engine_speed.json/.md go")
    args = ap.parse_args(argv)
    args.pairs = args.pairs if args.pairs is not None else (5 if args.quick else 7)
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    args.batch_sizes = args.batch_sizes or ("1,64" if args.quick else "1,16,64")
    try:
        args.batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    except ValueError:
        ap.error(f"--batch-sizes must be a comma list of integers, got {args.batch_sizes!r}")
    if min(args.batch_sizes) < 1:
        ap.error("--batch-sizes must be at least 1")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.models if m not in presets(False)]
    if unknown:
        ap.error(f"unknown model preset {unknown[0]!r} (use tiny, llama3-8b)")
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not args.modes or any(m not in ("spec", "decode") for m in args.modes):
        ap.error("--modes must be a comma list of spec, decode")
    return args


# ---- the GPU timeline -------------------------------------------------------------------------------


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Union of (start, end) intervals as sorted, disjoint intervals (kernels on several streams overlap)."""
    out: list[tuple[float, float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        elif e > s:
            out.append((s, e))
    return out


def busy_per_window(kernels: list[tuple[float, float]], markers: list[tuple[float, float]]) -> list[float]:
    """GPU busy time (union of kernel intervals) inside each window between consecutive markers (same unit).

    Window i runs from the end of marker i-1 (the start of the timeline for i = 0) to the start of marker i;
    busy intervals that straddle a boundary count on both sides, clipped."""
    busy = merge(kernels)
    ends = [e for _, e in busy]
    out = []
    for i, (hi, _) in enumerate(markers):
        lo = markers[i - 1][1] if i else float("-inf")
        total, j = 0.0, bisect.bisect_right(ends, lo)  # the first busy interval ending after lo
        while j < len(busy) and busy[j][0] < hi:
            total += max(0.0, min(busy[j][1], hi) - max(busy[j][0], lo))
            j += 1
        out.append(total)
    return out


def steady(stats: Any, bs: int) -> list[int]:
    """Indexes of iterations that decoded the whole batch and prefilled nothing, warm-up dropped."""
    idx = [i for i, (n, p) in enumerate(zip(stats.iteration_bs, stats.iteration_prefill, strict=True))
           if n == bs and not p]
    return idx[WARMUP_ITERATIONS:]


# ---- runs ---------------------------------------------------------------------------------------------


class Bench:
    """Loads each model once and runs the engine on it with fused ops off or on."""

    def __init__(self, torch: Any, spec_steps: int) -> None:
        import specscope.backend.session as session

        self.torch = torch
        self.session = session
        self.spec_steps = spec_steps
        self._cache: dict[tuple[Any, ...], Any] = {}
        self._arm = "plain"
        self._loaded: list[Any] = []  # this run's models, in load order (target, then draft)
        # What the arms mean on this device: the fused arm's `fused_ops` setting and the op set it must run (a CPU
        # dry run of the harness sets "cpu" / "fused-torch").
        self.device, self.dtype, self.fused_setting, self.fused_ops = "cuda", "bfloat16", "auto", "flashinfer"
        real = session.load_model

        def cached_load(path: str, **kw: Any) -> Any:
            # Loading an 8B model per run would dominate the benchmark; the engine never writes the weights, and
            # the fused layout is a view of them, so both arms share one copy (each session sets its op set).
            key = (str(path), str(kw.get("device")), str(kw.get("dtype")), kw.get("random_weights"), kw.get("seed"))
            if key not in self._cache:
                self._cache[key] = real(path, **kw)
            model, cfg = self._cache[key]
            self._loaded.append(model)
            return model, cfg

        session.load_model = cached_load

    def ops_setting(self) -> str:
        """The current arm's `EngineConfig.fused_ops`: the fused setting, or "plain"."""
        return self.fused_setting if self._arm == "fused" else "plain"

    def drop_models(self) -> None:
        """Free the cached models (between presets)."""
        self._cache.clear()
        gc.collect()
        if self.device == "cuda":
            self.torch.cuda.empty_cache()

    def run(self, p: Preset, bs: int, mode: str, arm: str, profile: bool = False) -> dict[str, Any]:
        """One engine run; returns steady-iteration wall times, accept length, and (profiled) GPU busy times."""
        from specscope.backend.engine_config import EngineConfig

        torch = self.torch
        self._arm = arm
        spec = self.spec_steps if mode == "spec" else 0
        cfg = EngineConfig(model=p.model, draft=p.draft, device=self.device, dtype=self.dtype, batch_size=bs,
                           num_requests=bs, max_new_tokens=p.new_tokens, spec_steps=spec, page_size=64,
                           cuda_graph=True, plan_stream=False, seed=0, prompt_len=p.prompt, arrival_gap=(0, 0),
                           ignore_eos=True, graph_batch_sizes=(bs,), fused_ops=self.ops_setting())
        marks = 0

        def mark(_done: int, _total: int) -> None:
            nonlocal marks
            torch.cuda._sleep(0)  # a ~2 µs marker kernel on the compute stream, after the iteration's work
            marks += 1

        self._loaded = []
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) if profile else None
        with prof if prof is not None else contextlib.nullcontext():
            res = self.session.run_session(cfg, None, command="benchmarks/engine_speed.py",
                                           progress=mark if profile else None, random_weights=p.random_weights)
            if self.device == "cuda":
                torch.cuda.synchronize()  # every kernel of the run lands inside the profile
        dev = torch.device("cuda", torch.cuda.current_device()) if self.device == "cuda" else torch.device("cpu")
        ops = dict(zip(("target", "draft"), (m.ops_name(dev) for m in self._loaded), strict=False))
        want = self.fused_ops if arm == "fused" else "plain"
        if set(ops.values()) != {want}:
            raise BenchError(f"the fused-ops {'on' if arm == 'fused' else 'off'} arm ran {ops} (want {want})")
        stats = res.stats
        idx = steady(stats, bs)
        if not idx:
            raise BenchError(f"{p.label} bs {bs} {mode}: no steady iterations (raise the request length)")
        wall = [stats.iteration_s[i] * 1e3 for i in idx]
        out: dict[str, Any] = dict(wall_ms=wall, accept_length=stats.mean_accept_length or 1.0,
                                   output_tokens=stats.output_tokens, run_s=stats.wall_s, ops=ops)
        if prof is not None:
            out.update(self._gpu_times(prof, marks, len(stats.iteration_s), idx, wall))
        return out

    def _gpu_times(self, prof: Any, marks: int, iterations: int, idx: list[int], wall: list[float]
                   ) -> dict[str, Any]:
        cuda = self.torch.autograd.DeviceType.CUDA
        kernels, markers = [], []
        for e in prof.events():
            if e.device_type != cuda:
                continue
            name = e.name
            iv = (float(e.time_range.start), float(e.time_range.end))
            if MARKER in name:
                markers.append(iv)
            elif not name.lower().startswith(("memcpy", "memset")):
                kernels.append(iv)
        markers.sort()
        if len(markers) != iterations or marks != iterations:
            # The engine's progress callback did not run once per iteration: no per-iteration split.
            note = f"{len(markers)} markers seen, {marks} launched, {iterations} iterations: no GPU times"
            print(f"engine_speed: warning: {note}", file=sys.stderr)
            return dict(gpu_note=note)
        busy = busy_per_window(kernels, markers)
        span = [(markers[i][0] - markers[i - 1][1]) if i else float("nan") for i in range(len(markers))]
        return dict(gpu_ms=[busy[i] / 1e3 for i in idx], gpu_span_ms=[span[i] / 1e3 for i in idx],
                    profiled_wall_ms=wall, kernels_per_iteration=_kernels_per_window(kernels, markers, idx))


def _kernels_per_window(kernels: list[tuple[float, float]], markers: list[tuple[float, float]],
                        idx: list[int]) -> float:
    starts = sorted(s for s, _ in kernels)
    counts = []
    for i in idx:
        lo = markers[i - 1][1] if i else float("-inf")
        counts.append(bisect.bisect_left(starts, markers[i][0]) - bisect.bisect_right(starts, lo))
    return statistics.median(counts) if counts else 0.0


# ---- the cells ----------------------------------------------------------------------------------------


def summarize(values: list[float]) -> dict[str, float]:
    """Median, min and max."""
    return dict(median=statistics.median(values), min=min(values), max=max(values))


def run_cell(bench: Bench, p: Preset, bs: int, mode: str, pairs: int, profile: bool) -> dict[str, Any]:
    """`pairs` off/on pairs in ABBA order, then one profiled run per arm."""
    per_run: dict[str, list[float]] = {"plain": [], "fused": []}
    accept: dict[str, list[float]] = {"plain": [], "fused": []}
    ratios = []
    for i in range(pairs):
        order = ("plain", "fused") if i % 2 == 0 else ("fused", "plain")
        got = {}
        for arm in order:
            r = bench.run(p, bs, mode, arm)
            got[arm] = statistics.median(r["wall_ms"])
            per_run[arm].append(got[arm])
            accept[arm].append(r["accept_length"])
        ratios.append(got["plain"] / got["fused"])
    row: dict[str, Any] = dict(model=p.label, batch_size=bs, mode=mode, pairs=pairs,
                               speedup=summarize(ratios), arms={})
    for arm in ("plain", "fused"):
        wall = summarize(per_run[arm])
        acc = statistics.median(accept[arm])
        tokens_per_iter = bs * acc
        a: dict[str, Any] = dict(wall_ms=wall, run_medians_ms=per_run[arm], accept_length=acc,
                                 tokens_per_s=tokens_per_iter / (wall["median"] / 1e3))
        r = bench.run(p, bs, mode, arm, profile=True) if profile else {}
        if "gpu_note" in r:
            a["gpu_note"] = r["gpu_note"]
        elif r:
            gpu = statistics.median(r["gpu_ms"])
            a.update(gpu_ms=summarize(r["gpu_ms"]), busy_share=gpu / wall["median"],
                     profiled_wall_ms=statistics.median(r["profiled_wall_ms"]),
                     profiled_busy_share=gpu / statistics.median(r["gpu_span_ms"]),
                     kernels_per_iteration=r["kernels_per_iteration"])
        row["arms"][arm] = a
    return row


def _fmt(s: dict[str, float], unit: str = "", prec: int = 2) -> str:
    return f"{s['median']:.{prec}f}{unit} [{s['min']:.{prec}f}–{s['max']:.{prec}f}]"


def line(row: dict[str, Any]) -> str:
    """One console line per cell."""
    parts = [f"{row['model'][:26]:26s} bs {row['batch_size']:3d} {row['mode']:6s}"]
    for arm in ("plain", "fused"):
        a = row["arms"][arm]
        busy = f" busy {a['busy_share']:.2f}" if "busy_share" in a else ""
        parts.append(f"{arm} {a['wall_ms']['median']:7.2f} ms{busy}")
    parts.append(f"speedup {row['speedup']['median']:.3f}")
    return " | ".join(parts)


def markdown(doc: dict[str, Any]) -> str:
    """The results as a markdown table with the provenance above it."""
    v = doc["versions"]
    out = [
        "# Engine speed (`benchmarks/engine_speed.py`)", "",
        f"- GPU: {doc['gpu']} (SM {doc['capability']}), {doc['date']}",
        f"- versions: torch {v.get('torch')}, CUDA {v.get('cuda')}, flashinfer {v.get('flashinfer')}, "
        f"Python {v.get('python')}, specscope commit {v.get('git_commit')}",
        f"- command: `{doc['command']}`",
        f"- {doc['pairs']} alternating off/on pairs per cell (ABBA); wall = median of steady iterations per run, "
        "then median [min–max] over runs; GPU = kernel busy time per iteration (profiled run, CUDA activity); "
        "busy share = GPU / wall; tokens/s = batch × accept length / wall.",
        f"- targets: busy share ≥ {TARGETS['busy_share_8b']} at the 8B shape (bs 1 and 64); tiny ≤ "
        f"{TARGETS['tiny_bs1_ms']} ms per iteration at bs 1.", "",
        "| model | bs | mode | fused ops | wall ms | GPU ms | busy share | kernels/iter | tokens/s | accept len "
        "| speedup (off/on) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in doc["rows"]:
        for arm in ("plain", "fused"):
            a = row["arms"][arm]
            gpu = _fmt(a["gpu_ms"]) if "gpu_ms" in a else "—"
            busy = f"{a['busy_share']:.2f}" if "busy_share" in a else "—"
            kern = f"{a['kernels_per_iteration']:.0f}" if "kernels_per_iteration" in a else "—"
            sp = _fmt(row["speedup"], prec=3) if arm == "fused" else ""
            out.append(f"| {row['model']} | {row['batch_size']} | {row['mode']} | {'on' if arm == 'fused' else 'off'} "
                       f"| {_fmt(a['wall_ms'])} | {gpu} | {busy} | {kern} | {a['tokens_per_s']:,.0f} "
                       f"| {a['accept_length']:.2f} | {sp} |")
    out.append("")
    return "\n".join(out)


def versions(torch: Any) -> dict[str, Any]:
    """Versions and the git commit the numbers belong to."""
    v: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import flashinfer

        v["flashinfer"] = flashinfer.__version__
    except ImportError:
        v["flashinfer"] = None
    from specscope.backend.session import git_commit

    commit = git_commit()  # also on a `git archive` copy, how GPU hosts get the tree
    v["git_commit"] = commit[:7] if commit else None
    return v


def load_torch() -> Any:
    """torch with a CUDA GPU and flashinfer, or a BenchError saying which is missing."""
    try:
        import torch
    except ImportError:
        raise BenchError("torch is not installed (pip install -e \".[gpu]\" on a GPU host)") from None
    if not torch.cuda.is_available():
        raise BenchError("needs a CUDA GPU, and torch sees none (this benchmark measures the GPU path)")
    try:
        import flashinfer  # noqa: F401
    except ImportError:
        raise BenchError("flashinfer is not installed (on an offline GPU host: . .gpu/setup.sh)") from None
    return torch


def main(argv: list[str] | None = None) -> int:
    """Run the cells and write the results; returns the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    try:
        torch = load_torch()
        bench = Bench(torch, args.spec_steps)
        table = presets(args.quick)
        rows = []
        t0 = time.perf_counter()
        for name in args.models:
            p = table[name]
            for bs in args.batch_sizes:
                for mode in args.modes:
                    row = run_cell(bench, p, bs, mode, args.pairs, not args.no_profile)
                    rows.append(row)
                    print(line(row), flush=True)
            bench.drop_models()
    except BenchError as e:
        print(f"engine_speed: error: {e}", file=sys.stderr)
        return 2
    doc = dict(benchmark="engine_speed", gpu=torch.cuda.get_device_name(),
               capability=".".join(map(str, torch.cuda.get_device_capability())), versions=versions(torch),
               date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
               command="python benchmarks/engine_speed.py " + shlex.join(argv), pairs=args.pairs,
               quick=args.quick, spec_steps=args.spec_steps, seconds=round(time.perf_counter() - t0, 1),
               fused_ops_setting=bench.fused_setting, targets=TARGETS,
               presets={n: dict(vars(table[n])) for n in args.models}, rows=rows)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_speed.json").write_text(json.dumps(doc, indent=1))
    (out / "engine_speed.md").write_text(markdown(doc))
    print(f"wrote {out / 'engine_speed.json'} and {out / 'engine_speed.md'} in {doc['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
