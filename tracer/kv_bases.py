"""Resolving a bundled call's delta-coded KV pages (`kv_delta.py`) through its chain of earlier calls.

`stored_kv(step, fetch)` returns a step's `attn_kv` as stored. A delta-coded call is decoded against the page store
of the earlier bundled calls of its model: found in a cache of recently decoded calls (a sequential read, as `check`
does, chains onto the previous call), else read through `fetch(i)` — step i of the same trace, which the caller
passes (`TraceReader.kv_base`: the reader knows the file, extracted from a bundle or not). Nothing here opens a
file: without `fetch`, a call whose base is not cached is a DeltaError with one sentence. `TraceReader.step`
resolves a bundled call through its own `kv_base` as it hands the step out (`resolve_ahead`), so code that is given
only the step (the catalogue) finds its KV in the cache.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from .kv_delta import DELTA, NO_BASE, REF, ROWS, SRC, DeltaError, Pages, advance, decode, raw_values
from .schema import Step

KvFetch = Callable[[int], Step]  # step i of the trace being read, with at least the arrays of kv_delta.KV_ARRAYS
_CACHE_ENTRIES = 16
_CACHE_BYTES = 256 << 20
_MAX_CHAIN = 1 << 16  # a base chain longer than any bundle: damage (or a loop)


class DecodedCalls:
    """A bounded LRU of decoded calls, (chain id, step index) -> (page store after the call, its kv)."""

    def __init__(self, entries: int = _CACHE_ENTRIES, max_bytes: int = _CACHE_BYTES) -> None:
        self.entries, self.max_bytes = entries, max_bytes
        self._lock = threading.Lock()  # viewers decode steps on loader threads
        self._calls: OrderedDict[tuple[int, int], tuple[Pages, np.ndarray]] = OrderedDict()

    def get(self, key: tuple[int, int]) -> tuple[Pages, np.ndarray] | None:
        """The cached call, or None."""
        with self._lock:
            hit = self._calls.get(key)
            if hit is not None:
                self._calls.move_to_end(key)
            return hit

    def put(self, key: tuple[int, int], pages: Pages, kv: np.ndarray) -> None:
        """Remember a decoded call, dropping the oldest beyond the entry and byte bounds."""
        with self._lock:
            self._calls[key] = (pages, kv)
            self._calls.move_to_end(key)
            while len(self._calls) > 1 and (len(self._calls) > self.entries or self._size() > self.max_bytes):
                self._calls.popitem(last=False)

    def _size(self) -> int:
        # Page stores share their unchanged pages; count each page array once.
        seen = {id(x): x.nbytes for v in self._calls.values() for x in v[0].values()}
        return sum(seen.values()) + sum(v[1].nbytes for v in self._calls.values())

    def clear(self) -> None:
        """Forget every decoded call."""
        with self._lock:
            self._calls.clear()


# One cache for the process: the catalogue's differential check decodes calls one step at a time and is handed no
# reader, so the chain a sequential read builds must be found without one. It holds decoded bytes only (keyed by
# the bundle's random 62-bit chain id, so calls of different bundles never meet) and never opens a file.
_DECODED = DecodedCalls()


def clear_cache() -> None:
    """Forget the decoded calls (a cold read, as in a fresh process)."""
    _DECODED.clear()


def stored_kv(step: Step, fetch: KvFetch | None = None) -> np.ndarray:
    """The step's `attn_kv` as stored (raw width), resolving a bundle's delta chain through `fetch` (step i of the
    same trace) where the cache of recently decoded calls does not hold its base."""
    a = {x.name: x for x in step.arrays}
    if REF not in a:
        return raw_values(step, "attn_kv")
    chain, base = _ref(a, step.index)
    hit = _DECODED.get((chain, step.index))
    if hit is not None:
        return hit[1]
    if "attn_kv" in a:
        kv = raw_values(step, "attn_kv")
        # Remember the page store after it, so a sequential read (as `check` does) decodes the next call.
        before = {} if base == NO_BASE else (_DECODED.get((chain, base)) or (None, None))[0]
        if before is not None and "attn_page_ids" in a:
            _DECODED.put((chain, step.index), advance(before, np.asarray(a["attn_page_ids"].values), kv), kv)
        return kv
    return _resolve(step, chain, fetch)


def resolve_ahead(step: Step, fetch: KvFetch) -> None:
    """Decode a delta-coded call's KV into the cache of decoded calls now, through `fetch`, so that a later reader of
    the call that is handed no fetch (the catalogue's differential check) finds it there."""
    if step.array(REF) is None:
        return
    try:
        stored_kv(step, fetch)
    except (ValueError, IndexError, KeyError, TypeError):
        pass  # damage: whoever decodes the call reports it, in one sentence, where it is asked for


def _ref(a: dict[str, Any], index: int) -> tuple[int, int]:
    v = np.asarray(a[REF].values).reshape(-1)
    if v.shape[0] != 2:
        raise DeltaError(f"{REF} holds {v.shape[0]} values, not 2")
    chain, base = int(v[0]), int(v[1])
    if base != NO_BASE and not 0 <= base < index:
        raise DeltaError(f"{REF} names base step {base}, which is not an earlier step")
    return chain, base


def _call_kv(s: Step, pages: Pages) -> tuple[np.ndarray, np.ndarray]:
    a = {x.name: x for x in s.arrays}
    if "attn_page_ids" not in a:
        raise DeltaError(f"step {s.index}'s recorded call lacks attn_page_ids")
    ids = np.asarray(a["attn_page_ids"].values).astype(np.int64)
    if "attn_kv" in a:
        return ids, raw_values(s, "attn_kv")
    missing = [n for n in (ROWS, SRC, DELTA) if n not in a]
    if missing:
        raise DeltaError(f"step {s.index}'s delta-coded KV lacks {missing[0]}")
    return ids, decode(ids, tuple(a[DELTA].shape), np.asarray(a[ROWS].values), np.asarray(a[SRC].values),
                       raw_values(s, DELTA), pages)



def _no_fetch(index: int) -> KvFetch:
    def get(base: int) -> Step:
        raise DeltaError(f"its KV pages are stored as changes against step {base}, and no reader of its trace was "
                         f"given to fetch that step (pass fetch=TraceReader.kv_base, or read the steps in order from "
                         f"the first; step {index})")

    return get


def _resolve(step: Step, chain: int, fetch: KvFetch | None) -> np.ndarray:
    """Walk back to a cached call or the model's first bundled call, then decode forward (caching each call)."""
    get = fetch or _no_fetch(step.index)
    pending = [step]
    pages: Pages = {}
    while True:
        a = {x.name: x for x in pending[-1].arrays}
        if REF not in a:
            raise DeltaError(f"step {pending[-1].index} is in the delta chain but has no {REF}")
        c, base = _ref(a, pending[-1].index)
        if c != chain:
            raise DeltaError(f"step {pending[-1].index} belongs to another delta chain")
        if base == NO_BASE:
            break
        hit = _DECODED.get((chain, base))
        if hit is not None:
            pages = hit[0]
            break
        if len(pending) > _MAX_CHAIN:
            raise DeltaError("the delta chain of its KV pages does not end")
        try:
            pending.append(get(base))
        except DeltaError:
            raise
        except Exception as e:  # noqa: BLE001 - the source's own error, as one sentence
            raise DeltaError(f"its KV pages are stored as changes against step {base}, which cannot be read "
                             f"({type(e).__name__}: {e})") from None
    kv = None
    for s in reversed(pending):
        ids, kv = _call_kv(s, pages)
        pages = advance(pages, ids, kv)
        _DECODED.put((chain, s.index), pages, kv)
    assert kv is not None
    return kv
