"""Parquet and CSV: kvtrace's canonical Parquet, and generic request/access tables.

A generic table is either

- a *request table* with a list column of block hashes (``block_ids``, ``hash_ids``,
  ``hashes`` or ``blocks``; in CSV a string such as ``"[1, 2, 3]"`` or ``"1 2 3"``), or
- an *exploded access table* with one row per block access: request, position and
  hash columns (e.g. ``request_id``, ``pos``, ``hash_id``).

Other columns are recognised by name (``timestamp``/``ts``/``time``; ``input_length``/
``input_tokens``; ``output_length``/``output_tokens``; ``session_id``, ``parent_id``,
``turn``, ``type``, ``tenant``; ``end_timestamp``, when the request finished, optional,
null where unknown). A column named ``timestamp_ms`` (or ``ts_ms``; ``end_timestamp_ms``)
is in milliseconds, otherwise seconds.
"""

from __future__ import annotations

import io
import os

import numpy as np
import polars as pl

from kvtrace.errors import KvtraceError
from kvtrace.trace import REQUEST_SCHEMA, TraceMeta
from kvtrace.ingest.canonical import read_metadata
from kvtrace.ingest.inputs import third_party_text

LIST_COLUMNS = ("block_ids", "hash_ids", "hashes", "blocks", "block_hashes")
ALIASES = {
    "request_id": ("request_id", "request", "req_id", "chat_id", "id"),
    "timestamp": ("timestamp", "ts", "time", "arrival", "arrival_time"),
    "timestamp_ms": ("timestamp_ms", "ts_ms", "time_ms"),
    "input_tokens": ("input_tokens", "input_length", "prompt_tokens", "input_len"),
    "output_tokens": ("output_tokens", "output_length", "completion_tokens", "output_len"),
    "session_id": ("session_id", "session", "conversation_id"),
    "parent_id": ("parent_id", "parent_chat_id", "parent"),
    "turn": ("turn",),
    "type": ("type", "request_type"),
    "tenant": ("tenant", "namespace", "tenant_id"),
    "end_timestamp": ("end_timestamp",),
    "end_timestamp_ms": ("end_timestamp_ms",),
}
ACCESS_POS = ("pos", "position", "block_index", "idx")
ACCESS_HASH = ("hash_id", "hash", "block_hash", "block_id", "block")


def column_named(columns: list[str], names: tuple[str, ...]) -> str | None:
    lower = {c.lower(): c for c in columns}
    for n in names:
        if n in lower:
            return lower[n]
    return None


def source_names(columns: list[str]) -> dict[str, str]:
    """canonical column -> the generic table's column it is read from (for messages)."""
    out = {}
    for name, aliases in ALIASES.items():
        c = column_named(columns, aliases)
        if c is not None and name not in ("timestamp_ms", "end_timestamp_ms"):
            out[name] = c
    for name in ("timestamp", "end_timestamp"):
        ms = column_named(columns, ALIASES[f"{name}_ms"])
        if ms is not None:
            out[name] = ms
    lst = column_named(columns, LIST_COLUMNS)
    if lst is not None:
        out["block_ids"] = lst
    return out


def read_table(path: str, fmt: str, data: bytes | None = None) -> pl.DataFrame:
    """A Parquet or CSV file as Polars reads it; ``data``: its bytes when already read
    (a CSV pipe, read once). A file Polars cannot read is one line naming the file (a
    CSV: the line and what is wrong there), quoting none of its content."""
    try:
        if fmt == "parquet":
            return pl.read_parquet(path)
        return pl.read_csv(io.BytesIO(data) if data is not None else path, infer_schema_length=10000)
    except Exception as exc:
        problem = _csv_problem(path, data) if fmt == "csv" else None
        if problem is not None:
            line, what = problem
            raise KvtraceError(f"cannot read as csv: {what}", path=path, line=line) from None
        raise KvtraceError(f"cannot read as {fmt}: {third_party_text(exc)}", path=path) from None


_CSV_UNCLOSED = ("a quoted field opens on this line and is not closed: expected its closing quote before the end "
                 "of the file")
_CSV_BAD_CLOSE = ("a quoted field opens on this line and is not closed properly: expected its closing quote to be "
                  "followed by a comma or the end of the line (a quote inside a quoted field is written twice)")


def _csv_problem(path: str, data: bytes | None = None) -> tuple[int, str] | None:
    """(line, what is wrong) for the first record of a CSV file whose field count
    differs from the header's, or whose quoting is broken (the line the bad quoted
    field opens on); None if the csv module finds nothing (the error path only)."""
    import csv
    import gzip

    try:
        if data is not None:
            raw = gzip.GzipFile(fileobj=io.BytesIO(data)) if data[:2] == b"\x1f\x8b" else io.BytesIO(data)
            fh = io.TextIOWrapper(raw, encoding="utf-8", newline="")
        else:
            with open(path, "rb") as probe:
                gz = probe.read(2) == b"\x1f\x8b"
            fh = (gzip.open if gz else open)(path, "rt", encoding="utf-8", newline="")
    except (OSError, UnicodeDecodeError, EOFError, ValueError):
        return None
    with fh:
        reader = csv.reader(fh, strict=True)
        start, width = 1, None  # ``start``: the first line of the record being read
        try:
            for row in reader:
                if width is None:
                    width = len(row)
                elif row and len(row) != width:
                    return start, f"expected {width} fields (as in the header), got {len(row)}"
                start = reader.line_num + 1
        except csv.Error as exc:
            fh.seek(0)
            return _bad_quote(fh, start, unclosed="unexpected end of data" in str(exc))
        except (OSError, UnicodeDecodeError, EOFError):
            return None
    return None


def _bad_quote(fh, start: int, unclosed: bool) -> tuple[int, str]:
    """Where the quoted field the csv module stopped at opens: the record's text from
    line ``start`` (at most 64 MiB of it) scanned quote by quote."""
    for _ in range(start - 1):
        fh.readline()
    text = fh.read(1 << 26)
    pos = 0
    while (q := text.find('"', pos)) >= 0:
        if q > 0 and text[q - 1] not in ",\r\n":
            pos = q + 1  # a quote inside an unquoted field is a character like any other
            continue
        end = q + 1
        while (end := text.find('"', end)) >= 0 and text.startswith('""', end):
            end += 2  # an escaped quote
        line = start + text.count("\n", 0, q)
        if end < 0:
            return line, _CSV_UNCLOSED
        if text[end + 1:end + 2] not in ("", ",", "\r", "\n"):
            return line, _CSV_BAD_CLOSE
        pos = end + 1
    return start, _CSV_UNCLOSED if unclosed else _CSV_BAD_CLOSE


def read_canonical(path: str) -> tuple[pl.DataFrame, TraceMeta] | None:
    """A kvtrace canonical Parquet file, or None when ``path`` is not one."""
    md = read_metadata(path)
    if not isinstance(md, dict) or "block_tokens" not in md:
        return None
    df = read_table(path, "parquet")
    missing = [c for c in REQUEST_SCHEMA if c not in df.columns]
    if missing:
        raise KvtraceError(f"canonical trace lacks column(s) {', '.join(missing)}", path=path, field=missing[0])
    bt = md.get("block_tokens")
    if isinstance(bt, bool) or not isinstance(bt, int) or bt < 1:
        raise KvtraceError(f"kvtrace metadata: expected a positive integer block_tokens, got {bt!r}", path=path,
                           field="kvtrace")
    try:
        return df, TraceMeta.from_dict(md)
    except (TypeError, ValueError) as exc:
        raise KvtraceError(f"kvtrace metadata: {exc}", path=path, field="kvtrace") from None


def _parse_list_strings(col: pl.Series, path: str, name: str) -> pl.Series:
    """CSV list cells: "[1, 2, 3]", "1 2 3" or "1;2;3" -> list<u64>."""
    cleaned = col.cast(pl.String).str.replace_all(r"[\[\]]", "").str.strip_chars()
    split = cleaned.str.replace_all(r"[,;\s]+", " ").str.strip_chars().str.split(" ")
    split = split.list.eval(pl.element().filter(pl.element() != ""))
    try:
        return split.list.eval(pl.element().cast(pl.UInt64, strict=True))
    except Exception:
        bad = split.list.eval(pl.element().cast(pl.UInt64, strict=False).is_null().any()).list.first()
        row = int(bad.arg_true()[0]) if bad.any() else 0
        raise KvtraceError(
            f"expected integer hashes in [0, 2^64), got {col[row]!r}", path=path, line=row + 2, field=name
        ) from None


def from_generic(df: pl.DataFrame, path: str, fmt: str, block_tokens: int | None,
                 warnings: list[str] | None = None) -> tuple[pl.DataFrame, TraceMeta]:
    """A generic request or access table -> canonical request table (file order).

    An exploded access table is collapsed to one row per request; the result then
    carries ``__source_row``, the first source row of each request, so that messages
    can name it. Bad values are errors naming the row (the line, in CSV) and column.
    """
    cols = df.columns
    list_col = column_named(cols, LIST_COLUMNS)
    hash_col = column_named(cols, ACCESS_HASH)
    pos_col = column_named(cols, ACCESS_POS)
    req_col = column_named(cols, ALIASES["request_id"])
    line0 = 2 if fmt == "csv" else None  # the header is line 1

    def where(row: int) -> dict:
        return {"path": path, "line": row + line0} if line0 else {"path": path, "row": row}

    # A CSV whose cells are all one bare hash ("5") is inferred as an integer column.
    if list_col is not None and (
        df.schema[list_col] == pl.String or (fmt == "csv" and df.schema[list_col].is_integer())
    ):
        df = df.with_columns(_parse_list_strings(df[list_col], path, list_col).alias(list_col))
    if list_col is not None and isinstance(df.schema[list_col], pl.List):
        _check_hash_lists(df[list_col], list_col, where)
    elif hash_col is not None and pos_col is not None and req_col is not None:
        df = _collapse_accesses(df, path, req_col, pos_col, hash_col, where, warnings)
        list_col = "block_ids"
        origin = df["__row"].to_numpy()

        def where(row: int, _inner=where) -> dict:  # noqa: F811 - a request -> its first source row
            return _inner(int(origin[row]))
    else:
        raise KvtraceError(
            "expected a list column of block hashes (block_ids/hash_ids) or an access table with "
            "request, pos and hash columns; found columns: " + ", ".join(cols),
            path=path,
        )
    if block_tokens is None:
        raise KvtraceError(
            "generic tables do not say their block size: pass --block-tokens N", path=path, field="block_tokens"
        )
    out: dict[str, pl.Series] = {"block_ids": df[list_col].cast(pl.List(pl.UInt64))}
    ts_ms = column_named(cols, ALIASES["timestamp_ms"])
    ts = column_named(cols, ALIASES["timestamp"])
    if ts_ms is not None:
        out["timestamp"] = to_seconds(df[ts_ms], ts_ms, 1000.0, where)
    elif ts is not None:
        out["timestamp"] = to_seconds(df[ts], ts, 1.0, where)
    else:
        raise KvtraceError("no timestamp column (timestamp, ts, time or timestamp_ms)", path=path, field="timestamp")
    end_ms = column_named(cols, ALIASES["end_timestamp_ms"])
    end = end_ms or column_named(cols, ALIASES["end_timestamp"])
    if end is not None:  # optional; a null where a request's end is unknown stays null
        seconds = to_seconds(df[end], end, 1000.0 if end_ms else 1.0, where)
        out["end_timestamp"] = seconds.set(df[end].is_null(), None) if df[end].null_count() else seconds
    for name in ("request_id", "session_id", "parent_id", "turn", "type", "tenant", "input_tokens", "output_tokens"):
        c = (column_named(df.columns, ALIASES[name]) if name != "request_id"
             else (req_col if req_col in df.columns else None))
        if c is not None:
            out[name] = cast_column(df[c], c, REQUEST_SCHEMA[name], where)
    n = df.height
    if "input_tokens" not in out:
        out["input_tokens"] = df[list_col].list.len().cast(pl.Int64) * int(block_tokens)
    if "output_tokens" not in out:
        out["output_tokens"] = pl.Series(np.zeros(n, dtype=np.int64))
    if "request_id" not in out:
        out["request_id"] = pl.Series(np.arange(n, dtype=np.int64))
    canon = pl.DataFrame({name: series.alias(name) for name, series in out.items()})
    if "__row" in df.columns:
        canon = canon.with_columns(df["__row"].alias("__source_row"))
    meta = TraceMeta(block_tokens=int(block_tokens), source_format=fmt, source=os.path.basename(path))
    return canon, meta


def _whole(where) -> dict:
    """The location of a problem with a whole column: the file only."""
    return {"path": where(0)["path"]}


def _first(mask: pl.Series) -> int:
    return int(mask.fill_null(False).arg_true()[0])


def _check_hash_lists(col: pl.Series, name: str, where) -> None:
    """A list column of hashes must hold integers in [0, 2^64): no floats, negatives or nulls."""
    inner = col.dtype.inner
    if inner != pl.Null and not inner.is_integer():
        raise KvtraceError(f"expected lists of integer hashes in [0, 2^64), found lists of {inner}",
                           field=name, **_whole(where))
    if inner.is_signed_integer():
        neg = col.list.min() < 0
        if neg.any():
            row = _first(neg)
            hint = " (unsigned 64-bit hashes stored as signed? write the column as uint64)" if inner == pl.Int64 else ""
            raise KvtraceError(f"expected integer hashes in [0, 2^64), got {col.list.min()[row]}{hint}", field=name,
                               **where(row))
        if inner == pl.Int128:
            big = col.list.max() >= 2**64
            if big.any():
                row = _first(big)
                raise KvtraceError(f"expected integer hashes in [0, 2^64), got {col.list.max()[row]}", field=name,
                                   **where(row))


def to_seconds(col: pl.Series, name: str, per_second: float, where) -> pl.Series:
    """A timestamp column -> float64 seconds (a datetime counts from the Unix epoch)."""
    dt = col.dtype
    if dt == pl.Boolean:
        raise KvtraceError("expected numbers, found booleans", field=name, **_whole(where))
    if isinstance(dt, pl.Datetime):
        return pl.Series("timestamp", col.dt.epoch("ns").cast(pl.Float64).to_numpy() / 1e9)
    if isinstance(dt, pl.Duration):
        return pl.Series("timestamp", col.dt.total_nanoseconds().cast(pl.Float64).to_numpy() / 1e9)
    if dt == pl.Date:
        return pl.Series("timestamp", col.cast(pl.Int64).cast(pl.Float64).to_numpy() * 86400.0)
    values = cast_column(col, name, pl.Float64, where, what="numbers" + (" (milliseconds)" if per_second != 1 else ""))
    if per_second == 1.0:
        return values
    # numpy's division is correctly rounded; Polars' multiplies by 1/1000 (71 ms -> 0.07100000000000001 s)
    return pl.Series("timestamp", values.to_numpy() / per_second)


def cast_column(col: pl.Series, name: str, dtype, where, what: str | None = None) -> pl.Series:
    """``col`` cast to ``dtype``, or an error naming the first value that does not fit.

    Unlike Polars' casts, a float is only an integer when it is whole (10.0, not 10.5)."""
    what = what or {pl.Int64: "integers", pl.Float64: "numbers", pl.String: "strings"}.get(dtype, str(dtype))
    src = col.dtype
    if src == pl.Boolean and dtype != pl.String:
        raise KvtraceError(f"expected {what}, found booleans", field=name, **_whole(where))
    if dtype.is_integer() and src.is_float():
        whole = col.is_nan().not_() & col.is_finite() & (col == col.floor())
        bad = whole.not_() & col.is_not_null()
        if bad.any():
            row = _first(bad)
            raise KvtraceError(f"expected {what}, got {col[row]!r}", field=name, **where(row))
    if src.is_nested() or src in (pl.Object, pl.Binary):
        raise KvtraceError(f"expected {what}, found {src}", field=name, **_whole(where))
    try:
        out = col.cast(dtype, strict=True)
        if out.dtype == dtype:
            return out
    except Exception:
        pass
    try:
        loose = col.cast(dtype, strict=False)
    except Exception:
        raise KvtraceError(f"expected {what}, found a column of {src}", field=name, **_whole(where)) from None
    bad = loose.is_null() & col.is_not_null()
    row = _first(bad) if bad.any() else 0
    value = col[row]
    shown = repr(value) if not isinstance(value, str) or len(value) < 60 else repr(value[:57] + "...")
    raise KvtraceError(f"expected {what}, got {shown}", field=name, **where(row))


def _collapse_accesses(df: pl.DataFrame, path: str, req: str, pos: str, hsh: str, where,
                       warnings: list[str] | None) -> pl.DataFrame:
    """Exploded access rows -> one row per request with a list column, chain order by pos.

    ``__row`` keeps each request's first source row. Two rows for the same position of
    a request are an error naming both; missing positions are a warning."""
    hashes = cast_column(df[hsh], hsh, pl.UInt64, where, what="integer hashes in [0, 2^64)")
    if hashes.null_count():
        raise KvtraceError("missing value (required)", field=hsh, **where(_first(hashes.is_null())))
    positions = cast_column(df[pos], pos, pl.Int64, where, what="integer positions")
    if positions.null_count() or (positions < 0).any():
        row = _first(positions.is_null() | (positions < 0))
        raise KvtraceError(f"expected a position >= 0, got {positions[row]}", field=pos, **where(row))
    if df[req].null_count():
        raise KvtraceError("missing value (required)", field=req, **where(_first(df[req].is_null())))
    # columns the regrouping creates are not carried over from the source
    keep = [c for c in df.columns if c not in (pos, hsh, "block_ids", "__row", "__last_pos")]
    first = [pl.col(c).first() for c in keep if c != req]
    rows = df.with_columns(hashes.alias(hsh), positions.alias(pos), pl.int_range(pl.len()).alias("__row")).sort(
        [req, pos], maintain_order=True)
    same = (rows[req] == rows[req].shift(1)) & (rows[pos] == rows[pos].shift(1))
    if same.any():
        k = _first(same)
        a, b = sorted((int(rows["__row"][k - 1]), int(rows["__row"][k])))
        at, before = where(b), where(a)
        first_at = f"line {before['line']}" if "line" in before else f"row {before['row']}"
        raise KvtraceError(f"request {rows[req][k]} has two hashes at position {rows[pos][k]}: first at {first_at}",
                           field=pos, **at)
    grouped = (
        rows.group_by(req, maintain_order=True)
        .agg([pl.col(hsh).alias("block_ids"), pl.col("__row").min(), pl.col(pos).max().alias("__last_pos"), *first])
        .sort("__row")
    )
    gaps = int((grouped["__last_pos"] + 1 != grouped["block_ids"].list.len()).sum())
    if gaps and warnings is not None:
        warnings.append(f"{gaps} of {grouped.height} requests have missing block positions; their hashes are "
                        "taken in position order")
    return grouped.drop("__last_pos")
