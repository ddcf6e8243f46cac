"""Streamed tier what-ifs (``kvtrace whatif --stream``) equal in-memory runs bit for bit.

The trace is a synthetic Parquet table in many row groups and the replay is fed in
chunks of a few thousand accesses, so every carried state (block rows, tier lists,
sketch, group statistics, per-request outputs) crosses many chunk boundaries.
Comparisons are exact: summary dicts with ``==``, tables with
``assert_frame_equal(check_exact=True)``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from numpy.testing import assert_array_equal
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

import kvtrace.ingest.stream as stream_mod
from kvtrace.trace import source as source_mod
from kvtrace.ingest import synth
from kvtrace.cli import app
from kvtrace.ingest import load_trace
from kvtrace.kernels import tiers as K
from kvtrace.ingest.stream import open_stream
from kvtrace.analyses.whatif import TierConfig, oracle_flags, route, simulate, sweep

KEEP = ("request_id", "session_id", "type", "tenant", "turn")


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(source_mod, "CHUNK_ACCESSES", 3_000)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    path = tmp_path_factory.mktemp("whatif_stream") / "mixed.parquet"
    synth.write_chunked("mixed", 2_000, 11, path, "parquet", chunk_requests=300)
    return path


@pytest.fixture(scope="module")
def loaded(mixed):
    return load_trace(mixed)


@pytest.fixture()
def streamed(mixed):
    with open_stream(mixed, columns=KEEP) as st:
        yield st


def _caps(trace):
    """DRAM and flash bytes holding 1/40 and 1/8 of the distinct blocks (Llama-3.1-8B)."""
    total = int(trace.block_size.sum()) * 131_072
    return total // 40, total // 8


def assert_same_result(a, b):
    assert a.summary == b.summary
    assert a.info == b.info
    assert_frame_equal(a.residency, b.residency, check_exact=True)
    assert_frame_equal(a.requests, b.requests, check_exact=True)


def test_many_chunks(loaded):
    assert loaded.n_accesses > 8 * source_mod.CHUNK_ACCESSES


def test_first_blocks_and_routing_match(loaded, streamed):
    rs = loaded.req_start
    want = np.where(rs[1:] > rs[:-1], loaded.accesses.block[np.minimum(rs[:-1], loaded.n_accesses - 1)], -1)
    assert_array_equal(loaded.first_blocks(), want)
    assert_array_equal(streamed.first_blocks(), want)
    for routing in ("session", "prefix", "round-robin"):
        assert_array_equal(route(streamed, 3, routing), route(loaded, 3, routing))


@pytest.mark.parametrize("policy", ["all", "none", "second-hit", "prob:0.4", "idle<30s", "tinylfu",
                                    "group:type>=0.5", "reuse-oracle"])
@pytest.mark.parametrize("eviction", ["prefix-aware", "flat"])
def test_each_policy_streamed_equals_in_memory(loaded, streamed, policy, eviction):
    dram, flash = _caps(loaded)
    cfg = TierConfig(dram, flash_bytes=flash, policy=policy)
    want = simulate(loaded, cfg, eviction=eviction, warmup="0.1", model="Llama-3.1-8B")
    got = simulate(streamed, cfg, eviction=eviction, warmup="0.1", model="Llama-3.1-8B")
    assert_same_result(got, want)
    if policy == "all":  # the capacities make both tiers matter
        assert 0 < want.summary["dram_prefix_token_hit_rate"] and 0 < want.summary["flash_prefix_token_hit_rate"]


@pytest.mark.parametrize("routing", ["session", "prefix", "round-robin"])
def test_nodes_local_ssd_and_options_streamed(loaded, streamed, routing):
    dram, flash = _caps(loaded)
    cfg = TierConfig(dram // 3, flash_bytes=flash, local_ssd_bytes=dram // 2, nodes=3, routing=routing,
                     policy="freq>=3", promotion="copy", write_mode="write-through", inclusive=True,
                     flash_order="fifo")
    assert_same_result(simulate(streamed, cfg, model="Llama-3.1-8B"), simulate(loaded, cfg, model="Llama-3.1-8B"))


def test_value_policy_reads_values_from_a_spill_file(loaded, streamed):
    rng = np.random.default_rng(3)
    values = rng.normal(0.0, 1e-6, loaded.n_accesses)
    path = streamed.spill / "test-values"
    values.tofile(path)
    dram, flash = _caps(loaded)
    cfg = TierConfig(dram, flash_bytes=flash, policy="value>=0")
    got = simulate(streamed, cfg, values=path, model="Llama-3.1-8B")
    want = simulate(loaded, cfg, values=values, model="Llama-3.1-8B")
    assert_same_result(got, want)
    assert got.summary["value_bound_usd"] > 0
    with pytest.raises(Exception, match="float64 values"):
        simulate(streamed, cfg, values=values[:-1].tofile(path) or path, model="Llama-3.1-8B")


@pytest.mark.parametrize("policy", ["all", "tinylfu", "group:type>=0.5", "reuse-oracle", "value>=0"])
def test_in_memory_chunks_equal_one_chunk(loaded, monkeypatch, policy):
    """A trace in memory replayed in many chunks gives what one chunk over all of it gives."""
    values = np.random.default_rng(5).normal(0.0, 1e-6, loaded.n_accesses)
    dram, flash = _caps(loaded)
    cfg = TierConfig(dram // 2, flash_bytes=flash, local_ssd_bytes=dram // 4, nodes=2, policy=policy)
    got = simulate(loaded, cfg, values=values, warmup="0.1", model="Llama-3.1-8B")
    monkeypatch.setattr(source_mod, "CHUNK_ACCESSES", loaded.n_accesses + 1)
    assert_same_result(got, simulate(loaded, cfg, values=values, warmup="0.1", model="Llama-3.1-8B"))


def test_oracle_flags_from_the_backward_chunk_pass(loaded, streamed):
    dram, flash = _caps(loaded)
    caps = (dram // 131_072, 0, flash // 131_072)  # tokens
    node = np.zeros(loaded.n_requests, dtype=np.int64)
    a = loaded.accesses
    opts = dict(block_tokens=loaded.meta.block_tokens, prefix_aware=True, dram=caps[0], local=0, flash=caps[2],
                n_nodes=1)
    run = K.simulate_tiers(a.block, loaded.block_size, a.req_start, a.tokens, a.pos, loaded.request_timestamp, node,
                           **opts)
    sim = K.TierSimulator(streamed.block_size, streamed.request_timestamp, node, chunk_columns=True, **opts)
    decisions = streamed.column("dec", np.int8)
    for ch in streamed.chunks():
        decisions.write(ch.lo, sim.feed(ch.block, ch.tokens, ch.pos, ch.lrs))
    decisions.close()
    assert_array_equal(np.fromfile(decisions.path, dtype=np.int8) & 3, run.decision)
    flags = oracle_flags(streamed, decisions)
    want = K.reuse_oracle_flags(a.block, loaded.n_blocks, run.decision)
    assert_array_equal(np.fromfile(flags.path, dtype=np.int8), want)
    assert want.any() and not want.all()
    in_memory = loaded.column("dec", np.int8)
    in_memory.write(0, run.decision)
    assert_array_equal(oracle_flags(loaded, in_memory).array, want)


def test_streamed_sweep_in_two_processes_equals_serial(loaded, streamed):
    dram, flash = _caps(loaded)
    configs = [TierConfig(d, flash_bytes=flash, policy=p) for d in (dram // 2, dram) for p in ("all", "tinylfu")]
    want = sweep(loaded, configs, workers=1, model="Llama-3.1-8B")
    assert_frame_equal(sweep(streamed, configs, workers=2, model="Llama-3.1-8B"), want, check_exact=True)


def test_cli_whatif_stream_equals_no_stream(mixed):
    runner = CliRunner()
    args = ["whatif", str(mixed), "--dram", "2GiB", "--flash", "16GiB",
            "--policy", "all,second-hit,reuse-oracle,value>=0", "--nodes", "2", "--model", "Llama-3.1-8B", "--json", "-"]
    streamed = runner.invoke(app, args + ["--stream"])
    assert streamed.exit_code == 0, streamed.output
    in_memory = runner.invoke(app, args + ["--no-stream"])
    assert in_memory.exit_code == 0, in_memory.output
    assert json.loads(streamed.stdout) == json.loads(in_memory.stdout)


def test_the_replay_really_runs_in_many_chunks(streamed):
    chunks = list(streamed._chunks())
    assert len(chunks) > 8
    assert max(hi - lo for _, _, lo, hi in chunks) < 2 * source_mod.CHUNK_ACCESSES
