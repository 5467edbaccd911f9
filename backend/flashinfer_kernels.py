"""flashinfer kernels by architecture, with argument checks before any launch.

- SM90 (H100/H200) and SM120: XQA through `trtllm_batch_decode_with_kv_cache` for decode, draft decode
  (q_len_per_req=1) and target verify (q_len_per_req=T with the packed uint16 mask); extend and draft
  extend through TRT-LLM's FMHAv2 paged prefill (`trtllm_fmha_v2_prefill`, Q_PAGED_KV_HND), or flashinfer's
  `BatchPrefillWithPagedKVCacheWrapper` (`--prefill-kernel flashinfer`).
- SM100/SM103 (Blackwell): trtllm-gen for decode and verify (causal, no mask) and
  `trtllm_batch_context_with_kv_cache` for extend. No Blackwell was available to test this path.

The KV cache of a layer is one tensor `[num_pages, 2, Hkv, P, D]` (HND), which every kernel takes as is.
"""

from __future__ import annotations

from typing import Protocol

import torch

XQA_PAGE_SIZES = (16, 32, 64, 128)
WORKSPACE_BYTES = 256 << 20


class KernelArgumentError(ValueError):
    """Arguments a kernel would fault on (illegal memory access or an assert deep inside); one sentence."""


def _check_common(q: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor,
                  cache_seqlens: torch.Tensor, page_size: int, *, xqa: bool) -> None:
    if q.dtype not in (torch.bfloat16, torch.float16):
        raise KernelArgumentError(f"query dtype {q.dtype} is not supported; the kernels take bfloat16 or float16")
    if kv_cache.dtype != q.dtype:
        raise KernelArgumentError(f"KV cache dtype {kv_cache.dtype} differs from query dtype {q.dtype}")
    if kv_cache.dim() != 5 or kv_cache.shape[1] != 2 or kv_cache.shape[3] != page_size:
        raise KernelArgumentError(f"KV cache shape {tuple(kv_cache.shape)} is not [pages, 2, Hkv, {page_size}, D]")
    hq, d, hkv = q.shape[1], q.shape[2], kv_cache.shape[2]
    if kv_cache.shape[4] != d:
        raise KernelArgumentError(f"head_dim of q ({d}) and KV cache ({kv_cache.shape[4]}) differ")
    if hq % hkv:
        raise KernelArgumentError(f"{hq} query heads are not a multiple of {hkv} KV heads")
    if xqa:
        if page_size not in XQA_PAGE_SIZES:
            raise KernelArgumentError(f"page size {page_size} is not one XQA supports {XQA_PAGE_SIZES}")
        if d % 16 or not 16 <= d <= 256:
            raise KernelArgumentError(f"head_dim {d} must be a multiple of 16 in [16, 256] for XQA")
    if page_table.dtype != torch.int32 or page_table.dim() != 2:
        raise KernelArgumentError(f"page table must be 2-D int32, got {page_table.dtype} {tuple(page_table.shape)}")
    if cache_seqlens.dtype != torch.int32 or cache_seqlens.dim() != 1:
        raise KernelArgumentError(f"cache_seqlens must be 1-D int32, got {cache_seqlens.dtype}")
    if page_table.shape[0] != cache_seqlens.shape[0]:
        raise KernelArgumentError(f"page table has {page_table.shape[0]} rows but cache_seqlens "
                                  f"{cache_seqlens.shape[0]}")
    if q.device != kv_cache.device or q.device != page_table.device or q.device != cache_seqlens.device:
        raise KernelArgumentError("query, KV cache, page table and cache_seqlens must be on one device")


class _PagedPrefill(Protocol):
    """What is used of flashinfer's `BatchPrefillWithPagedKVCacheWrapper` (flashinfer has no type information)."""

    def plan(self, qo_indptr: torch.Tensor, paged_kv_indptr: torch.Tensor, paged_kv_indices: torch.Tensor,
             paged_kv_last_page_len: torch.Tensor, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int,
             page_size: int, *, causal: bool, sm_scale: float, q_data_type: torch.dtype,
             kv_data_type: torch.dtype) -> None: ...

    def run(self, q: torch.Tensor, paged_kv_cache: torch.Tensor) -> torch.Tensor: ...


class FlashinferKernels:
    """The kernel set of one GPU."""

    def __init__(self, device: torch.device, prefill: str = "fmha_v2") -> None:
        import flashinfer  # noqa: F401 - fail here, with the import error, not at the first launch

        major, minor = torch.cuda.get_device_capability(device)
        if major in (9, 12):
            self.arch = "xqa"
        elif major == 10:
            self.arch = "trtllm-gen"
        else:
            raise KernelArgumentError(f"compute capability {major}.{minor} has no TRTLLM MHA kernels "
                                      "(need SM90, SM100/103 or SM120)")
        if prefill not in ("fmha_v2", "flashinfer"):
            raise KernelArgumentError(f"unknown prefill kernel {prefill!r}")
        self.prefill = prefill if self.arch == "xqa" else "trtllm-gen"
        self.device = device
        # One zero-initialised workspace for the decode/verify kernels, shared by every backend as SGLang's global
        # buffer is. XQA keeps its semaphores in the first 8 MB and needs them zero between launches, so the
        # SM90 prefill kernels get a buffer of their own: flashinfer's prefill plan writes its metadata at the
        # start of the workspace it is given, which corrupted later XQA launches when the two shared one.
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.prefill_workspace = (self.workspace if self.arch == "trtllm-gen"
                                  else torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device))
        self.name = f"{self.arch}+{self.prefill}"
        # Entry points, as a CallError names them when a launch (or its argument check) raises.
        self.decode_entry = "trtllm_batch_decode_with_kv_cache"
        self.context_entry = {"fmha_v2": "trtllm_fmha_v2_prefill", "trtllm-gen": "trtllm_batch_context_with_kv_cache",
                              "flashinfer": "BatchPrefillWithPagedKVCacheWrapper.run"}[self.prefill]
        self._prefill_wrapper: _PagedPrefill | None = None  # made at the first flashinfer prefill

    def decode(self, q: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor,
               cache_seqlens: torch.Tensor, *, q_len_per_req: int, page_size: int, scaling: float,
               mask: torch.Tensor | None, max_seq_len: int) -> torch.Tensor:
        """Uniform-q attention (`[num_tokens, Hq, D]` -> same); see `reference_attention.reference_decode`."""
        from flashinfer.decode import trtllm_batch_decode_with_kv_cache

        xqa = self.arch == "xqa"
        _check_common(q, kv_cache, page_table, cache_seqlens, page_size, xqa=xqa)
        if q.shape[0] % q_len_per_req:
            raise KernelArgumentError(f"{q.shape[0]} query tokens are not a multiple of q_len_per_req "
                                      f"{q_len_per_req}")
        rows = q.shape[0] // q_len_per_req
        if rows > page_table.shape[0]:
            raise KernelArgumentError(f"q_len_per_req {q_len_per_req} makes {rows} requests but the page table "
                                      f"has {page_table.shape[0]} rows")
        kw = {}
        if xqa and q_len_per_req > 1:
            words = ((q_len_per_req + 31) // 32) * 2
            if mask is None or mask.dtype != torch.uint16 or tuple(mask.shape) != (rows, q_len_per_req, words):
                got = None if mask is None else (mask.dtype, tuple(mask.shape))
                raise KernelArgumentError(f"XQA verify needs a uint16 mask of shape [{rows}, {q_len_per_req}, "
                                          f"{words}], got {got}")
            kw["mask"] = mask
        return trtllm_batch_decode_with_kv_cache(
            q, kv_cache, self.workspace, page_table, cache_seqlens, max_seq_len, bmm1_scale=scaling,
            bmm2_scale=1.0, kv_layout="HND", backend=self.arch, q_len_per_req=q_len_per_req, **kw)

    def context(self, q: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor,
                cache_seqlens: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, *,
                max_q_len: int, max_kv_len: int, batch_size: int, page_size: int,
                scaling: float) -> torch.Tensor:
        """Ragged-q attention with bottom-right causal mask (extend, draft extend)."""
        _check_common(q, kv_cache, page_table, cache_seqlens, page_size, xqa=False)
        if cu_seqlens_q.shape[0] != batch_size + 1:
            raise KernelArgumentError(f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries for batch {batch_size}")
        if self.prefill == "fmha_v2":
            from flashinfer.prefill import trtllm_fmha_v2_prefill

            return trtllm_fmha_v2_prefill(
                (q, kv_cache), "Q_PAGED_KV_HND", self.prefill_workspace, cache_seqlens, max_q_len, max_kv_len, scaling,
                1.0, batch_size, cu_seqlens_q, cu_seqlens_k, block_tables=page_table, mask_mode="causal")
        if self.prefill == "trtllm-gen":
            from flashinfer.prefill import trtllm_batch_context_with_kv_cache

            return trtllm_batch_context_with_kv_cache(
                q, kv_cache, self.workspace, page_table, cache_seqlens, max_q_len, max_kv_len, scaling, 1.0,
                batch_size, cu_seqlens_q, cu_seqlens_k, kv_layout="HND")
        return self._flashinfer_prefill(q, kv_cache, page_table, cache_seqlens, cu_seqlens_q, page_size, scaling)

    def _flashinfer_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor, page_table: torch.Tensor,
                            cache_seqlens: torch.Tensor, cu_seqlens_q: torch.Tensor, page_size: int,
                            scaling: float) -> torch.Tensor:
        # The wrapper wants CSR page indices; deriving them needs host values (eager extend only).
        from flashinfer import BatchPrefillWithPagedKVCacheWrapper

        wrapper = self._prefill_wrapper
        if wrapper is None:
            wrapper = self._prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace,
                                                                                  kv_layout="HND")
        lens = cache_seqlens.cpu()
        n_pages = (lens + page_size - 1) // page_size
        cols = torch.arange(page_table.shape[1], device=page_table.device)
        indices = page_table[cols[None, :] < n_pages.to(page_table.device)[:, None]]
        indptr = torch.zeros(lens.shape[0] + 1, dtype=torch.int32)
        indptr[1:] = torch.cumsum(n_pages, 0)
        last = (lens - (n_pages - 1) * page_size).int()
        dev = q.device
        wrapper.plan(
            cu_seqlens_q, indptr.to(dev), indices.int(), last.to(dev), q.shape[1], kv_cache.shape[2],
            q.shape[2], page_size, causal=True, sm_scale=scaling, q_data_type=q.dtype, kv_data_type=kv_cache.dtype)
        return wrapper.run(q, kv_cache)


def make_flashinfer_kernels(device: torch.device, prefill: str = "fmha_v2") -> FlashinferKernels:
    """The kernel set for `device` (raises ImportError with a hint when flashinfer is missing)."""
    try:
        import flashinfer  # noqa: F401
    except ImportError as e:
        raise ImportError("flashinfer is not installed: pip install 'specscope[gpu]' "
                          "(or, offline, `. .gpu/setup.sh`)") from e
    return FlashinferKernels(device, prefill)
