"""`specscope run`: drive real draft/verify steps through the instrumented backend and record a trace."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `run`."""
    p = subparsers.add_parser("run", help="run draft/verify steps on the GPU (or CPU) and record a trace",
                              description="Run speculative decoding through the instrumented TRTLLM MHA backend "
                                          "and record every step into a trace.")
    add_run_arguments(p)
    p.set_defaults(run=run)


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The engine's flags (shared by `run` and `demo`)."""
    g = p.add_argument_group("models")
    g.add_argument("--model", default="tiny", help="target: a folder with config.json (+ safetensors), or 'tiny'")
    g.add_argument("--draft", default="tiny", help="draft: a folder, or 'tiny' (the embedded draft)")
    g.add_argument("--random-weights", action="store_true",
                   help="ignore safetensors and use seeded random weights (benchmarks at real model sizes)")
    g.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16", "float64"],
                   help="model and KV dtype (auto: bfloat16 on a GPU, float32 on the CPU)")
    g = p.add_argument_group("batch")
    g.add_argument("--device", default="auto", help="auto, cpu or cuda[:N]")
    g.add_argument("--batch-size", type=int, default=4, help="most requests running at once (default 4)")
    g.add_argument("--requests", type=int, default=8, help="requests to serve (default 8)")
    g.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate per request (default 32)")
    g.add_argument("--prompt-len", type=_pair, default=(24, 160), metavar="MIN,MAX",
                   help="prompt length range in tokens (default 24,160)")
    g.add_argument("--ignore-eos", action="store_true", help="do not stop requests at the model's EOS token")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("speculative decoding")
    g.add_argument("--spec-steps", type=int, default=3, help="draft steps N per iteration; 0 = plain decode")
    g.add_argument("--verify-tokens", type=int, default=0, metavar="T",
                   help="tokens per request the verify runner captures (default N+1 = K); a different T "
                        "re-creates adaptive-spec setups where T != K")
    g.add_argument("--temperature", type=float, default=0.0,
                   help="0 = greedy acceptance; > 0 = speculative rejection sampling")
    g = p.add_argument_group("backend")
    g.add_argument("--page-size", type=int, default=64, choices=[16, 32, 64, 128])
    g.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True,
                   help="capture/replay decode, draft decode and verify (emulated on the CPU)")
    g.add_argument("--plan-stream", action=argparse.BooleanOptionalAction, default=False,
                   help="prepare verify / draft-extend metadata on a second stream, overlapping the draft")
    g.add_argument("--prefill-kernel", default="fmha_v2", choices=["fmha_v2", "flashinfer"],
                   help="SM90 extend kernel: TRT-LLM FMHAv2 paged prefill, or flashinfer's paged prefill")
    g.add_argument("--inject", action="append", default=[], metavar="FAULT",
                   help="switch on a known bug class (repeatable); see --list-faults")
    g.add_argument("--list-faults", action="store_true", help="list the injectable faults and exit")
    g = p.add_argument_group("output")
    g.add_argument("-o", "--output", metavar="TRACE", help="trace file to write (default specscope-<time>.db)")
    g.add_argument("--overwrite", action="store_true", help="replace TRACE if it exists")
    g.add_argument("--no-trace", action="store_true", help="record nothing (the plain backend)")
    g.add_argument("--record-attention", type=int, default=0, metavar="N",
                   help="every N steps keep layer 0's attention inputs and outputs, for `check`'s differential "
                        "test (sampled steps sync the GPU once)")
    g.add_argument("--quiet", action="store_true", help="no progress bar")


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


def config_from_args(args: argparse.Namespace):  # -> EngineConfig (torch import deferred)
    """Build the engine config from parsed flags."""
    from specscope.backend.engine_config import EngineConfig
    from specscope.backend.faults import parse_faults

    return EngineConfig(
        model=args.model, draft=("tiny-draft" if args.draft == "tiny" else args.draft) if args.spec_steps else None,
        device=args.device, dtype=args.dtype, batch_size=args.batch_size, num_requests=args.requests,
        max_new_tokens=args.max_new_tokens, spec_steps=args.spec_steps, verify_tokens=args.verify_tokens,
        page_size=args.page_size, cuda_graph=args.cuda_graph, plan_stream=args.plan_stream, seed=args.seed,
        temperature=args.temperature, faults=parse_faults(args.inject), prompt_len=args.prompt_len,
        prefill_kernel=args.prefill_kernel, ignore_eos=args.ignore_eos, record_attention=args.record_attention)


class Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        frac = min(done / max(total, 1), 1.0)
        bar = "#" * int(frac * 30)
        rate = done / max(time.perf_counter() - self.t0, 1e-9)
        sys.stderr.write(f"\r[{bar:<30s}] {done}/{total} tokens  {rate:,.0f} tok/s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def run(args: argparse.Namespace) -> int:
    """Run the engine and print the summary."""
    if args.list_faults:
        return list_faults()
    try:
        cfg = config_from_args(args)
    except ValueError as e:
        print(f"specscope: error: {e}", file=sys.stderr)
        return 2
    out = None if args.no_trace else (args.output or time.strftime("specscope-%Y%m%d-%H%M%S.db"))
    if out and os.path.exists(out) and not args.overwrite:
        print(f"specscope: error: {out} already exists (pass --overwrite to replace it)", file=sys.stderr)
        return 2
    from specscope.backend.engine_config import ConfigError  # noqa: F401 - a ValueError, listed for readers
    from specscope.backend.session import run_session

    progress = Progress(not args.quiet)
    command = "specscope " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else "specscope run"
    try:
        res = run_session(cfg, out, command=command, overwrite=args.overwrite, progress=progress,
                          random_weights=args.random_weights)
    except (ConfigError, FileNotFoundError, ValueError, ImportError) as e:
        # Bad flags, a missing model folder, a kernel rejecting its arguments, no flashinfer: one sentence.
        progress.close()
        print(f"specscope: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    progress.close()
    print_summary(res)
    return 0


def print_summary(res) -> None:  # res: SessionResult
    """tokens/s, mean accept length, acceptance by position, trace path."""
    s = res.stats
    print(f"device        {res.device_name} ({res.kernels} kernels)")
    print(f"requests      {len(res.requests)}  iterations {s.iterations}  output tokens {s.output_tokens}")
    print(f"throughput    {s.output_tokens / max(s.wall_s, 1e-9):,.1f} tokens/s over {s.wall_s:.2f} s")
    if s.mean_accept_length is not None:
        print(f"accept length {s.mean_accept_length:.3f} tokens per verify (bonus included)")
        rates = [n / s.verify_rows for n in s.accepted_by_position]
        print("acceptance    " + "  ".join(f"d{j}={r:.2f}" for j, r in enumerate(rates)))
    if res.trace_path:
        print(f"trace         {res.trace_path}")
