"""The bug-report bundle as a container: recognising a bundle .zip, extracting its trace, reading its members.

Every command opens a bundle where it opens a trace: `open_trace_or_bundle(path)` extracts `trace.db` to a
temporary folder for the duration of a `with` block (and `TraceReader(zip)` does the same for its lifetime).
Writing bundles is `export/bundle.py`; what a bundle holds is described there.

Bundles of format 2 and older renumbered their steps 0..n-1 (`bundle.json` original_steps[i] is bundle step i's
index in the original trace). They open as they always did, numbered as their own README.md says; `original_step`
gives the original numbers beside them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from typing import Any

from .errors import TraceError

TRACE_NAME = "trace.db"
MANIFEST = "bundle.json"
# 2: attn_kv delta-coded across the bundled calls of a model (kv_delta.py); 3: steps keep their original indexes
BUNDLE_FORMAT = 3
ORIGINAL_NUMBERS_SINCE = 3  # the first format whose trace.db numbers its steps as the original trace does
_MAX_TRACE_BYTES = 4 << 30  # refuse to extract more than this from a bundle (a damaged or hostile size field)


def is_bundle(path: str | os.PathLike[str]) -> bool:
    """True when `path` is a zip file (a bundle, or damage to be reported as such)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) in (b"PK\x03\x04", b"PK\x05\x06", b"PK\x07\x08")  # local file, empty, spanned
    except OSError:
        return False


@contextlib.contextmanager
def open_trace_or_bundle(path: str | os.PathLike[str]) -> Iterator[str]:
    """Yield a path to a trace file: `path` itself, or for a bundle its `trace.db` extracted to a temporary folder
    (removed when the block ends). A damaged bundle raises TraceError with one sentence."""
    path = os.fspath(path)
    if not is_bundle(path):
        yield path
        return
    tmp = tempfile.mkdtemp(prefix="specscope-bundle-")
    try:
        yield extract_trace(path, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def extract_trace(path: str, folder: str) -> str:
    """Copy a bundle's `trace.db` into `folder`; returns the copy's path (TraceError, one sentence, on damage)."""
    try:
        with zipfile.ZipFile(path) as z:
            try:
                info = z.getinfo(TRACE_NAME)
            except KeyError:
                raise TraceError(f"not a specscope bundle (the zip holds no {TRACE_NAME})", path) from None
            if info.file_size > _MAX_TRACE_BYTES:
                raise TraceError(f"bundle's {TRACE_NAME} claims {info.file_size} bytes; refusing to extract", path)
            out = os.path.join(folder, TRACE_NAME)
            with z.open(info) as src, open(out, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            return out
    except zipfile.BadZipFile as e:
        raise TraceError(f"not a readable bundle (damaged zip: {e})", path) from None
    except (OSError, EOFError, RuntimeError, ValueError) as e:  # zlib.error is not an OSError; CRC is BadZipFile
        raise TraceError(f"not a readable bundle ({type(e).__name__}: {e})", path) from None
    except Exception as e:  # noqa: BLE001 - zlib.error and friends from a damaged member: one sentence
        if isinstance(e, TraceError):
            raise
        raise TraceError(f"not a readable bundle ({type(e).__name__}: {e})", path) from None


def read_member(path: str | os.PathLike[str], name: str) -> bytes:
    """One file from a bundle (TraceError when absent or damaged)."""
    try:
        with zipfile.ZipFile(path) as z:
            return z.read(name)
    except KeyError:
        raise TraceError(f"bundle has no {name}", path) from None
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        raise TraceError(f"not a readable bundle ({type(e).__name__}: {e})", path) from None


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A bundle's bundle.json, or None for a plain trace."""
    if not is_bundle(path):
        return None
    try:
        manifest: dict[str, Any] = json.loads(read_member(path, MANIFEST))  # bundle.json is an object
        return manifest
    except (TraceError, ValueError):
        return None


def renumbered(manifest: dict[str, Any]) -> bool:
    """Whether a bundle numbers its steps 0..n-1 (formats before 3) instead of as the original trace does."""
    fmt = manifest.get("format")
    return not (isinstance(fmt, int) and fmt >= ORIGINAL_NUMBERS_SINCE) and bool(manifest.get("original_steps"))


def original_step(manifest: dict[str, Any], index: int) -> int | None:
    """The original trace's index of bundle step `index` (None when the bundle holds no such step): the index
    itself since format 3, original_steps[index] for the older bundles that renumbered their steps."""
    steps = manifest.get("original_steps") or []
    if not renumbered(manifest):
        return int(index) if int(index) in steps else None
    return int(steps[index]) if 0 <= index < len(steps) else None
