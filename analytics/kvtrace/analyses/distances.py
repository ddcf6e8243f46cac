"""Per-access reuse distances: the public wrapper around the stack-distance kernel.

Result conventions (also the schema of ``--distances-out``):

- distances are in tokens of KV cache (x kv_bytes_per_token for bytes);
- a first access is a cold miss with distance ``COLD`` (int64 max) in arrays and
  ``inf`` in tables;
- access ``t`` hits an LRU of capacity ``C`` iff ``dist[t] <= C`` (any-block hit) and
  is a usable-prefix hit iff ``usable[t] <= C``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np
import polars as pl

from kvtrace.config import plain_numpy_pages
from kvtrace.errors import UsageError
from kvtrace.kernels.stack_halves import longest_request, resolve_first_touches
from kvtrace.kernels.stackdist import COLD, StackState, stack_distances_chunk, usable_distances_into
from kvtrace.trace import Trace

EVICTIONS = ("prefix-aware", "flat")
_EMPTY = np.empty(0, dtype=np.int64)  # a kernel output not asked for


def normalise_eviction(eviction: str) -> str:
    """``prefix-aware`` (also ``prefix``) or ``flat``."""
    e = str(eviction).strip().lower()
    if e in ("prefix", "prefix-aware", "prefix_aware", "radix"):
        return "prefix-aware"
    if e in ("flat", "lru", "block"):
        return "flat"
    raise UsageError(f"unknown eviction model '{eviction}': expected prefix-aware or flat", field="eviction")


@dataclass
class Distances:
    """Per-access results, in trace order.

    Attributes
    ----------
    eviction : str
        ``prefix-aware`` or ``flat``.
    dist : int64[N]
        Byte-LRU stack distance in tokens (COLD for a first access).
    usable : int64[N]
        Usable-prefix distance in tokens: running max of ``dist`` along the request.
    dist_blocks : int64[N] or None
        Distance in blocks (COLD for a first access), when asked for.
    prev_request : int64[N] or None
        Request of the block's previous touch (-1 for a first access), when asked for.
    """

    eviction: str
    dist: np.ndarray
    usable: np.ndarray
    dist_blocks: np.ndarray | None = None
    prev_request: np.ndarray | None = None

    def reuse_time(self, trace: Trace) -> np.ndarray:
        """float64[N]: seconds since the block's previous touch (inf for a first access)."""
        if self.prev_request is None:
            raise ValueError("computed without details: call reuse_distances(..., details=True)")
        ts = trace.request_timestamp
        out = np.full(self.prev_request.shape[0], np.inf)
        warm = self.prev_request >= 0
        out[warm] = ts[trace.accesses.request[warm]] - ts[self.prev_request[warm]]
        return out


class StackFold:
    """The stack-distance kernel as a fold over the chunks of a source
    (:meth:`kvtrace.trace.source.TraceSource.chunks`, with the request layout).

    Carried state: the kernel's :class:`kvtrace.kernels.stackdist.StackState`
    (O(distinct blocks)), so the distances of a chunk are those of the whole trace,
    whatever the chunking. :meth:`step` writes into the arrays given, or into buffers
    of its own reused from chunk to chunk: ``buffers`` pairs taken in turn, so a step's
    outputs stay valid until ``buffers`` more steps have run (2: one chunk's outputs
    can be folded in while the kernel runs the next).

    Parameters
    ----------
    block_size : int64[M]
        Tokens each block occupies (ones for distances in blocks).
    eviction : str
        ``prefix-aware`` or ``flat`` (normalised).
    track_requests : bool
        Keep each block's last request, for the previous-touch request output.
    buffers : int
        Output buffer pairs taken in turn (default 1).
    """

    def __init__(self, block_size: np.ndarray, eviction: str, *, track_requests: bool = False,
                 buffers: int = 1) -> None:
        self.size = np.ascontiguousarray(block_size, dtype=np.int64)
        self.prefix_aware = eviction == "prefix-aware"
        self.state = StackState(self.size.shape[0])
        if not track_requests:  # no previous-request output: 8 bytes per block saved
            self.state.last_request = _EMPTY
        self._buffers = [[np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)] for _ in range(max(1, buffers))]
        self._turn = 0

    def step(self, ch, *, dist: np.ndarray | None = None, usable: np.ndarray | None = None,
             prev: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(dist, usable)`` of the chunk's accesses (tokens; COLD for a first access).
        An empty ``usable`` or ``prev`` array skips that output."""
        n = ch.hi - ch.lo
        if dist is None or usable is None:
            pair = self._buffers[self._turn]  # [dist, usable], each grown only when used
            self._turn = (self._turn + 1) % len(self._buffers)
            # grown with room to spare: chunks of whole requests differ a little in length, and
            # a buffer replaced for a few more accesses would fault all its pages in again
            if dist is None:
                if pair[0].shape[0] < n:
                    pair[0] = np.empty(n + n // 4, dtype=np.int64)
                dist = pair[0][:n]
            if usable is None:
                if pair[1].shape[0] < n:
                    pair[1] = np.empty(n + n // 4, dtype=np.int64)
                usable = pair[1][:n]
        stack_distances_chunk(ch.block, self.size, ch.lrs, ch.r, self.prefix_aware, *self.state.arrays(), dist,
                              _EMPTY if prev is None else prev, usable)
        return dist, usable


def distances_in_halves(chunks: list, block_size: np.ndarray, eviction: str, dist: np.ndarray, usable: np.ndarray,
                        emit: Callable, early: StackFold | None = None) -> None:
    """Exact distances of an in-memory trace's chunks (consecutive, in order) on two
    threads: the later half's kernel on a worker while this thread runs the earlier
    half's, then this thread resolves the later half's first touches chunk by chunk
    (:mod:`kvtrace.kernels.stack_halves`). Fills ``dist[lo:hi]`` and ``usable[lo:hi]``
    of every chunk, the same values as one :class:`StackFold` pass, and calls
    ``emit(chunk)`` once a chunk's are final, in trace order.

    ``early``: the fold that has run every chunk before these (None: these are the
    first), continued by the earlier half. Memory: a second stack state (O(distinct
    blocks)) for the later half."""
    n = sum(ch.hi - ch.lo for ch in chunks)
    k, acc = 0, 0
    while k < len(chunks) - 1 and acc + (chunks[k].hi - chunks[k].lo) <= n // 2:
        acc += chunks[k].hi - chunks[k].lo
        k += 1
    k = max(k, 1)
    first_half, late = chunks[:k], chunks[k:]
    fold = StackFold(block_size, eviction) if early is None else early
    later = StackFold(fold.size, eviction).state
    pa = fold.prefix_aware

    def run_late(ch) -> None:
        stack_distances_chunk(ch.block, fold.size, ch.lrs, ch.r, pa, *later.arrays(), dist[ch.lo:ch.hi], _EMPTY,
                              _EMPTY, True)

    with ThreadPoolExecutor(1, thread_name_prefix="kvtrace-later-half") as pool:
        futures = [pool.submit(run_late, ch) for ch in late]  # one worker: in order
        try:
            for ch in first_half:
                fold.step(ch, dist=dist[ch.lo:ch.hi], usable=usable[ch.lo:ch.hi])
                emit(ch)
            st = fold.state
            pending = np.empty(max([longest_request(ch.lrs) for ch in late], default=0), dtype=np.int64)
            for ch, fut in zip(late, futures):
                fut.result()
                d = dist[ch.lo:ch.hi]
                resolve_first_touches(ch.block, fold.size, ch.lrs, pa, st.tree, st.offsets, st.slot_size,
                                      st.last_slot, st.scalars, d, pending)
                usable_distances_into(d, ch.lrs, usable[ch.lo:ch.hi])
                emit(ch)
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise


@plain_numpy_pages
def reuse_distances(
    trace: Trace,
    eviction: str = "prefix-aware",
    *,
    details: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Distances:
    """Exact byte-LRU reuse distances of every access of ``trace``, as full arrays
    (an in-memory trace: one fold over its chunks, :class:`StackFold`).

    Parameters
    ----------
    trace : Trace
    eviction : str
        ``prefix-aware`` (request-atomic, radix-tree-like; default) or ``flat``
        (sequential block LRU over the chain-order stream, as libCacheSim sees it).
    details : bool
        Also compute distances in blocks and the previous-touch request (reuse time).
    progress : callable, optional
        Called as ``progress(accesses_done, accesses_total)``.

    Returns
    -------
    Distances
    """
    ev = normalise_eviction(eviction)
    n = trace.n_accesses
    dist = np.empty(n, dtype=np.int64)
    usable = np.empty(n, dtype=np.int64)
    prev = np.empty(n if details else 0, dtype=np.int64)
    dist_blocks = np.empty(n if details else 0, dtype=np.int64)
    tokens = StackFold(trace.block_size, ev, track_requests=details)
    # the depth in blocks is the same distance with unit sizes
    blocks = StackFold(np.ones_like(tokens.size), ev) if details else None
    for ch in trace.chunks():
        lo, hi = ch.lo, ch.hi
        tokens.step(ch, dist=dist[lo:hi], usable=usable[lo:hi], prev=prev[lo:hi] if details else None)
        if blocks is not None:
            blocks.step(ch, dist=dist_blocks[lo:hi], usable=_EMPTY)
        if progress is not None:
            progress(hi, n)
    return Distances(ev, dist, usable, dist_blocks if details else None, prev if details else None)


def distances_table(trace: Trace, d: Distances, kv_bytes_per_token: int) -> pl.DataFrame:
    """Per-access results as a table (``--distances-out``).

    Columns: ``t``, ``request``, ``pos``, ``block``, ``tokens``, ``timestamp`` (s),
    ``reuse_distance_tokens``, ``usable_distance_tokens``, ``reuse_distance_bytes``,
    ``usable_distance_bytes``, ``reuse_distance_blocks`` (all float64, ``inf`` = cold),
    ``reuse_time_s`` (``inf`` = cold).
    """

    def as_float(x: np.ndarray) -> np.ndarray:
        out = x.astype(np.float64)
        out[x == COLD] = np.inf
        return out

    df = trace.access_table()
    dt = as_float(d.dist)
    ut = as_float(d.usable)
    cols = {
        "reuse_distance_tokens": dt,
        "usable_distance_tokens": ut,
        "reuse_distance_bytes": dt * kv_bytes_per_token,
        "usable_distance_bytes": ut * kv_bytes_per_token,
    }
    if d.dist_blocks is not None:
        cols["reuse_distance_blocks"] = as_float(d.dist_blocks)
        cols["reuse_time_s"] = d.reuse_time(trace)
    return df.with_columns([pl.Series(k, v) for k, v in cols.items()])
