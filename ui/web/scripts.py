"""What a page loads, and when: plotly.js (4.85 MB, most of a first visit's main-thread time) is downloaded with
the page's first scripts, compiled on a background thread while it downloads, and run while the server answers
Dash's layout request, instead of after the first graph asks for it.

- The script is served by our own route, the file of the installed plotly package with V8's compile-hint comment
  `//# allFunctionsCalledOnLoad` in front: Chromium then compiles every function while the script streams in,
  instead of one function at a time on the main thread as the code first runs (the same code, byte for byte).
  The URL carries plotly.js's version, so a browser keeps it for a year; a gzip copy is made once, in the
  background, for a browser on the far side of an SSH tunnel (4.85 MB -> about 1.4 MB).
- A `<link rel="preload">` in the page's head starts the download at once, with those of the lazily loaded
  chunks the first figures need (dcc's graph and range slider).
- Dash's `layout_pre` renderer hook (called as the layout request goes out) inserts the script and sets
  `window.Plotly` to a promise of it: dcc's graph loader uses `window.Plotly` when it is set (and waits on a
  promise), so plotly.js is loaded once, by us.
"""

from __future__ import annotations

import gzip
import threading
from importlib import resources
from typing import Any

HINT = b"//# allFunctionsCalledOnLoad\n"
# dcc's lazily loaded chunks (webpack names them, unversioned) that the first graph and slider mount.
CHUNKS = ("_dash-component-suites/dash/dcc/async-graph.js", "_dash-component-suites/dash/dcc/async-slider.js")


def plotly_version() -> str:
    """The version of the plotly.js bundled with the installed plotly package."""
    from plotly.offline import get_plotlyjs_version

    return str(get_plotlyjs_version())


def plotly_url() -> str:
    """The path plotly.js is served at (versioned: browsers may cache it for good)."""
    return f"/_specscope/plotly-{plotly_version()}.min.js"


class PlotlyScript:
    """The bytes served for plotly.js: read once, with the compile hint; gzipped once in a background thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plain: bytes | None = None
        self._gzip: bytes | None = None

    def plain(self) -> bytes:
        """The hinted script."""
        with self._lock:
            if self._plain is None:
                data = (resources.files("plotly") / "package_data" / "plotly.min.js").read_bytes()
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


def register(server: Any) -> str:
    """Add the plotly.js route to the Flask server; returns its path."""
    import flask

    path = plotly_url()
    script = PlotlyScript()
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
    """`<link rel="preload">` tags for plotly.js and the chunks of the first graph and slider."""
    links = [f'<link rel="preload" as="script" href="{plotly_path}">']
    links += [f'<link rel="preload" as="script" href="/{c}">' for c in CHUNKS]
    return "".join(links)


def layout_pre_hook(plotly_path: str) -> str:
    """JS for Dash's `layout_pre` renderer hook: load plotly.js (once) while the layout request is answered."""
    return ("function () { if (window.Plotly) return; var s = document.createElement('script'); s.src = '"
            + plotly_path + "'; window.Plotly = new Promise(function (ok, fail) { s.onload = function () "
            "{ ok(window.Plotly); }; s.onerror = fail; }); document.head.appendChild(s); }")
