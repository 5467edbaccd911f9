"""The one exception type that reading or writing a trace raises."""

from __future__ import annotations

import os


class TraceError(Exception):
    """A trace could not be read or written; `str()` is one sentence naming the file and the problem."""

    def __init__(self, problem: str, path: str | os.PathLike[str] | None = None) -> None:
        # Messages end up on one stderr line, so newlines from nested errors are flattened here.
        self.problem = " ".join(str(problem).split())
        self.path = None if path is None else os.fspath(path)
        super().__init__(str(self))

    def __str__(self) -> str:
        return self.problem if self.path is None else f"{self.path}: {self.problem}"

    def with_path(self, path: str | os.PathLike[str]) -> TraceError:
        """This error, naming `path` if it names no file yet (keeps the subclass)."""
        if self.path is not None:
            return self
        err = type(self)(self.problem, path)
        err.__cause__ = self.__cause__
        return err


class TraceIndexError(TraceError, IndexError):
    """A step index that the trace does not hold."""
