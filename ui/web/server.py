"""Serving the dashboard: a threaded WSGI server on 127.0.0.1 (the command line's and the tests' one)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from werkzeug.serving import BaseWSGIServer, make_server


def make(app: Any, host: str = "127.0.0.1", port: int = 0, quiet: bool = True) -> BaseWSGIServer:
    """A threaded server for a Dash app (port 0: any free port; `server.server_port` says which)."""
    if quiet:
        # One line per request on stderr would drown the one line that matters (the address).
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    return make_server(host, port, app.server, threaded=True)


def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0) -> tuple[BaseWSGIServer, str]:
    """Start serving in a daemon thread; returns the server (call `shutdown()`) and its base URL."""
    server = make(app, host, port)
    threading.Thread(target=server.serve_forever, name="specscope-web", daemon=True).start()
    return server, f"http://{host}:{server.server_port}"
