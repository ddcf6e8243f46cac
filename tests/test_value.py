"""Future-reuse kernels and value tables vs their twins in tests/naive.py (DESIGN §2, seed §9).

Layers, each checking the next:
- hand-computed cases pin the twins (and the code) to the definitions: window
  semantics (ties, the horizon boundary, 0 and inf), the keep/drop optimum, and every
  number of a small value report;
- the twins against each other (run search vs subset enumeration);
- the kernels vs the twins on random and degenerate inputs, and ``value_report`` vs
  ``naive.value_tables`` (a stay-by-stay replay of the time-to-live schedule) on random
  traces built through the canonical ingest path.
"""

from __future__ import annotations

import json
import math

import numpy as np
import numpy.testing as npt
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import naive
from naive import naive_families
from strategies import all_cold_traces, all_hot_traces, one_access_traces, random_traces

from kvtrace.errors import KvtraceError, UsageError
from kvtrace.ingest.canonical import requests_to_trace
from kvtrace.kernels.future import best_keep_value, future_windows
from kvtrace.model import GpuSpec, ModelSpec
from kvtrace.outputs import write_json_atomic, write_table
from kvtrace.trace import TraceMeta
from kvtrace.analyses.value import (
    DEFAULT_COSTS,
    DEFAULT_HORIZON_S,
    QUANTILES,
    StorageCosts,
    weighted_quantiles,
    future_reuse,
    parse_horizon,
    value_report,
)

INF = math.inf
SETTINGS = settings(deadline=None, max_examples=150)
FEW = settings(deadline=None, max_examples=60)

# A toy model and GPU with round numbers: a token at position p costs 2 + 4p FLOPs
# (a = 2 x 1 param, b = 4 x 1 x 1 x 1), a token takes 1 x 1 x 1 x 2 x 2 = 4 bytes, and
# 1 FLOP = 1 GPU-second = $1.
TOY = ModelSpec(name="toy", attention="mha", layers=1, q_heads=1, kv_heads=1, head_dim=1, active_params=1)
TOY_GPU = GpuSpec(name="toy", peak_flops=1.0, dollars_per_hour=3600.0, mfu=1.0)

#: Steps between request arrivals, seconds: many ties, boundaries on the horizons below.
STEPS = [0.0, 0.0, 0.1, 0.25, 0.5, 1.0, 2.5, 7.0]
HORIZONS = st.one_of(st.sampled_from([0.0, 0.25, 0.5, 1.0, 2.5, 3.0, INF]), st.floats(0, 20))


# --------------------------------------------------------------------------- helpers


def kernel(block, ts, tokens, q, n_blocks, horizon):
    """Run the kernel, checking output types and that the inputs are left untouched."""
    args = [np.asarray(block, np.int64), np.asarray(ts, np.float64), np.asarray(tokens, np.int64),
            np.asarray(q, np.int64)]
    before = [x.copy() for x in args]
    out = future_windows(args[0], args[1], args[2], args[3], n_blocks, float(horizon))
    for x, y in zip(before, args):
        npt.assert_array_equal(x, y, err_msg="kernel modified its input")
    assert len(out) == 7
    for x, dtype in zip(out, (np.int64, np.float64, np.int64, np.int64, np.float64, np.int64, np.int64)):
        assert isinstance(x, np.ndarray) and x.dtype == dtype and x.shape == args[0].shape
    return out


NAMES = ("next_t", "next_gap", "reuses", "last_t", "last_gap", "reuse_tokens", "reuse_q")


def assert_windows_equal(got, want, msg="") -> None:
    for name, g, w in zip(NAMES, got, want):
        npt.assert_array_equal(g, w, err_msg=f"{name} {msg}")


@st.composite
def kernel_inputs(draw, traces=random_traces()):
    """(block, ts, tokens, q, n_blocks, horizon): a strategy trace with request arrival
    times (non-decreasing, with ties), random token counts and position-token sums."""
    tr = draw(traces)
    n_req = len(tr.req_start) - 1
    arrivals = np.cumsum([draw(st.sampled_from(STEPS)) for _ in range(n_req)])
    ts = np.repeat(arrivals, np.diff(tr.req_start)).astype(np.float64)
    n = len(tr.block)
    tokens = np.array(draw(st.lists(st.integers(1, 512), min_size=n, max_size=n)), dtype=np.int64).reshape(n)
    q = np.array(draw(st.lists(st.integers(0, 10**9), min_size=n, max_size=n)), dtype=np.int64).reshape(n)
    return tr.block, ts, tokens, q, len(tr.size), draw(HORIZONS)


def build_trace(rows, block_tokens):
    df = pl.DataFrame(rows, schema={"timestamp": pl.Float64, "input_tokens": pl.Int64, "output_tokens": pl.Int64,
                                    "block_ids": pl.List(pl.UInt64)})
    return requests_to_trace(df, TraceMeta(block_tokens=block_tokens, source_format="canonical"))


@st.composite
def request_rows(draw):
    """Canonical request rows (dicts) from a strategy trace: hashes = block id + 100,
    non-decreasing arrivals with ties, a random partial last block, empty requests."""
    tr = draw(random_traces(max_blocks=8, max_accesses=30, max_requests=10))
    B = draw(st.sampled_from([1, 4, 16]))
    rows, now = [], 0.0
    for r in range(len(tr.req_start) - 1):
        ids = tr.block[tr.req_start[r]:tr.req_start[r + 1]].tolist()
        now += draw(st.sampled_from(STEPS))
        n_in = B * (len(ids) - 1) + draw(st.integers(1, B)) if ids else 0
        rows.append({"timestamp": now, "input_tokens": n_in, "output_tokens": 1, "block_ids": [i + 100 for i in ids]})
    return rows, B


COSTS = st.builds(
    StorageCosts,
    write_dollars_per_byte=st.sampled_from([0.0, 0.5, 3.0]),
    read_dollars_per_byte=st.sampled_from([0.0, 0.25]),
    occupancy_dollars_per_byte_second=st.sampled_from([0.0, 0.1, 2.0]),
)


# ------------------------------------------------------------- future_windows: by hand

# block 0 at 0, 0, 1, 5 s; block 1 at 0 and 2 s (trace order = index)
HAND_BLOCK = [0, 1, 0, 0, 1, 0]
HAND_TS = [0.0, 0.0, 0.0, 1.0, 2.0, 5.0]
HAND_TOKENS = [16, 16, 16, 8, 16, 4]
HAND_Q = [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    "horizon, reuses, last_t, last_gap, reuse_tokens, reuse_q",
    [
        # a tie counts (t2 is in t0's window at gap 0); the boundary gap == horizon counts
        (1.0, [2, 0, 1, 0, 0, 0], [3, -1, 3, -1, -1, -1], [1, 0, 1, 0, 0, 0], [24, 0, 8, 0, 0, 0],
         [7, 0, 4, 0, 0, 0]),
        (0.0, [1, 0, 0, 0, 0, 0], [2, -1, -1, -1, -1, -1], [0, 0, 0, 0, 0, 0], [16, 0, 0, 0, 0, 0],
         [3, 0, 0, 0, 0, 0]),
        (INF, [3, 1, 2, 1, 0, 0], [5, 4, 5, 5, -1, -1], [5, 2, 5, 4, 0, 0], [28, 16, 12, 4, 0, 0],
         [13, 5, 10, 6, 0, 0]),
    ],
    ids=["1s", "0s", "inf"],
)
def test_windows_by_hand(horizon, reuses, last_t, last_gap, reuse_tokens, reuse_q):
    want_next = ([2, 4, 3, 5, -1, -1], [0.0, 2.0, 1.0, 4.0, INF, INF])
    want = (*want_next, reuses, last_t, np.array(last_gap, float), reuse_tokens, reuse_q)
    for impl in (kernel, naive.future_windows):
        assert_windows_equal(impl(HAND_BLOCK, HAND_TS, HAND_TOKENS, HAND_Q, 2, horizon), want, impl.__name__)


# ----------------------------------------------------------- future_windows: vs twin


@SETTINGS
@given(kernel_inputs())
def test_windows_match_twin(case):
    assert_windows_equal(kernel(*case), naive.future_windows(*case))


@FEW
@given(st.one_of(kernel_inputs(all_cold_traces()), kernel_inputs(all_hot_traces()),
                 kernel_inputs(one_access_traces())))
def test_windows_degenerate_match_twin(case):
    got = kernel(*case)
    assert_windows_equal(got, naive.future_windows(*case))
    block = case[0]
    if len(set(block.tolist())) == len(block):  # all cold: no access has a future
        assert (got[0] == -1).all() and (got[2] == 0).all() and np.isinf(got[1]).all()


@FEW
@given(kernel_inputs(), st.sampled_from([0.0, INF]))
def test_windows_all_ties(case, horizon):
    """Every access at one instant: any horizon (0 included) counts every later access."""
    block, ts, tokens, q, m, _ = case
    ts = np.full_like(ts, 42.0)
    got = kernel(block, ts, tokens, q, m, horizon)
    assert_windows_equal(got, naive.future_windows(block, ts, tokens, q, m, horizon))
    later = [sum(1 for u in range(t + 1, len(block)) if block[u] == block[t]) for t in range(len(block))]
    npt.assert_array_equal(got[2], later)


def test_windows_empty():
    e = np.zeros(0, np.int64)
    out = kernel(e, np.zeros(0), e, e, 0, 1.0)
    assert all(x.shape == (0,) for x in out)


@FEW
@given(kernel_inputs())
def test_windows_horizon_monotone(case):
    """A longer horizon never loses a reuse, and inf counts every later access."""
    block, ts, tokens, q, m, h = case
    base = kernel(*case)
    small, big, inf = base[2], kernel(block, ts, tokens, q, m, h + 1.0)[2], kernel(block, ts, tokens, q, m, INF)[2]
    assert (small <= big).all() and (big <= inf).all()
    npt.assert_array_equal(inf > 0, base[0] >= 0)  # reused at all iff there is a next access
    # reuses > 0 iff the next access is within the horizon
    npt.assert_array_equal(small > 0, (base[0] >= 0) & (base[1] <= h))


def test_windows_python_body_matches_jit():
    """The kernel run as Python (``py_func``) agrees with the compiled one."""
    windows_py = getattr(future_windows, "py_func", future_windows)  # NUMBA_DISABLE_JIT: already Python
    keep_py = getattr(best_keep_value, "py_func", best_keep_value)
    rng = np.random.default_rng(7)
    for _ in range(5):
        n = 60
        block = rng.integers(0, 6, n)
        ts = np.sort(rng.choice([0.0, 0.5, 1.0, 3.0], n).cumsum())
        tokens, q = rng.integers(1, 16, n), rng.integers(0, 1000, n)
        for h in (0.0, 1.0, INF):
            assert_windows_equal(windows_py(block, ts, tokens, q, 6, h),
                                 future_windows(block, ts, tokens, q, 6, h))
    keep = rng.random(n) < 0.7
    val = rng.normal(size=n)
    w = rng.random(6)
    npt.assert_array_equal(keep_py(block, 6, keep, val, w), best_keep_value(block, 6, keep, val, w))


# --------------------------------------------------------------------- best_keep_value


@pytest.mark.parametrize(
    "keepable, write, want",
    [
        ([True, True, True, False], 3.0, 6.0),  # one run through the losing middle: 9 - 3
        ([True, True, True, False], 0.0, 10.0),  # free writes: skip the middle
        ([True, False, True, False], 3.0, 4.0),  # the middle cannot be kept: two writes
        ([False, False, False, False], 3.0, 0.0),  # nothing keepable: keep nothing
        ([True, True, True, False], 20.0, 0.0),  # a write dearer than all gains
    ],
)
def test_best_keep_by_hand(keepable, write, want):
    block = np.zeros(4, np.int64)
    values = np.array([5.0, -1.0, 5.0, 99.0])  # the last access has no interval: ignored
    for impl in (best_keep_value, naive.best_keep_value, naive.best_keep_value_enumerated):
        assert impl(block, 1, np.array(keepable), values, np.array([write]))[0] == pytest.approx(want)


@st.composite
def keep_inputs(draw, max_accesses=30):
    tr = draw(random_traces(max_blocks=5, max_accesses=max_accesses))
    n, m = len(tr.block), len(tr.size)
    keep = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool).reshape(n)
    val = np.array(draw(st.lists(st.sampled_from([-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 4.0]), min_size=n,
                                 max_size=n))).reshape(n)
    write = np.array(draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 3.0]), min_size=m, max_size=m))).reshape(m)
    return tr.block, m, keep, val, write


@FEW
@given(keep_inputs(max_accesses=14))
def test_best_keep_twin_matches_enumeration(case):
    npt.assert_allclose(naive.best_keep_value(*case), naive.best_keep_value_enumerated(*case), atol=1e-12)


@SETTINGS
@given(keep_inputs())
def test_best_keep_kernel_matches_twin(case):
    got = best_keep_value(*case)
    assert got.dtype == np.float64 and got.shape == (case[1],)
    npt.assert_allclose(got, naive.best_keep_value(*case), atol=1e-12)
    assert (got >= 0).all()


# ------------------------------------------------------------------- value: by hand

# B = 4 tokens, toy model (bytes/token 4), costs W 0.5 $/B, R 0.25 $/B, O 0.1 $/B/s, H 5 s.
# accesses: t0 b10@0 (4 tok, pos 0) · t1 b11@0 (3 tok, pos 1) · t2 b10@1 · t3 b11@1 (4 tok)
#           · t4 b10@10 · t5 b20@10 (1 tok, pos 1) · t6 b30@11 (4 tok, pos 0, a new root)
HAND_ROWS = [
    {"timestamp": 0.0, "input_tokens": 7, "output_tokens": 1, "block_ids": [10, 11]},
    {"timestamp": 1.0, "input_tokens": 8, "output_tokens": 1, "block_ids": [10, 11]},
    {"timestamp": 10.0, "input_tokens": 5, "output_tokens": 1, "block_ids": [10, 20]},
    {"timestamp": 11.0, "input_tokens": 4, "output_tokens": 1, "block_ids": [30]},
]
HAND_COSTS = StorageCosts(write_dollars_per_byte=0.5, read_dollars_per_byte=0.25, occupancy_dollars_per_byte_second=0.1)


@pytest.fixture
def hand():
    return value_report(build_trace(HAND_ROWS, 4), model=TOY, gpu=TOY_GPU, horizon_s=5.0, costs=HAND_COSTS)


def test_value_by_hand_per_access(hand):
    fr = hand.future
    # FLOPs: 4 tokens at pos 0 = 2*4 + 4*(0+1+2+3) = 32; b11 with 4 tokens from 4 = 8 + 4*22 = 96
    npt.assert_array_equal(fr.reuses, [1, 1, 0, 0, 0, 0, 0])
    npt.assert_array_equal(fr.bytes, [16, 16, 16, 16, 16, 4, 16])
    npt.assert_allclose(fr.gain_gpu_seconds, [32, 96, 0, 0, 0, 0, 0])
    npt.assert_allclose(fr.hold_s, [1, 1, 5, 5, 5, 5, 5])
    # 32 - 16 x (0.5 + 0.25 + 0.1 x 1); no reuse: - bytes x (0.5 + 0.1 x 5)
    npt.assert_allclose(fr.value_usd, [18.4, 82.4, -16, -16, -16, -4, -16])
    # stays: b10 {t0, t2} {t4}; b11 {t1, t3}; b20; b30
    npt.assert_allclose(fr.interval_value_usd, [18.4, 82.4, -8, -8, -16, -4, -16])
    npt.assert_array_equal(fr.starts_stay, [True, True, False, False, True, True, True])


def test_value_by_hand_tables(hand):
    b = hand.per_block
    assert b["hash"].to_list() == [10, 11, 20, 30]
    assert b["root_block"].to_list() == [0, 0, 0, 3]
    assert b["accesses"].to_list() == [3, 2, 1, 1]
    assert b["reused"].to_list() == [True, True, False, False]
    assert b["horizon_hits"].to_list() == [1, 1, 0, 0]
    assert b["first_seen_s"].to_list() == [0.0, 0.0, 10.0, 11.0]
    assert b["last_seen_s"].to_list() == [10.0, 1.0, 10.0, 11.0]
    npt.assert_allclose(b["total_value_usd"], [-5.6, 74.4, -4, -16])
    npt.assert_allclose(b["value_usd_per_byte"], [-0.35, 4.65, -1, -1])
    npt.assert_allclose(b["clairvoyant_value_usd"], [18.4, 82.4, 0, 0])
    npt.assert_allclose(b["gain_gpu_seconds"] - b["cost_usd"], b["total_value_usd"])
    p = hand.per_prefix
    assert p["root_hash"].to_list() == [10, 30]
    assert p["blocks"].to_list() == [3, 1] and p["bytes"].to_list() == [36, 16]
    assert p["accesses"].to_list() == [6, 1] and p["never_reused_bytes"].to_list() == [4, 16]
    npt.assert_allclose(p["total_value_usd"], [64.8, -16])
    npt.assert_allclose(p["value_usd_per_byte"], [1.8, -1])
    assert hand.top_prefixes(1)["root_block"].to_list() == [0]


def test_value_by_hand_summary(hand):
    s = hand.summary
    assert (s["accesses"], s["blocks"], s["prefixes"], s["distinct_bytes"]) == (7, 4, 2, 52)
    assert s["never_reused_bytes"] == 20 and s["never_reused_blocks"] == 2
    assert s["never_reused_bytes_share"] == pytest.approx(20 / 52)
    assert s["never_reused_access_share"] == pytest.approx(2 / 7)
    assert s["no_reuse_in_horizon_access_share"] == pytest.approx(5 / 7)
    assert s["positive_window_value_access_share"] == pytest.approx(2 / 7)
    assert s["negative_value_bytes_share"] == pytest.approx(36 / 52)
    for key, want in (("gain_gpu_seconds", 128), ("gain_usd", 128), ("write_cost_usd", 34),
                      ("read_cost_usd", 8), ("occupancy_cost_usd", 37.2), ("total_value_usd", 48.8),
                      ("clairvoyant_bound_usd", 100.8)):
        assert s[key] == pytest.approx(want), key
    want_q = {"p10": -1, "p25": -1, "p50": -0.35, "p75": 4.65, "p90": 4.65, "p99": 4.65}
    assert s["value_usd_per_byte_quantiles"] == pytest.approx(want_q)
    assert s["horizon_s"] == 5.0 and s["model"] == "toy"


def test_value_formula_independent():
    """Window value of every access recomputed here from the model's own prefill_flops
    and GpuSpec conversions, on the hand trace under several horizons and real specs."""
    from kvtrace.model import resolve_gpu, resolve_model

    tr = build_trace(HAND_ROWS, 4)
    model, gpu = resolve_model("llama-3.1-8b"), resolve_gpu("H100")
    costs = StorageCosts(write_dollars_per_byte=3e-13, read_dollars_per_byte=1e-13,
                         occupancy_dollars_per_byte_second=2e-14)
    # (ts, tokens, start position, bytes) of each access, written out from HAND_ROWS
    acc = [(0, 4, 0, 10), (0, 3, 4, 11), (1, 4, 0, 10), (1, 4, 4, 11), (10, 4, 0, 10), (10, 1, 4, 20), (11, 4, 0, 30)]
    size = {10: 4, 11: 4, 20: 1, 30: 4}
    for horizon in (0.0, 1.0, 9.0, INF):
        fr = future_reuse(tr, model=model, gpu=gpu, horizon_s=horizon, costs=costs)
        for t, (ts, _, _, h) in enumerate(acc):
            inside = [u for u in range(t + 1, len(acc)) if acc[u][3] == h and acc[u][0] - ts <= horizon]
            flops = sum(model.prefill_flops(acc[u][1], acc[u][2]) for u in inside)
            hold = (acc[inside[-1]][0] - ts) if inside else (horizon if horizon < INF else 0.0)
            nbytes = size[h] * model.kv_bytes_per_token
            cost = nbytes * (3e-13 + 1e-13 * len(inside) + 2e-14 * hold)
            assert fr.gain_gpu_seconds[t] == pytest.approx(gpu.gpu_seconds(flops), rel=1e-12)
            assert fr.value_usd[t] == pytest.approx(gpu.dollars(flops) - cost, rel=1e-9, abs=1e-18)


# ----------------------------------------------------------------- value: vs the twin


def _close(x, y, scale):
    return x == pytest.approx(y, rel=1e-9, abs=1e-9 * scale)


@FEW
@given(request_rows(), HORIZONS, COSTS)
def test_value_report_matches_twin(rows_b, horizon, costs):
    rows, B = rows_b
    trace = build_trace(rows, B)
    res = value_report(trace, model=TOY, gpu=TOY_GPU, horizon_s=horizon, costs=costs)
    ct, order = naive.curve_trace(rows, B)
    assert order == sorted(order)
    tw = naive.value_tables(ct, TOY, TOY_GPU, horizon, costs.write_dollars_per_byte, costs.read_dollars_per_byte,
                            costs.occupancy_dollars_per_byte_second)
    _families_below_shared_root(tw, ct, res)
    fr = res.future
    scale = 1.0 + sum(abs(x["gain_usd"]) + abs(x["cost_usd"]) for x in tw["access"])
    for key in ("reuses", "next_t"):
        npt.assert_array_equal(getattr(fr, key), [x[key] for x in tw["access"]], err_msg=key)
    for key in ("hold_s", "gain_gpu_seconds", "gain_usd", "cost_usd", "value_usd"):
        npt.assert_allclose(getattr(fr, key), [x[key] for x in tw["access"]], rtol=1e-9, atol=1e-9 * scale,
                            err_msg=key)

    # per-block table
    pb = res.per_block
    assert pb["block"].to_list() == list(range(len(tw["block"])))
    assert pb["hash"].to_list() == _hashes(rows)
    for key in ("root_block", "accesses", "reused", "horizon_hits", "bytes", "first_seen_s", "last_seen_s"):
        assert pb[key].to_list() == [tw["block"][b][key] for b in range(pb.height)], key
    for key in ("gain_gpu_seconds", "cost_usd", "total_value_usd", "clairvoyant_value_usd"):
        npt.assert_allclose(pb[key], [tw["block"][b][key] for b in range(pb.height)], rtol=1e-9,
                            atol=1e-9 * scale, err_msg=key)
    # the interval decomposition sums to the schedule's value, block by block
    per_block_sum = np.bincount(fr.block, weights=fr.interval_value_usd, minlength=pb.height)
    npt.assert_allclose(per_block_sum, pb["total_value_usd"], rtol=1e-9, atol=1e-9 * scale)
    assert (pb["clairvoyant_value_usd"] >= pb["total_value_usd"].clip(lower_bound=0) - 1e-9 * scale).all()

    # per-prefix rollup
    pp = res.per_prefix
    assert sorted(pp["root_block"].to_list()) == sorted(tw["prefix"])
    for row in pp.iter_rows(named=True):
        want = tw["prefix"][row["root_block"]]
        for key in ("blocks", "bytes", "accesses", "never_reused_bytes"):
            assert row[key] == want[key], key
        for key in ("gain_gpu_seconds", "total_value_usd", "value_usd_per_byte", "clairvoyant_value_usd"):
            assert _close(row[key], want[key], scale), key
    totals = pp["total_value_usd"].to_list()
    assert all(x >= y - 1e-9 * scale for x, y in zip(totals, totals[1:])), "not sorted by value"

    # summary
    s, ws = res.summary, tw["summary"]
    for key in ("accesses", "blocks", "prefixes", "distinct_bytes", "never_reused_blocks", "never_reused_bytes"):
        assert s[key] == ws[key], key
    for key in ("never_reused_bytes_share", "never_reused_access_share", "no_reuse_in_horizon_access_share"):
        assert s[key] == (None if ws[key] is None else pytest.approx(ws[key])), key
    for key in ("gain_gpu_seconds", "write_cost_usd", "read_cost_usd", "occupancy_cost_usd",
                "total_value_usd", "clairvoyant_bound_usd"):
        assert _close(s[key], ws[key], scale), key
    assert s["total_value_usd"] == pytest.approx(
        s["gain_usd"] - s["write_cost_usd"] - s["read_cost_usd"] - s["occupancy_cost_usd"],
        rel=1e-9, abs=1e-9 * scale)
    # signs of values within rounding of 0 may differ: the share must lie between the
    # shares of clearly negative and of not clearly positive blocks
    eps = 1e-9 * scale
    if ws["distinct_bytes"]:
        neg_lo = sum(x["bytes"] for x in tw["block"].values() if x["total_value_usd"] < -eps) / ws["distinct_bytes"]
        neg_hi = sum(x["bytes"] for x in tw["block"].values() if x["total_value_usd"] < eps) / ws["distinct_bytes"]
        assert neg_lo - 1e-12 <= s["negative_value_bytes_share"] <= neg_hi + 1e-12
        n = ws["accesses"]
        pos_lo = sum(x["value_usd"] > eps for x in tw["access"]) / n
        pos_hi = sum(x["value_usd"] > -eps for x in tw["access"]) / n
        assert pos_lo <= s["positive_window_value_access_share"] <= pos_hi
        for q, v in ws["value_usd_per_byte_quantiles"].items():
            assert s["value_usd_per_byte_quantiles"][q] == pytest.approx(v, rel=1e-9, abs=eps), q
    else:
        assert s["negative_value_bytes_share"] is None
        assert all(v is None for v in s["value_usd_per_byte_quantiles"].values())


def _families_below_shared_root(tw, ct, res):
    """Regroup the twin's blocks by the families of ``naive_families`` (the twin's
    ``root_block`` is the position-0 one; random traces often have a shared root,
    e.g. a single request) and check the summary's shared-root keys."""
    rs = ct.req_start
    root, share, family = naive_families([list(ct.block[rs[i]:rs[i + 1]]) for i in range(len(rs) - 1)])
    s = res.summary
    assert s["shared_root_blocks"] == len(root) and s["shared_root_request_share"] == share
    assert s["shared_root_hashes"] == [int(res.per_block["hash"][b]) for b in root]
    for b, blk in tw["block"].items():
        blk["root_block"] = family[b]
    prefix = naive.naive_prefix_rollup(tw["block"].values())
    tw["prefix"] = prefix
    tw["summary"]["prefixes"] = len(prefix)


def _hashes(rows):
    """Hashes in order of first appearance (the dense ids of the canonical trace)."""
    seen = {}
    for row in sorted(rows, key=lambda r: r["timestamp"]):
        for h in row["block_ids"]:
            seen.setdefault(h, len(seen))
    return list(seen)


@FEW
@given(request_rows(), HORIZONS)
def test_free_storage_values_compute_alone(rows_b, horizon):
    """With zero costs, a value is the compute it saves: one-shot blocks are worth 0, the
    schedule keeps every reuse within the horizon, and the bound equals the schedule."""
    rows, B = rows_b
    res = value_report(build_trace(rows, B), model=TOY, gpu=TOY_GPU, horizon_s=horizon, costs=StorageCosts())
    fr, pb = res.future, res.per_block
    npt.assert_array_equal(fr.value_usd, fr.gain_usd)
    assert (fr.value_usd[fr.reuses == 0] == 0).all()
    assert (pb.filter(~pl.col("reused"))["total_value_usd"] == 0).all()
    npt.assert_allclose(pb["clairvoyant_value_usd"], pb["total_value_usd"], rtol=1e-12)
    s = res.summary
    assert s["write_cost_usd"] == s["read_cost_usd"] == s["occupancy_cost_usd"] == 0
    assert s["negative_value_bytes_share"] in (None, 0.0)


def test_one_shot_long_prompt_is_never_reused_share():
    """A one-shot long prompt dominates the bytes but not the accesses (seed §9)."""
    rows = [{"timestamp": float(i), "input_tokens": 16, "output_tokens": 1, "block_ids": [1]} for i in range(9)]
    rows.append({"timestamp": 9.0, "input_tokens": 16 * 90, "output_tokens": 1, "block_ids": list(range(100, 190))})
    res = value_report(build_trace(rows, 16), model=TOY, gpu=TOY_GPU, horizon_s=INF, costs=HAND_COSTS)
    s = res.summary
    assert s["never_reused_blocks"] == 90
    assert s["never_reused_bytes_share"] == pytest.approx(90 / 91)
    assert s["never_reused_access_share"] == pytest.approx(90 / 99)
    assert s["no_reuse_in_horizon_access_share"] == pytest.approx(91 / 99)  # + the hot block's last access
    # the one-shot family costs its writes; the hot block's family is the most valuable
    top = res.per_prefix.row(0, named=True)
    assert top["root_hash"] == 1 and top["total_value_usd"] > 0
    last = res.per_prefix.row(1, named=True)
    assert last["root_hash"] == 100 and last["blocks"] == 90 and last["never_reused_bytes"] == last["bytes"]
    assert last["total_value_usd"] == pytest.approx(-90 * 64 * 0.5)  # writes only: H = inf holds nothing


# ------------------------------------------------------------------ edges and plumbing


def test_trace_without_accesses():
    rows = [{"timestamp": 0.0, "input_tokens": 0, "output_tokens": 5, "block_ids": []}] * 2
    res = value_report(build_trace(rows, 16), model=TOY, gpu=TOY_GPU)
    assert res.per_block.height == 0 and res.per_prefix.height == 0
    assert res.per_block.schema["hash"] == pl.UInt64 and res.per_prefix.schema["root_hash"] == pl.UInt64
    s = res.summary
    assert s["accesses"] == 0 and s["never_reused_bytes_share"] is None and s["total_value_usd"] == 0
    assert all(v is None for v in s["value_usd_per_byte_quantiles"].values())


def test_one_access():
    rows = [{"timestamp": 3.0, "input_tokens": 3, "output_tokens": 1, "block_ids": [7]}]
    res = value_report(build_trace(rows, 4), model=TOY, gpu=TOY_GPU, horizon_s=2.0, costs=HAND_COSTS)
    fr = res.future
    assert fr.next_t.tolist() == [-1] and fr.next_gap_s.tolist() == [INF] and fr.reuses.tolist() == [0]
    # 3 tokens occupy 12 bytes: write 6, held 2 s at 0.1 $/B/s
    assert fr.value_usd.tolist() == pytest.approx([-(6 + 2.4)])
    assert res.summary["never_reused_bytes_share"] == 1.0 and res.summary["clairvoyant_bound_usd"] == 0


def test_parse_horizon():
    assert parse_horizon(None) == DEFAULT_HORIZON_S == 3600.0
    assert parse_horizon("2h") == 7200.0 and parse_horizon("250ms") == 0.25 and parse_horizon(0) == 0.0
    assert parse_horizon("inf") == INF and parse_horizon(INF) == INF
    for bad in (-1.0, float("nan"), "soon", "-5s", True):
        with pytest.raises(UsageError):
            parse_horizon(bad)


def test_costs_validation_and_units():
    with pytest.raises(UsageError):
        StorageCosts(write_dollars_per_byte=-1.0)
    with pytest.raises(UsageError):
        StorageCosts(occupancy_dollars_per_byte_second=float("inf"))
    with pytest.raises(UsageError):
        StorageCosts.per_tb(write_dollars_per_tb=-0.1)
    c = StorageCosts.per_tb(write_dollars_per_tb=2.0, read_dollars_per_tb=1.0, occupancy_dollars_per_tb_month=730 * 3.6)
    assert c.write_dollars_per_byte == pytest.approx(2e-12) and c.read_dollars_per_byte == pytest.approx(1e-12)
    assert c.occupancy_dollars_per_byte_second == pytest.approx(1e-15)  # 730 x 3.6 $/TB-month = 1 $/TB-ks
    d = DEFAULT_COSTS.to_dict()
    assert d["occupancy_dollars_per_tb_month"] == pytest.approx(20.0)
    assert d["write_dollars_per_tb"] == pytest.approx(0.2) and d["read_dollars_per_tb"] == 0


def test_future_argument_checks():
    tr = build_trace(HAND_ROWS, 4)
    fr = future_reuse(tr, model=TOY, gpu=TOY_GPU, horizon_s=5.0, costs=HAND_COSTS)
    assert value_report(tr, future=fr).summary["total_value_usd"] == pytest.approx(48.8)
    with pytest.raises(UsageError):
        value_report(tr, future=fr, horizon_s=5.0)
    with pytest.raises(UsageError):
        value_report(build_trace(HAND_ROWS[:2], 4), future=fr)
    with pytest.raises(UsageError):
        future_reuse(tr, model=TOY, gpu=TOY_GPU, costs={"write_dollars_per_byte": 1})
    with pytest.raises(KvtraceError):
        future_reuse(tr, model=TOY, gpu=TOY_GPU, horizon_s=-1)


def test_outputs_round_trip(hand, tmp_path):
    """Tables go through write_table (Parquet / JSON) and the summary through JSON."""
    for name, df in (("block", hand.per_block), ("prefix", hand.per_prefix), ("access", hand.future.table())):
        write_table(df, tmp_path / f"{name}.parquet", metadata=hand.summary)
        back = pl.read_parquet(tmp_path / f"{name}.parquet")
        assert back.equals(df), name
        write_table(df, tmp_path / f"{name}.json", metadata=hand.summary)
        rows = json.loads((tmp_path / f"{name}.json").read_text())["rows"]
        assert len(rows) == df.height
    assert hand.future.table().columns[:3] == ["t", "block", "timestamp"]
    inf = value_report(build_trace(HAND_ROWS, 4), model=TOY, gpu=TOY_GPU, horizon_s=INF, costs=HAND_COSTS)
    write_json_atomic(tmp_path / "value.json", inf.to_dict())
    got = json.loads((tmp_path / "value.json").read_text())
    assert got["summary"]["horizon_s"] is None  # infinite
    assert [r["root_hash"] for r in got["top_prefixes"]] == [10, 30]


def test_weighted_quantiles_in_chunks_equal_one_cumulative_sum():
    """The cumulative weight made chunk by chunk gives np.cumsum's quantiles: values
    with many ties, weights from 0 to 2**40 (their float sums round)."""
    rng = np.random.default_rng(7)
    for n in (1, 2, 9, 100, 1_000):
        x = rng.integers(-5, 5, n) / 3.0
        w = rng.integers(0, 2, n) * rng.integers(1, 2**40, n)
        if w.sum() == 0:
            w[0] = 1
        order = np.argsort(x, kind="stable")
        cum = np.cumsum(w[order].astype(np.float64))
        want = {f"p{round(100 * q)}": float(x[order[min(int(np.searchsorted(cum, q * cum[-1], side="left")), n - 1)]])
                for q in QUANTILES}
        for chunk in (1, 3, 8, n, n + 5):
            assert weighted_quantiles(x, w.__getitem__, int(w.sum()), QUANTILES, chunk) == want, (n, chunk)
    assert weighted_quantiles(np.zeros(3), np.zeros(3, np.int64).__getitem__, 0, QUANTILES)["p50"] is None
