"""Per-access future reuse of a trace source, one fold over its chunks (``kvtrace value``).

Passes (each over :meth:`kvtrace.trace.source.TraceSource.chunks`, whatever the source)
-----------------------------------------------------------------------------------
- **Next access** (backward, :func:`next_accesses`): each access gets its block's next
  access, the gap to it and the GPU-seconds of prefill that next access costs
  (:func:`kvtrace.kernels.future.next_access_chunk`; carried: each block's earliest
  access after the chunk, its time and cost, 20 bytes per block). Written to three
  per-access columns of the source (``next_t`` int64, ``next_gap_s`` and the next
  access's cost float64).
- **Windows** (forward, :func:`windows`): a lead cursor keeps each block's running
  access count and token sums; a lag cursor closes access ``s``'s reuse window as soon
  as the lead meets the first access beyond ``ts[s] + horizon`` and reads the reuses
  off as differences of running values
  (:func:`kvtrace.kernels.future.lead_lag_windows`; carried: :class:`WindowState`, 49
  bytes per block, 53 with the last reuse's index). Nothing grows with the horizon:
  the lag re-reads the chunks instead of holding the accesses whose window is open.

The per-access columns of :class:`FutureReuse` then follow elementwise
(:mod:`kvtrace.analyses.value.pricing`), chunk by chunk: :class:`FutureReuseChunks`
yields them, writes the per-access table and the ``value_usd`` file of
:func:`streamed_values`, and gives the whole arrays (:func:`future_reuse`).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import numpy as np
import polars as pl

from kvtrace.config import plain_numpy_pages
from kvtrace.errors import KvtraceError
from kvtrace.kernels.future import lead_lag_windows, next_access_chunk
from kvtrace.model import GpuSpec, ModelSpec
from kvtrace.trace import index_dtype
from kvtrace.trace import source as source_mod
from kvtrace.trace.source import Column, TraceSource
from kvtrace.analyses.value.pricing import (
    DEFAULT_HORIZON_S,
    StorageCosts,
    info,
    interval_values,
    pos_token_sums,
    prefill_gpu_seconds,
    setup,
    window_values,
)

Progress = Callable[[int, int], None]

#: A value chunk holds about 40 per-access arrays (a curve's, 3): it takes this
#: fraction of :data:`kvtrace.trace.source.CHUNK_ACCESSES`.
CHUNK_SHARE = 16

#: The per-access arrays of :class:`FutureReuse`, in its table's order.
FIELDS = ("block", "timestamp", "next_t", "next_gap_s", "reuses", "last_reuse_t", "hold_s", "reuse_tokens", "bytes",
          "gain_gpu_seconds", "gain_usd", "cost_usd", "value_usd", "interval_gain_gpu_seconds",
          "interval_value_usd", "starts_stay")

_SERIAL = itertools.count()  # column names of concurrent runs on one source stay apart


def chunk_accesses() -> int:
    """Accesses per chunk of a value pass (read at call time, so tests can shrink it)."""
    return max(1, source_mod.CHUNK_ACCESSES // CHUNK_SHARE)


@dataclass
class FutureReuse:
    """Output of :func:`future_reuse`: per-access arrays, all in trace order (length N),
    or those of one chunk (:meth:`FutureReuseChunks.chunks`: indices are trace indices).

    Attributes
    ----------
    block : int64[N]
        Dense block id.
    timestamp : float64[N]
        Arrival of the access's request, seconds.
    next_t : int64[N]
        Index of the next access of the same block; -1 for none.
    next_gap_s : float64[N]
        Seconds to the next access; inf for none.
    reuses : int64[N]
        Later accesses of the block within the horizon (gap <= horizon, ties count).
    last_reuse_t : int64[N]
        Index of the last of those reuses; -1 when ``reuses == 0``.
    hold_s : float64[N]
        Seconds the window value holds the block: to the last reuse; with none, the
        horizon if finite, else 0.
    reuse_tokens : int64[N]
        Tokens of those reuses.
    bytes : int64[N]
        Bytes the block occupies (its cache size in tokens x KV bytes per token).
    gain_gpu_seconds : float64[N]
        GPU-seconds of prefill the reuses within the horizon avoid.
    gain_usd : float64[N]
        The same in $.
    cost_usd : float64[N]
        ``bytes x (write + read x reuses + occupancy x hold_s)``, $.
    value_usd : float64[N]
        Window value ``gain_usd - cost_usd``, $: the clairvoyant admission
        score (a ``value >= v`` policy admits a block when the value of its latest
        access reaches ``v``). Windows overlap; do not sum.
    interval_gain_gpu_seconds : float64[N]
        GPU-seconds the *next* access avoids when it is within the horizon, else 0.
    interval_value_usd : float64[N]
        Interval value, $ (module docstring); sums to the block's total value.
    starts_stay : bool[N]
        The access starts a stay of the time-to-live schedule (its previous access is
        not within the horizon, or it has none): the block is written here. The other
        accesses are the schedule's hits.
    horizon_s : float
        The horizon, seconds (inf allowed).
    costs : StorageCosts
    info : dict
        Model, GPU and KV bytes per token used.
    model, gpu : ModelSpec, GpuSpec
        The specs the values were made with.
    source : TraceSource
        The trace they were made of.
    """

    block: np.ndarray
    timestamp: np.ndarray
    next_t: np.ndarray
    next_gap_s: np.ndarray
    reuses: np.ndarray
    last_reuse_t: np.ndarray
    hold_s: np.ndarray
    reuse_tokens: np.ndarray
    bytes: np.ndarray
    gain_gpu_seconds: np.ndarray
    gain_usd: np.ndarray
    cost_usd: np.ndarray
    value_usd: np.ndarray
    interval_gain_gpu_seconds: np.ndarray
    interval_value_usd: np.ndarray
    starts_stay: np.ndarray
    horizon_s: float
    costs: StorageCosts
    info: dict = field(default_factory=dict)
    model: ModelSpec | None = field(default=None, repr=False)
    gpu: GpuSpec | None = field(default=None, repr=False)
    source: object = field(default=None, repr=False)

    def __len__(self) -> int:
        return int(self.block.shape[0])

    @property
    def keepable(self) -> np.ndarray:
        """bool[N]: the next access is within the horizon (``reuses > 0``)."""
        return self.reuses > 0

    def table(self) -> pl.DataFrame:
        """The per-access arrays as a table (for Parquet / SQL), one row per access.

        Columns: ``t`` int64 (access index) · ``block`` · ``timestamp`` · and every
        array attribute above under its name (units as documented there).
        """
        n = len(self)
        return pl.DataFrame(
            {
                "t": np.arange(n, dtype=np.int64),
                "block": self.block.astype(np.int64, copy=False),
                "timestamp": self.timestamp,
                "next_t": self.next_t,
                "next_gap_s": self.next_gap_s,
                "reuses": self.reuses,
                "last_reuse_t": self.last_reuse_t,
                "hold_s": self.hold_s,
                "reuse_tokens": self.reuse_tokens,
                "bytes": self.bytes,
                "gain_gpu_seconds": self.gain_gpu_seconds,
                "gain_usd": self.gain_usd,
                "cost_usd": self.cost_usd,
                "value_usd": self.value_usd,
                "interval_gain_gpu_seconds": self.interval_gain_gpu_seconds,
                "interval_value_usd": self.interval_value_usd,
                "starts_stay": self.starts_stay,
            }
        )

    def write_table(self, path: str | os.PathLike, metadata: dict | None = None) -> None:
        """Write :meth:`table` atomically (.parquet, .csv or .json; see
        :func:`kvtrace.outputs.write_table`)."""
        from kvtrace.outputs import write_table

        write_table(self.table(), path, metadata=metadata)


def request_times(trace: TraceSource) -> np.ndarray:
    """float64 arrival of each request, seconds, after checking that access times never
    decrease in trace order (requests without accesses are not checked)."""
    req_ts = trace.request_timestamp.astype(np.float64, copy=False)
    rs = trace.req_start
    ts = req_ts[rs[1:] > rs[:-1]]
    if ts.size > 1 and np.any(np.diff(ts) < 0):
        raise KvtraceError("access timestamps must be non-decreasing in trace order", field="timestamp")
    return req_ts


class Lane(NamedTuple):
    """The accesses of one chunk as the window cursors read them."""

    lo: int  # first access (trace index)
    block: np.ndarray  # int64
    ts: np.ndarray  # float64, seconds
    tokens: np.ndarray  # int64
    q: np.ndarray  # int64 position-token sums
    extra: tuple  # the columns asked for


_EMPTY = Lane(0, np.empty(0, np.int64), np.empty(0, np.float64), np.empty(0, np.int64), np.empty(0, np.int64), ())


def lanes(trace: TraceSource, req_ts: np.ndarray, columns=(), reverse: bool = False) -> Iterator[Lane]:
    """The chunks of a value pass as :class:`Lane` s."""
    B = int(trace.meta.block_tokens)
    for ch in trace.chunks(size=chunk_accesses(), columns=columns, reverse=reverse):
        k, q = pos_token_sums(ch.tokens, ch.pos, B)
        yield Lane(ch.lo, ch.block, req_ts[ch.r + ch.local_req], k, q, ch.extra)


class WindowState:
    """The per-block state :func:`kvtrace.kernels.future.lead_lag_windows` carries (its
    docstring), counts and indices in int32 when the trace has fewer than 2**31
    accesses: 49 bytes per block, 53 with ``latest`` (the last reuse's index)."""

    def __init__(self, n_blocks: int, n_accesses: int, latest: bool) -> None:
        idx = index_dtype(n_accesses)
        self.count = np.zeros(n_blocks, dtype=idx)
        self.cum_tokens = np.zeros(n_blocks, dtype=np.int64)
        self.cum_q = np.zeros(n_blocks, dtype=np.int64)
        self.latest = np.full(n_blocks if latest else 0, -1, dtype=idx)
        self.latest_ts = np.zeros(n_blocks, dtype=np.float64)
        self.closed = np.zeros(n_blocks, dtype=idx)
        self.closed_tokens = np.zeros(n_blocks, dtype=np.int64)
        self.closed_q = np.zeros(n_blocks, dtype=np.int64)
        self.prev_keep = np.zeros(n_blocks, dtype=bool)

    def arrays(self) -> tuple:
        return (self.count, self.cum_tokens, self.cum_q, self.latest, self.latest_ts, self.closed,
                self.closed_tokens, self.closed_q, self.prev_keep)


@dataclass
class Windows:
    """The window outputs of one lag chunk (``last_t`` empty unless tracked)."""

    reuses: np.ndarray
    last_t: np.ndarray
    last_gap: np.ndarray
    reuse_tokens: np.ndarray
    reuse_q: np.ndarray
    starts_stay: np.ndarray


def windows(trace: TraceSource, horizon: float, req_ts: np.ndarray, state: WindowState,
            columns=()) -> Iterator[tuple[Lane, Windows]]:
    """The windows pass (module docstring): each lag chunk (with ``columns`` read
    alongside) and its window outputs, ``state`` carried (``state.latest`` empty:
    ``last_t`` not made). After the last chunk ``state.count`` is each block's accesses."""
    track = state.latest.shape[0] > 0
    lead_lanes, lag_lanes = lanes(trace, req_ts), lanes(trace, req_ts, columns)
    try:
        lead = next(lead_lanes, None)
        final = lead is None
        i = 0
        for lag in lag_lanes:
            m = lag.block.shape[0]
            w = Windows(np.empty(m, np.int64), np.empty(m if track else 0, np.int64), np.empty(m, np.float64),
                        np.empty(m, np.int64), np.empty(m, np.int64), np.empty(m, bool))
            j = 0
            while True:
                cur = lead if lead is not None else _EMPTY
                i, j = lead_lag_windows(cur.block, cur.ts, cur.tokens, cur.q, cur.lo, i,
                                        lag.block, lag.ts, lag.tokens, lag.q, j, horizon, final,
                                        *state.arrays(), w.reuses, w.last_t, w.last_gap, w.reuse_tokens,
                                        w.reuse_q, w.starts_stay)
                if j == m:
                    break
                lead = next(lead_lanes, None)
                final = lead is None
                i = 0
            yield lag, w
    finally:
        lead_lanes.close()
        lag_lanes.close()


def next_accesses(trace: TraceSource, m: ModelSpec, g: GpuSpec, req_ts: np.ndarray, tag: str,
                  progress: Callable[[int], None] | None = None) -> tuple[Column, Column, Column]:
    """The next-access pass (module docstring): columns ``next_t`` (int64, -1: none),
    ``next_gap_s`` (float64, inf: none) and the GPU-seconds of prefill of the next
    access (float64, 0: none) of every access."""
    N = trace.n_accesses
    idx = index_dtype(N)
    nxt = np.full(trace.n_blocks, -1, dtype=idx)
    nxt_ts = np.zeros(trace.n_blocks, dtype=np.float64)
    nxt_gain = np.zeros(trace.n_blocks, dtype=np.float64)
    cols = (trace.column(f"value-next-t-{tag}", np.int64), trace.column(f"value-next-gap-{tag}", np.float64),
            trace.column(f"value-next-gain-{tag}", np.float64))
    try:
        for lane in lanes(trace, req_ts, reverse=True):
            n = lane.block.shape[0]
            out = (np.empty(n, np.int64), np.empty(n, np.float64), np.empty(n, np.float64))
            next_access_chunk(lane.block, lane.lo, lane.ts, prefill_gpu_seconds(m, g, lane.tokens, lane.q), nxt,
                              nxt_ts, nxt_gain, *out)
            for col, x in zip(cols, out):
                col.write(lane.lo, x)
            if progress is not None:
                progress(N - lane.lo)
    except BaseException:
        for col in cols:
            col.drop()
        raise
    for col in cols:
        col.close()
    return cols


class FutureReuseChunks:
    """The per-access future reuse of a trace source (:class:`FutureReuse`), made chunk
    by chunk on demand: :meth:`chunks` yields the arrays chunk by chunk,
    :meth:`write_table` writes the per-access table, :meth:`values_path` the
    ``value_usd`` column to a file, :meth:`arrays` (or reading an array attribute, such
    as ``value_usd``) gives the whole :class:`FutureReuse` (held from then on). Each
    runs the windows pass again; the next accesses are made once (module docstring).
    The source must stay open.

    Attributes
    ----------
    source : TraceSource
    model : ModelSpec
    gpu : GpuSpec
    horizon_s : float
        Seconds (inf allowed).
    costs : StorageCosts
    info : dict
        As ``FutureReuse.info``.
    tag : str
        Names this run's columns of the source (:meth:`key` and a serial number).
    """

    def __init__(self, source: TraceSource, model: ModelSpec, gpu: GpuSpec, horizon_s: float,
                 costs: StorageCosts) -> None:
        self.source, self.model, self.gpu, self.horizon_s, self.costs = source, model, gpu, horizon_s, costs
        self.info = info(model, gpu)
        self._next: tuple[Column, Column, Column] | None = None
        self._arrays: FutureReuse | None = None
        self.tag = f"{self.key()}-{next(_SERIAL)}"
        self._drop = weakref.finalize(self, _drop_columns, [])

    @classmethod
    def of(cls, source: TraceSource, model=None, gpu=None, horizon_s=DEFAULT_HORIZON_S,
           costs: StorageCosts | None = None) -> "FutureReuseChunks":
        """Resolve the arguments as :func:`future_reuse` does."""
        m, g, horizon, c = setup(model, gpu, horizon_s, costs)
        return cls(source, m, g, horizon, c)

    def __len__(self) -> int:
        return self.source.n_accesses

    def __getattr__(self, name: str):
        if name in FIELDS or name in ("keepable", "table"):
            return getattr(self.arrays(), name)
        raise AttributeError(name)

    def key(self) -> str:
        """A digest of the arguments the values depend on."""
        m, g, c = self.model, self.gpu, self.costs
        what = (m.name, int(m.kv_bytes_per_token), m.flops_coefficients(), g.name, g.effective_flops,
                g.dollars_per_hour, self.horizon_s, c.write_dollars_per_byte, c.read_dollars_per_byte,
                c.occupancy_dollars_per_byte_second)
        return hashlib.sha256(repr(what).encode()).hexdigest()[:16]

    def next_columns(self, req_ts: np.ndarray, progress: Callable[[int], None] | None = None):
        """The next-access columns (:func:`next_accesses`), made on first use."""
        if self._next is None:
            self._next = next_accesses(self.source, self.model, self.gpu, req_ts, self.tag, progress)
            self._drop.detach()
            self._drop = weakref.finalize(self, _drop_columns, list(self._next))
        return self._next

    def chunks(self, progress: Progress | None = None) -> Iterator[tuple[int, FutureReuse]]:
        """``(lo, future)`` in trace order: ``future`` holds the per-access arrays of
        accesses ``lo .. lo + len(future) - 1`` (indices in ``next_t`` and
        ``last_reuse_t`` are trace indices)."""
        t = self.source
        N = t.n_accesses
        total = 2 * N
        req_ts = request_times(t)
        cols = self.next_columns(req_ts, None if progress is None else (lambda d: progress(d, total)))
        bpt = int(self.info["kv_bytes_per_token"])
        state = WindowState(t.n_blocks, N, latest=True)
        for lag, w in windows(t, self.horizon_s, req_ts, state, cols):
            next_t, next_gap, next_gain = lag.extra
            nbytes = t.block_size[lag.block].astype(np.int64) * bpt
            keep = w.reuses > 0
            interval_gain = np.where(keep, next_gain, 0.0)
            fbytes = nbytes.astype(np.float64)
            hold, gain_s, gain_d, cost, value = window_values(self.model, self.gpu, self.costs, self.horizon_s, fbytes,
                                                              w.reuses, w.last_gap, w.reuse_tokens, w.reuse_q)
            interval_value = interval_values(self.gpu, self.costs, self.horizon_s, fbytes, keep, next_gap,
                                             interval_gain, w.starts_stay)
            yield lag.lo, FutureReuse(
                block=lag.block, timestamp=lag.ts, next_t=next_t, next_gap_s=next_gap, reuses=w.reuses,
                last_reuse_t=w.last_t, hold_s=hold, reuse_tokens=w.reuse_tokens, bytes=nbytes,
                gain_gpu_seconds=gain_s, gain_usd=gain_d, cost_usd=cost, value_usd=value,
                interval_gain_gpu_seconds=interval_gain, interval_value_usd=interval_value,
                starts_stay=w.starts_stay, horizon_s=self.horizon_s, costs=self.costs, info=self.info,
                model=self.model, gpu=self.gpu, source=t)
            if progress is not None:
                progress(N + lag.lo + lag.block.shape[0], total)

    def arrays(self) -> FutureReuse:
        """The whole trace's per-access arrays (made on first use, then held)."""
        if self._arrays is None:
            N = len(self)
            whole = self.empty()
            for lo, fr in self.chunks():
                if lo == 0:
                    whole = FutureReuse(**{name: np.empty(N, getattr(fr, name).dtype) for name in FIELDS},
                                        horizon_s=self.horizon_s, costs=self.costs, info=self.info,
                                        model=self.model, gpu=self.gpu, source=self.source)
                for name in FIELDS:
                    getattr(whole, name)[lo:lo + len(fr)] = getattr(fr, name)
            self._arrays = whole
        return self._arrays

    def empty(self) -> FutureReuse:
        """The :class:`FutureReuse` of no access."""
        i, x = np.empty(0, np.int64), np.empty(0, np.float64)
        return FutureReuse(block=i, timestamp=x, next_t=i, next_gap_s=x, reuses=i, last_reuse_t=i, hold_s=x,
                           reuse_tokens=i, bytes=i, gain_gpu_seconds=x, gain_usd=x, cost_usd=x, value_usd=x,
                           interval_gain_gpu_seconds=x, interval_value_usd=x, starts_stay=np.empty(0, bool),
                           horizon_s=self.horizon_s, costs=self.costs, info=self.info, model=self.model,
                           gpu=self.gpu, source=self.source)

    def table_chunks(self, progress: Progress | None = None) -> Iterator[pl.DataFrame]:
        """``FutureReuse.table()`` of the whole trace, chunk by chunk (at least one frame)."""
        any_chunk = False
        for lo, fr in self.chunks(progress):
            any_chunk = True
            yield fr.table().with_columns(pl.Series("t", np.arange(lo, lo + len(fr), dtype=np.int64)))
        if not any_chunk:
            yield self.empty().table()

    def write_table(self, path: str | os.PathLike, metadata: dict | None = None,
                    progress: Progress | None = None) -> None:
        """Write the per-access table (.parquet, .csv or .json) chunk by chunk, atomically
        (:func:`kvtrace.outputs.write_table_chunks`: the file holds the same table as
        ``FutureReuse.write_table``)."""
        from kvtrace.outputs import table_format, write_table_chunks

        table_format(path)  # a bad suffix fails before the pass
        write_table_chunks(self.table_chunks(progress), path, metadata=metadata)

    def values_path(self, spill: Path, progress: Progress | None = None) -> Path:
        """A file in the directory ``spill`` holding ``value_usd`` (float64, one per access,
        trace order), named by :meth:`key`: an existing one is returned as it is."""
        path = Path(spill) / f"value-dollars-{self.key()}.f64"
        if path.exists():
            return path
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as fh:
                for _, fr in self.chunks(progress):
                    fr.value_usd.astype(np.float64, copy=False).tofile(fh)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return path


def _drop_columns(cols: list[Column]) -> None:
    for col in cols:
        col.drop()


def future_reuse(
    trace: TraceSource,
    *,
    model: ModelSpec | str | None = None,
    gpu: GpuSpec | str | None = None,
    horizon_s: float | str | None = DEFAULT_HORIZON_S,
    costs: StorageCosts | None = None,
) -> FutureReuse:
    """Next access, reuses within a horizon and the value of keeping every access's block.

    Parameters
    ----------
    trace : TraceSource
        In memory or streamed (the result holds every per-access array either way; for
        a large streamed trace use :meth:`FutureReuseChunks.chunks`).
    model : ModelSpec or str, optional
        Sets KV bytes per token and prefill FLOPs (default Llama-3.1-70B).
    gpu : GpuSpec or str, optional
        Turns FLOPs into GPU-seconds and $ (default H100).
    horizon_s : float or str, optional
        Horizon, seconds (``inf`` = unbounded), or a duration such as ``1h``. Default
        :data:`DEFAULT_HORIZON_S`.
    costs : StorageCosts, optional
        Write, read and occupancy costs; default :data:`DEFAULT_COSTS` (illustrative
        flash tier). ``StorageCosts()`` values the avoided compute alone.

    Returns
    -------
    FutureReuse
        Per-access arrays in trace order (see its attributes and the module docstring).
    """
    return FutureReuseChunks.of(trace, model, gpu, horizon_s, costs).arrays()


@plain_numpy_pages
def streamed_values(trace: TraceSource, *, model: ModelSpec | str | None = None, gpu: GpuSpec | str | None = None,
                    horizon_s: float | str | None = DEFAULT_HORIZON_S, costs: StorageCosts | None = None,
                    progress: Progress | None = None) -> Path:
    """Write every access's window value to a file; return its path.

    Parameters
    ----------
    trace : StreamedTrace
        A source with a spill directory (``trace.spill``); it must stay open while the
        file is read (the file lives there and goes with it).
    model, gpu, horizon_s, costs
        As for :func:`future_reuse`.
    progress : callable, optional
        ``progress(done, total)``.

    Returns
    -------
    pathlib.Path
        Raw float64, native byte order, one value per access in trace order (length
        ``trace.n_accesses``): exactly ``future_reuse(...).value_usd``, $. Read it chunk
        by chunk with ``np.fromfile(fh, dtype=np.float64, count=n)``. The same
        arguments on the same trace return the same file without a new pass.
    """
    return FutureReuseChunks.of(trace, model, gpu, horizon_s, costs).values_path(trace.spill, progress)


@plain_numpy_pages
def access_values(trace: TraceSource, *, model: ModelSpec | str | None = None, gpu: GpuSpec | str | None = None,
                  horizon_s: float | str | None = DEFAULT_HORIZON_S, costs: StorageCosts | None = None,
                  progress: Progress | None = None) -> np.ndarray | Path:
    """The value of keeping each access's block, $ (the input of the ``value>=v``
    admission policy), for any source: ``future_reuse(...).value_usd`` of a trace held in
    memory; for a source that spills (``trace.spill``), the same values in a file there
    (:func:`streamed_values`), so memory stays bounded."""
    if trace.spill is not None:
        return streamed_values(trace, model=model, gpu=gpu, horizon_s=horizon_s, costs=costs, progress=progress)
    return future_reuse(trace, model=model, gpu=gpu, horizon_s=horizon_s, costs=costs).value_usd
