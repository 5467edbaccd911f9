"""The state every page module's callbacks share: the opened traces (`Dashboard`), how a callback finds them
(`current()`: the Flask app serving the request holds its dashboard in `extensions`), and the guard that turns any
failure inside a callback into one line on the page (`safe`)."""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import dash
from specscope.tracer.errors import TraceError

from .routes import InputError, RouteError, parse_route
from .scripts import Bundle
from .source import TraceSource

if TYPE_CHECKING:
    import flask
    from specscope.tracer.diff import DiffReport

    from .routes import Route

EXTENSION = "specscope"  # the key of the dashboard in the Flask app's `extensions`
MAX_COMPARE_STEPS = 2000  # step pairs tracer.diff decodes before it stops looking
T = TypeVar("T")


class Ahead:
    """One page built ahead in a background thread (the step after the one just served): `take` hands it over, or
    builds the page itself when no guess was made for it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pages: dict[tuple[object, ...], Any] = {}
        self._thread: threading.Thread | None = None
        self._building: tuple[object, ...] | None = None  # the page that thread builds

    def take(self, key: tuple[object, ...], build: Callable[[], T]) -> T:
        """The page of `key`: built ahead (waiting for the thread building it), or now."""
        with self._lock:
            page = self._pages.pop(key, None)
            running = self._thread if self._building == key else None
        if page is None and running is not None:
            running.join()  # it is building this very page
            with self._lock:
                page = self._pages.pop(key, None)
        return build() if page is None else page

    def start(self, key: tuple[object, ...], build: Callable[[], object]) -> None:
        """Build the page of `key` in a daemon thread, unless one is already building a page."""

        def work() -> None:
            try:
                page = build()
            except Exception:  # noqa: BLE001 - the page is built again on request, and reports its error then
                return
            with self._lock:
                self._pages = {key: page}  # only the latest guess is worth keeping

        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            t = threading.Thread(target=work, name="specscope-web-ahead", daemon=True)
            self._thread, self._building = t, key
        t.start()


class Dashboard:
    """The opened traces and the caches the callbacks share."""

    def __init__(self, trace: str, compare_with: str | None = None) -> None:
        self.sources: dict[str, TraceSource] = {"a": TraceSource(trace, "a")}
        if compare_with is not None:
            self.sources["b"] = TraceSource(compare_with, "b")
        self.version = 0
        self.plotly: Bundle | None = None  # the plotly.js the app serves (create_app sets it)
        self.ahead = Ahead()
        self._lock = threading.Lock()
        self._divergence: tuple[tuple[int, int], DiffReport] | None = None

    def refresh(self) -> bool:
        """Load the steps live traces gained; True when any did."""
        grew = False
        for s in self.sources.values():
            grew = s.refresh() or grew
        if grew:
            self.version += 1
        return grew

    def needs_poll(self) -> bool:
        """True while a trace is being written or its summaries are still loading (the page polls)."""
        return any(s.is_live() or s.loading() for s in self.sources.values())

    def source(self, key: str) -> TraceSource:
        """The trace with this key (only the ones named on the command line exist)."""
        if key not in self.sources:
            raise RouteError(f"no trace {key!r}")
        return self.sources[key]

    def divergence(self) -> DiffReport:
        """The A/B `tracer.diff.DiffReport` (cached per pair of trace lengths)."""
        from specscope.tracer.diff import diff_traces

        a, b = self.sources["a"], self.sources["b"]
        key = (a.num_steps(), b.num_steps())
        with self._lock:
            if self._divergence is None or self._divergence[0] != key:
                with a.locked(), b.locked():
                    rep = diff_traces(a.reader, b.reader, max_steps=MAX_COMPARE_STEPS)
                self._divergence = (key, rep)
            return self._divergence[1]

    def route(self, pathname: object, search: object) -> Route:
        """The route of an address (RouteError for one this dashboard does not serve)."""
        return parse_route(pathname, search, tuple(self.sources))

    def page(self, pathname: object, search: object) -> Any:
        """The components of the page at this address (the page module routes.PAGE_MODULES names builds them)."""
        import importlib

        from .routes import PAGE_MODULES

        r = self.route(pathname, search)
        module = importlib.import_module(f"{__package__}.{PAGE_MODULES[r.page]}")
        return module.layout(self, r)

    def install(self, server: flask.Flask) -> None:
        """Make this the dashboard of `server`'s requests (what `current()` returns in its callbacks)."""
        server.extensions[EXTENSION] = self


def current() -> Dashboard:
    """The dashboard of the app serving the current request (or of the app context a test pushed)."""
    import flask

    d = flask.current_app.extensions.get(EXTENSION)
    if not isinstance(d, Dashboard):
        raise RuntimeError("no specscope dashboard on this app")
    return d


def of(app: dash.Dash) -> Dashboard:
    """The dashboard `create_app` built `app` for."""
    d = app.server.extensions.get(EXTENSION)
    if not isinstance(d, Dashboard):
        raise RuntimeError("no specscope dashboard on this app")
    return d


def trigger_id(given: str | None = None) -> str | None:
    """The id of the input that fired the callback running now: `given` when the caller names it (a callback
    called as a plain Python function), else what Dash says, else None (outside a callback)."""
    if given is not None:
        return given
    try:
        tid = dash.ctx.triggered_id
    except dash.exceptions.MissingCallbackContextException:
        return None
    return tid if isinstance(tid, str) else None


def log(message: str) -> None:
    """One line on the server's stderr."""
    print(f"specscope web: {' '.join(message.split())}", file=sys.stderr)


def safe(fallback: Callable[[str], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Turn any exception in a callback into `fallback(message)` (one line, no traceback to the browser)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except dash.exceptions.PreventUpdate:
                raise
            except (RouteError, InputError, TraceError) as e:
                return fallback(str(e))
            except Exception as e:  # noqa: BLE001 - a page must never show a traceback
                log(f"{fn.__name__}: {type(e).__name__}: {e}")
                return fallback(f"internal error ({type(e).__name__}: {e})")

        return inner

    return wrap


def check_int(x: object, name: str, lo: int = 0, hi: int = 10**9) -> int:
    """A callback input that must be an integer in [lo, hi] (InputError otherwise)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != int(x) or not lo <= int(x) <= hi:
        raise InputError(f"{name} must be an integer in [{lo}, {hi}], not {str(x)[:40]!r}")
    return int(x)
