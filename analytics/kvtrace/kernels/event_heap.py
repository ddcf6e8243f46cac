"""The event heap of :mod:`kvtrace.kernels.queueing`: a binary min-heap in six parallel
arrays (time ``ht``, push sequence ``hs``, kind ``hk`` and three payload fields ``ha``,
``hb``, ``hx``), ordered by ``(time, seq)`` so that events of equal time leave in the
order they were pushed; ``cnt[SIZE]`` is its size and ``cnt[SEQ]`` counts pushes. The
caller grows the arrays before a push could overflow them.
"""

from __future__ import annotations

from numba import njit

from kvtrace.config import NJIT

SIZE, SEQ = 0, 1


@njit(**NJIT)
def push(ht, hs, hk, ha, hb, hx, cnt, t, kind, a, b, x):
    """Add the event ``(t, kind, a, b, x)``, sequenced after every earlier push."""
    i = cnt[SIZE]
    cnt[SIZE] = i + 1
    seq = cnt[SEQ]
    cnt[SEQ] = seq + 1
    while i > 0:
        p = (i - 1) >> 1
        if ht[p] < t or (ht[p] == t and hs[p] < seq):
            break
        ht[i], hs[i], hk[i], ha[i], hb[i], hx[i] = ht[p], hs[p], hk[p], ha[p], hb[p], hx[p]
        i = p
    ht[i], hs[i], hk[i], ha[i], hb[i], hx[i] = t, seq, kind, a, b, x


@njit(**NJIT)
def pop(ht, hs, hk, ha, hb, hx, cnt):
    """Remove the root (the caller has read it)."""
    n = cnt[SIZE] - 1
    cnt[SIZE] = n
    if n == 0:
        return
    t, seq, k, a, b, x = ht[n], hs[n], hk[n], ha[n], hb[n], hx[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (ht[c + 1] < ht[c] or (ht[c + 1] == ht[c] and hs[c + 1] < hs[c])):
            c += 1
        if t < ht[c] or (t == ht[c] and seq < hs[c]):
            break
        ht[i], hs[i], hk[i], ha[i], hb[i], hx[i] = ht[c], hs[c], hk[c], ha[c], hb[c], hx[c]
        i = c
    ht[i], hs[i], hk[i], ha[i], hb[i], hx[i] = t, seq, k, a, b, x


__all__ = ["SEQ", "SIZE", "pop", "push"]
