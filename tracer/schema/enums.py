"""The enums the records use: forward modes, graph phases, violation severities."""

from __future__ import annotations

import enum


class ForwardMode(str, enum.Enum):
    """Forward modes, named as SGLang names them."""

    EXTEND = "EXTEND"
    DECODE = "DECODE"
    DRAFT_DECODE = "DRAFT_DECODE"
    TARGET_VERIFY = "TARGET_VERIFY"
    DRAFT_EXTEND = "DRAFT_EXTEND"


class GraphPhase(str, enum.Enum):
    """How a step ran: without a graph, while capturing one, or by replaying one."""

    EAGER = "eager"
    CAPTURE = "capture"
    REPLAY = "replay"


class Severity(str, enum.Enum):
    """Severity of an invariant violation."""

    ERROR = "error"
    WARNING = "warning"
