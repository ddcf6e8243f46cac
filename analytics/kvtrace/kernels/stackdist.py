"""Byte-weighted LRU stack distances (Olken's method over a compacted time axis).

Conventions
-----------
- Sizes and distances are in **tokens** (bytes = tokens x kv_bytes_per_token, so a
  distance computed once serves every model).
- ``dist[t]`` is the byte depth of the accessed block ``b`` in the LRU recency stack:
  ``size[b]`` + the sizes of the distinct other blocks touched more recently than
  ``b``'s previous touch. A first access is a cold miss: ``dist = COLD`` (int64 max,
  "infinity").
- An LRU cache of capacity ``C`` tokens hits access ``t`` iff ``dist[t] <= C``. A block
  larger than ``C`` is never cached; it still passes through the stack (for
  ``C >= max(size)`` this is exactly an ordinary byte-LRU).
- The depth in blocks (1 = the most recent block) is the same distance with every
  size set to 1: :func:`stack_distances` computes it that way when asked.
- Two models. *flat*: a sequential LRU over the chain-order access stream.
  *prefix-aware* (request-atomic): all accesses of a request are answered against the
  stack as the request found it, then its blocks are touched tail-first so that the
  prompt's first block ends up most recent (the cache stays prefix-closed).

Method
------
Olken's method with a shallow sum tree: the size of each block sits at the "slot" of
its latest touch, and the depth of ``b`` is the sum of sizes after its slot. A 64-ary
tree of partial sums (levels of 64-slot, 4096-slot, ... blocks) makes a touch O(log64 K)
writes (a Fenwick tree needs log2 K scattered ones; moving a block is the hot path) and
a sum O(64 log64 K) contiguous reads, each level summed from whichever end of its block
is nearer. Slots are handed out in touch order; when they run out, live slots are
renumbered in order and the sums rebuilt in O(K), so memory stays O(distinct blocks)
whatever the number of accesses. Time O(N log M). A live block's size is read from
its slot (no per-block size lookup but for first touches) and no slot -> block table is
kept: a compaction renumbers through each block's slot instead.

Prompts reuse whole runs of blocks that were touched together, so consecutive queries
usually land on neighbouring slots. The kernel keeps the last prefix sum and walks the
few slots between it and the next query instead of descending the tree again (the
cached sum is kept exact under every update), which makes a chained reuse O(1) to
query.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT, NJIT_INLINE
from kvtrace.kernels.memory import table_full, table_zeros
from kvtrace.kernels.prefetch import prefetch_row

COLD = np.iinfo(np.int64).max

# Indices into the small scalar-state array: next free slot, live total, and the
# cached prefix sum (slot, tokens) of the last query.
NEXT_SLOT, TOTAL, CACHE_SLOT, CACHE_SUM = 0, 1, 2, 3
# Fan-out of the sum tree.
SHIFT = 6
FAN = 1 << SHIFT
# Widest gap between two queried slots that is walked slot by slot rather than
# answered from the tree.
WALK = 16
#: Accesses ahead whose per-block slot entry a query prefetches.
AHEAD = 16


def tree_layout(n_blocks: int):
    """The slots (about two per block, a multiple of the fan-out) and the start of each
    tree level >= 1 in the tree table, then its end (``offsets``) for ``n_blocks``
    blocks; level 0 is the per-slot sizes."""
    slots = ((2 * int(n_blocks) + 64 + FAN - 1) >> SHIFT) << SHIFT
    offsets = [0]
    n, total = slots, 0
    while n > FAN:
        n = (n + FAN - 1) >> SHIFT
        offsets.append(total)
        total += n
    offsets.append(total)  # end of the top level
    return slots, np.array(offsets, dtype=np.int64)


class StackState:
    """Kernel state carried across chunks of one stream (O(distinct blocks)).

    Parameters
    ----------
    n_blocks : int
        Number of distinct blocks M (dense ids 0..M-1).
    slot_blocks : bool
        Keep ``slot_block`` as the block at each slot (-1: free), for kernels that read
        it (:mod:`kvtrace.kernels.shards`); the stack-distance kernel keeps none and uses
        the array as its compaction's scratch (:func:`compact_by_block`), never filled.
    """

    def __init__(self, n_blocks: int, slot_blocks: bool = False) -> None:
        slots, offsets = tree_layout(n_blocks)
        # tables read at random: huge pages where large (kvtrace.kernels.memory); the
        # per-slot and per-block tables int32 where every slot number fits (half the
        # bytes in the cache; the sums in ``tree`` stay int64)
        small = np.int32 if slots < (1 << 31) else np.int64
        self.tree = table_zeros(max(int(offsets[-1]), 1), np.int64)
        self.offsets = offsets
        self.slot_block = table_full(slots, -1, small) if slot_blocks else table_zeros(slots, small)
        self.slot_size = table_zeros(slots, small)  # size at a live slot, 0 when free (sizes < 2**31)
        self.last_slot = table_full(int(n_blocks), -1, small)
        self.last_request = table_full(int(n_blocks), -1, np.int64)
        self.scalars = np.zeros(4, dtype=np.int64)
        self.scalars[CACHE_SLOT] = -1

    def arrays(self):
        return self.tree, self.offsets, self.slot_block, self.slot_size, self.last_slot, self.last_request, self.scalars


@njit(**NJIT)
def prefix_of(tree, offsets, slot_size, slot, total):
    """Sum of sizes over slots 0..slot (inclusive)."""
    n_levels = offsets.shape[0] - 1  # levels 1..n_levels-1 live in ``tree``
    # level 0: the slot's 64-block, from the nearer end
    lo = slot & ~(FAN - 1)
    hi = min(lo + FAN, slot_size.shape[0])
    acc = 0
    if slot - lo < FAN // 2 or n_levels == 1:
        for u in range(lo, slot + 1):
            acc += slot_size[u]
    else:
        acc = tree[offsets[1] + (slot >> SHIFT)]
        for u in range(slot + 1, hi):
            acc -= slot_size[u]
    i = slot >> SHIFT
    for level in range(1, n_levels):
        base = offsets[level]
        length = offsets[level + 1] - base
        lo = i & ~(FAN - 1)
        hi = min(lo + FAN, length)
        if level + 1 < n_levels:
            if i - lo <= FAN // 2:
                for u in range(lo, i):
                    acc += tree[base + u]
            else:
                acc += tree[offsets[level + 1] + (i >> SHIFT)]
                for u in range(i, hi):
                    acc -= tree[base + u]
        else:  # top level: its total is the live total
            if i <= length // 2:
                for u in range(0, i):
                    acc += tree[base + u]
            else:
                acc += total
                for u in range(i, length):
                    acc -= tree[base + u]
        i >>= SHIFT
    return acc


@njit(**NJIT_INLINE)
def walk_prefix(tree, offsets, slot_size, slot, total, cache_slot, cache_sum):
    """:func:`prefix_of` at ``slot`` from the last query's prefix sum (``cache_sum`` at
    ``cache_slot``; -1: none) when the two slots are at most :data:`WALK` apart (the
    slots between them walked), else from the tree. :func:`stack_distances_chunk`'s hot
    loop writes the same steps out: it runs slower calling this, even inlined."""
    if cache_slot >= 0 and cache_slot - WALK <= slot <= cache_slot + WALK:
        acc = cache_sum
        if slot > cache_slot:
            for u in range(cache_slot + 1, slot + 1):
                acc += slot_size[u]
        else:
            for u in range(slot + 1, cache_slot + 1):
                acc -= slot_size[u]
        return acc
    return prefix_of(tree, offsets, slot_size, slot, total)


@njit(**NJIT)
def rebuild_sums(tree, offsets, slot_size, live):
    """Recompute every tree level from the sizes of slots ``0..live - 1`` (the slots
    after them empty), in O(live)."""
    tree[:] = 0
    if offsets.shape[0] > 2:
        base = offsets[1]
        for s in range(live):
            tree[base + (s >> SHIFT)] += slot_size[s]
        for level in range(2, offsets.shape[0] - 1):
            below = offsets[level - 1]
            for u in range(offsets[level] - below):
                tree[offsets[level] + (u >> SHIFT)] += tree[below + u]


@njit(**NJIT)
def compact_slots(tree, offsets, slot_block, slot_size, slot_time, last_slot, scalars):
    """Renumber live slots 0..live-1 in touch order and rebuild the sums in O(K).

    ``slot_time`` (touch time per slot, or an empty array) moves with its slot."""
    live = 0
    timed = slot_time.shape[0] > 0
    for s in range(scalars[NEXT_SLOT]):
        b = slot_block[s]
        if b >= 0:
            v = slot_size[s]
            slot_block[s] = -1
            slot_size[s] = 0
            slot_block[live] = b
            slot_size[live] = v
            if timed:
                slot_time[live] = slot_time[s]
            last_slot[b] = live
            live += 1
    rebuild_sums(tree, offsets, slot_size, live)
    scalars[NEXT_SLOT] = live
    scalars[CACHE_SLOT] = -1


@njit(**NJIT)
def compact_by_block(tree, offsets, slot_size, last_slot, renumber, scalars):
    """:func:`compact_slots` for a stack that keeps no slot -> block table: live slots
    (size > 0: every block has >= 1 token) renumbered 0..live-1 in touch order through
    the scratch ``renumber`` (one entry per slot), each block's slot moved by a scan of
    ``last_slot``; the sums rebuilt. O(slots + blocks)."""
    live = 0
    for s in range(scalars[NEXT_SLOT]):
        v = slot_size[s]
        if v > 0:
            renumber[s] = live
            slot_size[s] = 0
            slot_size[live] = v
            live += 1
    for b in range(last_slot.shape[0]):
        s = last_slot[b]
        if s >= 0:
            last_slot[b] = renumber[s]
    rebuild_sums(tree, offsets, slot_size, live)
    scalars[NEXT_SLOT] = live
    scalars[CACHE_SLOT] = -1


@njit(**NJIT)
def stack_distances_chunk(
    block, size, req_start, first_request, prefix_aware,
    tree, offsets, slot_block, slot_size, last_slot, last_request, scalars,
    dist, prev_request, usable, open_past=False,
):
    """Process the requests of one chunk (``req_start``: local offsets into ``block``).

    ``first_request`` is the global index of the chunk's first request. Distances go
    to ``dist``; the request of each block's previous touch to ``prev_request`` and
    the usable-prefix distance (running max along the request) to ``usable`` (pass
    empty arrays to skip them). State arrays are updated in place (``slot_block`` is
    the compaction's scratch: :class:`StackState`).

    ``open_past``: the stream's past is not known (the later part of a trace cut in
    two, :mod:`kvtrace.kernels.stack_halves`): an access whose block the state has not
    seen gets ``dist = -1 - total``, the tokens of the distinct blocks this stream
    touched before it (what they add to the block's depth in the whole stack), instead
    of COLD; every other access gets its exact distance (its previous touch, and every
    touch since, are in this stream). ``usable`` and ``prev_request`` must then be
    empty (a first touch's distance is not known yet).

    The hot path (query and touch) is written out in this one loop, with the scalar
    state in local variables: this kernel runs once per block access of a trace.
    """
    n_req = req_start.shape[0] - 1
    want_prev = prev_request.shape[0] > 0
    want_usable = usable.shape[0] > 0
    n_slots = slot_size.shape[0]
    n_acc = block.shape[0]
    top = offsets.shape[0] - 1  # tree levels are 1..top-1
    next_slot = scalars[NEXT_SLOT]
    total = scalars[TOTAL]
    cache_slot = scalars[CACHE_SLOT]
    cache_sum = scalars[CACHE_SUM]
    for r in range(n_req):
        lo = req_start[r]
        hi = req_start[r + 1]
        g = first_request + r
        # In the prefix-aware model all queries of a request come first, then the
        # touches (tail-first); in the flat model each access queries then touches.
        n_phases = 2 if prefix_aware else 1
        running = 0
        for phase in range(n_phases):
            if prefix_aware:
                start, stop, step = (lo, hi, 1) if phase == 0 else (hi - 1, lo - 1, -1)
            else:
                start, stop, step = lo, hi, 1
            do_query = phase == 0
            do_touch = (not prefix_aware) or phase == 1
            for t in range(start, stop, step):
                if do_query and t + AHEAD < n_acc:  # the block read AHEAD accesses on: its slot's line
                    prefetch_row(last_slot, block[t + AHEAD])
                b = block[t]
                s = last_slot[b]
                # a live block's size sits at its slot, read next anyway (near the last query's
                # slot, mostly): the per-block size table is read for first touches only
                sz = slot_size[s] if s >= 0 else size[b]
                if do_query:
                    if s < 0:
                        dist[t] = -1 - total if open_past else COLD
                        running = COLD
                    else:
                        if cache_slot >= 0 and cache_slot - WALK <= s <= cache_slot + WALK:
                            acc = cache_sum
                            if s > cache_slot:
                                for u in range(cache_slot + 1, s + 1):
                                    acc += slot_size[u]
                            else:
                                for u in range(s + 1, cache_slot + 1):
                                    acc -= slot_size[u]
                        else:
                            acc = prefix_of(tree, offsets, slot_size, s, total)
                        cache_slot = s
                        cache_sum = acc
                        d = sz + total - acc
                        dist[t] = d
                        if d > running:
                            running = d
                    if want_usable:
                        usable[t] = running
                    if want_prev:
                        prev_request[t] = last_request[b]
                if do_touch:
                    if want_prev:
                        last_request[b] = g
                    if next_slot == n_slots:
                        scalars[NEXT_SLOT] = next_slot
                        compact_by_block(tree, offsets, slot_size, last_slot, slot_block, scalars)
                        next_slot = scalars[NEXT_SLOT]
                        cache_slot = -1
                        s = last_slot[b]
                    if s >= 0:
                        i = s
                        for level in range(1, top):
                            i >>= SHIFT
                            tree[offsets[level] + i] -= sz
                        slot_size[s] = 0
                        if s <= cache_slot:
                            cache_sum -= sz
                    else:
                        total += sz
                    # the new slot is above every live one: the cached prefix is unaffected
                    i = next_slot
                    for level in range(1, top):
                        i >>= SHIFT
                        tree[offsets[level] + i] += sz
                    slot_size[next_slot] = sz
                    last_slot[b] = next_slot
                    next_slot += 1
    scalars[NEXT_SLOT] = next_slot
    scalars[TOTAL] = total
    scalars[CACHE_SLOT] = cache_slot
    scalars[CACHE_SUM] = cache_sum


def _run(block, size, req_start, prefix_aware, want_prev):
    n = block.shape[0]
    state = StackState(size.shape[0])
    dist = np.empty(n, dtype=np.int64)
    prev = np.empty(n if want_prev else 0, dtype=np.int64)
    if req_start.shape[0] > 1:
        stack_distances_chunk(block, size, req_start, 0, bool(prefix_aware), *state.arrays(), dist, prev,
                              np.empty(0, dtype=np.int64))
    return dist, prev


def stack_distances(block, size, req_start, prefix_aware):
    """Stack distances of a whole stream in one call.

    Parameters
    ----------
    block : int64[N]
        Dense block id of each access, in trace order.
    size : int64[M]
        Tokens each block occupies in a cache (>= 1).
    req_start : int64[R+1]
        Request offsets: the accesses of request r are ``req_start[r]:req_start[r+1]``.
    prefix_aware : bool
        Request-atomic prefix-aware model (True) or flat sequential LRU (False).

    Returns
    -------
    dist : int64[N]
        Depth in tokens (COLD for a first access).
    dist_blocks : int64[N]
        Depth in blocks (COLD for a first access).
    prev_request : int64[N]
        Request of the block's previous touch (-1 for a first access).
    """
    block = np.ascontiguousarray(block, dtype=np.int64)
    size = np.ascontiguousarray(size, dtype=np.int64)
    req_start = np.ascontiguousarray(req_start, dtype=np.int64)
    dist, prev = _run(block, size, req_start, prefix_aware, True)
    dist_blocks, _ = _run(block, np.ones_like(size), req_start, prefix_aware, False)
    return dist, dist_blocks, prev


@njit(**NJIT)
def usable_distances(dist, req_start):
    """Running max of ``dist`` inside each request (usable-prefix distance).

    Block j of request r is a usable-prefix hit at capacity C iff every block
    0..j of r hits, i.e. ``max(dist[r, 0..j]) <= C``. COLD propagates.
    """
    out = np.empty_like(dist)
    usable_distances_into(dist, req_start, out)
    return out


@njit(**NJIT)
def usable_distances_into(dist, req_start, out):
    """:func:`usable_distances` written into ``out``."""
    for r in range(req_start.shape[0] - 1):
        running = 0
        for t in range(req_start[r], req_start[r + 1]):
            if dist[t] > running:
                running = dist[t]
            out[t] = running


@njit(**NJIT)
def half_prefix_keys_into(usable, tokens, req_start, out):
    """Each request's half-prefix key into ``out`` (one per request): the usable
    distance of the block at which the request's cumulative tokens first reach
    ``ceil(total / 2)``, COLD for a request without blocks
    (:func:`kvtrace.analyses.curve_pass.half_prefix_keys` states why)."""
    for r in range(req_start.shape[0] - 1):
        lo, hi = req_start[r], req_start[r + 1]
        out[r] = COLD
        total = 0
        for t in range(lo, hi):
            total += tokens[t]
        target = (total + 1) // 2
        c = 0
        for t in range(lo, hi):
            c += tokens[t]
            if c >= target:
                out[r] = usable[t]
                break
