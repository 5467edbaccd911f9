"""One SGLang prep call as a step's facts: which forward it is, its header, the scalars the checks read, the tensors
the kernels consumed (to snapshot), and, once those snapshots have landed, its request rows.

Facts taken from where SGLang puts them: a replay view carries the padded static `seq_lens` / `req_pool_indices` but
the live `out_cache_loc` (and no positions for the target verify), so the live rows' positions come from the spec
input and padded rows are recorded as the runner's static buffer holds them after replay's copy (zeros). The live
batch size of a replay is the live token count over T. Draft decode step i runs at positions S + i and writes
column i of the request-major `out_cache_loc` (`[bs, num_steps]`). SGLang's backend sees no request ids: a row's id
is SGLang's rid when the batch carries it, else its req slot and a generation.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..tracer.schema import ForwardMode, GraphPhase

FIXUP = "update_verify_buffers_to_fill_after_draft"
IN_GRAPH = "init_forward_metadata_in_graph"
NP_DTYPES = {torch.int32: "int32", torch.int64: "int64", torch.int16: "int16", torch.uint8: "uint8",
             torch.bool: "bool", torch.float32: "float32"}
CROPPED = ("page_table", "req_to_token_page_starts")  # 2-D tables stored with their live columns only


@dataclass
class Prep:
    """What one prep call was given, normalized across SGLang's APIs."""

    phase: GraphPhase
    fb: Any  # a ForwardBatch or view: forward_mode, batch_size, seq_lens, seq_lens_cpu, req_pool_indices, ...
    num_tokens: int | None = None  # capture: tokens the graph is captured for
    in_capture: bool = False


def mode_of(fb: Any) -> ForwardMode | None:
    """The forward mode of a batch as specscope names it (None: an idle batch, nothing to record)."""
    m = fb.forward_mode
    name = getattr(m, "name", str(m))
    if name in ("DECODE", "IDLE"):
        if name == "IDLE":
            return None
        return ForwardMode.DRAFT_DECODE if getattr(fb, "spec_info", None) is not None else ForwardMode.DECODE
    return {"TARGET_VERIFY": ForwardMode.TARGET_VERIFY, "DRAFT_EXTEND": ForwardMode.DRAFT_EXTEND,
            "DRAFT_EXTEND_V2": ForwardMode.DRAFT_EXTEND, "EXTEND": ForwardMode.EXTEND,
            "MIXED": ForwardMode.EXTEND}.get(name)


def _pad(t: torch.Tensor | None, n: int) -> torch.Tensor | None:
    """`t` as a static buffer of n entries holds it after replay's zero-then-copy."""
    if t is None:
        return None
    t = t.reshape(-1)
    if t.shape[0] >= n:
        return t[:n]
    out = torch.zeros(n, dtype=t.dtype, device=t.device)
    out[: t.shape[0]] = t
    return out


def snapshot_entry(name: str, t: torch.Tensor) -> tuple[str, torch.Tensor, str, int]:
    """A tensor as `Probe.snapshot_tensors` takes it: its name, itself, its numpy dtype name and the address recorded
    (a host tensor's only when it holds something)."""
    dtype = NP_DTYPES.get(t.dtype, str(t.dtype).replace("torch.", ""))
    return name, t, dtype, t.data_ptr() if t.device.type == "cuda" or t.numel() else 0


@dataclass
class StepFacts:
    """A step as one prep call tells it, before its snapshots land."""

    header: dict[str, Any]  # Probe.begin_step's keyword arguments
    start_ns: int
    end_ns: int
    scalars: dict[str, int]
    tensors: list[tuple[str, torch.Tensor, str, int]]  # to snapshot (snapshot_entry)
    crop: dict[str, int]  # live columns of the 2-D tables
    crop_live: bool  # crop them by the recorded cache_seqlens once landed (no max_seq_len_k to crop by)
    hidden: bool  # the tensors only build request rows: the step carries no arrays (a 0.5.15+ replay)
    req_args: tuple[Any, ...] | None  # (mode, live rows or None, T, model, extend lengths, rids): rows once landed
    draft_tokens: torch.Tensor | None  # a verify's drafts as its spec input holds them at the prep
    errors: list[tuple[str, BaseException]] = field(default_factory=list)


class StepBuilder:
    """Turns prep calls into `StepFacts`, keeping what one call leaves for the next: the q length and tokens per
    request frozen at each graph's capture, the iteration count, the last mode, the compute stream."""

    def __init__(self, note_feature: Callable[[str, str, str], None]) -> None:
        self._note = note_feature
        self._frozen: dict[tuple[int, str, int], int] = {}  # (backend id, mode, bs) -> q len frozen at capture
        self._capture_tokens: dict[tuple[int, str, int], int] = {}  # 0.5.12 replays: tokens per request
        self._iteration = 0
        self._last_mode: ForwardMode | None = None
        self.compute_stream: Any = None  # the stream draft decode runs on (its spans are "compute", others "plan")

    def stream_name(self, mode: ForwardMode, stream: Any) -> str:
        """The trace's name for the stream a prep ran on."""
        if mode == ForwardMode.DRAFT_DECODE and self.compute_stream is None:
            self.compute_stream = stream
        return "compute" if self.compute_stream is None or stream == self.compute_stream else "plan"

    def build(self, be: Any, mode: ForwardMode, prep: Prep, start_ns: int, error: BaseException | None, live: Any,
              wrapper_ctx: Any, *, with_metadata: bool = True) -> StepFacts:
        """A step's facts from the call and the backend; `with_metadata=False`: the metadata the kernels read is
        not known to Python at this point (a 0.5.15+ replay), so the step carries no arrays or metadata scalars,
        only what builds its header and request rows."""
        fb = prep.fb
        md = getattr(be, "forward_metadata", None) if with_metadata else None
        wrapper, wrapper_fb = wrapper_ctx or (None, None)
        bs = int(fb.batch_size)
        P = int(be.page_size)
        key = (id(be), mode.value, bs)
        T = self._tokens_per_request(fb, mode, prep, key, bs)
        if prep.phase == GraphPhase.CAPTURE:
            self._capture_tokens[key] = T
        # Live rows: a replay's out_cache_loc (or live batch) is unpadded.
        raw_bs: int | None = bs
        src = live if live is not None else fb
        if getattr(src, "out_cache_loc", None) is None and wrapper_fb is not None:
            src = wrapper_fb  # 0.5.12's wrapper passes its step backends bare arguments
        loc = getattr(src, "out_cache_loc", None)
        n_steps = getattr(wrapper, "speculative_num_steps", None)
        if prep.phase == GraphPhase.REPLAY:
            raw_bs = None
            if live is not None:
                raw_bs = int(live.batch_size)
            elif loc is not None and mode == ForwardMode.DRAFT_DECODE and n_steps:
                raw_bs = int(loc.numel()) // n_steps
            elif loc is not None and mode == ForwardMode.DRAFT_EXTEND and getattr(fb, "input_ids", None) is not None:
                raw_bs = int(fb.input_ids.shape[0]) // max(T, 1)
            elif loc is not None and mode != ForwardMode.EXTEND:
                raw_bs = int(loc.numel()) // max(T, 1)
            if raw_bs is not None:
                raw_bs = max(1, min(raw_bs, bs))
        # Unknown (0.5.12's replay API without a live batch): the rows before the first reserved slot 0, counted
        # from the recorded req_pool_indices when the step is written (no host sync here).
        rows = raw_bs if raw_bs is not None else bs
        step_id = int(be.speculative_step_id) if mode == ForwardMode.DRAFT_DECODE else None
        seq = fb.seq_lens[:bs]
        # The host mirror as the batch carries it: 0.5.14+ backends do not ask for one (needs_cpu_seq_lens =
        # False) and spec-v2 batches then hold None, which is recorded as absent, not rebuilt from the device.
        seq_cpu = fb.seq_lens_cpu[:bs] if getattr(fb, "seq_lens_cpu", None) is not None else None
        rpi = fb.req_pool_indices[:bs]
        # Positions and KV write slots of the tokens the kernels run.
        n_tok = bs * T if mode != ForwardMode.EXTEND else None
        pos = getattr(src, "positions", None)
        if pos is None and getattr(fb, "spec_info", None) is not None:
            pos = getattr(fb.spec_info, "positions", None)
        if mode == ForwardMode.DRAFT_DECODE:
            assert step_id is not None, "a draft decode has its step id"
            if loc is not None and n_steps and loc.numel() == rows * n_steps:
                loc = loc.reshape(rows, n_steps)[:, step_id]
            elif loc is not None and loc.numel() != rows:
                loc = None
            if pos is not None:
                pos = pos.reshape(-1)[:rows] + step_id
        if n_tok is not None:
            pos = _pad(pos, n_tok) if pos is not None and pos.numel() <= n_tok else None
            loc = _pad(loc, n_tok) if loc is not None and loc.numel() <= n_tok else None
        if mode == ForwardMode.DRAFT_DECODE and pos is not None and rows < bs:
            pos[rows:] = 0
        scalars: dict[str, int] = {}
        if with_metadata:
            scalars.update(seq_len_fill_value=int(be.get_cuda_graph_seq_len_fill_value()),
                           backend_num_draft_tokens=int(be.speculative_num_draft_tokens or 1),
                           max_context_len=int(be.max_context_len), speculative_step_id=int(be.speculative_step_id))
            if seq_cpu is not None:
                scalars["seq_lens_cpu_max"] = int(seq_cpu.max()) if seq_cpu.numel() else 0
        arrays: list[tuple[str, torch.Tensor]] = []
        pt = None
        if md is not None and getattr(md, "cache_seqlens_int32", None) is not None:
            self._metadata_scalars(md, prep, key, scalars)
            for name, attr in (("cache_seqlens", "cache_seqlens_int32"), ("cu_seqlens_q", "cu_seqlens_q"),
                               ("cu_seqlens_k", "cu_seqlens_k"), ("page_table", "page_table")):
                t = getattr(md, attr, None)
                if t is not None:
                    arrays.append((name, t))
            pt = getattr(md, "page_table", None)
            self._step_features(md)
        r2t = be.req_to_token
        crop_live = False
        if "max_seq_len_k" in scalars:
            width = -(-int(scalars["max_seq_len_k"]) // P)
        else:
            # Without max_seq_len_k the live width is the recorded cache_seqlens' (cropped on the host once the
            # copies land: no sync here). Up to a bound from the host mirror when there is one, else all.
            crop_live = md is not None
            width = int(pt.shape[1]) if isinstance(pt, torch.Tensor) and pt.dim() == 2 else 0
            if seq_cpu is not None and seq_cpu.numel():
                bound = -(-(int(seq_cpu.max()) + T + int(getattr(be, "speculative_step_id", 0) or 0) + 1) // P)
                width = min(width, bound) if width else bound
            width = min(width, -(-int(r2t.shape[1]) // P))
        arrays += [("seq_lens", seq), ("req_pool_indices", rpi)]
        if seq_cpu is not None:
            arrays.append(("seq_lens_cpu", seq_cpu))
        if pos is not None:
            arrays.append(("positions", pos))
        if loc is not None:
            arrays.append(("out_cache_loc", loc))
        if with_metadata:
            cols = torch.arange(0, width * P, P, device=r2t.device)
            arrays.append(("req_to_token_page_starts", r2t[rpi.to(r2t.device).long()[:, None], cols[None, :]]))
        spec = getattr(src, "spec_info", None) or getattr(fb, "spec_info", None)
        tok = getattr(spec, "draft_token", None) if mode == ForwardMode.TARGET_VERIFY else None
        acc = getattr(spec, "num_accept_tokens", None) if mode == ForwardMode.DRAFT_EXTEND else None
        if isinstance(acc, torch.Tensor):
            arrays.append(("accept_lens", acc.reshape(-1)[:rows]))
        self._count_iteration(mode, prep, step_id)
        model = getattr(be, "_specscope_model", "draft" if mode in (ForwardMode.DRAFT_DECODE,
                                                                     ForwardMode.DRAFT_EXTEND) else "target")
        header = dict(iteration=-1 if prep.phase == GraphPhase.CAPTURE else self._iteration, mode=mode, model=model,
                      step_id=step_id, batch_size=rows, padded_batch_size=bs, graph=prep.phase,
                      tokens_per_request=T, num_draft_tokens=int(be.speculative_num_draft_tokens or 1), page_size=P)
        req_args = None
        if prep.phase != GraphPhase.CAPTURE:  # a capture runs on fill values, not requests: no request rows
            ext = getattr(fb, "extend_seq_lens_cpu", None)
            req_args = (mode, raw_bs, T, model, None if ext is None else list(ext), getattr(fb, "rids", None))
        facts = StepFacts(header=header, start_ns=start_ns, end_ns=time.perf_counter_ns(), scalars=scalars,
                          tensors=[snapshot_entry(n, t) for n, t in arrays if t is not None],
                          crop={name: width for name in CROPPED}, crop_live=crop_live, hidden=not with_metadata,
                          req_args=req_args,
                          draft_tokens=tok if isinstance(tok, torch.Tensor) and prep.phase != GraphPhase.CAPTURE
                          else None)
        if error is not None:
            facts.errors.append((getattr(error, "_specscope_call", "init_forward_metadata"), error))
        return facts

    def _tokens_per_request(self, fb: Any, mode: ForwardMode, prep: Prep, key: tuple[int, str, int], bs: int) -> int:
        """T: tokens per request of this forward, from what the call was given."""
        if mode in (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE):
            return 1
        if mode == ForwardMode.EXTEND:
            ext = getattr(fb, "extend_seq_lens_cpu", None)
            return int(max(ext)) if ext is not None and len(ext) else 1
        if mode == ForwardMode.DRAFT_EXTEND and getattr(fb.spec_info, "num_tokens_per_req", -1) > 0:
            return int(fb.spec_info.num_tokens_per_req)
        if prep.num_tokens is not None:
            return prep.num_tokens // bs
        if prep.phase == GraphPhase.REPLAY and key in self._capture_tokens:
            return self._capture_tokens[key]
        ids = getattr(fb, "input_ids", None)
        if ids is None:
            return 1
        return max(1, int(ids.shape[0]) // bs) if prep.phase == GraphPhase.REPLAY else int(ids.shape[0]) // bs

    def _metadata_scalars(self, md: Any, prep: Prep, key: tuple[int, str, int], scalars: dict[str, int]) -> None:
        scalars["max_seq_len_q"] = int(md.max_seq_len_q)
        mk = getattr(md, "max_seq_len_k", None)  # absent from 0.5.14: recorded as absent, never derived
        if mk is not None:
            scalars["max_seq_len_k"] = int(mk)
        if prep.phase == GraphPhase.CAPTURE:
            self._frozen[key] = int(md.max_seq_len_q)
        frozen = self._frozen.get(key) if prep.phase == GraphPhase.REPLAY else None
        if prep.phase == GraphPhase.CAPTURE:
            frozen = int(md.max_seq_len_q)
        scalars["kernel_q_len"] = frozen if frozen is not None else int(md.max_seq_len_q)
        if frozen is not None:
            scalars["captured_max_seq_len_q"] = frozen

    def _count_iteration(self, mode: ForwardMode, prep: Prep, step_id: int | None) -> None:
        if mode in (ForwardMode.DECODE, ForwardMode.DRAFT_DECODE, ForwardMode.TARGET_VERIFY, ForwardMode.EXTEND) and \
                self._last_mode in (ForwardMode.TARGET_VERIFY, ForwardMode.DRAFT_EXTEND, ForwardMode.DECODE) and \
                prep.phase != GraphPhase.CAPTURE and (mode != ForwardMode.DRAFT_DECODE or step_id == 0):
            self._iteration += 1
        if prep.phase != GraphPhase.CAPTURE:
            self._last_mode = mode

    def _step_features(self, md: Any) -> None:
        """Unmodelled features a step's metadata shows in use (0.5.16+ ragged verify, SWA, CP zigzag)."""
        if getattr(md, "is_ragged_verify", False) is True:
            self._note("ragged verify", "per-request verify lengths; the checks assume uniform T",
                       "metadata is_ragged_verify")
        if getattr(md, "swa_page_table", None) is not None:
            self._note("SWA", "sliding-window layers read a translated SWA page table; specscope records the "
                              "full-attention one", "metadata swa_page_table")
        if getattr(md, "zigzag_page_table", None) is not None:
            self._note("CP", "context parallel (zigzag page tables); specscope models one rank's whole context",
                       "metadata zigzag_page_table")


class RequestRows:
    """A step's request rows from its landed values, with ids stable across steps: SGLang's rid when the batch
    carries it, else the req slot plus a generation that starts anew when the target prefills the slot from a length
    it never committed (a new request). Steps must come in index order (the recorder resolves them so)."""

    def __init__(self) -> None:
        self._slot_gen: dict[int, tuple[int, int | None]] = {}  # req slot -> (generation, last committed length)

    def _request_id(self, slot: int, mode: ForwardMode, model: str, before: int, rid: Any) -> int:
        if isinstance(rid, str):
            return zlib.crc32(rid.encode()) & 0x7FFFFFFF
        gen, last = self._slot_gen.get(slot, (0, None))
        if mode == ForwardMode.EXTEND and model == "target" and (last is None or before != last):
            gen += 1
        self._slot_gen[slot] = (gen, last)
        return slot * 1_000_000 + gen

    def rows(self, values: dict[str, np.ndarray], req_args: tuple[Any, ...]) -> list[dict[str, Any]]:
        """The live rows of a step (RequestState fields), from its recorded `req_pool_indices` and lengths."""
        mode, raw_bs, T, model, ext, rids = req_args
        rpi = values["req_pool_indices"].reshape(-1).tolist()
        if raw_bs is None:
            raw_bs = next((i for i, x in enumerate(rpi) if x == 0), len(rpi)) or len(rpi)
        # The host mirror when the batch had one, else the device lengths (copied without a sync).
        seq = values.get("seq_lens_cpu", values["seq_lens"]).reshape(-1)[:raw_bs].tolist()
        slots = rpi[:raw_bs]
        out = []
        rids = list(rids) if isinstance(rids, (list, tuple)) and len(rids) >= raw_bs else [None] * raw_bs
        for b in range(raw_bs):
            s = int(seq[b])
            if mode == ForwardMode.DECODE:
                before, after, q = s - 1, s, 1
            elif mode == ForwardMode.DRAFT_DECODE:
                before, after, q = s, s, 1
            elif mode == ForwardMode.TARGET_VERIFY:
                before, after, q = s, s, T
            elif mode == ForwardMode.DRAFT_EXTEND:
                before, after, q = s - T, s, T
            else:
                q = int(ext[b]) if ext is not None else s
                before, after = s - q, s
            slot = int(slots[b])
            rid = self._request_id(slot, mode, model, before, rids[b])
            if mode in (ForwardMode.EXTEND, ForwardMode.DECODE) and model == "target":
                self._slot_gen[slot] = (self._slot_gen[slot][0], after)
            out.append(dict(request_id=rid, slot=slot, seq_len_before=before, seq_len_after=after, num_q_tokens=q))
        return out

    def accept(self, rows: list[dict[str, Any]], accept_by_slot: dict[int, int]) -> bool:
        """A verify's rows get the accept lengths its draft extend carried (by req slot); True if every row did."""
        for r in rows:
            n = accept_by_slot.get(r["slot"])
            if n is not None:
                r["accept_length"], r["seq_len_after"] = n, r["seq_len_before"] + n
                gen = self._slot_gen.get(r["slot"], (0, None))[0]
                self._slot_gen[r["slot"]] = (gen, r["seq_len_after"])
        return bool(rows) and all(r["slot"] in accept_by_slot for r in rows)


def columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Request rows as the recorder's columns."""
    names = ("request_id", "slot", "seq_len_before", "seq_len_after", "num_q_tokens", "accept_length", "draft_tokens")
    return {c: [r.get(c, () if c == "draft_tokens" else 0) for r in rows] for c in names}


def accept_lengths(values: dict[str, np.ndarray]) -> dict[int, int]:
    """req slot -> accept length, from a draft extend's recorded values (empty if it carried none)."""
    acc, rpi = values.get("accept_lens"), values.get("req_pool_indices")
    if acc is None or rpi is None:
        return {}
    return {int(s): int(n) for s, n in zip(rpi.reshape(-1).tolist(), acc.reshape(-1).tolist(), strict=False)}
