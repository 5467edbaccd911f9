"""Copy the accepted snapshot SVGs to docs/screenshots/tui-*.svg (run after `--snapshot-update`)."""

from __future__ import annotations

import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "__snapshots__", "test_snapshots")
DST = os.path.join(HERE, "..", "..", "docs", "screenshots")


def main() -> None:
    """Copy each snapshot as tui-<screen>.svg."""
    os.makedirs(DST, exist_ok=True)
    for name in sorted(os.listdir(SRC)):
        if name.endswith(".svg"):
            screen = name.removeprefix("test_").replace("[", "-").replace("]", "").replace("_", "-")
            shutil.copyfile(os.path.join(SRC, name), os.path.join(DST, f"tui-{screen}"))
            print(f"docs/screenshots/tui-{screen}")


if __name__ == "__main__":
    main()
