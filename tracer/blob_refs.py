"""Which stored blob each large array of a step refers to, and which new blobs a step adds.

Page tables mostly repeat from step to step, so a writer stores each distinct array once (by digest) and a changed
one compressed against the last stand-alone version of the same array (a "key"); every KEY_INTERVAL-th version is
a new key. Bases are always keys, so a random read decodes at most one base per array, and a damaged key spoils at
most KEY_INTERVAL versions.
"""

from __future__ import annotations

import collections

import numpy as np

from . import codec

KEY_INTERVAL = 16
COMPARE_MAX_BYTES = 1 << 20  # arrays up to this size are compared by bytes with the previous step's
_SEEN_DIGESTS = 8192  # blobs the writer knows are stored; page tables repeat across nearby steps


class BlobRefs:
    """One writer's memory of the blobs it stored: digests, the previous step's arrays and each array's key."""

    def __init__(self) -> None:
        self._seen: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        # array name -> (its bytes when small enough to compare, digest, (dtype, shape)) at the previous step
        self._last: dict[str, tuple[bytes | None, bytes, tuple[str, tuple[int, ...]]]] = {}
        self._keys: dict[str, tuple[codec.Base, int]] = {}  # array name -> current key, versions based on it

    def ref(self, name: str, values: np.ndarray, new_blobs: list[tuple[bytes, codec.Pending]]) -> str:
        """The digest (hex) of the blob that holds `values`; appends it to `new_blobs` when it is not stored yet."""
        prev = self._last.get(name)
        # Page tables mostly equal the previous step's: comparing bytes is ~10x cheaper than hashing them.
        # Large arrays (recorded attention, new every step) are only hashed: a copy of them would be wasted.
        data = values.tobytes() if values.nbytes <= COMPARE_MAX_BYTES else None
        if data is not None and prev is not None and prev[0] == data and prev[2] == (values.dtype.str,
                                                                                      values.shape):
            return prev[1].hex()
        d = codec.digest(values)
        self._last[name] = (data, d, (values.dtype.str, values.shape))
        if d in self._seen:
            self._seen.move_to_end(d)
            return d.hex()
        key = self._keys.get(name)
        if key is not None and key[1] < KEY_INTERVAL - 1:
            new_blobs.append((d, codec.prepare(values, key[0])))
            self._keys[name] = (key[0], key[1] + 1)
        else:
            new_blobs.append((d, codec.prepare(values)))
            self._keys[name] = (codec.Base(values, d), 0)
        self._seen[d] = None
        if len(self._seen) > _SEEN_DIGESTS:
            self._seen.popitem(last=False)
        return d.hex()
