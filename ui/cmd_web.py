"""`specscope web TRACE [--compare TRACE_B]`: the Dash dashboard (timeline, step explorer, acceptance, violations,
comparison), served on 127.0.0.1 only unless --host says otherwise."""

from __future__ import annotations

import argparse

from .args import integer


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the `web` subcommand."""
    p = subparsers.add_parser("web", help="browse a trace in a web dashboard", description=__doc__,
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("trace", metavar="TRACE", help="trace file (.db); may still be being written (the page follows it)")
    p.add_argument("--compare", metavar="TRACE_B", help="a second trace for the Compare page")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to bind; keep 127.0.0.1 and use an SSH tunnel from your laptop")
    p.add_argument("--port", **integer(0, 65535, "a TCP port (0-65535)"), default=8050,
                   help="port to listen on (0: any free port)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Open the traces, then serve until Ctrl-C."""
    import sys

    try:
        from specscope.ui.web.app import create_app
        from specscope.ui.web.server import listen_problem, listen_socket, make
    except ModuleNotFoundError as e:
        print(f"specscope: error: the dashboard needs {e.name} (pip install -e '.[web]')", file=sys.stderr)
        return 2
    try:  # before the traces load, so a taken port is known at once; the server is built on this socket
        sock = listen_socket(args.host, args.port)
    except OSError as e:
        print(f"specscope: error: {listen_problem(args.host, args.port, e)}", file=sys.stderr)
        return 2
    try:
        app = create_app(args.trace, args.compare)  # a TraceError becomes one line and exit 2 in cli.main
    except BaseException:
        sock.close()
        raise
    server = make(app, args.host, args.port, sock=sock)
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"specscope web: serving {args.trace}" + (f" and {args.compare}" if args.compare else "")
          + f" on http://{host}:{server.server_port}/  (Ctrl-C stops)", flush=True)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"specscope web: warning: listening on {args.host}: anyone who can reach it can read the trace",
              file=sys.stderr)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
