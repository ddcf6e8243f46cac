"""Future-reuse value of a streamed trace (``kvtrace value --stream``), bit for bit.

:func:`kvtrace.value.value_report` hands a :class:`kvtrace.stream.StreamedTrace` to
:func:`streamed_value_report`, which gives the same per-block table, per-prefix
rollup and summary as the in-memory run **bit for bit** without holding a
per-access array: ``tests/test_value_stream.py`` compares every column and figure,
and every per-access value, exactly, over many chunks.

Passes (after the scan of :func:`kvtrace.stream.open_stream`)
-------------------------------------------------------------
1. **Next access** (backward): the chunks of the block spill file are read last to
   first and each access gets the index of its block's next access
   (:func:`kvtrace.kernels.future_stream.next_access_chunk`, one index per block
   carried back), written to the spill file ``value-next`` (8 bytes per access; kept
   for later passes over the same trace, removed with the trace).
2. **Windows** (forward, two cursors over the block spill file): a lead cursor keeps
   each block's running access count and token sums; a lag cursor closes access
   ``s``'s reuse window as soon as the lead meets the first access beyond
   ``ts[s] + horizon``, and reads the reuses off as differences of running values
   (:func:`kvtrace.kernels.future_stream.lead_lag_windows`): the integers and times
   of :func:`kvtrace.kernels.future.future_windows`, exactly. Each chunk of the lag
   is then complete: its next access (pass 1) gives the gap to it and the compute it
   avoids, and the per-access float columns are computed by the in-memory code's own
   elementwise functions. With an infinite horizon the lead reads the whole trace
   before the lag closes anything: the reuses then come from each block's totals
   (the closed form), still with O(blocks) state.
3. **Reduce**, chunk by chunk in trace order, as the in-memory run does over whole
   arrays: per-block sums in ``np.bincount``'s order, numpy's pairwise sums over
   accesses (:mod:`kvtrace.kernels.sums`), the best keep/drop schedule's dynamic
   programme with its per-block state carried (``best_keep_value_into``).

Memory, per distinct block M and request R (bytes): about 170 x M (the two cursors'
per-block counters, the per-block sums and the keep/drop state; the per-block tables
at the end hold about 100 x M more) + the streamed trace's own (~16 x M + 20 x R) +
one chunk of ``CHUNK_ACCESSES / CHUNK_SHARE`` accesses (256K by default, about 300
bytes each with temporaries: ~80 MB). Nothing grows with the horizon or the number of
accesses: the lag re-reads the block ids from disk instead of holding the accesses
whose window is still open (measured on 3.2M accesses, 300K blocks, chunks of 64K:
80 MB above the scan's peak, against 575 MB in memory). Disk: 8 bytes per access
(``value-next``), plus 8 per access for each :func:`streamed_values` file, in the
trace's spill directory.

Per-access output (``--accesses-out``, :meth:`StreamedFutureReuse.write_table`) is
made by a second windows pass and written chunk by chunk, atomically
(:func:`kvtrace.outputs.write_table_chunks`).
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import polars as pl

from . import stream as stream_mod
from .errors import KvtraceError
from .kernels.future import best_keep_value_into
from .kernels.future_stream import block_extent, lead_lag_windows, next_access_chunk
from .kernels.sums import PairwiseSum, add_at, count_at
from .model import GpuSpec, ModelSpec
from .stream import StreamedTrace
from .value import (
    DEFAULT_HORIZON_S,
    FutureReuse,
    StorageCosts,
    ValueResult,
    _access_values,
    _clairvoyant_interval,
    _cost_parts,
    _info,
    _prefill_gpu_seconds,
    _setup,
    _tables,
    _write_cost,
)
try:
    from kvprobe import probe as _probe  # PROBE
except ImportError:  # PROBE
    _probe = lambda *_: None  # PROBE

__all__ = ["StreamedFutureReuse", "streamed_value_report", "streamed_values"]

Progress = Callable[[int, int], None]


#: A value chunk holds about 40 per-access arrays (the curve's, 3): it takes this
#: fraction of :data:`kvtrace.stream.CHUNK_ACCESSES`.
CHUNK_SHARE = 16


def _chunk_accesses() -> int:
    """Accesses per chunk (read at call time, so tests can shrink the chunks)."""
    return max(1, stream_mod.CHUNK_ACCESSES // CHUNK_SHARE)


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


@dataclass
class StreamedFutureReuse:
    """The per-access future reuse of a streamed trace, made chunk by chunk on demand.

    Stands for :class:`kvtrace.value.FutureReuse` in the ``ValueResult`` of a streamed
    trace: the same arrays, never all in memory. :meth:`chunks` yields them chunk by
    chunk, :meth:`write_table` writes the per-access table, :meth:`values_path` the
    ``value_dollars`` column to a file. Each runs the windows pass again (module
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
        """Resolve the arguments as :func:`kvtrace.value.future_reuse` does."""
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
        :func:`kvtrace.value.future_reuse`'s slices."""
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
        from .outputs import table_format, write_table_chunks

        table_format(path)  # a bad suffix fails before the pass
        write_table_chunks(self.table_chunks(progress), path, metadata=metadata)

    def values_path(self, progress: Progress | None = None) -> Path:
        """A file in the trace's spill directory holding ``value_dollars`` (float64, one
        per access, trace order): :func:`streamed_values`."""
        path = self.trace.spill / f"value-dollars-{self._key()}.f64"
        if path.exists():
            return path
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "wb") as fh:
                for _, fr in self.chunks(progress):
                    fr.value_dollars.astype(np.float64, copy=False).tofile(fh)
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
        """Passes 1 and 2 of the module docstring: every chunk's per-access arrays."""
        t = self.trace
        N, M = t.n_accesses, t.n_blocks
        total = 2 * N
        req_ts = t.request_timestamp.astype(np.float64, copy=False)
        _check_order(t, req_ts)
        _probe('value pass start')  # PROBE
        next_path = _next_accesses(t, None if progress is None else (lambda d, _n: progress(d, total)))
        _probe('next accesses done')  # PROBE
        size64 = t.block_size.astype(np.int64)
        bpt = int(self.info["kv_bytes_per_token"])
        B = int(t.meta.block_tokens)
        a = t.accesses
        lead_state = np.zeros((4, M), dtype=np.int64)
        lead_state[3] = -1
        latest_ts = np.zeros(M, dtype=np.float64)
        lag_state = np.zeros((3, M), dtype=np.int64)
        prev_keep = np.zeros(M, dtype=bool)
        size = _chunk_accesses()
        blocks_path = t.spill / "blocks"
        with open(blocks_path, "rb") as f_lead, open(blocks_path, "rb") as f_lag, open(next_path, "rb") as f_next:
            lead_chunks, lag_chunks = t._chunks(size), t._chunks(size)
            lead = _read_chunk(t, f_lead, next(lead_chunks, None), req_ts)
            final = lead is None
            i = 0
            for lag_c in lag_chunks:
                lag = _read_chunk(t, f_lag, lag_c, req_ts)
                m = lag.block.shape[0]
                reuses = np.empty(m, dtype=np.int64)
                last_t = np.empty(m, dtype=np.int64)
                last_gap = np.empty(m, dtype=np.float64)
                reuse_tokens = np.empty(m, dtype=np.int64)
                reuse_q = np.empty(m, dtype=np.int64)
                starts_stay = np.empty(m, dtype=bool)
                j = 0
                while True:
                    cur = lead if lead is not None else _EMPTY
                    i, j = lead_lag_windows(cur.block, cur.ts, cur.tokens, cur.q, cur.lo, i,
                                            lag.block, lag.ts, lag.tokens, lag.q, j, self.horizon_s, final,
                                            lead_state, latest_ts, lag_state, prev_keep,
                                            reuses, last_t, last_gap, reuse_tokens, reuse_q, starts_stay)
                    if j == m:
                        break
                    lead = _read_chunk(t, f_lead, next(lead_chunks, None), req_ts)
                    final = lead is None
                    i = 0
                next_t = _read_exact(f_next, np.int64, m, next_path)
                fr = self._finish(lag, a, req_ts, size64, bpt, B, next_t, reuses, last_t, last_gap, reuse_tokens,
                                  reuse_q, starts_stay)
                yield lag, fr
                if progress is not None:
                    progress(N + lag.lo + m, total)

    def _finish(self, lag: _Chunk, a, req_ts, size64, bpt, B, next_t, reuses, last_t, last_gap, reuse_tokens,
                reuse_q, starts_stay) -> FutureReuse:
        """The per-access arrays of a chunk whose windows are all closed."""
        m = lag.block.shape[0]
        rs = self.trace._req_start
        has = next_t >= 0
        next_gap = np.full(m, np.inf, dtype=np.float64)
        next_req = np.searchsorted(rs, next_t[has], side="right") - 1
        next_gap[has] = req_ts[next_req] - lag.ts[has]
        keep = reuses > 0
        nk = next_t[keep]
        k_next = a.tokens[nk].astype(np.int64)
        q_next = k_next * (a.pos[nk].astype(np.int64) * B) + k_next * (k_next - 1) // 2
        interval_gain = np.zeros(m, dtype=np.float64)
        interval_gain[keep] = _prefill_gpu_seconds(self.model, self.gpu, k_next, q_next)
        nbytes = size64[lag.block] * bpt
        hold, gain_s, gain_d, cost, value, interval_value = _access_values(
            self.model, self.gpu, self.costs, self.horizon_s, nbytes, reuses, last_gap, reuse_tokens, reuse_q,
            next_gap, interval_gain, starts_stay)
        return FutureReuse(
            block=lag.block, timestamp_s=lag.ts, next_t=next_t, next_gap_s=next_gap, reuses=reuses,
            last_reuse_t=last_t, hold_s=hold, reuse_tokens=reuse_tokens, bytes=nbytes, gain_gpu_seconds=gain_s,
            gain_dollars=gain_d, cost_dollars=cost, value_dollars=value, interval_gain_gpu_seconds=interval_gain,
            interval_value_dollars=interval_value, starts_stay=starts_stay, horizon_s=self.horizon_s,
            costs=self.costs, info=self.info)


_EMPTY = _Chunk(0, 0, np.zeros(1, np.int64), np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float64),
                np.empty(0, np.int64), np.empty(0, np.int64))


def _empty_future(f: StreamedFutureReuse) -> FutureReuse:
    i, x = np.empty(0, np.int64), np.empty(0, np.float64)
    return FutureReuse(block=i, timestamp_s=x, next_t=i, next_gap_s=x, reuses=i, last_reuse_t=i, hold_s=x,
                       reuse_tokens=i, bytes=i, gain_gpu_seconds=x, gain_dollars=x, cost_dollars=x, value_dollars=x,
                       interval_gain_gpu_seconds=x, interval_value_dollars=x, starts_stay=np.empty(0, bool),
                       horizon_s=f.horizon_s, costs=f.costs, info=f.info)


def _read_exact(fh, dtype, count: int, path: Path) -> np.ndarray:
    x = np.fromfile(fh, dtype=dtype, count=count)
    if x.shape[0] != count:
        raise KvtraceError(f"spill file cut short: read {x.shape[0]} of {count} values", path=str(path))
    return x


def _read_chunk(t: StreamedTrace, fh, chunk, req_ts: np.ndarray) -> _Chunk | None:
    """The accesses of chunk ``(r, r_end, lo, hi)`` (None: past the end), read from the
    block spill file at the handle's position."""
    if chunk is None:
        return None
    r, r_end, lo, hi = chunk
    block = _read_exact(fh, stream_mod._ID_DTYPE, hi - lo, t.spill / "blocks").astype(np.int64)
    lrs, tokens, pos, local_req = t._layout(r, r_end, lo)
    k = tokens.astype(np.int64)
    start = pos.astype(np.int64) * int(t.meta.block_tokens)
    q = k * start + k * (k - 1) // 2  # as kvtrace.value.future_reuse
    return _Chunk(r, lo, lrs, local_req, block, req_ts[r + local_req], k, q)


def _check_order(t: StreamedTrace, req_ts: np.ndarray) -> None:
    """The in-memory run's check that access times never decrease."""
    rs = t._req_start
    ts = req_ts[rs[1:] > rs[:-1]]
    if ts.size > 1 and np.any(np.diff(ts) < 0):
        raise KvtraceError("access timestamps must be non-decreasing in trace order", field="timestamp")


def _next_accesses(t: StreamedTrace, progress: Progress | None) -> Path:
    """Pass 1: the spill file ``value-next`` (int64 next access per access, -1: none)."""
    path = t.spill / "value-next"
    if path.exists():
        return path
    tmp = path.with_name(path.name + ".tmp")
    nxt = np.full(t.n_blocks, -1, dtype=np.int64)
    chunks = list(t._chunks(_chunk_accesses()))  # O(requests / chunk)
    itemsize = np.dtype(stream_mod._ID_DTYPE).itemsize
    N = t.n_accesses
    try:
        with open(t.spill / "blocks", "rb") as fin, open(tmp, "wb") as fout:
            fout.truncate(N * 8)
            for r, r_end, lo, hi in reversed(chunks):
                fin.seek(lo * itemsize)
                block = _read_exact(fin, stream_mod._ID_DTYPE, hi - lo, t.spill / "blocks").astype(np.int64)
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
    """:func:`kvtrace.value.value_report` of a streamed trace (which dispatches here).

    Same arguments and result, bit for bit; ``result.future`` is a
    :class:`StreamedFutureReuse`. Memory and disk: module docstring.
    """
    fut = StreamedFutureReuse.of(trace, model, gpu, horizon_s, costs)
    c = fut.costs
    M, N = trace.n_blocks, trace.n_accesses
    tail = fut.horizon_s if math.isfinite(fut.horizon_s) else 0.0
    bytes_b = trace.block_size.astype(np.int64) * int(fut.info["kv_bytes_per_token"])
    write_cost_b = _write_cost(c, bytes_b)
    gain_s = np.zeros(M, dtype=np.float64)
    cost = np.zeros(M, dtype=np.float64)
    total = np.zeros(M, dtype=np.float64)
    stored = np.full(M, -np.inf, dtype=np.float64)
    free = np.zeros(M, dtype=np.float64)
    hits = np.zeros(M, dtype=np.int64)
    first_req = np.full(M, -1, dtype=np.int64)
    last_req = np.zeros(M, dtype=np.int64)
    root = np.zeros(M, dtype=np.int64)
    write_sum, read_sum, occ_sum = PairwiseSum(N), PairwiseSum(N), PairwiseSum(N)
    no_reuse = positive = 0
    accesses = np.zeros(M, dtype=np.int64)
    for chunk, fr in fut._pass(progress):
        block, keep = fr.block, fr.keepable
        write_acc, read_acc, occ_acc = _cost_parts(c, fr.bytes, keep, fr.next_gap_s, fr.starts_stay, tail)
        add_at(gain_s, block, fr.interval_gain_gpu_seconds)
        add_at(cost, block, write_acc + read_acc + occ_acc)
        add_at(total, block, fr.interval_value_dollars)
        best_keep_value_into(block, keep, _clairvoyant_interval(fr, fr.interval_gain_gpu_seconds, read_acc, occ_acc,
                                                                keep), write_cost_b, stored, free)
        count_at(accesses, block, np.ones(block.shape[0], dtype=bool))
        count_at(hits, block, ~fr.starts_stay)
        block_extent(block, chunk.local_req, chunk.r, first_req, last_req, root, chunk.lrs)
        write_sum.add(write_acc)
        read_sum.add(read_acc)
        occ_sum.add(occ_acc)
        no_reuse += int(np.count_nonzero(~keep))
        positive += int(np.count_nonzero(fr.value_dollars > 0))
    _probe('value pass done')  # PROBE
    req_ts = trace.request_timestamp
    blocks = {
        "root_block": root,
        "first_seen_s": req_ts[first_req],
        "last_seen_s": req_ts[last_req],
        "accesses": accesses,
        "horizon_hits": hits,
        "gain_gpu_seconds": gain_s,
        "cost_dollars": cost,
        "total_value_dollars": total,
        "clairvoyant_value_dollars": free,
    }
    sums = {"write_cost_dollars": write_sum.value, "read_cost_dollars": read_sum.value,
            "occupancy_cost_dollars": occ_sum.value, "no_reuse": no_reuse, "positive_window_value": positive}
    per_block_df, per_prefix_df, summary = _tables(trace, fut, N, blocks, sums)
    _probe('tables done')  # PROBE
    return ValueResult(per_block_df, per_prefix_df, summary, fut)


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
        As for :func:`kvtrace.value.future_reuse`.
    progress : callable, optional
        ``progress(done, total)``.

    Returns
    -------
    pathlib.Path
        Raw float64, native byte order, one value per access in trace order (length
        ``trace.n_accesses``): exactly ``future_reuse(...).value_dollars`` of the
        in-memory trace, $. Read it chunk by chunk with
        ``np.fromfile(fh, dtype=np.float64, count=n)``. The same arguments on the same
        trace return the same file without a new pass.
    """
    return StreamedFutureReuse.of(trace, model, gpu, horizon_s, costs).values_path(progress)
