"""Every setting of a run, validated up front so a bad combination fails with one clear sentence."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .faults import FAULTS
from .memory import SUPPORTED_PAGE_SIZES


class ConfigError(ValueError):
    """An invalid run configuration; the message is one sentence for the user."""


@dataclass
class EngineConfig:
    """Run settings (the CLI's flags, resolved)."""

    model: str = "tiny"
    draft: str | None = "tiny"
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

    @property
    def torch_dtype(self) -> torch.dtype:
        """The model and KV dtype."""
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
                "float64": torch.float64}[self.dtype]

    def validate(self) -> EngineConfig:
        """Fill defaults and reject impossible combinations (raises ConfigError)."""
        if self.batch_size < 1 or self.num_requests < 1 or self.max_new_tokens < 1:
            raise ConfigError("--batch-size, --requests and --max-new-tokens must be at least 1")
        if self.page_size not in SUPPORTED_PAGE_SIZES:
            raise ConfigError(f"--page-size must be one of {', '.join(map(str, SUPPORTED_PAGE_SIZES))}")
        if self.spec_steps < 0 or self.spec_steps > 15:
            raise ConfigError("--spec-steps must be between 0 and 15")
        if self.spec_steps and not self.draft:
            raise ConfigError("speculative decoding (--spec-steps > 0) needs a --draft model")
        if not self.verify_tokens:
            self.verify_tokens = self.spec_steps + 1
        if self.spec_steps and not 2 <= self.verify_tokens <= 16:
            raise ConfigError("--verify-tokens must be between 2 and 16")
        if self.graph_batch_sizes and max(self.graph_batch_sizes) < self.batch_size:
            raise ConfigError("--graph-batch-sizes must include a size >= --batch-size")
        if self.dtype == "auto":
            self.dtype = "bfloat16" if self.device.startswith("cuda") else "float32"
        if self.dtype not in ("float32", "bfloat16", "float16", "float64"):
            raise ConfigError(f"unsupported --dtype {self.dtype}")
        need = {
            "max-seq-len-q-override": (self.cuda_graph and self.spec_steps > 0
                                       and self.verify_tokens != self.spec_steps + 1,
                                       "CUDA graphs, --spec-steps > 0 and --verify-tokens different from "
                                       "--spec-steps + 1 (T != K)"),
            "zero-cache-seqlens-at-capture": (self.cuda_graph and self.spec_steps > 0,
                                              "CUDA graphs and --spec-steps > 0"),
            "stale-page-table": (self.cuda_graph, "CUDA graphs"),
            "padded-row-seqlen": (self.cuda_graph, "CUDA graphs"),
            "no-plan-wait": (self.plan_stream and self.spec_steps > 0, "--plan-stream and --spec-steps > 0"),
            "missing-fixup-hook": (self.plan_stream and self.spec_steps > 0, "--plan-stream and --spec-steps > 0"),
        }
        for f in self.faults:
            ok, what = need[f]
            if not ok:
                raise ConfigError(f"fault {f} only bites with {what}")
        assert set(need) == {f.name for f in FAULTS}
        return self

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form for the trace's run record."""
        d = asdict(self)
        d["faults"] = sorted(self.faults)
        d["prompt_len"] = list(self.prompt_len)
        d["arrival_gap"] = list(self.arrival_gap)
        d["graph_batch_sizes"] = list(self.graph_batch_sizes)
        return d
