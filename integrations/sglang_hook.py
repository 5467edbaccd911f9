"""Switch specscope's SGLang recording on without editing SGLang: a `.pth` startup hook plus an env variable.

`specscope sglang-hook install` writes `specscope-sglang-hook.pth` into site-packages. Python runs its one line at
every start-up; it imports this module (standard library and tracer/user_env.py only) and calls `boot()`, which
returns at once unless `SPECSCOPE_TRACE` is set. When it is set, `boot()` puts an import finder in front of
`sys.meta_path` that reacts to exactly one module name, `sglang.srt.layers.attention.trtllm_mha_backend`: when
SGLang imports it, the module is executed normally and its `TRTLLMHAAttnBackend` /
`TRTLLMHAAttnMultiStepDraftBackend` are then patched (`specscope.integrations.sglang.instrument`). Nothing else is
imported or patched, so a process that never imports that module pays one dictionary lookup per import.

The trace is opened lazily, by the first prepared forward, in the process that runs it (SGLang's scheduler /
TP worker processes). One file per rank: the rank is SGLang's own (its model runner's `tp_rank`, the runtime
context's parallel group in 0.5.2x, else the torch.distributed world SGLang initialized; see
`sglang.parallel_facts`). `SPECSCOPE_TRACE` may contain `{rank}` and `{pid}`; a template without `{rank}` in a
process whose group has more than one rank gets `-rank<R>` before its extension, so ranks never share a path. A
path another live process is recording into is refused (an advisory lock beside it, `<path>.lock`, held while
recording), and an existing file is replaced only with `SPECSCOPE_TRACE_OVERWRITE=1`, and only when no live
process holds it: each rank replaces its own file at most. A refused path is one warning line; the server runs on
unrecorded (no fallback name that would hide the collision).
"""

from __future__ import annotations

import errno
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


def _multi_rank(par: dict[str, Any]) -> bool:
    sizes = (par.get("tp_size", 1), par.get("pp_size", 1), par.get("dp_size", 1), par.get("world_size", 1))
    return any(isinstance(n, int) and n > 1 for n in sizes) or par.get("tp_rank", 0) > 0


def trace_path(template: str, pid: int | None = None, parallel: dict[str, Any] | None = None) -> str:
    """The trace file for this process: `{pid}` and `{rank}` substituted (the rank from `parallel`, as
    `sglang.parallel_facts` reads it; without it from the launcher's variables); a template without `{rank}` in a
    process of a multi-rank group gets `-rank<R>` before its extension."""
    if parallel is None:
        rank, multi = user_env.rank(), user_env.rank() != "0"
    else:
        from .sglang import rank_label

        rank, multi = rank_label(parallel), _multi_rank(parallel)
    path = template.replace("{pid}", str(pid if pid is not None else os.getpid()))
    if "{rank}" in path:
        return path.replace("{rank}", rank)
    if multi:
        stem, ext = os.path.splitext(path)
        return f"{stem}-rank{rank}{ext}"
    return path


class PathLock:
    """An advisory lock on `<path>.lock`, held while a process records into `path`: a second process (another
    rank that computed the same path, another server) is refused instead of writing or replacing a live trace."""

    def __init__(self, path: str) -> None:
        import fcntl

        self.lock_path = path + ".lock"
        while True:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                os.close(fd)
                if e.errno in (errno.EAGAIN, errno.EACCES):
                    from ..tracer.errors import TraceError

                    raise TraceError(f"is being recorded by another live process (pid {holder}; its lock is "
                                     f"{self.lock_path})", path) from None
                raise
            # The holder may have removed the file between our open and our lock: lock the file that is there.
            try:
                same = os.stat(self.lock_path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self.fd: int | None = fd

    def release(self) -> None:
        """Remove the lock file and drop the lock (idempotent)."""
        if self.fd is None:
            return
        try:
            os.unlink(self.lock_path)
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None


def _open_tracer() -> Any:
    from . import sglang as ss  # torch and numpy: only once SGLang itself is running

    template = user_env.get(ENV)
    if template is None:  # boot() instruments SGLang only with it set
        raise KeyError(ENV)
    overwrite = user_env.get(user_env.TRACE_OVERWRITE) == "1"
    facts = ss.BACKEND_FACTS[0] if ss.BACKEND_FACTS else None  # the first backend this process built
    parallel = facts["parallel"] if facts is not None else ss.parallel_facts(None)
    path = trace_path(template, parallel=parallel)
    lock = PathLock(path)
    try:
        tracer = ss.SglangTracer(path, overwrite=overwrite)
    except BaseException:
        lock.release()
        raise
    import atexit

    atexit.register(lock.release)  # after the close below (atexit runs last-registered first)
    atexit.register(tracer.close)
    print(f"specscope: recording SGLang's TRTLLM MHA backend into {tracer.path} (rank {ss.rank_label(parallel)}, "
          f"from {parallel['source']})", file=sys.stderr)
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
