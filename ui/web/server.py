"""Serving the dashboard: a threaded WSGI server on 127.0.0.1 (the command line's and the tests' one)."""

from __future__ import annotations

import errno
import logging
import socket
import threading
from typing import Any

from werkzeug.serving import BaseWSGIServer, get_sockaddr, make_server, select_address_family


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound and listening on host:port the way the server binds it; OSError when that fails.

    The server is then built on this socket, so a taken port is an OSError here instead of the server library's
    two lines on stderr and exit 1, and nothing can take the port between the check and the serving."""
    family = select_address_family(host, port)
    s = socket.socket(family, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does: restarts reuse TIME_WAIT
        s.bind(get_sockaddr(host, int(port), family))
        s.listen(128)
    except BaseException:
        s.close()
        raise
    return s


def listen_problem(host: str, port: int, e: OSError) -> str:
    """One sentence for a failed `listen_socket`."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if e.errno == errno.EADDRINUSE:
        return (f"cannot listen on {where}: the port is in use by another program (pick another with --port, or "
                "--port 0 for any free one)")
    return f"cannot listen on {where} ({e.strerror or e})"


def make(app: Any, host: str = "127.0.0.1", port: int = 0, quiet: bool = True,
         sock: socket.socket | None = None) -> BaseWSGIServer:
    """A threaded server for a Dash app (port 0: any free port; `server.server_port` says which), on `sock` from
    `listen_socket` or a new one (OSError when the address cannot be bound)."""
    if quiet:
        # One line per request on stderr would drown the one line that matters (the address).
        logging.getLogger("werkzeug").setLevel(logging.WARNING)
    if sock is None:
        sock = listen_socket(host, port)
    try:
        server = make_server(host, port, app.server, threaded=True, fd=sock.fileno())
    finally:
        sock.close()  # the server holds its own duplicate of the descriptor
    # On a given socket the server skips its bind, which is where http.server names the address it serves.
    server.server_name, server.server_port = host, int(server.server_address[1])
    return server


def serve_in_thread(app: Any, host: str = "127.0.0.1", port: int = 0) -> tuple[BaseWSGIServer, str]:
    """Start serving in a daemon thread; returns the server (call `shutdown()`) and its base URL."""
    server = make(app, host, port)
    threading.Thread(target=server.serve_forever, name="specscope-web", daemon=True).start()
    return server, f"http://{host}:{server.server_port}"
