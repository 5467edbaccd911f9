"""A resolving pass's steps as one typed, columnar record: what the recorder hands the writer child.

The capture side fills a `StepBatchBuilder` step by step (`add`, or `add_raw` with the recorder's compact form,
documented at `parts_from_raw`) and `finish`es it into a `StepBatch`: the header fields as one column each, the
request rows as int columns plus the token tuples' lengths and their values flattened, every packed int64
snapshot's values back to back with the layouts interned (a graph replay's packs share one layout object, which
travels once), other arrays as raw bytes with their dtype and shape, and per step its spans, violations, waits,
errors and fired faults. The writer child turns a batch back into the numpy columns `TraceWriter.write_columns`
takes (`batch_columns`); `batch_steps` makes schema Steps of it (readers, tests).

Torch-free: the engine's tensors are host numpy arrays by the time a step is resolved.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import msgspec
import numpy as np

from . import tables
from .schema import ArraySnapshot, CallError, RequestState, Step, StreamSpan, StreamWait, step_from_parts

HEADER_FIELDS = ("index", "iteration", "mode", "model", "step_id", "batch_size", "padded_batch_size", "graph",
                 "tokens_per_request", "num_draft_tokens", "page_size", "start_ns", "end_ns", "scalars")
INT_FIELDS = tables.REQUEST_INT_FIELDS
TUPLE_FIELDS = tables.REQUEST_TUPLE_FIELDS
NUMERIC_KINDS = "biufc"  # what the codec stores: bool, int, uint, float, complex

# One entry of a snapshot layout: the tensor's name, numpy dtype name, full shape and data pointer.
LayoutEntry = tuple[str, str, tuple[int, ...], int]
# An array that is not a packed snapshot: name, dtype and shape as recorded, data pointer, then its values as the
# dtype string, shape and raw bytes of the numpy array (they may differ from the recorded ones: floats go as float32).
ArrayRow = tuple[str, str, tuple[int, ...], int, str, tuple[int, ...], bytes]
MAX_LAYOUTS = 4096  # layouts a sender remembers before it starts over (the receiver forgets them with it)


class StepBatch(msgspec.Struct, array_like=True, gc=False):
    """Steps in columns: `len(index)` steps; each column has one value per step unless it says otherwise."""

    index: tuple[int, ...]
    iteration: tuple[int, ...]
    mode: tuple[str, ...]
    model: tuple[str, ...]
    step_id: tuple[int | None, ...]
    batch_size: tuple[int, ...]
    padded_batch_size: tuple[int, ...]
    graph: tuple[str, ...]
    tokens_per_request: tuple[int, ...]
    num_draft_tokens: tuple[int, ...]
    page_size: tuple[int, ...]
    start_ns: tuple[int, ...]
    end_ns: tuple[int, ...]
    scalars: tuple[dict[str, int], ...]
    num_requests: list[int]
    # One list per INT_FIELDS entry, then one per TUPLE_FIELDS entry (the tuples' lengths): a value per request, the
    # steps' requests back to back (a step's offset is the running sum of num_requests).
    request_ints: list[list[int]]
    # Per TUPLE_FIELDS entry, its tuples' values back to back (offsets: the running sum of their lengths above).
    token_values: list[list[int]]
    # Snapshot layouts with their crop_cols, numbered in the order they were first sent: these are numbers
    # first_layout on (a receiver forgets the ones from first_layout on before it adds these: 0 starts over).
    first_layout: int
    layouts: list[tuple[list[LayoutEntry], dict[str, int]]]
    num_packs: list[int]  # per step; then per pack, the steps' packs back to back:
    pack_layouts: list[int]  # its layout number
    pack_sizes: list[int]  # how many of pack_values are its
    pack_values: bytes  # int64, every pack's values back to back
    num_arrays: list[int]  # per step; then per array, the steps' arrays back to back:
    arrays: list[ArrayRow]
    spans: tuple[list[tuple[str, str, int, int]], ...]
    violations: tuple[list[dict[str, Any]], ...]
    waits: tuple[list[tuple[str, str, str]], ...]
    errors: tuple[list[dict[str, Any]], ...]
    faults_fired: tuple[list[str], ...]


class LayoutTable:
    """The layouts (with their crop_cols) one sender has sent, by the ids of their objects: a graph replay hands the
    same interned objects with every step, so they cross the pipe once. Holds the objects, so their ids stay theirs."""

    def __init__(self) -> None:
        self.numbers: dict[tuple[int, int], int] = {}
        self.kept: list[tuple[Any, Any]] = []


_header_row = operator.itemgetter(*HEADER_FIELDS)
_raw_row = operator.itemgetter("header", "requests", "packs", "arrays", "spans", "violations", "waits", "errors",
                               "faults_fired")
_EMPTY: tuple[()] = ()
_LISTS = {list}
_get: Callable[[Any, str], Any] = dict.get  # map(_get, dicts, repeat(key)): one C-level pass
_DTYPE_STR: dict[int, tuple[np.dtype, str | None]] = {}  # id(dtype) -> (dtype, its str, None if not numeric)


def _header_row_of(h: dict[str, Any]) -> tuple[Any, ...]:
    try:
        row: tuple[Any, ...] = _header_row(h)
        return row
    except KeyError:  # step_id and scalars may be left out (TraceWriter reads them with defaults)
        return tuple(h.get(f, {} if f == "scalars" else None) if f in ("step_id", "scalars") else h[f]
                     for f in HEADER_FIELDS)  # fmt: skip


def _int_list(v: Any) -> list[Any]:
    if type(v) is list:
        return v
    return cast(list[Any], v.tolist()) if isinstance(v, np.ndarray) else list(v)


def _array_row(name: Any, dtype: Any, shape: Any, ptr: Any, values: Any) -> ArrayRow:
    v = values if type(values) is np.ndarray else np.asarray(values)
    dt = v.dtype
    known = _DTYPE_STR.get(id(dt))
    if known is None:
        known = (dt, dt.str if dt.kind in NUMERIC_KINDS and not dt.hasobject else None)
        if len(_DTYPE_STR) < 256:
            _DTYPE_STR[id(dt)] = known
    if known[1] is None:  # checked here, before the bytes are taken
        raise TypeError(f"array {name} of dtype {dt} cannot travel in a step batch")
    if v.nbytes < 65536:  # small: a copy is cheaper than a buffer view
        data = v.tobytes()
    else:  # msgspec writes any buffer as msgpack bin with one memcpy; the receiver decodes bytes
        data = cast(bytes, np.ascontiguousarray(v).data)  # v itself when it is contiguous
    return (name, dtype, shape, ptr, known[1], v.shape, data)


def _wait_rows(waits: Sequence[Any]) -> list[tuple[str, str, str]]:
    return [(str(w["stream"]), str(w["on_stream"]), str(w["on_span"])) if isinstance(w, dict)
            else (str(w[0]), str(w[1]), str(w[2])) for w in waits]  # fmt: skip


def _error_dicts(errors: Sequence[Any]) -> list[dict[str, Any]]:
    return [CallError.from_dict(e).to_dict() if isinstance(e, dict) else CallError(*e).to_dict() for e in errors]


_ZEROS: dict[int, list[int]] = {}
_NO_TUPLES: dict[int, list[tuple[()]]] = {}


def _no_tuples(n: int) -> list[tuple[()]]:
    z = _NO_TUPLES.get(n)
    if z is None:
        z = [()] * n
        if len(_NO_TUPLES) < 1024:
            _NO_TUPLES[n] = z
    return z



def _zeros(n: int) -> list[int]:
    z = _ZEROS.get(n)
    if z is None:
        z = [0] * n
        if len(_ZEROS) < 1024:
            _ZEROS[n] = z
    return z


class StepBatchBuilder:
    """Collects a pass's steps (`add`, `add_raw`) and makes them one `StepBatch` (`finish`).

    `add` only keeps its pieces; `finish` makes every column in one pass over the steps, so a step costs the
    engine's thread little Python. TypeError, ValueError or OverflowError from `finish` mean a step cannot travel as
    it is (a non-numeric array, a ragged request column). Given the `LayoutTable` of a sender, layouts it sent
    before go as their numbers; `sent()` records the new ones once the batch is on its way."""

    def __init__(self, table: LayoutTable | None = None) -> None:
        self._rows: list[tuple[Any, ...]] = []
        self._table = LayoutTable() if table is None else table
        self._new: dict[tuple[int, int], int] = {}
        self._new_kept: list[tuple[Any, Any]] = []

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, header: dict[str, Any], requests: dict[str, Any] | None = None, packs: Sequence[Any] = (),
            arrays: Sequence[Any] = (), spans: Sequence[Any] = (), violations: Sequence[Any] = (),
            waits: Sequence[Any] = (), errors: Sequence[Any] = (), faults_fired: Sequence[Any] = ()) -> None:
        """Add one step, given as the pieces of the recorder's compact form (see `parts_from_raw`)."""
        self._rows.append((header, requests, packs, arrays, spans, violations, waits, errors, faults_fired))

    def add_raw(self, raw: dict[str, Any]) -> None:
        """Add one step in the recorder's compact form."""
        try:
            self._rows.append(_raw_row(raw))
        except KeyError:  # only the header is required
            g = raw.get
            self.add(raw["header"], g("requests"), g("packs") or _EMPTY, g("arrays") or _EMPTY, g("spans") or _EMPTY,
                     g("violations") or _EMPTY, g("waits") or _EMPTY, g("errors") or _EMPTY,
                     g("faults_fired") or _EMPTY)

    def _layout(self, layout: Any, crop: Any) -> int:
        key = (id(layout), id(crop))
        n = self._table.numbers.get(key)
        if n is None:
            n = self._new.get(key)
            if n is None:
                n = self._new[key] = len(self._table.kept) + len(self._new_kept)
                self._new_kept.append((layout, crop))
        return n

    def finish(self) -> StepBatch:
        """The batch of the steps added so far."""
        if len(self._table.kept) >= MAX_LAYOUTS and not self._new_kept:
            self._table.numbers.clear()
            self._table.kept.clear()
        first = len(self._table.kept)
        cols: list[Any] = list(zip(*self._rows, strict=True)) or [_EMPTY] * 9
        headers, requests, packs, arrays, spans, violations, waits, errors, faults = cols
        try:
            hrows = list(map(_header_row, headers))
        except KeyError:
            hrows = list(map(_header_row_of, headers))
        hcols: list[Any] = list(zip(*hrows, strict=True)) or [_EMPTY] * len(HEADER_FIELDS)
        nums, ints, values = _request_columns(headers, requests)
        num_packs = list(map(len, packs))
        all_packs = list(itertools.chain.from_iterable(packs))
        flats: Sequence[Any] = ()
        pack_layouts: list[Any] = []
        if all_packs:
            flats, los, crops = zip(*all_packs, strict=True)
            keys = list(zip(map(id, los), map(id, crops), strict=True))
            pack_layouts = list(map(self._table.numbers.get, keys))
            if None in pack_layouts:
                pack_layouts = [self._layout(lo, crop) for lo, crop in zip(los, crops, strict=True)]
        pv = np.concatenate(flats).astype(np.int64, copy=False).tobytes() if flats else b""
        layouts = [(_layout_rows(lo), {str(k): int(v) for k, v in crop.items()}) for lo, crop in self._new_kept]
        num_arrays = list(map(len, arrays))
        array_rows = [_array_row(*a) for a in itertools.chain.from_iterable(arrays)] if any(num_arrays) else []
        return StepBatch(
            **dict(zip(HEADER_FIELDS, hcols, strict=True)), num_requests=nums, request_ints=ints,
            token_values=values, first_layout=first, layouts=layouts,
            num_packs=num_packs, pack_layouts=pack_layouts, pack_sizes=list(map(len, flats)), pack_values=pv,
            num_arrays=num_arrays, arrays=array_rows,
            spans=spans, violations=violations,
            waits=tuple([w if not w or type(w[0]) is tuple else _wait_rows(w) for w in waits]),
            errors=tuple([_error_dicts(e) for e in errors]) if any(errors) else errors, faults_fired=faults,
        )  # fmt: skip

    def sent(self) -> None:
        """The batch `finish` made is on its way: its new layouts are known to the receiver from now on."""
        t = self._table
        if self._new_kept:
            t.numbers.update(self._new)
            t.kept += self._new_kept
            self._new.clear()
            self._new_kept = []


def _layout_rows(layout: Sequence[Any]) -> list[LayoutEntry]:
    return [(str(n), str(dt), tuple(int(x) for x in sh), int(ptr)) for n, dt, sh, ptr in layout]


def _request_columns(headers: Sequence[dict[str, Any]], requests: Sequence[dict[str, Any] | None]
                     ) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """num_requests, request_ints and token_values of a batch (see StepBatch); ValueError for a ragged column."""
    # One C-level pass per field over the steps (map, chain), not a Python loop per step and field: this runs on
    # the engine's thread.
    nums = [len(c["request_id"]) if c else 0 for c in requests]
    if not any(nums):
        return nums, [[] for _ in INT_FIELDS + TUPLE_FIELDS], [[] for _ in TUPLE_FIELDS]
    idx = [i for i, c in enumerate(requests) if c]
    dicts = [requests[i] for i in idx]
    ns = [nums[i] for i in idx]
    chain = itertools.chain.from_iterable
    ints: list[list[int]] = []
    lens: list[list[int]] = []
    values: list[list[int]] = []
    for k, f in enumerate(INT_FIELDS + TUPLE_FIELDS):
        col: list[Any] = list(map(_get, dicts, itertools.repeat(f)))
        tup = k >= len(INT_FIELDS)
        if set(map(type, col)) != _LISTS or (tup and [] in col):
            if tup:
                col = [v if v is not None and len(v) else _no_tuples(n) for v, n in zip(col, ns, strict=True)]
            else:
                col = [_zeros(n) if v is None else _int_list(v) for v, n in zip(col, ns, strict=True)]
        if list(map(len, col)) != ns:
            for i, v, n in zip(idx, col, ns, strict=True):
                if len(v) != n:  # the writer's own check, in its words
                    raise ValueError(f"step {headers[i].get('index')}: a request column has {len(v)} values for "
                                     f"{n} requests")
        if tup:
            lens.append(list(map(len, chain(col))))
            values.append(list(chain(chain(col))))
        else:
            ints.append(list(chain(col)))
    return nums, ints + lens, values


def batch_of(raws: Sequence[dict[str, Any]]) -> StepBatch:
    """A stand-alone batch (its layouts all in it) of steps in the recorder's compact form."""
    b = StepBatchBuilder()
    for raw in raws:
        b.add_raw(raw)
    return b.finish()


# -- the writer child's side ---------------------------------------------------------------------------------

_DTYPES: dict[str, np.dtype] = {}


def _dtype(name: str) -> np.dtype:
    dt = _DTYPES.get(name)
    if dt is None:
        dt = np.dtype(name)
        if dt.kind not in NUMERIC_KINDS or dt.hasobject:
            raise ValueError(f"a step batch array of dtype {name}")
        if len(_DTYPES) < 256:
            _DTYPES[name] = dt
    return dt


def _int_table(cols: list[list[int]], a: int, e: int) -> np.ndarray:
    # fromiter refuses ints beyond int64 (OverflowError), as the writer's own request columns do.
    n = e - a
    src = cols if (a == 0 and all(len(c) == n for c in cols)) else [c[a:e] for c in cols]
    return np.fromiter(itertools.chain.from_iterable(src), np.int64, count=len(cols) * n).reshape(len(cols), n)


def batch_columns(b: StepBatch, layouts: list[tuple[list[LayoutEntry], dict[str, int]]] | None = None
                  ) -> Iterator[tables.StepColumns]:
    """Each step of a batch as the numpy columns `TraceWriter.write_columns` takes, in order; a step whose values
    cannot be stored raises when its turn comes, after the steps before it were yielded. `layouts` are the ones
    the same sender sent before (updated with the batch's); none for a stand-alone batch."""
    known = [] if layouts is None else layouts
    if b.first_layout > len(known):
        raise ValueError(f"a step batch continues layout {b.first_layout} of {len(known)}")
    del known[b.first_layout:]
    known += b.layouts
    num = b.num_requests
    req_off = [0, *itertools.accumulate(num)]
    total = req_off[-1]
    ni = len(INT_FIELDS)
    tok_off = [[0, *itertools.accumulate(lens)] for lens in b.request_ints[ni:]]
    try:
        table: np.ndarray | None = _int_table(b.request_ints, 0, total)
        tokens: list[np.ndarray] | None = [np.fromiter(v, np.int64, count=len(v)) for v in b.token_values]
    except (OverflowError, ValueError, TypeError):
        table = tokens = None  # one step's values do not fit: convert step by step, so the steps before it go in
    pv = np.frombuffer(b.pack_values, np.int64)
    pack_off = 0
    pack = 0
    array = 0
    rows = zip(*(getattr(b, f) for f in HEADER_FIELDS), strict=True)
    for i, row in enumerate(rows):
        a, e = req_off[i], req_off[i + 1]
        t = table[:, a:e] if table is not None else _int_table(b.request_ints, a, e)
        bounds = [(o[a], o[e]) for o in tok_off]
        if tokens is not None:
            parts = [v[x:y] for v, (x, y) in zip(tokens, bounds, strict=True)]
        else:
            parts = [np.fromiter(v[x:y], np.int64, count=y - x)
                     for v, (x, y) in zip(b.token_values, bounds, strict=True)]
        v = parts[0] if len(parts) == 1 else np.concatenate(parts) if parts else np.zeros(0, np.int64)
        arrays: list[tuple[str, str, tuple[int, ...], int, np.ndarray]] = []
        for li, n in zip(b.pack_layouts[pack:pack + b.num_packs[i]], b.pack_sizes[pack:pack + b.num_packs[i]],
                         strict=True):
            lay, crop = known[li]
            arrays += [(s.name, s.dtype, s.shape, s.data_ptr, s.values)
                       for s in unpack(pv[pack_off:pack_off + n], lay, crop)]  # fmt: skip
            pack_off += n
        pack += b.num_packs[i]
        for name, dtype, shape, ptr, vdt, vshape, data in b.arrays[array:array + b.num_arrays[i]]:
            arrays.append((name, dtype, shape, ptr, np.frombuffer(data, _dtype(vdt)).reshape(vshape)))
        array += b.num_arrays[i]
        yield tables.StepColumns(
            header=dict(zip(HEADER_FIELDS, row, strict=True)), table=tables.narrow_ints(t),
            values=tables.narrow_ints(v), arrays=arrays, spans=list(b.spans[i]), violations=list(b.violations[i]),
            waits=list(b.waits[i]), errors=list(b.errors[i]), faults_fired=list(b.faults_fired[i]),
        )  # fmt: skip


def batch_steps(b: StepBatch) -> list[Step]:
    """The schema Steps of a batch."""
    out = []
    ni = len(INT_FIELDS)
    for c in batch_columns(b):
        t = c.table.tolist()
        vals = c.values.tolist()
        n = len(t[0]) if t else 0
        tuples: dict[str, list[tuple[int, ...]]] = {}
        off = 0
        for k, f in enumerate(TUPLE_FIELDS):
            col = []
            for ln in t[ni + k]:
                col.append(tuple(vals[off:off + ln]))
                off += ln
            tuples[f] = col
        kws: list[dict[str, Any]] = [{f: t[j][r] for j, f in enumerate(INT_FIELDS)} for r in range(n)]
        for r, kw in enumerate(kws):
            kw.update({f: tuples[f][r] for f in TUPLE_FIELDS})
        reqs = [RequestState(**kw).to_dict() for kw in kws]
        arrays = [ArraySnapshot(nm, dt, tuple(sh), int(ptr), v) for nm, dt, sh, ptr, v in c.arrays]
        out.append(step_from_parts(c.header, reqs, arrays, [StreamSpan(*s).to_dict() for s in c.spans],
                                   c.violations, [StreamWait(*w).to_dict() for w in c.waits], c.errors,
                                   c.faults_fired))
    return out


# -- the recorder's compact step form (one step as a dict) ------------------------------------------------------


def unpack(flat: np.ndarray, layout: Sequence[Any], crop_cols: dict[str, int]) -> list[ArraySnapshot]:
    """Split a packed int64 snapshot back into its arrays (2-D tables cropped to their live columns)."""
    out, off = [], 0
    for name, dtype, shape, ptr in layout:
        n = int(np.prod(shape)) if shape else 1
        v = flat[off:off + n].astype(dtype).reshape(shape)
        off += n
        cols = crop_cols.get(name)
        if cols is not None and v.ndim == 2:
            v = v[:, :cols]
        out.append(ArraySnapshot(name, dtype, tuple(shape), int(ptr), np.ascontiguousarray(v)))
    return out


def _arrays(raw: dict[str, Any]) -> list[tuple[str, str, tuple[int, ...], int, np.ndarray]]:
    out = [(a.name, a.dtype, tuple(a.shape), a.data_ptr, a.values) for pack in raw.get("packs", ())
           for a in unpack(*pack)]  # fmt: skip
    out += [(str(n), str(dt), tuple(sh), int(ptr), v) for n, dt, sh, ptr, v in raw.get("arrays", ())]
    return out


def parts_from_raw(raw: dict[str, Any]) -> tables.StepParts:
    """The columns of a step in the recorder's compact form, without building per-request objects.

    Keys: `header` (Step.header_dict()), `requests` (columns: INT_FIELDS as int lists or arrays, optional
    `draft_tokens` / `accepted_tokens` lists of lists), `packs` ((flat int64 values, layout of (name, numpy dtype
    name, shape, data_ptr), crop_cols)) and `arrays` ((name, dtype, shape, data_ptr, values)), `spans` ((stream,
    name, start_ns, end_ns)), `violations` (Violation.to_dict()), and the optional `waits` ((stream, on_stream,
    on_span) or StreamWait dicts), `errors` ((call, error_type, message, fatal) or CallError dicts) and
    `faults_fired` (fault names)."""
    cols = raw.get("requests") or {}
    n = len(cols["request_id"]) if cols else 0
    ints: dict[str, Sequence[int]] = {}
    for c in INT_FIELDS:
        v = cols.get(c)
        ints[c] = [0] * n if v is None else (v.tolist() if isinstance(v, np.ndarray) else list(v))
    tup: dict[str, Sequence[Sequence[int]]] = {
        c: list(cols[c]) if cols.get(c) is not None and len(cols[c]) else [()] * n for c in TUPLE_FIELDS
    }
    return tables.StepParts(
        header=raw["header"], num_requests=n, int_cols=ints, tuple_cols=tup, arrays=_arrays(raw),
        spans=[(str(s[0]), str(s[1]), int(s[2]), int(s[3])) for s in raw.get("spans", ())],
        violations=list(raw.get("violations") or ()), waits=_wait_rows(raw.get("waits") or ()),
        errors=_error_dicts(raw.get("errors") or ()), faults_fired=[str(f) for f in raw.get("faults_fired") or ()],
    )  # fmt: skip


def step_from_raw(raw: dict[str, Any]) -> Step:
    """Build a schema Step from the recorder's compact form."""
    p = parts_from_raw(raw)
    ic, tc = p.int_cols, p.tuple_cols
    kws: list[dict[str, Any]] = [{c: int(ic[c][i]) for c in INT_FIELDS} for i in range(p.num_requests)]
    for i, kw in enumerate(kws):
        kw.update({c: tuple(int(t) for t in tc[c][i]) for c in TUPLE_FIELDS})
    reqs = [RequestState(**kw).to_dict() for kw in kws]
    arrays = [ArraySnapshot(name, dtype, tuple(shape), int(ptr), values)
              for name, dtype, shape, ptr, values in p.arrays]
    spans = [StreamSpan(*s).to_dict() for s in p.spans]
    waits = [StreamWait(*w).to_dict() for w in p.waits]
    return step_from_parts(p.header, reqs, arrays, spans, p.violations, waits, p.errors, p.faults_fired)


def raw_from_step(step: Step) -> dict[str, Any]:
    """The compact form of a schema Step (inverse of `step_from_raw`)."""
    cols: dict[str, Any] = {c: [getattr(r, c) for r in step.requests] for c in INT_FIELDS}
    for c in TUPLE_FIELDS:
        cols[c] = [list(getattr(r, c)) for r in step.requests]
    return dict(header=step.header_dict(), requests=cols,
                arrays=[(a.name, a.dtype, a.shape, a.data_ptr, a.values) for a in step.arrays],
                spans=[(s.stream, s.name, s.start_ns, s.end_ns) for s in step.spans],
                violations=[v.to_dict() for v in step.violations],
                waits=[(w.stream, w.on_stream, w.on_span) for w in step.waits],
                errors=[e.to_dict() for e in step.errors], faults_fired=list(step.faults_fired))
