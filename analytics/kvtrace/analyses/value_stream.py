"""Future-reuse value of a streamed trace (``kvtrace value --stream``), bit for bit.

:func:`kvtrace.analyses.value.value_report` hands a :class:`kvtrace.ingest.stream.StreamedTrace` to
:func:`streamed_value_report`, which gives the same per-block table, per-prefix
rollup and summary as the in-memory run **bit for bit** without holding a
per-access array: ``tests/test_value_stream.py`` compares every column and figure,
and every per-access value, exactly, over many chunks.

Passes of the report (after the scan of :func:`kvtrace.ingest.stream.open_stream`)
---------------------------------------------------------------------------
1. **Windows** (forward, two cursors over the block spill file): a lead cursor keeps
   each block's running access count and token sums; a lag cursor closes access
   ``s``'s reuse window as soon as the lead meets the first access beyond
   ``ts[s] + horizon``, and reads the reuses off as differences of running values
   (:func:`kvtrace.kernels.future_stream.lead_lag_windows`): the integers and times
   of :func:`kvtrace.kernels.future.future_windows`, exactly. The in-memory code's
   own elementwise functions then give each access's window value, of which the
   report counts the positive ones; each access's two flags for pass 3 (a reuse
   within the horizon; the access starts a stay) go to a spill file (1 byte per
   access, removed after pass 3), and the lead's counts are each block's accesses.
   With an infinite horizon the lead reads the whole trace before the lag closes
   anything: the reuses then come from each block's totals (the closed form), still
   with O(blocks) state.
2. **Next access** (backward): the chunks of the block spill file are read last to
   first and each access gets the index of its block's next access
   (:func:`kvtrace.kernels.future_stream.next_access_chunk`, one index per block
   carried back), written to the spill file ``value-next`` (8 bytes per access; kept
   for later passes over the same trace, removed with the trace).
3. **Reduce**, chunk by chunk in trace order, as the in-memory run does over whole
   arrays: the next access gives the gap to it and the compute it avoids, the flags
   the schedule's writes and hits; then per-block sums in ``np.bincount``'s order,
   numpy's pairwise sums over accesses (:mod:`kvtrace.kernels.sums`), the best
   keep/drop schedule's dynamic programme with its per-block state carried
   (``best_keep_value_into``).
4. **Tables**: the shared root and each block's prefix family, read from a memory
   map of the block spill file at the requests' leading positions and at each
   block's first request (:func:`kvtrace.analyses.value.shared_root` and
   :func:`kvtrace.analyses.value.family_roots`, the in-memory run's own functions); then the
   per-prefix table and the summary (:func:`kvtrace.analyses.value._tables`, shared with the
   in-memory run). The per-block table is built on first use
   (``ValueResult.per_block``; ``kvtrace value`` builds it only for ``--out``): it
   alone is about 105 bytes per block.

The windows and the reduce are separate passes so that their per-block states are
never held at once (one pass held both, 170 bytes per block).

Memory, per distinct block M and request R (bytes), counts and indices in int32 below
2**31 accesses, requests and blocks: the windows hold 49 x M (count, token and
position-token sums of each cursor, the lead's latest time, the previous window's
flag); the reduce 56 x M (gain, cost and value sums, the schedule's two states, hits,
first and last request, accesses), then 4 x M for the families' roots; the tables 32 x M (accesses, root, gain,
value and bound, kept for the per-block table; its first and last request, hits and
cost, 20 x M, wait in a spill directory of their own) + about 32 x M of temporaries
(the value densities and their order, then the bytes and the per-prefix frame's
columns). On top: the streamed trace's own (20 x M + 20 x R) and one chunk of
``CHUNK_ACCESSES / CHUNK_SHARE`` accesses (256K by default, about 300 bytes each with
temporaries: ~80 MB). Nothing grows with the horizon or the number of accesses: the
lag re-reads the block ids from disk instead of holding the accesses whose window is
still open. Measured on 300M accesses, 51.9M blocks, 19.4M requests (horizon 1 h):
peak RSS 5.47 GB, in the tables (4.24 GB in the scan, 4.57 GB in the windows, 5.16 GB
in the reduce); 168-182 s end to end. Disk: 9 bytes per access (``value-next``, the
flags) in the trace's spill directory and 20 bytes per block beside it, plus 8 per
access for each :func:`streamed_values` file.

Per-access output (``--accesses-out``, :meth:`StreamedFutureReuse.write_table`) is
made by another windows pass (with the next accesses of pass 2, and each block's
latest access index: 53 x M) and written chunk by chunk, atomically
(:func:`kvtrace.outputs.write_table_chunks`).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shutil
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import polars as pl

from kvtrace.trace import source as source_mod
from kvtrace.trace import spill as spill_mod
from kvtrace.ingest import stream as stream_mod
from kvtrace.errors import KvtraceError
from kvtrace.kernels.future import best_keep_value_into
from kvtrace.kernels.future_stream import block_extent, lead_lag_windows, next_access_chunk
from kvtrace.kernels.sums import PairwiseSum, add_at, count_at
from kvtrace.model import GpuSpec, ModelSpec
from kvtrace.ingest.stream import AccessChunk, StreamedTrace, read_exact
from kvtrace.trace import index_dtype
from kvtrace.analyses.value import (
    DEFAULT_HORIZON_S,
    FutureReuse,
    StorageCosts,
    ValueResult,
    _access_values,
    _block_table,
    _clairvoyant_interval,
    _cost_parts,
    _info,
    _interval_values,
    _prefill_gpu_seconds,
    _setup,
    _tables,
    _window_values,
    _write_cost,
    family_roots,
    shared_root,
)

__all__ = ["StreamedFutureReuse", "streamed_value_report", "streamed_values"]

Progress = Callable[[int, int], None]


#: A value chunk holds about 40 per-access arrays (the curve's, 3): it takes this
#: fraction of :data:`kvtrace.ingest.stream.CHUNK_ACCESSES`.
CHUNK_SHARE = 16


def _chunk_accesses() -> int:
    """Accesses per chunk (read at call time, so tests can shrink the chunks)."""
    return max(1, source_mod.CHUNK_ACCESSES // CHUNK_SHARE)


@dataclass
class _Chunk:
    """The accesses of one chunk of whole requests, as the windows pass reads them."""

    r: int  # first request
    lo: int  # first access (trace index)
    lrs: np.ndarray  # request offsets within the chunk
    local_req: np.ndarray  # request of each access, within the chunk
    block: np.ndarray  # int64
    ts: np.ndarray  # float64, seconds
    tokens: np.ndarray  # int64
    q: np.ndarray  # int64 position-token sums


class _WindowState:
    """The per-block state :func:`lead_lag_windows` carries (its docstring), counts and
    indices in int32 when the trace has fewer than 2**31 accesses: 49 bytes per block,
    53 with ``latest`` (the last reuse's index, for the per-access arrays only)."""

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
class _Windows:
    """The window outputs of one lag chunk (``last_t`` empty unless tracked)."""

    reuses: np.ndarray
    last_t: np.ndarray
    last_gap: np.ndarray
    reuse_tokens: np.ndarray
    reuse_q: np.ndarray
    starts_stay: np.ndarray


@dataclass
class StreamedFutureReuse:
    """The per-access future reuse of a streamed trace, made chunk by chunk on demand.

    Stands for :class:`kvtrace.analyses.value.FutureReuse` in the ``ValueResult`` of a streamed
    trace: the same arrays, never all in memory. :meth:`chunks` yields them chunk by
    chunk, :meth:`write_table` writes the per-access table, :meth:`values_path` the
    ``value_usd`` column to a file. Each runs the windows pass again (module
    docstring); the trace must stay open.

    Attributes
    ----------
    trace : StreamedTrace
    model : ModelSpec
    gpu : GpuSpec
    horizon_s : float
        Seconds (inf allowed).
    costs : StorageCosts
    info : dict
        As ``FutureReuse.info``.
    """

    trace: StreamedTrace
    model: ModelSpec
    gpu: GpuSpec
    horizon_s: float
    costs: StorageCosts
    info: dict = field(default_factory=dict)

    @classmethod
    def of(cls, trace: StreamedTrace, model=None, gpu=None, horizon_s=DEFAULT_HORIZON_S,
           costs: StorageCosts | None = None) -> "StreamedFutureReuse":
        """Resolve the arguments as :func:`kvtrace.analyses.value.future_reuse` does."""
        if not isinstance(trace, StreamedTrace):
            raise TypeError(f"expected a StreamedTrace, got {type(trace).__name__}")
        m, g, horizon, c = _setup(model, gpu, horizon_s, costs)
        return cls(trace, m, g, horizon, c, _info(m, g))

    def __len__(self) -> int:
        return self.trace.n_accesses

    def chunks(self, progress: Progress | None = None) -> Iterator[tuple[int, FutureReuse]]:
        """``(lo, future)`` in trace order: ``future`` holds the per-access arrays of
        accesses ``lo .. lo + len(future) - 1`` (indices in ``next_t`` and
        ``last_reuse_t`` are trace indices), equal to the in-memory
        :func:`kvtrace.analyses.value.future_reuse`'s slices."""
        for chunk, fr in self._pass(progress):
            yield chunk.lo, fr

    def table_chunks(self, progress: Progress | None = None) -> Iterator[pl.DataFrame]:
        """``FutureReuse.table()`` of the whole trace, chunk by chunk (at least one frame)."""
        any_chunk = False
        for lo, fr in self.chunks(progress):
            any_chunk = True
            yield fr.table().with_columns(pl.Series("t", np.arange(lo, lo + len(fr), dtype=np.int64)))
        if not any_chunk:
            yield _empty_future(self).table()

    def write_table(self, path: str | os.PathLike, metadata: dict | None = None,
                    progress: Progress | None = None) -> None:
        """Write the per-access table (.parquet, .csv or .json) chunk by chunk, atomically:
        the same table as the in-memory ``FutureReuse.write_table``."""
        from kvtrace.outputs import table_format, write_table_chunks

        table_format(path)  # a bad suffix fails before the pass
        write_table_chunks(self.table_chunks(progress), path, metadata=metadata)

    def values_path(self, progress: Progress | None = None) -> Path:
        """A file in the trace's spill directory holding ``value_usd`` (float64, one
        per access, trace order): :func:`streamed_values`."""
        path = self.trace.spill / f"value-dollars-{self._key()}.f64"
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

    def _key(self) -> str:
        m, g, c = self.model, self.gpu, self.costs
        what = (m.name, int(m.kv_bytes_per_token), m.flops_coefficients(), g.name, g.effective_flops,
                g.dollars_per_hour, self.horizon_s, c.write_dollars_per_byte, c.read_dollars_per_byte,
                c.occupancy_dollars_per_byte_second)
        return hashlib.sha256(repr(what).encode()).hexdigest()[:16]

    # ------------------------------------------------------------------ the passes
    def _pass(self, progress: Progress | None = None) -> Iterator[tuple[_Chunk, FutureReuse]]:
        """The windows and next-access passes (module docstring): every chunk's
        per-access arrays."""
        t = self.trace
        N = t.n_accesses
        total = 2 * N
        req_ts = _request_times(t)
        next_path = _next_accesses(t, None if progress is None else (lambda d, _n: progress(d, total)))
        bpt = int(self.info["kv_bytes_per_token"])
        state = _WindowState(t.n_blocks, N, latest=True)
        with open(next_path, "rb") as f_next:
            for lag, w in self._windows(req_ts, state):
                m = lag.block.shape[0]
                next_t = read_exact(f_next, np.int64, m, next_path)
                nbytes = t.block_size[lag.block].astype(np.int64) * bpt
                next_gap, interval_gain = self._next_columns(lag.ts, next_t, w.reuses > 0, req_ts)
                hold, gain_s, gain_d, cost, value, interval_value = _access_values(
                    self.model, self.gpu, self.costs, self.horizon_s, nbytes, w.reuses, w.last_gap, w.reuse_tokens,
                    w.reuse_q, next_gap, interval_gain, w.starts_stay)
                yield lag, FutureReuse(
                    block=lag.block, timestamp=lag.ts, next_t=next_t, next_gap_s=next_gap, reuses=w.reuses,
                    last_reuse_t=w.last_t, hold_s=hold, reuse_tokens=w.reuse_tokens, bytes=nbytes,
                    gain_gpu_seconds=gain_s, gain_usd=gain_d, cost_usd=cost, value_usd=value,
                    interval_gain_gpu_seconds=interval_gain, interval_value_usd=interval_value,
                    starts_stay=w.starts_stay, horizon_s=self.horizon_s, costs=self.costs, info=self.info)
                if progress is not None:
                    progress(N + lag.lo + m, total)

    def _windows(self, req_ts: np.ndarray, state: _WindowState) -> Iterator[tuple[_Chunk, _Windows]]:
        """The windows pass (module docstring): each lag chunk with its window outputs,
        ``state`` carried (``state.latest`` empty: ``last_t`` not made)."""
        t = self.trace
        size = _chunk_accesses()
        track = state.latest.shape[0] > 0
        lead_chunks, lag_chunks = t.access_chunks(size=size), t.access_chunks(size=size)
        try:
            lead = _read_chunk(t, next(lead_chunks, None), req_ts)
            final = lead is None
            i = 0
            for lag_c in lag_chunks:
                lag = _read_chunk(t, lag_c, req_ts)
                m = lag.block.shape[0]
                w = _Windows(np.empty(m, np.int64), np.empty(m if track else 0, np.int64), np.empty(m, np.float64),
                             np.empty(m, np.int64), np.empty(m, np.int64), np.empty(m, bool))
                j = 0
                while True:
                    cur = lead if lead is not None else _EMPTY
                    i, j = lead_lag_windows(cur.block, cur.ts, cur.tokens, cur.q, cur.lo, i,
                                            lag.block, lag.ts, lag.tokens, lag.q, j, self.horizon_s, final,
                                            *state.arrays(), w.reuses, w.last_t, w.last_gap, w.reuse_tokens,
                                            w.reuse_q, w.starts_stay)
                    if j == m:
                        break
                    lead = _read_chunk(t, next(lead_chunks, None), req_ts)
                    final = lead is None
                    i = 0
                yield lag, w
        finally:
            lead_chunks.close()
            lag_chunks.close()

    def _next_columns(self, ts, next_t, keep, req_ts):
        """(next_gap_s, interval_gain_gpu_seconds) of a chunk from its next accesses:
        the gap to the next access (inf: none) and the compute it avoids when ``keep``."""
        t = self.trace
        has = next_t >= 0
        next_gap = np.full(ts.shape[0], np.inf, dtype=np.float64)
        next_req = np.searchsorted(t._req_start, next_t[has], side="right") - 1
        next_gap[has] = req_ts[next_req] - ts[has]
        nk = next_t[keep]
        a = t.accesses
        k_next = a.tokens[nk].astype(np.int64)
        q_next = k_next * (a.pos[nk].astype(np.int64) * int(t.meta.block_tokens)) + k_next * (k_next - 1) // 2
        interval_gain = np.zeros(ts.shape[0], dtype=np.float64)
        interval_gain[keep] = _prefill_gpu_seconds(self.model, self.gpu, k_next, q_next)
        return next_gap, interval_gain


_EMPTY = _Chunk(0, 0, np.zeros(1, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64),
                np.empty(0, np.int64), np.empty(0, np.int64))


def _empty_future(f: StreamedFutureReuse) -> FutureReuse:
    i, x = np.empty(0, np.int64), np.empty(0, np.float64)
    return FutureReuse(block=i, timestamp=x, next_t=i, next_gap_s=x, reuses=i, last_reuse_t=i, hold_s=x,
                       reuse_tokens=i, bytes=i, gain_gpu_seconds=x, gain_usd=x, cost_usd=x, value_usd=x,
                       interval_gain_gpu_seconds=x, interval_value_usd=x, starts_stay=np.empty(0, bool),
                       horizon_s=f.horizon_s, costs=f.costs, info=f.info)


def _read_chunk(t: StreamedTrace, ch: AccessChunk | None, req_ts: np.ndarray) -> _Chunk | None:
    """A chunk's accesses as the window pass reads them (None: past the end)."""
    if ch is None:
        return None
    k = ch.tokens.astype(np.int64)
    start = ch.pos.astype(np.int64) * int(t.meta.block_tokens)
    q = k * start + k * (k - 1) // 2  # as kvtrace.analyses.value.future_reuse
    return _Chunk(ch.r, ch.lo, ch.lrs, ch.local_req, ch.block, req_ts[ch.r + ch.local_req], k, q)


def _request_times(t: StreamedTrace) -> np.ndarray:
    """float64 arrival of each request, after the in-memory run's check that access
    times never decrease."""
    req_ts = t.request_timestamp.astype(np.float64, copy=False)
    rs = t._req_start
    ts = req_ts[rs[1:] > rs[:-1]]
    if ts.size > 1 and np.any(np.diff(ts) < 0):
        raise KvtraceError("access timestamps must be non-decreasing in trace order", field="timestamp")
    return req_ts


def _block_ids(t: StreamedTrace) -> np.ndarray:
    """The dense block id of every access, as a read-only memory map of the trace's
    spill file (:meth:`kvtrace.ingest.stream.StreamedTrace.access_chunks` reads the same file):
    the shared root and the prefix families read a few positions per request and one
    per block, which a pass over every chunk would read in full."""
    if t.n_accesses == 0:
        return np.empty(0, dtype=stream_mod._ID_DTYPE)
    return np.memmap(t.spill / "blocks", dtype=stream_mod._ID_DTYPE, mode="r", shape=(t.n_accesses,))


def _next_accesses(t: StreamedTrace, progress: Progress | None) -> Path:
    """Pass 1: the spill file ``value-next`` (int64 next access per access, -1: none)."""
    path = t.spill / "value-next"
    if path.exists():
        return path
    tmp = path.with_name(path.name + ".tmp")
    N = t.n_accesses
    nxt = np.full(t.n_blocks, -1, dtype=index_dtype(N))
    try:
        with open(tmp, "wb") as fout:
            fout.truncate(N * 8)
            for ch in t.access_chunks(size=_chunk_accesses(), layout=False, reverse=True):
                lo, hi, block = ch.lo, ch.hi, ch.block
                out = np.empty(hi - lo, dtype=np.int64)
                next_access_chunk(block, lo, nxt, out)
                fout.seek(lo * 8)
                out.tofile(fout)
                if progress is not None:
                    progress(N - lo, N)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


# ---------------------------------------------------------------------- public API
def streamed_value_report(trace: StreamedTrace, *, model: ModelSpec | str | None = None,
                          gpu: GpuSpec | str | None = None, horizon_s: float | str | None = None,
                          costs: StorageCosts | None = None, progress: Progress | None = None) -> ValueResult:
    """:func:`kvtrace.analyses.value.value_report` of a streamed trace (which dispatches here).

    Same arguments and result, bit for bit; ``result.future`` is a
    :class:`StreamedFutureReuse`, and ``result.per_block`` is built on first use.
    Passes, memory and disk: module docstring.
    """
    fut = StreamedFutureReuse.of(trace, model, gpu, horizon_s, costs)
    t = trace  # short: used in most lines below
    M, N = t.n_blocks, t.n_accesses
    bpt = int(fut.info["kv_bytes_per_token"])
    report = (lambda done: None) if progress is None else (lambda done: progress(done, 3 * N))
    req_ts = _request_times(t)

    # windows: each access's window value (only its sign is reported) and its two
    # flags for the reduce pass (reuse within the horizon; starts a stay)
    flags_path = t.spill / f"value-flags-{fut._key()}"
    state = _WindowState(M, N, latest=False)
    positive = 0
    try:
        with open(flags_path, "wb") as fh:
            for lag, w in fut._windows(req_ts, state):
                fbytes = (t.block_size[lag.block].astype(np.int64) * bpt).astype(np.float64)
                value = _window_values(fut.model, fut.gpu, fut.costs, fut.horizon_s, fbytes, w.reuses, w.last_gap,
                                       w.reuse_tokens, w.reuse_q)[-1]
                positive += int(np.count_nonzero(value > 0))
                ((w.reuses > 0).view(np.uint8) | (w.starts_stay.view(np.uint8) << 1)).tofile(fh)
                report(lag.lo + lag.block.shape[0])
        accesses = state.count  # the lead has read every access
        del state
        next_path = _next_accesses(t, lambda d, _n: report(N + d))
        cols = _reduce(fut, req_ts, next_path, flags_path, lambda d: report(2 * N + d))
    finally:
        flags_path.unlink(missing_ok=True)
    first_req, last_req, hits, cost = cols.pop("first_req"), cols.pop("last_req"), cols.pop("hits"), cols.pop("cost")
    blocks_file = _block_ids(t)
    shared = shared_root(t._req_start, blocks_file)
    root = family_roots(first_req, t._req_start, blocks_file, shared[0], dtype=index_dtype(M))
    del blocks_file
    parked = _Parked(t.spill.parent, first_req=first_req, last_req=last_req, hits=hits, cost=cost)
    del first_req, last_req, hits, cost
    blocks = {"root_block": root, "accesses": accesses, "gain_gpu_seconds": cols.pop("gain_s"),
              "total_value_usd": cols.pop("total"), "clairvoyant_value_usd": cols.pop("free")}
    del accesses, root
    cols["positive_window_value"] = positive
    per_prefix_df, summary = _tables(t, fut, N, blocks, cols, shared)

    def per_block() -> pl.DataFrame:
        more = parked.load()
        ts = t.request_timestamp
        return _block_table(t, bpt, {**blocks, "root_block": blocks["root_block"].astype(np.int64),
                                     "accesses": blocks["accesses"].astype(np.int64),
                                     "first_seen_s": ts[more["first_req"]], "last_seen_s": ts[more["last_req"]],
                                     "horizon_hits": more["hits"].astype(np.int64), "cost_usd": more["cost"]})

    return ValueResult(per_block, per_prefix_df, summary, fut)


def _reduce(fut: StreamedFutureReuse, req_ts: np.ndarray, next_path: Path, flags_path: Path,
            progress: Callable[[int], None]) -> dict:
    """The reduce pass (module docstring): per-block sums and schedules and per-access
    totals, in trace order, from the spilled next accesses and window flags."""
    t = fut.trace
    c = fut.costs
    M, N = t.n_blocks, t.n_accesses
    tail = fut.horizon_s if math.isfinite(fut.horizon_s) else 0.0
    bpt = int(fut.info["kv_bytes_per_token"])
    idx, ridx = index_dtype(N), index_dtype(t.n_requests)
    gain_s = np.zeros(M, dtype=np.float64)
    cost = np.zeros(M, dtype=np.float64)
    total = np.zeros(M, dtype=np.float64)
    stored = np.full(M, -np.inf, dtype=np.float64)
    free = np.zeros(M, dtype=np.float64)
    hits = np.zeros(M, dtype=idx)
    first_req = np.full(M, -1, dtype=ridx)
    last_req = np.zeros(M, dtype=ridx)
    write_sum, read_sum, occ_sum = PairwiseSum(N), PairwiseSum(N), PairwiseSum(N)
    no_reuse = 0
    chunks = t.access_chunks(size=_chunk_accesses(), extra=[(next_path, np.int64), (flags_path, np.uint8)])
    with contextlib.closing(chunks):
        for ch in chunks:
            r, block, local_req = ch.r, ch.block, ch.local_req
            next_t, flags = ch.extra
            keep, starts_stay = (flags & 1).view(bool), (flags >> 1).view(bool)
            ts = req_ts[r + local_req]
            next_gap, interval_gain = fut._next_columns(ts, next_t, keep, req_ts)
            nbytes = t.block_size[block].astype(np.int64) * bpt
            interval_value = _interval_values(fut.gpu, c, fut.horizon_s, nbytes.astype(np.float64), keep, next_gap,
                                              interval_gain, starts_stay)
            write_acc, read_acc, occ_acc = _cost_parts(c, nbytes, keep, next_gap, starts_stay, tail)
            add_at(gain_s, block, interval_gain)
            add_at(cost, block, write_acc + read_acc + occ_acc)
            add_at(total, block, interval_value)
            best_keep_value_into(block, keep, _clairvoyant_interval(fut.info, interval_gain, read_acc, occ_acc, keep),
                                 _write_cost(c, nbytes), stored, free)
            count_at(hits, block, ~starts_stay)
            block_extent(block, local_req, r, first_req, last_req)
            write_sum.add(write_acc)
            read_sum.add(read_acc)
            occ_sum.add(occ_acc)
            no_reuse += int(np.count_nonzero(~keep))
            progress(ch.hi)
    return {"gain_s": gain_s, "cost": cost, "total": total, "free": free, "hits": hits, "first_req": first_req,
            "last_req": last_req, "write_cost_usd": write_sum.value,
            "read_cost_usd": read_sum.value, "occupancy_cost_usd": occ_sum.value, "no_reuse": no_reuse}


class _Parked:
    """Per-block arrays of a streamed report that its summary does not read, kept on
    disk until the per-block table is built (20 bytes per block less in memory while
    the summary runs). They live in a spill directory of their own (:mod:`kvtrace.trace.spill`,
    next to the trace's), so the table can still be built after the trace is closed;
    it goes with its builder: once the table is built, or with the result (or as stale,
    after a killed run)."""

    def __init__(self, parent: Path, **arrays: np.ndarray) -> None:
        self.dir = spill_mod.make_spill_dir(parent)
        self._remove = weakref.finalize(self, shutil.rmtree, self.dir, True)
        self.dtypes = {}
        try:
            for name, x in arrays.items():
                x.tofile(self.dir / name)
                self.dtypes[name] = x.dtype
        except BaseException:
            self._remove()
            raise

    def load(self) -> dict:
        return {name: np.fromfile(self.dir / name, dtype=dtype) for name, dtype in self.dtypes.items()}


def streamed_values(trace: StreamedTrace, *, model: ModelSpec | str | None = None, gpu: GpuSpec | str | None = None,
                    horizon_s: float | str | None = DEFAULT_HORIZON_S, costs: StorageCosts | None = None,
                    progress: Progress | None = None) -> Path:
    """Write every access's window value to a file; return its path.

    Parameters
    ----------
    trace : StreamedTrace
        Must stay open while the file is read (the file lives in ``trace.spill`` and
        goes with it).
    model, gpu, horizon_s, costs
        As for :func:`kvtrace.analyses.value.future_reuse`.
    progress : callable, optional
        ``progress(done, total)``.

    Returns
    -------
    pathlib.Path
        Raw float64, native byte order, one value per access in trace order (length
        ``trace.n_accesses``): exactly ``future_reuse(...).value_usd`` of the
        in-memory trace, $. Read it chunk by chunk with
        ``np.fromfile(fh, dtype=np.float64, count=n)``. The same arguments on the same
        trace return the same file without a new pass.
    """
    return StreamedFutureReuse.of(trace, model, gpu, horizon_s, costs).values_path(progress)
