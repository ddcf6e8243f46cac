"""Block ids through the commands (issue 19): the unchained-trace warning, ``stats``'s
chain report, ``--rechain``, re-blocking (``--reblock``, and ``--block-tokens`` on a
canonical trace) and ``ingest --anonymize --to``."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

from cli_helpers import one_line_error
from kvtrace.cli import app
from kvtrace.analyses.curves import compute_curve
from kvtrace.ingest import load_trace

ROOT = Path(__file__).resolve().parents[1]
MIXED = ROOT / "sample_traces" / "mixed.parquet"
RUNNER = CliRunner()
CAPS = "16MiB,160MiB,1GiB,8GiB,64GiB"


def run(*args, columns: int = 200):
    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": str(columns)})


def ok(res) -> str:
    assert res.exit_code == 0, (res.exit_code, res.stdout, res.stderr, res.exception)
    return res.stdout


@pytest.fixture
def per_block(tmp_path) -> Path:
    """A Bailian-style trace whose ids hash each block on its own: 120 requests with a
    private first block, then one of 3 "paragraphs" (blocks 7, 8) that recur after
    different prefixes (7, 8, 9 each after 40 parents: 3 of 126 blocks); an engine would never
    reuse them (their prefix differs)."""
    rows = [{"chat_id": i, "parent_chat_id": -1, "timestamp": float(i), "input_length": 48, "output_length": 1,
             "type": "text", "turn": 1, "hash_ids": [1000 + i, 7 + i % 3, 20 + i % 3]} for i in range(120)]
    p = tmp_path / "raw.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _prefix_ids(trace_path: Path, out: Path) -> Path:
    """The same trace with each block id replaced by a dense id of its whole prefix
    (a tuple of raw ids): chained by construction, independently of kvtrace's mix."""
    rows = [json.loads(x) for x in trace_path.read_text().splitlines()]
    ids: dict = {}
    for r in rows:
        r["hash_ids"] = [ids.setdefault(tuple(r["hash_ids"][: j + 1]), len(ids)) for j in range(len(r["hash_ids"]))]
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def test_an_unchained_trace_is_pointed_out_and_rechained(per_block, tmp_path):
    res = run("curve", per_block, "--capacity", CAPS)
    ok(res)
    warn = [x for x in res.stderr.splitlines() if "look unchained" in x]
    assert len(warn) == 1 and "--rechain" in warn[0], res.stderr
    stats = json.loads(ok(run("stats", per_block, "--json", "-")))["summary"]
    assert stats["chained"] is False and stats["multi_parent_block_share"] == pytest.approx(3 / 126)
    assert "no: 2.38% of blocks follow more than one parent (--rechain)" in " ".join(ok(run("stats", per_block)).split())

    out, want = tmp_path / "r.csv", tmp_path / "w.csv"
    res = run("curve", per_block, "--rechain", "--capacity", CAPS, "--out", out)
    ok(res)
    assert "look unchained" not in res.stderr
    ok(run("curve", _prefix_ids(per_block, tmp_path / "chained.jsonl"), "--capacity", CAPS, "--out", want))
    assert_frame_equal(pl.read_csv(out), pl.read_csv(want), check_exact=True)
    assert pl.read_csv(out)["token_hit_rate"].max() == 0.0  # nothing is reused after the same prefix
    assert json.loads(ok(run("stats", per_block, "--rechain", "--json", "-")))["summary"]["chained"] is True


def test_a_chained_trace_gets_no_warning():
    res = run("curve", MIXED, "--capacity", "64GiB")
    ok(res)
    assert "unchained" not in res.stderr
    assert json.loads(ok(run("stats", MIXED, "--json", "-")))["summary"]["chained"] is True


@pytest.fixture
def token_log(tmp_path) -> Path:
    import random

    rnd = random.Random(7)
    prompts = [[rnd.randrange(1, 5000) for _ in range(rnd.randrange(20, 300))] for _ in range(12)]
    rows = []
    for i in range(240):
        base = prompts[i % 12][: rnd.randrange(10, len(prompts[i % 12]) + 1)]
        rows.append({"timestamp": float(i), "prompt_token_ids": base + [rnd.randrange(1, 5000)
                                                                        for _ in range(rnd.randrange(0, 40))]})
    p = tmp_path / "log.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_reblocking_a_token_log_equals_hashing_at_the_larger_block(token_log, tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    caps = "1MiB,5MiB,20MiB,80MiB,1GiB"
    ok(run("curve", token_log, "--format", "tokens", "--block-tokens", "16", "--reblock", "64", "--capacity", caps,
           "--out", a))
    ok(run("curve", token_log, "--format", "tokens", "--block-tokens", "64", "--capacity", caps, "--out", b))
    got, want = pl.read_csv(a), pl.read_csv(b)
    assert want["prefix_token_hit_rate"].max() > 0.2  # the log reuses prefixes
    assert_frame_equal(got, want, check_exact=True)
    one_line_error(run("curve", token_log, "--format", "tokens", "--reblock", "24", columns=80), 1,
                   "field 'reblock'", "not a multiple of the trace's 16-token blocks")


def test_a_canonical_trace_reblocks_to_a_larger_block_tokens(tmp_path):
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    ok(run("curve", MIXED, "--block-tokens", "2048", "--capacity", "64GiB,1TiB", "--out", a))
    ok(run("curve", MIXED, "--reblock", "2048", "--capacity", "64GiB,1TiB", "--out", b))
    assert_frame_equal(pl.read_csv(a), pl.read_csv(b), check_exact=True)
    trace = load_trace(MIXED, block_tokens=2048)
    assert trace.meta.block_tokens == 2048
    assert pl.read_csv(a)["prefix_token_hit_rate"].to_list() == \
        compute_curve(trace, capacities=[64 * 2**30, 2**40]).curve["prefix_token_hit_rate"].to_list()
    one_line_error(run("curve", MIXED, "--block-tokens", "100", columns=80), 1, "smaller than the trace's 512-token")
    one_line_error(run("curve", MIXED, "--stream", "--rechain", columns=80), 2, "kvtrace ingest")


@pytest.mark.parametrize("to, again", [("mooncake", ["--block-tokens", "16"]), ("bailian", [])])
def test_anonymize_writes_a_shareable_trace_with_the_same_curve(token_log, tmp_path, to, again):
    out = tmp_path / f"share-{to}.jsonl"
    res = run("ingest", token_log, "--format", "tokens", "--anonymize", "--to", to, "-o", out)
    text = " ".join(ok(res).split())
    assert f"as anonymised {to} JSONL (16 tokens/block)" in text
    assert ("--block-tokens 16" in text) == bool(again)
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 240 and "prompt_token_ids" not in rows[0] and rows[0]["hash_ids"][0] == 0
    assert set(rows[0]) == ({"timestamp", "input_length", "output_length", "hash_ids"} if to == "mooncake" else
                            {"chat_id", "parent_chat_id", "timestamp", "input_length", "output_length", "type",
                             "turn", "hash_ids"})
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    ok(run("curve", out, *again, "--capacity", "1MiB,20MiB,1GiB", "--out", a))
    ok(run("curve", token_log, "--format", "tokens", "--capacity", "1MiB,20MiB,1GiB", "--out", b))
    assert_frame_equal(pl.read_csv(a), pl.read_csv(b), check_exact=True)
    one_line_error(run("ingest", token_log, "--format", "tokens", "--anonymize", "-o", tmp_path / "x.parquet",
                       columns=80), 2, "--anonymize writes JSONL")
    assert not (tmp_path / "x.parquet").exists()
