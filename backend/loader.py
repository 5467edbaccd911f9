"""Load a model (embedded tiny models by name, or an HF-style folder) and the byte-level tokenizer."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

import torch

from .model import LlamaForCausalLM
from .model_config import ModelConfig

log = logging.getLogger(__name__)

EMBEDDED = {"tiny": "target", "tiny-draft": "draft"}
BYTE_EOS = 0  # the embedded models end each file with NUL; see samples/models/README.md
# Old HF checkpoints carry these; they are derived (RoPE) or duplicated (tied head), never needed.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def samples_models_dir() -> Path:
    """The `samples/models` folder: beside the source tree, else $SPECSCOPE_SAMPLES, else ./samples/models."""
    candidates = [Path(__file__).resolve().parents[1] / "samples" / "models"]
    env = os.environ.get("SPECSCOPE_SAMPLES")
    if env:  # accept either the `samples` folder or `samples/models` itself
        candidates += [Path(env) / "models", Path(env)]
    candidates.append(Path.cwd() / "samples" / "models")
    for c in candidates:
        if (c / "target" / "config.json").is_file():
            return c
    raise FileNotFoundError(
        "embedded models not found (looked in " + ", ".join(str(c) for c in candidates)
        + "); set SPECSCOPE_SAMPLES to the repository's samples/ folder"
    )


def resolve_model_path(path_or_name: str | os.PathLike[str]) -> Path:
    """Map "tiny" / "tiny-draft" to the embedded folders; otherwise a folder (or its config.json)."""
    if str(path_or_name) in EMBEDDED:
        return samples_models_dir() / EMBEDDED[str(path_or_name)]
    p = Path(path_or_name).expanduser()
    if p.is_file() and p.name == "config.json":
        p = p.parent
    if not (p / "config.json").is_file():
        raise ValueError(
            f"no model at {str(path_or_name)!r}: expected a folder with config.json "
            f"or one of {', '.join(repr(n) for n in EMBEDDED)}"
        )
    return p


def load_model(
    path_or_name: str | os.PathLike[str],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str = torch.float32,
    random_weights: bool = False,
    seed: int = 0,
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """Build the model directly on `device` in `dtype` and fill it from safetensors (or randomly).

    A folder without *.safetensors, or `random_weights=True`, gives N(0, 0.02) weights seeded by `seed`
    (for benchmarking at real model sizes). Returns the model in eval mode without gradients.
    """
    folder = resolve_model_path(path_or_name)
    config = ModelConfig.from_json(folder / "config.json")
    device = torch.device(device)
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    # Construct on `meta` and materialise once on the target device: an 8B model never exists in fp32 on CPU.
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model = model.to(dtype=dtype).to_empty(device=device)
    files = _safetensors_files(folder)
    if random_weights or not files:
        if not random_weights:
            log.info("%s has no *.safetensors; using random weights (seed %d)", folder, seed)
        model.init_weights(seed=seed)
    else:
        _load_safetensors(model, folder, files)
    model.eval().requires_grad_(False)
    return model, config


def _safetensors_files(folder: Path) -> list[Path]:
    """Shards named by model.safetensors.index.json, else every *.safetensors in the folder."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [folder / f for f in sorted(set(weight_map.values()))]
    return sorted(folder.glob("*.safetensors"))


@torch.no_grad()
def _load_safetensors(model: LlamaForCausalLM, folder: Path, files: list[Path]) -> None:
    """Copy every checkpoint tensor into its parameter (casting dtype); raise on missing/mismatched ones."""
    from safetensors import safe_open

    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for f in files:
        if not f.is_file():
            raise ValueError(f"shard {f.name} named in model.safetensors.index.json is missing from {folder}")
        with safe_open(str(f), framework="pt", device="cpu") as sf:
            for name in sf.keys():
                if name.endswith(_IGNORED_SUFFIXES) or (name == "lm_head.weight" and model.lm_head is None):
                    continue
                if name not in params:
                    raise ValueError(
                        f"checkpoint tensor {name!r} in {f.name} has no counterpart in a "
                        f"{model.config.architectures[0]} with this config.json (architecture mismatch?)"
                    )
                t = sf.get_tensor(name)
                if tuple(t.shape) != tuple(params[name].shape):
                    raise ValueError(
                        f"tensor {name!r} has shape {list(t.shape)} in {f.name} but config.json implies "
                        f"{list(params[name].shape)}"
                    )
                params[name].copy_(t)
                loaded.add(name)
    missing = [n for n in params if n not in loaded]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"checkpoint in {folder} lacks tensor {missing[0]!r}{more}")


def tokenizer_kind(config: ModelConfig) -> str:
    """"bytes" when token ids are UTF-8 bytes (the embedded models), else "ids" (no decoding available)."""
    return "bytes" if config.specscope.get("tokenizer") == "bytes" else "ids"


def encode_text(s: str) -> list[int]:
    """Byte-level tokens: the UTF-8 bytes of `s`."""
    return list(s.encode("utf-8"))


def decode_tokens(ids: Iterable[int]) -> str:
    """Inverse of `encode_text`; invalid UTF-8 and ids outside 0..255 become U+FFFD."""
    out: list[str] = []
    run = bytearray()
    for i in ids:
        if 0 <= int(i) < 256:
            run.append(int(i))
            continue
        out.append(run.decode("utf-8", errors="replace") + "\ufffd")
        run.clear()
    out.append(run.decode("utf-8", errors="replace"))
    return "".join(out)
