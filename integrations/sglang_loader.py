"""Load SGLang's own `trtllm_mha_backend.py` from an installed wheel, by file path, with only its imports replaced.

Why: specscope's backend mirrors SGLang's `TRTLLMHAAttnBackend`, and the parity test and the seed-bug drives
must run *upstream's* code, not our reading of it. Importing `sglang` itself needs a GPU server stack (psutil,
triton, distributed, ...), but the backend's metadata paths (eager init, CUDA-graph build/apply, the draft
multi-step wrapper) only need a handful of names. Each loaded module gets its own `__import__` that answers
`sglang.*` imports from the stand-ins below and passes every other import through, so two versions (say 0.5.12
and 0.5.13) load side by side and nothing is copied into this repository.

What is real and what is a stand-in (one load = one `UpstreamSglang`):

- real, loaded from the same wheel the same way: `layers/attention/base_attn_backend.AttentionBackend`;
- real definitions taken from the wheel's source with `ast` (their modules import CUDA and distributed code):
  `model_executor/forward_batch_info.ForwardMode` and `build_inner_fb_view`,
  `model_executor/cuda_graph_runner.build_replay_fb_view` (for drivers; the backend does not import it),
  `layers/attention/utils.canonicalize_stride`;
- stand-in `flashinfer_backend.FlashInferAttnBackend`: a subclass of the real `AttentionBackend` whose
  `__init__` sets what the real one sets for this backend (`req_to_token_pool`, `token_to_kv_pool`,
  `use_sliding_window_kv_pool=False`, `max_context_len`, `skip_prefill`), without flashinfer wrappers; like
  the real class it defines no verify-buffer hooks, so the base class's raising default shows through;
- stand-in `flashinfer_backend.FlashInferMultiStepDraftBackend`: the attributes the real `__init__` sets
  (`topk`, `speculative_num_steps`, `kv_indptr`, `kv_last_page_len`, `attn_backends`, ...) without the Triton
  kv-indices kernel;
- `environ.envs`: the variables the backend reads (the workspace size, small on a CPU; the skip-softmax
  factors, unset);
- `utils.is_flashinfer_available`, `utils.common.is_sm90_supported` / `is_sm120_supported` / `is_npu`: False on
  a CPU; with `kernels=True` the real `flashinfer` is imported and the SM checks read the device;
- `mem_cache.swa_memory_pool.SWAKVPool` / `SWATokenToKVPoolAllocator`: empty classes (no SWA model here);
- `triton_ops/trtllm_fp8_kv_kernel.fused_fp8_set_kv_buffer`: raises (fp8 KV caches are out of scope);
- `kernel_api_logging.debug_kernel_api`: the identity decorator.

A model runner is the backend's constructor argument, not an import: `make_model_runner` builds the few
attributes the constructor reads. Only topk = 1 without sliding-window layers is supported, the configuration
TRTLLM MHA serves in SGLang <= 0.5.23.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import importlib.util
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum, auto
from functools import total_ordering
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional, Protocol

import torch

TMB_PATH = "srt/layers/attention/trtllm_mha_backend.py"
_BASE_PATH = "srt/layers/attention/base_attn_backend.py"
_FBI_PATH = "srt/model_executor/forward_batch_info.py"
_CGR_PATH = "srt/model_executor/cuda_graph_runner.py"
_UTILS_PATH = "srt/layers/attention/utils.py"


class SglangNotFound(RuntimeError):
    """No usable sglang wheel at the given place."""


def find_sglang(where: str | os.PathLike[str] | None = None) -> Path:
    """The `sglang` package folder: `where` (a folder holding `sglang/`, or `sglang/` itself), else the
    installed distribution, found without importing it (importing sglang needs its server stack)."""
    if where is not None:
        p = Path(where)
        for cand in (p / "sglang", p):
            if (cand / TMB_PATH).is_file():
                return cand.resolve()
        raise SglangNotFound(f"{p}: no sglang/{TMB_PATH} there")
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SglangNotFound("sglang is not installed (python -m pip install --no-deps sglang==0.5.13)")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    if not (pkg / TMB_PATH).is_file():
        raise SglangNotFound(f"{pkg}: this sglang has no {TMB_PATH}")
    return pkg.resolve()


def sglang_version(pkg: Path) -> str:
    """The wheel's version, from its `dist-info` beside the package (no import)."""
    for d in sorted(pkg.parent.glob("sglang-*.dist-info")):
        meta = d / "METADATA"
        if meta.is_file():
            for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    vfile = pkg / "version.py"
    if vfile.is_file():
        tree = ast.parse(vfile.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__version__" for t in node.targets):
                return str(ast.literal_eval(node.value))
    return "unknown"


# ---- stand-ins --------------------------------------------------------------------------------------------
class _EnvVar:
    """What `envs.X` is in SGLang: `.get()` and `.is_set()`."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def get(self) -> Any:
        """The value (None when unset)."""
        return self.value

    def is_set(self) -> bool:
        """Whether the variable was given."""
        return self.value is not None


def _envs(workspace_bytes: int) -> SimpleNamespace:
    return SimpleNamespace(
        SGLANG_FLASHINFER_WORKSPACE_SIZE=_EnvVar(workspace_bytes),
        SGLANG_SKIP_SOFTMAX_DECODE_THRESHOLD_SCALE_FACTOR=_EnvVar(None),
        SGLANG_SKIP_SOFTMAX_PREFILL_THRESHOLD_SCALE_FACTOR=_EnvVar(None),
    )


class UpstreamBatch(SimpleNamespace):
    """Stand-in for `ForwardBatch`: the backend only reads attributes, so a namespace with the fields it reads."""


def _fused_fp8_set_kv_buffer(**kwargs: Any) -> None:
    raise NotImplementedError("fp8 KV caches are not supported by specscope's sglang loader")


def _make_flashinfer_parents(base: type) -> tuple[type, type]:
    class FlashInferAttnBackend(base):
        """Stand-in: the state `TRTLLMHAAttnBackend` inherits (flashinfer_backend.py FlashInferAttnBackend)."""

        def __init__(self, model_runner: Any, skip_prefill: bool = False, kv_indptr_buf: Any = None,
                     kv_last_page_len_buf: Any = None, **kwargs: Any) -> None:
            super().__init__()
            self.req_to_token_pool = model_runner.req_to_token_pool
            self.token_to_kv_pool = model_runner.token_to_kv_pool
            self.use_sliding_window_kv_pool = False
            self.max_context_len = model_runner.model_config.context_len
            self.skip_prefill = skip_prefill
            self.kv_indptr_buf = kv_indptr_buf
            self.kv_last_page_len_buf = kv_last_page_len_buf

    class FlashInferMultiStepDraftBackend:
        """Stand-in: the attributes the real `__init__` sets, without the Triton kv-indices kernel."""

        def __init__(self, model_runner: Any, topk: int, speculative_num_steps: int) -> None:
            self.topk = topk
            self.speculative_num_steps = speculative_num_steps
            self.page_size = model_runner.page_size
            max_bs = model_runner.req_to_token_pool.size * topk
            self.kv_indptr = torch.zeros((speculative_num_steps, max_bs + 1), dtype=torch.int32,
                                         device=model_runner.device)
            self.kv_last_page_len = torch.ones((max_bs,), dtype=torch.int32, device=model_runner.device)
            self.attn_backends = [None] * (speculative_num_steps - 1)
            self.max_context_len = model_runner.model_config.context_len
            self.pool_len = model_runner.req_to_token_pool.req_to_token.shape[1]
            self.req_to_token_pool = model_runner.req_to_token_pool

    return FlashInferAttnBackend, FlashInferMultiStepDraftBackend


def _extract(path: Path, names: tuple[str, ...], env: dict[str, Any]) -> dict[str, Any]:
    """Execute only the top-level definitions `names` of an upstream file (its own text, nothing copied)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    nodes = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    missing = set(names) - {n.name for n in nodes}
    if missing:
        raise SglangNotFound(f"{path}: no top-level {', '.join(sorted(missing))}")
    body: list[ast.stmt] = list(nodes)
    code = compile(ast.Module(body=body, type_ignores=[]), str(path), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    ns = dict(env)
    exec(code, ns)  # noqa: S102 - upstream's own definitions, by design
    return {n: ns[n] for n in names}


def _is_sm(major: int) -> Callable[[], bool]:
    def check() -> bool:
        return bool(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == major)
    return check


class UpstreamForwardMode(Protocol):
    """What drivers read of upstream's `ForwardMode`: an IntEnum class executed from the wheel's source at load
    time, so its members are known to the type checker only by name."""

    DECODE: Any
    EXTEND: Any
    TARGET_VERIFY: Any
    DRAFT_EXTEND: Any


@dataclass
class UpstreamSglang:
    """One loaded copy of upstream's backend module and the real helpers around it."""

    version: str
    root: Path  # the sglang package folder
    module: types.ModuleType  # trtllm_mha_backend, executed from the wheel's file
    base_module: types.ModuleType  # base_attn_backend, likewise
    ForwardMode: UpstreamForwardMode
    build_inner_fb_view: Callable[..., Any] | None  # absent before 0.5.13
    build_replay_fb_view: Callable[..., Any] | None  # absent before 0.5.13

    @property
    def backend_cls(self) -> type:
        """`TRTLLMHAAttnBackend`."""
        return self.module.TRTLLMHAAttnBackend

    @property
    def multi_step_cls(self) -> type:
        """`TRTLLMHAAttnMultiStepDraftBackend`."""
        return self.module.TRTLLMHAAttnMultiStepDraftBackend

    @property
    def api(self) -> str:
        """`out_graph` (0.5.13: `init_forward_metadata_out_graph(fb, in_capture)`) or `capture_replay` (0.5.12)."""
        return "out_graph" if "init_forward_metadata_out_graph" in vars(self.backend_cls) else "capture_replay"

    @property
    def has_fixup_hook(self) -> bool:
        """Whether the backend class itself implements `update_verify_buffers_to_fill_after_draft` (PR #25925)."""
        return "update_verify_buffers_to_fill_after_draft" in vars(self.backend_cls)


_COUNTER = [0]


def _exec_module(path: Path, modname: str, stubs: dict[str, Any], passthrough: tuple[str, ...]) -> types.ModuleType:
    real_import = builtins.__import__

    def imp(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and (name == "sglang" or name.startswith("sglang.")):
            mod = stubs.get(name)
            if mod is None:
                raise ImportError(f"specscope's sglang loader has no stand-in for {name!r} (imported by {path})")
            return mod
        if level == 0 and name.split(".")[0] == "flashinfer" and "flashinfer" not in passthrough:
            raise ImportError("flashinfer is not available to this load (kernels=False)")
        return real_import(name, globals, locals, fromlist, level)

    b = dict(vars(builtins))
    b["__import__"] = imp
    mod = types.ModuleType(modname)
    mod.__file__ = str(path)
    mod.__dict__["__builtins__"] = b
    # Registered so dataclasses and pickling can find the module by name; the names are unique per load.
    sys.modules[modname] = mod
    code = compile(path.read_text(encoding="utf-8"), str(path), "exec", dont_inherit=True)
    exec(code, mod.__dict__)  # noqa: S102 - upstream's own module, by design
    return mod


@dataclass
class _Helpers:
    """Upstream's own small definitions, taken from the wheel's source."""

    ForwardMode: UpstreamForwardMode
    build_inner_fb_view: Callable[..., Any] | None
    build_replay_fb_view: Callable[..., Any] | None
    canonicalize_stride: Callable[..., Any]


def _helpers(pkg: Path) -> _Helpers:
    base_env = {"torch": torch, "Optional": Optional, "SimpleNamespace": SimpleNamespace, "IntEnum": IntEnum,
                "auto": auto, "total_ordering": total_ordering}
    fm = _extract(pkg / _FBI_PATH, ("ForwardMode",), base_env)["ForwardMode"]
    env = dict(base_env, ForwardMode=fm, ForwardBatch=UpstreamBatch)
    try:
        inner = _extract(pkg / _FBI_PATH, ("build_inner_fb_view",), env)["build_inner_fb_view"]
    except SglangNotFound:
        inner = None
    try:
        replay_view = _extract(pkg / _CGR_PATH, ("build_replay_fb_view",), env)["build_replay_fb_view"]
    except SglangNotFound:
        replay_view = None
    canon = _extract(pkg / _UTILS_PATH, ("canonicalize_stride",), env)["canonicalize_stride"]
    return _Helpers(fm, inner, replay_view, canon)


def _module(prefix: str, name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(f"{prefix}.{name}")
    mod.__dict__.update(attrs)
    return mod


def _base_stand_ins(prefix: str, kernels: bool) -> dict[str, Any]:
    """What base_attn_backend.py imports."""
    return {
        "sglang.kernel_api_logging": _module(prefix, "kernel_api_logging", debug_kernel_api=lambda f: f),
        "sglang.srt.utils.common": _module(prefix, "common", is_npu=lambda: False,
                                           is_sm90_supported=_is_sm(9) if kernels else (lambda: False),
                                           is_sm120_supported=_is_sm(12) if kernels else (lambda: False)),
    }


def _backend_stand_ins(prefix: str, h: _Helpers, base_cls: type, kernels: bool,
                       workspace_bytes: int) -> dict[str, Any]:
    """What trtllm_mha_backend.py imports, besides the base class module."""
    fib, fib_multi = _make_flashinfer_parents(base_cls)

    class _SWA:
        """No sliding-window pools here."""

    inner = {} if h.build_inner_fb_view is None else {"build_inner_fb_view": h.build_inner_fb_view}
    fbi = _module(prefix, "forward_batch_info", ForwardMode=h.ForwardMode, ForwardBatch=UpstreamBatch, **inner)
    return {
        "sglang.srt.environ": _module(prefix, "environ", envs=_envs(workspace_bytes)),
        "sglang.srt.layers.attention.flashinfer_backend": _module(
            prefix, "flashinfer_backend", FlashInferAttnBackend=fib, FlashInferMultiStepDraftBackend=fib_multi),
        "sglang.srt.layers.attention.triton_ops.trtllm_fp8_kv_kernel": _module(
            prefix, "trtllm_fp8_kv_kernel", fused_fp8_set_kv_buffer=_fused_fp8_set_kv_buffer),
        "sglang.srt.layers.attention.utils": _module(prefix, "utils", canonicalize_stride=h.canonicalize_stride),
        "sglang.srt.mem_cache.swa_memory_pool": _module(prefix, "swa_memory_pool", SWAKVPool=_SWA,
                                                        SWATokenToKVPoolAllocator=_SWA),
        "sglang.srt.model_executor.forward_batch_info": fbi,
        "sglang.srt.utils": _module(prefix, "utils", is_flashinfer_available=lambda: kernels),
    }


def load_upstream(where: str | os.PathLike[str] | None = None, *, kernels: bool = False,
                  workspace_bytes: int | None = None) -> UpstreamSglang:
    """Load upstream's TRTLLM MHA backend from the wheel at `where` (default: the installed sglang).

    `kernels=True` lets the module import the real flashinfer and answers the SM checks from the device (GPU
    drives); the default keeps everything on the metadata path, which is what runs on a CPU."""
    pkg = find_sglang(where)
    version = sglang_version(pkg)
    _COUNTER[0] += 1
    prefix = f"_specscope_sglang_{version.replace('.', '_')}_{_COUNTER[0]}"
    if workspace_bytes is None:
        workspace_bytes = (512 << 20) if kernels else (1 << 20)
    h = _helpers(pkg)
    stubs = _base_stand_ins(prefix, kernels)
    base = _exec_module(pkg / _BASE_PATH, f"{prefix}.base_attn_backend", stubs, ())
    stubs.update(_backend_stand_ins(prefix, h, base.AttentionBackend, kernels, workspace_bytes))
    tmb = _exec_module(pkg / TMB_PATH, f"{prefix}.trtllm_mha_backend", stubs, ("flashinfer",) if kernels else ())
    return UpstreamSglang(version, pkg, tmb, base, h.ForwardMode, h.build_inner_fb_view, h.build_replay_fb_view)


TMB_MODULE = "sglang.srt.layers.attention.trtllm_mha_backend"
_PACKAGES = ("", "srt", "srt/layers", "srt/layers/attention", "srt/layers/attention/triton_ops", "srt/mem_cache",
             "srt/model_executor")


def install_as_sglang(where: str | os.PathLike[str] | None = None, *, kernels: bool = False,
                      workspace_bytes: int | None = None) -> UpstreamSglang:
    """Make `import sglang.srt.layers.attention.trtllm_mha_backend` work in this process, through Python's normal
    import system, from the wheel's own files: the packages on the way are registered without running their
    `__init__.py` (which pull the server stack), and the stand-ins above under their real names.

    This is how a process looks to the start-up hook when SGLang imports the backend; tests and GPU drives use
    it. It refuses when any `sglang` module is already imported."""
    pkg = find_sglang(where)
    if any(m == "sglang" or m.startswith("sglang.") for m in sys.modules):
        raise RuntimeError("sglang is already imported in this process")
    if workspace_bytes is None:
        workspace_bytes = (512 << 20) if kernels else (1 << 20)
    for rel in _PACKAGES:
        name = "sglang" + ("." + rel.replace("/", ".") if rel else "")
        mod = types.ModuleType(name)
        mod.__path__ = [str(pkg / rel)] if rel else [str(pkg)]
        mod.__package__ = name
        sys.modules[name] = mod
    h = _helpers(pkg)
    sys.modules.update(_base_stand_ins("sglang", kernels))
    base = importlib.import_module("sglang.srt.layers.attention.base_attn_backend")
    sys.modules.update(_backend_stand_ins("sglang", h, base.AttentionBackend, kernels, workspace_bytes))
    tmb = importlib.import_module(TMB_MODULE)
    return UpstreamSglang(sglang_version(pkg), pkg, tmb, base, h.ForwardMode, h.build_inner_fb_view,
                          h.build_replay_fb_view)


def make_model_runner(*, req_to_token: torch.Tensor, page_size: int, context_len: int, num_draft_tokens: int | None,
                      device: torch.device | str = "cpu", topk: int = 1, is_draft_worker: bool = False,
                      token_to_kv_pool: Any = None, dtype: torch.dtype = torch.bfloat16,
                      kv_cache_dtype: torch.dtype | None = None, hidden_size: int = 64) -> SimpleNamespace:
    """The attributes `TRTLLMHAAttnBackend.__init__` reads from a model runner (0.5.12 and 0.5.13)."""
    pool = SimpleNamespace(req_to_token=req_to_token, size=req_to_token.shape[0] - 1)
    allocator = SimpleNamespace(get_kvcache=lambda: token_to_kv_pool)
    return SimpleNamespace(
        model_config=SimpleNamespace(context_len=context_len, hidden_size=hidden_size),
        kv_cache_dtype=kv_cache_dtype or dtype, dtype=dtype, page_size=page_size, req_to_token_pool=pool,
        token_to_kv_pool=token_to_kv_pool, token_to_kv_pool_allocator=allocator, device=torch.device(device),
        server_args=SimpleNamespace(speculative_eagle_topk=topk, speculative_num_draft_tokens=num_draft_tokens),
        is_draft_worker=is_draft_worker,
        spec_algorithm=SimpleNamespace(is_frozen_kv_mtp=lambda: False))


LOADED_FILES = (TMB_PATH, _BASE_PATH, _FBI_PATH, _CGR_PATH, _UTILS_PATH, "version.py")


def write_slim(pkg: Path, dest: Path) -> Path:
    """Copy only the wheel files this loader reads (a few hundred KB) to `dest/<version>/`, for hosts without
    network where a whole wheel is too big to carry; `load_upstream(dest/<version>)` loads it. Returns the folder."""
    import shutil

    version = sglang_version(pkg)
    out = dest / version
    for rel in LOADED_FILES:
        src = pkg / rel
        if src.is_file():
            (out / "sglang" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out / "sglang" / rel)
    meta = out / f"sglang-{version}.dist-info"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n", encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m specscope.integrations.sglang_loader --slim DEST [--sglang DIR ...]`: slim copies for GPU hosts."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m specscope.integrations.sglang_loader", description=main.__doc__)
    ap.add_argument("--slim", required=True, metavar="DEST", help="folder to write <version>/ copies into")
    ap.add_argument("--sglang", action="append", default=[], metavar="DIR",
                    help="an unpacked wheel (repeatable; default: the installed sglang)")
    a = ap.parse_args(argv)
    try:
        for where in a.sglang or [None]:
            print(write_slim(find_sglang(where), Path(a.slim)))
    except SglangNotFound as e:
        print(f"specscope: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
