"""The trace store: one SQLite file (WAL) per trace, written by TraceWriter and read by TraceReader.

The table layout is in `tables/layout.py` and `docs/trace-format.md`.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable

from . import tables
from .errors import TraceError
from .reader import TraceReader
from .schema import Violation
from .writer import TraceWriter, connect_rw, settle

__all__ = ["TraceError", "TraceReader", "TraceWriter", "append_violations", "mark_checked"]


def append_violations(
    path: str | os.PathLike[str],
    violations: Iterable[Violation],
    *,
    source: str = "check",
    replace: bool = False,
) -> int:
    """Add violations found after the run to a trace (one transaction); returns how many were added.

    With `replace=True`, violations previously added with the same `source` are removed first, so
    re-running a checker does not duplicate them. Safe while a writer is still appending. Schema 1 traces
    take violations too (without the cell columns, which they lack).
    """
    path = os.fspath(path)
    rows = [tables.violation_row(v, source) for v in violations]
    with TraceReader(path) as r:  # validates: a specscope trace this version can read
        closed = r.is_closed()
    try:
        conn = connect_rw(path)
        try:
            # Older traces lack some cell columns (schema 1 all of them, 2.0 `related`): write what they hold.
            sql, n = tables.violation_insert([str(c[1]) for c in conn.execute("PRAGMA table_info(violations)")])
            rows = [row[:n] for row in rows]
            conn.execute("BEGIN IMMEDIATE")
            if replace:
                conn.execute("DELETE FROM violations WHERE source = ?", (source,))
            conn.executemany(sql, rows)
            conn.execute("COMMIT")
            if closed:
                settle(conn)
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise TraceError(f"cannot add violations (SQLite: {e})", path) from None
    return len(rows)


def mark_checked(path: str | os.PathLike[str], through: int) -> None:
    """Record that the catalogue's verdicts for steps <= `through` are in the violations table (meta
    `checked_through`), so viewers know how far the violations of a live trace are complete."""
    path = os.fspath(path)
    with TraceReader(path) as r:
        closed = r.is_closed()
    try:
        conn = connect_rw(path)
        try:
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('checked_through', ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (str(int(through)),),
            )
            if closed:
                settle(conn)
        finally:
            conn.close()
    except sqlite3.Error as e:
        raise TraceError(f"cannot mark the trace checked (SQLite: {e})", path) from None
