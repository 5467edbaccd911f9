"""The attention-backend contract, in SGLang's shape (`base_attn_backend.py`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch

from ..tracer.schema import ForwardMode

if TYPE_CHECKING:
    from .attention_layer import AttentionLayer
    from .forward_batch import ForwardBatch


class AttentionBackend(ABC):
    """One required hook (`init_forward_metadata`), optional CUDA-graph hooks, dispatch by forward mode."""

    @abstractmethod
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        """Eager path: compute the metadata this forward's kernels consume."""

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        """Allocate the static buffers CUDA graphs bind to."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def init_forward_metadata_capture_cuda_graph(self, bs: int, num_tokens: int, fb: ForwardBatch) -> None:
        """At capture: bind buffer views for batch size `bs`, then fill them."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        """Before replay: refresh the bound views in place (never rebind: the graph holds their addresses)."""
        raise NotImplementedError(f"{type(self).__name__} does not support CUDA graphs")

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        """`seq_lens` value of padded graph rows."""
        return 1

    def get_verify_buffers_to_fill_after_draft(self) -> list[Any]:
        """Buffers the draft writes in place for verify (tree mask, positions); none by default."""
        return [None, None]

    def update_verify_buffers_to_fill_after_draft(  # noqa: B027 - a deliberate no-op default (PR #25925)
        self, spec_info: Any, cuda_graph_bs: int | None,
    ) -> None:
        """Plan-stream fix-up after the draft; a no-op unless verify metadata depends on draft outputs."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """Write k/v `[num_tokens, Hkv, D]` into the cache, then attend; returns `[num_tokens, Hq*D]`."""
        if fb.forward_mode in (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE):
            return self.forward_decode(q, k, v, layer, fb, save_kv_cache)
        return self.forward_extend(q, k, v, layer, fb, save_kv_cache)

    @abstractmethod
    def forward_decode(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """One query token per row."""

    @abstractmethod
    def forward_extend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """Several query tokens per row: EXTEND, TARGET_VERIFY, DRAFT_EXTEND."""
