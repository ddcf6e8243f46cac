"""Trace ingest: source files -> canonical request table -> :class:`~kvtrace.trace.Trace`.

Formats (DESIGN §1): Mooncake JSONL (FAST'25), Qwen-Bailian JSONL (ATC'25), generic
Parquet/CSV (a list column of block hashes, or an exploded access table), and kvtrace's
own canonical Parquet (written by :func:`write_canonical` / ``kvtrace ingest``).
Every command reads any of them directly: ingest is implicit.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import KvtraceError
from ..trace import Trace, TraceMeta
from .canonical import build_trace, distinct_blocks, prepare_requests, read_metadata, requests_to_trace, write_canonical
from .jsonl import first_record, jsonl_source, read_bailian, read_mooncake, scan_for_error
from .tabular import from_generic, read_canonical, read_table

FORMATS = ("auto", "mooncake", "bailian", "parquet", "csv")

__all__ = ["FORMATS", "build_trace", "detect_format", "distinct_blocks", "load_requests", "load_trace", "prepare_requests",
           "read_metadata", "read_requests", "requests_to_trace", "write_canonical"]


def detect_format(path: str | os.PathLike) -> str:
    """``mooncake``, ``bailian``, ``parquet`` or ``csv``, from the suffix and the fields."""
    p = str(path)
    suffix = "".join(Path(p).suffixes[-2:]).lower()
    if suffix.endswith((".parquet", ".pq")):
        return "parquet"
    if suffix.endswith((".csv", ".csv.gz")):
        return "csv"
    line, rec = first_record(p, p)
    if "chat_id" in rec or "parent_chat_id" in rec:
        return "bailian"
    if "hash_ids" in rec:
        return "mooncake"
    raise KvtraceError(
        "cannot tell the trace format: expected Mooncake fields (timestamp, input_length, output_length, "
        "hash_ids) or Qwen-Bailian fields (chat_id, parent_chat_id, ...); use --format",
        path=p, line=line,
    )


def read_requests(path: str | os.PathLike, *, fmt: str = "auto", block_tokens: int | None = None):
    """Read any supported file into (canonical request table in file order, meta, jsonl bytes or None)."""
    p = str(path)
    if not os.path.exists(p):
        raise KvtraceError("no such file", path=p)
    if os.path.isdir(p):
        raise KvtraceError("is a directory, expected a trace file", path=p)
    if fmt not in FORMATS:
        raise KvtraceError(f"unknown format '{fmt}': expected one of {', '.join(FORMATS)}", field="format")
    if fmt == "auto":
        fmt = detect_format(p)
    if fmt in ("mooncake", "bailian"):
        first_record(p, p)  # an empty file, or a first line that is not JSON, fails here
        data = jsonl_source(p)
        reader = read_mooncake if fmt == "mooncake" else read_bailian
        df, meta = reader(data, p, block_tokens)
        return df, meta, data, fmt
    if fmt == "parquet":
        canon = read_canonical(p)
        if canon is not None:
            df, meta = canon
            if block_tokens is not None and block_tokens != meta.block_tokens:
                raise KvtraceError(
                    f"--block-tokens {block_tokens} contradicts the trace's block size {meta.block_tokens}",
                    path=p, field="block_tokens",
                )
            return df, meta, None, "canonical"
    df = read_table(p, fmt)
    if df.height == 0:
        raise KvtraceError("no requests: the table is empty", path=p)
    df, meta = from_generic(df, p, fmt, block_tokens)
    return df, meta, None, fmt


def load_requests(
    path: str | os.PathLike,
    *,
    fmt: str = "auto",
    block_tokens: int | None = None,
    share_tenants: bool = False,
) -> tuple:
    """Read and validate a trace's request table, in trace order, without building
    the access table: (request table, meta, warnings). See :func:`load_trace`."""
    p = str(path)
    df, meta, data, kind = read_requests(p, fmt=fmt, block_tokens=block_tokens)
    if share_tenants != meta.share_tenants:
        meta = TraceMeta(**{**meta.to_dict(), "share_tenants": share_tenants})
    try:
        df, warn = prepare_requests(df, meta, source=p, already_relative=kind == "canonical")
    except KvtraceError:
        if data is not None:  # name the line, not the row
            err = scan_for_error(data, p, kind)
            if err is not None:
                raise err from None
        raise
    return df, meta, warn


def load_trace(
    path: str | os.PathLike,
    *,
    fmt: str = "auto",
    block_tokens: int | None = None,
    share_tenants: bool = False,
) -> Trace:
    """Read a trace file of any supported format into canonical form.

    Parameters
    ----------
    path : path-like
        JSONL (optionally gzip-compressed), Parquet or CSV.
    fmt : str
        ``auto`` (detect from suffix and fields), ``mooncake``, ``bailian``, ``parquet``
        or ``csv``.
    block_tokens : int, optional
        Tokens per block; defaults to the format's (512 Mooncake, 16 Bailian); required
        for generic tables.
    share_tenants : bool
        Treat equal hashes in different tenants as the same block.

    Returns
    -------
    Trace
    """
    df, meta, warn = load_requests(path, fmt=fmt, block_tokens=block_tokens, share_tenants=share_tenants)
    return build_trace(df, meta, warn)
