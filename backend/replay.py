"""Replay one recorded attention call: rebuild its inputs (q, the KV pages it read, the metadata it was handed),
run the same kernel entry point on the chosen device and the pure-torch reference, and compare per request and
head.

Three comparisons, each per live request and query head (max abs diff, relative diff = ||a - b|| / ||b||):

- `kernel` vs `reference`: the replayed kernel against the reference kernel given the same arguments (the
  differential check's D1, re-run): does the kernel compute what its arguments say?
- `recorded` vs `reference`: the output the kernel produced in the run against the same reference.
- `kernel` vs `truth`: each query token at position p against attention over positions [0, p] of its own
  request (through req_to_token and positions; D2): is the output right for the sequence, whatever the
  metadata said? A fault such as a wrong q_len_per_req shows here.

The KV pages are the recorded ones (`attn_kv`) in a compact cache; pages the call would read but the recorder did
not keep (none for the live rows of a well-formed call) map to a zero page and are reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..tracer.attention_call import RecordedCall
from ..tracer.differential import REL_TOL
from .reference_attention import ReferenceKernels, gather_kv
from .spec_mask import packed_causal_mask


@dataclass(frozen=True)
class HeadDiff:
    """One comparison for one request and head."""

    request_id: int
    row: int
    head: int
    comparison: str
    max_abs: float
    rel: float


@dataclass
class ReplayResult:
    """Everything `specscope replay` prints."""

    step: int
    kernel: str  # the kernel set that ran (e.g. "reference", "xqa+fmha_v2")
    device: str
    entry: str
    args: dict[str, Any]
    args_recorded: bool
    tol: float
    diffs: list[HeadDiff] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def worst(self, comparison: str) -> float:
        """Largest relative difference of one comparison (0 when nothing was compared)."""
        return max((d.rel for d in self.diffs if d.comparison == comparison), default=0.0)

    @property
    def agrees(self) -> bool:
        """True when every comparison stays within tolerance (NaN counts as disagreement)."""
        return all(d.rel <= self.tol for d in self.diffs)


def kernels_for(device: str, attention_kernel: str) -> Any:
    """The kernel set to replay with: the reference kernels on the CPU, the run's flashinfer set on CUDA."""
    if device == "cpu":
        return ReferenceKernels()
    from .flashinfer_kernels import make_flashinfer_kernels

    prefill = attention_kernel.split("+", 1)[1] if "+" in attention_kernel else "fmha_v2"
    prefill = prefill if prefill in ("fmha_v2", "flashinfer") else "fmha_v2"
    return make_flashinfer_kernels(torch.device(device), prefill=prefill)


def _dtype(name: str | None, device: str) -> torch.dtype:
    table = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64}
    if device != "cpu":
        return table.get(name or "", torch.bfloat16) if name in ("bfloat16", "float16") else torch.bfloat16
    return torch.float32


def _compact(call: RecordedCall, dev: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, dict[int, int], int]:
    """The recorded pages as a KV cache `[U + 1, 2, Hkv, P, D]`, the page id -> slot map, and the zero page's slot."""
    kv = torch.from_numpy(np.array(call.kv, dtype=np.float32))  # a writable copy
    zero = torch.zeros((1, *kv.shape[1:]), dtype=kv.dtype)
    cache = torch.cat([kv, zero]).to(device=dev, dtype=dtype)
    return cache, {int(p): i for i, p in enumerate(call.page_ids)}, kv.shape[0]


def _remap(table: np.ndarray, index: dict[int, int], zero: int) -> np.ndarray:
    flat = np.array([index.get(int(p), zero) for p in table.reshape(-1)], dtype=np.int32)
    return flat.reshape(table.shape)


def run_call(call: RecordedCall, kernels: Any, dev: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, list[str]]:
    """Run `kernels` on the recorded call's inputs; returns float32 `[n, Hq, D]` and notes on unrecorded pages."""
    cache, index, zero = _compact(call, dev, dtype)
    p = call.page_size
    rows, width = call.cache_seqlens.shape[0], call.page_table_width or call.page_table.shape[1]
    table = np.full((rows, max(width, 1)), -1, dtype=np.int64)
    rec = call.page_table[:rows]
    table[: rec.shape[0], : rec.shape[1]] = rec
    notes = []
    for b in range(min(call.step.batch_size, rows)):
        need = -(-int(call.cache_seqlens[b]) // p)
        cols = table[b, :need]
        unknown = [int(x) for x in cols if int(x) not in index]
        if unknown:
            notes.append(f"row {b} reads {len(unknown)} page(s) the recorder did not keep "
                         f"(ids {unknown[:4]}{'...' if len(unknown) > 4 else ''}); replayed as zeros")
    pt = torch.from_numpy(_remap(table, index, zero)).to(dev)
    cs = torch.from_numpy(np.array(call.cache_seqlens, dtype=np.int32)).to(dev)
    q = torch.from_numpy(np.array(call.q)).to(device=dev, dtype=dtype)
    if call.entry == "decode":
        mask = None
        if call.has_mask:
            if call.mask is not None:
                m16 = np.ascontiguousarray(call.mask).view(np.int16)
                mask = torch.zeros(m16.shape, dtype=torch.int16)  # fresh strides: an empty from_numpy has stride 0
                if m16.size:
                    mask.copy_(torch.from_numpy(m16.copy()))
                mask = mask.view(torch.uint16).to(dev)
            else:
                mask = packed_causal_mask(max(q.shape[0] // call.q_len_per_req, 1), call.q_len_per_req, dev)
        out = kernels.decode(q, cache, pt, cs, q_len_per_req=call.q_len_per_req, page_size=p, scaling=call.scaling,
                             mask=mask, max_seq_len=call.max_seq_len)
    else:
        cu_q = torch.from_numpy(np.array(call.cu_seqlens_q, dtype=np.int32)).to(dev)
        cu_k = torch.from_numpy(np.array(call.cu_seqlens_k, dtype=np.int32)).to(dev)
        out = kernels.context(q, cache, pt, cs, cu_q, cu_k, max_q_len=call.q_len_per_req, max_kv_len=call.max_seq_len,
                              batch_size=call.batch_size, page_size=p, scaling=call.scaling)
    return out.reshape(q.shape).float().cpu(), notes


def ground_truth(call: RecordedCall) -> tuple[torch.Tensor, list[str]]:
    """float32 `[n, Hq, D]`: each live request's tokens against its own KV (req_to_token page starts, positions);
    tokens of padded rows stay zero."""
    step = call.step
    arrays = {a.name: a.values for a in step.arrays}
    q = torch.from_numpy(np.array(call.q))
    out = torch.zeros_like(q)
    notes: list[str] = []
    if "positions" not in arrays or "req_to_token_page_starts" not in arrays:
        return out, ["no positions / req_to_token page starts recorded: no ground truth"]
    pos_all = np.asarray(arrays["positions"], dtype=np.int64)
    starts = np.asarray(arrays["req_to_token_page_starts"], dtype=np.int64)
    cache, index, _ = _compact(call, torch.device("cpu"), torch.float32)
    p = call.page_size
    for b, (t0, tn) in enumerate(call.token_rows()):
        if tn == 0 or t0 + tn > q.shape[0] or t0 + tn > pos_all.shape[0]:
            continue
        pos = torch.from_numpy(pos_all[t0 : t0 + tn].copy())
        last = int(pos.max()) + 1
        n_pages = -(-last // p)
        if n_pages > starts.shape[1]:
            notes.append(f"row {b}: positions reach page {n_pages - 1}, past the recorded req_to_token columns")
            continue
        ids = [int(s) // p for s in starts[b, :n_pages]]
        if any(i not in index for i in ids):
            notes.append(f"row {b}: its own KV pages were not all recorded; no ground truth")
            continue
        k, v = gather_kv(cache, torch.tensor([index[i] for i in ids]), last)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[t0 : t0 + tn].float(), k) * call.scaling
        visible = torch.arange(last)[None, :] <= pos[:, None]
        s = s.masked_fill(~visible[None], float("-inf"))
        out[t0 : t0 + tn] = torch.einsum("hqk,khd->qhd", torch.softmax(s, dim=-1), v)
    return out, notes


def _compare(name: str, a: torch.Tensor, b: torch.Tensor, call: RecordedCall, skip: set[int]) -> list[HeadDiff]:
    out = []
    for row, ((t0, tn), r) in enumerate(zip(call.token_rows(), call.step.requests, strict=False)):
        if tn == 0 or row in skip or t0 + tn > a.shape[0]:
            continue
        x, y = a[t0 : t0 + tn].double(), b[t0 : t0 + tn].double()
        for h in range(a.shape[1]):
            d = (x[:, h] - y[:, h]).abs()
            den = float(torch.linalg.norm(y[:, h]))
            num = float(torch.linalg.norm(x[:, h] - y[:, h]))
            rel = num / den if den else num
            out.append(HeadDiff(r.request_id, row, h, name, float(d.max()), rel if rel == rel else float("inf")))
    return out


def replay(call: RecordedCall, device: str, attention_kernel: str, dtype_name: str | None,
           tol: float = REL_TOL) -> ReplayResult:
    """Replay `call` on `device` ("cpu" or "cuda[:i]") and compare the kernel, the run's output and the reference."""
    dev = torch.device(device)
    kernels = kernels_for("cpu" if dev.type == "cpu" else device, attention_kernel)
    dtype = _dtype(dtype_name, dev.type)
    args = {"q_len_per_req" if call.entry == "decode" else "max_q_len": call.q_len_per_req,
            "max_seq_len" if call.entry == "decode" else "max_kv_len": call.max_seq_len,
            "batch_size": call.batch_size, "page_size": call.page_size, "scaling": round(call.scaling, 6),
            "mask": "packed causal (uint16)" if call.has_mask else None, "q": list(call.q.shape),
            "kv_pages": int(call.kv.shape[0]), "dtype": str(dtype).replace("torch.", "")}
    res = ReplayResult(call.step.index, kernels.name, str(dev), call.entry, args, call.args_recorded, tol)
    if dev.type != "cpu" and kernels.name != attention_kernel:
        res.notes.append(f"the run used the {attention_kernel} kernels; this GPU runs {kernels.name}")
    got, notes = run_call(call, kernels, dev, dtype)
    ref, _ = run_call(call, ReferenceKernels(), torch.device("cpu"), torch.float32)
    truth, tnotes = ground_truth(call)
    res.notes += notes + tnotes
    recorded = torch.from_numpy(np.array(call.out))
    no_truth = {int(n.split()[1].rstrip(":")) for n in tnotes if n.startswith("row ")}
    res.diffs += _compare("kernel-vs-reference", got, ref, call, set())
    res.diffs += _compare("recorded-vs-reference", recorded, ref, call, set())
    res.diffs += _compare("kernel-vs-truth", got, truth, call, no_truth)
    return res


def device_problem(device: str) -> str | None:
    """Why `device` cannot run a replay here (one sentence), or None."""
    if device != "cpu" and not torch.cuda.is_available():
        return f"--device {device}: torch sees no CUDA device here (use --device cpu)"
    return None
