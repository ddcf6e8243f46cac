"""Prefix families below the shared root (``kvtrace value``; kvtrace.analyses.value.shared_root).

When (almost) every request starts with the same blocks, families are rooted at the
first position below that shared root. Layers: by-hand traces pin the definition
(the 99 % boundary, requests no longer than the root, a request that diverges inside
it); :func:`naive.naive_families` (the twin, a plain-Python reading of the module
docstring) checks the library on random traces; the streamed run equals the
in-memory one; the real Mooncake trace gets more than one family.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

import kvtrace.ingest.stream as stream_mod
import kvtrace.analyses.value as value_mod
from kvtrace.trace import source as source_mod
from kvtrace.cli import app
from kvtrace.analyses.curves import SHARED_FIRST_BLOCK_SHARE
from kvtrace.ingest import load_trace
from kvtrace.ingest.stream import open_stream
from kvtrace.analyses.value import family_roots, shared_root, value_report

from naive import SHARED_FIRST_BLOCK_SHARE_TWIN, naive_families

MOONCAKE = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "mooncake_conversation.jsonl"
SYS = [1000, 1001]  # a two-block system prompt


# --------------------------------------------------------------------------- the twin


def requests_of(trace):
    rs, block = trace.accesses.req_start, trace.accesses.block
    return [block[rs[i]:rs[i + 1]].tolist() for i in range(rs.shape[0] - 1)]


def write_trace(path: Path, hashes, block_tokens: int = 16) -> Path:
    """A generic Parquet trace: one request per hash list, 1 s apart, full blocks."""
    n = len(hashes)
    table = pa.table({"ts_ms": pa.array([1000 * i for i in range(n)], pa.int64()),
                      "input_length": pa.array([block_tokens * len(h) for h in hashes], pa.int64()),
                      "hash_ids": pa.array(hashes, pa.list_(pa.uint64()))})
    pq.write_table(table, path, row_group_size=7)
    return path


def families_by_hash(res):
    """{root hash: blocks} of the per-prefix table."""
    return dict(zip(res.per_prefix["root_hash"].to_list(), res.per_prefix["blocks"].to_list()))


# --------------------------------------------------------------------------- by hand

# every request starts with the 2-block system prompt, then one of 3 conversations
# (A: 1, 2, 3; B: 11, 12, 13; C: 21, 22); one request is the prompt alone, one shorter
CONVERSATIONS = [SYS + [1, 2], SYS + [11], SYS + [1, 2, 3], SYS + [21, 22], SYS + [11, 12, 13], SYS, SYS[:1]]


@pytest.fixture
def conversations(tmp_path):
    return write_trace(tmp_path / "conv.parquet", CONVERSATIONS)


def test_families_below_a_two_block_system_prompt(conversations):
    trace = load_trace(conversations, block_tokens=16)
    res = value_report(trace)
    s = res.summary
    assert s["shared_root_blocks"] == 2 and s["shared_root_hashes"] == SYS
    assert s["shared_root_request_share"] == 6 / 7  # the 1-block request does not carry it
    # by hand: the shared root (its 2 blocks), A {1, 2, 3}, B {11, 12, 13}, C {21, 22}
    assert families_by_hash(res) == {1000: 2, 1: 3, 11: 3, 21: 2}
    assert s["prefixes"] == 4 and s["blocks"] == 10
    pb = res.per_block
    root_hash = dict(zip(pb["hash"].to_list(), trace.block_hash[pb["root_block"].to_numpy()].tolist()))
    assert root_hash == {1000: 1000, 1001: 1000, 1: 1, 2: 1, 3: 1, 11: 11, 12: 11, 13: 11, 21: 21, 22: 21}
    root, share, family = naive_families(requests_of(trace))
    assert trace.block_hash[root].tolist() == SYS and share == 6 / 7
    assert pb["root_block"].to_list() == [family[b] for b in range(pb.height)]


def test_minorities_at_the_99_percent_boundary(tmp_path):
    """198 of 200 requests carry the prompt at position 1 (exactly 99 %: still shared);
    the request [S0, 77] is no longer than the root (shared family); [S0, 88, 89, 90]
    diverges inside it and is rooted at its own position-2 block, 89."""
    hashes = [SYS + [500 + i % 5, 600 + i] for i in range(198)] + [[1000, 77], [1000, 88, 89, 90]]
    res = value_report(load_trace(write_trace(tmp_path / "t.parquet", hashes), block_tokens=16))
    s = res.summary
    assert s["shared_root_hashes"] == SYS and s["shared_root_request_share"] == 198 / 200
    # shared: 1000, 1001, 77; five conversations of 1 + 40 or 39 blocks; 89's family: 88, 89, 90
    assert families_by_hash(res) == {1000: 3, 500: 41, 501: 41, 502: 41, 503: 40, 504: 40, 89: 3}


def test_98_percent_share_is_no_shared_root(tmp_path):
    """Below the threshold the families are the position-0 ones, as before."""
    hashes = [[1000, 1001, 2000 + i] for i in range(98)] + [[7, 8], [9]]
    trace = load_trace(write_trace(tmp_path / "t.parquet", hashes), block_tokens=16)
    res = value_report(trace)
    s = res.summary
    assert (s["shared_root_blocks"], s["shared_root_hashes"], s["shared_root_request_share"]) == (0, [], None)
    assert families_by_hash(res) == {1000: 100, 7: 2, 9: 1}
    rs, block = trace.accesses.req_start, trace.accesses.block
    first_request = [next(r for r in range(len(rs) - 1) if b in block[rs[r]:rs[r + 1]]) for b in range(trace.n_blocks)]
    assert res.per_block["root_block"].to_list() == [int(block[rs[r]]) for r in first_request]
    out = CliRunner().invoke(app, ["value", str(tmp_path / "t.parquet"), "--block-tokens", "16"],
                             env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    assert "blocks / prefix families " in out.stdout and "shared root" not in out.stdout
    assert "top 10 prefix families by value" in out.stdout


def test_cli_names_the_skipped_root(conversations):
    out = CliRunner().invoke(app, ["value", str(conversations), "--block-tokens", "16", "--json", "-"],
                             env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    s = json.loads(out.stdout)["summary"]
    assert (s["shared_root_blocks"], s["shared_root_hashes"]) == (2, SYS)
    out = CliRunner().invoke(app, ["value", str(conversations), "--block-tokens", "16"], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    text = out.stdout
    assert "blocks / prefix families below the shared root (2 blocks, carried by 85.71% of requests)" in text
    assert "shared root skipped (hashes)" in text and "1000, 1001" in text
    assert "top 10 prefix families below the shared root by value" in text and "1000 (shared root)" in text


# --------------------------------------------------------------------------- streamed


@pytest.mark.parametrize("chunk", [2, 5, 1000])
def test_streamed_families_equal_in_memory(conversations, monkeypatch, chunk):
    monkeypatch.setattr(source_mod, "CHUNK_ACCESSES", chunk * value_mod.CHUNK_SHARE)
    expected = value_report(load_trace(conversations, block_tokens=16))
    with open_stream(conversations, block_tokens=16) as st:
        got = value_report(st)
    assert_frame_equal(expected.per_block, got.per_block, check_exact=True)
    assert_frame_equal(expected.per_prefix, got.per_prefix, check_exact=True)
    assert expected.summary == got.summary and got.summary["shared_root_hashes"] == SYS


# --------------------------------------------------------------------------- vs the twin


@st.composite
def prompted_requests(draw):
    """Request block lists: most (sometimes all) start with a prompt of 0-3 blocks,
    then one of a few conversations; some repeat blocks, some are empty."""
    prompt = list(range(100, 100 + draw(st.integers(0, 3))))
    n = draw(st.integers(1, 130))
    out = []
    for _ in range(n):
        kind = draw(st.sampled_from(["prompted"] * 6 + ["short", "other", "empty"]))
        tail = [draw(st.integers(0, 4)) * 10 + j for j in range(draw(st.integers(0, 4)))]
        if kind == "prompted":
            out.append(prompt + tail)
        elif kind == "short":
            out.append(prompt[:draw(st.integers(0, len(prompt)))])
        elif kind == "other":
            out.append([draw(st.integers(0, 60)) for _ in range(draw(st.integers(1, 5)))])
        else:
            out.append([])
    return out


@settings(deadline=None, max_examples=150)
@given(prompted_requests())
def test_shared_root_and_families_match_twin(requests):
    """The two functions on a dense access table (ids = the hypothesis' integers)."""
    req_start = np.concatenate([[0], np.cumsum([len(r) for r in requests])]).astype(np.int64)
    block = np.array([b for r in requests for b in r], dtype=np.int64)
    root, share = shared_root(req_start, block)
    want_root, want_share, family = naive_families(requests)
    assert root.tolist() == want_root and share == want_share
    blocks = sorted(family)
    request = np.repeat(np.arange(len(requests)), np.diff(req_start))
    first = {}
    for t, b in enumerate(block.tolist()):
        first.setdefault(b, int(request[t]))
    first_request = np.array([first.get(b, 0) for b in range(max(blocks, default=-1) + 1)], dtype=np.int64)
    for chunk in (1, 3, 1 << 22):
        got = family_roots(first_request, req_start, block, root, chunk=chunk)
        assert [int(got[b]) for b in blocks] == [family[b] for b in blocks]
    assert family_roots(first_request, req_start, block.astype(np.int32), root, dtype=np.int32).dtype == np.int32


# --------------------------------------------------------------------------- real trace


def test_real_trace_has_families_below_hash_0():
    if not MOONCAKE.exists():
        pytest.skip(f"shared trace not available: {MOONCAKE}")
    res = value_report(load_trace(MOONCAKE))
    s = res.summary
    assert s["shared_root_hashes"] == [0] and s["shared_root_blocks"] == 1
    assert s["shared_root_request_share"] == 1.0
    assert s["prefixes"] > 1 and res.per_prefix.height == s["prefixes"]
    shared = res.per_prefix.filter(res.per_prefix["root_hash"] == 0)
    assert shared["blocks"].to_list() == [1]  # hash 0 alone: every request goes past it


def test_the_twin_uses_the_products_threshold():
    assert SHARED_FIRST_BLOCK_SHARE_TWIN == SHARED_FIRST_BLOCK_SHARE
