"""User-facing errors.

A :class:`KvtraceError` is a problem with the user's input or options, not a bug. The
CLI prints it as one line (no traceback unless ``--debug``) and exits 1. The message
names the file, the line or row, the field and what was expected.
"""

from __future__ import annotations


class KvtraceError(Exception):
    """A problem with the user's input, reported as one line.

    Parameters
    ----------
    message : str
        What was expected and what was found.
    path : str, optional
        The file concerned.
    line : int, optional
        1-based line number (JSONL/CSV) in ``path``.
    row : int, optional
        0-based row number (Parquet) in ``path``.
    field : str, optional
        The field or column concerned.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        row: int | None = None,
        field: str | None = None,
    ) -> None:
        self.message = message
        self.path = path
        self.line = line
        self.row = row
        self.field = field
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = ""
        if self.path:
            where = str(self.path)
            if self.line is not None:
                where += f":{self.line}"
            elif self.row is not None:
                where += f": row {self.row}"
            where += ": "
        elif self.line is not None:
            where = f"line {self.line}: "
        elif self.row is not None:
            where = f"row {self.row}: "
        field = f"field '{self.field}': " if self.field else ""
        return printable(f"{where}{field}{self.message}")


def printable(text: str) -> str:
    """One line whatever the message holds: control characters (a newline in a file
    name, a value quoted from the input) are escaped."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class UsageError(KvtraceError):
    """An invalid option value (CLI exit code 2)."""


def require_extra(module: str, extra: str, *, package: str, what: str, load: bool = True):
    """Import ``module`` of an optional dependency (installed by ``kvtrace[extra]``), or
    raise :class:`UsageError` (one line, exit 2) saying how to install it.

    Parameters
    ----------
    module : str
        The module to import, e.g. ``"vl_convert"``.
    extra : str
        The extra that installs it, e.g. ``"png"``.
    package : str
        The distribution it comes in, for the message, e.g. ``"vl-convert-python"``.
    what : str
        What needs it, for the message, e.g. ``"writing a chart file"``.
    load : bool
        False: only check that it can be imported (for a module another process imports);
        returns None then.
    """
    import importlib
    import importlib.util

    try:
        if not load:
            if importlib.util.find_spec(module) is None:
                raise ImportError(module)
            return None
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(f"{what} needs {package}, an optional dependency that is not installed: "
                         f"pip install 'kvtrace[{extra}]'") from None
