"""SHARDS spatial sampling with exact heavy blocks, in one scan of the trace.

Plain SHARDS keeps a block iff a hash of it falls below the rate R and scales the
sampled stack distances by 1/R. LLM traces defeat it: a handful of blocks (the
system prompts) carry a large share of all accesses, so whether they land in the
sample swings the whole curve. Here

- *heavy* blocks (expected to be sampled at least once: accesses x R >= 1; at most
  ``MAX_HEAVY`` of them) are always tracked exactly, and every k-th of their accesses
  (k = round(1/R); systematic sampling from a start in 0..k-1 drawn by a hash of the
  block, so each access is evaluated with probability exactly 1/k) is evaluated with
  weight k;
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

The pass runs over chunks of whole requests (:class:`Sampler`), its state carried from
one to the next (the sum tree, the per-block touch records, and the block ids the exact
windows may reach back into: the last ``window + 1`` accesses before the chunk and the
first ``window`` of the request holding the first of them), so a trace streamed from
disk gives the in-memory result bit for bit, in memory O(tracked blocks).

Cost: one branch-free scan of the block column picks out the tracked accesses and
their blocks (:func:`tracked_accesses`); the stack work then runs over those alone
(about R of the accesses plus the heavy blocks'), with every per-block array indexed
by the block's rank among the tracked blocks (:func:`tracked_blocks`), so the hot loop
touches an array as long as the trace's block table only in the exact short windows.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from kvtrace.config import NJIT, NJIT_INLINE
from kvtrace.kernels.densify import mix_hash  # the same (hash, namespace) mix keys the sample
from kvtrace.kernels.stackdist import CACHE_SLOT, NEXT_SLOT, SHIFT, TOTAL, StackState, compact_slots, prefix_of

#: Most heavy blocks tracked exactly (each query scans them).
MAX_HEAVY = 64
#: Heavy blocks are counted among every this many accesses.
HEAVY_STEP = 32


@njit(**NJIT)
def strided_counts_into(counts, block, phase, step):
    """Add the accesses per block among accesses ``phase, phase + step, ...`` of
    ``block`` into ``counts`` (every ``step``-th access of a trace, chunk by chunk:
    finds the heavy blocks)."""
    for t in range(phase, block.shape[0], step):
        counts[block[t]] += 1


def heavy_from_counts(counts: np.ndarray, rate: float, step: int = 0) -> np.ndarray:
    """The heavy blocks (ascending) from strided counts: the at most ``MAX_HEAVY`` most
    counted among those whose count suggests accesses x R >= 1."""
    step = step or HEAVY_STEP
    need = max(1, int(np.ceil(1.0 / rate / step)))
    cand = np.flatnonzero(counts >= need)
    return np.sort(cand[np.argsort(-counts[cand].astype(np.int64), kind="stable")][:MAX_HEAVY]).astype(np.int64)


@njit(**NJIT)
def _heavy_phases(block_hash, block_tenant, heavy_blocks, stride):
    """Start of each heavy block's systematic sample, in 0..stride-1, from the low bits
    of its hash (the sample threshold reads the high ones)."""
    out = np.empty(heavy_blocks.shape[0], dtype=np.int64)
    for h in range(heavy_blocks.shape[0]):
        b = heavy_blocks[h]
        out[h] = np.int64(mix_hash(block_hash[b], block_tenant[b]) & np.uint64(0xFFFFFFFF)) % stride
    return out


@njit(**NJIT_INLINE)
def _popcount(x):
    """Set bits of a uint64 (SWAR; no table)."""
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return np.int64((x * np.uint64(0x0101010101010101)) >> np.uint64(56))


@njit(**NJIT_INLINE)
def _rank(words, cum, b):
    """Index of tracked block ``b`` among the tracked blocks (ascending block id)."""
    w = b >> 6
    below = (np.uint64(1) << np.uint64(b & 63)) - np.uint64(1)
    return cum[w] + _popcount(words[w] & below)


@njit(**NJIT)
def tracked_blocks(block_hash, block_tenant, heavy_blocks, threshold):
    """The tracked blocks: sampled (hash below ``threshold``) or heavy.

    Returns
    -------
    words : uint64[ceil(M / 64)]
        Membership bitmap (bit b of word b // 64); its little-endian bytes are the
        ``np.packbits(..., bitorder="little")`` bitmap :func:`tracked_accesses` reads.
    cum : int64[ceil(M / 64)]
        Tracked blocks in the words before each word (with ``words``, a rank structure:
        :func:`_rank` maps a tracked block to its dense index in O(1), from about 1.5
        bits per block that stay in cache, where a per-block code array would not).
    ids : int64[n]
        The tracked blocks, ascending (``ids[_rank(b)] == b``).
    """
    M = block_hash.shape[0]
    n_words = (M + 63) >> 6
    words = np.zeros(n_words, dtype=np.uint64)
    for w in range(n_words):
        acc = np.uint64(0)
        for i in range(w << 6, min(M, (w + 1) << 6)):
            keep = (mix_hash(block_hash[i], block_tenant[i]) >> np.uint64(40)) < threshold
            acc |= np.uint64(keep) << np.uint64(i & 63)
        words[w] = acc
    for h in range(heavy_blocks.shape[0]):
        b = heavy_blocks[h]
        words[b >> 6] |= np.uint64(1) << np.uint64(b & 63)
    cum = np.empty(n_words, dtype=np.int64)
    n = 0
    for w in range(n_words):
        cum[w] = n
        n += _popcount(words[w])
    ids = np.empty(n, dtype=np.int64)
    k = 0
    for w in range(n_words):
        x = words[w]
        while x != np.uint64(0):
            low = x & (~x + np.uint64(1))  # lowest set bit
            ids[k] = (w << 6) + _popcount(low - np.uint64(1))
            k += 1
            x ^= low
    return words, cum, ids


@njit(**NJIT)
def tracked_accesses(block, bitmap, lo, out_t, out_b):
    """Write the indices (ascending, plus ``lo``: the chunk's first access) of the
    accesses whose block is tracked (its bitmap bit set) to ``out_t[:n]`` and their
    blocks to ``out_b[:n]``; returns n.

    Branch-free: every access is stored and the count advances by the bit, so the scan
    runs at memory speed however the tracked accesses are spread (and the blocks need
    no second, scattered gather). The outputs have room for every access plus one;
    their pages past the last tracked access are never written (so never resident)."""
    n = 0
    for t in range(block.shape[0]):
        b = block[t]
        out_t[n] = lo + t
        out_b[n] = b
        n += (bitmap[b >> 3] >> (b & 7)) & 1
    return n


@njit(**NJIT)
def _distinct_tokens(block, base, tail, tail_lo, head, head_lo, size, lo1, hi1, lo2, hi2, exclude, table,
                     used):
    """Sum of sizes of the distinct blocks (other than ``exclude``) in two ranges of
    access indices; the block of access u is ``block[u - base]``, below ``base``
    ``tail[u - tail_lo]``, below ``tail_lo`` ``head[u - head_lo]``.

    ``table`` is scratch space (a power-of-two length > 2x the ranges' length), all -1
    when free; ``used`` (as long as the ranges) records the slots filled, which are
    reset before returning, so a call costs O(ranges' length)."""
    mask = table.shape[0] - 1
    total = 0
    n_used = 0
    for part in range(2):
        lo, hi = (lo1, hi1) if part == 0 else (lo2, hi2)
        for u in range(lo, hi):
            if u >= base:
                x = block[u - base]
            elif u >= tail_lo:
                x = tail[u - tail_lo]
            else:
                x = head[u - head_lo]
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
def _estimate(h_self, c, sz, p, heavy_last, heavy_size, tree, offsets, slot_size, slot_time, last_slot,
              scalars, inv_rate):
    """Estimated depth (float tokens) of a tracked block of ``sz`` tokens last touched at
    time ``p``: heavy block ``h_self``, or (``h_self`` < 0) sampled block ``c``."""
    heavy_term = 0
    for h in range(heavy_last.shape[0]):
        if h != h_self and heavy_last[h] > p:
            heavy_term += heavy_size[h]
    total = scalars[TOTAL]
    if h_self < 0:
        # the sampled blocks above c's own slot (its size is added exactly below)
        sampled_term = total - prefix_of(tree, offsets, slot_size, last_slot[c], total)
    else:
        lo = 0
        hi = scalars[NEXT_SLOT]
        while lo < hi:  # first slot touched after p
            mid = (lo + hi) >> 1
            if slot_time[mid] <= p:
                lo = mid + 1
            else:
                hi = mid
        sampled_term = total if lo == 0 else total - prefix_of(tree, offsets, slot_size, lo - 1, total)
    return np.float64(sz + heavy_term) + np.float64(sampled_term) * inv_rate


@njit(**NJIT_INLINE)
def _touch_sampled(t, r, c, sz, clock, last_time, last_at, last_req,
                   tree, offsets, slot_block, slot_size, slot_time, last_slot, scalars):
    """Touch sampled block ``c`` (its tracked index; ``sz`` tokens) at access ``t`` of
    request ``r``, time ``clock``. Heavy blocks are touched by the caller: three stores,
    kept out of this call because they are most of the touches."""
    if scalars[NEXT_SLOT] == slot_block.shape[0]:
        compact_slots(tree, offsets, slot_block, slot_size, slot_time, last_slot, scalars)
    s = last_slot[c]
    top = offsets.shape[0] - 1
    if s >= 0:
        i = s
        for level in range(1, top):
            i >>= SHIFT
            tree[offsets[level] + i] -= sz
        slot_block[s] = -1
        slot_size[s] = 0
    else:
        scalars[TOTAL] += sz
    new = scalars[NEXT_SLOT]
    i = new
    for level in range(1, top):
        i >>= SHIFT
        tree[offsets[level] + i] += sz
    slot_block[new] = c
    slot_size[new] = sz
    slot_time[new] = clock
    last_slot[c] = new
    last_time[c] = clock
    last_at[c] = t
    last_req[c] = r
    scalars[NEXT_SLOT] = new + 1


@njit(**NJIT)
def shards_chunk(block, base, tail, tail_lo, head, head_lo, size, req_start, r, tracked, tracked_block, prefix_aware, words, cum, tsize, theavy,
                 heavy_size, heavy_left, heavy_last, heavy_at, heavy_req, last_time, last_at, last_req, stride, rate,
                 window, table, used, clock_box, tree, offsets, slot_block, slot_size, slot_time, last_slot, scalars,
                 code, out_t, out_dist, out_weight, out_c, out_r):
    """Estimated distances of the evaluated accesses of one chunk of whole requests, in
    trace order; every state array is updated in place for the next chunk.

    Parameters
    ----------
    block, base : int[n], int
        Block ids of the chunk's accesses ``base..``.
    tail, tail_lo, head, head_lo : int[.], int, int[.], int
        Block ids of accesses ``tail_lo..base - 1`` (the ``window + 1`` before the
        chunk) and ``head_lo..`` (the first ``window`` of the request holding access
        ``tail_lo``): with the chunk, all that an exact window can read.
    req_start : int64[R + 1]
        Request offsets of the whole trace; ``r`` is the chunk's first request.
    tracked, tracked_block : int64[K], int[K]
        Indices (ascending, trace-wide) of the chunk's accesses of tracked (sampled or
        heavy) blocks, and their blocks (:func:`tracked_accesses`).
    words, cum : the tracked blocks' rank structure (:func:`tracked_blocks`)
    tsize : int64[n_tracked]
        Size of each tracked block (by tracked index), so that the hot loop reads only
        arrays of the tracked blocks.
    theavy : int64[n_tracked]
        Heavy index h of each tracked block, -1 for a sampled one.
    heavy_size, heavy_left, heavy_last, heavy_at, heavy_req : int64[H]
        Per heavy block: size, accesses until its next evaluated one, and its last
        touch (time, access index, request).
    last_time, last_at, last_req : int64[n_tracked]
        The last touch of each sampled block (by tracked index).
    stride : int
        Every ``stride``-th access of a heavy block is evaluated.
    rate : float
        Sampling rate R; evaluated accesses of sampled blocks get weight 1/R.
    window : int
        Reuse windows of at most this many accesses are measured exactly.
    table, used : scratch of :func:`_distinct_tokens`
    clock_box : int64[1]
        Touch counter.
    code : int64[>= K]
        Scratch: the tracked index of each tracked access.
    out_t, out_dist, out_weight, out_c, out_r : [>= K]
        Receive, in their first n entries, per evaluated access (trace order): its
        index, distance estimate in tokens (inf when cold), Horvitz-Thompson weight
        (1/R for a sampled block, ``stride`` for a heavy one), the tracked index of its
        block and its request. (Buffers kept from chunk to chunk: fresh memory for
        them cost each chunk a page fault per 4 KiB it touched.)

    Returns
    -------
    n : int
        Evaluated accesses.
    """
    inv_rate = 1.0 / rate
    heavy_w = np.float64(stride)
    K = tracked.shape[0]
    for e in range(K):
        code[e] = _rank(words, cum, tracked_block[e])
    clock = clock_box[0]
    k = 0
    i = 0
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
            c = code[e]
            h = theavy[c]  # heavy index, or -1 for a sampled block
            evaluate = True
            if h >= 0:  # every stride-th access, from the block's phase
                evaluate = heavy_left[h] == 0
                heavy_left[h] = stride - 1 if evaluate else heavy_left[h] - 1
            if evaluate:
                p = heavy_last[h] if h >= 0 else last_time[c]
                sz = tsize[c]
                out_t[k] = t
                out_c[k] = c
                out_r[k] = r
                out_weight[k] = heavy_w if h >= 0 else inv_rate
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
                        out_dist[k] = np.float64(sz + _distinct_tokens(block, base, tail, tail_lo, head, head_lo, size,
                                                                       lo1, hi1, lo2, hi2, tracked_block[e], table,
                                                                       used))
                    else:
                        out_dist[k] = _estimate(h, c, sz, p, heavy_last, heavy_size, tree, offsets,
                                                slot_size, slot_time, last_slot, scalars, inv_rate)
                k += 1
            if not prefix_aware:
                clock += 1
                if h >= 0:
                    heavy_last[h] = clock
                    heavy_at[h] = t
                    heavy_req[h] = r
                else:
                    _touch_sampled(t, r, c, tsize[c], clock, last_time, last_at, last_req, tree, offsets,
                                   slot_block, slot_size, slot_time, last_slot, scalars)
        if prefix_aware:  # tail-first
            for e in range(j - 1, i - 1, -1):
                t = tracked[e]
                c = code[e]
                clock += 1
                h = theavy[c]
                if h >= 0:
                    heavy_last[h] = clock
                    heavy_at[h] = t
                    heavy_req[h] = r
                else:
                    _touch_sampled(t, r, c, tsize[c], clock, last_time, last_at, last_req, tree, offsets,
                                   slot_block, slot_size, slot_time, last_slot, scalars)
        i = j
    clock_box[0] = clock
    scalars[CACHE_SLOT] = -1
    return k


@njit(**NJIT)
def usable_estimates(out_dist, out_r):
    """Running max of the estimates along each request (evaluated accesses only)."""
    u = np.empty_like(out_dist)
    prev_r = -1
    running = 0.0
    for i in range(out_dist.shape[0]):
        r = out_r[i]
        if r != prev_r:
            running = 0.0
            prev_r = r
        if out_dist[i] > running:
            running = out_dist[i]
        u[i] = running
    return u


class Sample(NamedTuple):
    """What a sampled run yields, per evaluated access (ascending access index)."""

    t: np.ndarray  # int64: access index
    dist: np.ndarray  # float64: distance estimate (tokens; inf = cold)
    usable: np.ndarray  # float64: usable-prefix estimate
    weight: np.ndarray  # float64: Horvitz-Thompson weight
    request: np.ndarray  # int64: the access's request
    block: np.ndarray  # int64: its block
    size: np.ndarray  # int64: its block's size (tokens)
    tracked_index: np.ndarray  # int64: its block's index among the tracked blocks
    heavy: np.ndarray  # bool: its block is heavy (tracked exactly, accesses sampled)


class Sampler:
    """The sampled pass over a trace, fed chunks of whole requests in order
    (:meth:`feed`); all state is O(tracked blocks) plus ``2 x window + 1`` block ids.

    Parameters
    ----------
    size : int[M]
        Block sizes (tokens).
    block_hash, block_tenant : per-block source hash and namespace (sampling key)
    heavy_blocks : int64[H]
        The heavy blocks (:func:`heavy_from_counts`), ascending.
    rate : float
        Sampling rate in (0, 1).
    prefix_aware : bool
    req_start : int64[R + 1]
        Request offsets of the whole trace.
    window : int, optional
        Reuse windows of at most this many accesses are measured exactly (default 4/R).
    """

    def __init__(self, size, block_hash, block_tenant, heavy_blocks, rate, prefix_aware, req_start,
                 window=None) -> None:
        self.size = np.ascontiguousarray(size, dtype=np.int64)
        self.req_start = req_start
        self.rate = float(rate)
        self.prefix_aware = bool(prefix_aware)
        self.window = int(window if window is not None else round(4.0 / rate))
        self.stride = max(1, int(round(1.0 / rate)))
        bh = np.ascontiguousarray(block_hash, dtype=np.uint64)
        bt = np.ascontiguousarray(block_tenant, dtype=np.int32)
        heavy = np.ascontiguousarray(heavy_blocks, dtype=np.int64)
        self.words, self.cum, self.ids = tracked_blocks(bh, bt, heavy, np.uint64(int(rate * (1 << 24) + 0.5)))
        self.bitmap = self.words.view(np.uint8)
        n = self.ids.shape[0]
        self.tsize = np.ascontiguousarray(self.size[self.ids], dtype=np.int64)
        self.theavy = np.full(n, -1, dtype=np.int64)
        self.theavy[np.searchsorted(self.ids, heavy)] = np.arange(heavy.shape[0])
        H = heavy.shape[0]
        self.heavy_size = np.ascontiguousarray(self.size[heavy], dtype=np.int64)
        self.heavy_left = _heavy_phases(bh, bt, heavy, self.stride)
        self.heavy_last = np.full(H, -1, dtype=np.int64)
        self.heavy_at = np.full(H, -1, dtype=np.int64)
        self.heavy_req = np.full(H, -1, dtype=np.int64)
        self.last_time = np.full(n, -1, dtype=np.int64)
        self.last_at = np.full(n, -1, dtype=np.int64)
        self.last_req = np.full(n, -1, dtype=np.int64)
        cap = 16
        while cap < 2 * self.window + 2:
            cap *= 2
        self.table = np.full(cap, -1, dtype=np.int64)
        self.used = np.empty(self.window + 1, dtype=np.int64)
        self.clock = np.zeros(1, dtype=np.int64)
        # the sum tree over the sampled blocks, slots indexed by tracked index
        self.state = StackState(n + 1, slot_blocks=True)
        self.slot_time = np.zeros(self.state.slot_block.shape[0], dtype=np.int64)
        # block ids an exact window of the next chunk may read: the accesses from
        # ``tail_lo`` to the chunk, and the first ``window`` of the request holding
        # access ``tail_lo``
        self.tail = self.head = None
        self.tail_lo = self.head_lo = 0
        self.head_req = -1
        self._buffers: dict = {}  # per-chunk scratch, kept for the next chunk

    def _buffer(self, name: str, n: int, dtype) -> np.ndarray:
        """A scratch array of at least ``n`` entries, the same memory chunk after chunk."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape[0] < n or buf.dtype != dtype:
            buf = self._buffers[name] = np.empty(max(n, 1), dtype=dtype)
        return buf

    def feed(self, block: np.ndarray, lo: int, r: int) -> Sample:
        """The evaluated accesses among ``block`` (accesses ``lo..``, whole requests from
        request ``r`` on; chunks in trace order)."""
        m = block.shape[0]
        scan_t = self._buffer("scan_t", m + 1, np.int64)
        scan_b = self._buffer("scan_b", m + 1, block.dtype)
        k = tracked_accesses(block, self.bitmap, lo, scan_t, scan_b)
        tracked, tracked_block = scan_t[:k], scan_b[:k]
        outs = [self._buffer(name, k, dt) for name, dt in (("code", np.int64), ("t", np.int64), ("dist", np.float64),
                                                           ("weight", np.float64), ("c", np.int64),
                                                           ("r", np.int64))]
        if self.tail is None:
            self.tail = np.empty(0, dtype=block.dtype)
            self.head = np.empty(0, dtype=block.dtype)
        tail = self.tail.astype(block.dtype, copy=False)
        head = self.head.astype(block.dtype, copy=False)
        st = self.state
        n = shards_chunk(
            block, lo, tail, self.tail_lo, head, self.head_lo, self.size, self.req_start, r, tracked, tracked_block,
            self.prefix_aware, self.words, self.cum, self.tsize, self.theavy, self.heavy_size, self.heavy_left,
            self.heavy_last, self.heavy_at, self.heavy_req, self.last_time, self.last_at, self.last_req, self.stride,
            self.rate, self.window, self.table, self.used, self.clock, st.tree, st.offsets, st.slot_block,
            st.slot_size, self.slot_time, st.last_slot, st.scalars, *outs)
        t, dist, weight, c, req = (x[:n].copy() for x in outs[1:])  # the buffers serve the next chunk
        del tracked, tracked_block

        def take(i, j):  # block ids of accesses i..j-1, all at or after tail_lo
            if i >= lo:
                return block[i - lo:j - lo]
            return np.concatenate([tail[i - self.tail_lo:], block[:max(0, j - lo)]])[:j - i]

        # what the next chunk's windows may read: the window + 1 accesses before it...
        end = lo + m
        new_lo = max(self.tail_lo, end - self.window - 1)
        new_tail = np.array(take(new_lo, end))
        # ... and the first window of the request holding the first of them
        q = int(np.searchsorted(self.req_start, new_lo, side="right")) - 1
        q_lo = int(self.req_start[q]) if q >= 0 else new_lo
        if q_lo >= new_lo:
            self.head, self.head_lo, self.head_req = np.empty(0, dtype=block.dtype), new_lo, -1
        elif q != self.head_req:  # it starts after the old tail's start: in tail or chunk
            self.head = np.array(take(q_lo, min(q_lo + self.window, end)))
            self.head_lo, self.head_req = q_lo, q
        self.tail, self.tail_lo = new_tail, new_lo
        usable = usable_estimates(dist, req)
        return Sample(t, dist, usable, weight, req, self.ids[c], self.tsize[c], c, self.theavy[c] >= 0)


def sample_distances(block, size, req_start, block_hash, block_tenant, rate, prefix_aware, window=None,
                     chunks=None) -> tuple[Sample, np.ndarray]:
    """The sampled pass over a whole in-memory trace (see the module docstring).

    Parameters
    ----------
    block, size, req_start : the trace's access arrays
    block_hash, block_tenant : per-block source hash and namespace (sampling key)
    rate : float
        Sampling rate in (0, 1).
    window : int, optional
        Reuse windows of at most this many accesses are measured exactly (default 4/R).
    chunks : sequence of int, optional
        Request indices at which to cut the pass into chunks (the result is the same).

    Returns
    -------
    (Sample, heavy_blocks)
    """
    counts = np.zeros(size.shape[0], dtype=np.uint32)
    strided_counts_into(counts, block, 0, HEAVY_STEP)
    heavy = heavy_from_counts(counts, rate)
    del counts
    sampler = Sampler(size, block_hash, block_tenant, heavy, rate, prefix_aware, req_start, window)
    R = req_start.shape[0] - 1
    cuts = sorted({0, R, *(int(c) for c in (chunks or ()) if 0 < int(c) < R)})
    parts = []
    for r0, r1 in zip(cuts[:-1], cuts[1:]):
        lo, hi = int(req_start[r0]), int(req_start[r1])
        parts.append(sampler.feed(block[lo:hi], lo, r0))
    if not parts:
        empty_i, empty_f = np.empty(0, np.int64), np.empty(0, np.float64)
        return Sample(empty_i, empty_f, empty_f, empty_f, empty_i, empty_i, empty_i, empty_i,
                      np.empty(0, dtype=bool)), heavy
    return Sample(*(np.concatenate([p[i] for p in parts]) for i in range(len(Sample._fields)))), heavy
