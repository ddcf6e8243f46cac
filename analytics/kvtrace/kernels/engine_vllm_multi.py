"""vLLM v1's prefix cache at many pool sizes in one pass (``--cache-rules vllm``).

Equal, request by request, to one :func:`kvtrace.kernels.engine_vllm.replay_chunk`
replay per pool size (the tests compare them), for every pool of at least as many
blocks as the trace's longest request (no request is rejected or cut) under the rule
sets whose freed hashless blocks go to the free queue's head (or that hash every
block); smaller pools and other rule sets replay one pool at a time.

Why one pass suffices
---------------------
Order a pool's cached copies by the time the free queue last received them (allocation
pops the oldest, a hit takes a copy out and it returns on top; a request's blocks
return tail first, so its first block is newest). A trace block's newest copy always
carries the time of its last access, whatever the pool size (a hit re-stamps the copy
it touches, a miss caches a new one), and every other copy of it is older. Copies leave
oldest first, so at every pool size the cached ids are the ones most recently accessed:
with ``D(x)`` = the number of distinct hashable ids accessed since ``x`` (one LRU stack
distance, shared by every pool), ``x`` is cached in pool ``P`` iff ``D(x) < K_P``,
``K_P`` = how many ids pool ``P`` holds. What depends on ``P`` is ``K_P``: a pool of
``P`` slots holds ``K_P`` newest copies, its *ghosts* (older copies of an id that has a
newer one; they only take room) and, during a request, the blocks it allocates without
a hash. Per request and pool, with ``h`` hits and ``a = n - h`` allocated blocks:

- an id accessed but not hit while cached (the capped last block, or a block after a
  missing one) gets a new copy; its previous copy stays where it was as a ghost;
- a hit takes the id's *first* copy (the oldest inserted, vLLM's lookup): if that is a
  ghost (the id was copied again since it was last hit), it moves to the top and the
  id's previous newest copy is left behind as the ghost instead;
- ``max(0, T + a - P)`` of the pool's ``T`` entries (ids and ghosts) are evicted,
  oldest first, merging the least recent ids with the oldest ghosts: a ghost is older
  than the id of rank ``k`` iff at least ``k + 1`` ids were accessed after the time it
  carries (a count the shared stack answers).

Only ghosts are per pool (heaps ordered by their time, and per id the ghosts its next
hit may take); the stack and the per-access distances are computed once. Cost
O(N log M) for the stack, O(n log n) per request of n blocks to sort its distances,
O(log n) per request and pool, O(log G) per ghost event (G ghosts in a pool), against
O(N) per pool for separate replays.

State
-----
:class:`MultiState` holds the stack (the tree of :class:`kvtrace.kernels.stackdist.StackState`
over slots in touch order, each live slot one hashable id; int32 and int8 tables), per
id the index of its ghost lists (ids that ever had a ghost), per pool ``K``, its ghost
count, a min-heap of its ghosts by time and the count of ids accessed after its oldest
tracked ghost (kept up to date request by request, asked of the stack only when the
oldest ghost changes), and the ghost records. A dead record leaves its heap when it
surfaces at the top or at the next compaction, and its number is then reused (a free
list): records in use stay within the ghosts alive plus those heaps' dead entries; a
ghost's time is its key (:data:`SUB_BITS`): the slot its copy vacated, or after a
compaction the gap between two live slots and its rank there, so ghosts keep their
exact order through any number of compactions without a per-id clock.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT
from kvtrace.kernels.engine_vllm import FULL_BLOCKS_ONLY, HASHLESS_FIRST, LAST_TOKEN_CAP
from kvtrace.kernels.memory import table_full, table_zeros
from kvtrace.kernels.stackdist import (CACHE_SLOT, CACHE_SUM, COLD, NEXT_SLOT, SHIFT, TOTAL, WALK, prefix_of,
                                       rebuild_sums, tree_layout)

# counters (int64[N_CT]): ghost records handed out (the high-water mark), ids with a ghost record, most
# entries on one heap, records free for reuse (on the free list), ghosts made in all
CT_REC, CT_FLAG, CT_HEAP, CT_FREE, CT_MADE = 0, 1, 2, 3, 4
N_CT = 5
# a ghost's place in time (its heap key): ((slot + 1) << SUB_BITS) | sub. ``sub`` 0: at ``slot``, the
# vacated slot of the copy it was; ``sub`` i >= 1: after live slot ``slot``, the i-th of the ghosts
# there (a compaction renumbers the slots and puts the ghosts of a gap in their order)
SUB_BITS = 24
# status of a call: every request done, more room needed (the caller grows and calls again), a request
# holding one id twice (the caller replays pool by pool instead)
DONE, GROW, REPEATED_ID = 0, 1, 2
# record flags
ALIVE, PENDING = 1, 2
NO_HITS = np.empty(0, dtype=np.int32)


def multi_capable(rules: int) -> bool:
    """Whether :func:`multi_chunk` implements ``rules``: hashless blocks are freed to
    the queue's head, or no block is hashless."""
    return bool(rules & HASHLESS_FIRST) or not rules & FULL_BLOCKS_ONLY


def state_bytes(n_ids: int) -> int:
    """Bytes of a :class:`MultiState` over ``n_ids`` ids, ghosts aside: the stack
    (an int8 table over ~2 slots per id and an int32 scratch for compactions, each id's
    slot) and each id's ghost index."""
    return (2 * (4 + 1) + 4 + 4) * int(n_ids)


class MultiState:
    """The state of a multi-pool pass over a trace of ``n_ids`` ids at pool sizes
    ``pools`` (each at least the longest request)."""

    def __init__(self, n_ids: int, pools) -> None:
        # the stack of kvtrace.kernels.stackdist.StackState, int32 tables (every count fits)
        slots, self.offsets = tree_layout(n_ids)
        self.tree = table_zeros(max(int(self.offsets[-1]), 1), np.int32)
        self.renumber = np.empty(slots, dtype=np.int32)  # a compaction's new slot numbers (scratch)
        self.slot_size = table_zeros(slots, np.int8)  # 1 at a live slot
        # each id's slot, with a mark bit above every slot number for the ids that have ghost lists
        self.last_slot = table_full(int(n_ids), -1, np.int32 if slots < (1 << 30) else np.int64)
        self.scalars = np.zeros(4, dtype=np.int64)
        self.scalars[CACHE_SLOT] = -1
        self.cidx = table_full(int(n_ids), -1, np.int32)
        self.pools = np.ascontiguousarray(pools, dtype=np.int64)
        k = self.pools.shape[0]
        self.k_ids = np.zeros(k, dtype=np.int64)  # K: ids cached per pool
        self.n_ghost = np.zeros(k, dtype=np.int64)  # live ghosts per pool
        self.top_rec = np.full(k, -1, dtype=np.int64)  # the ghost whose count l_top is
        self.l_top = np.zeros(k, dtype=np.int64)  # ids accessed after top_rec's time
        self.counters = np.zeros(N_CT, dtype=np.int64)
        self._alloc(heap=64, rec=256, flag=64)

    def _alloc(self, heap: int, rec: int, flag: int) -> None:
        k = self.pools.shape[0]
        self.heap = np.zeros((k, heap), dtype=np.int64)
        self.heap_n = np.zeros(k, dtype=np.int64)
        self.rec_key = np.zeros(rec, dtype=np.int64)
        self.rec_id = np.zeros(rec, dtype=np.int64)
        self.rec_next = np.zeros(rec, dtype=np.int64)
        self.rec_flags = np.zeros(rec, dtype=np.int8)
        self.free_rec = np.zeros(rec, dtype=np.int64)
        self.pend_head = np.full((k, flag), -1, dtype=np.int64)
        self.pend_tail = np.full((k, flag), -1, dtype=np.int64)

    def grow(self, n: int) -> None:
        """Room for one more request of ``n`` blocks (called after :data:`GROW`)."""
        k = self.pools.shape[0]
        need_heap = int(self.counters[CT_HEAP]) + n + 1
        need_rec = int(self.counters[CT_REC]) + 2 * k * n + 1
        need_flag = int(self.counters[CT_FLAG]) + n + 1
        if need_heap > self.heap.shape[1]:
            heap = np.zeros((k, max(need_heap, 2 * self.heap.shape[1])), dtype=np.int64)
            heap[:, :self.heap.shape[1]] = self.heap
            self.heap = heap
        if need_rec > self.rec_key.shape[0]:
            m = max(need_rec, 2 * self.rec_key.shape[0])
            for name in ("rec_key", "rec_id", "rec_next", "rec_flags", "free_rec"):
                old = getattr(self, name)
                new = np.zeros(m, dtype=old.dtype)
                new[:old.shape[0]] = old
                setattr(self, name, new)
        if need_flag > self.pend_head.shape[1]:
            m = max(need_flag, 2 * self.pend_head.shape[1])
            for name in ("pend_head", "pend_tail"):
                old = getattr(self, name)
                new = np.full((k, m), -1, dtype=np.int64)
                new[:, :old.shape[1]] = old
                setattr(self, name, new)

    def arrays(self):
        return (self.tree, self.offsets, self.renumber, self.slot_size, self.last_slot, self.scalars, self.cidx,
                self.pools, self.k_ids, self.n_ghost, self.top_rec, self.l_top, self.counters, self.heap, self.heap_n,
                self.rec_key, self.rec_id, self.rec_next, self.rec_flags, self.free_rec, self.pend_head,
                self.pend_tail)


@njit(**NJIT)
def _heap_push(heap, heap_n, p, rec, rec_key):
    """Push record ``rec`` on pool ``p``'s min-heap of ghost times."""
    i = heap_n[p]
    st = rec_key[rec]
    while i > 0:
        q = (i - 1) >> 1
        if rec_key[heap[p, q]] <= st:
            break
        heap[p, i] = heap[p, q]
        i = q
    heap[p, i] = rec
    heap_n[p] += 1


@njit(**NJIT)
def _heap_pop(heap, heap_n, p, rec_key):
    """Remove the top of pool ``p``'s heap."""
    n = heap_n[p] - 1
    heap_n[p] = n
    last = heap[p, n]
    st = rec_key[last]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and rec_key[heap[p, c + 1]] < rec_key[heap[p, c]]:
            c += 1
        if st <= rec_key[heap[p, c]]:
            break
        heap[p, i] = heap[p, c]
        i = c
    heap[p, i] = last


@njit(**NJIT)
def _newer(tree, offsets, slot_size, slot, total):
    """Live ids touched after ``slot`` in the stack's slot order (``slot`` may be -1)."""
    if slot < 0:
        return total
    return total - prefix_of(tree, offsets, slot_size, slot, total)


@njit(**NJIT)
def _compact(tree, offsets, slot_size, last_slot, renumber, scalars, mark):
    """:func:`kvtrace.kernels.stackdist.compact_slots` without a slot -> id table: live
    slots (size 1) are numbered 0.. in order, each id's slot follows (keeping its
    ``mark`` bit), and the sums are rebuilt, in O(slots + ids)."""
    live = 0
    for s in range(scalars[NEXT_SLOT]):
        if slot_size[s]:
            renumber[s] = live
            live += 1
    for b in range(last_slot.shape[0]):
        v = last_slot[b]
        if v >= 0:
            last_slot[b] = renumber[v & (mark - 1)] | (v & mark)
    slot_size[:live] = 1
    slot_size[live:scalars[NEXT_SLOT]] = 0
    rebuild_sums(tree, offsets, slot_size, live)
    scalars[NEXT_SLOT] = live
    scalars[CACHE_SLOT] = -1


@njit(**NJIT)
def _new_record(counters, free_rec):
    """A ghost record: one freed earlier, else the next never used."""
    counters[CT_MADE] += 1
    if counters[CT_FREE] > 0:
        counters[CT_FREE] -= 1
        return free_rec[counters[CT_FREE]]
    g = counters[CT_REC]
    counters[CT_REC] += 1
    return g


@njit(**NJIT)
def _drop_record(g, k, counters, free_rec, top_rec):
    """Free record ``g``, off pool ``k``'s heap (dead): its number may serve a new ghost,
    so pool ``k`` stops tracking it."""
    free_rec[counters[CT_FREE]] = g
    counters[CT_FREE] += 1
    if top_rec[k] == g:
        top_rec[k] = -1


@njit(**NJIT)
def _renumber_ghosts(tree, offsets, slot_size, total, heap, heap_n, rec_key, rec_flags, counters, free_rec, top_rec):
    """Before the stack compacts (live slots renumbered 0.. in order): every live ghost
    moves to the gap after the last live slot before it, the ghosts of one gap keeping
    their order; each pool's heap is rebuilt sorted (dead records freed)."""
    for k in range(heap.shape[0]):
        n = 0
        for i in range(heap_n[k]):
            g = heap[k, i]
            if rec_flags[g] & ALIVE:
                heap[k, n] = g
                n += 1
            else:
                _drop_record(g, k, counters, free_rec, top_rec)
        keys = np.empty(n, dtype=np.int64)
        for i in range(n):
            keys[i] = rec_key[heap[k, i]]
        order = np.argsort(keys)
        recs = heap[k, :n].copy()
        prev = -2
        sub = 0
        for i in range(n):
            g = recs[order[i]]
            slot = (rec_key[g] >> SUB_BITS) - 1
            gap = prefix_of(tree, offsets, slot_size, slot, total) - 1 if slot >= 0 else -1
            sub = sub + 1 if gap == prev else 1
            prev = gap
            rec_key[g] = ((gap + 1) << SUB_BITS) | sub
            heap[k, i] = g  # ascending keys: a heap
        heap_n[k] = n


@njit(**NJIT)
def _first_at_least(a, n, x):
    """The first index ``i < n`` with ``a[i] >= x`` in the ascending ``a`` (``n`` if none)."""
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(**NJIT)
def multi_chunk(block, tokens, lrs, block_tokens, rules,
                tree, offsets, renumber, slot_size, last_slot, scalars, cidx, pools, k_ids,
                n_ghost, top_rec, l_top, counters, heap, heap_n, rec_key, rec_id, rec_next, rec_flags,
                free_rec, pend_head, pend_tail, start, hit_blocks, unbounded):
    """Requests ``start..`` of one chunk (``lrs``: their offsets into ``block``/``tokens``)
    at every pool of the state (:meth:`MultiState.arrays`): ``hit_blocks[k, i]`` of pool
    k and the chunk's request i, and (when ``unbounded`` is not empty) ``unbounded[i]``,
    its hit at an unbounded pool (the leading blocks, within the cap, whose ids an
    earlier request accessed: nothing is ever evicted). Returns ``(status, next
    request)``: :data:`DONE`, or :data:`GROW` before a request the state has no room
    for (grow it and call again from there), or :data:`REPEATED_ID` (the state is then
    unusable)."""
    cap = (rules & LAST_TOKEN_CAP) != 0
    full_only = (rules & FULL_BLOCKS_ONLY) != 0
    K = pools.shape[0]
    n_slots = slot_size.shape[0]
    top = offsets.shape[0] - 1
    next_slot = scalars[NEXT_SLOT]
    total = scalars[TOTAL]
    cache_slot = scalars[CACHE_SLOT]
    cache_sum = scalars[CACHE_SUM]
    max_n = 0
    for r in range(start, lrs.shape[0] - 1):
        if lrs[r + 1] - lrs[r] > max_n:
            max_n = lrs[r + 1] - lrs[r]
    dq = np.empty(max_n, dtype=np.int64)  # per block of a request: distance (COLD: first access or no hash)
    hq = np.empty(max_n, dtype=np.bool_)  # hashable
    sq = np.empty(max_n, dtype=np.int64)  # slot before the request's touch
    case1 = np.empty(max_n, dtype=np.int64)
    cq = np.empty(max_n, dtype=np.int64)  # ghost index of each hit candidate's id
    mark = np.int64(1) << np.int64(30 if last_slot.itemsize == 4 else 62)  # above every slot number
    low = mark - 1
    pm = np.empty(max_n, dtype=np.int64)  # running maximum of the distances over the hit candidates
    ds = np.empty(max_n, dtype=np.int64)  # the distances, sorted
    status = DONE
    r = start
    while r < lrs.shape[0] - 1:
        lo, hi = lrs[r], lrs[r + 1]
        n = hi - lo
        if n == 0:
            for k in range(K):
                hit_blocks[k, r] = 0
            if unbounded.shape[0] > 0:
                unbounded[r] = 0
            r += 1
            continue
        if (counters[CT_HEAP] + n + 1 > heap.shape[1] or counters[CT_FLAG] + n + 1 > pend_head.shape[1]
                or rec_key.shape[0] - counters[CT_REC] + counters[CT_FREE] < 2 * K * n + 1):
            status = GROW
            break
        # 1. query every block against the stack as the request finds it; beside it the request's hit limit
        # (hit_limit), the running maximum of its distances, their sorted order and its ids with ghost lists
        nh = 0
        m = n  # full blocks only: up to the first partial one
        top_d = -1
        flagged = False  # a hit candidate whose id has ghost lists
        for j in range(n):
            t = lo + j
            b = block[t]
            hb = (not full_only) or tokens[t] == block_tokens
            if not hb and m == n:
                m = j
            hq[j] = hb
            raw = last_slot[b] if hb else -1
            s = raw & low if raw >= 0 else -1
            sq[j] = s
            if not hb:
                d = -1  # below every count: never new, never older than a ghost
            elif s < 0:
                d = COLD
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
                d = total - acc
            dq[j] = d
            if d > top_d:  # hits are the leading run of cached blocks: a prefix maximum below K
                top_d = d
            pm[j] = top_d
            if raw >= 0 and (raw & mark) != 0:
                cq[j] = cidx[b]
                flagged = True
            else:
                cq[j] = -1
            if n <= 32:  # insertion sort: most requests are short
                i = j
                while i > 0 and ds[i - 1] > d:
                    ds[i] = ds[i - 1]
                    i -= 1
                ds[i] = d
            if hb:
                nh += 1
        if n > 32:
            ds[:n] = np.sort(dq[:n])
        if cap:  # a block whose tokens end after the prompt's length - 1: the last one(s)
            after = 0
            j = n - 1
            while j >= 0 and after < 1:
                if j < m:
                    m = j
                after += tokens[lo + j]
                j -= 1
        # 2. touch tail first (the first block newest); compact first if the slots would run out
        if next_slot + nh > n_slots:
            _renumber_ghosts(tree, offsets, slot_size, total, heap, heap_n, rec_key, rec_flags, counters, free_rec,
                             top_rec)
            scalars[NEXT_SLOT] = next_slot
            _compact(tree, offsets, slot_size, last_slot, renumber, scalars, mark)
            next_slot = scalars[NEXT_SLOT]
            cache_slot = -1
            cache_sum = 0
            for j in range(n):
                if sq[j] >= 0:
                    sq[j] = last_slot[block[lo + j]] & low
        first_new = next_slot
        for j in range(n - 1, -1, -1):
            if not hq[j]:
                continue
            b = block[lo + j]
            raw = last_slot[b]
            s = raw & low if raw >= 0 else -1
            if s >= first_new:  # touched already by this request
                status = REPEATED_ID
                break
            if s >= 0:
                i = s
                for level in range(1, top):
                    i >>= SHIFT
                    tree[offsets[level] + i] -= 1
                slot_size[s] = 0
                if s <= cache_slot:
                    cache_sum -= 1
            else:
                total += 1
            i = next_slot
            for level in range(1, top):
                i >>= SHIFT
                tree[offsets[level] + i] += 1
            slot_size[next_slot] = 1
            last_slot[b] = next_slot | (raw & mark if raw >= 0 else 0)
            next_slot += 1
        if status == REPEATED_ID:
            break
        # 3. every pool, against its state before the request
        if unbounded.shape[0] > 0:
            unbounded[r] = _first_at_least(pm, m, COLD)
        hp = dp = 0  # the searches below walk forward while the pools' id counts grow (pools ascending)
        last_kk = -1
        for k in range(K):
            P = pools[k]
            kk = k_ids[k]
            tr = top_rec[k]
            lt = l_top[k]
            track = tr >= 0 and (rec_flags[tr] & ALIVE) != 0
            if kk >= last_kk:
                while hp < m and pm[hp] < kk:
                    hp += 1
                while dp < n and ds[dp] < kk:
                    dp += 1
            else:
                hp = _first_at_least(pm, m, kk)
                dp = _first_at_least(ds, n, kk)
            last_kk = kk
            h = hp
            new_ids = n - dp  # hashable blocks not cached (none of them hit)
            n1 = nh - h - new_ids  # cached but not hit
            if n1 > 0:
                n1 = 0
                for j in range(h, n):
                    if hq[j] and dq[j] < kk:
                        case1[n1] = j
                        n1 += 1
            grew = n - _first_at_least(ds, n, lt) if track else 0  # ids moving above the tracked ghost
            if track:
                l_top[k] = lt + grew
            hit_blocks[k, r] = h
            T = kk + n_ghost[k]
            a = n - h
            # a hit whose id was copied again since its last hit: its first copy (a ghost) moves up
            for j in range(h if flagged else 0):
                b = block[lo + j]
                c = cq[j]
                if c >= 0 and pend_head[k, c] >= 0:
                    g = pend_head[k, c]
                    rec_flags[g] = 0  # the touched ghost: gone (its heap entry drops at the top)
                    n_ghost[k] -= 1
                    g = rec_next[g]
                    while g >= 0:  # the id's other ghosts can no longer be touched
                        rec_flags[g] &= ~PENDING
                        g = rec_next[g]
                    pend_head[k, c] = -1
                    pend_tail[k, c] = -1
                    g = _new_record(counters, free_rec)
                    rec_key[g], rec_id[g], rec_next[g], rec_flags[g] = (sq[j] + 1) << SUB_BITS, b, -1, ALIVE
                    _heap_push(heap, heap_n, k, g, rec_key)
                    n_ghost[k] += 1
            # an id cached but not hit: its previous newest copy becomes a ghost
            for q in range(n1):
                j = case1[q]
                b = block[lo + j]
                c = cidx[b]
                if c < 0:
                    c = counters[CT_FLAG]
                    counters[CT_FLAG] += 1
                    cidx[b] = c
                    last_slot[b] |= mark  # its next queries see it has ghost lists, without reading cidx
                g = _new_record(counters, free_rec)
                rec_key[g], rec_id[g], rec_next[g], rec_flags[g] = (sq[j] + 1) << SUB_BITS, b, -1, ALIVE | PENDING
                if pend_tail[k, c] >= 0:
                    rec_next[pend_tail[k, c]] = g
                else:
                    pend_head[k, c] = g
                pend_tail[k, c] = g
                _heap_push(heap, heap_n, k, g, rec_key)
                n_ghost[k] += 1
            if heap_n[k] > counters[CT_HEAP]:
                counters[CT_HEAP] = heap_n[k]
            kk += new_ids
            # 4. evict the oldest entries: the least recent ids merged with the oldest ghosts
            x = T + a - P
            while x > 0:
                while heap_n[k] > 0 and (rec_flags[heap[k, 0]] & ALIVE) == 0:
                    _drop_record(heap[k, 0], k, counters, free_rec, top_rec)
                    _heap_pop(heap, heap_n, k, rec_key)
                if heap_n[k] == 0:
                    kk -= x
                    break
                g = heap[k, 0]
                if g != top_rec[k] or not track:
                    l_top[k] = _newer(tree, offsets, slot_size, (rec_key[g] >> SUB_BITS) - 1, total)
                    top_rec[k] = g
                    track = True
                older = kk - l_top[k]  # ids older than the ghost
                if older >= x:
                    kk -= x
                    break
                kk -= older
                x -= older + 1
                rec_flags[g] &= ~ALIVE
                n_ghost[k] -= 1
                if rec_flags[g] & PENDING:
                    c = cidx[rec_id[g]]
                    pend_head[k, c] = rec_next[g]
                    if rec_next[g] < 0:
                        pend_tail[k, c] = -1
                rec_flags[g] = 0
                _heap_pop(heap, heap_n, k, rec_key)
                _drop_record(g, k, counters, free_rec, top_rec)
                track = False
            k_ids[k] = kk
        r += 1
    scalars[NEXT_SLOT] = next_slot
    scalars[TOTAL] = total
    scalars[CACHE_SLOT] = cache_slot
    scalars[CACHE_SUM] = cache_sum
    return status, r


def replay_multi(block, tokens, req_start, n_ids: int, pools, block_tokens: int, rules: int):
    """Hit blocks ``int32[K, R]`` of every request at every pool size in ``pools`` (each
    at least the longest request), in one pass; ``None`` when a request holds one id
    twice (replay pool by pool then). The tests' entry point."""
    block = np.ascontiguousarray(block, dtype=np.int64)
    tokens = np.ascontiguousarray(tokens, dtype=np.int64)
    lrs = np.ascontiguousarray(req_start, dtype=np.int64)
    state = MultiState(n_ids, pools)
    hit = np.zeros((len(state.pools), lrs.shape[0] - 1), dtype=np.int32)
    r = 0
    while True:
        status, r = multi_chunk(block, tokens, lrs, int(block_tokens), int(rules), *state.arrays(), r, hit, NO_HITS)
        if status == DONE:
            return hit
        if status == REPEATED_ID:
            return None
        state.grow(int(lrs[r + 1] - lrs[r]))
