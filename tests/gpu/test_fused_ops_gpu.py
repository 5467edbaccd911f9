"""Fused ops on a GPU: each flashinfer op against the torch op (bf16), the whole model fused vs plain, greedy output
of the engine, fewer kernels per forward, and a CUDA-graph capture / replay of the fused model.

    . .gpu/setup.sh && python -m pytest -m gpu tests/gpu/test_fused_ops_gpu.py -q
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("flashinfer")

import torch.nn.functional as F  # noqa: E402
from specscope.backend import fused_ops  # noqa: E402
from specscope.backend.attention_layer import AttentionLayer  # noqa: E402
from specscope.backend.engine_config import EngineConfig  # noqa: E402
from specscope.backend.fused_ops import FlashinferOps, apply_rope_torch, rms_norm_torch, rope_cos_sin  # noqa: E402
from specscope.backend.loader import load_model, resolve_model_path  # noqa: E402
from specscope.backend.model import LlamaForCausalLM, rope_inv_freq  # noqa: E402
from specscope.backend.model_config import ModelConfig  # noqa: E402
from specscope.backend.session import run_session  # noqa: E402

DEV = torch.device("cuda")
BF16 = torch.bfloat16
# One bf16 rounding is a relative error of at most 2**-8; the torch ops round two or three times.
TOL = dict(rtol=2e-2, atol=2e-2)
NEAR_TIE = 0.25  # logits: a greedy choice this close to the runner-up may flip with bf16 rounding order

LLAMA3_CFG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 512, "hidden_size": 1024,
    "intermediate_size": 3584, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2,
    "head_dim": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "max_position_embeddings": 8192,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}
QWEN2_CFG = {**LLAMA3_CFG, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "rope_scaling": None,
             "rope_theta": 1000000.0, "head_dim": 64, "num_attention_heads": 16, "num_key_value_heads": 4,
             "tie_word_embeddings": True}


def _gen(seed: int) -> torch.Generator:
    return torch.Generator(device=DEV).manual_seed(seed)


def _ops(mc: ModelConfig | None = None) -> FlashinferOps:
    mc = mc or ModelConfig.from_dict(LLAMA3_CFG)
    return FlashinferOps(rope_inv_freq(mc).to(DEV), mc.max_position_embeddings)


# -- one op at a time ---------------------------------------------------------------------------------


@pytest.mark.parametrize("n,hidden", [(1, 256), (7, 4096), (300, 128), (64, 4096)])
def test_rmsnorm_matches_torch(n: int, hidden: int) -> None:
    g = _gen(n)
    x = (3 * torch.randn(n, hidden, device=DEV, generator=g)).to(BF16)
    w = (1 + 0.2 * torch.randn(hidden, device=DEV, generator=g)).to(BF16)
    exact = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()
    got = _ops().rmsnorm(x, w, 1e-5)
    assert got.dtype == BF16 and got.shape == x.shape
    torch.testing.assert_close(got.float(), exact, **TOL)
    torch.testing.assert_close(got, rms_norm_torch(x, w, 1e-5), **TOL)


@pytest.mark.parametrize("n,hidden", [(1, 256), (5, 4096), (256, 1024)])
def test_fused_add_rmsnorm_is_in_place_and_matches_torch(n: int, hidden: int) -> None:
    g = _gen(100 + n)
    x0 = torch.randn(n, hidden, device=DEV, generator=g).to(BF16)
    r0 = (4 * torch.randn(n, hidden, device=DEV, generator=g)).to(BF16)
    w = (1 + 0.2 * torch.randn(hidden, device=DEV, generator=g)).to(BF16)
    x, r = x0.clone(), r0.clone()
    out, res = _ops().add_rmsnorm(x, r, w, 1e-5)
    # flashinfer's semantics: residual += input, then input = norm(residual) * w, both in place.
    assert out.data_ptr() == x.data_ptr() and res.data_ptr() == r.data_ptr()
    assert torch.equal(res, x0 + r0)  # both round the float32 sum to bf16 once
    s = x0.float() + r0.float()
    exact = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()
    torch.testing.assert_close(out.float(), exact, **TOL)
    ref_out, ref_res = fused_ops.TorchOps(torch.ones(1, device=DEV)).add_rmsnorm(x0, r0, w, 1e-5)
    assert torch.equal(ref_res, res)
    torch.testing.assert_close(out, ref_out, **TOL)


@pytest.mark.parametrize("cfg", [LLAMA3_CFG, QWEN2_CFG, None], ids=["llama3-scaled", "qwen2-d64", "tiny"])
@pytest.mark.parametrize("n", [1, 37, 256])
@pytest.mark.parametrize("pos_dtype", [torch.int64, torch.int32])
def test_rope_matches_torch_on_strided_qkv_views(cfg: dict | None, n: int, pos_dtype: torch.dtype) -> None:
    mc = ModelConfig.from_dict(cfg) if cfg else ModelConfig.from_json(resolve_model_path("tiny"))
    hq, hkv, d = mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim
    ops = _ops(mc)
    g = _gen(n)
    qkv = (2 * torch.randn(n, (hq + 2 * hkv) * d, device=DEV, generator=g)).to(BF16)
    before = qkv.clone()
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    pos = torch.randint(0, mc.max_position_embeddings, (n,), device=DEV, generator=g).to(pos_dtype)
    got_q, got_k = ops.rope(ops.rope_context(pos), q, k, d)
    assert got_q.shape == (n, hq, d) and got_k.shape == (n, hkv, d) and got_q.is_contiguous()
    assert torch.equal(qkv, before)  # not in place: the GEMM output (and v inside it) is untouched
    cos, sin = rope_cos_sin(pos, rope_inv_freq(mc).to(DEV))
    # The table holds exactly the plain path's cos/sin for every position...
    assert torch.equal(ops.cos_sin_cache[pos.long()], torch.cat([cos, sin], -1))
    # ...and the rotation agrees with the torch op (HF rotate_half, i.e. NeoX / non-interleaved).
    torch.testing.assert_close(got_q, apply_rope_torch(q.view(n, hq, d), cos, sin), **TOL)
    torch.testing.assert_close(got_k, apply_rope_torch(k.view(n, hkv, d), cos, sin), **TOL)


def test_rope_table_matches_float64_frequencies() -> None:
    mc = ModelConfig.from_dict(LLAMA3_CFG)
    ops = _ops(mc)
    inv64 = rope_inv_freq(mc).double().to(DEV)  # our inv_freq: computed in float64, rounded to float32
    pos = torch.arange(mc.max_position_embeddings, device=DEV, dtype=torch.float64)
    ang = pos[:, None] * inv64[None, :]
    exact = torch.cat([ang.cos(), ang.sin()], -1)
    # float32 angles at position p carry ~p * 2**-24 rad of rounding, the same in the plain path.
    assert (ops.cos_sin_cache.double() - exact).abs().max().item() < 2e-3


@pytest.mark.parametrize("n,inter", [(1, 688), (33, 14336), (256, 512)])
def test_silu_and_mul_matches_torch(n: int, inter: int) -> None:
    gu = (2 * torch.randn(n, 2 * inter, device=DEV, generator=_gen(inter))).to(BF16)
    got = _ops().silu_and_mul(gu)
    gate, up = gu.float().chunk(2, -1)
    assert got.shape == (n, inter) and got.dtype == BF16
    torch.testing.assert_close(got.float(), F.silu(gate) * up, **TOL)
    torch.testing.assert_close(got, fused_ops.TorchOps(torch.ones(1, device=DEV)).silu_and_mul(gu), **TOL)


def test_zero_token_batches_do_not_launch() -> None:
    ops = _ops()
    x, w = torch.zeros(0, 256, device=DEV, dtype=BF16), torch.ones(256, device=DEV, dtype=BF16)
    assert ops.rmsnorm(x, w, 1e-5).shape == (0, 256)
    assert ops.add_rmsnorm(x, x.clone(), w, 1e-5)[0].shape == (0, 256)
    assert ops.silu_and_mul(torch.zeros(0, 512, device=DEV, dtype=BF16)).shape == (0, 256)


# -- the whole model ---------------------------------------------------------------------------------


class CausalBatchBackend:
    """Attention for b sequences of l tokens each (flattened), causal within each: static shapes, capturable."""

    def __init__(self, b: int, seq_len: int) -> None:
        self.b, self.l = b, seq_len

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer,
                fb: SimpleNamespace) -> torch.Tensor:
        b, seq_len, g = self.b, self.l, layer.num_q_heads // layer.num_kv_heads
        q, k, v = (t.reshape(b, seq_len, t.shape[1], t.shape[2]).transpose(1, 2) for t in (q, k, v))
        # GQA by expand + reshape (query head i reads KV head i // g): no data-dependent sizes, so capturable.
        k, v = (t[:, :, None].expand(b, t.shape[1], g, seq_len, t.shape[3]).reshape(b, -1, seq_len, t.shape[3])
                for t in (k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=layer.scaling)
        return out.transpose(1, 2).reshape(b * seq_len, -1)


def _models(name: str) -> tuple[LlamaForCausalLM, LlamaForCausalLM, LlamaForCausalLM]:
    """(bf16 plain, bf16 flashinfer, fp32 oracle with the same bf16-rounded weights), all on the GPU."""
    if name in ("tiny", "tiny-draft"):
        plain, cfg = load_model(name, device=DEV, dtype=BF16)
    else:
        cfg = ModelConfig.from_dict(LLAMA3_CFG if name == "llama3" else QWEN2_CFG)
        with torch.device(DEV):
            plain = LlamaForCausalLM(cfg)
        plain.init_weights(seed=3, std=0.05)
        with torch.no_grad():  # non-trivial norms and biases
            for n, p in plain.named_parameters():
                if n.endswith(("bias", "norm.weight")):
                    p.add_(0.1 * torch.randn(p.shape, device=DEV, generator=_gen(len(n))))
        plain = plain.to(BF16).eval().requires_grad_(False)
    sd = plain.state_dict()
    fused, oracle = LlamaForCausalLM(cfg).to(DEV, BF16), LlamaForCausalLM(cfg).to(DEV)
    fused.load_state_dict(sd)
    oracle.load_state_dict({k: v.float() for k, v in sd.items()})
    plain.set_ops("plain")
    fused.set_ops("flashinfer")
    oracle.set_ops("plain")
    return plain, fused.eval().requires_grad_(False), oracle.eval().requires_grad_(False)


def _tokens(b: int, seq_len: int, vocab: int, seed: int) -> torch.Tensor:
    if vocab == 256:  # the byte-level models: real code, where their predictions are confident
        text = open(fused_ops.__file__, "rb").read()
        starts = [1000 * i for i in range(b)]
        return torch.tensor([list(text[s:s + seq_len]) for s in starts], device=DEV)
    return torch.randint(0, vocab, (b, seq_len), device=DEV, generator=_gen(seed))


def _logits(model: LlamaForCausalLM, tokens: torch.Tensor) -> torch.Tensor:
    b, seq_len = tokens.shape
    pos = torch.arange(seq_len, device=DEV).repeat(b)
    fb = SimpleNamespace(attn_backend=CausalBatchBackend(b, seq_len), positions=pos)
    with torch.no_grad():
        return model(tokens.reshape(-1), pos, fb)


@pytest.mark.parametrize("name", ["tiny", "tiny-draft", "llama3", "qwen2"])
def test_model_logits_fused_vs_plain(name: str) -> None:
    plain, fused, oracle = _models(name)
    tokens = _tokens(4, 96, plain.config.vocab_size, seed=7)
    lp, lf, lo = _logits(plain, tokens), _logits(fused, tokens), _logits(oracle, tokens)
    assert fused.ops_name(DEV) == "flashinfer" and plain.ops_name(DEV) == "plain"
    err_plain, err_fused = (lp - lo).abs(), (lf - lo).abs()
    # Fused ops round less often than the torch ops (one rounding per kernel), so against the fp32 oracle they
    # must not be worse than the plain bf16 path beyond noise.
    assert err_fused.mean() <= 1.5 * err_plain.mean() + 1e-3, (err_fused.mean().item(), err_plain.mean().item())
    assert err_fused.max() <= 2.0 * err_plain.max() + 2e-2, (err_fused.max().item(), err_plain.max().item())
    # Greedy choices: the fused path agrees with the fp32 oracle at least as often as the plain bf16 path.
    agree_fused = (lf.argmax(-1) == lo.argmax(-1)).float().mean().item()
    agree_plain = (lp.argmax(-1) == lo.argmax(-1)).float().mean().item()
    assert agree_fused >= agree_plain - 0.01, (agree_fused, agree_plain)
    if name.startswith("tiny"):  # trained models on code are confident: bf16 rounding rarely flips a choice
        assert agree_fused > 0.9, agree_fused


def _kernels_per_forward(model: LlamaForCausalLM, tokens: torch.Tensor) -> tuple[int, list[str]]:
    _logits(model, tokens)  # warm-up: JIT, allocator
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _logits(model, tokens)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    kernels = [n for n in names if not n.lower().startswith(("memcpy", "memset"))]
    return len(kernels), kernels


def test_fused_forward_launches_fewer_kernels() -> None:
    plain, fused, _ = _models("tiny")
    tokens = _tokens(2, 32, 256, seed=0)
    n_plain, _ = _kernels_per_forward(plain, tokens)
    n_fused, names = _kernels_per_forward(fused, tokens)
    layers = plain.config.num_hidden_layers
    assert any("Rotary" in n for n in names), names
    assert any("act_and_mul" in n for n in names), names
    # Per layer the fused path runs 2 norms, 3 GEMMs + o_proj, 1 RoPE, 1 SiLU-and-mul and the attention ops.
    assert n_fused <= 0.6 * n_plain, (n_fused, n_plain, layers)


def test_cuda_graph_capture_and_replay_of_the_fused_model() -> None:
    plain, fused, _ = _models("tiny")
    b, seq_len = 3, 24
    ids = torch.zeros(b * seq_len, dtype=torch.int64, device=DEV)
    pos = torch.arange(seq_len, device=DEV).repeat(b)
    fb = SimpleNamespace(attn_backend=CausalBatchBackend(b, seq_len), positions=pos)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():  # warm-up off the capture, as GraphRunner does (fuses here)
        for _ in range(2):
            fused(ids, pos, fb)
    torch.cuda.current_stream().wait_stream(side)
    assert fused.model.layers[0].self_attn.qkv_weight is not None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        static_out = fused(ids, pos, fb)
    assert fused.ops_name(DEV) == "flashinfer"
    seen = []
    for seed in (1, 2, 3):
        new = torch.randint(0, 256, (b, seq_len), device=DEV, generator=_gen(seed))
        ids.copy_(new.reshape(-1))
        graph.replay()
        replayed = static_out.clone()
        # The same kernels on the same shapes: replay == an eager fused forward on the new inputs.
        torch.testing.assert_close(replayed, _logits(fused, new), rtol=1e-2, atol=5e-2)
        seen.append(replayed)
    assert not torch.equal(seen[0], seen[1])  # replays read the refreshed inputs
    assert fused.ops_name(DEV) == "flashinfer" and plain.ops_name(DEV) == "plain"


# -- the engine: greedy output with fused vs plain ops ---------------------------------------------------


def _run(setting: str, **kw: object) -> list:
    base = dict(model="tiny", draft="tiny-draft", device="cuda", dtype="bfloat16", batch_size=4, num_requests=8,
                max_new_tokens=32, spec_steps=3, seed=0, fused_ops=setting)
    base.update(kw)
    return run_session(EngineConfig(**base), None, command=f"pytest fused={setting}").requests


def _margin(model: LlamaForCausalLM, context: list[int], a: int, b: int) -> float:
    """|logit(a) - logit(b)| of the plain bf16 model after `context` (a teacher-forced forward)."""
    logits = _logits(model, torch.tensor([context], device=DEV))[-1]
    return abs(logits[a].item() - logits[b].item())


def _assert_same_greedy(fused: list, plain: list, oracle: LlamaForCausalLM) -> int:
    """Outputs equal, except where they part at a near-tie of the target (bf16 rounding order). Returns how
    many requests are token-for-token equal."""
    equal = 0
    for f, p in zip(fused, plain, strict=True):
        assert f.prompt == p.prompt
        if f.output == p.output:
            equal += 1
            continue
        j = next((i for i, (x, y) in enumerate(zip(f.output, p.output, strict=False)) if x != y), None)
        assert j is not None, f"request {f.request_id}: one output is a prefix of the other ({f.finish_reason}, " \
                              f"{p.finish_reason})"
        m = _margin(oracle, p.prompt + p.output[:j], f.output[j], p.output[j])
        assert m < NEAR_TIE, (f"request {f.request_id}: fused and plain ops part at output token {j} "
                              f"({f.output[j]} vs {p.output[j]}) where the target's logits differ by {m:.3f}")
    return equal


@pytest.mark.parametrize("spec_steps", [3, 0], ids=["spec", "plain-decode"])
def test_engine_greedy_output_fused_equals_plain(spec_steps: int) -> None:
    probe, _ = load_model("tiny", device=DEV, dtype=BF16)
    assert probe.ops_name(DEV) == "flashinfer"  # what the fused run below gets ("auto")
    fused = _run("auto", spec_steps=spec_steps)
    plain = _run("plain", spec_steps=spec_steps)
    oracle, _ = load_model("tiny", device=DEV, dtype=BF16)
    oracle.set_ops("plain")
    equal = _assert_same_greedy(fused, plain, oracle)
    # Every parting is a near-tie (checked above); wholesale differences would mean a wrong op, not rounding.
    assert equal >= len(plain) // 2, f"only {equal} of {len(plain)} requests equal"


def test_engine_fused_graph_replay_equals_eager() -> None:
    graph = _run("auto", cuda_graph=True, batch_size=6, num_requests=12)
    eager = _run("auto", cuda_graph=False, batch_size=6, num_requests=12)
    oracle, _ = load_model("tiny", device=DEV, dtype=BF16)
    oracle.set_ops("plain")
    assert _assert_same_greedy(graph, eager, oracle) >= len(eager) // 2
