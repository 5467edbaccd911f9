"""The decoder's hyper-parameters, parsed from a Hugging Face `config.json` (Llama / Qwen2 families)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# architectures name -> model_type; both spellings identify the same decoder.
SUPPORTED_ARCHITECTURES: dict[str, str] = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}
SUPPORTED_ROPE_TYPES = ("default", "llama3")


@dataclass
class ModelConfig:
    """Shapes and numerics of a Llama-family causal LM; field names follow HF `config.json`."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # None or a "llama3" block
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # bias on q/k/v projections (always on for Qwen2)
    o_proj_bias: bool = False  # Llama's `attention_bias` also covers o_proj; Qwen2's o_proj has none
    mlp_bias: bool = False
    eos_token_id: int | list[int] | None = None
    bos_token_id: int | None = None
    torch_dtype: str | None = None
    model_type: str = "llama"
    architectures: list[str] = field(default_factory=lambda: ["LlamaForCausalLM"])
    specscope: dict[str, Any] = field(default_factory=dict)  # our provenance block (tokenizer, training)

    @property
    def num_kv_groups(self) -> int:
        """Query heads per KV head (the GQA ratio)."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def eos_token_ids(self) -> list[int]:
        """`eos_token_id` normalised to a (possibly empty) list."""
        if self.eos_token_id is None:
            return []
        return [self.eos_token_id] if isinstance(self.eos_token_id, int) else list(self.eos_token_id)

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        """Parse a `config.json` file (or the `config.json` inside a folder)."""
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            data = json.loads(path.read_bytes().decode("utf-8"))
        except OSError as e:
            raise ValueError(f"{path}: cannot read ({e.strerror or e})") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"{path} is not UTF-8 text (byte {e.start}: {e.reason})") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON: {e}") from None
        try:
            return cls.from_dict(data)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Build from an HF config dict; unsupported architectures, RoPE types or bad field values raise ValueError."""
        if not isinstance(d, dict):
            raise ValueError(f"config.json must hold a JSON object, not {type(d).__name__} {_short(d)}")
        model_type = _model_type(d)
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers")
        missing = [k for k in (*required, "num_attention_heads") if d.get(k) is None]
        if missing:
            raise ValueError(f"config.json lacks required field(s) {', '.join(missing)}")
        heads = _positive_int(d, "num_attention_heads")
        kv_heads = _positive_int(d, "num_key_value_heads", heads)
        hidden = _positive_int(d, "hidden_size")
        if d.get("head_dim") is None and hidden % heads:
            raise ValueError(f"hidden_size={hidden} is not a multiple of num_attention_heads={heads} "
                             "(set head_dim)")
        if heads % kv_heads:
            raise ValueError(f"num_attention_heads={heads} is not a multiple of num_kv_heads={kv_heads}")
        if model_type == "qwen2" and d.get("use_sliding_window"):
            raise ValueError("Qwen2 with use_sliding_window=true is not supported (sliding-window attention)")
        # transformers>=4.56 may nest rope settings under `rope_parameters`.
        rope_params = d.get("rope_parameters") or {}
        if not isinstance(rope_params, dict):
            raise ValueError(f"field \"rope_parameters\" must be an object, got {_short(rope_params)}")
        if d.get("rope_theta") is None and rope_params.get("rope_theta") is not None:
            d = {**d, "rope_theta": rope_params["rope_theta"]}
        rope_theta = _positive_float(d, "rope_theta", 10000.0)
        rope_scaling = _rope_scaling(d.get("rope_scaling") or (rope_params if rope_params else None))
        explicit_bias = _bool(d, "attention_bias")
        vocab = _positive_int(d, "vocab_size")
        return cls(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=_positive_int(d, "intermediate_size"),
            num_hidden_layers=_positive_int(d, "num_hidden_layers"),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=_positive_int(d, "head_dim", hidden // heads),
            rms_norm_eps=_positive_float(d, "rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=_positive_int(d, "max_position_embeddings", 2048),
            tie_word_embeddings=_bool(d, "tie_word_embeddings"),
            attention_bias=explicit_bias or model_type == "qwen2",
            o_proj_bias=explicit_bias and model_type == "llama",
            mlp_bias=_bool(d, "mlp_bias"),
            eos_token_id=_token_ids(d, "eos_token_id", vocab),
            bos_token_id=_token_ids(d, "bos_token_id", vocab, allow_list=False),
            torch_dtype=d.get("torch_dtype") or d.get("dtype"),
            model_type=model_type,
            architectures=list(d.get("architectures") or [_arch_for(model_type)]),
            specscope=dict(d.get("specscope") or {}),
        )

    def to_dict(self) -> dict[str, Any]:
        """An HF-compatible `config.json` dict (round-trips through `from_dict`)."""
        d: dict[str, Any] = {
            "architectures": self.architectures,
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": self.rope_scaling,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.o_proj_bias if self.model_type == "llama" else self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "eos_token_id": self.eos_token_id,
            "bos_token_id": self.bos_token_id,
            "torch_dtype": self.torch_dtype,
        }
        if self.specscope:
            d["specscope"] = self.specscope
        return d


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _positive_int(d: dict[str, Any], key: str, default: int | None = None) -> int:
    """`d[key]` as an int >= 1 (null or absent: `default`); anything else names the field."""
    v = d.get(key)
    if v is None and default is not None:
        return default
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"field \"{key}\" must be a positive integer, got {_short(v)}")
    return v


def _positive_float(d: dict[str, Any], key: str, default: float) -> float:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v < float("inf"):
        raise ValueError(f"field \"{key}\" must be a positive number, got {_short(v)}")
    return float(v)


def _bool(d: dict[str, Any], key: str) -> bool:
    v = d.get(key)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ValueError(f"field \"{key}\" must be true or false, got {_short(v)}")
    return v


def _token_ids(d: dict[str, Any], key: str, vocab: int, allow_list: bool = True) -> Any:
    v = d.get(key)
    ids = v if allow_list and isinstance(v, list) else [v]
    if v is None:
        return None
    if not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in ids):
        kind = "a token id or a list of token ids" if allow_list else "a token id"
        raise ValueError(f"field \"{key}\" must be {kind} in [0, {vocab}), got {_short(v)}")
    return v


def _model_type(d: dict[str, Any]) -> str:
    archs = d.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ValueError(f"field \"architectures\" must be a list of names, got {_short(archs)}")
    for arch in archs:
        if arch in SUPPORTED_ARCHITECTURES:
            return SUPPORTED_ARCHITECTURES[arch]
    if archs:
        raise ValueError(
            f"unsupported architecture {archs[0]!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    model_type = d.get("model_type")
    if isinstance(model_type, str) and model_type in SUPPORTED_ARCHITECTURES.values():
        return model_type
    raise ValueError(
        f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES.values())}"
    )


def _arch_for(model_type: str) -> str:
    return next(a for a, t in SUPPORTED_ARCHITECTURES.items() if t == model_type)


def _rope_scaling(rs: dict[str, Any] | None) -> dict[str, Any] | None:
    """Validate a `rope_scaling` block; the "default" type means no scaling."""
    if rs is None:
        return None
    if not isinstance(rs, dict):
        raise ValueError(f"field \"rope_scaling\" must be an object or null, got {_short(rs)}")
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind not in SUPPORTED_ROPE_TYPES:
        supported = ", ".join(SUPPORTED_ROPE_TYPES)
        raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: {supported}")
    if kind == "default":
        return None
    need = ["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"]
    missing = [k for k in need if k not in rs]
    if missing:
        raise ValueError(f"llama3 rope_scaling lacks {', '.join(missing)}")
    return {"rope_type": "llama3", **{k: rs[k] for k in need}}
