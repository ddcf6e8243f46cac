"""Bounded-memory streaming over traces larger than RAM (``kvtrace curve --stream``).

An in-memory run holds the whole access table and every per-access result: about 80
bytes per block access at its peak (2.3 GB for 30M accesses), so a fleet trace of
billions of accesses does not fit. A streamed run reads the Parquet request table row
group by row group (a row group of more than
:data:`kvtrace.ingest.chunks.CHUNK_ACCESSES` accesses in batches of requests, so one
huge row group costs one batch) and keeps only what is O(distinct blocks) or
O(requests) in memory;
every per-access array exists one chunk at a time. Its results equal the in-memory
run's **bit for bit** (``tests/test_stream.py`` compares every array and table).

Passes
------
1. **Scan** (:func:`open_stream`): each row group is validated as in memory
   (:mod:`kvtrace.ingest.chunks`), its hashes get dense ids through one persistent
   hash -> id map (:func:`kvtrace.kernels.densify.densify`, carried across chunks,
   O(distinct blocks)), and the ids are appended to a spill file (4 bytes per access).
   Block sizes (a block's largest token count over the whole trace) are only known at
   the end of this pass, and the stack distances need them, hence two passes. The
   map is freed before pass 2.
2. **Bin** (:meth:`StreamedTrace.binned_pass`, called by
   :func:`kvtrace.analyses.curves.compute_curve`): chunks of about 4M accesses are read back
   from the spill file, run through the stack-distance kernel with its state carried
   across chunks (:class:`kvtrace.kernels.stackdist.StackState`), and added into the
   curve's capacity histogram in trace order
   (:func:`kvtrace.kernels.hitcurve.binned_hits_into`), so the float sums are the
   in-memory ones. The usable-prefix distances go to a second spill file (8 bytes per
   access).
3. **Knees**: the exact knee search reads the usable distances back, chunk by chunk,
   for the few histogram bins that bracket a knee.

Memory, per distinct block M and request R (bytes): pass 1 about 50-105 x M (the
hash map, 16-byte slots at load <= 0.5, plus the per-block hash, tenant and size
arrays, 20 bytes with up to 2x growth room) + 24 x R (timestamps, request ids, block
counts and last-block tokens) + the request columns kept (``type`` and ``tenant`` as
4-byte Categorical codes): measured 4.24 GB for 51.9M blocks and 19.4M requests, no
column kept. The scan ends holding 20 x M + 20 x R, and hands what it freed back to
the system (Arrow's and glibc's allocators keep it otherwise: ~0.6 GB there). Pass 2
about 60 x M (the kernel's slot arrays and per-block state) + 40 x R (offsets,
timestamps, per-request keys); plus one chunk (~200 MB). Disk: 12 bytes per access in
a temporary directory (``spill_dir``, default the system's), removed on close.

A sampled run (``--sample-rate``) on a streamed trace makes the same chunked pass as
in memory (:mod:`kvtrace.analyses.sampled`): the SHARDS kernel carries its state from chunk to
chunk and bins as it goes, so it equals the in-memory result bit for bit in memory
O(tracked blocks + sampled requests); the evaluated accesses' usable keys for the knee
search go to one more spill file (24 bytes per evaluated access, about ``rate`` of the
accesses).

Every pass after the scan (exact and sampled curves, ``whatif``, ``value``, ``stats``)
reads the spill files through one reader, :meth:`StreamedTrace.access_chunks`: chunks
of whole requests, forward or backward, with the derived request layout and any
per-access spill files of the pass alongside; a file cut short is an error naming it.

When to stream (:func:`should_stream`): ``kvtrace curve`` streams a Parquet trace
whose in-memory run would need more than the memory budget, and always with
``--stream``. The budget is ``$KVTRACE_MEMORY_BUDGET`` (a size such as ``8GiB``), else
half of the memory available when the command starts.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import polars as pl

from kvtrace.trace import spill as spill_mod
from kvtrace.analyses.distances import Distances
from kvtrace.errors import KvtraceError, UsageError
from kvtrace.ingest import probe_rows, unchained_warning
from kvtrace.ingest.chunks import ChunkInfo, ParquetRequests, chunk_accesses
from kvtrace.kernels.densify import densify
from kvtrace.kernels.hitcurve import binned_hits_into, keys_in_ranges, max_finite
from kvtrace.kernels.stackdist import COLD, StackState, stack_distances_chunk
from kvtrace.trace import TraceMeta, source
from kvtrace.trace.source import AccessChunk, ChunkedSource, Column, _FileReader, read_exact, request_chunks  # noqa: F401
from kvtrace.units import parse_size

#: Peak resident bytes per block access of an in-memory ``kvtrace curve`` (measured:
#: 2.34 GB for 30.0M accesses, README performance table), rounded up.
IN_MEMORY_BYTES_PER_ACCESS = 80
MEMORY_BUDGET_ENV = "KVTRACE_MEMORY_BUDGET"
_ID_DTYPE = np.int32  # dense ids in the spill file
_MAX_BLOCKS = np.iinfo(_ID_DTYPE).max
#: Request columns kept as Categorical when asked for (group labels: a few distinct
#: strings, 4 bytes per request instead of 16 or more).
LABEL_COLUMNS = ("type", "tenant")


# --------------------------------------------------------------------------- when
def memory_budget() -> int:
    """Bytes an in-memory run may use: ``$KVTRACE_MEMORY_BUDGET``, else half of the
    memory available now (``MemAvailable``; total physical memory where unknown)."""
    env = os.environ.get(MEMORY_BUDGET_ENV)
    if env:
        return parse_size(env, field=MEMORY_BUDGET_ENV)
    avail = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    if avail is None:
        avail = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return avail // 2


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
@dataclass
class BinnedPass:
    """What a chunked pass hands to :func:`kvtrace.analyses.curves.compute_curve`.

    Attributes
    ----------
    stream : curves._Stream
        Request offsets of the whole trace; per-access arrays empty (never held).
    distances : Distances
        Empty arrays (the distances went through the histogram).
    hist : float64[2, n_groups, G + 2, 4]
        :func:`kvtrace.kernels.hitcurve.binned_hits` of the whole stream.
    request_keys : (int64[R], bool[R]) or (int64[R], bool[R], int64[R])
        Usable key of each request's first block (COLD: empty or cold), which
        requests are measured and, from exact passes, each request's half-prefix key
        (:func:`kvtrace.analyses.curves.half_prefix_keys`).
    top : int
        Largest finite distance or usable distance among measured accesses (tokens).
    keys_in_ranges : callable
        ``(lo_keys, hi_keys) -> (keys, range, tokens, q)``, as
        :func:`kvtrace.kernels.hitcurve.keys_in_ranges` over the whole stream.
    """

    stream: object
    distances: Distances
    hist: np.ndarray
    request_keys: tuple
    top: int
    keys_in_ranges: Callable
    #: sampled passes (kvtrace.analyses.sampled): weight of each request, the sub-sample
    #: histograms behind the error estimate, and the number of evaluated accesses
    request_weights: np.ndarray | None = None
    sub_hist: np.ndarray | None = None
    n_evaluated: int | None = None


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
    them chunk by chunk (:meth:`StreamedTrace.access_chunks`)."""

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
        return _FileReader(self.spill / "blocks", _ID_DTYPE)

    def _last_block_tokens(self) -> np.ndarray:
        return self._last_tokens

    def column(self, name: str, dtype) -> Column:
        """A per-access column for a later pass: a file in the spill directory."""
        return Column(self.n_accesses, dtype, self.spill / f"column-{name}")

    def _chunks(self, size: int | None = None):
        return request_chunks(self._req_start, source.CHUNK_ACCESSES if size is None else size)

    def access_chunks(self, *, blocks: bool = True, layout: bool = True, extra: Sequence[tuple] = (),
                      size: int | None = None, reverse: bool = False, block_dtype=np.int64) -> Iterator[AccessChunk]:
        """:meth:`chunks` with per-access files ``extra`` (path, dtype) read alongside."""
        cols = []
        for path, dt in extra:
            c = Column.__new__(Column)
            c.n, c.dtype, c.path, c.array, c._fh = self.n_accesses, np.dtype(dt), Path(path), None, None
            cols.append(c)
        return self.chunks(blocks=blocks, layout=layout, columns=cols, size=size, reverse=reverse,
                           block_dtype=block_dtype)

    def binned_pass(self, ev: str, grid: np.ndarray, first_req: int, req_group: np.ndarray | None,
                    n_groups: int, block_tokens: int,
                    progress: Callable[[int, int], None] | None = None) -> BinnedPass:
        """Pass 2 (see the module docstring): exact distances chunk by chunk, binned on
        ``grid`` (tokens) into the histogram :func:`kvtrace.analyses.curves.compute_curve`
        evaluates, with the per-request keys, the top distance and the knee reader."""
        from kvtrace.analyses.curves import _Stream, half_prefix_keys

        rs = self._req_start
        n_req = rs.shape[0] - 1
        n = self.n_accesses
        size = np.ascontiguousarray(self.block_size, dtype=np.int64)
        state = StackState(size.shape[0])
        state.last_request = np.empty(0, dtype=np.int64)  # no previous-request output: 8 bytes/block saved
        hist = np.zeros((2, n_groups, grid.shape[0] + 2, 4), dtype=np.float64)
        keys = np.full(n_req, COLD, dtype=np.int64)
        half = np.full(n_req, COLD, dtype=np.int64)
        first_acc = int(rs[first_req]) if n_req else 0
        top = 0
        no_prev = np.empty(0, dtype=np.int64)
        no_scale = np.empty(0, dtype=np.float64)
        no_group = np.empty(0, dtype=np.int32)
        prefix_aware = ev == "prefix-aware"
        usable_path = self.spill / "usable"
        with open(usable_path, "wb") as usable_out:
            for r, r_end, lo, hi, block, tokens, pos, lrs, local_req, _ in self.access_chunks():
                dist = np.empty(hi - lo, dtype=np.int64)
                usable = np.empty(hi - lo, dtype=np.int64)
                stack_distances_chunk(block, size, lrs, r, prefix_aware, *state.arrays(), dist, no_prev, usable)
                first = min(max(first_acc - lo, 0), hi - lo)
                group = no_group if req_group is None else req_group[r + local_req].astype(np.int32)
                binned_hits_into(hist, dist, usable, first, tokens, pos, block, size, block_tokens, group, grid,
                                 no_scale)
                nonempty = lrs[1:] > lrs[:-1]
                keys[r:r_end][nonempty] = usable[lrs[:-1][nonempty]]
                half[r:r_end] = half_prefix_keys(usable, tokens, lrs)
                top = max(top, int(max_finite(dist, first)), int(max_finite(usable, first)))
                usable.tofile(usable_out)
                if progress is not None:
                    progress(hi, n)
        del state
        members = np.arange(n_req) >= first_req
        stream = _Stream(np.empty(0, np.int64), size, rs, np.empty(0, np.int32), np.empty(0, np.int32),
                         np.empty(0, np.int64))
        empty = np.empty(0, dtype=np.int64)

        def in_ranges(lo_keys: np.ndarray, hi_keys: np.ndarray):
            parts = []
            for ch in self.access_chunks(blocks=False, extra=[(usable_path, np.int64)]):
                if ch.hi <= first_acc:
                    continue
                parts.append(keys_in_ranges(ch.extra[0], max(first_acc - ch.lo, 0), ch.tokens, ch.pos,
                                            block_tokens, lo_keys, hi_keys, no_scale))
            if not parts:
                return keys_in_ranges(empty, 0, np.empty(0, np.int32), np.empty(0, np.int32), block_tokens,
                                      lo_keys, hi_keys, no_scale)
            return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))

        return BinnedPass(stream, Distances(ev, empty, empty), hist, (keys, members, half), top, in_ranges)


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
    its mmap threshold, interleaved with the per-request parts: about 0.6 GB after a
    300M-access scan, otherwise resident through every later pass."""
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


__all__ = ["BinnedPass", "IN_MEMORY_BYTES_PER_ACCESS", "MEMORY_BUDGET_ENV", "StreamedTrace",
           "in_memory_estimate", "is_parquet", "memory_budget", "open_stream", "should_stream", "spill_bytes"]
