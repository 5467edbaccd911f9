"""Load SGLang's own `trtllm_mha_backend.py` from an installed wheel, by file path, with only its imports replaced.

Why: specscope's backend mirrors SGLang's `TRTLLMHAAttnBackend`, and the parity test and the seed-bug drives
must run *upstream's* code, not our reading of it. Importing `sglang` itself needs a GPU server stack (psutil,
triton, distributed, ...), but the backend's metadata paths (eager init, CUDA-graph build/apply, the draft
multi-step wrapper) only need a handful of names. Each loaded module gets its own `__import__` that answers
`sglang.*` imports from the stand-ins below and passes every other import through, so two versions (say 0.5.12
and 0.5.13) load side by side and nothing is copied into this repository.

What is real and what is a stand-in (one load = one `UpstreamSglang`). Where a file lives, and which names a
release imports, come from `sglang_versions.facts_for` (and are checked against the wheel after every load):

- real, loaded from the same wheel the same way: `layers/attention/base_attn_backend` (its `AttentionBackend`,
  and from 0.5.18 the `SharedReadEnds` the backend imports from it);
- real, upstream's Triton kernel files (0.5.14+: the device page-table builder; 0.5.15+: the fused in-graph
  metadata kernel), executed from the wheel; on a CPU their kernels are made under Triton's interpreter (what
  `TRITON_INTERPRET=1` selects), so upstream's own kernels compute the values on CPU tensors;
- real definitions taken from the wheel's source with `ast` (their modules import CUDA and distributed code):
  `ForwardMode` and `build_inner_fb_view` (forward_batch_info), `build_replay_fb_view` (the decode graph
  runner; for drivers, the backend does not import it), `canonicalize_stride`, `resolve_ragged_verify_layout`
  (0.5.16+), and the enums `AttentionType`, `KVCacheAttentionAccessKind`, `IdSpaceKind` where a release has them;
- stand-in `flashinfer_backend.FlashInferAttnBackend`: a subclass of the real `AttentionBackend` whose
  `__init__` sets what the real one sets for this backend (`req_to_token_pool`, `token_to_kv_pool`,
  `kv_index_translator`, `use_sliding_window_kv_pool=False`, a plain `kv_cache_quant_method`,
  `max_context_len`, `skip_prefill`), without flashinfer wrappers; like the real class it defines no
  verify-buffer hooks, so the base class's raising default shows through;
- stand-in `flashinfer_backend.FlashInferMultiStepDraftBackend`: the attributes the real `__init__` sets
  (`topk`, `speculative_num_steps`, `kv_indptr`, `kv_last_page_len`, `attn_backends`, ...) without the Triton
  kv-indices kernel;
- `environ.envs`: the variables the backend reads (the workspace size, small on a CPU; the skip-softmax
  factors and ragged verify unset; one decode seq-len split);
- `runtime_context` (0.5.16+): `get_spec()` answers from the server args of the model runner whose backend is
  being built, `get_buffer` keeps one buffer per name, the platform is neither SM90 nor SM120 on a CPU, one
  attention TP rank;
- `utils.is_flashinfer_available`, `utils.common.is_sm90_supported` / `is_sm120_supported` / `is_npu`: False on
  a CPU; with `kernels=True` the real `flashinfer` is imported and the SM checks read the device;
- no sliding window, no context parallelism, no unified pool, no FP8/FP4 KV: `SWAKVPool`, `HybridLinearKVPool`
  and `KVWriteLoc` are classes nothing is an instance of, `is_cp_active` is False, the KV index translator does
  not translate; the FP8 kernels, `paged_kv_view`, `get_cp_strategy` and the ragged-verify geometry raise;
- `kernel_api_logging.debug_kernel_api` (either module name): the identity decorator; the MLA backend's
  persistent counter buffer: a zero tensor.

A model runner is the backend's constructor argument, not an import: `make_model_runner` builds the attributes
the constructor reads in any release. Only topk = 1 without sliding-window layers is supported, the configuration
TRTLLM MHA serves in SGLang 0.5.12 ... 0.5.23.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import enum
import functools
import importlib.util
import inspect
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum, IntEnum, auto
from functools import total_ordering
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional, Protocol

import torch

from .sglang_versions import SglangFacts, facts_for

TMB_PATH = "srt/layers/attention/trtllm_mha_backend.py"
_BASE_PATH = "srt/layers/attention/base_attn_backend.py"
_FBI_PATH = "srt/model_executor/forward_batch_info.py"
_RAGGED_PATH = "srt/speculative/ragged_verify.py"
_ENUM_SOURCES = (  # upstream enums the backend compares against, taken from the wheel where the release has them
    ("srt/layers/radix_attention.py", "AttentionType"),
    ("srt/layers/quantization/fp4_kv_cache_quant_method.py", "KVCacheAttentionAccessKind"),
    ("srt/mem_cache/kv_loc_plan.py", "IdSpaceKind"),
)


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
        SGLANG_TRTLLM_MHA_DECODE_SEQ_LEN_SPLITS=_EnvVar(1),  # SGLang's default: no split
        SGLANG_RAGGED_VERIFY_MODE=_EnvVar(None),
    )


class UpstreamBatch(SimpleNamespace):
    """Stand-in for `ForwardBatch`: the backend only reads attributes, so a namespace with the fields it reads."""


def _unsupported(what: str) -> Callable[..., Any]:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{what} is not supported by specscope's sglang loader")
    return refuse


class _KVAccess(SimpleNamespace):
    """`KVCacheAttentionAccess` of a plain bf16 KV cache: the backend reads its kind and scale recipe."""


class _PlainKVQuantMethod:
    """The KV-cache quant method of an unquantized pool (`token_to_kv_pool.get_kv_cache_quant_method()`)."""

    name = "plain"

    def __init__(self, plain_kind: Any) -> None:
        self.plain_kind = plain_kind

    def resolve_attention_access(self, phase: str, backend: str) -> _KVAccess:
        """Plain access in every phase: the cache is in the model's dtype and layout."""
        return _KVAccess(kind=self.plain_kind, scale_recipe=None)

    def describe_attention_accesses(self, phase: str) -> list[str]:
        """The accesses this method offers."""
        return ["plain"]


class _NoTranslation:
    """`kv_index_translator` (0.5.19+) of a static (non-unified) KV pool: ids are used as they are. The methods
    that translate are called only when `is_translating`, so they refuse."""

    is_translating = False

    def make_capture_tables(self, *, max_bs: int, max_context_len: int) -> None:
        """No capture tables to own (0.5.19): nothing is translated."""
        return None

    def index_table_for_batch(self, forward_batch: Any) -> SimpleNamespace:
        """No translated table (0.5.19 - 0.5.21): the backend builds its page table from `req_to_token`."""
        return SimpleNamespace(is_translated=False, ids=None, sliding_window_ids=None)

    def read_table(self, plan: Any, kind: Any = None, rows: int | None = None) -> SimpleNamespace:
        """No translated table (0.5.22+): the backend builds its page table from `req_to_token`."""
        return SimpleNamespace(is_translated=False, ids=None)

    def space(self, kind: Any) -> None:
        """No sub-pool id spaces (no sliding-window layers)."""
        return None

    build_index_table = fill_read_table = copy_page_table = staticmethod(_unsupported("a unified KV pool"))
    write_ids = sliding_window_write_loc_for = staticmethod(_unsupported("a unified KV pool"))


class _RuntimeContext:
    """`sglang.srt.runtime_context` (0.5.16+): the process-wide settings a server holds. Here the settings of the
    model runner whose backend is being built: the stand-in FlashInfer parents set them from its `server_args`
    before upstream's constructor reads them, as one SGLang process holds one runner's settings."""

    def __init__(self, kernels: bool) -> None:
        self.spec = SimpleNamespace(speculative_eagle_topk=None, speculative_num_draft_tokens=None)
        self.buffers: dict[str, Any] = {}
        self.kernels = kernels

    def use(self, model_runner: Any) -> None:
        """Answer `get_spec()` from this runner's server args from now on."""
        sa = model_runner.server_args
        self.spec = SimpleNamespace(speculative_eagle_topk=sa.speculative_eagle_topk,
                                    speculative_num_draft_tokens=sa.speculative_num_draft_tokens)

    def module(self, prefix: str) -> types.ModuleType:
        """The module's names, bound to this context."""
        def get_buffer(name: str, make: Callable[[], Any]) -> Any:
            # One buffer per name in a process (SGLang shares the zero workspace between all TRTLLM MHA backends).
            if name not in self.buffers:
                self.buffers[name] = make()
            return self.buffers[name]

        platform = SimpleNamespace(is_sm90=_is_sm(9)() if self.kernels else False,
                                   is_sm120=_is_sm(12)() if self.kernels else False)
        return _module(
            prefix, "runtime_context", get_buffer=get_buffer, get_spec=lambda: self.spec,
            get_platform=lambda: platform, get_parallel=lambda: SimpleNamespace(attn_tp_size=1),
            get_schedule=lambda: SimpleNamespace(max_prefill_tokens=0),
            get_exec=lambda: SimpleNamespace(graph=SimpleNamespace(cuda_graph_config=SimpleNamespace(
                decode=SimpleNamespace(max_bs=None)))),
            max_prefill_buffer_tokens=lambda: 0,
            max_speculative_num_draft_tokens=lambda: self.spec.speculative_num_draft_tokens)


def _make_flashinfer_parents(base: type, ctx: _RuntimeContext, plain_kind: Any) -> tuple[type, type]:
    class FlashInferAttnBackend(base):
        """Stand-in: the state `TRTLLMHAAttnBackend` inherits (flashinfer_backend.py FlashInferAttnBackend)."""

        def __init__(self, model_runner: Any, skip_prefill: bool = False, kv_indptr_buf: Any = None,
                     kv_last_page_len_buf: Any = None, **kwargs: Any) -> None:
            super().__init__()
            ctx.use(model_runner)
            self.req_to_token_pool = model_runner.req_to_token_pool
            self.token_to_kv_pool = model_runner.token_to_kv_pool
            self.kv_index_translator = model_runner.kv_index_translator
            self.use_sliding_window_kv_pool = False
            self.kv_cache_quant_method = _PlainKVQuantMethod(plain_kind)
            self.max_context_len = model_runner.model_config.context_len
            self.skip_prefill = skip_prefill
            self.kv_indptr_buf = kv_indptr_buf
            self.kv_last_page_len_buf = kv_last_page_len_buf

    class FlashInferMultiStepDraftBackend:
        """Stand-in: the attributes the real `__init__` sets, without the Triton kv-indices kernel."""

        def __init__(self, model_runner: Any, topk: int, speculative_num_steps: int) -> None:
            ctx.use(model_runner)
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
    time, so its members are known to the type checker only by name (v1 `DRAFT_EXTEND` only up to 0.5.13)."""

    DECODE: Any
    EXTEND: Any
    TARGET_VERIFY: Any
    DRAFT_EXTEND_V2: Any


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
    facts: SglangFacts
    # Upstream's Triton kernel modules the backend imports, by module name, loaded from the wheel (0.5.14+).
    kernel_modules: dict[str, types.ModuleType] = field(default_factory=dict)

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
        """`out_graph` (0.5.13+: `init_forward_metadata_out_graph(fb, in_capture)`) or `capture_replay` (0.5.12)."""
        return "out_graph" if "init_forward_metadata_out_graph" in vars(self.backend_cls) else "capture_replay"

    @property
    def has_fixup_hook(self) -> bool:
        """Whether the backend class itself implements `update_verify_buffers_to_fill_after_draft` (PR #25925)."""
        return "update_verify_buffers_to_fill_after_draft" in vars(self.backend_cls)


def check_facts(up: UpstreamSglang) -> None:
    """Raise SglangNotFound when `sglang_versions.facts_for` says something of this wheel that its loaded code
    contradicts (a field, a mode, a method, a signature): the facts table is kept true by every load."""
    f, cls = up.facts, up.backend_cls
    fields = set(getattr(up.module.TRTLLMMHAMetadata, "__dataclass_fields__", {}))
    seen = {
        "has_max_seq_len_k": "max_seq_len_k" in fields,
        "has_draft_extend_v1": hasattr(up.ForwardMode, "DRAFT_EXTEND"),
        "graph_metadata_in_graph": "init_forward_metadata_in_graph" in vars(cls),
        "graph_api": up.api,
        "has_fixup_hook": up.has_fixup_hook,
        "has_ragged_verify": "is_ragged_verify" in fields,
        "has_unified_kv_pool": "kv_index_translator" in Path(str(up.module.__file__)).read_text(encoding="utf-8"),
        "page_table_on_device": "build_trtllm_mha_page_table" in vars(up.module),
        "replay_view_takes_global_tokens": (up.build_replay_fb_view is not None and "global_num_tokens_cpu" in
                                            inspect.signature(up.build_replay_fb_view).parameters),
    }
    wrong = [f"{k}: facts say {getattr(f, k)!r}, the wheel has {v!r}" for k, v in seen.items() if getattr(f, k) != v]
    if wrong:
        raise SglangNotFound(f"sglang {up.version} at {up.root}: sglang_versions facts disagree: " + "; ".join(wrong))


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


def _module_name(rel: str) -> str:
    """`kernels/ops/attention/x.py` -> `sglang.kernels.ops.attention.x`."""
    return "sglang." + rel.removesuffix(".py").replace("/", ".")


def _kernel_modules(pkg: Path, facts: SglangFacts, prefix: str, kernels: bool) -> dict[str, types.ModuleType]:
    """Upstream's Triton kernel files the backend imports, executed from the wheel, by their module names.

    On a CPU (`kernels=False`) they run under Triton's interpreter, what `TRITON_INTERPRET=1` selects: their
    `@triton.jit` kernels are made as interpreted functions (the setting scoped to this load), and each call of
    the files' launchers sees Triton's own library functions (`tl.cdiv`, `tl.cumsum`, ...) interpreted too, as a
    process started under `TRITON_INTERPRET=1` would; so upstream's own kernels compute the values on CPU
    tensors, and no other Triton code in the process changes."""
    rels = [r for r in (facts.page_table_kernel_path, facts.graph_metadata_kernel_path) if r is not None]
    if not rels:
        return {}
    try:
        import triton
    except ImportError as e:
        raise SglangNotFound(f"sglang {facts.version}'s backend imports Triton kernels; install triton "
                             f"(python -m pip install triton) to load it ({e})") from e
    out: dict[str, types.ModuleType] = {}
    runtime = triton.knobs.runtime
    with runtime.scope():
        runtime.interpret = not kernels
        for rel in rels:
            name = _module_name(rel)
            mod = _exec_module(pkg / rel, f"{prefix}.{name.rsplit('.', 1)[1]}", {}, ())
            if not kernels:
                _interpret_launchers(mod)
            out[name] = mod
    return out


def _interpret_launchers(mod: types.ModuleType) -> None:
    """Wrap the module's plain Python functions (the launchers around its kernels) so that, while one runs,
    every library function of `triton.language` that is a compiled-mode `@jit` function is its interpreted twin."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    twins = {n: (v, InterpretedFunction(v.fn)) for n in dir(tl) if isinstance(v := getattr(tl, n), JITFunction)}
    depth = [0]  # launchers call each other: only the outermost call swaps and restores

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def launch(*args: Any, **kwargs: Any) -> Any:
            if depth[0] == 0:
                for n, (_, twin) in twins.items():
                    setattr(tl, n, twin)
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    for n, (orig, _) in twins.items():
                        setattr(tl, n, orig)
        return launch

    for n, v in list(vars(mod).items()):
        if isinstance(v, types.FunctionType) and v.__module__ == mod.__name__:
            setattr(mod, n, wrap(v))


@dataclass
class _Helpers:
    """Upstream's own small definitions, taken from the wheel's source."""

    ForwardMode: UpstreamForwardMode
    build_inner_fb_view: Callable[..., Any] | None
    build_replay_fb_view: Callable[..., Any] | None
    canonicalize_stride: Callable[..., Any]
    enums: dict[str, type]  # upstream enums present in this release (AttentionType, ...), by name
    resolve_ragged_verify_layout: Callable[..., Any] | None  # 0.5.16+


def _helpers(pkg: Path, facts: SglangFacts) -> _Helpers:
    base_env = {"torch": torch, "Optional": Optional, "SimpleNamespace": SimpleNamespace, "IntEnum": IntEnum,
                "auto": auto, "total_ordering": total_ordering, "Enum": Enum, "enum": enum}
    fm = _extract(pkg / _FBI_PATH, ("ForwardMode",), base_env)["ForwardMode"]
    env = dict(base_env, ForwardMode=fm, ForwardBatch=UpstreamBatch)
    try:
        inner = _extract(pkg / _FBI_PATH, ("build_inner_fb_view",), env)["build_inner_fb_view"]
    except SglangNotFound:
        inner = None
    # The view names the data-parallel padding mode (0.5.21+); no data parallelism here, and no backend of this
    # kind reads it.
    view_env = dict(env, DpPaddingMode=SimpleNamespace(get_default_mode_in_cuda_graph=lambda *a, **k: None))
    try:  # 0.5.12's runner has no view builder (its backends take the replay arguments one by one)
        replay_view = _extract(pkg / facts.cuda_graph_runner_path, ("build_replay_fb_view",),
                               view_env)["build_replay_fb_view"]
    except SglangNotFound:
        replay_view = None
    canon = _extract(pkg / facts.attention_utils_path, ("canonicalize_stride",), env)["canonicalize_stride"]
    enums: dict[str, type] = {}
    for rel, name in _ENUM_SOURCES:
        if (pkg / rel).is_file():
            try:
                enums[name] = _extract(pkg / rel, (name,), base_env)[name]
            except SglangNotFound:
                continue  # an older release: its backend does not import it
    ragged = None
    if facts.has_ragged_verify:
        ragged = _extract(pkg / _RAGGED_PATH, ("resolve_ragged_verify_layout",), env)["resolve_ragged_verify_layout"]
    return _Helpers(fm, inner, replay_view, canon, enums, ragged)


def _module(prefix: str, name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(f"{prefix}.{name}")
    mod.__dict__.update(attrs)
    return mod


class _Absent:
    """A class the backend only tests instances against (isinstance): no such pool exists here."""


def _stand_ins(prefix: str, h: _Helpers, kernels: bool, workspace_bytes: int) -> dict[str, Any]:
    """What base_attn_backend.py imports (and the module-level names the backend shares with it), every release's
    module names at once: a release imports the ones it has."""
    inner = {} if h.build_inner_fb_view is None else {"build_inner_fb_view": h.build_inner_fb_view}
    fbi = _module(prefix, "forward_batch_info", ForwardMode=h.ForwardMode, ForwardBatch=UpstreamBatch, **inner)
    logging_mod = _module(prefix, "kernel_api_logging", debug_kernel_api=lambda f: f)
    return {
        "sglang.kernel_api_logging": logging_mod,  # up to 0.5.17
        "sglang.kernels.kernel_api_logging": logging_mod,  # 0.5.18+
        "sglang.srt.environ": _module(prefix, "environ", envs=_envs(workspace_bytes)),
        "sglang.srt.model_executor.forward_batch_info": fbi,
        "sglang.srt.utils.common": _module(prefix, "common", is_npu=lambda: False,
                                           is_sm90_supported=_is_sm(9) if kernels else (lambda: False),
                                           is_sm120_supported=_is_sm(12) if kernels else (lambda: False)),
    }


def _backend_stand_ins(prefix: str, h: _Helpers, base: types.ModuleType, ctx: _RuntimeContext,
                       kernels: bool) -> dict[str, Any]:
    """What trtllm_mha_backend.py imports besides the base module's names, every release's at once."""
    access = h.enums.get("KVCacheAttentionAccessKind")
    plain: Any = getattr(access, "PLAIN") if access is not None else "plain"  # noqa: B009 - an enum executed from the wheel
    fib, fib_multi = _make_flashinfer_parents(base.AttentionBackend, ctx, plain)

    class _SWA:
        """No sliding-window pools here."""

    fp8 = _unsupported("an fp8 KV cache")
    canon = {"canonicalize_stride": h.canonicalize_stride}

    def counter_buffer(device: torch.device, num_q_heads: int, max_batch_size: int) -> torch.Tensor:
        # trtllm_mla_backend's persistent counter: only its existence matters to metadata.
        return torch.zeros(1, dtype=torch.uint8, device=device)

    return {
        "sglang.srt.layers.attention.base_attn_backend": base,
        "sglang.srt.layers.attention.flashinfer_backend": _module(
            prefix, "flashinfer_backend", FlashInferAttnBackend=fib, FlashInferMultiStepDraftBackend=fib_multi),
        "sglang.srt.layers.attention.triton_ops.trtllm_fp8_kv_kernel": _module(
            prefix, "trtllm_fp8_kv_kernel", fused_fp8_set_kv_buffer=fp8),
        "sglang.srt.layers.attention.utils": _module(prefix, "utils", **canon),  # up to 0.5.15
        "sglang.kernels.ops.attention.utils": _module(prefix, "utils", **canon),  # 0.5.16+
        "sglang.srt.layers.quantization.fp8_kernel": _module(prefix, "fp8_kernel", scaled_fp8_quant=fp8),
        "sglang.srt.mem_cache.swa_memory_pool": _module(prefix, "swa_memory_pool", SWAKVPool=_SWA,
                                                        SWATokenToKVPoolAllocator=_SWA),
        "sglang.srt.mem_cache.memory_pool": _module(prefix, "memory_pool", KVWriteLoc=_Absent,
                                                    HybridLinearKVPool=_Absent),
        "sglang.srt.mem_cache.kv_loc_plan": _module(prefix, "kv_loc_plan", **{
            k: v for k, v in h.enums.items() if k == "IdSpaceKind"}),
        "sglang.srt.mem_cache.layout.paged_view": _module(prefix, "paged_view",
                                                          paged_kv_view=_unsupported("a paged KV view")),
        "sglang.srt.layers.attention.trtllm_mla_backend": _module(
            prefix, "trtllm_mla_backend", make_persistent_multi_ctas_kv_counter_buffer=counter_buffer),
        "sglang.srt.layers.cp.base": _module(prefix, "cp_base", CPAttentionBackendKind=_Absent,
                                             get_cp_strategy=_unsupported("context parallelism")),
        "sglang.srt.layers.cp.utils": _module(prefix, "cp_utils", is_cp_active=lambda *a, **k: False,
                                              is_cp_v2_active=lambda *a, **k: False),
        "sglang.srt.layers.quantization.fp4_kv_cache_quant_method": _module(
            prefix, "fp4_kv_cache_quant_method", **{k: v for k, v in h.enums.items()
                                                    if k == "KVCacheAttentionAccessKind"}),
        "sglang.srt.layers.radix_attention": _module(prefix, "radix_attention", **{
            k: v for k, v in h.enums.items() if k == "AttentionType"}),
        "sglang.srt.runtime_context": ctx.module(prefix),
        "sglang.srt.speculative.ragged_verify": _module(
            prefix, "ragged_verify", resolve_ragged_verify_layout=h.resolve_ragged_verify_layout,
            build_ragged_target_verify_geometry=_unsupported("ragged verify (SGLANG_RAGGED_VERIFY_MODE)")),
        "sglang.srt.utils": _module(prefix, "utils", is_flashinfer_available=lambda: kernels),
    }


def load_upstream(where: str | os.PathLike[str] | None = None, *, kernels: bool = False,
                  workspace_bytes: int | None = None) -> UpstreamSglang:
    """Load upstream's TRTLLM MHA backend from the wheel at `where` (default: the installed sglang).

    `kernels=True` lets the module import the real flashinfer and answers the SM checks from the device (GPU
    drives); the default keeps everything on the metadata path, which is what runs on a CPU."""
    pkg = find_sglang(where)
    version = sglang_version(pkg)
    facts = _facts(version, pkg)
    _COUNTER[0] += 1
    prefix = f"_specscope_sglang_{version.replace('.', '_')}_{_COUNTER[0]}"
    if workspace_bytes is None:
        workspace_bytes = (512 << 20) if kernels else (1 << 20)
    h = _helpers(pkg, facts)
    stubs = _stand_ins(prefix, h, kernels, workspace_bytes)
    base = _exec_module(pkg / _BASE_PATH, f"{prefix}.base_attn_backend", stubs, ())
    ctx = _RuntimeContext(kernels)
    stubs.update(_backend_stand_ins(prefix, h, base, ctx, kernels))
    kmods = _kernel_modules(pkg, facts, prefix, kernels)
    stubs.update(kmods)
    tmb = _exec_module(pkg / TMB_PATH, f"{prefix}.trtllm_mha_backend", stubs, ("flashinfer",) if kernels else ())
    up = UpstreamSglang(version, pkg, tmb, base, h.ForwardMode, h.build_inner_fb_view, h.build_replay_fb_view,
                        facts, kmods)
    check_facts(up)
    return up


def _facts(version: str, pkg: Path) -> SglangFacts:
    try:
        return facts_for(version)
    except ValueError as e:
        raise SglangNotFound(f"{pkg}: {e}") from e


TMB_MODULE = "sglang.srt.layers.attention.trtllm_mha_backend"


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
    version = sglang_version(pkg)
    facts = _facts(version, pkg)
    if workspace_bytes is None:
        workspace_bytes = (512 << 20) if kernels else (1 << 20)
    for rel in ("", "srt", "srt/layers", "srt/layers/attention"):
        name = "sglang" + ("." + rel.replace("/", ".") if rel else "")
        mod = types.ModuleType(name)
        mod.__path__ = [str(pkg / rel)] if rel else [str(pkg)]
        mod.__package__ = name
        sys.modules[name] = mod
    h = _helpers(pkg, facts)
    sys.modules.update(_stand_ins("sglang", h, kernels, workspace_bytes))
    base = importlib.import_module("sglang.srt.layers.attention.base_attn_backend")
    ctx = _RuntimeContext(kernels)
    sys.modules.update(_backend_stand_ins("sglang", h, base, ctx, kernels))
    kmods = _kernel_modules(pkg, facts, "sglang._specscope_kernels", kernels)
    sys.modules.update(kmods)
    tmb = importlib.import_module(TMB_MODULE)
    up = UpstreamSglang(version, pkg, tmb, base, h.ForwardMode, h.build_inner_fb_view, h.build_replay_fb_view,
                        facts, kmods)
    check_facts(up)
    return up


def make_model_runner(*, req_to_token: torch.Tensor, page_size: int, context_len: int, num_draft_tokens: int | None,
                      device: torch.device | str = "cpu", topk: int = 1, is_draft_worker: bool = False,
                      token_to_kv_pool: Any = None, dtype: torch.dtype = torch.bfloat16,
                      kv_cache_dtype: torch.dtype | None = None, hidden_size: int = 64,
                      num_attention_heads: int = 8, num_kv_heads: int = 2, head_dim: int = 128) -> SimpleNamespace:
    """The attributes `TRTLLMHAAttnBackend.__init__` reads from a model runner, in every release 0.5.12+ (a
    release reads the ones it needs): a GQA model without ENCODER_ONLY layers on a static KV pool."""
    pool = SimpleNamespace(req_to_token=req_to_token, size=req_to_token.shape[0] - 1)
    allocator = SimpleNamespace(get_kvcache=lambda: token_to_kv_pool)
    model_config = SimpleNamespace(context_len=context_len, hidden_size=hidden_size,
                                   num_attention_heads=num_attention_heads, head_dim=head_dim, v_head_dim=head_dim,
                                   get_num_kv_heads=lambda tp_size: max(1, num_kv_heads // tp_size))
    return SimpleNamespace(
        model_config=model_config,
        kv_cache_dtype=kv_cache_dtype or dtype, dtype=dtype, page_size=page_size, req_to_token_pool=pool,
        token_to_kv_pool=token_to_kv_pool, token_to_kv_pool_allocator=allocator, device=torch.device(device),
        server_args=SimpleNamespace(speculative_eagle_topk=topk, speculative_num_draft_tokens=num_draft_tokens),
        is_draft_worker=is_draft_worker,
        spec_algorithm=SimpleNamespace(is_frozen_kv_mtp=lambda: False),
        model=SimpleNamespace(modules=lambda: iter(())), max_running_requests=req_to_token.shape[0] - 1,
        prefill_attention_backend_str="trtllm_mha", decode_attention_backend_str="trtllm_mha",
        kv_index_translator=_NoTranslation())


def loaded_files(pkg: Path) -> tuple[str, ...]:
    """The wheel files this loader reads for the release at `pkg`, relative to the package."""
    f = facts_for(sglang_version(pkg))
    rels = [TMB_PATH, _BASE_PATH, _FBI_PATH, f.cuda_graph_runner_path, f.attention_utils_path, _RAGGED_PATH,
            *(rel for rel, _ in _ENUM_SOURCES), "version.py"]
    rels += [r for r in (f.page_table_kernel_path, f.graph_metadata_kernel_path) if r is not None]
    return tuple(rels)


def write_slim(pkg: Path, dest: Path) -> Path:
    """Copy only the wheel files this loader reads (a few hundred KB) to `dest/<version>/`, for hosts without
    network where a whole wheel is too big to carry; `load_upstream(dest/<version>)` loads it. Returns the folder."""
    import shutil

    version = sglang_version(pkg)
    out = dest / version
    for rel in loaded_files(pkg):
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
    except (SglangNotFound, ValueError) as e:
        print(f"specscope: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
