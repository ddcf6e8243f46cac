"""The ``kvtrace`` command line, run for real (CliRunner) on files in ``tmp_path``.

Every figure a command prints or writes is checked against an independent
computation (a Python pass over the JSONL lines) or against the library function the
command is a thin wrapper of. Errors must be one line on stderr, exit 1 (2 for a bad
option value), with no traceback, and must not leave or clobber output files.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
import typer
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

from cli_helpers import one_line_error
from kvtrace.cli import app
from kvtrace.analyses.curves import KNEE_FRACTIONS, KNEE_METRICS, compute_curve
from kvtrace.ingest import load_trace, read_metadata
from kvtrace.model import resolve_model

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CHAT = ROOT / "sample_traces" / "chat.jsonl"
MIXED = ROOT / "sample_traces" / "mixed.parquet"
GiB = 2**30
MiB = 2**20
LLAMA8 = 131072  # Llama-3.1-8B KV bytes per token
LLAMA70 = 327680
RUNNER = CliRunner()
COMMANDS = typer.main.get_command(app).commands  # name -> click command


def run(*args, columns: int = 250, **kwargs):
    """Invoke ``kvtrace ARGS``; a wide terminal so that table cells are not cut."""
    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": str(columns)}, **kwargs)


def ok(res) -> str:
    assert res.exit_code == 0, (res.exit_code, res.stdout, res.stderr, res.exception)
    return res.stdout


def flat(text: str) -> str:
    """Terminal text with table rules dropped and runs of white space made one space."""
    return " ".join(re.sub(r"[│┃║]", " ", text).split())


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def mooncake(ts_ms, n_in, hashes, n_out=1):
    return {"timestamp": ts_ms, "input_length": n_in, "output_length": n_out, "hash_ids": hashes}


def temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob(".*.tmp"))


# Three requests where the two LRU models differ (512-token blocks):
#   R0 [A, B], R1 [C], R2 [A, B]; capacity 2 blocks.
# flat: stream A B C A B -> C evicts A (least recent), then A evicts B: no hit.
# prefix-aware: R0 touches B then A (tail first), so C evicts B and R2 hits A.
# Reuse distances in blocks: flat [inf, inf, inf, 3, 3]; prefix-aware [inf, inf, inf, 2, 3].
EVICT = [mooncake(0, 1024, [1, 2]), mooncake(1000, 512, [3]), mooncake(2000, 1024, [1, 2])]


@pytest.fixture
def evict_trace(tmp_path):
    return write_jsonl(tmp_path / "evict.jsonl", EVICT)


@pytest.fixture(scope="module")
def chat_lines():
    return [json.loads(line) for line in CHAT.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def chat_trace():
    return load_trace(CHAT)


# ------------------------------------------------------------------------- help


def test_help_lists_every_command():
    out = flat(ok(run("--help")))
    assert set(COMMANDS) >= {"ingest", "stats", "models", "synth", "curve"}
    for name, cmd in COMMANDS.items():
        assert re.search(rf"(^|\W){re.escape(name)}\W", out), name
        assert flat(cmd.help.splitlines()[0]) in out, name
    assert ok(run("--version")).startswith("kvtrace ")


def test_no_arguments_shows_help():
    res = run()
    assert "Usage" in res.stdout + res.stderr
    assert "curve" in res.stdout + res.stderr


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_has_help(name):
    cmd = COMMANDS[name]
    assert cmd.help and len(cmd.help.strip()) > 20, name
    out = flat(ok(run(name, "--help")))
    assert flat(cmd.help.strip().splitlines()[0]) in out
    assert f"kvtrace {name}" in out
    for param in cmd.params:
        assert getattr(param, "help", None), f"{name}: {param.name} has no help text"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_never_cuts_an_option_name(name):
    """At 80 columns (a terminal, or a pipe) every option name is printed whole."""
    out = ok(run(name, "--help", columns=80))
    assert "…" not in "".join(line.split("│")[1][:45] for line in out.splitlines() if line.startswith("│ "))
    for param in COMMANDS[name].params:
        for opt in getattr(param, "opts", []) + getattr(param, "secondary_opts", []):
            if opt.startswith("--"):
                assert opt in out, f"{name}: {opt}"


def documented_commands(text: str) -> set[str]:
    return set(re.findall(r"^#{2,4}\s+`kvtrace ([a-z][a-z-]*)`", text, flags=re.M))


@pytest.mark.xfail(not README.exists(), reason="README.md is not written yet", strict=False)
def test_every_command_is_documented_in_the_readme():
    documented = documented_commands(README.read_text(encoding="utf-8"))
    missing = sorted(set(COMMANDS) - documented)
    assert not missing, f"commands without a '### `kvtrace NAME`' section in README.md: {missing}"


@pytest.mark.xfail(not README.exists(), reason="README.md is not written yet", strict=False)
def test_readme_documents_no_missing_command():
    stale = sorted(documented_commands(README.read_text(encoding="utf-8")) - set(COMMANDS))
    assert not stale, f"README.md documents commands kvtrace does not have: {stale}"


def test_readme_section_parser():
    text = "# x\n### `kvtrace curve`\nbody\n## `kvtrace stats`\n### kvtrace ingest\n`kvtrace models` inline\n"
    assert documented_commands(text) == {"curve", "stats"}


# ----------------------------------------------------------------------- ingest


def ingest_message(out: Path, n_req: int, n_acc: int, n_blk: int, fmt: str = "mooncake", bt: int = 512) -> str:
    return (rf"wrote {re.escape(str(out))}: {n_req:,} requests, {n_acc:,} block accesses, "
            rf"{n_blk:,} distinct blocks \({fmt}, {bt} tokens/block\) in \d+\.\d\d s")


def test_ingest_chat_round_trip(tmp_path, chat_lines, chat_trace):
    out = tmp_path / "chat.parquet"
    stdout = ok(run("ingest", CHAT, "-o", out))
    n_acc = sum(len(r["hash_ids"]) for r in chat_lines)
    n_blk = len({h for r in chat_lines for h in r["hash_ids"]})
    assert (len(chat_lines), n_acc, n_blk) == (4000, 32158, 12482)  # sample_traces/README.md
    assert re.fullmatch(ingest_message(out, len(chat_lines), n_acc, n_blk), stdout.strip()), stdout
    back = load_trace(out)
    assert_frame_equal(back.access_table(), chat_trace.access_table(), check_exact=True)
    assert_frame_equal(back.requests, chat_trace.requests, check_exact=True)
    np.testing.assert_array_equal(back.block_hash, chat_trace.block_hash)
    np.testing.assert_array_equal(back.block_size, chat_trace.block_size)
    md = read_metadata(out)
    assert md["block_tokens"] == 512 and md["source_format"] == "mooncake"
    assert back.meta.block_tokens == 512
    assert temp_files(tmp_path) == []
    # format parity: the ingested Parquet and the JSONL give the same figures
    from_jsonl = json.loads(ok(run("stats", CHAT, "--json", "-")))
    from_parquet = json.loads(ok(run("stats", out, "--json", "-")))
    for d in (from_jsonl, from_parquet):
        del d["summary"]["source"], d["summary"]["source_format"]
    assert from_parquet == from_jsonl


def test_ingest_hand_trace_counts_and_warning(tmp_path):
    src = write_jsonl(tmp_path / "h.jsonl", [mooncake(5000, 1000, [7, 8]), mooncake(2000, 1500, [7, 8, 9]),
                                             mooncake(9000, 100, [42])])
    out = tmp_path / "h.parquet"
    res = run("ingest", src, "--out", out)
    assert re.fullmatch(ingest_message(out, 3, 6, 4), ok(res).strip()), res.stdout
    assert res.stderr.startswith(f"kvtrace: warning: {src}: timestamps are not monotonic")
    back = load_trace(out)
    assert back.requests["timestamp"].to_list() == [0.0, 3.0, 7.0]  # trace order, from the first arrival
    assert back.access_table()["tokens"].to_list() == [512, 512, 476, 512, 488, 100]
    assert_frame_equal(back.access_table(), load_trace(src).access_table(), check_exact=True)


BAD_LINES = [
    ("not json at all", 2, "malformed JSON"),
    (json.dumps(mooncake(1, "x", [3])), 2, "field 'input_length'"),
    (json.dumps(mooncake(1, 10, 3)), 2, "field 'hash_ids'"),
    (json.dumps(mooncake(1, 10, [3], n_out=-4)), 2, "field 'output_length'"),
    (json.dumps({"timestamp": 1, "input_length": 10, "hash_ids": [3]}), 2, "field 'output_length'"),
]


@pytest.mark.parametrize("bad, line, what", BAD_LINES, ids=["json", "type", "hashes", "negative", "missing"])
def test_failed_ingest_is_one_line_and_leaves_no_file(tmp_path, bad, line, what):
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps(mooncake(0, 1000, [1, 2])) + "\n" + bad + "\n" + json.dumps(mooncake(2, 10, [5])) + "\n")
    out = tmp_path / "new.parquet"
    msg = one_line_error(run("ingest", src, "-o", out, columns=80), 1, f"{src}:{line}: ", what)
    assert msg.startswith(f"kvtrace: error: {src}:{line}: ")
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_failed_ingest_does_not_clobber_an_existing_output(tmp_path, evict_trace):
    out = tmp_path / "t.parquet"
    ok(run("ingest", evict_trace, "-o", out))
    before = out.read_bytes()
    bad = write_jsonl(tmp_path / "bad.jsonl", [mooncake(0, 10, [1]), mooncake(1, "x", [2])])
    one_line_error(run("ingest", bad, "-o", out, columns=80), 1, f"{bad}:2: field 'input_length'")
    assert out.read_bytes() == before
    assert temp_files(tmp_path) == []
    assert load_trace(out).n_requests == 3


def test_interrupted_ingest_keeps_the_old_output(tmp_path, evict_trace, monkeypatch):
    out = tmp_path / "t.parquet"
    ok(run("ingest", evict_trace, "-o", out))
    before = out.read_bytes()

    def interrupted(frame, where, *args, **kwargs):
        Path(where).write_bytes(b"PAR1 partial")
        raise KeyboardInterrupt

    monkeypatch.setattr(pl.DataFrame, "write_parquet", interrupted)
    res = run("ingest", CHAT, "-o", out)
    assert res.exit_code == 130
    assert res.stderr.strip() == "kvtrace: interrupted"
    assert out.read_bytes() == before
    assert temp_files(tmp_path) == []


def test_ingest_into_a_directory_or_missing_directory(tmp_path, evict_trace):
    adir = tmp_path / "adir"
    adir.mkdir()
    # output locations are usage errors found before the trace is read (exit 2)
    one_line_error(run("ingest", evict_trace, "-o", adir, columns=80), 2, f"{adir}: field 'out': is a directory")
    assert list(adir.iterdir()) == [] and temp_files(tmp_path) == []
    missing = tmp_path / "no" / "such" / "dir" / "t.parquet"
    one_line_error(run("ingest", evict_trace, "-o", missing, columns=80), 2, "the output's directory does not exist")
    assert not (tmp_path / "no").exists()


def test_ingest_debug_shows_the_traceback(tmp_path):
    bad = write_jsonl(tmp_path / "bad.jsonl", [mooncake(0, 10, [1]), mooncake(1, "x", [2])])
    out = tmp_path / "o.parquet"
    res = run("--debug", "ingest", bad, "-o", out)
    assert res.exit_code == 1
    assert type(res.exception).__name__ == "KvtraceError"  # propagated, not turned into an exit
    assert "field 'input_length'" in str(res.exception)
    # and for real, in a process of its own
    cmd = [sys.executable, "-m", "kvtrace.cli"]
    plain = subprocess.run(cmd + ["ingest", str(bad), "-o", str(out)], capture_output=True, text=True)
    debug = subprocess.run(cmd + ["--debug", "ingest", str(bad), "-o", str(out)], capture_output=True, text=True)
    assert plain.returncode == 1 and debug.returncode == 1
    assert plain.stderr.strip() == f"kvtrace: error: {bad}:2: field 'input_length': expected an integer"
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].startswith("kvtrace.errors.KvtraceError: ")
    assert not out.exists()


# ------------------------------------------------------------------------ stats


def test_stats_json_matches_independent_figures(chat_lines):
    res = run("stats", CHAT, "--model", "Llama-3.1-8B", "--json", "-")
    s = json.loads(ok(res))["summary"]
    B = 512
    rows = sorted(chat_lines, key=lambda r: r["timestamp"])  # stable
    seen, rereferences, accesses, size = set(), 0, 0, {}
    for r in rows:
        n = len(r["hash_ids"])
        for j, h in enumerate(r["hash_ids"]):
            tokens = B if j < n - 1 else min(max(r["input_length"] - B * (n - 1), 1), B)
            accesses += 1
            rereferences += h in seen
            seen.add(h)
            size[h] = max(size.get(h, 0), tokens)
    ts = [r["timestamp"] / 1000.0 for r in rows]
    assert s["requests"] == len(chat_lines) == 4000
    assert s["block_accesses"] == accesses
    assert s["distinct_blocks"] == len(seen)
    assert s["rereference_share"] == pytest.approx(rereferences / accesses, rel=1e-14)
    assert s["duration_s"] == pytest.approx((ts[-1] - ts[0]), rel=1e-14)
    assert s["kv_bytes_per_token"] == LLAMA8 and s["model"] == "Llama-3.1-8B"
    assert s["distinct_kv_bytes"] == sum(size.values()) * LLAMA8
    assert s["input_tokens"] == sum(r["input_length"] for r in chat_lines)
    assert s["output_tokens"] == sum(r["output_length"] for r in chat_lines)
    minute = {}
    for t in ts:
        minute[math.floor((t - ts[0]) / 60)] = minute.get(math.floor((t - ts[0]) / 60), 0) + 1
    assert s["peak_arrivals_per_minute"] == max(minute.values())
    assert s["sessions"] is None
    assert res.stderr == ""


def test_stats_table_and_json_file(tmp_path):
    dest = tmp_path / "s.json"
    out = flat(ok(run("stats", MIXED, "--json", dest)))
    data = json.loads(dest.read_text())
    s = data["summary"]
    assert f"requests {s['requests']:,}" in out and s["requests"] == 3000
    assert f"distinct blocks {s['distinct_blocks']:,}" in out
    assert "Llama-3.1-70B, 327,680 B/token" in out
    assert "by type" in out and "by tenant" in out
    assert [g["type"] for g in data["groups"]["type"]] == ["agent", "chat", "rag"]
    assert "top shared prefixes" in out
    assert len(data["top_prefixes"]) == 10


def test_stats_missing_trace(tmp_path):
    missing = tmp_path / "nope.jsonl"
    one_line_error(run("stats", missing, columns=80), 1, f"{missing}: no such file")


# ----------------------------------------------------------------------- models


def test_models_lists_presets():
    out = flat(ok(run("models")))
    for name in ("Llama-3.1-8B", "Llama-3.1-70B", "Llama-3.1-405B", "DeepSeek-V3", "H100"):
        assert name in out
    assert "327,680" in out  # Llama-3.1-70B fp16 bytes per token
    assert f"{LLAMA70 * 512:,}" in out  # and per 512-token block


def test_models_json():
    data = json.loads(ok(run("models", "--json", "-")))
    models = {m["name"]: m for m in data["models"]}
    assert models["Llama-3.1-70B"]["kv_bytes_per_token"] == 327680 == 80 * 8 * 128 * 2 * 2
    assert models["Llama-3.1-70B"]["bytes_per_block"] == 327680 * 512
    assert models["Llama-3.1-8B"]["kv_bytes_per_token"] == LLAMA8
    for name, m in models.items():
        assert m["kv_bytes_per_token"] == resolve_model(name).kv_bytes_per_token
    assert "H100" in {g["name"] for g in data["gpus"]}
    small = json.loads(ok(run("models", "--block-tokens", "16", "--json", "-")))
    assert {m["name"]: m["bytes_per_block"] for m in small["models"]}["Llama-3.1-70B"] == 327680 * 16
    # the attention family from the heads: 64 query heads over 8 KV heads is grouped-query
    assert models["Llama-3.1-70B"]["attention"] == "gqa" and models["DeepSeek-V3"]["attention"] == "mla"
    assert all(m["attention"] == ("mla" if m["name"] == "DeepSeek-V3" else "mha" if m["kv_heads"] == m["q_heads"]
                                  else "mqa" if m["kv_heads"] == 1 else "gqa") for m in models.values())


def test_models_table_says_tflops_not_raw_flops():
    out = flat(ok(run("models")))
    assert "peak TFLOP/s" in out and " 989 " in out and "989,000,000,000,000" not in out
    assert " gqa " in out and " mha " not in out  # no preset has one KV head per query head


# ------------------------------------------------------------------------ synth


@pytest.mark.parametrize("fmt, suffix, bt", [("mooncake", "jsonl", 512), ("bailian", "jsonl", 16),
                                             ("parquet", "parquet", 512)])
def test_synth_writes_each_format(tmp_path, fmt, suffix, bt):
    out = tmp_path / f"s.{suffix}"
    stdout = ok(run("synth", "--kind", "chat", "-n", 40, "--seed", 3, "-o", out, "--format", fmt))
    trace = load_trace(out)
    assert trace.n_requests == 40
    assert trace.meta.block_tokens == bt
    assert re.fullmatch(rf"wrote {re.escape(str(out))}: 40 requests, {trace.n_accesses:,} block accesses "
                        rf"\(chat, {fmt}\) in \d+\.\d\d s", stdout.strip()), stdout
    assert temp_files(tmp_path) == []


def test_synth_is_deterministic(tmp_path):
    paths = [tmp_path / n for n in ("a.jsonl", "b.jsonl", "c.jsonl")]
    for p, seed in zip(paths, (7, 7, 8)):
        ok(run("synth", "--kind", "agent", "-n", 60, "--seed", seed, "-o", p))
    a, b, c = (p.read_bytes() for p in paths)
    assert a == b
    assert a != c
    assert len(a.splitlines()) == 60


# ------------------------------------------------------------------------ curve


def test_curve_csv_equals_compute_curve(tmp_path, chat_trace):
    out = tmp_path / "x.csv"
    res = run("curve", CHAT, "--capacity", "1GiB,64GiB", "--out", out)
    text = flat(ok(res))
    got = pl.read_csv(out)
    want = compute_curve(chat_trace, capacities=[GiB, 64 * GiB]).curve
    assert got["capacity_bytes"].to_list() == [GiB, 64 * GiB]
    assert_frame_equal(got, want, check_exact=True, check_dtypes=False)
    assert got.schema == want.schema
    for cap, r in zip(("1 GiB", "64 GiB"), want.iter_rows(named=True)):  # requests, half-prefix, prefix tokens
        assert (f" {cap} {100 * r['request_hit_rate']:.2f}% {100 * r['request_half_prefix_hit_rate']:.2f}% "
                f"{100 * r['prefix_token_hit_rate']:.2f}% ") in text
    assert "Llama-3.1-70B (327,680 B/token), prefix-aware LRU" in text
    assert "APPROXIMATE" not in text
    assert res.stderr.strip() == f"wrote curve: {out}"


@pytest.mark.parametrize("suffix", ["parquet", "json"])
def test_curve_out_carries_metadata(tmp_path, suffix, chat_trace):
    out = tmp_path / f"x.{suffix}"
    ok(run("curve", CHAT, "--capacity", "1GiB,64GiB", "--model", "Llama-3.1-8B", "--out", out))
    want = compute_curve(chat_trace, model="Llama-3.1-8B", capacities=[GiB, 64 * GiB])
    if suffix == "parquet":
        got = pl.read_parquet(out)
        meta = json.loads(pq.read_schema(out).metadata[b"kvtrace"])
    else:
        payload = json.loads(out.read_text())
        got, meta = pl.DataFrame(payload["rows"]), payload["metadata"]
    assert_frame_equal(got, want.curve, check_exact=True, check_dtypes=suffix == "parquet")
    assert set(meta) == {"info", "ceiling", "knees"}
    assert meta["info"]["model"] == "Llama-3.1-8B" and meta["info"]["kv_bytes_per_token"] == LLAMA8
    assert meta["info"]["eviction"] == "prefix-aware" and meta["info"]["approximate"] is False
    assert meta["ceiling"] == want.ceiling
    assert meta["knees"] == want.knees.to_dicts()


def test_curve_json_stdout_gives_ceiling_and_knees(chat_trace):
    res = run("curve", CHAT, "--json", "-")
    data = json.loads(ok(res))  # nothing but JSON on stdout
    want = compute_curve(chat_trace)
    assert data["ceiling"] == want.ceiling
    assert data["ceiling"]["block_hit_rate"] == pytest.approx(1 - 12482 / 32158, rel=1e-14)
    assert len(data["knees"]) == len(KNEE_METRICS) * len(KNEE_FRACTIONS)
    assert {(k["metric"], k["fraction"]) for k in data["knees"]} == {
        (m, f) for m in KNEE_METRICS for f in KNEE_FRACTIONS}
    assert data["knees"] == want.knees.to_dicts()
    assert data["info"]["measured_accesses"] == 32158 and data["info"]["approximate"] is False
    assert data["rows"] == json.loads(json.dumps(want.curve.to_dicts()))  # the curve itself, not only its summary


def test_curve_json_rows_equal_the_out_json_rows(tmp_path):
    out = tmp_path / "c.json"
    data = json.loads(ok(run("curve", MIXED, "--points", 20, "--by", "type", "--out", out, "--json", "-")))
    assert data["rows"] == json.loads(out.read_text())["rows"] and data["rows"]
    assert {r["group_name"] for r in data["rows"]} >= {"all"}


def test_curve_json_file_and_table(tmp_path):
    dest = tmp_path / "m.json"
    res = run("curve", CHAT, "--points", 20, "--json", dest)
    assert "capacity needed to reach a share of the ceiling" in flat(ok(res))
    assert json.loads(dest.read_text())["info"]["model"] == "Llama-3.1-70B"
    assert res.stderr.strip() == f"wrote json: {dest}"


PLOT_MAGIC = {
    "png": lambda b: b.startswith(b"\x89PNG\r\n\x1a\n"),
    "svg": lambda b: b.lstrip().startswith(b"<svg"),
    "html": lambda b: b"<html" in b[:300] and b"vega" in b,
}


@pytest.mark.parametrize("fmt", sorted(PLOT_MAGIC))
def test_curve_plot(tmp_path, evict_trace, fmt):
    dest = tmp_path / f"c.{fmt}"
    res = run("curve", evict_trace, "--points", 8, "--plot", dest)
    ok(res)
    assert PLOT_MAGIC[fmt](dest.read_bytes())
    assert res.stderr.strip() == f"wrote plot: {dest}"
    assert temp_files(tmp_path) == []


def curve_rows(path: Path) -> dict[int, dict]:
    return {r["capacity_bytes"]: r for r in pl.read_csv(path).to_dicts()}


def test_eviction_models_differ_where_they_should(tmp_path, evict_trace):
    caps = "128MiB,192MiB"  # 2 and 3 blocks of 512 tokens x 131,072 B
    rows = {}
    for ev in ("prefix-aware", "flat"):
        out = tmp_path / f"{ev}.csv"
        ok(run("curve", evict_trace, "-m", "Llama-3.1-8B", "--eviction", ev, "--capacity", caps, "--out", out))
        rows[ev] = curve_rows(out)
        want = compute_curve(load_trace(evict_trace), model="Llama-3.1-8B", eviction=ev,
                             capacities=[128 * MiB, 192 * MiB]).curve
        assert_frame_equal(pl.read_csv(out), want, check_exact=True, check_dtypes=False)
    pa, fl = rows["prefix-aware"], rows["flat"]
    # 2 blocks: prefix-aware hits A in R2 (1 of 5 blocks, 512 of 2560 tokens, 1 of 3 requests)
    assert pa[128 * MiB]["block_hit_rate"] == 0.2 and pa[128 * MiB]["prefix_token_hit_rate"] == 0.2
    assert pa[128 * MiB]["request_hit_rate"] == 1 / 3
    assert fl[128 * MiB]["block_hit_rate"] == 0.0 and fl[128 * MiB]["request_hit_rate"] == 0.0
    # 3 blocks: both models hit all of R2
    for r in (pa[192 * MiB], fl[192 * MiB]):
        assert r["block_hit_rate"] == 0.4 and r["prefix_token_hit_rate"] == 0.4 and r["request_hit_rate"] == 1 / 3


def test_curve_warmup(tmp_path, evict_trace):
    out = tmp_path / "w.csv"
    res = run("curve", evict_trace, "-m", "Llama-3.1-8B", "--capacity", "128MiB", "--warmup", "0.5", "--out", out)
    assert "3 accesses measured after warm-up" in flat(ok(res))
    r = curve_rows(out)[128 * MiB]
    # R0 only fills the cache; measured: R1 [C] (miss), R2 [A hit, B miss]
    assert r["request_hit_rate"] == 0.5
    assert r["block_hit_rate"] == 1 / 3
    assert r["prefix_token_hit_rate"] == 512 / 1536
    info = json.loads(ok(run("curve", evict_trace, "--warmup", "50%", "--json", "-")))["info"]
    assert info["warmup"] == {"kind": "fraction", "value": 0.5}
    assert (info["first_measured_request"], info["measured_requests"], info["measured_accesses"]) == (1, 2, 3)
    info = json.loads(ok(run("curve", evict_trace, "--warmup", "1.5s", "--json", "-")))["info"]
    assert info["warmup"] == {"kind": "seconds", "value": 1.5} and info["first_measured_request"] == 2


def test_curve_distances_out(tmp_path, evict_trace, chat_trace):
    for ev, blocks in (("prefix-aware", [2.0, 3.0]), ("flat", [3.0, 3.0])):
        dest = tmp_path / f"d-{ev}.parquet"
        res = run("curve", evict_trace, "-m", "Llama-3.1-8B", "--eviction", ev, "--points", 4, "--distances-out", dest)
        assert f"wrote distances: {dest}" in ok(res) + res.stderr
        d = pl.read_parquet(dest)
        assert d.height == 5
        assert d["t"].to_list() == [0, 1, 2, 3, 4]
        assert d["block"].to_list() == [0, 1, 2, 0, 1]
        assert d["reuse_distance_blocks"].to_list() == [math.inf] * 3 + blocks
        assert d["reuse_distance_tokens"].to_list() == [math.inf] * 3 + [b * 512 for b in blocks]
        assert d["reuse_distance_bytes"].to_list() == [math.inf] * 3 + [b * 512 * LLAMA8 for b in blocks]
        assert d["reuse_time_s"].to_list() == [math.inf] * 3 + [2.0, 2.0]
        meta = json.loads(pq.read_schema(dest).metadata[b"kvtrace"])
        assert meta["eviction"] == ev and meta["cold"] == "inf" and meta["kv_bytes_per_token"] == LLAMA8
    dest = tmp_path / "chat.parquet"
    ok(run("curve", CHAT, "--points", 4, "--distances-out", dest))
    d = pl.read_parquet(dest)
    assert d.height == chat_trace.n_accesses == 32158  # one row per access
    assert int(d["reuse_distance_tokens"].is_infinite().sum()) == chat_trace.n_blocks  # first accesses are cold


def test_curve_by_type(tmp_path):
    out = tmp_path / "g.csv"
    res = run("curve", MIXED, "--by", "type", "--capacity", "16GiB,256GiB", "--out", out)
    text = flat(ok(res))
    assert "by type (shared cache" in text
    g = pl.read_csv(out)
    assert g.columns[:2] == ["group_by", "group_name"] and set(g["group_by"]) == {"type"}
    assert g["group_name"].to_list() == ["all", "all", "agent", "agent", "chat", "chat", "rag", "rag"]
    plain = tmp_path / "p.csv"
    ok(run("curve", MIXED, "--capacity", "16GiB,256GiB", "--out", plain))
    assert_frame_equal(g.filter(pl.col("group_name") == "all").drop("group_by", "group_name"), pl.read_csv(plain),
                       check_exact=True)
    # agents reuse much more than RAG (sample_traces/README.md)
    at = {r["group_name"]: r for r in g.filter(pl.col("capacity_bytes") == 256 * GiB).to_dicts()}
    assert at["agent"]["prefix_token_hit_rate"] > at["rag"]["prefix_token_hit_rate"]


def test_curve_sample_rate_is_labelled_approximate(tmp_path):
    res = run("curve", CHAT, "--sample-rate", "0.5", "--capacity", "8GiB,64GiB")
    assert "APPROXIMATE: SHARDS sample rate 0.5" in flat(ok(res))
    info = json.loads(ok(run("curve", CHAT, "--sample-rate", "0.5", "--json", "-")))["info"]
    assert info["approximate"] is True and info["sample_rate"] == 0.5
    assert info["error_estimate"]["metric"] == "prefix_token_hit_rate"
    assert 0 < info["sampled_accesses"] < 32158
    out = tmp_path / "s.csv"
    ok(run("curve", CHAT, "--sample-rate", "0.5", "--capacity", "8GiB", "--out", out))
    assert "prefix_token_hit_rate_se" in pl.read_csv(out).columns


@pytest.mark.parametrize("args, code, needles", [
    (["--capacity", "12XB"], 2, ["capacity", "12XB"]),
    (["--capacity", "0"], 2, ["capacity"]),
    (["--out", "x.txt"], 2, ["x.txt", "unsupported output file (suffix '.txt')"]),
    (["--distances-out", "d.xlsx"], 2, ["d.xlsx", "unsupported output file"]),
    (["--plot", "x.gif"], 2, ["plot", ".gif"]),
    (["--sample-rate", "1.5"], 2, ["sample-rate"]),
    (["--sample-rate", "5e-8"], 2, ["sample-rate", "2**-24"]),
    (["--capacity", "8192PiB"], 2, ["capacity", "2**63"]),
    (["--sample-rate", "0.5", "--distances-out", "d.parquet"], 2, ["distances-out"]),
    (["--model", "NoSuchModel-9B"], 2, ["model", "NoSuchModel-9B"]),
], ids=["capacity-unit", "capacity-zero", "out-suffix", "distances-suffix", "plot-suffix", "sample-rate",
        "sample-rate-tiny", "capacity-huge", "sampled-distances", "model"])
def test_curve_bad_options_fail_before_reading_the_trace(tmp_path, args, code, needles):
    missing = tmp_path / "not-read.jsonl"  # the option is rejected before the trace is opened
    one_line_error(run("curve", missing, *args, columns=80), code, *needles)
    assert list(tmp_path.iterdir()) == []


def test_curve_bad_warmup(tmp_path, evict_trace):
    one_line_error(run("curve", evict_trace, "--warmup", "1.0", columns=80), 2, "warmup")
    one_line_error(run("curve", evict_trace, "--warmup", "10 parsecs", columns=80), 2, "warmup")


def test_curve_missing_trace(tmp_path):
    missing = tmp_path / "nope.jsonl"
    one_line_error(run("curve", missing, columns=80), 1, f"{missing}: no such file")


def test_curve_by_session_length_without_sessions(tmp_path):
    out = tmp_path / "g.csv"
    one_line_error(run("curve", CHAT, "--by", "session-length", "--out", out, columns=80), 1,
                   "'by'", "session")
    assert not out.exists()


# --------------------------------------------------------------------------- value


def test_value_json_and_tables_equal_the_library(tmp_path):
    from kvtrace.ingest import load_trace
    from kvtrace.analyses.value import StorageCosts, value_report

    blocks, prefixes = tmp_path / "b.parquet", tmp_path / "p.csv"
    res = run("value", CHAT, "--horizon", "10min", "--write-cost", "1", "--occupancy-cost", "5",
              "--out", blocks, "--prefixes-out", prefixes, "--json", tmp_path / "v.json")
    ok(res)
    want = value_report(load_trace(CHAT), horizon_s=600.0,
                        costs=StorageCosts.per_tb(write_dollars_per_tb=1.0, occupancy_dollars_per_tb_month=5.0))
    assert_frame_equal(pl.read_parquet(blocks), want.per_block, check_exact=True)
    assert_frame_equal(pl.read_csv(prefixes, schema=want.per_prefix.schema), want.per_prefix, check_exact=False)
    got = json.loads((tmp_path / "v.json").read_text())
    assert got["summary"]["never_reused_bytes"] == want.summary["never_reused_bytes"]
    assert got["summary"]["total_value_usd"] == pytest.approx(want.summary["total_value_usd"], rel=1e-12)
    assert got["summary"]["horizon_s"] == 600.0


def test_value_bad_options(tmp_path):
    missing = tmp_path / "not-read.jsonl"
    one_line_error(run("value", missing, "--horizon", "soon", columns=80), 2, "horizon")
    one_line_error(run("value", missing, "--out", "v.txt", columns=80), 2, "unsupported output file")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- whatif


def test_whatif_table_equals_the_library_and_dram_matches_the_curve(tmp_path):
    from kvtrace.analyses.curves import compute_curve
    from kvtrace.ingest import load_trace
    from kvtrace.analyses.whatif import TierConfig, simulate

    out = tmp_path / "w.parquet"
    ok(run("whatif", CHAT, "--dram", "64GiB", "--flash", "512GiB", "--policy", "all,second-hit", "--out", out,
           "--workers", "1"))
    got = pl.read_parquet(out)
    assert got.height == 2
    trace = load_trace(CHAT)
    want = simulate(trace, TierConfig("64GiB", flash_bytes="512GiB", policy="freq>=2")).summary
    row = got.filter(pl.col("policy") == "freq>=2").row(0, named=True)
    for key in ("dram_prefix_token_hit_rate", "flash_prefix_token_hit_rate", "prefix_token_miss_rate",
                "flash_write_bytes"):
        assert row[key] == pytest.approx(want[key], rel=1e-12)
    # DRAM alone is the curve at the DRAM capacity
    curve = compute_curve(trace, capacities=[64 * 2**30]).curve.row(0, named=True)
    assert row["dram_prefix_token_hit_rate"] == pytest.approx(curve["prefix_token_hit_rate"], rel=1e-12)


def test_whatif_bad_options(tmp_path):
    missing = tmp_path / "not-read.jsonl"
    one_line_error(run("whatif", missing, "--dram", "64GiB,128GiB", columns=80), 2, "grid")
    one_line_error(run("whatif", missing, "--dram", "64GiB", "--out", "w.txt", columns=80), 2, "unsupported output")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ the shared formats and defaults
def test_present_formats_are_the_cli_formats():
    from kvtrace.results import present

    assert [present.rate(x) for x in (None, 0.1234, 1.0)] == ["-", "12.34%", "100.00%"]
    assert [present.count(x) for x in (None, 1234, 12345.6, 12.345, 3.0)] == ["-", "1,234", "12,346", "12.3", "3"]
    assert [present.money(x) for x in (None, 1234.5, -868.52)] == ["-", "$1,234.50", "-$868.52"]
    assert [present.signed_money(x) for x in (12.0, -3.5)] == ["+$12.00", "-$3.50"]
    assert present.plain_dollars(-0.05) == "$-0.05"
    assert [present.milliseconds(x) for x in (None, 181.04)] == ["-", "181.0 ms"]
    assert present.bandwidth(3 * GiB) == "3 GiB/s" and present.per_tb(1.5e-12) == "1.50"


def test_knee_table_pivots_the_curve_knees():
    from kvtrace.results import present

    result = compute_curve(load_trace(CHAT), model="Llama-3.1-8B")
    table = present.knee_table(result.knees)
    assert table.columns == ["share of ceiling", *KNEE_METRICS]
    assert table["share of ceiling"].to_list() == [f"{100 * f:g}%" for f in sorted(KNEE_FRACTIONS)]
    k = result.knees.filter((pl.col("metric") == "request_hit_rate") & (pl.col("fraction") == 0.8))
    cell = table.filter(pl.col("share of ceiling") == "80%")["request_hit_rate"][0]
    assert cell == f"{present.format_bytes(k['capacity_bytes'][0])} ({present.rate(k['target_rate'][0])})"


def test_option_defaults_are_the_library_defaults():
    from kvtrace.analyses.response import ResponseModel
    from kvtrace.analyses.value import DEFAULT_HORIZON

    r = ResponseModel()
    text = RUNNER.invoke(app, ["whatif", "--help"], env={"COLUMNS": "200"}).stdout
    for option, value in (("--dram-gbps", r.dram_bytes_per_s / 1e9), ("--dram-latency-ms", r.dram_fixed_s * 1e3),
                          ("--flash-gbps", r.flash_bytes_per_s / 1e9), ("--flash-latency-ms", r.flash_fixed_s * 1e3),
                          ("--overhead-ms", r.overhead_s * 1e3), ("--horizon", DEFAULT_HORIZON)):
        line = next(line for line in text.splitlines() if f"{option} " in line)
        assert f"[default: {value}]" in line, line
