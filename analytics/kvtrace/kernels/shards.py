"""SHARDS spatial sampling with exact heavy blocks, in one scan of the trace.

Plain SHARDS keeps a block iff a hash of it falls below the rate R and scales the
sampled stack distances by 1/R. LLM traces defeat it: a handful of blocks (the
system prompts) carry a large share of all accesses, so whether they land in the
sample swings the whole curve. Here

- *heavy* blocks (expected to be sampled at least once: accesses x R >= 1; at most
  ``MAX_HEAVY`` of them) are always tracked exactly, and every k-th of their accesses
  (k = round(1/R), systematic sampling) is evaluated with weight accesses / evaluated;
- every other block is kept iff its hash falls below R, and all its accesses are
  evaluated with weight 1/R.

The distance estimate of an evaluated access of block ``b`` whose previous touch was
at time ``p`` is ``size[b]`` + the sizes of heavy blocks touched since ``p`` (exact) +
(the sizes of sampled blocks touched since ``p``) / R. Sampled blocks sit in the same
64-ary sum tree as the exact kernel, with touch times per slot so that a heavy block's
query ("everything touched after time p") is a binary search plus a suffix sum.

The estimate's resolution is about one block / R, which is too coarse for the short
reuses that small caches live on (a system prompt reused a few requests later). So
when the window since the previous touch holds at most ``window`` accesses (4 / R by
default), the distance is computed exactly instead, by summing the distinct blocks in
that window with a small hash set: at most ``window`` steps per evaluated access.

Both LRU models are supported; the prefix-aware one answers a request's queries
against the state it found, then touches its blocks tail-first.

Cost: one branch-free scan of the block column picks out the tracked accesses
(:func:`tracked_accesses`); the stack work then runs over those alone (about R of the
accesses plus the heavy blocks').
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..config import NJIT, NJIT_INLINE
from .densify import _mix  # the same (hash, namespace) mix keys the sample
from .stackdist import _CACHE_SLOT, _NEXT_SLOT, _SHIFT, _TOTAL, StackState, _compact, _prefix

#: Most heavy blocks tracked exactly (each query scans them).
MAX_HEAVY = 64
#: Per-block code: >= 0 the block's index among the sampled blocks, SKIPPED, or
#: HEAVY0 - h for heavy block h (h = 0..H-1).
SKIPPED, HEAVY0 = -1, -2


@njit(**NJIT)
def _strided_counts(block, n_blocks, step):
    """Accesses per block among every ``step``-th access (finds the heavy blocks)."""
    counts = np.zeros(n_blocks, dtype=np.uint32)
    for t in range(0, block.shape[0], step):
        counts[block[t]] += 1
    return counts


@njit(**NJIT)
def tracked_accesses(block, bitmap, out):
    """Write the indices (ascending) of the accesses whose block is tracked (its bitmap
    bit set) to ``out[:n]``; returns n.

    Branch-free: every index is stored and the count advances by the bit, so the scan
    runs at memory speed however the tracked accesses are spread. ``out`` has room for
    every access plus one; its pages past the last tracked index are never written
    (so never resident)."""
    n = 0
    for t in range(block.shape[0]):
        b = block[t]
        out[n] = t
        n += (bitmap[b >> 3] >> (b & 7)) & 1
    return n


@njit(**NJIT)
def _codes(block_hash, block_tenant, heavy_blocks, threshold):
    """Per-block code (see ``SKIPPED``/``HEAVY0``) and the number of sampled blocks."""
    code = np.empty(block_hash.shape[0], dtype=np.int32)
    n = 0
    for i in range(block_hash.shape[0]):
        if (_mix(block_hash[i], block_tenant[i]) >> np.uint64(40)) < threshold:
            code[i] = n
            n += 1
        else:
            code[i] = SKIPPED
    for h in range(heavy_blocks.shape[0]):
        code[heavy_blocks[h]] = HEAVY0 - h
    return code, n


@njit(**NJIT)
def _distinct_tokens(block, size, lo1, hi1, lo2, hi2, exclude, table, used):
    """Sum of sizes of the distinct blocks (other than ``exclude``) in two index ranges.

    ``table`` is scratch space (a power-of-two length > 2x the ranges' length), all -1
    when free; ``used`` (as long as the ranges) records the slots filled, which are
    reset before returning, so a call costs O(ranges' length)."""
    mask = table.shape[0] - 1
    total = 0
    n_used = 0
    for part in range(2):
        lo, hi = (lo1, hi1) if part == 0 else (lo2, hi2)
        for u in range(lo, hi):
            x = block[u]
            if x == exclude:
                continue
            j = (x * 0x9E3779B1) & mask
            while table[j] != -1 and table[j] != x:
                j = (j + 1) & mask
            if table[j] == -1:
                table[j] = x
                used[n_used] = j
                n_used += 1
                total += size[x]
    for i in range(n_used):
        table[used[i]] = -1
    return total


@njit(**NJIT)
def _estimate(b, p, code, heavy_last, heavy_size, size, tree, offsets, slot_size, slot_time, last_slot,
              scalars, inv_rate):
    """Estimated depth of block ``b`` last touched at time ``p`` (float tokens)."""
    h_self = HEAVY0 - code[b]  # < 0 for a sampled block
    heavy_term = 0
    for h in range(heavy_last.shape[0]):
        if h != h_self and heavy_last[h] > p:
            heavy_term += heavy_size[h]
    total = scalars[_TOTAL]
    if h_self < 0:
        # the sampled blocks above b's own slot (b's size is added exactly below)
        sampled_term = total - _prefix(tree, offsets, slot_size, last_slot[code[b]], total)
    else:
        lo = 0
        hi = scalars[_NEXT_SLOT]
        while lo < hi:  # first slot touched after p
            mid = (lo + hi) >> 1
            if slot_time[mid] <= p:
                lo = mid + 1
            else:
                hi = mid
        sampled_term = total if lo == 0 else total - _prefix(tree, offsets, slot_size, lo - 1, total)
    return np.float64(size[b] + heavy_term) + np.float64(sampled_term) * inv_rate


@njit(**NJIT_INLINE)
def _touch_sampled(t, r, b, c, clock, size, last_time, last_at, last_req,
                   tree, offsets, slot_block, slot_size, slot_time, last_slot, scalars):
    """Touch sampled block ``b`` (sampled index ``c``) at access ``t`` of request ``r``,
    time ``clock``. Heavy blocks are touched by the caller: three stores, kept out of
    this call because they are most of the touches."""
    if scalars[_NEXT_SLOT] == slot_block.shape[0]:
        _compact(tree, offsets, slot_block, slot_size, slot_time, last_slot, scalars)
    sz = size[b]
    s = last_slot[c]
    top = offsets.shape[0] - 1
    if s >= 0:
        i = s
        for level in range(1, top):
            i >>= _SHIFT
            tree[offsets[level] + i] -= sz
        slot_block[s] = -1
        slot_size[s] = 0
    else:
        scalars[_TOTAL] += sz
    new = scalars[_NEXT_SLOT]
    i = new
    for level in range(1, top):
        i >>= _SHIFT
        tree[offsets[level] + i] += sz
    slot_block[new] = c
    slot_size[new] = sz
    slot_time[new] = clock
    last_slot[c] = new
    last_time[c] = clock
    last_at[c] = t
    last_req[c] = r
    scalars[_NEXT_SLOT] = new + 1


@njit(**NJIT)
def shards_distances(block, size, req_start, tracked, tracked_block, prefix_aware, code, heavy_size, stride, rate,
                     window, tree, offsets, slot_block, slot_size, slot_time, last_slot, scalars):
    """Estimated distances of the evaluated accesses, in trace order.

    Parameters
    ----------
    tracked, tracked_block : int64[K]
        Ascending indices of the accesses of tracked (sampled or heavy) blocks, and
        their blocks (:func:`tracked_accesses`); the others are never looked at again
        (but for the exact short windows).
    code : int32[M]
        Per-block code: index among sampled blocks (>= 0), ``SKIPPED``, or
        ``HEAVY0 - h`` for heavy block h.
    stride : int
        Every ``stride``-th access of a heavy block is evaluated.
    rate : float
        Sampling rate R; evaluated accesses of sampled blocks get weight 1/R.
    window : int
        Reuse windows of at most this many accesses are measured exactly.

    Returns
    -------
    out_t : int64[n]
        Evaluated access indices (ascending).
    out_dist : float64[n]
        Distance estimates in tokens (inf when cold).
    out_weight : float64[n]
        Horvitz-Thompson weights: 1/R for a sampled block, accesses / evaluated for a
        heavy block (known at the end of the pass).
    """
    inv_rate = 1.0 / rate
    n_heavy = heavy_size.shape[0]
    heavy_seen = np.zeros(n_heavy, dtype=np.int64)
    heavy_left = np.zeros(n_heavy, dtype=np.int64)  # accesses until the next evaluated one
    heavy_last = np.full(n_heavy, -1, dtype=np.int64)
    heavy_at = np.full(n_heavy, -1, dtype=np.int64)  # access index of the last touch
    heavy_req = np.full(n_heavy, -1, dtype=np.int64)  # its request
    last_time = np.full(last_slot.shape[0], -1, dtype=np.int64)  # per sampled block
    last_at = np.full(last_slot.shape[0], -1, dtype=np.int64)
    last_req = np.full(last_slot.shape[0], -1, dtype=np.int64)
    cap = 16
    while cap < 2 * window + 2:
        cap *= 2
    table = np.full(cap, -1, dtype=np.int64)
    used = np.empty(window + 1, dtype=np.int64)
    K = tracked.shape[0]
    # at most K evaluated accesses: pages past the last one written are never touched
    out_t = np.empty(K, dtype=np.int64)
    out_dist = np.empty(K, dtype=np.float64)
    out_weight = np.empty(K, dtype=np.float64)  # heavy: -(h + 1) until the pass ends
    clock = 0
    k = 0
    i = 0
    r = 0
    while i < K:
        while req_start[r + 1] <= tracked[i]:
            r += 1
        lo = req_start[r]
        end = req_start[r + 1]
        j = i  # the request's tracked accesses are tracked[i:j]
        while j < K and tracked[j] < end:
            j += 1
        for e in range(i, j):
            t = tracked[e]
            b = tracked_block[e]
            c = code[b]
            h = HEAVY0 - c  # heavy index, or < 0 for a sampled block (c = its index)
            evaluate = True
            if h >= 0:  # every stride-th access, from the first
                evaluate = heavy_left[h] == 0
                heavy_left[h] = stride - 1 if evaluate else heavy_left[h] - 1
                heavy_seen[h] += 1
            if evaluate:
                p = heavy_last[h] if h >= 0 else last_time[c]
                out_t[k] = t
                out_weight[k] = -(h + 1.0) if h >= 0 else inv_rate
                if p < 0:
                    out_dist[k] = np.inf
                else:
                    pt = heavy_at[h] if h >= 0 else last_at[c]
                    if prefix_aware:
                        # after b in its last request (earlier positions, touched later),
                        # then every request since
                        pr = heavy_req[h] if h >= 0 else last_req[c]
                        lo1, hi1, lo2, hi2 = req_start[pr], pt, req_start[pr + 1], lo
                    else:
                        lo1, hi1, lo2, hi2 = pt + 1, t, 0, 0
                    if (hi1 - lo1) + (hi2 - lo2) <= window:
                        out_dist[k] = np.float64(size[b] + _distinct_tokens(block, size, lo1, hi1, lo2, hi2,
                                                                            b, table, used))
                    else:
                        out_dist[k] = _estimate(b, p, code, heavy_last, heavy_size, size, tree, offsets,
                                                slot_size, slot_time, last_slot, scalars, inv_rate)
                k += 1
            if not prefix_aware:
                clock += 1
                if h >= 0:
                    heavy_last[h] = clock
                    heavy_at[h] = t
                    heavy_req[h] = r
                else:
                    _touch_sampled(t, r, b, c, clock, size, last_time, last_at, last_req, tree, offsets,
                                   slot_block, slot_size, slot_time, last_slot, scalars)
        if prefix_aware:  # tail-first
            for e in range(j - 1, i - 1, -1):
                t = tracked[e]
                b = tracked_block[e]
                c = code[b]
                clock += 1
                h = HEAVY0 - c
                if h >= 0:
                    heavy_last[h] = clock
                    heavy_at[h] = t
                    heavy_req[h] = r
                else:
                    _touch_sampled(t, r, b, c, clock, size, last_time, last_at, last_req, tree, offsets,
                                   slot_block, slot_size, slot_time, last_slot, scalars)
        i = j
    scalars[_CACHE_SLOT] = -1
    # heavy weights: accesses / evaluated (every stride-th of them)
    heavy_w = np.empty(n_heavy, dtype=np.float64)
    for h in range(n_heavy):
        heavy_w[h] = heavy_seen[h] / max(1, (heavy_seen[h] + stride - 1) // stride)
    for e in range(k):
        if out_weight[e] < 0:
            out_weight[e] = heavy_w[np.int64(-out_weight[e]) - 1]
    return out_t[:k], out_dist[:k], out_weight[:k]


@njit(**NJIT)
def usable_estimates(out_t, out_dist, request):
    """Running max of the estimates along each request (evaluated accesses only)."""
    u = np.empty_like(out_dist)
    prev_r = -1
    running = 0.0
    for i in range(out_t.shape[0]):
        r = request[out_t[i]]
        if r != prev_r:
            running = 0.0
            prev_r = r
        if out_dist[i] > running:
            running = out_dist[i]
        u[i] = running
    return u


def sample_distances(block, size, req_start, request, block_hash, block_tenant, rate, prefix_aware,
                     window=None):
    """Run the sampled kernel; see the module docstring.

    Parameters
    ----------
    block, size, req_start, request : the trace's access arrays
    block_hash, block_tenant : per-block source hash and namespace (sampling key)
    rate : float
        Sampling rate in (0, 1).
    window : int, optional
        Reuse windows of at most this many accesses are measured exactly (default 4/R).

    Returns
    -------
    t : int64[n]  evaluated access indices (ascending)
    dist : float64[n]  distance estimates (tokens; inf = cold)
    usable : float64[n]  usable-prefix estimates
    weight : float64[n]  Horvitz-Thompson weights
    heavy_blocks : int64[H]
    code : int32[M]  per-block code (sampled index, SKIPPED, or HEAVY0 - h)
    """
    M = size.shape[0]
    # Heavy blocks are found from every 8th access: a block with >= 1/R accesses in
    # all shows about 1/(8R) of them there (the estimator stays unbiased whichever
    # blocks are chosen; the choice only moves variance).
    step = 8
    counts = _strided_counts(block, M, step)
    need = max(1, int(np.ceil(1.0 / rate / step)))
    cand = np.flatnonzero(counts >= need)
    heavy_blocks = np.sort(cand[np.argsort(-counts[cand].astype(np.int64), kind="stable")][:MAX_HEAVY])
    code, n_sampled_blocks = _codes(np.ascontiguousarray(block_hash, dtype=np.uint64),
                                    np.ascontiguousarray(block_tenant, dtype=np.int32),
                                    heavy_blocks.astype(np.int64), np.uint64(int(rate * (1 << 24) + 0.5)))
    del counts
    bitmap = np.packbits(code != SKIPPED, bitorder="little")
    stride = max(1, int(round(1.0 / rate)))
    out = np.empty(block.shape[0] + 1, dtype=np.int64)
    tracked = out[:tracked_accesses(block, bitmap, out)]
    tracked_block = block[tracked].astype(np.int64)
    state = StackState(n_sampled_blocks + 1)
    slot_time = np.zeros(state.slot_block.shape[0], dtype=np.int64)
    out_t, out_dist, out_w = shards_distances(
        block, size, req_start, tracked, tracked_block, prefix_aware, code, size[heavy_blocks].astype(np.int64), stride,
        float(rate), int(window if window is not None else round(4.0 / rate)), state.tree, state.offsets,
        state.slot_block, state.slot_size, slot_time, state.last_slot, state.scalars)
    usable = usable_estimates(out_t, out_dist, request)
    return out_t, out_dist, usable, out_w, heavy_blocks, code
