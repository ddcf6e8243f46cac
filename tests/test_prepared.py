"""Prepared traces (kvtrace.ingest.prepared): a load that maps a stored trace equals the
build it replaces, bit for bit, and the store never changes a result or gets in the way."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from typer.testing import CliRunner

from kvtrace.cli import app
from kvtrace.errors import KvtraceError
from kvtrace.ingest import canonical, load_trace, prepared, write_canonical

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
ARRAYS = ("request", "pos", "block", "tokens", "req_start")
BLOCK_ARRAYS = ("block_hash", "block_tenant", "block_size")


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A private, empty store for one test."""
    root = tmp_path / "cache"
    monkeypatch.setenv(prepared.CACHE_DIR_ENV, str(root))
    monkeypatch.delenv(prepared.CACHE_MAX_ENV, raising=False)
    return root / "prepared"


def run_cli(args):
    return CliRunner().invoke(app, args, env={"COLUMNS": "200"})


def built(path, **options):
    """The trace as built from the file, the store switched off."""
    old = os.environ.get(prepared.CACHE_DIR_ENV)
    os.environ[prepared.CACHE_DIR_ENV] = "off"
    try:
        return load_trace(path, **options)
    finally:
        if old is None:
            del os.environ[prepared.CACHE_DIR_ENV]
        else:
            os.environ[prepared.CACHE_DIR_ENV] = old


def loaded(path, **options):
    """A load through the store, waiting for what it stores."""
    trace = load_trace(path, **options)
    prepared.wait()
    return trace


def assert_same(a, b):
    assert a.requests.schema == b.requests.schema
    assert a.requests.equals(b.requests, null_equal=True)
    for name in ARRAYS:
        x, y = getattr(a.accesses, name), getattr(b.accesses, name)
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name
    for name in BLOCK_ARRAYS:
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y), name
    assert a.meta == b.meta
    assert a.warnings == b.warnings


def no_build(monkeypatch):
    """Make any build of a trace fail: a load that succeeds was mapped."""
    def refuse(*args, **kwargs):
        raise AssertionError("built again")

    monkeypatch.setattr(canonical, "build_trace", refuse)
    import kvtrace.ingest as ingest

    monkeypatch.setattr(ingest, "build_trace", refuse)


def make_inputs(tmp_path) -> list[tuple[Path, dict]]:
    """Traces of every reader, with the options that shape them."""
    gz = tmp_path / "chat.jsonl.gz"
    gz.write_bytes(gzip.compress((SAMPLES / "chat.jsonl").read_bytes()))
    cut = tmp_path / "cut.jsonl"  # a cut-off last line: a warning to carry
    text = (SAMPLES / "chat.jsonl").read_text().splitlines()
    cut.write_text("\n".join(text[:50]) + "\n" + text[50][: len(text[50]) // 2])
    ends = tmp_path / "ends.jsonl"  # the optional end_timestamp column
    rows = [json.loads(line) for line in text[:40]]
    ends.write_text("".join(json.dumps({**r, "end_timestamp": r["timestamp"] + 500}) + "\n" for r in rows))
    canon = tmp_path / "canon.parquet"
    write_canonical(built(SAMPLES / "agent_bailian.jsonl"), None, canon)
    return [
        (SAMPLES / "chat.jsonl", {}),
        (SAMPLES / "agent_bailian.jsonl", {}),
        (SAMPLES / "agent_bailian.jsonl", {"share_tenants": True}),
        (SAMPLES / "mixed.parquet", {}),
        (gz, {}),
        (cut, {}),
        (ends, {}),
        (canon, {"block_tokens": 32}),  # re-blocked on read
    ]


def test_a_mapped_trace_is_the_built_trace(store, tmp_path):
    for path, options in make_inputs(tmp_path):
        want = built(path, **options)
        first = loaded(path, **options)  # built, then stored
        assert_same(first, want)
        again = loaded(path, **options)  # mapped
        assert_same(again, want)
    assert len(prepared.entries(store)) == 8


def test_a_second_load_maps_instead_of_building(store, monkeypatch):
    path = SAMPLES / "chat.jsonl"
    want = loaded(path)
    no_build(monkeypatch)
    assert_same(load_trace(path), want)
    with pytest.raises(AssertionError, match="built again"):
        load_trace(path, share_tenants=True)  # other options: another key, a build


def test_the_key_is_the_content_not_the_name(store, tmp_path, monkeypatch):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    text = (SAMPLES / "chat.jsonl").read_text()
    a.write_text(text)
    loaded(a)
    shutil.copyfile(a, b)
    b_mtime = b.stat().st_mtime
    assert prepared.trace_key(a, {}) == prepared.trace_key(b, {})
    lines = text.splitlines(keepends=True)
    a.write_text("".join(lines[:-1]))  # one request fewer
    want = built(a)
    got = loaded(a)
    assert got.n_requests == len(lines) - 1
    assert_same(got, want)
    os.utime(b, (b_mtime, b_mtime))
    no_build(monkeypatch)
    assert loaded(b).n_requests == len(lines)  # the copy maps the first entry


def test_keys_follow_the_options_and_the_code(store, monkeypatch):
    path = SAMPLES / "chat.jsonl"
    keys = {prepared.trace_key(path, {"fmt": f}) for f in ("auto", "mooncake")}
    assert len(keys) == 2
    monkeypatch.setattr(prepared, "_code_digest", "another build")
    assert prepared.trace_key(path, {"fmt": "auto"}) not in keys


def test_writing_into_a_mapped_array_changes_only_the_caller(store):
    path = SAMPLES / "chat.jsonl"
    want = loaded(path)
    got = load_trace(path)
    got.accesses.block[:] = -7
    got.block_size[:] = 0
    assert_same(load_trace(path), want)


def test_a_damaged_entry_is_a_miss_and_is_replaced(store):
    path = SAMPLES / "chat.jsonl"
    want = loaded(path)
    (entry,) = [d for d, _, _ in prepared.entries(store)]
    npy = entry / "block.npy"
    whole = npy.stat().st_size
    npy.write_bytes(npy.read_bytes()[: whole // 2])
    assert_same(loaded(path), want)  # rebuilt (and stored again)
    assert npy.stat().st_size == whole
    assert_same(loaded(path), want)
    (entry / "trace.json").write_text("{not json")
    assert_same(loaded(path), want)
    (entry / "requests.arrow").unlink()  # a file of the entry removed by hand
    assert_same(loaded(path), want)
    assert (entry / "requests.arrow").is_file()


def test_switched_off_or_unwritable_stores_nothing_and_changes_nothing(tmp_path, monkeypatch):
    path = SAMPLES / "chat.jsonl"
    want = built(path)
    monkeypatch.setenv(prepared.CACHE_DIR_ENV, "off")
    assert prepared.cache_root() is None
    assert_same(loaded(path), want)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(prepared.CACHE_DIR_ENV, str(blocker))
    assert_same(loaded(path), want)
    assert blocker.read_text() == "not a directory"


def test_pipes_and_directories_are_not_prepared(store, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    shutil.copyfile(SAMPLES / "chat.jsonl", shards / "part-0.jsonl")
    assert_same(loaded(shards), built(shards))
    assert prepared.trace_key(shards, {}) is None
    assert prepared.entries(store) == []


def test_the_least_recently_used_entries_go_first(store, tmp_path, monkeypatch):
    paths = []
    lines = (SAMPLES / "chat.jsonl").read_text().splitlines(keepends=True)
    for i in range(3):  # three traces of one size
        p = tmp_path / f"t{i}.jsonl"
        p.write_text("".join(lines[100 * i: 100 * (i + 1)]))
        paths.append(p)
    loaded(paths[0])
    size = prepared.entries(store)[0][1]
    monkeypatch.setenv(prepared.CACHE_MAX_ENV, str(int(size * 2.6)))  # room for two
    loaded(paths[1])
    old = prepared.entries(store)[0][0]
    os.utime(old, (1, 1))  # entry 0 is the least recently used...
    loaded(paths[0])  # ...until this use
    loaded(paths[2])  # over the limit: entry 1 is now the oldest
    keys = {d.name for d, _, _ in prepared.entries(store)}
    want = {prepared.trace_key(p, prepared_options()) for p in (paths[0], paths[2])}
    assert keys == want


def prepared_options() -> dict:
    from kvtrace.ingest import _prepared_options

    return _prepared_options("auto", None, False, None)


def test_private_directories_of_dead_writers_are_removed(store):
    loaded(SAMPLES / "chat.jsonl")
    dead = store / ".tmp-999999999-x"
    dead.mkdir()
    mine = store / f".tmp-{os.getpid()}-y"
    mine.mkdir()
    prepared.prune(store, prepared.max_bytes())
    assert not dead.exists() and mine.exists()


def test_the_memory_guard_holds_on_a_mapped_trace(store, monkeypatch):
    path = SAMPLES / "chat.jsonl"
    loaded(path, workload="curve")
    monkeypatch.setenv("KVTRACE_MEMORY_BUDGET", "1KiB")
    with pytest.raises(KvtraceError, match="needs about"):
        load_trace(path, workload="curve")


def test_commands_give_the_same_outputs_cold_and_warm_and_cache_lists_and_clears(store, tmp_path):
    trace = tmp_path / "t.jsonl"
    shutil.copyfile(SAMPLES / "chat.jsonl", trace)
    outs = []
    for i in range(2):
        out = tmp_path / f"curve{i}.parquet"
        r = run_cli(["curve", str(trace), "--out", str(out)])
        assert r.exit_code == 0, r.output
        prepared.wait()
        outs.append(pl.read_parquet(out))
    assert outs[0].equals(outs[1])
    r = run_cli(["cache"])
    assert r.exit_code == 0 and "1 prepared trace," in r.output, r.output
    r = run_cli(["cache", "--clear"])
    assert r.exit_code == 0 and "freed" in r.output
    assert prepared.entries(store) == []


@pytest.mark.parametrize("value", ["lots", "16 parsecs", "-5GiB"])
def test_a_bad_store_limit_is_a_one_line_error_naming_the_variable(store, monkeypatch, value):
    monkeypatch.setenv(prepared.CACHE_MAX_ENV, value)
    res = CliRunner().invoke(app, ["stats", str(SAMPLES / "chat.jsonl")], env={"COLUMNS": "200"})
    assert res.exit_code != 0
    lines = [ln for ln in res.output.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and prepared.CACHE_MAX_ENV in lines[0], res.output
    assert prepared.entries(store) == []  # nothing stored under a limit it could not read


@pytest.mark.parametrize("value,want", [("", prepared.DEFAULT_MAX_BYTES), ("12345", 12345), ("2GiB", 2 << 30),
                                        ("500MB", 500_000_000)])
def test_the_store_limit_reads_plain_bytes_and_units(monkeypatch, value, want):
    monkeypatch.setenv(prepared.CACHE_MAX_ENV, value)
    assert prepared.max_bytes() == want


def test_an_unchanged_file_is_not_hashed_again_and_a_changed_one_is(store, tmp_path, monkeypatch):
    path = tmp_path / "t.jsonl"
    shutil.copy(SAMPLES / "chat.jsonl", path)
    reads = []
    real = prepared.file_digest
    monkeypatch.setattr(prepared, "file_digest", lambda p: reads.append(p) or real(p))
    first = prepared.content_digest(path)
    assert first == real(path) and len(reads) == 1
    assert prepared.content_digest(path) == first and len(reads) == 1  # remembered
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[10:12] = b"99" if data[10:12] != b"99" else b"98"
    path.write_bytes(bytes(data))  # same size, other bytes, the old times put back
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    changed = prepared.content_digest(path)
    assert len(reads) == 2 and changed == real(path) != first  # the change time moved: hashed anew
    assert run_cli(["cache", "--clear"]).exit_code == 0
    assert not (store / "digests").exists()
