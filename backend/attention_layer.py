"""The per-layer attention descriptor a model hands to its attention backend (SGLang's RadixAttention)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionLayer:
    """Static facts about one attention layer; the backend reads the KV pool slice of `layer_id`."""

    layer_id: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    scaling: float  # softmax scale, usually head_dim ** -0.5
