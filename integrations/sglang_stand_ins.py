"""The stand-ins a load puts where upstream's backend imports from SGLang's server stack, every release's module
names at once (a release imports the ones it has), and the model runner the backend's constructor reads. What each
one is, and what is real instead, is listed in `sglang_loader`'s docstring."""

from __future__ import annotations

import types
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from .sglang_upstream_code import Helpers


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


class RuntimeContext:
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


def _make_flashinfer_parents(base: type, ctx: RuntimeContext, plain_kind: Any) -> tuple[type, type]:
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


def _is_sm(major: int) -> Callable[[], bool]:
    def check() -> bool:
        return bool(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == major)
    return check


def _module(prefix: str, name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(f"{prefix}.{name}")
    mod.__dict__.update(attrs)
    return mod


class _Absent:
    """A class the backend only tests instances against (isinstance): no such pool exists here."""


def stand_ins(prefix: str, h: Helpers, kernels: bool, workspace_bytes: int) -> dict[str, Any]:
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


def backend_stand_ins(prefix: str, h: Helpers, base: types.ModuleType, ctx: RuntimeContext,
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
