"""URL parsing for the dashboard: a request's path and query become a `Route`, or a `RouteError` with one line.

Nothing from a URL is ever used as a file name: a page is picked from a fixed set, a trace by its key ("a",
"b"), and every other parameter must be a small integer or a short identifier.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl

PAGES = ("timeline", "step", "acceptance", "violations", "compare")
# The module of ui/web that builds each page (its `layout(dashboard, route)`) and registers its callbacks (its
# `register(app)`).
PAGE_MODULES = {"timeline": "timeline", "step": "explorer", "acceptance": "acceptance", "violations": "violations",
                "compare": "compare"}
_PATH = re.compile(r"^/(?:(timeline|acceptance|violations|compare)/?)?$")
_STEP = re.compile(r"^/step/(\d{1,12})/?$")
_INT_PARAMS = ("row", "col", "request", "v")  # v: which of the step's violations (0-based)
_PARAMS = {"trace", "check", "array", *_INT_PARAMS}
_CHECK = re.compile(r"^[A-Z]{1,3}\d{1,4}$")
_ARRAY = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
MAX_INT = 10**9


class RouteError(ValueError):
    """A URL the dashboard does not serve; the message is one line for the page."""


class InputError(ValueError):
    """A callback input that is not what the page sends (a hand-made request); one line for the page."""


@dataclass(frozen=True)
class Route:
    """A parsed dashboard URL."""

    page: str
    trace: str = "a"
    step: int | None = None
    params: dict[str, int | str] = field(default_factory=dict)


def parse_route(pathname: object, search: object, traces: tuple[str, ...] = ("a",)) -> Route:
    """The route of `pathname` + `search` (`?k=v&...`); RouteError for anything malformed or unknown."""
    if pathname is None:
        pathname = "/"
    if not isinstance(pathname, str) or len(pathname) > 256:
        raise RouteError("malformed address")
    if search is None:
        search = ""
    if not isinstance(search, str) or len(search) > 512:
        raise RouteError("malformed query string")
    params: dict[str, int | str] = {}
    query = search[1:] if search.startswith("?") else search
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query), max_num_fields=16)
    except ValueError:
        raise RouteError("malformed query string") from None
    for k, v in pairs:
        if k not in _PARAMS:
            raise RouteError(f"unknown query parameter {k[:40]!r}")
        if k in params:
            raise RouteError(f"query parameter {k!r} given twice")
        if k in _INT_PARAMS:
            if not v.isdigit() or len(v) > 10 or int(v) > MAX_INT:
                raise RouteError(f"{k} must be a non-negative integer, not {v[:40]!r}")
            params[k] = int(v)
        elif k == "trace":
            if v not in traces:
                raise RouteError(f"no trace {v[:40]!r} (this dashboard serves {', '.join(traces)})")
            params[k] = v
        elif k == "check":
            if not _CHECK.match(v):
                raise RouteError(f"malformed invariant id {v[:40]!r}")
            params[k] = v
        else:
            if not _ARRAY.match(v):
                raise RouteError(f"malformed array name {v[:40]!r}")
            params[k] = v
    trace = str(params.pop("trace", "a"))
    m = _STEP.match(pathname)
    if m:
        return Route("step", trace, int(m.group(1)), params)
    m = _PATH.match(pathname)
    if not m:
        raise RouteError(f"no page at {pathname[:80]!r}")
    page = m.group(1) or "timeline"
    if params:
        raise RouteError(f"the {page} page takes no query parameters")
    return Route(page, trace)


def step_href(step: int, trace: str = "a", **params: int | str) -> str:
    """The address of a step page."""
    q = ([] if trace == "a" else [f"trace={trace}"]) + [f"{k}={v}" for k, v in params.items()]
    return f"/step/{int(step)}" + ("?" + "&".join(q) if q else "")
