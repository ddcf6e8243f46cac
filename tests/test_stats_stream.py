"""Streamed ``kvtrace stats`` (kvtrace.analyses.stats on a StreamedTrace) equals the in-memory run bit for bit.

Traces are Parquet tables in many row groups, and the streamed passes run on chunks of
a few thousand accesses (``CHUNK_ACCESSES`` shrunk), so every carried state (block
visits, per-group counts and bits, the reuse-time spill) crosses many chunk
boundaries. Comparisons are exact: dicts with ``==``, tables with
``assert_frame_equal(check_exact=True)``. The pieces that stand in for numpy on values
read in chunks (kvtrace.analyses.stats: the out-of-core order statistics, numpy's
percentile interpolation from them, the sum in a fixed order) are checked against numpy
directly.
"""

from __future__ import annotations

import functools
import json

import naive
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from numpy.testing import assert_array_equal
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

import kvtrace.ingest.stream as stream_mod
from kvtrace.trace import source as source_mod
from kvtrace.ingest import synth
from kvtrace.cli import app
from kvtrace.errors import UsageError
from kvtrace.ingest import load_trace
from kvtrace.ingest.canonical import METADATA_KEY, conform
from kvtrace.kernels.reuse import visit_blocks
from kvtrace.analyses.stats import (PERCENTILES, STREAM_COLUMNS, linear_percentile, order_statistics,
                                    percentile_ranks, trace_stats)
from kvtrace.ingest.stream import open_stream
from kvtrace.trace import TraceMeta

CHUNK = 1_000
should_stream = functools.partial(stream_mod.should_stream, workload="stats")  # as `kvtrace stats` decides


def file_reader(path, n, chunk):
    """A read() for order_statistics: the n float64 values of a file, chunk at a time."""
    def read():
        with open(path, "rb") as fh:
            for lo in range(0, n, chunk):
                yield np.fromfile(fh, dtype=np.float64, count=min(chunk, n - lo))
    return read


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(source_mod, "CHUNK_ACCESSES", CHUNK)


def write_random_canonical(path, n, seed, *, block_tokens=16, tenants=("a", "b", "c"), types=("chat", "rag"),
                           row_group=64):
    """A canonical Parquet trace: timestamps with ties and repeated gaps (equal reuse
    times), chained hashes from a small pool of prefixes, empty requests, null
    sessions / types / tenants, and labels whose requests have no blocks."""
    rng = np.random.default_rng(seed)
    ts = np.cumsum(rng.choice([0.0, 0.0, 0.5, 1.0, 2.25, 60.0], size=n))
    rows = []
    for i in range(n):
        k = int(rng.integers(0, 9)) if rng.random() > 0.05 else 0
        doc = int(rng.integers(0, 25))
        hashes = [doc * 1_000 + j if rng.random() < 0.85 else int(rng.integers(1 << 40, 1 << 63)) for j in range(k)]
        n_in = block_tokens * (k - 1) + int(rng.integers(1, block_tokens + 1)) if k else 0
        tenant = None if rng.random() < 0.2 else tenants[int(rng.integers(0, len(tenants)))]
        kind = None if rng.random() < 0.1 else types[int(rng.integers(0, len(types)))]
        rows.append({
            "request_id": i, "timestamp": float(ts[i]),
            "session_id": None if rng.random() < 0.3 else int(rng.integers(0, n // 4 + 1)),
            "parent_id": None, "turn": None, "type": kind, "tenant": tenant,
            "input_tokens": n_in, "output_tokens": int(rng.integers(0, 500)), "block_ids": hashes,
        })
    rows.append({**rows[-1], "request_id": n, "timestamp": float(ts[-1]) + 1, "tenant": "idle", "type": "idle",
                 "input_tokens": 0, "block_ids": []})  # a label with requests but no accesses
    df = conform(pl.DataFrame(rows, schema_overrides={"block_ids": pl.List(pl.UInt64)}))
    meta = TraceMeta(block_tokens=block_tokens, source_format="canonical", source=path.name)
    md = {METADATA_KEY.decode(): json.dumps({"version": 1, **meta.to_dict()}, sort_keys=True)}
    df.write_parquet(path, row_group_size=row_group, metadata=md)
    return path


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A synthetic mixed trace (tenants, types, sessions, partial blocks), 400-request row groups."""
    path = tmp_path_factory.mktemp("stats_stream") / "mixed.parquet"
    synth.write_chunked("mixed", 2_500, 11, path, "parquet", chunk_requests=400)
    return path


def streamed_stats(path, model=None, min_chunks=4, **options):
    with open_stream(path, columns=STREAM_COLUMNS, **options) as st:
        assert len(list(st._chunks(source_mod.CHUNK_ACCESSES))) >= min_chunks or st.n_accesses <= CHUNK
        result = trace_stats(st, model)
        assert not (st.spill / "column-stats-reuse-times").exists()  # its disk is freed at once
    return result


def assert_same_stats(a, b):
    assert a.summary == b.summary
    assert_frame_equal(a.lengths, b.lengths, check_exact=True)
    assert_frame_equal(a.top_prefixes, b.top_prefixes, check_exact=True)
    assert list(a.groups) == list(b.groups)
    for k in a.groups:
        assert_frame_equal(a.groups[k], b.groups[k], check_exact=True)
    assert json.dumps(a.to_dict()) == json.dumps(b.to_dict())


# ------------------------------------------------------------- whole figures
@pytest.mark.parametrize("model", [None, "Llama-3.1-8B"])
def test_streamed_stats_equal_in_memory_on_a_mixed_trace(mixed, model):
    expected = trace_stats(load_trace(mixed), model)
    got = streamed_stats(mixed, model)
    assert_same_stats(expected, got)
    assert set(got.groups) == {"type", "tenant"} and got.summary["sessions"]
    assert got.lengths.row(2, named=True)["count"] > 10 * CHUNK  # the reuse times span many chunks


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_streamed_stats_equal_in_memory_on_random_traces(tmp_path, seed):
    path = write_random_canonical(tmp_path / "r.parquet", 1_500, seed)
    got = streamed_stats(path)
    assert_same_stats(trace_stats(load_trace(path)), got)
    groups = got.groups["tenant"]
    assert groups.filter(pl.col("tenant") == "idle")["block_accesses"].to_list() == [0]


def test_more_groups_than_one_pass_of_bits(tmp_path):
    """70 tenants + 4 types: the distinct blocks per group take two passes of 64 bits."""
    path = write_random_canonical(tmp_path / "t.parquet", 2_000, 4, tenants=[f"t{i:02d}" for i in range(70)],
                                  types=("a", "b", "c"))
    got = streamed_stats(path)
    assert got.groups["tenant"].height == 72  # 70, (none) and idle
    assert_same_stats(trace_stats(load_trace(path)), got)


@pytest.mark.parametrize("share", [False, True])
def test_generic_table_and_shared_tenants(tmp_path, share):
    """A generic table (no output tokens, sessions or types) with --share-tenants or not."""
    rng = np.random.default_rng(7)
    ts = np.cumsum(rng.integers(0, 400, 900))
    hashes = [[int(rng.integers(0, 40)) * 1_000 + j for j in range(int(rng.integers(0, 12)))] for _ in range(900)]
    path = tmp_path / "g.parquet"
    pq.write_table(pa.table({
        "ts_ms": pa.array(ts, pa.int64()),
        "input_length": pa.array([max(16 * len(h) - int(rng.integers(0, 16)), 0) for h in hashes], pa.int64()),
        "tenant": pa.array([["a", "b", None][int(rng.integers(0, 3))] for _ in range(900)], pa.string()),
        "hash_ids": pa.array(hashes, pa.list_(pa.uint64())),
    }), path, row_group_size=128)
    expected = trace_stats(load_trace(path, block_tokens=16, share_tenants=share))
    got = streamed_stats(path, block_tokens=16, share_tenants=share)
    assert_same_stats(expected, got)
    assert list(got.groups) == ["tenant"]


def test_one_chunk_and_many_chunks_agree(mixed, monkeypatch):
    many = streamed_stats(mixed)
    monkeypatch.setattr(source_mod, "CHUNK_ACCESSES", 10**9)
    assert_same_stats(many, streamed_stats(mixed, min_chunks=1))


@pytest.mark.parametrize("blocks", [[[], []], [[7], [8], [9]]])
def test_no_accesses_or_no_reuse(tmp_path, blocks):
    rows = [{"request_id": i, "timestamp": float(i), "input_tokens": 16 * len(b), "output_tokens": 1,
             "block_ids": b} for i, b in enumerate(blocks)]
    df = conform(pl.DataFrame(rows, schema_overrides={"block_ids": pl.List(pl.UInt64)}))
    meta = TraceMeta(block_tokens=16, source_format="canonical", source="e.parquet")
    path = tmp_path / "e.parquet"
    df.write_parquet(path, metadata={METADATA_KEY.decode(): json.dumps({"version": 1, **meta.to_dict()})})
    got = streamed_stats(path)
    assert_same_stats(trace_stats(load_trace(path)), got)
    assert got.lengths.row(2, named=True)["count"] == 0 and got.top_prefixes.height == 0


def test_a_stream_without_the_request_columns_is_refused(mixed):
    with open_stream(mixed) as st, pytest.raises(ValueError, match="STREAM_COLUMNS"):
        trace_stats(st)


def test_top_prefixes_ranked_in_chunks_equal_one_ranking(mixed):
    """The blocks ranked a few at a time (each chunk's best, then the best of those)
    give the ranking of all at once, ties by block id included."""
    from kvtrace.analyses.stats import _access_figures, _top_prefixes

    trace = load_trace(mixed)
    fig = _access_figures(trace, [], None)
    for top in (1, 10, 60, trace.n_blocks):
        want = _top_prefixes(trace, fig, 4, top, chunk=10**9)
        assert want.height == min(top, int(np.count_nonzero((fig.count > 1) & ~fig.dominated)))
        for chunk in (1, 7, 64, trace.n_blocks - 1):
            assert_frame_equal(_top_prefixes(trace, fig, 4, top, chunk=chunk), want, check_exact=True)


# ------------------------------------------------------------------- pieces
def test_visit_blocks_matches_its_twin_in_any_chunking():
    rng = np.random.default_rng(5)
    for n, m in [(0, 1), (1, 1), (50, 1), (400, 30), (3_000, 2_000)]:
        block = rng.integers(0, m, n).astype(np.int64)
        request = np.sort(rng.integers(0, max(n // 3, 1), n)).astype(np.int32)
        pos = rng.integers(0, 9, n).astype(np.int32)
        want = naive.visit_blocks(block, request, pos, m)
        for kernel, count_dtype in ((visit_blocks, np.int64), (visit_blocks, np.int32),
                                    (visit_blocks.py_func, np.int64)):
            cuts = np.unique(np.r_[0, np.sort(rng.integers(0, n + 1, 5)), n])
            count, fpos = np.zeros(m, count_dtype), np.full(m, -1, np.int32)
            first, last = np.full(m, -1, np.int32), np.full(m, -1, np.int32)
            prev = np.empty(n, np.int32)
            for lo, hi in zip(cuts[:-1], cuts[1:]):
                kernel(block[lo:hi], request[lo:hi], pos[lo:hi], count, first, fpos, last, prev[lo:hi])
            for got, exp in zip((prev, count, first, fpos, last), want):
                assert_array_equal(got, exp)


def test_block_sum_is_one_order_whatever_the_pieces(monkeypatch):
    """np.sum of all values up to SUM_BLOCK of them; beyond, np.sum of the runs' np.sums, for any cutting."""
    import kvtrace.analyses.stats as stats_mod

    rng = np.random.default_rng(3)
    cases = []
    for n in (0, 1, 7, 128, 129, 1_000, 4_097):
        x = rng.random(n) * 10.0 ** rng.integers(-3, 4, n)
        cuts = np.unique(np.r_[0, rng.integers(0, n + 1, 6), n])
        cases.append((x, [x[lo:hi] for lo, hi in zip(cuts[:-1], cuts[1:])]))
    for x, pieces in cases:
        assert stats_mod.block_sum(iter(pieces)) == float(np.sum(x)) == stats_mod.block_sum([x]), x.size
    monkeypatch.setattr(stats_mod, "SUM_BLOCK", 100)
    for x, pieces in cases:
        want = float(np.sum(np.array([np.sum(x[lo:lo + 100]) for lo in range(0, x.size, 100)])))
        assert stats_mod.block_sum(iter(pieces)) == want == stats_mod.block_sum([x]), x.size


@pytest.mark.parametrize("p", [*PERCENTILES, 0, 0.1, 12.5, 33.3, 50.5, 66.7, 99.99, 100])
def test_linear_percentile_is_numpys(p):
    """numpy's interpolation from the order statistics, over every n up to 400 and random larger ones."""
    rng = np.random.default_rng(int(p * 100))
    ns = [*range(1, 401), *rng.integers(401, 10**6, 40).tolist()]
    for n in ns:
        x = np.sort(rng.choice([rng.random(n) * 1e3, rng.integers(0, 5, n) * 0.1, rng.random(n) * 1e-300],
                               p=[0.6, 0.3, 0.1]) if n < 2_000 else rng.random(n) * 1e5)
        value = {k: x[k] for k in percentile_ranks(n, [p])}
        assert linear_percentile(n, p, value) == float(np.percentile(x, p)), (n, p)


def test_linear_percentile_is_numpys_on_adversarial_values():
    rng = np.random.default_rng(9)
    for _ in range(4_000):
        n = int(rng.integers(1, 50))
        x = np.sort(rng.choice([0.0, 1e-3, 0.1, 1 / 3, 2.0, 1e17, 3e300], size=n))
        for p in PERCENTILES:
            value = {k: x[k] for k in percentile_ranks(n, [p])}
            assert linear_percentile(n, p, value) == float(np.percentile(x, p)), (x, p)


@pytest.mark.parametrize("kind", ["uniform", "ties", "one value", "signed", "tiny and huge"])
@pytest.mark.parametrize("limit", [1, 7, 10**9])
def test_order_statistics_out_of_core(tmp_path, kind, limit):
    rng = np.random.default_rng(len(kind) + limit)
    n = 5_000
    x = {
        "uniform": rng.random(n) * 100,
        "ties": rng.integers(0, 4, n) * 0.25,  # a quarter of the values are equal: refines to all 64 bits
        "one value": np.full(n, 3.5),
        "signed": rng.normal(size=n) * np.where(rng.random(n) < 0.1, 0.0, 1.0) * 1e5,
        "tiny and huge": np.r_[rng.random(n // 2) * 1e-310, rng.random(n - n // 2) * 1e300],
    }[kind]
    rng.shuffle(x)
    path = tmp_path / "v"
    x.tofile(path)
    ranks = [0, 1, 17, n // 2, n // 2 + 1, n - 2, n - 1]
    got = order_statistics(file_reader(path, n, 333), n, ranks, chunk=333, limit=limit)
    assert got == {k: float(v) for k, v in zip(ranks, np.sort(x)[ranks])}
    for p in PERCENTILES:
        value = order_statistics(file_reader(path, n, 333), n, percentile_ranks(n, [p]), chunk=333, limit=limit)
        assert linear_percentile(n, p, value) == float(np.percentile(x, p))


def test_order_statistics_of_nan_and_bad_ranks(tmp_path):
    path = tmp_path / "v"
    np.array([1.0, np.nan, 2.0]).tofile(path)
    assert all(np.isnan(v) for v in order_statistics(file_reader(path, 3, 2), 3, [0, 2], chunk=2).values())
    assert np.isnan(np.percentile([1.0, np.nan, 2.0], 50))
    with pytest.raises(ValueError, match="ranks"):
        order_statistics(file_reader(path, 3, 2), 3, [3], chunk=2)


# ---------------------------------------------------------------------- CLI
def test_cli_stats_stream_equals_no_stream(mixed, tmp_path):
    runner = CliRunner()
    out = {}
    for flag in ("--no-stream", "--stream"):
        res = runner.invoke(app, ["stats", str(mixed), flag, "--json", "-", "--model", "Llama-3.1-8B"])
        assert res.exit_code == 0, (res.stdout, res.stderr, res.exception)
        table = runner.invoke(app, ["stats", str(mixed), flag], env={"COLUMNS": "200"})
        assert table.exit_code == 0, (table.stdout, table.stderr, table.exception)
        out[flag] = (json.loads(res.stdout), table.stdout, res.stderr)
    assert out["--stream"][:2] == out["--no-stream"][:2]
    assert "streaming" in out["--stream"][2] and "streaming" not in out["--no-stream"][2]
    assert out["--stream"][0]["lengths"][2]["count"] > 0


def test_cli_stats_streams_by_itself_over_the_budget(mixed, monkeypatch, tmp_path):
    runner = CliRunner()
    expected = json.loads(runner.invoke(app, ["stats", str(mixed), "--no-stream", "--json", "-"]).stdout)
    n = stream_mod.in_memory_estimate(mixed) // stream_mod.IN_MEMORY_BYTES_PER_ACCESS
    # between a curve's 80 and the stats' 134 bytes per access: a curve would not stream, stats does
    monkeypatch.setenv(stream_mod.MEMORY_BUDGET_ENV, f"{100 * n}B")
    assert not stream_mod.should_stream(mixed) and should_stream(mixed)
    res = runner.invoke(app, ["stats", str(mixed), "--json", "-"])
    assert res.exit_code == 0, (res.stdout, res.stderr, res.exception)
    assert "streaming" in res.stderr
    assert json.loads(res.stdout) == expected
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n')
    assert not should_stream(jsonl)
    with pytest.raises(UsageError, match="Parquet"):
        should_stream(jsonl, stream=True)
    res = runner.invoke(app, ["stats", str(jsonl), "--stream"])
    assert res.exit_code == 2 and "Parquet" in res.stderr and "Traceback" not in res.stderr


def test_cli_stats_stream_removes_its_spill_dir(mixed, tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    res = CliRunner().invoke(app, ["stats", str(mixed), "--stream", "--json", "-"])
    assert res.exit_code == 0, (res.stdout, res.stderr, res.exception)
    assert not list(tmp_path.glob("kvtrace-stream-*"))
