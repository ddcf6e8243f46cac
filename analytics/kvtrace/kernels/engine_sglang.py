"""SGLang's radix prefix cache, replayed exactly at one pool size per run (``--cache-rules
sglang``). The slow twin ``tests/naive_sglang.py`` is the specification (rules S1-S7, each
citing the upstream function it mirrors); this kernel implements its sequential mode:
each request is matched, admitted, allocated, inserted and released before the next.

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


@njit(**NJIT)
def _replay(block, tokens, req_start, n_ids, P, B, rules, hit_blocks, rejected):
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
    free_nodes = np.arange(NN - 1, 0, -1)  # node ids 1..NN-1, popped from the end
    n_free_nodes = NN - 1
    L = 0  # the longest request: a bound on one request's heap pushes (about 3 per page)
    for r in range(req_start.shape[0] - 1):
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
    R = req_start.shape[0] - 1
    for r in range(R):
        lo, hi = req_start[r], req_start[r + 1]
        n = hi - lo
        if n == 0:
            continue
        input_len = 0
        for t in range(lo, hi):
            input_len += tokens[t]
        if reject and input_len >= P * B - 6:  # S1
            rejected[r] = True
            continue
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
                # pages of c matching the key
                k = 0
                p = first[c]
                while p >= 0 and hit + k < m and p == block[lo + hit + k]:
                    k += 1
                    p = nxt_in[p]
                if k < length[c]:  # split: the first k pages become a new node above c
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
        hit_blocks[r] = hit
        hit_tokens = 0
        for j in range(hit):
            hit_tokens += tokens[lo + j]
        extend = input_len - hit_tokens
        new_pages = n - hit
        # S4 lock the path, admit
        x = last
        while x != ROOT:
            lock[x] += 1
            x = parent[x]
        room = free + (tree - hit)
        reserve = B if reserve_rule else 0
        admitted = True
        if extend + reserve < room * B:
            need = extend + (B if reserve_rule and B > 1 else 0)
        elif reject:
            admitted = False
            rejected[r] = True
            hit_blocks[r] = 0
        else:
            if new_pages > room:
                new_pages = room
            need = new_pages * B
        if admitted:
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
            # S6 take the pages
            free -= new_pages
            kept = hit + new_pages
            klen = kept if kept < keyable else keyable
            # S7 insert the kept keyable pages
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
            free += (prefix - hit) + (kept - klen)
        # unlock the path
        x = last
        while x != ROOT:
            lock[x] -= 1
            if lock[x] == 0 and kids[x] == 0:
                nh = _push(hk, hn, nh, time[x], x)
            x = parent[x]
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


def replay_sglang(block, tokens, req_start, n_ids: int, pools, page_tokens: int, rules: int = ALL_RULES):
    """Replay a whole trace once per pool size (pages): ``(hit_blocks int32[K, R],
    rejected bool[K, R])``."""
    block = np.ascontiguousarray(block, dtype=np.int64)
    tokens = np.ascontiguousarray(tokens, dtype=np.int64)
    lrs = np.ascontiguousarray(req_start, dtype=np.int64)
    R = lrs.shape[0] - 1
    pools = [int(p) for p in np.asarray(pools).ravel()]
    hit = np.zeros((len(pools), R), dtype=np.int32)
    rej = np.zeros((len(pools), R), dtype=np.bool_)
    for k, P in enumerate(pools):
        _replay(block, tokens, lrs, max(int(n_ids), 1), P, int(page_tokens), int(rules), hit[k], rej[k])
    return hit, rej
