"""The sglang package folder the loader reads: where it is (without importing it), its version, the release facts
that describe it, the files a load reads, and slim copies of just those files for hosts without network."""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path

from .sglang_versions import SglangFacts, facts_for

TMB_PATH = "srt/layers/attention/trtllm_mha_backend.py"
BASE_PATH = "srt/layers/attention/base_attn_backend.py"
FBI_PATH = "srt/model_executor/forward_batch_info.py"
RAGGED_PATH = "srt/speculative/ragged_verify.py"
ENUM_SOURCES = (  # upstream enums the backend compares against, taken from the wheel where the release has them
    ("srt/layers/radix_attention.py", "AttentionType"),
    ("srt/layers/quantization/fp4_kv_cache_quant_method.py", "KVCacheAttentionAccessKind"),
    ("srt/mem_cache/kv_loc_plan.py", "IdSpaceKind"),
)


class SglangNotFound(RuntimeError):
    """No usable sglang wheel at the given place."""


def find_sglang(where: str | os.PathLike[str] | None = None) -> Path:
    """The `sglang` package folder: `where` (a folder holding `sglang/`, or `sglang/` itself), else the
    installed distribution, found without importing it (importing sglang needs its server stack)."""
    if where is not None:
        p = Path(where)
        for cand in (p / "sglang", p):
            if (cand / TMB_PATH).is_file():
                return cand.resolve()
        raise SglangNotFound(f"{p}: no sglang/{TMB_PATH} there")
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SglangNotFound("sglang is not installed (python -m pip install --no-deps sglang==0.5.13)")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    if not (pkg / TMB_PATH).is_file():
        raise SglangNotFound(f"{pkg}: this sglang has no {TMB_PATH}")
    return pkg.resolve()


def sglang_version(pkg: Path) -> str:
    """The wheel's version, from its `dist-info` beside the package (no import)."""
    for d in sorted(pkg.parent.glob("sglang-*.dist-info")):
        meta = d / "METADATA"
        if meta.is_file():
            for line in meta.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    vfile = pkg / "version.py"
    if vfile.is_file():
        tree = ast.parse(vfile.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "__version__" for t in node.targets):
                return str(ast.literal_eval(node.value))
    return "unknown"


def facts_of(version: str, pkg: Path) -> SglangFacts:
    """The release facts of `version` (the package at `pkg`); SglangNotFound for a release they do not describe."""
    try:
        return facts_for(version)
    except ValueError as e:
        raise SglangNotFound(f"{pkg}: {e}") from e


def loaded_files(pkg: Path) -> tuple[str, ...]:
    """The wheel files this loader reads for the release at `pkg`, relative to the package."""
    f = facts_for(sglang_version(pkg))
    rels = [TMB_PATH, BASE_PATH, FBI_PATH, f.cuda_graph_runner_path, f.attention_utils_path, RAGGED_PATH,
            *(rel for rel, _ in ENUM_SOURCES), "version.py"]
    rels += [r for r in (f.page_table_kernel_path, f.graph_metadata_kernel_path) if r is not None]
    return tuple(rels)


def write_slim(pkg: Path, dest: Path) -> Path:
    """Copy only the wheel files this loader reads (a few hundred KB) to `dest/<version>/`, for hosts without
    network where a whole wheel is too big to carry; `load_upstream(dest/<version>)` loads it. Returns the folder."""
    import shutil

    version = sglang_version(pkg)
    out = dest / version
    for rel in loaded_files(pkg):
        src = pkg / rel
        if src.is_file():
            (out / "sglang" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out / "sglang" / rel)
    meta = out / f"sglang-{version}.dist-info"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n", encoding="utf-8")
    return out

