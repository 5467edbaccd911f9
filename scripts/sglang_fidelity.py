"""Prove specscope's TRTLLM MHA mirror equal to every SGLang release and write docs/fidelity.md.

For each release unpacked under `.sglang/<version>/` (`.ci/sglang-installs.sh`): the full parity sweep (every
mode x phase, page sizes 16-128, T = K, T < K, T > K), the five mutation checks of the comparison, and two
recorded drives through upstream's own backend (K=4 T=4 and the seed bug's K=4 T=2) checked by the invariant
catalogue. The page is written whole from this script's text and the measured results. No TRITON_INTERPRET is
needed: the loader runs upstream's Triton kernels under Triton's interpreter itself.

    python scripts/sglang_fidelity.py                       # every release, rewrites docs/fidelity.md
    python scripts/sglang_fidelity.py --releases 0.5.13 0.5.23 --out /tmp/fidelity.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from specscope.integrations.sglang_drive import drive
from specscope.integrations.sglang_loader import UpstreamSglang, load_upstream
from specscope.integrations.sglang_package import SglangNotFound
from specscope.integrations.sglang_parity import parity_table_body, sweep, sweep_header
from specscope.integrations.sglang_parity_compare import Comparison
from specscope.integrations.sglang_parity_harness import ALL_MODES, GRAPH_MODES, PHASES
from specscope.integrations.sglang_parity_mutations import MUTATIONS, mutation_effect
from specscope.integrations.sglang_versions import TESTED_RELEASES
from specscope.tracer.checks import check_steps
from specscope.tracer.schema import Severity
from specscope.tracer.store import TraceReader

ROOT = Path(__file__).resolve().parents[1]
# The drives of the table: T = K, and the seed bug's runner built for T != K.
DRIVES = ((4, 4), (4, 2))


def _check_order(item: tuple[str, int]) -> tuple[int, str]:
    """I3 before I12: the catalogue's order."""
    k = item[0]
    return (int(k[1:]) if k[1:].isdigit() else 10**6, k)


@dataclass
class DriveResult:
    """One recorded drive and what the invariant catalogue says of it."""

    K: int
    T: int
    steps: int
    replays_without_metadata: int
    errors: Counter[str]
    warnings: Counter[str]

    def verdict(self) -> str:
        """`clean`, or the violations by check id."""
        if not self.errors and not self.warnings:
            return "clean"
        parts = []
        if self.errors:
            parts.append(f"{sum(self.errors.values())} errors (" + ", ".join(
                f"{k} {n}" for k, n in sorted(self.errors.items(), key=_check_order)) + ")")
        if self.warnings:
            parts.append(f"{sum(self.warnings.values())} warnings (" + ", ".join(
                f"{k} {n}" for k, n in sorted(self.warnings.items(), key=_check_order)) + ")")
        return "; ".join(parts)


@dataclass
class ReleaseResult:
    """Everything measured on one release."""

    version: str
    up: UpstreamSglang
    cmps: list[Comparison]
    mutations_caught: int  # faults the comparison sees exactly (sglang_parity_mutations.mutation_effect)
    drives: list[DriveResult]
    sweep_s: float
    total_s: float

    @property
    def differing(self) -> int:
        """Forwards with any field different from upstream's."""
        return sum(1 for c in self.cmps if c.differs)

    @property
    def cells(self) -> tuple[int, int]:
        """(mode x phase cells compared, cells there are)."""
        want = {(m, "eager") for m in ALL_MODES} | {(m, p) for m in GRAPH_MODES for p in PHASES}
        seen = {(c.mode, c.phase) for c in self.cmps}
        return len(want & seen), len(want)


def run_drive(up: UpstreamSglang, K: int, T: int, folder: Path) -> DriveResult:
    """Record one drive (plan stream on where the release has the fix-up hook) and check it."""
    path = folder / f"drive-{up.version}-K{K}-T{T}.db"
    drive(up, path, K=K, T=T, plan_stream=up.has_fixup_hook)
    with TraceReader(path) as r:
        steps = list(r.steps())
        run = r.run
    vs = list(check_steps(steps, run))
    bare = sum(1 for s in steps if s.graph.value == "replay" and not s.arrays)
    return DriveResult(K, T, len(steps), bare, Counter(v.check_id for v in vs if v.severity == Severity.ERROR),
                       Counter(v.check_id for v in vs if v.severity != Severity.ERROR))


def measure(version: str, folder: Path, scratch: Path) -> ReleaseResult:
    """Sweep, mutation checks and drives on the release unpacked at `folder`."""
    t0 = time.perf_counter()
    up = load_upstream(folder)
    if up.version != version:
        raise SglangNotFound(f"{folder} holds sglang {up.version}, not {version}")
    cmps = sweep(up)
    sweep_s = time.perf_counter() - t0
    # Against the unmutated run of the same batches where upstream differs from ours unmutated (0.5.12).
    base = any(c.differs for c in cmps)
    caught = sum(mutation_effect(load_upstream(folder), m, baseline=base).caught for m in MUTATIONS)
    drives = [run_drive(load_upstream(folder), k, t, scratch) for k, t in DRIVES]
    return ReleaseResult(version, up, cmps, caught, drives, sweep_s, time.perf_counter() - t0)


def summary_row(r: ReleaseResult) -> str:
    """One release's row of the summary table."""
    f = r.up.facts
    cells, of = r.cells
    d44, d42 = r.drives
    graph = "inside the graph" if f.graph_metadata_in_graph else "out of graph"
    absent = ", ".join(f"`{x}`" for x in f.fields_absent) or "none"
    n = len(MUTATIONS)
    caught = f"{r.mutations_caught}/{n}" + (" (against unmutated)" if r.differing else "")
    return (f"| {r.version} | {len(r.cmps)} | {r.differing} | {cells}/{of} | {caught} "
            f"| {d44.steps} / {d42.steps} | {d44.verdict()} | {d42.verdict()} | {d44.replays_without_metadata} "
            f"| {absent} | {graph} | {r.sweep_s:.1f} | {r.total_s:.1f} |")


SUMMARY_HEAD = (
    "| release | forwards compared | differing | modes × phases | mutation checks caught | drive steps (T=K / T≠K) "
    "| check, drive K=4 T=4 | check, drive K=4 T=2 | replays without metadata | fields absent | graph metadata "
    "| sweep s | total s |\n|" + "---|" * 13)


def groups(results: list[ReleaseResult]) -> list[tuple[list[str], str]]:
    """Releases whose parity tables are the same cell for cell, with that table, oldest first."""
    out: list[tuple[list[str], str]] = []
    for r in results:
        body = parity_table_body(r.cmps, r.version)
        for vs, b in out:
            if b == body:
                vs.append(r.version)
                break
        else:
            out.append(([r.version], body))
    return out


def render(results: list[ReleaseResult], machine: str) -> str:
    """The whole of docs/fidelity.md."""
    parts = [PROLOGUE, "## Every release\n", MEASURED.format(machine=machine), SUMMARY_HEAD]
    parts += [summary_row(r) for r in results]
    parts.append(SUMMARY_NOTES)
    parts.append("## Parity tables\n\n`=` every compared forward equal; `≠ n` n forwards differ; `·` not applicable "
                 "(tensor reuse is a replay property); `(absent)` the release's metadata has no such field.\n")
    for versions, body in groups(results):
        parts.append(f"### sglang {', '.join(versions)}\n")
        parts.append(sweep_header(", ".join(versions)) + "\n" + body)
        if versions[0] == "0.5.12":
            parts.append(NOTES_0_5_12)
        elif "0.5.13" in versions:
            parts.append("Every field of every forward is equal: there is no difference to document.\n")
        else:
            parts.append(NOTES_LATER)
    parts.append(EPILOGUE)
    return "\n".join(parts)


PROLOGUE = """# Fidelity: specscope's TRTLLM MHA backend against SGLang's own

specscope's `backend/trtllm_mha_backend.py` and `backend/graph_runner.py` re-implement SGLang's
`TRTLLMHAAttnBackend` and the graph runners around it. This page is the proof that the re-implementation
prepares the same metadata as upstream, by **upstream's own code**, on every SGLang release 0.5.12 ... 0.5.23,
and the list of every place where it is deliberately different. It is written by `scripts/sglang_fidelity.py`.

## How it is checked

- `integrations/sglang_loader.py` loads the real `sglang/srt/layers/attention/trtllm_mha_backend.py` from an
  unpacked wheel **by file path**, with only its imports replaced (the stand-ins are listed in the module's
  docstring; `base_attn_backend`, `ForwardMode`, `build_inner_fb_view`, `build_replay_fb_view`,
  `canonicalize_stride` and from 0.5.14 upstream's Triton kernel files are upstream's own, taken from the same
  wheel). On a CPU the Triton kernels (the device page-table builder from 0.5.14, the fused in-graph metadata
  kernel from 0.5.15) run under Triton's interpreter, what `TRITON_INTERPRET=1` selects. Nothing of upstream is
  copied into this repository, and any number of releases load side by side.
- What differs between releases (file locations, imports, metadata fields, modes, call signatures, where graph
  metadata is computed) is in one place, `integrations/sglang_versions.py` (`facts_for`); every load checks
  those facts against the wheel's code and refuses a release they do not describe.
- `integrations/sglang_driver.py` drives it the way SGLang's runners do: upstream's capture fill values
  (`seq_lens` = 1, `req_pool_indices` = 0, `out_cache_loc` = 0), largest batch captured first, padded replays
  (`bisect_left` over the ladder; padded rows get the fill values), and the release's entry points:
  `init_forward_metadata_capture_cuda_graph` / `_replay_cuda_graph` (0.5.12),
  `init_forward_metadata_out_graph` with the real `build_replay_fb_view` (0.5.13+), and from 0.5.15
  `init_forward_metadata_in_graph` after it at capture and at every replay, on the capture's static buffers
  (what the CUDA graph records and re-runs). The draft-extend capture input carries `num_tokens_per_req = T`
  from 0.5.16, as the runner's does. Draft decode goes through upstream's
  `TRTLLMHAAttnMultiStepDraftBackend`; draft extend is upstream's `DRAFT_EXTEND_V2`.
- `integrations/sglang_parity.py` sends the same batches (fragmented page tables from our page allocator,
  batch sizes 1-8 over the capture ladder 1, 2, 4, 8) to both and compares, for every prepared forward:
  `cache_seqlens_int32`, `cu_seqlens_q`, `cu_seqlens_k` (values over every row the kernel runs, and dtypes),
  `max_seq_len_q`, `max_seq_len_k` (where the release has it), the page table's row count and the columns each
  row reads (`j < ceil(cache_seqlens[b] / P)`), the q length the kernels run with (`kernel_q_len`: the value a
  graph froze at capture, the live one eagerly) and, at replay, whether the metadata object and every tensor
  address are the ones bound at capture (`reuses_capture_tensors`). A field a release does not have is
  compared as absent, never given a value.
- The comparison itself is checked by mutation: each of our injected faults must differ from upstream in
  exactly the fields it corrupts (`sglang_parity_mutations.MUTATIONS`; fields a release lacks drop out):

  | fault (in our backend) | fields that differ from upstream |
  |---|---|
  | `max-seq-len-q-override` (T ≠ K) | TARGET_VERIFY capture / replay / padded replay: `cache_seqlens_int32`, `cu_seqlens_k`, `max_seq_len_q`, `max_seq_len_k` (up to 0.5.13), `kernel_q_len`; with K < T also `page_table` at replays (the refresh width comes from S + K, so the tail columns stay stale) |
  | `stale-page-table` | `page_table`, at every replay of every graph mode, nothing else |
  | `padded-row-seqlen` | `cache_seqlens_int32`, `cu_seqlens_k`, at padded replays only |
  | `zero-cache-seqlens-at-capture` | `cache_seqlens_int32`, `cu_seqlens_k`, at DRAFT_DECODE capture only |

- `integrations/sglang_drive.py` records an EAGLE run through upstream's backend with specscope's SGLang
  recorder (`integrations/sglang.py`), and `specscope check` judges the trace. From 0.5.15 a graph replay's
  metadata is computed inside the graph, so the recorder keeps those replays as steps whose metadata is not
  recorded (the trace says "computed inside the graph"), never as the values left over from before.
- CI (`.ci/run`) unpacks every release (`.ci/sglang-installs.sh`) and `tests/unit/test_sglang_releases.py` runs
  the full sweep, the five mutation checks and both drives on 0.5.12, 0.5.13, 0.5.14, 0.5.15, 0.5.16, 0.5.19 and
  0.5.23, each from its own folder `.sglang/<version>/` in one process, and requires this page to carry each
  one's table and summary row (a missing folder fails it under CI); `tests/unit/test_sglang_parity.py` does the
  same for the installed sglang, whichever tested release it is.

Regenerate this page with `python scripts/sglang_fidelity.py` (every release under `.sglang/`); one release's
table alone: `python -m specscope.integrations.sglang_parity --sglang .sglang/0.5.23`, with `--verbose` for
every differing forward on stderr.
"""  # noqa: E501 - a markdown table row is one line

MEASURED = "Measured by `python scripts/sglang_fidelity.py` on {machine}.\n"

SUMMARY_NOTES = """
- **forwards compared / differing**: the full parity sweep (28 page-size × K/T configurations, 3 iterations).
  0.5.12's differences are upstream's old behaviour, not ours (below); every later release equals ours in every
  field of every forward.
- **mutation checks caught**: the injected faults that differ from upstream in exactly their fields. On 0.5.12,
  whose upstream already differs unmutated, each fault is compared with the unmutated run of the same batches
  (`sglang_parity_mutations.mutation_effect`): it must add its fields wherever upstream did not already differ
  and change nothing outside its cells; `max-seq-len-q-override` and `zero-cache-seqlens-at-capture` re-create
  PR #27495's and PR #26521's bugs, so there they make ours equal to 0.5.12.
- **drive steps / check**: `sglang_drive` with K=4 and T=4, then the seed bug's runner built for T=2 (6
  iterations, plan stream on where the backend has its fix-up hook). On 0.5.12 the catalogue catches PR #27495's
  line (`max_seq_len_q = speculative_num_draft_tokens` in target verify, I6 with I3, I5, I12, I13) and PR #26521's
  unfilled draft-decode capture (I17); I7 is the warning that the verify graph buffer keeps stride K where T ≠ K.
  From 0.5.15 the replays carry no metadata (computed inside the graph), so I7 is judged at captures only.
- **replays without metadata**: graph replays of the K=4 T=4 drive recorded as "not recorded (computed inside
  the graph)".
- **sweep s / total s**: wall time of the sweep alone, and of everything on the release (sweep, mutation
  checks, drives). From 0.5.14 upstream's Triton kernels run under Triton's interpreter, which is what costs.
"""

NOTES_0_5_12 = """0.5.12 predates three fixes, and the harness finds exactly those
(`tests/unit/test_sglang_parity.py::test_sglang_0_5_12_differs_where_its_known_bugs_are` pins them):

- TARGET_VERIFY (all phases, only when T ≠ K): 0.5.12 sets `max_seq_len_q = speculative_num_draft_tokens` and
  `cache_seqlens = seq_lens + K` from the backend's cached K, in eager, capture and replay (the line PR #27495
  removed). With T = K these agree with ours.
- TARGET_VERIFY capture: 0.5.12 binds `cu_seqlens_k` without filling it at capture (zeros until the first
  replay); the kernels of the verify path do not read it, so this is harmless.
- DRAFT_DECODE capture: 0.5.12 binds `cache_seqlens` without copying `seq_lens` into it (the G1 bug, PR #26521;
  our fault `zero-cache-seqlens-at-capture` re-creates it).
- DRAFT_EXTEND graphs: 0.5.12's graph path knows only v1 `DRAFT_EXTEND`; for `DRAFT_EXTEND_V2` it prepares no
  metadata at all (`forward_metadata` is None), so every field differs.
"""

NOTES_LATER = """From 0.5.14 upstream's metadata has no `max_seq_len_k` (the kernels get `max_context_len`), builds the
page table on the device with a Triton kernel (columns past a row's live pages are uninitialized by design; the
comparison reads only the columns a row's kernel reads), and has no v1 `DRAFT_EXTEND`; from 0.5.15 graph
metadata is computed inside the graph by a fused Triton kernel; from 0.5.16 the draft-extend capture width comes
from the capture input. None of these changes a compared value: every field of every forward is equal.
"""

EPILOGUE = """## Documented differences (not metadata values)

These are places where specscope is built differently from SGLang. None changes a compared field above.

1. **Draft-extend graphs take only uniform batches (v1 ragged shape unsupported).**
   `GraphRunner.replay_prepare` copies `raw_bs × T` tokens into the static buffers; a draft-extend batch whose
   token count is not `bs × T` (SGLang's v1 `DRAFT_EXTEND` up to 0.5.13, one extend length per request from the
   accept lengths) raises `RuntimeError: The size of tensor a (12) must match the size of tensor b (6)`, or
   broadcasts silently when the batch has a single token. specscope models the spec-v2 worker, which always
   runs `DRAFT_EXTEND_V2` with T tokens per request; from 0.5.14 SGLang has no v1 path either.
2. **One graph runner per draft step.** SGLang captures the whole draft loop as one graph
   (`EAGLEDraftCudaGraphRunner`) and prepares all N-1 step backends in one `init_forward_metadata_out_graph`
   call; specscope keeps one `GraphRunner` (own static `seq_lens`, `out_cache_loc` for one step) per draft
   step. The order is SGLang's: every step backend's metadata is made first (one `metadata` span of all the draft
   steps), then the draft forwards run, then the verify is planned (on the plan stream when it is on), as
   `EAGLEWorkerV2.verify` does after `draft` returns. Per-step metadata is equal (tables above); what differs is
   N-1 graph launches with an argmax between them instead of one, and the static input buffers.
3. **Draft extend is captured, as in SGLang.** `backend/engine.py` captures TARGET_VERIFY, the N-1 DRAFT_DECODE
   steps and DRAFT_EXTEND (T tokens per request), so the draft-extend graph branch runs on every iteration; the
   fault `draft-extend-capture-q-len` re-creates G5 there. The loop runs N-1 draft decodes per iteration:
   draft extend's logits at `arange(bs)*T + accept_len - 1` give the next first draft token
   (`_draft_extend_for_decode`'s `select_index`), and the draft reads token p+1 at position p, as an EAGLE draft
   does, so its prefill is over `prompt[1:]` plus the first output token. Difference left: our standalone draft
   LM does not take the target's hidden states (EAGLE's draft does); the metadata is the same.
4. **Capture order.** Both capture the ladder largest batch first (`ModelRunner.capture_graphs`). Captured
   metadata per batch size does not depend on the order (our `GraphRunner` gives the same values either way),
   only the stale contents of static-buffer rows no kernel reads.
5. **`max_seq_len_k` of draft-decode replays** (releases up to 0.5.13) comes from `seq_lens.max().item()` on the
   device in 0.5.13 (a host sync per replay, G8) and from the CPU mirror `seq_lens_cpu` in ours. The values are
   equal whenever the mirror is correct (always, in the sweep); with a stale mirror ours would differ (check I9
   covers it). From 0.5.14 upstream has no such field.
6. **EXTEND without a prefix**: SGLang aliases `cu_seqlens_q = cu_seqlens_k` (one tensor); ours computes both
   from the extend lengths. Values are equal (the new tokens are the whole sequence); the tensors are distinct
   objects.
7. **Normal-decode graphs**: SGLang binds fresh `arange` / `zeros` tensors per batch size for `cu_seqlens_q/k`;
   ours binds views of one static buffer. Values are equal and both are reused by every replay.
8. **Forward mode names**: SGLang's draft decode is `DECODE` with a draft `spec_info`; ours is `DRAFT_DECODE`.
   `integrations/sglang_driver.upstream_batch` maps one onto the other.
9. **Bookkeeping fields**: our `TRTLLMMHAMetadata` adds `captured_max_seq_len_q`, `refreshed_page_cols` and
   `extra` (so traces can show what a graph froze and which columns a replay refreshed); upstream has
   `swa_page_table` and `swa_out_cache_loc` instead, and from 0.5.16 on fields for features specscope does not
   model (ragged verify, ENCODER_ONLY verify, CP zigzag, the mixed-prefill split, fmha_v2 block tables).

## Not compared

- Kernel outputs (no flashinfer on a CPU; `tests/unit/test_sglang_gpu.py` (marker `gpu`) drives upstream's
  backend with the real kernels on a GPU host), sliding-window pools (`swa_page_table`), fp8 / fp4 KV caches,
  topk > 1 trees, encoder lengths, data-parallel padding (`global_num_tokens`), and what later releases add and
  specscope does not model: ragged verify (0.5.16+), ENCODER_ONLY verify (0.5.17+), context parallelism, the
  unified KV pool (0.5.19+), the mixed-prefill split (0.5.22+) and the XQA spec-decode mask (0.5.21+).
"""


def main(argv: list[str] | None = None) -> int:
    """Measure every release and write the fidelity page."""
    ap = argparse.ArgumentParser(prog="python scripts/sglang_fidelity.py", description=main.__doc__)
    ap.add_argument("--root", default=str(ROOT / ".sglang"), help="folder holding <version>/ unpacked wheels")
    ap.add_argument("--releases", nargs="*", default=list(TESTED_RELEASES), help="releases (default: every one)")
    ap.add_argument("--out", default=str(ROOT / "docs" / "fidelity.md"), help="page to write")
    ap.add_argument("--machine", default="a 2-core CPU machine (CI's kind), torch CPU, triton's interpreter",
                    help="what the page says it was measured on")
    a = ap.parse_args(argv)
    unknown = [v for v in a.releases if v not in TESTED_RELEASES]
    if unknown:
        print(f"specscope: error: not a tested release: {', '.join(unknown)} (tested: {', '.join(TESTED_RELEASES)})",
              file=sys.stderr)
        return 2
    results = []
    try:
        with tempfile.TemporaryDirectory() as scratch:
            for v in a.releases:
                r = measure(v, Path(a.root) / v, Path(scratch))
                print(summary_row(r), file=sys.stderr)
                results.append(r)
    except SglangNotFound as e:
        print(f"specscope: error: {e} (unpack the wheels with .ci/sglang-installs.sh)", file=sys.stderr)
        return 2
    Path(a.out).write_text(render(results, a.machine), encoding="utf-8")
    print(a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
