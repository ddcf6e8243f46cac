"""Trace ingest (DESIGN §1): every source format -> the same canonical trace.

Golden values are either written out by hand below or computed by
:func:`expected_trace`, a plain-Python restatement of DESIGN §1 (stable sort by
time, partial last block clamped to [1, B], dense ids in order of first appearance
via a dict). Neither reuses kvtrace code.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np
import numpy.testing as npt
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from kvtrace.errors import KvtraceError
from kvtrace.ingest import load_trace, read_metadata, write_canonical
from kvtrace.trace import REQUEST_SCHEMA, Trace

SHARED_TRACES = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
BIG = 2**63  # hashes at or above this do not fit an int64

# --------------------------------------------------------------------------- helpers


def moon(ts_ms, input_length, output_length, hash_ids) -> dict:
    return {"timestamp": ts_ms, "input_length": input_length, "output_length": output_length, "hash_ids": hash_ids}


def write_jsonl(path: Path, records: list, blank_lines_before: int = 0) -> Path:
    """One JSON object per line; ``records`` items that are str are written verbatim."""
    lines = [""] * blank_lines_before
    lines += [r if isinstance(r, str) else json.dumps(r) for r in records]
    path.write_text("\n".join(lines) + "\n")
    return path


def expected_trace(records: list[dict], block_tokens: int = 512, ticks_per_second: int = 1000) -> dict:
    """DESIGN §1 in plain Python: the canonical tables a reader must produce.

    ``records`` are Mooncake-style dicts; seconds = ``timestamp / ticks_per_second``.
    """
    order = sorted(range(len(records)), key=lambda i: records[i]["timestamp"])  # stable
    secs = [records[i]["timestamp"] / ticks_per_second for i in order]
    t0 = secs[0]
    ids: dict[int, int] = {}
    request, pos, block, tokens, req_start = [], [], [], [], [0]
    block_hash, block_size = [], []
    for r, i in enumerate(order):
        rec = records[i]
        n = len(rec["hash_ids"])
        for j, h in enumerate(rec["hash_ids"]):
            tok = block_tokens if j < n - 1 else min(max(rec["input_length"] - block_tokens * (n - 1), 1), block_tokens)
            if h not in ids:
                ids[h] = len(block_hash)
                block_hash.append(h)
                block_size.append(0)
            b = ids[h]
            block_size[b] = max(block_size[b], tok)
            request.append(r)
            pos.append(j)
            block.append(b)
            tokens.append(tok)
        req_start.append(len(block))
    return {
        "order": order,
        "timestamp": [s - t0 for s in secs],
        "request": request,
        "pos": pos,
        "block": block,
        "tokens": tokens,
        "req_start": req_start,
        "block_hash": block_hash,
        "block_size": block_size,
    }


def expected_requests(records: list[dict], exp: dict) -> pl.DataFrame:
    """The canonical request table for Mooncake-style records (request_id = file line index)."""
    o = exp["order"]
    return pl.DataFrame(
        {
            "request_id": o,
            "timestamp": exp["timestamp"],
            "session_id": [None] * len(o),
            "parent_id": [None] * len(o),
            "turn": [None] * len(o),
            "type": [None] * len(o),
            "tenant": [None] * len(o),
            "input_tokens": [records[i]["input_length"] for i in o],
            "output_tokens": [records[i]["output_length"] for i in o],
            "block_ids": [records[i]["hash_ids"] for i in o],
        },
        schema=REQUEST_SCHEMA,
    )


def assert_matches_expected(trace: Trace, exp: dict) -> None:
    a = trace.accesses
    assert a.request.tolist() == exp["request"]
    assert a.pos.tolist() == exp["pos"]
    assert a.block.tolist() == exp["block"]
    assert a.tokens.tolist() == exp["tokens"]
    assert a.req_start.tolist() == exp["req_start"]
    assert [int(h) for h in trace.block_hash] == exp["block_hash"]
    assert trace.block_size.tolist() == exp["block_size"]
    assert trace.requests["timestamp"].to_list() == exp["timestamp"]


def assert_same_trace(a: Trace, b: Trace) -> None:
    """Identical canonical tables (values and dtypes)."""
    assert_frame_equal(a.requests, b.requests, check_dtypes=True)
    for name in ("request", "pos", "block", "tokens", "req_start"):
        x, y = getattr(a.accesses, name), getattr(b.accesses, name)
        assert x.dtype == y.dtype, name
        npt.assert_array_equal(x, y, err_msg=name)
    for name in ("block_hash", "block_tenant", "block_size"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype, name
        npt.assert_array_equal(x, y, err_msg=name)
    assert a.meta.block_tokens == b.meta.block_tokens


def assert_error(exc: pytest.ExceptionInfo, path: Path, line: int | None, field: str | None) -> str:
    msg = str(exc.value)
    if line is not None:
        assert f"{path}:{line}:" in msg, msg
    else:
        assert str(path) in msg, msg
    if field is not None:
        assert f"'{field}'" in msg, msg
    return msg


# Mooncake records with hand-computed golden values (B = 512). Distinct timestamps,
# so any file order of the same requests gives the same trace order.
HAND = [
    moon(1000, 1100, 10, [7, 8, 9]),  # 512, 512, 1100 - 1024 = 76
    moon(1500, 600, 20, [7, 11]),  # 512, 88
    moon(4000, 1024, 5, [7, 8]),  # 512, 512 (exactly full)
    moon(5250, 1, 1, [9]),  # 1 token: block 9 keeps its max (476 below)
    moon(6000, 1500, 2, [7, 8, 9]),  # 512, 512, 476
    moon(6500, 300, 3, [2**64 - 1]),  # one partial block, a hash >= 2^63
]
HAND_TS = [0.0, 0.5, 3.0, 4.25, 5.0, 5.5]
HAND_REQUEST = [0, 0, 0, 1, 1, 2, 2, 3, 4, 4, 4, 5]
HAND_POS = [0, 1, 2, 0, 1, 0, 1, 0, 0, 1, 2, 0]
HAND_BLOCK = [0, 1, 2, 0, 3, 0, 1, 2, 0, 1, 2, 4]
HAND_TOKENS = [512, 512, 76, 512, 88, 512, 512, 1, 512, 512, 476, 300]
HAND_REQ_START = [0, 3, 5, 7, 8, 11, 12]
HAND_BLOCK_HASH = [7, 8, 9, 11, 2**64 - 1]
HAND_BLOCK_SIZE = [512, 512, 476, 88, 300]


def check_hand(trace: Trace) -> None:
    a = trace.accesses
    assert a.request.tolist() == HAND_REQUEST
    assert a.pos.tolist() == HAND_POS
    assert a.block.tolist() == HAND_BLOCK
    assert a.tokens.tolist() == HAND_TOKENS
    assert a.req_start.tolist() == HAND_REQ_START
    assert [int(h) for h in trace.block_hash] == HAND_BLOCK_HASH
    assert trace.block_size.tolist() == HAND_BLOCK_SIZE
    assert trace.requests["timestamp"].to_list() == HAND_TS
    assert trace.requests["input_tokens"].to_list() == [r["input_length"] for r in HAND]
    assert trace.requests["output_tokens"].to_list() == [r["output_length"] for r in HAND]
    assert trace.requests["block_ids"].to_list() == [r["hash_ids"] for r in HAND]


# --------------------------------------------------------------------------- 1. Mooncake


def test_mooncake_request_table_schema_and_values(tmp_path):
    trace = load_trace(write_jsonl(tmp_path / "m.jsonl", HAND))
    assert trace.requests.schema == pl.Schema(REQUEST_SCHEMA)
    assert trace.requests.columns == list(REQUEST_SCHEMA)
    assert trace.requests["request_id"].to_list() == [0, 1, 2, 3, 4, 5]
    for col in ("session_id", "parent_id", "turn", "type", "tenant"):
        assert trace.requests[col].null_count() == 6, col
    assert trace.meta.block_tokens == 512
    assert trace.meta.source_format == "mooncake"
    assert trace.warnings == []
    assert trace.n_requests == 6 and trace.n_accesses == 12 and trace.n_blocks == 5
    assert trace.duration == 5.5


def test_mooncake_access_table(tmp_path):
    trace = load_trace(write_jsonl(tmp_path / "m.jsonl", HAND))
    check_hand(trace)
    a = trace.accesses
    assert (a.request.dtype, a.pos.dtype, a.block.dtype, a.tokens.dtype, a.req_start.dtype) == (
        np.int64, np.int32, np.int64, np.int32, np.int64,
    )
    assert trace.block_hash.dtype == np.uint64
    assert (trace.block_tenant == -1).all()
    # the naive restatement agrees with the hand values
    assert_matches_expected(trace, expected_trace(HAND))
    # access_table(): the canonical columns, timestamp = arrival of the access's request
    tab = trace.access_table()
    assert tab.columns == ["t", "request", "pos", "block", "tokens", "timestamp"]
    assert tab["t"].to_list() == list(range(12))
    assert tab["timestamp"].to_list() == [HAND_TS[r] for r in HAND_REQUEST]


def test_mooncake_block_hash_maps_back_to_source(tmp_path):
    trace = load_trace(write_jsonl(tmp_path / "m.jsonl", HAND))
    a = trace.accesses
    for r, rec in enumerate(HAND):  # trace order == file order here
        got = [int(trace.block_hash[b]) for b in a.block[a.req_start[r]: a.req_start[r + 1]]]
        assert got == rec["hash_ids"]


def test_mooncake_block_tokens_override(tmp_path):
    recs = [moon(0, 100, 1, [1, 2, 3, 4]), moon(10, 70, 1, [1, 2, 3, 4, 5])]
    trace = load_trace(write_jsonl(tmp_path / "m.jsonl", recs), block_tokens=32)
    assert trace.meta.block_tokens == 32
    # 100 = 32*3 + 4; 70 < 32*4 -> last block clamped to 1 (and a warning for request 1)
    assert trace.accesses.tokens.tolist() == [32, 32, 32, 4, 32, 32, 32, 32, 1]
    assert trace.block_size.tolist() == [32, 32, 32, 32, 1]


# --------------------------------------------------------------------------- 2. Qwen-Bailian


def bai(chat, parent, ts, il, hashes, typ="text", turn=1, ol=2) -> dict:
    return {"chat_id": chat, "parent_chat_id": parent, "timestamp": ts, "input_length": il,
            "output_length": ol, "type": typ, "turn": turn, "hash_ids": hashes}


def test_bailian_sessions_blocks_and_fields(tmp_path):
    recs = [  # file order: a child before its parent
        bai(101, 100, 10.5, 40, [1, 2, 3], turn=2),
        bai(100, -1, 10.0, 20, [1, 2], turn=1),
        bai(102, 101, 11.25, 33, [1, 2, 3], turn=3),
        bai(200, 999, 12.0, 16, [50], typ="image", turn=4),  # parent 999 not in the trace
        bai(201, 200, 12.0, 17, [50, 51], typ="file", turn=5),
        bai(300, -1, 13.0, 5, [1], turn=1),
        bai(103, 102, 14.0, 40, [1, 2, 3], turn=4),  # four-level chain 100-101-102-103
    ]
    trace = load_trace(write_jsonl(tmp_path / "b.jsonl", recs))
    assert trace.meta.block_tokens == 16 and trace.meta.source_format == "bailian"
    req = trace.requests
    assert req.schema == pl.Schema(REQUEST_SCHEMA)
    assert req["request_id"].to_list() == [100, 101, 102, 200, 201, 300, 103]
    assert req["session_id"].to_list() == [100, 100, 100, 200, 200, 300, 100]
    assert req["parent_id"].to_list() == [None, 100, 101, 999, 200, None, 102]
    assert req["turn"].to_list() == [1, 2, 3, 4, 5, 1, 4]
    assert req["type"].to_list() == ["text", "text", "text", "image", "file", "text", "text"]
    assert req["timestamp"].to_list() == [0.0, 0.5, 1.25, 2.0, 2.0, 3.0, 4.0]
    a = trace.accesses
    assert a.block.tolist() == [0, 1, 0, 1, 2, 0, 1, 2, 3, 3, 4, 0, 0, 1, 2]
    assert a.tokens.tolist() == [16, 4, 16, 16, 8, 16, 16, 1, 16, 16, 1, 5, 16, 16, 8]
    assert a.req_start.tolist() == [0, 2, 5, 8, 9, 11, 12, 15]
    assert [int(h) for h in trace.block_hash] == [1, 2, 3, 50, 51]
    assert trace.block_size.tolist() == [16, 16, 8, 16, 1]
    # the child-before-parent file order is one decrease of the timestamps
    assert len(trace.warnings) == 1 and "monotonic" in trace.warnings[0]


@pytest.mark.parametrize("cycle", [[(1, 2), (2, 1)], [(1, 2), (2, 3), (3, 1)], [(1, 2), (2, 3), (3, 4), (4, 1)]])
def test_bailian_parent_cycle_is_an_error(tmp_path, cycle):
    recs = [bai(c, p, float(i), 16, [c]) for i, (c, p) in enumerate(cycle)]
    recs.append(bai(50, -1, 9.0, 16, [50]))
    with pytest.raises(KvtraceError, match="cycle"):
        load_trace(write_jsonl(tmp_path / "b.jsonl", recs))


def test_bailian_missing_field_names_line(tmp_path):
    bad = bai(2, 1, 1.0, 16, [5])
    del bad["parent_chat_id"]
    path = write_jsonl(tmp_path / "b.jsonl", [bai(1, -1, 0.0, 16, [5]), bad])
    with pytest.raises(KvtraceError) as exc:
        load_trace(path, fmt="bailian")
    assert_error(exc, path, 2, "parent_chat_id")


# --------------------------------------------------------------------------- 3. generic tables


def generic_request_frame(records: list[dict]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "request_id": list(range(len(records))),
            "timestamp_ms": [r["timestamp"] for r in records],
            "input_length": [r["input_length"] for r in records],
            "output_length": [r["output_length"] for r in records],
            "hash_ids": [r["hash_ids"] for r in records],
        },
        schema={"request_id": pl.Int64, "timestamp_ms": pl.Int64, "input_length": pl.Int64,
                "output_length": pl.Int64, "hash_ids": pl.List(pl.UInt64)},
    )


def exploded_rows(records: list[dict], seed: int = 0) -> pl.DataFrame:
    rows = [
        (i, j, h, r["timestamp"] / 1000, r["input_length"], r["output_length"])
        for i, r in enumerate(records)
        for j, h in enumerate(r["hash_ids"])
    ]
    perm = np.random.default_rng(seed).permutation(len(rows))
    rows = [rows[k] for k in perm]
    assert [r[:2] for r in rows] != sorted(r[:2] for r in rows)  # really shuffled
    cols = list(zip(*rows))
    return pl.DataFrame(
        {"request_id": cols[0], "pos": cols[1], "hash_id": cols[2], "timestamp": cols[3],
         "input_tokens": cols[4], "output_tokens": cols[5]},
        schema={"request_id": pl.Int64, "pos": pl.Int64, "hash_id": pl.UInt64, "timestamp": pl.Float64,
                "input_tokens": pl.Int64, "output_tokens": pl.Int64},
    )


@pytest.fixture
def hand_jsonl_trace(tmp_path) -> Trace:
    return load_trace(write_jsonl(tmp_path / "m.jsonl", HAND))


def test_generic_parquet_list_column(tmp_path, hand_jsonl_trace):
    path = tmp_path / "g.parquet"
    generic_request_frame(HAND).write_parquet(path)
    trace = load_trace(path, block_tokens=512)
    assert trace.meta.source_format == "parquet"
    check_hand(trace)
    assert_same_trace(trace, hand_jsonl_trace)


def test_generic_csv_list_strings(tmp_path, hand_jsonl_trace):
    lines = ["request_id,timestamp_ms,input_length,output_length,hash_ids"]
    for i, r in enumerate(HAND):
        # alternate the two spellings of a list cell
        cell = "[" + ", ".join(map(str, r["hash_ids"])) + "]" if i % 2 == 0 else " ".join(map(str, r["hash_ids"]))
        lines.append(f'{i},{r["timestamp"]},{r["input_length"]},{r["output_length"]},"{cell}"')
    path = tmp_path / "g.csv"
    path.write_text("\n".join(lines) + "\n")
    trace = load_trace(path, block_tokens=512)
    assert trace.meta.source_format == "csv"
    check_hand(trace)
    assert_same_trace(trace, hand_jsonl_trace)


def test_generic_csv_single_block_cells(tmp_path):
    # Every cell is one bare hash, so a CSV reader sees an integer column, not strings.
    path = tmp_path / "one.csv"
    path.write_text(f"timestamp,hash_ids\n1.0,5\n2.5,{2**64 - 1}\n3.0,5\n")
    trace = load_trace(path, block_tokens=16)
    assert trace.requests["block_ids"].to_list() == [[5], [2**64 - 1], [5]]
    assert trace.accesses.block.tolist() == [0, 1, 0]
    assert trace.requests["input_tokens"].to_list() == [16, 16, 16]  # no input column: full blocks
    assert trace.requests["timestamp"].to_list() == [0.0, 1.5, 2.0]


@pytest.mark.parametrize("column", ["timestamp_ms", "ts_ms"])
def test_generic_millisecond_timestamps_exact(tmp_path, column):
    path = tmp_path / "ms.csv"
    path.write_text(f"{column},hash_ids\n1000,1\n1071,2\n1003,3\n")
    trace = load_trace(path, block_tokens=16)
    # seconds = ms / 1000 correctly rounded, then relative to the first arrival
    assert trace.requests["timestamp"].to_list() == [0.0, 1003 / 1000 - 1.0, 1071 / 1000 - 1.0]
    assert trace.requests["block_ids"].to_list() == [[1], [3], [2]]


@pytest.mark.parametrize("suffix", ["parquet", "csv"])
def test_generic_exploded_access_table(tmp_path, hand_jsonl_trace, suffix):
    df = exploded_rows(HAND)
    path = tmp_path / f"acc.{suffix}"
    df.write_parquet(path) if suffix == "parquet" else df.write_csv(path)
    trace = load_trace(path, block_tokens=512)
    check_hand(trace)
    assert_same_trace(trace, hand_jsonl_trace)


@pytest.mark.parametrize("kind", ["list.parquet", "list.csv", "exploded.parquet", "exploded.csv"])
def test_generic_requires_block_tokens(tmp_path, kind):
    shape, suffix = kind.split(".")
    df = generic_request_frame(HAND) if shape == "list" else exploded_rows(HAND)
    path = tmp_path / f"g.{suffix}"
    if suffix == "parquet":
        df.write_parquet(path)
    elif shape == "list":
        df.with_columns(pl.col("hash_ids").cast(pl.List(pl.String)).list.join(" ")).write_csv(path)
    else:
        df.write_csv(path)
    with pytest.raises(KvtraceError) as exc:
        load_trace(path)
    assert_error(exc, path, None, "block_tokens")
    assert "block-tokens" in str(exc.value)


def test_generic_csv_bad_hash_names_line(tmp_path):
    path = tmp_path / "g.csv"
    path.write_text('timestamp,hash_ids\n1.0,"[1, 2]"\n2.0,"[1, -3]"\n')
    with pytest.raises(KvtraceError) as exc:
        load_trace(path, block_tokens=16)
    assert_error(exc, path, 3, "hash_ids")


# --------------------------------------------------------------------------- 4. tenants


def tenant_frame() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "timestamp": [0.0, 1.0, 2.0, 3.0, 4.0],
            "tenant": ["b", "a", "b", None, "a"],
            "block_ids": [[1, 2], [1, 2], [1, 3], [1], [1, 2]],
        },
        schema={"timestamp": pl.Float64, "tenant": pl.String, "block_ids": pl.List(pl.UInt64)},
    )


def test_tenants_are_namespaces(tmp_path):
    path = tmp_path / "t.parquet"
    tenant_frame().write_parquet(path)
    trace = load_trace(path, block_tokens=16)
    # (b,1)=0 (b,2)=1 (a,1)=2 (a,2)=3 (b,3)=4 (none,1)=5
    assert trace.accesses.block.tolist() == [0, 1, 2, 3, 0, 4, 5, 2, 3]
    assert [int(h) for h in trace.block_hash] == [1, 2, 1, 2, 3, 1]
    # distinct tenants get distinct codes, a request without a tenant gets -1
    codes = trace.block_tenant.tolist()
    assert codes[0] == codes[1] == codes[4] != codes[2] == codes[3]
    assert codes[5] == -1 and min(codes[:5]) >= 0
    assert trace.requests["tenant"].to_list() == ["b", "a", "b", None, "a"]


def test_tenants_shared(tmp_path):
    path = tmp_path / "t.parquet"
    tenant_frame().write_parquet(path)
    trace = load_trace(path, block_tokens=16, share_tenants=True)
    assert trace.meta.share_tenants is True
    assert trace.accesses.block.tolist() == [0, 1, 0, 1, 0, 2, 0, 0, 1]
    assert [int(h) for h in trace.block_hash] == [1, 2, 3]
    assert (trace.block_tenant == -1).all()


def test_tenants_survive_canonical_round_trip(tmp_path):
    src = tmp_path / "t.parquet"
    tenant_frame().write_parquet(src)
    trace = load_trace(src, block_tokens=16)
    write_canonical(trace, None, tmp_path / "c.parquet")
    again = load_trace(tmp_path / "c.parquet")
    assert_same_trace(trace, again)
    shared = load_trace(tmp_path / "c.parquet", share_tenants=True)
    assert shared.n_blocks == 3


# --------------------------------------------------------------------------- 5. format parity


def test_canonical_parity_and_metadata(tmp_path):
    trace = load_trace(write_jsonl(tmp_path / "m.jsonl", HAND))
    out = tmp_path / "c.parquet"
    write_canonical(trace, None, out)
    md = read_metadata(out)
    assert md["block_tokens"] == 512 and md["source_format"] == "mooncake"
    again = load_trace(out)
    assert again.meta.block_tokens == 512
    assert_same_trace(trace, again)
    check_hand(again)
    with pytest.raises(KvtraceError) as exc:
        load_trace(out, block_tokens=16)  # contradicts the stored block size
    assert_error(exc, out, None, "block_tokens")


small_hash = st.integers(0, 40)
big_hash = st.sampled_from([BIG, BIG + 1, 2**64 - 1, 2**64 - 2, BIG + 12345])


@st.composite
def mooncake_records(draw):
    n = draw(st.integers(1, 12))
    recs = []
    for _ in range(n):
        hashes = draw(st.lists(st.one_of(small_hash, big_hash), max_size=8))
        if hashes:
            # mostly consistent lengths, sometimes not (warnings, clamping)
            il = draw(st.one_of(st.integers(512 * (len(hashes) - 1) + 1, 512 * len(hashes)),
                                st.integers(0, 512 * len(hashes) + 700)))
        else:
            il = 0
        ts = draw(st.integers(0, 10**7))
        recs.append(moon(ts, il, draw(st.integers(0, 4000)), hashes))
    return recs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(recs=mooncake_records())
def test_round_trip_property(recs):
    with tempfile.TemporaryDirectory() as d:
        src = write_jsonl(Path(d) / "m.jsonl", recs)
        trace = load_trace(src)
        exp = expected_trace(recs)
        assert_matches_expected(trace, exp)
        assert_frame_equal(trace.requests, expected_requests(recs, exp))
        write_canonical(trace, None, Path(d) / "c.parquet")
        again = load_trace(Path(d) / "c.parquet")
        assert_same_trace(trace, again)
        assert not any("monotonic" in w for w in again.warnings)  # canonical is in trace order


# --------------------------------------------------------------------------- 6. real trace


@pytest.mark.slow
def test_real_mooncake_conversation(tmp_path):
    src = SHARED_TRACES / "mooncake_conversation.jsonl"
    if not src.exists():
        pytest.skip(f"shared trace not available: {src}")
    trace = load_trace(src)
    assert trace.n_requests == 12_031
    assert trace.n_accesses == 288_500
    assert trace.n_blocks == 182_790
    assert trace.warnings == []
    # independently: parse with json, densify with a dict
    ids: dict[int, int] = {}
    block = []
    for line in src.read_text().splitlines():
        if line.strip():
            for h in json.loads(line)["hash_ids"]:
                block.append(ids.setdefault(h, len(ids)))
    npt.assert_array_equal(trace.accesses.block, np.array(block))  # file order == trace order here
    assert trace.request_timestamp[0] == 0.0
    out = tmp_path / "conv.parquet"
    write_canonical(trace, None, out)
    assert_same_trace(trace, load_trace(out))


# --------------------------------------------------------------------------- 7. bad input

GOOD = json.dumps(moon(0, 10, 1, [1]))


@pytest.mark.parametrize(
    "bad_line, field",
    [
        ('{"timestamp": 5, "input_length": 10,', None),  # malformed JSON
        (json.dumps({"timestamp": 5, "input_length": 10, "hash_ids": [1]}), "output_length"),
        (json.dumps({"timestamp": 5, "output_length": 1, "hash_ids": [1]}), "input_length"),
        (json.dumps({"input_length": 10, "output_length": 1, "hash_ids": [1]}), "timestamp"),
        (json.dumps({"timestamp": 5, "input_length": 10, "output_length": 1}), "hash_ids"),
        (json.dumps(moon(5, "10", 1, [1])), "input_length"),
        (json.dumps(moon(5, 10, 1, [1, 2.5])), "hash_ids"),
        (json.dumps(moon(5, 10, 1, [1, 2.0])), "hash_ids"),
        (json.dumps(moon("soon", 10, 1, [1])), "timestamp"),
        (json.dumps(moon(5, -1, 1, [1])), "input_length"),
        (json.dumps(moon(5, 10, -7, [1])), "output_length"),
        (json.dumps(moon(5, 10, 1, [])), "hash_ids"),
        (json.dumps(moon(5, 10, 1, [2**64])), "hash_ids"),
        (json.dumps(moon(5, 10, 1, [-1])), "hash_ids"),
        (json.dumps(moon(5, 10, 1, "1 2")), "hash_ids"),
    ],
)
@pytest.mark.parametrize("where", ["first", "later"])
@pytest.mark.parametrize("fmt", ["auto", "mooncake"])
def test_bad_line_names_file_line_field(tmp_path, bad_line, field, where, fmt):
    path = tmp_path / "bad.jsonl"
    expect = "malformed JSON" if field is None else field
    if where == "first":
        # two blank lines, then the bad record first (the format sniffing path)
        write_jsonl(path, [bad_line, GOOD], blank_lines_before=2)
        line = 3
        if fmt == "auto" and field == "hash_ids" and "hash_ids" not in bad_line:
            field, expect = None, "cannot tell the trace format"  # without hash_ids, that is the error
    else:
        text = GOOD + "\n\n" + GOOD + "\n   \n" + bad_line + "\n" + GOOD + "\n"
        path.write_text(text)
        line = 5
    with pytest.raises(KvtraceError) as exc:
        load_trace(path, fmt=fmt)
    msg = assert_error(exc, path, line, field)
    assert expect in msg


def test_empty_hash_list_with_zero_input_is_fine(tmp_path):
    trace = load_trace(write_jsonl(tmp_path / "m.jsonl", [moon(0, 10, 1, [1]), moon(5, 0, 1, [])]))
    assert trace.accesses.req_start.tolist() == [0, 1, 1]
    assert trace.warnings == []


@pytest.mark.parametrize("content", ["", "\n\n   \n\t\n"])
@pytest.mark.parametrize("fmt", ["auto", "mooncake", "bailian"])
def test_empty_files(tmp_path, content, fmt):
    path = tmp_path / "empty.jsonl"
    path.write_text(content)
    with pytest.raises(KvtraceError) as exc:
        load_trace(path, fmt=fmt)
    msg = assert_error(exc, path, None, None)
    assert "empty" in msg


def test_missing_path_and_directory(tmp_path):
    with pytest.raises(KvtraceError) as exc:
        load_trace(tmp_path / "nope.jsonl")
    assert_error(exc, tmp_path / "nope.jsonl", None, None)
    with pytest.raises(KvtraceError) as exc:
        load_trace(tmp_path)
    assert_error(exc, tmp_path, None, None)
    assert "directory" in str(exc.value)


def test_non_monotonic_timestamps_sorted_stably(tmp_path):
    recs = [
        moon(3000, 10, 1, [30]),
        moon(1000, 10, 1, [10]),
        moon(2000, 10, 1, [20]),
        moon(1000, 10, 1, [11]),  # ties with line 2: stays after it
        moon(500, 10, 1, [5]),
    ]  # decreases: 3000>1000, 2000>1000, 1000>500 -> 3
    trace = load_trace(write_jsonl(tmp_path / "m.jsonl", recs))
    assert trace.requests["request_id"].to_list() == [4, 1, 3, 2, 0]
    assert trace.requests["timestamp"].to_list() == [0.0, 0.5, 0.5, 1.5, 2.5]
    assert [int(h) for h in trace.block_hash] == [5, 10, 11, 20, 30]
    assert trace.accesses.block.tolist() == [0, 1, 2, 3, 4]
    assert len(trace.warnings) == 1
    assert "monotonic" in trace.warnings[0] and re.search(r"\b3\b", trace.warnings[0])
    assert_matches_expected(trace, expected_trace(recs))


def test_hash_count_mismatch_warns_with_count(tmp_path):
    recs = [
        moon(0, 1500, 1, [1]),  # needs 3 hashes: too few -> the one block is full (clamped)
        moon(1, 600, 1, [1, 2, 3]),  # needs 2: too many -> the last block clamped to 1 token
        moon(2, 1024, 1, [1, 2]),
        moon(3, 0, 1, []),
        moon(4, 1, 1, [4]),
    ]
    trace = load_trace(write_jsonl(tmp_path / "m.jsonl", recs))
    assert trace.accesses.tokens.tolist() == [512, 512, 512, 1, 512, 512, 1]
    assert trace.block_size.tolist() == [512, 512, 1, 1]
    assert len(trace.warnings) == 1
    assert "hash_ids" in trace.warnings[0] and re.search(r"\b2\b", trace.warnings[0])


def test_high_hashes_round_trip_exactly(tmp_path):
    hs = [BIG, BIG + 1, 2**64 - 1, 2**64 - 2, 1]
    recs = [moon(0, 512 * 3, 1, hs[:3]), moon(1, 512 * 3, 1, [hs[0], hs[3], hs[4]])]
    trace = load_trace(write_jsonl(tmp_path / "m.jsonl", recs))
    assert [int(h) for h in trace.block_hash] == [BIG, BIG + 1, 2**64 - 1, 2**64 - 2, 1]
    assert trace.accesses.block.tolist() == [0, 1, 2, 0, 3, 4]
    write_canonical(trace, None, tmp_path / "c.parquet")
    again = load_trace(tmp_path / "c.parquet")
    assert again.requests["block_ids"].to_list() == [hs[:3], [hs[0], hs[3], hs[4]]]
    assert_same_trace(trace, again)


@pytest.mark.parametrize("name", ["m.jsonl.gz", "m.jsonl"])
def test_gzip_jsonl_transparent(tmp_path, name, hand_jsonl_trace):
    path = tmp_path / name
    path.write_bytes(gzip.compress(("\n".join(json.dumps(r) for r in HAND) + "\n").encode()))
    trace = load_trace(path)
    check_hand(trace)
    assert_same_trace(trace, hand_jsonl_trace)


def test_corrupt_gzip_is_a_user_error(tmp_path):
    path = tmp_path / "m.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"timestamp": 0}\n' * 50)[:30])
    with pytest.raises(KvtraceError) as exc:
        load_trace(path)
    assert_error(exc, path, None, None)


# --------------------------------------------------------------------------- 8. atomic writes


@pytest.mark.parametrize("error", [OSError("disk full"), KeyboardInterrupt()])
def test_write_canonical_is_atomic(tmp_path, monkeypatch, error):
    good = load_trace(write_jsonl(tmp_path / "m.jsonl", HAND))
    other = load_trace(write_jsonl(tmp_path / "o.jsonl", [moon(0, 5, 1, [99])]))
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    dest = out_dir / "trace.parquet"
    write_canonical(good, None, dest)
    before = dest.read_bytes()
    seen = []

    def failing_write(frame, where, *args, **kwargs):
        seen.append(Path(where))
        Path(where).write_bytes(b"PAR1 half-written")  # the temp file exists, partly written
        raise error

    monkeypatch.setattr(pl.DataFrame, "write_parquet", failing_write)
    with pytest.raises(type(error)):
        write_canonical(other, None, dest)
    monkeypatch.undo()
    # a temporary file: unnamed (Linux O_TMPFILE, /proc/self/fd/N) or hidden next to the destination
    assert seen and seen[0] != dest and (seen[0].parent == out_dir or str(seen[0]).startswith("/proc/self/fd/"))
    assert dest.read_bytes() == before
    assert sorted(os.listdir(out_dir)) == ["trace.parquet"]
    assert_same_trace(load_trace(dest), good)
    # and a successful overwrite replaces it, leaving no temporary file either
    write_canonical(other, None, dest)
    assert sorted(os.listdir(out_dir)) == ["trace.parquet"]
    assert_same_trace(load_trace(dest), other)


def test_expected_trace_twin_sanity():
    # the twin itself, pinned on hand cases: clamp to [1, B], stable order, first appearance
    exp = expected_trace([moon(9, 1, 0, [1]), moon(1, 513, 0, [2, 3]), moon(1, 2000, 0, [1])])
    assert exp["order"] == [1, 2, 0]
    assert exp["tokens"] == [512, 1, 512, 1]
    assert exp["block"] == [0, 1, 2, 2]
    assert exp["block_size"] == [512, 1, 512]
    assert exp["timestamp"] == [0.0, 0.0, 0.008]


@pytest.mark.parametrize("share", [False, True])
def test_distinct_blocks_without_the_access_table(share):
    from kvtrace.ingest import distinct_blocks, load_requests

    path = Path(__file__).resolve().parents[1] / "sample_traces" / "mixed.parquet"
    df, meta, _ = load_requests(path, share_tenants=share)
    trace = load_trace(path, share_tenants=share)
    assert distinct_blocks(df, meta) == trace.n_blocks
    # tenants are namespaces: sharing can only merge blocks
    if not share:
        shared_df, shared_meta, _ = load_requests(path, share_tenants=True)
        assert distinct_blocks(shared_df, shared_meta) <= trace.n_blocks
