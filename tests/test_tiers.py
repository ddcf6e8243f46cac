"""Tier simulator (DESIGN §2 "Tier simulator") against its twin and the curve kernel.

Layers:
- a hand-computed replay pins the semantics (kernel and twin);
- the kernel vs the brute-force twin (tests/naive_tiers.py) on random traces, for every
  admission policy, promotion, write mode, flash order, single and multi-node, with
  and without local SSDs, both LRU models, with a warm-up;
- the acceptance invariants against the stack-distance kernel and the curve:
  admit-all + exclusive + promote = one LRU of C_d + C_f (one block size; with mixed
  sizes bounded by DRAM's slack), ``none`` = the DRAM-only curve, DRAM = H(C_d) for
  every policy that promotes, hits + misses = accesses, writes <= evictions;
- the public wrapper: metrics from the twin's sums, routing, response times,
  configuration errors, and ``sweep`` in parallel processes = serially.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import numpy.testing as npt
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import naive_tiers as twin
from strategies import chained_traces, make_trace, random_traces

from kvtrace.analyses.curves import compute_curve
from kvtrace.names import MISS_OF_UNIT, RATE_OF_UNIT, tier_rate
from kvtrace.errors import UsageError
from kvtrace.kernels import tiers as K
from kvtrace.kernels.memory import Scratch
from kvtrace.kernels.stackdist import COLD, stack_distances
from kvtrace.model import resolve_model
from kvtrace.analyses.response import ResponseModel, request_times
from kvtrace.trace import Accesses, Trace, TraceMeta
from kvtrace.analyses.whatif import TierConfig, local_vs_shared, parse_policy, route, simulate, sweep

SETTINGS = settings(deadline=None, max_examples=250, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
POLICY_CODES = dict(zip(twin.POLICIES, range(9)))
PROMOTION_CODES = dict(zip(twin.PROMOTIONS, range(3)))
ONE_BYTE = resolve_model(kv_bytes_per_token=1)


# --------------------------------------------------------------------------- inputs


def request_of(req_start) -> np.ndarray:
    return np.repeat(np.arange(len(req_start) - 1, dtype=np.int64), np.diff(req_start))


def positions(req_start) -> np.ndarray:
    n = int(req_start[-1])
    return (np.arange(n) - np.asarray(req_start)[request_of(req_start)]).astype(np.int32)


@st.composite
def sim_inputs(draw, max_nodes: int = 3, rules: bool = False):
    """Kernel arguments for a random trace and a random configuration (with ``rules``,
    random engine reuse rules, and a block size some accesses fill exactly)."""
    tr = draw(st.one_of(random_traces(max_blocks=8, max_accesses=36, max_requests=10, sizes=st.integers(1, 6)),
                        chained_traces(max_requests=10, max_new=3, sizes=st.integers(1, 6))))
    block, size, req_start = tr.block, tr.size, tr.req_start
    n, R = len(block), len(req_start) - 1
    tokens = np.array([draw(st.integers(1, int(size[b]))) for b in block], dtype=np.int32).reshape(n)
    gaps = draw(st.lists(st.sampled_from([0.0, 0.0005, 0.25, 1.0, 3.0, 1000.0]), min_size=R, max_size=R))
    ts = np.cumsum(gaps).astype(np.float64)
    nodes = draw(st.integers(1, max_nodes))
    total = max(1, int(size.sum()))
    policy = draw(st.sampled_from(twin.POLICIES))
    param = {"freq": lambda: float(draw(st.integers(1, 3))),
             "prob": lambda: draw(st.sampled_from([0.0, 0.3, 0.7, 1.0])),
             "idle": lambda: draw(st.sampled_from([0.5, 1.5, 4.0, 1e6])),
             "value": lambda: draw(st.sampled_from([-1.0, 0.0, 0.5])),
             "group": lambda: draw(st.sampled_from([0.0, 0.4, 0.5, 0.6, 1.0]))}.get(policy, lambda: 0.0)()
    n_groups = draw(st.integers(1, 3))
    kw = dict(
        block_tokens=6,
        prefix_aware=draw(st.booleans()),
        dram=draw(st.integers(0, total)),
        local=draw(st.one_of(st.just(0), st.integers(1, total))),
        flash=draw(st.one_of(st.just(0), st.integers(1, total))),
        n_nodes=nodes,
        param=param,
        flash_lru=draw(st.booleans()),
        write_through=draw(st.booleans()),
        first_measured=draw(st.integers(0, R)),
        req_group=np.array(draw(st.lists(st.integers(0, n_groups - 1), min_size=R, max_size=R)),
                           dtype=np.int32).reshape(R),
        n_groups=n_groups,
        values=(np.array(draw(st.lists(st.sampled_from([-2.0, 0.0, 0.25, 1.0, 3.0]), min_size=n, max_size=n)))
                .reshape(n) if policy == "value" or draw(st.booleans()) else None),
        sketch_width=draw(st.sampled_from([2, 4, 16])),
    )
    if rules:
        kw["rules"] = draw(st.sampled_from([0, K.RULE_LAST_TOKEN_CAP, K.RULE_FULL_BLOCKS_ONLY,
                                            K.RULE_LAST_TOKEN_CAP | K.RULE_FULL_BLOCKS_ONLY]))
        if n:
            kw["block_tokens"] = int(draw(st.sampled_from(sorted(set(tokens.tolist())))))
    args = (block, size, req_start, tokens, positions(req_start), ts,
            np.array(draw(st.lists(st.integers(0, nodes - 1), min_size=R, max_size=R)), dtype=np.int64).reshape(R))
    return args, kw, policy, draw(st.sampled_from(twin.PROMOTIONS))


def run_both(args, kw, policy, promotion):
    """The kernel and the twin on the same input (oracle flags from each one's own
    admit-all pass, checked equal); returns (kernel TierRun, twin dict)."""
    kw = dict(kw)
    if policy == "oracle":
        k_all = K.simulate_tiers(*args, **kw, policy=K.P_ALL, promotion=PROMOTION_CODES[promotion])
        t_all = twin.simulate_tiers(*args, **kw, policy="all", promotion=promotion)
        npt.assert_array_equal(k_all.decision, t_all["decision"], err_msg="admit-all pass")
        flags = K.reuse_oracle_flags(args[0], len(args[1]), k_all.decision)
        npt.assert_array_equal(flags, twin.reuse_oracle_flags(args[0], t_all["decision"]))
        kw["oracle_ok"] = flags
    got = K.simulate_tiers(*args, **kw, policy=POLICY_CODES[policy], promotion=PROMOTION_CODES[promotion])
    want = twin.simulate_tiers(*args, **kw, policy=policy, promotion=promotion)
    return got, want


def assert_runs_equal(got: K.TierRun, want: dict) -> None:
    npt.assert_array_equal(got.decision, want["decision"], err_msg="decisions")
    npt.assert_array_equal(got.cold, want["cold"], err_msg="cold flags")
    npt.assert_array_equal(got.req_level, want["req_level"], err_msg="request branches")
    npt.assert_array_equal(got.req_out, np.array(want["req_out"], dtype=np.float64).reshape(got.req_out.shape),
                           err_msg="per-request sums")
    assert got.counts == want["counts"]
    for k, v in want["sums"].items():
        assert got.sums[k] == pytest.approx(v, rel=1e-12, abs=1e-12), k
    npt.assert_array_equal(got.hist, np.array(want["hist"]), err_msg="residency histograms")


# --------------------------------------------------------------------------- hand-computed


def test_hand_computed_replay():
    # sizes 1, DRAM 2, flash 2, admit-all, exclusive promote, write-on-evict, prefix-aware.
    # r0 [0 1] and r1 [2 3] miss; r1's inserts push 1 then 0 into flash; r2 [0 1] hits
    # flash twice (promoted; DRAM victims 3, 2 go to flash); r3 [2 0]: 2 in flash, 0 in
    # DRAM, and 0 is pinned while 2 is inserted, so the victim is 1. Final: DRAM {2, 0},
    # flash {1, 3} = one LRU of 4 (stack 2 0 1 3).
    tr = make_trace([[0, 1], [2, 3], [0, 1], [2, 0]], [1, 1, 1, 1])
    args = (tr.block, tr.size, tr.req_start, np.ones(8, np.int32), positions(tr.req_start),
            np.array([0.0, 1.0, 2.0, 4.0]), np.zeros(4, np.int64))
    kw = dict(block_tokens=1, prefix_aware=True, dram=2, local=0, flash=2, n_nodes=1)
    got = K.simulate_tiers(*args, **kw)
    want = twin.simulate_tiers(*args, **kw)
    M, F, D = K.MISS, K.FLASH, K.DRAM
    npt.assert_array_equal(got.decision, [M, M, M, M, F, F, F, D])
    assert list(got.req_level) == [M, M, F, F]
    c = got.counts
    assert (c["write_flash"], c["evict_dram"], c["evict_flash"], c["promote_flash"]) == (5, 5, 0, 3)
    assert (c["acc_dram"], c["acc_flash"], c["acc_miss"]) == (1, 3, 4)
    # the DRAM block after a flash block counts at the flash level
    assert got.sums["prefix_dram_tokens"] == 0 and got.sums["prefix_flash_tokens"] == 4
    # residency: block 1 entered flash at t=1 and left it (promoted) at t=2
    # residency: blocks 1 and 0 spent 1 s in flash (1024 quanta: bin 11 = [1, 2) s), block 2 spent 2 s
    assert got.hist[2, 0].sum() == 3 and got.hist[2, 0, 11] == 2 and got.hist[2, 0, 12] == 1
    assert_runs_equal(got, want)
    # and the stack model agrees: D iff d <= 2, hit iff d <= 4
    dist = stack_distances(tr.block, tr.size, tr.req_start, True)[0]
    npt.assert_array_equal(got.decision == D, dist <= 2)
    npt.assert_array_equal(got.decision != M, dist <= 4)


def test_write_through_copy_and_fifo_by_hand():
    # inclusive, copy, write-through, FIFO flash of 2, DRAM of 1 (sizes 1, flat model):
    # every miss is written at once; a flash hit is copied into DRAM and stays in flash.
    tr = make_trace([[0], [1], [0], [2], [0]], [1, 1, 1])
    args = (tr.block, tr.size, tr.req_start, np.ones(5, np.int32), positions(tr.req_start),
            np.arange(5.0), np.zeros(5, np.int64))
    kw = dict(block_tokens=1, prefix_aware=False, dram=1, local=0, flash=2, n_nodes=1, promotion=K.COPY,
              write_through=True, flash_lru=False)
    got = K.simulate_tiers(*args, **kw)
    # 0 M (written) · 1 M (written; evicts 0 from DRAM, no write) · 0 F (copied) ·
    # 2 M (written; FIFO evicts 0, the oldest, although it was just read) · 0 M
    npt.assert_array_equal(got.decision, [3, 3, 2, 3, 3])
    assert got.counts["write_flash"] == 4 and got.counts["promote_flash"] == 1
    assert got.counts["evict_flash"] == 2
    assert_runs_equal(got, twin.simulate_tiers(*args, **{**kw, "promotion": "copy"}))


def test_block_larger_than_dram_passes_through_to_flash():
    tr = make_trace([[0], [1], [0]], [5, 1])
    args = (tr.block, tr.size, tr.req_start, np.array([5, 1, 5], np.int32),
            positions(tr.req_start), np.arange(3.0), np.zeros(3, np.int64))
    got = K.simulate_tiers(*args, block_tokens=5, prefix_aware=True, dram=2, local=0, flash=8, n_nodes=1)
    # never in DRAM: written to flash on its way through, then read in place (not promoted)
    npt.assert_array_equal(got.decision, [3, 3, 2])
    assert got.counts["evict_dram"] == 1 and got.counts["write_flash"] == 1 and got.counts["promote_flash"] == 0


# --------------------------------------------------------------------------- kernel vs twin


@SETTINGS
@given(sim_inputs())
def test_kernel_matches_twin(case):
    args, kw, policy, promotion = case
    got, want = run_both(args, kw, policy, promotion)
    assert_runs_equal(got, want)


@FEW
@given(sim_inputs(max_nodes=1), st.sampled_from(twin.POLICIES))
def test_kernel_matches_twin_each_policy_with_local_ssd_and_flash(case, policy):
    args, kw, _, promotion = case
    total = int(args[1].sum())
    kw = {**kw, "local": max(1, total // 3), "flash": max(1, total // 2)}
    if policy == "value" and kw["values"] is None:
        kw["values"] = np.linspace(-1.0, 2.0, len(args[0]))
    got, want = run_both(args, kw, policy, promotion)
    assert_runs_equal(got, want)


@SETTINGS
@given(sim_inputs(rules=True))
def test_kernel_matches_twin_under_engine_rules(case):
    args, kw, policy, promotion = case
    got, want = run_both(args, kw, policy, promotion)
    assert_runs_equal(got, want)


def test_engine_rules_by_hand():
    """Block size 4; requests [0, 1] (4 + 2 tokens: block 1 partial) then [0, 1, 2]
    (4 + 4 + 4 tokens, block 1 now full under the same id) then [0, 1]; DRAM holds
    everything. Ideal: the second request hits 0 and 1, the third 0 and 1. Full blocks
    only: the partial block 1 of request 0 is never cached, so request 1 hits 0 only and
    caches 1 (full there); request 2's block 1 is partial again: a miss. Last-token cap:
    each request's last block is a miss though cached (request 1: 0, 1 hit, 2 capped;
    request 2: 0 hits, 1 capped)."""
    block = np.array([0, 1, 0, 1, 2, 0, 1])
    tokens = np.array([4, 2, 4, 4, 4, 4, 2], np.int32)
    req_start = np.array([0, 2, 5, 7])
    args = (block, np.array([4, 4, 4]), req_start, tokens, positions(req_start), np.arange(3.0), np.zeros(3, np.int64))
    kw = dict(block_tokens=4, prefix_aware=True, dram=100, local=0, flash=0, n_nodes=1)
    M = K.MISS
    for rules, want in ((0, [M, M, 0, 0, M, 0, 0]),
                        (K.RULE_FULL_BLOCKS_ONLY, [M, M, 0, M, M, 0, M]),
                        (K.RULE_LAST_TOKEN_CAP, [M, M, 0, 0, M, 0, M]),
                        (K.RULE_LAST_TOKEN_CAP | K.RULE_FULL_BLOCKS_ONLY, [M, M, 0, M, M, 0, M])):
        got = K.simulate_tiers(*args, **kw, rules=rules)
        npt.assert_array_equal(got.decision, want, err_msg=f"rules {rules}")
        assert_runs_equal(got, twin.simulate_tiers(*args, **kw, rules=rules))
    # full blocks only: the partial accesses are cold misses, and never occupy DRAM
    got = K.simulate_tiers(*args, **{**kw, "dram": 4}, rules=K.RULE_FULL_BLOCKS_ONLY)
    assert got.cold.tolist() == [True, True, False, True, True, False, True]
    assert got.counts["evict_dram"] == 2  # 0 then 1 evicted by 1 then 2 (the partial ones never enter)


@SETTINGS
@given(sim_inputs(rules=True), st.sampled_from(twin.POLICIES), st.data())
def test_feeding_in_chunks_equals_one_call(case, policy, data):
    """Requests fed in chunks (a streamed trace) give the whole-trace run bit for bit,
    whatever the split points: the admission inputs of an earlier chunk's access are
    kept per block, and a repeat inside a request is found by its request."""
    args, kw, _, promotion = case
    block, size, req_start, tokens, pos, ts, node = args
    if policy == "value" and kw["values"] is None:
        kw = {**kw, "values": np.linspace(-1.0, 2.0, len(block))}
    if policy == "oracle":
        all_ = K.simulate_tiers(*args, **kw, policy=K.P_ALL, promotion=PROMOTION_CODES[promotion])
        kw = {**kw, "oracle_ok": K.reuse_oracle_flags(block, len(size), all_.decision)}
    whole = K.simulate_tiers(*args, **kw, policy=POLICY_CODES[policy], promotion=PROMOTION_CODES[promotion])
    R = len(req_start) - 1
    cuts = sorted(set(data.draw(st.lists(st.integers(0, R), max_size=4))) | {0, R})
    values, oracle = kw.pop("values"), kw.pop("oracle_ok", None)
    sims = [K.TierSimulator(size, ts, node, **kw, policy=POLICY_CODES[policy], promotion=PROMOTION_CODES[promotion],
                            has_values=values is not None, chunk_columns=chunked) for chunked in (False, True)]
    parts, chunk_rows = [], []
    for r, r_end in zip(cuts[:-1], cuts[1:]):
        lo, hi = int(req_start[r]), int(req_start[r_end])
        d = [sim.feed(block[lo:hi], tokens[lo:hi], pos[lo:hi], req_start[r:r_end + 1] - lo,
                      None if values is None else values[lo:hi], None if oracle is None else oracle[lo:hi])
             for sim in sims]
        npt.assert_array_equal(d[1], d[0])
        parts.append(d[0])
        chunk_rows.append(sims[1].chunk_out.copy())  # valid until the next feed
    decision = np.concatenate(parts) if parts else np.zeros(0, np.int8)
    got = sims[0].finish((decision & 3).astype(np.int8), (decision & K.COLD_FLAG) != 0)
    for name in ("decision", "cold", "req_first", "req_level", "req_out", "hist"):
        npt.assert_array_equal(getattr(got, name), getattr(whole, name), err_msg=name)
    assert got.counts == whole.counts
    assert got.sums == whole.sums  # bit for bit
    # keeping only each chunk's per-request rows: the same rows, the same sums
    by_chunk = sims[1].finish()
    assert by_chunk.req_out is None and by_chunk.counts == whole.counts and by_chunk.sums == whole.sums
    npt.assert_array_equal(np.concatenate(chunk_rows) if chunk_rows else np.zeros((0, K.N_REQ_COLS)), whole.req_out)
    nonempty = req_start[1:] > req_start[:-1]
    npt.assert_array_equal(whole.req_first[nonempty], whole.decision[req_start[:-1][nonempty]])
    assert (whole.req_first[~nonempty] == K.MISS).all()


def test_twin_checks_are_sensitive():
    # the comparison must notice a one-access difference
    tr = make_trace([[0, 1], [0, 1]], [1, 1])
    args = (tr.block, tr.size, tr.req_start, np.ones(4, np.int32), positions(tr.req_start),
            np.arange(2.0), np.zeros(2, np.int64))
    kw = dict(block_tokens=1, prefix_aware=True, dram=2, local=0, flash=0, n_nodes=1)
    got = K.simulate_tiers(*args, **kw)
    want = twin.simulate_tiers(*args, **{**kw, "dram": 1})
    with pytest.raises(AssertionError):
        assert_runs_equal(got, want)


# --------------------------------------------------------------------------- invariants


def _sim(tr, prefix_aware, dram, flash, *, local=0, policy=K.P_ALL, promotion=K.PROMOTE, write_through=False,
         flash_lru=True, values=None):
    n = len(tr.block)
    return K.simulate_tiers(tr.block, tr.size, tr.req_start, tr.size[tr.block].astype(np.int32)
                            if n else np.zeros(0, np.int32), positions(tr.req_start),
                            np.arange(len(tr.req_start) - 1, dtype=np.float64), np.zeros(len(tr.req_start) - 1, np.int64),
                            block_tokens=8, prefix_aware=prefix_aware, dram=dram, local=local, flash=flash, n_nodes=1,
                            policy=policy, promotion=promotion, write_through=write_through, flash_lru=flash_lru,
                            values=values, sketch_width=16)


uniform_traces = st.sampled_from([1, 3]).flatmap(
    lambda s: st.one_of(random_traces(max_blocks=12, max_accesses=50, sizes=st.just(s)),
                        chained_traces(max_requests=12, sizes=st.just(s)))).filter(lambda t: len(t.size) > 0)


@SETTINGS
@given(uniform_traces, st.integers(1, 6), st.integers(0, 6), st.integers(0, 3), st.booleans(), st.booleans())
def test_admit_all_exclusive_promote_is_one_lru(tr, kd, kf, kl, prefix_aware, fifo):
    s = int(tr.size[0])
    C_d, C_f, C_l = kd * s, kf * s, kl * s
    dist = stack_distances(tr.block, tr.size, tr.req_start, prefix_aware)[0]
    run = _sim(tr, prefix_aware, C_d, C_f, local=C_l, flash_lru=not fifo)  # flash is never touched in place
    npt.assert_array_equal(run.decision == K.DRAM, dist <= C_d, err_msg="h_D = H(C_d)")
    npt.assert_array_equal(run.decision <= K.LOCAL, dist <= C_d + C_l, err_msg="DRAM + local = H(C_d + C_l)")
    npt.assert_array_equal(run.decision != K.MISS, dist <= C_d + C_l + C_f, err_msg="h_D + h_F = H(C_d + C_f)")


mixed_traces = st.one_of(random_traces(max_blocks=12, max_accesses=50, sizes=st.integers(1, 9)),
                         chained_traces(max_requests=12, sizes=st.integers(1, 9))).filter(lambda t: len(t.size) > 0)


@SETTINGS
@given(mixed_traces, st.integers(0, 30), st.integers(0, 30), st.booleans())
def test_mixed_sizes_are_bounded_by_dram_slack(tr, extra_d, extra_f, prefix_aware):
    s_max = int(tr.size.max())
    C_d, C_f = s_max + extra_d, s_max + extra_f  # every tier holds the largest block
    dist = stack_distances(tr.block, tr.size, tr.req_start, prefix_aware)[0]
    run = _sim(tr, prefix_aware, C_d, C_f)
    hit = run.decision != K.MISS
    npt.assert_array_equal(run.decision == K.DRAM, dist <= C_d)
    assert np.all(hit[dist <= C_d + C_f - (s_max - 1)]), "misses something one LRU of C_d + C_f - slack hits"
    assert np.all(dist[hit] <= C_d + C_f), "hits something one LRU of C_d + C_f misses"


def test_mixed_size_slack_is_real():
    # sizes a=1, b=2, c=2, DRAM 3, flash 2: after a, b, c DRAM holds c with 1 token of
    # slack and flash holds b (a was pushed out): 4 tokens cached where one LRU of 5
    # holds c, b, a, so the next a misses although its stack distance is 5
    tr = make_trace([[0], [1], [2], [0]], [1, 2, 2])
    dist = stack_distances(tr.block, tr.size, tr.req_start, True)[0]
    assert dist[3] == 5
    assert _sim(tr, True, 3, 2).decision[3] == K.MISS


@SETTINGS
@given(mixed_traces, st.integers(0, 20), st.integers(0, 40), st.sampled_from(twin.PROMOTIONS), st.booleans(),
       st.booleans())
def test_admit_none_is_the_dram_only_curve(tr, extra, C_f, promotion, write_through, prefix_aware):
    C_d = int(tr.size.max()) + extra
    dist = stack_distances(tr.block, tr.size, tr.req_start, prefix_aware)[0]
    run = _sim(tr, prefix_aware, C_d, C_f, policy=K.P_NONE, promotion=PROMOTION_CODES[promotion],
               write_through=write_through)
    npt.assert_array_equal(run.decision == K.DRAM, dist <= C_d)
    assert not np.any(run.decision == K.FLASH) and run.counts["write_flash"] == 0


@FEW
@given(sim_inputs(max_nodes=1), st.sampled_from(["promote", "copy"]))
def test_dram_is_the_curve_for_every_policy_that_promotes(case, promotion):
    args, kw, policy, _ = case
    block, size, req_start = args[:3]
    kw = {**kw, "dram": (int(size.max()) if size.size else 0) + kw["dram"], "first_measured": 0}
    got, _ = run_both(args, kw, policy, promotion)
    dist = stack_distances(block, size, req_start, kw["prefix_aware"])[0]
    npt.assert_array_equal(got.decision == K.DRAM, dist <= kw["dram"])


@SETTINGS
@given(sim_inputs())
def test_hits_plus_misses_are_accesses_and_writes_at_most_evictions(case):
    args, kw, policy, promotion = case
    got, _ = run_both(args, kw, policy, promotion)
    c, s = got.counts, got.sums
    first = int(args[2][kw["first_measured"]])
    n_meas = len(args[0]) - first
    assert c["acc_dram"] + c["acc_local"] + c["acc_flash"] + c["acc_miss"] == n_meas
    assert c["req_dram"] + c["req_local"] + c["req_flash"] + c["req_miss"] == len(args[6]) - kw["first_measured"]
    assert sum(s[f"acc_{d}_tokens"] for d in ("dram", "local", "flash", "miss")) == s["total_tokens"]
    assert sum(s[f"prefix_{d}_tokens"] for d in ("dram", "local", "flash")) <= s["total_tokens"]
    for t in ("local", "flash"):
        assert c[f"write_{t}"] <= c[f"offer_{t}"]
    if not kw["write_through"]:  # every write is a victim of the tier above (or a pass-through)
        above = "dram" if kw["local"] == 0 else "local"
        assert c["write_local_tokens"] <= c["evict_dram_tokens"]
        assert c["write_flash_tokens"] <= c[f"evict_{above}_tokens"]
        assert c["write_local"] <= c["evict_dram"] and c["write_flash"] <= c[f"evict_{above}"]
    if kw["values"] is not None:
        assert s["value_captured"] <= s["value_bound"] + 1e-9


@FEW
@given(uniform_traces, st.integers(1, 5), st.integers(1, 6), st.booleans())
def test_reuse_oracle_keeps_admit_all_hits_with_only_read_back_writes(tr, kd, kf, prefix_aware):
    s = int(tr.size[0])
    all_ = _sim(tr, prefix_aware, kd * s, kf * s)
    flags = K.reuse_oracle_flags(tr.block, len(tr.size), all_.decision)
    n = len(tr.block)
    oracle = K.simulate_tiers(tr.block, tr.size, tr.req_start, tr.size[tr.block].astype(np.int32) if n else np.zeros(0, np.int32),
                              positions(tr.req_start), np.arange(len(tr.req_start) - 1, dtype=np.float64),
                              np.zeros(len(tr.req_start) - 1, np.int64), block_tokens=8, prefix_aware=prefix_aware,
                              dram=kd * s, local=0, flash=kf * s, n_nodes=1, policy=K.P_ORACLE, oracle_ok=flags)
    npt.assert_array_equal(oracle.decision, all_.decision)
    # every write is read back once: one write per flash-hit block of a request
    req = request_of(tr.req_start)
    hit = np.flatnonzero(oracle.decision == K.FLASH)
    read_backs = len({(req[t], tr.block[t]) for t in hit}) if prefix_aware else len(hit)
    assert oracle.counts["write_flash"] == read_backs <= all_.counts["write_flash"]


@FEW
@given(mixed_traces, st.integers(0, 20), st.integers(1, 30))
def test_value_filter_at_zero_captures_the_bound(tr, C_d, C_f):
    values = np.resize(np.array([-1.5, 0.0, 2.0, 0.25, -0.1]), len(tr.block)).astype(np.float64)
    run = _sim(tr, True, C_d, C_f, policy=K.P_VALUE, values=values)
    assert run.sums["value_captured"] == pytest.approx(run.sums["value_bound"], abs=1e-12)
    loose = _sim(tr, True, C_d, C_f, policy=K.P_ALL, values=values)
    assert loose.sums["value_captured"] <= loose.sums["value_bound"] + 1e-12


def test_residency_bins_match_histogram_edges():
    # the kernel's octave bin of a difference equals bisecting HIST_EDGES (in quanta)
    import bisect

    for shift in (0, 3):
        for dq in [0, 1, 2, 3, 1023, 1024, 1025, 2**20 - 1, 2**20, 2**31 - 1]:
            seconds = dq * 2.0 ** (K.HIST_MIN_EXP + shift)
            want = max(0, bisect.bisect_right(list(K.HIST_EDGES), seconds) - 1)
            assert twin.hist_bin(dq, shift) == want, (dq, shift)
    tq, shift = K.quantise_times(np.array([0.0, 30 * 86400.0]))
    assert shift == 1 and tq[-1] == 30 * 86400 * 512
    assert twin.quantise_times([0.0, 30 * 86400.0]) == (tq.tolist(), shift)


# --------------------------------------------------------------------------- public API


def as_trace(block, size, req_start, *, ts=None, session=None, types=None, tokens=None, block_tokens=8) -> Trace:
    block = np.asarray(block, dtype=np.int64)
    req_start = np.asarray(req_start, dtype=np.int64)
    R, M = len(req_start) - 1, len(size)
    request = request_of(req_start)
    tokens = np.asarray(size, dtype=np.int32)[block] if tokens is None else np.asarray(tokens, dtype=np.int32)
    per_req = np.bincount(request, weights=tokens, minlength=R).astype(np.int64)
    requests = pl.DataFrame({
        "request_id": np.arange(R, dtype=np.int64),
        "timestamp": np.arange(R, dtype=np.float64) if ts is None else np.asarray(ts, dtype=np.float64),
        "session_id": pl.Series(session if session is not None else [None] * R, dtype=pl.Int64),
        "parent_id": pl.Series([None] * R, dtype=pl.Int64),
        "turn": pl.Series([None] * R, dtype=pl.Int64),
        "type": pl.Series(types if types is not None else [None] * R, dtype=pl.String),
        "tenant": pl.Series([None] * R, dtype=pl.String),
        "input_tokens": per_req,
        "output_tokens": np.zeros(R, dtype=np.int64),
        "block_ids": pl.Series([block[req_start[r]:req_start[r + 1]].astype(np.uint64).tolist() for r in range(R)],
                               dtype=pl.List(pl.UInt64)),
    })
    acc = Accesses(request=request, pos=positions(req_start), block=block, tokens=tokens, req_start=req_start)
    return Trace(requests, acc, (np.arange(M, dtype=np.uint64) * np.uint64(7919)) + np.uint64(1),
                 np.full(M, -1, np.int32), np.asarray(size, dtype=np.int64),
                 TraceMeta(block_tokens=block_tokens, source_format="canonical"))


CURVE_RATES = {"token": "prefix_token_hit_rate", "byte": "prefix_byte_hit_rate", "compute": "compute_saved_rate",
               "request": "request_hit_rate"}


@FEW
@given(uniform_traces, st.integers(1, 6), st.integers(0, 6), st.booleans())
def test_summary_shares_equal_the_curve(tr, kd, kf, flat):
    s = int(tr.size[0])
    trace = as_trace(tr.block, tr.size, tr.req_start)
    bpt = 2
    model = resolve_model(kv_bytes_per_token=bpt)
    ev = "flat" if flat else "prefix-aware"
    res = simulate(trace, TierConfig(kd * s * bpt, flash_bytes=kf * s * bpt), model=model, eviction=ev)
    curve = compute_curve(trace, model=model, eviction=ev, capacities=[kd * s * bpt, (kd + kf) * s * bpt])
    row = res.summary
    for unit, col in CURVE_RATES.items():
        at_d, at_df = curve.curve[col].to_list()
        assert row[tier_rate("dram", unit)] == pytest.approx(at_d, rel=1e-12, abs=1e-15), unit
        assert row[RATE_OF_UNIT[unit]] == pytest.approx(at_df, rel=1e-12, abs=1e-15), unit
        assert row[tier_rate("flash", unit)] == pytest.approx(at_df - at_d, rel=1e-9, abs=1e-12), unit
        shares = [row[tier_rate(t, unit)] for t in ("dram", "local", "flash")] + [row[MISS_OF_UNIT[unit]]]
        assert sum(shares) == pytest.approx(1.0)
    blocks = [row[f"{t}_block_hit_rate"] for t in ("dram", "local", "flash")] + [row["block_miss_rate"]]
    assert sum(blocks) == pytest.approx(1.0)


@FEW
@given(sim_inputs(max_nodes=1), st.sampled_from(["write-on-evict", "write-through"]))
def test_summary_and_requests_follow_the_twin(case, write_mode):
    args, kw, policy, promotion = case
    block, size, req_start, tokens, _, ts, _ = args
    if policy in ("group", "value", "oracle"):
        policy = "freq"
    if write_mode == "write-through" or promotion == "copy":
        inclusive = True
    else:
        inclusive = False
    bpt = 3
    model = resolve_model(kv_bytes_per_token=bpt)
    trace = as_trace(block, size, req_start, ts=ts, tokens=tokens, block_tokens=6)
    pol = {"freq": "freq>=2", "prob": "prob:0.3", "idle": "idle<1.5s"}.get(policy, policy)
    cfg = TierConfig(kw["dram"] * bpt, flash_bytes=kw["flash"] * bpt, local_ssd_bytes=kw["local"] * bpt,
                     policy=pol, promotion=promotion, write_mode=write_mode, inclusive=inclusive,
                     flash_order="lru" if kw["flash_lru"] else "fifo", window_s=2.0)
    resp = ResponseModel(dram_fixed_s=1e-3, dram_bytes_per_s=100.0, flash_fixed_s=5e-3, flash_bytes_per_s=10.0,
                         overhead_s=2e-3, recompute_flops_per_s=1e10)
    first = kw["first_measured"]
    R = len(req_start) - 1
    warm = None if first == 0 or first >= R else f"{first / R!r}"
    res = simulate(trace, cfg, model=model, response=resp, eviction="prefix-aware" if kw["prefix_aware"] else "flat",
                   warmup=warm)
    first = res.info["first_measured_request"]
    p = parse_policy(pol)
    want = twin.simulate_tiers(block, size, req_start, tokens, positions(req_start), ts,
                               np.zeros(R, np.int64), block_tokens=6, prefix_aware=kw["prefix_aware"],
                               dram=kw["dram"], local=kw["local"], flash=kw["flash"], n_nodes=1, policy=policy,
                               param=p.param, flash_lru=kw["flash_lru"], promotion=promotion,
                               write_through=write_mode == "write-through", first_measured=first,
                               sketch_width=K.sketch_width(kw["flash"] + kw["local"], 6, len(size)))
    row, c, s = res.summary, want["counts"], want["sums"]
    a, b = model.flops_coefficients()
    n_meas = R - first
    firsts = [want["decision"][req_start[r]] if req_start[r + 1] > req_start[r] else K.MISS for r in range(first, R)]
    def share(x, y):
        return None if y == 0 else pytest.approx(x / y)

    for i, t in enumerate(("dram", "local", "flash")):
        assert row[tier_rate(t, "request")] == share(firsts.count(i), n_meas)
        assert row[tier_rate(t, "token")] == share(s[f"prefix_{t}_tokens"], s["total_tokens"])
        assert row[tier_rate(t, "byte")] == share(s[f"prefix_{t}_size"], s["total_size"])
        flops = a * s[f"prefix_{t}_tokens"] + b * s[f"prefix_{t}_q"]
        assert row[tier_rate(t, "compute")] == share(flops, a * s["total_tokens"] + b * s["total_q"])
        assert row[f"{t}_eviction_bytes"] == c[f"evict_{t}_tokens"] * bpt
    for t in ("local", "flash"):
        assert row[f"{t}_write_bytes"] == c[f"write_{t}_tokens"] * bpt
        assert row[f"{t}_write_opportunities"] == c[f"offer_{t}"]
    assert row["promotions"] == c["promote_local"] + c["promote_flash"]
    seconds = ts[-1] - ts[first]
    if seconds > 0 and kw["flash"] > 0:
        assert row["flash_write_bytes_per_day"] == pytest.approx(c["write_flash_tokens"] * bpt / seconds * 86400)
        assert row["flash_dwpd"] == pytest.approx(row["flash_write_bytes_per_day"] / (kw["flash"] * bpt))
    # reads: mean and peak per 2-second window
    out = np.array(want["req_out"], dtype=np.float64).reshape(R, K.N_REQ_COLS)[first:]
    win = np.floor((ts[first:] - ts[first]) / 2.0).astype(int)
    for i, t in enumerate(("local", "flash"), start=1):
        per_win = np.bincount(win, weights=out[:, i] * bpt) if R > first else np.zeros(1)
        assert row[f"{t}_read_bytes"] == pytest.approx(out[:, i].sum() * bpt)
        assert row[f"{t}_read_peak_bytes_per_s"] == pytest.approx(per_win.max() / 2.0)
    # per-request service times: the response model on the twin's bytes and FLOPs
    times = request_times(out[:, 0] * bpt, (out[:, 1] + out[:, 2]) * bpt, a * out[:, 3] + b * out[:, 4],
                          a * out[:, 5] + b * out[:, 6], resp, cfg.has_flash)
    npt.assert_allclose(res.requests["service_time_ms"].to_numpy(), np.asarray(times) * 1e3, rtol=1e-12)
    assert res.requests["branch"].to_list() == [["dram", "local", "flash", "miss"][x] for x in want["req_level"][first:]]
    assert row["service_time_mean_ms"] == pytest.approx(times.mean() * 1e3 if times.size else None)
    if times.size:
        assert row["service_time_p99_ms"] == float(np.percentile(times, 99, method="inverted_cdf")) * 1e3
    assert res.residency["count"].sum() == sum(sum(sum(m) for m in tier) for i, tier in enumerate(want["hist"])
                                               if i == 0 or (i == 1 and kw["local"]) or (i == 2 and kw["flash"]))


@FEW
@given(sim_inputs(max_nodes=1), st.integers(1, 5), st.sampled_from(["session", "round-robin", "prefix"]))
def test_multi_node_routing_matches_twin(case, nodes, routing):
    args, kw, policy, _ = case
    block, size, req_start = args[:3]
    R = len(req_start) - 1
    sessions = [None if r % 3 == 0 else 100 + r % 4 for r in range(R)]
    trace = as_trace(block, size, req_start, session=sessions)
    got = route(trace, nodes, routing)
    firsts = [int(trace.block_hash[block[req_start[r]]]) if req_start[r + 1] > req_start[r] else None
              for r in range(R)]
    want = twin.route(nodes, routing, sessions, list(range(R)), firsts)
    npt.assert_array_equal(got, want if nodes > 1 else [0] * R)
    # the whole multi-node replay, with local SSDs and a shared pool
    res = simulate(trace, TierConfig(kw["dram"] + 1, flash_bytes=kw["flash"], local_ssd_bytes=kw["local"], nodes=nodes,
                                     routing=routing), model=ONE_BYTE)
    sim = twin.simulate_tiers(block, size, req_start, trace.accesses.tokens,
                              positions(req_start), trace.request_timestamp, np.asarray(got), block_tokens=8,
                              prefix_aware=True, dram=kw["dram"] + 1, local=kw["local"], flash=kw["flash"],
                              n_nodes=nodes)
    assert res.info["counts"] == sim["counts"]
    assert res.requests["node"].to_list() == list(got)


def test_local_ssd_vs_shared_flash_in_one_sweep():
    # two nodes, sessions pinned to nodes; the same 4 tokens of flash as two local SSDs of
    # 2 or one pool of 4: a session whose working set outgrows its node's SSD is helped by
    # the pool only
    reqs = [[0], [1], [2], [3], [4], [0], [1], [2]]
    tr = make_trace(reqs, [1] * 5)
    trace = as_trace(tr.block, tr.size, tr.req_start, session=[7] * 8)
    configs = local_vs_shared(1, 2, 2, routing="session")
    table = sweep(trace, configs, model=ONE_BYTE, workers=1)
    assert table["config"].to_list() == ["local-ssd", "shared-flash"]
    local, shared = table.to_dicts()
    assert local["local_prefix_token_hit_rate"] == 0 and shared["flash_prefix_token_hit_rate"] == pytest.approx(3 / 8)
    assert local["local_write_bytes"] > 0 and shared["flash_write_bytes"] > 0


def test_sweep_in_processes_equals_serial():
    rng = np.random.default_rng(3)
    reqs = [list(rng.integers(0, 40, size=rng.integers(1, 6))) for _ in range(300)]
    tr = make_trace(reqs, list(rng.integers(1, 5, size=40)))
    trace = as_trace(tr.block, tr.size, tr.req_start, ts=np.sort(rng.uniform(0, 600, 300)),
                     session=list(rng.integers(0, 20, 300)), types=list(rng.choice(["a", "b"], 300)))
    configs = [TierConfig(20, flash_bytes=60, policy=p, nodes=n, routing="session")
               for p in ("all", "tinylfu", "group>=0.5", "reuse-oracle") for n in (1, 3)]
    serial = sweep(trace, configs, model=ONE_BYTE, workers=1)
    parallel = sweep(trace, configs, model=ONE_BYTE, workers=2)
    assert serial.height == len(configs)
    assert serial.equals(parallel, null_equal=True)
    assert serial["policy"].to_list() == [c.policy for c in configs]


def test_parallel_sweep_maps_the_trace_and_values_and_removes_its_files(tmp_path, monkeypatch):
    # the workers map the trace (and the value>=v values) from files in a temporary
    # directory rather than receiving pickled copies: same table, directory gone after
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    rng = np.random.default_rng(8)
    reqs = [list(rng.integers(0, 50, size=rng.integers(1, 7))) for _ in range(400)]
    tr = make_trace(reqs, list(rng.integers(1, 5, size=50)))
    trace = as_trace(tr.block, tr.size, tr.req_start, ts=np.sort(rng.uniform(0, 900, 400)),
                     session=list(rng.integers(0, 25, 400)), types=list(rng.choice(["a", "b", "c"], 400)))
    values = rng.uniform(-1.0, 3.0, trace.n_accesses)
    configs = [TierConfig(15, flash_bytes=50, policy=p, nodes=n, routing=r)
               for p in ("value>=1.0", "prob:0.5", "group>=0.4") for n, r in ((1, "session"), (2, "prefix"))]
    serial = sweep(trace, configs, model=ONE_BYTE, values=values, workers=1, warmup="10%")
    parallel = sweep(trace, configs, model=ONE_BYTE, values=values, workers=2, warmup="10%")
    assert serial.equals(parallel, null_equal=True)
    assert serial["value_captured_usd"].drop_nulls().len() == len(configs)  # the values reached every run
    assert list(tmp_path.iterdir()) == []


def test_a_reused_block_table_changes_nothing():
    # one Scratch through configurations of different row widths (3 nodes with local
    # SSDs first, then one node), dirtied in between: every result as from fresh memory
    # (a row field or request column left uninitialised would read the garbage)
    rng = np.random.default_rng(5)
    reqs = [list(rng.integers(0, 30, size=rng.integers(1, 6))) for _ in range(200)]
    tr = make_trace(reqs, list(rng.integers(1, 5, size=30)))
    trace = as_trace(tr.block, tr.size, tr.req_start, ts=np.sort(rng.uniform(0, 300, 200)),
                     session=list(rng.integers(0, 9, 200)))
    configs = [TierConfig(12, flash_bytes=40, local_ssd_bytes=10, nodes=3, routing="session", policy="all"),
               TierConfig(12, flash_bytes=40, policy="tinylfu"),
               TierConfig(20, flash_bytes=30, policy="reuse-oracle", promotion="copy", inclusive=True),
               TierConfig(8, flash_bytes=50, policy="second-hit", write_mode="write-through", inclusive=True)]
    scratch = Scratch()
    for i, cfg in enumerate(configs):
        if i:  # garbage in the reused rows and per-request outputs
            for name in ("table", "requests"):
                scratch.get(1 << 16, name)[:] = rng.integers(0, 256, 1 << 16, dtype=np.uint8)
        fresh = simulate(trace, cfg, model=ONE_BYTE)
        reused = simulate(trace, cfg, model=ONE_BYTE, scratch=scratch)
        assert reused.summary == fresh.summary
        assert reused.info["counts"] == fresh.info["counts"]
        assert reused.requests.equals(fresh.requests) and reused.residency.equals(fresh.residency)


def test_config_and_policy_errors():
    with pytest.raises(UsageError, match="exclusive"):
        TierConfig("1GiB", flash_bytes="1TiB", promotion="copy")
    with pytest.raises(UsageError, match="exclusive"):
        TierConfig("1GiB", flash_bytes="1TiB", write_mode="write-through")
    TierConfig("1GiB", flash_bytes="1TiB", promotion="copy", write_mode="write-through", inclusive=True)
    for bad in ("freq>=0", "prob:1.5", "idle<soon", "lfu", "group:colour>=0.5", "group>=2"):
        with pytest.raises(UsageError):
            parse_policy(bad)
    with pytest.raises(UsageError, match="nodes"):
        TierConfig("1GiB", nodes=65)
    with pytest.raises(UsageError, match="routing"):
        TierConfig("1GiB", nodes=2, routing="random")
    assert str(parse_policy("second-hit")) == "freq>=2"
    assert parse_policy("idle<10min").param == 600.0
    assert parse_policy("group>=0.3", group_by="tenant").by == "tenant"
    # spellings a shell leaves alone mean the same policy
    for safe, usual in (("freq:3", "freq>=3"), ("idle:10min", "idle<10min"), ("value:-1.5", "value>=-1.5"),
                        ("group:0.3", "group>=0.3"), ("group:tenant:0.25", "group:tenant>=0.25")):
        assert parse_policy(safe) == parse_policy(usual), safe
    for bad in ("freq:0", "idle:soon", "group:colour:0.5", "value:"):
        with pytest.raises(UsageError):
            parse_policy(bad)
    assert TierConfig("64GiB", flash_bytes="1TiB").dram_bytes == 64 * 2**30
    tr = make_trace([[0], [0]], [1])
    with pytest.raises(UsageError, match="value"):
        simulate(as_trace(tr.block, tr.size, tr.req_start), TierConfig(1, flash_bytes=4, policy="value>=0"))


def test_kernel_runs_the_same_without_the_jit(tmp_path):
    script = r"""
import json, numpy as np
from kvtrace.kernels import tiers as K
from kvtrace.kernels.memory import Scratch
rng = np.random.default_rng(5)
starts = np.concatenate([[0], np.cumsum(rng.integers(0, 5, 60))]).astype(np.int64)
n = int(starts[-1]); block = rng.integers(0, 25, n).astype(np.int64); size = rng.integers(1, 4, 25).astype(np.int64)
req = np.repeat(np.arange(60), np.diff(starts)); pos = (np.arange(n) - starts[req]).astype(np.int32)
out = {}
for pol, prom, wt in ((K.P_ALL, K.PROMOTE, False), (K.P_TINYLFU, K.COPY, True), (K.P_GROUP, K.NO_PROMOTION, False)):
    r = K.simulate_tiers(block, size, starts, size[block].astype(np.int32), pos, np.arange(60.0), req % 2,
                         block_tokens=4, prefix_aware=True, dram=6, local=5, flash=9, n_nodes=2, policy=pol,
                         param=0.5, promotion=prom, write_through=wt, req_group=(np.arange(60) % 3).astype(np.int32),
                         n_groups=3, sketch_width=4)
    out[str(pol)] = [r.decision.tolist(), r.req_out.tolist(), r.counts, r.sums, r.hist.tolist()]
print(json.dumps(out))
"""
    runs = []
    for disable in ("0", "1"):
        env = dict(os.environ, NUMBA_DISABLE_JIT=disable)
        res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
        assert res.returncode == 0, res.stderr[-2000:]
        runs.append(json.loads(res.stdout))
    assert runs[0] == runs[1]


def test_cold_access_convention_matches_the_stack_kernel():
    tr = make_trace([[0, 0, 1], [1, 0]], [1, 1])
    for prefix_aware in (True, False):
        run = _sim(tr, prefix_aware, 4, 0)
        dist = stack_distances(tr.block, tr.size, tr.req_start, prefix_aware)[0]
        npt.assert_array_equal(run.cold, dist == COLD)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(sim_inputs(rules=True), st.data())
def test_probe_and_fetch_requests_equal_twin(case, data):
    """A scenario's probes (decisions only) and fetches (the leading blocks some tier of
    the node holds, touched, never measured; the row: DRAM tokens evicted), mixed with
    real requests: kernel = twin, access by access."""
    args, kw, policy, promotion = case
    if policy == "oracle":
        return
    R = len(args[2]) - 1
    kinds = np.array(data.draw(st.lists(st.sampled_from([0, 0, 1, 2]), min_size=R, max_size=R)), dtype=np.int8)
    kinds = kinds.reshape(R)
    kw = {k: v for k, v in kw.items() if k not in ("values",)} if policy != "value" else kw
    sim = K.TierSimulator(args[1], args[5], args[6], block_tokens=kw["block_tokens"], prefix_aware=kw["prefix_aware"],
                          dram=kw["dram"], local=kw["local"], flash=kw["flash"], n_nodes=kw["n_nodes"],
                          policy=POLICY_CODES[policy], param=kw["param"], flash_lru=kw["flash_lru"],
                          promotion=PROMOTION_CODES[promotion], write_through=kw["write_through"],
                          first_measured=kw["first_measured"], req_group=kw["req_group"], n_groups=kw["n_groups"],
                          has_values=kw.get("values") is not None, sketch_width=kw["sketch_width"],
                          rules=kw.get("rules", 0))
    sim.req_kind[:] = kinds
    decision = sim.feed(args[0], args[3], args[4], args[2], kw.get("values"))
    got = sim.finish(decision & 3, (decision & K.COLD_FLAG) != 0)
    want = twin.simulate_tiers(*args, **kw, policy=policy, promotion=promotion, req_kind=kinds.tolist())
    assert_runs_equal(got, want)
