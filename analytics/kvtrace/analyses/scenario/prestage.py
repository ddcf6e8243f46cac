"""Prestaging fed in bulk (a ``prestage`` event without a bandwidth limit): each piece of
real requests goes to the tier simulator together with the prefetches issued before
them, as one run of requests (:func:`augment`), and the prefetch figures are read off
its decisions afterwards (:func:`account`).

Before real request ``r`` come, for every prefetch ``k`` whose issue time falls at
``r`` (the first request at or after it; in issue order): a *probe* of its turn ``j``'s
blocks (the decisions record which of them DRAM did not hold at the issue: the coverage
denominator) and a *fetch* of the predicted blocks (``REQ_FETCH``: the simulator touches
the leading run some tier of ``j``'s node holds). A scenario's state edits at ``r`` come
before them. The figures are :mod:`kvtrace.kernels.scenario_ops`' definitions.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT
from kvtrace.kernels.scenario_ops import PF_DISPLACED, land, read
from kvtrace.kernels.tier_table import R_SRC, REQ_FETCH, REQ_PROBE, REQ_REAL
from kvtrace.kernels.tiers import HIST_MIN_EXP


class Bulk:
    """The prefetches of a plan, in issue order, with the request each is fed before."""

    def __init__(self, trace, plan, rel: np.ndarray, moved, M: int):
        pre = plan.prestage
        self.targets = pre.targets.astype(np.int64)
        self.srcs = self.targets if pre.predictor == "oracle" else pre.preds.astype(np.int64)
        self.issue = pre.issue_s.astype(np.float64)
        self.at = pre.at
        self.shift = (np.where(moved[self.targets], M, 0) if moved is not None
                      else np.zeros(self.targets.shape[0], dtype=np.int64)).astype(np.int64)
        self.req_start = np.asarray(trace.req_start, dtype=np.int64)
        self.moved = moved
        self.M = M
        self.next = 0

    def segments(self, r_lo: int, r_hi: int, rel: np.ndarray, first: int):
        """The piece's requests in feeding order: ``(start, length, shift, kind, who, time,
        measured)`` per request (``who``: the real request, or the prefetch's turn)."""
        k0 = self.next
        k1 = int(np.searchsorted(self.at, r_hi, side="left"))
        self.next = k1
        ks = np.arange(k0, k1, dtype=np.int64)
        rs = np.arange(r_lo, r_hi, dtype=np.int64)
        rsh = (np.where(self.moved[r_lo:r_hi], self.M, 0).astype(np.int64) if self.moved is not None
               else np.zeros(rs.shape[0], dtype=np.int64))
        j, src = self.targets[ks], self.srcs[ks]
        # order: by request; before it its prefetches in issue order, each a probe then a fetch
        key_r = np.concatenate([rs, self.at[ks], self.at[ks]])
        key_g = np.concatenate([np.ones(rs.shape[0], np.int64), np.zeros(2 * ks.shape[0], np.int64)])
        key_s = np.concatenate([np.zeros(rs.shape[0], np.int64), 2 * ks, 2 * ks + 1])
        order = np.lexsort((key_s, key_g, key_r))
        s_all = np.concatenate([self.req_start[rs], self.req_start[j], self.req_start[src]])
        l_all = np.concatenate([self.req_start[rs + 1] - self.req_start[rs], self.req_start[j + 1] - self.req_start[j],
                                self.req_start[src + 1] - self.req_start[src]])
        sh_all = np.concatenate([rsh, self.shift[ks], self.shift[ks]])
        kind_all = np.concatenate([np.full(rs.shape[0], REQ_REAL, np.int8), np.full(ks.shape[0], REQ_PROBE, np.int8),
                                   np.full(ks.shape[0], REQ_FETCH, np.int8)])
        who_all = np.concatenate([rs, j, j])
        time_all = np.concatenate([rel[rs], self.issue[ks], self.issue[ks]])
        # a prefetch issued before the first measured request warms up, as that request's own do
        meas_all = np.concatenate([rs >= first, self.at[ks] > first, self.at[ks] > first])
        return tuple(x[order] for x in (s_all, l_all, sh_all, kind_all, who_all, time_all, meas_all))


@njit(**NJIT)
def gather(start, length, shift, block, tokens, pos, out_block, out_tokens, out_pos, lrs):
    """The requests' accesses from the trace's arrays, renumbered by ``shift``, one after
    another (``lrs``: their offsets)."""
    o = 0
    lrs[0] = 0
    for s in range(start.shape[0]):
        a = start[s]
        for i in range(length[s]):
            out_block[o] = block[a + i] + shift[s]
            out_tokens[o] = tokens[a + i]
            out_pos[o] = pos[a + i]
            o += 1
        lrs[s + 1] = o


def quanta(t_abs: np.ndarray, t0: float, shift: int) -> np.ndarray:
    """Request times as the simulator's quanta (:func:`kvtrace.kernels.tiers.quantise_times`)."""
    return np.floor(np.ldexp(t_abs - t0, -(HIST_MIN_EXP + shift))).astype(np.int32)


@njit(**NJIT)
def account(block, decision, lrs, kind, who, time, meas, start, size, rows, moved, landed, absent, pf):
    """The prefetch figures of one fed run (:mod:`kvtrace.kernels.scenario_ops`): a probe
    marks its turn's accesses not in DRAM (``absent``, by access of the trace); a fetch
    lands (:func:`~kvtrace.kernels.scenario_ops.land`) and its row's ``R_SRC`` is the
    DRAM it evicted; a real request reads (:func:`~kvtrace.kernels.scenario_ops.read`)."""
    for s in range(kind.shape[0]):
        lo, hi = lrs[s], lrs[s + 1]
        if kind[s] == REQ_PROBE:
            if meas[s]:
                a = start[s]
                for t in range(lo, hi):
                    if (decision[t] & 3) != 0:
                        absent[a + t - lo] = 1
            continue
        if kind[s] == REQ_FETCH:
            if meas[s]:
                pf[PF_DISPLACED] += rows[s, R_SRC]
                land(block, decision, lo, hi, time[s], size, moved, landed, pf)
            continue
        a = start[s]
        read(block, decision, lo, hi, time[s], meas[s], absent[a:], size, moved, landed, pf)


__all__ = ["Bulk", "account", "gather", "quanta"]
