"""How the SGLang recorder attaches: `TRTLLMHAAttnBackend`'s prep methods, its in-graph metadata call and its
plan-stream fix-up hook are wrapped (each calls the original unchanged, then tells the active tracer what it
prepared, also when it raised); the multi-step draft wrapper only tells its step backends which live batch they
serve. Nothing is patched at import: `instrument` patches a loaded module's classes, `uninstrument` restores them."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

from ..tracer.schema import GraphPhase
from . import sglang_state as state
from .sglang_provenance import (
    facts_of,
    features,
    installed_sglang_version,
    module_version,
    parallel_facts,
    server_args_of,
    spec_env,
)
from .sglang_state import SglangTracer, active_tracer, safely
from .sglang_steps import FIXUP, IN_GRAPH, Prep

_WRAPPER_METHODS = ("init_forward_metadata", "init_forward_metadata_out_graph", "init_forward_metadata_in_graph",
                    "init_forward_metadata_capture_cuda_graph", "init_forward_metadata_replay_cuda_graph")


def _recording(method: str, to_prep: Callable[..., Prep]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap a prep method: call it unchanged, then record what it prepared (also when it raised)."""

    def deco(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            tr = active_tracer()
            if tr is None or state.IN_PREP.get():
                return orig(self, *args, **kwargs)
            start, ev = tr.timing()
            tok = state.IN_PREP.set(True)  # a prep calling another prep (capture -> apply) is one step
            try:
                out = orig(self, *args, **kwargs)
            except BaseException as e:
                e._specscope_call = method  # type: ignore[attr-defined]  # an ad hoc tag: which prep raised
                state.IN_PREP.reset(tok)

                def record_error(err: BaseException = e) -> None:  # a default: Python deletes `e` after the handler
                    tr.record_prep(self, to_prep(self, *args, **kwargs), start, ev, err)

                safely(record_error, method, tr)
                raise
            state.IN_PREP.reset(tok)
            safely(lambda: tr.record_prep(self, to_prep(self, *args, **kwargs), start, ev, None), method, tr)
            return out

        wrapper._specscope_original = orig  # type: ignore[attr-defined]  # an ad hoc tag on a plain function
        return wrapper

    return deco


def _eager(self: Any, fb: Any) -> Prep:
    return Prep(GraphPhase.EAGER, fb)


def _out_graph(self: Any, fb: Any, in_capture: bool = False) -> Prep:
    n = int(fb.positions.numel()) if in_capture and getattr(fb, "positions", None) is not None else None
    return Prep(GraphPhase.CAPTURE if in_capture else GraphPhase.REPLAY, fb, n, in_capture)


class _Args:
    """A ForwardBatch-like view of 0.5.12's capture/replay arguments."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


def _capture_012(self: Any, bs: int, num_tokens: int, req_pool_indices: Any, seq_lens: Any, encoder_lens: Any,
                 forward_mode: Any, spec_info: Any) -> Prep:
    live = state.LIVE.get()
    fb = _Args(batch_size=bs, req_pool_indices=req_pool_indices, seq_lens=seq_lens, seq_lens_cpu=seq_lens.cpu(),
               forward_mode=forward_mode, spec_info=spec_info, input_ids=None,
               positions=getattr(live, "positions", None), out_cache_loc=getattr(live, "out_cache_loc", None))
    return Prep(GraphPhase.CAPTURE, fb, num_tokens, True)


def _replay_012(self: Any, bs: int, req_pool_indices: Any, seq_lens: Any, seq_lens_sum: Any, encoder_lens: Any,
                forward_mode: Any, spec_info: Any, seq_lens_cpu: Any = None) -> Prep:
    fb = _Args(batch_size=bs, req_pool_indices=req_pool_indices, seq_lens=seq_lens,
               seq_lens_cpu=seq_lens_cpu if seq_lens_cpu is not None else seq_lens.cpu(), forward_mode=forward_mode,
               spec_info=spec_info, input_ids=None, positions=None, out_cache_loc=None)
    return Prep(GraphPhase.REPLAY, fb)


_PREPS: dict[str, Callable[..., Prep]] = {
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
        safely(lambda: attach(self, model_runner), "attach")

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

                    safely(record_error, IN_GRAPH, tr)
                raise
            if tr is not None:
                safely(lambda: tr.record_in_graph(self, None), IN_GRAPH, tr)
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

                    safely(record_error, FIXUP, tr)
                raise
            if tr is not None:
                safely(lambda: tr.record_fixup(self, spec_info, None), FIXUP, tr)
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
                tok = state.WRAPPER.set((self, forward_batch))
                try:
                    return orig(self, forward_batch, *args, **kwargs)
                finally:
                    state.WRAPPER.reset(tok)

            return wrapper

        setattr(cls, name, make(orig))
    cls._specscope_patched = saved


def instrument(module: Any, tracer: SglangTracer | None = None) -> None:
    """Patch `TRTLLMHAAttnBackend` and `TRTLLMHAAttnMultiStepDraftBackend` of a loaded trtllm_mha_backend module
    (idempotent). Patched classes record into the active tracer (`tracer`, or the last one opened); with none
    they run unchanged."""
    _patch_backend(module.TRTLLMHAAttnBackend)
    _patch_wrapper(module.TRTLLMHAAttnMultiStepDraftBackend)
    if module in state.MODULES:
        state.MODULES.remove(module)
    state.MODULES.append(module)
    if tracer is not None and tracer in state.ACTIVE:
        state.ACTIVE.remove(tracer)
        state.ACTIVE.append(tracer)


def attach(be: Any, model_runner: Any) -> None:
    """What a just-constructed backend says about the server: server args, SGLang's spec-decoding variables, the
    rank, the unmodelled features in use (kept on the backend; the run info reads them when the trace opens)."""
    module = sys.modules.get(type(be).__module__)
    mod = next((m for m in reversed(state.MODULES) if m is module), state.MODULES[-1] if state.MODULES else module)
    sa = server_args_of(model_runner)
    env = spec_env(getattr(mod, "envs", None))
    version = module_version(mod) if mod is not None else installed_sglang_version()
    feats = features(be, sa, env, facts_of(version))
    be._specscope_facts = {"model": be._specscope_model, "server_args": sa, "env": env,
                           "parallel": parallel_facts(model_runner), "features": feats}
    state.FACTS_SEQ[0] += 1
    be._specscope_facts["seq"] = state.FACTS_SEQ[0]
    # A server builds a handful of backends: stay bounded.
    state.BACKEND_FACTS[:] = [*state.BACKEND_FACTS[-63:], be._specscope_facts]
    for tr in state.ACTIVE:  # a backend built after the trace opened (SGLang builds the draft's after the target's)
        if tr.opened:
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
