"""Parquet request tables read row group by row group (streaming and distributed runs).

A trace too large to hold is read in chunks of consecutive requests: a Parquet row
group, split into batches of at most :data:`CHUNK_ACCESSES` block accesses (a file
written as one huge row group must not cost its whole row group at once). Each chunk is
conformed to the canonical request schema and validated exactly as
:func:`~kvtrace.ingest.canonical.prepare_requests` validates a whole table (same
messages; rows are numbered in the whole file), so a chunked run accepts and rejects
the same files as an in-memory one.

What a chunked read needs, and why
----------------------------------
- **Parquet**: kvtrace's canonical table, or a generic request table with a list column
  of block hashes (:mod:`kvtrace.ingest.tabular`). An exploded access table (one row per
  block) is regrouped by request, which needs the whole file: convert it once with
  ``kvtrace ingest``. JSONL is read whole by its readers: convert it once too.
- **Requests in timestamp order.** Trace order is a stable sort by arrival; an
  in-memory run sorts, a chunked one cannot without holding the table, so a decrease
  is an error naming the row. Tables written by ``kvtrace ingest`` and ``kvtrace
  synth`` are sorted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import polars as pl

from kvtrace.errors import KvtraceError
from kvtrace.trace import OPTIONAL_REQUEST_SCHEMA, REQUEST_SCHEMA, TraceMeta
from kvtrace.ingest.canonical import conform, prepare_requests, read_metadata
from kvtrace.ingest.tabular import (ALIASES, LIST_COLUMNS, cast_column, column_named, from_generic, source_names,
                                    to_seconds)

#: Columns a chunk carries by default (the rest of the canonical schema is left out).
CORE_COLUMNS = ("timestamp", "input_tokens", "block_ids", "tenant")
#: Block accesses per chunk at most (a row group holding more is read in batches of
#: requests): a chunk's per-access arrays cost about 60 bytes per access in pass 1 of a
#: streamed run (Arrow and Polars copies of the hashes, namespaces, tokens, ids), ~250 MB.
CHUNK_ACCESSES = 1 << 22


@dataclass
class ChunkInfo:
    """Totals of a chunked read, filled in as chunks are read."""

    rows: int = 0
    #: requests whose hash list length differs from ceil(input_tokens / B)
    length_mismatches: int = 0
    last_timestamp: float = -np.inf


class ParquetRequests:
    """A Parquet request table opened for reading in row-group chunks.

    Parameters
    ----------
    path : path-like
        Canonical or generic Parquet request table, requests in timestamp order.
    block_tokens : int, optional
        Tokens per block; required for generic tables, checked against a canonical
        table's own.
    share_tenants : bool
        Treat equal hashes in different tenants as the same block.

    Attributes
    ----------
    meta : TraceMeta
    n_rows : int
        Requests in the file.
    row_offsets : int64[G + 1]
        First row of each row group (global request index), and the row count.
    accesses_hint : int
        Values of the block-hash column in the file metadata (= block accesses, plus
        one per empty list): sizes buffers and the memory estimate without a read.
    top_hash : int or None
        Largest block hash, from the column statistics when present.
    """

    def __init__(self, path: str | os.PathLike, *, block_tokens: int | None = None,
                 share_tenants: bool = False) -> None:
        import pyarrow.parquet as pq

        self.path = str(path)
        if not os.path.exists(self.path):
            raise KvtraceError("no such file", path=self.path)
        md = read_metadata(self.path)  # one-line error for a file that is not Parquet
        self._file = pq.ParquetFile(self.path)
        fmd = self._file.metadata
        names = self._file.schema_arrow.names
        self.canonical = bool(md and "block_tokens" in md)
        if self.canonical:
            meta = TraceMeta.from_dict(md)
            if block_tokens is not None and block_tokens != meta.block_tokens:
                raise KvtraceError(
                    f"--block-tokens {block_tokens} contradicts the trace's block size {meta.block_tokens} in a "
                    "streamed run: re-blocking rewrites every request in memory (--no-stream, or `kvtrace ingest "
                    f"--block-tokens {block_tokens} -o t.parquet` once)",
                    path=self.path, field="block_tokens",
                )
            self.list_column = "block_ids"
        else:
            self.list_column = column_named(names, LIST_COLUMNS)
            if self.list_column is None:
                raise KvtraceError(
                    "a chunked read needs a request table with a list column of block hashes "
                    "(block_ids/hash_ids); convert an access table once with kvtrace ingest",
                    path=self.path,
                )
            if block_tokens is None:
                raise KvtraceError("generic tables do not say their block size: pass --block-tokens N",
                                   path=self.path, field="block_tokens")
            meta = TraceMeta(block_tokens=int(block_tokens), source_format="parquet",
                             source=os.path.basename(self.path))
        if share_tenants != meta.share_tenants:
            meta = TraceMeta(**{**meta.to_dict(), "share_tenants": share_tenants})
        self.meta = meta
        self.columns = names
        counts = [fmd.row_group(i).num_rows for i in range(fmd.num_row_groups)]
        self.row_offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.row_offsets[1:])
        self.n_rows = int(self.row_offsets[-1])
        if self.n_rows == 0:
            raise KvtraceError("no requests: the table is empty", path=self.path)
        leaf, top, have_stats = 0, 0, True
        self._group_values = np.zeros(fmd.num_row_groups, dtype=np.int64)  # list values per row group
        for i in range(fmd.num_row_groups):
            rg = fmd.row_group(i)
            for j in range(rg.num_columns):
                col = rg.column(j)
                if col.path_in_schema.split(".")[0] != self.list_column:
                    continue
                leaf += int(col.num_values)
                self._group_values[i] += int(col.num_values)
                st = col.statistics
                if st is not None and st.has_min_max and rg.num_rows:
                    top = max(top, int(st.max))
                elif rg.num_rows:
                    have_stats = False
        self.accesses_hint = leaf
        self.top_hash = top if have_stats else None
        self._t0 = 0.0 if self.canonical else None  # generic: the first arrival becomes 0

    @property
    def n_row_groups(self) -> int:
        return int(self.row_offsets.shape[0] - 1)

    def _raw(self, row_groups: Sequence[int], columns: Sequence[str] | None) -> pl.DataFrame:
        want = None
        if self.canonical and columns is not None:
            want = [c for c in columns if c in self.columns]
        try:
            table = self._file.read_row_groups(list(row_groups), columns=want)
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise KvtraceError(f"cannot read as parquet: {str(exc).splitlines()[0]}", path=self.path) from None
        return pl.from_arrow(table)

    def batch_rows(self, g: int) -> int:
        """Requests per batch of row group ``g``: all of them, unless its block accesses
        (from the metadata) exceed :data:`CHUNK_ACCESSES`; then about that many accesses
        per batch (the average request length of the row group)."""
        rows = int(self.row_offsets[g + 1] - self.row_offsets[g])
        values = int(self._group_values[g])
        if values <= CHUNK_ACCESSES:
            return max(rows, 1)
        return max(1, rows * CHUNK_ACCESSES // values)

    def _raw_batches(self, g: int, columns: Sequence[str] | None) -> Iterator[pl.DataFrame]:
        """Row group ``g`` in batches of :meth:`batch_rows` requests (one batch when it is
        small), decoded one at a time: a batch's columns are all that is held."""
        rows = self.batch_rows(g)
        if rows >= self.row_offsets[g + 1] - self.row_offsets[g]:
            yield self._raw([g], columns)
            return
        import pyarrow as pa

        want = None
        if self.canonical and columns is not None:
            want = [c for c in columns if c in self.columns]
        batches = self._file.iter_batches(batch_size=rows, row_groups=[g], columns=want)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except Exception as exc:  # pyarrow raises several types for a damaged file
                raise KvtraceError(f"cannot read as parquet: {str(exc).splitlines()[0]}", path=self.path) from None
            yield pl.from_arrow(pa.Table.from_batches([batch]))
            del batch

    def tenant_names(self, row_groups: Sequence[int] | None = None) -> list[str] | None:
        """Sorted tenant names of the file (of ``row_groups`` when given): the namespace
        codes of :func:`~kvtrace.ingest.canonical._namespaces`. None when blocks have no
        tenant namespace (no tenant values, or shared tenants)."""
        if self.meta.share_tenants:
            return None
        names: set[str] = set()
        for g in range(self.n_row_groups) if row_groups is None else row_groups:
            names.update(self._column(g, "tenant").drop_nulls().unique().to_list())
        return sorted(names) if names else None

    def _column(self, g: int, name: str) -> pl.Series:
        """One canonical per-request column (``tenant`` or ``timestamp``, as stored) of
        row group ``g``, read from its own source column only: a generic table's
        block-hash lists are not decoded for it. Converted as
        :func:`~kvtrace.ingest.tabular.from_generic` converts it."""
        row0 = int(self.row_offsets[g])
        if self.canonical:
            return self._canonical(self._raw([g], [name]), row0, [name])[name]
        rows = int(self.row_offsets[g + 1]) - row0
        source = None
        if name == "timestamp":
            source = column_named(self.columns, ALIASES["timestamp_ms"])
            per_second = 1000.0 if source is not None else 1.0
            source = source or column_named(self.columns, ALIASES["timestamp"])
        else:
            source = column_named(self.columns, ALIASES[name])
        if source is None:  # from_generic's own message (no timestamp column), or no tenants
            if name == "timestamp":
                import pyarrow as pa

                first = next(self._file.iter_batches(batch_size=1, row_groups=[g]))
                return self._canonical(pl.from_arrow(pa.Table.from_batches([first])), row0, [name])[name]
            return pl.Series(name, [None] * rows, dtype=pl.String)
        try:
            col = pl.from_arrow(self._file.read_row_groups([g], columns=[source]))[source]
        except Exception as exc:  # pyarrow raises several types for a damaged file
            raise KvtraceError(f"cannot read as parquet: {str(exc).splitlines()[0]}", path=self.path) from None

        def where(row: int) -> dict:
            return {"path": self.path, "row": row0 + row}

        if name == "timestamp":
            return to_seconds(col, source, per_second, where)
        return cast_column(col, source, REQUEST_SCHEMA[name], where)

    def _canonical(self, df: pl.DataFrame, row0: int, columns: Sequence[str] | None) -> pl.DataFrame:
        if not self.canonical:
            try:
                df, _ = from_generic(df, self.path, "parquet", self.meta.block_tokens)
            except KvtraceError as exc:  # rows numbered in the whole file, not in the chunk
                if exc.row is None or not row0:
                    raise
                raise KvtraceError(exc.message, path=exc.path, row=exc.row + row0, field=exc.field) from None
            if column_named(self.columns, ALIASES["request_id"]) is None:  # row numbers, as in memory
                df = df.with_columns(pl.col("request_id") + row0)
        df = conform(df)
        if columns is not None:  # an optional column asked for but not in the file: all null
            df = df.with_columns(pl.lit(None, dtype=OPTIONAL_REQUEST_SCHEMA[c]).alias(c)
                                 for c in columns if c in OPTIONAL_REQUEST_SCHEMA and c not in df.columns)
        return df if columns is None else df.select(list(columns))

    def chunks(self, columns: Sequence[str] = CORE_COLUMNS, row_groups: Sequence[int] | None = None,
               info: ChunkInfo | None = None) -> Iterator[tuple[int, pl.DataFrame]]:
        """Validated chunks in trace order: ``(first row, table)`` per row group, or per
        batch of at most about :data:`CHUNK_ACCESSES` accesses of a larger row group.

        Parameters
        ----------
        columns : sequence of str
            Canonical columns to return (validation reads what it needs besides).
        row_groups : sequence of int, optional
            Consecutive row groups to read (default: all). Timestamp order is checked
            inside them and against ``info.last_timestamp``.
        info : ChunkInfo, optional
            Accumulates totals (rows, length mismatches, last timestamp).

        Timestamps are seconds from the first arrival of the whole file (a generic
        table's are shifted so its first request arrives at 0, as in memory).
        """
        info = info if info is not None else ChunkInfo()
        need = list(dict.fromkeys(["request_id", "timestamp", "input_tokens", "output_tokens", "block_ids",
                                   *columns]))
        groups = range(self.n_row_groups) if row_groups is None else row_groups
        for g in groups:
            row0 = int(self.row_offsets[g])
            if self.row_offsets[g + 1] == row0:
                continue
            for raw in self._raw_batches(g, need):
                if raw.height == 0:
                    continue
                df = self._canonical(raw, row0, need)
                del raw
                df = self._validate(df, row0, info)
                yield row0, df.select(list(columns))
                row0 += df.height
                del df

    def first_timestamp(self) -> float:
        """Arrival of the first request, seconds as stored (before any shift)."""
        for g in range(self.n_row_groups):
            if self.row_offsets[g + 1] > self.row_offsets[g]:
                v = self._column(g, "timestamp")[0]
                if v is None or not np.isfinite(v):
                    raise KvtraceError("expected a finite number", path=self.path, row=int(self.row_offsets[g]),
                                       field="timestamp")
                return float(v)
        return 0.0

    def _validate(self, df: pl.DataFrame, row0: int, info: ChunkInfo) -> pl.DataFrame:
        ts = df["timestamp"].to_numpy()
        try:
            checked, _ = prepare_requests(df, self.meta, source=self.path, already_relative=True)
        except KvtraceError as exc:
            if exc.row is None:
                raise
            field = exc.field if self.canonical else source_names(self.columns).get(exc.field, exc.field)
            raise KvtraceError(exc.message, path=exc.path, row=exc.row + row0, field=field) from None
        if self._t0 is None:
            self._t0 = self.first_timestamp()
        if self._t0:
            ts = ts - self._t0
            df = df.with_columns(pl.Series("timestamp", ts))
            if "end_timestamp" in df.columns:  # on the same clock: shifted with the arrivals
                df = df.with_columns(pl.col("end_timestamp") - self._t0)
        down = np.flatnonzero(np.diff(ts) < 0)
        if ts.size and ts[0] < info.last_timestamp:
            bad = 0
        elif down.size:
            bad = int(down[0]) + 1
        else:
            bad = -1
        if bad >= 0:
            raise KvtraceError(
                "requests are not in timestamp order (this row arrives before the one above it): a streaming "
                "or distributed run reads the table in order; sort it first (kvtrace ingest sorts a trace "
                "that fits in memory)",
                path=self.path, row=row0 + bad, field="timestamp",
            )
        B = int(self.meta.block_tokens)
        lengths = checked["block_ids"].list.len().to_numpy().astype(np.int64)
        inputs = checked["input_tokens"].to_numpy().astype(np.int64)
        info.length_mismatches += int(np.count_nonzero(lengths != -(-inputs // B)))
        info.rows += df.height
        info.last_timestamp = float(ts[-1])
        return df

    def check_whole(self, request_id: np.ndarray, timestamp: np.ndarray) -> None:
        """The checks that need the whole table, once every chunk is read: request ids
        seen twice, and the trace's time span. The same checks as in memory
        (:func:`~kvtrace.ingest.canonical.prepare_requests` on the ids and times, with
        empty block lists): same messages, rows numbered in the file. O(requests)."""
        import pyarrow as pa

        n = int(request_id.shape[0])
        if n == 0:
            return
        empty = pa.LargeListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int64)), pa.array([], pa.uint64()))
        zeros = np.zeros(n, dtype=np.int64)
        df = pl.DataFrame({"request_id": request_id, "timestamp": timestamp, "input_tokens": zeros,
                           "output_tokens": zeros}).with_columns(pl.Series("block_ids", empty))
        try:
            prepare_requests(df, self.meta, source=self.path, already_relative=True)
        except KvtraceError as exc:
            if self.canonical or exc.field is None:
                raise
            raise KvtraceError(exc.message, path=exc.path, row=exc.row,
                               field=source_names(self.columns).get(exc.field, exc.field)) from None

    def warnings(self, info: ChunkInfo) -> list[str]:
        """The warnings an in-memory load of the same file gives (same text)."""
        if not info.length_mismatches:
            return []
        B = int(self.meta.block_tokens)
        return [f"{info.length_mismatches} of {info.rows} requests have len(hash_ids) != ceil(input_length/{B}); "
                "block tokens follow the hash list (last block clamped to [1, B])"]


def namespace_codes(tenant: pl.Series, names: list[str] | None) -> np.ndarray | None:
    """int32 namespace per request (-1: none) from the file's sorted tenant names."""
    if names is None:
        return None
    return (tenant.replace_strict(names, list(range(len(names))), default=None, return_dtype=pl.Int32)
            .fill_null(-1).to_numpy())


def chunk_accesses(df: pl.DataFrame, block_tokens: int, names: list[str] | None):
    """Per-access arrays of a validated chunk, as :func:`build_trace` derives them.

    Returns
    -------
    lengths : int64[r]
        Blocks per request.
    hashes : uint64[n]
    ns : int32[n]
        Namespace per access (-1: none).
    tokens : int32[n]
        ``block_tokens`` except a request's last block, ``input_tokens - B*(len-1)``
        clamped to [1, B].
    last_tokens : int32[r]
        Tokens of each request's last block (``block_tokens`` for an empty request).
    """
    B = int(block_tokens)
    col = df["block_ids"]
    lengths = col.list.len().to_numpy().astype(np.int64)
    inputs = df["input_tokens"].to_numpy().astype(np.int64)
    n = int(lengths.sum())
    hashes = (col.explode(empty_as_null=False).to_numpy() if n else np.empty(0, np.uint64))
    hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
    ends = np.cumsum(lengths)
    tokens = np.full(n, B, dtype=np.int32)
    last_tokens = np.full(lengths.shape[0], B, dtype=np.int32)
    has = lengths > 0
    last_tokens[has] = np.clip(inputs[has] - B * (lengths[has] - 1), 1, B).astype(np.int32)
    tokens[ends[has] - 1] = last_tokens[has]
    codes = namespace_codes(df["tenant"], names) if "tenant" in df.columns else None
    ns = (np.full(n, -1, dtype=np.int32) if codes is None else np.repeat(codes, lengths).astype(np.int32))
    return lengths, hashes, ns, tokens, last_tokens
