"""The server arguments the audit evaluates: a configuration, and how it is picked out of a launch command."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..tracer import user_env
from .sglang_audit_source import AuditInputError

PLAN_ENV = user_env.SGLANG_PLAN_STREAM
# Server arguments the audit evaluates; their defaults come from the release's own field declarations.
SERVER_ARGS = ("attention_backend", "prefill_attention_backend", "decode_attention_backend",
               "speculative_attention_mode", "speculative_algorithm", "disable_overlap_schedule",
               "enable_multi_layer_eagle")


@dataclass
class ServerConfig:
    """The server arguments and environment the verdict depends on (None: not given, SGLang's default)."""

    attention_backend: str | None = None
    prefill_attention_backend: str | None = None
    decode_attention_backend: str | None = None
    speculative_attention_mode: str | None = None
    speculative_algorithm: str | None = None
    disable_overlap_schedule: bool | None = None
    enable_multi_layer_eagle: bool | None = None
    plan_stream: str | None = None  # the value of SGLANG_ENABLE_OVERLAP_PLAN_STREAM; None: unset

    def args(self) -> list[str]:
        """The configuration as launch-server flags (and the variable), for messages."""
        out = [f"{PLAN_ENV}={self.plan_stream}"] if self.plan_stream is not None else []
        for k in SERVER_ARGS:
            v = getattr(self, k)
            if isinstance(v, bool):
                out += [f"--{k.replace('_', '-')}"] if v else []
            elif v is not None:
                out += [f"--{k.replace('_', '-')}", v]
        return out


_STR_FLAGS = {f"--{k.replace('_', '-')}": k for k in SERVER_ARGS[:5]}
_BOOL_FLAGS = {f"--{k.replace('_', '-')}": k for k in SERVER_ARGS[5:]}
_ENV_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


def parse_server_command(tokens: list[str], config: ServerConfig | None = None) -> ServerConfig:
    """Pick the evaluated arguments (and `SGLANG_ENABLE_OVERLAP_PLAN_STREAM=...`) out of a launch command line;
    every other token (the model, the port, `python -m sglang.launch_server`) is ignored."""
    cfg = config or ServerConfig()
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        m = _ENV_ASSIGN.match(tok)
        if m and not tok.startswith("-"):
            if m.group(1) == PLAN_ENV:
                cfg.plan_stream = m.group(2)
            i += 1
            continue
        flag, eq, val = tok.partition("=")
        if flag in _STR_FLAGS:
            if not eq:
                if i + 1 >= len(tokens) or tokens[i + 1].startswith("--"):
                    raise AuditInputError(f"{flag} needs a value")
                val = tokens[i + 1]
                i += 1
            setattr(cfg, _STR_FLAGS[flag], val)
        elif flag in _BOOL_FLAGS:
            setattr(cfg, _BOOL_FLAGS[flag], True if not eq else val.lower() in ("1", "true", "yes", "y"))
        i += 1
    return cfg

