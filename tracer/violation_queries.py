"""The violations of an open trace (from the recorder and from `check --write`): lists, filtered pages, counts, and
where one violation sits in a filtered list. SQL over the violations table; no step body is read."""

from __future__ import annotations

import json
from typing import Any

from .query import ViolationFilter
from .schema import Cell, ForwardMode, Severity, Violation
from .trace_file import TraceDb


class ViolationQueries:
    """Violation reads of one trace (`TraceReader` exposes each method under the same name)."""

    def __init__(self, db: TraceDb) -> None:
        self.db = db

    def violations(
        self,
        *,
        step: int | None = None,
        check_id: str | None = None,
        severity: str | Severity | None = None,
        source: str | None = None,
    ) -> list[Violation]:
        """Violations (recorded and appended by checkers), by step; filters combine with AND."""
        conds, params = [], []
        for col, val in (("step", step), ("check_id", check_id), ("source", source)):
            if val is not None:
                conds.append(f"v.{col} = ?")
                params.append(val)
        if severity is not None:
            conds.append("v.severity = ?")
            params.append(Severity(severity).value)
        where = (" WHERE " + " AND ".join(conds)) if conds else ""
        return self._read(where, params, " ORDER BY v.step, v.id")

    def violations_page(self, filter: ViolationFilter | None = None, offset: int = 0,
                        limit: int | None = 100) -> list[Violation]:
        """The violations matching `filter`, by step (then as stored), from the `offset`-th on, at most `limit`
        (None: all): a viewer lists any page of them without reading the rest."""
        where, params = _where(filter or ViolationFilter())
        page = "" if limit is None else f" LIMIT {max(0, int(limit))} OFFSET {max(0, int(offset))}"
        return self._read(where, params, " ORDER BY v.step, v.id" + page)

    def count_violations(self, filter: ViolationFilter | None = None) -> int:
        """How many violations match `filter` (one SQL count)."""
        where, params = _where(filter or ViolationFilter())
        join = " JOIN steps s ON s.idx = v.step" if "s.mode" in where else ""
        with self.db.guard("counting violations") as conn:
            return int(conn.execute(f"SELECT count(*) FROM violations v{join}{where}", params).fetchone()[0])

    def violation_position(self, filter: ViolationFilter | None, step: int, check_id: str) -> int | None:
        """The offset in `violations_page(filter)` of the first violation of `check_id` at `step` (None: none)."""
        f = filter or ViolationFilter()
        where, params = _where(f)
        join = " JOIN steps s ON s.idx = v.step" if "s.mode" in where else ""
        with self.db.guard("finding a violation") as conn:
            first = conn.execute(f"SELECT min(v.id) FROM violations v{join}{where}"
                                 f"{' AND' if where else ' WHERE'} v.step = ? AND v.check_id = ?",
                                 [*params, int(step), str(check_id)]).fetchone()[0]
            if first is None:
                return None
            cond = "(v.step < ? OR (v.step = ? AND v.id < ?))"
            sql = f"SELECT count(*) FROM violations v{join}{where}{' AND' if where else ' WHERE'} {cond}"
            return int(conn.execute(sql, [*params, int(step), int(step), int(first)]).fetchone()[0])

    def violation_sources(self) -> dict[str, int]:
        """Number of violations per source (`recorder`, `check`, ...)."""
        with self.db.guard("counting violations") as conn:
            rows = conn.execute("SELECT source, count(*) FROM violations GROUP BY source").fetchall()
            return {str(k): int(n) for k, n in rows}

    def count_violations_by_id(self) -> dict[str, int]:
        """Number of violations per check id."""
        with self.db.guard("counting violations") as conn:
            rows = conn.execute("SELECT check_id, count(*) FROM violations GROUP BY check_id").fetchall()
            return {str(k): int(n) for k, n in rows}

    def _read(self, where: str, params: list[Any], tail: str) -> list[Violation]:
        join = " JOIN steps s ON s.idx = v.step" if "s.mode" in where else ""
        with self.db.guard("reading violations") as conn:
            # Schema 1 has no cell columns and schema 2.0 no `related` column: they read as NULL. Read per call:
            # `check --write` may run while this reader is open, but it never changes the columns.
            have = {str(r[1]) for r in conn.execute("PRAGMA table_info(violations)")}
            names = ("array", "row", "col", "found", "expected", "related")
            cells = ", ".join(f"v.{c}" if c in have else "NULL" for c in names)
            sql = f"SELECT v.step, v.check_id, v.severity, v.request_id, v.message, {cells} FROM violations v"
            rows = conn.execute(sql + join + where + tail, params).fetchall()
            return [
                Violation(check_id=str(c), severity=Severity(sev), step=int(s), message=str(m),
                          request_id=None if rq is None else int(rq), array=None if a is None else str(a),
                          row=None if row is None else int(row), col=None if col is None else int(col),
                          found=None if fo is None else str(fo), expected=None if ex is None else str(ex),
                          related=tuple(Cell.from_dict(d) for d in json.loads(rel)) if rel else ())
                for s, c, sev, rq, m, a, row, col, fo, ex, rel in rows
            ]  # fmt: skip


def _where(f: ViolationFilter) -> tuple[str, list[Any]]:
    conds: list[str] = []
    params: list[Any] = []
    if f.check_ids:
        conds.append(f"v.check_id IN ({', '.join('?' * len(f.check_ids))})")
        params += [str(c) for c in f.check_ids]
    if f.severity is not None:
        conds.append("v.severity = ?")
        params.append(Severity(f.severity).value)
    if f.mode is not None:
        conds.append("s.mode = ?")
        params.append(ForwardMode(f.mode).value)
    if f.request_id is not None:
        conds.append("v.request_id = ?")
        params.append(int(f.request_id))
    if f.start is not None:
        conds.append("v.step >= ?")
        params.append(int(f.start))
    if f.stop is not None:
        conds.append("v.step < ?")
        params.append(int(f.stop))
    if f.text:
        # LIKE is case-insensitive for ASCII; its wildcards in the text are matched literally.
        esc = f.text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        conds.append("v.message LIKE ? ESCAPE '\\'")
        params.append(f"%{esc}%")
    return (" WHERE " + " AND ".join(conds)) if conds else "", params
