"""Load SGLang's own `trtllm_mha_backend.py` from an installed wheel, by file path, with only its imports replaced.

Why: specscope's backend mirrors SGLang's `TRTLLMHAAttnBackend`, and the parity test and the seed-bug drives
must run *upstream's* code, not our reading of it. Importing `sglang` itself needs a GPU server stack (psutil,
triton, distributed, ...), but the backend's metadata paths (eager init, CUDA-graph build/apply, the draft
multi-step wrapper) only need a handful of names. Each loaded module gets its own `__import__` that answers
`sglang.*` imports from the stand-ins below and passes every other import through, so two versions (say 0.5.12
and 0.5.13) load side by side and nothing is copied into this repository.

What is real and what is a stand-in (one load = one `UpstreamSglang`). Where a file lives, and which names a
release imports, come from `sglang_versions.facts_for` (and are checked against the wheel after every load):

- real, loaded from the same wheel the same way: `layers/attention/base_attn_backend` (its `AttentionBackend`,
  and from 0.5.18 the `SharedReadEnds` the backend imports from it);
- real, upstream's Triton kernel files (0.5.14+: the device page-table builder; 0.5.15+: the fused in-graph
  metadata kernel), executed from the wheel; on a CPU their kernels are made under Triton's interpreter (what
  `TRITON_INTERPRET=1` selects), so upstream's own kernels compute the values on CPU tensors;
- real definitions taken from the wheel's source with `ast` (their modules import CUDA and distributed code):
  `ForwardMode` and `build_inner_fb_view` (forward_batch_info), `build_replay_fb_view` (the decode graph
  runner; for drivers, the backend does not import it), `canonicalize_stride`, `resolve_ragged_verify_layout`
  (0.5.16+), and the enums `AttentionType`, `KVCacheAttentionAccessKind`, `IdSpaceKind` where a release has them;
- stand-in `flashinfer_backend.FlashInferAttnBackend`: a subclass of the real `AttentionBackend` whose
  `__init__` sets what the real one sets for this backend (`req_to_token_pool`, `token_to_kv_pool`,
  `kv_index_translator`, `use_sliding_window_kv_pool=False`, a plain `kv_cache_quant_method`,
  `max_context_len`, `skip_prefill`), without flashinfer wrappers; like the real class it defines no
  verify-buffer hooks, so the base class's raising default shows through;
- stand-in `flashinfer_backend.FlashInferMultiStepDraftBackend`: the attributes the real `__init__` sets
  (`topk`, `speculative_num_steps`, `kv_indptr`, `kv_last_page_len`, `attn_backends`, ...) without the Triton
  kv-indices kernel;
- `environ.envs`: the variables the backend reads (the workspace size, small on a CPU; the skip-softmax
  factors and ragged verify unset; one decode seq-len split);
- `runtime_context` (0.5.16+): `get_spec()` answers from the server args of the model runner whose backend is
  being built, `get_buffer` keeps one buffer per name, the platform is neither SM90 nor SM120 on a CPU, one
  attention TP rank;
- `utils.is_flashinfer_available`, `utils.common.is_sm90_supported` / `is_sm120_supported` / `is_npu`: False on
  a CPU; with `kernels=True` the real `flashinfer` is imported and the SM checks read the device;
- no sliding window, no context parallelism, no unified pool, no FP8/FP4 KV: `SWAKVPool`, `HybridLinearKVPool`
  and `KVWriteLoc` are classes nothing is an instance of, `is_cp_active` is False, the KV index translator does
  not translate; the FP8 kernels, `paged_kv_view`, `get_cp_strategy` and the ragged-verify geometry raise;
- `kernel_api_logging.debug_kernel_api` (either module name): the identity decorator; the MLA backend's
  persistent counter buffer: a zero tensor.

A model runner is the backend's constructor argument, not an import: `sglang_stand_ins.make_model_runner` builds
the attributes the constructor reads in any release. Only topk = 1 without sliding-window layers is supported,
the configuration TRTLLM MHA serves in SGLang 0.5.12 ... 0.5.23.

Where each part lives: the package folder and its files in `sglang_package`, running upstream's code by path in
`sglang_upstream_code`, the stand-ins in `sglang_stand_ins`, the Triton interpreter setup in
`sglang_triton_interp`; this module puts one load together.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .sglang_package import BASE_PATH, TMB_PATH, SglangNotFound, facts_of, find_sglang, sglang_version, write_slim
from .sglang_stand_ins import RuntimeContext, UpstreamBatch, backend_stand_ins, stand_ins
from .sglang_triton_interp import kernel_modules
from .sglang_upstream_code import UpstreamForwardMode, exec_module, upstream_helpers
from .sglang_versions import SglangFacts

__all__ = ["TMB_MODULE", "UpstreamSglang", "check_facts", "install_as_sglang", "load_upstream", "main"]


@dataclass
class UpstreamSglang:
    """One loaded copy of upstream's backend module and the real helpers around it."""

    version: str
    root: Path  # the sglang package folder
    module: types.ModuleType  # trtllm_mha_backend, executed from the wheel's file
    base_module: types.ModuleType  # base_attn_backend, likewise
    ForwardMode: UpstreamForwardMode
    build_inner_fb_view: Callable[..., Any] | None  # absent before 0.5.13
    build_replay_fb_view: Callable[..., Any] | None  # absent before 0.5.13
    facts: SglangFacts
    # Upstream's Triton kernel modules the backend imports, by module name, loaded from the wheel (0.5.14+).
    kernel_modules: dict[str, types.ModuleType] = field(default_factory=dict)

    @property
    def backend_cls(self) -> type:
        """`TRTLLMHAAttnBackend`."""
        return self.module.TRTLLMHAAttnBackend

    @property
    def multi_step_cls(self) -> type:
        """`TRTLLMHAAttnMultiStepDraftBackend`."""
        return self.module.TRTLLMHAAttnMultiStepDraftBackend

    @property
    def api(self) -> str:
        """`out_graph` (0.5.13+: `init_forward_metadata_out_graph(fb, in_capture)`) or `capture_replay` (0.5.12)."""
        return "out_graph" if "init_forward_metadata_out_graph" in vars(self.backend_cls) else "capture_replay"

    @property
    def has_fixup_hook(self) -> bool:
        """Whether the backend class itself implements `update_verify_buffers_to_fill_after_draft` (PR #25925)."""
        return "update_verify_buffers_to_fill_after_draft" in vars(self.backend_cls)


def check_facts(up: UpstreamSglang) -> None:
    """Raise SglangNotFound when `sglang_versions.facts_for` says something of this wheel that its loaded code
    contradicts (a field, a mode, a method, a signature): the facts table is kept true by every load."""
    f, cls = up.facts, up.backend_cls
    fields = set(getattr(up.module.TRTLLMMHAMetadata, "__dataclass_fields__", {}))
    seen = {
        "has_max_seq_len_k": "max_seq_len_k" in fields,
        "has_draft_extend_v1": hasattr(up.ForwardMode, "DRAFT_EXTEND"),
        "graph_metadata_in_graph": "init_forward_metadata_in_graph" in vars(cls),
        "graph_api": up.api,
        "has_fixup_hook": up.has_fixup_hook,
        "has_ragged_verify": "is_ragged_verify" in fields,
        "has_unified_kv_pool": "kv_index_translator" in Path(str(up.module.__file__)).read_text(encoding="utf-8"),
        "page_table_on_device": "build_trtllm_mha_page_table" in vars(up.module),
        "replay_view_takes_global_tokens": (up.build_replay_fb_view is not None and "global_num_tokens_cpu" in
                                            inspect.signature(up.build_replay_fb_view).parameters),
    }
    wrong = [f"{k}: facts say {getattr(f, k)!r}, the wheel has {v!r}" for k, v in seen.items() if getattr(f, k) != v]
    if wrong:
        raise SglangNotFound(f"sglang {up.version} at {up.root}: sglang_versions facts disagree: " + "; ".join(wrong))


_COUNTER = [0]


def load_upstream(where: str | os.PathLike[str] | None = None, *, kernels: bool = False,
                  workspace_bytes: int | None = None) -> UpstreamSglang:
    """Load upstream's TRTLLM MHA backend from the wheel at `where` (default: the installed sglang).

    `kernels=True` lets the module import the real flashinfer and answers the SM checks from the device (GPU
    drives); the default keeps everything on the metadata path, which is what runs on a CPU."""
    pkg = find_sglang(where)
    version = sglang_version(pkg)
    facts = facts_of(version, pkg)
    _COUNTER[0] += 1
    prefix = f"_specscope_sglang_{version.replace('.', '_')}_{_COUNTER[0]}"
    if workspace_bytes is None:
        workspace_bytes = (512 << 20) if kernels else (1 << 20)
    h = upstream_helpers(pkg, facts, UpstreamBatch)
    stubs = stand_ins(prefix, h, kernels, workspace_bytes)
    base = exec_module(pkg / BASE_PATH, f"{prefix}.base_attn_backend", stubs, ())
    ctx = RuntimeContext(kernels)
    stubs.update(backend_stand_ins(prefix, h, base, ctx, kernels))
    kmods = kernel_modules(pkg, facts, prefix, kernels)
    stubs.update(kmods)
    tmb = exec_module(pkg / TMB_PATH, f"{prefix}.trtllm_mha_backend", stubs, ("flashinfer",) if kernels else ())
    up = UpstreamSglang(version, pkg, tmb, base, h.ForwardMode, h.build_inner_fb_view, h.build_replay_fb_view,
                        facts, kmods)
    check_facts(up)
    return up


TMB_MODULE = "sglang.srt.layers.attention.trtllm_mha_backend"


def install_as_sglang(where: str | os.PathLike[str] | None = None, *, kernels: bool = False,
                      workspace_bytes: int | None = None) -> UpstreamSglang:
    """Make `import sglang.srt.layers.attention.trtllm_mha_backend` work in this process, through Python's normal
    import system, from the wheel's own files: the packages on the way are registered without running their
    `__init__.py` (which pull the server stack), and the stand-ins above under their real names.

    This is how a process looks to the start-up hook when SGLang imports the backend; tests and GPU drives use
    it. It refuses when any `sglang` module is already imported."""
    pkg = find_sglang(where)
    if any(m == "sglang" or m.startswith("sglang.") for m in sys.modules):
        raise RuntimeError("sglang is already imported in this process")
    version = sglang_version(pkg)
    facts = facts_of(version, pkg)
    if workspace_bytes is None:
        workspace_bytes = (512 << 20) if kernels else (1 << 20)
    for rel in ("", "srt", "srt/layers", "srt/layers/attention"):
        name = "sglang" + ("." + rel.replace("/", ".") if rel else "")
        mod = types.ModuleType(name)
        mod.__path__ = [str(pkg / rel)] if rel else [str(pkg)]
        mod.__package__ = name
        sys.modules[name] = mod
    h = upstream_helpers(pkg, facts, UpstreamBatch)
    sys.modules.update(stand_ins("sglang", h, kernels, workspace_bytes))
    base = importlib.import_module("sglang.srt.layers.attention.base_attn_backend")
    ctx = RuntimeContext(kernels)
    sys.modules.update(backend_stand_ins("sglang", h, base, ctx, kernels))
    kmods = kernel_modules(pkg, facts, "sglang._specscope_kernels", kernels)
    sys.modules.update(kmods)
    tmb = importlib.import_module(TMB_MODULE)
    up = UpstreamSglang(version, pkg, tmb, base, h.ForwardMode, h.build_inner_fb_view, h.build_replay_fb_view,
                        facts, kmods)
    check_facts(up)
    return up


def main(argv: list[str] | None = None) -> int:
    """`python -m specscope.integrations.sglang_loader --slim DEST [--sglang DIR ...]`: slim copies for GPU hosts."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m specscope.integrations.sglang_loader", description=main.__doc__)
    ap.add_argument("--slim", required=True, metavar="DEST", help="folder to write <version>/ copies into")
    ap.add_argument("--sglang", action="append", default=[], metavar="DIR",
                    help="an unpacked wheel (repeatable; default: the installed sglang)")
    a = ap.parse_args(argv)
    try:
        for where in a.sglang or [None]:
            print(write_slim(find_sglang(where), Path(a.slim)))
    except (SglangNotFound, ValueError) as e:
        print(f"specscope: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
