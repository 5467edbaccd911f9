"""Opening a trace file read-only and validating it: the file's bytes, its SQLite connection, its meta table and run
record, and the one boundary (`TraceDb.guard`) through which every read turns damaged bytes into one sentence."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import sqlite3
import struct
import threading
import zlib
from collections.abc import Iterator

import zstandard

from . import tables
from .errors import TraceError
from .schema import MAGIC, SCHEMA_MAJOR, RunInfo

# What damaged bytes can raise on their way through sqlite3, zlib, json, numpy and the schema types.
DAMAGE = (
    sqlite3.Error, zlib.error, zstandard.ZstdError, struct.error, ValueError, KeyError, TypeError, IndexError,
    AttributeError, OverflowError, RecursionError, MemoryError,
)  # fmt: skip


def check_file(path: str) -> None:
    """Raise TraceError unless `path` is an existing, non-empty, complete-looking SQLite file."""
    try:
        with open(path, "rb") as f:
            head = f.read(100)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        raise TraceError("no such file", path) from None
    except IsADirectoryError:
        raise TraceError("is a directory, not a trace file", path) from None
    except OSError as e:
        raise TraceError(f"cannot be read ({e.strerror or e})", path) from None
    if size == 0:
        raise TraceError("empty file (0 bytes), not a specscope trace", path)
    if not head.startswith(tables.SQLITE_HEADER):
        raise TraceError("not a specscope trace (not an SQLite database)", path)
    if len(head) < 100:
        raise TraceError(f"truncated SQLite file ({size} bytes, shorter than its header)", path)
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    num_pages = int.from_bytes(head[28:32], "big")
    size_valid = head[24:28] == head[92:96]  # the in-header size is only trusted when these match
    # A live writer's WAL can hold pages the main file lacks; only judge the size of a settled file.
    try:
        settled = os.path.getsize(path + "-wal") == 0
    except OSError:
        settled = True  # no WAL beside it
    if size_valid and settled and size < num_pages * page_size:
        raise TraceError(f"truncated ({size} of {num_pages * page_size} bytes present)", path)


def _connect(uri: str) -> sqlite3.Connection:
    # Autocommit (no implicit transactions), and usable from the viewers' loader threads under the reader's lock.
    return sqlite3.connect(uri, uri=True, isolation_level=None, check_same_thread=False)


def open_read_only(path: str) -> sqlite3.Connection:
    """A read-only connection to the trace at `path` (TraceError, one sentence, when SQLite cannot open it)."""
    uri = pathlib.Path(path).resolve().as_uri() + "?mode=ro"
    try:
        conn = _connect(uri)
        try:
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            return conn
        except sqlite3.OperationalError:
            # A WAL-mode file in a read-only folder cannot get its -shm: read it as an immutable file.
            conn.close()
            if os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
                raise
            return _connect(uri + "&immutable=1")
    except sqlite3.OperationalError as e:
        raise TraceError(f"cannot be opened (SQLite: {' '.join(str(e).split())})", path) from None
    except sqlite3.Error as e:
        raise TraceError(f"damaged or unreadable (SQLite: {' '.join(str(e).split())})", path) from None
    except ValueError as e:  # e.g. UnicodeDecodeError from a damaged schema text
        raise TraceError(f"damaged or unreadable ({type(e).__name__})", path) from None


class TraceDb:
    """One read-only connection to a trace, the lock its users share, and the damage boundary every read passes."""

    def __init__(self, conn: sqlite3.Connection, display_path: str) -> None:
        self.conn = conn
        self.display_path = display_path  # the file the user named (a bundle's .zip, not its trace.db copy)
        self.lock = threading.RLock()  # one connection, read from the viewers' loader threads

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[sqlite3.Connection]:
        """Hold the lock and yield the connection; any way damaged bytes fail becomes one TraceError naming the
        file and `what` was being done."""
        try:
            with self.lock:
                yield self.conn
        except TraceError as e:
            raise e.with_path(self.display_path) from None
        except DAMAGE as e:
            detail = " ".join(str(e).split())[:200]
            if isinstance(e, sqlite3.Error):
                problem = f"damaged or unreadable while {what} (SQLite: {detail})"
            else:
                problem = f"damaged while {what} ({type(e).__name__}: {detail})"
            raise TraceError(problem, self.display_path) from None

    def close(self) -> None:
        """Close the connection."""
        with self.lock:
            self.conn.close()


def check_meta(db: TraceDb, path: str) -> tuple[str, int]:
    """(schema version text, major) of a specscope trace this reader understands; TraceError otherwise."""
    with db.guard("reading its table list") as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "meta" not in names:
        problem = "not a specscope trace (SQLite database without the specscope tables)"
        raise TraceError(problem, path)
    with db.guard("reading its meta table") as conn:
        meta = dict(conn.execute("SELECT key, value FROM meta").fetchall())
    if meta.get("magic") != MAGIC:
        raise TraceError("not a specscope trace (its meta table lacks the specscope magic)", path)
    version = meta.get("schema_version")
    try:
        major, _minor = (int(p) for p in str(version).split("."))
    except ValueError:
        raise TraceError(f"damaged: unreadable schema version {version!r}", path) from None
    if major > SCHEMA_MAJOR:
        raise TraceError(
            f"written by a newer specscope (schema {version}); this reader understands {SCHEMA_MAJOR}.x",
            path,
        )
    if major < 1:
        raise TraceError(f"damaged: unknown schema version {version}", path)
    required = tables.REQUIRED_TABLES_V1 if major < 2 else tables.REQUIRED_TABLES
    missing = [t for t in required if t not in names]
    if missing:
        raise TraceError(f"damaged: table {missing[0]!r} is missing", path)
    return str(version), major


def read_run(db: TraceDb) -> RunInfo:
    """The run record (config, models, GPU, versions, ...)."""
    with db.guard("reading its run record") as conn:
        row = conn.execute("SELECT info FROM run WHERE id = 1").fetchone()
        if row is None:
            raise TraceError("damaged: the run record is missing")
        d = json.loads(row[0])
        run = RunInfo.from_dict(d)
        if not isinstance(run.config, dict) or not isinstance(run.versions, dict):
            raise TypeError("run config and versions must be objects")
        return run
