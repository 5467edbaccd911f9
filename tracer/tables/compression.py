"""Compression of step bodies (zstd, with the trace's trained dictionary once there is one; zlib for schema 1) and
of `step_requests.data`."""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Sequence

import zstandard

BODY_ZLIB_LEVEL = 1  # schema 1 bodies (still read; the upgrade command rewrites them)
# Level 1 with a trained dictionary (digested once): ~1.26 KB per bs-64 body, ~20% less CPU than level 3 for
# ~1% more bytes, and far below zlib level 1's ~170 us and ~1.8 KB (benchmarks/results/trace_store.md).
BODY_ZSTD_LEVEL = 1
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_REQ_DATA_LEVEL = -1  # ~2x faster than level 1 on these ~1.3 KB for ~100 more bytes
MAX_BODY_BYTES = 1 << 30


class _ThreadZstd(threading.local):
    """The dictionary-less zstd contexts of one thread."""

    # python-zstandard's compressors and decompressors keep one native context that two threads must not use
    # at once (it lets go of the GIL while it works): a context shared by the process let two readers on two threads
    # corrupt each other's output ("Data corruption detected" on a valid trace). Each thread makes its own on
    # first use; a context is cheap to keep and costly to make per call.

    def __init__(self) -> None:
        self.plain = zstandard.ZstdDecompressor()
        self.request_compressor = zstandard.ZstdCompressor(level=_REQ_DATA_LEVEL)


_zstd = _ThreadZstd()


class BodyCompressor:
    """zstd for step bodies, with the trace's trained dictionary once there is one."""

    def __init__(self, dict_data: zstandard.ZstdCompressionDict | None = None) -> None:
        self.dict_id = 0 if dict_data is None else dict_data.dict_id()
        if dict_data is not None:
            # Digested once for this level: otherwise every compress() re-loads the 16 KiB dictionary (~2x the
            # cost of compressing a body). A private copy, so the caller's dictionary object is left as it was.
            dict_data = zstandard.ZstdCompressionDict(dict_data.as_bytes())
            dict_data.precompute_compress(level=BODY_ZSTD_LEVEL)
        self._c = zstandard.ZstdCompressor(level=BODY_ZSTD_LEVEL, dict_data=dict_data, write_content_size=True)

    def compress(self, container: bytes) -> bytes:
        """The `step_bodies.body` of a container made by `encode_parts`."""
        return self._c.compress(container)


def train_dictionary(samples: Sequence[bytes], size: int = 16384) -> zstandard.ZstdCompressionDict | None:
    """A zstd dictionary trained on body containers, or None when the samples are too few or too alike."""
    # zstandard types its samples list[bytes | bytearray | memoryview], which a list[bytes] is not (lists are
    # invariant): a list of that type holding the same objects.
    buffers: list[bytes | bytearray | memoryview] = list(samples)
    try:
        d = zstandard.train_dictionary(size, buffers)
    except zstandard.ZstdError:
        return None
    return d if d.dict_id() else None


def compress_body(container: bytes) -> bytes:
    """A body compressed without a dictionary (tests and one-off writers)."""
    return BodyCompressor().compress(container)


# A dictionary's decompressor comes from the reader (one per trace, used under the reader's lock).
DictLoader = Callable[[int], "zstandard.ZstdDecompressor"]


def decompress_body(data: bytes, dicts: DictLoader | None) -> bytes:
    """The container of a stored body: zstd (schema 2, maybe with a dictionary) or zlib (schema 1)."""
    if data[:4] == ZSTD_MAGIC:
        params = zstandard.get_frame_parameters(data)
        if params.content_size > MAX_BODY_BYTES:
            raise ValueError("step body claims an impossible size")
        d = _zstd.plain
        if params.dict_id:
            if dicts is None:
                raise ValueError(f"step body needs dictionary {params.dict_id}")
            d = dicts(params.dict_id)
        return d.decompress(data, max_output_size=MAX_BODY_BYTES)
    return zlib.decompress(data)


def compress_request_data(raw: bytes) -> bytes:
    """A `step_requests.data` value from its uncompressed codec blob."""
    return _zstd.request_compressor.compress(raw)


def decompress_request_data(data: bytes) -> bytes:
    """The codec blob of a `step_requests.data` value."""
    return _zstd.plain.decompress(data, max_output_size=MAX_BODY_BYTES)
