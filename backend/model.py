"""A Llama-family decoder (Llama / Qwen2) whose attention layers call a pluggable attention backend.

Parameter names match Hugging Face's, so HF safetensors load as-is. Two forward paths share weights:
`forward` (flattened tokens + positions, attention through `fb.attn_backend`, the serving path) and
`forward_dense` (a plain causal batch through torch SDPA, for training and as the test oracle).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .attention_layer import AttentionLayer
from .model_config import ModelConfig


class RMSNorm(nn.Module):
    """Root-mean-square layer norm, computed in float32 like HF's LlamaRMSNorm."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., dim] any float dtype -> same shape and dtype."""
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies [head_dim // 2] float32 on CPU, with Llama-3 scaling when configured."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64, device="cpu") / d))
    rs = config.rope_scaling
    if rs is None:
        return inv_freq.float()
    # Llama 3.1 "llama3" scaling: stretch low frequencies by `factor`, keep high ones, blend between.
    factor, lo, hi = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
    old_ctx = float(rs["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_ctx / lo, inv_freq / factor, inv_freq)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_ctx / hi) & (wavelen <= old_ctx / lo)
    return torch.where(medium, blended, scaled).float()


class RotaryEmbedding(nn.Module):
    """cos/sin tables computed on the fly from positions (no max-length cache)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        # A plain attribute, not a buffer: it must stay float32 when the model is cast to bf16, and must
        # survive meta-device construction (`to_empty` would leave a buffer uninitialised).
        self._inv_freq_cpu = rope_inv_freq(config)
        self._inv_freq: dict[torch.device, torch.Tensor] = {}

    def inv_freq(self, device: torch.device) -> torch.Tensor:
        """[head_dim // 2] float32 on `device`; cached so CUDA-graph capture after warm-up copies nothing."""
        t = self._inv_freq.get(device)
        if t is None:
            t = self._inv_freq[device] = self._inv_freq_cpu.to(device)
        return t

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: int [...] -> (cos, sin), each float32 [..., head_dim // 2]."""
        freqs = positions.float().unsqueeze(-1) * self.inv_freq(positions.device)
        return freqs.cos(), freqs.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., H, D] by cos/sin [..., D/2] (HF rotate_half layout); float32 math, x's dtype out."""
    x1, x2 = x.float().chunk(2, dim=-1)
    c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).to(x.dtype)


class LlamaAttention(nn.Module):
    """GQA self-attention; the serving path delegates the attention itself to the backend."""

    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        hq, hkv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = hq, hkv, d
        self.q_proj = nn.Linear(config.hidden_size, hq * d, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, hkv * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, hkv * d, bias=config.attention_bias)
        self.o_proj = nn.Linear(hq * d, config.hidden_size, bias=config.o_proj_bias)
        self.layer = AttentionLayer(layer_id, hq, hkv, d, d**-0.5)

    def _qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [..., hidden] -> q [..., Hq, D], k and v [..., Hkv, D], RoPE applied to q and k."""
        lead = x.shape[:-1]
        q = self.q_proj(x).view(*lead, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(*lead, self.num_kv_heads, self.head_dim)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v.contiguous()

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fb: Any) -> torch.Tensor:
        """x [N, hidden] -> [N, hidden]; the backend writes k/v to the KV cache and attends."""
        q, k, v = self._qkv(x, cos, sin)
        out = fb.attn_backend.forward(q, k, v, self.layer, fb)
        return self.o_proj(out.view(x.shape[0], self.num_heads * self.head_dim))

    def forward_dense(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [B, L, hidden] -> [B, L, hidden] with plain causal attention over each row."""
        b, seq_len, _ = x.shape
        q, k, v = (t.transpose(1, 2) for t in self._qkv(x, cos, sin))  # [B, H, L, D]
        groups = self.num_heads // self.num_kv_heads
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.layer.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(b, seq_len, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, i, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., hidden] -> [..., hidden]."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then + mlp(norm(.))."""

    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, fb: Any) -> torch.Tensor:
        """Serving path: x [N, hidden] -> [N, hidden]."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, fb)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_dense(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Dense path: x [B, L, hidden] -> [B, L, hidden]."""
        x = x + self.self_attn.forward_dense(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    """Embeddings, decoder layers and final norm (HF's `model.` prefix)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        # from_pretrained skips Embedding's normal_() init, which on `meta` costs seconds of one-time setup;
        # weights are filled later by the loader or `init_weights`.
        self.embed_tokens = nn.Embedding.from_pretrained(
            torch.empty(config.vocab_size, config.hidden_size), freeze=False
        )
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Llama / Qwen2 causal LM; see the module docstring for the two forward paths."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.rotary = RotaryEmbedding(config)
        # Tied models have no `lm_head.weight` in their checkpoints; logits reuse the embedding matrix.
        self.lm_head = None
        if not config.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.attention_layers: list[AttentionLayer] = [layer.self_attn.layer for layer in self.model.layers]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] (model dtype) -> logits [..., vocab] float32."""
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, w).float()

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        fb: Any,
        *,
        logits_indices: torch.Tensor | None = None,
        return_hidden: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Serving path over flattened tokens.

        input_ids, positions: int64 [N]. `fb` is the forward batch; only `fb.attn_backend` is read here.
        logits_indices: optional int64 [M] rows to project (e.g. each request's last token); default all.
        Returns logits float32 [N or M, vocab], plus the final-normed hidden [N, hidden] (model dtype)
        when `return_hidden`.
        """
        cos, sin = self.rotary(positions)
        h = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            h = layer(h, cos, sin, fb)
        h = self.model.norm(h)
        logits = self.compute_logits(h if logits_indices is None else h[logits_indices])
        return (logits, h) if return_hidden else logits

    def forward_dense(self, tokens: torch.Tensor) -> torch.Tensor:
        """Causal LM over a dense batch: tokens int64 [B, L] at positions 0..L-1 -> float32 [B, L, vocab]."""
        cos, sin = self.rotary(torch.arange(tokens.shape[1], device=tokens.device))
        h = self.model.embed_tokens(tokens)
        for layer in self.model.layers:
            h = layer.forward_dense(h, cos, sin)
        return self.compute_logits(self.model.norm(h))

    @torch.no_grad()
    def init_weights(self, seed: int = 0, std: float = 0.02) -> None:
        """Deterministic random init in place: N(0, std) matrices, zero biases, unit norms."""
        gen = torch.Generator(device=self.model.embed_tokens.weight.device).manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                p.normal_(0.0, std, generator=gen)

    def num_parameters(self) -> int:
        """Total parameter count (tied embeddings counted once)."""
        return sum(p.numel() for p in self.parameters())
