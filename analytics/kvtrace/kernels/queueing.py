"""Exact discrete-event simulation of requests through queues: links, flash targets and
GPU prefill servers (the load model of :mod:`kvtrace.analyses.load`, which documents
the model; this module is its engine, arrays in, arrays out). The slow twin
``tests/naive_queueing.py`` implements the same specification event by event.

Stations
--------
For N nodes and T flash targets the link stations are numbered: host-to-GPU link of
node n = ``n``, NIC of node n = ``N + n``, local SSD of node n = ``2N + n``, flash
target t = ``3N + t``, rack uplink = ``3N + T`` (``NL = 3N + T + 1`` links); the GPU
pool of node n is station ``NL + n`` (c servers). Rates are given as their inverses
(``inv_b[s]`` seconds per byte, ``inv_io[s]`` seconds per read; 0 = not limiting,
``inf`` = a zero rate): a link job of ``x`` bytes is ``x * inv_b[s]`` seconds of work
(a flash target's read: ``max(x * inv_b[s], reads * inv_io[s])``). A link is FCFS
(``start = max(t, free)``, ``free = start + work``) or processor sharing (each of the n
jobs present is served at rate 1/n: virtual time ``V += (now - Vt) / n`` at every event
of the link; a job arriving at ``V`` with work ``w`` has the tag ``V + w`` and leaves
when ``V`` reaches it, the smallest tag first, the earliest arrival among equal tags;
the link's next departure is pushed at ``now + max(0, tag - V) * n`` after every change,
superseding the previous one). A link may have a *congestion window* ``[c0, c1)`` in
which it serves at ``x`` times its rate (:meth:`QueueSim.congest`): a FCFS job's finish
is when the work served since its start, at rate ``x`` inside the window and 1 outside,
reaches its work; PS virtual time advances by the work served over an interval divided
by n, and a departure is pushed when the work served reaches ``(tag - V) n``. A GPU
pool is a FIFO queue and c servers: the jobs
arrive at the queue's tail; whenever a server is free (lowest-numbered first) and the
queue is not empty, the server takes the head job and, with a batch budget
``batch_tokens > 0``, each following job while the batch's tokens stay ``<=`` the
budget; the batch lasts ``pass_s + sum of its jobs' work`` (summed in queue order) and
all its jobs leave at its end.

A request
---------
Inputs per request (in arrival order): arrival ``a``, node ``n``, bytes read from DRAM
``bd``, from the local SSD ``bl``, from the shared flash ``bf`` (``bft[t]`` bytes and
``rft[t]`` reads per target), GPU work (seconds) and tokens of the prompt's uncached
rest ``s_rest``, ``k_rest`` and of recomputing the flash part instead ``s_fl``,
``k_fl``, bytes its touches wrote to the local SSD ``wl`` and to the shared flash
``wf``. With ``t1 = a + route_s`` and ``B = bl + bf``:

1. *Arrival* (restore or recompute): if ``B > 0`` it restores iff ``flash_fixed + m <=
   s_fl``, with ``m`` the max of ``B * client`` and, for each tier station s the
   restore would use (host link, local SSD if ``bl > 0``, targets with ``bft[t] > 0``,
   NIC and uplink if ``bf > 0``), ``U_s + w_s``: the work s holds at ``a`` (FCFS:
   ``max(0, free - a)``; PS: the sum of ``max(0, tag - V(a))``) plus the request's
   work there (through a congestion window: the time from ``a`` until s would finish
   it, FCFS from ``max(a, free)``, PS serving ``U_s + w_s`` from ``a``). Restoring,
   the GPU work is ``S = s_rest`` (tokens ``k_rest``), else ``s_rest + s_fl``
   (``k_rest + k_fl``); without B, ``s_rest``.
2. *DRAM restore* if ``bd > 0``: at ``t1 + dram_fixed`` a job of ``bd`` on the host link.
3. *Tier restore* if it restores and ``B > 0``: at ``flash_fixed`` after the DRAM
   restore's end (after ``t1`` without one), jobs in this order: host link ``B``;
   local SSD ``bl`` if ``bl > 0``; target t ``bft[t]`` for each t with ``bft[t] > 0``;
   NIC ``bf`` then uplink ``bf`` (if there is one) if ``bf > 0``; then a delay of
   ``B * client`` (the per-request read rate). The restore ends when all have ended.
   Without a restore stage the "restore" ends at ``t1`` (an event).
4. *Prefill* on the node's GPU pool when the restore has ended: one job of S (tokens
   ``K``). With an overlap fraction ``phi > 0``, ``S > 0`` and a restore stage (``bd >
   0`` or step 3), a job A of ``phi * S`` (tokens ``K * phi``) joins the queue at
   ``t1`` and the job B of ``S - phi * S`` (tokens ``K * (1 - phi)``) when both the
   restore and A have ended. ``S = 0``: no GPU job.
5. *First token* when the last prefill job (else the restore) ends, plus ``decode_s``:
   ``TTFT = (end + decode_s) - a``. Then its writes leave in the background: ``wl``
   as a local-SSD job; ``wf`` is issued at ``max(now, pacer)`` with ``pacer = issue +
   wf * write`` (the write budget, seconds per byte; 0 = none), as jobs of ``wf / T``
   on each target, ``wf`` on the NIC and on the uplink.

A *transfer* (a background move into a node's DRAM: a prefetch, a prewarm) is an
input row of its own, in the same arrival order, flagged ``transfer``: at ``a``, with
no route delay, slot or GPU work, jobs in this order: local SSD ``bl`` if ``bl > 0``;
target t ``bft[t]`` (reads ``rft[t]``) for each t with ``bft[t] > 0``; NIC ``bf`` then
uplink ``bf`` if ``bf > 0``. Like the background writes it loads the links and counts
in their figures, but has no TTFT, branch, bytes read or queue-wait sample.

Events and their order
----------------------
Every stage entry is an event ``(time, seq)`` on one heap, ``seq`` counting pushes, so
events of equal time run in the order they were pushed. Before the arrival of a
request at ``a`` every event with time ``<= a`` runs; an arrival pushes, in order,
job A's entry (if any) and its first stage's (DRAM restore, tier restore or restore
end). A FCFS link job pushes its departure at its finish; a PS job its link's next
departure. A batch pushes its end when it starts. A batch end frees its server,
completes its jobs in batch order (job A: the request's B when the restore has ended
too; else the request's first token), then starts batches; a restore end queues the
prefill and starts batches.

Measurement and overload
------------------------
Stations' figures cover the window ``[w0, w1]`` (the measured arrivals): busy time
(FCFS: each job's ``[start, finish]``; PS: each busy period; a GPU pool: each batch, in
server-seconds), the time-integral of the jobs present (a GPU pool's: queued and in
service), and the jobs that arrived in it with their summed sojourn and work. Queue
waits (FCFS and GPU: start - arrival; PS: sojourn - work) of request jobs (not
background writes) of measured requests go to a histogram per station type: bin 0 no
wait, bin i >= 1 ``1e-6 x 2**((i-1)/64) < wait <= 1e-6 x 2**(i/64)`` s (the last bin
open). The run stops, *overloaded* at a station, when a job there would start after
waiting more than ``max_wait`` s (FCFS, GPU: at its start; PS: when the work it holds
passes ``max_wait``) or has infinite work (a zero rate; no GPU); the overload is dated
from the start of the station's busy period (for a GPU pool: since its queue formed).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from kvtrace.config import NJIT
from kvtrace.kernels.event_heap import pop as _pop, push as _push
from kvtrace.kernels.queue_links import (  # noqa: F401  (the record layouts are this module's too)
    FP_ROUTE, FP_DRAM_FIXED, FP_FLASH_FIXED, FP_CLIENT_S_PER_B, FP_WRITE_S_PER_B, FP_OVERLAP, FP_PASS, FP_DECODE,
    FP_MAX_WAIT, FP_W0, FP_W1, FP_BATCH_TOKENS,
    HOST, NIC, LOCAL_SSD, FLASH, UPLINK, GPU, STATION_TYPES, WAIT_BINS_PER_OCTAVE, WAIT_BIN0_S, N_WAIT_BINS, N_FP,
    IP_NODES, IP_TARGETS, IP_GPUS, IP_PS, IP_UPLINK, N_IP, EV_DRAM, EV_TIER, EV_RESTORED, EV_GPU_A, EV_LINK_DONE,
    EV_CLIENT, EV_PS, EV_BATCH_END, EV_WRITE, QA, QT1, QBD, QBL, QBF, QS, QK, QSA, QWL, QWF, N_QF, QI_NODE, QI_MEAS,
    QI_JOIN, QI_GPU_JOIN, QI_RESTORE, QI_STAGE, N_QI, JW, JK, JT, JTAG, N_JF, JI_SLOT, JI_PART, JI_STATION, JI_NEXT,
    N_JI, PART_ONLY, PART_A, PART_B, SF_FREE, SF_V, SF_VT, SF_N, SF_LAST, SF_AREA, SF_BUSY, SF_BUSY_START, SF_JOBS,
    SF_SOJOURN, SF_WORK, SF_CW0, SF_CW1, SF_CWX, N_SF, SI_HEAD, SI_TAIL, SI_VERSION, N_SI, C_HEAP, C_SEQ,
    C_FREE_SLOTS, C_FREE_JOBS, C_STATUS, C_OVER_STATION, C_INFLIGHT, C_DONE, N_C, O_OVER_FROM, O_OVER_AT, O_BYTES_D,
    O_BYTES_L, O_BYTES_F, O_LAST_T, O_PACER, N_O, B_NONE, B_RESTORE, B_RECOMPUTE, RUNNING, GROW, OVERLOADED, overlap,
    wait_bin, count, overload, finish_at, served, ps_advance, ps_next, unfinished, predicted, link_job)


@njit(**NJIT)
def _gpu_job(node, slot, part, work, tokens, now, NL, fp, ip, cnt, out, sf, si, jf, ji, job_free, gsrv, gstart):
    s = NL + node
    if ip[IP_GPUS] == 0 or not work < math.inf:
        overload(cnt, out, s, now, now)
        return
    count(sf, s, now, 1.0, fp)
    top = cnt[C_FREE_JOBS] - 1
    cnt[C_FREE_JOBS] = top
    j = job_free[top]
    jf[j, JW] = work
    jf[j, JK] = tokens
    jf[j, JT] = now
    ji[j, JI_SLOT] = slot
    ji[j, JI_PART] = part
    ji[j, JI_STATION] = s
    ji[j, JI_NEXT] = -1
    if si[s, SI_HEAD] < 0:
        si[s, SI_HEAD] = j
        busy = True
        for k in range(ip[IP_GPUS]):
            if gsrv[node, k] < 0:
                busy = False
                break
        if busy:
            sf[s, SF_BUSY_START] = now  # a queue starts forming
    else:
        ji[si[s, SI_TAIL], JI_NEXT] = j
    si[s, SI_TAIL] = j


@njit(**NJIT)
def _start_batches(node, now, NL, fp, ip, cnt, out, sf, si, jf, ji, qi, gsrv, gstart, whist,
                   ht, hs, hk, ha, hb, hx):
    s = NL + node
    budget = fp[FP_BATCH_TOKENS]
    w0, w1 = fp[FP_W0], fp[FP_W1]
    for k in range(ip[IP_GPUS]):
        if si[s, SI_HEAD] < 0:
            return
        if gsrv[node, k] >= 0:
            continue
        first = si[s, SI_HEAD]
        last = first
        tokens = jf[first, JK]
        work = jf[first, JW]
        if budget > 0:
            nxt = ji[last, JI_NEXT]
            while nxt >= 0 and tokens + jf[nxt, JK] <= budget:
                tokens += jf[nxt, JK]
                work += jf[nxt, JW]
                last = nxt
                nxt = ji[last, JI_NEXT]
        si[s, SI_HEAD] = ji[last, JI_NEXT]
        ji[last, JI_NEXT] = -1
        finish = now + (fp[FP_PASS] + work)
        gsrv[node, k] = first
        gstart[node, k] = now
        sf[s, SF_BUSY] += overlap(now, finish, w0, w1)
        j = first
        while j >= 0:
            t = jf[j, JT]
            if t >= w0 and t <= w1:
                sf[s, SF_JOBS] += 1.0
                sf[s, SF_SOJOURN] += finish - t
                sf[s, SF_WORK] += jf[j, JW]
            if qi[ji[j, JI_SLOT], QI_MEAS]:
                whist[GPU, wait_bin(now - t)] += 1
            if now - t > fp[FP_MAX_WAIT]:
                overload(cnt, out, s, sf[s, SF_BUSY_START], now)
            j = ji[j, JI_NEXT]
        _push(ht, hs, hk, ha, hb, hx, cnt, finish, EV_BATCH_END, node, k, 0.0)


@njit(**NJIT)
def _finish(slot, now, fp, ip, cnt, out, ttft, qf, qi, qrid, slot_free, sf, si, jf, ji, job_free, stype, inv_b,
            whist, ht, hs, hk, ha, hb, hx):
    """Request ``slot`` has its first token: record it, send its writes, free the slot."""
    r = qrid[slot]
    if r >= 0:
        ttft[r] = (now + fp[FP_DECODE]) - qf[slot, QA]
        cnt[C_DONE] += 1
    N = ip[IP_NODES]
    n = qi[slot, QI_NODE]
    if qf[slot, QWL] > 0:
        s = 2 * N + n
        link_job(s, qf[slot, QWL] * inv_b[s], -1, now, 0, stype, ip[IP_PS] != 0, fp, cnt, out, sf, si, jf, ji,
                  job_free, whist, ht, hs, hk, ha, hb, hx)
    wf = qf[slot, QWF]
    if wf > 0:
        issue = out[O_PACER] if out[O_PACER] > now else now
        out[O_PACER] = issue + wf * fp[FP_WRITE_S_PER_B]
        _push(ht, hs, hk, ha, hb, hx, cnt, issue, EV_WRITE, n, 0, wf)
    top = cnt[C_FREE_SLOTS]
    slot_free[top] = slot
    cnt[C_FREE_SLOTS] = top + 1
    cnt[C_INFLIGHT] -= 1


@njit(**NJIT)
def _transfer(n, now, bl, bf, bft, rft, N, T, ps, fp, ip, stype, inv_b, inv_io, cnt, out, sf, si, jf, ji, job_free,
              whist, ht, hs, hk, ha, hb, hx):
    """A transfer's jobs (the module docstring), all issued at ``now``."""
    if bl > 0:
        s = 2 * N + n
        link_job(s, bl * inv_b[s], -1, now, 0, stype, ps, fp, cnt, out, sf, si, jf, ji, job_free, whist,
                 ht, hs, hk, ha, hb, hx)
    for t in range(T):
        if bft[t] > 0:
            s = 3 * N + t
            link_job(s, max(bft[t] * inv_b[s], rft[t] * inv_io[s]), -1, now, 0, stype, ps, fp, cnt, out, sf, si, jf,
                     ji, job_free, whist, ht, hs, hk, ha, hb, hx)
    if bf > 0:
        s = N + n
        link_job(s, bf * inv_b[s], -1, now, 0, stype, ps, fp, cnt, out, sf, si, jf, ji, job_free, whist,
                 ht, hs, hk, ha, hb, hx)
        if ip[IP_UPLINK]:
            s = 3 * N + T
            link_job(s, bf * inv_b[s], -1, now, 0, stype, ps, fp, cnt, out, sf, si, jf, ji, job_free, whist,
                     ht, hs, hk, ha, hb, hx)


@njit(**NJIT)
def _run(a_, node_, meas_, rix_, bd_, bl_, bf_, bft_, rft_, srest_, kr_, sfl_, kfl_, wl_, wf_, tr_, start,
         fp, ip, stype, inv_b, inv_io, cnt, out, branches, ttft, whist,
         ht, hs, hk, ha, hb, hx, qf, qi, qtb, qrid, slot_free, jf, ji, job_free, sf, si, gsrv, gstart, final):
    """Run the requests ``start..`` of a batch (then, with ``final``, every remaining
    event). Returns the index to resume at after the caller grew the tables
    (``cnt[C_STATUS] == GROW``), else the batch's length."""
    N = ip[IP_NODES]
    T = ip[IP_TARGETS]
    ps = ip[IP_PS] != 0
    NL = 3 * N + T + 1
    phi = fp[FP_OVERLAP]
    m = a_.shape[0]
    i = start
    while True:
        horizon = a_[i] if i < m else math.inf
        if i >= m and not final:
            return m
        # ---- events up to the next arrival
        while cnt[C_HEAP] > 0 and ht[0] <= horizon:
            if cnt[C_HEAP] + 2 * cnt[C_INFLIGHT] + 4 * T + 64 + ip[IP_GPUS] > ht.shape[0] or \
                    cnt[C_FREE_JOBS] < 2 * cnt[C_INFLIGHT] + 2 * T + 16:
                cnt[C_STATUS] = GROW
                return i
            now, kind, ea, eb, ex = ht[0], hk[0], ha[0], hb[0], hx[0]
            _pop(ht, hs, hk, ha, hb, hx, cnt)
            out[O_LAST_T] = now
            done_slot = -1  # a request whose restore ended here
            finish_slot = -1  # a request whose prefill ended here
            if kind == EV_LINK_DONE or kind == EV_CLIENT or kind == EV_PS:
                slot = ea
                if kind == EV_LINK_DONE:
                    count(sf, eb, now, -1.0, fp)
                elif kind == EV_PS:
                    s = ea
                    if eb != si[s, SI_VERSION]:
                        continue
                    ps_advance(sf, s, now)
                    best = -1
                    prev_best = -1
                    prev = -1
                    j = si[s, SI_HEAD]
                    while j >= 0:
                        if best < 0 or jf[j, JTAG] < jf[best, JTAG]:
                            best = j
                            prev_best = prev
                        prev = j
                        j = ji[j, JI_NEXT]
                    nxt = ji[best, JI_NEXT]
                    if prev_best < 0:
                        si[s, SI_HEAD] = nxt
                    else:
                        ji[prev_best, JI_NEXT] = nxt
                    if si[s, SI_TAIL] == best:
                        si[s, SI_TAIL] = prev_best
                    count(sf, s, now, -1.0, fp)
                    t = jf[best, JT]
                    if t >= fp[FP_W0] and t <= fp[FP_W1]:
                        sf[s, SF_JOBS] += 1.0
                        sf[s, SF_SOJOURN] += now - t
                        sf[s, SF_WORK] += jf[best, JW]
                    slot = ji[best, JI_SLOT]
                    if slot >= 0 and ji[best, JI_PART]:
                        whist[stype[s], wait_bin(now - t - jf[best, JW])] += 1
                    if sf[s, SF_N] == 0:
                        sf[s, SF_BUSY] += overlap(sf[s, SF_BUSY_START], now, fp[FP_W0], fp[FP_W1])
                    top = cnt[C_FREE_JOBS]
                    job_free[top] = best
                    cnt[C_FREE_JOBS] = top + 1
                    ps_next(sf, si, jf, ji, s, now, ht, hs, hk, ha, hb, hx, cnt)
                if slot >= 0:
                    qi[slot, QI_JOIN] -= 1
                    if qi[slot, QI_JOIN] == 0:
                        if qi[slot, QI_STAGE] == 1 and qi[slot, QI_RESTORE] and qf[slot, QBL] + qf[slot, QBF] > 0:
                            _push(ht, hs, hk, ha, hb, hx, cnt, now + fp[FP_FLASH_FIXED], EV_TIER, slot, 0, 0.0)
                        else:
                            done_slot = slot
            elif kind == EV_DRAM:
                slot = ea
                qi[slot, QI_STAGE] = 1
                qi[slot, QI_JOIN] = 1
                n = qi[slot, QI_NODE]
                link_job(n, qf[slot, QBD] * inv_b[n], slot, now, qi[slot, QI_MEAS], stype, ps, fp, cnt, out, sf,
                          si, jf, ji, job_free, whist, ht, hs, hk, ha, hb, hx)
            elif kind == EV_TIER:
                slot = ea
                qi[slot, QI_STAGE] = 2
                n = qi[slot, QI_NODE]
                meas = qi[slot, QI_MEAS]
                B = qf[slot, QBL] + qf[slot, QBF]
                qi[slot, QI_JOIN] = 1
                link_job(n, B * inv_b[n], slot, now, meas, stype, ps, fp, cnt, out, sf, si, jf, ji, job_free,
                          whist, ht, hs, hk, ha, hb, hx)
                if qf[slot, QBL] > 0:
                    qi[slot, QI_JOIN] += 1
                    s = 2 * N + n
                    link_job(s, qf[slot, QBL] * inv_b[s], slot, now, meas, stype, ps, fp, cnt, out, sf, si, jf,
                              ji, job_free, whist, ht, hs, hk, ha, hb, hx)
                for t in range(T):
                    if qtb[slot, t] > 0:
                        qi[slot, QI_JOIN] += 1
                        s = 3 * N + t
                        w = max(qtb[slot, t] * inv_b[s], qtb[slot, T + t] * inv_io[s])
                        link_job(s, w, slot, now, meas, stype, ps, fp, cnt, out, sf, si, jf, ji, job_free, whist,
                                  ht, hs, hk, ha, hb, hx)
                if qf[slot, QBF] > 0:
                    qi[slot, QI_JOIN] += 1
                    s = N + n
                    link_job(s, qf[slot, QBF] * inv_b[s], slot, now, meas, stype, ps, fp, cnt, out, sf, si, jf,
                              ji, job_free, whist, ht, hs, hk, ha, hb, hx)
                    if ip[IP_UPLINK]:
                        qi[slot, QI_JOIN] += 1
                        s = 3 * N + T
                        link_job(s, qf[slot, QBF] * inv_b[s], slot, now, meas, stype, ps, fp, cnt, out, sf, si,
                                  jf, ji, job_free, whist, ht, hs, hk, ha, hb, hx)
                qi[slot, QI_JOIN] += 1
                _push(ht, hs, hk, ha, hb, hx, cnt, now + B * fp[FP_CLIENT_S_PER_B], EV_CLIENT, slot, 0, 0.0)
            elif kind == EV_RESTORED:
                done_slot = ea
            elif kind == EV_GPU_A:
                slot = ea
                _gpu_job(qi[slot, QI_NODE], slot, PART_A, qf[slot, QSA], qf[slot, QK] * phi, now, NL, fp, ip, cnt,
                         out, sf, si, jf, ji, job_free, gsrv, gstart)
                _start_batches(qi[slot, QI_NODE], now, NL, fp, ip, cnt, out, sf, si, jf, ji, qi, gsrv, gstart,
                               whist, ht, hs, hk, ha, hb, hx)
            elif kind == EV_BATCH_END:
                node, k = ea, eb
                s = NL + node
                j = gsrv[node, k]
                gsrv[node, k] = -1
                while j >= 0:
                    nxt = ji[j, JI_NEXT]
                    count(sf, s, now, -1.0, fp)
                    slot = ji[j, JI_SLOT]
                    part = ji[j, JI_PART]
                    top = cnt[C_FREE_JOBS]
                    job_free[top] = j
                    cnt[C_FREE_JOBS] = top + 1
                    if part == PART_A:
                        qi[slot, QI_GPU_JOIN] -= 1
                        if qi[slot, QI_GPU_JOIN] == 0:
                            _gpu_job(node, slot, PART_B, qf[slot, QS] - qf[slot, QSA], qf[slot, QK] * (1.0 - phi),
                                     now, NL, fp, ip, cnt, out, sf, si, jf, ji, job_free, gsrv, gstart)
                    else:
                        _finish(slot, now, fp, ip, cnt, out, ttft, qf, qi, qrid, slot_free, sf, si, jf, ji, job_free,
                                stype, inv_b, whist, ht, hs, hk, ha, hb, hx)
                    j = nxt
                _start_batches(node, now, NL, fp, ip, cnt, out, sf, si, jf, ji, qi, gsrv, gstart, whist,
                               ht, hs, hk, ha, hb, hx)
            elif kind == EV_WRITE:  # a background write of ex bytes to the shared flash leaves node ea
                n = ea
                for t in range(T):
                    s = 3 * N + t
                    link_job(s, ex / T * inv_b[s], -1, now, 0, stype, ps, fp, cnt, out, sf, si, jf, ji, job_free,
                              whist, ht, hs, hk, ha, hb, hx)
                s = N + n
                link_job(s, ex * inv_b[s], -1, now, 0, stype, ps, fp, cnt, out, sf, si, jf, ji, job_free, whist,
                          ht, hs, hk, ha, hb, hx)
                if ip[IP_UPLINK]:
                    s = 3 * N + T
                    link_job(s, ex * inv_b[s], -1, now, 0, stype, ps, fp, cnt, out, sf, si, jf, ji, job_free,
                              whist, ht, hs, hk, ha, hb, hx)
            if done_slot >= 0:
                slot = done_slot
                qi[slot, QI_GPU_JOIN] -= 1
                if qi[slot, QI_GPU_JOIN] == 0:
                    if qf[slot, QS] > 0:
                        part = PART_B if qf[slot, QSA] > 0 else PART_ONLY
                        _gpu_job(qi[slot, QI_NODE], slot, part, qf[slot, QS] - qf[slot, QSA],
                                 qf[slot, QK] * (1.0 - phi) if part == PART_B else qf[slot, QK], now, NL, fp, ip,
                                 cnt, out, sf, si, jf, ji, job_free, gsrv, gstart)
                        _start_batches(qi[slot, QI_NODE], now, NL, fp, ip, cnt, out, sf, si, jf, ji, qi, gsrv,
                                       gstart, whist, ht, hs, hk, ha, hb, hx)
                    else:
                        finish_slot = slot
            if finish_slot >= 0:
                _finish(finish_slot, now, fp, ip, cnt, out, ttft, qf, qi, qrid, slot_free, sf, si, jf, ji, job_free,
                        stype, inv_b, whist, ht, hs, hk, ha, hb, hx)
            if cnt[C_STATUS] == OVERLOADED:
                return i
        if i >= m:
            return m
        # ---- the arrival of request i
        if cnt[C_FREE_SLOTS] == 0 or cnt[C_HEAP] + 2 * cnt[C_INFLIGHT] + 4 * T + 64 + ip[IP_GPUS] > ht.shape[0] or \
                cnt[C_FREE_JOBS] < 2 * cnt[C_INFLIGHT] + 2 * T + 16:
            cnt[C_STATUS] = GROW
            return i
        if tr_[i]:
            _transfer(node_[i], a_[i], bl_[i], bf_[i], bft_[i], rft_[i], N, T, ps, fp, ip, stype, inv_b, inv_io, cnt,
                      out, sf, si, jf, ji, job_free, whist, ht, hs, hk, ha, hb, hx)
            if cnt[C_STATUS] == OVERLOADED:
                return i
            i += 1
            continue
        top = cnt[C_FREE_SLOTS] - 1
        cnt[C_FREE_SLOTS] = top
        slot = slot_free[top]
        cnt[C_INFLIGHT] += 1
        a = a_[i]
        n = node_[i]
        meas = meas_[i]
        qrid[slot] = rix_[i]
        qi[slot, QI_NODE] = n
        qi[slot, QI_MEAS] = meas
        qf[slot, QA] = a
        t1 = a + fp[FP_ROUTE]
        qf[slot, QT1] = t1
        bd, bl, bf = bd_[i], bl_[i], bf_[i]
        qf[slot, QBD] = bd
        qf[slot, QBL] = bl
        qf[slot, QBF] = bf
        for t in range(T):
            qtb[slot, t] = bft_[i, t]
            qtb[slot, T + t] = rft_[i, t]
        qf[slot, QWL] = wl_[i]
        qf[slot, QWF] = wf_[i]
        B = bl + bf
        restore = True
        if B > 0:
            best = B * fp[FP_CLIENT_S_PER_B]
            w = predicted(sf, si, jf, ji, n, a, ps, B * inv_b[n])
            best = w if w > best else best
            if bl > 0:
                s = 2 * N + n
                w = predicted(sf, si, jf, ji, s, a, ps, bl * inv_b[s])
                best = w if w > best else best
            if bf > 0:
                for t in range(T):
                    if bft_[i, t] > 0:
                        s = 3 * N + t
                        w = predicted(sf, si, jf, ji, s, a, ps, max(bft_[i, t] * inv_b[s], rft_[i, t] * inv_io[s]))
                        best = w if w > best else best
                s = N + n
                w = predicted(sf, si, jf, ji, s, a, ps, bf * inv_b[s])
                best = w if w > best else best
                if ip[IP_UPLINK]:
                    s = 3 * N + T
                    w = predicted(sf, si, jf, ji, s, a, ps, bf * inv_b[s])
                    best = w if w > best else best
            restore = fp[FP_FLASH_FIXED] + best <= sfl_[i]
        qi[slot, QI_RESTORE] = restore
        work = srest_[i] if restore else srest_[i] + sfl_[i]
        tokens = kr_[i] if restore else kr_[i] + kfl_[i]
        qf[slot, QS] = work
        qf[slot, QK] = tokens
        if meas:
            branches[B_NONE if B == 0 else (B_RESTORE if restore else B_RECOMPUTE)] += 1
            out[O_BYTES_D] += bd
            if restore:
                out[O_BYTES_L] += bl
                out[O_BYTES_F] += bf
        has_restore = bd > 0 or (restore and B > 0)
        qi[slot, QI_STAGE] = 0
        if phi > 0 and has_restore and work > 0:
            qf[slot, QSA] = phi * work
            qi[slot, QI_GPU_JOIN] = 2
            _push(ht, hs, hk, ha, hb, hx, cnt, t1, EV_GPU_A, slot, 0, 0.0)
        else:
            qf[slot, QSA] = 0.0
            qi[slot, QI_GPU_JOIN] = 1
        if bd > 0:
            _push(ht, hs, hk, ha, hb, hx, cnt, t1 + fp[FP_DRAM_FIXED], EV_DRAM, slot, 0, 0.0)
        elif restore and B > 0:
            qi[slot, QI_STAGE] = 1
            _push(ht, hs, hk, ha, hb, hx, cnt, t1 + fp[FP_FLASH_FIXED], EV_TIER, slot, 0, 0.0)
        else:
            _push(ht, hs, hk, ha, hb, hx, cnt, t1, EV_RESTORED, slot, 0, 0.0)
        i += 1


def _grown(a: np.ndarray, n: int, fill=0) -> np.ndarray:
    """``a`` with its first axis grown to ``n`` rows (the new ones ``fill``)."""
    out = np.full((n,) + a.shape[1:], fill, dtype=a.dtype)
    out[:a.shape[0]] = a
    return out


class QueueSim:
    """The state of one simulation, fed requests in arrival order batch by batch
    (:meth:`feed`) with the results of one call over all of them; per-request state
    is held only while a request is in flight (tables grow by doubling).

    Parameters
    ----------
    nodes, targets, gpus : int
        Nodes, flash targets, GPU servers per node.
    inv_rate : float64[3N + T + 1]
        Seconds per byte of each link station (0 for a link that is not limiting;
        ``inf`` for one of zero rate); ``inv_iops`` seconds per read (flash targets).
    fp : float64[N_FP]
        The ``FP_*`` parameters.
    ps : bool
        Processor sharing on links (else FCFS).
    uplink : bool
        Shared-flash traffic crosses a rack uplink.
    n_measured : int
        Measured requests (their TTFTs are kept by index).
    """

    def __init__(self, nodes: int, targets: int, gpus: int, inv_rate, inv_iops, fp, *, ps: bool, uplink: bool,
                 n_measured: int) -> None:
        N, T = int(nodes), int(targets)
        self.N, self.T, self.NL = N, T, 3 * N + T + 1
        NS = self.NL + N
        self.ip = np.array([N, T, int(gpus), int(ps), int(uplink)], dtype=np.int64)
        self.fp = np.asarray(fp, dtype=np.float64).copy()
        self.inv_b = np.asarray(inv_rate, dtype=np.float64).copy()
        self.inv_io = np.asarray(inv_iops, dtype=np.float64).copy()
        self.stype = np.array([HOST] * N + [NIC] * N + [LOCAL_SSD] * N + [FLASH] * T + [UPLINK] + [GPU] * N,
                              dtype=np.int64)
        self.cnt = np.zeros(N_C, dtype=np.int64)
        self.out = np.zeros(N_O, dtype=np.float64)
        self.branches = np.zeros(3, dtype=np.int64)
        self.ttft = np.full(int(n_measured), np.nan, dtype=np.float64)
        self.whist = np.zeros((len(STATION_TYPES), N_WAIT_BINS), dtype=np.int64)
        self.sf = np.zeros((NS, N_SF), dtype=np.float64)
        self.sf[:, SF_CW0] = self.sf[:, SF_CW1] = math.inf
        self.sf[:, SF_CWX] = 1.0
        self.si = np.full((NS, N_SI), -1, dtype=np.int64)
        self.si[:, SI_VERSION] = 0
        self.gsrv = np.full((N, max(1, int(gpus))), -1, dtype=np.int64)
        self.gstart = np.zeros((N, max(1, int(gpus))), dtype=np.float64)
        self._alloc_heap(1024)
        self._alloc_slots(256)
        self._alloc_jobs(1024)

    def _alloc_heap(self, n: int) -> None:
        old = getattr(self, "heap", None)
        kinds = (np.float64, np.int64, np.int64, np.int64, np.int64, np.float64)
        self.heap = tuple(np.zeros(n, dtype=k) if old is None else _grown(h, n) for h, k in
                          zip(old or (None,) * 6, kinds))

    def _alloc_slots(self, n: int) -> None:
        old = 0 if not hasattr(self, "qf") else self.qf.shape[0]
        if old == 0:
            self.qf = np.zeros((n, N_QF), dtype=np.float64)
            self.qi = np.zeros((n, N_QI), dtype=np.int64)
            self.qtb = np.zeros((n, 2 * self.T), dtype=np.float64)
            self.qrid = np.full(n, -1, dtype=np.int64)
            self.slot_free = np.arange(n - 1, -1, -1, dtype=np.int64)
            self.cnt[C_FREE_SLOTS] = n
            return
        self.qf, self.qi, self.qtb = _grown(self.qf, n), _grown(self.qi, n), _grown(self.qtb, n)
        self.qrid = _grown(self.qrid, n, -1)
        free = self.slot_free[:self.cnt[C_FREE_SLOTS]]
        self.slot_free = np.concatenate([np.arange(n - 1, old - 1, -1, dtype=np.int64), free,
                                         np.zeros(old - free.shape[0], dtype=np.int64)])
        self.cnt[C_FREE_SLOTS] += n - old

    def _alloc_jobs(self, n: int) -> None:
        old = 0 if not hasattr(self, "jf") else self.jf.shape[0]
        if old == 0:
            self.jf = np.zeros((n, N_JF), dtype=np.float64)
            self.ji = np.zeros((n, N_JI), dtype=np.int64)
            self.job_free = np.arange(n - 1, -1, -1, dtype=np.int64)
            self.cnt[C_FREE_JOBS] = n
            return
        self.jf, self.ji = _grown(self.jf, n), _grown(self.ji, n)
        free = self.job_free[:self.cnt[C_FREE_JOBS]]
        self.job_free = np.concatenate([np.arange(n - 1, old - 1, -1, dtype=np.int64), free,
                                        np.zeros(old - free.shape[0], dtype=np.int64)])
        self.cnt[C_FREE_JOBS] += n - old

    def congest(self, station: int, start: float, end: float, share: float) -> None:
        """Link ``station`` serves at ``share`` of its rate from ``start`` to ``end``
        (seconds, the arrivals' clock): its congestion window (one per link)."""
        if not 0.0 <= share <= 1.0:
            raise ValueError("a congestion window's share of the rate is in [0, 1]")
        if station >= self.NL:
            raise ValueError("only links have congestion windows")
        self.sf[station, SF_CW0] = float(start)
        self.sf[station, SF_CW1] = float(end)
        self.sf[station, SF_CWX] = float(share) if end > start else 1.0

    @property
    def overloaded(self) -> bool:
        return bool(self.cnt[C_STATUS] == OVERLOADED)

    def feed(self, arrival, node, measured_index, bd, bl, bf, bft, rft, s_rest, k_rest, s_fl, k_fl, wl, wf,
             final: bool = False, transfer=None) -> None:
        """Requests in arrival order (after those of earlier calls): per-request arrays
        (``bft``, ``rft``: [m, T]); ``measured_index`` -1 for a warm-up request;
        ``transfer`` (bool[m], default none) flags the rows that are transfers (their
        ``measured_index`` -1; only ``node, bl, bf, bft, rft`` are read). With ``final``
        the events left after the last arrival run too. A run that is :attr:`overloaded`
        ignores what follows."""
        if self.overloaded:
            return
        meas = (np.asarray(measured_index) >= 0).astype(np.int64)
        args = [np.ascontiguousarray(x, dtype=np.float64) for x in (arrival,)]
        args += [np.ascontiguousarray(node, dtype=np.int64), meas, np.ascontiguousarray(measured_index, np.int64)]
        args += [np.ascontiguousarray(x, dtype=np.float64) for x in (bd, bl, bf)]
        args += [np.ascontiguousarray(x, dtype=np.float64).reshape(-1, self.T) for x in (bft, rft)]
        args += [np.ascontiguousarray(x, dtype=np.float64) for x in (s_rest, k_rest, s_fl, k_fl, wl, wf)]
        m = args[0].shape[0]
        args.append(np.zeros(m, dtype=np.bool_) if transfer is None else np.ascontiguousarray(transfer, np.bool_))
        if transfer is not None and np.any(args[2][args[-1]]):
            raise ValueError("a transfer is not measured: its measured_index is -1")
        i = 0
        while True:
            i = _run(*args, i, self.fp, self.ip, self.stype, self.inv_b, self.inv_io, self.cnt, self.out,
                     self.branches, self.ttft, self.whist, *self.heap, self.qf, self.qi, self.qtb, self.qrid,
                     self.slot_free, self.jf, self.ji, self.job_free, self.sf, self.si, self.gsrv, self.gstart,
                     bool(final))
            if self.cnt[C_STATUS] != GROW:
                return
            self.cnt[C_STATUS] = RUNNING
            inflight = int(self.cnt[C_INFLIGHT])
            if self.cnt[C_FREE_SLOTS] == 0:
                self._alloc_slots(2 * self.qf.shape[0])
            need = int(self.cnt[C_HEAP]) + 2 * inflight + 4 * self.T + 64 + int(self.ip[IP_GPUS])
            if need > self.heap[0].shape[0]:
                self._alloc_heap(max(2 * self.heap[0].shape[0], 2 * need))
            if self.cnt[C_FREE_JOBS] < 2 * inflight + 2 * self.T + 16:
                self._alloc_jobs(2 * self.jf.shape[0] + 4 * inflight)
