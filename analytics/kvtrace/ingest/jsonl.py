"""Mooncake (FAST'25) and Qwen-Bailian (ATC'25) JSONL readers.

Fast path: Polars' native NDJSON reader with an explicit schema. When it fails, or when
validation finds a bad value, a line-by-line scan (only on that error path) finds the
first offending line and field so the message can name them.
"""

from __future__ import annotations

import gzip
import io
import json
import os

import numpy as np
import polars as pl

from ..errors import KvtraceError
from ..trace import TraceMeta

MOONCAKE_BLOCK_TOKENS = 512
BAILIAN_BLOCK_TOKENS = 16

_MOONCAKE_SCHEMA = {
    "timestamp": pl.Float64,
    "input_length": pl.Int64,
    "output_length": pl.Int64,
    "hash_ids": pl.List(pl.UInt64),
}
_BAILIAN_SCHEMA = {
    "chat_id": pl.Int64,
    "parent_chat_id": pl.Int64,
    "timestamp": pl.Float64,
    "input_length": pl.Int64,
    "output_length": pl.Int64,
    "type": pl.String,
    "turn": pl.Int64,
    "hash_ids": pl.List(pl.UInt64),
}
#: field -> kind, for the line-by-line validator
_REQUIRED = {
    "mooncake": {"timestamp": "number", "input_length": "count", "output_length": "count", "hash_ids": "hashes"},
    "bailian": {
        "chat_id": "int", "parent_chat_id": "int", "timestamp": "number", "input_length": "count",
        "output_length": "count", "hash_ids": "hashes",
    },
}
_OPTIONAL = {"mooncake": {}, "bailian": {"type": "string", "turn": "int"}}


def read_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes, gunzipped transparently."""
    with open(path, "rb") as fh:
        data = fh.read()
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError) as exc:
            raise KvtraceError(f"corrupt gzip stream ({exc})", path=str(path)) from None
    return data


def jsonl_source(path: str) -> str | bytes:
    """What the readers take: the path itself (Polars reads it without a Python copy),
    or the decompressed bytes of a gzipped file."""
    with open(path, "rb") as fh:
        magic = fh.read(2)
    return read_bytes(path) if magic == b"\x1f\x8b" else path


def _lines(src: str | bytes):
    """Lines of a source: bytes, or a file path (gzip read as a stream)."""
    if isinstance(src, bytes):
        yield from io.BytesIO(src)
        return
    with open(src, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    try:
        with (gzip.open(src, "rb") if gz else open(src, "rb")) as fh:
            yield from fh
    except (OSError, EOFError) as exc:
        if not gz:
            raise
        raise KvtraceError(f"corrupt gzip stream ({exc})", path=str(src)) from None


def first_record(data: str | bytes, path: str) -> tuple[int, dict]:
    """The first non-blank JSON line: (line number, parsed record)."""
    for lineno, line in enumerate(_lines(data), start=1):
        if line.strip():
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "not valid UTF-8"
                raise KvtraceError(f"malformed JSON ({msg})", path=path, line=lineno) from None
            if not isinstance(rec, dict):
                raise KvtraceError("expected a JSON object per line", path=path, line=lineno)
            return lineno, rec
    raise KvtraceError("no requests: the file is empty", path=path)


def _check_value(kind: str, value) -> str | None:
    """None if ``value`` is of ``kind``, else what was expected."""
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
            return "expected a finite number"
    elif kind in ("int", "count"):
        if isinstance(value, bool) or not isinstance(value, int):
            return "expected an integer"
        if kind == "count" and value < 0:
            return f"expected a non-negative integer, got {value}"
    elif kind == "string":
        if value is not None and not isinstance(value, str):
            return "expected a string"
    elif kind == "hashes":
        if not isinstance(value, list):
            return "expected a list of integer hashes"
        for v in value:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**64:
                return f"expected integer hashes in [0, 2^64), got {v!r}"
    return None


def scan_for_error(data: str | bytes, path: str, fmt: str) -> KvtraceError | None:
    """Line-by-line validation; the first problem found, or None."""
    required, optional = _REQUIRED[fmt], _OPTIONAL[fmt]
    for lineno, line in enumerate(_lines(data), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            return KvtraceError(f"malformed JSON ({exc.msg})", path=path, line=lineno)
        except UnicodeDecodeError:
            return KvtraceError("not valid UTF-8", path=path, line=lineno)
        if not isinstance(rec, dict):
            return KvtraceError("expected a JSON object per line", path=path, line=lineno)
        for name, kind in required.items():
            if name not in rec:
                return KvtraceError("missing (required)", path=path, line=lineno, field=name)
            problem = _check_value(kind, rec[name])
            if problem:
                return KvtraceError(problem, path=path, line=lineno, field=name)
        for name, kind in optional.items():
            if name in rec:
                problem = _check_value(kind, rec[name])
                if problem:
                    return KvtraceError(problem, path=path, line=lineno, field=name)
        if rec["input_length"] > 0 and not rec["hash_ids"]:
            return KvtraceError(
                f"empty hash list for a prompt of {rec['input_length']} tokens",
                path=path, line=lineno, field="hash_ids",
            )
    return None


def _fast_read(data: str | bytes, path: str, fmt: str) -> pl.DataFrame:
    schema = _MOONCAKE_SCHEMA if fmt == "mooncake" else _BAILIAN_SCHEMA
    try:
        return pl.read_ndjson(io.BytesIO(data) if isinstance(data, bytes) else data, schema=schema,
                              ignore_errors=False)
    except Exception as exc:  # Polars raises several error types for bad input
        err = scan_for_error(data, path, fmt)
        if err is not None:
            raise err from None
        raise KvtraceError(f"cannot read as {fmt} JSONL: {str(exc).splitlines()[0]}", path=path) from None


def read_mooncake(data: str | bytes, path: str, block_tokens: int | None = None) -> tuple[pl.DataFrame, TraceMeta]:
    """Mooncake JSONL -> canonical request table (file order) and metadata.

    ``timestamp`` is in milliseconds; block size 512 tokens unless overridden.
    """
    raw = _fast_read(data, path, "mooncake")
    df = raw.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("request_id"),
        # numpy's division is correctly rounded; Polars' multiplies by 1/1000 (71 ms -> 0.07100000000000001 s)
        pl.lit(pl.Series("timestamp", raw["timestamp"].to_numpy() / 1000.0)),
        pl.col("input_length").alias("input_tokens"),
        pl.col("output_length").alias("output_tokens"),
        pl.col("hash_ids").alias("block_ids"),
    )
    meta = TraceMeta(block_tokens=block_tokens or MOONCAKE_BLOCK_TOKENS, source_format="mooncake",
                     source=os.path.basename(path))
    return df, meta


def read_bailian(data: str | bytes, path: str, block_tokens: int | None = None) -> tuple[pl.DataFrame, TraceMeta]:
    """Qwen-Bailian JSONL -> canonical request table (file order) and metadata.

    ``timestamp`` is in seconds; block size 16 tokens unless overridden. The session
    of a request is the root of its ``parent_chat_id`` chain (-1 = root).
    """
    raw = _fast_read(data, path, "bailian")
    # Polars reads a missing or null field as null; these two are required here.
    if raw["chat_id"].null_count() or raw["parent_chat_id"].null_count():
        field = "chat_id" if raw["chat_id"].null_count() else "parent_chat_id"
        raise scan_for_error(data, path, "bailian") or KvtraceError("missing (required)", path=path, field=field)
    chat = raw["chat_id"].to_numpy()
    parent = raw["parent_chat_id"].to_numpy()
    df = raw.select(
        pl.col("chat_id").alias("request_id"),
        pl.col("timestamp"),
        pl.when(pl.col("parent_chat_id") >= 0).then(pl.col("parent_chat_id")).alias("parent_id"),
        pl.col("turn"),
        pl.col("type"),
        pl.col("input_length").alias("input_tokens"),
        pl.col("output_length").alias("output_tokens"),
        pl.col("hash_ids").alias("block_ids"),
    ).with_columns(pl.Series("session_id", session_roots(chat, parent, path), dtype=pl.Int64))
    meta = TraceMeta(block_tokens=block_tokens or BAILIAN_BLOCK_TOKENS, source_format="bailian",
                     source=os.path.basename(path))
    return df, meta


def session_roots(chat: np.ndarray, parent: np.ndarray, path: str = "") -> np.ndarray:
    """Root chat id of each request's parent chain, by pointer jumping (O(R log depth)).

    A parent that is not in the trace (the trace starts mid-conversation) ends the
    chain: the earliest ancestor present is the root.
    """
    n = chat.shape[0]
    order = np.argsort(chat, kind="stable")
    sorted_chat = chat[order]
    if n > 1 and np.any(sorted_chat[1:] == sorted_chat[:-1]):
        dup = sorted_chat[1:][sorted_chat[1:] == sorted_chat[:-1]][0]
        raise KvtraceError(f"duplicate chat_id {dup}", path=path, field="chat_id")
    idx = np.searchsorted(sorted_chat, parent)
    idx = np.clip(idx, 0, max(n - 1, 0))
    found = (parent >= 0) & (n > 0) & (sorted_chat[idx] == parent) if n else np.zeros(0, bool)
    up = np.arange(n)
    up[found] = order[idx[found]]
    for _ in range(64):
        nxt = up[up]
        if np.array_equal(nxt, up):
            break
        up = nxt
    else:
        raise KvtraceError("parent_chat_id chains form a cycle", path=path, field="parent_chat_id")
    # A cycle whose length is a power of two makes ``up`` a fixed point too (up^2 = id);
    # a true root has no parent in the trace.
    if np.any(found[up]):
        raise KvtraceError("parent_chat_id chains form a cycle", path=path, field="parent_chat_id")
    return chat[up]
