"""Unreadable inputs through the real `specscope info` process: exit 2, one line on stderr, no traceback."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest
from conftest import write_small_trace


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m specscope.ui.cli ARGS` as a real process."""
    return subprocess.run(
        [sys.executable, "-m", "specscope.ui.cli", *args], capture_output=True, text=True, timeout=120
    )


def assert_one_line_error(p: subprocess.CompletedProcess[str], *expect: str) -> None:
    """Exit 2, exactly one stderr line starting `specscope: error:`, mentioning each of `expect`."""
    assert p.returncode == 2, (p.returncode, p.stderr)
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("specscope: error: "), p.stderr
    assert "Traceback" not in p.stderr
    for e in expect:
        assert e in lines[0], lines[0]


def _make(kind: str, d: str) -> tuple[str, str]:
    path = os.path.join(d, f"{kind}.db")
    if kind == "missing":
        return path, "no such file"
    if kind == "empty":
        open(path, "wb").close()
        return path, "empty file"
    if kind == "random":
        with open(path, "wb") as f:
            f.write(os.urandom(8192))
        return path, "not an SQLite database"
    if kind == "directory":
        os.mkdir(path)
        return path, "is a directory"
    if kind == "other_sqlite":
        with sqlite3.connect(path) as c:
            c.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
            c.execute("INSERT INTO users VALUES (1, 'x')")
        return path, "not a specscope trace"
    write_small_trace(path)
    if kind == "newer_major":
        with sqlite3.connect(path) as c:
            c.execute("UPDATE meta SET value = '2.0' WHERE key = 'schema_version'")
        return path, "written by a newer specscope (schema 2.0); this reader understands 1.x"
    if kind == "wrong_magic":
        with sqlite3.connect(path) as c:
            c.execute("UPDATE meta SET value = 'something-else' WHERE key = 'magic'")
        return path, "not a specscope trace"
    if kind == "truncated":
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.truncate(size // 2)
        return path, "truncated"
    if kind == "corrupt_page":
        with sqlite3.connect(path) as c:
            page = c.execute("PRAGMA page_size").fetchone()[0]
            root = c.execute("SELECT rootpage FROM sqlite_master WHERE name = 'steps'").fetchone()[0]
        with open(path, "r+b") as f:
            f.seek((root - 1) * page)
            f.write(os.urandom(page))
        return path, "damaged"
    if kind == "corrupt_schema_page":
        with open(path, "r+b") as f:
            f.seek(100)  # page 1 after the file header: the schema table
            f.write(b"\xff" * 3000)
        return path, "damaged"
    raise AssertionError(kind)


KINDS = ["missing", "empty", "random", "directory", "other_sqlite", "newer_major", "wrong_magic", "truncated",
         "corrupt_page", "corrupt_schema_page"]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_info_unreadable(kind: str, tmp_path: os.PathLike[str]) -> None:
    path, expect = _make(kind, str(tmp_path))
    p = run_cli("info", path)
    assert_one_line_error(p, path, expect)
    assert p.stdout == ""


@pytest.mark.parametrize("kind", ["random", "newer_major", "corrupt_page"])
def test_info_json_unreadable(kind: str, tmp_path: os.PathLike[str]) -> None:
    path, expect = _make(kind, str(tmp_path))
    assert_one_line_error(run_cli("info", "--json", path), expect)


def test_help_and_version() -> None:
    h = run_cli("--help")
    assert h.returncode == 0 and "info" in h.stdout
    v = run_cli("--version")
    assert v.returncode == 0 and v.stdout.startswith("specscope ")
    bare = run_cli()
    assert bare.returncode == 2 and "COMMAND" in bare.stdout
