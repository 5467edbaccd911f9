"""Component ids of the dashboard: one place, so a layout, its callbacks, the page's CSS and its key handling cannot
drift apart. Every id a ui/web module gives a component, or names in a callback, comes from here."""

from __future__ import annotations

# the shell around every page (app.py)
URL = "url"
LIVE = "live"  # the live poll's interval
VERSION = "version"  # how many times the traces grew (the pages that summarize a trace redraw on it)
LIVE_STATUS = "live-status"
RECORDING_NOTES = "recording-notes"
PAGE = "page"
NAV_TIMELINE = "nav-timeline"
NAV_ACCEPTANCE = "nav-acceptance"
NAV_VIOLATIONS = "nav-violations"
NAV_COMPARE = "nav-compare"
NAV_STEP = "nav-step"
ERROR_MESSAGE = "error-message"


def loading(key: str) -> str:
    """The banner of trace `key` while its summaries load."""
    return f"loading-{key}"


def recording_notes(key: str) -> str:
    """The banner of what trace `key`'s recording could not record."""
    return f"recording-notes-{key}"


# timeline
TL_PAGE = "timeline-page"
TL_EMPTY = "tl-empty"
TL_OVERVIEW = "tl-overview"
TL_RANGE = "tl-range"
TL_FROM = "tl-from"
TL_TO = "tl-to"
TL_OUTLIERS = "tl-outliers"
TL_GANTT = "tl-gantt"
TL_OVERLAP = "tl-overlap"
TL_STATS = "tl-stats"
TL_WINDOW_STATS = "tl-window-stats"
TL_GAPS = "tl-gaps"

# step explorer
STEP_PAGE = "step-page"
STEP_INDEX = "step-index"
STEP_PREV = "step-prev"
STEP_NEXT = "step-next"
STEP_POS = "step-pos"
VIOL_PREV = "viol-prev"  # N: the previous violation (in this step, then before it)
VIOL_NEXT = "viol-next"  # n: the next violation
VIOLATION_BANNER = "violation-banner"
STEP_VIOLATIONS = "step-violations"
STEP_VIOLATIONS_REST = "step-violations-rest"
STEP_MARKS = "step-marks"
STEP_DETAIL = "step-detail"
STEP_HEATMAP = "step-heatmap"
STEP_CELL = "step-cell"
STEP_NOT_RECORDED = "step-not-recorded"
CELL_TABLE = "cell-table"
SEQLENS_TABLE = "seqlens-table"
REQUEST_TABLE = "request-table"
DRAFT_CHAIN = "draft-chain"

# acceptance
ACC_PAGE = "acceptance-page"
ACC_EMPTY = "acc-empty"
ACC_STATS = "acc-stats"
ACC_POSITION = "acc-position"
ACC_HIST = "acc-hist"
ACC_TIME = "acc-time"
ACC_BS = "acc-bs"
ACC_REQUEST = "acc-request"

# violations page
VL_PAGE_ROOT = "violations-page"
VL_PROGRESS = "viol-progress"
VL_NONE = "viol-none"
VL_INVARIANTS = "viol-invariants"
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

# compare
CMP_PAGE = "compare-page"
CMP_NONE = "cmp-none"
CMP_TRACES = "cmp-traces"
CMP_VERDICT = "cmp-verdict"
CMP_FIRST = "cmp-first"  # a divergence block; its links and table are CMP_FIRST + "-open-a" ... (see `divergence`)
CMP_FORWARD = "cmp-forward"
CMP_ACC = "cmp-acc"
CMP_POSITION = "cmp-position"
CMP_HIST = "cmp-hist"
CMP_TIME = "cmp-time"


def divergence(block: str, part: str) -> str:
    """The id of part `part` ("open-a", "open-b", "diffs") of divergence block `block`."""
    return f"{block}-{part}"
