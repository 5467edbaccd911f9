"""What differs between SGLang releases, for the parts of SGLang specscope loads, drives and records.

One place per version range: file locations, imports, metadata fields, modes, call signatures and where CUDA-graph
metadata is computed. The loader, the driver, the parity harness and the live recorder ask `facts_for(version)`
instead of testing versions themselves; the loader checks the facts against every wheel it loads
(`sglang_loader.check_facts`), so a wrong fact fails loudly. Torch-free: `info` and the audit read it on any machine.

Facts come from the released wheels of every release 0.5.12 ... 0.5.23 (their source read, and the parity sweep and
the drive run on each).
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

# The compared metadata fields of `TRTLLMMHAMetadata` that not every release has (sglang_parity_compare.FIELDS).
OPTIONAL_FIELDS: tuple[str, ...] = ("max_seq_len_k",)


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
    # The draft-extend capture spec carries `num_tokens_per_req = T` (0.5.16+, the runner's `captured_req_width`),
    # which capture freezes into `max_seq_len_q`; before, capture derived it from the token count.
    draft_extend_capture_width: bool
    # `SGLANG_RAGGED_VERIFY_MODE` (per-request verify lengths) exists (0.5.16+); specscope does not model it.
    has_ragged_verify: bool
    # The unified KV pool (`kv_index_translator`) exists (0.5.19+); specscope does not model it.
    has_unified_kv_pool: bool
    # `build_replay_fb_view` takes `global_num_tokens_cpu` after `num_tokens` (0.5.21+).
    replay_view_takes_global_tokens: bool
    # Where the CUDA-graph runner's source lives inside the package (moved in 0.5.14).
    cuda_graph_runner_path: str
    # Where `canonicalize_stride` and the attention utils live (moved in 0.5.16).
    attention_utils_path: str
    # The graph API: `init_forward_metadata_out_graph(fb, in_capture)` (0.5.13+, "out_graph"), or the
    # `init_forward_metadata_capture_cuda_graph` / `_replay_cuda_graph` pair (0.5.12, "capture_replay").
    graph_api: str
    # The backend implements `update_verify_buffers_to_fill_after_draft` itself (a no-op, 0.5.13+, PR #25925).
    has_fixup_hook: bool
    # Graphs of DRAFT_EXTEND_V2 prepare metadata (0.5.13+; 0.5.12's graph path knows only v1 DRAFT_EXTEND).
    has_draft_extend_v2_graph: bool
    # Upstream's Triton kernel that builds the page table on the device (0.5.14+), relative to the package.
    page_table_kernel_path: str | None
    # Upstream's fused Triton kernel that writes CUDA-graph metadata inside the graph (0.5.15+).
    graph_metadata_kernel_path: str | None
    # The module the base class takes `debug_kernel_api` from (moved under `sglang.kernels` in 0.5.18).
    kernel_api_logging_module: str
    # The backend reads the speculative settings from `runtime_context.get_spec()` (0.5.17+), not `server_args`.
    spec_from_runtime_context: bool
    # Compared metadata fields (of OPTIONAL_FIELDS) this release does not have: recorded and compared as absent.
    fields_absent: tuple[str, ...]


def is_tested(version: str) -> bool:
    """Whether `version`'s release is one specscope is tested against."""
    r = parse_version(version)
    return any(parse_version(t) == r for t in TESTED_RELEASES)


def _kernel_path(r: tuple[int, int, int], name: str, first: tuple[int, int, int]) -> str | None:
    """Where one of upstream's TRTLLM MHA Triton kernel files lives: under the attention layer's `triton_ops`
    (until 0.5.15), `sglang/kernels/ops/kvcache` (0.5.16 - 0.5.22), `sglang/kernels/ops/attention` (0.5.23+)."""
    if r < first:
        return None
    if r < (0, 5, 16):
        return f"srt/layers/attention/triton_ops/{name}.py"
    if r < (0, 5, 23):
        return f"kernels/ops/kvcache/{name}.py"
    return f"kernels/ops/attention/{name}.py"


def facts_for(version: str) -> SglangFacts:
    """The facts for `version` (e.g. "0.5.23"); a release newer than every tested one gets the newest range's facts
    with `tested=False`. Raises ValueError on unparsable text."""
    r = parse_version(version)
    has_k = r < (0, 5, 14)
    return SglangFacts(
        version=version.strip(),
        release=r,
        tested=is_tested(version),
        has_max_seq_len_k=has_k,
        has_draft_extend_v1=r < (0, 5, 14),
        graph_metadata_in_graph=r >= (0, 5, 15),
        page_table_on_device=r >= (0, 5, 14),
        draft_extend_capture_width=r >= (0, 5, 16),
        has_ragged_verify=r >= (0, 5, 16),
        has_unified_kv_pool=r >= (0, 5, 19),
        replay_view_takes_global_tokens=r >= (0, 5, 21),
        cuda_graph_runner_path=(
            "srt/model_executor/cuda_graph_runner.py" if r < (0, 5, 14)
            else "srt/model_executor/runner/decode_cuda_graph_runner.py"
        ),
        attention_utils_path=(
            "srt/layers/attention/utils.py" if r < (0, 5, 16) else "kernels/ops/attention/utils.py"
        ),
        graph_api="out_graph" if r >= (0, 5, 13) else "capture_replay",
        has_fixup_hook=r >= (0, 5, 13),
        has_draft_extend_v2_graph=r >= (0, 5, 13),
        page_table_kernel_path=_kernel_path(r, "trtllm_mha_page_table", (0, 5, 14)),
        graph_metadata_kernel_path=_kernel_path(r, "trtllm_mha_graph_metadata", (0, 5, 15)),
        kernel_api_logging_module=(
            "sglang.kernel_api_logging" if r < (0, 5, 18) else "sglang.kernels.kernel_api_logging"
        ),
        spec_from_runtime_context=r >= (0, 5, 17),
        fields_absent=() if has_k else ("max_seq_len_k",),
    )  # fmt: skip
