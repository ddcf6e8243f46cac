"""Prefix families of ``kvtrace value``: the shared root of a trace and each block's
family below it (module docstring of :mod:`kvtrace.analyses.value`)."""

from __future__ import annotations

import numpy as np

from kvtrace.analyses.curves import SHARED_FIRST_BLOCK_SHARE, dominant_block
from kvtrace.trace.source import TraceSource


class BlockIds:
    """The dense block id of accesses of a source at given positions, read by one pass
    over its chunks (``ids[index]``, ``index`` int64 ascending): what
    :func:`shared_root` reads of a source, a few leading positions per request."""

    def __init__(self, source: TraceSource) -> None:
        self.source = source

    def __getitem__(self, index: np.ndarray) -> np.ndarray:
        index = np.asarray(index, dtype=np.int64)
        out = np.empty(index.shape[0], dtype=np.int64)
        if index.shape[0] == 0:
            return out
        assert (index[1:] >= index[:-1]).all(), "positions must be ascending"
        for ch in self.source.chunks(layout=False, block_dtype=None):
            a, b = np.searchsorted(index, [ch.lo, ch.hi])
            out[a:b] = ch.block[index[a:b] - ch.lo]
            if b == index.shape[0]:
                break
        return out


def shared_root(req_start: np.ndarray, block: np.ndarray) -> tuple[np.ndarray, float | None]:
    """The shared root of a trace (module docstring) and the share of requests carrying it.

    Parameters
    ----------
    req_start : int[R + 1]
        Request offsets into the access table.
    block : int[N] array, or :class:`BlockIds` of a source
        Dense block id of every access; only the requests' leading positions are read
        (ascending).

    Returns
    -------
    root : int64[k]
        Dense ids of the blocks at positions 0 .. k - 1; empty (k = 0) when no block
        reaches :data:`kvtrace.analyses.curves.SHARED_FIRST_BLOCK_SHARE` at position 0.
    request_share : float or None
        Share of the non-empty requests whose first k blocks are the root (requests
        shorter than k blocks do not carry it); None when k = 0.

    Each position costs a gather (with :class:`BlockIds`, a pass over the chunks) and an
    O(n) selection over the requests longer than it.
    """
    assert SHARED_FIRST_BLOCK_SHARE > 0.5  # dominant_block is exact above one half
    rs = np.asarray(req_start, dtype=np.int64)
    length = np.diff(rs)
    nonempty = np.flatnonzero(length > 0)
    start, length = rs[:-1][nonempty], length[nonempty]
    carries = np.ones(nonempty.shape[0], dtype=bool)
    reach = np.arange(nonempty.shape[0])  # the non-empty requests longer than p blocks
    root: list[int] = []
    while reach.shape[0]:
        p = len(root)
        at = np.asarray(block[start[reach] + p]).astype(np.int64, copy=False)
        candidate, share = dominant_block(at)
        if share < SHARED_FIRST_BLOCK_SHARE:
            break
        same = at == candidate
        root.append(candidate)
        carries[reach[~same]] = False
        reach = reach[length[reach] > p + 1]
    if not root:
        return np.empty(0, dtype=np.int64), None
    carries &= length >= len(root)
    return np.array(root, dtype=np.int64), float(np.count_nonzero(carries)) / carries.shape[0]


def family_roots(first_request: np.ndarray, req_start: np.ndarray, block: np.ndarray, root: np.ndarray,
                 dtype=np.int64, chunk: int = 1 << 22, ids: np.ndarray | None = None) -> np.ndarray:
    """Each block's prefix family (the per-block ``root_block``; module docstring).

    Parameters
    ----------
    first_request : int[M]
        The request in which each dense block first appears.
    req_start : int[R + 1]
        Request offsets into the access table.
    block : int[N] array or memory map
        Dense block id of every access.
    root : int64[k]
        The shared root (:func:`shared_root`).
    dtype : numpy dtype
        Of the result (int64, or int32 for a trace with fewer than 2**31 blocks).
    ids : int64[M'], optional
        The blocks ``first_request`` describes (default: all, ``0 .. M - 1``); with
        them ``req_start`` and ``block`` may be those of a chunk of whole requests
        holding the blocks' first requests (``first_request`` then local to it).

    Returns
    -------
    ``dtype[M]``: the block at position k of each block's first request, or
    ``root[0]`` for the shared family. Made ``chunk`` blocks at a time (a few
    chunk-size temporaries).
    """
    M, k = first_request.shape[0], root.shape[0]
    out = np.empty(M, dtype=dtype)
    for lo in range(0, M, chunk):
        r = first_request[lo:lo + chunk].astype(np.int64)
        start = req_start[r]
        if k == 0:
            out[lo:lo + r.shape[0]] = block[start]
            continue
        family = np.full(r.shape[0], root[0], dtype=np.int64)
        longer = req_start[r + 1] - start > k
        family[longer] = block[start[longer] + k]
        family[np.isin(family, root)] = root[0]  # a position-k block of the shared root (repeated hashes)
        out[lo:lo + r.shape[0]] = family
    if k:
        if ids is None:
            out[root] = root[0]
        else:
            out[np.isin(ids, root)] = root[0]
    return out

