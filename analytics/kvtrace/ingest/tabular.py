"""Parquet and CSV: kvtrace's canonical Parquet, and generic request/access tables.

A generic table is either

- a *request table* with a list column of block hashes (``block_ids``, ``hash_ids``,
  ``hashes`` or ``blocks``; in CSV a string such as ``"[1, 2, 3]"`` or ``"1 2 3"``), or
- an *exploded access table* with one row per block access: request, position and
  hash columns (e.g. ``request_id``, ``pos``, ``hash_id``).

Other columns are recognised by name (``timestamp``/``ts``/``time``; ``input_length``/
``input_tokens``; ``output_length``/``output_tokens``; ``session_id``, ``parent_id``,
``turn``, ``type``, ``tenant``). A column named ``timestamp_ms`` (or ``ts_ms``) is in
milliseconds, otherwise seconds.
"""

from __future__ import annotations

import os

import polars as pl

from ..errors import KvtraceError
from ..trace import REQUEST_SCHEMA, TraceMeta
from .canonical import read_metadata

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
}
ACCESS_POS = ("pos", "position", "block_index", "idx")
ACCESS_HASH = ("hash_id", "hash", "block_hash", "block_id", "block")


def _find(columns: list[str], names: tuple[str, ...]) -> str | None:
    lower = {c.lower(): c for c in columns}
    for n in names:
        if n in lower:
            return lower[n]
    return None


def read_table(path: str, fmt: str) -> pl.DataFrame:
    try:
        if fmt == "parquet":
            return pl.read_parquet(path)
        return pl.read_csv(path, infer_schema_length=10000)
    except Exception as exc:
        raise KvtraceError(f"cannot read as {fmt}: {str(exc).splitlines()[0]}", path=path) from None


def read_canonical(path: str) -> tuple[pl.DataFrame, TraceMeta] | None:
    """A kvtrace canonical Parquet file, or None when ``path`` is not one."""
    md = read_metadata(path)
    if not md or "block_tokens" not in md:
        return None
    df = read_table(path, "parquet")
    missing = [c for c in REQUEST_SCHEMA if c not in df.columns]
    if missing:
        raise KvtraceError(f"canonical trace lacks column(s) {', '.join(missing)}", path=path, field=missing[0])
    return df, TraceMeta.from_dict(md)


def _parse_list_strings(col: pl.Series, path: str, name: str) -> pl.Series:
    """CSV list cells: "[1, 2, 3]", "1 2 3" or "1;2;3" -> list<u64>."""
    cleaned = col.cast(pl.String).str.replace_all(r"[\[\]]", "").str.strip_chars()
    parts = cleaned.str.split_exact  # noqa: F841  (keep Polars API discoverable)
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


def from_generic(df: pl.DataFrame, path: str, fmt: str, block_tokens: int | None) -> tuple[pl.DataFrame, TraceMeta]:
    """A generic request or access table -> canonical request table (file order)."""
    cols = df.columns
    list_col = _find(cols, LIST_COLUMNS)
    hash_col = _find(cols, ACCESS_HASH)
    pos_col = _find(cols, ACCESS_POS)
    req_col = _find(cols, ALIASES["request_id"])
    # A CSV whose cells are all one bare hash ("5") is inferred as an integer column.
    if list_col is not None and (
        df.schema[list_col] == pl.String or (fmt == "csv" and df.schema[list_col].is_integer())
    ):
        df = df.with_columns(_parse_list_strings(df[list_col], path, list_col).alias(list_col))
    if list_col is not None and isinstance(df.schema[list_col], pl.List):
        pass
    elif hash_col is not None and pos_col is not None and req_col is not None:
        df = _collapse_accesses(df, path, req_col, pos_col, hash_col, fmt)
        list_col = "block_ids"
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
    out: dict[str, pl.Expr] = {}
    try:
        out["block_ids"] = pl.col(list_col).cast(pl.List(pl.UInt64), strict=True)
        df.select(out["block_ids"])
    except Exception:
        raise KvtraceError("expected a list of integer hashes in [0, 2^64)", path=path, field=list_col) from None
    ts_ms = _find(cols, ALIASES["timestamp_ms"])
    ts = _find(cols, ALIASES["timestamp"])
    if ts_ms is not None:
        # numpy's division is correctly rounded; Polars' multiplies by 1/1000 (71 ms -> 0.07100000000000001 s)
        try:
            secs = df[ts_ms].cast(pl.Float64, strict=True).to_numpy() / 1000.0
        except Exception:
            raise KvtraceError("expected numbers (milliseconds)", path=path, field=ts_ms) from None
        out["timestamp"] = pl.lit(pl.Series("timestamp", secs))
    elif ts is not None:
        out["timestamp"] = pl.col(ts).cast(pl.Float64)
    else:
        raise KvtraceError("no timestamp column (timestamp, ts, time or timestamp_ms)", path=path, field="timestamp")
    for name in ("request_id", "session_id", "parent_id", "turn", "type", "tenant", "input_tokens", "output_tokens"):
        c = _find(df.columns, ALIASES[name]) if name != "request_id" else (req_col if req_col in df.columns else None)
        if c is not None:
            out[name] = pl.col(c)
    if "input_tokens" not in out:
        out["input_tokens"] = pl.col(list_col).list.len().cast(pl.Int64) * int(block_tokens)
    if "output_tokens" not in out:
        out["output_tokens"] = pl.lit(0, dtype=pl.Int64)
    if "request_id" not in out:
        out["request_id"] = pl.int_range(pl.len(), dtype=pl.Int64)
    exprs = []
    for name, expr in out.items():
        dtype = REQUEST_SCHEMA[name]
        exprs.append(expr.cast(dtype, strict=True).alias(name))
    try:
        canon = df.select(exprs)
    except Exception as exc:
        raise KvtraceError(f"ill-typed column: {str(exc).splitlines()[0]}", path=path) from None
    meta = TraceMeta(block_tokens=int(block_tokens), source_format=fmt, source=os.path.basename(path))
    return canon, meta


def _collapse_accesses(df: pl.DataFrame, path: str, req: str, pos: str, hsh: str, fmt: str) -> pl.DataFrame:
    """Exploded access rows -> one row per request with a list column, chain order by pos."""
    keep = [c for c in df.columns if c not in (pos, hsh)]
    first = [pl.col(c).first() for c in keep if c != req]
    try:
        grouped = (
            df.with_columns(pl.int_range(pl.len()).alias("__row"))
            .sort([req, pos], maintain_order=True)
            .group_by(req, maintain_order=True)
            .agg([pl.col(hsh).cast(pl.UInt64, strict=True).alias("block_ids"), pl.col("__row").min(), *first])
            .sort("__row")
            .drop("__row")
        )
    except Exception as exc:
        raise KvtraceError(
            f"ill-typed access table: {str(exc).splitlines()[0]}", path=path, field=hsh
        ) from None
    return grouped
