"""Load a model (embedded tiny models by name, or an HF-style folder) and the byte-level tokenizer."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from ..tracer import user_env

# The byte-level codec and the embedded model names live in the torch-free tracer (a trace's reader decodes tokens
# too); they are re-exported here for the engine's callers.
from ..tracer.tokens import EMBEDDED_MODELS as EMBEDDED
from ..tracer.tokens import decode_tokens as decode_tokens
from ..tracer.tokens import encode_text as encode_text
from ..tracer.tokens import model_folder
from ..tracer.tokens import tokenizer_kind as _config_tokenizer_kind
from .model_config import ModelConfig

if TYPE_CHECKING:  # torch loads only when a model is built, so path resolution and tokens stay torch-free
    import torch

    from .model import LlamaForCausalLM

log = logging.getLogger(__name__)

BYTE_EOS = 0  # the embedded models end each file with NUL; see samples/models/README.md
# Old HF checkpoints carry these; they are derived (RoPE) or duplicated (tied head), never needed.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def samples_models_dir() -> Path:
    """The `samples/models` folder: beside the source tree, else $SPECSCOPE_SAMPLES, else ./samples/models."""
    candidates = [Path(__file__).resolve().parents[1] / "samples" / "models"]
    env = user_env.get(user_env.SAMPLES)
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
    return model_folder(path_or_name)


def check_checkpoint(path_or_name: str | os.PathLike[str]) -> None:
    """Read config.json and every safetensors header (not the tensors): a damaged file is a ValueError naming it.

    Cheap and torch-free, so `specscope run` refuses a broken checkpoint before torch loads.
    """
    folder = resolve_model_path(path_or_name)
    ModelConfig.from_json(folder / "config.json")
    for f in _safetensors_files(folder):
        if not f.is_file():
            raise ValueError(f"shard {f.name} named in model.safetensors.index.json is missing from {folder}")
        _check_safetensors_header(f)


def _check_safetensors_header(f: Path) -> None:
    # Layout: 8-byte little-endian header length n, n bytes of JSON {name: {dtype, shape, data_offsets}}, data.
    size = f.stat().st_size
    with open(f, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError(f"{f} is not a safetensors file ({size} bytes, shorter than the 8-byte header length)")
        n = int.from_bytes(head, "little")
        if n > size - 8 or n > 100 << 20:
            raise ValueError(f"{f} is not a readable safetensors file (header length {n} but the file has {size} "
                             "bytes; truncated or damaged)")
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
        entries = [(k, v["data_offsets"]) for k, v in header.items() if k != "__metadata__"]
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, TypeError) as e:
        raise ValueError(f"{f} is not a readable safetensors file (damaged header: {type(e).__name__})") from None
    data = size - 8 - n
    for name, off in entries:
        if not (isinstance(off, list) and len(off) == 2 and all(isinstance(x, int) for x in off)
                and 0 <= off[0] <= off[1] <= data):
            raise ValueError(f"{f} is truncated or damaged: tensor {name!r} lies at bytes {off} of a {data}-byte "
                             "data section")


def load_model(
    path_or_name: str | os.PathLike[str],
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | str = "float32",
    random_weights: bool = False,
    seed: int = 0,
) -> tuple[LlamaForCausalLM, ModelConfig]:
    """Build the model directly on `device` in `dtype` and fill it from safetensors (or randomly).

    A folder without *.safetensors, or `random_weights=True`, gives N(0, 0.02) weights seeded by `seed`
    (for benchmarking at real model sizes). Returns the model in eval mode without gradients.
    """
    import torch

    from .model import LlamaForCausalLM

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
        try:
            weight_map = json.loads(index.read_bytes().decode("utf-8"))["weight_map"]
            return [folder / f for f in sorted(set(weight_map.values()))]
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{index} is not valid UTF-8 JSON ({e})") from None
        except (KeyError, TypeError, AttributeError):
            raise ValueError(f"{index} has no \"weight_map\" object of tensor name -> shard file") from None
    return sorted(folder.glob("*.safetensors"))


def _load_safetensors(model: LlamaForCausalLM, folder: Path, files: list[Path]) -> None:
    """Copy every checkpoint tensor into its parameter (casting dtype); raise on missing/mismatched ones."""
    import torch

    with torch.no_grad():
        _copy_tensors(model, folder, files)


def _copy_tensors(model: LlamaForCausalLM, folder: Path, files: list[Path]) -> None:
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for f in files:
        if not f.is_file():
            raise ValueError(f"shard {f.name} named in model.safetensors.index.json is missing from {folder}")
        try:
            _copy_file(f, params, loaded, model)
        except ValueError:
            raise
        except Exception as e:  # noqa: BLE001 - safetensors raises its own SafetensorError, OSError, ...
            raise ValueError(f"{f} is not a readable safetensors file ({type(e).__name__}: {e})") from None
    missing = [n for n in params if n not in loaded]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ValueError(f"checkpoint in {folder} lacks tensor {missing[0]!r}{more}")


def _copy_file(f: Path, params: dict[str, torch.nn.Parameter], loaded: set[str], model: LlamaForCausalLM) -> None:
    from safetensors import safe_open

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


def tokenizer_kind(config: ModelConfig) -> str:
    """"bytes" when token ids are UTF-8 bytes (the embedded models), else "ids" (no decoding available)."""
    return _config_tokenizer_kind({"specscope": config.specscope})
