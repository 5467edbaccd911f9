"""Delta-coded KV pages of recorded attention calls, as bug-report bundles store them: the format and its codec.

Torch-free (numpy). Consecutive calls of one model read nearly the same pages: per step only the token rows just
written change (the tail of each request's last page, and pages it just started). So in a bundle each call stores
only the token rows that differ, byte for byte, from what the earlier bundled calls of the same model hold for that
physical page id (a page none of them read counts as zeros):

- `attn_kv_ref`   int64 [2]: the chain id (one per bundle) and the bundle step index of the base call (-1: none,
  this step holds its full `attn_kv`);
- `attn_kv_rows`  int32 [R]: the differing token rows, as `slot * page_size + row` (slot: index in attn_page_ids);
- `attn_kv_src`   int64 [R]: where each row's bytes come from: -1 the next literal row; `page id * P + row` a row
  the earlier calls hold; `-2 - r` the literal row r of this call (layer 0's KV of a token depends only on the token
  and its position, so equal rows recur);
- `attn_kv_delta` [L, 2, Hkv, D] in attn_kv's stored dtype: the literal rows; its snapshot's `shape` is the full
  `[U, 2, Hkv, P, D]` of the call's attn_kv.

A model's first bundled call is coded against an empty store (zeros), so it too keeps only its distinct rows.

Decoding is exact (the stored bytes come back). Resolving a step's chain of base calls is `kv_bases.py`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .schema import ArraySnapshot, Step

REF, ROWS, SRC, DELTA = "attn_kv_ref", "attn_kv_rows", "attn_kv_src", "attn_kv_delta"
KV_ARRAYS = ("attn_page_ids", "attn_kv", REF, ROWS, SRC, DELTA, "attn_planes")  # what resolving a base call reads
NO_BASE = -1
PLANES = "attn_planes"  # uint8 [1]: present when attn_q / attn_out / attn_kv / attn_kv_delta are stored as byte planes
# The stored widths (attention_call).
_PLANE_DTYPES: dict[int, np.dtype[Any]] = {2: np.dtype("<i2"), 4: np.dtype("<f4"), 8: np.dtype("<i8")}


def to_planes(v: np.ndarray) -> np.ndarray:
    """uint8 `[k, *shape]`: the k bytes of each element, most significant first (high bytes of bf16 or float32 are
    sign and exponent, which compress; the low bytes hardly do, and interleaved they spoil each other)."""
    dt = _PLANE_DTYPES[v.dtype.itemsize]
    b = np.ascontiguousarray(v, dtype=v.dtype.newbyteorder("<")).view(np.uint8).reshape(*v.shape, dt.itemsize)
    return np.ascontiguousarray(np.moveaxis(b[..., ::-1], -1, 0))


def from_planes(p: np.ndarray) -> np.ndarray:
    """Inverse of `to_planes`: int16 (2 planes), float32 (4) or int64 (8), in native byte order."""
    k = p.shape[0] if p.ndim else 0
    if p.dtype != np.uint8 or k not in _PLANE_DTYPES:
        raise DeltaError(f"byte planes must be uint8 [2|4|8, ...], not {p.dtype} {list(p.shape)}")
    b = np.ascontiguousarray(np.moveaxis(p[::-1], 0, -1))
    out = b.view(_PLANE_DTYPES[k]).reshape(p.shape[1:])
    return out.astype(out.dtype.newbyteorder("="))


def raw_values(step: Step, name: str) -> np.ndarray:
    """The values of array `name` at their stored width (undoing a bundle's byte planes)."""
    a = step.array(name)
    if a is None:
        raise DeltaError(f"the recorded attention call lacks {name}")
    v = np.asarray(a.values)
    if step.array(PLANES) is not None and name in PLANED:
        return from_planes(v)
    return v


PLANED = ("attn_q", "attn_out", "attn_kv", "attn_kv_delta")


class DeltaError(ValueError):
    """A delta-coded call cannot be resolved (its base is missing or the arrays disagree); one sentence."""


Pages = dict[int, np.ndarray]  # page id -> its latest known content as token rows [P, 2 * Hkv * D] (never mutated)


def _as_rows(kv: np.ndarray) -> np.ndarray:
    """[U, 2, Hkv, P, D] -> [U, P, 2 * Hkv * D]: one row per token slot of every page."""
    u, two, h, p, d = kv.shape
    return np.ascontiguousarray(kv.transpose(0, 3, 1, 2, 4)).reshape(u, p, two * h * d)


def _from_rows(rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    u, two, h, p, d = shape
    return np.ascontiguousarray(rows.reshape(u, p, two, h, d).transpose(0, 2, 3, 1, 4))


def _base_rows(ids: np.ndarray, shape: tuple[int, ...], dtype: np.dtype, pages: Pages) -> np.ndarray:
    """What the earlier calls hold for the pages `ids`, `[U, P, W]` (zeros for pages none of them read)."""
    u, two, h, p, d = shape
    out = np.zeros((u, p, two * h * d), dtype=dtype)
    for slot, pid in enumerate(ids):
        page = pages.get(int(pid))
        if page is not None and page.shape == out.shape[1:] and page.dtype == dtype:
            out[slot] = page
    return out


def advance(pages: Pages, ids: np.ndarray, kv: np.ndarray) -> Pages:
    """The page store after a call that read `kv` for the pages `ids` (a new dict; unchanged pages are shared)."""
    out = dict(pages)
    rows = _as_rows(kv)
    for slot, pid in enumerate(ids):
        out[int(pid)] = rows[slot]
    return out


def _store_index(pages: Pages, ids: np.ndarray) -> dict[bytes, int]:
    """The token rows the earlier calls hold for the pages this call reads, by content -> `page id * P + row`.

    Only this call's pages: they hold every live request's rows, and the index stays the size of one call however
    long the bundle (pages of finished requests are not searched)."""
    index: dict[bytes, int] = {}
    for pid in ids.tolist():
        page = pages.get(int(pid))
        if page is None:
            continue
        p = page.shape[0]
        for t in range(p):
            index.setdefault(page[t].tobytes(), int(pid) * p + t)
    return index


def encode(ids: np.ndarray, kv: np.ndarray, pages: Pages | None
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(rows, sources, literals) of `kv` against the page store of the earlier calls (empty for a model's first
    call), or None when the full array is the better encoding.

    Layer 0's K and V of a token depend only on the token and its position, so equal rows recur (across requests,
    and at every page boundary a request crosses): a differing row equal to one the store holds, or to an earlier
    row of this call, is stored as a reference (`sources`), only the others as literals."""
    if pages is None or kv.ndim != 5:
        return None
    u, two, h, p, d = kv.shape
    cur = _as_rows(kv).reshape(u * p, -1)
    base = _base_rows(ids, kv.shape, kv.dtype, pages).reshape(u * p, -1)
    differ = np.any(cur.view(np.uint8) != base.view(np.uint8), axis=1)  # bytes: NaN and -0.0 are kept exactly
    idx = np.flatnonzero(differ)
    index = _store_index(pages, ids) if idx.size else {}
    src = np.full(idx.size, LITERAL, dtype=np.int64)
    first: dict[bytes, int] = {}
    literal = []
    for j, r in enumerate(idx.tolist()):
        b = cur[r].tobytes()
        hit = index.get(b)
        if hit is not None:
            src[j] = hit
        elif b in first:
            src[j] = -2 - first[b]  # the same bytes as an earlier literal row of this call
        else:
            first[b] = r
            literal.append(r)
    lit = cur[literal].reshape(len(literal), two, h, d)
    if idx.size * 12 + lit.nbytes >= kv.nbytes:
        return None
    return idx.astype(np.int32), src, lit


LITERAL = -1  # attn_kv_src: the row's bytes are the next row of attn_kv_delta


def decode(ids: np.ndarray, shape: tuple[int, ...], rows: np.ndarray, src: np.ndarray, delta: np.ndarray,
           pages: Pages) -> np.ndarray:
    """The full kv `[U, 2, Hkv, P, D]` from the earlier calls' page store and the differing rows."""
    if len(shape) != 5 or shape[0] != len(ids):
        raise DeltaError(f"{DELTA} says the call read {shape[0] if shape else '?'} pages, attn_page_ids has {len(ids)}")
    u, two, h, p, d = shape
    rows = rows.astype(np.int64)
    lit = src == LITERAL
    if src.shape != rows.shape or delta.shape != (int(lit.sum()), two, h, d):
        raise DeltaError(f"{DELTA} holds {list(delta.shape)} for {int(lit.sum())} literal rows of [{two}, {h}, {d}]")
    if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= u * p):
        raise DeltaError(f"{ROWS} points past the call's {u * p} token rows")
    out = _base_rows(ids, tuple(shape), delta.dtype, pages).reshape(u * p, -1)
    out[rows[lit]] = delta.reshape(delta.shape[0], out.shape[1])
    stored = src >= 0
    for r, s in zip(rows[stored].tolist(), src[stored].tolist(), strict=True):
        page = pages.get(s // p)
        if page is None or page.shape[1] != out.shape[1]:
            raise DeltaError(f"{SRC} names page {s // p}, which no earlier call of the chain holds")
        out[r] = page[s % p]
    same = src <= -2
    if same.any():
        from_rows = -2 - src[same]
        if int(from_rows.max()) >= u * p or not np.isin(from_rows, rows[lit]).all():
            raise DeltaError(f"{SRC} names a row of this call that is not a literal")
        out[rows[same]] = out[from_rows]
    return _from_rows(out, tuple(shape))


def delta_arrays(chain: int, base: int, coded: tuple[np.ndarray, np.ndarray, np.ndarray] | None,
                 kv: np.ndarray) -> list[Any]:
    """The ArraySnapshots that replace a step's `attn_kv` in a bundle: the chain reference (`base`: the previous
    bundled call of the model, -1 for its first) plus the full kv (`coded` None) or the differing rows."""
    ref = ArraySnapshot(REF, "int64", (2,), 0, np.array([chain, base], np.int64))
    if coded is None:
        return [ArraySnapshot("attn_kv", str(kv.dtype), tuple(kv.shape), 0, kv), ref]
    rows, src, delta = coded
    return [ref, ArraySnapshot(ROWS, "int32", tuple(rows.shape), 0, rows),
            ArraySnapshot(SRC, "int64", tuple(src.shape), 0, src),
            ArraySnapshot(DELTA, str(delta.dtype), tuple(kv.shape), 0, delta)]

