"""vLLM v1's prefix cache, replayed exactly at one pool size per run (``--cache-rules vllm``).

The engine's rules break the stack property (a recomputed block is cached as a second
copy, requests larger than the pool are rejected), so there is no one-pass curve: each
capacity is its own event replay, O(1) per block. The slow twin is
``tests/naive_vllm.py``; this docstring states what both implement.

Pool and free queue
-------------------
A pool of ``P`` usable blocks (vLLM's ``num_gpu_blocks`` minus its null block), all free
at the start, each free block on one doubly linked *free queue* (``FreeKVCacheBlockQueue``:
allocation pops its head, the least recently freed). A block may carry the hash of the
trace block it holds (here the dense block id); the hash map keeps, per id, its cached
copies in insertion order (``cached_block_hash_to_block``: no de-duplication; a lookup
returns the first copy).

A request (sequential: each is allocated, cached and freed before the next)
-------------------------------------------------------------------------
With ``n`` blocks and ``T`` prompt tokens (block j holds ``tokens[j]``, ``B`` for every
block but possibly the last):

1. *Hit*: ``h`` = the longest run of leading blocks whose id is cached, over at most
   ``m`` blocks: ``m = n``; with ``last_token_cap``, the blocks whose tokens end at or
   before token ``T - 1`` (``get_computed_blocks``: the hit is capped at ``T - 1``
   tokens); with ``full_blocks_only``, full blocks only (a partial block is never
   hashed). ``hit_tokens`` = the tokens of those ``h`` blocks (``num_cached_tokens``).
2. *Reject*: with ``reject_oversize`` and ``n > P`` the request is rejected: no hit, the
   cache unchanged. vLLM's scheduler itself never rejects such a request (it waits and
   blocks the queue forever); a deployment rejects it earlier, as a prompt longer than
   ``max_model_len``, which vLLM checks fits the pool at start-up. Without the rule only
   its first ``P`` blocks are allocated and cached (what a request-atomic LRU keeps of a
   request larger than the cache).
3. *Touch* the ``h`` hit copies (the first copy of each id): out of the free queue.
4. *Allocate* the other blocks from the free queue's head; a popped block that carries
   a hash leaves the hash map (``_maybe_evict_cached_block``).
5. *Cache* every newly allocated block that can be hashed (all of them without
   ``full_blocks_only``; else the full ones): its id is appended to that id's copies.
6. *Free* the request's blocks tail first (``free``: reversed order): each to the free
   queue's tail, except, with ``hashless_first``, the blocks without a hash, which go to
   its head as a group in that order (``prepend_n``: reused first). ``hashless_first`` is
   vLLM's order since #42656; without it every freed block goes to the tail (older
   versions).

With none of the rules (no cap, partial blocks cached, no rejection, every freed block
to the tail) the replay is kvtrace's ideal prefix-aware LRU of ``P`` equal blocks.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT

# rule flags (bits of ``rules``)
LAST_TOKEN_CAP, FULL_BLOCKS_ONLY, REJECT_OVERSIZE, HASHLESS_FIRST = 1, 2, 4, 8
ALL_RULES = LAST_TOKEN_CAP | FULL_BLOCKS_ONLY | REJECT_OVERSIZE | HASHLESS_FIRST
RULE_NAMES = {LAST_TOKEN_CAP: "last-token cap", FULL_BLOCKS_ONLY: "full blocks only",
              REJECT_OVERSIZE: "oversize rejection", HASHLESS_FIRST: "hashless blocks freed first"}


# state fields of one pool (int64[N_ST]): free queue head and tail
ST_HEAD, ST_TAIL = 0, 1
N_ST = 2


def new_state(pool: int, n_ids: int):
    """The state of an empty pool of ``pool`` blocks: ``(st, prv, nxt, held, cprv, cnxt,
    first_copy)`` (every block free, in order; nothing cached). The copies of an id form
    a ring through ``cprv``/``cnxt`` starting at ``first_copy`` (its oldest copy; the
    newest is ``cprv[first_copy]``). Each table as narrow as its values allow: block
    indices (``prv``, ``nxt``, ``cprv``, ``cnxt``, ``first_copy``) in int8 / int16 /
    int32 for small pools, ids (``held``) in int32 (the replay's random reads then touch
    a half, a quarter or an eighth of the memory), else int64."""
    P = int(pool)
    idt = np.int32 if int(n_ids) < np.iinfo(np.int32).max else np.int64
    sdt = next(t for t in (np.int8, np.int16, np.int32, np.int64) if P < np.iinfo(t).max)
    prv = np.arange(-1, P - 1, dtype=sdt)
    nxt = np.arange(1, P + 1, dtype=sdt)
    if P:
        nxt[-1] = -1
    st = np.array([0 if P else -1, P - 1], dtype=np.int64)
    return (st, prv, nxt, np.full(P, -1, dtype=idt), np.full(P, -1, dtype=sdt), np.full(P, -1, dtype=sdt),
            np.full(int(n_ids), -1, dtype=sdt))


@njit(**NJIT)
def hit_limit(tokens, lo, hi, block_tokens, cap, full_only):
    """How many leading blocks of the request at ``lo..hi - 1`` a hit may cover: with
    ``cap`` those whose tokens end at or before the prompt's length - 1
    (``get_computed_blocks``), with ``full_only`` full blocks only (a partial block is
    never hashed). Shared by every vLLM replay."""
    total = 0
    for t in range(lo, hi):
        total += tokens[t]
    m = 0
    end = 0
    while lo + m < hi:
        t = lo + m
        end += tokens[t]
        if cap and end > total - 1:
            break
        if full_only and tokens[t] != block_tokens:
            break
        m += 1
    return m


@njit(**NJIT)
def replay_chunk(block, tokens, lrs, pool, block_tokens, rules, st, prv, nxt, held, cprv, cnxt, first_copy,
                 slots, hit_blocks, rejected):
    """Replay the requests of one chunk (``lrs``: their offsets into ``block``/``tokens``)
    through one pool whose state the arrays hold (:func:`new_state`), updating it in
    place: ``hit_blocks[i]`` and ``rejected[i]`` of the chunk's request i. Feeding the
    chunks of a trace in order equals one call over the whole trace."""
    cap = (rules & LAST_TOKEN_CAP) != 0
    full_only = (rules & FULL_BLOCKS_ONLY) != 0
    reject = (rules & REJECT_OVERSIZE) != 0
    hashless_first = (rules & HASHLESS_FIRST) != 0
    P = pool
    head, tail = st[ST_HEAD], st[ST_TAIL]
    for r in range(lrs.shape[0] - 1):
        lo, hi = lrs[r], lrs[r + 1]
        n = hi - lo
        hit_blocks[r] = 0
        rejected[r] = False
        if n == 0:
            continue
        if n > P and reject:
            rejected[r] = True
            continue
        total = 0
        for t in range(lo, hi):
            total += tokens[t]
        # 1. the hit, capped (hit_limit's walk, stopping at the first block not cached)
        h = 0
        end = 0
        while h < n:
            t = lo + h
            end += tokens[t]
            if cap and end > total - 1:
                break
            if full_only and tokens[t] != block_tokens:
                break
            if first_copy[block[t]] < 0:
                break
            h += 1
        hit_blocks[r] = h
        nb = n if n <= P else P
        # 3. touch: the first copy of each hit id leaves the free queue
        for j in range(h):
            s = first_copy[block[lo + j]]
            slots[j] = s
            a, b = prv[s], nxt[s]
            if a >= 0:
                nxt[a] = b
            else:
                head = b
            if b >= 0:
                prv[b] = a
            else:
                tail = a
        # 4. allocate from the head, evicting what a popped block holds; 5. cache
        for j in range(h, nb):
            s = head
            head = nxt[s]
            if head >= 0:
                prv[head] = -1
            else:
                tail = -1
            old = held[s]
            if old >= 0:  # out of its id's ring of copies
                a, b = cprv[s], cnxt[s]
                if a == s:
                    first_copy[old] = -1
                else:
                    cnxt[a] = b
                    cprv[b] = a
                    if first_copy[old] == s:
                        first_copy[old] = b
                held[s] = -1
            slots[j] = s
            t = lo + j
            if not full_only or tokens[t] == block_tokens:  # the newest copy: last in the ring
                bid = block[t]
                held[s] = bid
                f = first_copy[bid]
                if f < 0:
                    first_copy[bid] = s
                    cprv[s] = s
                    cnxt[s] = s
                else:
                    a = cprv[f]
                    cnxt[a] = s
                    cprv[s] = a
                    cnxt[s] = f
                    cprv[f] = s
        # 6. free tail first (hashless blocks to the head, as a group in that order)
        ins = -1
        for j in range(nb - 1, -1, -1):
            s = slots[j]
            if hashless_first and held[s] < 0:
                b = head if ins < 0 else nxt[ins]  # after the group's previous block
                prv[s] = ins
                nxt[s] = b
                if ins >= 0:
                    nxt[ins] = s
                else:
                    head = s
                if b >= 0:
                    prv[b] = s
                else:
                    tail = s
                ins = s
            else:
                nxt[s] = -1
                prv[s] = tail
                if tail >= 0:
                    nxt[tail] = s
                else:
                    head = s
                tail = s
    st[ST_HEAD], st[ST_TAIL] = head, tail


def replay_vllm(block, tokens, req_start, n_ids: int, pools, block_tokens: int, rules: int = ALL_RULES):
    """Replay a whole trace (in memory) once per pool size: ``(hit_blocks int32[K, R],
    rejected bool[K, R])``; the reference entry point of the tests."""
    block = np.ascontiguousarray(block, dtype=np.int64)
    tokens = np.ascontiguousarray(tokens, dtype=np.int64)
    lrs = np.ascontiguousarray(req_start, dtype=np.int64)
    R = lrs.shape[0] - 1
    pools = [int(p) for p in np.asarray(pools).ravel()]
    hit = np.zeros((len(pools), R), dtype=np.int32)
    rej = np.zeros((len(pools), R), dtype=np.bool_)
    for k, P in enumerate(pools):
        state = new_state(P, n_ids)
        replay_chunk(block, tokens, lrs, P, int(block_tokens), int(rules), *state, np.empty(max(P, 1), np.int64),
                     hit[k], rej[k])
    return hit, rej


# --------------------------------------------------------------------------- requests in flight
@njit(**NJIT)
def due_push(ht, hr, n, t, r):
    """Push request ``r`` ending at ``t`` on the min-heap ``ht``/``hr`` of ``n`` running
    requests ordered by (end time, request index: admission order under first come,
    first served); returns the new size. Shared by the engines' in-flight replays."""
    i = n
    while i > 0:
        p = (i - 1) >> 1
        if ht[p] < t or (ht[p] == t and hr[p] < r):
            break
        ht[i], hr[i] = ht[p], hr[p]
        i = p
    ht[i], hr[i] = t, r
    return n + 1


@njit(**NJIT)
def due_pop(ht, hr, n):
    """Remove the heap's first (earliest end, then lowest index) request, read before
    from ``ht[0]``/``hr[0]``; returns the new size."""
    n -= 1
    t, r = ht[n], hr[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (ht[c + 1] < ht[c] or (ht[c + 1] == ht[c] and hr[c + 1] < hr[c])):
            c += 1
        if t < ht[c] or (t == ht[c] and r < hr[c]):
            break
        ht[i], hr[i] = ht[c], hr[c]
        i = c
    ht[i], hr[i] = t, r
    return n


@njit(**NJIT)
def _replay_inflight(block, tokens, req_start, n_ids, pool, block_tokens, rules, arrival, duration, decode_blocks,
                     hit_blocks, rejected, wait, stats):
    """Requests in flight (see :func:`replay_vllm_inflight`); ``stats`` = [time the
    queue's head waited for blocks, span from the first arrival to the last completion]."""
    cap = (rules & LAST_TOKEN_CAP) != 0
    full_only = (rules & FULL_BLOCKS_ONLY) != 0
    reject = (rules & REJECT_OVERSIZE) != 0
    hashless_first = (rules & HASHLESS_FIRST) != 0
    P = pool
    R = req_start.shape[0] - 1
    prv = np.arange(-1, P - 1)
    nxt = np.arange(1, P + 1)
    if P > 0:
        nxt[P - 1] = -1
    head = 0 if P > 0 else -1
    tail = P - 1
    n_free = P
    ref = np.zeros(P, dtype=np.int64)
    held = np.full(P, -1, dtype=np.int64)
    cprv = np.full(P, -1, dtype=np.int64)
    cnxt = np.full(P, -1, dtype=np.int64)
    first_copy = np.full(n_ids, -1, dtype=np.int64)
    last_copy = np.full(n_ids, -1, dtype=np.int64)
    # the blocks each running request holds: slots[own_start[r] : own_start[r] + own_n[r]]
    total_blocks = 0
    for r in range(R):
        total_blocks += req_start[r + 1] - req_start[r] + decode_blocks[r]
    own = np.empty(max(total_blocks, 1), dtype=np.int64)
    own_start = np.zeros(R, dtype=np.int64)
    own_n = np.zeros(R, dtype=np.int64)
    ht = np.empty(max(R, 1), dtype=np.float64)
    hr = np.empty(max(R, 1), dtype=np.int64)
    nh = 0
    queue_head = 0  # requests queue_head..next_arrival-1 wait, FCFS
    next_arrival = 0
    blocked_since = -1.0
    used = 0
    t0 = arrival[0] if R > 0 else 0.0
    last = t0
    while next_arrival < R or queue_head < next_arrival or nh > 0:
        now = arrival[next_arrival] if next_arrival < R else np.inf
        if nh > 0 and ht[0] < now:
            now = ht[0]
        if now > last:
            last = now
        # 1. every completion at this time, in admission order: free tail first
        while nh > 0 and ht[0] <= now:
            r = hr[0]
            nh = due_pop(ht, hr, nh)
            ins = -1
            for j in range(own_n[r] - 1, -1, -1):
                s = own[own_start[r] + j]
                ref[s] -= 1
                if ref[s] > 0:
                    continue
                n_free += 1
                if hashless_first and held[s] < 0:
                    b = head if ins < 0 else nxt[ins]
                    prv[s] = ins
                    nxt[s] = b
                    if ins >= 0:
                        nxt[ins] = s
                    else:
                        head = s
                    if b >= 0:
                        prv[b] = s
                    else:
                        tail = s
                    ins = s
                else:
                    nxt[s] = -1
                    prv[s] = tail
                    if tail >= 0:
                        nxt[tail] = s
                    else:
                        head = s
                    tail = s
        # 2. arrivals at this time join the queue
        while next_arrival < R and arrival[next_arrival] <= now:
            next_arrival += 1
        # 3. admissions from the queue's head while it fits
        while queue_head < next_arrival:
            r = queue_head
            lo, hi = req_start[r], req_start[r + 1]
            n = hi - lo
            if n == 0:
                wait[r] = now - arrival[r]
                queue_head += 1
                continue
            if n + decode_blocks[r] > P and reject:
                rejected[r] = True
                queue_head += 1
                continue
            m = hit_limit(tokens, lo, hi, block_tokens, cap, full_only)
            h = 0
            while h < m and first_copy[block[lo + h]] >= 0:
                h += 1
            nb = n if n <= P else P
            extra = decode_blocks[r]
            if nb + extra > P:
                extra = P - nb
            touched_free = 0
            for j in range(h):
                if ref[first_copy[block[lo + j]]] == 0:
                    touched_free += 1
            if (nb - h) + extra + touched_free > n_free:
                if blocked_since < 0:
                    blocked_since = now
                break
            if blocked_since >= 0:
                stats[0] += now - blocked_since
                blocked_since = -1.0
            hit_blocks[r] = h
            wait[r] = now - arrival[r]
            own_start[r] = used
            own_n[r] = nb + extra
            for j in range(h):
                s = first_copy[block[lo + j]]
                own[used + j] = s
                if ref[s] == 0:
                    a, b = prv[s], nxt[s]
                    if a >= 0:
                        nxt[a] = b
                    else:
                        head = b
                    if b >= 0:
                        prv[b] = a
                    else:
                        tail = a
                    n_free -= 1
                ref[s] += 1
            for j in range(h, nb + extra):
                s = head
                head = nxt[s]
                if head >= 0:
                    prv[head] = -1
                else:
                    tail = -1
                n_free -= 1
                old = held[s]
                if old >= 0:
                    a, b = cprv[s], cnxt[s]
                    if a >= 0:
                        cnxt[a] = b
                    else:
                        first_copy[old] = b
                    if b >= 0:
                        cprv[b] = a
                    else:
                        last_copy[old] = a
                    held[s] = -1
                own[used + j] = s
                ref[s] = 1
                if j < nb:
                    t = lo + j
                    if not full_only or tokens[t] == block_tokens:
                        bid = block[t]
                        held[s] = bid
                        cnxt[s] = -1
                        cprv[s] = last_copy[bid]
                        if last_copy[bid] >= 0:
                            cnxt[last_copy[bid]] = s
                        else:
                            first_copy[bid] = s
                        last_copy[bid] = s
            used += nb + extra
            nh = due_push(ht, hr, nh, now + duration[r], r)
            queue_head += 1
            if duration[r] <= 0:
                break  # its completion is the next event, at this same time
    if blocked_since >= 0:
        stats[0] += last - blocked_since
    stats[1] = last - t0


def replay_vllm_inflight(block, tokens, req_start, n_ids: int, pool: int, block_tokens: int, arrival, duration,
                         decode_blocks=None, rules: int = ALL_RULES):
    """Requests in flight through one pool of ``pool`` blocks.

    Each request holds its blocks (its hit copies, its newly allocated prompt blocks and
    ``decode_blocks[r]`` more for its output, which are never hashed) from admission
    until admission + ``duration[r]``; held blocks have a reference count above zero and
    are not on the free queue, so they cannot be evicted (a hit on a held copy only adds
    a reference). Requests are admitted first come, first served in arrival order: the
    queue's head is admitted when ``new blocks + its hit copies now on the free queue <=
    free blocks`` (``allocate_slots``' check), else it and every request behind it wait
    until completions free enough (no preemption); a request needing more blocks than
    the pool is rejected (with ``reject_oversize``; else it keeps what fits). Its hit is
    decided and its prompt blocks cached at admission. Events at one time: every
    completion first (in admission order), then the arrivals join the queue, then
    admissions from its head; a request admitted for 0 s completes at that same time,
    before the next admission is tried. With every duration 0 this is
    :func:`replay_vllm`.

    Returns ``(hit_blocks int32[R], rejected bool[R], wait_s float64[R], head_blocked_s,
    span_s)``: the head-of-queue blocked time is the time some request waited for blocks.
    """
    lrs = np.ascontiguousarray(req_start, dtype=np.int64)
    R = lrs.shape[0] - 1
    hit = np.zeros(R, dtype=np.int32)
    rej = np.zeros(R, dtype=np.bool_)
    wait = np.zeros(R, dtype=np.float64)
    stats = np.zeros(2, dtype=np.float64)
    dec = np.zeros(R, dtype=np.int64) if decode_blocks is None else np.ascontiguousarray(decode_blocks, np.int64)
    _replay_inflight(np.ascontiguousarray(block, dtype=np.int64), np.ascontiguousarray(tokens, dtype=np.int64), lrs,
                     int(n_ids), int(pool), int(block_tokens), int(rules),
                     np.ascontiguousarray(arrival, dtype=np.float64), np.ascontiguousarray(duration, dtype=np.float64),
                     dec, hit, rej, wait, stats)
    return hit, rej, wait, float(stats[0]), float(stats[1])
