"""Streamed future-reuse value (kvtrace.analyses.value on a streamed trace) equals the in-memory run bit for bit.

Traces are Parquet tables in many row groups, and the streamed passes run on chunks
of a few dozen to a few hundred accesses, so reuse windows span many chunks (the
horizons below reach from ties only to the whole trace). Every comparison is exact:
arrays with ``assert_array_equal``, tables with ``assert_frame_equal(check_exact=True)``,
dicts with ``==``; output files byte for byte where the format allows.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from numpy.testing import assert_array_equal
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

import kvtrace.analyses.value as value_mod
import kvtrace.ingest.stream as stream_mod
from kvtrace.trace import source as source_mod
from kvtrace.ingest import synth
from kvtrace.cli import app
from kvtrace.errors import UsageError
from kvtrace.ingest import load_trace
from kvtrace.model import GpuSpec, ModelSpec
from kvtrace.outputs import write_table, write_table_chunks
from kvtrace.ingest.stream import open_stream
from kvtrace.analyses.value import DEFAULT_COSTS, StorageCosts, future_reuse, value_report
from kvtrace.analyses.value import StreamedFutureReuse, streamed_values

INF = math.inf
FIELDS = ("block", "timestamp", "next_t", "next_gap_s", "reuses", "last_reuse_t", "hold_s", "reuse_tokens", "bytes",
          "gain_gpu_seconds", "gain_usd", "cost_usd", "value_usd", "interval_gain_gpu_seconds",
          "interval_value_usd", "starts_stay")
COSTS = [DEFAULT_COSTS, StorageCosts(write_dollars_per_byte=3e-9, read_dollars_per_byte=1e-10,
                                     occupancy_dollars_per_byte_second=2e-12)]
TOY = ModelSpec(name="toy", attention="mha", layers=1, q_heads=1, kv_heads=1, head_dim=1, active_params=1)
TOY_GPU = GpuSpec(name="toy", peak_flops=1.0, dollars_per_hour=3600.0, mfu=1.0)


def set_chunk(monkeypatch, accesses: int) -> None:
    """Streamed value passes on chunks of about ``accesses`` accesses."""
    monkeypatch.setattr(source_mod, "CHUNK_ACCESSES", accesses * value_mod.CHUNK_SHARE)


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    set_chunk(monkeypatch, 300)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A mixed trace (tenants, types, partial blocks) in row groups of 300 requests."""
    path = tmp_path_factory.mktemp("vstream") / "mixed.parquet"
    synth.write_chunked("mixed", 1_200, 11, path, "parquet", chunk_requests=300)
    return path


@pytest.fixture(scope="module")
def loaded(mixed):
    return load_trace(mixed)


def generic_trace(path, n, seed, row_group_size=64):
    """A generic request table: chained hashes from 30 prefixes (many reuses), arrivals
    in ms with many ties, empty requests, partial last blocks, tenants."""
    rng = np.random.default_rng(seed)
    t, ts, lens, tenants, hashes = 1_000, [], [], [], []
    for _ in range(n):
        t += int(rng.choice([0, 0, 0, 1, 7, 50, 400, 3_000]))
        k = int(rng.integers(0, 9))
        base = int(rng.integers(0, 30))
        hashes.append([base * 1000 + j if rng.random() < 0.85 else int(rng.integers(0, 2**63)) for j in range(k)])
        ts.append(t)
        lens.append(max(0, 16 * k - int(rng.integers(0, 16))) if k else 0)
        tenants.append(["a", "b"][int(rng.integers(0, 2))])
    table = pa.table({"ts_ms": pa.array(ts, pa.int64()), "input_length": pa.array(lens, pa.int64()),
                      "tenant": pa.array(tenants, pa.string()), "hash_ids": pa.array(hashes, pa.list_(pa.uint64()))})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def assert_same_report(expected, got):
    assert_frame_equal(expected.per_block, got.per_block, check_exact=True)
    assert_frame_equal(expected.per_prefix, got.per_prefix, check_exact=True)
    assert expected.summary == got.summary


def assert_same_future(expected, streamed: StreamedFutureReuse):
    """Every per-access array of the streamed run's chunks equals the in-memory slice."""
    seen = 0
    for lo, fr in streamed.chunks():
        assert lo == seen
        hi = lo + len(fr)
        for name in FIELDS:
            want = getattr(expected, name)[lo:hi]
            got = getattr(fr, name)
            assert got.dtype == want.dtype or name == "block", name
            assert_array_equal(got, want, err_msg=name, strict=name != "block")
        seen = hi
    assert seen == len(expected)


def check_trace(mem, st, horizon, costs, model=None, gpu=None):
    expected = value_report(mem, model=model, gpu=gpu, horizon_s=horizon, costs=costs)
    got = value_report(st, model=model, gpu=gpu, horizon_s=horizon, costs=costs)
    assert_same_report(expected, got)
    assert isinstance(got.future, StreamedFutureReuse)
    assert_same_future(expected.future, got.future)
    path = streamed_values(st, model=model, gpu=gpu, horizon_s=horizon, costs=costs)
    assert path.parent == st.spill
    assert_array_equal(np.fromfile(path, dtype=np.float64), expected.future.value_usd, strict=True)


# ------------------------------------------------------------------ ordered sums


def test_add_at_continues_bincount_across_chunks():
    """The per-block sums of the value report: np.add.at chunk by chunk is np.bincount's order."""
    rng = np.random.default_rng(3)
    idx, w = rng.integers(0, 7, 5000), rng.standard_normal(5000) * 1e6
    out = np.zeros(7)
    for i in range(0, 5000, 333):
        np.add.at(out, idx[i:i + 333], w[i:i + 333])
    assert_array_equal(out, np.bincount(idx, weights=w, minlength=7))


# ------------------------------------------------------------------ streamed == in memory


def test_chunks_are_many(mixed, loaded):
    assert pq.ParquetFile(mixed).metadata.num_row_groups >= 4
    with open_stream(mixed) as st:
        chunks = list(st.chunks(size=value_mod.chunk_accesses(), blocks=False, layout=False))
    assert len(chunks) > 50 and chunks[-1][3] == loaded.n_accesses


@pytest.mark.parametrize("horizon", [0.0, 2.5, 60.0, 1800.0, INF])
@pytest.mark.parametrize("costs", range(len(COSTS)))
def test_mixed_trace_streams_like_memory(mixed, loaded, horizon, costs):
    with open_stream(mixed) as st:
        check_trace(loaded, st, horizon, COSTS[costs])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("horizon", [0.0, 0.05, 3.0, 40.0, INF])
def test_random_generic_traces_stream_like_memory(tmp_path, monkeypatch, seed, horizon):
    set_chunk(monkeypatch, 7 + 13 * seed)
    path = generic_trace(tmp_path / "g.parquet", 250, seed)
    mem = load_trace(path, block_tokens=16)
    with open_stream(path, block_tokens=16) as st:
        check_trace(mem, st, horizon, COSTS[seed % 2], model=TOY if seed == 3 else None,
                    gpu=TOY_GPU if seed == 3 else None)


def test_one_chunk_and_many_chunks_agree(mixed, monkeypatch):
    with open_stream(mixed) as st:
        many = value_report(st, horizon_s=30.0)
    monkeypatch.setattr(source_mod, "CHUNK_ACCESSES", 10**9)
    with open_stream(mixed) as st:
        one = value_report(st, horizon_s=30.0)
    assert_same_report(many, one)


def test_per_block_table_is_built_on_first_read(mixed, loaded, tmp_path):
    """The streamed report leaves the per-block table's columns the summary does not
    read on disk, beside the trace's spill directory: the table can be read after the
    trace is closed, and the directory goes once it is built."""
    import gc

    expected = value_report(loaded, horizon_s=60.0)
    with open_stream(mixed, spill_dir=tmp_path) as st:
        got = value_report(st, horizon_s=60.0)
        assert len(list(tmp_path.glob("kvtrace-stream-*"))) == 2
    assert len(list(tmp_path.glob("kvtrace-stream-*"))) == 1
    assert_same_report(expected, got)
    gc.collect()
    assert not list(tmp_path.glob("kvtrace-stream-*"))
    with open_stream(mixed, spill_dir=tmp_path) as st:
        value_report(st, horizon_s=60.0)  # dropped unread
    gc.collect()
    assert not list(tmp_path.glob("kvtrace-stream-*"))


def test_requests_without_accesses(tmp_path):
    table = pa.table({"ts_ms": pa.array([0, 5, 9], pa.int64()), "input_length": pa.array([0, 0, 0], pa.int64()),
                      "hash_ids": pa.array([[], [], []], pa.list_(pa.uint64()))})
    path = tmp_path / "empty.parquet"
    pq.write_table(table, path)
    mem = load_trace(path, block_tokens=16)
    with open_stream(path, block_tokens=16) as st:
        check_trace(mem, st, 60.0, DEFAULT_COSTS)
        frames = list(value_report(st).future.table_chunks())
        assert_frame_equal(pl.concat(frames), future_reuse(mem).table(), check_exact=True)


def test_values_file_is_reused_and_keyed_by_arguments(mixed):
    with open_stream(mixed) as st:
        a = streamed_values(st, horizon_s=60.0)
        mtime = a.stat().st_mtime_ns
        assert streamed_values(st, horizon_s="1min") == a and a.stat().st_mtime_ns == mtime
        b = streamed_values(st, horizon_s=61.0)
        assert b != a and b.stat().st_size == a.stat().st_size == 8 * st.n_accesses
        assert not [p for p in st.spill.iterdir() if p.name.endswith(".tmp")]
    assert not a.exists()  # closing the trace removes it


def test_streamed_report_refuses_a_future(mixed, loaded):
    with open_stream(mixed) as st:
        with pytest.raises(UsageError, match="streamed"):
            value_report(st, future=future_reuse(loaded))


# ------------------------------------------------------------------ per-access tables


@pytest.mark.parametrize("suffix", ["parquet", "csv", "json"])
def test_access_table_written_chunk_by_chunk_equals_memory(tmp_path, suffix, monkeypatch):
    set_chunk(monkeypatch, 40)
    path = generic_trace(tmp_path / "g.parquet", 120, 9)
    mem = load_trace(path, block_tokens=16)
    md = {"x": 1.5, "inf": INF}
    want, got = tmp_path / f"want.{suffix}", tmp_path / f"got.{suffix}"
    future_reuse(mem, horizon_s=2.0).write_table(want, metadata=md)
    with open_stream(path, block_tokens=16) as st:
        value_report(st, horizon_s=2.0).future.write_table(got, metadata=md)
    if suffix == "parquet":
        assert pq.ParquetFile(got).metadata.num_row_groups > 5
        assert_frame_equal(pl.read_parquet(got), pl.read_parquet(want), check_exact=True)
        assert pq.read_schema(got).metadata[b"kvtrace"] == pq.read_schema(want).metadata[b"kvtrace"]
    else:
        assert got.read_bytes() == want.read_bytes()


@pytest.mark.parametrize("suffix", ["parquet", "csv", "json"])
def test_write_table_chunks_of_an_empty_table(tmp_path, suffix):
    df = pl.DataFrame({"a": pl.Series([], dtype=pl.Int64), "b": pl.Series([], dtype=pl.Float64)})
    write_table(df, tmp_path / f"w.{suffix}", metadata={})
    write_table_chunks([df], tmp_path / f"c.{suffix}", metadata={})
    if suffix == "parquet":
        assert_frame_equal(pl.read_parquet(tmp_path / "c.parquet"), df)
    else:
        assert (tmp_path / f"c.{suffix}").read_bytes() == (tmp_path / f"w.{suffix}").read_bytes()


# ------------------------------------------------------------------ CLI


def run(args):
    return CliRunner().invoke(app, args, env={"COLUMNS": "200"})


def test_cli_stream_equals_no_stream(mixed, tmp_path, monkeypatch):
    outs = {}
    for flag in ("--no-stream", "--stream"):
        acc = tmp_path / f"acc{flag}.csv"
        res = run(["value", str(mixed), flag, "--horizon", "90s", "--json", "-", "--top", "25",
                   "--accesses-out", str(acc), "--out", str(tmp_path / f"b{flag}.parquet")])
        assert res.exit_code == 0, (res.stdout, res.stderr, res.exception)
        outs[flag] = (json.loads(res.stdout), acc.read_bytes(), pl.read_parquet(tmp_path / f"b{flag}.parquet"))
    assert outs["--stream"][0] == outs["--no-stream"][0]
    assert outs["--stream"][1] == outs["--no-stream"][1]
    assert_frame_equal(outs["--stream"][2], outs["--no-stream"][2], check_exact=True)
    # left to itself, a budget below the in-memory estimate streams, with the same figures
    monkeypatch.setenv(stream_mod.MEMORY_BUDGET_ENV, "1MiB")
    res = run(["value", str(mixed), "--horizon", "90s", "--json", "-", "--top", "25"])
    assert res.exit_code == 0, (res.stdout, res.stderr, res.exception)
    assert "streaming" in res.stderr
    assert json.loads(res.stdout) == outs["--no-stream"][0]


def test_cli_failure_midway_leaves_no_file(mixed, tmp_path, monkeypatch):
    """A failure while the per-access table is written chunk by chunk (here: disk full
    at the fourth chunk) leaves no file, any previous file intact and no spill files."""
    real_chunks = StreamedFutureReuse.table_chunks

    def failing(self, progress=None):
        for i, frame in enumerate(real_chunks(self, progress)):
            if i == 3:
                raise OSError(28, "No space left on device")
            yield frame

    spills = []
    real_open = stream_mod.open_stream

    def recording_open(*args, **kwargs):
        trace = real_open(*args, **kwargs)
        spills.append(trace.spill)
        return trace

    monkeypatch.setattr(StreamedFutureReuse, "table_chunks", failing)
    monkeypatch.setattr(stream_mod, "open_stream", recording_open)
    for suffix in ("parquet", "csv"):
        acc = tmp_path / f"acc.{suffix}"
        acc.write_bytes(b"previous")
        res = run(["value", str(mixed), "--stream", "--accesses-out", str(acc), "--json", str(tmp_path / "v.json")])
        assert res.exit_code == 1, (res.stdout, res.stderr, res.exception)
        assert "No space left" in res.stderr and "Traceback" not in res.stderr
        assert acc.read_bytes() == b"previous"
        assert {p.name for p in tmp_path.iterdir()} <= {"acc.parquet", "acc.csv"}  # no temporary file, no json
    assert len(spills) == 2 and not any(p.exists() for p in spills)


# ------------------------------------------------------------------ without the JIT

NOJIT_SCRIPT = r"""
import json, sys
import numpy as np
import kvtrace.trace.source as source_mod
import kvtrace.analyses.value as value_mod
source_mod.CHUNK_ACCESSES = 10 * value_mod.CHUNK_SHARE
from kvtrace.ingest.stream import open_stream
from kvtrace.analyses.value import streamed_values, value_report
with open_stream(sys.argv[1], block_tokens=16) as st:
    r = value_report(st, horizon_s=3.0)
    v = np.fromfile(streamed_values(st, horizon_s=3.0), dtype=np.float64)
print(json.dumps({"summary": r.summary, "blocks": r.per_block.to_dicts(), "values": v.tolist()}))
"""


def test_streamed_kernels_without_the_jit(tmp_path):
    """The chunked kernels as plain Python (NUMBA_DISABLE_JIT=1: coverage sees them)
    give the in-memory (JIT) results exactly."""
    path = generic_trace(tmp_path / "g.parquet", 60, 5)
    env = dict(os.environ, NUMBA_DISABLE_JIT="1", KVTRACE_NUMBA_CACHE="0")
    res = subprocess.run([sys.executable, "-c", NOJIT_SCRIPT, str(path)], capture_output=True, text=True, env=env,
                         timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    got = json.loads(res.stdout)
    expected = value_report(load_trace(path, block_tokens=16), horizon_s=3.0)
    assert got["summary"] == json.loads(json.dumps(expected.summary))
    assert got["blocks"] == expected.per_block.to_dicts()
    assert got["values"] == expected.future.value_usd.tolist()
