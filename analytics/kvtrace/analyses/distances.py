"""Per-access reuse distances: the public wrapper around the stack-distance kernel.

Result conventions (also the schema of ``--distances-out``):

- distances are in tokens of KV cache (x kv_bytes_per_token for bytes);
- a first access is a cold miss with distance ``COLD`` (int64 max) in arrays and
  ``inf`` in tables;
- access ``t`` hits an LRU of capacity ``C`` iff ``dist[t] <= C`` (any-block hit) and
  is a usable-prefix hit iff ``usable[t] <= C``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import polars as pl

from kvtrace.errors import UsageError
from kvtrace.kernels.stackdist import COLD, StackState, stack_distances_chunk
from kvtrace.trace import Trace, request_chunks

EVICTIONS = ("prefix-aware", "flat")
_CHUNK_ACCESSES = 1 << 20


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


def reuse_distances(
    trace: Trace,
    eviction: str = "prefix-aware",
    *,
    details: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> Distances:
    """Exact byte-LRU reuse distances of every access of ``trace``.

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
    a = trace.accesses
    return _distances_of(a.block, trace.block_size, a.req_start, ev, details=details, progress=progress)


def _distances_of(block, size, req_start, ev, *, details=False, progress=None) -> Distances:
    size = np.ascontiguousarray(size, dtype=np.int64)
    req_start = np.ascontiguousarray(req_start, dtype=np.int64)
    n = block.shape[0]
    passes = [(size, True)]
    if details:  # the depth in blocks is the same distance with unit sizes
        passes.append((np.ones_like(size), False))
    outputs = []
    for p, (sizes, main) in enumerate(passes):
        state = StackState(sizes.shape[0])
        dist = np.empty(n, dtype=np.int64)
        prev = np.empty(n if (details and main) else 0, dtype=np.int64)
        usable = np.empty(n if main else 0, dtype=np.int64)
        for r, r_end, lo, hi in request_chunks(req_start, _CHUNK_ACCESSES):
            stack_distances_chunk(
                block[lo:hi], sizes, req_start[r:r_end + 1] - lo, r, ev == "prefix-aware",
                *state.arrays(), dist[lo:hi], prev[lo:hi] if prev.shape[0] else prev,
                usable[lo:hi] if usable.shape[0] else usable,
            )
            if progress is not None:
                progress(p * n + hi, n * len(passes))
        outputs.append((dist, prev, usable))
    dist, prev, usable = outputs[0]
    dist_blocks = outputs[1][0] if details else None
    return Distances(ev, dist, usable, dist_blocks, prev if details else None)


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
