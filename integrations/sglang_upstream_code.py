"""Upstream's own code, run from the wheel by file path: a whole module with its own `__import__` (its `sglang.*`
imports answered from given stand-ins, nothing copied and nothing registered under SGLang's names), or chosen
top-level definitions of a file whose module cannot be imported here; and the small helpers the loader takes that
way (`ForwardMode`, the fb-view builders, `canonicalize_stride`, enums, the ragged-verify layout)."""

from __future__ import annotations
import __future__

import ast
import builtins
import enum
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, IntEnum, auto
from functools import total_ordering
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional, Protocol

import torch

from .sglang_package import ENUM_SOURCES, FBI_PATH, RAGGED_PATH, SglangNotFound
from .sglang_versions import SglangFacts


def extract(path: Path, names: tuple[str, ...], env: dict[str, Any]) -> dict[str, Any]:
    """Execute only the top-level definitions `names` of an upstream file (its own text, nothing copied)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    nodes = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    missing = set(names) - {n.name for n in nodes}
    if missing:
        raise SglangNotFound(f"{path}: no top-level {', '.join(sorted(missing))}")
    body: list[ast.stmt] = list(nodes)
    code = compile(ast.Module(body=body, type_ignores=[]), str(path), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    ns = dict(env)
    exec(code, ns)  # noqa: S102 - upstream's own definitions, by design
    return {n: ns[n] for n in names}


def exec_module(path: Path, modname: str, stubs: dict[str, Any], passthrough: tuple[str, ...]) -> types.ModuleType:
    """Execute the upstream file at `path` as module `modname`: its `sglang.*` imports come from `stubs` (an
    ImportError for one it lacks), flashinfer only when `passthrough` names it, every other import as usual."""
    real_import = builtins.__import__

    def imp(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and (name == "sglang" or name.startswith("sglang.")):
            mod = stubs.get(name)
            if mod is None:
                raise ImportError(f"specscope's sglang loader has no stand-in for {name!r} (imported by {path})")
            return mod
        if level == 0 and name.split(".")[0] == "flashinfer" and "flashinfer" not in passthrough:
            raise ImportError("flashinfer is not available to this load (kernels=False)")
        return real_import(name, globals, locals, fromlist, level)

    b = dict(vars(builtins))
    b["__import__"] = imp
    mod = types.ModuleType(modname)
    mod.__file__ = str(path)
    mod.__dict__["__builtins__"] = b
    # Registered so dataclasses and pickling can find the module by name; the names are unique per load.
    sys.modules[modname] = mod
    code = compile(path.read_text(encoding="utf-8"), str(path), "exec", dont_inherit=True)
    exec(code, mod.__dict__)  # noqa: S102 - upstream's own module, by design
    return mod


class UpstreamForwardMode(Protocol):
    """What drivers read of upstream's `ForwardMode`: an IntEnum class executed from the wheel's source at load
    time, so its members are known to the type checker only by name (v1 `DRAFT_EXTEND` only up to 0.5.13)."""

    DECODE: Any
    EXTEND: Any
    TARGET_VERIFY: Any
    DRAFT_EXTEND_V2: Any


@dataclass
class Helpers:
    """Upstream's own small definitions, taken from the wheel's source."""

    ForwardMode: UpstreamForwardMode
    build_inner_fb_view: Callable[..., Any] | None
    build_replay_fb_view: Callable[..., Any] | None
    canonicalize_stride: Callable[..., Any]
    enums: dict[str, type]  # upstream enums present in this release (AttentionType, ...), by name
    resolve_ragged_verify_layout: Callable[..., Any] | None  # 0.5.16+


def upstream_helpers(pkg: Path, facts: SglangFacts, forward_batch: type) -> Helpers:
    """Upstream's helpers from the wheel's source; `forward_batch` is what they see as `ForwardBatch` (the
    loader's stand-in)."""
    base_env = {"torch": torch, "Optional": Optional, "SimpleNamespace": SimpleNamespace, "IntEnum": IntEnum,
                "auto": auto, "total_ordering": total_ordering, "Enum": Enum, "enum": enum}
    fm = extract(pkg / FBI_PATH, ("ForwardMode",), base_env)["ForwardMode"]
    env = dict(base_env, ForwardMode=fm, ForwardBatch=forward_batch)
    try:
        inner = extract(pkg / FBI_PATH, ("build_inner_fb_view",), env)["build_inner_fb_view"]
    except SglangNotFound:
        inner = None
    # The view names the data-parallel padding mode (0.5.21+); no data parallelism here, and no backend of this
    # kind reads it.
    view_env = dict(env, DpPaddingMode=SimpleNamespace(get_default_mode_in_cuda_graph=lambda *a, **k: None))
    try:  # 0.5.12's runner has no view builder (its backends take the replay arguments one by one)
        replay_view = extract(pkg / facts.cuda_graph_runner_path, ("build_replay_fb_view",),
                              view_env)["build_replay_fb_view"]
    except SglangNotFound:
        replay_view = None
    canon = extract(pkg / facts.attention_utils_path, ("canonicalize_stride",), env)["canonicalize_stride"]
    enums: dict[str, type] = {}
    for rel, name in ENUM_SOURCES:
        if (pkg / rel).is_file():
            try:
                enums[name] = extract(pkg / rel, (name,), base_env)[name]
            except SglangNotFound:
                continue  # an older release: its backend does not import it
    ragged = None
    if facts.has_ragged_verify:
        ragged = extract(pkg / RAGGED_PATH, ("resolve_ragged_verify_layout",), env)["resolve_ragged_verify_layout"]
    return Helpers(fm, inner, replay_view, canon, enums, ragged)
