"""Request logs through the commands (issue 19): ``--format tokens`` and ``--format
openai`` are read by every command like any trace (ingest is implicit), with the
request-log options, and give the library's figures."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from kvtrace.cli import app
from kvtrace.analyses.curves import compute_curve
from kvtrace.ingest import LogOptions, load_trace
from kvtrace.ingest.chat import load_chat_trace
from kvtrace.ingest.tokens import TokenFields, load_token_trace
from kvtrace.ingest.vllm_hash import HashSpec

from test_chat_logs import CONVERSATION, _train

RUNNER = CliRunner()


def run(*args):
    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def write_token_log(path: Path, requests: int, conversations: int, seed: int, step_ms: int) -> Path:
    """A token log (fields ts_ms, ids, salt): a 64-token system prompt, one of
    ``conversations`` conversations' 40 tokens, a random tail; every third request salted."""
    import random

    rnd = random.Random(seed)
    rows = [{"ts_ms": 1_700_000_000_000 + step_ms * i,
             "ids": list(range(100, 164)) + [1000 + i % conversations] * 40 + [rnd.randrange(2000, 30000)
                                                                            for _ in range(rnd.randrange(5, 60))],
             "salt": "tenant-a" if i % 3 == 0 else None}
            for i in range(requests)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def token_log(tmp_path) -> Path:
    return write_token_log(tmp_path / "log.jsonl", 300, 20, seed=1, step_ms=1000)


def test_a_token_log_runs_end_to_end_and_equals_the_library(token_log, tmp_path):
    args = ["--format", "tokens", "--tokens-field", "ids", "--time-field", "ts_ms", "--salt-field", "salt"]
    out = tmp_path / "c.json"
    res = run("curve", token_log, *args, "--out", out, "--points", 30)
    assert res.exit_code == 0, res.stderr
    assert "timestamps read as milliseconds" in res.stderr
    trace, _ = load_token_trace(token_log, fields=TokenFields(tokens="ids", timestamp="ts_ms", cache_salt="salt"))
    want = compute_curve(trace, points=30).curve
    got = pl.DataFrame(json.loads(out.read_text())["rows"])
    assert got["prefix_token_hit_rate"].to_list() == want["prefix_token_hit_rate"].to_list()
    assert got["capacity_bytes"].to_list() == want["capacity_bytes"].to_list()
    # the same through the library's load_trace with LogOptions (what the app and SQL use)
    log = LogOptions.from_options(tokens_field="ids", time_field="ts_ms", salt_field="salt")
    again = load_trace(token_log, fmt="tokens", log=log)
    assert again.requests["block_ids"].to_list() == trace.requests["block_ids"].to_list()


def test_the_hash_function_changes_ids_not_the_reuse(token_log):
    args = ["--format", "tokens", "--tokens-field", "ids", "--time-field", "ts_ms", "--json", "-"]
    a = json.loads(run("stats", token_log, *args).stdout)
    b = json.loads(run("stats", token_log, *args, "--hash", "sha256_cbor").stdout)
    c = json.loads(run("stats", token_log, *args, "--hash-seed", "42").stdout)
    for other in (b, c):
        assert other["summary"]["distinct_blocks"] == a["summary"]["distinct_blocks"]
        assert other["summary"]["block_accesses"] == a["summary"]["block_accesses"]
        assert [p["hash"] for p in other["top_prefixes"]] != [p["hash"] for p in a["top_prefixes"]]


def test_ingest_writes_a_token_log_once_and_it_reads_back(token_log, tmp_path):
    out = tmp_path / "t.parquet"
    res = run("ingest", token_log, "--format", "tokens", "--tokens-field", "ids", "--time-field", "ts_ms",
              "--out", out)
    assert res.exit_code == 0, res.stderr
    direct, _ = load_token_trace(token_log, fields=TokenFields(tokens="ids", timestamp="ts_ms"))
    back = load_trace(out)
    assert back.requests["block_ids"].to_list() == direct.requests["block_ids"].to_list()
    assert back.meta.block_tokens == 16


def test_a_chat_log_runs_end_to_end(tmp_path):
    d, _ = _train(tmp_path)
    turns = [CONVERSATION[:2], CONVERSATION[:2] + [{"role": "assistant", "content": "It is sunny in Paris."},
                                                    {"role": "user", "content": "And in London?"}]]
    p = tmp_path / "chat.jsonl"
    p.write_text("".join(json.dumps({"timestamp": 1_700_000_000 + i, "body": {"model": "m", "messages": m}}) + "\n"
                         for i, m in enumerate(turns)))
    res = run("stats", p, "--format", "openai", "--tokenizer", d, "--block-tokens", 4, "--json", "-")
    assert res.exit_code == 0, res.stderr
    s = json.loads(res.stdout)["summary"]
    trace, _ = load_chat_trace(p, d, spec=HashSpec(block_tokens=4))
    assert s["requests"] == 2 and s["block_accesses"] == trace.n_accesses and s["distinct_blocks"] == trace.n_blocks
    assert s["rereference_share"] > 0  # the second turn reuses the first turn's blocks
    res = run("stats", p, "--format", "openai", "--tokenizer", tmp_path / "missing")
    assert res.exit_code == 2  # an option value: a usage error
    assert len(res.stderr.strip().splitlines()) == 1
    assert "a local Hugging Face tokenizer; nothing is downloaded" in res.stderr


def test_a_streamed_token_log_equals_the_in_memory_run(token_log, tmp_path):
    args = ["--format", "tokens", "--tokens-field", "ids", "--time-field", "ts_ms", "--salt-field", "salt"]
    for cmd, extra in (("curve", ["--points", "25"]), ("whatif", ["--dram", "64MiB", "--flash", "1GiB"]),
                       ("value", [])):
        outs = []
        for mode in ("--stream", "--no-stream"):
            out = tmp_path / f"{cmd}{mode}.csv"
            res = run(cmd, token_log, *args, *extra, mode, "--out", out)
            assert res.exit_code == 0, (cmd, mode, res.stderr)
            assert ("streaming log.jsonl" in res.stderr) == (mode == "--stream")
            outs.append(pl.read_csv(out))
        assert outs[0].equals(outs[1]), cmd
    stats = [json.loads(run("stats", token_log, *args, mode, "--json", "-").stdout)["summary"]
             for mode in ("--stream", "--no-stream")]
    assert {k: v for k, v in stats[0].items() if k != "warnings"} == {k: v for k, v in stats[1].items()
                                                                      if k != "warnings"}


def test_ingest_hashes_a_token_log_chunk_by_chunk_and_sorts_an_unsorted_one(token_log, tmp_path):
    args = ["--format", "tokens", "--tokens-field", "ids", "--time-field", "ts_ms", "--salt-field", "salt"]
    out = tmp_path / "t.parquet"
    res = run("ingest", token_log, *args, "-o", out)
    assert res.exit_code == 0, res.stderr
    assert "hashed chunk by chunk" in res.stdout
    trace, _ = load_token_trace(token_log, fields=TokenFields(tokens="ids", timestamp="ts_ms", cache_salt="salt"))
    again = load_trace(out)
    assert again.requests.drop("timestamp").equals(trace.requests.drop("timestamp"))
    assert again.requests["timestamp"].to_list() == pytest.approx(trace.requests["timestamp"].to_list(), abs=1e-9)
    # a log out of arrival order: refused by a streamed run (with its line), sorted by ingest in memory
    rows = [json.loads(x) for x in token_log.read_text().splitlines()]
    rows[10], rows[11] = rows[11], rows[10]
    bad = tmp_path / "unsorted.jsonl"
    bad.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = run("curve", bad, *args, "--stream")
    assert res.exit_code == 1 and "unsorted.jsonl:12: field 'ts_ms': timestamps go back in time" in res.stderr
    res = run("ingest", bad, *args, "-o", tmp_path / "u.parquet")
    assert res.exit_code == 0 and "requests sorted stably by time" in res.stderr
    assert load_trace(tmp_path / "u.parquet").requests["block_ids"].to_list() == \
        trace.requests["block_ids"].to_list()
