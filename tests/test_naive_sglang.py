"""The SGLang radix-cache twin (``tests/naive_sglang.py``), checked on its own.

- hand-computed scenarios pin each rule one at a time (golden values worked out by hand in the comments:
  B = 4 tokens a page unless said, pool sizes in pages, ids as letters, a tree written as paths of nodes,
  e.g. ``{A-Bk, D}`` = a node holding pages A,Bk and a node holding D, both under the root);
- with every rule switched to kvtrace's semantics the sequential replay is exactly kvtrace's ideal
  prefix-aware LRU (``naive.lru_simulate``, block size 1, capacity = pool) on random chained traces at every
  pool size from 0 up, hits and cache contents after every request;
- in-flight mode with zero durations is the sequential mode; random runs keep the pool's invariants
  (checked inside the twin after every operation).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import naive
from naive_sglang import KVTRACE_RULES, Replayer, Result, Rules, replay
from strategies import chained_traces

B = 4
A, Bk, C, D, E, F, G = range(7)  # block ids of the hand-computed cases


def req(blocks, tokens=None, arrival=0.0, duration=0.0):
    tokens = [B] * len(blocks) if tokens is None else tokens
    return {"blocks": list(blocks), "tokens": list(tokens), "arrival": float(arrival), "duration": float(duration)}


def hits(results):
    return [(r.hit_blocks, r.hit_tokens) for r in results]


def run(requests, pool, rules=Rules(), page_size=B):
    """Sequential replay keeping the replayer, to look at the tree afterwards."""
    rp = Replayer(pool, page_size, rules)
    return [rp.sequential(r) for r in requests], rp


def kv(**changes):
    """kvtrace's rules with the given ones switched back to upstream's (one rule at a time)."""
    return dataclasses.replace(KVTRACE_RULES, **changes)


def test_the_default_rules_are_upstream():
    assert Rules() == Rules(last_token_cap=True, full_pages_only=True, reject_oversize=True,
                            whole_leaf_eviction=True, evict_amount="need", reserve_page=True, split_refresh=True)
    with pytest.raises(AssertionError):
        Rules(evict_amount="lru")


# ------------------------------------------------------------------------------------------ S2: last-token cap
def test_the_cap_recomputes_the_last_page_and_frees_the_duplicate():
    # pool 100. r0 [A,Bk] (8 tokens): key = 7 tokens -> 1 page [A]; empty tree -> 0 hits. 2 new pages,
    #    insert [A,Bk] -> {A-Bk}: tree 2, free 98.
    # r1 [A,Bk]: key [A] -> hit 1 (4 tokens), node split into {A -> Bk}. Bk recomputed: 1 new page (free 97);
    #    insert [A,Bk] finds both pages: prefix 2 -> kv[1:2] (the new Bk) is a duplicate, freed: free 98.
    res, rp = run([req([A, Bk])] * 2, 100)
    assert hits(res) == [(0, 0), (1, 4)]
    assert rp.free == 98 and rp.tree_pages() == 2
    # cap off: r1 hits both pages, 8 tokens.
    res, rp = run([req([A, Bk])] * 2, 100, Rules(last_token_cap=False))
    assert hits(res) == [(0, 0), (2, 8)]
    assert rp.free == 98


def test_the_cap_does_not_bite_a_partial_last_page():
    # [A,Bk,C] with C holding 3 tokens: 11 tokens, cap 10 -> floor(10/4) = 2 pages, A and Bk: the cap only
    # removes a page that is full. Second request hits 2 pages = 8 tokens.
    res, _ = run([req([A, Bk, C], [4, 4, 3])] * 2, 100)
    assert hits(res) == [(0, 0), (2, 8)]


# ------------------------------------------------------------------------------------------ S2/S7: partial page
def test_a_partial_page_is_neither_inserted_nor_reused():
    # r0 [A,Bk] tokens [4,2] (6 tokens): keyable pages = [A] (Bk is partial). 2 pages allocated (free 98);
    #    insert [A]; the unaligned tail page (Bk) is freed: tree {A}, free 99.
    # r1 same: key = 5 tokens -> 1 page [A] -> hit 1 (4 tokens); Bk recomputed in 1 new page (free 98),
    #    insert [A]: prefix 1 = hit, no duplicate; tail freed -> free 99.
    res, rp = run([req([A, Bk], [4, 2])] * 2, 100)
    assert hits(res) == [(0, 0), (1, 4)]
    assert rp.cached_ids() == {A} and rp.free == 99
    # full_pages_only off (cap on): Bk is inserted ({A-Bk}, free 98), but r1's key is still [A]: 6-1 = 5
    # tokens and Bk ends at token 6 > 5.
    res, rp = run([req([A, Bk], [4, 2])] * 2, 100, Rules(full_pages_only=False))
    assert hits(res) == [(0, 0), (1, 4)]
    assert rp.cached_ids() == {A, Bk} and rp.free == 98
    # both off: r1 hits both, 6 tokens.
    res, _ = run([req([A, Bk], [4, 2])] * 2, 100, Rules(full_pages_only=False, last_token_cap=False))
    assert hits(res) == [(0, 0), (2, 6)]


# ------------------------------------------------------------------------------------------ S1/S4: rejection
def test_validation_rejects_input_len_at_least_pool_tokens_minus_6():
    # pool 4 pages = 16 tokens: max_req_input_len = (16 - 1) - 5 = 10; input_len >= 10 is rejected.
    # r0 [A,Bk,C] 4+4+2 = 10 tokens: rejected, all miss, nothing cached (free 4).
    # r1 [A,Bk,C] 4+4+1 = 9 tokens: passes; cap 8 -> key [A,Bk], empty tree -> 0 hits; admission:
    #    extend 9 + reserve 4 = 13 < (4 free + 0) * 4 = 16 -> admitted; insert [A,Bk] (C partial, freed).
    # r2 [A,Bk] 8 tokens: key 7 tokens -> [A] -> hit 1.
    res, rp = run([req([A, Bk, C], [4, 4, 2]), req([A, Bk, C], [4, 4, 1]), req([A, Bk])], 4)
    assert [(r.rejected, r.reason) for r in res] == [(True, "validation"), (False, ""), (False, "")]
    assert hits(res) == [(0, 0), (0, 0), (1, 4)]
    # without the rejection r0 is admitted (10 + 4 = 14 < 16) and caches [A,Bk]; r1 then hits 2 (cap 8).
    res, _ = run([req([A, Bk, C], [4, 4, 2]), req([A, Bk, C], [4, 4, 1])], 4, Rules(reject_oversize=False))
    assert [r.rejected for r in res] == [False, False]
    assert hits(res) == [(0, 0), (2, 8)]


def test_a_request_that_passes_validation_but_never_fits():
    # B = 8, pool 4 pages = 32 tokens: max_req_input_len = 31 - 5 = 26. [A,Bk,C,D] 8+8+8+1 = 25 < 26 passes,
    # but admission needs 25 + 8 (reserve) = 33 < 32 * ... = (4 + 0) * 8 = 32: false, with nothing running:
    # upstream would wait for ever; the twin rejects it ("never fits"), the cache stays empty.
    res, rp = run([req([A, Bk, C, D], [8, 8, 8, 1])], 4, page_size=8)
    assert (res[0].rejected, res[0].reason) == (True, "never fits")
    assert rp.free == 4 and rp.tree_pages() == 0


def test_kvtrace_keeps_the_first_pages_that_fit():
    # kvtrace rules, pool 2: [A,Bk,C] keeps A,Bk (C dropped); the second request hits 2.
    res, rp = run([req([A, Bk, C])] * 2, 2, KVTRACE_RULES)
    assert hits(res) == [(0, 0), (2, 8)]
    assert res[0].reason == "truncated" and rp.cached_ids() == {A, Bk}


# ------------------------------------------------------------------------------------------ S5: eviction
def test_whole_leaf_eviction_evicts_more_than_needed():
    # kvtrace rules but whole-leaf eviction; pool 4.
    # r0 [A,Bk,C]: tree {A-Bk-C} (one node), free 1.
    # r1 [D,E]: 2 new pages, free 1: shortfall 1 page -> the only leaf {A-Bk-C} goes whole: free 4 -> 2.
    #    tree {D-E}. r2 [A]: miss.
    res, rp = run([req([A, Bk, C]), req([D, E]), req([A])], 4, kv(whole_leaf_eviction=True))
    assert hits(res) == [(0, 0), (0, 0), (0, 0)]
    # page by page: only C goes: tree {A-Bk, D-E}; r2 [A] hits 1.
    res, rp = run([req([A, Bk, C]), req([D, E]), req([A])], 4, KVTRACE_RULES)
    assert hits(res) == [(0, 0), (0, 0), (1, 4)]


def test_evict_need_versus_the_shortfall():
    # kvtrace rules but evict(need); pool 4, page-by-page.
    # r0 [A,Bk,C]: free 1. r1 [D,E]: need 8 tokens, available 4 < 8 -> evict(8) = 2 pages: C then Bk
    #    (deepest first), free 3 -> 1. Tree {A, D-E}. r2 [A,Bk]: hit 1 (A).
    res, _ = run([req([A, Bk, C]), req([D, E]), req([A, Bk])], 4, kv(evict_amount="need"))
    assert hits(res) == [(0, 0), (0, 0), (1, 4)]
    # shortfall: evict(8 - 4) = 1 page (C): tree {A-Bk, D-E}; r2 hits 2.
    res, _ = run([req([A, Bk, C]), req([D, E]), req([A, Bk])], 4, KVTRACE_RULES)
    assert hits(res) == [(0, 0), (0, 0), (2, 8)]


def test_evict_need_with_whole_leaves_under_the_default_rules():
    # Upstream defaults (cap, reserve, evict(need), whole leaves); pool 6, B = 4.
    # r0 [A,Bk] (8 tok): cap -> key [A], miss; admission 8 + 4 = 12 < 24; alloc: need 8 + 4 = 12 <= 24 free,
    #    no eviction; insert {A-Bk}; free 4.
    # r1 [C,D] (8 tok): key [C], miss; 12 < (4 + 2) * 4 = 24 admitted; need 12 <= 16 free -> no eviction;
    #    free 2; tree {A-Bk, C-D}.
    # r2 [E] (4 tok): key = 3 tokens -> 0 pages; 4 + 4 = 8 < (2 + 4) * 4 = 24; need 8 <= 8 free: no eviction
    #    (strictly less is needed to evict); free 1, tree {A-Bk, C-D, E}.
    # r3 [F] : 8 < 24 admitted; need 8 > 4 free -> evict(8): LRU leaf {A-Bk} (r0) goes whole = 8 tokens, done;
    #    free 3 -> 2. tree {C-D, E, F}.
    # r4 [C,D]: key [C] -> hit 1 (C-D survived); r5 [A,Bk]: key [A] -> miss.
    res, rp = run([req([A, Bk]), req([C, D]), req([E]), req([F]), req([C, D]), req([A, Bk])], 6)
    assert hits(res) == [(0, 0), (0, 0), (0, 0), (0, 0), (1, 4), (0, 0)]


# ------------------------------------------------------------------------------------------ S4/S5: reserve page
def test_the_reserved_page_makes_eviction_start_one_page_early():
    # kvtrace rules but the reserve page; pool 4.
    # r0 [A,Bk]: 8 + 4 = 12 < 16 admitted; alloc need 12 <= 16 free: free 2. tree {A-Bk}.
    # r1 [D]: 4 + 4 = 8 < (2 + 2) * 4 = 16; need 8 <= 8 free: no eviction; free 1. tree {A-Bk, D}.
    # r2 [E]: 8 < (1 + 3) * 4 = 16; need 8 > 4 free -> evict the shortfall 4 tokens = 1 page: LRU leaf
    #    {A-Bk} (r0) loses Bk; free 2 -> 1. tree {A, D, E}.
    # r3 [A,Bk]: hit 1.
    reqs = [req([A, Bk]), req([D]), req([E]), req([A, Bk])]
    res, _ = run(reqs, 4, kv(reserve_page=True))
    assert hits(res)[3] == (1, 4)
    # no reserve: r2 needs 4 <= 4 free, no eviction; r3 hits 2.
    res, _ = run(reqs, 4, KVTRACE_RULES)
    assert hits(res)[3] == (2, 8)


def test_the_reserved_page_in_the_admission_check():
    # In flight, kvtrace rules but the reserve page, pool 3. r0 [A] (0 s, runs 10 s): 4 + 4 = 8 < 12, holds 1,
    # free 2. r1 [C] at 1 s: 4 + 4 = 8 < (2 + 0) * 4 = 8 false -> waits until r0 finishes at 10 s.
    # Without the reserve: 4 < 8 -> admitted at once.
    reqs = [req([A], arrival=0, duration=10), req([C], arrival=1, duration=1)]
    assert [r.wait_s for r in replay(reqs, 3, B, kv(reserve_page=True), in_flight=True)] == [0.0, 9.0]
    assert [r.wait_s for r in replay(reqs, 3, B, KVTRACE_RULES, in_flight=True)] == [0.0, 0.0]


# ------------------------------------------------------------------------------------------ S3/S7: split refresh
def test_the_split_refreshes_the_unmatched_remainder():
    # kvtrace rules but the split refresh; pool 3.
    # r0 [A,Bk]: {A-Bk}. r1 [C]: {A-Bk, C}, free 0. r2 [A]: hit 1, splits {A -> Bk}; with the refresh Bk
    #    gets r2's time (newer than C), without it keeps r0's.
    # r3 [D]: 1 page, free 0 -> evict 1: refresh -> C (older leaf); no refresh -> Bk.
    # r4 [A,Bk]: refresh -> hit 2; no refresh (kvtrace's LRU: Bk last touched by r0) -> hit 1.
    reqs = [req([A, Bk]), req([C]), req([A]), req([D]), req([A, Bk])]
    res, _ = run(reqs, 3, kv(split_refresh=True))
    assert hits(res)[2:] == [(1, 4), (0, 0), (2, 8)]
    res, _ = run(reqs, 3, KVTRACE_RULES)
    assert hits(res)[2:] == [(1, 4), (0, 0), (1, 4)]


def test_the_insert_split_also_refreshes():
    # kvtrace rules but the split refresh; pool 4. r0 [A,Bk]: {A-Bk}. r1 [C]: {A-Bk, C}.
    # r2 [A,D]: match [A,D] -> hit 1, splits {A -> Bk} (refresh Bk); insert adds D: {A -> (Bk, D), C}, free 0.
    # r3 [E]: evict 1 page among leaves Bk (r2 time if refreshed, else r0), C (r1), D (r2 insert, newest):
    #    refresh -> C; no refresh -> Bk. r4 [C]: refresh -> miss; no refresh -> hit 1.
    reqs = [req([A, Bk]), req([C]), req([A, D]), req([E]), req([C])]
    assert hits(run(reqs, 4, kv(split_refresh=True))[0])[4] == (0, 0)
    assert hits(run(reqs, 4, KVTRACE_RULES)[0])[4] == (1, 4)


# ------------------------------------------------------------------------------------------ in flight
def test_in_flight_waiting_blocks_the_queue():
    # kvtrace rules, pool 3.
    # 0 s: r0 [A,Bk] (10 s) admitted: holds 2, free 1.
    # 1 s: r1 [C,D]: 8 < (1 + 0) * 4 false -> waits. 2 s: r2 [E] arrives behind it (FCFS, it would fit).
    # 10 s: r0 finishes: {A-Bk} unlocked. r1: 8 < (1 + 2) * 4 -> admitted, evicts the shortfall 1 page (Bk),
    #    holds 2, free 0, wait 9. r2: 4 < (0 + 1) * 4 false -> waits.
    # 11 s: r1 finishes: {A, C-D}; r2: 4 < 12 admitted, evicts 1 page: LRU leaf A (inserted at 10 s, before
    #    C-D at 11 s); wait 9. 12 s: r2 finishes: {C-D, E}.
    reqs = [req([A, Bk], arrival=0, duration=10), req([C, D], arrival=1, duration=1),
            req([E], arrival=2, duration=1), req([C, D], arrival=20), req([A], arrival=21)]
    res = replay(reqs, 3, B, KVTRACE_RULES, in_flight=True)
    assert [r.wait_s for r in res] == [0.0, 9.0, 9.0, 0.0, 0.0]
    assert hits(res) == [(0, 0), (0, 0), (0, 0), (2, 8), (0, 0)]


def test_in_flight_a_running_request_locks_its_prefix():
    # kvtrace rules, pool 4.
    # 0 s: r0 [A] (0 s): {A}, free 3. 1 s: r1 [A,Bk] (10 s): hit 1, locks A, holds 1 page, free 2.
    # 2 s: r2 [C,D]: 8 < (2 free + 0 evictable: A is locked) * 4 = 8 false -> waits (unlocked it would fit
    #    by evicting A).
    # 11 s: r1 finishes: {A -> Bk}; r2: 8 < (2 + 2) * 4, free 2 suffices: no eviction; wait 9.
    #    r2 runs 11-21 s holding 2 pages: free 0.
    # 12 s: r3 [A,Bk]: hit 2 (locks A,Bk), needs 0 new pages, yet the strict check 0 < (0 free + 0 evictable) * 4
    #    fails -> waits until r2 finishes at 21 s (wait 9), then is re-matched: still hit 2.
    reqs = [req([A], arrival=0), req([A, Bk], arrival=1, duration=10), req([C, D], arrival=2, duration=10),
            req([A, Bk], arrival=12)]
    res = replay(reqs, 4, B, KVTRACE_RULES, in_flight=True)
    assert [r.wait_s for r in res] == [0.0, 0.0, 9.0, 9.0]
    assert hits(res) == [(0, 0), (1, 4), (0, 0), (2, 8)]


def test_in_flight_concurrent_duplicates_are_freed_on_insert():
    # kvtrace rules, pool 10. r0 [A,Bk] 0-5 s and r1 [A,Bk] 1-6 s both miss (nothing inserted yet) and hold 2
    # pages each (free 6). 5 s: r0 inserts {A-Bk}. 6 s: r1's insert finds both pages: prefix 2, its 2 pages
    # are duplicates, freed: free 8, tree 2.
    rp = Replayer(10, B, KVTRACE_RULES)
    res = rp.in_flight([req([A, Bk], arrival=0, duration=5), req([A, Bk], arrival=1, duration=5)])
    assert hits(res) == [(0, 0), (0, 0)]
    assert rp.free == 8 and rp.tree_pages() == 2 and rp.held == 0


def test_in_flight_completions_come_before_admissions_at_equal_times():
    # kvtrace rules, pool 2. r0 [A,Bk] 0-5 s fills the pool. r1 [A,Bk] arrives at 5 s, the instant r0
    # finishes: the completion is processed first, so r1 hits 2 and waits 0.
    res = replay([req([A, Bk], arrival=0, duration=5), req([A, Bk], arrival=5)], 2, B, KVTRACE_RULES,
                 in_flight=True)
    assert hits(res) == [(0, 0), (2, 8)] and [r.wait_s for r in res] == [0.0, 0.0]


def test_in_flight_validation_rejects_at_arrival():
    # defaults, pool 2 = 8 tokens: validation rejects input_len >= 2 (8 - 6). r0 [A] 1 token... every
    # request of >= 2 tokens is rejected at once; a 1-token one: cap 0 -> no key; 1 + 4 = 5 < 8 admitted.
    res = replay([req([A], [1]), req([Bk], [2])], 2, B, in_flight=True)
    assert [(r.rejected, r.reason) for r in res] == [(False, ""), (True, "validation")]


# ------------------------------------------------------------------------------------------ random traces
def _requests(trace, draw_tokens=None):
    starts = [int(x) for x in trace.req_start]
    out = []
    for r in range(len(starts) - 1):
        blocks = [int(b) for b in trace.block[starts[r]:starts[r + 1]]]
        tokens = [B] * len(blocks)
        if blocks and draw_tokens is not None:
            tokens[-1] = draw_tokens[r % len(draw_tokens)]
        out.append(req(blocks, tokens, arrival=r))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=chained_traces(max_requests=14, max_new=5), last=st.lists(st.integers(1, B), min_size=1, max_size=5),
       extra=st.integers(0, 3))
def test_kvtrace_rules_are_kvtraces_prefix_aware_lru(trace, last, extra):
    requests = _requests(trace, last)
    m = int(trace.parent.shape[0])
    size = np.ones(m, dtype=np.int64)
    longest = max([len(r["blocks"]) for r in requests] + [0])
    for pool in list(range(0, longest + 3)) + [m + extra]:
        flags, after = naive.lru_simulate(trace.block, size, trace.req_start, pool, prefix_aware=True)
        rp = Replayer(pool, B, KVTRACE_RULES)
        starts = [int(x) for x in trace.req_start]
        for r, rq in enumerate(requests):
            got = rp.sequential(rq, r)
            f = list(flags[starts[r]:starts[r + 1]])
            want = next((j for j, h in enumerate(f) if not h), len(f))
            assert got.hit_blocks == want, (pool, r)
            assert got.hit_tokens == sum(rq["tokens"][:want])
            assert not got.rejected
            assert rp.cached_ids() == after[r], (pool, r)


@st.composite
def rules(draw):
    return Rules(*(draw(st.booleans()) for _ in range(4)), draw(st.sampled_from(["need", "shortfall"])),
                 draw(st.booleans()), draw(st.booleans()))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=chained_traces(max_requests=12, max_new=4), last=st.lists(st.integers(1, B), min_size=1, max_size=4),
       pool=st.integers(0, 14), rules=rules())
def test_in_flight_with_zero_durations_is_sequential(trace, last, pool, rules):
    requests = _requests(trace, last)
    seq = replay(requests, pool, B, rules)
    fl = replay(requests, pool, B, rules, in_flight=True)
    assert [dataclasses.replace(r, wait_s=0.0) for r in fl] == seq


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=chained_traces(max_requests=12, max_new=4), last=st.lists(st.integers(1, B), min_size=1, max_size=4),
       pool=st.integers(0, 14), rules=rules(), data=st.data())
def test_in_flight_random_runs_keep_the_invariants(trace, last, pool, rules, data):
    requests = _requests(trace, last)
    for r in requests:
        r["arrival"] = float(data.draw(st.integers(0, 6)))
        r["duration"] = float(data.draw(st.integers(0, 4)))
    rp = Replayer(pool, B, rules)
    res = rp.in_flight(requests)  # Replayer.check() runs after every admission and completion
    assert all(isinstance(r, Result) for r in res)
    assert rp.held == 0 and rp.free + rp.tree_pages() == pool
    assert all(n.lock_ref == 0 for n in rp.nodes() if n is not rp.root)
    for r, rq in zip(res, requests):
        assert r.wait_s >= 0 and r.hit_blocks <= len(rq["blocks"])
        if r.rejected:
            assert r.hit_blocks == 0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=chained_traces(max_requests=12, max_new=4), pool=st.integers(0, 14), rules=rules())
def test_the_upstream_rules_never_hit_more_than_kvtrace_without_eviction(trace, pool, rules):
    # With a pool so large nothing is ever evicted, upstream's hits are kvtrace's hits capped (S2).
    requests = _requests(trace)
    big = 10 * (sum(len(r["blocks"]) for r in requests) + 10)
    ideal = replay(requests, big, B, KVTRACE_RULES)
    got = replay(requests, big, B, Rules(last_token_cap=rules.last_token_cap))
    for g, i, rq in zip(got, ideal, requests):
        n = len(rq["blocks"])
        cap = min(i.hit_blocks, n - 1) if rules.last_token_cap else i.hit_blocks
        assert g.hit_blocks == max(cap, 0) and g.hit_tokens == B * g.hit_blocks
