"""Token ids as text, for readers: the byte-level tokenizer of the embedded models, and the tokenizer a trace's
target model names (its config.json's "specscope" block, or its tokenizer.json through `tokenizers`).

Torch-free and engine-free: `info` decodes a trace's requests without importing the engine's package, and the
engine's loader takes the byte-level codec and the embedded model names from here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

Decoder = Callable[[Sequence[int]], str]

# Model names that stand for the folders under samples/models (byte-level target and draft).
EMBEDDED_MODELS: dict[str, str] = {"tiny": "target", "tiny-draft": "draft"}


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


def tokenizer_kind(config: Mapping[str, Any]) -> str:
    """"bytes" when a config.json's "specscope" block says token ids are UTF-8 bytes (the embedded models), else
    "ids" (no byte-level decoding)."""
    block = config.get("specscope")
    return "bytes" if isinstance(block, Mapping) and block.get("tokenizer") == "bytes" else "ids"


def model_folder(path: str | os.PathLike[str]) -> Path:
    """The folder of a model given as a folder or its config.json (not an embedded name); ValueError when it holds
    no config.json."""
    p = Path(path).expanduser()
    if p.is_file() and p.name == "config.json":
        p = p.parent
    if not (p / "config.json").is_file():
        raise ValueError(f"no model at {str(path)!r}: expected a folder with config.json "
                         f"or one of {', '.join(repr(n) for n in EMBEDDED_MODELS)}")
    return p


def tokenizer_for(target_model: str | None) -> tuple[str, Decoder | None]:
    """("bytes" | "tokenizers" | "ids", decode) for a trace's target model: byte-level for the embedded models
    (and any config.json that says so), the checkpoint's tokenizer.json through `tokenizers` when installed,
    else ids only (no decoder)."""
    if not target_model:
        return "ids", None
    if target_model in EMBEDDED_MODELS:
        return "bytes", decode_tokens
    try:
        folder = model_folder(target_model)
        config = json.loads((folder / "config.json").read_bytes().decode("utf-8"))
    except (ValueError, OSError):  # recorded on another machine, the folder moved, or an unreadable config
        return "ids", None
    if isinstance(config, Mapping) and tokenizer_kind(config) == "bytes":
        return "bytes", decode_tokens
    tok_file = folder / "tokenizer.json"
    if not tok_file.is_file():
        return "ids", None
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return "ids", None
    try:
        tok = Tokenizer.from_file(os.fspath(tok_file))
    except Exception:  # noqa: BLE001 - a tokenizer.json this version cannot read: fall back to ids
        return "ids", None
    return "tokenizers", lambda ids: tok.decode(list(ids), skip_special_tokens=False)
