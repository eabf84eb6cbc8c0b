"""Errors the harness reports to a user as one line (no traceback)."""

from __future__ import annotations

__all__ = ["DataError", "SpecError", "TraceFormatError", "UserError"]


class UserError(Exception):
    """A mistake in what the user asked for or supplied; its message is the whole report."""


class DataError(UserError):
    """A data file is missing, unreadable or fails its checksum."""


def _located(path: object, line: int | None, field: str | None, problem: str) -> str:
    where = f"{path}:{line}" if line is not None else f"{path}"
    what = f" field {field!r}:" if field else ""
    return f"{where}:{what} {problem}"


class TraceFormatError(DataError):
    """A trace file is malformed.

    Attributes:
        path: the file.
        line: 1-based line number (the header is line 1), or ``None`` for the whole file.
        field: the offending column or key, or ``None``.
    """

    def __init__(self, path: object, line: int | None, field: str | None, problem: str) -> None:
        super().__init__(_located(path, line, field, problem))
        self.path, self.line, self.field = path, line, field


class SpecError(UserError):
    """A workload spec file (TOML) is malformed or asks for something impossible.

    The message has the same form as :class:`TraceFormatError`'s: ``FILE:LINE: field 'KEY':
    problem``, where ``KEY`` is the dotted path of the offending key
    (``source[2].arrivals.rate_rps``).

    Attributes:
        path: the spec file (or ``<built-in NAME>``).
        line: 1-based line of the key, or ``None`` when it cannot be located.
        field: dotted key path, or ``None``.
    """

    def __init__(self, path: object, line: int | None, field: str | None, problem: str) -> None:
        super().__init__(_located(path, line, field, problem))
        self.path, self.line, self.field = path, line, field
