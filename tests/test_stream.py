"""Streaming (kvtrace.ingest.stream, kvtrace.ingest.chunks): chunked runs equal in-memory runs bit for bit.

Traces are synthetic Parquet tables written in many row groups, and the second pass
runs on chunks of a few thousand accesses, so every carried state (dense-id map,
stack kernel, histogram sums, request keys, knee reader) crosses many chunk
boundaries. Every comparison is exact: arrays with ``assert_array_equal``, tables
with ``assert_frame_equal(check_exact=True)``, dicts with ``==``.
"""

from __future__ import annotations

import json

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
from kvtrace.analyses.curves import compute_curve
from kvtrace.errors import KvtraceError, UsageError
from kvtrace.ingest import load_trace
from kvtrace.ingest.chunks import ParquetRequests
from kvtrace.ingest.stream import in_memory_estimate, open_stream, should_stream

EVICTIONS = ("prefix-aware", "flat")
KEEP = ("tenant", "type", "turn", "session_id")


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(source_mod, "CHUNK_ACCESSES", 3_000)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A mixed trace (tenants, types, partial blocks) in row groups of 400 requests."""
    path = tmp_path_factory.mktemp("stream") / "mixed.parquet"
    synth.write_chunked("mixed", 2_500, 7, path, "parquet", chunk_requests=400)
    return path


@pytest.fixture(scope="module")
def loaded(mixed):
    return load_trace(mixed)


def assert_same_curve(a, b):
    assert_frame_equal(a.curve, b.curve, check_exact=True)
    assert_frame_equal(a.knees, b.knees, check_exact=True)
    assert a.ceiling == b.ceiling
    assert a.info == b.info
    if a.by_group is None:
        assert b.by_group is None
    else:
        assert_frame_equal(a.by_group, b.by_group, check_exact=True)
    da, db = getattr(a, "display", None), getattr(b, "display", None)
    if da is not None:
        assert_frame_equal(da, db, check_exact=True)
    if a.group_summary is None:
        assert b.group_summary is None
    else:  # evaluated at the knee itself, streamed or not
        assert_frame_equal(a.group_summary, b.group_summary, check_exact=True)


def test_file_has_many_row_groups(mixed, loaded):
    assert pq.ParquetFile(mixed).metadata.num_row_groups >= 6
    assert loaded.n_accesses > 10 * source_mod.CHUNK_ACCESSES


def test_scan_gives_the_in_memory_access_table(mixed, loaded):
    with open_stream(mixed) as st:
        a = loaded.accesses
        assert_array_equal(st.accesses.req_start, a.req_start)
        chunks = list(st.chunks())
        assert len(chunks) > 1 and [c.lo for c in chunks] == [int(a.req_start[c.r]) for c in chunks]
        assert all(c.r_end == d.r for c, d in zip(chunks, chunks[1:])) and chunks[-1].r_end == loaded.n_requests
        assert_array_equal(np.concatenate([c.block for c in chunks]), a.block)
        assert_array_equal(np.concatenate([c.tokens for c in chunks]), a.tokens)
        assert_array_equal(np.concatenate([c.pos for c in chunks]), a.pos)
        only = list(st.chunks(layout=False))
        assert_array_equal(np.concatenate([c.block for c in only]), a.block)
        assert all(c.tokens is None and c.pos is None for c in only)
        back = list(st.chunks(reverse=True, layout=False))
        assert [c.lo for c in back] == [c.lo for c in chunks][::-1]
        assert_array_equal(np.concatenate([c.block for c in back[::-1]]), a.block)
        # per-access columns (spill files) alongside, and a short one is an error naming it
        col = st.column("x", np.int64)
        assert col.path.parent == st.spill
        for c in back:  # written in any order
            col.write(c.lo, np.arange(c.lo, c.hi, dtype=np.int64))
        got = np.concatenate([c.extra[0] for c in st.chunks(blocks=False, columns=[col])])
        assert_array_equal(got, np.arange(loaded.n_accesses))
        np.arange(loaded.n_accesses - 1, dtype=np.int64).tofile(col.path)
        with pytest.raises(KvtraceError, match="cut short") as exc:
            list(st.chunks(columns=[col]))
        assert exc.value.path == str(col.path)
        every = np.arange(loaded.n_accesses)  # derived on indexing, at any accesses
        assert_array_equal(st.accesses.tokens[every[::-1]], a.tokens[::-1])
        assert_array_equal(st.accesses.pos[every[::-1]], a.pos[::-1])
        assert_array_equal(st.block_hash, loaded.block_hash)
        assert_array_equal(st.block_tenant, loaded.block_tenant)
        assert_array_equal(st.block_size, loaded.block_size)
        assert_array_equal(st.request_timestamp, loaded.request_timestamp)
        assert (st.n_requests, st.n_accesses, st.n_blocks) == (loaded.n_requests, loaded.n_accesses, loaded.n_blocks)
        assert st.warnings == loaded.warnings
        spill = st.spill
        assert spill.is_dir()
    assert not spill.exists()  # closing removes the spill files


@pytest.mark.parametrize("eviction", EVICTIONS)
@pytest.mark.parametrize("options", [
    {},
    {"warmup": "15%"},
    {"warmup": "2min"},
    {"by": "tenant"},
    {"by": "session-length"},
    {"capacities": [2**30, 50 * 2**30, 2**40], "points": 50},
    {"display_capacities": [2**34, 2**36], "model": "Llama-3.1-8B"},
])
def test_streamed_curve_equals_in_memory(mixed, loaded, eviction, options):
    expected = compute_curve(loaded, eviction=eviction, **options)
    with open_stream(mixed, columns=KEEP) as st:
        got = compute_curve(st, eviction=eviction, **options)
    assert_same_curve(expected, got)


@pytest.mark.parametrize("eviction", EVICTIONS)
@pytest.mark.parametrize("options", [{}, {"warmup": "20%", "by": "type"}])
def test_sampled_curve_on_a_streamed_trace_equals_in_memory(mixed, loaded, eviction, options):
    expected = compute_curve(loaded, eviction=eviction, sample_rate=0.05, **options)
    with open_stream(mixed, columns=KEEP) as st:
        got = compute_curve(st, eviction=eviction, sample_rate=0.05, **options)
        # the knee keys of the evaluated accesses went to disk, one chunk at a time
        size = (st.spill / "sampled_keys").stat().st_size  # 24 bytes per measured evaluated access
        assert size % 24 == 0 and 0 < size <= 24 * got.info["sampled_accesses"]
        assert (size == 24 * got.info["sampled_accesses"]) == ("warmup" not in options)
    assert_same_curve(expected, got)
    assert expected.info["approximate"] and expected.info["sampled_accesses"] > 0


def test_one_chunk_and_many_chunks_agree(mixed, loaded, monkeypatch):
    with open_stream(mixed) as st:
        many = compute_curve(st)
    monkeypatch.setattr(source_mod, "CHUNK_ACCESSES", 10**9)
    with open_stream(mixed) as st:
        one = compute_curve(st)
    assert_same_curve(many, one)


def generic_table(path, rows, row_group_size):
    """A generic request table: hash_ids list, timestamps in ms, tenants, no request ids."""
    table = pa.table({
        "ts_ms": pa.array([r[0] for r in rows], pa.int64()),
        "input_length": pa.array([r[1] for r in rows], pa.int64()),
        "tenant": pa.array([r[2] for r in rows], pa.string()),
        "hash_ids": pa.array([r[3] for r in rows], pa.list_(pa.uint64())),
    })
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def random_rows(n, seed, sorted_ts=True):
    rng = np.random.default_rng(seed)
    rows = []
    t = 5_000
    for i in range(n):
        t += int(rng.integers(0, 400)) if sorted_ts else int(rng.integers(-50, 400))
        k = int(rng.integers(0, 12))
        base = int(rng.integers(0, 40))
        hashes = [int(base * 1000 + j) if rng.random() < 0.8 else int(rng.integers(0, 2**64, dtype=np.uint64))
                  for j in range(k)]
        n_in = max(0, 16 * k - int(rng.integers(0, 16))) if k else 0
        rows.append((t, n_in, ["a", "b", None][int(rng.integers(0, 3))], hashes))
    return rows


@pytest.mark.parametrize("share", [False, True])
def test_generic_parquet_streams_like_memory(tmp_path, share):
    path = generic_table(tmp_path / "generic.parquet", random_rows(900, 1), 128)
    mem = load_trace(path, block_tokens=16, share_tenants=share)
    assert mem.requests["timestamp"][0] == 0.0  # shifted to the first arrival
    with open_stream(path, block_tokens=16, share_tenants=share, columns=("tenant",)) as st:
        assert_array_equal(np.concatenate([c.block for c in st.chunks(layout=False)]), mem.accesses.block)
        assert_array_equal(st.request_timestamp, mem.request_timestamp)
        for ev in EVICTIONS:
            assert_same_curve(compute_curve(mem, eviction=ev, by="tenant"),
                              compute_curve(st, eviction=ev, by="tenant"))


def test_unsorted_table_is_one_error_naming_the_row(tmp_path):
    rows = random_rows(300, 2)
    rows[200] = (rows[199][0] - 1, *rows[200][1:])  # row 200 arrives before row 199 (row group 1)
    path = generic_table(tmp_path / "unsorted.parquet", rows, 128)
    with pytest.raises(KvtraceError, match="not in timestamp order") as exc:
        open_stream(path, block_tokens=16)
    assert exc.value.row == 200
    rows = random_rows(300, 3)
    rows[128] = (rows[127][0] - 1, *rows[128][1:])  # across a row-group boundary
    path = generic_table(tmp_path / "unsorted2.parquet", rows, 128)
    with pytest.raises(KvtraceError, match="not in timestamp order") as exc:
        open_stream(path, block_tokens=16)
    assert exc.value.row == 128


def test_bad_value_is_reported_at_its_row_in_the_file(tmp_path):
    rows = random_rows(300, 4)
    rows[260] = (rows[260][0], -5, *rows[260][2:])
    path = generic_table(tmp_path / "bad.parquet", rows, 128)
    with pytest.raises(KvtraceError) as mem:
        load_trace(path, block_tokens=16)
    with pytest.raises(KvtraceError) as streamed:
        open_stream(path, block_tokens=16)
    assert streamed.value.one_line() == mem.value.one_line()
    assert streamed.value.row == 260


def test_chunked_reader_rejects_what_it_cannot_stream(tmp_path, mixed):
    with pytest.raises(KvtraceError, match="--block-tokens"):
        ParquetRequests(generic_table(tmp_path / "g.parquet", random_rows(10, 5), 4))
    access = tmp_path / "access.parquet"
    pq.write_table(pa.table({"request_id": [0, 0, 1], "pos": [0, 1, 0], "hash_id": [1, 2, 1],
                             "timestamp": [0.0, 0.0, 1.0]}), access)
    with pytest.raises(KvtraceError, match="list column"):
        ParquetRequests(access, block_tokens=16)
    with pytest.raises(KvtraceError, match="contradicts"):
        ParquetRequests(mixed, block_tokens=16)
    with pytest.raises(UsageError, match="Parquet"):
        open_stream(tmp_path / "trace.jsonl")


def test_when_to_stream(mixed, monkeypatch, tmp_path):
    est = in_memory_estimate(mixed)
    n = int(sum(load_trace(mixed).requests["block_ids"].list.len()))
    assert est == n * stream_mod.IN_MEMORY_BYTES_PER_ACCESS
    monkeypatch.setenv(stream_mod.MEMORY_BUDGET_ENV, f"{est - 1}B")
    assert should_stream(mixed)
    monkeypatch.setenv(stream_mod.MEMORY_BUDGET_ENV, f"{est}B")
    assert not should_stream(mixed)
    assert should_stream(mixed, stream=True)
    assert not should_stream(mixed, stream=False)
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1]}\n')
    monkeypatch.setenv(stream_mod.MEMORY_BUDGET_ENV, "1B")
    assert not should_stream(jsonl)  # JSONL is read in memory
    with pytest.raises(UsageError, match="Parquet"):
        should_stream(jsonl, stream=True)
    monkeypatch.delenv(stream_mod.MEMORY_BUDGET_ENV)
    assert stream_mod.memory_budget() > 0


def test_cli_stream_writes_the_same_outputs(mixed, tmp_path, monkeypatch):
    runner = CliRunner()
    outs = {}
    for flag in ("--no-stream", "--stream"):
        out, js = tmp_path / f"c{flag}.parquet", tmp_path / f"c{flag}.json"
        res = runner.invoke(app, ["curve", str(mixed), flag, "--out", str(out), "--json", str(js),
                                  "--capacity", "4GiB,64GiB,1TiB"], env={"COLUMNS": "200"})
        assert res.exit_code == 0, (res.stdout, res.stderr, res.exception)
        outs[flag] = (pl.read_parquet(out), json.loads(js.read_text()), res.stdout)
    assert_frame_equal(outs["--stream"][0], outs["--no-stream"][0], check_exact=True)
    assert outs["--stream"][1] == outs["--no-stream"][1]
    table = lambda text: [ln for ln in text.splitlines() if "computed in" not in ln]  # noqa: E731
    assert table(outs["--stream"][2]) == table(outs["--no-stream"][2])
    # automatic: a budget below the estimate streams, with the same figures
    monkeypatch.setenv(stream_mod.MEMORY_BUDGET_ENV, "1MiB")
    js = tmp_path / "auto.json"
    res = runner.invoke(app, ["curve", str(mixed), "--json", str(js), "--capacity", "4GiB,64GiB,1TiB"])
    assert res.exit_code == 0, (res.stdout, res.stderr, res.exception)
    assert "streaming" in res.stderr
    assert json.loads(js.read_text()) == outs["--no-stream"][1]


def test_cli_stream_refuses_per_access_output(mixed, tmp_path):
    res = CliRunner().invoke(app, ["curve", str(mixed), "--stream", "--distances-out", str(tmp_path / "d.parquet")])
    assert res.exit_code == 2
    assert "--distances-out" in res.stderr and "Traceback" not in res.stderr


def test_whole_table_checks_match_memory(tmp_path):
    """A request id repeated in another row group, found after the scan, as in memory."""
    rows = random_rows(300, 6)
    table = pa.table({
        "request_id": pa.array([i if i != 250 else 3 for i in range(300)], pa.int64()),
        "ts_ms": pa.array([r[0] for r in rows], pa.int64()),
        "input_length": pa.array([r[1] for r in rows], pa.int64()),
        "hash_ids": pa.array([r[3] for r in rows], pa.list_(pa.uint64())),
    })
    path = tmp_path / "dup.parquet"
    pq.write_table(table, path, row_group_size=100)
    with pytest.raises(KvtraceError) as mem:
        load_trace(path, block_tokens=16)
    with pytest.raises(KvtraceError) as streamed:
        open_stream(path, block_tokens=16)
    assert streamed.value.one_line() == mem.value.one_line()
    assert "duplicate request id 3" in streamed.value.one_line()
