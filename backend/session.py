"""One `specscope run`: resolve the device, load the models, pick the kernels, open the trace, run, summarize."""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..tracer.errors import TraceError
from ..tracer.live_check import CheckResult, LiveCheck
from ..tracer.probe import NullProbe, Probe, is_sticky_cuda_error
from ..tracer.process_writer import ProcessTraceWriter
from ..tracer.recorder import Recorder
from ..tracer.run_end import keep_until_exit
from ..tracer.schema import RunInfo
from . import fused_ops
from .control import ControlPoint, RunStopped
from .engine import Engine
from .engine_config import ConfigError, EngineConfig
from .loader import load_model, tokenizer_kind
from .model import LlamaForCausalLM
from .model_config import ModelConfig
from .request import Request
from .run_stats import RunStats
from .workload import make_requests

# What a traced session records through: a factory of (the trace's writer, the device). The tracer's Recorder;
# benchmarks/ hand in measurement-only subclasses (benchmarks/recorder_ablation.py).
RecorderFactory = Callable[[ProcessTraceWriter, torch.device], Recorder]


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


def git_commit(cwd: Path | None = None, archive_file: Path | None = None) -> str | None:
    """The commit of the git tree at `cwd` (default: this specscope tree), or None. Without git's answer (no git, or
    no repository there) it is the one `archive_file` names (default: this specscope tree's
    backend/archive_commit.txt, and only when `cwd` is inside that tree: the file describes its own tree, not
    whatever folder was asked about)."""
    cwd = _SOURCE_DIR if cwd is None else cwd
    out = (_quiet(["git", "rev-parse", "HEAD"], cwd) or "").strip()
    if out:
        return out
    if archive_file is None:
        root = _SOURCE_DIR.parent  # the tree a `git archive` copy unpacks: the package's top folder
        if not Path(cwd).resolve().is_relative_to(root.resolve()):
            return None
        archive_file = _SOURCE_DIR / "archive_commit.txt"
    return archive_commit(archive_file)


def archive_commit(path: Path | None = None) -> str | None:
    """The commit a `git archive` copy was made from: what git filled into `path` (default: this tree's
    backend/archive_commit.txt, .gitattributes export-subst), or None in a checkout (git leaves the placeholder,
    and git itself answers there) or without the file."""
    try:
        text = (path or _SOURCE_DIR / "archive_commit.txt").read_text().strip()
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


@dataclass
class _Parts:
    """What a session builds before its engine: the device's models, the workload, the kernels, the trace."""

    cfg: EngineConfig
    trace_path: str | None
    target: tuple[LlamaForCausalLM, ModelConfig]
    draft: tuple[LlamaForCausalLM, ModelConfig] | None
    tcfg: ModelConfig
    byte_level: bool
    stops: frozenset[int]
    requests: list[Request]
    kernels: Any
    device_name: str
    writer: ProcessTraceWriter | None
    recorder: Probe
    control: ControlPoint | None
    engine: Engine | None = None
    ended_by: BaseException | None = None  # what ended the run early (the trace's end record says), None: nothing
    checker: LiveCheck | None = None  # the live checker beside the writer (a trace with checking on)


def _prepare(cfg: EngineConfig, trace_path: str | None, *, command: str, overwrite: bool, random_weights: bool,
             control: ControlPoint | None, check: bool, recorder_factory: RecorderFactory) -> _Parts:
    """Device, models, the cfg's requests, kernels, writer, recorder and live checker: everything a run needs but
    the engine."""
    cfg.device = resolve_device(cfg.device)
    cfg.validate()
    dev = torch.device(cfg.device)
    if dev.type == "cpu":
        # The embedded models are tiny: intra-op threads cost more than they save on small matmuls, and
        # collapse (x40) when another process shares the cores; --cpu-threads (default 1) sets them.
        torch.set_num_threads(cfg.cpu_threads)
    elif dev.index is not None:
        # Kernels that launch on "the current stream" (flashinfer's, the recorder's stamps) must find this device.
        torch.cuda.set_device(dev)
    target = load_model(cfg.model, device=dev, dtype=cfg.torch_dtype, random_weights=random_weights,
                        seed=cfg.seed)
    draft = None
    if cfg.spec_steps > 0:
        assert cfg.draft  # validate() refuses speculation without a draft
        draft = load_model(cfg.draft, device=dev, dtype=cfg.torch_dtype, random_weights=random_weights,
                           seed=cfg.seed + 1)
        if draft[1].vocab_size != target[1].vocab_size:
            raise ConfigError(f"draft vocab ({draft[1].vocab_size}) differs from target vocab "
                              f"({target[1].vocab_size})")
    try:  # refused here, before any kernel runs: "flashinfer" where flashinfer cannot run
        fused_ops.ops_for(dev, cfg.torch_dtype, cfg.fused_ops)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    for model, _ in (target, draft) if draft is not None else (target,):
        model.set_ops(cfg.fused_ops)
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
    checker = None
    recorder: Probe = NullProbe()
    if trace_path:
        info = RunInfo(command=command, config=cfg.to_dict(), target_model=str(cfg.model),
                       draft_model=str(cfg.draft) if cfg.spec_steps else None, device=device_name,
                       device_capability=cap, attention_kernel=kernels.name, versions=_versions(dev),
                       git_commit=git_commit(), start_ns=time.time_ns(), hostname=socket.gethostname())
        writer = ProcessTraceWriter(trace_path, info, overwrite=overwrite)
        try:
            recorder = recorder_factory(writer, dev)
        except RuntimeError as e:  # no device stamps on this GPU / driver: say so, leave no empty trace behind
            writer.close()
            with contextlib.suppress(OSError):
                os.remove(trace_path)
            raise ConfigError(f"cannot record on {device_name}: {e} (--no-trace runs without recording)") from e
        if check:  # the writer has created the trace: the checker follows it from its first step
            checker = LiveCheck(trace_path)
    return _Parts(cfg, trace_path, target, draft, tcfg, byte_level, stops, requests, kernels, device_name, writer,
                  recorder, control, checker=checker)


def _close_trace(parts: _Parts) -> None:
    """Close the recorder (and with it the writer), then wait for the live checker's last verdicts: it checks up
    to the last step the writer committed. A writer's error is the one raised; a checker's, only without one."""
    checker = parts.checker
    try:
        parts.recorder.close(parts.ended_by, stopped=isinstance(parts.ended_by, RunStopped))
    except BaseException as e:
        if checker is not None:
            if isinstance(e, TraceError):  # the writer failed: the verdicts on what it committed still land
                with contextlib.suppress(TraceError):
                    checker.finish()
            else:  # Ctrl-C or a failure before the writer closed: nobody waits; it checks what is there and exits
                checker.abort()
        raise
    if checker is not None:
        checker.finish()


@contextlib.contextmanager
def _engine_scope(parts: _Parts) -> Iterator[Engine]:
    """Build the engine (graph capture included); on the way out, close the trace and the control point, and
    keep a dead CUDA context's tensors alive past a sticky CUDA error."""
    try:
        # The live viewer holds the run between forwards through the engine's step callback, traced or not.
        on_step_end = parts.control.after_step if parts.control is not None else None
        parts.engine = Engine(parts.cfg, parts.target, parts.draft, parts.kernels, parts.recorder, on_step_end)
        yield parts.engine
    except BaseException as e:
        parts.ended_by = parts.ended_by or e
        if is_sticky_cuda_error(e):
            # The CUDA context is dead: the engine's tensors (freed as the traceback's frames go) must outlive it.
            keep_until_exit(e, parts.engine, parts.target, parts.draft, parts.kernels)
        raise
    finally:
        # Everything recorded so far reaches the file even when the run fails part-way, with how it ended: a stop
        # the viewer asked for, Ctrl-C, a CUDA error or another exception (the recorder's end record).
        _close_trace(parts)
        if parts.control is not None:
            parts.control.close()


@dataclass
class OpenSession:
    """An engine built once (models, kernels, CUDA graphs, trace) that serves several workloads in turn."""

    engine: Engine
    requests: list[Request]  # the cfg's workload, as run_session serves it
    device_name: str
    kernels: str  # the attention kernels' name
    trace_path: str | None
    writer: ProcessTraceWriter | None
    _parts: _Parts = field(repr=False)
    _used_ids: set[int] = field(default_factory=set, repr=False)  # ids of the requests this engine has served
    _next_id: int = field(default=0, repr=False)  # the next id fresh_requests hands out
    _failed: bool = field(default=False, repr=False)  # a run raised or was stopped: its requests hold KV slots

    @property
    def stats(self) -> RunStats:
        """The statistics of the latest (or current, or stopped) run."""
        return self.engine.stats

    @property
    def check_result(self) -> CheckResult | None:
        """The live checker's summary once the session closed (None: no trace, checking off, or still open)."""
        checker = self._parts.checker
        return None if checker is None else checker.result

    def run(self, requests: list[Request], progress: Callable[[int, int], None] | None = None) -> RunStats:
        """Serve `requests` to completion on this engine with a fresh RunStats, which is returned.

        Arrivals count from the start of this run: each request's `arrival_iteration` is shifted (in place) by
        the iterations the engine has already run, so the trace's iterations keep increasing. Request ids must be
        new to this session (the trace keys requests by id; `fresh_requests` numbers them on). `iterations` of
        the result counts this run's iterations only. After a run that raised (or was stopped), its requests still
        hold slots and pages: the engine serves no further run."""
        if self._failed:
            raise RuntimeError("an earlier run on this engine did not finish; its requests still hold KV slots")
        ids = [r.request_id for r in requests]
        reused = sorted(set(ids) & self._used_ids) or sorted({i for i in ids if ids.count(i) > 1})
        if reused:
            raise ValueError(f"request id {reused[0]} was already served in this session (use fresh_requests)")
        if any(r.output or r.kv is not None or r.finish_iteration is not None for r in requests):
            raise ValueError("these requests were already served: make new ones (fresh_requests)")
        engine = self.engine
        start = engine.iteration
        for r in requests:
            r.arrival_iteration += start
        self._used_ids.update(ids)
        engine.stats = RunStats(accepted_by_position=[0] * engine.num_drafts)
        self._failed = True  # until engine.run returns
        stats = engine.run(requests, progress)
        self._failed = False
        stats.iterations = engine.iteration - start
        return stats

    def fresh_requests(self, seed: int) -> list[Request]:
        """A workload of the cfg's shape (count, lengths, arrival gaps, stop tokens) drawn with `seed`, its ids
        numbered after every id this session has handed out."""
        p, cfg = self._parts, self._parts.cfg
        reqs = make_requests(num_requests=cfg.num_requests, max_new_tokens=cfg.max_new_tokens, seed=seed,
                             vocab_size=p.tcfg.vocab_size, byte_level=p.byte_level, prompt_len=cfg.prompt_len,
                             arrival_gap=cfg.arrival_gap, stop_token_ids=p.stops)
        first = max([self._next_id, *(r.request_id + 1 for r in self.requests), *(i + 1 for i in self._used_ids)])
        for i, r in enumerate(reqs):
            r.request_id = first + i
        self._next_id = first + len(reqs)
        return reqs


@contextlib.contextmanager
def _session(parts: _Parts) -> Iterator[OpenSession]:
    """`parts` with its engine built, as an OpenSession; closed as `_engine_scope` closes."""
    with _engine_scope(parts) as engine:
        yield OpenSession(engine, parts.requests, parts.device_name, parts.kernels.name, parts.trace_path,
                          parts.writer, parts)


@contextlib.contextmanager
def open_session(cfg: EngineConfig, trace_path: str | None, *, command: str, overwrite: bool = False,
                 random_weights: bool = False, control: ControlPoint | None = None,
                 check: bool = True, recorder: RecorderFactory = Recorder) -> Iterator[OpenSession]:
    """Build `cfg`'s engine once (device, models, the cfg's requests, kernels, trace writer, recorder, CUDA
    graphs) and yield it as an OpenSession that runs workloads in turn; on exit the trace is closed (the live
    checker's verdict is then on `check_result`) and the control point hung up. `check` starts the live checker
    beside the writer (tracer/live_check.py) when there is a trace. `recorder` makes the trace's recorder from its
    writer and the device (with a trace only)."""
    parts = _prepare(cfg, trace_path, command=command, overwrite=overwrite, random_weights=random_weights,
                     control=control, check=check, recorder_factory=recorder)
    with _session(parts) as session:
        yield session


def run_session(cfg: EngineConfig, trace_path: str | None, *, command: str, overwrite: bool = False,
                progress: Callable[[int, int], None] | None = None, random_weights: bool = False,
                control: ControlPoint | None = None, check: bool = True,
                recorder: RecorderFactory = Recorder) -> SessionResult:
    """Run `cfg` end to end, recording into `trace_path` (no trace when None); `control` lets a live viewer
    pause the engine after each forward, recorded or not (backend/control.py); `check` runs the invariant catalogue
    beside the writer (a separate process the session starts and finishes, tracer/live_check.py), so the trace carries
    its violations; `recorder` makes the trace's recorder from its writer and the device (the tracer's Recorder
    unless a caller hands in another)."""
    parts = _prepare(cfg, trace_path, command=command, overwrite=overwrite, random_weights=random_weights,
                     control=control, check=check, recorder_factory=recorder)
    # open_session's two halves, kept apart so a stop during graph capture still has the workload to report.
    try:
        with _session(parts) as session:
            try:
                stats = session.run(parts.requests, progress)
            except RunStopped as e:
                parts.ended_by = e  # the viewer stopped the run: a clean end, recorded as a stop
                stats = session.stats
    except RunStopped:
        stats = RunStats()  # stopped during graph capture, before the engine was built: a clean end too
    cr = None if parts.checker is None else parts.checker.result
    verdict = None if cr is None else (cr.checked_through, cr.num_errors, cr.num_warnings)
    return SessionResult(stats, parts.requests, trace_path, parts.device_name, parts.kernels.name, verdict)
