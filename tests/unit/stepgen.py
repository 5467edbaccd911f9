"""Deterministic trace content for tests: step i is a pure function of i, so any process can rebuild it."""

from __future__ import annotations

import numpy as np
from specscope.tracer.schema import (
    ArraySnapshot,
    ForwardMode,
    GraphPhase,
    RequestRecord,
    RequestState,
    RunInfo,
    Severity,
    Step,
    StreamSpan,
    Violation,
)

CYCLE = (
    (ForwardMode.DRAFT_DECODE, 0),
    (ForwardMode.DRAFT_DECODE, 1),
    (ForwardMode.DRAFT_DECODE, 2),
    (ForwardMode.TARGET_VERIFY, None),
    (ForwardMode.DRAFT_EXTEND, None),
)
K = 4  # tokens per verify (3 drafts + root)


def make_run(command: str = "specscope run --test") -> RunInfo:
    """A RunInfo with every field set."""
    return RunInfo(
        command=command,
        config={"batch_size": 4, "spec_steps": 3, "page_size": 16, "cuda_graphs": True, "ladder": [1, 2, 4]},
        target_model="tiny",
        draft_model="tiny-draft",
        device="cpu",
        device_capability=None,
        attention_kernel="reference",
        versions={"python": "3.11", "specscope": "0.1.0"},
        git_commit="0123456789abcdef",
        start_ns=1_700_000_000_000_000_000,
        hostname="testhost",
    )


def accept_length(i: int, row: int) -> int:
    """Accept length of `row` in verify step `i` (1..K, varied)."""
    return 1 + (i * 7 + row * 3) % K


def make_step(i: int, bs: int = 4) -> Step:
    """Step `i`: mode cycles like a spec run; arrays of several dtypes, incl. empty and 2-D ones."""
    rng = np.random.default_rng(i)
    mode, step_id = CYCLE[i % len(CYCLE)]
    it = i // len(CYCLE)
    padded = bs + (i % 2) * 2
    verify = mode == ForwardMode.TARGET_VERIFY
    t = K if verify else 1
    seq = (100 + 10 * np.arange(padded) + it).astype(np.int32)
    reqs = []
    for r in range(bs):
        al = accept_length(i, r) if verify else 0
        drafts = tuple(int(x) for x in rng.integers(0, 256, K - 1)) if verify else ()
        acc = (drafts[: al - 1] + (int(rng.integers(0, 256)),)) if verify else ()
        reqs.append(RequestState(r + 1000, r, int(seq[r]), int(seq[r]) + (al if verify else t), t, drafts, acc, al))
    pages = (np.arange(padded * 5, dtype=np.int32).reshape(padded, 5) + it // 3) % 97
    arrays = (
        ArraySnapshot("cache_seqlens", "int32", (8,), 0x7F00_0000_1000, seq),
        ArraySnapshot("cu_seqlens_q", "int32", (9,), 0x7F00_0000_2000,
                      np.concatenate([[0], np.cumsum(np.full(padded, t))]).astype(np.int32)),
        ArraySnapshot("page_table", "int32", (8, 64), 0x7F00_0000_3000, pages),
        ArraySnapshot("out_cache_loc", "int64", (bs * t,), 0, rng.integers(0, 2**40, bs * t, dtype=np.int64)),
        ArraySnapshot("logits_sample", "float32", (4, 3), 0, rng.standard_normal((4, 3)).astype(np.float32)),
        ArraySnapshot("spec_mask", "uint16", (bs, t, 2), 0, rng.integers(0, 2**16, (bs, t, 2), dtype=np.uint16)),
        ArraySnapshot("empty", "int32", (0,), 0, np.zeros((0,), np.int32)),
        ArraySnapshot("empty2d", "int64", (3, 0), 0, np.zeros((3, 0), np.int64)),
        # Over the inline limit, so it goes to the blobs table; it changes every other step (one row
        # gains a page), so consecutive versions are stored against each other as a base chain.
        ArraySnapshot("req_to_token_page_starts", "int32", (8, 512), 0, big_pages(i, padded)),
    )  # fmt: skip
    t0 = 5_000_000 + i * 1000
    spans = (
        StreamSpan("host", "prepare", t0, t0 + 100),
        StreamSpan("plan", "metadata", t0 + 50, t0 + 300),
        StreamSpan("compute", "attention", t0 + 310, t0 + 900),
    )
    viol = ()
    if i % 7 == 3:
        viol = (Violation("I5", Severity.ERROR, i, f"step {i}: request 1001 cache_seqlens 7 != 8", 1001),)
    elif i % 11 == 5:
        viol = (Violation("I9", Severity.WARNING, i, f"step {i}: padded row reads page 0", None),)
    return Step(
        index=i,
        iteration=it,
        mode=mode,
        model="target" if verify else "draft",
        step_id=step_id,
        batch_size=bs,
        padded_batch_size=padded,
        graph=(GraphPhase.EAGER, GraphPhase.CAPTURE, GraphPhase.REPLAY)[min(i, 2)],
        tokens_per_request=t,
        num_draft_tokens=K,
        page_size=16,
        start_ns=t0,
        end_ns=t0 + 1000,
        scalars={"max_seq_len_q": t, "max_seq_len_k": int(seq.max()), "frozen_max_seq_len_q": t},
        requests=tuple(reqs),
        arrays=arrays,
        spans=spans,
        violations=viol,
    )


def big_pages(i: int, rows: int) -> np.ndarray:
    """A [rows, 300] page-start table whose row (i // 2) % rows gets one new page every other step."""
    t = (np.arange(rows * 300, dtype=np.int32).reshape(rows, 300) * 16 + 4096) % 100_000
    changed = i // 2
    for k in range(changed):
        t[k % rows, 299 - (k // rows) % 300] = 7 * k + 1
    return t


def make_request(r: int) -> RequestRecord:
    """Request record `r` (odd ones unfinished)."""
    return RequestRecord(
        request_id=1000 + r,
        prompt_tokens=tuple(range(r + 3)),
        output_tokens=tuple(range(100, 100 + 2 * r + 1)),
        arrival_iteration=r,
        finish_iteration=None if r % 2 else r + 10,
        finish_reason="unfinished" if r % 2 else "length",
    )


def child_env() -> dict[str, str]:
    """The environment for a child Python process that imports stepgen as the tests do."""
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": here if not path else here + os.pathsep + path}


def write_ended_trace(path: str, num_steps: int, end: tuple[str, str] | None) -> str:
    """A trace of `num_steps` steps whose writer recorded the end `(state, detail)` (None: a plain close)."""
    from specscope.tracer.store import TraceWriter

    w = TraceWriter(path, make_run())
    for i in range(num_steps):
        w.write_step(make_step(i))
    if end is not None:
        w.set_end(end[0], lost_in_flight=2, detail=end[1])
    w.close()
    return path
