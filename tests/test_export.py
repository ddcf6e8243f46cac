"""``kvtrace.results.export``: the analysis database, its tables, macros and atomic writing.

Every table is checked against an independent computation: the slow twin of the
stack-distance kernel (``tests/naive.py``) for distances and reuse times, a brute-force
LRU replay (``naive.curve_metrics``) for the hit-rate macro at every metric, plain
Python for per-request and per-block figures, and kvtrace's curve/value functions for
the result tables they produce. A failed export must leave no partial database and
keep the previous one.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

import naive
from sql_helpers import (  # noqa: F401 (ex, fixture_path, trace: shared fixtures)
    GiB, MOONCAKE, TiB, ex, expect, fixture_path, percentile, trace,
)

from kvtrace.analyses.curves import KNEE_FRACTIONS, RATE_COLUMNS, compute_curve
from kvtrace.errors import KvtraceError
from kvtrace.results.export import TABLES, build_database, example_files, export_database, install_sql, is_database, \
    parquet_views_sql, sql_dir
from kvtrace.ingest import load_trace
from kvtrace.ingest.canonical import requests_to_trace
from kvtrace.model import resolve_gpu, resolve_model
from kvtrace.outputs import write_table
from kvtrace.analyses.stats import trace_stats
from kvtrace.trace import TraceMeta
from kvtrace.analyses.value import value_report

LLAMA70 = resolve_model(None)
BPT = LLAMA70.kv_bytes_per_token
METRICS = {  # macro metric -> curve column
    "request": "request_hit_rate", "prefix_token": "prefix_token_hit_rate", "prefix_byte": "prefix_byte_hit_rate",
    "prefix_block": "prefix_block_hit_rate", "block": "block_hit_rate", "token": "token_hit_rate",
    "byte": "byte_hit_rate", "compute": "compute_saved_rate",
}



@pytest.fixture(scope="module")
def db(trace, tmp_path_factory):
    path = tmp_path_factory.mktemp("db") / "fixture.duckdb"
    export_database(trace, path)
    con = duckdb.connect(str(path), read_only=True)
    yield con
    con.close()


def rows(con, sql: str, *params) -> list[tuple]:
    return con.execute(sql, list(params)).fetchall()


def one(con, sql: str, *params):
    return con.execute(sql, list(params)).fetchall()[0][0]


def frame(con, sql: str, *params) -> pl.DataFrame:
    cur = con.execute(sql, list(params))
    return pl.DataFrame(cur.fetchall(), schema=[d[0] for d in cur.description], orient="row")


def meta_row(con) -> dict:
    return frame(con, "FROM trace_meta").row(0, named=True)


def temp_leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(".") or p.suffix == ".wal")


# --------------------------------------------------------------------------- schema


def test_every_table_and_column_is_documented_in_the_database(db):
    tables = {r[0] for r in rows(db, "SELECT table_name FROM duckdb_tables()")}
    assert tables == set(TABLES)
    for name, (description, columns) in TABLES.items():
        got = rows(db, "SELECT column_name, comment FROM duckdb_columns() WHERE table_name = ? "
                       "ORDER BY column_index", name)
        assert [c for c, _ in got] == list(columns), name
        assert all(comment == columns[c] for c, comment in got), name
        assert one(db, "SELECT comment FROM duckdb_tables() WHERE table_name = ?", name) == description
    assert rows(db, "SELECT table_name, column_name FROM duckdb_columns() WHERE data_type = 'NULL'") == []
    views = {r[0] for r in rows(db, "SELECT view_name FROM duckdb_views() WHERE NOT internal")}
    assert views == {"access_detail", "session_requests", "prefixes", "curve_pct"}
    macros = {r[0] for r in rows(db, "SELECT function_name FROM duckdb_functions() WHERE function_type IN "
                                     "('macro', 'table_macro') AND NOT internal")}
    assert macros >= {"hit_rate_at", "capacity_for", "kv_bytes", "reuse_time_pct", "gib", "tib"}


def test_row_counts_and_meta(db, trace):
    assert one(db, "SELECT count(*) FROM requests") == trace.n_requests
    assert one(db, "SELECT count(*) FROM accesses") == trace.n_accesses
    assert one(db, "SELECT count(*) FROM blocks") == trace.n_blocks
    m = meta_row(db)
    assert m["kv_bytes_per_token"] == BPT and m["model"] == LLAMA70.name
    assert m["block_tokens"] == 512 and m["eviction"] == "prefix-aware"
    assert (m["prefill_flops_per_token"], m["prefill_flops_per_token_position"]) == LLAMA70.flops_coefficients()
    assert m["distinct_bytes"] == int(sum(trace.block_size)) * BPT
    assert m["first_measured_request"] == 0 and m["measured_accesses"] == trace.n_accesses
    assert m["horizon_s"] == 3600.0


# --------------------------------------------------------------------------- accesses, requests, blocks


def test_accesses_match_the_twin(db, ex):
    got = rows(db, "SELECT request, pos, block, tokens, timestamp, reuse_distance_tokens, usable_distance_tokens, "
                   "reuse_distance_bytes, usable_distance_bytes, reuse_distance_blocks, reuse_time_s, measured "
                   "FROM accesses ORDER BY t")
    n = len(ex.block)
    assert len(got) == n
    assert [r[0] for r in got] == ex.request
    assert [r[1] for r in got] == ex.pos
    assert [r[2] for r in got] == ex.block
    assert [r[3] for r in got] == ex.tokens
    assert [r[4] for r in got] == ex.ts
    assert [r[5] for r in got] == ex.dist
    assert [r[6] for r in got] == ex.usable
    assert [r[7] for r in got] == [d * BPT for d in ex.dist]
    assert [r[8] for r in got] == [d * BPT for d in ex.usable]
    assert [r[9] for r in got] == ex.dist_blocks
    assert [r[10] for r in got] == pytest.approx(ex.reuse_time, abs=1e-9)
    assert all(r[11] for r in got)
    assert math.inf in ex.dist and any(math.isfinite(d) for d in ex.dist)  # cold and warm accesses


def test_next_use_and_prefill_flops(db, ex):
    got = rows(db, "SELECT next_t, next_gap_s, prefill_flops FROM accesses ORDER BY t")
    last: dict[int, int] = {}
    nxt = [None] * len(ex.block)
    for t in reversed(range(len(ex.block))):
        nxt[t] = last.get(ex.block[t])
        last[ex.block[t]] = t
    assert [r[0] for r in got] == nxt
    gaps = [math.inf if u is None else ex.ts[u] - ex.ts[t] for t, u in enumerate(nxt)]
    assert [r[1] for r in got] == pytest.approx(gaps, abs=1e-9)
    a, b = LLAMA70.flops_coefficients()
    for (_, _, flops), k, p in zip(got, ex.tokens, ex.pos):
        start = p * ex.block_tokens
        assert flops == pytest.approx(sum(a + b * x for x in range(start, start + k)), rel=1e-12)


def test_requests_table(db, trace, ex):
    got = rows(db, "SELECT request, request_id, blocks, prompt_tokens, hit_distance_tokens, hit_distance_bytes, "
                   "type, tenant, session_id, turn, block_ids FROM requests ORDER BY request")
    req = trace.requests
    for r, row in enumerate(got):
        acc = ex.accesses_of(r)
        first = ex.usable[acc[0]] if len(acc) else math.inf
        assert row[:6] == (r, req["request_id"][r], len(acc), sum(ex.tokens[t] for t in acc), first, first * BPT)
        assert row[6:10] == (ex.req_type[r], ex.req_tenant[r], ex.req_session[r], ex.req_turn[r])
        assert row[10] == req["block_ids"][r].to_list()


def test_blocks_table(db, trace, ex):
    got = rows(db, "SELECT block, hash, tenant, size_tokens, bytes, root_block, first_seen_s, last_seen_s, accesses, "
                   "reused FROM blocks ORDER BY block")
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    count: dict[int, int] = {}
    for t, b in enumerate(ex.block):
        first.setdefault(b, t)
        last[b] = t
        count[b] = count.get(b, 0) + 1
    for b, row in enumerate(got):
        r = ex.request[first[b]]
        root = ex.block[ex.req_start[r]]
        assert row == (b, int(trace.block_hash[b]), ex.req_tenant[r], ex.size[b], ex.size[b] * BPT, root,
                       ex.ts[first[b]], ex.ts[last[b]], count[b], count[b] > 1)
    vr = value_report(trace)
    values = frame(db, "SELECT horizon_hits, gain_gpu_seconds, cost_usd, total_value_usd, value_usd_per_byte, "
                       "clairvoyant_value_usd FROM blocks ORDER BY block")
    expected = vr.per_block.select(values.columns)
    assert values.to_dicts() == expected.to_dicts()


def test_value_columns_of_accesses(db, trace):
    fr = value_report(trace).future
    got = db.execute("SELECT reuses, value_usd, interval_value_usd FROM accesses ORDER BY t").fetchnumpy()
    np.testing.assert_array_equal(got["reuses"], fr.reuses)
    np.testing.assert_array_equal(got["value_usd"], fr.value_usd)
    np.testing.assert_array_equal(got["interval_value_usd"], fr.interval_value_usd)


# --------------------------------------------------------------------------- curve tables


def test_curve_tables_are_the_curve(db, trace):
    cr = compute_curve(trace)
    assert frame(db, "FROM curve").to_dicts() == cr.curve.to_dicts()
    assert frame(db, "FROM knees").to_dicts() == cr.knees.to_dicts()
    for by in ("type", "tenant", "turn", "session-length"):
        got = frame(db, "SELECT * EXCLUDE (group_by) FROM curve_by_group WHERE group_by = ? ORDER BY rowid", by)
        want = compute_curve(trace, by=by).by_group
        assert got.to_dicts() == want.to_dicts(), by
    meta = meta_row(db)
    for k in RATE_COLUMNS:
        assert meta[f"ceiling_{k}"] == cr.ceiling[k]


def test_curve_steps_are_the_distances(db, ex):
    got = rows(db, "SELECT distance_tokens, accesses, tokens FROM curve_steps WHERE kind = 'prefix' "
                   "ORDER BY distance_tokens")
    want: dict[float, list[int]] = {}
    for d, k in zip(ex.usable, ex.tokens):
        w = want.setdefault(d, [0, 0])
        w[0] += 1
        w[1] += k
    assert got == [(d, n, k) for d, (n, k) in sorted(want.items())]


# --------------------------------------------------------------------------- macros


def hand_trace(block_tokens: int = 512) -> "Trace":  # noqa: F821
    """R0 [A, B], R1 [C], R2 [A, B] (full blocks); prefix-aware distances in blocks
    [inf, inf, inf, 2, 3], flat [inf, inf, inf, 3, 3] (tests/test_cli.py EVICT)."""
    df = pl.DataFrame({
        "request_id": [0, 1, 2], "timestamp": [0.0, 1.0, 2.0], "input_tokens": [1024, 512, 1024],
        "output_tokens": [1, 1, 1], "block_ids": [[1, 2], [3], [1, 2]],
    })
    return requests_to_trace(df, TraceMeta(block_tokens=block_tokens, source_format="canonical", source="hand"))


def test_hit_rate_at_by_hand():
    con = duckdb.connect()
    build_database(con, hand_trace())
    block = 512 * BPT
    assert rows(con, "SELECT usable_distance_tokens FROM accesses ORDER BY t") == [
        (math.inf,), (math.inf,), (math.inf,), (1024.0,), (1536.0,)]
    # 2 blocks: R2 hits A only -> 1 of 5 blocks (512 of 2560 tokens), 1 of 3 requests
    assert one(con, "SELECT hit_rate_at(?)", 2 * block) == 512 / 2560
    assert one(con, "SELECT hit_rate_at(?, metric := 'request')", 2 * block) == 1 / 3
    assert one(con, "SELECT hit_rate_at(?)", 2 * block - 1) == 0.0
    assert one(con, "SELECT hit_rate_at(?)", 3 * block) == 1024 / 2560
    assert one(con, "SELECT hit_rate_at(?)", 0) == 0.0
    assert one(con, "SELECT capacity_for(0.4)") == 3 * block
    assert one(con, "SELECT capacity_for(0.2)") == 2 * block
    assert one(con, "SELECT capacity_for(0.41)") is None  # above the ceiling (2 of 5 blocks)
    assert one(con, "SELECT capacity_for(0)") == 0
    with pytest.raises(duckdb.Error, match="unknown metric 'nope'"):
        con.execute("SELECT hit_rate_at(1, metric := 'nope')").fetchall()
    flat = duckdb.connect()
    build_database(flat, hand_trace(), eviction="flat")
    assert one(flat, "SELECT hit_rate_at(?)", 2 * block) == 0.0
    assert one(flat, "SELECT hit_rate_at(?, metric := 'block')", 3 * block) == 2 / 5


@pytest.mark.parametrize("eviction,warmup,model", [("prefix-aware", None, None), ("flat", None, None),
                                                   ("prefix-aware", "25%", "Llama-3.1-8B"), ("flat", "30min", None)])
def test_hit_rate_at_is_exact_at_every_metric(trace, ex, eviction, warmup, model):
    """The macro against a brute-force LRU replay, at capacities on, and one byte
    either side of, real distances."""
    m = resolve_model(model)
    bpt = m.kv_bytes_per_token
    con = duckdb.connect()
    build_database(con, trace, model=m, eviction=eviction, warmup=warmup)
    first = one(con, "SELECT first_measured_request FROM trace_meta")
    twin = expect(trace, prefix_aware=eviction == "prefix-aware") if eviction == "flat" else ex
    finite = sorted({d for d in twin.usable if math.isfinite(d)})
    picks = [finite[0], finite[len(finite) // 3], finite[len(finite) // 2], finite[-1]]
    capacities = [0, 1] + [d * bpt + delta for d in picks for delta in (-1, 0, 1)] + [100 * TiB]
    gpu = resolve_gpu(None)
    for c in capacities:
        want = naive.curve_metrics(trace, None, m, gpu, eviction == "prefix-aware", first, capacity_bytes=c)
        for metric, column in METRICS.items():
            got = one(con, "SELECT hit_rate_at(?, metric := ?)", c, metric)
            if metric == "compute":
                assert got == pytest.approx(want[column], rel=1e-12, abs=1e-15), (c, metric)
            else:
                assert got == want[column], (c, metric)


def test_capacity_for(db, ex):
    tokens = sorted(((d, k) for d, k in zip(ex.usable, ex.tokens)), key=lambda x: x[0])
    total = sum(k for _, k in tokens)
    for target in (0.1, 0.3, 0.5, 0.6):
        cum = 0
        want = None
        for d, k in tokens:
            cum += k
            if cum >= target * total * (1 - 1e-12):
                want = d * BPT if math.isfinite(d) else None
                break
        got = one(db, "SELECT capacity_for(?)", target)
        assert got == want, target
        assert one(db, "SELECT hit_rate_at(?)", got) >= target
        assert one(db, "SELECT hit_rate_at(?)", got - 1) < target
    ceiling = one(db, "SELECT ceiling_prefix_token_hit_rate FROM trace_meta")
    assert one(db, "SELECT capacity_for(?)", ceiling) == one(db, "SELECT ceiling_capacity_bytes FROM trace_meta")
    assert one(db, "SELECT capacity_for(?)", ceiling + 1e-6) is None


def test_capacity_for_reproduces_the_knees(db):
    for metric, macro_metric in (("prefix_token_hit_rate", "prefix_token"), ("request_hit_rate", "request"),
                                 ("compute_saved_rate", "compute")):
        for f in KNEE_FRACTIONS:
            target, cap = rows(db, "SELECT target_rate, capacity_bytes FROM knees WHERE metric = ? AND fraction = ?",
                               metric, f)[0]
            assert one(db, "SELECT capacity_for(?, metric := ?)", target, macro_metric) == cap, (metric, f)


def test_reuse_time_pct_matches_kvtrace_stats(db, trace, ex):
    lengths = trace_stats(trace).lengths.filter(pl.col("quantity") == "reuse_time_s").row(0, named=True)
    warm = [x for x in ex.reuse_time if math.isfinite(x)]
    for p in (50, 90, 99, 99.9):
        got = one(db, "SELECT reuse_time_pct(?)", p)
        assert got == pytest.approx(lengths[f"p{p:g}"], rel=1e-12, abs=1e-12)
        assert got == pytest.approx(percentile(warm, p), rel=1e-12, abs=1e-12)


def test_size_macros():
    con = duckdb.connect()
    con.execute(Path(sql_dir() / "macros.sql").read_text().split("-- Hit rate of an LRU")[0])
    assert con.execute("SELECT kv_bytes(100000, 327680), gib(64), gib(1.5), tib(1), tib(0.5)").fetchall()[0] == (
        32_768_000_000, 64 * GiB, 3 * GiB // 2, TiB, TiB // 2)
    assert con.execute("SELECT kv_bytes(CAST('inf' AS DOUBLE), 2)").fetchall()[0][0] == math.inf


# --------------------------------------------------------------------------- views


def test_views(db, trace, ex):
    assert one(db, "SELECT count(*) FROM access_detail") == len(ex.block)
    got = rows(db, "SELECT type, tenant, session_id, turn, block_bytes FROM access_detail ORDER BY t")
    assert got == [(ex.req_type[r], ex.req_tenant[r], ex.req_session[r], ex.req_turn[r], ex.size[b] * BPT)
                   for r, b in zip(ex.request, ex.block)]
    # session_requests: the pause since the session's previous request
    last: dict = {}
    want = []
    for r in range(len(ex.req_ts)):
        s = ex.req_session[r]
        want.append((s, r, None if s not in last else ex.req_ts[r] - ex.req_ts[last[s]]))
        last[s] = r
    got = rows(db, "SELECT session_id, request, gap_s FROM session_requests ORDER BY request")
    assert [g[:2] for g in got] == [w[:2] for w in want]
    assert [g[2] for g in got] == [w[2] if w[2] is None else pytest.approx(w[2], abs=1e-9) for w in want]
    # prefixes: kvtrace value's per-prefix table
    per_prefix = value_report(trace).per_prefix
    got = frame(db, "SELECT * EXCLUDE (tenant) FROM prefixes")
    assert got.columns == per_prefix.columns
    for g, w in zip(got.iter_rows(), per_prefix.iter_rows()):
        assert g[:6] == w[:6]
        assert g[6:] == pytest.approx(w[6:], rel=1e-9, abs=1e-12)
    # curve_pct: the curve in GiB and percent
    pct = rows(db, "SELECT capacity_gib, prefix_token_hit_rate_pct FROM curve_pct")
    curve = rows(db, "SELECT capacity_bytes, prefix_token_hit_rate FROM curve ORDER BY capacity_bytes")
    assert pct == [(round(c / GiB, 3), round(100 * r, 2)) for c, r in curve]


# --------------------------------------------------------------------------- files


def test_export_replaces_atomically_and_a_failure_keeps_the_old_database(trace, tmp_path, monkeypatch):
    dest = tmp_path / "a.duckdb"
    first = export_database(trace, dest)
    assert is_database(dest) and first.bytes == dest.stat().st_size
    before = dest.read_bytes()

    import kvtrace.results.export as export_mod

    def broken(*args, **kwargs):
        raise KvtraceError("boom")

    monkeypatch.setattr(export_mod, "value_report", broken)  # fails after tables are half built
    with pytest.raises(KvtraceError, match="boom"):
        export_database(trace, dest, model="Llama-3.1-8B")
    assert dest.read_bytes() == before
    assert temp_leftovers(tmp_path) == []
    with pytest.raises(KvtraceError, match="boom"):
        export_database(trace, tmp_path / "new.duckdb")
    assert not (tmp_path / "new.duckdb").exists() and temp_leftovers(tmp_path) == []
    monkeypatch.undo()

    export_database(trace, dest, model="Llama-3.1-8B")  # re-running replaces it
    con = duckdb.connect(str(dest), read_only=True)
    assert one(con, "SELECT model FROM trace_meta") == "Llama-3.1-8B"
    con.close()
    assert temp_leftovers(tmp_path) == []


def test_failure_inside_duckdb_leaves_nothing(trace, tmp_path, monkeypatch):
    import kvtrace.results.export as export_mod

    real = export_mod.install_sql

    def half(con):
        real(con)
        con.execute("SELECT no_such_column FROM accesses")

    monkeypatch.setattr(export_mod, "install_sql", half)
    with pytest.raises(duckdb.Error):
        export_database(trace, tmp_path / "x.duckdb")
    assert list(tmp_path.iterdir()) == []


def test_export_refuses_to_replace_a_file_that_is_not_a_database(trace, tmp_path):
    victim = tmp_path / "trace.jsonl"
    victim.write_text('{"timestamp": 0}\n')
    with pytest.raises(KvtraceError, match="not a DuckDB database"):
        export_database(trace, victim)
    assert victim.read_text() == '{"timestamp": 0}\n'
    with pytest.raises(KvtraceError, match="directory does not exist"):
        export_database(trace, tmp_path / "no" / "x.duckdb")


def test_export_parquet_creates_its_directory(tmp_path):
    from typer.testing import CliRunner

    from kvtrace.cli import app

    out = tmp_path / "tables"
    chat = Path(__file__).resolve().parent.parent / "sample_traces" / "chat.jsonl"
    res = CliRunner().invoke(app, ["export", str(chat), "--db", str(tmp_path / "c.duckdb"), "--parquet", str(out),
                                   "--points", "10"])
    assert res.exit_code == 0, res.stderr
    assert (out / "requests.parquet").is_file() and (out / "knees.parquet").is_file()
    res = CliRunner().invoke(app, ["export", str(chat), "--db", str(tmp_path / "d.duckdb"), "--parquet",
                                   str(tmp_path / "no" / "tables")])
    assert res.exit_code == 2 and "the output's directory does not exist" in res.stderr
    assert not (tmp_path / "no").exists() and not (tmp_path / "d.duckdb").exists()


def test_parquet_tables_work_with_the_sql_files(trace, tmp_path, db):
    out = tmp_path / "tables"
    out.mkdir()
    result = export_database(trace, tmp_path / "p.duckdb", parquet_dir=out)
    assert sorted(p.name for p in result.parquet) == sorted(f"{n}.parquet" for n in TABLES)
    con = duckdb.connect()
    con.execute(parquet_views_sql(out))
    install_sql(con)
    for c in (16 * GiB, 64 * GiB, TiB):
        assert one(con, "SELECT hit_rate_at(?)", c) == one(db, "SELECT hit_rate_at(?)", c)
        assert one(con, "SELECT hit_rate_at(?, metric := 'compute')", c) == \
            one(db, "SELECT hit_rate_at(?, metric := 'compute')", c)
    for f in example_files():
        sql = f.read_text()
        assert con.execute(sql).fetchall() == db.execute(sql).fetchall(), f.name


def test_whatif_table_is_loaded(trace, tmp_path):
    table = pl.DataFrame({"config": ["dram 256GiB"], "dram_prefix_token_hit_rate": [0.5], "flash_dwpd": [None]},
                         schema_overrides={"flash_dwpd": pl.Float64})
    write_table(table, tmp_path / "w.json", metadata={"model": "x"})
    con = duckdb.connect()
    counts = build_database(con, trace, whatif=tmp_path / "w.json")
    assert counts["whatif"] == 1
    assert rows(con, "FROM whatif") == [("dram 256GiB", 0.5, None)]
    with pytest.raises(KvtraceError, match="no such file"):
        build_database(duckdb.connect(), trace, whatif=tmp_path / "missing.parquet")


def test_sql_files_are_found_and_shipped():
    d = sql_dir()
    assert (d / "views.sql").is_file() and (d / "macros.sql").is_file()
    assert 6 <= len(example_files()) <= 10
    root = Path(__file__).resolve().parents[1]
    assert d == root / "analytics" / "kvtrace" / "sql"
    assert '"kvtrace.sql" = ["*.sql", "examples/*.sql"]' in (root / "pyproject.toml").read_text()


# --------------------------------------------------------------------------- real trace


@pytest.mark.slow
def test_real_trace_exports_fast_and_opens_fresh(tmp_path):
    if not MOONCAKE.exists():
        pytest.skip(f"shared trace not available: {MOONCAKE}")
    trace = load_trace(MOONCAKE)
    dest = tmp_path / "mooncake.duckdb"
    t0 = time.perf_counter()
    result = export_database(trace, dest)
    elapsed = time.perf_counter() - t0
    assert elapsed < 20, elapsed
    con = duckdb.connect(str(dest))  # a fresh connection, read-write: a complete database
    assert con.execute("SELECT count(*) FROM accesses").fetchall()[0][0] == 288_500
    assert con.execute("SELECT count(*) FROM requests").fetchall()[0][0] == 12_031
    assert con.execute("SELECT count(*) FROM blocks").fetchall()[0][0] == 182_790
    cr = compute_curve(trace, capacities=[64 * GiB, TiB])
    for c, want in zip((64 * GiB, TiB), cr.curve["prefix_token_hit_rate"]):
        assert con.execute("SELECT hit_rate_at(?)", [c]).fetchall()[0][0] == want
    con.close()
    assert result.bytes == os.path.getsize(dest)
    assert temp_leftovers(tmp_path) == []
