"""One `specscope run`: resolve the device, load the models, pick the kernels, open the trace, run, summarize."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..tracer.process_writer import ProcessTraceWriter
from ..tracer.recorder import NullRecorder, Recorder, is_sticky_cuda_error, keep_until_exit
from ..tracer.schema import RunInfo
from .control import ControlledRecorder, ControlPoint, RunStopped
from .engine import Engine, RunStats
from .engine_config import ConfigError, EngineConfig
from .loader import load_model, tokenizer_kind
from .request import Request
from .workload import make_requests


@dataclass
class SessionResult:
    """What a run produced."""

    stats: RunStats
    requests: list[Request]
    trace_path: str | None
    device_name: str
    kernels: str
    check: tuple[int, int, int] | None = None  # (checked through step, errors, warnings) from the live checker


def resolve_device(device: str) -> str:
    """"auto" -> "cuda" when a GPU is visible, else "cpu"; "cuda" without a GPU is a ConfigError."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("--device cuda was asked for, but torch sees no CUDA GPU")
    if device != "cpu" and not device.startswith("cuda"):
        raise ConfigError(f"unknown --device {device!r} (use auto, cpu or cuda)")
    return device


def select_kernels(cfg: EngineConfig) -> Any:
    """The attention kernels for the device: reference on the CPU, flashinfer by architecture on a GPU."""
    if cfg.device == "cpu":
        from .reference_attention import ReferenceKernels

        return ReferenceKernels()
    from .flashinfer_kernels import make_flashinfer_kernels

    return make_flashinfer_kernels(torch.device(cfg.device), prefill=cfg.prefill_kernel)


_SOURCE_DIR = Path(__file__).resolve().parent  # the specscope checkout a run's git commit and dirty flag describe


def _quiet(cmd: list[str], cwd: Path | None = None, timeout: float = 5.0) -> str | None:
    """stdout of `cmd`, or None when it is missing, fails or hangs (never a traceback: git or nvidia-smi may be
    absent)."""
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_commit(cwd: Path = _SOURCE_DIR) -> str | None:
    """The commit of the specscope tree at `cwd` (git, or the file a `git archive` copy carries), or None."""
    out = _quiet(["git", "rev-parse", "HEAD"], cwd)
    return (out or "").strip() or archive_commit()


def archive_commit() -> str | None:
    """The commit a `git archive` copy of the checkout was made from (git fills backend/archive_commit.txt in an
    archive: .gitattributes export-subst), or None in a checkout, where git itself answers."""
    try:
        text = (_SOURCE_DIR / "archive_commit.txt").read_text().strip()
    except OSError:
        return None
    return text if text and not text.startswith("$Format") else None


def git_dirty(cwd: Path = _SOURCE_DIR) -> str | None:
    """"true" when the git tree at `cwd` has uncommitted changes (untracked files count), "false" when clean,
    None when there is no git or no repository."""
    out = _quiet(["git", "status", "--porcelain"], cwd)
    return None if out is None else ("true" if out.strip() else "false")


def nvidia_driver() -> str | None:
    """The NVIDIA driver version nvidia-smi reports (the first GPU's; all GPUs of a host share one), or None."""
    out = _quiet(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], timeout=10.0)
    lines = [x.strip() for x in (out or "").splitlines() if x.strip()]
    return lines[0] if lines else None


def _versions(dev: torch.device | None = None) -> dict[str, str]:
    v = {"python": platform.python_version(), "torch": torch.__version__}
    dirty = git_dirty()
    if dirty is not None:
        v["git_dirty"] = dirty  # bug-report bundles name it beside the git commit (tracer/export/bundle.py)
    if dev is not None and dev.type == "cuda":
        driver = nvidia_driver()
        if driver is not None:
            v["nvidia_driver"] = driver
    try:
        from importlib.metadata import version

        v["specscope"] = version("specscope")
    except Exception:  # noqa: BLE001 - running from a source tree
        v["specscope"] = "source"
    try:
        import flashinfer

        v["flashinfer"] = flashinfer.__version__
    except Exception:  # noqa: BLE001 - flashinfer is only on GPU hosts
        pass
    if torch.version.cuda:
        v["cuda"] = torch.version.cuda
    return v


def run_session(cfg: EngineConfig, trace_path: str | None, *, command: str, overwrite: bool = False,
                progress: Callable[[int, int], None] | None = None, random_weights: bool = False,
                control: ControlPoint | None = None, check: bool = True) -> SessionResult:
    """Run `cfg` end to end, recording into `trace_path` (no trace when None); `control` lets a live viewer
    pause the engine after each recorded step (backend/control.py); `check` runs the invariant catalogue beside
    the writer (a separate process, tracer/live_check.py), so the trace carries its violations."""
    cfg.device = resolve_device(cfg.device)
    cfg.validate()
    dev = torch.device(cfg.device)
    if dev.type == "cpu":
        # The embedded models are tiny: intra-op threads cost more than they save on small matmuls, and
        # collapse (x40) when another process shares the cores. SPECSCOPE_CPU_THREADS overrides.
        torch.set_num_threads(int(os.environ.get("SPECSCOPE_CPU_THREADS", "1")))
    elif dev.index is not None:
        # Kernels that launch on "the current stream" (flashinfer's, the recorder's stamps) must find this device.
        torch.cuda.set_device(dev)
    target = load_model(cfg.model, device=dev, dtype=cfg.torch_dtype, random_weights=random_weights,
                        seed=cfg.seed)
    draft = None
    if cfg.spec_steps > 0:
        draft = load_model(cfg.draft, device=dev, dtype=cfg.torch_dtype, random_weights=random_weights,
                           seed=cfg.seed + 1)
        if draft[1].vocab_size != target[1].vocab_size:
            raise ConfigError(f"draft vocab ({draft[1].vocab_size}) differs from target vocab "
                              f"({target[1].vocab_size})")
    tcfg = target[1]
    byte_level = tokenizer_kind(tcfg) == "bytes"
    stops = frozenset() if cfg.ignore_eos else frozenset(tcfg.eos_token_ids)
    requests = make_requests(num_requests=cfg.num_requests, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed,
                             vocab_size=tcfg.vocab_size, byte_level=byte_level, prompt_len=cfg.prompt_len,
                             arrival_gap=cfg.arrival_gap, stop_token_ids=stops)
    need = cfg.prompt_len[1] + cfg.max_new_tokens + 2 * cfg.verify_tokens + 2
    cfg.max_context_len = -(-need // cfg.page_size) * cfg.page_size
    if cfg.max_context_len > tcfg.max_position_embeddings:
        raise ConfigError(f"prompts + --max-new-tokens need {need} positions, more than the model's "
                          f"{tcfg.max_position_embeddings}")
    kernels = select_kernels(cfg)
    device_name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    cap = ".".join(map(str, torch.cuda.get_device_capability(dev))) if dev.type == "cuda" else None
    writer = None
    recorder: Recorder | NullRecorder = NullRecorder()
    if trace_path:
        info = RunInfo(command=command, config=cfg.to_dict(), target_model=str(cfg.model),
                       draft_model=str(cfg.draft) if cfg.spec_steps else None, device=device_name,
                       device_capability=cap, attention_kernel=kernels.name, versions=_versions(dev),
                       git_commit=git_commit(), start_ns=time.time_ns(), hostname=socket.gethostname())
        writer = ProcessTraceWriter(trace_path, info, overwrite=overwrite, check=check)
        try:
            recorder = Recorder(writer, dev)
        except RuntimeError as e:  # no device stamps on this GPU / driver: say so, leave no empty trace behind
            writer.close()
            with contextlib.suppress(OSError):
                os.remove(trace_path)
            raise ConfigError(f"cannot record on {device_name}: {e} (--no-trace runs without recording)") from e
    if control is not None:
        recorder = ControlledRecorder(recorder, control)  # type: ignore[assignment]
    engine = None
    try:
        engine = Engine(cfg, target, draft, kernels, recorder)
        stats = engine.run(requests, progress)
    except RunStopped:
        stats = engine.stats if engine is not None else RunStats()  # the viewer stopped the run: a clean end
    except BaseException as e:
        if is_sticky_cuda_error(e):
            # The CUDA context is dead: the engine's tensors (freed as the traceback's frames go) must outlive it.
            keep_until_exit(e, engine, target, draft, kernels)
        raise
    finally:
        # Everything recorded so far reaches the file even when the run fails part-way.
        recorder.close()
        if control is not None:
            control.close()
    cr = None if writer is None else writer.check_result
    verdict = None if cr is None else (cr.checked_through, cr.num_errors, cr.num_warnings)
    return SessionResult(stats, requests, trace_path, device_name, kernels.name, verdict)

