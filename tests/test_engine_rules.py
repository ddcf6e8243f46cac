"""Engine-faithful cache rules (``--cache-rules vllm|sglang``, :mod:`kvtrace.analyses.engine`).

- hand-computed replays pin each vLLM rule one at a time: the last-token cap and the
  second copy it caches, oversize rejection, hashless blocks freed to the free queue's
  head;
- with every rule off the kernel is kvtrace's ideal request-atomic LRU (the explicit
  ``tests/naive.py`` LRU) on random chained traces at every pool size, and
  ``engine_curve`` equals ``compute_curve`` metric for metric on traces of full blocks;
- the kernel equals the plain-Python twin of vLLM's block manager (``tests/naive_vllm.py``)
  request by request (hit blocks, rejections, and in flight the waits) under all 16
  combinations of the rules, at many pool sizes;
- the SGLang radix-cache kernel equals its twin (``tests/naive_sglang.py``) request by
  request under 32 of the 128 rule combinations, and with every rule off its curve is
  the ideal one; in flight (waits to 1e-9, decode pages) under 16 combinations per
  seed, and with every duration 0 it is the sequential kernel; hand-computed cases pin
  insertion at finish and decode pages held, never cached;
- the curve does not depend on how the trace is cut into chunks;
- the command: ``kvtrace curve --cache-rules vllm|sglang [--in-flight]`` tables and its
  usage errors.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import naive
import naive_sglang
import naive_vllm
from cli_helpers import one_line_error
from jit_helpers import json_with_and_without_jit
from strategies import chained_traces

from kvtrace.analyses.curves import RATE_COLUMNS, compute_curve
from kvtrace.analyses.engine import EngineRules, engine_curve
from kvtrace.cli import app
from kvtrace.ingest import load_trace
from kvtrace.ingest.canonical import requests_to_trace
from kvtrace.kernels import engine_sglang as S
from kvtrace.kernels import engine_vllm as V
from kvtrace.trace import TraceMeta

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "sample_traces" / "chat.jsonl"
B = 4
A, Bk, C, D, X, Y, Z = range(7)  # block ids of the hand-computed cases


def replay(requests, tokens, pool, rules):
    """Per-request (hit blocks, rejected) of the kernel over lists of ids and tokens."""
    block = np.array([b for r in requests for b in r], dtype=np.int64)
    tok = np.array([t for r in tokens for t in r], dtype=np.int64)
    starts = np.cumsum([0] + [len(r) for r in requests])
    hit, rej = V.replay_vllm(block, tok, starts, 1 + int(block.max(initial=0)), [pool], B, rules)
    return hit[0].tolist(), rej[0].tolist()


# --------------------------------------------------------------------------- hand-computed
def test_last_token_cap_and_the_second_copy_it_caches():
    """Pool of 3 (s0, s1, s2 free in that order), blocks of 4 tokens.
    r0 [a, b] (8 tokens): cold; a -> s0, b -> s1; freed tail first: queue s2, s1(b), s0(a).
    r1 [a, b]: the cap (7 tokens) leaves only a eligible: hit 1; b recomputed into s2 and
      cached again (b: s1, s2); queue s1(b), s2(b), s0(a).
    r2 [c] (4 tokens, cap 3: nothing eligible): pops s1, evicting b's first copy; b stays
      cached in s2; queue s2(b), s0(a), s1(c).
    r3 [a, b, d] (4 + 4 + 2 tokens, cap 9; d is partial): a and b hit through the copy: 2.
    Without the cap r1 hits both blocks and caches no copy, r2 takes the never-used s2,
    r3 hits a and b: [0, 2, 0, 2]."""
    reqs = [[A, Bk], [A, Bk], [C], [A, Bk, D]]
    toks = [[4, 4], [4, 4], [4], [4, 4, 2]]
    assert replay(reqs, toks, 3, V.ALL_RULES)[0] == [0, 1, 0, 2]
    assert replay(reqs, toks, 3, V.ALL_RULES & ~V.LAST_TOKEN_CAP)[0] == [0, 2, 0, 2]
    # Pool of 2: r0 leaves queue s1(b), s0(a); r1 hits a (s0) and pops s1, evicting b's
    # only copy before caching b there again (no second copy); r2 [c] pops s1, evicting b;
    # r3 needs 3 blocks: rejected
    hit, rej = replay(reqs, toks, 2, V.ALL_RULES)
    assert hit == [0, 1, 0, 0] and rej == [False, False, False, True]
    hit, _ = replay(reqs[:3] + [[A, Bk]], toks[:3] + [[4, 1]], 2, V.ALL_RULES)
    assert hit == [0, 1, 0, 1]  # [a, b] with b partial (5 tokens): a hits, b is gone


def test_partial_blocks_are_never_hit_unless_the_rule_is_off():
    """r0 [a, x] with x partial (4 + 2 tokens), r1 the same prompt: with full blocks only,
    x is never cached and r1 hits a alone. Without the full-blocks rule x is cached, but
    the cap (6 - 1 = 5 tokens) still stops the hit after a; without both, r1 hits a and x."""
    reqs = [[A, X], [A, X]]
    toks = [[4, 2], [4, 2]]
    assert replay(reqs, toks, 4, V.ALL_RULES)[0] == [0, 1]
    assert replay(reqs, toks, 4, V.ALL_RULES & ~V.FULL_BLOCKS_ONLY & ~V.LAST_TOKEN_CAP)[0] == [0, 2]
    assert replay(reqs, toks, 4, V.ALL_RULES & ~V.FULL_BLOCKS_ONLY)[0] == [0, 1]


def test_a_request_larger_than_the_pool_is_rejected_and_changes_nothing():
    """Pool of 2: r0 [a] caches a; r1 [b, c, d] needs 3 blocks: rejected, no hit, nothing
    evicted; r2 [a, y] (4 + 1 tokens) hits a. Without rejection r1 keeps its first 2
    blocks (b, c), evicting a: r2 misses."""
    reqs = [[A], [Bk, C, D], [A, Y]]
    toks = [[4], [4, 4, 4], [4, 1]]
    hit, rej = replay(reqs, toks, 2, V.ALL_RULES)
    assert hit == [0, 0, 1] and rej == [False, True, False]
    hit, rej = replay(reqs, toks, 2, V.ALL_RULES & ~V.REJECT_OVERSIZE)
    assert hit == [0, 0, 0] and rej == [False, False, False]


def test_hashless_blocks_are_freed_to_the_head():
    """Pool of 3. r0 [a]: a -> s0; queue s1, s2, s0(a). r1 [b, x] (x partial): b -> s1,
    x -> s2 unhashed; freed tail first: x to the head, b to the tail: queue s2, s0(a), s1(b)
    (every block to the tail instead: s0(a), s2, s1(b)). r2 [c] pops the head: s2 (a
    survives), or s0 (a evicted). r3 [a, y] (4 + 1 tokens): hit 1, or 0."""
    reqs = [[A], [Bk, X], [C], [A, Y]]
    toks = [[4], [4, 2], [4], [4, 1]]
    assert replay(reqs, toks, 3, V.ALL_RULES)[0] == [0, 0, 0, 1]
    assert replay(reqs, toks, 3, V.ALL_RULES & ~V.HASHLESS_FIRST)[0] == [0, 0, 0, 0]


def test_an_empty_pool_rejects_everything_nonempty():
    hit, rej = replay([[A], [], [A, Bk]], [[4], [], [4, 4]], 0, V.ALL_RULES)
    assert hit == [0, 0, 0] and rej == [True, False, True]


# --------------------------------------------------------------------------- rules off = ideal
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=chained_traces(max_requests=16, max_new=5), pool=st.integers(0, 24))
def test_with_every_rule_off_the_replay_is_the_ideal_lru(trace, pool):
    block, starts = trace.block, trace.req_start
    n = len(trace.size)
    hits, _ = naive.lru_simulate(block, [1] * n, starts, pool, True)
    want = []
    for r in range(len(starts) - 1):
        h = 0
        while starts[r] + h < starts[r + 1] and hits[starts[r] + h]:
            h += 1
        want.append(h)
    got, rej = V.replay_vllm(block, np.full(len(block), B), starts, n, [pool], B, 0)
    assert got[0].tolist() == want and not rej.any()


def full_block_trace(seed: int, n_req: int = 60):
    """Chained prompts of full blocks (so the ideal model's byte capacity is a page count)."""
    rng = np.random.default_rng(seed)
    chains, rows, fresh = [], [], iter(range(1, 10**6))
    for i in range(n_req):
        base = chains[int(rng.integers(0, len(chains)))] if chains and rng.random() < 0.7 else []
        hashes = base[: int(rng.integers(0, len(base) + 1))] + [next(fresh) for _ in range(int(rng.integers(0, 4)))]
        chains.append(hashes)
        rows.append({"request_id": i, "timestamp": float(i), "type": ["chat", "api"][i % 2], "tenant": None,
                     "input_tokens": B * len(hashes), "output_tokens": 1, "block_ids": hashes})
    df = pl.DataFrame(rows, schema={"request_id": pl.Int64, "timestamp": pl.Float64, "type": pl.String,
                                    "tenant": pl.String, "input_tokens": pl.Int64, "output_tokens": pl.Int64,
                                    "block_ids": pl.List(pl.UInt64)})
    return requests_to_trace(df, TraceMeta(block_tokens=B, source_format="canonical"))


@pytest.mark.parametrize("seed", range(6))
def test_engine_curve_with_rules_off_equals_the_ideal_curve(seed):
    """Full blocks: a pool of P blocks is the ideal model's capacity of P x B tokens."""
    trace = full_block_trace(seed)
    bpt = 327_680  # the default model's bytes per token
    caps = [p * B * bpt for p in (1, 2, 3, 5, 8, 13, 40, 1000)]
    eng = engine_curve(trace, EngineRules("vllm", 0), capacities=caps, warmup="10%")
    ideal = compute_curve(trace, capacities=caps, warmup="10%")
    for col in (*RATE_COLUMNS, "gpu_seconds_saved_per_hour", "read_mean_bytes_per_s"):
        np.testing.assert_allclose(eng.curve[col].to_numpy().astype(float), ideal.curve[col].to_numpy().astype(float),
                                   rtol=1e-12, atol=1e-15, err_msg=col)
    for k in RATE_COLUMNS:
        assert eng.ceiling[k] == pytest.approx(ideal.ceiling[k], rel=1e-12, abs=1e-15), k
    assert eng.curve["rejected_request_share"].to_list() == [0.0] * len(caps)


def test_engine_curve_by_group_adds_up_to_the_whole():
    trace = full_block_trace(11, 80)
    res = engine_curve(trace, "vllm", by="type")
    assert res.by_group is not None and set(res.by_group["group_name"]) == {"chat", "api"}
    whole = res.curve["prefix_block_hit_rate"].to_numpy()
    g = res.by_group
    # blocks: the groups' hit blocks add up to the whole's (rates x accesses)
    acc = {name: sum(len(h) for h, t in zip(trace.requests["block_ids"], trace.requests["type"]) if t == name)
           for name in ("chat", "api")}
    total = sum(acc.values())
    parts = sum(g.filter(pl.col("group_name") == n)["prefix_block_hit_rate"].fill_null(0).to_numpy() * acc[n]
                for n in acc)
    np.testing.assert_allclose(parts, whole * total, rtol=1e-12)


def test_chunks_do_not_change_the_curve(monkeypatch):
    from kvtrace.trace import source

    trace = load_trace(CHAT)
    one = engine_curve(trace, "vllm", points=12)
    monkeypatch.setattr(source, "CHUNK_ACCESSES", 97)
    many = engine_curve(trace, "vllm", points=12)
    assert one.curve.equals(many.curve) and one.ceiling == many.ceiling


# --------------------------------------------------------------------------- the command
runner = CliRunner()


def test_curve_command_with_vllm_rules(tmp_path):
    out, js = tmp_path / "c.parquet", tmp_path / "c.json"
    res = runner.invoke(app, ["curve", str(CHAT), "--cache-rules", "vllm", "--out", str(out), "--json", str(js)])
    assert res.exit_code == 0, res.output
    assert "vllm cache rules" in res.output and "rules applied: vLLM v1" in res.output
    table = pl.read_parquet(out)
    assert "rejected_request_share" in table.columns and table.height <= 25
    doc = json.loads(js.read_text())
    assert doc["info"]["cache_rules"] == "vllm"
    # the ideal run of the same capacities differs: the rules matter on this trace
    ideal = compute_curve(load_trace(CHAT), capacities=table["capacity_bytes"].to_list())
    assert not np.allclose(ideal.curve["prefix_token_hit_rate"].to_numpy(), table["prefix_token_hit_rate"].to_numpy())


@pytest.mark.parametrize("extra,field", [(["--eviction", "flat"], "eviction"),
                                         (["--sample-rate", "0.1"], "sample-rate"),
                                         (["--cache-rules", "nonsense"], "cache-rules")])
def test_curve_command_usage_errors(extra, field):
    args = ["curve", str(CHAT), *(["--cache-rules", "vllm"] if "--cache-rules" not in extra else []), *extra]
    line = one_line_error(runner.invoke(app, args, env={"COLUMNS": "200"}), 2)
    assert field in line


# --------------------------------------------------------------------------- requests in flight
def inflight(requests, tokens, pool, arrival, duration, rules=V.ALL_RULES, decode=None,
             kernel=V.replay_vllm_inflight):
    """``kernel`` (an engine's in-flight replay) over requests given as block lists."""
    block = np.array([b for r in requests for b in r], dtype=np.int64)
    tok = np.array([t for r in tokens for t in r], dtype=np.int64)
    starts = np.cumsum([0] + [len(r) for r in requests])
    return kernel(block, tok, starts, 1 + int(block.max(initial=0)), pool, B, arrival, duration, decode, rules)


def test_in_flight_a_request_waits_for_blocks_first_come_first_served():
    """Pool of 2. r0 [a] at 0 for 10 s holds s0. r1 [b, c] at 1 needs 2 blocks, 1 is free:
    it waits (and r2 behind it) until r0 ends at 10; it takes s1 and then s0, evicting a.
    r2 [a, y] at 2 (cap 4 tokens: a eligible) needs 2 blocks: waits for r1 (10 -> 11); a is
    gone: no hit. Waits 0, 9, 9; some request waited for blocks from 1 to 11 = 10 s of the
    span 0 -> 12 (r2 ends at 11 + 1)."""
    hit, rej, wait, blocked, span = inflight([[A], [Bk, C], [A, Y]], [[4], [4, 4], [4, 1]], 2, [0.0, 1.0, 2.0],
                                             [10.0, 1.0, 1.0])
    assert hit.tolist() == [0, 0, 0] and not rej.any()
    assert wait.tolist() == [0.0, 9.0, 9.0] and (blocked, span) == (10.0, 12.0)


def test_in_flight_held_blocks_are_pinned_and_can_be_hit():
    """Pool of 3. r0 [a] at 0 holds a (s0) for 10 s; r1 [b] at 1 (0 s) caches b in s1; r2
    [c, d] at 2 (0 s) takes s2 and s1 (evicting b: a is pinned); r3 [a, y] at 3 hits the
    held a. Sequentially (every duration 0) a is freed at once and r2 evicts it: no hit."""
    reqs, toks, arr = [[A], [Bk], [C, D], [A, Y]], [[4], [4], [4, 4], [4, 1]], [0.0, 1.0, 2.0, 3.0]
    hit, _, wait, blocked, _ = inflight(reqs, toks, 3, arr, [10.0, 0.0, 0.0, 0.0])
    assert hit.tolist() == [0, 0, 0, 1] and wait.tolist() == [0.0] * 4 and blocked == 0.0
    assert inflight(reqs, toks, 3, arr, [0.0] * 4)[0].tolist() == [0, 0, 0, 0]
    # a hit on a copy another request holds adds a reference: both end, a stays cached
    hit, _, _, _, _ = inflight([[A, X], [A, Z], [A, Y]], [[4, 2], [4, 1], [4, 1]], 4, [0.0, 1.0, 9.0],
                               [5.0, 5.0, 0.0])
    assert hit.tolist() == [0, 1, 1]


def test_in_flight_output_blocks_are_held_too():
    """Pool of 3: r0 [a] holds one prompt block and 2 output blocks for 5 s, so r1 [b] at 1
    waits until 5; without them it is admitted at once."""
    args = ([[A], [Bk]], [[4], [4]], 3, [0.0, 1.0], [5.0, 1.0])
    assert inflight(*args, decode=[2, 0])[2].tolist() == [0.0, 4.0]
    assert inflight(*args, decode=[0, 0])[2].tolist() == [0.0, 0.0]


#: Per engine: its sequential and in-flight kernels and rule sets to try
ZERO_DURATION_CASES = {
    "vllm": (V.replay_vllm, V.replay_vllm_inflight, [0, V.ALL_RULES, V.LAST_TOKEN_CAP | V.REJECT_OVERSIZE]),
    "sglang": (S.replay_sglang, S.replay_sglang_inflight,
               [0, S.ALL_RULES, S.LAST_TOKEN_CAP | S.REJECT_OVERSIZE | S.WHOLE_LEAF,
                S.FULL_PAGES_ONLY | S.EVICT_NEED | S.RESERVE_PAGE | S.SPLIT_REFRESH]),
}


@pytest.mark.parametrize("engine", list(ZERO_DURATION_CASES))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=chained_traces(max_requests=14, max_new=5), pool=st.integers(0, 20), data=st.data())
def test_in_flight_with_zero_durations_is_the_sequential_replay(engine, trace, pool, data):
    sequential, in_flight, rule_sets = ZERO_DURATION_CASES[engine]
    rules = data.draw(st.sampled_from(rule_sets))
    n = len(trace.req_start) - 1
    toks = np.full(len(trace.block), B)
    if len(toks) and data.draw(st.booleans()):
        toks[trace.req_start[1:][np.diff(trace.req_start) > 0] - 1] = data.draw(st.integers(1, B))  # partial tails
    arr = np.sort(np.array(data.draw(st.lists(st.floats(0, 100), min_size=n, max_size=n)), dtype=float))
    seq, srej = sequential(trace.block, toks, trace.req_start, len(trace.size), [pool], B, rules)
    hit, rej, wait, blocked, _ = in_flight(trace.block, toks, trace.req_start, len(trace.size), pool, B, arr,
                                           np.zeros(n), None, rules)
    assert hit.tolist() == seq[0].tolist() and rej.tolist() == srej[0].tolist()
    assert not wait.any() and blocked == 0.0


def test_service_time_expressions():
    from kvtrace.analyses.engine import service_times
    from kvtrace.errors import UsageError

    np.testing.assert_allclose(service_times("input/5000 + output/50", [5000, 0], [0, 100]), [1.0, 2.0])
    np.testing.assert_allclose(service_times("max(0.5, input / 1000) - -1", [100, 3000], [0, 0]), [1.5, 4.0])
    np.testing.assert_allclose(service_times("2", [1, 2], [3, 4]), [2.0, 2.0])
    for bad in ("input ** 2", "__import__('os')", "input/", "output - 10", "foo"):
        with pytest.raises(UsageError):
            service_times(bad, [1], [1])


def test_curve_command_in_flight(tmp_path):
    out = tmp_path / "c.parquet"
    res = runner.invoke(app, ["curve", str(CHAT), "--cache-rules", "vllm", "--in-flight", "--capacity",
                              "4GiB,64GiB", "--service-time", "input/2000", "--out", str(out)])
    assert res.exit_code == 0, res.output
    t = pl.read_parquet(out)
    assert {"wait_mean_s", "wait_p99_s", "pool_full_share"} <= set(t.columns)
    assert t["wait_mean_s"][0] >= t["wait_mean_s"][1] >= 0
    assert "requests in flight (input/2000 s each)" in res.output
    line = one_line_error(runner.invoke(app, ["curve", str(CHAT), "--in-flight"], env={"COLUMNS": "200"}), 2)
    assert "in-flight" in line


# --------------------------------------------------------------------------- the twin (tests/naive_vllm.py)

RULE_SETS = [(cap, full, rej, order) for cap, full, rej, order in
             itertools.product([True, False], [True, False], [True, False], ["hashless-first", "append"])]


def twin_rules(cap, full, rej, order):
    bits = ((V.LAST_TOKEN_CAP if cap else 0) | (V.FULL_BLOCKS_ONLY if full else 0)
            | (V.REJECT_OVERSIZE if rej else 0) | (V.HASHLESS_FIRST if order == "hashless-first" else 0))
    return naive_vllm.Rules(cap, full, rej, order), bits


def random_requests(rng, n_req, B):
    """Requests as paths in a random prefix tree, partial last blocks, tied arrivals."""
    children: dict = {}
    fresh = itertools.count()
    out = []
    t = 0.0
    for _ in range(n_req):
        node, path = -1, []
        for _ in range(int(rng.integers(0, 7))):
            ch = children.setdefault(node, [])
            node = ch[int(rng.integers(0, len(ch)))] if ch and rng.random() < 0.75 else next(fresh)
            if node not in ch:
                ch.append(node)
            path.append(node)
        tokens = [B] * len(path)
        if path and B > 1 and rng.random() < 0.4:
            tokens[-1] = int(rng.integers(1, B))
        t += float(rng.choice([0.0, 0.5, 1.0, 3.0]))
        out.append({"blocks": path, "tokens": tokens, "arrival": t, "duration": float(rng.choice([0.0, 0.7, 2.0,
                                                                                                   9.0]))})
    return out


def kernel_columns(reqs):
    block = np.array([b for r in reqs for b in r["blocks"]], dtype=np.int64)
    tok = np.array([x for r in reqs for x in r["tokens"]], dtype=np.int64)
    starts = np.cumsum([0] + [len(r["blocks"]) for r in reqs])
    return block, tok, starts, 1 + int(block.max(initial=0))


@pytest.mark.parametrize("seed", range(40))
def test_kernel_equals_the_vllm_twin_per_request(seed):
    rng = np.random.default_rng(seed)
    reqs = random_requests(rng, int(rng.integers(1, 30)), B)
    block, tok, starts, n_ids = kernel_columns(reqs)
    pools = sorted({0, 1, 2, 3, 5, 8, int(rng.integers(0, n_ids + 3)), n_ids + 2})
    for cap, full, rej, order in RULE_SETS:
        rules, bits = twin_rules(cap, full, rej, order)
        hit, rejd = V.replay_vllm(block, tok, starts, n_ids, pools, B, bits)
        for k, P in enumerate(pools):
            want = naive_vllm.replay(reqs, P, B, rules)
            assert hit[k].tolist() == [w.hit_blocks for w in want], (P, rules)
            assert rejd[k].tolist() == [w.rejected for w in want], (P, rules)
            got = V.replay_vllm_inflight(block, tok, starts, n_ids, P, B, [r["arrival"] for r in reqs],
                                         [r["duration"] for r in reqs], None, bits)
            want = naive_vllm.replay(reqs, P, B, rules, in_flight=True)
            assert got[0].tolist() == [w.hit_blocks for w in want], ("in flight", P, rules)
            assert got[1].tolist() == [w.rejected for w in want], ("in flight", P, rules)
            np.testing.assert_array_equal(got[2], [w.wait_s for w in want])


MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"


def mooncake():
    """The shared Mooncake trace, or skip the test when ``../shared`` is absent."""
    if not MOONCAKE.is_file():
        pytest.skip(f"shared trace not present: {MOONCAKE}")
    return load_trace(MOONCAKE)


def whole_arrays(trace):
    """The kernels' inputs for the whole trace: block ids and tokens (int64), request offsets."""
    ch = next(iter(trace.chunks(size=trace.n_accesses)))
    return ch.block.astype(np.int64), ch.tokens.astype(np.int64), ch.lrs


@pytest.mark.slow
@pytest.mark.parametrize("in_flight", [False, True])
def test_kernel_equals_the_vllm_twin_on_the_mooncake_trace(in_flight):
    """The first 4,000 requests of the real trace (the twin's lists cost O(pool) per
    operation), at three HBM-sized pools."""
    trace = mooncake()
    block, tok, starts = whole_arrays(trace)
    B_ = trace.meta.block_tokens
    arrival = trace.request_timestamp
    duration = (trace.requests["input_tokens"].to_numpy() / 5000 + trace.requests["output_tokens"].to_numpy() / 50)
    reqs = [{"blocks": block[starts[r]:starts[r + 1]].tolist(), "tokens": tok[starts[r]:starts[r + 1]].tolist(),
             "arrival": float(arrival[r]), "duration": float(duration[r])} for r in range(4000)]
    block, tok, starts = block[:starts[4000]], tok[:starts[4000]], starts[:4001]
    arrival, duration = arrival[:4000], duration[:4000]
    for P in (256, 1024, 4096):
        want = naive_vllm.replay(reqs, P, B_, naive_vllm.Rules(), in_flight=in_flight)
        if in_flight:
            hit, rej, wait, _, _ = V.replay_vllm_inflight(block, tok, starts, trace.n_blocks, P, B_, arrival, duration)
            np.testing.assert_allclose(wait, [w.wait_s for w in want], rtol=0, atol=1e-9)
        else:
            h, r = V.replay_vllm(block, tok, starts, trace.n_blocks, [P], B_)
            hit, rej = h[0], r[0]
        assert hit.tolist() == [w.hit_blocks for w in want]
        assert rej.tolist() == [w.rejected for w in want]


# --------------------------------------------------------------------------- SGLang (tests/naive_sglang.py)
SGLANG_FIELDS = ("last_token_cap", "full_pages_only", "reject_oversize", "whole_leaf_eviction", "evict_amount",
                 "reserve_page", "split_refresh")


def sglang_rules(combo):
    bits = sum(bit for bit, on in zip((S.LAST_TOKEN_CAP, S.FULL_PAGES_ONLY, S.REJECT_OVERSIZE, S.WHOLE_LEAF,
                                       S.EVICT_NEED, S.RESERVE_PAGE, S.SPLIT_REFRESH), combo) if on)
    kw = dict(zip(SGLANG_FIELDS, combo))
    kw["evict_amount"] = "need" if kw["evict_amount"] else "shortfall"
    return naive_sglang.Rules(**kw), bits


@pytest.mark.parametrize("seed", range(16))
def test_sglang_kernel_equals_the_twin_per_request(seed):
    """Hit pages and rejections under 32 of the 128 rule combinations (always all on and
    all off), page sizes 1, 4, 8, many pool sizes."""
    rng = np.random.default_rng(100 + seed)
    page = int(rng.choice([1, 4, 8]))
    reqs = random_requests(rng, int(rng.integers(1, 30)), page)
    block, tok, starts, n_ids = kernel_columns(reqs)
    pools = sorted({0, 1, 2, 3, 5, 8, int(rng.integers(0, n_ids + 3)), n_ids + 2})
    combos = list(itertools.product([True, False], repeat=7))
    picked = [combos[0], combos[-1]] + [combos[int(i)] for i in rng.choice(len(combos), 30, replace=False)]
    for combo in picked:
        rules, bits = sglang_rules(combo)
        hit, rej = S.replay_sglang(block, tok, starts, n_ids, pools, page, bits)
        for k, P in enumerate(pools):
            want = naive_sglang.replay(reqs, P, page, rules)
            assert hit[k].tolist() == [w.hit_blocks for w in want], (P, rules)
            assert rej[k].tolist() == [w.rejected for w in want], (P, rules)


@pytest.mark.slow
def test_sglang_kernel_equals_the_twin_on_the_mooncake_trace():
    trace = mooncake()
    block, tok, starts = whole_arrays(trace)
    reqs = [{"blocks": block[starts[r]:starts[r + 1]].tolist(), "tokens": tok[starts[r]:starts[r + 1]].tolist()}
            for r in range(trace.n_requests)]
    pools = [16, 256, 1024, 4096, 16384]
    hit, rej = S.replay_sglang(block, tok, starts, trace.n_blocks, pools, trace.meta.block_tokens)
    for k, P in enumerate(pools):
        want = naive_sglang.replay(reqs, P, trace.meta.block_tokens)
        assert hit[k].tolist() == [w.hit_blocks for w in want], P
        assert rej[k].tolist() == [w.rejected for w in want], P


@pytest.mark.parametrize("seed", range(4))
def test_sglang_curve_with_rules_off_equals_the_ideal_curve(seed):
    trace = full_block_trace(50 + seed)
    caps = [p * B * 327_680 for p in (1, 2, 3, 5, 8, 13, 40, 1000)]
    eng = engine_curve(trace, EngineRules("sglang", 0), capacities=caps, warmup="10%")
    ideal = compute_curve(trace, capacities=caps, warmup="10%")
    for col in (*RATE_COLUMNS, "gpu_seconds_saved_per_hour"):
        np.testing.assert_allclose(eng.curve[col].to_numpy().astype(float), ideal.curve[col].to_numpy().astype(float),
                                   rtol=1e-12, atol=1e-15, err_msg=col)


def test_curve_command_with_sglang_rules(tmp_path):
    out = tmp_path / "c.parquet"
    res = runner.invoke(app, ["curve", str(CHAT), "--cache-rules", "sglang", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "sglang cache rules" in res.output and "rules applied: SGLang radix cache" in res.output
    t = pl.read_parquet(out)
    v = engine_curve(load_trace(CHAT), "vllm").curve
    assert t["capacity_bytes"].to_list() == v["capacity_bytes"].to_list()
    assert t["prefix_token_hit_rate"].to_list() != v["prefix_token_hit_rate"].to_list()
    assert "; rules off" not in res.output  # every rule on: nothing listed as off


# --------------------------------------------------------------------------- SGLang in flight
def sglang_inflight(requests, tokens, pool, arrival, duration, rules=S.ALL_RULES, decode=None):
    return inflight(requests, tokens, pool, arrival, duration, rules, decode, kernel=S.replay_sglang_inflight)


def test_sglang_in_flight_pages_are_inserted_when_a_request_finishes():
    """Pool of 4 pages of 4 tokens, every rule on (reserve page: admitted iff extend + 4 <
    room x 4). r0 [a] at 0 for 10 s: the cap leaves no key; 4 + 4 < 16: admitted, holds
    one page (free 3). r1 [b, c] at 1: 8 + 4 < 3 x 4 fails while r0 runs: it waits, and r2
    behind it. At 10 r0 finishes and inserts a (tree 1, free 3); r1 re-tried: room 3 + 1
    evictable: admitted, takes 2 pages (free 1) for 1 s. r2 [a, y] (4 + 1 tokens, key [a])
    re-matches: a is in the tree now and locked: room 1 + 0: waits. At 11 r1 inserts b, c;
    r2 hits a: 1 + 4 < (1 + 2) x 4: admitted. Waits 0, 9, 9; the head waited from 1 to 11
    = 10 s of the span 0 -> 12. In a larger pool r1 and r2 (0 s) are admitted at once
    while r0 runs and r2 misses: vLLM caches a at r0's admission, SGLang at its finish."""
    reqs, toks = [[A], [Bk, C], [A, Y]], [[4], [4, 4], [4, 1]]
    hit, rej, wait, blocked, span = sglang_inflight(reqs, toks, 4, [0.0, 1.0, 2.0], [10.0, 1.0, 1.0])
    assert hit.tolist() == [0, 0, 1] and not rej.any()
    assert wait.tolist() == [0.0, 9.0, 9.0] and (blocked, span) == (10.0, 12.0)
    hit, _, wait, blocked, _ = sglang_inflight(reqs, toks, 8, [0.0, 1.0, 2.0], [10.0, 0.0, 0.0])
    assert hit.tolist() == [0, 0, 0] and wait.tolist() == [0.0, 0.0, 0.0] and blocked == 0.0


def test_sglang_in_flight_decode_pages_are_held_and_never_cached():
    """Pool of 4, no reserve page. r0 [a] at 0 for 5 s with 2 decode pages: 4 + 2 x 4 <
    16: it takes 3 pages (free 1). r1 [b] at 1: 4 < 1 x 4 fails: waits until r0 ends at 5
    (a inserted, its 2 decode pages freed): wait 4. Without decode pages r1 is admitted at
    once. r2 [a, y] at 9 hits a either way: the decode pages went back to the free pages,
    not into the tree (nothing of a was evicted to make room)."""
    rules = S.ALL_RULES & ~S.RESERVE_PAGE
    args = ([[A], [Bk], [A, Y]], [[4], [4], [4, 1]], 4, [0.0, 1.0, 9.0], [5.0, 1.0, 1.0], rules)
    hit, _, wait, blocked, _ = sglang_inflight(*args, decode=[2, 0, 0])
    assert wait.tolist() == [0.0, 4.0, 0.0] and blocked == 4.0 and hit.tolist() == [0, 0, 1]
    hit, _, wait, _, _ = sglang_inflight(*args, decode=[0, 0, 0])
    assert wait.tolist() == [0.0, 0.0, 0.0] and hit.tolist() == [0, 0, 1]
    # a request whose pages and decode pages can never fit: rejected when nothing else runs, after waiting
    _, rej, wait, _, _ = sglang_inflight([[A], [Bk]], [[4], [4]], 4, [0.0, 1.0], [5.0, 1.0], rules, decode=[0, 3])
    assert rej.tolist() == [False, True] and wait.tolist() == [0.0, 4.0]


def with_decode(rng, reqs):
    for r in reqs:
        r["decode_pages"] = int(rng.choice([0, 0, 1, 3]))
    return reqs


@pytest.mark.parametrize("seed", range(24))
def test_sglang_in_flight_kernel_equals_the_twin_per_request(seed):
    """Random arrivals (ties included) and durations (zeros included), decode pages,
    small pools so requests wait, page sizes 1, 4, 8, 16 of the 128 rule combinations
    (always all on and all off): hit pages, rejections and waits request by request."""
    rng = np.random.default_rng(300 + seed)
    page = int(rng.choice([1, 4, 8]))
    reqs = with_decode(rng, random_requests(rng, int(rng.integers(1, 30)), page))
    block, tok, starts, n_ids = kernel_columns(reqs)
    arrival, duration = [r["arrival"] for r in reqs], [r["duration"] for r in reqs]
    decode = [r["decode_pages"] for r in reqs]
    pools = sorted({0, 1, 2, 3, 5, 8, int(rng.integers(0, n_ids + 3)), n_ids + 2})
    combos = list(itertools.product([True, False], repeat=7))
    picked = [combos[0], combos[-1]] + [combos[int(i)] for i in rng.choice(len(combos), 14, replace=False)]
    waited = 0
    for combo in picked:
        rules, bits = sglang_rules(combo)
        for P in pools:
            for dec in (None, decode):
                got = S.replay_sglang_inflight(block, tok, starts, n_ids, P, page, arrival, duration, dec, bits)
                want = naive_sglang.replay(reqs if dec else [{**r, "decode_pages": 0} for r in reqs], P, page, rules,
                                           in_flight=True)
                assert got[0].tolist() == [w.hit_blocks for w in want], (P, rules, dec)
                assert got[1].tolist() == [w.rejected for w in want], (P, rules, dec)
                np.testing.assert_allclose(got[2], [w.wait_s for w in want], rtol=0, atol=1e-9)
                waited += int((got[2] > 0).sum())
    assert waited or len(reqs) < 3  # the cases make requests wait


def test_sglang_engine_curve_in_flight_is_the_kernel():
    """engine_curve(..., 'sglang', in_flight=True) end to end: its rates, rejections,
    waits and pool-full share are the kernel's at each pool; with zero service times it is
    the sequential curve."""
    from kvtrace.analyses.engine import service_times

    trace = load_trace(CHAT)
    B_ = trace.meta.block_tokens
    bpt = 327_680
    pools = [2, 8, 40, 200, 1000]
    expr = "input/2000 + output/100"
    res = engine_curve(trace, "sglang", capacities=[p * B_ * bpt for p in pools], in_flight=True, service_time=expr,
                       cache_decode=True)
    req = trace.requests
    inp, out = req["input_tokens"].to_numpy(), req["output_tokens"].fill_null(0).to_numpy()
    block, tok, starts = whole_arrays(trace)
    decode = np.maximum(0, -(-(inp + out) // B_) - np.diff(starts))
    assert decode.any()
    for i, P in enumerate(pools):
        hit, rej, wait, blocked, span = S.replay_sglang_inflight(block, tok, starts, trace.n_blocks, P, B_,
                                                                 trace.request_timestamp,
                                                                 service_times(expr, inp, out), decode)
        got = sum(int(tok[starts[r]:starts[r] + hit[r]].sum()) for r in range(len(hit)))
        row = res.curve.row(i, named=True)
        assert row["prefix_token_hit_rate"] == pytest.approx(got / tok.sum(), rel=1e-12)
        assert row["rejected_request_share"] == pytest.approx(rej.mean(), rel=1e-12)
        if rej.all():  # a pool too small for every prompt: no measured wait
            assert row["wait_mean_s"] is None
        else:
            assert row["wait_mean_s"] == pytest.approx(wait[~rej].mean(), rel=1e-12)
        assert row["pool_full_share"] == pytest.approx(blocked / span, rel=1e-12)
    assert res.curve["wait_mean_s"][1] > 0 and res.curve["rejected_request_share"][0] == 1.0
    assert "path's lock" in res.info["in_flight"]["admission"]
    caps = [p * B_ * bpt for p in pools]
    zero = engine_curve(trace, "sglang", capacities=caps, in_flight=True, service_time="0")
    seq = engine_curve(trace, "sglang", capacities=caps)
    for col in (*RATE_COLUMNS, "rejected_request_share"):
        assert zero.curve[col].to_list() == seq.curve[col].to_list(), col
    assert zero.curve["wait_mean_s"].to_list() == [0.0] * len(pools)


def test_curve_command_with_sglang_rules_in_flight(tmp_path):
    out = tmp_path / "c.parquet"
    res = runner.invoke(app, ["curve", str(CHAT), "--cache-rules", "sglang", "--in-flight", "--capacity",
                              "4GiB,64GiB", "--service-time", "input/2000", "--cache-decode", "--out", str(out)],
                        env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    t = pl.read_parquet(out)
    assert {"wait_mean_s", "wait_p99_s", "pool_full_share"} <= set(t.columns)
    assert t["wait_mean_s"][0] >= t["wait_mean_s"][1] >= 0
    assert "requests in flight (input/2000 s each, output" in res.output and "blocks held)" in res.output
    assert "sglang cache rules" in res.output and "mean wait" in res.output and "pool full" in res.output


@pytest.mark.slow
def test_sglang_in_flight_kernel_equals_the_twin_on_the_mooncake_trace():
    """The first 4,000 requests of the real trace in flight (default service times), at
    three pool sizes, with and without decode pages."""
    trace = mooncake()
    block, tok, starts = whole_arrays(trace)
    B_ = trace.meta.block_tokens
    inp, out = trace.requests["input_tokens"].to_numpy(), trace.requests["output_tokens"].fill_null(0).to_numpy()
    duration = inp / 5000 + out / 50
    decode = np.maximum(0, -(-(inp + out) // B_) - np.diff(starts))
    n = 4000
    block, tok, starts = block[:starts[n]], tok[:starts[n]], starts[:n + 1]
    arrival, duration, decode = trace.request_timestamp[:n], duration[:n], decode[:n]
    for dec in (None, decode):
        reqs = [{"blocks": block[starts[r]:starts[r + 1]].tolist(), "tokens": tok[starts[r]:starts[r + 1]].tolist(),
                 "arrival": float(arrival[r]), "duration": float(duration[r]),
                 "decode_pages": 0 if dec is None else int(dec[r])} for r in range(n)]
        for P in (256, 1024, 4096):
            want = naive_sglang.replay(reqs, P, B_, in_flight=True)
            hit, rej, wait, _, _ = S.replay_sglang_inflight(block, tok, starts, trace.n_blocks, P, B_, arrival,
                                                            duration, dec)
            assert hit.tolist() == [w.hit_blocks for w in want], P
            assert rej.tolist() == [w.rejected for w in want], P
            np.testing.assert_allclose(wait, [w.wait_s for w in want], rtol=0, atol=1e-9)


@pytest.mark.nojit
def test_sglang_kernels_without_jit():
    """Both SGLang kernels run as Python (NUMBA_DISABLE_JIT=1, so coverage sees their
    bodies) give the JIT's answers on a case with waits, decode pages and evictions."""
    code = ("import json, numpy as np\n"
            "from kvtrace.kernels import engine_sglang as S\n"
            "rng = np.random.default_rng(7)\n"
            "n = 40\n"
            "lens = rng.integers(0, 6, n)\n"
            "starts = np.concatenate([[0], np.cumsum(lens)])\n"
            "base = rng.integers(0, 8, n)\n"
            "block = np.concatenate([base[i] * 10 + np.arange(lens[i]) for i in range(n)]).astype(np.int64)\n"
            "tok = np.full(block.shape[0], 4)\n"
            "arr = np.sort(rng.choice([0.0, 1.0, 2.5], n).cumsum())\n"
            "dur = rng.choice([0.0, 1.0, 6.0], n)\n"
            "out = {}\n"
            "for rules in (0, S.ALL_RULES):\n"
            "    h, r, w, b, s = S.replay_sglang_inflight(block, tok, starts, 80, 7, 4, arr, dur,\n"
            "                                             rng.integers(0, 3, n), rules)\n"
            "    out[rules] = [h.tolist(), r.tolist(), w.tolist(), b, s,\n"
            "                  S.replay_sglang(block, tok, starts, 80, [3, 7], 4, rules)[0].tolist()]\n"
            "print(json.dumps(out))\n")
    runs = json_with_and_without_jit(code)
    assert runs[0] == runs[1]
    waits = runs[1][str(S.ALL_RULES)][2]
    assert any(w > 0 for w in waits)  # the case makes requests wait


# --------------------------------------------------------------------------- the trace's own end times
def end_time_records(ends_ms=(11000, 3000, 4000)):
    """test_sglang_in_flight_pages_are_inserted_when_a_request_finishes as a Mooncake trace
    (milliseconds) whose end times give the durations 10, 1 and 1 s: a = 0, b = 1, c = 2,
    y = 3, pages of 4 tokens."""
    recs = [{"timestamp": 1000, "input_length": 4, "output_length": 3, "hash_ids": [0]},
            {"timestamp": 2000, "input_length": 8, "output_length": 3, "hash_ids": [1, 2]},
            {"timestamp": 3000, "input_length": 5, "output_length": 3, "hash_ids": [0, 3]}]
    for r, e in zip(recs, ends_ms):
        if e is not None:
            r["end_timestamp"] = e
    return recs


def write_jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def check_hand_case(trace):
    """Durations end - start = 10, 1, 1 s: waits 0, 9, 9 s, the head blocked 10 s of the
    span 0 -> 12 (the hand-computed case), through the engine curve at a pool of 4 pages."""
    from kvtrace.analyses.engine import trace_service_times

    np.testing.assert_array_equal(trace_service_times(trace.requests), [10.0, 1.0, 1.0])
    res = engine_curve(trace, "sglang", capacities=[4 * 4 * 327_680], in_flight=True, service_time="trace")
    row = res.curve.row(0, named=True)
    assert (row["wait_mean_s"], row["wait_p99_s"]) == (6.0, 9.0)
    assert row["pool_full_share"] == pytest.approx(10 / 12, rel=1e-15)
    assert res.info["in_flight"]["service_time"] == "trace"


def test_in_flight_durations_from_the_traces_end_times(tmp_path):
    """Mooncake JSONL (ms), the canonical Parquet it is written to, and a generic
    Parquet table (seconds, and an end_timestamp_ms column) give the same durations."""
    from kvtrace.ingest import write_canonical

    trace = load_trace(write_jsonl(tmp_path / "t.jsonl", end_time_records()), block_tokens=4)
    assert trace.requests["end_timestamp"].to_list() == [10.0, 2.0, 3.0]  # shifted with the arrivals (1 s -> 0)
    check_hand_case(trace)
    write_canonical(trace, None, tmp_path / "canon.parquet")
    check_hand_case(load_trace(tmp_path / "canon.parquet"))
    table = pl.DataFrame({"timestamp": [5.0, 6.0, 7.0], "end_timestamp": [15.0, 7.0, 8.0],
                          "input_tokens": [4, 8, 5], "block_ids": [[0], [1, 2], [0, 3]]})
    table.write_parquet(tmp_path / "generic.parquet")
    check_hand_case(load_trace(tmp_path / "generic.parquet", block_tokens=4))
    table.drop("end_timestamp").with_columns(end_timestamp_ms=pl.Series([15000, 7000, 8000])).write_parquet(
        tmp_path / "ms.parquet")
    check_hand_case(load_trace(tmp_path / "ms.parquet", block_tokens=4))
    # a trace without end times keeps no such column
    assert "end_timestamp" not in load_trace(CHAT).requests.columns


def test_curve_command_with_the_traces_end_times(tmp_path):
    """The command, in memory and streamed (a generic Parquet table), and its one-line
    errors: no end times, a request without one, an end before its start."""
    path = write_jsonl(tmp_path / "t.jsonl", end_time_records())
    args = ["--cache-rules", "sglang", "--in-flight", "--service-time", "trace", "--capacity", f"{4 * 4 * 327_680}B",
            "--block-tokens", "4"]
    res = runner.invoke(app, ["curve", str(path), *args, "--json", "-"])
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)["rows"][0]
    assert (row["wait_mean_s"], row["wait_p99_s"]) == (6.0, 9.0)
    res = runner.invoke(app, ["curve", str(path), *args], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "requests in flight (end_timestamp - timestamp each)" in " ".join(res.output.split())
    pl.DataFrame({"timestamp": [5.0, 6.0, 7.0], "end_timestamp": [15.0, 7.0, 8.0], "input_tokens": [4, 8, 5],
                  "block_ids": [[0], [1, 2], [0, 3]]}).write_parquet(tmp_path / "g.parquet")
    for stream in ("--stream", "--no-stream"):
        res = runner.invoke(app, ["curve", str(tmp_path / "g.parquet"), *args, stream, "--json", "-"])
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout[res.stdout.index("{"):])["rows"][0]["wait_mean_s"] == 6.0, stream
    for recs, needle in ((end_time_records((None, None, None)), "this trace has none"),
                         (end_time_records((11000, None, 4000)), "1 of 3 requests have no end_timestamp"),
                         (end_time_records((11000, 1500, 4000)), "end_timestamp precedes timestamp for 1 of 3")):
        bad = write_jsonl(tmp_path / "bad.jsonl", recs)
        line = one_line_error(runner.invoke(app, ["curve", str(bad), *args], env={"COLUMNS": "250"}), 2)
        assert needle in line and "service-time" in line, line


def test_an_end_time_that_is_not_a_number_is_refused(tmp_path):
    from kvtrace.errors import KvtraceError

    recs = end_time_records()
    recs[1]["end_timestamp"] = "soon"
    with pytest.raises(KvtraceError) as err:
        load_trace(write_jsonl(tmp_path / "t.jsonl", recs), block_tokens=4)
    assert err.value.field == "end_timestamp" and err.value.line == 2
    pl.DataFrame({"timestamp": [5.0, 6.0], "end_timestamp": [float("nan"), None], "input_tokens": [4, 4],
                  "block_ids": [[0], [1]]}).write_parquet(tmp_path / "nan.parquet")
    with pytest.raises(KvtraceError) as err:
        load_trace(tmp_path / "nan.parquet", block_tokens=4)
    assert err.value.field == "end_timestamp"


@pytest.mark.parametrize("seed", range(4))
def test_engine_rate_is_hits_over_the_admitted_requests_prompts(seed):
    """``engine_prefix_token_hit_rate``: what vLLM's own counter reports, computed here
    from the twin's per-request results: hit tokens over the prompt tokens of the
    requests it did not reject (and the headline rate over every prompt token)."""
    rng = np.random.default_rng(100 + seed)
    rows, chains, fresh = [], [], iter(range(1, 10**6))
    for i in range(40):
        base = chains[int(rng.integers(0, len(chains)))] if chains and rng.random() < 0.7 else []
        hashes = base[: int(rng.integers(0, len(base) + 1))] + [next(fresh) for _ in range(int(rng.integers(1, 9)))]
        chains.append(hashes)
        tokens = B * len(hashes) - int(rng.integers(0, B))  # a partial last block, sometimes
        rows.append({"request_id": i, "timestamp": float(i), "input_tokens": tokens, "output_tokens": 1,
                     "block_ids": hashes})
    df = pl.DataFrame(rows, schema={"request_id": pl.Int64, "timestamp": pl.Float64, "input_tokens": pl.Int64,
                                    "output_tokens": pl.Int64, "block_ids": pl.List(pl.UInt64)})
    trace = requests_to_trace(df, TraceMeta(block_tokens=B, source_format="canonical"))
    a = trace.accesses
    reqs = [{"blocks": a.block[a.req_start[r]:a.req_start[r + 1]].tolist(),
             "tokens": a.tokens[a.req_start[r]:a.req_start[r + 1]].tolist()} for r in range(trace.n_requests)]
    pools = [3, 6, 12, 40]
    seen_rejection = False
    res = engine_curve(trace, "vllm", capacities=[p * B * 327_680 for p in pools])
    for P, row in zip(pools, res.curve.iter_rows(named=True)):
        want = naive_vllm.replay(reqs, P, B, naive_vllm.Rules())
        hit = sum(w.hit_tokens for w in want)
        total = sum(sum(r["tokens"]) for r in reqs)
        admitted = sum(sum(r["tokens"]) for r, w in zip(reqs, want) if not w.rejected)
        assert any(w.rejected for w in want) == (admitted < total)
        seen_rejection |= admitted < total
        assert row["prefix_token_hit_rate"] == pytest.approx(hit / total, rel=1e-12)
        assert row["engine_prefix_token_hit_rate"] == pytest.approx(hit / admitted, rel=1e-12)
    assert seen_rejection  # the small pools reject prompts of up to 8 blocks


def test_whole_trace_replays_refuse_what_the_memory_budget_cannot_hold(tmp_path, monkeypatch):
    """SGLang and in-flight replays hold the whole trace's accesses: past the budget, a
    one-line error naming the need and the budget (the streamed vLLM replay still runs)."""
    src = tmp_path / "t.parquet"
    assert runner.invoke(app, ["ingest", str(CHAT), "-o", str(src)]).exit_code == 0
    n = load_trace(CHAT).n_accesses
    monkeypatch.setenv("KVTRACE_MEMORY_BUDGET", f"{20 * n - 1}B")
    for extra in (["--cache-rules", "sglang"], ["--cache-rules", "vllm", "--in-flight"]):
        res = runner.invoke(app, ["curve", str(src), "--stream", "--capacity", "4GiB", *extra],
                            env={"COLUMNS": "250"})
        assert res.exit_code == 2 and "Traceback" not in res.stderr + res.stdout
        line = res.stderr.splitlines()[-1]  # after the line saying it streams
        assert line.startswith("kvtrace: error: ") and f"its {n:,} block accesses need" in line
        assert "$KVTRACE_MEMORY_BUDGET" in line
    assert runner.invoke(app, ["curve", str(src), "--stream", "--capacity", "4GiB", "--cache-rules", "vllm"]
                         ).exit_code == 0
