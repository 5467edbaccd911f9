"""`specscope sglang-hook install|uninstall|status`: the start-up hook that records a real SGLang server.

`install` writes one `.pth` file into site-packages (see `specscope.integrations.sglang_hook`); with it in
place, any Python process of that environment started with `SPECSCOPE_TRACE=PATH` records every forward SGLang's
TRTLLM MHA backend prepares into PATH. Without the variable the hook does nothing. docs/sglang.md has the
commands for a server. `install` also audits that sglang statically (`specscope sglang-audit`) and warns when a
common configuration would raise at its first verify with the overlap plan stream on.
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
from pathlib import Path

from specscope.tracer import user_env

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register `sglang-hook`."""
    p = subparsers.add_parser(
        "sglang-hook", help="install / remove the start-up hook that records a live SGLang server",
        description="Manage the .pth start-up hook that instruments SGLang's TRTLLMHAAttnBackend when "
                    "SPECSCOPE_TRACE=PATH is set (no SGLang file is edited).")
    p.add_argument("action", choices=("install", "uninstall", "status"))
    p.add_argument("--site-packages", metavar="DIR",
                   help="where the .pth goes (default: this interpreter's site-packages, "
                        f"{sysconfig.get_paths()['purelib']})")
    p.set_defaults(run=run)


def _error(msg: str) -> None:
    print(f"specscope: error: {msg}", file=sys.stderr)


def _plan_stream_warning(site: Path) -> None:
    # The sglang this hook will record, audited statically (about a second, no torch): with the overlap plan
    # stream on, a server whose verify lands on a backend without the fix-up hook dies at its first verify. The
    # install has succeeded whatever the audit says, so an sglang it cannot read is passed over in silence.
    try:
        from specscope.integrations.sglang_audit import plan_stream_warning

        # The sglang beside the .pth when that site-packages holds one, else the one this interpreter imports.
        lines = plan_stream_warning(path=str(site) if (site / "sglang").is_dir() else None)
    except Exception:  # noqa: BLE001 - never fail or clutter the install because of the audit
        return
    for line in lines:
        print(line, file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """Install, remove or report the hook; exit 0 on success (status: 0 installed, 1 not installed)."""
    from specscope.integrations.sglang_hook import ENV, PTH_LINE, PTH_NAME

    site = Path(args.site_packages or sysconfig.get_paths()["purelib"])
    pth = site / PTH_NAME
    if args.action in ("install", "uninstall") and not site.is_dir():
        _error(f"{site}: no such directory")
        return EXIT_USAGE
    if args.action == "install":
        try:
            pth.write_text(PTH_LINE, encoding="utf-8")
        except OSError as e:
            _error(f"cannot write {pth}: {e.strerror or e}")
            return EXIT_USAGE
        print(f"installed {pth}")
        print(f"record a server with: {ENV}=/tmp/sglang-{{pid}}.db python -m sglang.launch_server ...")
        _plan_stream_warning(site)
        return EXIT_OK
    if args.action == "uninstall":
        if not pth.exists():
            print(f"not installed ({pth} absent)")
            return EXIT_OK
        try:
            pth.unlink()
        except OSError as e:
            _error(f"cannot remove {pth}: {e.strerror or e}")
            return EXIT_USAGE
        print(f"removed {pth}")
        return EXIT_OK
    installed = pth.is_file() and pth.read_text(encoding="utf-8", errors="replace") == PTH_LINE
    print(f"hook: {'installed' if installed else 'not installed'} ({pth})")
    trace = user_env.get(ENV)
    print(f"{ENV}: {trace if trace else 'unset (the hook does nothing)'}")
    try:
        from importlib.metadata import version

        sg = version("sglang")
    except Exception:  # noqa: BLE001 - not installed
        sg = "not installed"
    print(f"sglang: {sg}")
    return EXIT_OK if installed else EXIT_FAIL
