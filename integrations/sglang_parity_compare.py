"""The comparison of upstream parity: one prepared forward's metadata as plain values, upstream's against ours,
field by field.

Fields compared for every prepared forward (the metadata the kernels consume):

- `cache_seqlens_int32`, `cu_seqlens_q`, `cu_seqlens_k`: values over all rows the kernel runs (padded rows too),
  and their dtypes (`*.dtype`);
- `max_seq_len_q`, `max_seq_len_k`: the Python scalars (`max_seq_len_k` only where the release has it: from 0.5.14
  upstream's metadata has no such field, and it is compared as absent, `(absent)` in the table);
- `page_table`: the row count, and for every row b the columns j < ceil(cache_seqlens[b] / P) the kernel reads
  (upstream's lengths);
- `kernel_q_len`: the q length the kernels run with: the live `max_seq_len_q` eagerly, the value frozen at
  capture for a graph;
- `reuses_capture_tensors` (replay only): the metadata object and every tensor address are the ones bound at
  capture.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..tracer.schema import ForwardMode

FIELDS = ("cache_seqlens_int32", "cache_seqlens_int32.dtype", "cu_seqlens_q", "cu_seqlens_q.dtype", "cu_seqlens_k",
          "cu_seqlens_k.dtype", "max_seq_len_q", "max_seq_len_k", "page_table", "kernel_q_len",
          "reuses_capture_tensors")
_TENSORS = ("cache_seqlens_int32", "cu_seqlens_q", "cu_seqlens_k", "page_table")


def tensor_ptrs(md: Any) -> dict[str, int]:
    """The device address of each compared tensor a metadata object holds."""
    return {n: getattr(md, n).data_ptr() for n in _TENSORS if getattr(md, n, None) is not None}


class _Absent:
    """The value of a metadata field the release does not have (not a made-up value)."""

    def __repr__(self) -> str:
        return "absent"


ABSENT: Any = _Absent()


@dataclass
class Snapshot:
    """One prepared forward's metadata, as plain values."""

    values: dict[str, Any]


def snapshot(md: Any, *, kernel_q_len: int | None, reuses: bool | None) -> Snapshot:
    """The compared fields of a metadata object (upstream's `TRTLLMMHAMetadata` or ours)."""
    v: dict[str, Any] = {}
    if md is None:  # the backend prepared nothing for this mode (0.5.12 has no DRAFT_EXTEND_V2 graph path)
        v = {f: None for f in FIELDS}
        v["page_table"] = torch.zeros(0, 0, dtype=torch.int32)
        return Snapshot(v)
    for n in ("cache_seqlens_int32", "cu_seqlens_q", "cu_seqlens_k"):
        t = getattr(md, n)
        v[n] = None if t is None else t.detach().cpu().tolist()
        v[n + ".dtype"] = None if t is None else str(t.dtype)
    v["max_seq_len_q"] = int(md.max_seq_len_q)
    v["max_seq_len_k"] = int(md.max_seq_len_k) if hasattr(md, "max_seq_len_k") else ABSENT
    v["page_table"] = torch.zeros(0, 0, dtype=torch.int32) if md.page_table is None else md.page_table.detach().cpu()
    v["kernel_q_len"] = None if kernel_q_len is None else int(kernel_q_len)
    v["reuses_capture_tensors"] = reuses
    return Snapshot(v)


def diff(ref: Snapshot, got: Snapshot, page_size: int) -> set[str]:
    """Fields where `got` (ours) differs from `ref` (upstream); a field upstream does not have is not compared."""
    out = {f for f in FIELDS if f != "page_table" and ref.values[f] is not ABSENT
           and ref.values[f] != got.values[f]}
    a, b, lens = ref.values["page_table"], got.values["page_table"], ref.values["cache_seqlens_int32"] or []
    if a.shape[0] != b.shape[0]:
        out.add("page_table")
    else:
        for row, n in enumerate(lens):
            cols = -(-int(n) // page_size)
            if cols > a.shape[1] or cols > b.shape[1] or not torch.equal(a[row, :cols], b[row, :cols]):
                out.add("page_table")
                break
    return out


@dataclass
class Comparison:
    """One forward prepared by both backends."""

    mode: ForwardMode
    phase: str
    step_id: int | None
    batch_size: int  # live rows
    padded_batch_size: int
    page_size: int
    K: int
    T: int
    differs: set[str]
    detail: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    def describe(self) -> str:
        """One line naming the forward and what differs."""
        sid = "" if self.step_id is None else f" #{self.step_id}"
        parts = [f"{f}: upstream {self.detail[f][0]!r} ours {self.detail[f][1]!r}" for f in sorted(self.differs)
                 if f in self.detail]
        return (f"{self.mode.value}{sid} {self.phase} bs {self.batch_size}/{self.padded_batch_size} P={self.page_size} "
                f"K={self.K} T={self.T}: " + "; ".join(parts))


def record(cmp: list[Comparison], mode: ForwardMode, phase: str, step_id: int | None, bs: int, pbs: int,
           ref: Snapshot, got: Snapshot, p: int, k: int, t: int) -> None:
    """Compare one forward's two snapshots and append the result to `cmp`."""
    d = diff(ref, got, p)
    detail = {f: (ref.values[f], got.values[f]) for f in d if f != "page_table"}
    cmp.append(Comparison(mode, phase, step_id, bs, pbs, p, k, t, d, detail))

