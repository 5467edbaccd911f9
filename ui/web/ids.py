"""Component ids the pages and their callbacks share: one place, so a layout and a callback cannot drift apart."""

from __future__ import annotations

# timeline
TL_OVERVIEW = "tl-overview"
TL_RANGE = "tl-range"
TL_FROM = "tl-from"
TL_TO = "tl-to"
TL_OUTLIERS = "tl-outliers"
TL_GANTT = "tl-gantt"
TL_OVERLAP = "tl-overlap"
TL_STATS = "tl-stats"
TL_GAPS = "tl-gaps"

# step explorer
STEP_INDEX = "step-index"
STEP_PREV = "step-prev"
STEP_NEXT = "step-next"
VIOL_PREV = "viol-prev"  # N: the previous violation (in this step, then before it)
VIOL_NEXT = "viol-next"  # n: the next violation
STEP_VIOLATIONS = "step-violations"
STEP_MARKS = "step-marks"
STEP_DETAIL = "step-detail"
STEP_HEATMAP = "step-heatmap"
STEP_CELL = "step-cell"

# violations page
VL_CHECKS = "vl-checks"
VL_SEVERITY = "vl-severity"
VL_MODE = "vl-mode"
VL_REQUEST = "vl-request"
VL_FROM = "vl-from"
VL_TO = "vl-to"
VL_TEXT = "vl-text"
VL_PAGE = "vl-page"
VL_PREV = "vl-prev"
VL_NEXT = "vl-next"
VL_TABLE = "vl-table"
VL_COUNT = "vl-count"
VL_POLL = "viol-poll"
VL_BODY = "viol-body"
