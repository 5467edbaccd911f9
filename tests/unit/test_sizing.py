"""The memory estimate against what the real components allocate, and the refusals built on it."""

from __future__ import annotations

from pathlib import Path

import pytest
from specscope.backend.config_error import ConfigError
from specscope.backend.engine_config import EngineConfig
from specscope.backend.model_config import ModelConfig
from specscope.backend.sizing import (
    RunShape,
    SizingError,
    check_fits,
    context_len,
    cpu_available_bytes,
    estimate,
    num_parameters,
)

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "benchmarks" / "configs"


def _qwen_like() -> ModelConfig:
    # Biases on q/k/v, an untied head and an MLP bias: every optional parameter the estimate counts.
    return ModelConfig.from_dict({
        "architectures": ["Qwen2ForCausalLM"], "vocab_size": 50, "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "mlp_bias": True,
        "tie_word_embeddings": False})


@pytest.mark.parametrize("which", ["tiny", "tiny-draft", "qwen", "llama-bias"])
def test_parameter_count_matches_the_real_model(which: str) -> None:
    torch = pytest.importorskip("torch")
    from specscope.backend.loader import load_model, resolve_model_path
    from specscope.backend.model import LlamaForCausalLM

    if which.startswith("tiny"):
        model, cfg = load_model(which, device="cpu", dtype=torch.float32)
        assert cfg == ModelConfig.from_json(resolve_model_path(which))
    else:
        cfg = _qwen_like() if which == "qwen" else ModelConfig.from_dict({
            "architectures": ["LlamaForCausalLM"], "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24,
            "num_hidden_layers": 3, "num_attention_heads": 2, "attention_bias": True})
        with torch.device("meta"):
            model = LlamaForCausalLM(cfg)
    assert num_parameters(cfg) == sum(p.numel() for p in model.parameters())


def test_kv_estimate_matches_the_engine_pools() -> None:
    torch = pytest.importorskip("torch")
    from specscope.backend.memory import KVPool, ReqToTokenPool

    cfg = EngineConfig(device="cpu", batch_size=3, num_requests=5, max_new_tokens=40, page_size=16).validate()
    target, draft = cfg.model_configs()
    est = cfg.check_memory(target, draft, available=None)
    ctx = context_len(cfg.prompt_len[1], cfg.max_new_tokens, cfg.verify_tokens, cfg.page_size)
    pages = cfg.batch_size * (ctx // cfg.page_size) + 2  # the engine's num_pages
    real = ReqToTokenPool(cfg.batch_size, ctx, torch.device("cpu")).req_to_token.nbytes
    for m in (target, draft):
        pool = KVPool(m.num_hidden_layers, pages, cfg.page_size, m.num_key_value_heads, m.head_dim,
                      torch.float32, torch.device("cpu"))
        real += sum(b.nbytes for b in pool.kv_buffer)
    assert est.kv_pool == real
    assert est.weights == (num_parameters(target) + num_parameters(draft)) * 4


def test_llama3_8b_on_a_cpu_is_refused_with_the_numbers() -> None:
    cfg = EngineConfig(model=str(CONFIGS / "llama3-8b"), draft=str(CONFIGS / "llama3-8b-draft"), device="cpu")
    cfg.validate(memory=False)
    target, draft = cfg.model_configs()
    with pytest.raises(ConfigError) as e:
        cfg.check_memory(target, draft, available=24 * 10**9)
    msg = str(e.value)
    assert msg.startswith("this run needs about 38.") and "weights 37.2 GB" in msg
    assert "but the CPU has 24.0 GB available; use a smaller model, --dtype bfloat16 or a GPU" in msg
    assert "\n" not in msg
    # The same run in bf16 on a 141 GB GPU fits.
    gpu = EngineConfig(model=cfg.model, draft=cfg.draft, device="cuda", batch_size=64, num_requests=64)
    gpu.validate(memory=False)
    est = gpu.check_memory(target, draft, available=141 * 10**9)
    assert 16e9 < est.weights < 19e9 and est.graph_buffers > 0


def test_advice_follows_the_biggest_part() -> None:
    target = ModelConfig.from_json(REPO / "samples/models/target")
    shape = RunShape(batch_size=100_000, num_requests=100_000, max_new_tokens=32, prompt_max=8, spec_steps=0,
                     verify_tokens=1, page_size=64, dtype="float32", cuda_graph=False, on_gpu=False)
    with pytest.raises(SizingError, match="available; use a smaller --batch-size, --max-new-tokens or --prompt-len"):
        check_fits(shape, target, None, 10**9, "CPU")
    assert check_fits(shape, target, None, None, "CPU") == estimate(shape, target, None)  # unknown: no refusal


def test_batch_size_is_capped_by_requests_and_the_ladder_with_it() -> None:
    cfg = EngineConfig(device="cpu", batch_size=2048, num_requests=2).validate()
    assert cfg.batch_size == 2
    cfg = EngineConfig(device="cpu", batch_size=64, num_requests=5, graph_batch_sizes=(1, 4, 8, 64)).validate()
    assert cfg.batch_size == 5 and cfg.graph_batch_sizes == (1, 4, 8)


def test_cpu_available_bytes_reads_meminfo(tmp_path: Path) -> None:
    f = tmp_path / "meminfo"
    f.write_text("MemTotal:       16000000 kB\nMemFree:         1000 kB\nMemAvailable:    2000000 kB\n")
    assert cpu_available_bytes(str(f)) == 2_000_000 * 1024
    assert cpu_available_bytes(str(tmp_path / "absent")) is None
    if Path("/proc/meminfo").is_file():
        assert cpu_available_bytes() > 0


def test_preflight_needs_no_torch() -> None:
    import subprocess
    import sys

    code = ("import sys\nfrom specscope.backend.engine_config import EngineConfig\n"
            "EngineConfig(device='cpu').preflight()\nEngineConfig(device='auto').preflight(device='cpu')\n"
            "from specscope.backend.loader import check_checkpoint\ncheck_checkpoint('tiny')\n"
            "print('torch' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "False"


def test_a_billion_requests_is_refused_for_their_host_memory() -> None:
    cfg = EngineConfig(device="cpu", num_requests=10**9).validate(memory=False)
    target, draft = cfg.model_configs()
    with pytest.raises(ConfigError, match=r"requests 3\d\d\d\.\d GB\) but the CPU has 64\.0 GB available; use fewer "
                                          r"--requests"):
        cfg.check_memory(target, draft, available=64 * 10**9)
    gpu = EngineConfig(device="cuda", num_requests=10**9).validate(memory=False)
    est = estimate(gpu.run_shape(), target, draft)
    assert est.total < 10**9 < est.requests  # GPU memory holds no request objects ...
    from specscope.backend.sizing import check_host_fits

    with pytest.raises(SizingError, match="of request objects .* exceed the 64.0 GB of RAM available"):
        check_host_fits(est, 64 * 10**9)  # ... host RAM does
