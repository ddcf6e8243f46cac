"""The exact capacity-hit pass: one fold over the chunks of any trace source (DESIGN §3).

Rules this module keeps (and :mod:`kvtrace.analyses.curves` relies on):

- distances are computed once per access, in tokens, by the stack-distance kernel
  (:class:`kvtrace.analyses.distances.StackFold`); no capacity enters them;
- capacities appear only where accesses are binned, on the evaluation grid
  (:func:`kvtrace.kernels.hitcurve.binned_hits_into`); bytes only in the result tables;
- the histogram is added to in trace order, so its float sums do not depend on how
  the trace is cut into chunks: an in-memory trace, the same trace streamed from disk
  and one chunk or many give the same curve bit for bit.

The fold (:func:`exact_pass`): ``init`` allocates the carried state, ``step`` takes
one chunk of whole requests (:meth:`kvtrace.trace.source.TraceSource.chunks`),
``finish`` hands a :class:`CurvePass` to the curve. Carried state: the kernel's stack
(O(distinct blocks)), the histogram ``float64[2, n_groups, G + 2, 4]``, each
request's usable key and half-prefix key (O(requests)), the largest finite distance,
and the usable-prefix distance of every access in a column of the source
(``source.column("usable")``: an array in memory, a spill file streamed). Later passes
read that column back: the exact knee search between two grid points
(:meth:`CurvePass.keys_in_ranges`) and the group summary's one-capacity evaluation
(:meth:`CurvePass.at_capacity`).

The sampled pass (:mod:`kvtrace.analyses.sampled`) and the partitioned one
(:mod:`kvtrace.analyses.distributed`) hand over the same :class:`CurvePass`.
"""

from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from kvtrace.analyses.distances import Distances, StackFold, distances_in_halves, normalise_eviction
from kvtrace.kernels.hitcurve import binned_hits_into, keys_in_ranges, max_finite
from kvtrace.kernels.partition import partition_estimates
from kvtrace.kernels.stackdist import COLD, half_prefix_keys_into, usable_distances
from kvtrace.trace.source import CHUNK_ACCESSES

#: An in-memory exact pass of at least this many accesses, on a machine with two cores
#: or more, may run the rest of its kernel in two halves at once (:func:`halves_pay`,
#: :func:`kvtrace.analyses.distances.distances_in_halves`) ...
HALVES_MIN_ACCESSES = 2_000_000
#: ... and is cut into about this many chunks, so that the fold of the last one, which
#: runs after the kernel's end, is short.
HALVES_CHUNKS = 32
#: ... when its second chunk's kernel took this many times its first chunk's fold.
HALVES_KERNEL_RATIO = 3.0
NO_SCALE = np.empty(0, dtype=np.float64)  # binning weights: all 1
NO_GROUP = np.empty(0, dtype=np.int32)  # one group
_NO_USABLE = np.empty(0, dtype=np.int64)  # a kernel output not asked for


@dataclass
class CurvePass:
    """What a pass over the accesses hands to :func:`kvtrace.analyses.curves.compute_curve`.

    Requests are the pass's own: every request of the trace for exact passes, the
    sampled ones (in trace order) for a sampled pass.

    Attributes
    ----------
    hist : float64[2, n_groups, G + 2, 4]
        :func:`kvtrace.kernels.hitcurve.binned_hits_into` of the measured accesses on the
        grid: ``[0]`` any-block distances, ``[1]`` usable-prefix distances.
    request_keys : int64[R']
        Usable key (tokens) of each request's first block; COLD for an empty or cold one.
    request_members : bool[R']
        Which requests are measured (a sampled request also needs its first block sampled).
    top : int
        Largest finite distance or usable distance among measured accesses (tokens).
    knee_keys : callable
        ``(lo_keys, hi_keys) -> (keys, range, tokens, q)``:
        :func:`kvtrace.kernels.hitcurve.keys_in_ranges` over the measured accesses.
    half_keys : int64[R'] or None
        Each request's half-prefix key (:func:`half_prefix_keys`); None when the pass
        cannot tell (sampled and partitioned passes).
    request_group : int32[R'] or None
        Group of each request (None: one group).
    request_weights : float64[R'] or None
        Sampled passes: each request's weight (its first evaluated access's).
    at_capacity : callable or None
        ``capacity_tokens -> float64[2, n_groups, 3, 4]``: the usable-prefix histogram
        ``[1]`` on the one-point grid ``[capacity]`` (``[0]`` is NaN: not evaluated);
        None when the pass has only its grid.
    sub_hist : float64[2, SUBSAMPLES, G + 2, 4] or None
        Sampled passes: the sub-sample histograms behind the error estimate.
    n_evaluated : int or None
        Sampled passes: accesses evaluated.
    release : callable or None
        Frees what the later passes read (the usable column).
    """

    hist: np.ndarray
    request_keys: np.ndarray
    request_members: np.ndarray
    top: int
    knee_keys: Callable
    half_keys: np.ndarray | None = None
    request_group: np.ndarray | None = None
    request_weights: np.ndarray | None = None
    at_capacity: Callable | None = None
    sub_hist: np.ndarray | None = None
    n_evaluated: int | None = None
    release: Callable | None = None

    def keys_in_ranges(self, lo_keys: np.ndarray, hi_keys: np.ndarray):
        return self.knee_keys(lo_keys, hi_keys)

    def close(self) -> None:
        if self.release is not None:
            self.release()
            self.release = None


def halves_pay(kernel_seconds: float, fold_seconds: float) -> bool:
    """Whether the rest of an exact pass runs its kernel in two halves at once: the
    fold takes the second core otherwise, so two kernels pay only where a chunk's kernel
    is much slower than its fold (:data:`HALVES_KERNEL_RATIO`). Results are the same
    either way."""
    return kernel_seconds > HALVES_KERNEL_RATIO * fold_seconds


def half_prefix_keys(usable: np.ndarray, tokens: np.ndarray, req_start: np.ndarray) -> np.ndarray:
    """int64[R]: the smallest capacity (tokens) at which each request's usable prefix
    holds at least half its prompt tokens; COLD for an empty request or one that never
    gets there.

    ``usable`` is non-decreasing along a request (a running max), so at capacity C the
    usable prefix is the blocks with ``usable <= C`` and reaches half the tokens iff the
    block at which the request's cumulative tokens first reach ``ceil(total / 2)`` is in
    it: the key is that block's usable distance
    (:func:`kvtrace.kernels.stackdist.half_prefix_keys_into`).
    """
    rs = np.ascontiguousarray(req_start, dtype=np.int64)
    keys = np.empty(rs.shape[0] - 1, dtype=np.int64)
    half_prefix_keys_into(usable, tokens, rs, keys)
    return keys


def exact_pass(source, eviction: str, grid: np.ndarray, first_req: int, req_group: np.ndarray | None,
               n_groups: int, *, distances: Distances | None = None, partitions: int = 1,
               progress: Callable[[int, int], None] | None = None) -> CurvePass:
    """The exact pass (module docstring) over a :class:`kvtrace.trace.source.TraceSource`.

    Parameters
    ----------
    source : TraceSource
    eviction : str
        ``prefix-aware`` or ``flat``.
    grid : int64[G]
        Capacities in tokens, ascending.
    first_req : int
        First measured request (earlier ones only warm the cache).
    req_group : int32[R] or None
        Group of each request, 0..n_groups-1.
    distances : Distances, optional
        Exact distances already computed for this source (full arrays, same eviction):
        read instead of running the kernel.
    partitions : int
        The source is one of P spatial partitions of a trace
        (:mod:`kvtrace.analyses.distributed`): each distance becomes the estimate
        ``size + P x (d - size)`` (:func:`kvtrace.kernels.partition.partition_estimates`),
        the usable distance its running max along the request.
    progress : callable, optional
        ``progress(accesses_done, accesses_total)``.
    """
    ev = normalise_eviction(eviction)
    B = int(source.meta.block_tokens)
    rs = source.req_start
    n_req = rs.shape[0] - 1
    n = source.n_accesses
    grid = np.ascontiguousarray(grid, dtype=np.int64)
    size = np.ascontiguousarray(source.block_size, dtype=np.int64)
    depth = 1 if source.spill is None else 0  # chunks folded in while the next one's kernel runs
    usable_col = source.column("usable", np.int64)
    adaptive = (distances is None and partitions == 1 and source.spill is None and n >= HALVES_MIN_ACCESSES
                and (os.cpu_count() or 1) >= 2 and usable_col.array is not None)
    fold = StackFold(size, ev, buffers=depth + 1) if distances is None else None
    fold_seconds: list[float] = []
    hist = np.zeros((2, n_groups, grid.shape[0] + 2, 4), dtype=np.float64)
    keys = np.full(n_req, COLD, dtype=np.int64)
    half = np.full(n_req, COLD, dtype=np.int64)
    first_acc = int(rs[first_req]) if n_req else 0
    top = [0]

    def fold_in(ch, dist, usable, written=False):  # everything after the kernel, one chunk, in trace order
        t0 = time.perf_counter()
        r, r_end, lo, hi, lrs = ch.r, ch.r_end, ch.lo, ch.hi, ch.lrs
        if partitions > 1:
            dist = partition_estimates(dist, size, ch.block, partitions)
            usable = usable_distances(dist, lrs)
        first = min(max(first_acc - lo, 0), hi - lo)
        group = NO_GROUP if req_group is None else req_group[r + ch.local_req].astype(np.int32, copy=False)
        binned_hits_into(hist, dist, usable, first, ch.tokens, ch.pos, ch.block, size, B, group, grid, NO_SCALE)
        nonempty = lrs[1:] > lrs[:-1]
        keys[r:r_end][nonempty] = usable[lrs[:-1][nonempty]]
        half_prefix_keys_into(usable, ch.tokens, lrs, half[r:r_end])
        top[0] = max(top[0], int(max_finite(dist, first)), int(max_finite(usable, first)))
        if not written:
            usable_col.write(lo, usable)
        fold_seconds.append(time.perf_counter() - t0)
        return hi

    def done(future) -> None:  # progress is reported from the caller's thread
        hi = future.result()
        if progress is not None:
            progress(hi, n)

    # In memory, the kernel of chunk k + 1 runs while one worker folds chunk k in (chunks in
    # order, so the histogram's sums are added as before; the fold's two buffer pairs
    # alternate). A large trace whose kernel is much slower than its fold (a stream with
    # little locality) then runs the rest in two halves at once (halves_pay). A streamed
    # source holds one chunk at a time (its memory budget): no overlap.
    try:
        with usable_col, ThreadPoolExecutor(1, thread_name_prefix="kvtrace-fold") as after:
            pending: deque = deque()
            size_hint = max(1, min(CHUNK_ACCESSES, -(-n // HALVES_CHUNKS))) if adaptive else None
            chunks = source.chunks(local_req=req_group is not None, size=size_hint)
            chunks = list(chunks) if adaptive else chunks  # in memory: views
            for i, ch in enumerate(chunks):
                t0 = time.perf_counter()
                if fold is None:
                    dist, usable = distances.dist[ch.lo:ch.hi], distances.usable[ch.lo:ch.hi]
                else:  # a partition's usable distances are those of its estimates (fold_in)
                    dist, usable = fold.step(ch, usable=None if partitions == 1 else _NO_USABLE)
                kernel_seconds = time.perf_counter() - t0
                pending.append(after.submit(fold_in, ch, dist, usable))
                while len(pending) > depth:  # before the next chunk is read: at most depth + 1 alive
                    done(pending.popleft())
                if adaptive and i == 1 and len(chunks) >= 4 and halves_pay(kernel_seconds, fold_seconds[0]):
                    dist_all = np.empty(n, dtype=np.int64)  # only the rest's range is touched

                    def emit(ch) -> None:
                        pending.append(after.submit(fold_in, ch, dist_all[ch.lo:ch.hi],
                                                    usable_col.array[ch.lo:ch.hi], True))
                        while pending and pending[0].done():
                            done(pending.popleft())

                    distances_in_halves(chunks[2:], size, ev, dist_all, usable_col.array, emit, early=fold)
                    break
            while pending:
                done(pending.popleft())
    except BaseException:
        usable_col.drop()
        raise
    top = top[0]
    reader = _UsableKeys(source, usable_col, first_acc, size, B, req_group, n_groups)
    members = np.arange(n_req) >= first_req
    return CurvePass(hist, keys, members, top, reader.in_ranges, half_keys=half, request_group=req_group,
                     at_capacity=reader.at_capacity, release=usable_col.drop)


class _UsableKeys:
    """The usable-prefix distances of a finished exact pass, read back from their
    column chunk by chunk (measured accesses only)."""

    def __init__(self, source, column, first_acc: int, size: np.ndarray, block_tokens: int,
                 req_group: np.ndarray | None, n_groups: int) -> None:
        self.source, self.column, self.first_acc = source, column, first_acc
        self.size, self.block_tokens = size, block_tokens
        self.req_group, self.n_groups = req_group, n_groups

    def in_ranges(self, lo_keys: np.ndarray, hi_keys: np.ndarray):
        """:func:`kvtrace.kernels.hitcurve.keys_in_ranges` over the measured accesses, in
        trace order (an in-memory trace's chunks on every core, a streamed one's one at a
        time)."""
        def scan(ch):
            return keys_in_ranges(ch.extra[0], max(self.first_acc - ch.lo, 0), ch.tokens, ch.pos,
                                  self.block_tokens, lo_keys, hi_keys, NO_SCALE)

        chunks = (ch for ch in self.source.chunks(blocks=False, columns=[self.column], local_req=False)
                  if ch.hi > self.first_acc)
        if self.source.spill is None and (os.cpu_count() or 1) > 1:
            with ThreadPoolExecutor(os.cpu_count(), thread_name_prefix="kvtrace-knees") as pool:
                parts = list(pool.map(scan, chunks))
        else:
            parts = [scan(ch) for ch in chunks]
        if not parts:
            return keys_in_ranges(np.empty(0, np.int64), 0, np.empty(0, np.int32), np.empty(0, np.int32),
                                  self.block_tokens, lo_keys, hi_keys, NO_SCALE)
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))

    def at_capacity(self, capacity_tokens: int) -> np.ndarray:
        """The usable-prefix histogram on the one-point grid ``[capacity_tokens]``
        (:attr:`CurvePass.at_capacity`), added in trace order."""
        grid = np.array([int(capacity_tokens)], dtype=np.int64)
        hist = np.zeros((2, self.n_groups, 3, 4), dtype=np.float64)
        for ch in self.source.chunks(columns=[self.column], local_req=self.req_group is not None):
            if ch.hi <= self.first_acc:
                continue
            usable = ch.extra[0]
            group = NO_GROUP if self.req_group is None else self.req_group[ch.r + ch.local_req].astype(np.int32)
            binned_hits_into(hist, usable, usable, max(self.first_acc - ch.lo, 0), ch.tokens, ch.pos, ch.block,
                             self.size, self.block_tokens, group, grid, NO_SCALE)
        hist[0] = np.nan  # any-block distances are not kept: not evaluated here
        return hist


__all__ = ["CurvePass", "exact_pass", "half_prefix_keys"]
