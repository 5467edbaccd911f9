"""`specscope run`: drive real draft/verify steps through the instrumented backend and record a trace."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TextIO

from .args import INT64_MAX, check_writable, integer, one_of, real

if TYPE_CHECKING:  # type names only: `run` validates everything before torch is imported
    from specscope.backend.engine_config import EngineConfig
    from specscope.backend.session import SessionResult

# ops_setting.FUSED_OPS and its aliases (named here so building the parser imports no engine module).
FUSED_OPS = ("auto", "plain", "fused-torch", "flashinfer")
FUSED_OPS_ALIASES = {"on": "auto", "1": "auto", "true": "auto", "off": "plain", "0": "plain", "false": "plain"}


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to each option whose help does not state it and whose default says something."""

    def _get_help_string(self, action: argparse.Action) -> str:
        h = action.help or ""
        d = action.default
        if ("default" in h or d is None or d is False or d is argparse.SUPPRESS or d == []
                or action.option_strings == [] or isinstance(action, argparse._StoreConstAction)):
            return h
        shown = ",".join(map(str, d)) if isinstance(d, tuple) else d
        return f"{h} (default: {shown})"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `run`."""
    p = subparsers.add_parser("run", help="run draft/verify steps on the GPU (or CPU) and record a trace",
                              description="Run speculative decoding through the instrumented TRTLLM MHA backend "
                                          "and record every step into a trace.",
                              formatter_class=DefaultsHelpFormatter)
    add_run_arguments(p)
    add_json_argument(p)
    p.add_argument("--control", metavar="SOCKET", help=argparse.SUPPRESS)  # live TUI's channel (docs/tui.md)
    p.set_defaults(run=run)


def add_run_arguments(p: argparse.ArgumentParser, default_output: str = "specscope-<time>.db") -> None:
    """The engine's flags (shared by `run` and `demo`)."""
    g = p.add_argument_group("models")
    g.add_argument("--model", default="tiny",
                   help="target: a folder with config.json (+ safetensors), or 'tiny' = the embedded target")
    g.add_argument("--draft", default=None,
                   help="draft: a folder, or 'tiny' / 'tiny-draft' = the embedded draft (default: the embedded "
                        "draft; unused with --spec-steps 0)")
    g.add_argument("--random-weights", action="store_true",
                   help="ignore safetensors and use seeded random weights (benchmarks at real model sizes)")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16", "float64"],
                   help="model and KV dtype (auto: bfloat16 on a GPU, float32 on the CPU)")
    g = p.add_argument_group("batch")
    g.add_argument("--device", default="auto", help="auto (the GPU when torch sees one), cpu, cuda or cuda:N")
    g.add_argument("--batch-size", **integer(lo=1), default=4,
                   help="most requests running at once (capped at --requests)")
    g.add_argument("--requests", **integer(lo=1), default=8, help="requests to serve")
    g.add_argument("--max-new-tokens", **integer(lo=1), default=32, help="tokens to generate per request")
    g.add_argument("--prompt-len", type=_pair, default=(24, 160), metavar="MIN,MAX",
                   help="prompt length range in tokens")
    g.add_argument("--ignore-eos", action="store_true", help="do not stop requests at the model's EOS token")
    g.add_argument("--seed", **integer(0, INT64_MAX, "between 0 and 2**63 - 1"), default=0,
                   help="seeds prompts, arrivals, random weights and sampling")
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--spec-steps", **integer(0, 15), default=3, help="draft steps N per iteration; 0 = plain decode")
    g.add_argument("--verify-tokens", **integer(2, 16), default=None, metavar="T",
                   help="tokens per request the verify runner captures, 2..16 (default: N+1 = K); a different "
                        "T re-creates adaptive-spec setups where T != K")
    g.add_argument("--temperature", **real(0.0, what="a finite number >= 0 (0 = greedy)"), default=0.0,
                   help="0 = greedy acceptance; > 0 = speculative rejection sampling")
    g = p.add_argument_group("backend")
    g.add_argument("--page-size", type=int, default=64, choices=[16, 32, 64, 128], help="KV page size in tokens")
    g.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True,
                   help="capture/replay decode, draft decode and verify (emulated on the CPU)")
    g.add_argument("--plan-stream", action=argparse.BooleanOptionalAction, default=False,
                   help="prepare verify / draft-extend metadata on a second stream, overlapping the draft")
    g.add_argument("--prefill-kernel", default=None, choices=["fmha_v2", "flashinfer"],
                   help="SM90 extend kernel: TRT-LLM FMHAv2 paged prefill, or flashinfer's paged prefill "
                        "(default: fmha_v2; GPU only)")
    g.add_argument("--draft-extend-graph", action=argparse.BooleanOptionalAction, default=True,
                   help="capture draft extend too (with --prefill-kernel flashinfer it stays eager: flashinfer's "
                        "prefill plans on the host)")
    g.add_argument("--fused-ops", **one_of(FUSED_OPS, FUSED_OPS_ALIASES), default="auto",
                   help="the decoder's norm / RoPE / SiLU ops: auto = flashinfer's fused kernels on a bf16 or fp16 "
                        "GPU, else plain torch; plain; fused-torch (the fused QKV and gate/up structure in torch); "
                        "flashinfer (a GPU only); on / off mean auto / plain")
    g.add_argument("--cpu-threads", **integer(lo=1), default=1, metavar="N",
                   help="torch's intra-op threads on the CPU device (the embedded models run fastest on one)")
    g.add_argument("--inject", action="append", default=[], metavar="FAULT",
                   help="switch on a known bug class (repeatable); see --list-faults")
    g.add_argument("--list-faults", action="store_true", help="list the injectable faults and exit")
    g = p.add_argument_group("output")
    g.add_argument("-o", "--output", metavar="TRACE", help=f"trace file to write (default: {default_output})")
    g.add_argument("--overwrite", action="store_true", help="replace TRACE if it exists")
    g.add_argument("--no-trace", action="store_true", help="record nothing (the plain backend)")
    g.add_argument("--record-attention", **integer(0, what="0 (off) or a step interval >= 1"), default=0,
                   metavar="N",
                   help="every N steps keep layer 0's attention inputs and outputs, for `check`'s differential "
                        "test (sampled steps sync the GPU once; default: 0 = off)")
    g.add_argument("--quiet", action="store_true",
                   help="no progress: a bar on a terminal; when stderr is not a terminal (a log, CI), one line "
                        f"every {PROGRESS_LOG_S:g} s")


def add_json_argument(p: argparse.ArgumentParser) -> None:
    """`--json` of `run` and `demo` (not of `tui --live`, which shows the run itself)."""
    p.add_argument("--json", action="store_true",
                   help="print the result as JSON on stdout (trace path, steps, verdict counts, throughput, "
                        "acceptance) instead of the summary; warnings and progress stay on stderr")


def _pair(s: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in s.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX, got {s!r}") from None
    if not 1 <= a <= b:
        raise argparse.ArgumentTypeError(f"expected 1 <= MIN <= MAX, got {s!r}")
    return a, b


def list_faults() -> int:
    """Print the fault catalogue."""
    from specscope.backend.faults import FAULTS

    for f in FAULTS:
        print(f"{f.name:32s} {f.description} [caught by {f.expected_check}]")
    return 0


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    """Build the engine config from parsed flags."""
    from specscope.backend.engine_config import EngineConfig
    from specscope.backend.faults import parse_faults

    draft = args.draft or "tiny"
    draft = "tiny-draft" if draft == "tiny" else draft
    return EngineConfig(
        model=args.model, draft=draft if args.spec_steps else None,
        device=args.device, dtype=args.dtype, batch_size=args.batch_size, num_requests=args.requests,
        max_new_tokens=args.max_new_tokens, spec_steps=args.spec_steps,
        verify_tokens=_verify_tokens(args), page_size=args.page_size, cuda_graph=args.cuda_graph,
        plan_stream=args.plan_stream, seed=args.seed, temperature=args.temperature,
        faults=parse_faults(args.inject), prompt_len=args.prompt_len, prefill_kernel=args.prefill_kernel or "fmha_v2",
        ignore_eos=args.ignore_eos, record_attention=args.record_attention, fused_ops=args.fused_ops,
        draft_extend_graph=args.draft_extend_graph, cpu_threads=args.cpu_threads)


def _verify_tokens(args: argparse.Namespace) -> int:
    t = args.verify_tokens
    if t is None:
        return 0  # EngineConfig's "K"
    t = int(t)
    if args.spec_steps and not 2 <= t <= 16:
        raise ValueError(f"--verify-tokens must be between 2 and 16, got {t}")
    if not args.spec_steps:
        raise ValueError(f"--verify-tokens {t} needs --spec-steps > 0 (plain decode has no verify)")
    return t


def check_flags(args: argparse.Namespace) -> list[str]:
    """Flag combinations that cannot mean what was asked: raise ValueError, or return warnings to print."""
    warnings = []
    if args.output is not None and not args.output.strip():
        raise ValueError("-o/--output needs a file name")
    if args.no_trace:
        if args.output is not None:
            raise ValueError("--no-trace records nothing, so -o/--output would be ignored; pass one of them")
        if args.record_attention:
            raise ValueError("--record-attention keeps attention in the trace, but --no-trace records nothing")
        if args.overwrite:
            warnings.append("--overwrite does nothing with --no-trace")
        if args.inject:
            warnings.append("--inject with --no-trace: the fault bites, but no trace records it for `check`")
    if not args.spec_steps:
        if args.draft is not None:
            warnings.append("--draft is unused with --spec-steps 0 (plain decode)")
        if args.plan_stream:
            warnings.append("--plan-stream does nothing with --spec-steps 0 (it plans verify and draft extend)")
    if args.prefill_kernel and args.device == "cpu":
        warnings.append("--prefill-kernel picks a GPU kernel; the CPU runs the reference kernels")
    if not args.draft_extend_graph and (not args.cuda_graph or not args.spec_steps):
        why = "--no-cuda-graph (nothing is captured)" if not args.cuda_graph else "--spec-steps 0 (no draft extend)"
        warnings.append(f"--no-draft-extend-graph does nothing with {why}")
    if args.cpu_threads != 1 and args.device.startswith("cuda"):
        warnings.append("--cpu-threads sets torch's threads on the CPU device; a GPU run does not use it")
    if args.batch_size > args.requests >= 1:
        warnings.append(f"--batch-size {args.batch_size} capped at --requests {args.requests} (more running slots "
                        "than requests would only allocate memory and capture unused graphs)")
    return warnings


def check_output(out: str, overwrite: bool) -> None:
    """The trace path can be written: not a directory, its folder exists and takes a new file, no accidental
    overwrite. Checked by creating a probe file, so /proc or a read-only mount fails here, before torch loads."""
    if os.path.isdir(out):
        raise ValueError(f"{out} is a directory; -o needs a trace file name")
    if os.path.exists(out) and not overwrite:
        raise ValueError(f"{out} already exists (pass --overwrite to replace it)")
    problem = check_writable(out)
    if problem is not None:
        raise ValueError(problem)


def _gpu_visible_without_torch() -> bool:
    # Device nodes of the NVIDIA driver (or WSL's): without them torch cannot see a CUDA GPU either.
    return any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/nvidia0", "/dev/dxg", "/proc/driver/nvidia"))


def preflight(args: argparse.Namespace) -> tuple[EngineConfig, list[str]]:
    """Validate flags, model configs, checkpoints and (CPU) memory without torch; (config, warnings)."""
    from specscope.backend.loader import check_checkpoint

    warnings = check_flags(args)
    cfg = config_from_args(args)
    gpu = _gpu_visible_without_torch()
    if cfg.device.startswith("cuda") and not gpu:
        raise ValueError(f"--device {cfg.device} was asked for, but this machine shows no NVIDIA GPU (no "
                         "/dev/nvidiactl); use --device cpu")
    guess = "cpu" if cfg.device == "auto" and not gpu else None
    cfg.preflight(device=guess)
    if not args.random_weights:
        for m in (cfg.model, cfg.draft if cfg.spec_steps else None):
            if m is not None:
                check_checkpoint(m)
    return cfg, warnings


PROGRESS_LOG_S = 10.0  # a log gets a progress line this often: short runs (tests, the demo) print none


class Progress:
    """Progress on stderr: a one-line bar on a terminal, else a line every PROGRESS_LOG_S seconds (a log file
    or CI keeps whole lines, where the bar's carriage returns would pile up).

    The rate counts from the first finished iteration (model loading and graph capture are not generation),
    and `close` redraws the bar with the run's final throughput, so the bar and the summary agree.
    """

    def __init__(self, enabled: bool, stream: TextIO | None = None,
                 clock: Callable[[], float] = time.perf_counter, tty: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = (stream is not None or sys.stderr.isatty()) if tty is None else tty
        self.clock = clock
        self.first: tuple[float, int] | None = None
        self.last = (0, 1)
        self.next_log: float | None = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = self.clock()
        if self.first is None:
            self.first = (now, done)
            self.next_log = now + PROGRESS_LOG_S
            rate = None
        else:
            rate = (done - self.first[1]) / max(now - self.first[0], 1e-9)
        self.last = (done, total)
        if self.tty:
            self._draw(done, total, rate)
        elif self.next_log is not None and now >= self.next_log:
            self.next_log = now + PROGRESS_LOG_S
            shown = f", {rate:,.0f} tok/s" if rate is not None else ""
            self.stream.write(f"specscope: progress {done}/{total} tokens "
                              f"({min(done / max(total, 1), 1.0):.0%}){shown}\n")
            self.stream.flush()

    def _draw(self, done: int, total: int, rate: float | None) -> None:
        frac = min(done / max(total, 1), 1.0)
        bar = "#" * int(frac * 30)
        shown = f"{rate:,.0f} tok/s" if rate is not None else "..."
        self.stream.write(f"\r[{bar:<30s}] {done}/{total} tokens  {shown}")
        self.stream.flush()

    def close(self, final_rate: float | None = None) -> None:
        """End the bar's line (with the final rate, when the run finished); a log's lines are already whole."""
        if self.enabled and self.tty and self.first is not None:
            if final_rate is not None:
                self._draw(*self.last, final_rate)
            self.stream.write("\n")
        self.enabled = False


def run(args: argparse.Namespace) -> int:
    """Run the engine and print the summary."""
    if args.list_faults:
        return list_faults()
    try:
        cfg, warnings = preflight(args)
        out = None if args.no_trace else (args.output or time.strftime("specscope-%Y%m%d-%H%M%S.db"))
        if out:
            check_output(out, args.overwrite)
    except ValueError as e:  # ConfigError, SizingError, a bad config.json or checkpoint: one sentence
        print(f"specscope: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    for w in warnings:
        print(f"specscope: warning: {w}", file=sys.stderr)
    from specscope.backend.config_error import ConfigError
    from specscope.backend.session import run_session

    progress = Progress(not args.quiet)
    command = "specscope " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else "specscope run"
    try:
        control = None
        if getattr(args, "control", None):  # a live viewer holds the run between forwards (docs/tui.md)
            from specscope.backend.control import ControlPoint

            control = ControlPoint(args.control)
        res = run_session(cfg, out, command=command, overwrite=args.overwrite, progress=progress,
                          random_weights=args.random_weights, control=control)
    except (ConfigError, FileNotFoundError, ValueError, ImportError) as e:
        # A kernel rejecting its arguments, no flashinfer, no GPU: one sentence.
        progress.close()
        print(f"specscope: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        progress.close()
        where = f"; the steps recorded so far are in {out} (specscope info {out})" if out and os.path.exists(out) \
            else ""
        print(f"specscope: interrupted{where}", file=sys.stderr)
        return 130
    s = res.stats
    progress.close(s.output_tokens / max(s.wall_s, 1e-9))
    if getattr(args, "json", False):
        print(json.dumps(result_json(res), indent=1))
    else:
        print_summary(res)
    return 0


def trace_verdicts(path: str) -> dict[str, Any]:
    """Steps and stored verdicts of a finished trace: {steps, errors, warnings, by_id, checked_through}."""
    from specscope.tracer.store import TraceReader

    from .views import check_key

    with TraceReader(path) as r:
        by_id = r.count_violations_by_id()
        return {"steps": r.num_steps(), "errors": len(r.violations(severity="error")),
                "warnings": len(r.violations(severity="warning")),
                "by_id": dict(sorted(by_id.items(), key=lambda kv: check_key(kv[0]))),
                "checked_through": r.checked_through()}


def result_json(res: SessionResult) -> dict[str, Any]:
    """`run --json`: the trace, its steps and verdict counts, and the numbers of the text summary."""
    s = res.stats
    drafted = s.verify_rows * len(s.accepted_by_position)
    verdicts = trace_verdicts(res.trace_path) if res.trace_path else None
    return {
        "trace": res.trace_path,
        "steps": verdicts.pop("steps") if verdicts else None,
        "verdicts": verdicts,
        "device": res.device_name,
        "kernels": res.kernels,
        "requests": len(res.requests),
        "iterations": s.iterations,
        "output_tokens": s.output_tokens,
        "wall_s": s.wall_s,  # generation only: model loading and graph capture excluded
        "tokens_per_s": s.output_tokens / max(s.wall_s, 1e-9),
        "mean_accept_length": s.mean_accept_length,  # bonus token included
        "draft_acceptance": (s.accepted_total - s.verify_rows) / drafted if drafted else None,
        "accept_rate_by_position": [n / s.verify_rows for n in s.accepted_by_position] if s.verify_rows else [],
    }


def print_summary(res: SessionResult) -> None:
    """tokens/s, mean accept length, acceptance by position, trace path."""
    s = res.stats
    print(f"device        {res.device_name} ({res.kernels} kernels)")
    print(f"requests      {len(res.requests)}  iterations {s.iterations}  output tokens {s.output_tokens}")
    print(f"throughput    {s.output_tokens / max(s.wall_s, 1e-9):,.1f} tokens/s over {s.wall_s:.2f} s "
          "(generation only: model loading and graph capture excluded)")
    if s.mean_accept_length is not None:
        print(f"accept length {s.mean_accept_length:.3f} tokens per verify row (bonus token included)")
        drafted = s.verify_rows * len(s.accepted_by_position)
        if drafted:
            accepted = s.accepted_total - s.verify_rows
            print(f"draft accept  {accepted / drafted:.1%} of drafted tokens ({accepted}/{drafted}, bonus excluded)")
        rates = [n / s.verify_rows for n in s.accepted_by_position]
        print("by position   " + "  ".join(f"d{j}={r:.2f}" for j, r in enumerate(rates)))
    if res.trace_path:
        print(f"trace         {res.trace_path}")
    if res.check is not None:
        through, errors, warnings = res.check
        print(f"checks        {errors} errors, {warnings} warnings in steps 0..{through} "
              f"(specscope check {res.trace_path})")
