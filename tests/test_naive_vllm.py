"""The vLLM block-management twin (``tests/naive_vllm.py``), checked on its own.

- hand-computed scenarios pin each rule one at a time (golden values worked out by hand in the
  comments: free queues are written head first, physical blocks as numbers, ids as letters);
- with every rule switched to kvtrace's semantics the sequential replay is exactly kvtrace's
  ideal prefix-aware LRU (``naive.lru_simulate``, block size 1, capacity = pool) on random
  chained traces at every pool size from 0 up, hits and cache contents after every request;
- vLLM's rules against an independent restatement when nothing is ever evicted;
- in-flight mode with zero durations is the sequential mode; random in-flight runs keep the
  pool's invariants (checked inside the twin after every event).
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import naive
from naive_vllm import KVTRACE_RULES, Replayer, Result, Rules, replay
from strategies import chained_traces

B = 4
A, Bk, C, D, E, F, G, P, Q, W, X, Y, Y2, Z = range(14)  # block ids of the hand-computed cases


def req(blocks, tokens, arrival=0.0, duration=0.0):
    return {"blocks": list(blocks), "tokens": list(tokens), "arrival": float(arrival), "duration": float(duration)}


def hits(results):
    return [(r.hit_blocks, r.hit_tokens) for r in results]


def run(requests, pool, rules=Rules()):
    """Sequential replay keeping the replayer, to look at the pool afterwards."""
    rp = Replayer(pool, B, rules)
    return [rp.sequential(r) for r in requests], rp.pool


def test_the_default_rules_are_current_upstream():
    assert Rules() == Rules(last_token_cap=True, full_blocks_only=True, reject_oversize=True,
                            free_order="hashless-first")
    with pytest.raises(AssertionError):
        Rules(free_order="lru")


# --------------------------------------------------------------------------- R2: last-token cap
def test_the_last_token_cap_recomputes_the_last_block_into_a_second_copy():
    # pool 4, queue [1,2,3,4].
    # r0 [A,Bk] 8 tokens: cap 7 -> at most 1 block; A missing -> 0 hits. Pops 1,2 (A=1, Bk=2),
    #    caches both; frees tail first [2,1], both hashed -> appended: queue [3,4,2,1].
    # r1 [A,Bk] again: cap 7 -> only A can hit: hit 1 (4 tokens). touch 1 -> [3,4,2]; pops 3 for
    #    Bk and caches it although Bk already has copy 2: cached Bk = [2,3]. Frees [3,1]: [4,2,3,1].
    res, pool = run([req([A, Bk], [4, 4])] * 2, 4)
    assert hits(res) == [(0, 0), (1, 4)]
    assert pool.cached == {A: [1], Bk: [2, 3]}
    assert pool.free == [4, 2, 3, 1]
    # Without the cap r1 hits both blocks and allocates nothing: no copy, queue [3,4,2,1].
    res, pool = run([req([A, Bk], [4, 4])] * 2, 4, Rules(last_token_cap=False))
    assert hits(res) == [(0, 0), (2, 8)]
    assert pool.cached == {A: [1], Bk: [2]}
    assert pool.free == [3, 4, 2, 1]


def test_the_second_copy_takes_a_slot_and_changes_a_later_eviction():
    # pool 4, queue [1,2,3,4]. Cap on (default rules):
    # r0 [Z]:      0 hits; Z=1; queue [2,3,4,1].
    # r1 [A,Bk]:   0 hits; A=2, Bk=3; frees [3,2]: queue [4,1,3,2].
    # r2 [A,Bk]:   cap -> hit A only (1 block, 4 tokens); touch 2 -> [4,1,3]; need = 1 new + 1
    #              (A was free) = 2 <= 3; pops 4 -> second copy of Bk on 4; frees [4,2]: [1,3,4,2].
    # r3 [W]:      cap 3 -> no hit possible; pops 1 -> evicts Z (the last hashless block went
    #              to the copy); W=1: queue [3,4,2,1].
    # r4 [Z,G] 4+2 tokens: Z is gone -> 0 hits.
    trace = [req([Z], [4]), req([A, Bk], [4, 4]), req([A, Bk], [4, 4]), req([W], [4]), req([Z, G], [4, 2])]
    assert hits(replay(trace, 4, B)) == [(0, 0), (0, 0), (1, 4), (0, 0), (0, 0)]
    # Cap off: r2 hits A and Bk, allocates nothing, queue stays [4,1,3,2]; r3 pops the hashless
    # 4 for W, so Z survives and r4 hits it (1 block, 4 tokens; G is partial: never hashed).
    assert hits(replay(trace, 4, B, Rules(last_token_cap=False))) == [(0, 0), (0, 0), (2, 8), (0, 0), (1, 4)]


def test_a_hit_takes_the_oldest_copy():
    # pool 5, queue [1,2,3,4,5].
    # r0 [A,Bk]: A=1, Bk=2; queue [3,4,5,2,1].       rX [X]: X=3; queue [4,5,2,1,3].
    # r1 [A,Bk]: cap -> hit A; touch 1 -> [4,5,2,3]; Bk's second copy on 4; frees [4,1]:
    #    queue [5,2,3,4,1] = hashless, Bk, X, Bk', A.
    # r2 [A,Bk,P] 4+4+2: cap 9 -> A and Bk hit; Bk is served by its OLDEST copy, 2: touch 1,2 ->
    #    [5,3,4]; pops 5 for P (hashless); frees [5,2,1]: 5 to the head -> [5,3,4,2,1]: the
    #    unused copy 4 now sits behind X.
    # r3 [Y,Y2]: pops 5 and 3 -> evicts X.             r4 [X,Q] 4+1: X is gone -> 0 hits.
    # (Serving Bk from the newest copy, 4, would leave copy 2 ahead of X; r3 would evict that
    # copy instead of X and r4 would hit.)
    trace = [req([A, Bk], [4, 4]), req([X], [4]), req([A, Bk], [4, 4]), req([A, Bk, P], [4, 4, 2]),
             req([Y, Y2], [4, 4]), req([X, Q], [4, 1])]
    assert hits(replay(trace, 5, B)) == [(0, 0), (0, 0), (1, 4), (2, 8), (0, 0), (0, 0)]


# --------------------------------------------------------------------------- R1: full blocks only
def test_a_partial_last_block_is_never_hit():
    # [A,P] with 4+2 tokens, twice, pool 4. A is full, P (2 tokens) is partial.
    trace = [req([A, P], [4, 2])] * 2
    # Default: P is never hashed, so r1 hits A only (cap 5 would allow 4 tokens anyway).
    res, pool = run(trace, 4)
    assert hits(res) == [(0, 0), (1, 4)] and pool.cached_ids() == {A}
    # Cap off: still only A (P has no hash), 4 of the 6 tokens.
    assert hits(replay(trace, 4, B, Rules(last_token_cap=False))) == [(0, 0), (1, 4)]
    # Partial blocks cached (kvtrace), cap on: P ends at token 6 > cap 5 -> A only.
    assert hits(replay(trace, 4, B, Rules(full_blocks_only=False))) == [(0, 0), (1, 4)]
    # Partial blocks cached and cap off: both blocks, all 6 tokens.
    both_off = Rules(last_token_cap=False, full_blocks_only=False)
    assert hits(replay(trace, 4, B, both_off)) == [(0, 0), (2, 6)]


def test_the_partial_block_still_takes_a_block():
    # pool 2: [A,P] (4+1 tokens) takes both blocks: A=1, P=2 (hashless). Freed [2,1]:
    # hashless-first -> queue [2,1]. [C] (4 tokens) pops 2: A survives; [A,Q] then hits A.
    trace = [req([A, P], [4, 1]), req([C], [4]), req([A, Q], [4, 1])]
    assert hits(replay(trace, 2, B)) == [(0, 0), (0, 0), (1, 4)]


# --------------------------------------------------------------------------- R7: oversize
def test_an_oversize_request_is_rejected_and_the_cache_is_unchanged():
    # pool 2, queue [1,2]. r0 [A]: A=1; queue [2,1].
    # r1 [A,C,D] needs 3 blocks > 2: rejected, all miss (although A is cached), nothing moves.
    # r2 [A,E] 4+1 tokens: hits A.
    trace = [req([A], [4]), req([A, C, D], [4, 4, 4]), req([A, E], [4, 1])]
    rp = Replayer(2, B)
    res = [rp.sequential(trace[0])]
    before = (list(rp.pool.free), {k: list(v) for k, v in rp.pool.cached.items()}, dict(rp.pool.ref))
    res.append(rp.sequential(trace[1]))
    assert (rp.pool.free, rp.pool.cached, rp.pool.ref) == before == ([2, 1], {A: [1]}, {1: 0, 2: 0})
    res.append(rp.sequential(trace[2]))
    assert res == [Result(), Result(rejected=True), Result(1, 4)]
    # Not rejected (kvtrace): r1 keeps its first 2 blocks [A,C]; the cap is about the whole
    # 12-token prompt (11), so A hits (touch 1 -> [2]); C takes 2; D is dropped. Queue [2,1].
    # r2 then hits A, pops 2 (evicts C) for its partial E, which is freed to the head: [2,1].
    rp = Replayer(2, B, Rules(reject_oversize=False))
    res = [rp.sequential(r) for r in trace[:2]]
    assert rp.pool.cached == {A: [1], C: [2]} and rp.pool.free == [2, 1]
    res.append(rp.sequential(trace[2]))
    assert res == [Result(), Result(1, 4), Result(1, 4)]
    assert rp.pool.cached == {A: [1]} and rp.pool.free == [2, 1]


def test_an_oversize_request_keeps_its_first_blocks_under_kvtrace_rules():
    # pool 2, [A,Bk,C] three times: first keeps A, Bk; then A, Bk hit every time, C never.
    trace = [req([A, Bk, C], [4, 4, 4])] * 3
    assert hits(replay(trace, 2, B, KVTRACE_RULES)) == [(0, 0), (2, 8), (2, 8)]


def test_an_empty_pool():
    # 0 usable blocks (num_gpu_blocks = 1, the null block): every non-empty request is oversize.
    trace = [req([A], [4]), req([], []), req([A, Bk], [4, 4])]
    assert replay(trace, 0, B) == [Result(rejected=True), Result(), Result(rejected=True)]
    assert replay(trace, 0, B, KVTRACE_RULES) == [Result(), Result(), Result()]


# --------------------------------------------------------------------------- R6: free order
@pytest.mark.parametrize("free_order, queue_after_r1, r3_hit", [
    # r1 frees [3 (P, hashless), 2 (A)] onto queue [1 (X)]:
    ("hashless-first", [3, 1, 2], (1, 4)),  # 3 prepended, 2 appended: r2 pops 3, X survives
    ("append", [1, 3, 2], (0, 0)),  # both appended: r2 pops 1 and evicts X
])
def test_the_free_order_of_hashless_blocks(free_order, queue_after_r1, r3_hit):
    # pool 3, queue [1,2,3]. r0 [X]: X=1; queue [2,3,1].
    # r1 [A,P] 4+2 tokens: pops 2 (A), 3 (P, never hashed); queue [1] before the free.
    # r2 [Y] pops the head; r3 [X,Q] 4+1 tokens hits X iff it survived.
    rp = Replayer(3, B, Rules(free_order=free_order))
    res = [rp.sequential(r) for r in [req([X], [4]), req([A, P], [4, 2])]]
    assert rp.pool.free == queue_after_r1
    res += [rp.sequential(r) for r in [req([Y], [4]), req([X, Q], [4, 1])]]
    assert hits(res) == [(0, 0), (0, 0), (0, 0), r3_hit]


# --------------------------------------------------------------------------- in flight
def test_in_flight_a_request_waits_for_blocks_and_blocks_those_behind_it():
    # pool 3. r0 [A,Bk,C] t=0..5; r1 [D] arrives 1; r2 [A,Bk,C] arrives 2; r3 [E] (2 tokens) at 3.
    # t=0 r0 admitted: A=1, Bk=2, C=3, queue [].
    # t=1,2,3: nothing free: r1 waits, r2 and r3 queue behind it.
    # t=5 r0 ends: frees [3,2,1] (hashed, appended): queue [3,2,1].
    #     r1: 0 hits, need 1 -> admitted (wait 4), pops 3 (evicts C), D=3, runs to 6.
    #     r2: cap 11 -> A, Bk hit; need = 1 new + 2 free hits = 3 > 2 free -> waits; r3 waits too
    #     although one block would do (FCFS).
    # t=6 r1 ends: queue [2,1,3]. r2 admitted (wait 4): hits 2 blocks (8 tokens), touch 1,2,
    #     pops 3 (evicts D) for C; runs to 7. r3: queue empty -> waits.
    # t=7 r2 ends: queue [3,2,1]. r3 admitted (wait 4), 0 hits.
    trace = [req([A, Bk, C], [4, 4, 4], 0, 5), req([D], [4], 1, 1), req([A, Bk, C], [4, 4, 4], 2, 1),
             req([E], [2], 3, 1)]
    assert replay(trace, 3, B, in_flight=True) == [Result(0, 0, False, 0.0), Result(0, 0, False, 4.0),
                                                   Result(2, 8, False, 4.0), Result(0, 0, False, 4.0)]


def test_in_flight_a_hit_on_a_block_held_by_a_running_request_is_shared():
    # pool 3. r0 [A,P] 4+1 tokens, t=0..10: A=1 (cached), P=2; queue [3].
    # r1 [A,Q] 4+1 at t=1: cap 4 -> A hits although r0 holds it (ref_cnt 1): need = 1 new + 0
    # -> admitted at once with 1 free block for 2 blocks. Hit 1 block, 4 tokens.
    trace = [req([A, P], [4, 1], 0, 10), req([A, Q], [4, 1], 1, 1)]
    assert replay(trace, 3, B, in_flight=True) == [Result(), Result(1, 4, False, 0.0)]
    # The same r1 with a block nobody holds ([F,Q]) needs 2 blocks with 1 free: waits to t=10.
    trace = [req([A, P], [4, 1], 0, 10), req([F, Q], [4, 1], 1, 1)]
    assert replay(trace, 3, B, in_flight=True) == [Result(), Result(0, 0, False, 9.0)]


def test_in_flight_completions_come_before_admissions_at_the_same_time():
    # pool 2. r0 [A,Bk] t=0..2 holds both blocks (A=1, Bk=2). r1 [C] and r2 [A,Bk] arrive at 2.
    # t=2: r0 is freed first: queue [2,1]; so r1 is admitted at once (wait 0): pops 2 (evicts
    #      Bk), queue [1]. r2: cap -> A hits (free, ref_cnt 0): need 1 new + 1 = 2 > 1 -> waits.
    # t=3: r1 ends: queue [1,2]; r2 admitted (wait 1), hit A (1 block, 4 tokens).
    trace = [req([A, Bk], [4, 4], 0, 2), req([C], [4], 2, 1), req([A, Bk], [4, 4], 2, 1)]
    assert replay(trace, 2, B, in_flight=True) == [Result(), Result(0, 0, False, 0.0), Result(1, 4, False, 1.0)]


def test_in_flight_oversize_is_rejected_at_arrival_and_blocks_nobody():
    trace = [req([A], [4], 0, 5), req([C, D, E], [4, 4, 4], 1, 1), req([F], [4], 2, 1)]
    # pool 2: r0 holds 1 block; r1 (3 blocks) is rejected at 1; r2 takes the other block at 2.
    assert replay(trace, 2, B, in_flight=True) == [Result(), Result(rejected=True), Result(0, 0, False, 0.0)]


# --------------------------------------------------------------------------- random traces
def _requests(trace, draw_tokens=None):
    """Twin requests from a ChainedTrace; a block is partial only if no request continues it."""
    block, starts, parent = trace.block.tolist(), trace.req_start.tolist(), trace.parent.tolist()
    interior = {p for p in parent if p >= 0}
    for r in range(len(starts) - 1):
        interior.update(block[starts[r]:starts[r + 1] - 1])
    size = {b: B if b in interior or draw_tokens is None else draw_tokens(b) for b in set(block)}
    reqs = []
    for r in range(len(starts) - 1):
        ids = block[starts[r]:starts[r + 1]]
        reqs.append(req(ids, [size[b] for b in ids], arrival=r))
    return reqs, size


def _prefix(hit_flags):
    h = 0
    while h < len(hit_flags) and hit_flags[h]:
        h += 1
    return h


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=chained_traces(max_requests=16, max_new=5), data=st.data())
def test_with_every_rule_switched_to_kvtrace_the_replay_is_the_ideal_lru(trace, data):
    tokens_of = {}

    def draw_tokens(b):
        return tokens_of.setdefault(b, data.draw(st.integers(1, B)))

    reqs, size = _requests(trace, draw_tokens)
    block, starts = trace.block.tolist(), trace.req_start.tolist()
    n_ids = len(trace.size)
    for pool in range(0, n_ids + 3):
        lru_hits, after = naive.lru_simulate(block, [1] * n_ids, starts, pool, prefix_aware=True)
        rp = Replayer(pool, B, KVTRACE_RULES)
        for r, rq in enumerate(reqs):
            got = rp.sequential(rq)
            h = _prefix(lru_hits[starts[r]:starts[r + 1]].tolist())
            want = Result(h, sum(rq["tokens"][:h]))
            assert got == want, (pool, r)
            assert rp.pool.cached_ids() == after[r], (pool, r)
            assert all(len(c) == 1 for c in rp.pool.cached.values())  # no copies without the cap


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=chained_traces(max_requests=14, max_new=5), data=st.data(),
       cap=st.booleans(), full=st.booleans(), order=st.sampled_from(["hashless-first", "append"]))
def test_vllm_rules_when_nothing_is_ever_evicted(trace, data, cap, full, order):
    # A pool larger than every block ever allocated never evicts: a block hits iff it is hashable,
    # its id was cached by an earlier request, every block before it hits, and it ends <= the cap.
    tokens_of = {}
    reqs, _ = _requests(trace, lambda b: tokens_of.setdefault(b, data.draw(st.integers(1, B))))
    pool = sum(len(r["blocks"]) for r in reqs) + 1
    rules = Rules(last_token_cap=cap, full_blocks_only=full, free_order=order)
    seen: set[int] = set()
    want = []
    for rq in reqs:
        limit = sum(rq["tokens"]) - (1 if cap else 0)
        h, end = 0, 0
        for b, t in zip(rq["blocks"], rq["tokens"]):
            end += t
            if b not in seen or end > limit:
                break
            h += 1
        want.append(Result(h, sum(rq["tokens"][:h])))
        seen.update(b for b, t in zip(rq["blocks"], rq["tokens"]) if t == B or not full)
    assert replay(reqs, pool, B, rules) == want


ALL_RULES = [Rules(*c) for c in itertools.product([True, False], [True, False], [True, False],
                                                  ["hashless-first", "append"])]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=chained_traces(max_requests=12, max_new=4), data=st.data(), pool=st.integers(0, 12))
def test_in_flight_with_zero_durations_is_the_sequential_replay(trace, data, pool):
    tokens_of = {}
    reqs, _ = _requests(trace, lambda b: tokens_of.setdefault(b, data.draw(st.integers(1, B))))
    for rules in ALL_RULES:
        assert replay(reqs, pool, B, rules, in_flight=True) == replay(reqs, pool, B, rules)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=chained_traces(max_requests=14, max_new=4), data=st.data(), pool=st.integers(0, 10),
       rules=st.sampled_from(ALL_RULES))
def test_random_in_flight_runs_keep_the_invariants(trace, data, pool, rules):
    tokens_of = {}
    reqs, _ = _requests(trace, lambda b: tokens_of.setdefault(b, data.draw(st.integers(1, B))))
    for rq in reqs:
        rq["arrival"] = float(data.draw(st.integers(0, 6)))
        rq["duration"] = float(data.draw(st.integers(0, 4)))
    res = replay(reqs, pool, B, rules, in_flight=True)  # the twin checks the pool after every event
    for rq, r in zip(reqs, res):
        assert r.rejected == (rules.reject_oversize and len(rq["blocks"]) > pool)
        assert r.wait_s >= 0 and (not r.rejected or (r.hit_blocks, r.wait_s) == (0, 0))
        aligned = bool(rq["tokens"]) and rq["tokens"][-1] == B
        assert r.hit_blocks <= len(rq["blocks"]) - (rules.last_token_cap and aligned)
        assert r.hit_tokens == sum(rq["tokens"][:r.hit_blocks])
    # FCFS: admissions happen in arrival order (ties in list order).
    order = sorted(range(len(reqs)), key=lambda i: reqs[i]["arrival"])
    admitted = [reqs[i]["arrival"] + res[i].wait_s for i in order if not res[i].rejected]
    assert admitted == sorted(admitted)
