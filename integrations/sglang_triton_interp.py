"""Upstream's Triton kernel files (0.5.14+: the device page-table builder; 0.5.15+: the fused in-graph metadata
kernel), executed from the wheel; on a CPU their kernels are made under Triton's interpreter, what
`TRITON_INTERPRET=1` selects, scoped to this load."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .sglang_package import SglangNotFound
from .sglang_upstream_code import exec_module
from .sglang_versions import SglangFacts


def _module_name(rel: str) -> str:
    """`kernels/ops/attention/x.py` -> `sglang.kernels.ops.attention.x`."""
    return "sglang." + rel.removesuffix(".py").replace("/", ".")


def kernel_modules(pkg: Path, facts: SglangFacts, prefix: str, kernels: bool) -> dict[str, types.ModuleType]:
    """Upstream's Triton kernel files the backend imports, executed from the wheel, by their module names.

    On a CPU (`kernels=False`) they run under Triton's interpreter, what `TRITON_INTERPRET=1` selects: their
    `@triton.jit` kernels are made as interpreted functions (the setting scoped to this load), and each call of
    the files' launchers sees Triton's own library functions (`tl.cdiv`, `tl.cumsum`, ...) interpreted too, as a
    process started under `TRITON_INTERPRET=1` would; so upstream's own kernels compute the values on CPU
    tensors, and no other Triton code in the process changes."""
    rels = [r for r in (facts.page_table_kernel_path, facts.graph_metadata_kernel_path) if r is not None]
    if not rels:
        return {}
    try:
        import triton
    except ImportError as e:
        raise SglangNotFound(f"sglang {facts.version}'s backend imports Triton kernels; install triton "
                             f"(python -m pip install triton) to load it ({e})") from e
    out: dict[str, types.ModuleType] = {}
    runtime = triton.knobs.runtime
    with runtime.scope():
        runtime.interpret = not kernels
        for rel in rels:
            name = _module_name(rel)
            mod = exec_module(pkg / rel, f"{prefix}.{name.rsplit('.', 1)[1]}", {}, ())
            if not kernels:
                _interpret_launchers(mod)
            out[name] = mod
    return out


def _interpret_launchers(mod: types.ModuleType) -> None:
    """Wrap the module's plain Python functions (the launchers around its kernels) so that, while one runs,
    every library function of `triton.language` that is a compiled-mode `@jit` function is its interpreted twin."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    twins = {n: (v, InterpretedFunction(v.fn)) for n in dir(tl) if isinstance(v := getattr(tl, n), JITFunction)}
    depth = [0]  # launchers call each other: only the outermost call swaps and restores

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def launch(*args: Any, **kwargs: Any) -> Any:
            if depth[0] == 0:
                for n, (_, twin) in twins.items():
                    setattr(tl, n, twin)
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:
                    for n, (orig, _) in twins.items():
                        setattr(tl, n, orig)
        return launch

    for n, v in list(vars(mod).items()):
        if isinstance(v, types.FunctionType) and v.__module__ == mod.__name__:
            setattr(mod, n, wrap(v))
