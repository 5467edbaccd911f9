"""The steps of an open trace: counting and listing their indexes, and decoding step bodies (with the array blobs
they name, and the compression dictionaries and base blobs those were coded against) back into `Step` records."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import zstandard

from . import codec, tables
from .errors import TraceError, TraceIndexError
from .query import index_runs_text
from .schema import Step
from .trace_file import DAMAGE, TraceDb

BATCH = 128  # rows per query when streaming, so no statement stays open across yields
_MAX_BASE_DEPTH = 64  # writers chain at most 8; anything deeper (or a cycle) is damage
_ARRAY_CACHE_SIZE = 512


class StepTable:
    """Step indexes and decoded steps of one trace; every read goes through the trace's `TraceDb.guard`."""

    def __init__(self, db: TraceDb, major: int) -> None:
        self.db = db
        self.major = major
        self._arrays: collections.OrderedDict[bytes, np.ndarray] = collections.OrderedDict()  # decoded blobs, LRU
        self._count = (0, -(2**63))  # (steps counted, highest index counted) for num_steps()
        self._zdicts: dict[int, zstandard.ZstdDecompressor] = {}

    # -- indexes ---------------------------------------------------------------------------------

    def num_steps(self) -> int:
        """Steps committed right now (re-queried on every call, so a live trace grows)."""
        with self.db.guard("counting steps") as conn:
            # Steps are append-only with increasing indexes, so only rows past the last one seen need
            # counting: a poll of a live 100k-step trace stays O(new steps), not a full table scan.
            n, last = self._count
            more, top = conn.execute("SELECT count(*), max(idx) FROM steps WHERE idx > ?", (last,)).fetchone()
            if more:
                self._count = (n + int(more), int(top))
            return self._count[0]

    def last_index(self) -> int | None:
        """The highest step index committed right now (None without steps)."""
        n = self.num_steps()
        return self._count[1] if n else None

    def is_dense(self) -> bool:
        """True when the steps are exactly 0..num_steps()-1 (every recorded trace): index == position."""
        n = self.num_steps()
        return n == 0 or self._count[1] == n - 1

    def step_indexes(self, start: int = 0, stop: int | None = None) -> list[int]:
        """The indexes of the steps with start <= index < stop, ascending (the primary key: no body is read)."""
        hi = (2**63 - 1) if stop is None else int(stop)
        with self.db.guard("listing step indexes") as conn:
            rows = conn.execute("SELECT idx FROM steps WHERE idx >= ? AND idx < ? ORDER BY idx",
                                (int(start), hi)).fetchall()
        return [int(r[0]) for r in rows]

    def has_step(self, i: int) -> bool:
        """Whether the trace holds a step with index `i`."""
        with self.db.guard(f"looking up step {i}") as conn:
            return conn.execute("SELECT 1 FROM steps WHERE idx = ?", (int(i),)).fetchone() is not None

    def steps_text(self) -> str:
        """The step indexes the trace holds, for messages: `steps 0–172`, or a bundle's `steps 2, 5, 30–59`."""
        if self.is_dense():
            n = self.num_steps()
            return f"steps 0–{n - 1}" if n else "no steps"
        return "steps " + index_runs_text(self.step_indexes())

    # -- decoded steps ---------------------------------------------------------------------------

    def step(self, i: int, arrays: Iterable[str] | None = None) -> Step:
        """The step with index `i` (TraceIndexError when absent); `arrays` as for `TraceReader.step`."""
        i = int(i)
        keep = None if arrays is None else {arrays} if isinstance(arrays, str) else set(arrays)
        with self.db.guard(f"reading step {i}"):
            rows = self._fetch_steps("s.idx = ?", (i,))
            if not rows:
                raise TraceIndexError(f"has no step {i} ({self.steps_text()})", self.db.display_path)
            return self._assemble(rows, keep)[0]

    def iter_steps(self, start: int, stop: int | None, keep: set[str] | None) -> Iterator[Step]:
        """Steps with start <= index < stop in index order, fetched in batches, decoding the arrays in `keep`
        (None: all)."""
        nxt = int(start)
        while stop is None or nxt < stop:
            with self.db.guard(f"reading steps from {nxt}"):
                hi = (2**63 - 1) if stop is None else int(stop)
                rows = self._fetch_steps("s.idx >= ? AND s.idx < ? ORDER BY s.idx LIMIT ?", (nxt, hi, BATCH))
                batch = self._assemble(rows, keep)
            if not batch:
                return
            yield from batch
            nxt = batch[-1].index + 1

    def step_headers(self, start: int = 0, stop: int | None = None, *, mode: str | None = None
                     ) -> Iterator[dict[str, Any]]:
        """Header dicts (`Step.header_dict()` keys plus `num_violations`), no arrays: for list views."""
        cols = ", ".join(f"s.{c}" for c in tables.HEADER_COLUMNS)
        nv = "(SELECT count(*) FROM violations v WHERE v.step = s.idx)"
        where = "s.idx >= ? AND s.idx < ?" + (" AND s.mode = ?" if mode is not None else "")
        nxt = int(start)
        while stop is None or nxt < stop:
            hi = (2**63 - 1) if stop is None else int(stop)
            params: tuple[Any, ...] = (nxt, hi) + ((str(mode),) if mode is not None else ())
            with self.db.guard(f"reading step headers from {nxt}") as conn:
                sql = f"SELECT {cols}, {nv} FROM steps s WHERE {where} ORDER BY s.idx LIMIT {BATCH * 8}"
                rows = conn.execute(sql, params).fetchall()
                out = []
                for r in rows:
                    h = tables.header_from_row(r)
                    h["num_violations"] = int(r[-1])
                    out.append(h)
            if not out:
                return
            yield from out
            nxt = int(out[-1]["index"]) + 1

    def num_cached_arrays(self) -> int:
        """How many decoded array blobs are cached (what a read decoded, for tests of lazy decoding)."""
        return len(self._arrays)

    # -- decoding (callers hold the guard) -------------------------------------------------------

    def _fetch_steps(self, where: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        cols = ", ".join(f"s.{c}" for c in tables.HEADER_COLUMNS)
        sql = f"SELECT {cols}, b.body FROM steps s LEFT JOIN step_bodies b ON b.idx = s.idx WHERE {where}"
        return self.db.conn.execute(sql, params).fetchall()

    def _assemble(self, rows: list[tuple[Any, ...]], keep: set[str] | None = None) -> list[Step]:
        bodies = []
        for r in rows:
            if r[-1] is None:
                raise TraceError(f"damaged: the body of step {r[0]} is missing")
            bodies.append(tables.Body(r[-1], self._zdict))
        # Only the blobs of the arrays asked for are fetched and decoded.
        arrays = self._load_arrays({d for body in bodies for d in body.blob_digests(keep)})
        steps = []
        for r, body in zip(rows, bodies, strict=True):
            try:
                steps.append(tables.step_from_row(r[:-1], body, arrays, keep))
            except DAMAGE as e:
                problem = f"damaged: step {r[0]} cannot be decoded ({type(e).__name__}: {e})"
                raise TraceError(problem) from None
        return steps

    def _zdict(self, dict_id: int) -> zstandard.ZstdDecompressor:
        d = self._zdicts.get(dict_id)
        if d is None:
            row = None
            if self.major >= 2:
                row = self.db.conn.execute("SELECT data FROM zdicts WHERE id = ?", (int(dict_id),)).fetchone()
            if row is None or not isinstance(row[0], bytes):
                raise TraceError(f"damaged: compression dictionary {dict_id} is missing")
            d = self._zdicts[dict_id] = zstandard.ZstdDecompressor(dict_data=zstandard.ZstdCompressionDict(row[0]))
        return d

    def _load_arrays(self, digests: set[bytes]) -> dict[bytes, np.ndarray]:
        cache = self._arrays
        out = {d: cache[d] for d in digests if d in cache}
        want = sorted(digests - out.keys())
        blobs: dict[bytes, bytes] = {}
        for k in range(0, len(want), 500):  # stay under SQLite's bound-parameter limit
            chunk = want[k : k + 500]
            q = f"SELECT digest, data FROM blobs WHERE digest IN ({', '.join('?' * len(chunk))})"
            blobs.update(self.db.conn.execute(q, chunk).fetchall())
        for d in want:
            out[d] = self._decode_blob(d, blobs, 0)
        for d in digests:
            cache[d] = out[d]
            cache.move_to_end(d)
        # Decoded bases stay cached too: the next steps of a sequential read chain onto them.
        while len(cache) > _ARRAY_CACHE_SIZE:
            cache.popitem(last=False)
        return out

    def _decode_blob(self, digest: bytes, blobs: dict[bytes, bytes], depth: int) -> np.ndarray:
        """Decode one blob, first decoding the chain of bases it was compressed against."""
        if digest in self._arrays:
            return self._arrays[digest]
        if depth > _MAX_BASE_DEPTH:
            raise TraceError(f"damaged: array blob {digest.hex()} has a base chain deeper than {_MAX_BASE_DEPTH}")
        data = blobs.get(digest)
        if data is None:
            row = self.db.conn.execute("SELECT data FROM blobs WHERE digest = ?", (digest,)).fetchone()
            data = None if row is None else row[0]
        if data is None:
            raise TraceError(f"damaged: array blob {digest.hex()} is missing")
        if not isinstance(data, bytes):
            raise TraceError(f"damaged: array blob {digest.hex()} is not binary")
        try:
            b = codec.base_digest(data)
            base = None if b is None else self._decode_blob(b, blobs, depth + 1)
            arr = codec.decode(data, base)
        except TraceError as e:
            if e.problem.startswith("damaged: array blob"):
                raise
            raise TraceError(f"damaged: array blob {digest.hex()} cannot be decoded ({e.problem})") from None
        self._arrays[digest] = arr
        return arr
