"""The memory estimate on a real GPU: a run too big for it is refused before allocating, and the estimate of an
8B-shaped run is not below what torch actually allocates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

if not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("flashinfer")

from specscope.backend.config_error import ConfigError  # noqa: E402
from specscope.backend.engine_config import EngineConfig  # noqa: E402
from specscope.backend.session import run_session  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "benchmarks" / "configs"


def test_too_big_for_the_gpu_is_refused_before_allocating() -> None:
    before = torch.cuda.memory_allocated()
    cfg = EngineConfig(device="cuda", batch_size=10**6, num_requests=10**6)
    with pytest.raises(ConfigError, match=r"but the GPU \(cuda\) has .* available; use a smaller --batch-size"):
        cfg.validate()
    assert torch.cuda.memory_allocated() == before
    p = subprocess.run([sys.executable, "-m", "specscope.ui.cli", "run", "--device", "cuda", "--batch-size",
                        "1000000", "--requests", "1000000"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    assert "this run needs about" in p.stderr and "Traceback" not in p.stderr


def test_estimate_covers_an_8b_run(tmp_path) -> None:
    cfg = EngineConfig(model=str(CONFIGS / "llama3-8b"), draft=str(CONFIGS / "llama3-8b-draft"), device="cuda",
                       dtype="bfloat16", batch_size=16, num_requests=16, max_new_tokens=8, spec_steps=3,
                       prompt_len=(256, 512), arrival_gap=(0, 0), ignore_eos=True)
    est = EngineConfig(**{**cfg.__dict__}).validate(memory=False)
    target, draft = est.model_configs()
    estimate = est.check_memory(target, draft, available=10**15)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run_session(cfg, str(tmp_path / "8b.db"), command="pytest sizing", random_weights=True)
    peak = torch.cuda.max_memory_allocated() - base
    print(f"8B bs 16: estimate {estimate.total / 1e9:.2f} GB (weights {estimate.weights / 1e9:.2f}, KV "
          f"{estimate.kv_pool / 1e9:.2f}, graphs {estimate.graph_buffers / 1e9:.2f}, activations "
          f"{estimate.activations / 1e9:.2f}), torch peak {peak / 1e9:.2f} GB")
    assert estimate.total >= 0.9 * peak  # the refusal must not wave through a run that then runs out
    assert estimate.total <= 2.0 * peak + 2e9  # nor refuse runs that would fit by a wide margin
