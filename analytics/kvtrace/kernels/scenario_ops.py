"""Scenario events on the tier simulator's lists, applied between two requests
(:mod:`kvtrace.analyses.scenario` states when and why; the slow twin is
``tests/naive_scenario.py``).

Each operation walks one tier list ``X`` (slot ``LIST0 + L`` of the block table,
:mod:`kvtrace.kernels.tier_table`) from its least-recent (or oldest, for a FIFO list)
end and *drops* entries: a dropped block leaves the list and its tokens leave the
tier's count, as if it had never been written; it is not an eviction (no write below,
no residency histogram, no counter), and the block's own state (accesses so far, first
request: what makes a later access cold or not) is kept: a dropped block that is
accessed again is a miss, not a first access.

- :func:`drop_all` drops every entry (a restart that loses the tier);
- :func:`drop_target` drops the entries whose flash target is ``k`` of ``T``
  (``mix_hash(block, 0) % T``: the placement of :mod:`kvtrace.analyses.load`);
- :func:`drop_idle` drops, from the old end, the entries whose time field (last touch
  for an LRU list, insertion for a FIFO list: the list's own order, so the expired
  entries are a run at its old end) is older than a cutoff (a TTL sweep);
- :func:`drop_idle_classes` is :func:`drop_idle` with a cutoff per block class (a TTL
  by request type or tenant);
- :func:`drop_namespace` drops, from the old end, the entries of blocks below an id
  bound (an old model version's namespace) while their sizes fit a token budget
  (retirement at a rate).

Every operation is O(entries dropped), but :func:`drop_target`,
:func:`drop_idle_classes` and :func:`drop_namespace`, which walk the list (O(entries
passed)).

Prestaging (a prefetch is replayed as a request of the tier simulator): which leading
blocks of a predicted list a node's tiers hold (:func:`present_prefix`), and the
prefetch figures (:func:`land`, :func:`read`): a block moved into DRAM by a prefetch is
useful iff its next access reads it from DRAM.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT
from kvtrace.kernels.densify import mix_hash
from kvtrace.kernels.tier_table import ABSENT, COLD_FLAG, INFO, INFO_SIZE, INS, MISS, NEXT, PREV, TCH, unlink_row




@njit(**NJIT)
def drop_all(st, used, X, gone):
    """Drop every entry of list ``X``; returns ``(blocks, tokens)`` dropped (their ids
    into ``gone`` unless it is empty, as every drop here)."""
    M = st.shape[0] - 1
    b = st[M, X, NEXT]
    n = 0
    tok = 0
    while b != M:
        nxt = st[b, X, NEXT]
        st[b, X, PREV] = ABSENT
        if gone.shape[0]:
            gone[n] = b
        n += 1
        tok += st[b, INFO, INFO_SIZE]
        b = nxt
    st[M, X, NEXT] = M
    st[M, X, PREV] = M
    used[X] -= tok
    return n, tok


@njit(**NJIT)
def drop_target(st, used, X, T, k, gone):
    """Drop the entries of list ``X`` whose flash target (``mix_hash(b, 0) % T``) is
    ``k``; returns ``(blocks, tokens)`` dropped."""
    M = st.shape[0] - 1
    b = st[M, X, NEXT]
    n = 0
    tok = 0
    while b != M:
        nxt = st[b, X, NEXT]
        if np.int64(mix_hash(np.uint64(b), 0) % np.uint64(T)) == k:
            unlink_row(st, X, b)
            if gone.shape[0]:
                gone[n] = b
            n += 1
            tok += st[b, INFO, INFO_SIZE]
        b = nxt
    used[X] -= tok
    return n, tok


@njit(**NJIT)
def drop_idle_classes(st, used, X, by_insert, cutoffs, klass, gone):
    """:func:`drop_idle` with a cutoff per class: drop the entries whose time field is
    before ``cutoffs[klass[b]]`` (``klass`` empty: every block of class 0), walking from
    the old end while it is before the largest cutoff (past it, no class's entry has
    expired; with one class the walk stops at the first kept). O(entries passed)."""
    M = st.shape[0] - 1
    field = INS if by_insert else TCH
    top = cutoffs.max()
    n = 0
    tok = 0
    b = st[M, X, NEXT]
    while b != M and st[b, X, field] < top:
        nxt = st[b, X, NEXT]
        if st[b, X, field] < cutoffs[klass[b] if klass.shape[0] else 0]:
            unlink_row(st, X, b)
            if gone.shape[0]:
                gone[n] = b
            n += 1
            tok += st[b, INFO, INFO_SIZE]
        b = nxt
    used[X] -= tok
    return n, tok


@njit(**NJIT)
def drop_idle(st, used, X, by_insert, cutoff, gone):
    """Drop, from the old end of list ``X``, the entries whose last touch (insertion
    with ``by_insert``) is before ``cutoff`` (time quanta), stopping at the first that
    is not; returns ``(blocks, tokens)`` dropped. The list must be ordered by that
    field (LRU lists by last touch, FIFO lists by insertion)."""
    return drop_idle_classes(st, used, X, by_insert, np.full(1, cutoff, dtype=np.int64),
                             np.zeros(0, dtype=np.int32), gone)


@njit(**NJIT)
def drop_namespace(st, used, X, bound, budget, gone):
    """Drop, from the old end of list ``X``, the entries of blocks ``< bound`` while
    each one's size fits what is left of ``budget`` tokens (stopping at the first that
    does not); returns ``(blocks, tokens)`` dropped."""
    M = st.shape[0] - 1
    n = 0
    tok = 0
    b = st[M, X, NEXT]
    while b != M:
        nxt = st[b, X, NEXT]
        if b < bound:
            s = st[b, INFO, INFO_SIZE]
            if tok + s > budget:
                break
            unlink_row(st, X, b)
            if gone.shape[0]:
                gone[n] = b
            n += 1
            tok += s
        b = nxt
    used[X] -= tok
    return n, tok


@njit(**NJIT)
def mark_lost(st, ids, lists, aside, code, lost):
    """``lost[b] = code`` for each of ``ids`` that no list of ``lists`` holds, nor the
    set-aside flash list ``aside`` (its ``PREV`` column; empty: none): a block an event
    dropped from everywhere."""
    for b in ids:
        held = aside.shape[0] > 0 and aside[b] != ABSENT
        for X in lists:
            if st[b, X, PREV] != ABSENT:
                held = True
                break
        if not held:
            lost[b] = code


@njit(**NJIT)
def attribute(block, decision, tokens, lrs, r0, first, lost, aside, aside_code, out):
    """The tokens of the measured real requests ``r0..`` (requests ``>= first``) whose
    access missed a block seen before (decision MISS, not cold), by cause into ``out``:
    ``out[lost[b]]`` (0: capacity; ``e + 1``: event e dropped it and it was nowhere
    since), or ``out[aside_code]`` when a catalog outage holds it set aside (``aside``,
    its ``PREV`` column; empty: no outage). Every access then clears ``lost[b]``."""
    for r in range(lrs.shape[0] - 1):
        meas = r0 + r >= first
        for t in range(lrs[r], lrs[r + 1]):
            b = block[t]
            d = decision[t]
            if meas and (d & 3) == MISS and (d & COLD_FLAG) == 0:
                c = lost[b]
                if c == 0 and aside.shape[0] > 0 and aside[b] != ABSENT:
                    c = aside_code
                out[c] += tokens[t]
            lost[b] = 0


# prefetch accounting (float64 sums): requests, blocks and tokens moved, tokens moved whose block's next access
# read it from DRAM, the prestaged turns' usable-prefix tokens not in DRAM at issue and those read from DRAM
# thanks to a prefetch, token-seconds from landing to that read, DRAM tokens evicted by the prefetches
PF_REQUESTS, PF_BLOCKS, PF_MOVED, PF_USEFUL, PF_NEEDED, PF_COVERED, PF_HELD, PF_DISPLACED = range(8)
N_PF = 8


@njit(**NJIT)
def present_prefix(st, block, Xd, Xl, Xf):
    """How many leading ``block`` ids are in list ``Xd``, ``Xl`` or ``Xf`` (-1: no such
    list): the blocks a prefetch can touch (it stops at the first it finds nowhere)."""
    n = 0
    for b in block:
        if st[b, Xd, PREV] != ABSENT or (Xl >= 0 and st[b, Xl, PREV] != ABSENT) or \
                (Xf >= 0 and st[b, Xf, PREV] != ABSENT):
            n += 1
        else:
            break
    return n


@njit(**NJIT)
def mark_absent(st, block, Xd, mark):
    """``mark[i] = 1`` for every ``block[i]`` not in DRAM list ``Xd``."""
    for i in range(block.shape[0]):
        if st[block[i], Xd, PREV] == ABSENT:
            mark[i] = 1


@njit(**NJIT)
def land(block, decision, lo, hi, now, size, moved, landed, pf):
    """A prefetch's accesses ``lo..hi - 1``: those decided in a flash tier moved into
    DRAM (``moved[b] = 1``, ``landed[b] = now``)."""
    pf[PF_REQUESTS] += 1
    for t in range(lo, hi):
        d = decision[t] & 3
        if d == 1 or d == 2:
            b = block[t]
            moved[b] = 1
            landed[b] = now
            pf[PF_BLOCKS] += 1
            pf[PF_MOVED] += size[b]


@njit(**NJIT)
def read(block, decision, lo, hi, now, meas, absent, size, moved, landed, pf):
    """A real request's accesses ``lo..hi - 1`` at ``now``: a block moved by a prefetch
    is useful iff this next access reads it from DRAM; when the request is a prestaged
    turn, its usable-prefix tokens not in DRAM at its prefetch's issue (``absent[t -
    lo]``) and those read from DRAM thanks to a prefetch (coverage). Only a measured
    request counts."""
    usable = True
    for t in range(lo, hi):
        b = block[t]
        d = decision[t] & 3
        if d == 3:
            usable = False
        was = moved[b] != 0
        if was:
            moved[b] = 0
            if d == 0 and meas:
                pf[PF_USEFUL] += size[b]
                pf[PF_HELD] += size[b] * (now - landed[b])
        if usable and absent[t - lo] != 0 and meas:
            pf[PF_NEEDED] += size[b]
            if was and d == 0:
                pf[PF_COVERED] += size[b]


@njit(**NJIT)
def transfer_rows(block, decision, lrs, pick, size, T, bpt, out):
    """The bytes a move into DRAM reads, per picked request of a fed run (``pick[s]``):
    ``out[s, 0]`` from the local SSD (decision LOCAL), ``out[s, 1 + t]`` and reads
    ``out[s, 1 + T + t]`` from flash target ``t = mix_hash(b, 0) % T`` (decision FLASH:
    the placement of :mod:`kvtrace.analyses.load`); other rows are zero."""
    for s in range(lrs.shape[0] - 1):
        for c in range(out.shape[1]):
            out[s, c] = 0.0
        if not pick[s]:
            continue
        for i in range(lrs[s], lrs[s + 1]):
            d = decision[i] & 3
            b = block[i]
            if d == 1:
                out[s, 0] += np.float64(size[b]) * bpt
            elif d == 2:
                t = np.int64(mix_hash(np.uint64(b), 0) % np.uint64(T))
                out[s, 1 + t] += np.float64(size[b]) * bpt
                out[s, 1 + T + t] += 1.0


@njit(**NJIT)
def account_requests(block, decision, lrs, r0, req_t, size, moved, landed, absent, pf, meas_from):
    """Real requests ``r0..`` of a piece (:func:`read` each; ``absent`` per access of the
    piece; measured from request ``meas_from``)."""
    for r in range(lrs.shape[0] - 1):
        lo = lrs[r]
        read(block, decision, lo, lrs[r + 1], req_t[r0 + r], r0 + r >= meas_from, absent[lo:], size, moved, landed,
             pf)


__all__ = ["N_PF", "PF_BLOCKS", "PF_COVERED", "PF_DISPLACED", "PF_HELD", "PF_MOVED", "PF_NEEDED", "PF_REQUESTS",
           "PF_USEFUL", "account_requests", "attribute", "drop_all", "drop_idle", "drop_idle_classes",
           "drop_namespace", "drop_target", "land", "mark_absent", "mark_lost", "present_prefix", "read",
           "transfer_rows"]
