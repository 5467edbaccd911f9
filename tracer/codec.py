"""Compact, self-describing blobs for numpy arrays.

Blob layout (little-endian):

    b"SA"  u8 version(=1)  u8 codec  u8 len(dtype)  dtype.str (ASCII, e.g. "<i4")  u8 ndim  u64 x ndim shape
    [16-byte base digest, codecs 4 and 5 only]  payload

The payload is the array's C-order bytes, transformed: integer arrays of one or more dimensions are
delta-coded along the last axis (first column kept; wrapping arithmetic, so it is lossless for every
integer dtype), other arrays are kept as they are. Page tables, cumulative lengths and positions are
runs of +1 / small steps, which delta turns into long runs zlib packs well.

    codec 0 raw   1 zlib   2 delta + zlib   3 delta   4 delta + zlib(base)   5 zlib(base)

The uncompressed codecs (0, 3) are for arrays inside a step body, which is compressed as a whole.
Codecs 4 and 5 compress with the transformed bytes of a *base* array (the previous version of the
same array, named by its digest) as zlib's preset dictionary: a page table that gained one page since
the previous step costs a few hundred bytes instead of kilobytes. Decoding needs the base first.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    # zlib-ng's stubs leave out parts of the zlib interface it has (compressobj().copy(), `error` as a class);
    # the module mirrors zlib's, so it is checked against zlib's own.
    import zlib as _z
else:
    try:
        # zlib-ng writes and reads the same zlib streams ~3x faster than the system zlib (blobs of changed page
        # tables are the writer's largest cost after the step bodies); without it the stdlib module does the same.
        from zlib_ng import zlib_ng as _z
    except ImportError:  # pragma: no cover - zlib-ng is a dependency; a bare environment still works
        _z = zlib

from .errors import TraceError

MAGIC = b"SA"
VERSION = 1
CODEC_RAW = 0
CODEC_ZLIB = 1
CODEC_DELTA_ZLIB = 2
CODEC_DELTA = 3
CODEC_DELTA_ZLIB_BASE = 4
CODEC_ZLIB_BASE = 5
_DELTA_CODECS = (CODEC_DELTA_ZLIB, CODEC_DELTA, CODEC_DELTA_ZLIB_BASE)
_ZLIB_CODECS = (CODEC_ZLIB, CODEC_DELTA_ZLIB, CODEC_DELTA_ZLIB_BASE, CODEC_ZLIB_BASE)
_BASE_CODECS = (CODEC_DELTA_ZLIB_BASE, CODEC_ZLIB_BASE)
_ALL_CODECS = (0, 1, 2, 3, 4, 5)
DIGEST_BYTES = 16
ZDICT_BYTES = 32768  # zlib's window: only the base's last 32 KiB can be referenced
# Level 1, not 6: on page tables level 6 saves ~20% of a few hundred bytes at ~3.5x the CPU time,
# and the writer must keep up with thousands of steps per second.
ZLIB_LEVEL = 1
_ALLOWED_KINDS = "biufc"  # no object/str/void arrays: they are not metadata tensors
_MAX_NDIM = 32


def _header(codec: int, arr: np.ndarray) -> bytes:
    # Typed: numpy's stubs give dtype.str as Any for Python 3.10, which mypy checks against.
    dt: bytes = arr.dtype.str.encode("ascii")
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
    # arr.data, not memoryview(arr): the same buffer, and numpy declares ndarray's buffer protocol only for 3.12+.
    h.update(arr.data.cast("B") if arr.size else b"")
    return h.digest()[:16]


_headers: dict[tuple[np.dtype, tuple[int, ...], bool], tuple[bytes, bool]] = {}


def _payload(arr: np.ndarray) -> bytes:
    """The transformed bytes of `arr` (delta-coded if it is an integer array), as encode() compresses them."""
    arr = _contiguous(arr)
    if arr.dtype.kind in "iu" and arr.ndim >= 1 and arr.shape[-1] > 1:
        data = arr.copy()
        data[..., 1:] -= arr[..., :-1]
        arr = data
    return arr.tobytes()


class Compressor(Protocol):
    """A zlib compression object, the stdlib's or zlib-ng's (zlib types its class only privately)."""

    def compress(self, data: bytes, /) -> bytes:
        """Compressed bytes of `data`, as far as they are ready."""
        ...

    def flush(self) -> bytes:
        """The rest of the stream."""
        ...


class Base:
    """An array other arrays are compressed against, primed once: its zlib dictionary is set up only once."""

    def __init__(self, arr: np.ndarray, digest: bytes) -> None:
        if len(digest) != DIGEST_BYTES:
            raise ValueError("base digest must be 16 bytes")
        self.digest = digest
        self._compressor = _z.compressobj(ZLIB_LEVEL, zdict=_payload(arr)[-ZDICT_BYTES:])

    def compressor(self) -> Compressor:
        """A fresh compressor with this base as its dictionary (copying beats re-priming)."""
        return self._compressor.copy()


class Pending:
    """A blob whose numpy work is done and whose compression is not: `finish()` compresses.

    The split lets a writer do the GIL-holding part on one thread and zlib (which releases the GIL)
    on another.
    """

    __slots__ = ("prefix", "payload", "base")

    def __init__(self, prefix: bytes, payload: bytes, base: Base | None) -> None:
        self.prefix = prefix
        self.payload = payload
        self.base = base

    def finish(self) -> bytes:
        """The compressed blob."""
        if self.base is None:
            return self.prefix + _z.compress(self.payload, ZLIB_LEVEL)
        c = self.base.compressor()
        return self.prefix + c.compress(self.payload) + c.flush()


def prepare(arr: np.ndarray, base: Base | None = None) -> Pending:
    """Everything of `encode(arr)` but compression; with `base`, compressed against it (codec 4 or 5)."""
    arr = _contiguous(arr)
    _check_encodable(arr)
    codec = _codec_for(arr)
    if base is None:
        return Pending(_header(codec, arr), _payload(arr), None)
    codec = CODEC_DELTA_ZLIB_BASE if codec == CODEC_DELTA_ZLIB else CODEC_ZLIB_BASE
    return Pending(_header(codec, arr) + base.digest, _payload(arr), base)


def encode_with_base(arr: np.ndarray, base: Base) -> bytes:
    """Encode `arr` compressed against `base` (codec 4 or 5); decoding needs the base array."""
    return prepare(arr, base).finish()


def base_digest(blob: bytes) -> bytes | None:
    """The digest of the base a blob was compressed against, or None; TraceError if the header is damaged."""
    try:
        codec, _, _, pos = _parse_header(bytes(blob[: 5 + 255 + 1 + 8 * _MAX_NDIM + DIGEST_BYTES]))
    except (struct.error, ValueError, TypeError, OverflowError) as e:
        raise TraceError(f"damaged array blob ({type(e).__name__}: {e})") from e
    if codec not in _BASE_CODECS:
        return None
    d = bytes(blob[pos - DIGEST_BYTES : pos])
    if len(d) != DIGEST_BYTES:
        raise TraceError("damaged array blob (truncated base digest)")
    return d


def _cached_header(arr: np.ndarray, compress: bool) -> tuple[bytes, bool]:
    """(blob header, whether the codec delta-codes the last axis) of a contiguous array.

    Steps repeat a few (dtype, shape) pairs; caching their headers keeps small arrays cheap."""
    key = (arr.dtype, arr.shape, compress)
    hit = _headers.get(key)
    if hit is None:
        _check_encodable(arr)
        codec = _codec_for(arr, compress)
        if len(_headers) > 4096:
            _headers.clear()
        hit = _headers[key] = (_header(codec, arr), codec in _DELTA_CODECS and arr.shape[-1] > 1)
    return hit


def _delta_coded(arr: np.ndarray) -> np.ndarray:
    """Each element minus its left neighbour along the last axis. Integer subtraction wraps, so a cumsum in the
    same dtype restores the values exactly."""
    data: np.ndarray = arr.copy()  # numpy's stubs give ndarray.copy() as Any for Python 3.10
    np.subtract(data[..., 1:], arr[..., :-1], out=data[..., 1:])
    return data


def encode(arr: np.ndarray, *, compress: bool = True) -> bytes:
    """Encode `arr` as a self-describing blob (zlib-compressed unless `compress=False`)."""
    arr = _contiguous(arr)
    header, delta = _cached_header(arr, compress)
    raw = _delta_coded(arr).tobytes() if delta else arr.tobytes()
    return header + (_z.compress(raw, ZLIB_LEVEL) if compress else raw)


def encode_parts_raw(arr: np.ndarray) -> tuple[bytes, bytes]:
    """`encode(arr, compress=False)` as (header, payload): the same bytes once joined."""
    arr = _contiguous(arr)
    header, delta = _cached_header(arr, False)
    return header, (_delta_coded(arr) if delta else arr).tobytes()


def decode(blob: bytes | memoryview, base: np.ndarray | None = None) -> np.ndarray:
    """Decode a blob made by `encode` (or `encode_with_base`, given its base array).

    Any damage raises TraceError; the result is read-only.
    """
    try:
        return _decode(blob if isinstance(blob, bytes) else bytes(blob), base)
    except TraceError:
        raise
    except (zlib.error, _z.error, struct.error, ValueError, TypeError, OverflowError, MemoryError) as e:
        raise TraceError(f"damaged array blob ({type(e).__name__}: {e})") from e


_DTYPES: dict[bytes, np.dtype] = {}  # dtype strings a reader met, parsed once (a trace uses a handful)
_SHAPES = [struct.Struct(f"<{n}Q") for n in range(_MAX_NDIM + 1)]


def _parse_header(blob: bytes) -> tuple[int, np.dtype, tuple[int, ...], int]:
    """codec, dtype, shape and the payload offset of a blob."""
    if len(blob) < 6 or blob[:2] != MAGIC:
        raise TraceError("damaged array blob (bad magic)")
    version, codec, dlen = blob[2], blob[3], blob[4]
    if version != VERSION:
        raise TraceError(f"array blob has unknown version {version}")
    if codec not in _ALL_CODECS:
        raise TraceError(f"array blob has unknown codec {codec}")
    pos = 5
    key = bytes(blob[pos : pos + dlen])
    dtype = _DTYPES.get(key)
    if dtype is None:
        dtype = np.dtype(key.decode("ascii"))
        if dtype.kind not in _ALLOWED_KINDS:
            raise TraceError(f"damaged array blob (dtype {dtype})")
        if len(_DTYPES) < 256:
            _DTYPES[key] = dtype
    pos += dlen
    (ndim,) = struct.unpack_from("<B", blob, pos)
    pos += 1
    if ndim > _MAX_NDIM:
        raise TraceError(f"damaged array blob ({ndim} dimensions)")
    shape = _SHAPES[ndim].unpack_from(blob, pos)
    pos += 8 * ndim
    if codec in _BASE_CODECS:
        pos += DIGEST_BYTES
    return codec, dtype, shape, pos


def _decode(blob: bytes, base: np.ndarray | None) -> np.ndarray:
    codec, dtype, shape, pos = _parse_header(blob)
    if len(blob) < pos:
        raise TraceError("damaged array blob (truncated header)")
    zdict = b""
    if codec in _BASE_CODECS:
        if base is None:
            raise TraceError("array blob needs its base array to be decoded")
        zdict = _payload(base)[-ZDICT_BYTES:]
    count = 1
    for n in shape:
        count *= n
    nbytes = count * dtype.itemsize
    raw: bytes | memoryview
    if codec in _ZLIB_CODECS:
        if nbytes > len(blob) * 1032 + 1024:
            # zlib cannot expand more than ~1032x: a larger claimed size is damage, not data.
            raise TraceError("damaged array blob (shape larger than its data)")
        d = _z.decompressobj(zdict=zdict) if zdict else _z.decompressobj()
        raw = d.decompress(blob[pos:], nbytes + 1)
        ok = len(raw) == nbytes and d.eof and not d.unused_data
    else:
        raw = memoryview(blob)[pos:]  # no copy: the array is read-only and keeps the bytes alive
        ok = len(raw) == nbytes
    if not ok:
        raise TraceError("damaged array blob (payload length does not match its shape)")
    arr: np.ndarray = np.frombuffer(raw, dtype=dtype).reshape(shape)
    if codec in _DELTA_CODECS:
        if dtype.kind not in "iu" or len(shape) == 0:
            raise TraceError("damaged array blob (delta codec on a non-integer array)")
        arr = np.cumsum(arr, axis=-1, dtype=dtype) if arr.shape[-1] > 1 else arr.copy()
    arr.flags.writeable = False
    return arr
