"""SGLang's radix prefix cache, replayed exactly at one pool size per run (``--cache-rules
sglang``). The slow twin ``tests/naive_sglang.py`` is the specification (rules S1-S7, each
citing the upstream function it mirrors); this module implements both its modes:
:func:`replay_sglang` the sequential one (each request is matched, admitted, allocated,
inserted and released before the next) and :func:`replay_sglang_inflight` requests in
flight (a first-come-first-served queue; a request holds its pages and its path's lock
until it finishes, when it is inserted), one monolithic kernel for both (the sequential
mode is requests arriving at 0 for 0 s).

Representation
--------------
Trace ids are chained block hashes, so a page id has one place in the tree: ``node_of[id]``
is the node holding the page (-1: not cached) and ``nxt_in`` / ``prv_in`` link the pages of
one node in order; a node keeps its parent, first and last page, length, child count, lock
count and last access time (a logical clock, one tick per walk and one per node created, as
``time.monotonic()`` is read upstream). A child of a node is found by its first page: page
``key[n]`` continues the walk iff it is cached and first in its node. Evictable leaves are
kept in a lazy min-heap by access time: a node is pushed whenever its time changes, it
becomes a leaf or its lock drops to 0, and an entry is used only if it still describes an
unlocked live leaf with that time (leaves never share a time, so the order is upstream's
heap order).

Per request (rules by the twin's numbering; flags in ``rules``)
---------------------------------------------------------------
S1 reject ``input_len >= pool * B - 6`` (``REJECT_OVERSIZE``). S2 the match key: the
leading keyable pages (full ones with ``FULL_PAGES_ONLY``) ending at or before token
``input_len - 1`` (``LAST_TOKEN_CAP``; else ``input_len``). S3 the walk: one tick for the
root and every node visited; a node the key leaves inside is split at that page (the upper
part a new node with a fresh tick and the lock copied; with ``SPLIT_REFRESH`` the remainder
takes the walk's time). S4 lock the path; admitted iff ``extend + reserve < (free +
evictable) * B`` (``reserve = B`` with ``RESERVE_PAGE``); else rejected ("never fits") with
``REJECT_OVERSIZE``, or kept truncated to ``hit + free + evictable`` pages. S5 if ``free * B
< need`` (``need = extend + B`` with the reserve and ``B > 1``; a truncated request needs its
new pages) evict ``need`` tokens (``EVICT_NEED``) or the shortfall: least recent leaf first,
a whole node at a time (``WHOLE_LEAF``; else its deepest page), a parent that becomes an
unlocked leaf joins. S6 take the new pages. S7 insert the keyable kept pages (one tick;
visited nodes take it; a split as in S3; the rest one new leaf, a fresh tick), free the
duplicates of pages already in the tree and the unaligned tail, unlock the path.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT
from kvtrace.kernels.engine_vllm import due_pop, due_push

LAST_TOKEN_CAP, FULL_PAGES_ONLY, REJECT_OVERSIZE, WHOLE_LEAF, EVICT_NEED, RESERVE_PAGE, SPLIT_REFRESH = (
    1, 2, 4, 8, 16, 32, 64)
ALL_RULES = LAST_TOKEN_CAP | FULL_PAGES_ONLY | REJECT_OVERSIZE | WHOLE_LEAF | EVICT_NEED | RESERVE_PAGE | SPLIT_REFRESH
RULE_NAMES = {LAST_TOKEN_CAP: "last-token cap", FULL_PAGES_ONLY: "full pages only", REJECT_OVERSIZE: "rejection",
              WHOLE_LEAF: "whole-leaf eviction", EVICT_NEED: "evict(need)", RESERVE_PAGE: "reserved page",
              SPLIT_REFRESH: "split refresh"}

ROOT = 0


@njit(**NJIT)
def _push(hk, hn, nh, t, node):
    i = nh
    while i > 0:
        p = (i - 1) >> 1
        if hk[p] <= t:
            break
        hk[i], hn[i] = hk[p], hn[p]
        i = p
    hk[i], hn[i] = t, node
    return nh + 1


@njit(**NJIT)
def _pop(hk, hn, nh):
    nh -= 1
    t, x = hk[nh], hn[nh]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= nh:
            break
        if c + 1 < nh and hk[c + 1] < hk[c]:
            c += 1
        if t <= hk[c]:
            break
        hk[i], hn[i] = hk[c], hn[c]
        i = c
    hk[i], hn[i] = t, x
    return nh


def replay_sglang(block, tokens, req_start, n_ids: int, pools, page_tokens: int, rules: int = ALL_RULES):
    """Replay a whole trace once per pool size (pages): ``(hit_blocks int32[K, R],
    rejected bool[K, R])``. The sequential mode is the in-flight replay with every
    request arriving at 0 for 0 s (each try finds nothing running: the twin's
    sequential mode), so one kernel holds the tree code."""
    block = np.ascontiguousarray(block, dtype=np.int64)
    tokens = np.ascontiguousarray(tokens, dtype=np.int64)
    lrs = np.ascontiguousarray(req_start, dtype=np.int64)
    R = lrs.shape[0] - 1
    pools = [int(p) for p in np.asarray(pools).ravel()]
    hit = np.zeros((len(pools), R), dtype=np.int32)
    rej = np.zeros((len(pools), R), dtype=np.bool_)
    zero = np.zeros(R, dtype=np.float64)
    none = np.zeros(R, dtype=np.int64)  # no decode pages
    wait = np.zeros(R, dtype=np.float64)
    stats = np.zeros(2, dtype=np.float64)
    for k, P in enumerate(pools):
        _replay_inflight(block, tokens, lrs, max(int(n_ids), 1), P, int(page_tokens), int(rules), zero, zero, none,
                         hit[k], rej[k], wait, stats)
    return hit, rej


# --------------------------------------------------------------------------- requests in flight
@njit(**NJIT)
def _replay_inflight(block, tokens, req_start, n_ids, P, B, rules, arrival, duration, decode, hit_blocks, rejected,
                     wait, stats):
    """Requests in flight (see :func:`replay_sglang_inflight`); ``stats`` = [time the
    queue's head waited for pages, span from the first arrival to the last completion].
    The event loop is that of :func:`kvtrace.kernels.engine_vllm.replay_vllm_inflight`."""
    cap = (rules & LAST_TOKEN_CAP) != 0
    full_only = (rules & FULL_PAGES_ONLY) != 0
    reject = (rules & REJECT_OVERSIZE) != 0
    whole = (rules & WHOLE_LEAF) != 0
    evict_need = (rules & EVICT_NEED) != 0
    reserve_rule = (rules & RESERVE_PAGE) != 0
    refresh = (rules & SPLIT_REFRESH) != 0
    node_of = np.full(n_ids, -1, dtype=np.int64)
    nxt_in = np.full(n_ids, -1, dtype=np.int64)
    prv_in = np.full(n_ids, -1, dtype=np.int64)
    NN = P + 2
    parent = np.full(NN, -1, dtype=np.int64)
    first = np.full(NN, -1, dtype=np.int64)
    lastp = np.full(NN, -1, dtype=np.int64)
    length = np.zeros(NN, dtype=np.int64)
    kids = np.zeros(NN, dtype=np.int64)
    lock = np.zeros(NN, dtype=np.int64)
    time = np.zeros(NN, dtype=np.int64)
    alive = np.zeros(NN, dtype=np.bool_)
    free_nodes = np.arange(NN - 1, 0, -1)
    n_free_nodes = NN - 1
    R = req_start.shape[0] - 1
    L = 0
    for r in range(R):
        L = max(L, req_start[r + 1] - req_start[r])
    HC = 8 * NN + 8 * (L + 4) + 64
    hk = np.empty(HC, dtype=np.int64)
    hn = np.empty(HC, dtype=np.int64)
    nh = 0
    clock = 1
    alive[ROOT] = True
    lock[ROOT] = 1
    time[ROOT] = clock
    free = P
    tree = 0
    locked = 0  # tree pages of nodes with a lock (upstream's protected_size_); evictable = tree - locked
    # what each running request holds until it finishes: its path's last node, hit pages, new prompt pages,
    # decode pages and how many of its leading pages it inserts
    run_last = np.zeros(max(R, 1), dtype=np.int64)
    run_hit = np.zeros(max(R, 1), dtype=np.int64)
    run_new = np.zeros(max(R, 1), dtype=np.int64)
    run_dec = np.zeros(max(R, 1), dtype=np.int64)
    run_klen = np.zeros(max(R, 1), dtype=np.int64)
    rt = np.empty(max(R, 1), dtype=np.float64)
    rr = np.empty(max(R, 1), dtype=np.int64)
    nrun = 0
    queue_head = 0  # requests queue_head..next_arrival-1 wait, first come first served
    next_arrival = 0
    blocked_since = -1.0
    t0 = arrival[0] if R > 0 else 0.0
    last_t = t0
    while next_arrival < R or queue_head < next_arrival or nrun > 0:
        now = arrival[next_arrival] if next_arrival < R else np.inf
        if nrun > 0 and rt[0] < now:
            now = rt[0]
        if now > last_t:
            last_t = now
        # 1. every completion due, by (end, admission order): S7 insert, free, unlock
        while nrun > 0 and rt[0] <= now:
            r = rr[0]
            nrun = due_pop(rt, rr, nrun)
            if nh > HC - 4 * (L + 4):  # compact: keep the entries that still describe an evictable leaf
                j = 0
                for i in range(nh):
                    x = hn[i]
                    if alive[x] and x != ROOT and lock[x] == 0 and kids[x] == 0 and time[x] == hk[i]:
                        hk[j], hn[j] = hk[i], hn[i]
                        j += 1
                nh = 0
                for i in range(j):
                    nh = _push(hk, hn, nh, hk[i], hn[i])
            lo = req_start[r]
            hit = run_hit[r]
            kept = hit + run_new[r]
            klen = run_klen[r]
            clock += 1
            tw = clock
            time[ROOT] = tw
            node = ROOT
            pos = 0
            while pos < klen:
                c = node_of[block[lo + pos]]
                if c < 0 or first[c] != block[lo + pos]:
                    break
                k = 0
                p = first[c]
                while p >= 0 and pos + k < klen and p == block[lo + pos + k]:
                    k += 1
                    p = nxt_in[p]
                pos += k
                if k < length[c]:
                    if refresh:
                        time[c] = tw
                        if kids[c] == 0 and lock[c] == 0:
                            nh = _push(hk, hn, nh, tw, c)
                    u = free_nodes[n_free_nodes - 1]
                    n_free_nodes -= 1
                    clock += 1
                    alive[u] = True
                    parent[u] = parent[c]
                    time[u] = clock
                    lock[u] = lock[c]
                    kids[u] = 1
                    first[u] = first[c]
                    q = first[c]
                    for _ in range(k - 1):
                        node_of[q] = u
                        q = nxt_in[q]
                    node_of[q] = u
                    lastp[u] = q
                    length[u] = k
                    first[c] = nxt_in[q]
                    nxt_in[q] = -1
                    prv_in[first[c]] = -1
                    length[c] -= k
                    parent[c] = u
                    node = u
                    break
                time[c] = tw
                if kids[c] == 0 and lock[c] == 0:
                    nh = _push(hk, hn, nh, tw, c)
                node = c
            prefix = pos
            if prefix < klen:  # the rest: one new leaf
                u = free_nodes[n_free_nodes - 1]
                n_free_nodes -= 1
                clock += 1
                alive[u] = True
                parent[u] = node
                time[u] = clock
                lock[u] = 0
                kids[u] = 0
                kids[node] += 1
                first[u] = block[lo + prefix]
                prev = -1
                for j in range(prefix, klen):
                    q = block[lo + j]
                    node_of[q] = u
                    prv_in[q] = prev
                    nxt_in[q] = -1
                    if prev >= 0:
                        nxt_in[prev] = q
                    prev = q
                lastp[u] = prev
                length[u] = klen - prefix
                tree += klen - prefix
                nh = _push(hk, hn, nh, clock, u)
            # the duplicates of pages already in the tree, the unaligned tail and the decode pages
            free += (prefix - hit) + (kept - klen) + run_dec[r]
            x = run_last[r]
            while x != ROOT:
                lock[x] -= 1
                if lock[x] == 0:
                    locked -= length[x]
                    if kids[x] == 0:
                        nh = _push(hk, hn, nh, time[x], x)
                x = parent[x]
        # 2. arrivals at this time join the queue
        while next_arrival < R and arrival[next_arrival] <= now:
            next_arrival += 1
        # 3. tries from the queue's head (each re-matches) while it is admitted
        while queue_head < next_arrival:
            r = queue_head
            lo, hi = req_start[r], req_start[r + 1]
            n = hi - lo
            if n == 0:
                wait[r] = now - arrival[r]
                queue_head += 1
                continue
            input_len = 0
            for t in range(lo, hi):
                input_len += tokens[t]
            if reject and input_len >= P * B - 6:  # S1
                rejected[r] = True
                wait[r] = now - arrival[r]
                queue_head += 1
                continue
            if nh > HC - 4 * (L + 4):
                j = 0
                for i in range(nh):
                    x = hn[i]
                    if alive[x] and x != ROOT and lock[x] == 0 and kids[x] == 0 and time[x] == hk[i]:
                        hk[j], hn[j] = hk[i], hn[i]
                        j += 1
                nh = 0
                for i in range(j):
                    nh = _push(hk, hn, nh, hk[i], hn[i])
            keyable = 0
            while keyable < n and (not full_only or tokens[lo + keyable] == B):
                keyable += 1
            limit = input_len - 1 if cap else input_len
            m = 0
            end = 0
            while m < keyable:
                end += tokens[lo + m]
                if end > limit:
                    break
                m += 1
            # S3 the match walk
            hit = 0
            last = ROOT
            if m > 0:
                clock += 1
                tw = clock
                time[ROOT] = tw
                while hit < m:
                    c = node_of[block[lo + hit]]
                    if c < 0 or first[c] != block[lo + hit]:
                        break
                    k = 0
                    p = first[c]
                    while p >= 0 and hit + k < m and p == block[lo + hit + k]:
                        k += 1
                        p = nxt_in[p]
                    if k < length[c]:
                        if refresh:
                            time[c] = tw
                            if kids[c] == 0 and lock[c] == 0:
                                nh = _push(hk, hn, nh, tw, c)
                        u = free_nodes[n_free_nodes - 1]
                        n_free_nodes -= 1
                        clock += 1
                        alive[u] = True
                        parent[u] = parent[c]
                        time[u] = clock
                        lock[u] = lock[c]
                        kids[u] = 1
                        first[u] = first[c]
                        q = first[c]
                        for _ in range(k - 1):
                            node_of[q] = u
                            q = nxt_in[q]
                        node_of[q] = u
                        lastp[u] = q
                        length[u] = k
                        first[c] = nxt_in[q]
                        nxt_in[q] = -1
                        prv_in[first[c]] = -1
                        length[c] -= k
                        parent[c] = u
                        hit += k
                        last = u
                        break
                    time[c] = tw
                    if kids[c] == 0 and lock[c] == 0:
                        nh = _push(hk, hn, nh, tw, c)
                    hit += k
                    last = c
            hit_tokens = 0
            for j in range(hit):
                hit_tokens += tokens[lo + j]
            extend = input_len - hit_tokens
            new_pages = n - hit
            dec = decode[r]
            # S4 lock the path, admit
            x = last
            while x != ROOT:
                if lock[x] == 0:
                    locked += length[x]
                lock[x] += 1
                x = parent[x]
            room = free + (tree - locked)
            reserve = B if reserve_rule else 0
            admitted = True
            need = 0
            if extend + dec * B + reserve < room * B:
                need = extend + dec * B + (B if reserve_rule and B > 1 else 0)
            elif nrun > 0 or reject:
                admitted = False
            else:  # nothing runs: truncated to the room, the prompt's pages first
                if new_pages > room:
                    new_pages = room
                if dec > room - new_pages:
                    dec = room - new_pages
                need = (new_pages + dec) * B
            if not admitted:  # unlock; wait (something runs) or never fits (rejected)
                x = last
                while x != ROOT:
                    lock[x] -= 1
                    if lock[x] == 0:
                        locked -= length[x]
                        if kids[x] == 0:
                            nh = _push(hk, hn, nh, time[x], x)
                    x = parent[x]
                if nrun > 0:
                    if blocked_since < 0:
                        blocked_since = now
                    break
                rejected[r] = True
                wait[r] = now - arrival[r]
                if blocked_since >= 0:
                    stats[0] += now - blocked_since
                    blocked_since = -1.0
                queue_head += 1
                continue
            if blocked_since >= 0:
                stats[0] += now - blocked_since
                blocked_since = -1.0
            hit_blocks[r] = hit
            wait[r] = now - arrival[r]
            # S5 eviction
            if free * B < need:
                target = need if evict_need else need - free * B
                evicted = 0
                while evicted < target and nh > 0:
                    tx, x = hk[0], hn[0]
                    nh = _pop(hk, hn, nh)
                    if not alive[x] or x == ROOT or lock[x] != 0 or kids[x] != 0 or time[x] != tx:
                        continue
                    k = length[x] if whole else 1
                    for _ in range(k):
                        q = lastp[x]
                        node_of[q] = -1
                        lastp[x] = prv_in[q]
                        prv_in[q] = -1
                        if lastp[x] >= 0:
                            nxt_in[lastp[x]] = -1
                    length[x] -= k
                    free += k
                    tree -= k
                    evicted += k * B
                    if length[x] > 0:
                        nh = _push(hk, hn, nh, tx, x)
                        continue
                    alive[x] = False
                    first[x] = -1
                    free_nodes[n_free_nodes] = x
                    n_free_nodes += 1
                    y = parent[x]
                    kids[y] -= 1
                    if y != ROOT and lock[y] == 0 and kids[y] == 0:
                        nh = _push(hk, hn, nh, time[y], y)
            # S6 take the pages; held until admission + duration
            free -= new_pages + dec
            kept = hit + new_pages
            run_last[r] = last
            run_hit[r] = hit
            run_new[r] = new_pages
            run_dec[r] = dec
            run_klen[r] = kept if kept < keyable else keyable
            nrun = due_push(rt, rr, nrun, now + duration[r], r)
            queue_head += 1
            if duration[r] <= 0:
                break  # its completion is the next event, at this same time
    if blocked_since >= 0:
        stats[0] += last_t - blocked_since
    stats[1] = last_t - t0


def replay_sglang_inflight(block, tokens, req_start, n_ids: int, pool_pages: int, page_tokens: int, arrival, duration,
                           decode_pages=None, rules: int = ALL_RULES):
    """Requests in flight through one SGLang radix cache of ``pool_pages`` pages of
    ``page_tokens`` tokens (the twin's in-flight mode, ``tests/naive_sglang.py`` "Modes").

    Requests join one first-come-first-served queue in index order (``arrival[r]``
    seconds, non-decreasing: a trace's order). The queue's head is *tried* when it
    reaches the head and after every event: S1-S4, a fresh match each try
    (``Req.init_next_round_input`` runs every scheduling round, so a failed try still
    ticks the clock, splits and refreshes), then ``PrefillAdder.add_one_req``'s check
    ``extend + decode_pages[r] * B + reserve < (free + evictable) * B``, where evictable
    counts the tree pages no running request locks (``evictable_size_``). If it fails,
    the head unlocks and waits, and everyone behind it (``AddReqResult.NO_TOKEN`` stops
    the adder loop); if it fails while nothing runs it can never fit: rejected with
    ``REJECT_OVERSIZE``, else admitted truncated to the room (prompt pages first, then
    decode pages). An admitted request evicts (S5) and takes its new prompt pages and
    its decode pages (S6), holds them and its path lock (``inc_lock_ref``) until
    admission + ``duration[r]``, then finishes: ``cache_finished_req`` (S7) inserts its
    kept keyable prompt pages (a page another request inserted meanwhile is a duplicate
    and freed), frees its decode pages (never inserted: their keys are output tokens
    the trace does not give) and ``dec_lock_ref``. Its hit is the match at admission.
    Events at one time: every completion first (by end time, then admission order), then
    the arrivals join the queue, then tries from its head; a request admitted for 0 s
    finishes at that same time before the next try. With every duration 0 this is
    :func:`replay_sglang` (each try finds nothing running).

    Returns ``(hit_blocks int32[R], rejected bool[R], wait_s float64[R], head_blocked_s,
    span_s)``: ``wait_s[r]`` = admission (or rejection) - arrival; the head-blocked time
    is the time some request waited for pages; the span runs from the first arrival to
    the last completion, seconds.
    """
    lrs = np.ascontiguousarray(req_start, dtype=np.int64)
    R = lrs.shape[0] - 1
    hit = np.zeros(R, dtype=np.int32)
    rej = np.zeros(R, dtype=np.bool_)
    wait = np.zeros(R, dtype=np.float64)
    stats = np.zeros(2, dtype=np.float64)
    dec = np.zeros(R, dtype=np.int64) if decode_pages is None else np.ascontiguousarray(decode_pages, np.int64)
    _replay_inflight(np.ascontiguousarray(block, dtype=np.int64), np.ascontiguousarray(tokens, dtype=np.int64), lrs,
                     max(int(n_ids), 1), int(pool_pages), int(page_tokens), int(rules),
                     np.ascontiguousarray(arrival, dtype=np.float64), np.ascontiguousarray(duration, dtype=np.float64),
                     dec, hit, rej, wait, stats)
    return hit, rej, wait, float(stats[0]), float(stats[1])
