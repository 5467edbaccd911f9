"""The `specscope` command: argparse front end that dispatches to `ui/cmd_<name>.py` modules.

A subcommand is a module `specscope.ui.cmd_<name>` exposing `add_parser(subparsers) -> None` and
`run(args) -> int`. Its top level imports only the standard library (and specscope.tracer.user_env, the
documented variables, itself standard library only); heavy dependencies (torch, textual, dash) are imported
inside `run`, so `specscope info` never loads torch and `specscope run` on a bare GPU host never loads textual.
Add a subcommand by appending its name to SUBCOMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from specscope.tracer import user_env

# The order `specscope --help` lists them in. Planned: "run", "demo", "check", "tui", "web", "export".
SUBCOMMANDS: list[str] = ["demo", "run", "check", "info", "export", "replay", "diff", "sglang_hook", "web", "tui",
                          "upgrade", "sglang_audit"]

EXIT_OK = 0
EXIT_UNREADABLE = 2  # also argparse's usage-error code


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("specscope")
    except Exception:  # noqa: BLE001 - not installed as a distribution (e.g. a source checkout)
        return "unknown"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors: the line that matters, then where the full usage is."""

    def error(self, message: str) -> NoReturn:
        _error(f"{message} (see `{self.prog} --help`)")
        sys.exit(EXIT_UNREADABLE)


def build_parser() -> argparse.ArgumentParser:
    """The full parser, with every registered subcommand."""
    parser = _Parser(
        prog="specscope",
        description="Record, check and inspect speculative-decoding steps of a TRTLLM MHA attention backend.",
    )
    parser.add_argument("--version", action="version", version=f"specscope {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in SUBCOMMANDS:
        module = importlib.import_module(f"specscope.ui.cmd_{name}")
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit status."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # Name the subcommand's help, not the top-level one: that is where the right flags are listed.
        command = f"specscope {args.command}" if getattr(args, "command", None) else "specscope"
        _error(f"unrecognized arguments: {' '.join(extra)} (see `{command} --help`)")
        return EXIT_UNREADABLE
    if getattr(args, "run", None) is None:
        parser.print_help()
        return EXIT_UNREADABLE
    from specscope.tracer.errors import TraceError

    try:
        return int(args.run(args))
    except TraceError as e:
        _error(str(e))
        return EXIT_UNREADABLE
    except KeyboardInterrupt:
        # Subcommands that write files say where their output is; this is the fallback.
        print("specscope: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `specscope info t.db | head`: the reader went away; say nothing.
        sys.stderr.close()
        return EXIT_OK
    except Exception as e:
        if user_env.debug():
            raise
        _error(f"{type(e).__name__}: {e} (set SPECSCOPE_DEBUG=1 for a traceback)")
        if _is_sticky_cuda_error(e):
            # The CUDA context is gone: torch's destructors at interpreter exit would print C++ warnings and
            # abort (exit 134). The trace is already closed, so leave without running them.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(EXIT_UNREADABLE)
        return EXIT_UNREADABLE


def _is_sticky_cuda_error(e: BaseException) -> bool:
    # By name: the CLI must not import torch to recognise torch's error type.
    return type(e).__name__ == "AcceleratorError" or (isinstance(e, RuntimeError) and "CUDA error" in str(e))


def _error(message: str) -> None:
    # Always exactly one line: tools and tests parse stderr.
    print(f"specscope: error: {' '.join(message.split())}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
