"""The resource guard holds before the read (kvtrace.ingest.guard.check_before_read), the
decompression is bounded, and a streamed scan splits a huge row group.

The subprocess tests run the real command under ``KVTRACE_MEMORY_BUDGET=512MiB`` and
measure the child's peak resident set size: it must stay within the budget plus the
interpreter's baseline (the peak of the same command on a tiny trace).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from numpy.testing import assert_array_equal

import kvtrace.ingest.canonical as canonical_mod
import kvtrace.ingest.chunks as chunks_mod
from kvtrace.ingest import guard
from kvtrace.analyses.curves import compute_curve
from kvtrace.errors import KvtraceError
from kvtrace.ingest import load_requests, load_trace
from kvtrace.ingest.chunks import ParquetRequests
from kvtrace.ingest.jsonl import _decompress
from kvtrace.ingest.stream import open_stream

BUDGET = "512MiB"
BUDGET_BYTES = 512 << 20
KVTRACE = str(Path(sys.executable).with_name("kvtrace"))
MiB = 1 << 20

# Runs the command as its only child and prints the child's peak RSS (ru_maxrss, KiB).
_PEAK = ("import resource, subprocess, sys\n"
         "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
         "sys.stderr.write(p.stderr)\n"
         "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")


def run_peak(*args, budget: str | None = BUDGET) -> tuple[int, int, str]:
    """(exit code, peak bytes, stderr) of ``kvtrace ARGS`` in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != guard.MEMORY_BUDGET_ENV}
    if budget is not None:
        env[guard.MEMORY_BUDGET_ENV] = budget
    p = subprocess.run([sys.executable, "-c", _PEAK, KVTRACE, *map(str, args)], capture_output=True, text=True,
                       env=env, timeout=300)
    rc, kib = p.stdout.split()
    return int(rc), int(kib) * 1024, p.stderr


def hash_table(path, hashes: np.ndarray, rows: int, **write):
    """A generic request table of ``rows`` requests of equal length (ms timestamps)."""
    per = hashes.shape[0] // rows
    offsets = np.arange(0, rows * per + 1, per, dtype=np.int32)
    table = pa.table({
        "timestamp_ms": pa.array(np.arange(rows, dtype=np.float64) * 1000.0),
        "input_length": pa.array(np.full(rows, per * 512, dtype=np.int64)),
        "output_length": pa.array(np.full(rows, 10, dtype=np.int64)),
        "hash_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(hashes)),
    })
    pq.write_table(table, path, **write)
    return path


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Built once: a tiny trace (the baseline), a 30M-access Parquet in one row group
    (1,000 distinct blocks; ~220 KB), a ~2 MB gzip expanding to 50M accesses, and a
    gzip bomb whose first MiBs compress like a trace (the estimate misses it)."""
    d = tmp_path_factory.mktemp("bounds")
    tiny = d / "tiny.jsonl"
    tiny.write_text("".join(json.dumps({"timestamp": i, "input_length": 1024, "output_length": 1,
                                        "hash_ids": [i, i + 1]}) + "\n" for i in range(10)))
    big_pq = hash_table(d / "big.parquet", np.tile(np.arange(1_000, dtype=np.uint64), 30_000), 30_000,
                        row_group_size=30_000, compression="zstd")
    big_gz = d / "big.jsonl.gz"
    hashes = json.dumps(list(range(2_000)))
    with gzip.open(big_gz, "wb", compresslevel=6) as fh:
        for i in range(25_000):
            fh.write(b'{"timestamp": %d, "input_length": 1024000, "output_length": 1, "hash_ids": %s}\n'
                     % (i, hashes.encode()))
    bomb = d / "bomb.jsonl.gz"
    rng = np.random.default_rng(0)
    head = "".join(json.dumps({"timestamp": i, "input_length": 64, "output_length": 1,
                               "hash_ids": [int(h) for h in rng.integers(0, 2**62, 4)]}) + "\n"
                   for i in range(60_000)).encode()  # ~6 MiB that compresses ~2.5x
    blank = gzip.compress(b"\n" * (64 * MiB), compresslevel=9)  # one member: 64 MiB of blank lines
    with open(bomb, "wb") as fh:
        fh.write(gzip.compress(head))
        for _ in range(16):  # 1 GiB decompressed in all
            fh.write(blank)
    return {"tiny": tiny, "parquet": big_pq, "gzip": big_gz, "bomb": bomb}


@pytest.fixture(scope="module")
def baseline(inputs):
    """Peak bytes of kvtrace stats and curve on a tiny trace: the interpreter and its
    libraries, what no budget can bound."""
    out = {}
    for cmd in ("stats", "curve"):
        rc, peak, err = run_peak(cmd, inputs["tiny"], budget=None)
        assert rc == 0, err
        out[cmd] = peak
    return out


def one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.startswith("kvtrace: error:")]
    assert len(lines) == 1, err
    return lines[0]


# --------------------------------------------------------------------------- the budget holds
def test_a_parquet_too_large_is_refused_from_its_metadata_within_the_budget(inputs, baseline):
    # measured: 939 MiB peak before the refusal (the table parsed first); now ~175 MiB
    rc, peak, err = run_peak("stats", "--no-stream", "--block-tokens", "512", inputs["parquet"])
    line = one_error_line(err)
    assert rc == 1 and str(inputs["parquet"]) in line and "estimated before reading it" in line
    assert "30,000,000 block accesses" in line and "from the Parquet metadata" in line
    assert "analyse a part of it" in line  # the stats advice, not --sample-rate
    assert peak <= BUDGET_BYTES + baseline["stats"], peak / MiB


def test_a_gzip_too_large_is_refused_from_a_first_read_within_the_budget(inputs, baseline):
    # measured: 1,252-1,278 MiB peak before the refusal; now ~150 MiB
    rc, peak, err = run_peak("curve", inputs["gzip"])
    line = one_error_line(err)
    assert rc == 1 and str(inputs["gzip"]) in line and "decompressed" in line and "ratio" in line
    assert "--stream" in line and "out of memory" not in line
    assert peak <= BUDGET_BYTES + baseline["curve"], peak / MiB


def test_a_gzip_bomb_the_estimate_misses_stops_at_the_hard_bound(inputs, baseline):
    rc, peak, err = run_peak("stats", inputs["bomb"])
    line = one_error_line(err)
    assert rc == 1 and str(inputs["bomb"]) in line and "decompresses to more than" in line
    assert "out of memory" not in line and "--sample-rate" not in line
    assert peak <= BUDGET_BYTES + baseline["stats"], peak / MiB


def test_a_single_row_group_streams_within_the_budget(inputs, baseline):
    # measured: 1,711-1,844 MiB peak (the 30M-access row group read at once); now ~590 MiB
    rc, peak, err = run_peak("curve", "--block-tokens", "512", inputs["parquet"])
    assert rc == 0 and "streaming" in err, err
    assert peak <= BUDGET_BYTES + baseline["curve"], peak / MiB


# --------------------------------------------------------------------------- estimates
def test_parquet_estimate_is_exact_from_the_metadata(tmp_path):
    path = hash_table(tmp_path / "t.parquet", np.arange(6_000, dtype=np.uint64) % 97, 300, row_group_size=64)
    est = guard.estimate_read(path)
    assert (est.accesses, est.requests, est.held_bytes) == (6_000, 300, 0)


def test_jsonl_estimates_from_a_bounded_sample(tmp_path, monkeypatch):
    monkeypatch.setattr(guard, "SAMPLE_BYTES", 64 << 10)  # the sample is a small part of the file
    lines = "".join(json.dumps({"timestamp": i, "input_length": 160, "output_length": 1,
                                "hash_ids": list(range(i % 7, i % 7 + 10))}) + "\n" for i in range(20_000))
    plain = tmp_path / "t.jsonl"
    plain.write_text(lines)
    est = guard.estimate_read(plain)
    assert 0.9 * 200_000 <= est.accesses <= 1.1 * 200_000 and 0.9 * 20_000 <= est.requests <= 1.1 * 20_000
    assert est.held_bytes == plain.stat().st_size
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(lines.encode()))
    est = guard.estimate_read(gz)
    assert 0.7 * 200_000 <= est.accesses <= 1.3 * 200_000
    assert 0.7 * 2 * len(lines) <= est.held_bytes <= 1.3 * 2 * len(lines)  # decompressed, held twice
    zst = tmp_path / "t.jsonl.zst"
    with pa.output_stream(str(zst), compression="zstd") as out:
        out.write(lines.encode() * 5)  # 6.5 MB: the decoder reads ahead, so a real-sized sample
    monkeypatch.setattr(guard, "SAMPLE_BYTES", 4 << 20)
    est = guard.estimate_read(zst)
    assert 0.7 * 1_000_000 <= est.accesses <= 1.3 * 1_000_000
    shards = tmp_path / "shards"
    shards.mkdir()
    for k in range(3):
        (shards / f"part-{k}.jsonl").write_text(lines)
    est = guard.estimate_read(shards)
    assert 0.9 * 600_000 <= est.accesses <= 1.1 * 600_000


def test_what_fits_is_not_refused_before_the_read(tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": 1024, "output_length": 1,
                                        "hash_ids": [i, i + 1]}) + "\n" for i in range(100)))
    monkeypatch.setenv(guard.MEMORY_BUDGET_ENV, "64MiB")
    df, _, _ = load_requests(path, workload="curve")
    assert df.height == 100
    monkeypatch.setenv(guard.MEMORY_BUDGET_ENV, "8KiB")
    with pytest.raises(KvtraceError, match="estimated before reading it") as exc:
        load_requests(path, workload="curve")
    assert exc.value.path == str(path)


def test_decompression_is_bounded_under_the_guard(tmp_path, monkeypatch):
    gz = tmp_path / "t.jsonl.gz"
    gz.write_bytes(gzip.compress(b"\n" * (8 * MiB)))
    monkeypatch.setenv(guard.MEMORY_BUDGET_ENV, "4MiB")
    assert len(_decompress(str(gz), [])) == 8 * MiB  # no bound outside a guarded read
    with guard.reading("stats"), pytest.raises(KvtraceError, match="decompresses to more than") as exc:
        _decompress(str(gz), [])
    assert exc.value.path == str(gz)
    z = zlib.compressobj(wbits=31)  # and a stream read piece by piece gives the same bytes
    data = os.urandom(3 * MiB) + b"\n" * (5 * MiB)
    gz.write_bytes(z.compress(data) + z.flush())
    assert _decompress(str(gz), []) == data


# --------------------------------------------------------------------------- huge row groups
@pytest.fixture
def one_row_group(tmp_path):
    rng = np.random.default_rng(3)
    hashes = rng.integers(0, 500, 24_000).astype(np.uint64)
    return hash_table(tmp_path / "one.parquet", hashes, 2_000, row_group_size=2_000)


def test_a_huge_row_group_is_read_in_bounded_batches(one_row_group, monkeypatch):
    monkeypatch.setattr(chunks_mod, "CHUNK_ACCESSES", 1_000)
    src = ParquetRequests(one_row_group, block_tokens=16)
    assert src.n_row_groups == 1
    got = list(src.chunks(columns=("request_id", "block_ids")))
    assert len(got) > 20 and all(df["block_ids"].list.len().sum() <= 1_000 for _, df in got)
    assert [row0 for row0, _ in got] == list(np.cumsum([0] + [df.height for _, df in got[:-1]]))
    assert_array_equal(np.concatenate([df["request_id"].to_numpy() for _, df in got]), np.arange(2_000))


def test_a_streamed_huge_row_group_equals_the_in_memory_run(one_row_group, monkeypatch):
    mem = load_trace(one_row_group, block_tokens=16)
    monkeypatch.setattr(chunks_mod, "CHUNK_ACCESSES", 1_000)
    with open_stream(one_row_group, block_tokens=16) as st:
        assert_array_equal(np.concatenate([c.block for c in st.chunks(layout=False)]), mem.accesses.block)
        assert_array_equal(st.block_size, mem.block_size)
        a, b = compute_curve(mem), compute_curve(st)
        assert a.curve.equals(b.curve) and a.knees.equals(b.knees)


def test_a_bad_value_in_a_later_batch_is_numbered_in_the_file(tmp_path, monkeypatch):
    rows = 400
    offsets = np.arange(0, rows * 3 + 1, 3, dtype=np.int32)
    ts = np.arange(rows, dtype=np.float64)
    ts[333] = np.nan
    pq.write_table(pa.table({"timestamp": pa.array(ts), "input_length": pa.array(np.full(rows, 48)),
                             "hash_ids": pa.ListArray.from_arrays(pa.array(offsets),
                                                                  pa.array(np.arange(rows * 3, dtype=np.uint64)))}),
                   tmp_path / "bad.parquet", row_group_size=rows)
    with pytest.raises(KvtraceError) as mem:
        load_trace(tmp_path / "bad.parquet", block_tokens=16)
    monkeypatch.setattr(chunks_mod, "CHUNK_ACCESSES", 30)
    with pytest.raises(KvtraceError) as streamed:
        open_stream(tmp_path / "bad.parquet", block_tokens=16)
    assert streamed.value.row == mem.value.row == 333


def test_the_hash_column_is_copied_out_in_pieces(one_row_group, monkeypatch):
    whole = load_trace(one_row_group, block_tokens=16)
    pieces = list(canonical_mod.hash_pieces(whole.requests["block_ids"],
                                            whole.requests["block_ids"].list.len().to_numpy(), 100))
    assert len(pieces) > 100 and all(int(lens.sum()) <= 100 for _, _, lens in pieces)
    monkeypatch.setattr(canonical_mod, "PIECE_ACCESSES", 100)
    small = load_trace(one_row_group, block_tokens=16)
    assert_array_equal(small.accesses.block, whole.accesses.block)
    assert_array_equal(small.block_hash, whole.block_hash)
    assert canonical_mod.distinct_blocks(small.requests, small.meta) == whole.n_blocks


def test_streaming_and_the_guard_share_one_budget_under_a_cgroup_limit(tmp_path, monkeypatch):
    """In a memory-limited container (a fake cgroup v2 limit far below the host's
    MemAvailable) ``should_stream`` and the guard read the same budget: a trace that does
    not fit is streamed, and the guard refuses it in memory; one that fits is neither."""
    from kvtrace.ingest import stream as stream_mod
    from kvtrace.trace import budget

    rows, per = 200, 50
    path = hash_table(tmp_path / "t.parquet", np.arange(rows * per, dtype=np.uint64) + 1, rows)
    need = stream_mod.in_memory_estimate(path)
    meminfo, limit, usage = tmp_path / "meminfo", tmp_path / "memory.max", tmp_path / "memory.current"
    meminfo.write_text("MemTotal: 67108864 kB\nMemAvailable: 67108864 kB\n")  # 64 GiB on the host
    usage.write_text(f"{100 * MiB}\n")
    monkeypatch.setattr(budget, "MEMINFO", str(meminfo))
    monkeypatch.setattr(budget, "CGROUP_FILES", ((str(limit), str(usage)),))
    monkeypatch.delenv(budget.MEMORY_BUDGET_ENV, raising=False)

    limit.write_text(f"{100 * MiB + need - 1}\n")  # room: one byte short of the in-memory curve
    assert guard.available_bytes() == (need - 1, "left in this cgroup")
    assert stream_mod.memory_budget() == (need - 1) // 2  # streams at half the room, the guard refuses past it
    assert stream_mod.should_stream(path)
    with pytest.raises(KvtraceError, match="left in this cgroup"):
        load_requests(path, workload="curve", block_tokens=512)

    limit.write_text(f"{100 * MiB + 4 * need}\n")
    assert guard.available_bytes() == (4 * need, "left in this cgroup")
    assert not stream_mod.should_stream(path)
    df, _, _ = load_requests(path, workload="curve", block_tokens=512)
    assert df.height == rows

    limit.write_text("max\n")  # no limit: the host's available memory
    assert guard.available_bytes() == (64 << 30, "available") and stream_mod.memory_budget() == 32 << 30
