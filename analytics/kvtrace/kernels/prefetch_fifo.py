"""Prestaging under a bandwidth budget, compiled: the prefetches' issues and landings
interleaved with the real requests of a stretch of the trace, each fed to the tier
kernel as it comes (:func:`run`; :mod:`kvtrace.analyses.scenario` states the
semantics). The replay's one-prefetch-at-a-time Python path
(``kvtrace.analyses.scenario.run.replay(..., compiled_fifo=False)``) is its slow twin,
equal to it access by access in the tests.

Before real request ``r`` of the stretch, in order of time (an issue before a landing
at the same time; issues in issue order; landings first in first out):

- an *issue* of prefetch k (turn ``j = targets[k]``, predicted blocks those of request
  ``srcs[k]``, in ``j``'s namespace): if measured, ``j``'s blocks not in its node's DRAM
  are marked (coverage, :func:`~kvtrace.kernels.scenario_ops.mark_absent`); the
  predicted blocks' leading run some tier of the node holds
  (:func:`~kvtrace.kernels.scenario_ops.present_prefix`) is the prefetch, its bytes not
  in DRAM its transfer: ``start = max(issue, busy)``, ``busy = start + bytes / rate``;
  it lands before the first request at or after ``busy`` (never, after the last);
- a *landing*: the leading run of the prefetch that a tier of the node still holds is
  fed as a fetch (``REQ_FETCH``) at time ``busy``; its reads are a transfer starting at
  ``start`` (:func:`~kvtrace.kernels.scenario_ops.transfer_rows`); if measured, its
  blocks land (:func:`~kvtrace.kernels.scenario_ops.land`) and the DRAM it evicted is
  counted.

The real requests between two such events are fed as one run and read what the
prefetches moved (:func:`~kvtrace.kernels.scenario_ops.account_requests`). Compiled once
per admission policy, as the tier kernel it calls (:func:`_specialise`).
"""

from __future__ import annotations

import math
import types

import numpy as np
from numba import njit

from kvtrace.config import NJIT
from kvtrace.kernels.scenario_ops import (PF_DISPLACED, account_requests, land, mark_absent, present_prefix,
                                          transfer_rows)
from kvtrace.kernels.tier_replay import SIMULATE
from kvtrace.kernels.tier_table import ABSENT, I_FIRST_MEASURED, PREV, R_SRC, REQ_FETCH, REQ_REAL
from kvtrace.kernels.tiers import HIST_MIN_EXP

# FIFO queue fields (float / int), and the run's counters
QF_END, QF_START = 0, 1
QI_K, QI_N, QI_REQ = 0, 1, 2
S_NEXT_K, S_HEAD, S_TAIL, S_SLOT, S_TRANSFERS, S_LANDED = range(6)

#: The tier kernel a compiled :func:`_run` calls, bound per policy by :func:`_specialise`.
_SIM = None


def _run(r_a, r_b, ch_r, ch_block, ch_tokens, ch_pos, ch_lrs, ch_lo, acc_block, acc_tokens, acc_pos, req_start,
         shift, rel, ts, real_tq, node, lists_d, lists_l, list_f, first, targets, srcs, issue, at, rate, bpt, size,
         t0, tshift, qf, qi, state, busy, pf_moved, pf_landed, pf_absent, pf, tr_time, tr_node, tr_rows, tr_meas,
         rec_k, rec_t, blk, tok, pos, dec1, out1, dec_chunk, rows_chunk,
         req_ts, req_tq, req_node, req_group, req_kind, values, oracle_ok, ip, fp, cap, st, used, gstat, last_val,
         sketch, sk_ops, req_level, cnt, sums, hist):
    """Real requests ``r_a..r_b - 1`` (of the chunk starting at request ``ch_r``, access
    ``ch_lo``, its arrays ``ch_*``) with the prefetch events before each (module
    docstring). The chunk's decisions go to ``dec_chunk`` and its requests' rows to
    ``rows_chunk`` (chunk-relative); ``state`` carries the next issue, the queue's
    head and tail, the next slot of the tier simulator, transfers and landings so far."""
    K = targets.shape[0]
    R = rel.shape[0]
    T = (tr_rows.shape[1] - 1) // 2
    r = r_a
    while r < r_b:
        while True:  # the prefetch events before request r
            k = state[S_NEXT_K]
            h = state[S_HEAD]
            iss = k < K and at[k] == r
            lnd = h < state[S_TAIL] and qi[h, QI_REQ] == r
            if not iss and not lnd:
                break
            if iss and (not lnd or issue[k] <= qf[h, QF_END]):
                state[S_NEXT_K] = k + 1
                j = targets[k]
                src = srcs[k]
                n_ = node[j]
                Xd, Xl = lists_d[n_], lists_l[n_]
                sh = shift[j]
                if state[S_SLOT] >= ip[I_FIRST_MEASURED]:  # a measured turn's coverage
                    jl, jh = req_start[j], req_start[j + 1]
                    for i in range(jl, jh):
                        blk[i - jl] = acc_block[i] + sh
                    mark_absent(st, blk[:jh - jl], Xd, pf_absent[jl:jh])
                m = _copy_turn(src, sh, acc_block, acc_tokens, acc_pos, req_start, blk, tok, pos)
                n = present_prefix(st, blk[:m], Xd, Xl, list_f)
                if n == 0:
                    continue
                nbytes = 0.0
                for i in range(n):
                    if st[blk[i], Xd, PREV] == ABSENT:
                        nbytes += size[blk[i]]
                start = max(issue[k], busy[0])
                busy[0] = start + nbytes * bpt / rate
                r_land = np.searchsorted(rel, busy[0], side="left")
                if r_land < R:
                    t = state[S_TAIL]
                    qf[t, QF_END] = busy[0]
                    qf[t, QF_START] = start
                    qi[t, QI_K] = k
                    qi[t, QI_N] = n
                    qi[t, QI_REQ] = r_land
                    state[S_TAIL] = t + 1
            else:
                state[S_HEAD] = h + 1
                k = qi[h, QI_K]
                j = targets[k]
                n_ = node[j]
                Xd, Xl = lists_d[n_], lists_l[n_]
                _copy_turn(srcs[k], shift[j], acc_block, acc_tokens, acc_pos, req_start, blk, tok, pos)
                n = present_prefix(st, blk[:qi[h, QI_N]], Xd, Xl, list_f)
                if n == 0:
                    continue
                s = state[S_SLOT]
                now = qf[h, QF_END]
                req_ts[s] = t0 + now
                req_tq[s] = np.int32(math.floor(math.ldexp((t0 + now) - t0, -(HIST_MIN_EXP + tshift))))
                req_node[s] = n_
                req_kind[s] = REQ_FETCH
                lrs = np.zeros(2, dtype=np.int64)
                lrs[1] = n
                _SIM(blk[:n], tok[:n], pos[:n], lrs, s, req_ts, req_tq, req_node, req_group, req_kind, values,
                     oracle_ok, ip, fp, cap, st, used, gstat, last_val, sketch, sk_ops, dec1[:n], req_level, out1, s,
                     cnt, sums, hist)
                state[S_SLOT] = s + 1
                measured = s >= ip[I_FIRST_MEASURED]
                x = state[S_TRANSFERS]
                pick = np.ones(1, dtype=np.bool_)
                transfer_rows(blk[:n], dec1[:n], lrs, pick, size, T, bpt, tr_rows[x:x + 1])
                tr_time[x] = qf[h, QF_START]
                tr_node[x] = n_
                tr_meas[x] = measured
                state[S_TRANSFERS] = x + 1
                if measured:
                    land(blk, dec1, 0, n, now, size, pf_moved, pf_landed, pf)
                    pf[PF_DISPLACED] += out1[R_SRC, 0]
                y = state[S_LANDED]
                rec_k[y] = k
                rec_t[y] = now
                state[S_LANDED] = y + 1
        # the real requests up to the next event
        nxt = r_b
        k = state[S_NEXT_K]
        if k < K and at[k] < nxt:
            nxt = at[k]
        h = state[S_HEAD]
        if h < state[S_TAIL] and qi[h, QI_REQ] < nxt:
            nxt = qi[h, QI_REQ]
        if nxt <= r:  # pragma: no cover - an event behind the cursor: the plan was not in order
            raise ValueError("prefetch events out of order")
        s = state[S_SLOT]
        for q in range(r, nxt):
            req_ts[s + q - r] = ts[q]
            req_tq[s + q - r] = real_tq[q]
            req_node[s + q - r] = node[q]
            req_kind[s + q - r] = REQ_REAL
            if q == first:
                ip[I_FIRST_MEASURED] = s + q - r
        i0, i1 = r - ch_r, nxt - ch_r
        _SIM(ch_block, ch_tokens, ch_pos, ch_lrs[i0:i1 + 1], s, req_ts, req_tq, req_node, req_group, req_kind, values,
             oracle_ok, ip, fp, cap, st, used, gstat, last_val, sketch, sk_ops, dec_chunk, req_level, rows_chunk,
             s - i0, cnt, sums, hist)
        state[S_SLOT] = s + (nxt - r)
        account_requests(ch_block, dec_chunk, ch_lrs[i0:i1 + 1], r, rel, size, pf_moved, pf_landed,
                         pf_absent[ch_lo:], pf, first)
        r = nxt


def _copy_turn(src, sh, acc_block, acc_tokens, acc_pos, req_start, blk, tok, pos):
    """Request ``src``'s accesses into the buffers (its blocks in namespace ``sh``)."""
    lo, hi = req_start[src], req_start[src + 1]
    for i in range(lo, hi):
        blk[i - lo] = acc_block[i] + sh
        tok[i - lo] = acc_tokens[i]
        pos[i - lo] = acc_pos[i]
    return hi - lo


def _specialise(policy: int):
    """:func:`_run` compiled for one admission policy, calling that policy's tier kernel."""
    name = f"_fifo_policy{policy}"
    g = {**globals(), "_SIM": SIMULATE[policy], "_copy_turn": njit(**NJIT)(_copy_turn)}
    fn = types.FunctionType(_run.__code__, g, name)
    fn.__qualname__ = name
    fn.__module__ = __name__
    fn.__doc__ = _run.__doc__
    return njit(**NJIT)(fn)


#: The compiled run of each policy code (``P_*``), built on first use.
_RUNS: dict = {}


def runner(policy: int):
    """The compiled :func:`_run` for an admission policy code."""
    if policy not in _RUNS:
        _RUNS[policy] = _specialise(policy)
    return _RUNS[policy]


__all__ = ["QF_END", "QF_START", "QI_K", "QI_N", "QI_REQ", "S_HEAD", "S_LANDED", "S_NEXT_K", "S_SLOT", "S_TAIL",
           "S_TRANSFERS", "runner"]
