"""Canonical request table -> :class:`~kvtrace.trace.Trace` (access table, dense ids).

Every reader produces a canonical request table (``REQUEST_SCHEMA``) in file order;
:func:`requests_to_trace` validates it, puts it in trace order, and builds the access
table that every analysis consumes.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import numpy as np
import polars as pl

from kvtrace.errors import KvtraceError
from kvtrace.kernels.densify import densify
from kvtrace.kernels.layout import request_and_pos
from kvtrace.outputs import atomic_path
from kvtrace.trace import OPTIONAL_REQUEST_SCHEMA, REQUEST_SCHEMA, Accesses, Trace, TraceMeta

METADATA_KEY = b"kvtrace"


#: Largest block size accepted, in tokens (engines use 16 to 4,096).
MAX_BLOCK_TOKENS = 1 << 20
#: Largest prompt or output length accepted, in tokens: sums over millions of requests,
#: and bytes (tokens x KV bytes per token), must stay far from int64's limit.
MAX_TOKENS = 1 << 40
#: Longest trace accepted, in seconds (317 years): a longer span is a unit mistake
#: (nanoseconds read as seconds) or a corrupt timestamp.
MAX_SPAN_S = 1e10


def conform(df: pl.DataFrame, *, source: str | None = None) -> pl.DataFrame:
    """Add missing nullable columns and cast to ``REQUEST_SCHEMA`` in its column order,
    then the ``OPTIONAL_REQUEST_SCHEMA`` columns ``df`` has (cast the same way)."""
    cols = []
    for name, dtype in {**REQUEST_SCHEMA, **OPTIONAL_REQUEST_SCHEMA}.items():
        if name not in REQUEST_SCHEMA and name not in df.columns:
            continue
        if name in df.columns:
            if df.schema[name] != dtype:
                try:  # (Polars casts a struct field by field: check what comes out)
                    ok = df.select(pl.col(name).cast(dtype, strict=True)).schema[name] == dtype
                except Exception:
                    ok = False
                if not ok:
                    raise KvtraceError(f"expected {_TYPE_TEXT[name]}, found a column of {df.schema[name]}",
                                       path=source, field=name)
            cols.append(pl.col(name).cast(dtype))
        else:
            cols.append(pl.lit(None, dtype=dtype).alias(name))
    return df.select(cols)


_TYPE_TEXT = {
    "request_id": "integer ids", "timestamp": "numbers (seconds)", "session_id": "integer ids",
    "parent_id": "integer ids", "turn": "integers", "type": "strings", "tenant": "strings",
    "input_tokens": "integers (tokens)", "output_tokens": "integers (tokens)",
    "block_ids": "lists of integer hashes in [0, 2^64)", "end_timestamp": "numbers (seconds)",
}


def requests_to_trace(
    df: pl.DataFrame,
    meta: TraceMeta,
    *,
    source: str | None = None,
    row_to_line: np.ndarray | None = None,
    already_relative: bool = True,
) -> Trace:
    """Validate a canonical request table and build the trace.

    :func:`prepare_requests` then :func:`build_trace`; see them for the parameters.
    """
    df, warn = prepare_requests(df, meta, source=source, row_to_line=row_to_line,
                                already_relative=already_relative)
    return build_trace(df, meta, warn)


def prepare_requests(
    df: pl.DataFrame,
    meta: TraceMeta,
    *,
    source: str | None = None,
    row_to_line: np.ndarray | None = None,
    already_relative: bool = True,
    locate: Callable[[int], dict] | None = None,
) -> tuple[pl.DataFrame, list[str]]:
    """Validate a canonical request table and put it in trace order.

    Parameters
    ----------
    df : polars.DataFrame
        Canonical request table in file order (timestamps in seconds).
    meta : TraceMeta
        Trace metadata; ``meta.block_tokens`` sets the partial-last-block rule.
    source : str, optional
        File name for messages.
    row_to_line : int64[R], optional
        1-based source line of each row, for messages naming lines.
    already_relative : bool
        When False, timestamps are shifted so the first arrival is 0.
    locate : callable, optional
        row -> ``path`` and ``line`` (or ``row``) of that request in its source, for
        messages; takes precedence over ``row_to_line``.

    Returns
    -------
    df : polars.DataFrame
        The request table in trace order (stable sort by timestamp).

    warnings : list of str
        Problems repaired or tolerated, with counts.

    Raises
    ------
    KvtraceError
        Naming the first bad row: a missing value, a null hash, a timestamp that is
        not finite or a span over ``MAX_SPAN_S``, a negative or absurd length, an
        empty hash list for a non-empty prompt, a request id seen twice (both rows).
    """
    src = source if source is not None else meta.source
    df = conform(df, source=src)
    warn: list[str] = []
    if df.height == 0:
        raise KvtraceError("no requests: the trace is empty", path=src)

    def where(row: int) -> dict:
        if locate is not None:
            return locate(row)
        if row_to_line is not None:
            return {"path": src, "line": int(row_to_line[row])}
        return {"path": src, "row": int(row)}

    B = int(meta.block_tokens)
    if not 1 <= B <= MAX_BLOCK_TOKENS:
        raise KvtraceError(f"block size must be in [1, {MAX_BLOCK_TOKENS:,}] tokens, got {B}", path=src,
                           field="block_tokens")
    for name in ("timestamp", "block_ids", "input_tokens", "output_tokens"):
        nulls = df[name].is_null()
        if nulls.any():
            row = int(nulls.arg_true()[0])
            raise KvtraceError("missing value (required)", field=name, **where(row))
    row = _first_null_hash(df["block_ids"])
    if row is not None:
        raise KvtraceError("expected integer hashes in [0, 2^64), got null", field="block_ids", **where(row))
    ts = df["timestamp"].to_numpy()
    bad = ~np.isfinite(ts)
    if bad.any():
        raise KvtraceError("expected a finite number", field="timestamp", **where(int(np.argmax(bad))))
    if "end_timestamp" in df.columns:  # optional; null where a request's end is unknown
        bad = (~df["end_timestamp"].is_finite()).fill_null(False).to_numpy()
        if bad.any():
            raise KvtraceError("expected a finite number", field="end_timestamp", **where(int(np.argmax(bad))))
    lo, hi = float(ts.min()), float(ts.max())
    if hi - lo > MAX_SPAN_S:
        # name the outlier: the end farther from the median
        med = float(np.median(ts))
        row = int(np.argmax(ts)) if hi - med >= med - lo else int(np.argmin(ts))
        raise KvtraceError(f"this timestamp makes the trace span {hi - lo:.3g} s: expected at most "
                           f"{MAX_SPAN_S:.0e} s (317 years); a wrong unit or a corrupt value?",
                           field="timestamp", **where(row))
    for name in ("input_tokens", "output_tokens"):
        values = df[name].to_numpy()
        out = (values < 0) | (values > MAX_TOKENS)
        if out.any():
            row = int(np.argmax(out))
            what = "a non-negative integer" if values[row] < 0 else "at most 2^40 tokens"
            raise KvtraceError(f"expected {what}, got {values[row]}", field=name, **where(row))
    _check_unique_ids(df, where)

    lengths = df["block_ids"].list.len().to_numpy().astype(np.int64)
    inputs = df["input_tokens"].to_numpy().astype(np.int64)
    empty = (lengths == 0) & (inputs > 0)
    if empty.any():
        row = int(np.argmax(empty))
        raise KvtraceError(
            f"empty hash list for a prompt of {inputs[row]} tokens", field="block_ids", **where(row)
        )
    expected = -(-inputs // B)
    mismatch = int(np.count_nonzero(lengths != expected))
    if mismatch:
        warn.append(
            f"{mismatch} of {df.height} requests have len(hash_ids) != ceil(input_length/{B}); "
            "block tokens follow the hash list (last block clamped to [1, B])"
        )

    # Trace order: stable sort by timestamp.
    descents = int(np.count_nonzero(np.diff(ts) < 0))
    if descents:
        warn.append(f"timestamps are not monotonic ({descents} decreases); requests sorted stably by time")
        order = np.argsort(ts, kind="stable")
        df = df[order]
        ts = ts[order]
        lengths = lengths[order]
        inputs = inputs[order]
    if not already_relative:  # an end time is on the same clock: shifted with its start
        df = df.with_columns(pl.col(c) - float(ts[0]) for c in ("timestamp", "end_timestamp") if c in df.columns)
    return df, warn


def _first_null_hash(col: pl.Series) -> int | None:
    """Row of the first list holding a null hash, or None (the common case costs a look
    at Arrow's null counts, not a copy of the hashes)."""
    arr = col.to_arrow()
    chunks = arr.chunks if hasattr(arr, "chunks") else [arr]
    if not any(chunk.flatten().null_count for chunk in chunks):
        return None
    has = col.list.eval(pl.element().is_null().any()).list.first().fill_null(False)
    rows = has.arg_true()
    return int(rows[0]) if rows.len() else None


def _check_unique_ids(df: pl.DataFrame, where: Callable[[int], dict]) -> None:
    """A request id seen twice is an error naming both rows (a trace concatenated twice,
    or shards that overlap): every per-request result would count it twice."""
    nulls = df["request_id"].null_count()
    if nulls == df.height:  # a table built without ids (library use): nothing to check
        return
    if nulls:
        row = int(df["request_id"].is_null().arg_true()[0])
        raise KvtraceError("missing value (required)", field="request_id", **where(row))
    ids = df["request_id"].to_numpy()
    if ids.size < 2:
        return
    order = np.argsort(ids, kind="stable")
    s = ids[order]
    same = np.flatnonzero(s[1:] == s[:-1])
    if same.size == 0:
        return
    k = same[np.argmin(order[same + 1])]  # the earliest repeat in file order
    first, again = int(order[k]), int(order[k + 1])
    at = where(again)
    before = where(first)
    text = (f"line {before['line']}" if "line" in before and before.get("path") == at.get("path")
            else f"{before['path']}:{before['line']}" if "line" in before else f"row {before['row']}")
    raise KvtraceError(f"duplicate request id {ids[again]}: first at {text}", field="request_id", **at)


def _namespaces(df: pl.DataFrame, meta: TraceMeta) -> np.ndarray | None:
    """int32 namespace per request (-1: none), or None when the trace has no tenants.

    Namespace = rank of the tenant name among the trace's tenants (exact: two names
    never share a namespace)."""
    if meta.share_tenants or df["tenant"].null_count() == df.height:
        return None
    names = sorted(df["tenant"].drop_nulls().unique().to_list())
    return (
        df["tenant"]
        .replace_strict(names, list(range(len(names))), default=None, return_dtype=pl.Int32)
        .fill_null(-1)
        .to_numpy()
    )


def distinct_blocks(df: pl.DataFrame, meta: TraceMeta) -> int:
    """Distinct blocks of a prepared request table, without building the access table
    (memory: the dense-id table only)."""
    ns_req = _namespaces(df, meta)
    col = df["block_ids"]
    lengths = col.list.len().to_numpy().astype(np.int64)
    n = int(lengths.sum())
    if n == 0:
        return 0
    top = int(col.list.max().max() or 0)
    ns_max = int(ns_req.max()) if ns_req is not None and ns_req.size else -1
    state = None
    for row, piece, lens in hash_pieces(col, lengths):
        m = int(lens.sum())
        hashes = piece.explode(empty_as_null=False).to_numpy()
        ns = (np.full(m, -1, dtype=np.int32) if ns_req is None
              else np.repeat(ns_req[row:row + lens.shape[0]], lens).astype(np.int32))
        _, state = densify(hashes, ns, np.ones(m, dtype=np.int32), state, top=top, ns_max=ns_max, total=n)
        del hashes, ns
    return int(state.n_blocks) if state is not None else 0


#: Block accesses per piece of the hash column that is copied out at once (the hashes,
#: namespaces and ids of a piece: ~20 bytes per access, ~80 MB).
PIECE_ACCESSES = 1 << 22


def hash_pieces(col: pl.Series, lengths: np.ndarray, size: int | None = None):
    """``(first row, piece, lengths)`` of a list column, in pieces of whole rows holding
    at most about ``size`` accesses (default :data:`PIECE_ACCESSES`; a longer row is a
    piece of its own) and never across the column's chunks; pieces without accesses
    are skipped. A caller copying each piece's hashes out holds one piece at a time,
    never a copy of the whole column."""
    size = PIECE_ACCESSES if size is None else size
    row = 0
    for part in col.get_chunks():
        rows = part.len()
        lens = lengths[row:row + rows]
        ends = np.cumsum(lens)
        a = 0
        while a < rows:
            base = int(ends[a - 1]) if a else 0
            b = max(int(np.searchsorted(ends, base + size, side="right")), a + 1)
            if int(ends[b - 1]) > base:
                yield row + a, part.slice(a, b - a), lens[a:b]
            a = b
        row += rows


def build_trace(df: pl.DataFrame, meta: TraceMeta, warnings: list[str] | None = None) -> Trace:
    """The access table and dense block ids of a prepared request table.

    Parameters
    ----------
    df : polars.DataFrame
        Output of :func:`prepare_requests` (validated, in trace order).
    meta : TraceMeta
    warnings : list of str, optional
        Carried into ``Trace.warnings``.
    """
    warn = list(warnings or [])
    B = int(meta.block_tokens)
    lengths = df["block_ids"].list.len().to_numpy().astype(np.int64)
    inputs = df["input_tokens"].to_numpy().astype(np.int64)
    req_start = np.zeros(df.height + 1, dtype=np.int64)
    np.cumsum(lengths, out=req_start[1:])
    n = int(req_start[-1])
    request, pos = request_and_pos(req_start)
    tokens = np.full(n, B, dtype=np.int32)
    has = lengths > 0
    last_idx = req_start[1:][has] - 1
    last_tokens = np.clip(inputs[has] - B * (lengths[has] - 1), 1, B)
    tokens[last_idx] = last_tokens.astype(np.int32)

    ns_req = _namespaces(df, meta)
    # Densify chunk by chunk of the list column, so the hashes are never copied whole.
    col = df["block_ids"]
    block = np.empty(n, dtype=np.int64)
    state = None
    top = int(col.list.max().max() or 0) if n else 0
    ns_max = int(ns_req.max()) if ns_req is not None and ns_req.size else -1
    for row, piece, lens in hash_pieces(col, lengths) if n else []:
        lo, hi = int(req_start[row]), int(req_start[row + lens.shape[0]])
        hashes = piece.explode(empty_as_null=False).to_numpy()
        ns = (np.full(hi - lo, -1, dtype=np.int32) if ns_req is None
              else ns_req[request[lo:hi]].astype(np.int32))
        block[lo:hi], state = densify(hashes, ns, tokens[lo:hi], state, top=top, ns_max=ns_max, total=n)
        del hashes, ns
    if state is None:
        state = densify(np.empty(0, np.uint64), np.empty(0, np.int32), np.empty(0, np.int32))[1]
    block_hash, block_ns, block_size = (a.copy() for a in state.arrays())
    del state

    return Trace(
        requests=df,
        accesses=Accesses(request=request, pos=pos, block=block, tokens=tokens, req_start=req_start),
        block_hash=block_hash,
        block_tenant=block_ns,
        block_size=block_size,
        meta=meta,
        warnings=warn,
    )


def write_canonical(trace_or_requests, meta: TraceMeta | None, path: str | os.PathLike) -> None:
    """Write the canonical request table to Parquet (atomically) with trace metadata.

    Parameters
    ----------
    trace_or_requests : Trace or polars.DataFrame
    meta : TraceMeta or None
        Required when a DataFrame is given.
    path : path-like
        Destination ``.parquet`` file.
    """
    if isinstance(trace_or_requests, Trace):
        df, meta = trace_or_requests.requests, trace_or_requests.meta
    else:
        df = conform(trace_or_requests)
        if meta is None:
            raise ValueError("meta is required when writing a DataFrame")
    md = {METADATA_KEY.decode(): json.dumps({"version": 1, **meta.to_dict()}, sort_keys=True)}
    with atomic_path(path) as tmp:
        # Polars' own writer: no Arrow copy of the (large) list column
        df.write_parquet(tmp, compression="zstd", row_group_size=1 << 17, metadata=md)


def read_metadata(path: str | os.PathLike) -> dict | None:
    """The kvtrace metadata of a Parquet file, or None when it has none."""
    import pyarrow.parquet as pq

    try:
        md = pq.read_metadata(path).metadata or {}  # the file's key-value metadata
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise KvtraceError(f"cannot read as parquet: {str(exc).splitlines()[0]}", path=str(path)) from None
    raw = md.get(METADATA_KEY)
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        raise KvtraceError("kvtrace metadata is not valid JSON", path=str(path), field="kvtrace") from None
