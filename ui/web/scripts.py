"""What a page loads, and when: plotly.js (most of a first visit's main-thread time) is downloaded with the page's
first scripts, compiled on a background thread while it downloads, and run while the server answers Dash's layout
request, instead of after the first graph asks for it.

- What is served is our partial bundle (ui/web/static/plotly-VERSION-TRACES.min.js, 1.06 MB, built by
  scripts/build_plotly_partial.py from the plotly package's own 4.85 MB file): plotly.js with only the trace
  types the figures draw (PARTIAL_TRACES); its top level runs in ~70 ms instead of ~1 s. When the installed plotly
  ships another plotly.js version than the bundle was built from (or the bundle is missing), the installed full
  bundle is served instead, and one line on stderr says so: never a bundle of another version.
- It is served by our own route with V8's compile-hint comment `//# allFunctionsCalledOnLoad` in front: Chromium
  then compiles every function while the script streams in, instead of one function at a time on the main thread
  as the code first runs (measured on the partial bundle: a little faster with it, benchmarks/results/web.md). The
  URL carries plotly.js's version, the trace list and a hash of the file, so a browser keeps it for a year; a gzip
  copy is made once, in the background, for a browser on the far side of an SSH tunnel (1.06 MB -> 356 KB).
- A `<link rel="preload">` in the page's head starts its download at once. Dash's own scripts, dcc's lazily loaded
  chunks included, are served by Dash as it documents (`serve_locally=True`, loaded on demand): no URL of Dash's
  is written here, so a Dash upgrade that renames its chunks changes nothing.
- Dash's `layout_pre` renderer hook (called as the layout request goes out) inserts the script and sets
  `window.Plotly` to a promise of it: dcc's graph loader uses `window.Plotly` when it is set (and waits on a
  promise), so plotly.js is loaded once, by us.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

HINT = b"//# allFunctionsCalledOnLoad\n"  # in front of every plotly.js served (see the module's docstring)
# The trace types ui/web/figures.py draws: the partial bundle registers these and no other
# (tests/web/test_scripts.py derives the set from the figures and checks it against the bundle).
PARTIAL_TRACES = ("bar", "heatmap", "scatter")
STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")
_VERSION_RE = re.compile(rb"\A/\*\*\n\* plotly\.js v(\S+)\n")


def plotly_version() -> str:
    """The version of the plotly.js bundled with the installed plotly package."""
    from plotly.offline import get_plotlyjs_version

    return str(get_plotlyjs_version())


def partial_name(version: str, traces: tuple[str, ...] = PARTIAL_TRACES) -> str:
    """The file name of the partial bundle of plotly.js `version` with `traces`."""
    return f"plotly-{version}-{'-'.join(sorted(traces))}.min.js"


def _full_bundle() -> str:
    return str(resources.files("plotly") / "package_data" / "plotly.min.js")


@dataclass(frozen=True)
class Bundle:
    """The plotly.js file served, and at which URL."""

    path: str
    url: str
    partial: bool
    data: bytes | None = field(default=None, repr=False, compare=False)  # the file, when already read


def full_bundle(version: str | None = None) -> Bundle:
    """The installed plotly package's full plotly.js."""
    version = version or plotly_version()
    return Bundle(_full_bundle(), f"/_specscope/plotly-{version}.min.js", False)


def bundle_version(path: str) -> str | None:
    """The plotly.js version a bundle's header names (None when unreadable or not plotly.js)."""
    try:
        with open(path, "rb") as f:
            return _header_version(f.read(200))
    except OSError:
        return None


def _header_version(head: bytes) -> str | None:
    m = _VERSION_RE.match(head)
    return m.group(1).decode() if m else None


def choose_bundle(version: str | None = None, static: str = STATIC) -> Bundle:
    """The partial bundle of the installed plotly.js version, or the full bundle (with one line on stderr) when
    the partial one is missing or was built from another version."""
    version = version or plotly_version()
    name = partial_name(version)
    path = os.path.join(static, name)
    try:
        with open(path, "rb") as f:
            data: bytes | None = f.read()  # read once: its header, its hash and what is served
    except OSError:
        data = None
    found = _header_version(data[:200]) if data is not None else None
    if found == version and data is not None:  # (found is None without data)
        # The content's hash in the URL: a rebuilt bundle of the same version and traces is a new URL, so a browser
        # never keeps an older build for the year it may cache the script.
        digest = hashlib.sha256(data).hexdigest()[:12]
        return Bundle(path, f"/_specscope/{name.removesuffix('.min.js')}-{digest}.min.js", True, data)
    if found is not None:
        why = f"{name} says it is plotly.js {found}"
    else:
        try:
            others = sorted(f for f in os.listdir(static) if f.startswith("plotly-") and f.endswith(".min.js"))
        except OSError:
            others = []
        why = f"no {name}" + (f" (there is {', '.join(others)})" if others else "")
    print(f"specscope web: the installed plotly ships plotly.js {version} and {why}: serving the full plotly.js "
          "bundle (rebuild the partial one with scripts/build_plotly_partial.py)", file=sys.stderr)
    return full_bundle(version)


def plotly_url() -> str:
    """The path plotly.js is served at by default (versioned: browsers may cache it for good)."""
    return choose_bundle().url


class PlotlyScript:
    """The bytes served for plotly.js: read once, with the compile hint; gzipped once in a background thread."""

    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self._lock = threading.Lock()
        self._plain: bytes | None = None
        self._gzip: bytes | None = None

    def plain(self) -> bytes:
        """The script as served: the compile hint, then the bundle."""
        with self._lock:
            if self._plain is None:
                data = self.bundle.data
                if data is None:
                    with open(self.bundle.path, "rb") as f:
                        data = f.read()
                self._plain = HINT + data
            return self._plain

    def gzipped(self) -> bytes | None:
        """The gzip copy, or None while it is still being made."""
        return self._gzip

    def prepare(self) -> None:
        """Read the script and gzip it (in a daemon thread: a first request never waits for the compression)."""

        def work() -> None:
            try:
                data = self.plain()
            except OSError:
                return  # a request for the script then fails with one line on stderr (app._http_error)
            self._gzip = gzip.compress(data, compresslevel=6, mtime=0)

        threading.Thread(target=work, name="specscope-web-gzip", daemon=True).start()


def register(server: Any, bundle: Bundle) -> str:
    """Add the route of `bundle` to the Flask server; returns its path."""
    import flask

    path = bundle.url
    script = PlotlyScript(bundle)
    script.prepare()

    def plotly_js() -> Any:
        headers = {"Cache-Control": "public, max-age=31536000, immutable", "Vary": "Accept-Encoding"}
        body = script.gzipped()
        if body is not None and "gzip" in flask.request.headers.get("Accept-Encoding", ""):
            headers["Content-Encoding"] = "gzip"
        else:
            body = script.plain()
        return flask.Response(body, mimetype="application/javascript", headers=headers)

    server.add_url_rule(path, "specscope_plotly_js", plotly_js)
    return path


def preload_links(plotly_path: str) -> str:
    """The `<link rel="preload">` tag for plotly.js (our route: Dash's own scripts are Dash's to load)."""
    return f'<link rel="preload" as="script" href="{plotly_path}">'


def layout_pre_hook(plotly_path: str) -> str:
    """JS for Dash's `layout_pre` renderer hook: load plotly.js (once) while the layout request is answered."""
    return ("function () { if (window.Plotly) return; var s = document.createElement('script'); s.src = '"
            + plotly_path + "'; window.Plotly = new Promise(function (ok, fail) { s.onload = function () "
            "{ ok(window.Plotly); }; s.onerror = fail; }); document.head.appendChild(s); }")
