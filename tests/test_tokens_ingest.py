"""Token-id logs -> canonical trace; re-chaining, re-blocking, anonymised export."""

from __future__ import annotations

import gzip
import json

import numpy as np
import numpy.testing as npt
import polars as pl
import pytest
from test_tokens_vllm import vllm_twin

from kvtrace.analyses.curves import compute_curve
from kvtrace.errors import KvtraceError
from kvtrace.ingest import load_trace
from kvtrace.ingest.anonymize import anonymized_table, write_anonymized
from kvtrace.ingest.canonical import build_trace, prepare_requests
from kvtrace.ingest.rechain import chain_report, rechain, reblock
from kvtrace.ingest.tokens import TokenFields, load_token_trace, read_token_log
from kvtrace.ingest.vllm_hash import HashSpec


def _log(n=40, seed=0):
    """Requests sharing system prompts and conversation prefixes (so blocks are reused)."""
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 100_000, int(rng.integers(20, 90))).tolist() for _ in range(3)]
    rows = []
    history: list[list[int]] = []
    for i in range(n):
        if history and rng.random() < 0.5:
            base = history[int(rng.integers(len(history)))]
        else:
            base = systems[int(rng.integers(3))]
        prompt = base + rng.integers(0, 100_000, int(rng.integers(1, 70))).tolist()
        history.append(prompt)
        rows.append({"prompt_token_ids": prompt, "timestamp": 1_700_000_000.0 + 0.25 * i,
                     "output_tokens": int(rng.integers(1, 50)), "cache_salt": "s" if i % 7 == 3 else None,
                     "lora_name": "ad" if i % 5 == 2 else None})
    return rows


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_parquet_csv_agree_with_twin(tmp_path):
    rows = _log()
    j = _write_jsonl(tmp_path / "log.jsonl", rows)
    pl.DataFrame(rows).write_parquet(tmp_path / "log.parquet")
    pl.DataFrame([{**r, "prompt_token_ids": json.dumps(r["prompt_token_ids"])} for r in rows]).write_csv(
        tmp_path / "log.csv")
    exp, starts = vllm_twin([r["prompt_token_ids"] for r in rows], lora=[r["lora_name"] for r in rows],
                            salt=[r["cache_salt"] for r in rows])
    for path in (j, tmp_path / "log.parquet", tmp_path / "log.csv"):
        log = read_token_log(path, chunk_rows=7)  # several chunks
        df = log.requests
        npt.assert_array_equal(df["block_ids"].explode().to_numpy(), exp)
        npt.assert_array_equal(df["block_ids"].list.len().to_numpy(), np.diff(starts))
        assert df["input_tokens"].to_list() == [len(r["prompt_token_ids"]) for r in rows]
        assert df["output_tokens"].to_list() == [r["output_tokens"] for r in rows]
        assert df["timestamp"].to_list() == [r["timestamp"] for r in rows]
        assert log.time_unit == "s" and "seconds" in log.time_note
        assert log.meta.source_format == "tokens" and log.meta.block_tokens == 16


def test_gzip_and_options(tmp_path):
    rows = [{"ids": [1, 2, 3] * 7, "t_ms": 1000 * i, "salt": "x"} for i in range(3)]
    p = tmp_path / "log.jsonl.gz"
    p.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    log = read_token_log(p, fields=TokenFields(tokens="ids", timestamp="t_ms", cache_salt="salt"),
                         spec=HashSpec("sha256_cbor", 42, 8))
    exp, _ = vllm_twin([r["ids"] for r in rows], "sha256_cbor", 42, 8, salt=["x"] * 3)
    npt.assert_array_equal(log.requests["block_ids"].explode().to_numpy(), exp)
    assert log.requests["timestamp"].to_list() == [0.0, 1.0, 2.0]
    assert log.time_unit == "ms" and "field name" in log.time_note


@pytest.mark.parametrize("values, unit, seconds", [
    ([1_700_000_000_000, 1_700_000_000_500], "ms", [1_700_000_000.0, 1_700_000_000.5]),
    ([1_700_000_000_000_000, 1_700_000_000_250_000], "us", [1_700_000_000.0, 1_700_000_000.25]),
    ([1.7e18, 1.7e18 + 5e8], "ns", [1.7e9, 1.7e9 + 0.5]),
    ([0.0, 2.5], "s", [0.0, 2.5]),
    (["2024-05-01T00:00:00Z", "2024-05-01T01:00:00.5+01:00"], "iso", [1714521600.0, 1714521600.5]),
])
def test_time_units_detected(tmp_path, values, unit, seconds):
    p = _write_jsonl(tmp_path / "t.jsonl", [{"prompt_token_ids": [1], "timestamp": v} for v in values])
    log = read_token_log(p)
    assert log.time_unit == unit
    assert log.requests["timestamp"].to_list() == pytest.approx(seconds, abs=1e-6)


@pytest.mark.parametrize("line2, field, message", [
    ('{"timestamp": 1}', "prompt_token_ids", "missing"),
    ('{"prompt_token_ids": null, "timestamp": 1}', "prompt_token_ids", "missing"),
    ('{"prompt_token_ids": [], "timestamp": 1}', "prompt_token_ids", "non-empty"),
    ('{"prompt_token_ids": [1, 2.5], "timestamp": 1}', "prompt_token_ids", "integer token ids, got 2.5"),
    ('{"prompt_token_ids": [1, "a"], "timestamp": 1}', "prompt_token_ids", "integer token ids, got 'a'"),
    ('{"prompt_token_ids": [1, -3], "timestamp": 1}', "prompt_token_ids", r"\[0, 2147483647\], got -3"),
    ('{"prompt_token_ids": [1, 2147483648], "timestamp": 1}', "prompt_token_ids", "got 2147483648"),
    ('{"prompt_token_ids": [1], "timestamp": "yesterday"}', "timestamp", "a number like the rows before"),
    ('{"prompt_token_ids": [1]}', "timestamp", "missing"),
    ('{"prompt_token_ids": [1], "timestamp": 1, "output_tokens": -2}', "output_tokens", "non-negative"),
    ('{"prompt_token_ids": [1], "timestamp"', None, "malformed JSON"),
])
def test_jsonl_errors_name_line_and_field(tmp_path, line2, field, message):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt_token_ids": [1, 2], "timestamp": 0, "output_tokens": 1}\n\n' + line2 + "\n")
    with pytest.raises(KvtraceError, match=message) as info:
        read_token_log(p)
    assert info.value.path == str(p) and info.value.line == 3 and info.value.field == field


def test_bad_iso_time_names_line(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"prompt_token_ids": [1], "timestamp": "2024-05-01T00:00:00"}\n'
                 '{"prompt_token_ids": [1], "timestamp": "yesterday"}\n')
    with pytest.raises(KvtraceError, match="ISO-8601") as info:
        read_token_log(p)
    assert (info.value.line, info.value.field) == (2, "timestamp")


def test_parquet_errors_name_row(tmp_path):
    p = tmp_path / "bad.parquet"
    pl.DataFrame({"prompt_token_ids": [[1, 2], [3, 2**31]], "timestamp": [0.0, 1.0]}).write_parquet(p)
    with pytest.raises(KvtraceError) as info:
        read_token_log(p, chunk_rows=1)
    assert (info.value.row, info.value.field, info.value.line) == (1, "prompt_token_ids", None)
    pl.DataFrame({"prompt_token_ids": [[1.5], [3.0]], "timestamp": [0.0, 1.0]}).write_parquet(p)
    with pytest.raises(KvtraceError, match="integer token ids") as info:
        read_token_log(p)
    assert info.value.row == 0
    with pytest.raises(KvtraceError, match=r"\[0, 100\]") as info:
        read_token_log(tmp_path / "bad.parquet" if False else _ok_parquet(tmp_path), max_token_id=100)
    assert info.value.row == 1


def _ok_parquet(tmp_path):
    p = tmp_path / "ok.parquet"
    pl.DataFrame({"prompt_token_ids": [[1, 2], [3, 200]], "timestamp": [0.0, 1.0]}).write_parquet(p)
    return p


def test_csv_errors_name_line(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text('prompt_token_ids,timestamp\n"[1, 2]",0\n"[1, x]",1\n')
    with pytest.raises(KvtraceError, match="integer token ids") as info:
        read_token_log(p)
    assert (info.value.line, info.value.field) == (3, "prompt_token_ids")


def test_string_request_ids_are_numbered(tmp_path):
    p = _write_jsonl(tmp_path / "s.jsonl", [{"prompt_token_ids": [1], "timestamp": i, "request_id": f"cmpl-{i}",
                                             "session_id": "u1" if i < 2 else "u2"} for i in range(3)])
    log = read_token_log(p)
    assert log.requests["request_id"].to_list() == [0, 1, 2]
    assert log.requests["session_id"].to_list() == [0, 0, 1]
    assert any("request_id" in w for w in log.warnings)


# -- re-chaining -----------------------------------------------------------------------

def _table(lists, B=16):
    return pl.DataFrame({"block_ids": lists, "input_tokens": [B * len(x) for x in lists],
                         "timestamp": [float(i) for i in range(len(lists))]},
                        schema_overrides={"block_ids": pl.List(pl.UInt64)})


def test_chain_report_by_hand():
    # raw per-block hashes: block 7 follows "none" and 5, block 9 follows 7 and 5
    raw = _table([[5, 7, 9], [7, 9], [5, 9]])
    rep = chain_report(raw)
    assert (rep.blocks, rep.multi_parent) == (3, 2) and rep.share == pytest.approx(2 / 3)
    assert chain_report(_table([[1, 2, 3], [1, 2, 4], [5]])).chained


def test_rechain_makes_reuse_need_the_prefix():
    raw = _table([[5, 7, 9], [7, 9], [5, 7, 8]])
    out = rechain(raw)["block_ids"].to_list()
    assert out[0][:2] == out[2][:2]  # same prefix 5, 7
    assert out[0][2] != out[2][2]
    assert len(set(out[0]) & set(out[1])) == 0  # 7, 9 after a different prefix
    assert chain_report(rechain(raw)).chained
    # independent twin: c_j = mix(c_{j-1}, h_j) one step at a time
    from kvtrace.ingest.rechain import ROOT, mix
    c = ROOT
    for h, got in zip([5, 7, 9], out[0]):
        c = mix(np.array([c], np.uint64), np.array([h], np.uint64))[0]
        assert int(c) == got


# -- re-blocking -----------------------------------------------------------------------

#: Capacities in bytes: 0 to 16,384 tokens of Llama-3.1-70B fp16 (327,680 B per token).
CAPACITIES = [327_680 * t for t in (0, 16, 64, 100, 256, 1000, 1024, 4096, 16384)]


def _curve(trace):
    return compute_curve(trace, capacities=CAPACITIES).curve


def test_reblock_16_to_64_equals_hashing_at_64(tmp_path):
    rows = _log(80, seed=4)
    p = _write_jsonl(tmp_path / "log.jsonl", rows)
    t16, log16 = load_token_trace(p, spec=HashSpec(block_tokens=16))
    t64, _ = load_token_trace(p, spec=HashSpec(block_tokens=64))
    df, meta = reblock(log16.requests, log16.meta, 64)
    df, warn = prepare_requests(df, meta, already_relative=False)
    re64 = build_trace(df, meta, warn)
    npt.assert_array_equal(re64.accesses.block, t64.accesses.block)  # same dense reuse structure
    npt.assert_array_equal(re64.accesses.tokens, t64.accesses.tokens)
    a, b = _curve(re64), _curve(t64)
    assert a.columns == b.columns
    assert max(b["prefix_token_hit_rate"]) > 0.2  # the log reuses prefixes: not a trivial curve
    for col in a.columns:
        assert a[col].to_list() == b[col].to_list(), col
    assert t16.meta.block_tokens == 16


def test_reblock_refuses_refining_and_unchained():
    t = _table([[1, 2, 3]], B=16)
    from kvtrace.trace import TraceMeta
    meta = TraceMeta(block_tokens=16, source_format="tokens")
    with pytest.raises(KvtraceError, match="smaller than"):
        reblock(t, meta, 8)
    with pytest.raises(KvtraceError, match="not a multiple"):
        reblock(t, meta, 24)
    with pytest.raises(KvtraceError, match="not prefix-chained"):
        reblock(_table([[5, 7, 9], [7, 9]]), meta, 32)
    out, m = reblock(_table([[1, 2, 3, 4, 5]]), meta, 32)
    assert out["block_ids"].to_list() == [[2, 4, 5]] and m.block_tokens == 32


# -- anonymised export -------------------------------------------------------------------

@pytest.mark.parametrize("to", ["mooncake", "bailian"])
def test_export_roundtrip_same_curve(tmp_path, to):
    rows = _log(60, seed=9)
    p = _write_jsonl(tmp_path / "log.jsonl", rows)
    trace, _ = load_token_trace(p)
    out = tmp_path / f"anon-{to}.jsonl"
    assert write_anonymized(trace, out, to) == len(rows)
    text = out.read_text()
    assert "prompt_token_ids" not in text and "lora" not in text
    first = json.loads(text.splitlines()[0])
    assert first["hash_ids"][0] == 0 and first["timestamp"] == 0
    again = load_trace(out, block_tokens=16)
    a, b = _curve(again), _curve(trace)
    for col in a.columns:
        assert a[col].to_list() == b[col].to_list(), col


def test_export_dense_ids_in_order_of_first_appearance(tmp_path):
    rows = [{"prompt_token_ids": list(range(40)), "timestamp": 0.0},
            {"prompt_token_ids": list(range(32)) + [7] * 3, "timestamp": 0.5}]
    trace, _ = load_token_trace(_write_jsonl(tmp_path / "l.jsonl", rows))
    table = anonymized_table(trace, "mooncake")
    assert table["hash_ids"].to_list() == [[0, 1, 2], [0, 1, 3]]
    assert table["timestamp"].to_list() == [0, 500]
    assert table.columns == ["timestamp", "input_length", "output_length", "hash_ids"]
