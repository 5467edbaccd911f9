"""Fused ops on the CPU: the op choice per device, and the fused QKV / gate-up structure against the plain path."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from specscope.backend import fused_ops  # noqa: E402
from specscope.backend.attention_layer import AttentionLayer  # noqa: E402
from specscope.backend.engine_config import EngineConfig  # noqa: E402
from specscope.backend.loader import load_model  # noqa: E402
from specscope.backend.model import LlamaForCausalLM  # noqa: E402
from specscope.backend.model_config import ModelConfig  # noqa: E402
from specscope.backend.session import open_session  # noqa: E402

SMALL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 97, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}
# Every bias the fusion has to carry along: q/k/v and o_proj (Llama attention_bias) and gate/up/down (mlp_bias).
BIASED = {**SMALL, "attention_bias": True, "mlp_bias": True}
QWEN2 = {**SMALL, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "tie_word_embeddings": True}
LLAMA3_ROPE = {**SMALL, "rope_theta": 500000.0, "rope_scaling": {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64}}
CONFIGS = {"llama": SMALL, "biased": BIASED, "qwen2": QWEN2, "llama3-rope": LLAMA3_ROPE}


class DenseKVBackend:
    """A real attention backend for the serving path: per-layer K/V by position, causal attention in fp32."""

    def __init__(self) -> None:
        self.kv: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer,
                fb: SimpleNamespace) -> torch.Tensor:
        pos = fb.positions
        assert q.shape == (len(pos), layer.num_q_heads, layer.head_dim) and q.is_contiguous()
        assert k.shape == v.shape == (len(pos), layer.num_kv_heads, layer.head_dim)
        n = int(pos.max()) + 1
        if layer.layer_id not in self.kv or self.kv[layer.layer_id][0].shape[0] < n:
            new = [torch.zeros(n, *k.shape[1:], dtype=k.dtype) for _ in range(2)]
            for old, grown in zip(self.kv.get(layer.layer_id, ()), new, strict=False):
                grown[:old.shape[0]] = old
            self.kv[layer.layer_id] = (new[0], new[1])
        keys, values = self.kv[layer.layer_id]
        keys[pos], values[pos] = k, v
        group = layer.num_q_heads // layer.num_kv_heads
        ks, vs = (t[:n].repeat_interleave(group, dim=1) for t in (keys, values))
        scores = torch.einsum("qhd,khd->hqk", q, ks) * layer.scaling
        visible = torch.arange(n)[None, :] <= pos[:, None]
        scores = scores.masked_fill(~visible[None], float("-inf"))
        return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vs).reshape(len(pos), -1)


def small_model(cfg: dict, seed: int = 0) -> LlamaForCausalLM:
    model = LlamaForCausalLM(ModelConfig.from_dict(cfg))
    model.init_weights(seed=seed, std=0.1)
    with torch.no_grad():  # non-zero biases and non-unit norms, so a dropped or misplaced one shows
        gen = torch.Generator().manual_seed(seed + 1)
        for name, p in model.named_parameters():
            if name.endswith(("bias", "norm.weight")):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model.eval()


def run_chunks(model: LlamaForCausalLM, tokens: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    """`tokens` [L] through the serving path in consecutive chunks (prefill, decode, verify sizes) -> [L, vocab]."""
    backend, out, start = DenseKVBackend(), [], 0
    with torch.no_grad():
        for n in chunks:
            positions = torch.arange(start, start + n)
            out.append(model(tokens[start:start + n], positions, SimpleNamespace(attn_backend=backend,
                                                                                 positions=positions)))
            start += n
    return torch.cat(out)


# -- op selection -------------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["auto", "AUTO", "1", "on", "0", "off", "plain", "fused-torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_never_gets_flashinfer(setting: str, dtype: torch.dtype) -> None:
    want = "fused-torch" if setting == "fused-torch" else "plain"
    assert fused_ops.choose_ops("cpu", dtype, setting, have_flashinfer=True) == want
    assert fused_ops.choose_ops("cpu", dtype, setting, have_flashinfer=False) == want


@pytest.mark.parametrize("setting,dtype,have,want", [
    ("auto", torch.bfloat16, True, "flashinfer"),
    ("auto", torch.float16, True, "flashinfer"),
    ("plain", torch.bfloat16, True, "plain"),
    ("off", torch.bfloat16, True, "plain"),  # an alias of plain
    ("auto", torch.float32, True, "plain"),  # flashinfer's norm kernels take bf16/fp16 only
    ("auto", torch.bfloat16, False, "plain"),  # no flashinfer installed
    ("fused-torch", torch.bfloat16, True, "fused-torch"),
    ("flashinfer", torch.bfloat16, True, "flashinfer"),
])
def test_cuda_choice(setting: str, dtype: torch.dtype, have: bool, want: str) -> None:
    assert fused_ops.choose_ops("cuda", dtype, setting, have_flashinfer=have) == want


def test_bad_settings_are_one_clear_error() -> None:
    with pytest.raises(ValueError, match="--fused-ops must be one of auto, plain, fused-torch, flashinfer, got 'fast'"):
        fused_ops.choose_ops("cuda", torch.bfloat16, "fast", have_flashinfer=True)
    with pytest.raises(ValueError, match="--fused-ops flashinfer needs a CUDA device"):
        fused_ops.choose_ops("cpu", torch.bfloat16, "flashinfer", have_flashinfer=True)
    with pytest.raises(ValueError, match="--fused-ops must be one of"):
        small_model(SMALL).set_ops("fastest")
    with pytest.raises(ValueError, match="--fused-ops must be one of"):
        small_model(SMALL).set_ops("")


def test_cpu_model_runs_the_plain_path_and_fuses_nothing() -> None:
    model, _ = load_model("tiny")  # "auto" until a run sets its op set
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tokens = torch.tensor(list(b"def main():\n    return 0\n"))
    logits = run_chunks(model, tokens, [10, 1, 4, len(tokens) - 15])
    assert model.ops_name("cpu") == "plain"
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attn.qkv_weight is None and mlp.gate_up_weight is None
    # The oracle is the plain path itself: same op set, same tensors, bit for bit.
    model.set_ops("plain")
    assert torch.equal(run_chunks(model, tokens, [10, 1, 4, len(tokens) - 15]), logits)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


# -- the fused structure (torch math) against the plain path ------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_projections_give_the_plain_logits_fp32(name: str) -> None:
    model = small_model(CONFIGS[name], seed=3)
    tokens = torch.randint(0, 97, (14,), generator=torch.Generator().manual_seed(1))
    chunks = [6, 1, 4, 3]  # prefill, a decode, verify-sized chunks
    plain = run_chunks(model, tokens, chunks)
    model.set_ops("fused-torch")
    fused = run_chunks(model, tokens, chunks)
    assert model.ops_name("cpu") == "fused-torch"
    # Same math op for op; only the GEMM shapes differ (one [N, 3 proj] GEMM instead of three).
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=2e-5)
    assert torch.equal(fused.argmax(-1), plain.argmax(-1))


def test_embedded_models_fused_vs_plain_fp32() -> None:
    tokens = torch.tensor(list(b"import os\n\n\ndef walk(top):\n    for name in os.listdir(top):\n"))
    for name in ("tiny", "tiny-draft"):
        model, _ = load_model(name)
        plain = run_chunks(model, tokens, [len(tokens)])
        model.set_ops("fused-torch")
        fused = run_chunks(model, tokens, [20, 1, 1, 4, len(tokens) - 26])
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-4)
        assert torch.equal(fused.argmax(-1), plain.argmax(-1))


def test_fusion_keeps_names_shapes_and_shares_storage() -> None:
    model = small_model(BIASED)
    names = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    count = model.num_parameters()
    model.fuse_projections()
    model.fuse_projections()  # idempotent
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == names  # checkpoints see HF names only
    assert model.num_parameters() == count
    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    assert attn.qkv_weight.shape == (4 * 32 + 2 * 2 * 32, 64) and attn.qkv_bias.shape == (256,)
    assert mlp.gate_up_weight.shape == (2 * 96, 64) and mlp.gate_up_bias.shape == (192,)
    # q/k/v_proj are views of the fused weight: a change through one is seen by the other (no second copy).
    with torch.no_grad():
        attn.k_proj.weight[0, 0] = 7.0
        mlp.up_proj.bias[-1] = -3.0
    assert attn.qkv_weight[4 * 32, 0] == 7.0 and mlp.gate_up_bias[-1] == -3.0
    assert attn.v_proj.weight.untyped_storage().data_ptr() == attn.qkv_weight.untyped_storage().data_ptr()


def test_set_ops_switches_back_and_forth_on_one_model() -> None:
    model = small_model(QWEN2, seed=5)
    tokens = torch.arange(9)
    plain = run_chunks(model, tokens, [9])
    for setting in ("fused-torch", "plain", "fused-torch", "auto"):
        model.set_ops(setting)
        torch.testing.assert_close(run_chunks(model, tokens, [4, 5]), plain, rtol=1e-5, atol=2e-5)
    assert model.ops_name("cpu") == "plain"  # auto is plain on the CPU


def test_engine_on_cpu_fused_structure_equals_plain() -> None:
    """The real engine (TRTLLM backend, reference kernels, emulated graphs) runs the op set its config names, and
    greedy output is the same under both."""
    cfg = dict(model="tiny", draft="tiny-draft", device="cpu", dtype="float32", batch_size=3, num_requests=4,
               max_new_tokens=16, spec_steps=3, seed=0, prompt_len=(16, 48))
    outputs, ran = {}, {}
    for setting in ("plain", "fused-torch"):
        with open_session(EngineConfig(**cfg, fused_ops=setting), None, command="pytest fused") as s:
            s.run(s.requests)
            assert s.engine.draft is not None
            ran[setting] = {r.model.ops_name("cpu") for r in (s.engine.target, s.engine.draft)}
        outputs[setting] = {r.request_id: r.output for r in s.requests}
    assert ran == {"plain": {"plain"}, "fused-torch": {"fused-torch"}}
    assert outputs["plain"] == outputs["fused-torch"]
    assert all(len(v) == 16 or v[-1] == 0 for v in outputs["plain"].values())


def test_set_ops_keeps_the_op_sets_that_captured_graphs_read() -> None:
    """Graphs captured with an op set read its tensors (the RoPE table) on every replay: re-selecting ops must
    neither drop the set in use when the setting is unchanged nor free a replaced one."""
    model = small_model(QWEN2, seed=5)
    model.set_ops("fused-torch")
    run_chunks(model, torch.arange(5), [5])
    in_use = model._ops
    assert in_use, "the forward made no op set"
    model.set_ops("fused-torch")
    assert model._ops is in_use
    model.set_ops("plain")
    assert any(kept is in_use for kept in model._retired_ops)
