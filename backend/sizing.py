"""How much memory a run needs (weights, KV pool, graph buffers, activations), computed from the configs before
anything is allocated, against what the device has. Torch-free except for asking CUDA how much memory is free."""

from __future__ import annotations

from dataclasses import dataclass

from .model_config import ModelConfig

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
# The interpreter, torch's own allocations and the trace writer: measured ~0.5 GB RSS for a tiny CPU run.
RUNTIME_OVERHEAD = 512 << 20
# Leave this share of the free memory alone: the OS, the page cache, allocator fragmentation.
USABLE_SHARE = 0.9


class SizingError(ValueError):
    """The run would not fit in the device's memory; the message is one line with the numbers."""


@dataclass(frozen=True)
class RunShape:
    """The settings of a run that decide its memory (an EngineConfig's, after validation)."""

    batch_size: int
    num_requests: int
    max_new_tokens: int
    prompt_max: int
    spec_steps: int
    verify_tokens: int
    page_size: int
    dtype: str
    cuda_graph: bool
    on_gpu: bool


@dataclass(frozen=True)
class Estimate:
    """Bytes a run needs, by component."""

    weights: int
    kv_pool: int
    graph_buffers: int
    activations: int
    overhead: int
    requests: int = 0  # host memory of the request objects (prompts, outputs): on the CPU even for a GPU run
    on_gpu: bool = False

    @property
    def total(self) -> int:
        """Everything on the run's device (host-side request objects count only when that is the CPU)."""
        device = self.weights + self.kv_pool + self.graph_buffers + self.activations + self.overhead
        return device if self.on_gpu else device + self.requests


def context_len(prompt_max: int, max_new_tokens: int, verify_tokens: int, page_size: int) -> int:
    """Positions each request's KV row holds, rounded up to whole pages (the engine's formula)."""
    need = prompt_max + max_new_tokens + 2 * verify_tokens + 2
    return -(-need // page_size) * page_size


def num_parameters(c: ModelConfig) -> int:
    """Parameters of the Llama-family decoder `c` describes (tied embeddings counted once)."""
    h, d = c.hidden_size, c.head_dim
    q, kv = c.num_attention_heads * d, c.num_key_value_heads * d
    attn = h * q + 2 * h * kv + q * h
    if c.attention_bias:
        attn += q + 2 * kv
    if c.o_proj_bias:
        attn += h
    mlp = 3 * h * c.intermediate_size + (2 * c.intermediate_size + h if c.mlp_bias else 0)
    per_layer = attn + mlp + 2 * h  # two RMSNorms
    head = 0 if c.tie_word_embeddings else c.vocab_size * h
    return c.vocab_size * h + c.num_hidden_layers * per_layer + h + head


def estimate(shape: RunShape, target: ModelConfig, draft: ModelConfig | None) -> Estimate:
    """Memory of a run with these settings and models (upper-bound-ish, within ~20 % of what torch allocates)."""
    b = DTYPE_BYTES[shape.dtype]
    spec_draft = draft if shape.spec_steps > 0 else None  # a draft runs only when the run speculates
    spec = spec_draft is not None
    t = shape.verify_tokens if spec else 1
    bs = shape.batch_size
    ctx = context_len(shape.prompt_max, shape.max_new_tokens, t, shape.page_size)
    num_pages = bs * (ctx // shape.page_size) + 2
    models = [target] if spec_draft is None else [target, spec_draft]
    weights = sum(num_parameters(m) for m in models) * b
    kv = sum(m.num_hidden_layers * num_pages * 2 * m.num_key_value_heads * shape.page_size * m.head_dim * b
             for m in models)
    kv += (bs + 1) * ctx * 4  # req_to_token, int32
    graphs = 0
    if shape.cuda_graph:
        ladder = _ladder(bs)
        # Static inputs, page tables and cu_seqlens per runner; on a GPU each captured graph also keeps its
        # float32 logits output (the graph pool shares activations, not outputs).
        runners = [(target, t)] + ([(spec_draft, 1)] * (t - 1) if spec_draft is not None else [])
        for m, tpr in runners:
            graphs += bs * tpr * 8 * 3 + bs * (ctx // shape.page_size + 3) * 4
            if shape.on_gpu:
                graphs += sum(n * tpr for n in ladder) * m.vocab_size * 4
    # The largest single forward: a prefill of `bs` prompts at once, or a verify of bs * T tokens.
    act = 0
    for m in models:
        tokens = max(bs * shape.prompt_max, bs * t)
        width = 6 * m.hidden_size + 3 * (m.num_attention_heads + 2 * m.num_key_value_heads) * m.head_dim
        per_token = (width + 3 * m.intermediate_size) * b
        logits = bs * t * m.vocab_size * 4 * 3  # float32 logits, softmax and argmax copies
        scores = m.num_attention_heads * shape.prompt_max * ctx * 4 * 3  # reference attention, one row
        act = max(act, tokens * per_token + logits + scores)
    # Measured ~350 B + 8 B per token id per Request (ids < 256 are shared ints); x2 for list growth.
    reqs = shape.num_requests * (512 + 16 * (shape.prompt_max + shape.max_new_tokens))
    return Estimate(weights, kv, graphs, act, RUNTIME_OVERHEAD, reqs, shape.on_gpu)


def _ladder(max_bs: int) -> list[int]:
    # Mirrors graph_runner.capture_ladder (kept here so sizing needs no torch).
    sizes = [n for n in (1, 2, 4, 8) if n < max_bs] + list(range(16, max_bs, 8))
    return sorted(set(sizes + [max_bs]))


def check_host_fits(est: Estimate, available: int | None) -> None:
    """A GPU run's request objects live in host RAM: refuse when they alone exceed it."""
    if available is not None and est.requests > available * USABLE_SHARE:
        raise SizingError(f"the {gb(est.requests)} of request objects (prompts and outputs) exceed the "
                          f"{gb(available)} of RAM available; use fewer --requests")


def cpu_available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """MemAvailable from /proc/meminfo (None where there is no such file, e.g. macOS)."""
    try:
        with open(meminfo, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def cuda_available_bytes(device: str) -> int:
    """Free memory of the CUDA device (torch must already be usable)."""
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


def gb(n: int) -> str:
    """Bytes as GB with one decimal (or MB when small)."""
    if n >= 1e8:
        return f"{n / 1e9:.1f} GB"
    return f"{n / 1e6:.0f} MB" if n >= 1e6 else "<1 MB"


def check_fits(shape: RunShape, target: ModelConfig, draft: ModelConfig | None, available: int | None,
               where: str) -> Estimate:
    """Raise SizingError (one line: the numbers, and what to change) when the run needs more than `available`."""
    est = estimate(shape, target, draft)
    if available is None or est.total <= available * USABLE_SHARE:
        return est
    parts = {"weights": est.weights, "KV pool": est.kv_pool, "graph buffers": est.graph_buffers,
             "activations": est.activations}
    if not shape.on_gpu and est.requests >= 1e8:
        parts["requests"] = est.requests
    biggest = max(parts, key=lambda k: parts[k])
    advice = {
        "weights": "a smaller model" + (", --dtype bfloat16" if shape.dtype in ("float32", "float64") else "")
                   + ("" if shape.on_gpu else " or a GPU"),
        "KV pool": "a smaller --batch-size, --max-new-tokens or --prompt-len",
        "graph buffers": "a smaller --batch-size or --no-cuda-graph",
        "activations": "a smaller --batch-size or --prompt-len",
        "requests": "fewer --requests",
    }[biggest]
    detail = ", ".join(f"{k} {gb(v)}" for k, v in parts.items())
    raise SizingError(f"this run needs about {gb(est.total)} ({detail}) but the {where} has "
                      f"{gb(available)} available; use {advice}")
