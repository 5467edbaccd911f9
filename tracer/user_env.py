"""The environment variables specscope reads, each a user's setting documented in the README.

Every read of the process environment in specscope's packages goes through this module (an AST test,
`tests/unit/test_environment_reads.py`, fails on any other): an engine option is an `EngineConfig` field and a
`run` flag, never a variable, and a measurement variant is an object `benchmarks/` injects. Torch-free, so the
reading side, the SGLang hook and the CLI all use it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

DEBUG = "SPECSCOPE_DEBUG"  # set (non-empty): a failing command prints its traceback instead of one line
TRACE = "SPECSCOPE_TRACE"  # `sglang-hook`: the trace path template a hooked SGLang process records into
TRACE_OVERWRITE = "SPECSCOPE_TRACE_OVERWRITE"  # "1": the hook may replace an existing trace file
TARGET_MODEL = "SPECSCOPE_TARGET_MODEL"  # the target model's name a recorded SGLang run is labelled with
DRAFT_MODEL = "SPECSCOPE_DRAFT_MODEL"  # the draft model's name a recorded SGLang run is labelled with
SAMPLES = "SPECSCOPE_SAMPLES"  # the embedded models' folder, for an install without the source tree beside it
NVTX = "SPECSCOPE_NVTX"  # "1" / "0": NVTX ranges on or off (default: on while a profiler that reads them runs)
SGLANG_WHEELS = "SPECSCOPE_SGLANG_WHEELS"  # `sglang-audit --version X`: folders (os.pathsep) holding SGLang wheels
# SGLang's own switch for its plan stream: `sglang-audit` judges a server started in this environment.
SGLANG_PLAN_STREAM = "SGLANG_ENABLE_OVERLAP_PLAN_STREAM"
# The rank a launcher (SGLang's TP workers, torchrun) gives a process, in the order the hook asks.
RANK_VARS = ("TP_RANK", "RANK", "LOCAL_RANK")
# Set by Nsight Systems / Nsight Compute in the processes they profile: NVTX ranges then reach a tool.
PROFILER_VARS = ("NVTX_INJECTION64_PATH", "CUDA_INJECTION64_PATH")

DOCUMENTED = (DEBUG, TRACE, TRACE_OVERWRITE, TARGET_MODEL, DRAFT_MODEL, SAMPLES, NVTX, SGLANG_WHEELS,
              SGLANG_PLAN_STREAM, *RANK_VARS, *PROFILER_VARS)


def get(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of one documented variable (None when unset); `environ` replaces the process environment."""
    if name not in DOCUMENTED:
        raise KeyError(f"{name} is not a documented specscope variable (tracer/user_env.py lists them)")
    return (os.environ if environ is None else environ).get(name)


def debug() -> bool:
    """Whether a failing command should print its traceback (SPECSCOPE_DEBUG set and non-empty)."""
    return bool(get(DEBUG))


def rank(environ: Mapping[str, str] | None = None) -> str:
    """The process's rank as its launcher set it ("0" when none did)."""
    return next((v for k in RANK_VARS if (v := get(k, environ)) is not None), "0")


def profiler_attached(environ: Mapping[str, str] | None = None) -> bool:
    """Whether an NVIDIA profiler injected itself into this process (NVTX ranges would reach it)."""
    return any(get(k, environ) for k in PROFILER_VARS)


def path_list(name: str) -> list[str]:
    """A documented variable holding folders separated by os.pathsep, as a list (empty when unset)."""
    return [d for d in (get(name) or "").split(os.pathsep) if d]
