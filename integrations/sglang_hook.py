"""Switch specscope's SGLang recording on without editing SGLang: a `.pth` startup hook plus an env variable.

`specscope sglang-hook install` writes `specscope-sglang-hook.pth` into site-packages. Python runs its one line at
every start-up; it imports this module (standard library and tracer/user_env.py only) and calls `boot()`, which
returns at once unless `SPECSCOPE_TRACE` is set. When it is set, `boot()` puts an import finder in front of
`sys.meta_path` that reacts to exactly one module name, `sglang.srt.layers.attention.trtllm_mha_backend`: when
SGLang imports it, the module is executed normally and its `TRTLLMHAAttnBackend` /
`TRTLLMHAAttnMultiStepDraftBackend` are then patched (`specscope.integrations.sglang.instrument`). Nothing else is
imported or patched, so a process that never imports that module pays one dictionary lookup per import.

The trace is opened lazily, by the first prepared forward, in the process that runs it (SGLang's scheduler /
TP worker processes). `SPECSCOPE_TRACE` may contain `{pid}` (and `{rank}`, from `TP_RANK` / `RANK` / `LOCAL_RANK`
when set); without them the first process creates the file and any other falls back to `<stem>-<pid><ext>`.
An existing file is never overwritten unless `SPECSCOPE_TRACE_OVERWRITE=1`.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from typing import Any

from ..tracer import user_env  # os and collections.abc only: cheap enough for every interpreter start-up

TARGET = "sglang.srt.layers.attention.trtllm_mha_backend"
ENV = user_env.TRACE
PTH_NAME = "specscope-sglang-hook.pth"
PTH_LINE = "import specscope.integrations.sglang_hook as _specscope_sglang_hook; _specscope_sglang_hook.boot()\n"


class _PatchingLoader(importlib.abc.Loader):
    """Executes the real module with its own loader, then instruments it."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        """Whatever the real loader creates."""
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        """Run SGLang's module unchanged, then patch its two classes."""
        self.inner.exec_module(module)
        on_loaded(module)


class SglangFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for the one target name it asks the other finders and wraps the loader."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        """Only `TARGET` is ever touched."""
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def trace_path(template: str, pid: int | None = None) -> str:
    """The trace file for this process: `{pid}` / `{rank}` substituted."""
    rank = user_env.rank()
    return template.replace("{pid}", str(pid if pid is not None else os.getpid())).replace("{rank}", rank)


def _open_tracer() -> Any:
    from . import sglang as ss  # torch and numpy: only once SGLang itself is running

    template = user_env.get(ENV)
    if template is None:  # boot() instruments SGLang only with it set
        raise KeyError(ENV)
    overwrite = user_env.get(user_env.TRACE_OVERWRITE) == "1"
    path = trace_path(template)
    from ..tracer.errors import TraceError

    try:
        tracer = ss.SglangTracer(path, overwrite=overwrite)
    except TraceError:
        if "{pid}" in template:
            raise
        stem, ext = os.path.splitext(path)
        tracer = ss.SglangTracer(f"{stem}-{os.getpid()}{ext or '.db'}", overwrite=overwrite)
    import atexit

    atexit.register(tracer.close)
    print(f"specscope: recording SGLang's TRTLLM MHA backend into {tracer.path}", file=sys.stderr)
    return tracer


def on_loaded(module: Any) -> None:
    """Instrument a just-imported trtllm_mha_backend module; the trace opens at its first prepared forward."""
    from . import sglang as ss

    ss.set_tracer_factory(_open_tracer)
    ss.instrument(module)


def boot() -> None:
    """Called by the .pth line at interpreter start-up; a no-op unless SPECSCOPE_TRACE is set."""
    if not user_env.get(ENV):
        return
    if any(isinstance(f, SglangFinder) for f in sys.meta_path):
        return
    mod = sys.modules.get(TARGET)
    if mod is not None:  # imported before we got here (not via the .pth path)
        on_loaded(mod)
        return
    sys.meta_path.insert(0, SglangFinder())
