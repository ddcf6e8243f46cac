"""Tests of the synthetic trace generator (kvtrace.ingest.synth).

The reference for block ids is a slow twin, ``naive_block_keys``: it rebuilds every
prompt as a sequence of content segments (system prompt, documents, user text,
outputs) and keys block j by the content of tokens ``0..min((j+1)*B, L)``. Chained
hashing means ids and these keys must be in one-to-one correspondence.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

from kvtrace.ingest import synth
from kvtrace.errors import KvtraceError, UsageError
from kvtrace.trace import REQUEST_SCHEMA, TraceMeta


@pytest.fixture(scope="module")
def traces() -> dict[str, pl.DataFrame]:
    return {k: synth.generate(k, 2_000, 11)[0] for k in synth.KINDS}


def rows(df: pl.DataFrame) -> list[dict]:
    return df.to_dicts()


def consecutive_gaps(df: pl.DataFrame) -> np.ndarray:
    """Seconds between each later turn and its parent."""
    parents = df.select("request_id", parent_ts=pl.col("timestamp"))
    j = df.filter(pl.col("parent_id").is_not_null()).join(
        parents, left_on="parent_id", right_on="request_id"
    )
    return (j["timestamp"] - j["parent_ts"]).to_numpy()


# --------------------------------------------------------------------------- the twin
def naive_block_keys(kind: str, n: int, seed: int, B: int) -> list[list[tuple]]:
    """Content key of every block of every request (trace order), from the plan's
    segment lengths, without any of the id bookkeeping."""
    plan = synth._plan(kind, n, seed, B, None)
    turns_of: dict[int, list[int]] = defaultdict(list)  # session -> request rows by turn
    out = []
    for r in range(plan.n):
        s = int(plan.sess[r])
        turns_of[s].append(r)
        assert len(turns_of[s]) == plan.turn[r]
        t = int(plan.tenant[r])
        segs = [(("sys", t), int(plan.sys_tokens[t]))]
        for d in plan.docs[s]:
            if d >= 0:
                segs.append((("doc", t, int(d)), int(plan.doc_tokens[t, d])))
        rs = turns_of[s]
        for i, q in enumerate(rs):
            segs.append((("user", s, i), int(plan.user_tokens[q])))
            if q != r:
                segs.append((("out", s, i), int(plan.output_tokens[q])))
        L = sum(length for _, length in segs)
        assert L == plan.input_tokens[r]
        keys = []
        for j in range(math.ceil(L / B)):
            end = min((j + 1) * B, L)
            key, start = [], 0
            for seg, length in segs:
                if start >= end:
                    break
                key.append((seg, min(length, end - start)))
                start += length
            keys.append(tuple(key))
        out.append(keys)
    return out


@pytest.mark.parametrize(
    "kind,n,B", [("chat", 400, 512), ("agent", 120, 512), ("rag", 400, 512),
                 ("mixed", 300, 512), ("chat", 120, 16), ("rag", 150, 16)]
)
def test_block_ids_match_naive_content_keys(kind, n, B):
    df, _ = synth.generate(kind, n, 5, block_tokens=B)
    keys = naive_block_keys(kind, n, 5, B)
    id_of: dict[tuple, int] = {}
    key_of: dict[int, tuple] = {}
    for ids, ks in zip(df["block_ids"].to_list(), keys):
        assert len(ids) == len(ks)
        for i, k in zip(ids, ks):
            assert id_of.setdefault(k, i) == i  # same content -> same id
            assert key_of.setdefault(i, k) == k  # same id -> same content
    # the twin sees real sharing, not just distinct blocks everywhere
    assert len(id_of) < sum(len(k) for k in keys)


# --------------------------------------------------------------------------- table shape
@pytest.mark.parametrize("kind", synth.KINDS)
def test_schema_and_bookkeeping(traces, kind):
    df = traces[kind]
    assert df.schema == pl.Schema(REQUEST_SCHEMA)
    assert df.height == 2_000
    assert df["request_id"].to_list() == list(range(df.height))
    ts = df["timestamp"].to_numpy()
    assert ts[0] == 0.0 and np.all(np.diff(ts) >= 0)
    np.testing.assert_array_equal(np.rint(ts * 1000) / 1000, ts)  # whole milliseconds
    assert (df["input_tokens"] >= 1).all() and (df["output_tokens"] >= 1).all()
    assert (df["input_tokens"] + df["output_tokens"] <= 131_072).all()
    by_id = {r["request_id"]: r for r in rows(df)}
    for r in by_id.values():
        if r["turn"] == 1:
            assert r["parent_id"] is None and r["session_id"] == r["request_id"]
        else:
            p = by_id[r["parent_id"]]
            assert p["request_id"] < r["request_id"] and p["timestamp"] < r["timestamp"]
            assert p["turn"] == r["turn"] - 1
            assert p["session_id"] == r["session_id"]
            assert (p["tenant"], p["type"]) == (r["tenant"], r["type"])


@pytest.mark.parametrize("B", [512, 16, 1, 100, 10**6])
def test_block_count_is_ceil_of_input_tokens(B):
    df, meta = synth.generate("mixed", 500, 2, block_tokens=B)
    n_blocks = df["block_ids"].list.len().cast(pl.Int64)
    assert (n_blocks == (df["input_tokens"] + B - 1) // B).all()
    assert meta.block_tokens == B


def test_determinism():
    a, ma = synth.generate("mixed", 1_500, 42)
    b, mb = synth.generate("mixed", 1_500, 42)
    c, _ = synth.generate("mixed", 1_500, 43)
    assert a.equals(b) and ma == mb
    assert not a["input_tokens"].equals(c["input_tokens"])
    assert not a["timestamp"].equals(c["timestamp"])


def test_ids_dense_in_order_of_first_appearance(traces):
    for df in traces.values():
        flat = df["block_ids"].explode().to_numpy().astype(np.int64)
        uniq, first = np.unique(flat, return_index=True)
        np.testing.assert_array_equal(uniq, np.arange(uniq.size))
        assert np.all(np.diff(first) > 0)  # id k first appears before id k+1
        assert flat.max() < 2**63


def test_chained_hash_invariants(traces):
    """An id sits at one position, has one predecessor and one token count."""
    for kind, df in traces.items():
        B = 512
        pos_of, prev_of, tokens_of = {}, {}, {}
        for ids, L in zip(df["block_ids"].to_list(), df["input_tokens"].to_list()):
            for j, i in enumerate(ids):
                tok = min(B, L - j * B)
                assert pos_of.setdefault(i, j) == j, kind
                assert prev_of.setdefault(i, ids[j - 1] if j else None) == (ids[j - 1] if j else None)
                assert tokens_of.setdefault(i, tok) == tok, kind


# --------------------------------------------------------------------------- structure
def test_chat_turns_extend_the_previous_prompt(traces):
    df = traces["chat"]
    B = 512
    by_id = {r["request_id"]: r for r in rows(df)}
    n_children = 0
    for r in by_id.values():
        if r["parent_id"] is None:
            continue
        p = by_id[r["parent_id"]]
        pb, cb = p["block_ids"], r["block_ids"]
        full = p["input_tokens"] // B
        assert r["input_tokens"] > p["input_tokens"] + p["output_tokens"]
        assert cb[:full] == pb[:full]  # the parent's full blocks are reused as is
        assert not set(cb[full:]) & set(pb)  # everything after is new content
        if p["input_tokens"] % B:
            assert cb[full] != pb[full]  # the filled-in partial block changed
        n_children += 1
    assert n_children > 500


def test_tenants_have_distinct_shared_system_prompts(traces):
    df = traces["chat"]
    first = df.filter(pl.col("turn") == 1)
    assert first["tenant"].n_unique() >= 4
    # tenants are Zipf-popular: the top tenant has many times the last one's sessions
    counts = first["tenant"].value_counts()["count"]
    assert counts.max() >= 4 * counts.min()
    # a block never appears in two tenants
    owners = df.select("tenant", "block_ids").explode("block_ids").unique()
    assert owners["block_ids"].is_unique().all()
    # within a tenant whose system prompt spans a full block, every session starts
    # with the same block; across tenants the first blocks differ
    block0 = first.select("tenant", b0=pl.col("block_ids").list.first())
    per_tenant = block0.group_by("tenant").agg(pl.col("b0").n_unique().alias("n"), pl.len())
    shared = per_tenant.filter((pl.col("n") == 1) & (pl.col("len") > 1))
    assert shared.height >= 3
    b0 = block0.filter(pl.col("tenant").is_in(shared["tenant"].implode()))
    assert b0.group_by("tenant").agg(pl.col("b0").first())["b0"].is_unique().all()


def test_rag_documents_shared_across_sessions(traces):
    """Session content is private and a system prompt is in all of a tenant's
    sessions, so a block in some but not all sessions of a tenant is a document."""

    def partly_shared(df: pl.DataFrame) -> tuple[int, float]:
        sessions = df.group_by("tenant").agg(pl.col("session_id").n_unique().alias("ns"))
        blk = (df.select("tenant", "session_id", "block_ids").explode("block_ids")
               .group_by("tenant", "block_ids").agg(pl.col("session_id").n_unique().alias("k"))
               .join(sessions, on="tenant"))
        partial = blk.filter((pl.col("k") >= 2) & (pl.col("k") < pl.col("ns")))
        acc = df.select("block_ids").explode("block_ids")
        share = acc["block_ids"].is_in(partial["block_ids"].implode()).mean()
        return partial.height, share

    n_doc_blocks, share = partly_shared(traces["rag"])
    assert n_doc_blocks > 100 and share > 0.2
    assert partly_shared(traces["chat"])[0] == 0  # control: chat shares no documents


def test_agent_gaps_short_and_contexts_long_vs_chat(traces):
    agent_gaps, chat_gaps = consecutive_gaps(traces["agent"]), consecutive_gaps(traces["chat"])
    assert np.median(agent_gaps) < 10.0
    assert np.median(agent_gaps) * 5 < np.median(chat_gaps)
    assert traces["agent"]["input_tokens"].median() > 2 * traces["chat"]["input_tokens"].median()
    assert traces["agent"]["turn"].max() > 30


def test_heavy_tails_and_bursty_arrivals():
    df, _ = synth.generate("chat", 20_000, 3)
    gaps = consecutive_gaps(df)
    assert np.quantile(gaps, 0.1) < 60 and gaps.max() > 3_600  # seconds to hours
    out = df["output_tokens"].to_numpy()
    assert np.quantile(out, 0.99) > 5 * np.median(out)
    # session starts per minute are over-dispersed (a plain Poisson process gives ~1)
    starts = df.filter(pl.col("turn") == 1)["timestamp"].to_numpy()
    per_min = np.bincount((starts // 60).astype(np.int64))[:-1]
    assert per_min.var() / per_min.mean() > 1.5


def test_rate_scales_duration():
    slow, _ = synth.generate("rag", 4_000, 9, rate_per_s=2.0)
    fast, _ = synth.generate("rag", 4_000, 9, rate_per_s=8.0)
    ratio = fast["timestamp"].max() / slow["timestamp"].max()
    assert 0.15 < ratio < 0.4


def test_mixed_has_all_types_and_tenants(traces):
    df = traces["mixed"]
    assert set(df["type"].unique()) == {"chat", "agent", "rag"}
    assert df["tenant"].n_unique() >= 8
    assert (df["tenant"].str.split("-").list.first() == df["type"]).all()


# --------------------------------------------------------------------------- writers
@pytest.fixture(scope="module")
def small() -> tuple[pl.DataFrame, TraceMeta]:
    return synth.generate("mixed", 400, 8, block_tokens=16)


def test_mooncake_round_trip(small, tmp_path):
    df, meta = small
    path = tmp_path / "t.jsonl"
    synth.write(df, meta, path, "mooncake")
    first = json.loads(path.read_text().splitlines()[0])
    assert list(first) == ["timestamp", "input_length", "output_length", "hash_ids"]
    assert isinstance(first["timestamp"], int)
    back = pl.read_ndjson(path)
    assert back.height == df.height
    assert back["timestamp"].to_list() == [round(t * 1000) for t in df["timestamp"]]
    assert back["input_length"].to_list() == df["input_tokens"].to_list()
    assert back["output_length"].to_list() == df["output_tokens"].to_list()
    assert back["hash_ids"].to_list() == df["block_ids"].to_list()


def test_bailian_round_trip(small, tmp_path):
    df, meta = small
    path = tmp_path / "t.jsonl"
    synth.write(df, meta, path, "bailian")
    first = json.loads(path.read_text().splitlines()[0])
    assert list(first) == ["chat_id", "parent_chat_id", "timestamp", "input_length",
                           "output_length", "type", "turn", "hash_ids"]
    back = pl.read_ndjson(path)
    assert back["chat_id"].to_list() == df["request_id"].to_list()
    assert back["parent_chat_id"].to_list() == df["parent_id"].fill_null(-1).to_list()
    assert (back["parent_chat_id"] == -1).sum() == (df["turn"] == 1).sum()
    assert back["timestamp"].to_list() == df["timestamp"].to_list()  # exact floats
    for a, b in [("input_length", "input_tokens"), ("output_length", "output_tokens"),
                 ("type", "type"), ("turn", "turn"), ("hash_ids", "block_ids")]:
        assert back[a].to_list() == df[b].to_list(), a


def test_parquet_round_trip(small, tmp_path):
    df, meta = small
    path = tmp_path / "t.parquet"
    synth.write(df, meta, path, "parquet")
    table = pq.read_table(path)
    assert TraceMeta.from_dict(json.loads(table.schema.metadata[b"kvtrace"])) == meta
    assert pq.ParquetFile(path).metadata.row_group(0).column(0).compression == "ZSTD"
    back = pl.from_arrow(table)
    assert back.schema == pl.Schema(REQUEST_SCHEMA)
    assert back.equals(df)


@pytest.mark.parametrize("fmt", synth.FORMATS)
def test_chunked_equals_whole(tmp_path, fmt):
    kind, n, seed = "mixed", 900, 4
    chunks, meta = synth.iter_chunks(kind, n, seed, chunk_requests=128)
    whole, meta2 = synth.generate(kind, n, seed)
    assert meta == meta2
    assert pl.concat(list(chunks)).equals(whole)
    a, b = tmp_path / f"a.{fmt}", tmp_path / f"b.{fmt}"
    synth.write(whole, meta, a, fmt)
    assert synth.write_chunked(kind, n, seed, b, fmt, chunk_requests=128) == meta
    if fmt == "parquet":
        assert pq.ParquetFile(b).num_row_groups == math.ceil(n / 128)
        assert pl.read_parquet(b).equals(pl.read_parquet(a))
        assert pq.read_schema(b).metadata[b"kvtrace"] == pq.read_schema(a).metadata[b"kvtrace"]
    else:
        assert a.read_bytes() == b.read_bytes()


# --------------------------------------------------------------------------- failures
def test_failed_write_leaves_no_file_and_keeps_the_old_one(small, tmp_path):
    df, meta = small
    dest = tmp_path / "t.jsonl"
    with pytest.raises(pl.exceptions.ColumnNotFoundError):
        synth.write(df.drop("block_ids"), meta, dest, "mooncake")
    assert os.listdir(tmp_path) == []
    dest.write_text("old\n")
    with pytest.raises(pl.exceptions.ColumnNotFoundError):
        synth.write(df.drop("block_ids"), meta, dest, "bailian")
    assert os.listdir(tmp_path) == ["t.jsonl"] and dest.read_text() == "old\n"


@pytest.mark.parametrize("fmt", synth.FORMATS)
def test_failure_mid_chunked_write_leaves_no_file(tmp_path, monkeypatch, fmt):
    calls = []
    real_chunk = synth._Plan.chunk

    def failing(self, a, b):
        calls.append(a)
        if len(calls) == 3:
            raise RuntimeError("disk full")
        return real_chunk(self, a, b)

    monkeypatch.setattr(synth._Plan, "chunk", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        synth.write_chunked("chat", 500, 1, tmp_path / "t.out", fmt, chunk_requests=100)
    assert len(calls) == 3
    assert os.listdir(tmp_path) == []


def test_ids_beyond_int63_refused_in_jsonl_kept_in_parquet(small, tmp_path):
    df, meta = small
    big = df.with_columns(pl.col("block_ids").list.eval(pl.element() + 2**63))
    with pytest.raises(KvtraceError, match="2\\*\\*63"):
        synth.write(big, meta, tmp_path / "t.jsonl", "mooncake")
    assert os.listdir(tmp_path) == []
    synth.write(big, meta, tmp_path / "t.parquet", "parquet")
    assert pl.read_parquet(tmp_path / "t.parquet")["block_ids"].equals(big["block_ids"])


@pytest.mark.parametrize(
    "kwargs,field",
    [({"kind": "video"}, "kind"), ({"n_requests": 0}, "requests"),
     ({"block_tokens": 0}, "block_tokens"), ({"rate_per_s": -1.0}, "rate_per_s"),
     ({"rate_per_s": float("nan")}, "rate_per_s")],
)
def test_bad_arguments(kwargs, field):
    args = {"kind": "chat", "n_requests": 10, "seed": 0, **kwargs}
    with pytest.raises(UsageError) as info:
        synth.generate(args.pop("kind"), args.pop("n_requests"), args.pop("seed"), **args)
    assert info.value.field == field


def test_unknown_format(small, tmp_path):
    df, meta = small
    with pytest.raises(UsageError, match="unknown format"):
        synth.write(df, meta, tmp_path / "t.csv", "csv")
    assert os.listdir(tmp_path) == []


def test_rag_prompts_hold_one_to_four_distinct_documents():
    plan = synth._plan("rag", 3_000, 6, 512, None)
    docs = plan.docs
    n_docs = (docs >= 0).sum(axis=1)
    assert n_docs.min() == 1 and n_docs.max() == 4
    assert np.all((docs >= 0)[:, :-1] >= (docs >= 0)[:, 1:])  # no holes
    for row, k in zip(docs, n_docs):
        assert len(set(row[:k].tolist())) == k
    # Zipf-popular corpus: the most used document is in many sessions
    assert np.bincount(docs[docs >= 0]).max() > 0.05 * docs.shape[0]


SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"


@pytest.mark.parametrize(
    "name,kind,n,B,fmt",
    [("chat.jsonl", "chat", 4000, None, "mooncake"),
     ("mixed.parquet", "mixed", 3000, None, "parquet"),
     ("agent_bailian.jsonl", "agent", 150, 16, "bailian")],
)
def test_bundled_samples_are_reproducible(tmp_path, name, kind, n, B, fmt):
    """The commands in sample_traces/README.md remake the bundled files; if the
    generator changes, regenerate them (and the README's stats)."""
    bundled = SAMPLES / name
    df, meta = synth.generate(kind, n, 1, block_tokens=B)
    made = tmp_path / name
    synth.write(df, meta, made, fmt)
    if fmt == "parquet":
        assert pl.read_parquet(bundled).equals(pl.read_parquet(made))
        assert pq.read_schema(bundled).metadata[b"kvtrace"] == pq.read_schema(made).metadata[b"kvtrace"]
    else:
        assert bundled.read_bytes() == made.read_bytes()
    assert f"--requests {n} --seed 1" in (SAMPLES / "README.md").read_text()


@pytest.mark.parametrize("kind", synth.KINDS)
def test_single_request(kind):
    df, _ = synth.generate(kind, 1, 0)
    assert df.height == 1 and df["timestamp"][0] == 0.0 and df["turn"][0] == 1
    n = df["block_ids"].list.len()[0]
    assert df["block_ids"][0].to_list() == list(range(n))
