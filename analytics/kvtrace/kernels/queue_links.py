"""The link stations of the queue simulator (:mod:`kvtrace.kernels.queueing`, whose
docstring is the specification): FCFS and processor-sharing service through a
congestion window, the work a link holds and would hold (the restore decision's
estimate), the stations' figures over the measured window and the overload rule, and
the record layouts (stations, jobs, counters) the simulator's tables share.
"""

from __future__ import annotations

import math

from numba import njit

from kvtrace.config import NJIT
from kvtrace.kernels import event_heap
from kvtrace.kernels.event_heap import push as _push

# station types (wait histograms, utilisation by resource)
HOST, NIC, LOCAL_SSD, FLASH, UPLINK, GPU = 0, 1, 2, 3, 4, 5
STATION_TYPES = ("host_link", "nic", "local_ssd", "flash", "uplink", "gpu")
#: wait histogram: bin 0 = no wait, bin i = (1e-6 x 2**((i-1)/64), 1e-6 x 2**(i/64)] s
WAIT_BINS_PER_OCTAVE = 64
WAIT_BIN0_S = 1e-6
N_WAIT_BINS = 2 + WAIT_BINS_PER_OCTAVE * 48

# float parameters
FP_ROUTE, FP_DRAM_FIXED, FP_FLASH_FIXED, FP_CLIENT_S_PER_B, FP_WRITE_S_PER_B, FP_OVERLAP, FP_PASS, FP_DECODE, \
    FP_MAX_WAIT, FP_W0, FP_W1, FP_BATCH_TOKENS = range(12)
N_FP = 12
# int parameters
IP_NODES, IP_TARGETS, IP_GPUS, IP_PS, IP_UPLINK = range(5)
N_IP = 5

# events
EV_DRAM, EV_TIER, EV_RESTORED, EV_GPU_A, EV_LINK_DONE, EV_CLIENT, EV_PS, EV_BATCH_END, EV_WRITE = range(9)

# request slot fields: float
QA, QT1, QBD, QBL, QBF, QS, QK, QSA, QWL, QWF = range(10)
N_QF = 10
# request slot fields: int
QI_NODE, QI_MEAS, QI_JOIN, QI_GPU_JOIN, QI_RESTORE, QI_STAGE = range(6)
N_QI = 6

# job fields: float / int
JW, JK, JT, JTAG = range(4)
N_JF = 4
JI_SLOT, JI_PART, JI_STATION, JI_NEXT = range(4)
N_JI = 4
PART_ONLY, PART_A, PART_B = 0, 1, 2

# station fields: float
SF_FREE, SF_V, SF_VT, SF_N, SF_LAST, SF_AREA, SF_BUSY, SF_BUSY_START, SF_JOBS, SF_SOJOURN, SF_WORK = range(11)
# a link's congestion window: from CW0 to CW1 it serves at CWX times its rate (1: no window)
SF_CW0, SF_CW1, SF_CWX = 11, 12, 13
N_SF = 14
# station fields: int
SI_HEAD, SI_TAIL, SI_VERSION = range(3)
N_SI = 3

# run counters
C_HEAP, C_SEQ, C_FREE_SLOTS, C_FREE_JOBS, C_STATUS, C_OVER_STATION, C_INFLIGHT, C_DONE = range(8)
N_C = 8
# outcomes: float
O_OVER_FROM, O_OVER_AT, O_BYTES_D, O_BYTES_L, O_BYTES_F, O_LAST_T, O_PACER = range(7)
N_O = 7
# branches of measured requests
B_NONE, B_RESTORE, B_RECOMPUTE = range(3)

RUNNING, GROW, OVERLOADED = 0, 1, 2
assert (C_HEAP, C_SEQ) == (event_heap.SIZE, event_heap.SEQ)  # the heap's counters in ``cnt``


@njit(**NJIT)
def overlap(a, b, w0, w1):
    lo = a if a > w0 else w0
    hi = b if b < w1 else w1
    return hi - lo if hi > lo else 0.0


@njit(**NJIT)
def wait_bin(w):
    if w <= 0.0:
        return 0
    i = int(math.ceil(WAIT_BINS_PER_OCTAVE * math.log2(w / WAIT_BIN0_S)))
    if i < 1:
        return 1
    return i if i < N_WAIT_BINS else N_WAIT_BINS - 1


@njit(**NJIT)
def count(sf, s, now, delta, fp):
    """Jobs present at station s change by ``delta`` at ``now``: the integral first."""
    sf[s, SF_AREA] += sf[s, SF_N] * overlap(sf[s, SF_LAST], now, fp[FP_W0], fp[FP_W1])
    sf[s, SF_LAST] = now
    sf[s, SF_N] += delta


@njit(**NJIT)
def overload(cnt, out, s, since, now):
    if cnt[C_STATUS] != OVERLOADED:
        cnt[C_STATUS] = OVERLOADED
        cnt[C_OVER_STATION] = s
        out[O_OVER_FROM] = since
        out[O_OVER_AT] = now


@njit(**NJIT)
def finish_at(sf, s, t, w):
    """When link s, serving from ``t``, has done ``w`` seconds of work at its full rate
    (``x`` times that rate in its congestion window ``[CW0, CW1)``)."""
    x = sf[s, SF_CWX]
    if x == 1.0:
        return t + w
    c0, c1 = sf[s, SF_CW0], sf[s, SF_CW1]
    if t < c0:
        cap = c0 - t
        if w <= cap:
            return t + w
        w -= cap
        t = c0
    if t < c1:
        cap = (c1 - t) * x
        if w <= cap:
            return t + (w / x if x > 0.0 else 0.0)
        w -= cap
        t = c1
    return t + w


@njit(**NJIT)
def served(sf, s, t0, t1):
    """Full-rate work link s serves over ``[t0, t1]``."""
    d = t1 - t0
    x = sf[s, SF_CWX]
    if x == 1.0:
        return d
    lo = t0 if t0 > sf[s, SF_CW0] else sf[s, SF_CW0]
    hi = t1 if t1 < sf[s, SF_CW1] else sf[s, SF_CW1]
    if hi > lo:
        d -= (1.0 - x) * (hi - lo)
    return d


@njit(**NJIT)
def ps_advance(sf, s, now):
    n = sf[s, SF_N]
    if n > 0:
        sf[s, SF_V] += served(sf, s, sf[s, SF_VT], now) / n
    sf[s, SF_VT] = now


@njit(**NJIT)
def ps_next(sf, si, jf, ji, s, now, ht, hs, hk, ha, hb, hx, cnt):
    """Push station s's next departure (superseding any earlier one)."""
    si[s, SI_VERSION] += 1
    j = si[s, SI_HEAD]
    best = -1
    while j >= 0:
        if best < 0 or jf[j, JTAG] < jf[best, JTAG]:
            best = j
        j = ji[j, JI_NEXT]
    if best >= 0:
        left = jf[best, JTAG] - sf[s, SF_V]
        if left < 0.0:
            left = 0.0
        _push(ht, hs, hk, ha, hb, hx, cnt, finish_at(sf, s, now, left * sf[s, SF_N]), EV_PS, s,
              si[s, SI_VERSION], 0.0)


@njit(**NJIT)
def unfinished(sf, si, jf, ji, s, now, ps):
    """Work (seconds) station s holds at ``now``."""
    if ps:
        n = sf[s, SF_N]
        v = sf[s, SF_V] + (served(sf, s, sf[s, SF_VT], now) / n if n > 0 else 0.0)
        u = 0.0
        j = si[s, SI_HEAD]
        while j >= 0:
            left = jf[j, JTAG] - v
            if left > 0.0:
                u += left
            j = ji[j, JI_NEXT]
        return u
    u = sf[s, SF_FREE] - now
    return u if u > 0.0 else 0.0


@njit(**NJIT)
def predicted(sf, si, jf, ji, s, a, ps, w):
    """Seconds from ``a`` until link s would finish a job of ``w`` arriving at ``a``: the
    work it holds, then this job (FCFS: its finish; PS: the held work and this job served
    back to back, the restore deadline's estimate), through its congestion window."""
    if sf[s, SF_CWX] == 1.0:
        return unfinished(sf, si, jf, ji, s, a, ps) + w
    if ps:
        return finish_at(sf, s, a, unfinished(sf, si, jf, ji, s, a, True) + w) - a
    free = sf[s, SF_FREE]
    return finish_at(sf, s, free if free > a else a, w) - a


@njit(**NJIT)
def link_job(s, work, slot, now, meas, stype, ps, fp, cnt, out, sf, si, jf, ji, job_free, whist,
              ht, hs, hk, ha, hb, hx):
    """A job of ``work`` seconds arrives at link s (``slot`` -1: a background write)."""
    if not work < math.inf:
        overload(cnt, out, s, now, now)
        return
    w0, w1 = fp[FP_W0], fp[FP_W1]
    in_w = now >= w0 and now <= w1
    if ps:
        ps_advance(sf, s, now)
        if sf[s, SF_N] == 0:
            sf[s, SF_BUSY_START] = now
        count(sf, s, now, 1.0, fp)
        top = cnt[C_FREE_JOBS] - 1
        cnt[C_FREE_JOBS] = top
        j = job_free[top]
        jf[j, JW] = work
        jf[j, JT] = now
        jf[j, JTAG] = sf[s, SF_V] + work
        ji[j, JI_SLOT] = slot
        ji[j, JI_PART] = meas
        ji[j, JI_STATION] = s
        ji[j, JI_NEXT] = -1
        if si[s, SI_HEAD] < 0:  # append: the list keeps arrival order
            si[s, SI_HEAD] = j
        else:
            ji[si[s, SI_TAIL], JI_NEXT] = j
        si[s, SI_TAIL] = j
        if unfinished(sf, si, jf, ji, s, now, True) > fp[FP_MAX_WAIT]:
            overload(cnt, out, s, sf[s, SF_BUSY_START], now)
        ps_next(sf, si, jf, ji, s, now, ht, hs, hk, ha, hb, hx, cnt)
        return
    free = sf[s, SF_FREE]
    if free <= now:
        sf[s, SF_BUSY_START] = now
        start = now
    else:
        start = free
    finish = finish_at(sf, s, start, work)
    sf[s, SF_FREE] = finish
    sf[s, SF_BUSY] += overlap(start, finish, w0, w1)
    count(sf, s, now, 1.0, fp)
    if in_w:
        sf[s, SF_JOBS] += 1.0
        sf[s, SF_SOJOURN] += finish - now
        sf[s, SF_WORK] += work
    if slot >= 0 and meas:
        whist[stype[s], wait_bin(start - now)] += 1
    if start - now > fp[FP_MAX_WAIT]:
        overload(cnt, out, s, sf[s, SF_BUSY_START], now)
    _push(ht, hs, hk, ha, hb, hx, cnt, finish, EV_LINK_DONE, slot, s, 0.0)
