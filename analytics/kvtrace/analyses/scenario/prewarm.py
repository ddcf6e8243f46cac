"""Prewarming (a ``prewarm`` event, :class:`~kvtrace.analyses.scenario.config.Prewarm`):
each node's DRAM refilled from the tiers below it under a bandwidth budget, in the
order of value, recency or a full scan (seed section 10: "prioritise restoring the
high-value hot spots rather than a full scan moved back at once"). The slow twin is
``tests/naive_scenario.py``.

At the event, before the first request at or after its time ``t0`` (request ``r0``), for
each node n:

- **candidates**: the blocks whose last access before ``r0`` was served by n (the
  plan's node, migrations applied; a rollout's moved requests in the new namespace)
  that a tier below n's DRAM holds (n's local SSD; the shared flash unless its catalog
  is down) and n's DRAM does not;
- **order**: ``value``, descending ``V / tokens`` with ``V`` the prefill FLOPs of the
  block's accesses in requests arriving in ``[t0, t0 + horizon)``, ``a k + b q`` each at
  its own tokens ``k`` and token positions (``q``:
  :func:`kvtrace.model.position_token_sum`; the gain term of ``kvtrace value``, read
  from the trace's future: clairvoyant); ``recency``, descending last request then
  ascending position in it; ``scan``, ascending ``mix_hash(block)`` (a content-addressed
  store's own order). Remaining ties: ascending block id;
- **how much**: the leading candidates while their tokens sum to at most ``limit`` x
  n's DRAM capacity;
- **when**: candidate i (bytes ``tokens x kv_bytes_per_token``, cumulative ``C_i``) lands
  at ``t0 + C_i / rate`` with ``rate = gbps x 1e9`` B/s. The candidates landing before
  the same request (the first at or after their landing; none after the last request)
  form a *group*, applied before that request (in the order of (request, the landing
  of its first candidate, push order) with the other edits) as a fetch of node n
  (``REQ_FETCH``) of those of its candidates that a tier below n's DRAM holds and n's
  DRAM does not at that moment, in candidate order, each with its tokens and its last
  position; the others are skipped, their share of the budget spent. The group's
  transfer (the load model's background read, by source) starts at ``t0 + C_(first) -
  bytes(first)) / rate``.

The prewarm figures are the prefetch figures' definitions
(:func:`kvtrace.kernels.scenario_ops.land`, :func:`~kvtrace.kernels.scenario_ops.read`):
moved tokens, useful (the next access reads the block from DRAM), the DRAM a group
evicted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from kvtrace.config import NJIT
from kvtrace.kernels.densify import mix_hash
from kvtrace.kernels.tier_table import ABSENT, PREV


@njit(**NJIT)
def last_use(block, pos, req_start, shift, r0, last_req, last_pos):
    """``last_req[b]``, ``last_pos[b]``: the request and position of each block's last
    access before request ``r0`` (``block + shift[r]``: a rollout's namespace); -1 if none."""
    for r in range(r0):
        s = shift[r]
        for i in range(req_start[r], req_start[r + 1]):
            b = block[i] + s
            last_req[b] = r
            last_pos[b] = pos[i]


@njit(**NJIT)
def future_flops(block, tokens, pos, req_start, shift, r0, r1, block_tokens, a, b_coef, out):
    """``out[b] +=`` the prefill FLOPs of every access of requests ``r0..r1 - 1``."""
    for r in range(r0, r1):
        s = shift[r]
        for i in range(req_start[r], req_start[r + 1]):
            k = np.float64(tokens[i])
            start = np.float64(pos[i]) * block_tokens
            out[block[i] + s] += a * k + b_coef * (k * start + k * (k - 1.0) / 2.0)


@njit(**NJIT)
def held_below(st, block, Xd, Xl, Xf, out):
    """``out[i]``: ``block[i]`` is not in DRAM list ``Xd`` and is in ``Xl`` or ``Xf``
    (-1: no such list)."""
    for i in range(block.shape[0]):
        b = block[i]
        out[i] = st[b, Xd, PREV] == ABSENT and ((Xl >= 0 and st[b, Xl, PREV] != ABSENT) or
                                                (Xf >= 0 and st[b, Xf, PREV] != ABSENT))


@njit(**NJIT)
def _scan_keys(n):
    out = np.empty(n, dtype=np.uint64)
    for b in range(n):
        out[b] = mix_hash(np.uint64(b), 0)
    return out


@dataclass
class Group:
    """Candidates landing before request ``request`` on ``node`` (``time_s``: the first's
    landing; ``start_s``: its transfer's start)."""

    request: int
    time_s: float
    start_s: float
    node: int
    blocks: np.ndarray
    tokens: np.ndarray
    pos: np.ndarray


def schedule(ev, trace, plan, rel: np.ndarray, r0: int, t0: float, size: np.ndarray, state, lists, *,
             dram_tokens: int, bpt: int, a_coef: float, b_coef: float, M: int) -> list[Group]:
    """The groups of a prewarm starting at ``t0`` before request ``r0`` (the module
    docstring), from the tier state ``state`` then; ``lists(node)`` gives its DRAM,
    local-SSD and shared-flash list ids (-1: none or unreachable)."""
    R = rel.shape[0]
    n_ids = size.shape[0]
    shift = (np.where(plan.moved, M, 0) if plan.moved is not None else np.zeros(R)).astype(np.int64)
    acc = trace.accesses
    req_start = np.asarray(trace.req_start, dtype=np.int64)
    last_req = np.full(n_ids, -1, dtype=np.int64)
    last_pos = np.zeros(n_ids, dtype=np.int64)
    last_use(acc.block, acc.pos, req_start, shift, r0, last_req, last_pos)
    seen = np.nonzero(last_req >= 0)[0]
    if ev.order == "value":
        r1 = int(np.searchsorted(rel, t0 + ev.horizon, side="left")) if ev.horizon < math.inf else R
        flops = np.zeros(n_ids, dtype=np.float64)
        future_flops(acc.block, acc.tokens, acc.pos, req_start, shift, r0, max(r0, r1),
                     float(trace.meta.block_tokens), a_coef, b_coef, flops)
        keys = (seen, -flops[seen] / np.maximum(size[seen], 1))
    elif ev.order == "recency":
        keys = (seen, last_pos[seen], -last_req[seen])
    else:
        keys = (seen, _scan_keys(n_ids)[seen])
    seen = seen[np.lexsort(keys)]
    owner = np.asarray(plan.node, dtype=np.int64)[last_req[seen]]
    rate = ev.gbps * 1e9
    budget = ev.limit * dram_tokens
    groups: list[Group] = []
    for n in range(int(owner.max()) + 1 if owner.size else 0):
        cand = seen[owner == n]
        Xd, Xl, Xf = lists(n)
        ok = np.zeros(cand.shape[0], dtype=np.bool_)
        held_below(state, cand, Xd, Xl, Xf, ok)
        cand = cand[ok]
        tok = size[cand].astype(np.int64)
        cum = np.cumsum(tok)
        cand, tok, cum = cand[cum <= budget], tok[cum <= budget], cum[cum <= budget]
        land = t0 + cum.astype(np.float64) * bpt / rate
        at = np.searchsorted(rel, land, side="left")
        keep = at < R
        cand, tok, cum, land, at = cand[keep], tok[keep], cum[keep], land[keep], at[keep]
        if cand.shape[0] == 0:
            continue
        cuts = np.flatnonzero(np.diff(at)) + 1
        for lo, hi in zip(np.concatenate([[0], cuts]), np.concatenate([cuts, [cand.shape[0]]])):
            lo, hi = int(lo), int(hi)
            start = t0 + float(cum[lo] - tok[lo]) * bpt / rate
            groups.append(Group(int(at[lo]), float(land[lo]), start, n, cand[lo:hi], tok[lo:hi].astype(np.int32),
                                last_pos[cand[lo:hi]].astype(np.int32)))
    return groups


__all__ = ["Group", "future_flops", "held_below", "last_use", "schedule"]
