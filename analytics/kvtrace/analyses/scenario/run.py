"""One scenario run: the tier replay with its events applied between requests
(:func:`replay`; the events are resolved by :mod:`kvtrace.analyses.scenario.events`),
the load model over that replay, and the timeline, recovery and summary row
(:func:`run_scenarios`).

A prefetch (``prestage``) is fed to the tier simulator as a request of its own between
the real ones (:class:`_Slots` keeps the simulator's per-request arrays in that order);
the real requests' outputs feed the load model and the timeline, the prefetches' feed
the prestaging figures (:mod:`kvtrace.kernels.scenario_ops`).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from kvtrace.analyses.curves import parse_warmup, warmup_first_request
from kvtrace.analyses.load import LoadLevel, run_level
from kvtrace.analyses.load.demand import D_BD, D_BF, D_BL, D_SREST, D_WF, D_WL, Demand, Transfers
from kvtrace.analyses.response import ResponseModel
from kvtrace.analyses.scenario.config import (CatalogOutage, ColdStart, Congestion, Migration, Prestage, Prewarm,
                                              Restored, Rollout, ScenarioFile, TargetLoss, Ttl)
from kvtrace.analyses.scenario import prestage as P
from kvtrace.analyses.scenario.prewarm import held_below, schedule
from kvtrace.analyses.scenario.events import BASELINE, Action, Editor, EventPlan, plan_events
from kvtrace.analyses.whatif.config import PROMOTIONS, route
from kvtrace.analyses.whatif.simulate import tier_rules
from kvtrace.config import plain_numpy_pages
from kvtrace.errors import UsageError
from kvtrace.kernels import tiers as K
from kvtrace.kernels.scenario_ops import (N_PF, PF_COVERED, PF_DISPLACED, PF_HELD, PF_MOVED, PF_NEEDED,
                                          PF_REQUESTS, PF_USEFUL, account_requests, attribute, land, mark_absent,
                                          present_prefix, transfer_rows)
from kvtrace.kernels.tier_table import (ABSENT, COUNT_NAMES, LIST0, PREV, R_MISS_Q, R_MISS_TOK, R_PRE_TOK, R_SRC,
                                        R_TOTAL_TOK, REQ_FETCH, REQ_REAL)
from kvtrace.model import GpuSpec, ModelSpec
from kvtrace.trace.source import AccessChunk


@dataclass
class ReplayOut:
    """What one scenario's replay yields for the load model and the timeline."""

    demand: Demand
    prefix_tokens: np.ndarray  # float64[R]
    total_tokens: np.ndarray
    recompute_s: np.ndarray  # GPU-seconds of reusable tokens recomputed
    counts: dict
    dropped: dict = field(default_factory=dict)
    prefetch: dict | None = None  # the prestaging figures (tokens, token-seconds), with a prestage event
    prewarm: dict | None = None  # the prewarming figures (tokens), with a prewarm event
    transfers: Transfers | None = None  # the moves into DRAM, for the load model's links
    lost_tokens: np.ndarray | None = None  # float64[events + 1]: reusable tokens missed by cause (0: capacity)


@dataclass
class Synthetic:
    """A prefetch to replay as a request of the tier simulator (``blocks`` with the
    source turn's ``tokens`` and ``pos``), before real request ``before``."""

    before: int
    time_s: float
    node: int
    blocks: np.ndarray
    tokens: np.ndarray
    pos: np.ndarray
    target: int


class _Slots:
    """The tier simulator's request slots: the real requests in order, with the
    prefetches replayed as requests between them (their per-request arrays written as
    each is fed)."""

    def __init__(self, ts: np.ndarray, node: np.ndarray, extra: int):
        R = ts.shape[0]
        self.t0 = float(ts[0]) if R else 0.0
        # the real times, then room for the prefetches (the same span: the same time quantum)
        self.req_ts = np.concatenate([ts, np.full(extra, ts[-1] if R else 0.0)])
        self.req_node = np.concatenate([node, np.zeros(extra, dtype=np.int32)]).astype(np.int32)


def _heap_push(heap: list, a: Action) -> None:
    """Actions run by request, then the state edits (and prewarms) before the
    prefetches, then by time and push order."""
    heapq.heappush(heap, (a.request, a.kind in ("pf_issue", "pf_apply"), a.time_s, a.order, a))


def replay(trace, cfg: ScenarioFile, plan: EventPlan, *, model: ModelSpec, response: ResponseModel, load,
           first: int, progress=None, decisions: np.ndarray | None = None, record: list | None = None,
           compiled_fifo: bool = True) -> ReplayOut:
    """The tier replay of ``trace`` through ``cfg``'s system with ``plan`` applied.

    The events act between requests (an action before its request; a prefetch is fed to
    the simulator as a request of its own, between the real ones: :class:`_Slots`).
    ``decisions``, if given, int8[N]: every real access's decision, ``COLD_FLAG`` added to
    a cold one's; ``record``, if given, receives every prefetch fed (:class:`Synthetic`;
    from the compiled budget path its time, node and turn only). ``compiled_fifo=False``
    runs a budgeted prestage one prefetch at a time in Python (the compiled path's twin,
    :mod:`kvtrace.kernels.prefetch_fifo`)."""
    sysc = cfg.system
    config = cfg.tier_config()
    bpt = int(model.kv_bytes_per_token)
    a_coef, b_coef = model.flops_coefficients()
    rules = tier_rules(sysc.cache_rules)
    M = int(trace.n_blocks)
    size = np.asarray(trace.block_size, dtype=np.int64)
    moved = plan.moved
    if moved is not None:
        size = np.concatenate([size, size])
    caps = (config.dram_bytes // bpt, config.local_ssd_bytes // bpt, config.flash_bytes // bpt)
    width = K.sketch_width(caps[2] + config.nodes * caps[1], trace.meta.block_tokens, size.shape[0])
    policy = config.parsed_policy
    if policy.kind in ("value", "reuse-oracle", "group"):
        raise UsageError(f"kvtrace scenario does not run the {policy.kind} admission policy yet; use all, none, "
                         "second-hit, freq>=k, prob:p, idle<T or tinylfu", field="system.policy")
    R = trace.n_requests
    ts = np.asarray(trace.request_timestamp, dtype=np.float64)
    rel = ts - ts[0] if R else ts
    pre = plan.prestage
    # a prefetch takes one slot (two fed in bulk: its probe and its fetch)
    slots = _Slots(ts, plan.node, 0 if pre is None else len(pre.targets) * (2 if pre.gbps == math.inf else 1))
    total_slots = slots.req_ts.shape[0]
    sim = K.TierSimulator(size, slots.req_ts, slots.req_node, block_tokens=trace.meta.block_tokens,
                          prefix_aware=sysc.eviction == "prefix-aware", dram=caps[0], local=caps[1], flash=caps[2],
                          n_nodes=config.nodes, policy=policy.code, param=policy.param,
                          flash_lru=sysc.flash_order == "lru", promotion=PROMOTIONS[sysc.promotion],
                          write_through=sysc.write_mode == "write-through", first_measured=total_slots,
                          sketch_width=width, chunk_columns=True, rules=rules)
    real_tq = sim.req_tq[:R].copy()
    quantum = 2.0 ** (K.HIST_MIN_EXP + sim.shift)
    editor = Editor(sim, config.nodes, caps[1] > 0, caps[2] > 0, bpt, M, quantum, caps[2],
                     sysc.flash_order == "lru")
    demand = Demand(trace, config, first, load.flash_targets, bpt, a_coef, b_coef, response,
                    load.prefill_tokens_per_s, block_size=size)
    pre_tok = np.zeros(R, dtype=np.float64)
    tot = np.zeros(R, dtype=np.float64)
    rec = np.zeros(R, dtype=np.float64)
    tps = load.prefill_tokens_per_s
    bulk = None
    if pre is not None and pre.gbps == math.inf:  # no bandwidth limit: the prefetches fed with the pieces
        bulk = P.Bulk(trace, plan, rel, moved, M)
    heap: list = []
    for a in plan.actions:
        _heap_push(heap, a)
    fifo = Fifo(trace, plan, sim, rel, ts, real_tq, size, bpt, M, policy.code, int(load.flash_targets)) \
        if pre is not None and bulk is None and compiled_fifo else None
    if pre is not None and bulk is None and fifo is None:  # with a bandwidth limit: one prefetch at a time
        for k in range(pre.targets.shape[0]):
            _heap_push(heap, Action(int(pre.at[k]), float(pre.issue_s[k]), len(plan.actions) + k, "pf_issue", (k,),
                                    pre.event))
    pf = np.zeros(N_PF, dtype=np.float64)
    pf_moved = np.zeros(size.shape[0] if pre is not None else 0, dtype=np.int8)
    pf_landed = np.zeros(pf_moved.shape[0], dtype=np.float64)
    pf_absent = np.zeros(trace.n_accesses if pre is not None else 0, dtype=np.int8)  # per access of a prestaged turn
    pw = np.zeros(N_PF, dtype=np.float64)
    lost_tok = np.zeros(len(plan.event_times) + 1, dtype=np.float64)
    pw_moved = np.zeros(size.shape[0] if plan.prewarms else 0, dtype=np.int8)
    pw_landed = np.zeros(pw_moved.shape[0], dtype=np.float64)
    no_absent = np.zeros(trace.n_accesses if plan.prewarms else 0, dtype=np.int8)
    busy = [-math.inf]  # the prefetch transfers' queue: when the last one ends (seconds after the first request)
    T = int(load.flash_targets)
    moves = Transfers(T)

    def move(block, decision, lrs, pick, time_s, node, measured) -> None:
        """The picked fed requests are moves into DRAM: their reads load the links."""
        rows = np.empty((lrs.shape[0] - 1, 1 + 2 * T), dtype=np.float64)
        transfer_rows(block, decision, lrs, pick, size, T, bpt, rows)
        moves.add(time_s, node, rows[pick, 0], rows[pick, 1:1 + T], rows[pick, 1 + T:], measured)
    seq = [len(plan.actions) + (pre.targets.shape[0] if pre is not None else 0)]

    def feed_bulk(ch, r_lo: int, r_hi: int) -> None:
        start, length, shift, kind, who, time, meas = bulk.segments(r_lo, r_hi, rel, first)
        n_acc = int(length.sum())
        ns = start.shape[0]
        ab = np.empty(n_acc, dtype=np.int64)
        at = np.empty(n_acc, dtype=np.int32)
        ap = np.empty(n_acc, dtype=np.int32)
        alrs = np.empty(ns + 1, dtype=np.int64)
        acc = trace.accesses
        P.gather(start, length, shift, acc.block, acc.tokens, acc.pos, ab, at, ap, alrs)
        slot = sim.next_request
        real = kind == REQ_REAL
        sim.req_ts[slot:slot + ns] = np.where(real, ts[who], slots.t0 + time)
        sim.req_tq[slot:slot + ns] = np.where(real, real_tq[who], P.quanta(slots.t0 + time, slots.t0, sim.shift))
        sim.req_node[slot:slot + ns] = plan.node[who]
        sim.req_kind[slot:slot + ns] = kind
        if r_lo <= first < r_hi:
            sim.ip[K.I_FIRST_MEASURED] = slot + int(np.nonzero(real & (who == first))[0][0])
        decision = sim.feed(ab, at, ap, alrs)
        q = sim.chunk_out
        P.account(ab, decision, alrs, kind, who, time, meas, start, size, q, pf_moved, pf_landed, pf_absent, pf)
        fetch = kind == REQ_FETCH
        if fetch.any():
            move(ab, decision, alrs, fetch, time[fetch], plan.node[who[fetch]], meas[fetch])
        mask = np.repeat(real, length)
        i0, i1 = r_lo - ch.r, r_hi - ch.r
        lo, hi = int(ch.lrs[i0]), int(ch.lrs[i1])
        lrs = ch.lrs[i0:i1 + 1] - lo
        piece = AccessChunk(r_lo, r_hi, ch.lo + lo, ch.lo + hi, ab[mask], ch.tokens[lo:hi], ch.pos[lo:hi], lrs)
        outputs(piece, decision[mask], q[real])

    def outputs(piece, decision, q) -> None:
        """A piece's real requests: their decisions and rows into the outputs."""
        r_lo, r_hi = piece.r, piece.r_end
        if decisions is not None:
            decisions[piece.lo:piece.hi] = decision
        demand.add(piece, decision, q, plan.node)
        pre_tok[r_lo:r_hi] = q[:, R_PRE_TOK]
        tot[r_lo:r_hi] = q[:, R_TOTAL_TOK]
        if tps is None:
            rec[r_lo:r_hi] = (a_coef * q[:, R_MISS_TOK] + b_coef * q[:, R_MISS_Q]) / response.recompute_flops_per_s
        else:
            rec[r_lo:r_hi] = q[:, R_MISS_TOK] / tps if tps > 0 else np.inf
        blk = np.ascontiguousarray(piece.block, dtype=np.int64)
        attribute(blk, decision, piece.tokens, piece.lrs, r_lo, first, editor.lost, editor.aside(),
                  editor.hide_event + 1, lost_tok)
        if plan.prewarms:
            account_requests(blk, decision, piece.lrs, r_lo, rel, size, pw_moved, pw_landed,
                             no_absent[piece.lo:piece.hi], pw, first)

    def feed_real(ch, r_lo: int, r_hi: int) -> None:
        if bulk is not None:
            feed_bulk(ch, r_lo, r_hi)
            return
        if fifo is not None:
            piece, decision, q = fifo.run(ch, r_lo, r_hi, lists, first, pf_moved, pf_landed, pf_absent, pf)
            outputs(piece, decision, q)
            return
        slot = sim.next_request
        n = r_hi - r_lo
        sim.req_ts[slot:slot + n] = ts[r_lo:r_hi]
        sim.req_tq[slot:slot + n] = real_tq[r_lo:r_hi]
        sim.req_node[slot:slot + n] = plan.node[r_lo:r_hi]
        if r_lo <= first < r_hi:
            sim.ip[K.I_FIRST_MEASURED] = slot + first - r_lo
        i0, i1 = r_lo - ch.r, r_hi - ch.r
        lo, hi = int(ch.lrs[i0]), int(ch.lrs[i1])
        block = ch.block[lo:hi]
        if moved is not None:
            mv = np.repeat(moved[r_lo:r_hi], np.diff(ch.lrs[i0:i1 + 1]))
            block = np.where(mv, block + M, block)
        lrs = ch.lrs[i0:i1 + 1] - lo
        piece = AccessChunk(r_lo, r_hi, ch.lo + lo, ch.lo + hi, block, ch.tokens[lo:hi], ch.pos[lo:hi], lrs)
        decision = sim.feed(block, piece.tokens, piece.pos, lrs)
        q = sim.chunk_out
        outputs(piece, decision, q)
        if pre is not None:
            account_requests(np.ascontiguousarray(block, dtype=np.int64), decision, lrs, r_lo, rel, size, pf_moved,
                              pf_landed, pf_absent[piece.lo:piece.hi], pf, first)

    def lists(node: int):
        Xd = LIST0 + node
        Xl = editor.local[node] if editor.local else -1
        Xf = editor.flash[0] if editor.flash and editor.hidden is None else -1
        return Xd, Xl, Xf

    def feed_fetch(blocks, tokens, pos, node: int, time_s: float, start_s: float, moved_, landed_, figs) -> None:
        """A fetch into ``node``'s DRAM landing at ``time_s``, its transfer started at
        ``start_s``; its figures into ``figs`` (prefetches' or prewarms')."""
        slot = sim.next_request
        sim.req_ts[slot] = slots.t0 + time_s
        sim.req_tq[slot] = P.quanta(np.array([slots.t0 + time_s]), slots.t0, sim.shift)[0]
        sim.req_node[slot] = node
        sim.req_kind[slot] = REQ_FETCH
        measured = slot >= sim.ip[K.I_FIRST_MEASURED]
        lrs = np.array([0, blocks.shape[0]], dtype=np.int64)
        decision = sim.feed(blocks, tokens, pos, lrs)
        move(blocks, decision, lrs, np.ones(1, dtype=np.bool_), np.array([start_s]), node, measured)
        if measured:
            land(blocks, decision, 0, blocks.shape[0], time_s, size, moved_, landed_, figs)
            figs[PF_DISPLACED] += sim.chunk_out[0, R_SRC]

    def feed_prefetch(syn: Synthetic, start_s: float) -> None:
        feed_fetch(syn.blocks, syn.tokens, syn.pos, syn.node, syn.time_s, start_s, pf_moved, pf_landed, pf)
        if record is not None:
            record.append(syn)

    def prewarm(a: Action) -> None:
        if a.kind == "pw_start":
            groups = schedule(plan.prewarms[a.args[0]], trace, plan, rel, a.request, a.time_s, size, sim.st, lists,
                              dram_tokens=caps[0], bpt=bpt, a_coef=a_coef, b_coef=b_coef, M=M)
            sim.add_requests(len(groups))
            for g in groups:
                seq[0] += 1
                _heap_push(heap, Action(g.request, g.time_s, seq[0], "pw_land", (g,), a.event))
            return
        g = a.args[0]  # pw_land: what is still below DRAM and not in it lands
        ok = np.zeros(g.blocks.shape[0], dtype=np.bool_)
        held_below(sim.st, g.blocks, *lists(g.node), ok)
        if ok.any():
            feed_fetch(g.blocks[ok], g.tokens[ok], g.pos[ok], g.node, g.time_s, g.start_s, pw_moved, pw_landed, pw)

    def prestage(a: Action) -> None:
        k = a.args[0]
        j = int(pre.targets[k])
        node = int(plan.node[j])
        shift = M if moved is not None and moved[j] else 0
        Xd, Xl, Xf = lists(node)
        if a.kind == "pf_issue":
            src = j if pre.predictor == "oracle" else int(pre.preds[k])
            lo, hi = int(trace.req_start[src]), int(trace.req_start[src + 1])
            acc = trace.accesses
            blocks = np.asarray(acc.block[lo:hi], dtype=np.int64) + shift
            tokens = np.asarray(acc.tokens[lo:hi])
            pos = np.asarray(acc.pos[lo:hi])
            jl, jh = int(trace.req_start[j]), int(trace.req_start[j + 1])
            if sim.next_request >= sim.ip[K.I_FIRST_MEASURED]:  # a measured turn's coverage
                mark_absent(sim.st, np.asarray(acc.block[jl:jh], dtype=np.int64) + shift, Xd, pf_absent[jl:jh])
            n = present_prefix(sim.st, blocks, Xd, Xl, Xf)
            if n == 0:
                return
            syn = Synthetic(a.request, a.time_s, node, blocks[:n], tokens[:n], pos[:n], j)
            # here only with a bandwidth limit (without, the prefetches are fed in bulk: prestage.Bulk)
            in_dram = sim.st[syn.blocks, Xd, PREV] != ABSENT
            nbytes = float(size[syn.blocks[~in_dram]].sum()) * bpt
            start = max(a.time_s, busy[0])
            busy[0] = start + nbytes / (pre.gbps * 1e9)
            r = int(np.searchsorted(rel, busy[0], side="left"))
            if r < R:
                seq[0] += 1
                _heap_push(heap, Action(r, busy[0], seq[0], "pf_apply", (k, syn, start), a.event))
        else:  # pf_apply: the transfer is done; what is still in a tier lands
            syn = a.args[1]
            n = present_prefix(sim.st, syn.blocks, Xd, Xl, Xf)
            if n:
                feed_prefetch(Synthetic(syn.before, a.time_s, node, syn.blocks[:n], syn.tokens[:n], syn.pos[:n], j),
                              a.args[2])

    try:
        for ch in trace.chunks():
            r = ch.r
            while True:
                while heap and heap[0][0] == r:
                    a = heapq.heappop(heap)[-1]
                    if a.kind in ("pf_issue", "pf_apply"):
                        prestage(a)
                    elif a.kind in ("pw_start", "pw_land"):
                        prewarm(a)
                    else:
                        editor.apply(a)
                if r >= ch.r_end:
                    break
                nxt = min(heap[0][0], ch.r_end) if heap else ch.r_end
                feed_real(ch, r, nxt)
                r = nxt
            if progress is not None:
                progress(ch.hi, trace.n_accesses)
    except BaseException:
        demand.close()
        raise
    if fifo is not None:
        fifo.finish(moves, record)
    counts = dict(zip(COUNT_NAMES, sim.cnt.tolist()))
    figures = None
    if pre is not None:
        figures = {"prefetch_requests": int(pf[PF_REQUESTS]), "moved_tokens": float(pf[PF_MOVED]),
                   "useful_tokens": float(pf[PF_USEFUL]), "needed_tokens": float(pf[PF_NEEDED]),
                   "covered_tokens": float(pf[PF_COVERED]), "held_token_seconds": float(pf[PF_HELD]),
                   "displaced_tokens": float(pf[PF_DISPLACED])}
    warmed = None
    if plan.prewarms:
        warmed = {"prewarm_groups": int(pw[PF_REQUESTS]), "moved_tokens": float(pw[PF_MOVED]),
                  "useful_tokens": float(pw[PF_USEFUL]), "displaced_tokens": float(pw[PF_DISPLACED])}
    return ReplayOut(demand, pre_tok, tot, rec, counts, editor.dropped, figures, warmed,
                     moves if len(moves) else None, lost_tok)


class Fifo:
    """The compiled budgeted prestage (:func:`kvtrace.kernels.prefetch_fifo.runner`): its
    state across the stretches of real requests the replay hands it."""

    def __init__(self, trace, plan: EventPlan, sim, rel, ts, real_tq, size, bpt: int, M: int, policy: int,
                 targets: int):
        from kvtrace.kernels import prefetch_fifo as F

        pre = plan.prestage
        K_ = pre.targets.shape[0]
        acc = trace.accesses
        self.F, self.sim, self.plan = F, sim, plan
        self.run_fn = F.runner(int(policy))
        self.acc = (np.ascontiguousarray(acc.block, dtype=np.int64), np.ascontiguousarray(acc.tokens),
                    np.ascontiguousarray(acc.pos))
        self.req_start = np.ascontiguousarray(trace.req_start, dtype=np.int64)
        R = rel.shape[0]
        self.shift = (np.where(plan.moved, M, 0) if plan.moved is not None else np.zeros(R)).astype(np.int64)
        self.rel, self.ts, self.real_tq = rel, ts, real_tq
        self.node = np.ascontiguousarray(plan.node, dtype=np.int32)
        self.size, self.bpt = size, float(bpt)
        self.targets = pre.targets.astype(np.int64)
        self.srcs = (self.targets if pre.predictor == "oracle" else pre.preds).astype(np.int64)
        self.issue, self.at = pre.issue_s.astype(np.float64), pre.at.astype(np.int64)
        self.rate = pre.gbps * 1e9
        self.qf = np.zeros((K_, 2), dtype=np.float64)
        self.qi = np.zeros((K_, 3), dtype=np.int64)
        self.state = np.zeros(6, dtype=np.int64)
        self.busy = np.array([-math.inf])
        longest = int(np.diff(self.req_start).max()) if R else 0
        self.blk = np.zeros(max(1, longest), dtype=np.int64)
        self.tok = np.zeros(max(1, longest), dtype=self.acc[1].dtype)
        self.pos = np.zeros(max(1, longest), dtype=self.acc[2].dtype)
        self.dec1 = np.zeros(max(1, longest), dtype=np.int8)
        self.out1 = np.zeros((K.N_REQ_COLS, 1), dtype=np.float64)
        self.rec_k = np.zeros(K_, dtype=np.int64)
        self.rec_t = np.zeros(K_, dtype=np.float64)
        self.T = targets
        # the landed prefetches' transfers: start, node, bytes by source (tr_rows), measured
        self.tr = (np.zeros(K_), np.zeros(K_, np.int64), np.zeros((K_, 1 + 2 * targets)), np.zeros(K_, np.bool_))
        self._chunk = None  # (first request, its blocks in their namespaces, decisions, rows) of the current chunk

    def run(self, ch, r_lo: int, r_hi: int, lists, first: int, pf_moved, pf_landed, pf_absent, pf):
        """Real requests ``r_lo..r_hi - 1`` of chunk ``ch`` with the prefetch events
        before each: ``(piece, decisions, rows)`` of the real requests."""
        sim, N = self.sim, self.plan.node
        i0, i1 = r_lo - ch.r, r_hi - ch.r
        if self._chunk is None or self._chunk[0] != ch.r:
            block = np.ascontiguousarray(ch.block, dtype=np.int64)
            if self.plan.moved is not None:
                block = block + np.repeat(self.shift[ch.r:ch.r_end], np.diff(ch.lrs))
            self._chunk = (ch.r, block, np.full(block.shape[0], K.MISS, dtype=np.int8),
                           np.zeros((K.N_REQ_COLS, ch.r_end - ch.r), dtype=np.float64))
        _, block, dec_chunk, rows = self._chunk
        nodes = int(N.max()) + 1 if N.shape[0] else 1
        lists_d = np.array([lists(n)[0] for n in range(nodes)], dtype=np.int64)
        lists_l = np.array([lists(n)[1] for n in range(nodes)], dtype=np.int64)
        list_f = int(lists(0)[2])
        self.state[self.F.S_SLOT] = sim.next_request
        self.run_fn(r_lo, r_hi, ch.r, block, ch.tokens, ch.pos, ch.lrs, ch.lo, *self.acc, self.req_start,
                    self.shift, self.rel, self.ts, self.real_tq, self.node, lists_d, lists_l, list_f, first,
                    self.targets, self.srcs, self.issue, self.at, self.rate, self.bpt, self.size, float(self.ts[0]),
                    int(sim.shift), self.qf, self.qi, self.state, self.busy, pf_moved, pf_landed, pf_absent, pf,
                    *self.tr, self.rec_k, self.rec_t, self.blk, self.tok, self.pos, self.dec1, self.out1, dec_chunk,
                    rows, sim.req_ts, sim.req_tq, sim.req_node, sim.req_group, sim.req_kind, np.zeros(0),
                    np.zeros(0, np.int8), sim.ip, sim.fp, sim.cap, sim.st, sim.used, sim.gstat, sim.last_val,
                    sim.sketch, sim.sk_ops, sim.req_level, sim.cnt, sim.sums, sim.hist)
        sim.next_request = int(self.state[self.F.S_SLOT])
        lo, hi = int(ch.lrs[i0]), int(ch.lrs[i1])
        lrs = ch.lrs[i0:i1 + 1] - lo
        piece = AccessChunk(r_lo, r_hi, ch.lo + lo, ch.lo + hi, block[lo:hi], ch.tokens[lo:hi], ch.pos[lo:hi], lrs)
        return piece, dec_chunk[lo:hi], rows[:, i0:i1].T

    def finish(self, moves: Transfers, record: list | None) -> None:
        """The landed prefetches' transfers into ``moves`` (and ``record``)."""
        if self.tr is not None:
            x = int(self.state[self.F.S_TRANSFERS])
            t, n, rows, meas = (a[:x] for a in self.tr)
            T = self.T
            moves.add(t, n, rows[:, 0], rows[:, 1:1 + T], rows[:, 1 + T:], meas)
        if record is not None:
            for y in range(int(self.state[self.F.S_LANDED])):
                k = int(self.rec_k[y])
                j = int(self.targets[k])
                record.append(Synthetic(-1, float(self.rec_t[y]), int(self.plan.node[j]), np.zeros(0, np.int64),
                                        np.zeros(0, np.int32), np.zeros(0, np.int32), j))


def _bins(rel: np.ndarray, first: int, bin_s: float) -> np.ndarray:
    """int64[R]: the timeline bin of every request (-1 before the measured window),
    bins counted from the first measured request's time."""
    out = np.full(rel.shape[0], -1, dtype=np.int64)
    if first < rel.shape[0]:
        out[first:] = np.floor((rel[first:] - rel[first]) / bin_s).astype(np.int64)
    return out


def timeline(name: str, rel: np.ndarray, first: int, bin_s: float, out: ReplayOut, ttft: np.ndarray | None,
             load, slo_s: float, nodes: int) -> pl.DataFrame:
    """Per bin of ``bin_s`` seconds of the measured window (``bin_start_s``: seconds
    after the trace's first request, as the events' times): requests, the prefix-token
    hit rate, bytes read per tier and their shares, recompute and prefill GPU-seconds,
    TTFT percentiles and SLO attainment, and the offered utilisation of the flash pool
    and the GPUs (work arriving in the bin over what the bin can serve)."""
    R = rel.shape[0]
    b = _bins(rel, first, bin_s)
    nb = int(b.max()) + 1 if R and b.max() >= 0 else 0
    m = b >= 0
    idx = b[m]
    rows = np.asarray(out.demand.rows)[m] if R else np.zeros((0, 16))

    def s(x):
        return np.bincount(idx, weights=x, minlength=nb)

    n = np.bincount(idx, minlength=nb).astype(np.int64)
    pre, tot = s(out.prefix_tokens[m]), s(out.total_tokens[m])
    bd, bl, bf = s(rows[:, D_BD]), s(rows[:, D_BL]), s(rows[:, D_BF])
    read = bd + bl + bf
    wf, wl = s(rows[:, D_WF]), s(rows[:, D_WL])
    gpu = s(rows[:, D_SREST])
    bg = np.zeros(nb)  # the measured transfers' reads by their start's bin (the first if before): local SSD +
    bg_f = np.zeros(nb)  # flash, and flash alone
    if out.transfers is not None and nb:
        t_s, _, t_bl, t_bft, _, t_m = out.transfers.arrays(measured=True)
        tb = np.clip(np.floor((t_s - rel[first]) / bin_s), 0, nb - 1).astype(np.int64)
        m_t = t_m
        bg_f = np.bincount(tb[m_t], weights=t_bft.sum(axis=1)[m_t], minlength=nb)
        bg = bg_f + np.bincount(tb[m_t], weights=t_bl[m_t], minlength=nb)
    with np.errstate(invalid="ignore", divide="ignore"):
        cols = {
            "scenario": [name] * nb,
            "bin_start_s": (rel[first] if first < R else 0.0) + np.arange(nb, dtype=np.float64) * bin_s,
            "requests": n,
            "prefix_token_hit_rate": np.where(tot > 0, pre / np.where(tot > 0, tot, 1), np.nan),
            "dram_read_bytes": bd, "local_read_bytes": bl, "flash_read_bytes": bf,
            "dram_read_share": np.where(read > 0, bd / np.where(read > 0, read, 1), np.nan),
            "local_read_share": np.where(read > 0, bl / np.where(read > 0, read, 1), np.nan),
            "flash_read_share": np.where(read > 0, bf / np.where(read > 0, read, 1), np.nan),
            "flash_write_bytes": wf, "local_write_bytes": wl, "background_read_bytes": bg,
            "recompute_gpu_seconds": s(out.recompute_s[m]),
            "prefill_gpu_seconds": gpu,
            "util_flash_offered": (bf + wf + bg_f) / (load.flash_bytes_per_s * bin_s) if load.flash_bytes_per_s
            else np.full(nb, np.nan),
            "util_gpu_offered": gpu / (max(1, load.gpus_per_node) * nodes * bin_s),
        }
    p50 = np.full(nb, np.nan)
    p99 = np.full(nb, np.nan)
    att = np.full(nb, np.nan)
    if ttft is not None and nb:
        tb = idx
        order = np.argsort(tb, kind="stable")
        edges = np.searchsorted(tb[order], np.arange(nb + 1))
        tt = ttft[order]
        for k in range(nb):
            x = tt[edges[k]:edges[k + 1]]
            done = x[~np.isnan(x)]
            if x.shape[0]:
                att[k] = np.count_nonzero(done <= slo_s) / x.shape[0]
            if done.shape[0]:
                p50[k], p99[k] = np.quantile(done, [0.5, 0.99], method="inverted_cdf")
    cols["ttft_p50_ms"] = p50 * 1e3
    cols["ttft_p99_ms"] = p99 * 1e3
    cols["slo_attainment"] = att
    return pl.DataFrame(cols).with_columns(pl.col(pl.Float64).fill_nan(None))


def recovery(tl: pl.DataFrame, base: pl.DataFrame, event_s: float, first_rel: float, bin_s: float,
             tol: float) -> tuple[float | None, float | None, bool]:
    """``(recovered_after_s, hit_rate_shortfall, recovered)``: the first bin at or after the
    event's from which the per-bin prefix-token hit rate stays within ``tol`` of the
    baseline's to the end (its start minus the event's time; 0 if never apart), and the
    largest drop below the baseline from the event's bin on (>= 0)."""
    h = tl["prefix_token_hit_rate"].to_numpy().astype(np.float64)
    g = base["prefix_token_hit_rate"].to_numpy().astype(np.float64)
    nb = min(h.shape[0], g.shape[0])
    if not nb or event_s == math.inf:
        return None, None, True
    e = max(0, int(math.floor((event_s - first_rel) / bin_s)))
    if e >= nb:
        return None, None, True
    d = np.nan_to_num(h[e:nb] - g[e:nb], nan=0.0)
    short = float(max(0.0, -d.min()))
    apart = np.nonzero(np.abs(d) > tol)[0]
    if apart.shape[0] == 0:
        return 0.0, short, True
    last = int(apart[-1])
    if last == d.shape[0] - 1:
        return None, short, False
    start = first_rel + (e + last + 1) * bin_s
    return max(0.0, start - event_s), short, True


@dataclass
class ScenarioResult:
    """Output of :func:`run_scenarios`.

    table : one row per scenario (the baseline ``plain`` first).
    timeline : one row per scenario and bin.
    events : one row per scenario event (its time, the request it acted before, what
        it dropped).
    info : model, system, load model, bin width, assumptions.
    """

    table: pl.DataFrame
    timeline: pl.DataFrame
    events: pl.DataFrame
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"scenarios": self.table.to_dicts(), "timeline": self.timeline.to_dicts(),
                "events": self.events.to_dicts(), "info": self.info}


@plain_numpy_pages
def run_scenarios(trace, cfg: ScenarioFile, *, model: ModelSpec, gpu: GpuSpec, response: ResponseModel,
                  progress=None) -> ScenarioResult:
    """Every scenario of ``cfg`` (and the baseline without events) over ``trace``."""
    load = cfg.load_model()
    R = trace.n_requests
    if R == 0:
        raise UsageError("the trace has no requests", field="trace")
    first = min(warmup_first_request(trace, parse_warmup(cfg.run.warmup)), R)
    if first >= R:
        raise UsageError("the warm-up covers the whole trace: nothing left to measure", field="run.warmup")
    ts = np.asarray(trace.request_timestamp, dtype=np.float64)
    rel = ts - ts[0]
    config = cfg.tier_config()
    node0 = route(trace, config.nodes, config.routing)
    bin_s = cfg.run.bin
    level = LoadLevel(cfg.load.scale)
    runs = ([(BASELINE, [])] if cfg.run.baseline else []) + [(s.name, list(s.event)) for s in cfg.scenario]
    rows, tls, ev_rows = [], [], []
    bpt = int(model.kv_bytes_per_token)
    base_tl = None
    total = len(runs) * trace.n_accesses
    for k, (name, events) in enumerate(runs):
        plan = plan_events(trace, cfg, events, node0, load.flash_targets)

        def prog(done, _n, k=k):
            if progress is not None:
                progress(k * trace.n_accesses + done, total)

        out = replay(trace, cfg, plan, model=model, response=response, load=load, first=first, progress=prog)
        try:  # the timeline reads the demand's rows too: closed (a spill file removed) after both
            row, _, ttft_m = run_level(out.demand, level, load, response, keep_ttft=True,
                                       congestion=plan.congestion, transfers=out.transfers)
            ttft = np.full(R, np.nan)
            ttft[first:first + ttft_m.shape[0]] = ttft_m
            tl = timeline(name, rel, first, bin_s, out, ttft[first:], load, load.slo_ttft_s, config.nodes)
        finally:
            out.demand.close()
        if base_tl is None and cfg.run.baseline:
            base_tl = tl
        ev_t = min(plan.event_times) if plan.event_times else math.inf
        if base_tl is not None:
            rec_s, short, recovered = recovery(tl, base_tl, ev_t, float(rel[first]), bin_s,
                                               cfg.run.recovery_tolerance)
        else:  # no baseline to compare with
            rec_s, short, recovered = None, None, None
        pre = float(out.prefix_tokens[first:].sum())
        totv = float(out.total_tokens[first:].sum())
        s = {"scenario": name, "events": "; ".join(_event_text(e) for e in events) or "none"}
        for key in ("ttft_p50_ms", "ttft_p99_ms", "ttft_p999_ms", "goodput_rps", "slo_attainment", "restore_share",
                    "recompute_share"):
            s[key] = row.get(key)
        s["prefix_token_hit_rate"] = pre / totv if totv > 0 else None
        t_read = sum(float(tl[c].sum()) for c in ("dram_read_bytes", "local_read_bytes", "flash_read_bytes"))
        for tier in ("dram", "local", "flash"):
            v = float(tl[f"{tier}_read_bytes"].sum())
            s[f"{tier}_read_bytes"] = v
            s[f"{tier}_read_share"] = v / t_read if t_read > 0 else None
        s["flash_write_bytes"] = float(tl["flash_write_bytes"].sum())
        s["local_write_bytes"] = float(tl["local_write_bytes"].sum())
        computed = (totv - pre) * bpt  # KV bytes the measured requests' prefill computed
        s["flash_write_amplification_ratio"] = s["flash_write_bytes"] / computed if computed > 0 else None
        s["recompute_gpu_seconds"] = float(out.recompute_s[first:].sum())
        s["prefill_gpu_seconds"] = float(tl["prefill_gpu_seconds"].sum())
        s["extra_prefill_gpu_seconds"] = (s["prefill_gpu_seconds"] - rows[0]["prefill_gpu_seconds"] if rows
                                          else 0.0) if cfg.run.baseline else None
        s["hit_rate_shortfall"] = short
        s["recovered_after_s"] = rec_s
        s["recovered"] = recovered
        for res in ("host_link", "nic", "local_ssd", "flash", "uplink", "gpu"):
            s[f"wait_p99_{res}_ms"] = row.get(f"wait_p99_{res}_ms")
        s["overloaded"] = bool(row.get("overloaded"))
        pfx = out.prefetch
        s["prefetch_requests"] = pfx["prefetch_requests"] if pfx else None
        s["prefetch_bytes"] = pfx["moved_tokens"] * bpt if pfx else None
        s["prefetch_useful_share"] = pfx["useful_tokens"] / pfx["moved_tokens"] if pfx and pfx["moved_tokens"] else None
        s["prefetch_extra_bytes"] = (pfx["moved_tokens"] - pfx["useful_tokens"]) * bpt if pfx else None
        s["prefetch_coverage_share"] = (pfx["covered_tokens"] / pfx["needed_tokens"] if pfx and pfx["needed_tokens"]
                                        else None)
        s["prefetch_dram_byte_seconds"] = pfx["held_token_seconds"] * bpt if pfx else None
        s["prefetch_displaced_bytes"] = pfx["displaced_tokens"] * bpt if pfx else None
        pw = out.prewarm
        s["prewarm_bytes"] = pw["moved_tokens"] * bpt if pw else None
        s["prewarm_useful_share"] = pw["useful_tokens"] / pw["moved_tokens"] if pw and pw["moved_tokens"] else None
        s["prewarm_displaced_bytes"] = pw["displaced_tokens"] * bpt if pw else None
        s["background_read_bytes"] = float(tl["background_read_bytes"].sum())
        s["ttft_p99_recovery_ms"] = _p99_between(ttft, rel, first, ev_t,
                                                 ev_t + rec_s if rec_s is not None else math.inf)
        s["lost_to_capacity_bytes"] = float(out.lost_tokens[0]) * bpt
        s["lost_to_events_bytes"] = float(out.lost_tokens[1:].sum()) * bpt
        s["dropped_blocks"] = int(sum(v[0] for v in out.dropped.values()))
        s["dropped_bytes"] = float(sum(v[1] for v in out.dropped.values()) * model.kv_bytes_per_token)
        rows.append(s)
        tls.append(tl)
        for i, e in enumerate(events):
            acts = [a for a in plan.actions if a.event == i]
            if plan.prestage is not None and plan.prestage.event == i:
                acts += [None] * plan.prestage.targets.shape[0]  # one per prefetch
            d = out.dropped.get(i, [0, 0])
            ev_rows.append({"scenario": name, "event": i, "kind": e.kind, "text": _event_text(e),
                            "at_s": plan.event_times[i] if plan.event_times[i] < math.inf else None,
                            "first_request": plan.event_first[i],
                            "actions": len(acts), "dropped_blocks": int(d[0]),
                            "dropped_bytes": float(d[1]) * model.kv_bytes_per_token,
                            "lost_bytes": float(out.lost_tokens[i + 1]) * bpt})
    table = pl.DataFrame(rows, infer_schema_length=None)
    events_df = pl.DataFrame(ev_rows, infer_schema_length=None) if ev_rows else pl.DataFrame(
        schema={"scenario": pl.String, "event": pl.Int64, "kind": pl.String})
    info = {"model": model.name, "kv_bytes_per_token": int(model.kv_bytes_per_token), "gpu": gpu.name,
            "system": cfg.system.model_dump(), "load": load.to_dict(), "load_factor": cfg.load.scale,
            "bin_s": bin_s, "warmup": cfg.run.warmup, "first_measured_request": first,
            "first_measured_s": float(rel[first]),
            "recovery_tolerance": cfg.run.recovery_tolerance,
            "assumptions": (f"{load.assumptions(response)}; load factor {cfg.load.scale:g}x; cache rules "
                            f"{cfg.system.cache_rules}; measured from request {first:,} of {R:,} "
                            f"({rel[-1] - rel[first]:.0f} s); recovery = the per-bin prefix-token hit rate within "
                            f"{cfg.run.recovery_tolerance:g} of the baseline's to the trace's end"
                            + ("; a prefetch's reads are queued on the links (the local SSD, its targets, "
                               "the NIC and the uplink) from its start, competing with the requests' reads; when it "
                               "lands follows its bandwidth budget, not the queues"
                               if any(e.kind == "prestage" for s in cfg.scenario for e in s.event) else ""))}
    return ScenarioResult(table, pl.concat(tls, how="vertical_relaxed"), events_df, info)


def _p99_between(ttft: np.ndarray, rel: np.ndarray, first: int, t0: float, t1: float) -> float | None:
    """p99 TTFT (ms) of the measured requests arriving in ``[t0, t1)`` (seconds after
    the first request; an unfinished one counts as infinite); None if there are none."""
    if t0 == math.inf:
        return None
    sel = np.arange(rel.shape[0]) >= first
    sel &= (rel >= t0) & (rel < t1)
    x = np.where(np.isnan(ttft[sel]), np.inf, ttft[sel])
    if x.shape[0] == 0:
        return None
    v = float(np.quantile(x, 0.99, method="inverted_cdf"))
    return v * 1e3 if v < math.inf else None


def _event_text(e) -> str:
    at = f"{e.at.seconds:g}s" if e.at.seconds is not None else f"{e.at.share:.0%}"
    if isinstance(e, ColdStart):
        return f"cold start at {at}"
    if isinstance(e, Restored):
        return f"DRAM lost, flash kept, at {at}"
    if isinstance(e, Migration):
        return f"{e.share:.0%} of sessions to the next node at {at}"
    if isinstance(e, TargetLoss):
        return f"flash target {e.target} lost at {at}"
    if isinstance(e, CatalogOutage):
        return f"catalog down {e.duration:g}s from {at}"
    if isinstance(e, Rollout):
        ret = f", old version retired at {e.retire_gbps:g} GB/s per tier" if e.retire_gbps else ""
        return f"rollout to {e.share:.0%} over {e.ramp:g}s from {at}{ret}"
    if isinstance(e, Prestage):
        lead = "at the previous turn's end" if e.lead == math.inf else f"{e.lead:g}s ahead"
        bw = "" if e.gbps == math.inf else f" at {e.gbps:g} GB/s"
        return f"prestage ({e.predictor}) {lead}{bw} from {at}"
    if isinstance(e, Congestion):
        which = "every" if e.instance is None else f"#{e.instance}"
        return f"{e.resource} ({which}) at {e.share:.0%} of its bandwidth for {e.duration:g}s from {at}"
    if isinstance(e, Prewarm):
        lim = "" if e.limit == 1.0 else f" up to {e.limit:g}x DRAM"
        hor = "" if e.order != "value" or e.horizon == math.inf else f" (value over {e.horizon:g}s)"
        return f"prewarm by {e.order}{hor} at {e.gbps:g} GB/s per node{lim} from {at}"
    if isinstance(e, Ttl):
        def ttl(v) -> str:
            if isinstance(v, dict):
                return "{" + ", ".join(f"{k} {x:g}s" for k, x in v.items()) + "}"
            return f"{v:g}s"

        parts = [f"{t} {ttl(v)}" for t, v in (("DRAM", e.dram), ("local SSD", e.local_ssd),
                                               ("flash", e.shared_flash)) if v != math.inf]
        by = f" by {e.by}" if e.by else ""
        return f"TTL{by} {', '.join(parts) or 'none'} from {at} (sweep {e.sweep:g}s)"
    return e.kind  # pragma: no cover


__all__ = ["ReplayOut", "ScenarioResult", "Synthetic", "recovery", "replay", "run_scenarios", "timeline"]
