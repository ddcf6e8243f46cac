"""The tier simulator's replay kernel: one chunk of whole requests through the tiers
(:mod:`kvtrace.kernels.tiers` states the semantics, :mod:`kvtrace.kernels.tier_table`
holds the block table and its operations).

:func:`_simulate` stays one function: a request's forward pass (decide, pin, account)
and backward pass (insert, evict, write below) share a dozen running values per
request (its level, usable/reusable state, per-tier sums, the previous in-place read
of each flash list) and the write loop is the one place every write goes through;
split into calls, Numba passes the arrays to each call and the per-request state
through memory. It is compiled once per admission policy (:func:`_specialise`).
"""

from __future__ import annotations

import types

import numpy as np
from numba import njit

from kvtrace.config import NJIT
from kvtrace.kernels.tier_table import (
    ABSENT, COLD_FLAG, COPY, C_ACC, C_EVICT, C_EVICT_TOK, C_OFFER, C_OFFER_TOK, C_PROMO, C_PROMO_TOK, C_REQ, C_WRITE,
    C_WRITE_TOK, DRAM, FLASH, I_BLOCK_TOKENS, I_FIRST_MEASURED, I_FLASH_LRU, I_HAS_FLASH, I_HAS_LOCAL, I_HAS_VALUES,
    I_NODES, I_PREFIX, I_PROMOTION, I_RULES, I_TIME_SHIFT, I_WRITE_THROUGH, LOCAL, MISS, NO_PROMOTION, PROMOTE,
    P_GROUP, P_ORACLE, P_TINYLFU, RULE_FULL_BLOCKS_ONLY, RULE_LAST_TOKEN_CAP, R_FL_Q, R_FL_TOK, R_MISS_Q, R_MISS_TOK,
    R_PRE_Q, R_PRE_TOK, R_READS, R_SRC, R_TOTAL_Q, R_TOTAL_TOK, R_WRITES, S_ACC, S_PREFIX, S_TOTAL, S_VALUE_BOUND,
    S_VALUE_CAPTURED, COUNT, FIRST_REQ, HEAD, HIST_LAST, INFO, INS, LIST0, INFO_ORACLE, PREV, RLAST, INFO_SIZE,
    STAT, TCH, admit_offer, time_bin, evict_lru, link_before, link_mru, prefetch_ahead, sketch_add, unlink_row,
    N_REQ_COLS, REQ_FETCH, REQ_PROBE, REQ_REAL,
)

# --------------------------------------------------------------------------- kernel
#: The admission policy a compiled :func:`_simulate` serves, bound per kernel by
#: :func:`_specialise` (the template below is never called as it is).
_KERNEL_POLICY = -1


def _simulate(block, tokens, pos, req_start, r0, req_ts, req_tq, req_node, req_group, req_kind, values,
              oracle_ok, ip, fp, cap, st, used, gstat, last_val, sketch, sk_ops,
              decision, req_level, req_out, out_base, cnt, sums, hist):
    """Replay a chunk of whole requests: a forward pass over each touch group decides,
    pins and accounts its accesses, a backward pass inserts them into DRAM (module
    docstring). Access arrays (``block`` .. ``pos``, ``values``, ``oracle_ok``,
    ``decision``) and ``req_start`` are the chunk's; per-request arrays are the whole
    trace's, the chunk's request r being trace request ``r0 + r`` (``req_out`` is
    [column, request - out_base]: the whole trace's with ``out_base`` 0, or the chunk's
    with ``out_base`` = r0).

    The pins of pass 1 run forward here, at each block's first occurrence, after its
    decision: a pin changes only the pinned block's own entries, and a repeat copies
    the decision of its first occurrence, so every decision still sees the tiers as
    the group found them. In-place flash reads (LRU) are linked, in forward order, just
    behind the group's previous read in that list: the order tail-first linking at the
    most-recent end gives.

    ``req_kind`` (the whole trace's, per request) marks the requests a scenario adds
    (:mod:`kvtrace.analyses.scenario`): a *probe* (``REQ_PROBE``) only records each
    access's decision (the tiers as it finds them; nothing changes, nothing is
    counted); a *fetch* (``REQ_FETCH``, a prefetch) is the leading run of its blocks
    that a tier of its node holds (it stops at the first it finds nowhere), touched as a
    request's are but never measured, its row holding the DRAM tokens its inserts
    evicted (``R_SRC``) instead of the accounting columns."""
    n_req = req_start.shape[0] - 1
    N = ip[I_NODES]
    has_local = ip[I_HAS_LOCAL] != 0
    has_flash = ip[I_HAS_FLASH] != 0
    local0 = LIST0 + N
    F = LIST0 + N * (1 + ip[I_HAS_LOCAL])
    flash_lru = ip[I_FLASH_LRU] != 0
    promotion = ip[I_PROMOTION]
    write_through = ip[I_WRITE_THROUGH] != 0
    prefix_aware = ip[I_PREFIX] != 0
    first_measured = ip[I_FIRST_MEASURED]
    policy = _KERNEL_POLICY  # a compile-time constant: one kernel per policy (see _specialise)
    shift = ip[I_TIME_SHIFT]
    B = np.float64(ip[I_BLOCK_TOKENS])
    Bi = ip[I_BLOCK_TOKENS]
    cap_last = (ip[I_RULES] & RULE_LAST_TOKEN_CAP) != 0
    full_only = (ip[I_RULES] & RULE_FULL_BLOCKS_ONLY) != 0
    use_sketch = policy == P_TINYLFU
    use_groups = policy == P_GROUP
    M = st.shape[0] - 1
    # the first flash tier below DRAM: the node's local SSD, else the shared flash
    first_tier = 1 if has_local else (2 if has_flash else 0)
    # accumulators of the measured period: acc[d] = accesses, tokens, occupied tokens
    # per decision; acc[4] = accesses, tokens, occupied tokens, q of all accesses;
    # acc[5, d] = request branches; pre[level] = usable-prefix blocks, tokens, occupied
    # tokens, q; lgap = reuse gaps per tier. Sums of integer-valued floats: exact.
    acc = np.zeros((6, 4), dtype=np.float64)
    pre = np.zeros((3, 4), dtype=np.float64)
    lgap = np.zeros((3, HIST_LAST + 1), dtype=np.int64)
    longest = 0
    for r in range(n_req):
        longest = max(longest, req_start[r + 1] - req_start[r])
    since_buf = np.empty(longest, dtype=np.int32)  # per first occurrence: last touch in the serving tier
    has_values = ip[I_HAS_VALUES] != 0
    has_oracle = policy == P_ORACLE
    chunk_node = req_node[r0:r0 + n_req]
    for r in range(n_req):
        lo = req_start[r]
        hi = req_start[r + 1]
        prefetch_ahead(r, block, req_start, chunk_node, st, F, has_flash, sketch, use_sketch)
        rg = r0 + r  # the trace's request index
        n = req_node[rg]
        D = LIST0 + n
        Lc = local0 + n
        first_flash = Lc if has_local else (F if has_flash else -1)
        now = req_ts[rg]
        nq = req_tq[rg]
        meas = rg >= first_measured
        kind = req_kind[rg]
        if kind != REQ_REAL:
            # probe or fetch: the leading blocks a tier of the node holds (a probe: all, decided)
            k = lo
            while k < hi:
                b = block[k]
                if full_only and tokens[k] != Bi:
                    d = MISS
                elif st[b, D, PREV] != ABSENT:
                    d = DRAM
                elif has_local and st[b, Lc, PREV] != ABSENT:
                    d = LOCAL
                elif has_flash and st[b, F, PREV] != ABSENT:
                    d = FLASH
                else:
                    d = MISS
                if kind == REQ_PROBE:
                    decision[k] = d
                elif d == MISS:
                    break
                k += 1
            if kind == REQ_PROBE:
                req_level[rg] = MISS
                for c in range(N_REQ_COLS):
                    req_out[c, rg - out_base] = 0.0
                continue
            hi = k
            meas = False
        # the request's usable / reusable prefix (accounting)
        usable = True
        reusable = True
        level = 0
        src_d = 0.0
        src_l = 0.0
        src_f = 0.0
        fl_tok = 0.0
        fl_q = 0.0
        miss_tok = 0.0
        miss_q = 0.0
        all_tok = 0.0  # the load model's columns (REQUEST_COLUMNS)
        all_q = 0.0
        pre_tok = 0.0
        pre_q = 0.0
        reads_l = 0.0
        reads_f = 0.0
        wrote_l = 0.0
        wrote_f = 0.0
        p_n = 0.0  # the current level's usable-prefix sums, flushed when the level changes
        p_tok = 0.0
        p_size = 0.0
        p_q = 0.0
        cap_d = -1  # the decision of a capped last block (touched as decided, accounted a miss)
        evicted_d = 0  # DRAM tokens evicted by the request's inserts
        n_touch_groups = 1 if prefix_aware else hi - lo
        for k in range(n_touch_groups):
            if prefix_aware:
                a, z = lo, hi
            else:
                a, z = lo + k, lo + k + 1
            behind_local = M  # the group's latest in-place read per flash list
            behind_flash = M
            # ---- forward: decide, pin (pass 1), account
            for t in range(a, z):
                b = block[t]
                s = st[b, INFO, INFO_SIZE]
                if full_only and tokens[t] != Bi:
                    # never cached (full blocks only): the engine recomputes it, the tiers never see it
                    d = MISS
                    cold = True
                    decision[t] = MISS + COLD_FLAG
                else:
                    tl = st[b, STAT, RLAST]
                    if use_groups:
                        if tl >= 0:
                            gstat[req_group[tl], 1] += 1
                        gstat[req_group[rg], 0] += 1
                    first_req = st[b, STAT, FIRST_REQ]
                    if prefix_aware:
                        cold = first_req < 0 or first_req == rg
                    else:
                        cold = st[b, STAT, COUNT] == 0
                    st[b, STAT, COUNT] += 1
                    st[b, STAT, RLAST] = rg
                    if has_values:
                        last_val[b] = values[t]
                    if has_oracle:
                        st[b, INFO, INFO_ORACLE] = oracle_ok[t]
                    if first_req < 0:
                        st[b, STAT, FIRST_REQ] = rg
                    if use_sketch:
                        sketch_add(sketch, sk_ops, st, b)
                    if prefix_aware and tl == rg:  # a repeat in this group: decided and pinned at its first
                        head = st[b, STAT, HEAD]
                        d = decision[head] & 3
                        since = since_buf[head - lo]
                    else:
                        st[b, STAT, HEAD] = t
                        if st[b, D, PREV] != ABSENT:
                            d = DRAM
                            X = D
                        elif has_local and st[b, Lc, PREV] != ABSENT:
                            d = LOCAL
                            X = Lc
                        elif has_flash and st[b, F, PREV] != ABSENT:
                            d = FLASH
                            X = F
                        else:
                            d = MISS
                            X = -1
                        since = st[b, X, TCH] if X >= 0 else -1
                        since_buf[t - lo] = since
                        # pin
                        if d == DRAM:
                            unlink_row(st, D, b)
                            used[D] -= s
                        elif d != MISS:
                            fits = s <= cap[D]  # a block larger than DRAM is never promoted
                            if promotion == PROMOTE and fits:
                                unlink_row(st, X, b)
                                used[X] -= s
                                if meas:
                                    cnt[C_PROMO + d] += 1
                                    cnt[C_PROMO_TOK + d] += s
                                    hist[d, 0, time_bin(nq - st[b, X, INS], shift)] += 1
                            else:
                                if flash_lru:
                                    unlink_row(st, X, b)
                                    if d == LOCAL:
                                        link_before(st, X, b, behind_local)
                                        behind_local = b
                                    else:
                                        link_before(st, X, b, behind_flash)
                                        behind_flash = b
                                st[b, X, TCH] = nq
                                if meas and promotion == COPY and fits:
                                    cnt[C_PROMO + d] += 1
                                    cnt[C_PROMO_TOK + d] += s
                    decision[t] = d + COLD_FLAG if cold else d
                if cap_last and t == hi - 1 and d != MISS:
                    # the last block is recomputed (hits capped at the prompt's length - 1 tokens): the
                    # tiers see the block the engine stores again (touched as decided), not read
                    cap_d = d
                    d = MISS
                    decision[t] = MISS + COLD_FLAG if cold else MISS
                # account (forward over the request)
                kt = np.float64(tokens[t])
                fs = np.float64(s)
                q = kt * (np.float64(pos[t]) * B) + kt * (kt - 1.0) * 0.5
                all_tok += kt
                all_q += q
                if meas:
                    if d != MISS:
                        lgap[d, time_bin(nq - since, shift)] += 1
                    acc[d, 0] += 1.0
                    acc[d, 1] += kt
                    acc[d, 2] += fs
                    acc[4, 0] += 1.0
                    acc[4, 1] += kt
                    acc[4, 2] += fs
                    acc[4, 3] += q
                if cold:
                    reusable = False
                if usable and d == MISS:
                    usable = False
                if usable:
                    if d > level:
                        if meas:
                            pre[level, 0] += p_n
                            pre[level, 1] += p_tok
                            pre[level, 2] += p_size
                            pre[level, 3] += p_q
                        p_n = p_tok = p_size = p_q = 0.0
                        level = d
                    p_n += 1.0
                    p_tok += kt
                    p_size += fs
                    p_q += q
                    pre_tok += kt
                    pre_q += q
                    if d == DRAM:
                        src_d += fs
                    else:
                        if d == LOCAL:
                            src_l += fs
                            reads_l += 1.0
                        else:
                            src_f += fs
                            reads_f += 1.0
                        fl_tok += kt
                        fl_q += q
                elif reusable:
                    miss_tok += kt
                    miss_q += q
            # ---- touch, pass 2 (tail-first): insert into DRAM, evict, write below.
            # Every write goes through the one loop below (write-through candidate
            # first, then each DRAM victim in eviction order; a local-SSD victim is
            # written to the shared flash before the next one is evicted), so the
            # write path is compiled once.
            for t in range(z - 1, a - 1, -1):
                b = block[t]
                if st[b, STAT, HEAD] != t or (full_only and tokens[t] != Bi):
                    continue
                d = cap_d if t == hi - 1 and cap_d >= 0 else decision[t] & 3
                s = st[b, INFO, INFO_SIZE]
                if (d == LOCAL or d == FLASH) and (promotion == NO_PROMOTION or s > cap[D]):
                    continue  # served in place
                cand = -1
                if s > cap[D]:  # never fits: passes through DRAM (inserted and evicted at once)
                    if meas:
                        cnt[C_EVICT] += 1
                        cnt[C_EVICT_TOK] += s
                        hist[0, 0, 0] += 1
                        hist[0, 1, 0] += 1
                    if d == MISS or not write_through:
                        cand = b
                else:
                    link_mru(st, D, b, M)
                    used[D] += s
                    if d != DRAM:  # a DRAM block was pinned in pass 1: it keeps its insert time
                        st[b, D, INS] = nq
                    st[b, D, TCH] = nq
                    if write_through and d == MISS:
                        cand = b
                while True:
                    if cand >= 0 and first_flash >= 0:
                        X = first_flash
                        tier = first_tier
                        while True:
                            if cand >= 0:
                                # offer cand to flash list X: an opportunity iff it is not there
                                # and fits; written iff admitted (at its most-recent end). Written
                                # out here, not as an inlined helper: Numba keeps a reference-count
                                # increment and decrement per array argument of the helper (14) on
                                # every offer
                                wrote = False
                                sv = st[cand, INFO, INFO_SIZE]
                                if st[cand, X, PREV] == ABSENT and sv <= cap[X]:
                                    val = last_val[cand] if has_values else 0.0
                                    if meas:
                                        cnt[C_OFFER + tier] += 1
                                        cnt[C_OFFER_TOK + tier] += sv
                                        if val > 0:
                                            sums[S_VALUE_BOUND] += val
                                    if admit_offer(policy, cand, X, now, ip, fp, st, used, cap, req_ts, req_group,
                                                   gstat, last_val, sketch, sk_ops):
                                        link_mru(st, X, cand, M)
                                        st[cand, X, INS] = nq
                                        st[cand, X, TCH] = nq
                                        used[X] += sv
                                        if tier == 2:
                                            wrote_f += sv
                                        else:
                                            wrote_l += sv
                                        if meas:
                                            cnt[C_WRITE + tier] += 1
                                            cnt[C_WRITE_TOK + tier] += sv
                                            sums[S_VALUE_CAPTURED] += val
                                        wrote = True
                                cand = -1
                                if wrote and tier == 2:
                                    while used[F] > cap[F]:
                                        evict_lru(F, 2, nq, shift, meas, st, used, cnt, hist, sketch, use_sketch)
                            if has_local and used[Lc] > cap[Lc]:
                                w = evict_lru(Lc, 1, nq, shift, meas, st, used, cnt, hist, sketch, use_sketch)
                                if has_flash:
                                    cand = w
                                    X = F
                                    tier = 2
                                continue
                            break
                    cand = -1
                    if used[D] <= cap[D]:
                        break
                    w = evict_lru(D, 0, nq, shift, meas, st, used, cnt, hist, sketch, use_sketch)
                    evicted_d += st[w, INFO, INFO_SIZE]
                    if not write_through:
                        cand = w
        if kind == REQ_FETCH:
            for c in range(N_REQ_COLS):
                req_out[c, rg - out_base] = 0.0
            req_out[R_SRC, rg - out_base] = evicted_d
            req_level[rg] = MISS
            continue
        # ---- the request's totals
        if meas:
            pre[level, 0] += p_n
            pre[level, 1] += p_tok
            pre[level, 2] += p_size
            pre[level, 3] += p_q
        req_out[R_SRC, rg - out_base] = src_d
        req_out[R_SRC + 1, rg - out_base] = src_l
        req_out[R_SRC + 2, rg - out_base] = src_f
        req_out[R_FL_TOK, rg - out_base] = fl_tok
        req_out[R_FL_Q, rg - out_base] = fl_q
        req_out[R_MISS_TOK, rg - out_base] = miss_tok
        req_out[R_MISS_Q, rg - out_base] = miss_q
        req_out[R_TOTAL_TOK, rg - out_base] = all_tok
        req_out[R_TOTAL_Q, rg - out_base] = all_q
        req_out[R_PRE_TOK, rg - out_base] = pre_tok
        req_out[R_PRE_Q, rg - out_base] = pre_q
        req_out[R_READS, rg - out_base] = reads_l
        req_out[R_READS + 1, rg - out_base] = reads_f
        req_out[R_WRITES, rg - out_base] = wrote_l
        req_out[R_WRITES + 1, rg - out_base] = wrote_f
        # request branch: deepest tier of the usable prefix, miss if it is empty
        branch = MISS
        if hi > lo and (decision[lo] & 3) != MISS:  # a capped or uncached access's decision is MISS
            branch = level
        req_level[rg] = branch
        if meas:
            acc[5, branch] += 1.0
    for lv in range(3):
        for w in range(4):
            sums[S_PREFIX + 4 * lv + w] += pre[lv, w]
    for w in range(4):
        sums[S_TOTAL + w] += acc[4, w]
    for d in range(4):
        sums[S_ACC + 2 * d] += acc[d, 1]
        sums[S_ACC + 2 * d + 1] += acc[d, 2]
        cnt[C_ACC + d] += np.int64(acc[d, 0])
        cnt[C_REQ + d] += np.int64(acc[5, d])
    for tier in range(3):
        for i in range(HIST_LAST + 1):
            hist[tier, 2, i] += lgap[tier, i]


@njit(**NJIT)
def oracle_flags_chunk(block, decision, next_flash, out):
    """Backward over one run of accesses (a trace's chunks taken last to first):
    ``out[t]`` = 1 iff the block's next access was served from a flash tier (LOCAL or
    FLASH) in the admit-all run whose decisions are ``decision``; ``next_flash``
    (int8 per block, 0 at the start) carries that per block from one chunk to the
    previous one."""
    for t in range(block.shape[0] - 1, -1, -1):
        b = block[t]
        out[t] = next_flash[b]
        d = decision[t] & 3
        next_flash[b] = 1 if d == LOCAL or d == FLASH else 0


# --------------------------------------------------------------------------- one kernel per policy
def _specialise(policy: int):
    """:func:`_simulate` compiled for one admission policy: the same code with the
    global ``_KERNEL_POLICY`` bound to a constant, so the compiler drops the other
    policies' branches from the hot loop. Each is compiled on its first use and cached
    on disk under its own name."""
    name = f"_simulate_{_POLICY_NAMES[policy]}"
    fn = types.FunctionType(_simulate.__code__, {**globals(), "_KERNEL_POLICY": policy}, name)
    fn.__qualname__ = name
    fn.__module__ = __name__
    fn.__doc__ = _simulate.__doc__
    return njit(**NJIT)(fn)


_POLICY_NAMES = ("all", "none", "freq", "prob", "idle", "value", "oracle", "tinylfu", "group")
#: The kernel of each policy code (``P_*``).
SIMULATE = tuple(_specialise(p) for p in range(len(_POLICY_NAMES)))
