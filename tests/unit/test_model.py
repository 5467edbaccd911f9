"""Model, config and loader: embedded models, HF folders, byte tokenizer, serving path == dense path."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file
from specscope.backend.attention_layer import AttentionLayer
from specscope.backend.loader import decode_tokens, encode_text, load_model, tokenizer_kind
from specscope.backend.model import LlamaForCausalLM, rope_inv_freq
from specscope.backend.model_config import ModelConfig

SMALL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 97, "hidden_size": 64,
    "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
    "tie_word_embeddings": False, "torch_dtype": "float32",
}
QWEN2 = {**SMALL, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "tie_word_embeddings": True}


def write_config(folder: Path, cfg: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def small_model(cfg: dict, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(ModelConfig.from_dict(cfg))
    model.init_weights(seed=seed, std=0.1)  # larger than 0.02 so attention patterns are far from uniform
    with torch.no_grad():  # non-zero biases and norms so the test notices if either is skipped
        for name, p in model.named_parameters():
            if name.endswith(("bias", "norm.weight")):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


# -- embedded models ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tiny", "tiny-draft"])
def test_embedded_models_load_by_name(name: str) -> None:
    model, cfg = load_model(name)
    assert cfg.head_dim == 128 and cfg.num_key_value_heads < cfg.num_attention_heads
    assert cfg.vocab_size == 256 and tokenizer_kind(cfg) == "bytes" and cfg.eos_token_ids == [0]
    assert [a.head_dim for a in model.attention_layers] == [128] * cfg.num_hidden_layers
    tokens = torch.tensor([encode_text("def main() -> None:\n    return ")])
    with torch.no_grad():
        logits = model.forward_dense(tokens)
    assert logits.shape == (1, tokens.shape[1], 256) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all()


def test_embedded_target_knows_python() -> None:
    model, _ = load_model("tiny")
    tokens = torch.tensor([encode_text("import os\nimport sys\n\n\ndef ")])
    with torch.no_grad():
        logp = model.forward_dense(tokens)[0, :-1].log_softmax(-1)
    nll = -logp.gather(1, tokens[0, 1:, None]).mean().item()
    assert nll < 2.5, nll  # an untrained model sits near ln(256) = 5.5


# -- config parsing ----------------------------------------------------------------------------------


def test_config_defaults_and_qwen2_bias() -> None:
    defaults = ("num_key_value_heads", "head_dim")
    cfg = ModelConfig.from_dict({k: v for k, v in SMALL.items() if k not in defaults})
    assert cfg.num_key_value_heads == 4 and cfg.head_dim == 16 and not cfg.attention_bias
    q = ModelConfig.from_dict(QWEN2)
    assert q.attention_bias and not q.o_proj_bias
    assert ModelConfig.from_dict(q.to_dict()) == q


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"architectures": ["MistralForCausalLM"]}, "MistralForCausalLM"),
        ({"architectures": None, "model_type": "gemma"}, "gemma"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
        ({"num_key_value_heads": 3}, "multiple"),
    ],
)
def test_config_rejects_unsupported(patch: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ModelConfig.from_dict({**SMALL, **patch})


def test_llama3_rope_scaling() -> None:
    rs = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
    base = rope_inv_freq(ModelConfig.from_dict(SMALL))
    scaled = rope_inv_freq(ModelConfig.from_dict({**SMALL, "rope_scaling": rs}))
    wavelen = 2 * math.pi / base
    hi, lo = wavelen < 64 / 4, wavelen > 64
    assert hi.any() and lo.any()
    torch.testing.assert_close(scaled[hi], base[hi])  # high frequencies untouched
    torch.testing.assert_close(scaled[lo], base[lo] / 8)  # low frequencies stretched by `factor`


# -- loading from folders ----------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [SMALL, QWEN2], ids=["llama", "qwen2"])
def test_random_weights_from_config_only(tmp_path: Path, cfg: dict) -> None:
    model, config = load_model(write_config(tmp_path / "m", cfg), dtype=torch.bfloat16, seed=3)
    sd = model.state_dict()
    assert all(t.dtype == torch.bfloat16 and t.device.type == "cpu" for t in sd.values())
    assert sd["model.layers.1.self_attn.q_proj.weight"].shape == (4 * 32, 64)
    assert sd["model.layers.1.self_attn.k_proj.weight"].shape == (2 * 32, 64)
    assert sd["model.layers.0.mlp.down_proj.weight"].shape == (64, 96)
    is_qwen = config.model_type == "qwen2"
    for proj in "qkv":
        assert (f"model.layers.0.self_attn.{proj}_proj.bias" in sd) == is_qwen
    assert "model.layers.0.self_attn.o_proj.bias" not in sd
    assert ("lm_head.weight" in sd) == (not is_qwen)  # the Qwen2 config ties embeddings
    assert 0.015 < sd["model.embed_tokens.weight"].float().std().item() < 0.025
    again, _ = load_model(tmp_path / "m", dtype=torch.bfloat16, seed=3)
    assert all(torch.equal(sd[k], v) for k, v in again.state_dict().items())


@pytest.mark.parametrize("cfg", [SMALL, QWEN2], ids=["llama", "qwen2"])
def test_safetensors_round_trip(tmp_path: Path, cfg: dict) -> None:
    src = small_model(cfg, seed=1)
    folder = write_config(tmp_path / "m", cfg)
    save_file({k: v.contiguous() for k, v in src.state_dict().items()}, str(folder / "model.safetensors"))
    model, _ = load_model(folder)
    for k, v in src.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    tokens = torch.randint(0, cfg["vocab_size"], (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model.forward_dense(tokens), src.forward_dense(tokens), rtol=0, atol=0)


def test_sharded_checkpoint(tmp_path: Path) -> None:
    sd = small_model(SMALL).state_dict()
    folder = write_config(tmp_path / "m", SMALL)
    names = sorted(sd)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for fname, keys in shards.items():
        save_file({k: sd[k].contiguous() for k in keys}, str(folder / fname))
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    model, _ = load_model(folder, dtype="bfloat16")
    assert all(torch.equal(model.state_dict()[k], v.bfloat16()) for k, v in sd.items())


def test_missing_and_misshapen_tensors_raise(tmp_path: Path) -> None:
    sd = {k: v.contiguous() for k, v in small_model(SMALL).state_dict().items()}
    folder = write_config(tmp_path / "m", SMALL)
    missing = "model.layers.1.mlp.up_proj.weight"
    save_file({k: v for k, v in sd.items() if k != missing}, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=missing.replace(".", r"\.")):
        load_model(folder)
    save_file({**sd, missing: torch.zeros(3, 3)}, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"up_proj\.weight.*shape"):
        load_model(folder)
    with pytest.raises(ValueError, match="no model"):
        load_model(tmp_path / "nowhere")


# -- byte tokenizer ----------------------------------------------------------------------------------


def test_byte_tokenizer_round_trip() -> None:
    text = "def f(x):\n    return x  # café ✓ 🐍\n"
    ids = encode_text(text)
    assert all(0 <= i < 256 for i in ids) and len(ids) == len(text.encode())
    assert decode_tokens(ids) == text
    assert decode_tokens([0xC3]) == "\ufffd" and decode_tokens([104, 300, 105]) == "h\ufffdi"
    assert tokenizer_kind(ModelConfig.from_dict(SMALL)) == "ids"


# -- serving path (through a backend) == dense path ---------------------------------------------------


class DenseKVBackend:
    """Test double for the attention backend: a per-layer {position: (k, v)} dict + causal attention."""

    def __init__(self) -> None:
        self.kv: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: AttentionLayer, fb: SimpleNamespace
    ) -> torch.Tensor:
        assert q.shape == (len(fb.positions), layer.num_q_heads, layer.head_dim) and q.is_contiguous()
        assert k.shape == v.shape == (len(fb.positions), layer.num_kv_heads, layer.head_dim)
        cache = self.kv.setdefault(layer.layer_id, {})
        for i, pos in enumerate(fb.positions.tolist()):
            cache[pos] = (k[i], v[i])
        group = layer.num_q_heads // layer.num_kv_heads
        out = []
        for i, pos in enumerate(fb.positions.tolist()):
            ks = torch.stack([cache[p][0] for p in range(pos + 1)]).repeat_interleave(group, dim=1)
            vs = torch.stack([cache[p][1] for p in range(pos + 1)]).repeat_interleave(group, dim=1)
            scores = torch.einsum("hd,khd->hk", q[i], ks) * layer.scaling
            out.append(torch.einsum("hk,khd->hd", scores.softmax(-1), vs).reshape(-1))
        return torch.stack(out)


def run_chunks(model: LlamaForCausalLM, tokens: torch.Tensor, chunks: list[int]) -> torch.Tensor:
    """Feed `tokens` [L] through the serving path in consecutive chunks; returns logits [L, vocab]."""
    backend, out, start = DenseKVBackend(), [], 0
    for n in chunks:
        positions = torch.arange(start, start + n)
        fb = SimpleNamespace(attn_backend=backend, positions=positions)
        out.append(model(tokens[start : start + n], positions, fb))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("cfg", [SMALL, QWEN2], ids=["llama", "qwen2"])
def test_serving_path_matches_dense(cfg: dict) -> None:
    model = small_model(cfg, seed=2)
    tokens = torch.randint(0, cfg["vocab_size"], (12,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        dense = model.forward_dense(tokens[None])[0]
        full = run_chunks(model, tokens, [12])
        incremental = run_chunks(model, tokens, [1] * 12)
        mixed = run_chunks(model, tokens, [5, 1, 4, 2])  # prefill, decode, verify-sized chunks
    for got in (full, incremental, mixed):
        assert got.dtype == torch.float32 and got.shape == dense.shape
        torch.testing.assert_close(got, dense, rtol=0, atol=1e-4)


def test_serving_path_options() -> None:
    model = small_model(SMALL)
    tokens, positions = torch.arange(6), torch.arange(6)
    with torch.no_grad():
        fb = SimpleNamespace(attn_backend=DenseKVBackend(), positions=positions)
        logits, hidden = model(tokens, positions, fb, return_hidden=True)
        fb = SimpleNamespace(attn_backend=DenseKVBackend(), positions=positions)
        last = model(tokens, positions, fb, logits_indices=torch.tensor([5]))
    assert hidden.shape == (6, 64) and logits.shape == (6, 97)
    torch.testing.assert_close(last, logits[5:])
    heads = [(a.layer_id, a.num_q_heads, a.num_kv_heads) for a in model.attention_layers]
    assert heads == [(0, 4, 2), (1, 4, 2)]
    assert model.attention_layers[0].scaling == pytest.approx(32**-0.5)


def test_embedded_models_found_from_a_wheel_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from specscope.backend import loader

    real = loader.samples_models_dir()
    wheel_file = tmp_path / "site-packages" / "specscope" / "backend" / "loader.py"
    monkeypatch.setattr(loader, "__file__", str(wheel_file))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SPECSCOPE_SAMPLES", raising=False)
    with pytest.raises(FileNotFoundError, match="SPECSCOPE_SAMPLES"):
        loader.resolve_model_path("tiny")
    monkeypatch.setenv("SPECSCOPE_SAMPLES", str(real.parent))  # the repository's samples/ folder
    assert loader.resolve_model_path("tiny-draft") == real / "draft"


@pytest.mark.parametrize("patch,match", [
    ({"num_hidden_layers": -1}, 'field "num_hidden_layers" must be a positive integer, got -1'),
    ({"hidden_size": "abc"}, 'field "hidden_size" must be a positive integer, got \'abc\''),
    ({"head_dim": 0}, 'field "head_dim" must be a positive integer, got 0'),
    ({"max_position_embeddings": 1.5}, 'field "max_position_embeddings" must be a positive integer, got 1.5'),
    ({"rope_theta": -1}, 'field "rope_theta" must be a positive number'),
    ({"head_dim": None, "hidden_size": 66}, "hidden_size=66 is not a multiple of num_attention_heads=4"),
])  # fmt: skip
def test_config_values_are_checked_and_named(patch: dict, match: str, tmp_path: Path) -> None:
    folder = write_config(tmp_path / "m", {**SMALL, **patch})
    with pytest.raises(ValueError) as e:
        ModelConfig.from_json(folder)
    assert str(e.value) == f"{folder / 'config.json'}: {match}" or match in str(e.value)
    assert str(e.value).startswith(str(folder / "config.json"))
    assert ModelConfig.from_dict({**SMALL, "hidden_size": 64.0}).hidden_size == 64  # 64.0 is an integer


def test_damaged_safetensors_is_a_value_error_naming_the_file(tmp_path: Path) -> None:
    from specscope.backend.loader import check_checkpoint

    folder = write_config(tmp_path / "m", SMALL)
    header = json.dumps({"lm_head.weight": {"dtype": "NOPE", "shape": [1], "data_offsets": [0, 4]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + b"\0" * 4)
    check_checkpoint(folder)  # the header's layout is sound; the dtype is only known to safetensors itself
    with pytest.raises(ValueError, match=r"model\.safetensors is not a readable safetensors file \(Safetensor"):
        load_model(folder)
    (folder / "model.safetensors").write_bytes((1 << 40).to_bytes(8, "little"))
    with pytest.raises(ValueError, match="header length 1099511627776 but the file has 8 bytes"):
        check_checkpoint(folder)
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_model(folder)


def test_workload_prompts_start_at_lines_and_end_inside_code() -> None:
    from specscope.backend.workload import good_cut, held_out_text, make_requests

    text = held_out_text()
    kw = dict(num_requests=40, max_new_tokens=8, seed=5, vocab_size=256, byte_level=True, prompt_len=(24, 160),
              arrival_gap=(0, 2), stop_token_ids=frozenset())
    reqs = make_requests(**kw)
    assert [r.prompt for r in reqs] == [r.prompt for r in make_requests(**kw)]  # seeded
    for r in reqs:
        p = bytes(r.prompt)
        assert 24 <= len(p) <= 160
        start = text.find(p)
        assert start >= 0 and good_cut(text, start, start + len(p)), p
        assert (start == 0 or text[start - 1] == 10) and p[-1:] not in (b" ", b"\n", b"\t")
    ids = make_requests(**{**kw, "byte_level": False, "vocab_size": 1000})
    assert all(1 <= t < 1000 for r in ids for t in r.prompt)


def test_loader_and_config_import_without_torch() -> None:
    import subprocess
    import sys

    code = ("import sys\nimport specscope.backend.loader, specscope.backend.engine_config, "
            "specscope.backend.sizing\nprint('torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "False", p.stderr
