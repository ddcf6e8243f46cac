"""vLLM's prefix cache at many pool sizes in one pass (:mod:`kvtrace.kernels.engine_vllm_multi`).

The oracle is the per-pool replay :func:`kvtrace.kernels.engine_vllm.replay_vllm`,
itself equal request by request to the plain-Python twin of vLLM's block manager
(``tests/naive_vllm.py``, ``test_engine_rules.py``):

- the one pass equals a replay per pool, request by request, on random chained traces
  (prefix trees, partial last blocks; and every prompt block-aligned, so the last-token
  cap copies blocks all the time) and on random traces without chaining (a block may be
  cached after a missing one), at pool sizes from the longest request up, under every
  rule set it implements, with the stack compacting many times while ghosts are alive;
- hypothesis-drawn chained traces, and the shared Mooncake trace;
- a request holding one id twice is refused (``None``); ``engine_curve`` then replays
  pool by pool, and its tables equal the per-pool path's everywhere else;
- the kernel run as Python gives the JIT's answers (``nojit``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jit_helpers import json_with_and_without_jit
from strategies import chained_traces
from test_engine_rules import kernel_columns, mooncake, random_requests, whole_arrays

from kvtrace.analyses import engine as E
from kvtrace.ingest import load_trace
from kvtrace.kernels import engine_vllm as V
from kvtrace.kernels import engine_vllm_multi as M

ROOT = Path(__file__).resolve().parents[1]
B = 4
CAPABLE = [bits for bits in range(16) if M.multi_capable(bits)]


def pools_from(rng, longest: int, n_ids: int) -> list[int]:
    return sorted({max(longest, 1), longest + 1, longest + 2, longest + 5, int(rng.integers(longest, n_ids + 3)),
                   n_ids, n_ids + 2, 2 * n_ids + 5})


def assert_equal_to_replays(block, tok, starts, n_ids, pools, bits):
    want, rej = V.replay_vllm(block, tok, starts, n_ids, pools, B, bits)
    assert not rej.any()
    got = M.replay_multi(block, tok, starts, n_ids, pools, B, bits)
    for k, P in enumerate(pools):
        bad = np.flatnonzero(want[k] != got[k])
        assert bad.size == 0, (P, bits, int(bad[0]), want[k][:bad[0] + 1].tolist(), got[k][:bad[0] + 1].tolist())


def unchained_requests(rng, n_req: int, alphabet: int):
    """Requests of distinct ids drawn from a small alphabet: a block may be cached after
    one that is not (no prefix structure)."""
    reqs = []
    for _ in range(n_req):
        n = int(rng.integers(0, min(alphabet, 9)))
        tokens = [B] * n
        if n and rng.random() < 0.4:
            tokens[-1] = int(rng.integers(1, B))
        reqs.append({"blocks": rng.choice(alphabet, size=n, replace=False).tolist(), "tokens": tokens})
    return reqs


def test_only_rule_sets_with_hashless_blocks_at_the_head_are_shared():
    assert M.multi_capable(V.ALL_RULES)
    assert not M.multi_capable(V.ALL_RULES & ~V.HASHLESS_FIRST)  # hashless blocks aged like cached ones
    assert M.multi_capable(V.ALL_RULES & ~V.HASHLESS_FIRST & ~V.FULL_BLOCKS_ONLY)  # no block is hashless
    assert len(CAPABLE) == 12


@pytest.mark.parametrize("seed", range(60))
@pytest.mark.parametrize("kind", ["chained", "unchained"])
def test_one_pass_equals_a_replay_per_pool(kind, seed):
    if kind == "chained":
        rng = np.random.default_rng(seed)
        reqs = random_requests(rng, int(rng.integers(1, 150)), B)
        if seed % 2:  # every prompt block-aligned: the capped last block is copied again and again
            for r in reqs:
                r["tokens"] = [B] * len(r["blocks"])
    else:
        rng = np.random.default_rng(1000 + seed)
        reqs = unchained_requests(rng, int(rng.integers(1, 250)), int(rng.integers(2, 40)))
    block, tok, starts, n_ids = kernel_columns(reqs)
    pools = pools_from(rng, int(np.diff(starts).max(initial=0)), n_ids)
    for bits in CAPABLE:
        assert_equal_to_replays(block, tok, starts, n_ids, pools, bits)


@pytest.mark.parametrize("seed", range(20))
def test_the_unbounded_pool_comes_with_the_pass(seed):
    """The rules' ceiling (nothing evicted: a block hits once an earlier request accessed
    it) from the shared pass equals its own replay."""
    rng = np.random.default_rng(3000 + seed)
    reqs = random_requests(rng, 100, B) if seed % 2 else unchained_requests(rng, 200, int(rng.integers(3, 30)))
    block, tok, starts, n_ids = kernel_columns(reqs)
    pools = pools_from(rng, int(np.diff(starts).max(initial=0)), n_ids)
    R = starts.shape[0] - 1
    for bits in CAPABLE:
        state, hit, got = M.MultiState(n_ids, pools), np.zeros((len(pools), R), np.int32), np.zeros(R, np.int32)
        r = 0
        while True:
            status, r = M.multi_chunk(block, tok, starts, B, bits, *state.arrays(), r, hit, got)
            if status == M.DONE:
                break
            state.grow(int(starts[r + 1] - starts[r]))
        want = np.zeros(R, dtype=np.int32)
        E._unbounded_chunk(block, tok, starts, B, bits, np.zeros(n_ids, dtype=np.bool_), want)
        np.testing.assert_array_equal(got, want)


def test_ghosts_live_through_many_compactions():
    """A long trace over few ids: the stack (about two slots per id) compacts every few
    requests while pools hold ghosts, several in one gap between live slots."""
    rng = np.random.default_rng(5)
    reqs = unchained_requests(rng, 3000, 12)
    for r in reqs[::3]:
        r["tokens"] = [B] * len(r["blocks"])
    block, tok, starts, n_ids = kernel_columns(reqs)
    pools = [8, 9, 10, 12, 14]
    assert_equal_to_replays(block, tok, starts, n_ids, pools, V.ALL_RULES)
    # the case does what it says: ghosts created, several sharing a gap after a compaction
    state = M.MultiState(n_ids, pools)
    hit = np.zeros((len(pools), starts.shape[0] - 1), dtype=np.int32)
    r, compactions, shared_gap, most_alive = 0, 0, False, 0
    for i in range(starts.shape[0] - 1):
        before = state.scalars[0]
        while True:
            status, r = M.multi_chunk(block, tok, starts[: i + 2], B, V.ALL_RULES, *state.arrays(), i, hit,
                                      M.NO_HITS)
            if status == M.DONE:
                break
            state.grow(int(starts[i + 1] - starts[i]))
        compactions += state.scalars[0] < before
        live = state.rec_flags[: state.counters[M.CT_REC]] & M.ALIVE > 0
        subs = state.rec_key[: state.counters[M.CT_REC]][live] & ((1 << M.SUB_BITS) - 1)
        shared_gap |= bool((subs >= 2).any())
        most_alive = max(most_alive, int(live.sum()))
    assert compactions > 20 and shared_gap
    # records are reused: the numbers handed out stay near the most ghosts alive at once, not the ghosts made
    high, made = int(state.counters[M.CT_REC]), int(state.counters[M.CT_MADE])
    assert made > 10 * high and high < 3 * most_alive + 4 * len(pools) * int(np.diff(starts).max()), (high, made)
    want, _ = V.replay_vllm(block, tok, starts, n_ids, pools, B, V.ALL_RULES)
    np.testing.assert_array_equal(hit, want)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trace=chained_traces(max_requests=30, max_new=5), extra=st.integers(0, 6), aligned=st.booleans())
def test_one_pass_equals_replays_on_drawn_traces(trace, extra, aligned):
    block, starts = trace.block, trace.req_start
    n_ids = len(trace.size)
    tok = np.full(block.shape[0], B, dtype=np.int64)
    if not aligned:
        ends = starts[1:][starts[1:] > starts[:-1]] - 1
        tok[ends] = 1 + (ends % (B - 1))
    longest = int(np.diff(starts).max(initial=0))
    pools = sorted({max(longest, 1), longest + extra, n_ids + extra})
    assert_equal_to_replays(block, tok, starts, n_ids, pools, V.ALL_RULES)


def test_a_request_holding_one_id_twice_is_refused():
    block = np.array([1, 2, 3, 1, 2, 2, 2], dtype=np.int64)
    starts = np.array([0, 3, 5, 7])
    tok = np.full(7, B, dtype=np.int64)
    assert M.replay_multi(block, tok, starts, 4, [3, 4], B, V.ALL_RULES) is None
    assert M.replay_multi(block[:5], tok[:5], starts[:3], 4, [3, 4], B, V.ALL_RULES) is not None


def engine_tables(trace, **kw):
    res = E.engine_curve(trace, "vllm", **kw)
    return res.curve, res.knees, res.ceiling, res.by_group


@pytest.mark.parametrize("name,kw", [("chat.jsonl", dict(points=14)),
                                     ("agent_bailian.jsonl", dict(points=40, warmup="20%", by="type"))])
def test_engine_curve_is_the_same_with_and_without_the_shared_pass(monkeypatch, name, kw):
    trace = load_trace(ROOT / "sample_traces" / name)
    assert int(np.diff(trace.req_start).max()) < trace.n_blocks  # some pools share the pass
    calls = []
    real = M.multi_chunk
    monkeypatch.setattr(M, "multi_chunk", lambda *a: calls.append(1) or real(*a))
    shared = engine_tables(trace, **kw)
    assert calls
    monkeypatch.setattr(M, "multi_capable", lambda bits: False)
    alone = engine_tables(trace, **kw)
    assert shared[0].equals(alone[0]) and shared[1].equals(alone[1]) and shared[2] == alone[2]
    assert (shared[3] is None and alone[3] is None) or shared[3].equals(alone[3])


def test_engine_curve_falls_back_when_a_request_repeats_an_id(monkeypatch):
    import polars as pl

    from kvtrace.ingest.canonical import requests_to_trace
    from kvtrace.trace import TraceMeta

    rng = np.random.default_rng(3)
    rows = []
    for i in range(80):
        ids = rng.integers(1, 30, int(rng.integers(1, 6))).tolist()  # repeats inside a request happen
        rows.append({"request_id": i, "timestamp": float(i), "type": "chat", "tenant": None,
                     "input_tokens": B * len(ids), "output_tokens": 1, "block_ids": ids})
    df = pl.DataFrame(rows, schema={"request_id": pl.Int64, "timestamp": pl.Float64, "type": pl.String,
                                    "tenant": pl.String, "input_tokens": pl.Int64, "output_tokens": pl.Int64,
                                    "block_ids": pl.List(pl.UInt64)})
    trace = requests_to_trace(df, TraceMeta(block_tokens=B, source_format="canonical"))
    block, starts = trace.accesses.block, trace.req_start
    assert any(len(set(block[a:b])) < b - a for a, b in zip(starts[:-1], starts[1:]))
    got = engine_tables(trace, points=10)
    monkeypatch.setattr(M, "multi_capable", lambda bits: False)
    want = engine_tables(trace, points=10)
    assert got[0].equals(want[0]) and got[2] == want[2]


@pytest.mark.slow
def test_one_pass_equals_replays_on_the_mooncake_trace():
    trace = mooncake()
    block, tok, starts = whole_arrays(trace)
    longest = int(np.diff(starts).max())
    pools = [longest, 2 * longest, 1000, 4000, 16000, trace.n_blocks]
    want, _ = V.replay_vllm(block, tok, starts, trace.n_blocks, pools, 512, V.ALL_RULES)
    got = M.replay_multi(block, tok, starts, trace.n_blocks, pools, 512, V.ALL_RULES)
    np.testing.assert_array_equal(got, want)


@pytest.mark.nojit
def test_multi_kernel_without_jit():
    """The one-pass kernel run as Python (NUMBA_DISABLE_JIT=1, so coverage sees its
    body) gives the JIT's answers on a case with ghosts and compactions."""
    code = ("import json, numpy as np, sys\n"
            "sys.path.insert(0, 'tests')\n"
            "from test_engine_multi import unchained_requests\n"
            "from test_engine_rules import kernel_columns\n"
            "from kvtrace.kernels import engine_vllm as V, engine_vllm_multi as M\n"
            "reqs = unchained_requests(np.random.default_rng(11), 300, 10)\n"
            "for r in reqs[::2]: r['tokens'] = [4] * len(r['blocks'])\n"
            "block, tok, starts, n = kernel_columns(reqs)\n"
            "print(json.dumps(M.replay_multi(block, tok, starts, n, [8, 9, 12], 4, V.ALL_RULES).tolist()))\n")
    runs = json_with_and_without_jit(code)
    assert runs[0] == runs[1] and any(any(row) for row in runs[0])
