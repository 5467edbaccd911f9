"""Record a live SGLang `TRTLLMHAAttnBackend` into a specscope trace: every forward it prepares becomes a `Step`.

Usage in-process (a server, a test, a driver script):

    from specscope.integrations import sglang as ss
    tracer = ss.SglangTracer("run.db")                      # opens a TraceWriter
    ss.instrument(trtllm_mha_backend_module, tracer)       # patches its two classes (idempotent)
    ...                                                     # run SGLang as usual
    tracer.close()

In a real server, `specscope sglang-hook install` plus `SPECSCOPE_TRACE=run.db` does the same without editing
SGLang (see `sglang_hook.py` and docs/sglang.md).

What a step holds (names as the engine's recorder writes them, docs/trace-format.md):

- arrays, after the backend's prep (eager `init_forward_metadata`, capture, and each replay's `_apply`):
  `cache_seqlens`, `cu_seqlens_q`, `cu_seqlens_k`, `page_table` (live columns, full shape kept) — exactly the
  tensors in `backend.forward_metadata`, with their device addresses; the batch's `seq_lens`, `seq_lens_cpu`,
  `req_pool_indices`, `positions`, `out_cache_loc`, `req_to_token_page_starts`; `draft_tokens` (verify) and
  `accept_lens` (draft extend) when the spec input carries them.
- scalars: `max_seq_len_q`, `max_seq_len_k` (releases that have it: up to 0.5.13), `kernel_q_len` (the q length
  the kernels run with: the live value eagerly, the value frozen at capture for a graph), `captured_max_seq_len_q`,
  `seq_len_fill_value`, `backend_num_draft_tokens`, `max_context_len`, `speculative_step_id`, `seq_lens_cpu_max`
  (when the batch carries a host mirror); `plan_stream` and `fixup_hook_ok` for verifies once the plan-stream
  fix-up hook ran.
- spans: `host`/`metadata` always; on a CUDA device also CUDA-event spans of the prep on its stream, named
  `compute` for the stream draft decode runs on and `plan` for any other (SGLang's overlap plan stream).
- errors: a `CallError` for each prep or hook call that raised (then re-raised unchanged), e.g.
  `update_verify_buffers_to_fill_after_draft` → `NotImplementedError` on backends without PR #25925.

Facts taken from where SGLang puts them: a replay view carries the padded static `seq_lens` / `req_pool_indices`
but the live `out_cache_loc` (and no positions for the target verify), so the live rows' positions come from the
spec input and padded rows are recorded as the runner's static buffer holds them after replay's copy (zeros).
The live batch size of a replay is the live token count over T. Draft decode step i runs at positions S + i and
writes column i of the request-major `out_cache_loc` (`[bs, num_steps]`). SGLang's backend sees no request ids:
each row's `request_id` is its `req_pool_index`.

Versions (`sglang_versions.facts_for`): a field the release lacks is recorded as absent, never made up, and named in
the run's `config["not_recorded"]["fields"]`; the page table is cropped by the recorded `cache_seqlens` then. From
0.5.15 a graph's metadata is computed inside the graph (`init_forward_metadata_in_graph`, a Triton kernel the
graph records and every replay re-runs): a capture is recorded after that call's warm-up run, and a replay, which
runs it inside `graph.replay()` where Python never sees it, is a step without metadata (header, requests, spans;
`config["not_recorded"]["replay_metadata"]`). `seq_lens_cpu` is recorded when the batch carries one (0.5.14+
backends do not ask for it).

What the trace says beside the steps: `run.config["sglang"]` holds the provenance (version, where the backend was
imported from, the server args that shape attention and speculation, the spec-decoding variables SGLang saw set,
GPU and kernel versions, the rank) and the features specscope does not model that this server uses (ragged verify,
unified KV pool, SWA, CP, FP8/NVFP4 KV, topk > 1). A failure of the recorder never reaches SGLang; it is stored in
the trace's `meta` row `recording_problems` (`SPECSCOPE_DEBUG=1` raises instead).

Recording never changes what the backend computes: it reads the metadata after the original call returns,
copies it (CPU: clone; CUDA: non-blocking copies into pinned memory, resolved when an event completes, so
nothing synchronizes), and never writes to a tensor the backend owns (tested in tests/unit/test_sglang_integration.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import platform
import socket
import sys
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..tracer import schema as S
from ..tracer import user_env
from ..tracer.schema import ArraySnapshot, ForwardMode, GraphPhase, RequestState, RunInfo, Step, StreamSpan
from ..tracer.store import TraceWriter
from .sglang_versions import SglangFacts, facts_for

_NP = {torch.int32: "int32", torch.int64: "int64", torch.int16: "int16", torch.uint8: "uint8", torch.bool: "bool",
       torch.float32: "float32"}
_BACKEND_METHODS = ("__init__", "init_forward_metadata", "init_forward_metadata_out_graph",
                    "init_forward_metadata_in_graph", "init_forward_metadata_capture_cuda_graph",
                    "init_forward_metadata_replay_cuda_graph", "update_verify_buffers_to_fill_after_draft")
_WRAPPER_METHODS = ("init_forward_metadata", "init_forward_metadata_out_graph", "init_forward_metadata_in_graph",
                    "init_forward_metadata_capture_cuda_graph", "init_forward_metadata_replay_cuda_graph")
FIXUP = "update_verify_buffers_to_fill_after_draft"
IN_GRAPH = "init_forward_metadata_in_graph"
# The text the checker reads in run.config["not_recorded"]["replay_metadata"] (agreed with tracer/checks/).
REPLAY_METADATA_IN_GRAPH = "computed inside the graph (SGLang 0.5.15+)"
# Server args that shape attention and speculation, by the names any release 0.5.12 ... 0.5.23 gives them (0.5.2x
# splits the CUDA-graph flags per phase); only those the server's args object has are recorded.
SERVER_ARGS = (
    "model_path", "speculative_draft_model_path", "attention_backend", "prefill_attention_backend",
    "decode_attention_backend", "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
    "speculative_num_draft_tokens", "speculative_attention_mode", "page_size", "kv_cache_dtype",
    "disable_cuda_graph", "cuda_graph_bs", "cuda_graph_max_bs", "disable_decode_cuda_graph",
    "cuda_graph_backend_decode", "cuda_graph_bs_decode", "cuda_graph_max_bs_decode", "disable_overlap_schedule",
    "tp_size", "pp_size", "dp_size", "enable_dp_attention", "attn_cp_size", "dcp_size", "enable_unified_memory",
    "enable_two_batch_overlap",
)  # fmt: skip
# SGLang's spec-decoding and TRTLLM MHA variables, read through SGLang's own `envs` (the value SGLang itself uses);
# those set are recorded.
SPEC_ENV = (
    "SGLANG_ENABLE_OVERLAP_PLAN_STREAM", "SGLANG_ENABLE_SPEC_V2", "SGLANG_RAGGED_VERIFY_MODE",
    "SGLANG_TEST_RAGGED_VERIFY_FORCE_UNIFORM_CAPTURE", "SGLANG_ENABLE_METADATA_GLUE_GRAPH",
    "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND", "SGLANG_SPEC_TP_SYNC",
    "SGLANG_ENABLE_PP_SPEC", "SGLANG_TRTLLM_MHA_DECODE_SEQ_LEN_SPLITS", "SGLANG_FLASHINFER_WORKSPACE_SIZE",
)  # fmt: skip

_ACTIVE: list[SglangTracer] = []  # the tracer the patched classes record into (the last one opened)
# The live batch behind a call whose arguments do not carry it (0.5.12's replay API, the draft wrapper's fan-out).
_LIVE: contextvars.ContextVar[Any] = contextvars.ContextVar("specscope_sglang_live", default=None)
_WRAPPER: contextvars.ContextVar[Any] = contextvars.ContextVar("specscope_sglang_wrapper", default=None)
_IN_PREP: contextvars.ContextVar[bool] = contextvars.ContextVar("specscope_sglang_in_prep", default=False)


@contextlib.contextmanager
def live_batch(fb: Any) -> Iterator[None]:
    """Tell the recorder which live batch the next prep calls serve (for APIs that pass only padded buffers)."""
    tok = _LIVE.set(fb)
    try:
        yield
    finally:
        _LIVE.reset(tok)


_FACTORY: list[Callable[[], SglangTracer]] = []


def set_tracer_factory(factory: Callable[[], SglangTracer] | None) -> None:
    """Open a tracer lazily, at the first prepared forward (the start-up hook's way: the trace is created in
    the process that runs the backend, not in every process that imports it)."""
    _FACTORY[:] = [factory] if factory is not None else []


def active_tracer() -> SglangTracer | None:
    """The tracer patched classes record into, if any (opened by the factory on first use)."""
    if not _ACTIVE and _FACTORY:
        factory = _FACTORY.pop()
        _safely(factory)  # registers itself in _ACTIVE; a bad path is one warning, never a dead server
    return _ACTIVE[-1] if _ACTIVE else None


# ---- what the server is (read at attach) ---------------------------------------------------------------
_MODULES: list[Any] = []  # trtllm_mha_backend modules instrument() patched, the last one is the server's
# What each backend told at construction (`_attach`), oldest first: kept when the backend itself is gone.
BACKEND_FACTS: list[dict[str, Any]] = []
_FACTS_SEQ = [0]  # backends attached so far in this process (numbers BACKEND_FACTS' entries)
# Failures before any tracer exists (a backend constructed before the trace opens): handed to the next tracer.
_EARLY_PROBLEMS: list[tuple[str, str]] = []


def _jsonable(v: Any) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    return str(getattr(v, "value", v))  # enums as their value, anything else as text


def _server_args(model_runner: Any) -> dict[str, Any]:
    """The attention and speculation server args the runner was built with (only the names this release has)."""
    sa = getattr(model_runner, "server_args", None)
    if sa is None:
        return {}
    out: dict[str, Any] = {}
    for name in SERVER_ARGS:
        try:
            v = getattr(sa, name)
        except Exception:  # noqa: BLE001 - a name this release lacks (0.5.2x's args raise on some unknown reads)
            continue
        if not callable(v):
            out[name] = _jsonable(v)
    return out


def _spec_env(envs: Any) -> dict[str, Any]:
    """SPEC_ENV variables set, with the value SGLang parsed (its `envs` object; absent names are skipped)."""
    out: dict[str, Any] = {}
    if envs is None:
        return out
    for name in SPEC_ENV:
        var = getattr(envs, name, None)
        try:
            if var is not None and var.is_set():
                out[name] = _jsonable(var.get())
        except Exception:  # noqa: BLE001 - a stand-in or an older EnvField without is_set
            continue
    return out


def parallel_facts(model_runner: Any) -> dict[str, Any]:
    """This process's place in SGLang's parallel groups: `tp_rank`/`tp_size` (and pp/dp where SGLang has them)
    and where they were read (`source`): the model runner (up to 0.5.2x), the runtime context (0.5.2x), the
    initialized torch.distributed world, else the launcher's variables; a lone process is rank 0 of 1."""
    sa = getattr(model_runner, "server_args", None)
    sizes = {k: int(v) for k in ("tp_size", "pp_size", "dp_size")
             if isinstance(v := getattr(sa, k, None), int)}
    if isinstance(getattr(model_runner, "tp_rank", None), int):
        out: dict[str, Any] = {"tp_rank": int(model_runner.tp_rank), "source": "model_runner.tp_rank"}
        for k in ("pp_rank", "dp_rank", "tp_size", "pp_size"):
            if isinstance(v := getattr(model_runner, k, None), int):
                out[k] = int(v)
        return {**sizes, **out}
    rc = sys.modules.get("sglang.srt.runtime_context")
    if rc is not None and hasattr(rc, "get_parallel"):
        par = rc.get_parallel()
        out = {}
        for k in ("tp_rank", "tp_size", "pp_rank", "pp_size", "dp_rank"):
            try:
                v = getattr(par, k)
            except Exception:  # noqa: BLE001 - not published in this process (ParallelContext raises)
                continue
            if isinstance(v, int):
                out[k] = int(v)
        if "tp_rank" in out:
            return {**sizes, **out, "source": "runtime_context.get_parallel()"}
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        # SGLang's world rank is tp_size * pp_rank + tp_rank (model_runner init_torch_distributed).
        rank, world = dist.get_rank(), dist.get_world_size()
        tp = sizes.get("tp_size", world)
        return {**sizes, "tp_rank": rank % tp, "pp_rank": rank // tp, "world_rank": rank, "world_size": world,
                "source": "torch.distributed"}
    env = next(((k, v) for k in user_env.RANK_VARS if (v := user_env.get(k)) is not None), None)
    if env is not None and env[1].isdigit():
        return {**sizes, "tp_rank": int(env[1]), "source": f"environment ({env[0]})"}
    return {**sizes, "tp_rank": 0, "source": "none, one process"}


def rank_label(par: dict[str, Any]) -> str:
    """The rank as a file name part: the TP rank ("3"), prefixed by the PP / DP rank where those groups have more
    than one member ("pp1-tp3")."""
    parts = [f"dp{par['dp_rank']}"] if par.get("dp_size", 1) > 1 and "dp_rank" in par else []
    if par.get("pp_size", 1) > 1 or par.get("pp_rank", 0) > 0:
        parts.append(f"pp{par.get('pp_rank', 0)}")
    return "-".join([*parts, f"tp{par['tp_rank']}"]) if parts else str(par["tp_rank"])


def _features(be: Any, sa: dict[str, Any], env: dict[str, Any], facts: SglangFacts | None) -> list[dict[str, str]]:
    """Features of this server that specscope's model of TRTLLM MHA leaves out, with what showed them."""
    out: list[dict[str, str]] = []

    def add(feature: str, detail: str, source: str) -> None:
        out.append({"feature": feature, "detail": detail, "source": source})

    topk = getattr(be, "topk", None)
    topk = topk if isinstance(topk, int) else sa.get("speculative_eagle_topk")
    if isinstance(topk, int) and topk > 1:
        add("topk > 1", f"EAGLE tree drafts (topk {topk}); specscope models topk = 1 only",
            "backend.topk" if isinstance(getattr(be, "topk", None), int) else "server args speculative_eagle_topk")
    mode = env.get("SGLANG_RAGGED_VERIFY_MODE")
    if mode not in (None, "static") and (facts is None or facts.has_ragged_verify):
        xqa = " (XQA, SM90/SM120, refuses it: the first verify raises NotImplementedError)" \
            if getattr(be, "is_xqa_impl", False) else ""
        add("ragged verify", f"per-request verify lengths{xqa}; the checks assume uniform T",
            f"SGLANG_RAGGED_VERIFY_MODE={mode}")
    tr = getattr(be, "kv_index_translator", None)
    if tr is not None and getattr(tr, "is_translating", False):
        add("unified KV pool", "page-table ids are translated (kv_index_translator); specscope reads them as "
                               "pool pages", "backend.kv_index_translator")
    elif sa.get("enable_unified_memory"):
        add("unified KV pool", "page-table ids are translated; specscope reads them as pool pages",
            "server args enable_unified_memory")
    if getattr(be, "_swa_kv_pool", None) is not None or getattr(be, "use_sliding_window_kv_pool", False) is True:
        add("SWA", "sliding-window layers read a translated SWA page table; specscope records the full-attention "
                   "one", "backend SWA KV pool")
    cp = {k: v for k in ("attn_cp_size", "dcp_size") if isinstance(v := sa.get(k), int) and v > 1}
    if cp:
        add("CP", "context parallel (zigzag page tables); specscope models one rank's whole context",
            "server args " + ", ".join(f"{k}={v}" for k, v in cp.items()))
    dt = getattr(be, "data_type", None)
    kvd = sa.get("kv_cache_dtype")
    if getattr(be, "is_nvfp4_kvcache", False) is True or (isinstance(kvd, str) and "fp4" in kvd):
        add("NVFP4 KV", "NVFP4 KV cache (scales, FP8 output); specscope models bf16 KV",
            "backend.is_nvfp4_kvcache" if getattr(be, "is_nvfp4_kvcache", False) is True else f"kv_cache_dtype={kvd}")
    elif (isinstance(dt, torch.dtype) and "float8" in str(dt)) or (isinstance(kvd, str) and "fp8" in kvd):
        add("FP8 KV", "FP8 KV cache (k/v scales); specscope models bf16 KV",
            f"backend.data_type={_jsonable(dt)}" if isinstance(dt, torch.dtype) and "float8" in str(dt)
            else f"kv_cache_dtype={kvd}")
    return out


def _kernel_versions() -> dict[str, str]:
    """flashinfer (and sgl-kernel) as this process has them: the imported module's version, else the installed
    distribution's; nothing is imported here."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str] = {}
    mod = sys.modules.get("flashinfer")
    if mod is not None and isinstance(getattr(mod, "__version__", None), str):
        out["flashinfer"] = mod.__version__
    for key, dists in (("flashinfer", ("flashinfer-python", "flashinfer")), ("sgl_kernel", ("sgl-kernel",))):
        for d in dists:
            if key in out:
                break
            try:
                out[key] = version(d)
            except PackageNotFoundError:
                continue
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    return out


def module_version(module: Any) -> str:
    """The release a trtllm_mha_backend module belongs to: its wheel's dist-info or version.py beside the
    package it was loaded from, else SGLang's `sglang.version`, else the installed distribution, else "unknown"."""
    f = getattr(module, "__file__", None)
    if isinstance(f, str) and Path(f).is_file():
        from .sglang_package import sglang_version

        v = sglang_version(Path(f).resolve().parents[3])
        if v != "unknown":
            return v
    return _installed_sglang_version()


def _facts(version: str) -> SglangFacts | None:
    try:
        return facts_for(version)
    except ValueError:
        return None


# ---- facts of one prep call -----------------------------------------------------------------------------
@dataclass
class _Prep:
    """What one prep call was given, normalized across SGLang's APIs."""

    phase: GraphPhase
    fb: Any  # a ForwardBatch or view: forward_mode, batch_size, seq_lens, seq_lens_cpu, req_pool_indices, ...
    num_tokens: int | None = None  # capture: tokens the graph is captured for
    in_capture: bool = False


def _mode_of(fb: Any) -> ForwardMode | None:
    m = fb.forward_mode
    name = getattr(m, "name", str(m))
    if name in ("DECODE", "IDLE"):
        if name == "IDLE":
            return None
        return ForwardMode.DRAFT_DECODE if getattr(fb, "spec_info", None) is not None else ForwardMode.DECODE
    return {"TARGET_VERIFY": ForwardMode.TARGET_VERIFY, "DRAFT_EXTEND": ForwardMode.DRAFT_EXTEND,
            "DRAFT_EXTEND_V2": ForwardMode.DRAFT_EXTEND, "EXTEND": ForwardMode.EXTEND,
            "MIXED": ForwardMode.EXTEND}.get(name)


def _pad(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """`t` as a static buffer of n entries holds it after replay's zero-then-copy."""
    if t is None:
        return None
    t = t.reshape(-1)
    if t.shape[0] >= n:
        return t[:n]
    out = torch.zeros(n, dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out


@dataclass
class _Pending:
    """A step whose copies may still be in flight."""

    step_kw: dict[str, Any]
    arrays: list[tuple[str, torch.Tensor, str, tuple[int, ...], int]]  # name, host copy, dtype, full shape, ptr
    spans: list[tuple[str, str, Any, Any]]
    event: Any = None
    errors: list[Any] = field(default_factory=list)
    req_args: tuple[Any, ...] | None = None  # how to build the request rows once the copies are on the host
    backend_id: int = 0
    hold: bool = False  # a verify waits for the plan-stream fix-up hook (or the next prep) before it is written
    await_accept: bool = False  # ... and for the draft extend that carries its accept lengths
    accept_from: _Pending | None = None  # that draft extend
    hidden: frozenset[str] = frozenset()  # host copies that only build request rows (not written as arrays)
    crop_live: bool = False  # crop page_table / req_to_token_page_starts by the recorded cache_seqlens at write


class SglangTracer:
    """Turns the instrumented backends' prep calls into steps of one trace (in-process TraceWriter).

    The file is created when the first thing is recorded (or at close), so its run info holds what the backends
    constructed by then tell: the server args, the rank, the features specscope does not model. A path that
    exists (without `overwrite`) or is a directory is refused here, at once."""

    def __init__(self, path: str | os.PathLike[str], *, overwrite: bool = False, sglang_version: str | None = None,
                 config: dict[str, Any] | None = None, command: str | None = None) -> None:
        from ..tracer.errors import TraceError

        self.path = os.fspath(path)
        if os.path.isdir(self.path):
            raise TraceError("is a directory, not a trace file", self.path)
        if os.path.lexists(self.path) and not overwrite:
            raise TraceError("already exists (pass overwrite=True to replace it)", self.path)
        self._overwrite = overwrite
        self._version_given = sglang_version
        self._config = dict(config or {})
        self._command = command or " ".join(sys.argv)
        self._start_ns = time.time_ns()
        self._writer: TraceWriter | None = None
        self._lock = threading.RLock()
        self._next = 0
        self._pending: list[_Pending] = []
        self._frozen: dict[tuple[int, str, int], int] = {}  # (backend id, mode, bs) -> q len frozen at capture
        self._capture_tokens: dict[tuple[int, str, int], int] = {}  # 0.5.12 replays: tokens per request
        # 0.5.15+: a capture's metadata exists once `init_forward_metadata_in_graph` ran (backend id -> the call).
        self._await_in_graph: dict[int, tuple[Any, ForwardMode, _Prep, int, Any, Any, Any]] = {}
        self._iteration = 0
        self._last_mode: ForwardMode | None = None
        self._compute_stream: Any = None
        self._epoch: tuple[int, Any] | None = None  # (host ns, CUDA event) for GPU span times
        self._slot_gen: dict[int, tuple[int, int | None]] = {}  # req slot -> (generation, last committed length)
        self._problems: dict[str, dict[str, Any]] = {}  # what -> {"what", "first_step", "count", "detail"}
        self._problems_dirty = False
        self._features: list[dict[str, str]] = []  # the unmodelled features the run info names
        self._late_features: list[dict[str, str]] = []  # found after the run info was written (meta row)
        self.version = sglang_version or (module_version(_MODULES[-1]) if _MODULES else _installed_sglang_version())
        self.facts = _facts(self.version)
        self.closed = False
        self._facts_from = _FACTS_SEQ[0]
        _ACTIVE.append(self)
        early, _EARLY_PROBLEMS[:] = list(_EARLY_PROBLEMS), []
        for what, detail in early:
            self.problem(what, detail)

    # ---- the file and its run info ------------------------------------------------------------------------
    @property
    def writer(self) -> TraceWriter:
        """The trace's writer (the file is created at the first use)."""
        with self._lock:
            if self._writer is None:
                self._writer = TraceWriter(self.path, self._run_info(), overwrite=self._overwrite)
                if self._problems:
                    self._write_problems()
            return self._writer

    def _run_info(self) -> RunInfo:
        """The run as the backends constructed so far describe it (each part guarded: a part that cannot be read
        is a recording problem and is left out)."""
        dev, cap = "cpu", None
        if torch.cuda.is_available():
            dev = torch.cuda.get_device_name()
            cap = "{}.{}".format(*torch.cuda.get_device_capability())
        versions = {"python": platform.python_version(), "torch": torch.__version__, "sglang": self.version}
        try:
            from importlib.metadata import version

            versions["specscope"] = version("specscope")
        except Exception:  # noqa: BLE001 - a source checkout without metadata
            versions["specscope"] = "unknown"
        sg: dict[str, Any] = {"version": self.version,
                              "tested": bool(self.facts is not None and self.facts.tested)}
        if not sg["tested"]:
            sg["untested"] = f"untested SGLang {self.version}"
        try:
            kernels = _kernel_versions()
            versions.update(kernels)
            sg["kernels"] = kernels
        except Exception as e:  # noqa: BLE001 - provenance is best effort, and says so
            self.problem("provenance: kernel versions", _describe(e))
        sg["gpu"] = {"name": dev, "capability": cap}
        if _MODULES:
            sg["backend_file"] = str(getattr(_MODULES[-1], "__file__", None))
        # The backends built since this tracer was made (a drive, a test), else all this process built (the hook
        # opens its tracer at the first forward, after the server built its backends).
        known = [f for f in BACKEND_FACTS if f["seq"] > self._facts_from] or list(BACKEND_FACTS)
        facts = next((f for f in known if f["model"] == "target"), known[0] if known else None)
        if facts is not None:
            sg["server_args"] = facts["server_args"]
            sg["env"] = facts["env"]
            sg["parallel"] = facts["parallel"]
        else:
            sg["server_args_source"] = "no backend constructed before the trace opened"
        seen = {f["feature"] for f in self._features}
        for bf in known:
            for f in bf["features"]:
                if f["feature"] not in seen:
                    seen.add(f["feature"])
                    self._features.append(f)
        sg["unmodelled"] = list(self._features)
        config = dict(self._config, source="sglang", sglang=sg)
        nr = self._not_recorded()
        if nr:
            config["not_recorded"] = nr
        return RunInfo(
            command=self._command, config=config,
            target_model=target_name if (target_name := user_env.get(user_env.TARGET_MODEL)) is not None
            else "sglang",
            draft_model=user_env.get(user_env.DRAFT_MODEL), device=dev, device_capability=cap,
            attention_kernel="sglang trtllm_mha", versions=versions, git_commit=None, start_ns=self._start_ns,
            hostname=socket.gethostname())

    def _not_recorded(self) -> dict[str, Any]:
        """What this release's backend does not give the recorder (the checker skips what needs it)."""
        out: dict[str, Any] = {}
        f = self.facts
        md_cls = getattr(_MODULES[-1], "TRTLLMMHAMetadata", None) if _MODULES else None
        fields = getattr(md_cls, "__dataclass_fields__", None)
        has_k = ("max_seq_len_k" in fields) if fields is not None else (f is None or f.has_max_seq_len_k)
        if not has_k:
            out["fields"] = {"max_seq_len_k": f"TRTLLMMHAMetadata has no max_seq_len_k in SGLang {self.version} "
                                              "(dropped in 0.5.14: the kernels get max_context_len)"}
        if self._in_graph():
            out["replay_metadata"] = REPLAY_METADATA_IN_GRAPH
        return out

    def _in_graph(self) -> bool:
        """Whether graph metadata is computed inside the graph (0.5.15+): from the facts, else from the class."""
        if self.facts is not None:
            return self.facts.graph_metadata_in_graph
        cls = getattr(_MODULES[-1], "TRTLLMHAAttnBackend", None) if _MODULES else None
        return cls is not None and IN_GRAPH in vars(cls)

    # ---- what could not be recorded --------------------------------------------------------------------
    def problem(self, what: str, detail: str, step: int | None = None) -> None:
        """Count one recording failure under `what`; the trace's `meta.recording_problems` says it (written at
        the first of each kind, then as counts double and at every flush)."""
        with self._lock:
            ent = self._problems.get(what)
            if ent is None:
                ent = self._problems[what] = {"what": what, "first_step": step, "count": 0,
                                              "detail": " ".join(detail.split())[:2000]}
            ent["count"] += 1
            self._problems_dirty = True
            n = ent["count"]
            if self._writer is not None and n & (n - 1) == 0:  # 1, 2, 4, ...: a killed server shows them grow
                self._write_problems()

    def _write_problems(self) -> None:
        assert self._writer is not None, "problems are written once the file exists"
        self._writer.write_meta("recording_problems", json.dumps(list(self._problems.values())))
        self._problems_dirty = False

    def _next_index(self) -> int:
        return self._next + len(self._pending)

    def note_feature(self, feature: str, detail: str, source: str) -> None:
        """A feature specscope does not model, seen in a step or a backend after the run info was written: kept
        in `meta.unmodelled_features` (the run info's list plus these)."""
        with self._lock:
            known = {f["feature"] for f in self._features + self._late_features}
            if feature in known:
                return
            entry = {"feature": feature, "detail": detail, "source": source}
            if self._writer is None:
                self._features.append(entry)
                return
            self._late_features.append(entry)
            self._writer.write_meta("unmodelled_features", json.dumps(self._features + self._late_features))

    # ---- prep calls --------------------------------------------------------------------------------------
    def record_prep(self, backend: Any, prep: _Prep, start_ns: int, gpu_start: Any,
                    error: BaseException | None) -> None:
        """One finished prep call of `backend` (successful or not)."""
        with self._lock:
            self._finish_held(backend)
            mode = _mode_of(prep.fb)
            if mode is None:
                return
            ctx = (_LIVE.get(), _WRAPPER.get())
            if prep.phase == GraphPhase.CAPTURE and prep.in_capture and error is None and self._in_graph():
                # 0.5.15+: out_graph only bound the buffers; the values come with init_forward_metadata_in_graph.
                self._await_in_graph[id(backend)] = (backend, mode, prep, start_ns, gpu_start, *ctx)
                return
            with_md = not (prep.phase == GraphPhase.REPLAY and self._in_graph())
            self._add(self._build(backend, mode, prep, start_ns, gpu_start, error, *ctx, with_metadata=with_md))

    def record_in_graph(self, backend: Any, error: BaseException | None) -> None:
        """`init_forward_metadata_in_graph` returned on `backend`: a capture waiting for it is recorded now, with
        the values it wrote (on a CUDA device only outside stream capture: a copy inside would join the graph)."""
        with self._lock:
            held = self._await_in_graph.pop(id(backend), None)
            if held is None:
                return  # a replay's (a driver or a debug replay calls it): replays are recorded at out_graph
            be, mode, prep, start_ns, gpu_start, live, wrap = held
            capturing = torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
            if capturing:
                self.problem("capture metadata not recorded",
                             "init_forward_metadata_in_graph ran only under CUDA-graph stream capture (no warm-up "
                             "run), where a copy of its output would join the graph", self._next_index())
            self._add(self._build(be, mode, prep, start_ns, gpu_start, error, live, wrap,
                                  with_metadata=not capturing))

    def _flush_in_graph(self, backend_id: int | None) -> None:
        """Captures whose in_graph call never came (the backend moved on, or the trace closes): written without
        metadata, and said."""
        for bid in [k for k in self._await_in_graph if backend_id is None or k == backend_id]:
            be, mode, prep, start_ns, gpu_start, live, wrap = self._await_in_graph.pop(bid)
            self.problem("capture metadata not recorded",
                         "init_forward_metadata_in_graph did not follow the capture's init_forward_metadata_out_graph "
                         "(SGLang 0.5.15+ computes the graph's metadata there)", self._next_index())
            self._add(self._build(be, mode, prep, start_ns, gpu_start, None, live, wrap, with_metadata=False))

    def _add(self, p: _Pending) -> None:
        if p.step_kw["mode"] == ForwardMode.DRAFT_EXTEND and any(a[0] == "accept_lens" for a in p.arrays):
            # Spec v2: the draft extend after a verify carries that verify's accept lengths.
            for q in self._pending:
                if q.await_accept:
                    q.accept_from, q.await_accept, q.hold = p, False, False
        self._pending.append(p)
        self._write_ready()

    def record_fixup(self, backend: Any, spec_info: Any, error: BaseException | None) -> None:
        """The plan-stream fix-up hook ran for the verify `backend` just prepared (or raised)."""
        with self._lock:
            held = [p for p in self._pending if p.hold and p.backend_id == id(backend)]
            if not held:
                return
            p = held[-1]
            p.step_kw["scalars"].update(plan_stream=1, fixup_hook_ok=int(error is None))
            if error is not None:
                p.errors.append(_call_error(FIXUP, error))
            else:
                tok = getattr(spec_info, "draft_token", None)
                if isinstance(tok, torch.Tensor):  # final now: the hook runs after the compute stream's wait
                    self._add_draft_tokens(p, tok)
            p.hold = False
            if error is not None:
                p.await_accept = False  # nothing after this: SGLang raises
            self._write_ready()
            if error is not None:
                self.flush()  # the server is about to die of this exception: keep the evidence

    def _finish_held(self, backend: Any) -> None:
        # The backend prepares its next forward: whatever its held verify was waiting for will not come.
        self._flush_in_graph(id(backend))
        for p in self._pending:
            if p.backend_id == id(backend):
                p.hold = p.await_accept = False

    def _build(self, be: Any, mode: ForwardMode, prep: _Prep, start_ns: int, gpu_start: Any,
               error: BaseException | None, live: Any, wrapper_ctx: Any, *, with_metadata: bool = True) -> _Pending:
        """A step's facts from the call and the backend; `with_metadata=False`: the metadata the kernels read is
        not known to Python at this point (a 0.5.15+ replay), so the step carries no arrays or metadata scalars,
        only what builds its header and request rows."""
        fb = prep.fb
        md = getattr(be, "forward_metadata", None) if with_metadata else None
        wrapper, wrapper_fb = wrapper_ctx or (None, None)
        bs = int(fb.batch_size)
        P = int(be.page_size)
        key = (id(be), mode.value, bs)
        # T: tokens per request of this forward, from what the call was given.
        if mode in (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE):
            T = 1
        elif mode == ForwardMode.EXTEND:
            ext = getattr(fb, "extend_seq_lens_cpu", None)
            T = int(max(ext)) if ext is not None and len(ext) else 1
        elif mode == ForwardMode.DRAFT_EXTEND and getattr(fb.spec_info, "num_tokens_per_req", -1) > 0:
            T = int(fb.spec_info.num_tokens_per_req)
        elif prep.num_tokens is not None:
            T = prep.num_tokens // bs
        elif prep.phase == GraphPhase.REPLAY and key in self._capture_tokens:
            T = self._capture_tokens[key]
        else:
            ids = getattr(fb, "input_ids", None)
            T = int(ids.shape[0]) // bs if ids is not None and prep.phase != GraphPhase.REPLAY else 1
            if ids is not None and prep.phase == GraphPhase.REPLAY:
                T = max(1, int(ids.shape[0]) // bs)
        if prep.phase == GraphPhase.CAPTURE:
            self._capture_tokens[key] = T
        # Live rows: a replay's out_cache_loc (or live batch) is unpadded.
        raw_bs: int | None = bs
        src = live if live is not None else fb
        if getattr(src, "out_cache_loc", None) is None and wrapper_fb is not None:
            src = wrapper_fb  # 0.5.12's wrapper passes its step backends bare arguments
        loc = getattr(src, "out_cache_loc", None)
        n_steps = getattr(wrapper, "speculative_num_steps", None)
        if prep.phase == GraphPhase.REPLAY:
            raw_bs = None
            if live is not None:
                raw_bs = int(live.batch_size)
            elif loc is not None and mode == ForwardMode.DRAFT_DECODE and n_steps:
                raw_bs = int(loc.numel()) // n_steps
            elif loc is not None and mode == ForwardMode.DRAFT_EXTEND and getattr(fb, "input_ids", None) is not None:
                raw_bs = int(fb.input_ids.shape[0]) // max(T, 1)
            elif loc is not None and mode != ForwardMode.EXTEND:
                raw_bs = int(loc.numel()) // max(T, 1)
            if raw_bs is not None:
                raw_bs = max(1, min(raw_bs, bs))
        # Unknown (0.5.12's replay API without a live batch): the rows before the first reserved slot 0, counted
        # from the recorded req_pool_indices when the step is written (no host sync here).
        rows = raw_bs if raw_bs is not None else bs
        step_id = int(be.speculative_step_id) if mode == ForwardMode.DRAFT_DECODE else None
        seq = fb.seq_lens[:bs]
        # The host mirror as the batch carries it: 0.5.14+ backends do not ask for one (needs_cpu_seq_lens =
        # False) and spec-v2 batches then hold None, which is recorded as absent, not rebuilt from the device.
        seq_cpu = fb.seq_lens_cpu[:bs] if getattr(fb, "seq_lens_cpu", None) is not None else None
        rpi = fb.req_pool_indices[:bs]
        # Positions and KV write slots of the tokens the kernels run.
        n_tok = bs * T if mode != ForwardMode.EXTEND else None
        pos = getattr(src, "positions", None)
        if pos is None and getattr(fb, "spec_info", None) is not None:
            pos = getattr(fb.spec_info, "positions", None)
        if mode == ForwardMode.DRAFT_DECODE:
            if loc is not None and n_steps and loc.numel() == rows * n_steps:
                loc = loc.reshape(rows, n_steps)[:, step_id]
            elif loc is not None and loc.numel() != rows:
                loc = None
            if pos is not None:
                pos = pos.reshape(-1)[:rows] + step_id
        if n_tok is not None:
            pos = _pad(pos, n_tok) if pos is not None and pos.numel() <= n_tok else None
            loc = _pad(loc, n_tok) if loc is not None and loc.numel() <= n_tok else None
        if mode == ForwardMode.DRAFT_DECODE and pos is not None and rows < bs:
            pos[rows:] = 0
        scalars: dict[str, int] = {}
        if with_metadata:
            scalars.update(seq_len_fill_value=int(be.get_cuda_graph_seq_len_fill_value()),
                           backend_num_draft_tokens=int(be.speculative_num_draft_tokens or 1),
                           max_context_len=int(be.max_context_len), speculative_step_id=int(be.speculative_step_id))
            if seq_cpu is not None:
                scalars["seq_lens_cpu_max"] = int(seq_cpu.max()) if seq_cpu.numel() else 0
        arrays: list[tuple[str, torch.Tensor]] = []
        pt = None
        if md is not None and getattr(md, "cache_seqlens_int32", None) is not None:
            scalars["max_seq_len_q"] = int(md.max_seq_len_q)
            mk = getattr(md, "max_seq_len_k", None)  # absent from 0.5.14: recorded as absent, never derived
            if mk is not None:
                scalars["max_seq_len_k"] = int(mk)
            if prep.phase == GraphPhase.CAPTURE:
                self._frozen[key] = int(md.max_seq_len_q)
            frozen = self._frozen.get(key) if prep.phase == GraphPhase.REPLAY else None
            if prep.phase == GraphPhase.CAPTURE:
                frozen = int(md.max_seq_len_q)
            scalars["kernel_q_len"] = frozen if frozen is not None else int(md.max_seq_len_q)
            if frozen is not None:
                scalars["captured_max_seq_len_q"] = frozen
            for name, attr in (("cache_seqlens", "cache_seqlens_int32"), ("cu_seqlens_q", "cu_seqlens_q"),
                               ("cu_seqlens_k", "cu_seqlens_k"), ("page_table", "page_table")):
                t = getattr(md, attr, None)
                if t is not None:
                    arrays.append((name, t))
            pt = getattr(md, "page_table", None)
            self._step_features(md)
        r2t = be.req_to_token
        crop_live = False
        if "max_seq_len_k" in scalars:
            width = -(-int(scalars["max_seq_len_k"]) // P)
        else:
            # Without max_seq_len_k the live width is the recorded cache_seqlens' (cropped on the host once the
            # copies land: no sync here). Copied: up to a bound from the host mirror when there is one, else all.
            crop_live = md is not None
            width = int(pt.shape[1]) if isinstance(pt, torch.Tensor) and pt.dim() == 2 else 0
            if seq_cpu is not None and seq_cpu.numel():
                bound = -(-(int(seq_cpu.max()) + T + int(getattr(be, "speculative_step_id", 0) or 0) + 1) // P)
                width = min(width, bound) if width else bound
            width = min(width, -(-int(r2t.shape[1]) // P))
        arrays += [("seq_lens", seq), ("req_pool_indices", rpi)]
        if seq_cpu is not None:
            arrays.append(("seq_lens_cpu", seq_cpu))
        if pos is not None:
            arrays.append(("positions", pos))
        if loc is not None:
            arrays.append(("out_cache_loc", loc))
        if with_metadata:
            cols = torch.arange(0, width * P, P, device=r2t.device)
            arrays.append(("req_to_token_page_starts", r2t[rpi.to(r2t.device).long()[:, None], cols[None, :]]))
        spec = getattr(src, "spec_info", None) or getattr(fb, "spec_info", None)
        tok = getattr(spec, "draft_token", None) if mode == ForwardMode.TARGET_VERIFY else None
        acc = getattr(spec, "num_accept_tokens", None) if mode == ForwardMode.DRAFT_EXTEND else None
        if isinstance(acc, torch.Tensor):
            arrays.append(("accept_lens", acc.reshape(-1)[:rows]))
        p = self._snapshot(arrays, crop={"page_table": width, "req_to_token_page_starts": width})
        p.crop_live = crop_live
        if not with_metadata:
            # The batch's own arrays only build the request rows: the step says nothing it cannot vouch for.
            p.hidden = frozenset(a[0] for a in p.arrays) | {"draft_tokens"}
        if mode in (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND) and \
                self._last_mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND, ForwardMode.DECODE) and \
                prep.phase != GraphPhase.CAPTURE and (mode != ForwardMode.DRAFT_DECODE or step_id == 0):
            self._iteration += 1
        if prep.phase != GraphPhase.CAPTURE:
            self._last_mode = mode
        model = getattr(be, "_specscope_model", "draft" if mode in (ForwardMode.DRAFT_DECODE,
                                                                     ForwardMode.DRAFT_EXTEND) else "target")
        p.step_kw = dict(
            iteration=-1 if prep.phase == GraphPhase.CAPTURE else self._iteration, mode=mode, model=model,
            step_id=step_id, batch_size=rows, padded_batch_size=bs, graph=prep.phase, tokens_per_request=T,
            num_draft_tokens=int(be.speculative_num_draft_tokens or 1), page_size=P, start_ns=start_ns,
            end_ns=time.perf_counter_ns(), scalars=scalars)
        # A capture runs on fill values, not requests: like the engine's capture steps it has no request rows.
        if prep.phase != GraphPhase.CAPTURE:
            ext = getattr(fb, "extend_seq_lens_cpu", None)
            p.req_args = (mode, raw_bs, T, model, None if ext is None else list(ext), getattr(fb, "rids", None))
        if isinstance(tok, torch.Tensor) and prep.phase != GraphPhase.CAPTURE:
            self._add_draft_tokens(p, tok)
        p.spans.append(("host", "metadata", start_ns, p.step_kw["end_ns"]))
        if gpu_start is not None:
            end = torch.cuda.Event(enable_timing=True)
            stream = torch.cuda.current_stream()
            end.record(stream)
            if mode == ForwardMode.DRAFT_DECODE and self._compute_stream is None:
                self._compute_stream = stream
            name = "compute" if self._compute_stream is None or stream == self._compute_stream else "plan"
            p.spans.append((name, "metadata", gpu_start, end))
        if error is not None:
            p.errors.append(_call_error(getattr(error, "_specscope_call", "init_forward_metadata"), error))
        p.backend_id = id(be)
        p.hold = mode == ForwardMode.TARGET_VERIFY and prep.phase != GraphPhase.CAPTURE and error is None
        p.await_accept = p.hold
        return p

    def _request_id(self, slot: int, mode: ForwardMode, model: str, before: int, rid: Any) -> int:
        """A stable id per request: SGLang's rid when the batch carries it, else the req slot plus a generation
        that starts anew when the target prefills the slot from a length it never committed (a new request)."""
        if isinstance(rid, str):
            return zlib.crc32(rid.encode()) & 0x7FFFFFFF
        gen, _ = self._slot_gen.get(slot, (0, None))
        last = self._slot_gen.get(slot, (0, None))[1]
        if mode == ForwardMode.EXTEND and model == "target" and (last is None or before != last):
            gen += 1
        self._slot_gen[slot] = (gen, last)
        return slot * 1_000_000 + gen

    def _ensure_epoch(self) -> None:
        """One synchronized event that puts every stream's event times on the host clock (one sync per trace)."""
        if self._epoch is None:
            torch.cuda.synchronize()
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(torch.cuda.current_stream())
            torch.cuda.synchronize()
            self._epoch = (time.perf_counter_ns(), ev)

    def _requests(self, p: _Pending) -> tuple[int, list[dict[str, Any]]]:
        """(live rows, request rows) of a step, from its host copies (built in write order)."""
        arr = {n: h for n, h, *_ in p.arrays}
        assert p.req_args is not None, "only steps with request rows are built into requests"
        mode, raw_bs, T, model, ext, rids = p.req_args
        rpi = arr["req_pool_indices"].tolist()
        if raw_bs is None:
            raw_bs = next((i for i, x in enumerate(rpi) if x == 0), len(rpi)) or len(rpi)
        # The host mirror when the batch had one, else the device lengths (copied without a sync).
        seq = arr.get("seq_lens_cpu", arr["seq_lens"])[:raw_bs].tolist()
        slots = rpi[:raw_bs]
        out = []
        rids = list(rids) if isinstance(rids, (list, tuple)) and len(rids) >= raw_bs else [None] * raw_bs
        for b in range(raw_bs):
            s = int(seq[b])
            if mode == ForwardMode.DECODE:
                before, after, q = s - 1, s, 1
            elif mode == ForwardMode.DRAFT_DECODE:
                before, after, q = s, s, 1
            elif mode == ForwardMode.TARGET_VERIFY:
                before, after, q = s, s, T
            elif mode == ForwardMode.DRAFT_EXTEND:
                before, after, q = s - T, s, T
            else:
                q = int(ext[b]) if ext is not None else s
                before, after = s - q, s
            slot = int(slots[b])
            rid = self._request_id(slot, mode, model, before, rids[b])
            if mode in (ForwardMode.EXTEND, ForwardMode.DECODE) and model == "target":
                self._slot_gen[slot] = (self._slot_gen[slot][0], after)
            out.append(dict(request_id=rid, slot=slot, seq_len_before=before, seq_len_after=after, num_q_tokens=q))
        return raw_bs, out

    def _add_draft_tokens(self, p: _Pending, tok: torch.Tensor) -> None:
        p.arrays = [a for a in p.arrays if a[0] != "draft_tokens"]
        host = self._copy(tok.reshape(-1))
        p.arrays.append(("draft_tokens", host, _NP.get(tok.dtype, "int64"), tuple(tok.shape), tok.data_ptr()))
        if p.event is not None:
            p.event.record(torch.cuda.current_stream())

    # ---- copies ------------------------------------------------------------------------------------------
    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        if t.device.type != "cuda":
            return t.detach().clone()
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t, non_blocking=True)
        return host

    def _snapshot(self, arrays: list[tuple[str, torch.Tensor]], crop: dict[str, int]) -> _Pending:
        out = []
        cuda = False
        for name, t in arrays:
            if t is None:
                continue
            src = t[:, : crop[name]] if name in crop and t.dim() == 2 else t
            cuda = cuda or t.device.type == "cuda"
            out.append((name, self._copy(src), _NP.get(t.dtype, str(t.dtype).replace("torch.", "")),
                        tuple(t.shape), t.data_ptr() if t.device.type == "cuda" or t.numel() else 0))
        ev = None
        if cuda:
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream())
        return _Pending(step_kw={}, arrays=out, spans=[], event=ev)

    # ---- writing -----------------------------------------------------------------------------------------
    def _ready(self, p: _Pending) -> bool:
        if p.hold or p.await_accept:
            return False
        if p.accept_from is not None and p.accept_from.event is not None and not p.accept_from.event.query():
            return False
        if p.event is not None and not p.event.query():
            return False
        return all(not isinstance(s[3], torch.cuda.Event) or s[3].query() for s in p.spans)

    def _write_ready(self, force: bool = False) -> None:
        while self._pending and (force or self._ready(self._pending[0])):
            p = self._pending.pop(0)
            if force:
                for ev in (p.event, getattr(p.accept_from, "event", None)):
                    if ev is not None:
                        ev.synchronize()
                for s in p.spans:
                    if isinstance(s[3], torch.cuda.Event):
                        s[3].synchronize()
            self.writer.write_step(self._to_step(p))

    def _to_step(self, p: _Pending) -> Step:
        host = {n: h.numpy() for n, h, *_ in p.arrays}
        if p.crop_live and "cache_seqlens" in host:
            # The pages the kernels read: ceil(cache_seqlens / P) for every row the metadata holds.
            cs = host["cache_seqlens"]
            width = -(-int(cs.max()) // p.step_kw["page_size"]) if cs.size else 0
            for name in ("page_table", "req_to_token_page_starts"):
                if name in host and host[name].ndim == 2:
                    host[name] = host[name][:, : max(width, 0)]
        arrays = tuple(ArraySnapshot(n, dt, sh, ptr, np.ascontiguousarray(host[n]))
                       for n, _h, dt, sh, ptr in p.arrays if n not in p.hidden)
        spans = []
        for stream, name, a, b in p.spans:
            if isinstance(a, torch.cuda.Event):
                # GPU spans on the host clock, through the epoch event recorded at the first GPU span.
                assert self._epoch is not None, "a GPU span is only timed after _ensure_epoch"
                e_ns, ev = self._epoch
                spans.append(StreamSpan(stream, name, e_ns + int(ev.elapsed_time(a) * 1e6),
                                        e_ns + int(ev.elapsed_time(b) * 1e6)))
            else:
                spans.append(StreamSpan(stream, name, int(a), int(b)))
        extra: dict[str, Any] = {}
        errors = tuple(e for e in p.errors if e is not None)
        if errors and "errors" in Step.__dataclass_fields__:
            extra["errors"] = errors
        kw = dict(p.step_kw)
        reqs: list[dict[str, Any]] = []
        if p.req_args is not None:
            kw["batch_size"], reqs = self._requests(p)
        tok = host.get("draft_tokens")  # also when hidden: the request rows carry the drafts either way
        T = kw["tokens_per_request"]
        if tok is not None and kw["mode"] == ForwardMode.TARGET_VERIFY and tok.size >= len(reqs) * T:
            rows = tok.reshape(-1)[: len(reqs) * T].reshape(len(reqs), T)
            for b, r in enumerate(reqs):  # the root (the last verify's bonus token) is not a draft
                r["draft_tokens"] = tuple(int(x) for x in rows[b, 1:])
        if kw["mode"] == ForwardMode.TARGET_VERIFY:
            got = self._accept_lens(p)
            for r in reqs:
                n = got.get(r["slot"])
                if n is not None:
                    r["accept_length"], r["seq_len_after"] = n, r["seq_len_before"] + n
                    gen = self._slot_gen.get(r["slot"], (0, None))[0]
                    self._slot_gen[r["slot"]] = (gen, r["seq_len_after"])
            kw["scalars"] = dict(kw["scalars"], acceptance_recorded=int(bool(reqs) and all(r["slot"] in got
                                                                                           for r in reqs)))
        step = Step(index=self._next, requests=tuple(RequestState(**r) for r in reqs), arrays=arrays,
                    spans=tuple(spans), **kw, **extra)
        self._next += 1
        return step

    @staticmethod
    def _accept_lens(p: _Pending) -> dict[int, int]:
        """req slot -> accept length, from the draft extend that followed verify `p` (empty if none did)."""
        de = p.accept_from
        if de is None:
            return {}
        arr = {n: h for n, h, *_ in de.arrays}
        acc, rpi = arr.get("accept_lens"), arr.get("req_pool_indices")
        if acc is None or rpi is None:
            return {}
        return {int(s): int(n) for s, n in zip(rpi.tolist(), acc.tolist(), strict=False)}

    def _step_features(self, md: Any) -> None:
        """Unmodelled features a step's metadata shows in use (0.5.16+ ragged verify, SWA, CP zigzag)."""
        if getattr(md, "is_ragged_verify", False) is True:
            self.note_feature("ragged verify", "per-request verify lengths; the checks assume uniform T",
                              "metadata is_ragged_verify")
        if getattr(md, "swa_page_table", None) is not None:
            self.note_feature("SWA", "sliding-window layers read a translated SWA page table; specscope records the "
                                     "full-attention one", "metadata swa_page_table")
        if getattr(md, "zigzag_page_table", None) is not None:
            self.note_feature("CP", "context parallel (zigzag page tables); specscope models one rank's whole "
                                    "context", "metadata zigzag_page_table")

    def flush(self) -> None:
        """Write every pending step (waits for its copies) and commit."""
        with self._lock:
            self._flush_in_graph(None)
            for p in self._pending:
                p.hold = p.await_accept = False
            self._write_ready(force=True)
            if self._problems_dirty:
                self.writer  # noqa: B018 - creates the file the problems go into
                self._write_problems()
            self.writer.flush()

    def close(self) -> None:
        """Flush and close the trace (created now if nothing was recorded, with the reason); the patched classes
        stop recording into it."""
        if self.closed:
            return
        with self._lock:
            self._flush_in_graph(None)
            if self._next + len(self._pending) == 0 and not self._problems:
                what = "nothing recorded"
                detail = ("no instrumented TRTLLM MHA backend prepared a forward while the trace was open" if _MODULES
                          else "no trtllm_mha_backend module was instrumented in this process")
                self.problem(what, detail)
            self.flush()
            self.writer.close()
            self.closed = True
        if self in _ACTIVE:
            _ACTIVE.remove(self)


_WARNED: list[str] = []


def _describe(e: BaseException) -> str:
    """The exception and the innermost frame of specscope's that raised it (what a bug report needs)."""
    here = Path(__file__).resolve().parent.parent
    frames = [f for f in traceback.extract_tb(e.__traceback__) if Path(f.filename).resolve().is_relative_to(here)]
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    return f"{type(e).__name__}: {e}{where}"


def _safely(fn: Callable[[], object], what: str = "recording", tracer: SglangTracer | None = None) -> None:
    """Run a recording step; a failure there is counted in the trace's `meta.recording_problems` (`what`, the
    exception type), said once on stderr, and never reaches SGLang (`SPECSCOPE_DEBUG=1` raises instead)."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the server must not die of its debugger
        if user_env.debug():
            raise
        msg = f"{type(e).__name__}: {e}"
        if msg not in _WARNED:
            _WARNED.append(msg)
            print(f"specscope: warning: sglang recording failed ({' '.join(msg.split())})", file=sys.stderr)
        tr = tracer if tracer is not None else (_ACTIVE[-1] if _ACTIVE else None)
        label = f"{what}: {type(e).__name__}"
        try:
            if tr is not None and not tr.closed:
                tr.problem(label, _describe(e), tr._next_index())
            else:
                _EARLY_PROBLEMS.append((label, _describe(e)))
        except Exception:  # noqa: BLE001 - the trace itself cannot be written: stderr has said it
            pass


def _call_error(call: str, e: BaseException) -> Any:
    ce = getattr(S, "CallError", None)
    if ce is None:
        return None
    return ce(call=call, error_type=type(e).__name__, message=str(e))


def _installed_sglang_version() -> str:
    mod = sys.modules.get("sglang.version")
    if mod is not None and hasattr(mod, "__version__"):
        return str(mod.__version__)
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"


# ---- patching ---------------------------------------------------------------------------------------------
def _timed(tr: SglangTracer | None) -> tuple[int, Any]:
    start = time.perf_counter_ns()
    ev = None
    if (tr is not None and torch.cuda.is_available() and torch.cuda.is_initialized()
            and not torch.cuda.is_current_stream_capturing()):
        tr._ensure_epoch()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(torch.cuda.current_stream())
    return start, ev


def _recording(method: str, to_prep: Callable[..., _Prep]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap a prep method: call it unchanged, then record what it prepared (also when it raised)."""

    def deco(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            tr = active_tracer()
            if tr is None or _IN_PREP.get():
                return orig(self, *args, **kwargs)
            start, ev = _timed(tr)
            tok = _IN_PREP.set(True)  # a prep calling another prep (capture -> apply) is one step
            try:
                out = orig(self, *args, **kwargs)
            except BaseException as e:
                e._specscope_call = method  # type: ignore[attr-defined]  # an ad hoc tag: which prep raised
                _IN_PREP.reset(tok)

                def record_error(err: BaseException = e) -> None:  # a default: Python deletes `e` after the handler
                    tr.record_prep(self, to_prep(self, *args, **kwargs), start, ev, err)

                _safely(record_error, method, tr)
                raise
            _IN_PREP.reset(tok)
            _safely(lambda: tr.record_prep(self, to_prep(self, *args, **kwargs), start, ev, None), method, tr)
            return out

        wrapper._specscope_original = orig  # type: ignore[attr-defined]  # an ad hoc tag on a plain function
        return wrapper

    return deco


def _eager(self: Any, fb: Any) -> _Prep:
    return _Prep(GraphPhase.EAGER, fb)


def _out_graph(self: Any, fb: Any, in_capture: bool = False) -> _Prep:
    n = int(fb.positions.numel()) if in_capture and getattr(fb, "positions", None) is not None else None
    return _Prep(GraphPhase.CAPTURE if in_capture else GraphPhase.REPLAY, fb, n, in_capture)


class _Args:
    """A ForwardBatch-like view of 0.5.12's capture/replay arguments."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def _capture_012(self: Any, bs: int, num_tokens: int, req_pool_indices: Any, seq_lens: Any, encoder_lens: Any,
                 forward_mode: Any, spec_info: Any) -> _Prep:
    live = _LIVE.get()
    fb = _Args(batch_size=bs, req_pool_indices=req_pool_indices, seq_lens=seq_lens, seq_lens_cpu=seq_lens.cpu(),
               forward_mode=forward_mode, spec_info=spec_info, input_ids=None,
               positions=getattr(live, "positions", None), out_cache_loc=getattr(live, "out_cache_loc", None))
    return _Prep(GraphPhase.CAPTURE, fb, num_tokens, True)


def _replay_012(self: Any, bs: int, req_pool_indices: Any, seq_lens: Any, seq_lens_sum: Any, encoder_lens: Any,
                forward_mode: Any, spec_info: Any, seq_lens_cpu: Any = None) -> _Prep:
    fb = _Args(batch_size=bs, req_pool_indices=req_pool_indices, seq_lens=seq_lens,
               seq_lens_cpu=seq_lens_cpu if seq_lens_cpu is not None else seq_lens.cpu(), forward_mode=forward_mode,
               spec_info=spec_info, input_ids=None, positions=None, out_cache_loc=None)
    return _Prep(GraphPhase.REPLAY, fb)


_PREPS: dict[str, Callable[..., _Prep]] = {
    "init_forward_metadata": _eager, "init_forward_metadata_out_graph": _out_graph,
    "init_forward_metadata_capture_cuda_graph": _capture_012,
    "init_forward_metadata_replay_cuda_graph": _replay_012}


def _patch_backend(cls: type[Any]) -> None:
    if "_specscope_patched" in cls.__dict__:
        return
    saved: dict[str, Any] = {}
    orig_init = cls.__init__

    @functools.wraps(orig_init)
    def __init__(self: Any, model_runner: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, model_runner, *args, **kwargs)
        self._specscope_model = "draft" if getattr(model_runner, "is_draft_worker", False) else "target"
        _safely(lambda: _attach(self, model_runner), "attach")

    saved["__init__"] = cls.__dict__.get("__init__")
    cls.__init__ = __init__
    for name, to_prep in _PREPS.items():
        if name in cls.__dict__:
            saved[name] = cls.__dict__[name]
            setattr(cls, name, _recording(name, to_prep)(cls.__dict__[name]))
    if IN_GRAPH in cls.__dict__:  # 0.5.15+: where a graph's metadata is computed (run inside the graph)
        in_graph = cls.__dict__[IN_GRAPH]
        saved[IN_GRAPH] = in_graph

        @functools.wraps(in_graph)
        def in_graph_wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            tr = active_tracer()
            try:
                out = in_graph(self, *args, **kwargs)
            except BaseException as e:
                if tr is not None:
                    def record_error(err: BaseException = e) -> None:  # a default: Python deletes `e` after it
                        tr.record_in_graph(self, err)

                    _safely(record_error, IN_GRAPH, tr)
                raise
            if tr is not None:
                _safely(lambda: tr.record_in_graph(self, None), IN_GRAPH, tr)
            return out

        setattr(cls, IN_GRAPH, in_graph_wrapper)
    # The fix-up hook: wrap whatever the class resolves it to (its own, or the base class's raising default).
    hook = getattr(cls, FIXUP, None)
    saved[FIXUP] = cls.__dict__.get(FIXUP)
    if hook is not None:

        @functools.wraps(hook)
        def fixup(self: Any, spec_info: Any, cuda_graph_bs: Any) -> Any:
            tr = active_tracer()
            try:
                out = hook(self, spec_info, cuda_graph_bs)
            except BaseException as e:
                if tr is not None:

                    def record_error(err: BaseException = e) -> None:  # a default: Python deletes `e` after the handler
                        tr.record_fixup(self, spec_info, err)

                    _safely(record_error, FIXUP, tr)
                raise
            if tr is not None:
                _safely(lambda: tr.record_fixup(self, spec_info, None), FIXUP, tr)
            return out

        setattr(cls, FIXUP, fixup)
    cls._specscope_patched = saved


def _patch_wrapper(cls: type[Any]) -> None:
    """The multi-step draft wrapper: its fan-out calls are recorded by the step backends; the wrapper only tells
    them which live batch and how many draft steps they serve."""
    if "_specscope_patched" in cls.__dict__:
        return
    saved: dict[str, Any] = {}
    for name in _WRAPPER_METHODS:
        if name not in cls.__dict__:
            continue
        orig = cls.__dict__[name]
        saved[name] = orig

        def make(orig: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(orig)
            def wrapper(self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
                tok = _WRAPPER.set((self, forward_batch))
                try:
                    return orig(self, forward_batch, *args, **kwargs)
                finally:
                    _WRAPPER.reset(tok)

            return wrapper

        setattr(cls, name, make(orig))
    cls._specscope_patched = saved


def instrument(module: Any, tracer: SglangTracer | None = None) -> None:
    """Patch `TRTLLMHAAttnBackend` and `TRTLLMHAAttnMultiStepDraftBackend` of a loaded trtllm_mha_backend module
    (idempotent). Patched classes record into the active tracer (`tracer`, or the last one opened); with none
    they run unchanged."""
    _patch_backend(module.TRTLLMHAAttnBackend)
    _patch_wrapper(module.TRTLLMHAAttnMultiStepDraftBackend)
    if module in _MODULES:
        _MODULES.remove(module)
    _MODULES.append(module)
    if tracer is not None and tracer in _ACTIVE:
        _ACTIVE.remove(tracer)
        _ACTIVE.append(tracer)


def _attach(be: Any, model_runner: Any) -> None:
    """What a just-constructed backend says about the server: server args, SGLang's spec-decoding variables, the
    rank, the unmodelled features in use (kept on the backend; the run info reads them when the trace opens)."""
    module = sys.modules.get(type(be).__module__)
    mod = next((m for m in reversed(_MODULES) if m is module), _MODULES[-1] if _MODULES else module)
    sa = _server_args(model_runner)
    env = _spec_env(getattr(mod, "envs", None))
    version = module_version(mod) if mod is not None else _installed_sglang_version()
    feats = _features(be, sa, env, _facts(version))
    be._specscope_facts = {"model": be._specscope_model, "server_args": sa, "env": env,
                           "parallel": parallel_facts(model_runner), "features": feats}
    _FACTS_SEQ[0] += 1
    be._specscope_facts["seq"] = _FACTS_SEQ[0]
    BACKEND_FACTS[:] = [*BACKEND_FACTS[-63:], be._specscope_facts]  # a server builds a handful; stay bounded
    for tr in _ACTIVE:  # a backend built after the trace opened (SGLang builds the draft's after the target's)
        if tr._writer is not None:
            for f in feats:
                tr.note_feature(f["feature"], f["detail"], f["source"])


def instrument_class(cls: type) -> None:
    """Patch one backend class (e.g. a subclass that overrides the fix-up hook); idempotent."""
    _patch_backend(cls)


def uninstrument(module: Any) -> None:
    """Restore the classes' original methods."""
    for cls in (module.TRTLLMHAAttnBackend, module.TRTLLMHAAttnMultiStepDraftBackend):
        saved = cls.__dict__.get("_specscope_patched")
        if saved is None:
            continue
        for name, orig in saved.items():
            if orig is None:
                if name in cls.__dict__:
                    delattr(cls, name)
            else:
                setattr(cls, name, orig)
        delattr(cls, "_specscope_patched")
