"""A trace source: what every analysis reads, whether the trace is in memory or streamed.

Every analysis is one fold over :meth:`TraceSource.chunks`: chunks of whole requests,
in trace order (or last to first), each the accesses ``lo..hi - 1`` of requests
``r..r_end - 1``. What an analysis carries from chunk to chunk is explicit state of its
own (a kernel's ``StackState``, a histogram, per-block arrays); what it keeps per
access for a later pass is a :class:`Column` of the source, written chunk by chunk and
read back alongside the block ids. Because the fold is the same code whatever the
source, a streamed run equals the in-memory run by construction.

Sources
-------
- :class:`kvtrace.trace.Trace`: a trace held in memory; chunks are views of its
  arrays and columns are numpy arrays.
- :class:`kvtrace.ingest.stream.StreamedTrace`: a Parquet trace scanned once into a
  spill file of block ids; chunks are read back from disk and columns are spill files,
  so memory stays O(distinct blocks + requests) plus one chunk.
- A partition of a Dask run (:mod:`kvtrace.analyses.distributed`) is an in-memory
  trace of the blocks one worker owns.

What every source holds in memory: ``meta``, the request table ``requests`` (at least
``timestamp``; a streamed source keeps only the columns asked for and never the block
lists), ``req_start`` (int64[R+1] request offsets into the accesses) and the per-block
arrays ``block_hash``, ``block_tenant``, ``block_size``.

Chunk invariants (every source): chunks tile ``0..n_accesses`` without overlap in
request order (reversed when asked); a chunk holds whole requests and about ``size``
accesses (one request when a request alone is longer); ``tokens`` of an access is
``block_tokens`` except a request's last block (its remainder); ``pos`` counts blocks
from 0 in each request; a column read back is exactly what was written for those
accesses, and a column file shorter than the trace is an error naming it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterator, NamedTuple, Protocol, Sequence

import numpy as np

from kvtrace.errors import KvtraceError
from kvtrace.kernels.layout import request_and_pos

if TYPE_CHECKING:
    import polars as pl

    from kvtrace.trace import TraceMeta

#: Accesses per chunk of a pass (about 100 MB of per-access arrays with temporaries).
#: Read at each call, so tests can shrink it to exercise the carried state.
CHUNK_ACCESSES = 1 << 22


def request_chunks(req_start: np.ndarray, size: int):
    """``(r, r_end, lo, hi)`` of consecutive chunks of whole requests, each about
    ``size`` accesses (one request when a request alone is longer): requests
    ``r..r_end - 1``, accesses ``lo..hi - 1``."""
    n_req = req_start.shape[0] - 1
    r = 0
    while r < n_req:
        r_end = int(np.searchsorted(req_start, req_start[r] + size, side="right")) - 1
        r_end = min(max(r_end, r + 1), n_req)
        yield r, r_end, int(req_start[r]), int(req_start[r_end])
        r = r_end


class AccessChunk(NamedTuple):
    """Accesses ``lo..hi - 1`` = requests ``r..r_end - 1`` of a trace; the fields not
    asked for are None (:meth:`TraceSource.chunks`)."""

    r: int
    r_end: int
    lo: int
    hi: int
    block: np.ndarray | None
    tokens: np.ndarray | None  # int32
    pos: np.ndarray | None  # int32
    lrs: np.ndarray | None = None  # int64[r_end - r + 1]: local request offsets
    local_req: np.ndarray | None = None  # request of each access, minus r
    extra: tuple = ()  # one array per column asked for, in the order asked


def read_exact(fh, dtype, count: int, path: Path) -> np.ndarray:
    """``count`` values from an open file; a shorter read is an error naming it."""
    x = np.fromfile(fh, dtype=dtype, count=count)
    if x.shape[0] != count:
        raise KvtraceError(f"spill file cut short: read {x.shape[0]} of {count} values", path=str(path))
    return x


class Column:
    """A per-access column one pass writes for a later pass over the same source.

    Written with :meth:`write` (any order: forward and backward passes both fill it),
    read back through ``chunks(columns=[column])``. In memory it is a numpy array; on a
    streamed source a file of ``n_accesses`` values in the spill directory, removed by
    :meth:`drop` or with the source.
    """

    def __init__(self, n: int, dtype, path: Path | None = None) -> None:
        self.n = int(n)
        self.dtype = np.dtype(dtype)
        self.path = path
        self.array = np.empty(self.n, dtype=self.dtype) if path is None else None
        self.owned = True  # made here: drop removes its file
        self._fh = None
        if path is not None:
            self._fh = open(path, "w+b")
            self._fh.truncate(self.n * self.dtype.itemsize)

    @classmethod
    def existing(cls, values: "np.ndarray | Path", dtype) -> "Column":
        """A column whose values exist already (an array of one value per access, or a
        file of them another pass wrote): read through ``chunks(columns=...)`` like any
        column, never written here; :meth:`drop` leaves the file in place."""
        col = cls.__new__(cls)
        col.dtype, col._fh, col.owned = np.dtype(dtype), None, False
        if isinstance(values, np.ndarray):
            col.array, col.path, col.n = values, None, int(values.shape[0])
        else:
            col.array, col.path = None, Path(values)
            col.n = col.path.stat().st_size // col.dtype.itemsize
        return col

    def write(self, lo: int, values: np.ndarray) -> None:
        """Set the values of accesses ``lo..lo + len(values) - 1``."""
        values = np.ascontiguousarray(values, dtype=self.dtype)
        if self.array is not None:
            self.array[lo:lo + values.shape[0]] = values
            return
        self._fh.seek(lo * self.dtype.itemsize)
        values.tofile(self._fh)

    def close(self) -> None:
        """Finish writing (the values stay readable)."""
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def drop(self) -> None:
        """Free the column (its array, or its file)."""
        self.close()
        self.array = None
        if self.path is not None and self.owned:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> "Column":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TraceSource(Protocol):
    """What an analysis may read of a trace (see the module docstring)."""

    meta: "TraceMeta"
    requests: "pl.DataFrame"
    block_hash: np.ndarray
    block_tenant: np.ndarray
    block_size: np.ndarray
    warnings: list[str]
    #: Directory of the source's spill files (None in memory): where a pass may keep
    #: variable-length state of its own beside the source's columns.
    spill: Path | None

    @property
    def req_start(self) -> np.ndarray: ...

    @property
    def n_requests(self) -> int: ...

    @property
    def n_accesses(self) -> int: ...

    @property
    def n_blocks(self) -> int: ...

    @property
    def request_timestamp(self) -> np.ndarray: ...

    @property
    def duration(self) -> float: ...

    def chunks(self, *, blocks: bool = True, layout: bool = True, columns: Sequence[Column] = (),
               size: int | None = None, reverse: bool = False, block_dtype=np.int64,
               local_req: bool = True) -> Iterator[AccessChunk]: ...

    def column(self, name: str, dtype) -> Column: ...

    def first_blocks(self) -> np.ndarray: ...

    def close(self) -> None: ...


class ChunkedSource:
    """The chunk reader shared by every source. A subclass provides ``req_start``,
    ``meta`` and :meth:`_block_reader` (the block ids of accesses ``lo..hi - 1``) and
    :meth:`_last_block_tokens` (tokens of each request's last block)."""

    def chunks(self, *, blocks: bool = True, layout: bool = True, columns: Sequence[Column] = (),
               size: int | None = None, reverse: bool = False, block_dtype=np.int64,
               local_req: bool = True) -> Iterator[AccessChunk]:
        """Chunks of whole requests, about ``size`` accesses each (default
        :data:`CHUNK_ACCESSES`, read at each call).

        Parameters
        ----------
        blocks : bool
            Read the block ids (as ``block_dtype``; None: as the source stores them).
        layout : bool
            Derive the request layout: local request offsets ``lrs``, ``local_req``,
            ``tokens`` and ``pos`` (int32) of each access.
        columns : sequence of Column
            Per-access columns of this source to read alongside (``chunk.extra``).
        reverse : bool
            Last chunk first (backward passes).
        local_req : bool
            With ``layout``, also each access's request within the chunk (``local_req``;
            an in-memory trace skips computing it when not asked).
        """
        rs = self.req_start
        spans = request_chunks(rs, CHUNK_ACCESSES if size is None else size)
        spans = reversed(list(spans)) if reverse else spans
        readers = [_column_reader(c) for c in columns]
        block_reader = self._block_reader() if blocks else None
        try:
            for r, r_end, lo, hi in spans:
                block = None
                if blocks:
                    block = block_reader(lo, hi)
                    if block_dtype is not None:
                        block = block.astype(block_dtype, copy=False)
                lrs = tokens = pos = req = None
                if layout:
                    lrs, tokens, pos, req = self._layout(r, r_end, lo, local_req)
                yield AccessChunk(r, r_end, lo, hi, block, tokens, pos, lrs, req,
                                  tuple(read(lo, hi) for read in readers))
        finally:
            for read in readers:
                getattr(read, "close", lambda: None)()
            if block_reader is not None:
                getattr(block_reader, "close", lambda: None)()

    def first_blocks(self) -> np.ndarray:
        """int64[R]: the first block of each request (-1 for a request without blocks)."""
        rs = self.req_start
        first = np.full(rs.shape[0] - 1, -1, dtype=np.int64)
        for ch in self.chunks():
            ne = ch.lrs[1:] > ch.lrs[:-1]
            first[ch.r:ch.r_end][ne] = ch.block[ch.lrs[:-1][ne]]
        return first

    def _layout(self, r: int, r_end: int, lo: int, local_req: bool = True):
        """Local offsets, tokens (int32), positions (int32) and each access's local
        request of requests r..r_end-1."""
        lrs = self.req_start[r:r_end + 1] - lo
        m = int(lrs[-1])
        tokens = np.full(m, self.meta.block_tokens, dtype=np.int32)
        ends = lrs[1:]
        has = ends > lrs[:-1]
        tokens[ends[has] - 1] = self._last_block_tokens()[r:r_end][has]
        local_req, pos = request_and_pos(lrs)
        return lrs, tokens, pos, local_req

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class FileReader:
    """Values ``lo..hi - 1`` of a file of one value per access, read in any order."""

    def __init__(self, path: Path, dtype) -> None:
        self.path, self.dtype = path, np.dtype(dtype)
        self.fh = open(path, "rb")
        self.at = 0

    def __call__(self, lo: int, hi: int) -> np.ndarray:
        if lo != self.at:
            self.fh.seek(lo * self.dtype.itemsize)
        self.at = hi
        return read_exact(self.fh, self.dtype, hi - lo, self.path)

    def close(self) -> None:
        self.fh.close()


def _column_reader(col: Column):
    if col.array is not None:
        return lambda lo, hi: col.array[lo:hi]
    col.close()
    return FileReader(col.path, col.dtype)


__all__ = ["AccessChunk", "CHUNK_ACCESSES", "ChunkedSource", "Column", "TraceSource", "read_exact",
           "request_chunks"]
