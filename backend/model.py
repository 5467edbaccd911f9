"""A Llama-family decoder (Llama / Qwen2) whose attention layers call a pluggable attention backend.

Parameter names match Hugging Face's, so HF safetensors load as-is. Two forward paths share weights:
`forward` (flattened tokens + positions, attention through `fb.attn_backend`, the serving path) and
`forward_dense` (a plain causal batch through torch SDPA, for training and as the test oracle).

The serving path runs one of the op sets of `fused_ops.py`, chosen per device at the first forward from the run's
setting (`EngineConfig.fused_ops`, handed to `set_ops`; "auto" until then): the plain torch ops (the CPU's under
"auto": the oracle) or, on CUDA, flashinfer's norm / RoPE / SiLU kernels over fused QKV and gate/up GEMMs. Fusing
re-homes q/k/v (gate/up) weights as row views of one concatenated tensor, so both op sets keep working on the same
model and switching between them costs no memory.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Literal, overload

import torch
import torch.nn.functional as F
from torch import nn

from . import fused_ops
from .attention_layer import AttentionLayer
from .fused_ops import FlashinferOps, OpsName, TorchOps
from .model_config import ModelConfig

log = logging.getLogger(__name__)
Ops = TorchOps | FlashinferOps
ROPE_TABLE_MIN_ROWS = 32768


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

    # Buffers registered as None and set by `fuse_projections` (declared here: nn.Module serves them untyped).
    qkv_weight: torch.Tensor | None
    qkv_bias: torch.Tensor | None

    def __init__(self, config: ModelConfig, layer_id: int) -> None:
        super().__init__()
        hq, hkv, d = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = hq, hkv, d
        self.q_proj = nn.Linear(config.hidden_size, hq * d, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, hkv * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, hkv * d, bias=config.attention_bias)
        self.o_proj = nn.Linear(hq * d, config.hidden_size, bias=config.o_proj_bias)
        self.layer = AttentionLayer(layer_id, hq, hkv, d, d**-0.5)
        # Filled by `fuse_projections`; non-persistent, so checkpoints and state_dict keep HF's names only.
        self.register_buffer("qkv_weight", None, persistent=False)
        self.register_buffer("qkv_bias", None, persistent=False)
        self._qkv_sizes = (hq * d, hkv * d, hkv * d)

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

    def fuse_projections(self) -> None:
        """Concatenate q/k/v into `qkv_weight` (and bias); q/k/v_proj become row views of it."""
        if self.qkv_weight is None:
            self.qkv_weight, self.qkv_bias = _fuse_linears([self.q_proj, self.k_proj, self.v_proj])

    def forward_fused(self, x: torch.Tensor, rope_ctx: Any, fb: Any, ops: Ops) -> torch.Tensor:
        """Serving path with one QKV GEMM and the op set's RoPE: x [N, hidden] -> [N, hidden]."""
        n = x.shape[0]
        assert self.qkv_weight is not None  # fused when the op set was built (`_build_ops`), before any fused forward
        q, k, v = F.linear(x, self.qkv_weight, self.qkv_bias).split(self._qkv_sizes, dim=-1)
        q, k = ops.rope(rope_ctx, q, k, self.head_dim)
        # v stays a strided view of the GEMM output: the KV write takes strides, and a copy would be one more kernel.
        out = fb.attn_backend.forward(q, k, v.view(n, self.num_kv_heads, self.head_dim), self.layer, fb)
        return self.o_proj(out.view(n, self.num_heads * self.head_dim))

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

    # Buffers registered as None and set by `fuse_projections` (declared here: nn.Module serves them untyped).
    gate_up_weight: torch.Tensor | None
    gate_up_bias: torch.Tensor | None

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h, i, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.gate_proj = nn.Linear(h, i, bias=bias)
        self.up_proj = nn.Linear(h, i, bias=bias)
        self.down_proj = nn.Linear(i, h, bias=bias)
        self.register_buffer("gate_up_weight", None, persistent=False)
        self.register_buffer("gate_up_bias", None, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., hidden] -> [..., hidden]."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def fuse_projections(self) -> None:
        """Concatenate gate/up into `gate_up_weight` (gate rows first, as silu_and_mul expects)."""
        if self.gate_up_weight is None:
            self.gate_up_weight, self.gate_up_bias = _fuse_linears([self.gate_proj, self.up_proj])

    def forward_fused(self, x: torch.Tensor, ops: Ops) -> torch.Tensor:
        """One gate/up GEMM, the op set's SiLU-and-mul, the down GEMM."""
        assert self.gate_up_weight is not None  # fused when the op set was built (`_build_ops`)
        return self.down_proj(ops.silu_and_mul(F.linear(x, self.gate_up_weight, self.gate_up_bias)))


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

    def forward_fused(self, x: torch.Tensor, residual: torch.Tensor | None, rope_ctx: Any, fb: Any,
                      ops: Ops) -> tuple[torch.Tensor, torch.Tensor]:
        """Fused serving path, SGLang's layout: (x, residual) in, (mlp output, residual stream) out.

        The residual add of each block happens inside the next norm (fused add-RMSNorm), so the stream is
        carried beside x; the first layer has no residual yet and starts it from the embeddings."""
        ln = self.input_layernorm
        if residual is None:
            residual, x = x, ops.rmsnorm(x, ln.weight, ln.eps)
        else:
            x, residual = ops.add_rmsnorm(x, residual, ln.weight, ln.eps)
        x = self.self_attn.forward_fused(x, rope_ctx, fb, ops)
        ln = self.post_attention_layernorm
        x, residual = ops.add_rmsnorm(x, residual, ln.weight, ln.eps)
        return self.mlp.forward_fused(x, ops), residual

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
        layers = [LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        self.layers = nn.ModuleList(layers)  # registers them under HF's names (model.layers.N.*)
        # The same layers as a typed sequence (a ModuleList yields plain Modules); the stack is never rebuilt, so
        # the two stay the same objects in the same order.
        self.decoder_layers: tuple[LlamaDecoderLayer, ...] = tuple(layers)
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
        self.attention_layers: list[AttentionLayer] = [layer.self_attn.layer for layer in self.model.decoder_layers]
        self._ops_setting = "auto"  # fused_ops.choose_ops's setting (EngineConfig.fused_ops)
        self._ops: dict[torch.device, Ops | None] = {}  # per device; None = the plain path
        self._retired_ops: list[dict[torch.device, Ops | None]] = []  # replaced op sets captured graphs may read

    # ---- op selection ------------------------------------------------------------------------------------
    def set_ops(self, setting: str) -> None:
        """Pick the op set: "auto", "plain", "fused-torch" or "flashinfer" (ops_setting.FUSED_OPS, aliases too).

        Takes effect at the next forward; CUDA graphs already captured keep the ops they were captured with."""
        setting = fused_ops.check_setting(setting)
        if setting == self._ops_setting:
            return
        if self._ops:  # graphs captured with the old ops read their buffers (the RoPE table): keep them alive
            self._retired_ops.append(self._ops)
        self._ops_setting = setting
        self._ops = {}

    def ops_name(self, device: torch.device | str) -> OpsName:
        """The op set this model's serving path uses (or will use) on `device`."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:  # forwards key the cache by the inputs' "cuda:N"
            device = torch.device("cuda", torch.cuda.current_device())
        if device in self._ops:
            ops = self._ops[device]
            return "plain" if ops is None else ops.name
        return fused_ops.ops_for(device, self.model.embed_tokens.weight.dtype, self._ops_setting)

    def fuse_projections(self) -> None:
        """Fuse every layer's q/k/v and gate/up weights (idempotent; done at the first fused forward)."""
        for layer in self.model.decoder_layers:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()

    def _ops_for(self, device: torch.device) -> Ops | None:
        if device in self._ops:
            return self._ops[device]
        name = fused_ops.ops_for(device, self.model.embed_tokens.weight.dtype, self._ops_setting)
        if name == "plain":
            self._ops[device] = None
            return None
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            # Fusing allocates and copies weights: never inside a capture (GraphRunner warms up before capturing).
            log.warning("first forward of %s ops ran inside a CUDA-graph capture; using the plain ops", name)
            return None
        if device.type != "cuda":
            self._ops[device] = ops = self._build_ops(name, device)
            return ops
        # Build on the default stream, where the loader put the weights, so the fused weights and the RoPE
        # table live in its memory pool even when the first forward is GraphRunner's side-stream warm-up;
        # stream waits (not host syncs) order it against the caller's stream.
        cur, home = torch.cuda.current_stream(device), torch.cuda.default_stream(device)
        if cur != home:
            home.wait_stream(cur)
        with torch.cuda.stream(home):
            self._ops[device] = ops = self._build_ops(name, device)
        if cur != home:
            cur.wait_stream(home)
        return ops

    def _build_ops(self, name: OpsName, device: torch.device) -> Ops | None:
        self.fuse_projections()
        # The RoPE table is indexed by position on the GPU, unchecked (a check would be a host sync). The session
        # bounds positions by the target's max_position_embeddings only, so a draft declaring fewer still gets a
        # table that covers common run lengths (16 MB at head_dim 128).
        rows = max(self.config.max_position_embeddings, ROPE_TABLE_MIN_ROWS)
        return fused_ops.make_ops(name, self.rotary.inv_freq(device), rows)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., hidden] (model dtype) -> logits [..., vocab] float32."""
        w = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, w).float()

    @overload
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: Any, *,
                logits_indices: torch.Tensor | None = None, return_hidden: Literal[False] = False) -> torch.Tensor: ...

    @overload
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: Any, *,
                logits_indices: torch.Tensor | None = None,
                return_hidden: Literal[True]) -> tuple[torch.Tensor, torch.Tensor]: ...

    @overload
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: Any, *,
                logits_indices: torch.Tensor | None = None,
                return_hidden: bool) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...

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
        ops = self._ops_for(input_ids.device)
        if ops is None:
            cos, sin = self.rotary(positions)
            h = self.model.embed_tokens(input_ids)
            for layer in self.model.decoder_layers:
                h = layer(h, cos, sin, fb)
            h = self.model.norm(h)
        else:
            h = self._forward_fused(input_ids, positions, fb, ops)
        logits = self.compute_logits(h if logits_indices is None else h[logits_indices])
        return (logits, h) if return_hidden else logits

    def _forward_fused(self, input_ids: torch.Tensor, positions: torch.Tensor, fb: Any, ops: Ops) -> torch.Tensor:
        """The layer stack with a carried residual stream; returns the final-normed hidden [N, hidden]."""
        rope_ctx = ops.rope_context(positions)
        h = self.model.embed_tokens(input_ids)  # a fresh tensor: the residual stream may be updated in place
        residual = None
        for layer in self.model.decoder_layers:
            h, residual = layer.forward_fused(h, residual, rope_ctx, fb, ops)
        norm = self.model.norm
        if residual is None:
            return ops.rmsnorm(h, norm.weight, norm.eps)
        return ops.add_rmsnorm(h, residual, norm.weight, norm.eps)[0]

    def forward_dense(self, tokens: torch.Tensor) -> torch.Tensor:
        """Causal LM over a dense batch: tokens int64 [B, L] at positions 0..L-1 -> float32 [B, L, vocab]."""
        cos, sin = self.rotary(torch.arange(tokens.shape[1], device=tokens.device))
        h = self.model.embed_tokens(tokens)
        for layer in self.model.decoder_layers:
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


@torch.no_grad()
def _fuse_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) with the linears' rows stacked; each linear's parameters become views of it."""
    weight = torch.cat([lin.weight for lin in linears])
    bias = torch.cat([lin.bias for lin in linears]) if linears[0].bias is not None else None
    # The concatenation may run on a side stream (GraphRunner's warm-up); the old storage must not be handed
    # to another allocation before that stream has read it. record_stream defers the reuse without a host sync.
    stream = torch.cuda.current_stream(weight.device) if weight.is_cuda else None
    start = 0
    for lin in linears:
        n = lin.weight.shape[0]
        old = [lin.weight] + ([lin.bias] if bias is not None else [])
        lin.weight = nn.Parameter(weight[start:start + n], requires_grad=lin.weight.requires_grad)
        if bias is not None:
            lin.bias = nn.Parameter(bias[start:start + n], requires_grad=lin.bias.requires_grad)
        if stream is not None:
            for t in old:
                t.record_stream(stream)
        start += n
    return weight, bias
