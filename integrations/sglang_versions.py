"""What differs between SGLang releases, for the parts of SGLang specscope loads, drives and records.

One place per version range: file locations, imports, metadata fields, modes and where CUDA-graph metadata is
computed. The loader, the driver, the parity harness and the live recorder ask `facts_for(version)` instead of
testing versions themselves. Torch-free: `info` and the audit read it on any machine.

Facts come from the released wheels (`shared` reference notes on every release 0.5.12 ... 0.5.23).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# Every release specscope is tested against, oldest first. A newer release attaches and records what it can; its
# traces say "untested SGLang X".
TESTED_RELEASES: tuple[str, ...] = (
    "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22",
    "0.5.23",
)  # fmt: skip


def parse_version(text: str) -> tuple[int, int, int]:
    """`"0.5.13.post1"` -> (0, 5, 13); raises ValueError on text that does not start with three numbers."""
    m = re.match(r"\s*v?(\d+)\.(\d+)\.(\d+)", text)
    if m is None:
        raise ValueError(f"not an SGLang version: {text!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


@dataclass(frozen=True)
class SglangFacts:
    """The version-dependent facts about one SGLang release."""

    version: str  # as given (e.g. "0.5.13.post1")
    release: tuple[int, int, int]
    tested: bool  # the release (major.minor.patch) is one of TESTED_RELEASES
    # `TRTLLMMHAMetadata.max_seq_len_k` exists (dropped in 0.5.14; the kernels get `max_context_len` instead).
    has_max_seq_len_k: bool
    # `ForwardMode.DRAFT_EXTEND` (v1, ragged draft extend) exists (gone from 0.5.14; only DRAFT_EXTEND_V2 remains).
    has_draft_extend_v1: bool
    # CUDA-graph metadata is computed inside the graph by `init_forward_metadata_in_graph` (a fused Triton kernel
    # recorded at capture and re-run by every replay), from 0.5.15; before, `init_forward_metadata_out_graph` (or
    # the replay method) computed it on the host side.
    graph_metadata_in_graph: bool
    # The eager page table is built on the device by a Triton kernel (0.5.14+), not gathered on the host.
    page_table_on_device: bool
    # The draft-extend capture spec carries `num_tokens_per_req = T` (0.5.16+), which capture freezes into
    # `max_seq_len_q`; before, capture derived it from the token count.
    draft_extend_capture_width: bool
    # `SGLANG_RAGGED_VERIFY_MODE` (per-request verify lengths) exists (0.5.16+); specscope does not model it.
    has_ragged_verify: bool
    # The unified KV pool (`kv_index_translator`) exists (0.5.19+); specscope does not model it.
    has_unified_kv_pool: bool
    # `build_replay_fb_view` takes `global_num_tokens_cpu` (0.5.23+).
    replay_view_takes_global_tokens: bool
    # Where the CUDA-graph runner's source lives inside the package (moved in 0.5.14).
    cuda_graph_runner_path: str
    # Where `canonicalize_stride` and the attention utils live (moved in 0.5.16).
    attention_utils_path: str


def is_tested(version: str) -> bool:
    """Whether `version`'s release is one specscope is tested against."""
    r = parse_version(version)
    return any(parse_version(t) == r for t in TESTED_RELEASES)


def facts_for(version: str) -> SglangFacts:
    """The facts for `version` (e.g. "0.5.23"); a release newer than every tested one gets the newest range's facts
    with `tested=False`. Raises ValueError on unparsable text."""
    r = parse_version(version)
    return SglangFacts(
        version=version.strip(),
        release=r,
        tested=is_tested(version),
        has_max_seq_len_k=r < (0, 5, 14),
        has_draft_extend_v1=r < (0, 5, 14),
        graph_metadata_in_graph=r >= (0, 5, 15),
        page_table_on_device=r >= (0, 5, 14),
        draft_extend_capture_width=r >= (0, 5, 16),
        has_ragged_verify=r >= (0, 5, 16),
        has_unified_kv_pool=r >= (0, 5, 19),
        replay_view_takes_global_tokens=r >= (0, 5, 23),
        cuda_graph_runner_path=(
            "srt/model_executor/cuda_graph_runner.py" if r < (0, 5, 14)
            else "srt/model_executor/runner/decode_cuda_graph_runner.py"
        ),
        attention_utils_path=(
            "srt/layers/attention/utils.py" if r < (0, 5, 16) else "kernels/ops/attention/utils.py"
        ),
    )  # fmt: skip
