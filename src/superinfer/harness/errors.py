"""Errors the harness reports to a user as one line (no traceback)."""

from __future__ import annotations

__all__ = ["DataError", "TraceFormatError", "UserError"]


class UserError(Exception):
    """A mistake in what the user asked for or supplied; its message is the whole report."""


class DataError(UserError):
    """A data file is missing, unreadable or fails its checksum."""


class TraceFormatError(DataError):
    """A trace file is malformed.

    Attributes:
        path: the file.
        line: 1-based line number (the header is line 1), or ``None`` for the whole file.
        field: the offending column or key, or ``None``.
    """

    def __init__(self, path: object, line: int | None, field: str | None, problem: str) -> None:
        where = f"{path}:{line}" if line is not None else f"{path}"
        what = f" field {field!r}:" if field else ""
        super().__init__(f"{where}:{what} {problem}")
        self.path, self.line, self.field = path, line, field
