"""``sql/`` and ``kvtrace sql`` / ``kvtrace export``, run for real on a fixture trace.

Every example query of ``sql/examples`` runs on the fixture and must return the rows
computed here independently: plain Python over the canonical access table, the slow
stack-distance twin (``tests/naive.py``) for distances, numpy for percentiles, and
kvtrace's curve and value functions where the example claims to reproduce them.
The hit-rate macro must agree with ``kvtrace curve --capacity`` run as a command.
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import naive
from sql_helpers import (  # noqa: F401 (ex, fixture_path, trace: shared fixtures)
    GiB, TiB, approx_rows, ex, fixture_path, percentile, trace,
)

from cli_helpers import one_line_error
from kvtrace.cli import app
from kvtrace.analyses.curves import compute_curve
from kvtrace.results.export import example_files, sql_dir
from kvtrace.model import resolve_gpu, resolve_model
from kvtrace.sql.shell import open_database, repl, run_script
from kvtrace.analyses.value import value_report

RUNNER = CliRunner()
LLAMA70 = resolve_model(None)
BPT = LLAMA70.kv_bytes_per_token
FA, FB = LLAMA70.flops_coefficients()


def run(*args, columns: int = 250, **kwargs):
    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": str(columns)}, **kwargs)


def ok(res) -> str:
    assert res.exit_code == 0, (res.exit_code, res.stdout, res.stderr, res.exception)
    return res.stdout


@pytest.fixture(scope="module")
def db_path(fixture_path, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("db") / "fixture.duckdb"
    ok(run("export", fixture_path, "--db", path))
    return path


@pytest.fixture
def con(db_path):
    c = duckdb.connect(str(db_path), read_only=True)
    yield c
    c.close()


def query(con, sql: str) -> list[tuple]:
    return con.execute(sql).fetchall()


def example(name: str) -> str:
    [path] = [f for f in example_files() if f.stem.startswith(name)]
    return path.read_text()


# --------------------------------------------------------------------------- the examples


def turn_bucket(turn):
    if turn is None:
        return "(none)"
    if turn <= 3:
        return str(turn)
    return "4-7" if turn <= 7 else ("8-15" if turn <= 15 else "16+")


def flops(ex, t: int) -> float:
    s = ex.pos[t] * ex.block_tokens
    k = ex.tokens[t]
    return FA * k + FB * (k * s + k * (k - 1) // 2)


def expect_01(ex, trace, capacity=TiB):
    by_type: dict = {}
    for r in range(len(ex.req_ts)):
        g = by_type.setdefault(ex.req_type[r] or "(none)", [0, 0, 0, 0, 0.0, 0.0])
        acc = ex.accesses_of(r)
        g[0] += 1
        g[1] += bool(len(acc)) and ex.usable[acc[0]] * BPT <= capacity
        for t in acc:
            hit = ex.usable[t] * BPT <= capacity
            g[2] += ex.tokens[t] * hit
            g[3] += ex.tokens[t]
            g[4] += flops(ex, t) * hit
            g[5] += flops(ex, t)
    want = [(k, g[0], g[1] / g[0], g[2] / g[3], g[4] / g[5]) for k, g in sorted(by_type.items())]
    # and what `kvtrace curve --by type --capacity` reports
    bg = compute_curve(trace, by="type", capacities=[capacity]).by_group
    curve = [(r["group_name"], r["request_hit_rate"], r["prefix_token_hit_rate"], r["compute_saved_rate"])
             for r in bg.iter_rows(named=True)]
    approx_rows([(w[0], w[2], w[3], w[4]) for w in want], curve, rel=1e-12)
    return want


def expect_02(ex, targets=(0.25, 0.5, 0.75, 0.9)):
    n = len(ex.req_ts)
    first_keys = [ex.usable[ex.req_start[r]] if ex.req_start[r + 1] > ex.req_start[r] else math.inf for r in range(n)]
    weights = {
        "prefix_token": list(zip(ex.usable, ex.tokens)),
        "compute": [(ex.usable[t], flops(ex, t)) for t in range(len(ex.block))],
        "request": [(k, 1) for k in first_keys],
    }

    def capacity(metric, target):
        pairs = sorted(weights[metric], key=lambda x: x[0])
        total = sum(w for _, w in pairs)
        cum = 0
        for d, w in pairs:
            cum += w
            if cum >= target * total * (1 - 1e-12):
                return d * BPT / 2**30 if math.isfinite(d) else None
        return None

    ceiling = sum(k for d, k in weights["prefix_token"] if math.isfinite(d)) / sum(ex.tokens)
    return [(t, capacity("prefix_token", t), capacity("compute", t), capacity("request", t), ceiling) for t in targets]


def expect_03(ex):
    groups: dict = {}
    for t, r in enumerate(ex.request):
        g = groups.setdefault(turn_bucket(ex.req_turn[r]), {"n": 0, "times": [], "order": ex.req_turn[r]})
        g["n"] += 1
        g["order"] = min(g["order"], ex.req_turn[r])
        if math.isfinite(ex.reuse_time[t]):
            g["times"].append(ex.reuse_time[t])
    out = []
    for name, g in sorted(groups.items(), key=lambda kv: (kv[1]["order"], kv[0])):
        out.append((name, g["n"], len(g["times"]) / g["n"], percentile(g["times"], 50), percentile(g["times"], 90),
                    percentile(g["times"], 99)))
    return out


def expect_04(ex, window=3600.0):
    buckets: dict = {}
    seen: set = set()
    for t, b in enumerate(ex.block):
        w = math.floor(ex.ts[t] / window)
        g = buckets.setdefault(w, {"requests": set(), "n": 0, "blocks": set(), "new": 0, "reuse": 0})
        g["requests"].add(ex.request[t])
        g["n"] += 1
        g["blocks"].add(b)
        if b not in seen:
            g["new"] += ex.size[b] * BPT
            seen.add(b)
        g["reuse"] += math.isfinite(ex.dist[t])
    return [(w, w * window, len(g["requests"]), g["n"], len(g["blocks"]), sum(ex.size[b] for b in g["blocks"]) * BPT,
             g["new"], g["reuse"] / g["n"]) for w, g in sorted(buckets.items())]


def expect_05(ex, trace, top=10):
    pp = value_report(trace).per_prefix.head(top)
    first: dict = {}
    for t, b in enumerate(ex.block):
        first.setdefault(b, t)
    return [(r["root_hash"], ex.req_tenant[ex.request[first[r["root_block"]]]], r["blocks"], r["bytes"] / 2**30,
             r["accesses"], r["never_reused_bytes"] / r["bytes"], r["total_value_usd"], r["value_usd_per_byte"] * 1e12,
             r["clairvoyant_value_usd"]) for r in pp.iter_rows(named=True)]


def expect_06(ex, ttls=(60, 300, 1800, 3600)):
    out = []
    warm = [x for x in ex.reuse_time if math.isfinite(x)]
    for ttl in ttls:
        lost = [t for t, x in enumerate(ex.reuse_time) if math.isfinite(x) and x > ttl]
        out.append((ttl, len(lost), len(lost) / len(ex.block), len(lost) / len(warm),
                    sum(ex.tokens[t] for t in lost) / sum(ex.tokens)))
    return out


def expect_07(ex, gap=1800.0):
    sessions: dict = {}
    for r in sorted(range(len(ex.req_ts)), key=lambda r: (ex.req_ts[r], r)):
        s = ex.req_session[r]
        if s is None:
            continue
        sessions.setdefault(s, []).append(r)
    out = []
    for s, rs in sessions.items():
        gaps = [ex.req_ts[b] - ex.req_ts[a] for a, b in zip(rs, rs[1:])]
        returns = sum(g > gap for g in gaps)
        if returns:
            tenants = {ex.req_tenant[r] for r in rs}
            assert len(tenants) == 1
            out.append((s, tenants.pop(), len(rs), returns, max(gaps), ex.req_ts[rs[0]], ex.req_ts[rs[-1]]))
    return sorted(out, key=lambda x: (-x[4], x[0]))


def expect_08(trace, capacities=(16 * GiB, 64 * GiB, 256 * GiB, TiB, 4 * TiB)):
    curve = compute_curve(trace, capacities=list(capacities)).curve
    return [(r["capacity_bytes"], r["capacity_bytes"] / 2**30, r["request_hit_rate"], r["prefix_token_hit_rate"],
             r["compute_saved_rate"]) for r in curve.iter_rows(named=True)]


def expect_09(ex, trace):
    total = value_report(trace).per_block["total_value_usd"].to_list()
    first: dict = {}
    count: dict = {}
    for t, b in enumerate(ex.block):
        first.setdefault(b, t)
        count[b] = count.get(b, 0) + 1
    groups: dict = {}
    for b, t in first.items():
        g = groups.setdefault(ex.req_tenant[ex.request[t]] or "(none)", [0, 0, 0, 0.0])
        g[0] += 1
        g[1] += ex.size[b] * BPT
        g[2] += ex.size[b] * BPT * (count[b] == 1)
        g[3] += total[b]
    return sorted(((k, g[0], g[1], g[2], g[2] / g[1], g[3]) for k, g in groups.items()), key=lambda x: (-x[2], x[0]))


def expected_rows(name: str, ex, trace):
    return {
        "01": lambda: expect_01(ex, trace), "02": lambda: expect_02(ex), "03": lambda: expect_03(ex),
        "04": lambda: expect_04(ex), "05": lambda: expect_05(ex, trace), "06": lambda: expect_06(ex),
        "07": lambda: expect_07(ex), "08": lambda: expect_08(trace), "09": lambda: expect_09(ex, trace),
    }[name]()


@pytest.mark.parametrize("path", example_files(), ids=lambda p: p.stem)
def test_example_returns_the_expected_rows(path, con, ex, trace):
    want = expected_rows(path.stem[:2], ex, trace)
    assert want, "the fixture must give every example something to show"
    approx_rows(query(con, path.read_text()), want)


def test_examples_are_documented_questions():
    files = example_files()
    assert 6 <= len(files) <= 10
    assert sorted(f.stem[:2] for f in files) == [f"{i:02d}" for i in range(1, len(files) + 1)]
    for f in files:
        head = f.read_text().splitlines()
        assert head[0].startswith("-- ") and "Question:" in "\n".join(head[:4]), f.name
        assert any(line.startswith("-- Reads:") for line in head), f.name


def test_example_parameters(con, ex, trace):
    con.execute("SET VARIABLE capacity_bytes = gib(64)")
    con.execute("SET VARIABLE window_s = 600")
    con.execute("SET VARIABLE gap_s = 300")
    con.execute("SET VARIABLE ttls_s = [10, 120]")
    con.execute("SET VARIABLE targets = [0.1, 0.6]")
    con.execute("SET VARIABLE top = 3")
    con.execute("SET VARIABLE capacities = [gib(8), tib(2)]")
    approx_rows(query(con, example("01")), expect_01(ex, trace, capacity=64 * GiB))
    approx_rows(query(con, example("02")), expect_02(ex, targets=(0.1, 0.6)))
    approx_rows(query(con, example("04")), expect_04(ex, window=600.0))
    approx_rows(query(con, example("05")), expect_05(ex, trace, top=3))
    approx_rows(query(con, example("06")), expect_06(ex, ttls=(10, 120)))
    approx_rows(query(con, example("07")), expect_07(ex, gap=300.0))
    approx_rows(query(con, example("08")), expect_08(trace, capacities=(8 * GiB, 2 * TiB)))
    assert len(expect_07(ex, gap=300.0)) > len(expect_07(ex))


def test_fixture_has_what_the_examples_need(ex):
    assert len(expect_04(ex)) == 2  # two hours
    assert expect_07(ex)  # a session returning after 30 min
    assert None not in ex.req_type and len(set(ex.req_type)) == 3


def test_every_sql_file_runs_in_a_fresh_database(con, db_path, tmp_path):
    """views.sql and macros.sql are idempotent (CREATE OR REPLACE) and run as files."""
    copy = tmp_path / "copy.duckdb"
    copy.write_bytes(db_path.read_bytes())
    c = duckdb.connect(str(copy))
    for name in ("macros.sql", "views.sql"):
        c.execute((sql_dir() / name).read_text())
    assert c.execute("SELECT hit_rate_at(gib(64))").fetchall() == con.execute("SELECT hit_rate_at(gib(64))").fetchall()
    c.close()


# --------------------------------------------------------------------------- SQL agrees with the CLI

CAPACITIES = "16GiB,64GiB,200GB,1TiB,2.5TiB"
METRICS = {"request": "request_hit_rate", "prefix_token": "prefix_token_hit_rate",
           "prefix_byte": "prefix_byte_hit_rate", "prefix_block": "prefix_block_hit_rate", "block": "block_hit_rate",
           "token": "token_hit_rate", "byte": "byte_hit_rate", "compute": "compute_saved_rate"}


def _capacity_bytes(text: str) -> int:
    number, unit = re.fullmatch(r"([0-9.]+)([A-Za-z]+)", text).groups()
    scale = {"GiB": 2**30, "TiB": 2**40, "GB": 10**9}[unit]
    return int(Fraction(number) * scale)


@pytest.mark.parametrize("options", [[], ["--model", "Llama-3.1-8B", "--warmup", "20%"], ["--eviction", "flat"]],
                         ids=["default", "8B-warmup", "flat"])
def test_hit_rate_at_equals_kvtrace_curve(options, fixture_path, tmp_path):
    ok(run("curve", fixture_path, "--capacity", CAPACITIES, "--out", tmp_path / "curve.json", *options))
    curve = json.loads((tmp_path / "curve.json").read_text())["rows"]
    ok(run("export", fixture_path, "--db", tmp_path / "t.duckdb", *options))
    caps = [_capacity_bytes(c) for c in CAPACITIES.split(",")]
    cols = ", ".join(f"hit_rate_at(c, metric := '{m}') AS {m}" for m in METRICS)
    sql = f"SELECT c, {cols} FROM (SELECT unnest({caps}) AS c) ORDER BY c"
    from_db = json.loads(ok(run("sql", tmp_path / "t.duckdb", "-c", sql, "--format", "json")))
    on_the_fly = json.loads(ok(run("sql", fixture_path, "-c", sql, "--format", "json", *options)))
    assert on_the_fly == from_db
    assert [r["c"] for r in from_db] == [r["capacity_bytes"] for r in curve] == sorted(caps)
    for got, want in zip(from_db, curve):
        for m, column in METRICS.items():
            if m == "compute":
                assert got[m] == pytest.approx(want[column], rel=1e-12), (got["c"], m)
            else:
                assert got[m] == want[column], (got["c"], m)


def test_hit_rate_at_equals_the_brute_force_replay(con, trace):
    gpu = resolve_gpu(None)
    for c in (64 * GiB, 300 * GiB):
        want = naive.curve_metrics(trace, None, LLAMA70, gpu, True, 0, capacity_bytes=c)
        assert con.execute(f"SELECT hit_rate_at({c})").fetchall()[0][0] == want["prefix_token_hit_rate"]


# --------------------------------------------------------------------------- kvtrace sql


def test_sql_table_output(db_path):
    out = ok(run("sql", db_path, "-c", "SELECT 1 AS one, 2.5 AS x, NULL AS n, 'a' AS s; SELECT 42 AS answer"))
    flat = " ".join(re.sub(r"[│┃║]", " ", out).split())
    assert "one x n s" in flat and "1 2.5 NULL a" in flat
    assert "answer" in flat and "42" in flat  # every statement with rows is shown


def test_sql_csv_and_json_to_stdout(db_path, ex):
    out = ok(run("sql", db_path, "-c", "SELECT t, reuse_distance_tokens AS d FROM accesses ORDER BY t LIMIT 5",
                 "--format", "csv"))
    want = "t,d\n" + "".join(f"{t},{'inf' if d == math.inf else repr(float(d))}\n" for t, d in enumerate(ex.dist[:5]))
    assert out == want
    rows = json.loads(ok(run("sql", db_path, "-c", "SELECT request, hit_distance_tokens AS h, block_ids[1] AS b0 "
                                                    "FROM requests ORDER BY request LIMIT 3", "--format", "json")))
    assert [r["request"] for r in rows] == [0, 1, 2]
    assert all(r["h"] is None for r in rows if math.isinf(ex.usable[ex.req_start[r["request"]]]))


def test_sql_writes_files_atomically(db_path, tmp_path):
    sql = "SELECT block, bytes FROM blocks ORDER BY block LIMIT 4"
    ok(run("sql", db_path, "-c", sql, "-o", tmp_path / "b.parquet"))
    table = pq.read_table(tmp_path / "b.parquet")
    c = duckdb.connect(str(db_path), read_only=True)
    assert table.to_pylist() == [dict(zip(("block", "bytes"), r)) for r in c.execute(sql).fetchall()]
    c.close()
    ok(run("sql", db_path, "-c", sql, "-o", tmp_path / "b.csv"))
    assert (tmp_path / "b.csv").read_text().splitlines()[0] == "block,bytes"
    ok(run("sql", db_path, "-c", sql, "--format", "json", "-o", tmp_path / "b.txt"))
    assert len(json.loads((tmp_path / "b.txt").read_text())) == 4
    before = (tmp_path / "b.csv").read_text()
    one_line_error(run("sql", db_path, "-c", "SELECT nope FROM blocks", "-o", tmp_path / "b.csv", columns=80), 1,
                   "SQL error", "nope")
    assert (tmp_path / "b.csv").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.csv", "b.parquet", "b.txt"]


def test_sql_file_example_and_stdin(db_path, tmp_path, con):
    f = tmp_path / "q.sql"
    f.write_text("-- a comment\nSELECT count(*) AS n FROM accesses;\n")
    n = con.execute("SELECT count(*) FROM accesses").fetchall()[0][0]
    assert json.loads(ok(run("sql", db_path, "-f", f, "--format", "json"))) == [{"n": n}]
    assert json.loads(ok(run("sql", db_path, "--format", "json", input="SELECT 7 AS seven;"))) == [{"seven": 7}]
    rows = json.loads(ok(run("sql", db_path, "-e", "08", "--format", "json")))
    assert [r["capacity_bytes"] for r in rows] == [16 * GiB, 64 * GiB, 256 * GiB, TiB, 4 * TiB]
    assert json.loads(ok(run("sql", db_path, "-e", "curve_at_round_sizes", "--format", "json"))) == rows


def test_sql_errors(db_path, fixture_path, tmp_path):
    one_line_error(run("sql", db_path, "-c", "SELEC 1", columns=80), 1, "SQL error")
    one_line_error(run("sql", db_path, "-c", "SELECT 1; SELECT nope", columns=80), 1, "statement 2")
    one_line_error(run("sql", db_path, "-e", "nope", columns=80), 2, "no example 'nope'", "01_hit_rate_by_type")
    one_line_error(run("sql", db_path, "-c", "SELECT 1", "--model", "Llama-3.1-8B", columns=80), 2, "--model")
    one_line_error(run("sql", db_path, "-c", "SELECT 1", "-e", "01", columns=80), 2, "one of")
    one_line_error(run("sql", db_path, "-c", "SELECT 1", "--format", "parquet", columns=80), 2, "-o FILE")
    one_line_error(run("sql", db_path, "-c", "SELECT 1", "-o", tmp_path / "x.xlsx", columns=80), 2, "--format")
    one_line_error(run("sql", tmp_path / "missing.duckdb", "-c", "SELECT 1", columns=80), 1, "no such file")
    one_line_error(run("sql", db_path, "-f", tmp_path / "missing.sql", columns=80), 1, "no such file")
    one_line_error(run("sql", db_path, input="   \n", columns=80), 2, "no query")
    one_line_error(run("sql", db_path, "-c", "CREATE TABLE x AS SELECT 1", columns=80), 1, "read-only")
    one_line_error(run("sql", db_path, "-c", "CREATE TEMP TABLE y(a INT)", "-o", tmp_path / "x.csv", columns=80), 1,
                   "nothing to write")
    assert not (tmp_path / "x.csv").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": "x"}\n')
    one_line_error(run("sql", bad, "-c", "SELECT 1", columns=80), 1, "bad.jsonl")


def test_sql_write_mode_persists(db_path, tmp_path):
    copy = tmp_path / "w.duckdb"
    copy.write_bytes(db_path.read_bytes())
    ok(run("sql", copy, "--write", "-c", "CREATE TABLE notes AS SELECT 'kept' AS note"))
    assert json.loads(ok(run("sql", copy, "-c", "FROM notes", "--format", "json"))) == [{"note": "kept"}]


# --------------------------------------------------------------------------- kvtrace export


def test_export_cli_output_and_failure_keeps_the_database(fixture_path, tmp_path):
    dest = tmp_path / "a.duckdb"
    out = ok(run("export", fixture_path, "--db", dest))
    assert f"wrote {dest}" in " ".join(out.split())
    for name in ("requests", "accesses", "blocks", "curve", "curve_steps"):
        assert name in out
    before = dest.read_bytes()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1}\n')
    one_line_error(run("export", bad, "--db", dest, columns=80), 1, "bad.jsonl:2")
    one_line_error(run("export", fixture_path, "--db", dest, "--horizon", "-5", columns=80), 2, "horizon")
    assert dest.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.duckdb", "bad.jsonl"]
    not_db = tmp_path / "notes.txt"
    not_db.write_text("mine")
    one_line_error(run("export", fixture_path, "--db", not_db, columns=80), 1, "not a DuckDB database")
    assert not_db.read_text() == "mine"


def test_export_parquet_and_whatif_options(fixture_path, tmp_path):
    (tmp_path / "pq").mkdir()
    whatif = tmp_path / "w.csv"
    whatif.write_text("config,dram_prefix_token_hit_rate\nx,0.25\n")
    ok(run("export", fixture_path, "--db", tmp_path / "a.duckdb", "--parquet", tmp_path / "pq", "--whatif", whatif,
           "--points", "20"))
    assert pq.read_table(tmp_path / "pq" / "curve.parquet").num_rows == 20
    assert pq.read_table(tmp_path / "pq" / "whatif.parquet").to_pylist() == [{"config": "x",
                                                                              "dram_prefix_token_hit_rate": 0.25}]


# --------------------------------------------------------------------------- the interactive prompt


def test_repl(db_path, tmp_path, monkeypatch):
    monkeypatch.setenv("KVTRACE_SQL_HISTORY", str(tmp_path / "history"))
    lines = iter(["SELECT 1 AS a,", "  2 AS b; -- trailing comment", "", ".tables", ".schema curve_steps",
                  ".schema nope", ".examples", ".example 08", "SELECT 'a;b' AS s;", "SELECT nope;", ".read missing.sql",
                  ".bogus", "SELECT 3 AS c;", ".quit", "SELECT 'never';"])
    prompts = []

    def read_line(prompt):
        prompts.append(prompt)
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    shown, said = [], []
    con = open_database(db_path)
    repl(con, shown.append, said.append, read_line=read_line)
    con.close()
    assert prompts[:2] == ["kvtrace> ", "     ...> "]
    assert shown[0].rows() == [(1, 2)]
    assert ("curve_steps", "BASE TABLE") in shown[1].rows() and ("prefixes", "VIEW") in shown[1].rows()
    assert shown[2].columns == ["column_name", "data_type", "comment"] and shown[2].rows()[0][0] == "kind"
    assert any("no table or view 'nope'" in s for s in said)
    assert any(s.startswith("01_hit_rate_by_type: Hit rate by request type") for s in said)
    assert shown[3].columns[:2] == ["capacity_bytes", "gib"]
    assert shown[4].rows() == [("a;b",)]
    assert any(s.startswith("error: SQL error") and "nope" in s for s in said)
    assert any("missing.sql" in s and "no such file" in s for s in said)
    assert any("unknown command .bogus" in s for s in said)
    assert shown[-1].rows() == [(3,)]
    assert (tmp_path / "history").exists()


def test_run_script_skips_statements_without_rows(con):
    results = run_script(con, "CREATE TEMP TABLE z AS SELECT 1 AS a; SET VARIABLE v = 2; "
                              "SELECT a + getvariable('v') AS s FROM z")
    assert [r.rows() for r in results] == [[(3,)]]
    assert np.isinf(run_script(con, "SELECT reuse_distance_tokens FROM accesses ORDER BY t LIMIT 1")[0].rows()[0][0])


def test_set_variables(db_path, ex):
    rows = json.loads(ok(run("sql", db_path, "-e", "07", "--set", "gap_s=300", "--format", "json")))
    want = expect_07(ex, gap=300.0)
    approx_rows([tuple(r.values()) for r in rows], want)
    rows = json.loads(ok(run("sql", db_path, "-e", "06", "--set", "ttls_s=[5, 50]", "--format", "json")))
    approx_rows([tuple(r.values()) for r in rows], expect_06(ex, ttls=(5, 50)))
    one_line_error(run("sql", db_path, "-e", "07", "--set", "gap_s 300", columns=80), 2, "NAME=VALUE")
    one_line_error(run("sql", db_path, "-e", "07", "--set", "gap_s=1 +", columns=80), 1, "--set", "SQL error")
    one_line_error(run("sql", db_path, "-e", "07", "--set", "gap_s='x'", columns=80), 1,
                   "07_sessions_returning_late.sql", "SQL error")


# --------------------------------------------------------------------------- README


def test_readme_documents_the_schema_and_examples():
    from kvtrace.results.export import TABLES

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## SQL for analysts"):]
    section = section[:section.index("\n## ", 5)]
    for name, (_, columns) in TABLES.items():
        assert f"#### `{name}`" in section, name
        for col in columns:
            assert f"`{col}`" in section, (name, col)
    for f in example_files():
        assert f"`{f.name}`" in section, f.name
    for macro in ("hit_rate_at", "capacity_for", "kv_bytes", "reuse_time_pct"):
        assert f"`{macro}(" in section, macro
    for view in ("access_detail", "session_requests", "prefixes", "curve_pct"):
        assert f"`{view}`" in section, view
