"""The per-forward batch description handed to a model and its attention backend (SGLang's ForwardBatch)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from ..tracer.schema import ForwardMode

if TYPE_CHECKING:
    from .attention_layer import AttentionLayer
    from .memory import KVPool, ReqToTokenPool


class BatchAttention(Protocol):
    """What a model calls on `fb.attn_backend`: the one method of `AttentionBackend` a forward needs.

    Declared here, not imported from attention_backend.py, because that contract takes a ForwardBatch in every
    hook: the batch is the lower module, and every `AttentionBackend` satisfies this protocol as it stands.
    """

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, fb: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        """Write k/v into the cache, then attend; returns `[num_tokens, Hq*D]`."""
        ...


@dataclass
class ForwardBatch:
    """One forward's inputs. Tensors live on the engine's device unless the name ends in `_cpu`.

    Conventions (SGLang spec-v2): for DRAFT_DECODE and TARGET_VERIFY `seq_lens` is the committed KV
    length S *before* this iteration's tokens; for DECODE and DRAFT_EXTEND it already counts the tokens of
    this forward (S+1 and S+K); for EXTEND it is prefix + extend length.
    """

    forward_mode: ForwardMode
    batch_size: int
    input_ids: torch.Tensor  # int64 [num_tokens]
    positions: torch.Tensor  # int64 [num_tokens]
    seq_lens: torch.Tensor  # int32 [bs]
    seq_lens_cpu: torch.Tensor  # int32 [bs] (host mirror)
    req_pool_indices: torch.Tensor  # int64 [bs]
    out_cache_loc: torch.Tensor  # int64 [num_tokens] KV write slots
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: KVPool
    attn_backend: BatchAttention
    extend_seq_lens_cpu: list[int] | None = None  # EXTEND / DRAFT_EXTEND: new tokens per row
    extend_prefix_lens_cpu: list[int] | None = None
    spec_step_id: int | None = None  # DRAFT_DECODE: which draft step
    num_tokens_per_req: int = 1  # uniform-q modes: T
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        """Query tokens in this forward."""
        return int(self.input_ids.shape[0])
