"""Every setting of a run, validated up front so a bad combination fails with one clear sentence.

Torch-free at import: `specscope run` validates flags, model configs and memory before torch loads.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from .config_error import ConfigError as ConfigError  # raised by validate(); its home is config_error.py
from .faults import FAULTS
from .model_config import ModelConfig
from .ops_setting import fused_ops_setting
from .sizing import (
    Estimate,
    RunShape,
    SizingError,
    check_fits,
    check_host_fits,
    context_len,
    cpu_available_bytes,
    cuda_available_bytes,
)

if TYPE_CHECKING:
    import torch

SUPPORTED_PAGE_SIZES = (16, 32, 64, 128)  # memory.py's (kept here so validation needs no torch)
DTYPES = ("float32", "bfloat16", "float16", "float64")
MAX_SEED = 2**63 - 1  # the draft's weights use seed + 1, and torch seeds are at most 64 bits
_DEVICE = re.compile(r"auto|cpu|cuda(:[0-9]+)?")


@dataclass
class EngineConfig:
    """Run settings (the CLI's flags, resolved)."""

    model: str = "tiny"
    draft: str | None = "tiny-draft"  # the embedded draft ("tiny" alone names the embedded target)
    device: str = "cpu"  # resolved: "cpu" or "cuda[:n]"
    dtype: str = "auto"  # auto: bfloat16 on a GPU, float32 on the CPU
    batch_size: int = 4
    num_requests: int = 8
    max_new_tokens: int = 32
    spec_steps: int = 3  # N draft steps; 0 = plain decode. K = N + 1
    verify_tokens: int = 0  # T the runners capture; 0 = K (a different T re-creates adaptive-spec setups)
    page_size: int = 64
    cuda_graph: bool = True
    plan_stream: bool = False
    seed: int = 0
    temperature: float = 0.0  # 0 = greedy; > 0 = rejection sampling
    faults: frozenset[str] = field(default_factory=frozenset)
    max_context_len: int = 1024
    prompt_len: tuple[int, int] = (24, 160)
    arrival_gap: tuple[int, int] = (0, 2)
    prefill_kernel: str = "fmha_v2"  # GPU extend kernel on SM90: "fmha_v2" or "flashinfer"
    ignore_eos: bool = False
    graph_batch_sizes: tuple[int, ...] = ()  # sizes to capture; () = 1, 2, 4, 8, 16, 24, ... up to batch_size
    record_attention: int = 0  # keep layer 0's attention inputs/outputs every N steps (differential check)
    fused_ops: str = "auto"  # the decoder's op set (ops_setting.py); auto: flashinfer's kernels on a bf16/fp16 GPU
    draft_extend_graph: bool = True  # capture draft extend too (eager anyway with --prefill-kernel flashinfer)
    cpu_threads: int = 1  # torch's intra-op threads on the CPU device (the tiny models lose with more)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The model and KV dtype."""
        import torch

        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "float64": torch.float64}[self.dtype]

    def validate(self, *, models: bool = True, memory: bool = True) -> EngineConfig:
        """Fill defaults and reject impossible combinations (raises ConfigError); with `models`, also read the
        models' config.json (positions, vocab) and, with `memory`, refuse a run the device cannot hold."""
        for name, flag in (("batch_size", "--batch-size"), ("num_requests", "--requests"),
                           ("max_new_tokens", "--max-new-tokens")):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{flag} must be at least 1, got {getattr(self, name)!r}")
        if not _DEVICE.fullmatch(self.device):
            raise ConfigError(f"unknown --device {self.device!r} (use auto, cpu, cuda or cuda:N)")
        if self.page_size not in SUPPORTED_PAGE_SIZES:
            raise ConfigError(f"--page-size must be one of {', '.join(map(str, SUPPORTED_PAGE_SIZES))}")
        if self.spec_steps < 0 or self.spec_steps > 15:
            raise ConfigError(f"--spec-steps must be between 0 and 15, got {self.spec_steps}")
        if self.spec_steps and not self.draft:
            raise ConfigError("speculative decoding (--spec-steps > 0) needs a --draft model")
        if not self.spec_steps and self.verify_tokens not in (0, 1):
            raise ConfigError(f"--verify-tokens {self.verify_tokens} needs --spec-steps > 0 (plain decode has no "
                              "verify)")
        if self.verify_tokens < 0 or (self.spec_steps and self.verify_tokens and not 2 <= self.verify_tokens <= 16):
            raise ConfigError(f"--verify-tokens must be between 2 and 16, got {self.verify_tokens}")
        if not self.verify_tokens:
            self.verify_tokens = self.spec_steps + 1
        if not (isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise ConfigError(f"--temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"--seed must be between 0 and 2**63 - 1, got {self.seed}")
        if not isinstance(self.cpu_threads, int) or isinstance(self.cpu_threads, bool) or self.cpu_threads < 1:
            raise ConfigError(f"--cpu-threads must be at least 1, got {self.cpu_threads!r}")
        if not isinstance(self.draft_extend_graph, bool):
            raise ConfigError(f"draft_extend_graph must be true or false, got {self.draft_extend_graph!r}")
        self.fused_ops = fused_ops_setting(self.fused_ops)
        if self.record_attention < 0:
            raise ConfigError(f"--record-attention must be 0 (off) or a step interval >= 1, got "
                              f"{self.record_attention}")
        lo, hi = self.prompt_len
        if not 1 <= lo <= hi:
            raise ConfigError(f"--prompt-len must be 1 <= MIN <= MAX, got {lo},{hi}")
        # More running slots than requests are never used: they would only allocate KV pages and graphs.
        self.batch_size = min(self.batch_size, self.num_requests)
        if self.graph_batch_sizes:
            if min(self.graph_batch_sizes) < 1:
                raise ConfigError("--graph-batch-sizes must be at least 1")
            if max(self.graph_batch_sizes) < self.batch_size:
                raise ConfigError("--graph-batch-sizes must include a size >= --batch-size")
            top = min(s for s in self.graph_batch_sizes if s >= self.batch_size)
            self.graph_batch_sizes = tuple(sorted({s for s in self.graph_batch_sizes if s <= top}))
        if self.dtype == "auto" and self.device != "auto":
            self.dtype = "bfloat16" if self.device.startswith("cuda") else "float32"
        if self.dtype not in (*DTYPES, "auto"):
            raise ConfigError(f"unsupported --dtype {self.dtype}")
        if self.fused_ops == "flashinfer" and (self.device == "cpu" or self.dtype in ("float32", "float64")):
            raise ConfigError(f"--fused-ops flashinfer needs a CUDA device and --dtype bfloat16 or float16, got "
                              f"{self.device} {self.dtype}")
        need = {
            "max-seq-len-q-override": (self.cuda_graph and self.spec_steps > 0
                                       and self.verify_tokens != self.spec_steps + 1,
                                       "CUDA graphs, --spec-steps > 0 and --verify-tokens different from "
                                       "--spec-steps + 1 (T != K)"),
            "zero-cache-seqlens-at-capture": (self.cuda_graph and self.spec_steps > 0 and self.verify_tokens >= 3,
                                              "CUDA graphs and at least one draft-decode step (--spec-steps >= 2: "
                                              "the first draft comes from draft extend)"),
            "draft-extend-capture-q-len": (self.cuda_graph and self.spec_steps > 0,
                                           "CUDA graphs and --spec-steps > 0"),
            "stale-page-table": (self.cuda_graph, "CUDA graphs"),
            "padded-row-seqlen": (self.cuda_graph, "CUDA graphs"),
            "no-plan-wait": (self.plan_stream and self.spec_steps > 0, "--plan-stream and --spec-steps > 0"),
            "missing-fixup-hook": (self.plan_stream and self.spec_steps > 0, "--plan-stream and --spec-steps > 0"),
            "wild-page-id": (self.spec_steps > 0 and self.device != "cpu", "a CUDA device and --spec-steps > 0"),
        }
        for f in self.faults:
            ok, what = need[f]
            if not ok:
                raise ConfigError(f"fault {f} only bites with {what}")
        assert set(need) == {f.name for f in FAULTS}
        if models:
            target, draft = self.model_configs()
            self.check_models(target, draft)
            if memory and self.device != "auto":
                self.check_memory(target, draft)
        return self

    def model_configs(self) -> tuple[ModelConfig, ModelConfig | None]:
        """The target's and (when speculating) the draft's config.json, parsed (no torch, no weights)."""
        from .loader import resolve_model_path

        target = ModelConfig.from_json(resolve_model_path(self.model) / "config.json")
        if not self.spec_steps:
            return target, None
        if not self.draft:  # validate() refuses this too; model_configs() may be called on its own
            raise ConfigError("speculative decoding (--spec-steps > 0) needs a --draft model")
        return target, ModelConfig.from_json(resolve_model_path(self.draft) / "config.json")

    def check_models(self, target: ModelConfig, draft: ModelConfig | None) -> None:
        """Vocabularies agree and every request fits the models' positions."""
        if draft is not None and draft.vocab_size != target.vocab_size:
            raise ConfigError(f"draft vocab ({draft.vocab_size}, {self.draft}) differs from target vocab "
                              f"({target.vocab_size}, {self.model}); pass a --draft with the target's vocabulary, "
                              "or --spec-steps 0")
        t = self.verify_tokens if self.spec_steps else 1
        need = context_len(self.prompt_len[1], self.max_new_tokens, t, self.page_size)
        limit = min(m.max_position_embeddings for m in (target, draft) if m is not None)
        if need > limit:
            raise ConfigError(f"--prompt-len up to {self.prompt_len[1]} plus --max-new-tokens {self.max_new_tokens} "
                              f"need {need} positions, more than the model's {limit}")

    def run_shape(self) -> RunShape:
        """The settings that decide the run's memory."""
        return RunShape(batch_size=self.batch_size, num_requests=self.num_requests,
                        max_new_tokens=self.max_new_tokens, prompt_max=self.prompt_len[1],
                        spec_steps=self.spec_steps, verify_tokens=self.verify_tokens or self.spec_steps + 1,
                        page_size=self.page_size, dtype=self.dtype if self.dtype != "auto" else "float32",
                        cuda_graph=self.cuda_graph, on_gpu=self.device.startswith("cuda"))

    def check_memory(self, target: ModelConfig, draft: ModelConfig | None,
                     available: int | None = None) -> Estimate:
        """Refuse (ConfigError) a run that needs more memory than the device has; returns the estimate."""
        on_gpu = self.device.startswith("cuda")
        if available is None:
            available = cuda_available_bytes(self.device) if on_gpu else cpu_available_bytes()
        where = f"GPU ({self.device})" if on_gpu else "CPU"
        try:
            est = check_fits(self.run_shape(), target, draft, available, where)
            if on_gpu:
                check_host_fits(est, cpu_available_bytes())
            return est
        except SizingError as e:
            raise ConfigError(str(e)) from None

    def preflight(self, device: str | None = None) -> EngineConfig:
        """A validated copy, checked as far as possible without torch: flags, models, and memory when the run is
        on the CPU (`device` overrides "auto" when the caller knows there is no GPU)."""
        probe = replace(self, device=device or self.device, faults=frozenset(self.faults))
        probe.validate(memory=probe.device == "cpu")
        return probe

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form for the trace's run record."""
        d = asdict(self)
        d["faults"] = sorted(self.faults)
        d["prompt_len"] = list(self.prompt_len)
        d["arrival_gap"] = list(self.arrival_gap)
        d["graph_batch_sizes"] = list(self.graph_batch_sizes)
        return d
