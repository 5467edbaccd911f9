"""One recorded attention call, decoded from a step's arrays: what `replay` re-runs and the differential check
recomputes. Torch-free (numpy).

Steps recorded with `--record-attention N` carry layer 0's query `attn_q [n, Hq, D]`, the kernel's output
`attn_out [n, Hq*D]`, the KV pages the live rows touch `attn_kv [U, 2, Hkv, P, D]` with their ids
`attn_page_ids [U]`, the softmax scale `attn_scaling [1]`, and (recorders from schema 2 on) the kernel's
arguments `attn_call` (int64, fields `CALL_FIELDS`) and, for a masked verify call, the packed mask `attn_mask`
(uint16 stored as int16). The metadata tensors (page_table, cache_seqlens, cu_seqlens_*) are the step's
standard snapshots: the same tensors the kernel was handed. Older traces lack `attn_call`; their arguments are
derived from the mode and scalars exactly as the backend derives them (`RecordedCall.args_recorded` is False).

Width: recorders from this version on keep `attn_q`, `attn_out` and `attn_kv` at the width of the tensors they
came from and name that dtype in `attn_dtype` (uint8, the ASCII name): a bf16 or fp16 pool is stored as its raw
16-bit patterns (int16), float64 as int64 bits, float32 as it is. The decoder widens them exactly (bf16 bits << 16
are the float32 bits). A step without `attn_dtype` (older traces) holds float32 values.

Bundles store `attn_kv` as a delta against the previous bundled call of the same model (tracer/kv_delta.py);
`recorded_call` resolves it (tracer/kv_bases.py) from a cache of recently decoded calls, or through `fetch`, the
trace's reader (`TraceReader.kv_base`), which finds the base calls in the same trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import kv_delta
from .kv_bases import KvFetch, stored_kv
from .schema import ForwardMode, Step

UNIFORM = (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY)
# attn_call: the arguments of the kernel entry point the backend called for layer 0 (backend/trtllm_mha_backend.py).
CALL_FIELDS = ("entry", "q_len_per_req", "max_seq_len", "batch_size", "page_size", "num_tokens", "has_mask")
ENTRY_DECODE, ENTRY_CONTEXT = 0, 1  # kernels.decode (XQA / trtllm-gen) or kernels.context (FMHAv2 / prefill)
REQUIRED = ("attn_q", "attn_out", "attn_page_ids", "attn_scaling", "cache_seqlens", "page_table")
DTYPE_ARRAY = "attn_dtype"  # uint8: the ASCII name of the dtype attn_q / attn_out / attn_kv were recorded from
# The stored (integer bit pattern) dtype of each recorded width; float32 is stored as float32.
STORED_AS: dict[str, np.dtype[Any]] = {
    "bfloat16": np.dtype(np.int16), "float16": np.dtype(np.int16), "float32": np.dtype(np.float32),
    "float64": np.dtype(np.int64),
}  # fmt: skip


# What a replay compares, in report order (backend/replay.py computes them; the CLI prints them).
COMPARISONS = ("kernel-vs-reference", "recorded-vs-reference", "kernel-vs-truth")


class NoRecordedCall(ValueError):
    """The step has no (complete) recorded attention call; the message says which array is missing."""


@dataclass(frozen=True)
class RecordedCall:
    """Layer 0's attention call of one step, as recorded."""

    step: Step
    entry: str  # "decode" or "context"
    q: np.ndarray  # [n, Hq, D] float32
    out: np.ndarray  # [n, Hq, D] float32: what the kernel produced in the run
    kv: np.ndarray  # [U, 2, Hkv, P, D]
    page_ids: np.ndarray  # [U] physical page id of each kv page
    scaling: float
    page_table: np.ndarray  # [rows, W_recorded] physical page ids (only the live columns were recorded)
    page_table_width: int  # W of the tensor the kernel saw
    cache_seqlens: np.ndarray  # [rows]
    cu_seqlens_q: np.ndarray | None
    cu_seqlens_k: np.ndarray | None
    q_len_per_req: int  # decode: q_len_per_req; context: max_q_len
    max_seq_len: int  # decode: max_seq_len; context: max_kv_len
    batch_size: int  # context: batch_size argument; decode: rows the kernel forms (num_tokens // q_len_per_req)
    page_size: int
    mask: np.ndarray | None  # uint16 [rows, T, words*2] when the call passed one (recorded), else None
    has_mask: bool  # the call passed a mask (recorded, or derived: verify with q_len_per_req > 1)
    args_recorded: bool  # True: from attn_call; False: derived from mode and scalars (older traces)
    recorded_dtype: str = "float32"  # the dtype of the tensors q / out / kv came from (widened exactly here)

    @property
    def num_q_heads(self) -> int:
        """Hq."""
        return int(self.q.shape[1])

    def token_rows(self) -> list[tuple[int, int]]:
        """(first token, tokens) of each live request in q, by the request's own query length (not the kernel's)."""
        out, t = [], 0
        for r in self.step.requests:
            out.append((t, int(r.num_q_tokens)))
            t += int(r.num_q_tokens)
        return out

    def kernel_rows(self) -> list[tuple[int, int]]:
        """(first token, tokens) of each live row as the kernel groups q: q_len_per_req tokens per row (decode),
        or cu_seqlens_q (context)."""
        bs = self.step.batch_size
        if self.entry == "decode":
            ql = self.q_len_per_req
            return [(b * ql, ql) for b in range(bs)]
        cu = self.cu_seqlens_q
        assert cu is not None
        return [(int(cu[b]), int(cu[b + 1] - cu[b])) if b + 1 < len(cu) else (0, 0) for b in range(bs)]


def has_recorded_call(step: Step) -> bool:
    """True when the step carries the arrays of a recorded attention call."""
    return step.array("attn_q") is not None


def recorded_dtype(step: Step) -> str:
    """The dtype name the step's attention tensors were recorded from ("float32" for traces without the tag)."""
    tag = step.array(DTYPE_ARRAY)
    if tag is None:
        return "float32"
    try:
        return bytes(np.asarray(tag.values, dtype=np.uint8).reshape(-1)).decode("ascii")
    except (ValueError, UnicodeDecodeError):
        raise NoRecordedCall(f"step {step.index}: {DTYPE_ARRAY} is not an ASCII dtype name") from None


def widen(values: np.ndarray, dtype_name: str, what: str = "array") -> np.ndarray:
    """Stored values of a recorded tensor as float32 (float64 for a float64 source), exactly.

    bf16 bits are the top half of the float32 with the same value, so shifting them up 16 bits is exact."""
    stored = STORED_AS.get(dtype_name)
    if stored is None:
        raise NoRecordedCall(f"{what} was recorded from {dtype_name!r}, which this specscope cannot widen")
    v = np.asarray(values)
    if dtype_name == "float32":
        return np.asarray(v, dtype=np.float32)  # older traces: float32 (or anything numeric) as it is
    if v.dtype.itemsize != stored.itemsize or v.dtype.kind not in "iu":
        raise NoRecordedCall(f"{what} is tagged {dtype_name} but holds {v.dtype} values")
    v = np.ascontiguousarray(v)
    if dtype_name == "bfloat16":
        return (v.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if dtype_name == "float16":
        return v.view(np.float16).astype(np.float32)
    return v.view(np.float64)


def recorded_call(step: Step, fetch: KvFetch | None = None) -> RecordedCall:
    """Decode the recorded call of `step` (NoRecordedCall when it has none).

    `fetch(i)` returns step i of the same trace (`TraceReader.kv_base`): a bundle's delta-coded KV is resolved
    through it where the recently decoded calls do not reach (without it, only through those)."""
    a = {x.name: x for x in step.arrays}
    if "attn_q" not in a:
        raise NoRecordedCall(f"step {step.index} has no recorded attention call (record with --record-attention 1)")
    missing = [n for n in REQUIRED if n not in a]
    if "attn_kv" not in a and kv_delta.REF not in a:
        missing.insert(0, "attn_kv")
    if missing:
        raise NoRecordedCall(f"step {step.index}: the recorded attention call lacks {missing[0]}")
    dt = recorded_dtype(step)
    try:
        q = widen(kv_delta.raw_values(step, "attn_q"), dt, "attn_q")
        out = widen(kv_delta.raw_values(step, "attn_out"), dt, "attn_out").reshape(q.shape)
        kv_stored = stored_kv(step, fetch)
    except kv_delta.DeltaError as e:
        raise NoRecordedCall(f"step {step.index}: {e}") from None
    kv = widen(kv_stored, dt, "attn_kv")
    pt = a["page_table"]
    cu_q = a["cu_seqlens_q"].values if "cu_seqlens_q" in a else None
    cu_k = a["cu_seqlens_k"].values if "cu_seqlens_k" in a else None
    call = a.get("attn_call")
    mask = None
    if call is not None:
        f = dict(zip(CALL_FIELDS, (int(x) for x in call.values), strict=False))
        entry = "decode" if f["entry"] == ENTRY_DECODE else "context"
        ql, max_len, batch, page = f["q_len_per_req"], f["max_seq_len"], f["batch_size"], f["page_size"]
        has_mask = bool(f.get("has_mask", 0))
        if "attn_mask" in a:
            mask = np.ascontiguousarray(a["attn_mask"].values).view(np.uint16)
    else:
        entry = "decode" if step.mode in UNIFORM else "context"
        if entry == "decode":
            # What forward_decode / forward_extend pass: q_len_per_req 1 for (draft) decode, the kernel's q_len
            # (captured inside a graph) for verify; batch = num_tokens // q_len_per_req.
            ql = step.scalars.get("kernel_q_len", 1) if step.mode == ForwardMode.TARGET_VERIFY else 1
            batch = q.shape[0] // max(ql, 1)
        else:
            ql = step.scalars.get("kernel_q_len", step.scalars.get("max_seq_len_q", 1))
            batch = (a["cu_seqlens_q"].shape[0] - 1) if "cu_seqlens_q" in a else step.padded_batch_size
        max_len = step.scalars.get("max_context_len", 0)
        page = step.page_size
        has_mask = step.mode == ForwardMode.TARGET_VERIFY and ql > 1
    return RecordedCall(
        step=step, entry=entry, q=q, out=out, kv=kv,
        page_ids=np.asarray(a["attn_page_ids"].values).astype(np.int64),
        scaling=float(np.asarray(a["attn_scaling"].values).reshape(-1)[0]),
        page_table=np.asarray(pt.values), page_table_width=int(pt.shape[1]) if len(pt.shape) == 2 else 0,
        cache_seqlens=np.asarray(a["cache_seqlens"].values), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
        q_len_per_req=int(ql), max_seq_len=int(max_len), batch_size=int(batch), page_size=int(page),
        mask=mask, has_mask=has_mask, args_recorded=call is not None, recorded_dtype=dt,
    )  # fmt: skip
