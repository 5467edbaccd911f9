"""What an SGLang server is, read from its objects: the server args that shape attention and speculation, SGLang's
spec-decoding variables, the process's place in the parallel groups, the features specscope does not model, and the
kernel and SGLang versions (a recorded trace's provenance, `run.config["sglang"]`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

from ..tracer import user_env
from .sglang_versions import SglangFacts, facts_for

# Server args that shape attention and speculation, by the names any release 0.5.12 ... 0.5.23 gives them (0.5.2x
# splits the CUDA-graph flags per phase); only those the server's args object has are recorded.
SERVER_ARGS = (
    "model_path", "speculative_draft_model_path", "attention_backend", "prefill_attention_backend",
    "decode_attention_backend", "speculative_algorithm", "speculative_num_steps", "speculative_eagle_topk",
    "speculative_num_draft_tokens", "speculative_attention_mode", "page_size", "kv_cache_dtype",
    "disable_cuda_graph", "cuda_graph_bs", "cuda_graph_max_bs", "disable_decode_cuda_graph",
    "cuda_graph_backend_decode", "cuda_graph_bs_decode", "cuda_graph_max_bs_decode", "disable_overlap_schedule",
    "tp_size", "pp_size", "dp_size", "enable_dp_attention", "attn_cp_size", "dcp_size", "enable_unified_memory",
    "enable_two_batch_overlap",
)  # fmt: skip
# SGLang's spec-decoding and TRTLLM MHA variables, read through SGLang's own `envs` (the value SGLang itself uses);
# those set are recorded.
SPEC_ENV = (
    "SGLANG_ENABLE_OVERLAP_PLAN_STREAM", "SGLANG_ENABLE_SPEC_V2", "SGLANG_RAGGED_VERIFY_MODE",
    "SGLANG_TEST_RAGGED_VERIFY_FORCE_UNIFORM_CAPTURE", "SGLANG_ENABLE_METADATA_GLUE_GRAPH",
    "SGLANG_DISABLE_DRAFT_EXTEND_CUDA_GRAPH", "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND", "SGLANG_SPEC_TP_SYNC",
    "SGLANG_ENABLE_PP_SPEC", "SGLANG_TRTLLM_MHA_DECODE_SEQ_LEN_SPLITS", "SGLANG_FLASHINFER_WORKSPACE_SIZE",
)  # fmt: skip


def jsonable(v: Any) -> Any:
    """A server arg or variable as plain JSON (dtypes and enums as text)."""
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, torch.dtype):
        return str(v).replace("torch.", "")
    return str(getattr(v, "value", v))  # enums as their value, anything else as text


def server_args_of(model_runner: Any) -> dict[str, Any]:
    """The attention and speculation server args the runner was built with (only the names this release has)."""
    sa = getattr(model_runner, "server_args", None)
    if sa is None:
        return {}
    out: dict[str, Any] = {}
    for name in SERVER_ARGS:
        try:
            v = getattr(sa, name)
        except Exception:  # noqa: BLE001 - a name this release lacks (0.5.2x's args raise on some unknown reads)
            continue
        if not callable(v):
            out[name] = jsonable(v)
    return out


def spec_env(envs: Any) -> dict[str, Any]:
    """SPEC_ENV variables set, with the value SGLang parsed (its `envs` object; absent names are skipped)."""
    out: dict[str, Any] = {}
    if envs is None:
        return out
    for name in SPEC_ENV:
        var = getattr(envs, name, None)
        try:
            if var is not None and var.is_set():
                out[name] = jsonable(var.get())
        except Exception:  # noqa: BLE001 - a stand-in or an older EnvField without is_set
            continue
    return out


def parallel_facts(model_runner: Any) -> dict[str, Any]:
    """This process's place in SGLang's parallel groups: `tp_rank`/`tp_size` (and pp/dp where SGLang has them)
    and where they were read (`source`): the model runner (up to 0.5.2x), the runtime context (0.5.2x), the
    initialized torch.distributed world, else the launcher's variables; a lone process is rank 0 of 1."""
    sa = getattr(model_runner, "server_args", None)
    sizes = {k: int(v) for k in ("tp_size", "pp_size", "dp_size")
             if isinstance(v := getattr(sa, k, None), int)}
    if isinstance(getattr(model_runner, "tp_rank", None), int):
        out: dict[str, Any] = {"tp_rank": int(model_runner.tp_rank), "source": "model_runner.tp_rank"}
        for k in ("pp_rank", "dp_rank", "tp_size", "pp_size"):
            if isinstance(v := getattr(model_runner, k, None), int):
                out[k] = int(v)
        return {**sizes, **out}
    rc = sys.modules.get("sglang.srt.runtime_context")
    if rc is not None and hasattr(rc, "get_parallel"):
        par = rc.get_parallel()
        out = {}
        for k in ("tp_rank", "tp_size", "pp_rank", "pp_size", "dp_rank"):
            try:
                v = getattr(par, k)
            except Exception:  # noqa: BLE001 - not published in this process (ParallelContext raises)
                continue
            if isinstance(v, int):
                out[k] = int(v)
        if "tp_rank" in out:
            return {**sizes, **out, "source": "runtime_context.get_parallel()"}
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        # SGLang's world rank is tp_size * pp_rank + tp_rank (model_runner init_torch_distributed).
        rank, world = dist.get_rank(), dist.get_world_size()
        tp = sizes.get("tp_size", world)
        return {**sizes, "tp_rank": rank % tp, "pp_rank": rank // tp, "world_rank": rank, "world_size": world,
                "source": "torch.distributed"}
    env = next(((k, v) for k in user_env.RANK_VARS if (v := user_env.get(k)) is not None), None)
    if env is not None and env[1].isdigit():
        return {**sizes, "tp_rank": int(env[1]), "source": f"environment ({env[0]})"}
    return {**sizes, "tp_rank": 0, "source": "none, one process"}


def rank_label(par: dict[str, Any]) -> str:
    """The rank as a file name part: the TP rank ("3"), prefixed by the PP / DP rank where those groups have more
    than one member ("pp1-tp3")."""
    parts = [f"dp{par['dp_rank']}"] if par.get("dp_size", 1) > 1 and "dp_rank" in par else []
    if par.get("pp_size", 1) > 1 or par.get("pp_rank", 0) > 0:
        parts.append(f"pp{par.get('pp_rank', 0)}")
    return "-".join([*parts, f"tp{par['tp_rank']}"]) if parts else str(par["tp_rank"])


def features(be: Any, sa: dict[str, Any], env: dict[str, Any], facts: SglangFacts | None) -> list[dict[str, str]]:
    """Features of this server that specscope's model of TRTLLM MHA leaves out, with what showed them."""
    out: list[dict[str, str]] = []

    def add(feature: str, detail: str, source: str) -> None:
        out.append({"feature": feature, "detail": detail, "source": source})

    topk = getattr(be, "topk", None)
    topk = topk if isinstance(topk, int) else sa.get("speculative_eagle_topk")
    if isinstance(topk, int) and topk > 1:
        add("topk > 1", f"EAGLE tree drafts (topk {topk}); specscope models topk = 1 only",
            "backend.topk" if isinstance(getattr(be, "topk", None), int) else "server args speculative_eagle_topk")
    mode = env.get("SGLANG_RAGGED_VERIFY_MODE")
    if mode not in (None, "static") and (facts is None or facts.has_ragged_verify):
        xqa = " (XQA, SM90/SM120, refuses it: the first verify raises NotImplementedError)" \
            if getattr(be, "is_xqa_impl", False) else ""
        add("ragged verify", f"per-request verify lengths{xqa}; the checks assume uniform T",
            f"SGLANG_RAGGED_VERIFY_MODE={mode}")
    tr = getattr(be, "kv_index_translator", None)
    if tr is not None and getattr(tr, "is_translating", False):
        add("unified KV pool", "page-table ids are translated (kv_index_translator); specscope reads them as "
                               "pool pages", "backend.kv_index_translator")
    elif sa.get("enable_unified_memory"):
        add("unified KV pool", "page-table ids are translated; specscope reads them as pool pages",
            "server args enable_unified_memory")
    if getattr(be, "_swa_kv_pool", None) is not None or getattr(be, "use_sliding_window_kv_pool", False) is True:
        add("SWA", "sliding-window layers read a translated SWA page table; specscope records the full-attention "
                   "one", "backend SWA KV pool")
    cp = {k: v for k in ("attn_cp_size", "dcp_size") if isinstance(v := sa.get(k), int) and v > 1}
    if cp:
        add("CP", "context parallel (zigzag page tables); specscope models one rank's whole context",
            "server args " + ", ".join(f"{k}={v}" for k, v in cp.items()))
    dt = getattr(be, "data_type", None)
    kvd = sa.get("kv_cache_dtype")
    if getattr(be, "is_nvfp4_kvcache", False) is True or (isinstance(kvd, str) and "fp4" in kvd):
        add("NVFP4 KV", "NVFP4 KV cache (scales, FP8 output); specscope models bf16 KV",
            "backend.is_nvfp4_kvcache" if getattr(be, "is_nvfp4_kvcache", False) is True else f"kv_cache_dtype={kvd}")
    elif (isinstance(dt, torch.dtype) and "float8" in str(dt)) or (isinstance(kvd, str) and "fp8" in kvd):
        add("FP8 KV", "FP8 KV cache (k/v scales); specscope models bf16 KV",
            f"backend.data_type={jsonable(dt)}" if isinstance(dt, torch.dtype) and "float8" in str(dt)
            else f"kv_cache_dtype={kvd}")
    return out


def kernel_versions() -> dict[str, str]:
    """flashinfer (and sgl-kernel) as this process has them: the imported module's version, else the installed
    distribution's; nothing is imported here."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str] = {}
    mod = sys.modules.get("flashinfer")
    if mod is not None and isinstance(getattr(mod, "__version__", None), str):
        out["flashinfer"] = mod.__version__
    for key, dists in (("flashinfer", ("flashinfer-python", "flashinfer")), ("sgl_kernel", ("sgl-kernel",))):
        for d in dists:
            if key in out:
                break
            try:
                out[key] = version(d)
            except PackageNotFoundError:
                continue
    if torch.version.cuda:
        out["cuda"] = str(torch.version.cuda)
    return out


def module_version(module: Any) -> str:
    """The release a trtllm_mha_backend module belongs to: its wheel's dist-info or version.py beside the
    package it was loaded from, else SGLang's `sglang.version`, else the installed distribution, else "unknown"."""
    f = getattr(module, "__file__", None)
    if isinstance(f, str) and Path(f).is_file():
        from .sglang_package import sglang_version

        v = sglang_version(Path(f).resolve().parents[3])
        if v != "unknown":
            return v
    return installed_sglang_version()


def facts_of(version: str) -> SglangFacts | None:
    """The release's facts, None for a release specscope does not know."""
    try:
        return facts_for(version)
    except ValueError:
        return None


def installed_sglang_version() -> str:
    """The SGLang this process imported, else the installed distribution's version, else "unknown"."""
    mod = sys.modules.get("sglang.version")
    if mod is not None and hasattr(mod, "__version__"):
        return str(mod.__version__)
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"
