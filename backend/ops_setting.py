"""The `--fused-ops` setting (`EngineConfig.fused_ops`): the op sets fused_ops.py runs, their on/off aliases, parsing.

Torch-free, and below both engine_config.py (which validates a run's settings) and fused_ops.py (which picks an op
set from one), so neither imports the other.
"""

from __future__ import annotations

from .config_error import ConfigError

# The op sets backend/fused_ops.py runs ("auto": flashinfer's fused kernels where they can run, else plain), and
# the on/off spellings `--fused-ops` takes for them.
FUSED_OPS = ("auto", "plain", "fused-torch", "flashinfer")
FUSED_OPS_ALIASES = {"on": "auto", "1": "auto", "true": "auto", "off": "plain", "0": "plain", "false": "plain"}


def fused_ops_setting(value: object) -> str:
    """`value` as one of FUSED_OPS (case-insensitive; an on/off alias maps onto auto/plain); else a ConfigError."""
    s = value.strip().lower() if isinstance(value, str) else None
    s = FUSED_OPS_ALIASES.get(s, s) if s is not None else None
    if s not in FUSED_OPS:
        raise ConfigError(f"--fused-ops must be one of {', '.join(FUSED_OPS)}, got {value!r}")
    return s
