"""Compact, self-describing blobs for numpy arrays.

Blob layout (little-endian):

    b"SA"  u8 version(=1)  u8 codec  u8 len(dtype)  dtype.str (ASCII, e.g. "<i4")  u8 ndim  u64 x ndim shape
    payload

codec 0 = raw C-order bytes; 1 = zlib(raw); 2 = integer delta along the last axis (first column kept,
wrapping arithmetic so it is lossless for every integer dtype), then zlib; 3 = delta, not compressed.
Page tables and cumulative sequence lengths are runs of +1 / small steps, which delta turns into long
runs zlib packs well. Integer arrays of one or more dimensions use delta; all others do not. The
uncompressed codecs (0, 3) are for arrays stored inside a step body, which is compressed as a whole.
"""

from __future__ import annotations

import hashlib
import struct
import zlib

import numpy as np

from .errors import TraceError

MAGIC = b"SA"
VERSION = 1
CODEC_RAW = 0
CODEC_ZLIB = 1
CODEC_DELTA_ZLIB = 2
CODEC_DELTA = 3
_DELTA_CODECS = (CODEC_DELTA_ZLIB, CODEC_DELTA)
_ZLIB_CODECS = (CODEC_ZLIB, CODEC_DELTA_ZLIB)
# Level 1, not 6: on page tables level 6 saves ~20% of a few hundred bytes at ~3.5x the CPU time,
# and the writer must keep up with thousands of steps per second.
ZLIB_LEVEL = 1
_ALLOWED_KINDS = "biufc"  # no object/str/void arrays: they are not metadata tensors
_MAX_NDIM = 32


def _header(codec: int, arr: np.ndarray) -> bytes:
    dt = arr.dtype.str.encode("ascii")
    return (
        MAGIC
        + struct.pack("<BBB", VERSION, codec, len(dt))
        + dt
        + struct.pack(f"<B{arr.ndim}Q", arr.ndim, *arr.shape)
    )


def _contiguous(arr: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns 0-d arrays into 1-d ones.
    arr = np.asarray(arr)
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _check_encodable(arr: np.ndarray) -> None:
    if arr.dtype.kind not in _ALLOWED_KINDS:
        raise TraceError(f"cannot store an array of dtype {arr.dtype} (only bool, int, uint, float, complex)")
    if arr.ndim > _MAX_NDIM:
        raise TraceError(f"cannot store an array with {arr.ndim} dimensions (at most {_MAX_NDIM})")


def _codec_for(arr: np.ndarray, compress: bool = True) -> int:
    if arr.dtype.kind in "iu" and arr.ndim >= 1:
        return CODEC_DELTA_ZLIB if compress else CODEC_DELTA
    return CODEC_ZLIB if compress else CODEC_RAW


def digest(arr: np.ndarray) -> bytes:
    """16-byte content address of `arr` (dtype, shape and values), computed without encoding it."""
    arr = _contiguous(arr)
    _check_encodable(arr)
    # SHA-256 has CPU support (SHA-NI) almost everywhere, so it beats blake2b here; 16 bytes suffice.
    h = hashlib.sha256(_header(_codec_for(arr), arr))
    h.update(memoryview(arr).cast("B") if arr.size else b"")
    return h.digest()[:16]


_headers: dict[tuple[np.dtype, tuple[int, ...], bool], tuple[bytes, bool]] = {}


def encode(arr: np.ndarray, *, compress: bool = True) -> bytes:
    """Encode `arr` as a self-describing blob (zlib-compressed unless `compress=False`)."""
    arr = _contiguous(arr)
    # Steps repeat a few (dtype, shape) pairs; caching their headers keeps small arrays cheap.
    key = (arr.dtype, arr.shape, compress)
    hit = _headers.get(key)
    if hit is None:
        _check_encodable(arr)
        codec = _codec_for(arr, compress)
        if len(_headers) > 4096:
            _headers.clear()
        hit = _headers[key] = (_header(codec, arr), codec in _DELTA_CODECS and arr.shape[-1] > 1)
    header, delta = hit
    if delta:
        # Integer subtraction wraps, so cumsum in the same dtype restores the values exactly.
        data = arr.copy()
        data[..., 1:] -= arr[..., :-1]
        arr = data
    raw = arr.tobytes()
    return header + (zlib.compress(raw, ZLIB_LEVEL) if compress else raw)


def decode(blob: bytes) -> np.ndarray:
    """Decode a blob made by `encode`; any damage raises TraceError (the result is read-only)."""
    try:
        return _decode(bytes(blob))
    except TraceError:
        raise
    except (zlib.error, struct.error, ValueError, TypeError, OverflowError, MemoryError) as e:
        raise TraceError(f"damaged array blob ({type(e).__name__}: {e})") from e


def _decode(blob: bytes) -> np.ndarray:
    if len(blob) < 6 or blob[:2] != MAGIC:
        raise TraceError("damaged array blob (bad magic)")
    version, codec, dlen = struct.unpack_from("<BBB", blob, 2)
    if version != VERSION:
        raise TraceError(f"array blob has unknown version {version}")
    if codec not in (CODEC_RAW, CODEC_ZLIB, CODEC_DELTA_ZLIB, CODEC_DELTA):
        raise TraceError(f"array blob has unknown codec {codec}")
    pos = 5
    dtype = np.dtype(blob[pos : pos + dlen].decode("ascii"))
    pos += dlen
    if dtype.kind not in _ALLOWED_KINDS:
        raise TraceError(f"damaged array blob (dtype {dtype})")
    (ndim,) = struct.unpack_from("<B", blob, pos)
    pos += 1
    if ndim > _MAX_NDIM:
        raise TraceError(f"damaged array blob ({ndim} dimensions)")
    shape = struct.unpack_from(f"<{ndim}Q", blob, pos)
    pos += 8 * ndim
    count = 1
    for n in shape:
        count *= n
    nbytes = count * dtype.itemsize
    if codec in _ZLIB_CODECS:
        if nbytes > len(blob) * 1032 + 1024:
            # zlib cannot expand more than ~1032x: a larger claimed size is damage, not data.
            raise TraceError("damaged array blob (shape larger than its data)")
        d = zlib.decompressobj()
        raw = d.decompress(blob[pos:], nbytes + 1)
        ok = len(raw) == nbytes and d.eof and not d.unused_data
    else:
        raw = blob[pos:]
        ok = len(raw) == nbytes
    if not ok:
        raise TraceError("damaged array blob (payload length does not match its shape)")
    arr = np.frombuffer(raw, dtype=dtype).reshape(shape)
    if codec in _DELTA_CODECS:
        if dtype.kind not in "iu" or ndim == 0:
            raise TraceError("damaged array blob (delta codec on a non-integer array)")
        arr = np.cumsum(arr, axis=-1, dtype=dtype) if arr.shape[-1] > 1 else arr.copy()
    arr.flags.writeable = False
    return arr
