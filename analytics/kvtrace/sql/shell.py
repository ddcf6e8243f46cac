"""Running SQL against a kvtrace database (``kvtrace sql``).

:func:`open_database` opens an exported ``.duckdb`` file (read-only unless asked);
:func:`analyse_in_memory` analyses a trace into an in-memory database with the same
tables, macros and views. :func:`run_script` runs a script statement by statement and
returns the result of every statement that produces rows, as Arrow tables;
:func:`write_result` writes one as CSV, JSON or Parquet; :func:`repl` is the
interactive prompt (history in ``~/.kvtrace_sql_history``, or ``$KVTRACE_SQL_HISTORY``).
"""

from __future__ import annotations

import csv
import datetime as _dt
import decimal
import io
import json
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kvtrace.errors import KvtraceError, UsageError
from kvtrace.results.export import build_database, example_files, is_database
from kvtrace.outputs import json_safe, atomic_path
from kvtrace.trace import Trace

__all__ = ["OUTPUT_FORMATS", "QueryResult", "analyse_in_memory", "example_by_name", "open_database", "repl",
           "result_text", "run_script", "write_result"]

OUTPUT_FORMATS = ("table", "csv", "json", "parquet")
HISTORY_ENV = "KVTRACE_SQL_HISTORY"
_QUIET_COLUMNS = (["Count"], ["Success"])  # what DDL and SET statements return


@dataclass
class QueryResult:
    """Rows of one statement.

    Attributes
    ----------
    sql : str
        The statement.
    table : pyarrow.Table
        Its result (column names and types as DuckDB returns them).
    """

    sql: str
    table: object

    @property
    def columns(self) -> list[str]:
        return list(self.table.column_names)

    def rows(self) -> list[tuple]:
        """Rows as Python tuples (column order)."""
        cols = [self.table.column(i).to_pylist() for i in range(self.table.num_columns)]
        return list(zip(*cols)) if cols else []


def _duck():
    import duckdb

    return duckdb


def open_database(path: str | os.PathLike, *, write: bool = False):
    """Open an exported database (read-only unless ``write``)."""
    duckdb = _duck()
    p = str(path)
    if not os.path.exists(p):
        raise KvtraceError("no such file", path=p)
    if not is_database(p):
        raise KvtraceError("not a DuckDB database", path=p)
    try:
        return duckdb.connect(p, read_only=not write)
    except duckdb.Error as exc:
        raise KvtraceError(f"cannot open the database: {str(exc).splitlines()[0]}", path=p) from None


def analyse_in_memory(trace: Trace, **options):
    """A temporary in-memory database of ``trace`` (options as for
    :func:`kvtrace.results.export.build_database`)."""
    con = _duck().connect()
    build_database(con, trace, **options)
    return con


def _execute(con, sql: str):
    """Run one statement; its rows as an Arrow table, or None (DuckDB 1.x returns no
    relation for statements without rows)."""
    rel = con.sql(sql)
    if rel is None:
        return None
    fetch = getattr(rel, "to_arrow_table", None) or getattr(rel, "fetch_arrow_table", None) or rel.arrow
    return fetch()


def run_script(con, text: str, *, source: str = "query") -> list[QueryResult]:
    """Run every statement of ``text``; return the results that have rows to show.

    A statement that fails raises :class:`KvtraceError` naming ``source`` and the
    statement's number; the statements before it have run.
    """
    duckdb = _duck()
    try:
        statements = con.extract_statements(text)
    except duckdb.Error as exc:
        raise KvtraceError(f"SQL error: {_first_line(exc)}", path=source) from None
    if not statements:
        raise UsageError("no SQL statement to run", path=source)
    results = []
    for i, stmt in enumerate(statements, 1):
        sql = stmt.query.strip()
        try:
            table = _execute(con, sql)
        except duckdb.Error as exc:
            where = f"statement {i}: " if len(statements) > 1 else ""
            raise KvtraceError(f"SQL error: {where}{_first_line(exc)}", path=source) from None
        if table is None or (stmt.type.name != "SELECT" and (table.num_columns == 0 or
                                                             list(table.column_names) in _QUIET_COLUMNS)):
            continue
        results.append(QueryResult(sql, table))
    return results


def _first_line(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _plain(value):
    """A cell as a JSON/CSV-ready Python value."""
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, (_dt.datetime, _dt.date, _dt.time)):
        return value.isoformat()
    if isinstance(value, _dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _csv_cell(value) -> str:
    v = _plain(value)
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else ("inf" if v > 0 else "-inf"))
    if isinstance(v, (list, dict)):
        return json.dumps(json_safe(v))
    return str(v)


def result_text(result: QueryResult, fmt: str) -> str:
    """A result as CSV (header row, ``inf`` for infinity, empty for NULL) or JSON (a
    list of row objects; NULL and non-finite numbers as null)."""
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(result.columns)
        for row in result.rows():
            w.writerow([_csv_cell(v) for v in row])
        return buf.getvalue()
    if fmt == "json":
        rows = [dict(zip(result.columns, (_plain(v) for v in row))) for row in result.rows()]
        return json.dumps(json_safe(rows), indent=1) + "\n"
    raise UsageError(f"unknown output format '{fmt}': expected csv or json", field="format")


def write_result(result: QueryResult, path: str | os.PathLike, fmt: str) -> None:
    """Write a result atomically as CSV, JSON or Parquet (zstd)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        with atomic_path(path) as tmp:
            pq.write_table(result.table, tmp, compression="zstd")
        return
    with atomic_path(path) as tmp:
        tmp.write_text(result_text(result, fmt), encoding="utf-8")


def output_format(fmt: str | None, out: str | os.PathLike | None) -> str:
    """The output format: as given, else from ``out``'s suffix, else ``table``."""
    if fmt is None:
        if out is None:
            return "table"
        suffix = Path(out).suffix.lower().lstrip(".")
        fmt = {"pq": "parquet"}.get(suffix, suffix)
        if fmt not in ("csv", "json", "parquet"):
            found = f"suffix '.{suffix}'" if suffix else "no suffix"
            raise UsageError(f"cannot tell the output format from the file name ({found}): use --format",
                             field="output")
    if fmt not in OUTPUT_FORMATS:
        raise UsageError(f"unknown output format '{fmt}': expected {', '.join(OUTPUT_FORMATS)}", field="format")
    if fmt == "parquet" and out is None:
        raise UsageError("--format parquet needs an output file: -o FILE", field="format")
    if fmt == "table" and out is not None:
        raise UsageError("--format table is for the terminal: write csv, json or parquet to a file",
                         field="format")
    return fmt


def example_by_name(name: str) -> Path:
    """The example query ``name`` (file name, with or without ``.sql`` or its number prefix)."""
    files = example_files()
    wanted = name[:-4] if name.endswith(".sql") else name
    for f in files:
        stem = f.stem
        if wanted in (stem, stem.split("_", 1)[-1], stem.split("_", 1)[0]):
            return f
    names = ", ".join(f.stem for f in files)
    raise UsageError(f"no example '{name}': expected one of {names}", field="example")


# ----------------------------------------------------------------------------- interactive

_HELP = """Statements end with ';' and may span lines. Commands:
  .tables            tables and views
  .schema NAME       columns of a table or view (with units)
  .examples          the example queries; .example NAME runs one
  .read FILE         run a SQL file
  .help              this text
  .quit              leave (also Ctrl-D)"""


def _history_path() -> Path:
    return Path(os.environ.get(HISTORY_ENV) or Path.home() / ".kvtrace_sql_history")


def repl(
    con,
    show: Callable[[QueryResult], None],
    say: Callable[[str], None],
    *,
    read_line: Callable[[str], str] = input,
    use_history: bool = True,
) -> None:
    """The interactive prompt: read statements until ``.quit`` or end of input.

    Parameters
    ----------
    con : duckdb.DuckDBPyConnection
    show : callable
        Renders one result.
    say : callable
        Prints a line of text (messages and errors).
    read_line : callable
        ``read_line(prompt) -> str``; raises EOFError at the end of input.
    use_history : bool
        Load and save the line history (readline, when available).
    """
    readline = None
    if use_history:
        try:
            import readline  # noqa: F401  (line editing for input())
        except ImportError:  # pragma: no cover - Windows without pyreadline
            readline = None
        else:
            try:
                readline.read_history_file(_history_path())
            except (FileNotFoundError, OSError):
                pass
            readline.set_history_length(2000)
    say("kvtrace sql: statements end with ';'. .help for commands, .quit to leave.")
    buffer: list[str] = []
    try:
        while True:
            try:
                line = read_line("kvtrace> " if not buffer else "     ...> ")
            except EOFError:
                say("")
                break
            except KeyboardInterrupt:
                buffer = []
                say("")
                continue
            stripped = line.strip()
            if not buffer and stripped.startswith("."):
                if _dot_command(con, stripped, show, say):
                    break
                continue
            if not stripped and not buffer:
                continue
            buffer.append(line)
            text = "\n".join(buffer)
            if not _complete(text):
                continue
            buffer = []
            try:
                for result in run_script(con, text, source="input"):
                    show(result)
            except KvtraceError as exc:
                say(f"error: {exc.message}")
    finally:
        if readline is not None:
            try:
                readline.write_history_file(_history_path())
            except OSError:
                pass


def _complete(text: str) -> bool:
    """Whether ``text`` ends a statement: a ';' outside quotes and comments, last."""
    in_single = in_double = in_line_comment = False
    last = ""
    i = 0
    while i < len(text):
        ch = text[i]
        if in_line_comment:
            in_line_comment = ch != "\n"
        elif in_single:
            in_single = ch != "'"
        elif in_double:
            in_double = ch != '"'
        elif ch == "-" and text[i:i + 2] == "--":
            in_line_comment = True
        elif ch == "'":
            in_single = True
        elif ch == '"':
            in_double = True
        elif not ch.isspace():
            last = ch
        i += 1
    return last == ";" and not in_single and not in_double


def run_input(con, text: str, say: Callable[[str], None], *, source: str = "stdin") -> list[QueryResult]:
    """Run SQL read from a pipe or file, with the prompt's dot commands (``.tables``,
    ``.schema NAME``, ...) on lines of their own between statements, as a script: the
    first error raises :class:`KvtraceError` naming ``source`` and the line. Returns
    every result in order (the dot commands' included); ``.quit`` stops reading."""
    results: list[QueryResult] = []
    buffer: list[str] = []
    start = 1

    def flush(upto: int) -> None:
        if any(line.strip() for line in buffer):
            where = f"{source}:{start}" if start > 1 or upto > 1 else source
            results.extend(run_script(con, "\n".join(buffer), source=where))
        buffer.clear()

    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith(".") and not any(b.strip() for b in buffer):
            buffer.clear()
            if _dot_command(con, stripped, results.append, say, strict=True, source=f"{source}:{lineno}"):
                return results
            start = lineno + 1
            continue
        if not buffer:
            start = lineno
        buffer.append(line)
        if _complete("\n".join(buffer)):
            flush(lineno)
    flush(len(text.splitlines()))
    return results


def has_dot_commands(text: str) -> bool:
    """Whether a script holds a line that is a dot command (``.tables``)."""
    return any(re.match(r"\.[a-z]+(\s|$)", line.strip()) for line in text.splitlines())


def _dot_command(con, line: str, show, say, *, strict: bool = False, source: str = "input") -> bool:
    """Run a dot command; True to leave. ``strict``: an error raises (a script) instead
    of being said (the prompt)."""
    if strict and line.split(" ", 1)[0] not in _DOT_COMMANDS:
        raise KvtraceError(f"unknown command {line.split(' ', 1)[0]}: expected one of {', '.join(_DOT_COMMANDS)}",
                           path=source)
    cmd, _, arg = line.partition(" ")
    arg = arg.strip()
    try:
        if cmd in (".quit", ".exit", ".q"):
            return True
        if cmd == ".help":
            say(_HELP)
        elif cmd == ".tables":
            for r in run_script(con, "SELECT table_name AS name, table_type AS kind FROM information_schema.tables "
                                     "WHERE table_schema = 'main' ORDER BY table_name", source=".tables"):
                show(r)
        elif cmd == ".schema":
            if not arg:
                say("usage: .schema NAME")
            else:
                name = arg.replace("'", "''")
                res = run_script(con, f"SELECT column_name, data_type, comment FROM duckdb_columns() "
                                      f"WHERE table_name = '{name}' ORDER BY column_index", source=".schema")
                if res and res[0].table.num_rows:
                    show(res[0])
                else:
                    say(f"no table or view '{arg}'")
        elif cmd == ".examples":
            for f in example_files():
                first = next((ln[2:].strip() for ln in f.read_text(encoding="utf-8").splitlines()
                              if ln.startswith("--")), "")
                say(f"{f.stem}: {first}")
        elif cmd == ".example":
            f = example_by_name(arg)
            for r in run_script(con, f.read_text(encoding="utf-8"), source=str(f)):
                show(r)
        elif cmd == ".read":
            p = Path(arg)
            if not p.is_file():
                raise KvtraceError("no such file", path=arg)
            for r in run_script(con, p.read_text(encoding="utf-8"), source=arg):
                show(r)
        else:
            say(f"unknown command {cmd}: .help lists them")
    except KvtraceError as exc:
        if strict:
            raise
        say(f"error: {exc.one_line()}")
    return False


_DOT_COMMANDS = (".tables", ".schema", ".examples", ".example", ".read", ".help", ".quit", ".exit", ".q")
