"""Bounded-memory streaming over traces larger than RAM (``kvtrace curve --stream``).

An in-memory run holds the whole access table and the per-access results of its pass
(:data:`IN_MEMORY_BYTES_PER_ACCESS` at its peak), so a fleet trace of billions of
accesses does not fit. A streamed run reads the Parquet request table row group by
row group (a row group of more than :data:`kvtrace.ingest.chunks.CHUNK_ACCESSES`
accesses in batches of requests, so one huge row group costs one batch) and keeps
only what is O(distinct blocks) or O(requests) in memory; every per-access array
exists one chunk at a time.

The scan (:func:`open_stream`): each row group is validated as in memory
(:mod:`kvtrace.ingest.chunks`), its hashes get dense ids through one persistent hash
-> id map (:func:`kvtrace.kernels.densify.densify`, carried across chunks, O(distinct
blocks)), and the ids are appended to a spill file (4 bytes per access). Block sizes
(a block's largest token count over the whole trace) are only known at the end of the
scan, and every analysis needs them, so the analyses run as later passes. The map is
freed when the scan ends.

The result is a :class:`StreamedTrace`, a :class:`kvtrace.trace.source.TraceSource`:
every analysis is one fold over its chunks (:meth:`StreamedTrace.chunks`: whole
requests read back from the spill file, forward or backward, with the derived request
layout), and what a pass keeps per access for a later one is a column of the source
(:meth:`StreamedTrace.column`: a file in the spill directory; one cut short is an
error naming it). The folds are the in-memory ones, so a streamed run equals the
in-memory run bit for bit by construction (``tests/test_stream.py`` checks it). This
module imports no analysis.

Memory, per distinct block M and request R (bytes): the scan about 50-105 x M (the
hash map, 16-byte slots at load <= 0.5, plus the per-block hash, tenant and size
arrays, 20 bytes with up to 2x growth room) + 24 x R (timestamps, request ids, block
counts and last-block tokens) + the request columns kept (``type`` and ``tenant`` as
4-byte Categorical codes). The scan ends holding 20 x M + 20 x R, and hands what it
freed back to the system (Arrow's and glibc's allocators keep it otherwise). A curve
pass then holds about 60 x M (the kernel's slot arrays and per-block state) + 40 x R
(offsets, timestamps, per-request keys), plus one chunk. Disk: 12 bytes per access in
a temporary directory (``spill_dir``, default the system's: the block ids and the
curve's usable distances), removed on close.

When to stream (:func:`should_stream`): ``kvtrace curve`` streams a Parquet trace
whose in-memory run would need more than the memory budget, and always with
``--stream``. The budget is the resource guard's (:mod:`kvtrace.trace.budget`):
``$KVTRACE_MEMORY_BUDGET`` (a size such as ``8GiB``), else the memory available when the
command starts, counting the cgroup's limit.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import polars as pl

from kvtrace.config import plain_numpy_pages
from kvtrace.trace import spill as spill_mod
from kvtrace.errors import KvtraceError, UsageError
from kvtrace.ingest import probe_rows, unchained_warning
from kvtrace.ingest.chunks import ChunkInfo, ParquetRequests, chunk_accesses
from kvtrace.kernels.densify import densify
from kvtrace.trace import TraceMeta, source
from kvtrace.trace.budget import MEMORY_BUDGET_ENV
from kvtrace.trace.source import (AccessChunk, ChunkedSource, Column, FileReader,  # noqa: F401 (re-exported)
                                  read_exact, request_chunks)

#: Peak resident bytes per block access of an in-memory ``kvtrace curve`` (the README's
#: performance table), rounded up.
IN_MEMORY_BYTES_PER_ACCESS = 80
_ID_DTYPE = np.int32  # dense ids in the spill file
_MAX_BLOCKS = np.iinfo(_ID_DTYPE).max
#: Request columns kept as Categorical when asked for (group labels: a few distinct
#: strings, 4 bytes per request instead of 16 or more).
LABEL_COLUMNS = ("type", "tenant")


# --------------------------------------------------------------------------- when
def memory_budget() -> int:
    """Bytes an in-memory run may use before a command streams instead, from the one budget
    the resource guard refuses by (:func:`kvtrace.trace.budget.memory_budget`):
    ``$KVTRACE_MEMORY_BUDGET`` as given, else half of the memory available counting the
    cgroup's limit (the rest of the machine keeps room; the guard refuses only past the
    whole). So a run the guard would refuse in memory is always streamed first."""
    from kvtrace.trace import budget

    room, where = budget.memory_budget()
    if room is None:
        return 1 << 62  # nothing tells: never stream unasked
    return room if where == f"${budget.MEMORY_BUDGET_ENV}" else room // 2


def is_parquet(path: str | os.PathLike, fmt: str = "auto") -> bool:
    """Whether ``path`` is read as Parquet (streaming reads only Parquet)."""
    if fmt not in ("auto", "parquet"):
        return False
    return str(path).lower().endswith((".parquet", ".pq")) or fmt == "parquet"


def in_memory_estimate(path: str | os.PathLike) -> int:
    """Estimated peak bytes of an in-memory curve of a Parquet trace, from its metadata
    (block accesses x :data:`IN_MEMORY_BYTES_PER_ACCESS`), without reading the data."""
    import pyarrow.parquet as pq

    from kvtrace.ingest.guard import parquet_list_values

    try:
        md = pq.ParquetFile(str(path)).metadata
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise KvtraceError(f"cannot read as parquet: {str(exc).splitlines()[0]}", path=str(path)) from None
    return parquet_list_values(md)[0] * IN_MEMORY_BYTES_PER_ACCESS


#: Memory of an in-memory token-log read per byte of the log file, an upper estimate:
#: a token id takes 3-6 bytes of JSONL ("1234, ") or 2-4 of compressed Parquet and
#: about 16 bytes in memory while it is hashed (the list column and its int64 copy).
TOKEN_LOG_BYTES_PER_FILE_BYTE = 8


def should_stream(path: str | os.PathLike, fmt: str = "auto", stream: bool | None = None,
                  workload: str | None = None) -> bool:
    """Whether a command streams this trace.

    Parameters
    ----------
    stream : bool or None
        ``True``/``False`` force it (``--stream``/``--no-stream``); None decides: a
        Parquet trace streams when its in-memory run would exceed
        :func:`memory_budget`; other formats are read in memory.
    workload : str, optional
        The command's profile in :data:`kvtrace.ingest.guard.PROFILES`, whose bytes per
        access cost the in-memory run; default a curve's (:func:`in_memory_estimate`).
    """
    if stream is not None:
        if stream and not (is_parquet(path, fmt) or fmt == "tokens"):
            raise UsageError("--stream reads Parquet request tables and token logs: convert the trace once with "
                             "kvtrace ingest TRACE -o trace.parquet", field="stream")
        if stream:  # a pipe cannot be streamed (Parquet needs random access), a device never ends
            from kvtrace.ingest.inputs import check_input_kind

            check_input_kind(path, random_access=True)
        return bool(stream)
    if fmt == "tokens" and os.path.isfile(path):  # the in-memory read holds every token id
        return os.path.getsize(path) * TOKEN_LOG_BYTES_PER_FILE_BYTE > memory_budget()
    if not is_parquet(path, fmt) or not os.path.isfile(path):
        return False
    need = in_memory_estimate(path)
    if workload is not None:
        from kvtrace.ingest.guard import estimate_bytes

        need = estimate_bytes(workload, need // IN_MEMORY_BYTES_PER_ACCESS, 0, 0)
    return need > memory_budget()


# --------------------------------------------------------------------------- the trace
class _Derived:
    """A per-access column computed on indexing (``tokens`` or ``pos``) from the
    request offsets (e.g. at the next accesses a value pass looks ahead to)."""

    def __init__(self, trace: "StreamedTrace", which: str) -> None:
        self._t = trace
        self._which = which
        self.dtype = np.dtype(np.int32)
        self.shape = (trace.n_accesses,)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, idx):
        idx = np.asarray(idx, dtype=np.int64)
        rs = self._t._req_start
        r = np.searchsorted(rs, idx, side="right") - 1
        if self._which == "pos":
            return (idx - rs[r]).astype(np.int32)
        out = np.full(idx.shape, self._t.meta.block_tokens, dtype=np.int32)
        last = idx == rs[r + 1] - 1
        out[last] = self._t._last_tokens[r[last]]
        return out


class _Accesses:
    """The access table of a streamed trace: its request offsets, and ``tokens`` and
    ``pos`` derived from them on indexing. The block ids are never held; passes read
    them chunk by chunk (:meth:`StreamedTrace.chunks`)."""

    def __init__(self, trace: "StreamedTrace") -> None:
        self._t = trace
        self.req_start = trace._req_start

    def __len__(self) -> int:
        return self._t.n_accesses

    @property
    def tokens(self) -> _Derived:
        return _Derived(self._t, "tokens")

    @property
    def pos(self) -> _Derived:
        return _Derived(self._t, "pos")


class StreamedTrace(ChunkedSource):
    """A trace scanned once in chunks (:func:`open_stream`), for
    :func:`kvtrace.analyses.curves.compute_curve`.

    It has the attributes of :class:`kvtrace.trace.Trace` that the curve reads, with
    the memory of a streamed run: ``requests`` holds the timestamp (and the columns
    asked for, e.g. for ``by``; ``type`` and ``tenant`` as Categorical) but no block
    lists; ``block_hash``, ``block_tenant``, ``block_size`` are per dense block id; the
    accesses live in a spill file. Close it (or use it as a context manager) to remove
    the spill directory.
    """

    def __init__(self, meta: TraceMeta, requests: pl.DataFrame, req_start: np.ndarray, last_tokens: np.ndarray,
                 block_hash: np.ndarray, block_tenant: np.ndarray, block_size: np.ndarray, spill: Path,
                 warnings: list[str]) -> None:
        self.meta = meta
        self.requests = requests
        self._req_start = req_start
        self._last_tokens = last_tokens
        self.block_hash = block_hash
        self.block_tenant = block_tenant
        self.block_size = block_size
        self.spill = spill
        self.warnings = warnings

    # the Trace attributes the curve reads
    @property
    def n_requests(self) -> int:
        return self.requests.height

    @property
    def n_accesses(self) -> int:
        return int(self._req_start[-1])

    @property
    def n_blocks(self) -> int:
        return int(self.block_size.shape[0])

    @property
    def request_timestamp(self) -> np.ndarray:
        return self.requests["timestamp"].to_numpy()

    @property
    def duration(self) -> float:
        ts = self.request_timestamp
        return float(ts[-1] - ts[0]) if ts.size else 0.0

    @property
    def accesses(self) -> _Accesses:
        return _Accesses(self)

    # lifetime
    def close(self) -> None:
        """Remove the spill files."""
        shutil.rmtree(self.spill, ignore_errors=True)

    # the TraceSource protocol (kvtrace.trace.source)
    @property
    def req_start(self) -> np.ndarray:
        """int64[R+1]: the accesses of request r are ``req_start[r]:req_start[r+1]``."""
        return self._req_start

    def _block_reader(self):
        return FileReader(self.spill / "blocks", _ID_DTYPE)

    def _last_block_tokens(self) -> np.ndarray:
        return self._last_tokens

    def column(self, name: str, dtype) -> Column:
        """A per-access column for a later pass: a file in the spill directory."""
        return Column(self.n_accesses, dtype, self.spill / f"column-{name}")

    def _chunks(self, size: int | None = None):
        return request_chunks(self._req_start, source.CHUNK_ACCESSES if size is None else size)


@plain_numpy_pages
def open_stream(path: str | os.PathLike, *, fmt: str = "auto", block_tokens: int | None = None,
                share_tenants: bool = False, columns: Sequence[str] = (), spill_dir: str | os.PathLike | None = None,
                progress: Callable[[int, int], None] | None = None, log=None) -> StreamedTrace:
    """Pass 1 of a streamed run: scan a Parquet request table in row-group chunks.

    A token log (``fmt="tokens"``, read with ``log``, a
    :class:`kvtrace.ingest.LogOptions`) is first hashed chunk by chunk into a canonical
    Parquet table in the spill directory (:func:`kvtrace.ingest.tokens.write_token_parquet`),
    scanned, then removed: memory stays one chunk plus the distinct blocks.

    Parameters
    ----------
    path : path-like
        Canonical or generic Parquet request table, requests in timestamp order
        (:mod:`kvtrace.ingest.chunks` says why).
    fmt : str
        ``auto`` or ``parquet``.
    block_tokens : int, optional
        Tokens per block (required for generic tables).
    share_tenants : bool
        Treat equal hashes in different tenants as the same block.
    columns : sequence of str
        Request columns to keep besides ``timestamp`` (e.g. ``type`` for ``by``):
        O(requests) memory each. String ``type`` and ``tenant`` (:data:`LABEL_COLUMNS`)
        are kept as ``pl.Categorical`` (4 bytes per request).
    spill_dir : path-like, optional
        Where the spill files go (12 bytes per access; default: the system's
        temporary directory). Spill directories that killed runs left there are
        removed first (:mod:`kvtrace.trace.spill`).
    progress : callable, optional
        ``progress(requests_done, requests_total)``.

    Returns
    -------
    StreamedTrace
    """
    if fmt == "tokens":
        return _open_token_stream(path, block_tokens=block_tokens, share_tenants=share_tenants, columns=columns,
                                  spill_dir=spill_dir, progress=progress, log=log)
    if not is_parquet(path, fmt):
        raise UsageError("streaming reads Parquet request tables and token logs: convert the trace once with "
                         "kvtrace ingest", field="format")
    from kvtrace.ingest.inputs import check_input_kind

    check_input_kind(path, random_access=True)  # before pyarrow opens it: a FIFO would wait in native code
    src = ParquetRequests(path, block_tokens=block_tokens, share_tenants=share_tenants)
    B = int(src.meta.block_tokens)
    names = src.tenant_names()
    ns_max = len(names) - 1 if names else -1
    info = ChunkInfo()
    keep = [c for c in dict.fromkeys(columns) if c != "timestamp"]
    read = list(dict.fromkeys(["request_id", "timestamp", "input_tokens", "block_ids", "tenant", *keep]))
    spill_mod.clean_stale(spill_dir)  # spill directories of killed runs (kvtrace.trace.spill)
    spill = spill_mod.make_spill_dir(spill_dir)
    try:
        state = None
        ts_parts, len_parts, last_parts, kept, ids_parts = [], [], [], [], []
        probe, probed, probed_ids = [], 0, 0  # copies of the first requests' ids, for the unchained warning
        with open(spill / "blocks", "wb") as out:
            for row0, df in src.chunks(columns=read, info=info):
                lens = df["block_ids"].list.len().to_numpy()
                k = probe_rows(lens, probed, probed_ids)
                if k:
                    probe.append(_copied(df.select("block_ids", "tenant").head(k)))
                    probed, probed_ids = probed + k, probed_ids + int(lens[:k].sum())
                lengths, hashes, ns, tokens, last_tokens = chunk_accesses(df, B, names)
                if hashes.shape[0]:
                    try:
                        ids, state = densify(hashes, ns, tokens, state, top=src.top_hash, ns_max=ns_max,
                                             total=src.accesses_hint)
                    except OverflowError:
                        raise KvtraceError(f"more than {_MAX_BLOCKS:,} distinct blocks: too many for one machine; "
                                           "use --engine dask", path=str(path)) from None
                    ids.astype(_ID_DTYPE).tofile(out)
                    del ids
                del hashes, ns, tokens
                ts_parts.append(df["timestamp"].to_numpy())
                ids_parts.append(df["request_id"].to_numpy())
                len_parts.append(lengths.astype(np.int32))  # blocks in one request
                last_parts.append(last_tokens)
                if keep:
                    labels = [c for c in keep if c in LABEL_COLUMNS and df[c].dtype == pl.String]
                    kept.append(df.select(keep).with_columns(pl.col(labels).cast(pl.Categorical)))
                if progress is not None:
                    progress(row0 + df.height, src.n_rows)
        if state is None:
            state = densify(np.empty(0, np.uint64), np.empty(0, np.int32), np.empty(0, np.int32))[1]
        # free the lookup table before copying the per-block arrays out of the map
        state.direct = state.slot_hash = state.slot_ns = state.slot_id = None
        block_hash, block_ns, block_size = (a.copy() for a in state.arrays())
        del state
        timestamps = np.concatenate(ts_parts) if ts_parts else np.empty(0)
        src.check_whole(np.concatenate(ids_parts) if ids_parts else np.empty(0, np.int64), timestamps)
        del ids_parts
        lengths = np.concatenate(len_parts) if len_parts else np.empty(0, np.int32)
        req_start = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=req_start[1:])
        del lengths, len_parts
        requests = pl.DataFrame({"timestamp": timestamps})
        if keep:
            requests = pl.concat([requests, pl.concat(kept)], how="horizontal")
        del kept
        last_tokens = np.concatenate(last_parts) if last_parts else np.empty(0, np.int32)
        del last_parts
        _release_freed_memory()
        note = unchained_warning(pl.concat(probe), src.meta) if probe else None
        return StreamedTrace(src.meta, requests, req_start, last_tokens, block_hash, block_ns, block_size, spill,
                             src.warnings(info) + ([note] if note else []))
    except BaseException:
        shutil.rmtree(spill, ignore_errors=True)
        raise


def _open_token_stream(path, *, block_tokens, share_tenants, columns, spill_dir, progress, log) -> StreamedTrace:
    """:func:`open_stream` of a token log: hashed into a temporary canonical table first."""
    from kvtrace.ingest import LogOptions
    from kvtrace.ingest.tokens import write_token_parquet

    log = log or LogOptions()
    tmp = spill_mod.make_spill_dir(spill_dir)
    try:
        table = tmp / "log.parquet"
        got = write_token_parquet(path, table, fields=log.fields, spec=log.hash_spec(block_tokens),
                                  time_unit=log.time_unit, share_tenants=share_tenants)
        trace = open_stream(table, fmt="parquet", share_tenants=share_tenants, columns=columns, spill_dir=spill_dir,
                            progress=progress)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    trace.meta = TraceMeta(**{**trace.meta.to_dict(), "source": os.path.basename(str(path))})
    trace.warnings = got.notes + list(trace.warnings)
    return trace


def _copied(df: pl.DataFrame) -> pl.DataFrame:
    """``df`` in buffers of its own (a slice of a chunk would keep the whole chunk alive)."""
    return pl.from_arrow(df.to_arrow().combine_chunks().take(np.arange(df.height)))


def _release_freed_memory() -> None:
    """Hand the memory the scan freed back to the system. Arrow's allocator keeps the
    pages of the row groups it read, and glibc's heap the per-chunk arrays smaller than
    its mmap threshold, interleaved with the per-request parts, which would otherwise
    stay resident through every later pass."""
    import pyarrow as pa

    pa.default_memory_pool().release_unused()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def spill_bytes(n_accesses: int) -> int:
    """Disk a streamed curve needs in its spill directory (bytes)."""
    return int(n_accesses) * (np.dtype(_ID_DTYPE).itemsize + 8)


__all__ = ["IN_MEMORY_BYTES_PER_ACCESS", "MEMORY_BUDGET_ENV", "StreamedTrace",
           "in_memory_estimate", "is_parquet", "memory_budget", "open_stream", "should_stream", "spill_bytes"]
