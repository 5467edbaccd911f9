"""`specscope sglang-audit`: will the overlap plan stream's fix-up hook raise on this SGLang server?

With `SGLANG_ENABLE_OVERLAP_PLAN_STREAM` set, SGLang's EAGLE-family workers prepare the verify's metadata on a
second stream and then call `target_attn_backend.update_verify_buffers_to_fill_after_draft(...)` before the verify
runs. The base `AttentionBackend` raises `NotImplementedError` there, so a server whose target backend lands on that
default dies at its first verify. This module answers the question from SGLang's source alone, read statically
with `ast` (an installed package, an unpacked wheel or a `.whl`; torch and SGLang are never imported):

- every `AttentionBackend` subclass and where the method resolves for it: defined (a no-op, a body, a forward to
  a child backend), inherited non-raising, or the raising default;
- the backend registry (`@register_attention_backend("name")`): which classes each name builds, and when;
- the call sites, the workers that reach them and the speculative algorithms that pick those workers;
- for given server arguments, the object the verify's call lands on, through the wrappers (`HybridAttnBackend`
  for different prefill and decode backends, and whatever any wrapper's method forwards to), and whether the first
  verify raises.

Nothing is tabulated per release: each answer is derived from the source it reads.

The facts live in `sglang_audit_classes` (the hierarchy) and `sglang_audit_wiring` (registry, call sites, workers),
the configuration in `sglang_audit_args`, the answer in `sglang_audit_verdict`, its output in
`sglang_audit_report`; this module holds the entry points: the cached audit of a source and the install warning.
"""

from __future__ import annotations

import os

from ..tracer import user_env
from .sglang_audit_args import PLAN_ENV, parse_server_command
from .sglang_audit_source import AuditInputError, open_source
from .sglang_audit_verdict import DEFAULT_ALGORITHM, EXIT_RAISES, EXIT_SAFE, judge
from .sglang_audit_wiring import Audit

_CACHE: dict[tuple[str, str | None, str | None], Audit] = {}


def load(path: str | None = None, version: str | None = None) -> Audit:
    """The audit of an SGLang source (see `open_source`), cached per process."""
    key = (os.path.abspath(path) if path else "", version, None)
    if key not in _CACHE:
        _CACHE[key] = Audit(open_source(path, version))
    return _CACHE[key]


# The configurations `sglang-hook install` checks: TRTLLM MHA alone (Blackwell) and TRTLLM MHA for decode with
# FlashAttention 3 for prefill (Hopper), the two recipes of docs/sglang.md.
COMMON = (("--attention-backend", "trtllm_mha"),
          ("--prefill-attention-backend", "fa3", "--decode-attention-backend", "trtllm_mha"))


def plan_stream_warning(environ: dict[str, str] | None = None, path: str | None = None) -> list[str]:
    """At most two lines for `sglang-hook install`: the common configurations that raise at the first verify with
    the plan stream on, on the installed sglang (or `path`); empty when none does."""
    audit = load(path)
    value = user_env.get(PLAN_ENV, environ)
    on = audit.plan_stream_on(value) if value is not None else False
    bad: list[str] = []
    fixes: list[str] = []
    for args in COMMON:
        cfg = parse_server_command(list(args) + ["--speculative-algorithm", DEFAULT_ALGORITHM])
        cfg.plan_stream = "1"
        try:
            if judge(audit, cfg).exit_code != EXIT_RAISES:
                continue
            bad.append(" ".join(args))
            cfg.speculative_attention_mode = "decode"
            if judge(audit, cfg).exit_code == EXIT_SAFE:
                fixes.append(" ".join(args))
        except AuditInputError:
            continue
    if not bad:
        return []
    state = f"{PLAN_ENV} is on here" if on else f"with {PLAN_ENV}=1"
    fix = " (add --speculative-attention-mode decode)" if fixes == bad else ""
    return [f"specscope: warning: {state}, sglang {audit.version} raises NotImplementedError at the first verify "
            f"with {'; '.join(bad)}{fix}",
            "specscope: warning: check a server's arguments with `specscope sglang-audit -- <launch command>`"]
