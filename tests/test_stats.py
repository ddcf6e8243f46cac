"""Trace statistics (kvtrace.analyses.stats.trace_stats) against independent computations.

The twins below are plain Python passes over the request rows (dicts, sets, sorted
lists), written from DESIGN §1 without kvtrace code: trace order is the stable sort
by timestamp, a block's tokens follow the partial-last-block rule, and a tenant is a
namespace for hashes.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from kvtrace.ingest import load_trace
from kvtrace.ingest.canonical import requests_to_trace
from kvtrace.model import resolve_model
from kvtrace.analyses.stats import PERCENTILES, trace_stats
from kvtrace.trace import TraceMeta

ROOT = Path(__file__).resolve().parent.parent
MIXED = ROOT / "sample_traces" / "mixed.parquet"
B = 512
LLAMA8 = 131072  # Llama-3.1-8B fp16: 32 x 8 x 128 x 2 x 2

# A hand-made Mooncake trace: (timestamp ms, input_length, output_length, hash_ids).
# - request "R3" arrives out of file order (65 s, between R1 and R2);
# - block 2 is always followed by block 3 (same count): a dominated ancestor;
# - block 3 is accessed with 512 and 376 tokens (it occupies 512 in a cache);
# - block 5 is a one-block prompt of 100 tokens, reused twice.
HAND = [
    (0, 1536, 10, [1, 2, 3]),
    (30_000, 1800, 20, [1, 2, 3, 4]),
    (70_000, 1400, 30, [1, 2, 3]),
    (65_000, 600, 40, [1, 9]),
    (130_000, 100, 50, [5]),
    (135_000, 100, 60, [5]),
    (140_000, 100, 70, [5]),
]


def write_mooncake(path: Path, rows) -> Path:
    with open(path, "w") as fh:
        for ts, n_in, n_out, hashes in rows:
            fh.write(json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out,
                                 "hash_ids": hashes}) + "\n")
    return path


@pytest.fixture
def hand_trace(tmp_path):
    return load_trace(write_mooncake(tmp_path / "hand.jsonl", HAND))


# ----------------------------------------------------------------------- twin


def twin(rows, block_tokens, seconds_per_unit=1.0, tenants=None):
    """Everything trace_stats reports, from request rows by plain Python.

    rows: (timestamp, input_tokens, output_tokens, hashes); tenants: per-row namespace.
    """
    tenants = tenants or [None] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: rows[i][0])  # sorted() is stable
    ts_all = [rows[i][0] / 1000.0 if seconds_per_unit == 1e-3 else rows[i][0] for i in range(len(rows))]
    t0 = ts_all[order[0]]
    accesses = []  # (request position in trace order, pos, key, tokens, ts)
    for r, i in enumerate(order):
        _, n_in, _, hashes = rows[i]
        n = len(hashes)
        for j, h in enumerate(hashes):
            tok = block_tokens if j < n - 1 else min(max(n_in - block_tokens * (n - 1), 1), block_tokens)
            accesses.append((r, j, (tenants[i], h), tok, ts_all[i] - t0))
    last_ts, count, first, last, size = {}, defaultdict(int), {}, {}, defaultdict(int)
    reuse_times = []
    reref = []
    for t, (r, j, key, tok, ts) in enumerate(accesses):
        reref.append(key in last_ts)
        if key in last_ts:
            reuse_times.append(ts - last_ts[key])
        last_ts[key] = ts
        count[key] += 1
        first.setdefault(key, t)
        last[key] = t
        size[key] = max(size[key], tok)
    rel_ts = [ts_all[i] - t0 for i in order]
    minutes = defaultdict(int)
    for ts in rel_ts:
        minutes[math.floor(ts / 60.0)] += 1
    n_minutes = max(minutes) - min(minutes) + 1
    # top prefixes: a parent whose child has as many accesses is dominated
    dominated = set()
    for t, (r, j, key, tok, ts) in enumerate(accesses):
        if j > 0 and count[key] == count[accesses[t - 1][2]]:
            dominated.add(accesses[t - 1][2])
    prefixes = []
    for key, c in count.items():
        if c > 1 and key not in dominated:
            depth = accesses[first[key]][1] + 1
            ptok = (depth - 1) * block_tokens + size[key]
            prefixes.append(dict(key=key, depth_blocks=depth, prefix_tokens=ptok, accesses=c, reuses=c - 1,
                                 first_seen_s=accesses[first[key]][4], last_seen_s=accesses[last[key]][4],
                                 score=ptok * (c - 1), first=first[key]))
    prefixes.sort(key=lambda p: (-p["score"], p["first"]))
    return dict(
        order=order, accesses=accesses, reuse_times=reuse_times, reref=reref, size=size,
        requests=len(rows), block_accesses=len(accesses), distinct_blocks=len(count),
        duration=rel_ts[-1] - rel_ts[0], peak_per_minute=max(minutes.values()),
        mean_per_minute=len(rows) / n_minutes, input_tokens=sum(r[1] for r in rows),
        output_tokens=sum(r[2] for r in rows), accessed_tokens=sum(a[3] for a in accesses),
        distinct_tokens=sum(size.values()), rereference_share=sum(reref) / len(reref), prefixes=prefixes,
    )


# ---------------------------------------------------------------- hand trace


def test_hand_trace_summary(hand_trace):
    w = twin(HAND, B, seconds_per_unit=1e-3)
    s = trace_stats(hand_trace, "Llama-3.1-8B").summary
    # by hand first, so that the twin is checked too
    assert (w["requests"], w["block_accesses"], w["distinct_blocks"]) == (7, 15, 6)
    assert w["reuse_times"] == [30, 30, 30, 35, 5, 40, 40, 5, 5]
    assert w["peak_per_minute"] == 3 and w["duration"] == 140.0
    assert s["model"] == "Llama-3.1-8B" and s["kv_bytes_per_token"] == LLAMA8
    assert s["source_format"] == "mooncake" and s["block_tokens"] == B and s["source"] == "hand.jsonl"
    assert s["requests"] == 7
    assert s["block_accesses"] == 15
    assert s["distinct_blocks"] == 6
    assert s["duration_s"] == 140.0
    assert s["arrival_rate_per_s"] == 7 / 140
    assert s["peak_arrivals_per_minute"] == 3
    assert s["mean_arrivals_per_minute"] == 7 / 3
    assert s["input_tokens"] == 1536 + 1800 + 1400 + 600 + 300
    assert s["output_tokens"] == 280
    # 512-token blocks except the last: 264 (1800), 376 (1400), 88 (600), 100 (x3)
    assert s["accessed_kv_bytes"] == (9 * 512 + 264 + 376 + 88 + 300) * LLAMA8 == w["accessed_tokens"] * LLAMA8
    # blocks 1, 2, 3 (512 and 376: 512), 4 (264), 9 (88), 5 (100)
    assert s["distinct_kv_bytes"] == (3 * 512 + 264 + 88 + 100) * LLAMA8 == w["distinct_tokens"] * LLAMA8
    assert s["rereference_share"] == 9 / 15
    assert s["sessions"] is None  # Mooncake has no sessions
    assert len(s["warnings"]) == 1 and "not monotonic" in s["warnings"][0]


def test_hand_trace_reuse_time_percentiles(hand_trace):
    st = trace_stats(hand_trace)
    rows = {r["quantity"]: r for r in st.lengths.to_dicts()}
    assert list(rows) == ["input_tokens", "output_tokens", "reuse_time_s"]
    reuse = sorted([30.0, 30.0, 30.0, 35.0, 5.0, 40.0, 40.0, 5.0, 5.0])

    def pct(xs, p):  # linear interpolation between closest ranks (numpy's default)
        k = (len(xs) - 1) * p / 100.0
        lo, hi = math.floor(k), math.ceil(k)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    r = rows["reuse_time_s"]
    assert r["count"] == 9
    assert r["mean"] == pytest.approx(220 / 9, rel=1e-15)
    assert r["p50"] == 30.0
    for p in PERCENTILES:
        assert r[f"p{p:g}"] == pytest.approx(pct(reuse, p), rel=1e-12), p
    assert r["p90"] == pytest.approx(40.0) and r["p99.9"] == pytest.approx(40.0)
    inputs = sorted(float(x[1]) for x in HAND)
    assert rows["input_tokens"]["count"] == 7
    assert rows["input_tokens"]["mean"] == pytest.approx(sum(inputs) / 7, rel=1e-15)
    assert rows["input_tokens"]["p50"] == 600.0
    assert rows["output_tokens"]["p50"] == 40.0
    for p in PERCENTILES:
        assert rows["input_tokens"][f"p{p:g}"] == pytest.approx(pct(inputs, p), rel=1e-12)


def test_hand_trace_top_prefixes(hand_trace):
    top = trace_stats(hand_trace, "Llama-3.1-8B").top_prefixes
    # block 3 (3 blocks deep, 1536 tokens, 2 reuses) > block 1 (512, 3) > block 5 (100, 2).
    # Block 2 (1024 tokens x 2 reuses = 2048 would rank second) is always followed by
    # block 3: its every use continues into the longer prefix, so it is left out.
    assert top["hash"].to_list() == [3, 1, 5]
    assert top["depth_blocks"].to_list() == [3, 1, 1]
    assert top["prefix_tokens"].to_list() == [1536, 512, 100]
    assert top["prefix_bytes"].to_list() == [1536 * LLAMA8, 512 * LLAMA8, 100 * LLAMA8]
    assert top["accesses"].to_list() == [3, 4, 3]
    assert top["reuses"].to_list() == [2, 3, 2]
    assert top["first_seen_s"].to_list() == [0.0, 0.0, 130.0]
    assert top["last_seen_s"].to_list() == [70.0, 70.0, 140.0]
    assert top["bytes_x_reuses"].to_list() == [1536.0 * LLAMA8 * 2, 512.0 * LLAMA8 * 3, 100.0 * LLAMA8 * 2]
    w = twin(HAND, B, seconds_per_unit=1e-3)
    assert [p["key"][1] for p in w["prefixes"]] == [3, 1, 5]
    assert trace_stats(hand_trace, "Llama-3.1-8B", top=2).top_prefixes["hash"].to_list() == [3, 1]


def test_top_prefixes_an_ancestor_with_other_uses_is_kept():
    # 1 -> 2 in three requests, 1 alone in a fourth: block 1 is not dominated.
    rows = pl.DataFrame({
        "request_id": [0, 1, 2, 3], "timestamp": [0.0, 1.0, 2.0, 3.0],
        "input_tokens": [8, 8, 8, 4], "output_tokens": [0, 0, 0, 0],
        "block_ids": [[1, 2], [1, 2], [1, 2], [1]],
    })
    trace = requests_to_trace(rows, TraceMeta(block_tokens=4, source_format="parquet"))
    top = trace_stats(trace, resolve_model("Llama-3.1-8B")).top_prefixes
    assert top["hash"].to_list() == [2, 1]  # 8 tokens x 2 reuses, 4 tokens x 3 reuses
    assert top["bytes_x_reuses"].to_list() == [16.0 * LLAMA8, 12.0 * LLAMA8]
    # drop the fourth request: now every use of 1 continues into 2
    top = trace_stats(requests_to_trace(rows.head(3), TraceMeta(block_tokens=4, source_format="parquet")),
                      "Llama-3.1-8B").top_prefixes
    assert top["hash"].to_list() == [2]


def test_top_prefixes_none_when_nothing_is_reused():
    rows = pl.DataFrame({"request_id": [0, 1], "timestamp": [0.0, 1.0], "input_tokens": [8, 8],
                         "output_tokens": [1, 1], "block_ids": [[1, 2], [3, 4]]})
    st = trace_stats(requests_to_trace(rows, TraceMeta(block_tokens=4, source_format="parquet")))
    assert st.top_prefixes.height == 0
    assert st.summary["rereference_share"] == 0.0
    reuse = st.lengths.filter(pl.col("quantity") == "reuse_time_s").row(0, named=True)
    assert reuse["count"] == 0 and reuse["mean"] is None and reuse["p50"] is None
    json.dumps(st.to_dict())  # serialisable as is


def test_default_model_is_llama_70b(hand_trace):
    s = trace_stats(hand_trace).summary
    assert s["model"] == "Llama-3.1-70B" and s["kv_bytes_per_token"] == 327680
    assert s["distinct_kv_bytes"] == (3 * 512 + 264 + 88 + 100) * 327680


def test_sessions_ignore_requests_without_one():
    rows = pl.DataFrame({
        "request_id": [0, 1, 2, 3], "timestamp": [0.0, 1.0, 2.0, 3.0], "session_id": [7, None, 7, 8],
        "input_tokens": [4, 4, 4, 4], "output_tokens": [1, 1, 1, 1], "block_ids": [[1], [1], [2], [3]],
    })
    trace = requests_to_trace(rows, TraceMeta(block_tokens=4, source_format="parquet"))
    assert trace_stats(trace).summary["sessions"] == 2  # 7 and 8; a missing id is no session


def test_group_rows_are_ordered_by_requests_then_name():
    rows = pl.DataFrame({
        "request_id": list(range(6)), "timestamp": [float(i) for i in range(6)],
        "type": ["d", "b", "a", "c", "b", "e"], "input_tokens": [4] * 6, "output_tokens": [1] * 6,
        "block_ids": [[1], [1], [2], [3], [2], [1]],
    })
    trace = requests_to_trace(rows, TraceMeta(block_tokens=4, source_format="parquet"))
    for _ in range(5):  # a hash-ordered group_by would shuffle the ties
        g = trace_stats(trace).groups["type"]
        assert g["type"].to_list() == ["b", "a", "c", "d", "e"]
    assert g.row(0, named=True) == {"type": "b", "requests": 2, "mean_input_tokens": 4.0,
                                    "mean_output_tokens": 1.0, "block_accesses": 2, "rereference_share": 1.0,
                                    "distinct_blocks": 2}
    assert "tenant" not in trace_stats(trace).groups


# ---------------------------------------------------------------- mixed.parquet


@pytest.fixture(scope="module")
def mixed():
    return load_trace(MIXED), pl.read_parquet(MIXED)


@pytest.mark.parametrize("col", ["type", "tenant"])
def test_mixed_group_rows_match_twin(mixed, col):
    trace, raw = mixed
    st = trace_stats(trace)
    req = raw.sort("timestamp", maintain_order=True).to_dicts()
    seen = set()
    acc = defaultdict(lambda: {"requests": 0, "in": 0, "out": 0, "accesses": 0, "reref": 0, "blocks": set()})
    for r in req:
        g = acc[r[col]]
        g["requests"] += 1
        g["in"] += r["input_tokens"]
        g["out"] += r["output_tokens"]
        for h in r["block_ids"]:
            key = (r["tenant"], h)  # tenants are namespaces
            g["accesses"] += 1
            g["reref"] += key in seen
            g["blocks"].add(key)
            seen.add(key)
    got = st.groups[col]
    assert got.columns == [col, "requests", "mean_input_tokens", "mean_output_tokens", "block_accesses",
                           "rereference_share", "distinct_blocks"]
    want_order = sorted(acc, key=lambda k: (-acc[k]["requests"], k))
    assert got[col].to_list() == want_order
    for row in got.to_dicts():
        g = acc[row[col]]
        assert row["requests"] == g["requests"]
        assert row["mean_input_tokens"] == pytest.approx(g["in"] / g["requests"], rel=1e-12)
        assert row["mean_output_tokens"] == pytest.approx(g["out"] / g["requests"], rel=1e-12)
        assert row["block_accesses"] == g["accesses"]
        assert row["rereference_share"] == pytest.approx(g["reref"] / g["accesses"], rel=1e-12)
        assert row["distinct_blocks"] == len(g["blocks"])
    assert sum(got["requests"]) == trace.n_requests == 3000
    assert sum(got["block_accesses"]) == trace.n_accesses


def test_mixed_summary_matches_twin(mixed):
    trace, raw = mixed
    rows = [(r["timestamp"], r["input_tokens"], r["output_tokens"], r["block_ids"]) for r in raw.to_dicts()]
    w = twin(rows, 512, tenants=raw["tenant"].to_list())
    s = trace_stats(trace, "Llama-3.1-8B").summary
    assert s["requests"] == w["requests"] == 3000
    assert s["block_accesses"] == w["block_accesses"]
    assert s["distinct_blocks"] == w["distinct_blocks"]
    assert s["rereference_share"] == pytest.approx(w["rereference_share"], rel=1e-12)
    assert s["distinct_kv_bytes"] == w["distinct_tokens"] * LLAMA8
    assert s["accessed_kv_bytes"] == w["accessed_tokens"] * LLAMA8
    assert s["peak_arrivals_per_minute"] == w["peak_per_minute"]
    assert s["sessions"] == raw["session_id"].n_unique()
    assert s["source_format"] == "canonical"
    top = trace_stats(trace, "Llama-3.1-8B").top_prefixes
    want = w["prefixes"][:10]
    assert top["hash"].to_list() == [p["key"][1] for p in want]
    assert top["prefix_tokens"].to_list() == [p["prefix_tokens"] for p in want]
    assert top["reuses"].to_list() == [p["reuses"] for p in want]
    assert top["first_seen_s"].to_list() == pytest.approx([p["first_seen_s"] for p in want], abs=1e-9)
    reuse = trace_stats(trace).lengths.filter(pl.col("quantity") == "reuse_time_s").row(0, named=True)
    assert reuse["count"] == len(w["reuse_times"])
    assert reuse["p50"] == pytest.approx(float(np.percentile(w["reuse_times"], 50)), abs=1e-9)
