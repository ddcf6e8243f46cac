"""One name and one unit per quantity: every column each command writes is listed in
:mod:`kvtrace.names` under its table, every listed name follows the documented scheme,
the README's "Metric names" section is that list, and tables of earlier releases read
back under the current names."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import polars as pl
import pytest
from typer.testing import CliRunner

from kvtrace import names
from kvtrace.cli import app

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "sample_traces" / "chat.jsonl"
MIXED = ROOT / "sample_traces" / "mixed.parquet"
TIERS = ROOT / "sample_traces" / "tiers.example.toml"
SCENARIOS = ROOT / "sample_traces" / "scenario.example.toml"
RUNNER = CliRunner()


def run(*args) -> str:
    res = RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})
    assert res.exit_code == 0, (res.exit_code, res.stdout, res.stderr, res.exception)
    return res.stdout


def listed(table: str) -> set[str]:
    return set(names.TABLES[table][1])


def assert_listed(columns, table: str) -> None:
    missing = sorted(set(columns) - listed(table))
    assert not missing, (table, missing)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("names")
    run("curve", MIXED, "--points", 20, "--out", d / "curve.parquet", "--json", d / "curve.json",
        "--distances-out", d / "dist.parquet")
    run("curve", MIXED, "--points", 20, "--by", "type", "--out", d / "by.parquet", "--json", d / "by.json")
    run("curve", MIXED, "--points", 20, "--sample-rate", "0.2", "--out", d / "sampled.parquet")
    run("value", CHAT, "--out", d / "blocks.parquet", "--prefixes-out", d / "prefixes.parquet",
        "--accesses-out", d / "accesses.parquet", "--json", d / "value.json")
    run("whatif", CHAT, "--dram", "64GiB", "--flash", "1TiB", "--local-ssd", "256GiB", "--grid",
        "--out", d / "whatif.parquet", "--json", d / "whatif.json")
    run("size", CHAT, "--config", TIERS, "--out", d / "size.parquet", "--json", d / "size.json")
    run("load", CHAT, "--dram", "64GiB", "--flash", "1TiB", "--local-ssd", "256GiB", "--load", "1x,64x",
        "--out", d / "load.parquet", "--resources-out", d / "resources.parquet", "--json", d / "load.json")
    run("scenario", MIXED, "--config", SCENARIOS, "--out", d / "scenario.parquet", "--timeline-out",
        d / "timeline.parquet", "--json", d / "scenario.json")
    return d


def test_every_column_each_command_writes_is_listed_under_its_table(outputs):
    d = outputs
    assert_listed(pl.read_parquet_schema(d / "curve.parquet").names(), "curve")
    assert_listed(pl.read_parquet_schema(d / "by.parquet").names(), "curve")
    assert_listed(pl.read_parquet_schema(d / "sampled.parquet").names(), "curve")
    for doc in ("curve.json", "by.json"):
        data = json.loads((d / doc).read_text())
        assert data["rows"]
        for row in data["rows"]:
            assert_listed(row, "curve")
        for knee in data["knees"]:
            assert_listed(knee, "knees")
        assert_listed(set(data["ceiling"]), "curve")
    assert_listed(pl.read_parquet_schema(d / "dist.parquet").names(), "distances")
    assert_listed(pl.read_parquet_schema(d / "blocks.parquet").names(), "value_blocks")
    assert_listed(pl.read_parquet_schema(d / "prefixes.parquet").names(), "value_prefixes")
    assert_listed(pl.read_parquet_schema(d / "accesses.parquet").names(), "value_accesses")
    assert_listed(json.loads((d / "value.json").read_text())["summary"], "value_summary")
    assert_listed(pl.read_parquet_schema(d / "whatif.parquet").names(), "whatif")
    for row in json.loads((d / "whatif.json").read_text())["configs"]:
        assert_listed(set(row) - {"residency"}, "whatif")
        for r in row.get("residency", []):
            assert_listed(r, "residency")
    assert_listed(pl.read_parquet_schema(d / "size.parquet").names(), "size")
    size = json.loads((d / "size.json").read_text())
    for row in size["candidates"]:
        assert_listed(row, "size")
    assert_listed(size["recommendation"]["figures"], "size")
    assert_listed(pl.read_parquet_schema(d / "load.parquet").names(), "load")
    assert_listed(pl.read_parquet_schema(d / "resources.parquet").names(), "load_resources")
    doc = json.loads((d / "load.json").read_text())
    for row in doc["levels"]:
        assert_listed(row, "load")
    for row in doc["resources"]:
        assert_listed(row, "load_resources")
    assert_listed(pl.read_parquet_schema(d / "scenario.parquet").names(), "scenario")
    assert_listed(pl.read_parquet_schema(d / "timeline.parquet").names(), "scenario_timeline")
    doc = json.loads((d / "scenario.json").read_text())
    for key, table in (("scenarios", "scenario"), ("timeline", "scenario_timeline"), ("events", "scenario_events")):
        assert doc[key]
        for row in doc[key]:
            assert_listed(row, table)
    for row in size["search"]:
        assert_listed(row, "size")
    for row in size["knees"]:
        assert_listed(row, "knees")


#: The ending each unit's names take (DESIGN-fixed names of the canonical tables aside).
_ENDINGS = {
    "bytes": ("bytes",), "tokens": ("tokens",), "blocks": ("blocks",), "ms": ("_ms",), "USD": ("_usd",),
    "USD/h": ("_usd_per_hour", "usd_saved_per_hour"), "USD/month": ("_usd_per_month",),
    "USD/byte": ("_usd_per_byte",), "bytes/s": ("_bytes_per_s",), "bytes/day": ("_bytes_per_day",),
    "GPU-s": ("_gpu_seconds",), "GPU-s/h": ("gpu_seconds_saved_per_hour",), "GPU-h/month": ("_per_month",),
    "DWPD": ("dwpd",), "share": ("_rate", "_share", "_rate_se", "fraction", "shortfall", "_attainment"),
    "ratio": ("_ratio", "_headroom", "_realisation", "_factor"), "s": ("_s",), "price": ("dollars_per_hour", "_per_byte",
                                                                            "_per_byte_second", "_per_tb",
                                                                            "_per_tb_month"),
    "bytes/token": ("_per_token",), "requests/s": ("_rps",), "1/s": ("_per_s",),
}
_STARTS = {"utilisation": "util"}  # kvtrace load: util_<resource>, as queueing tools spell it
_CANONICAL = {"timestamp"}  # DESIGN §1: the canonical tables' arrival column, seconds


def test_every_listed_name_follows_the_scheme():
    seen: dict[str, tuple[str, str]] = {}
    for table, (_, columns) in names.TABLES.items():
        for name, (unit, meaning) in columns.items():
            assert unit in names.UNITS, (table, name, unit)
            assert name == name.lower() and " " not in name, name
            if unit in _STARTS:
                assert name.startswith(_STARTS[unit]), (table, name, unit)
            if name not in _CANONICAL and unit in _ENDINGS:  # a mapping of quantiles: of the named quantity
                assert name.removesuffix("_quantiles").endswith(_ENDINGS[unit]), (table, name, unit)
            if name in seen:  # one unit for a name, wherever it is listed
                assert seen[name][0] == unit, (name, seen[name], unit)
            seen[name] = (unit, meaning)
            assert name not in names.ALIASES, name
    for old, alias in {**names.ALIASES, **names.SIZE_ALIASES}.items():
        assert alias.name in seen, (old, alias)


def test_the_readme_lists_every_column_with_its_unit():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Metric names"):]
    section = section[:section.index("\n## ", 5)]
    assert names.markdown() in section


def test_cli_tables_print_each_metric_under_its_label():
    out = run("curve", MIXED, "--capacity", "64GiB")
    for col in ("request_hit_rate", "prefix_token_hit_rate", "token_hit_rate", "compute_saved_rate",
                "gpu_seconds_saved_per_hour", "usd_saved_per_hour", "read_mean_bytes_per_s"):
        assert names.label(col) in out, col
    from kvtrace.app import choices
    from kvtrace.results import charts
    assert set(charts.CURVE_METRICS.values()) <= set(names.LABELS.values())
    assert set(choices.CURVE_METRICS) <= set(names.LABELS.values())


#: The what-if table's names of the release before the scheme.
_WHATIF_BEFORE = {**names._whatif_aliases(),
                  **{k: names.ALIASES[k] for k in ("flash_request_share", "gpu_seconds_saved_per_hour_flash",
                                                   "value_captured_dollars", "value_bound_dollars",
                                                   "dollars_saved_per_hour", "measured_seconds")}}


def _old(table: pl.DataFrame) -> pl.DataFrame:
    """``table`` as the earlier release wrote it (its aliases inverted)."""
    back = {a.name: (old, a.scale) for old, a in _WHATIF_BEFORE.items()}
    return table.select([(pl.col(c) / back[c][1]).alias(back[c][0]) if c in back else pl.col(c)
                         for c in table.columns])


def test_a_whatif_table_of_an_earlier_release_loads_under_the_current_names(outputs, tmp_path):
    new = pl.read_parquet(outputs / "whatif.parquet")
    old = _old(new)
    assert "h_dram_token" in old.columns and "service_time_p99_s" in old.columns
    assert old["service_time_p99_s"][0] == pytest.approx(new["service_time_p99_ms"][0] / 1e3)
    old.write_parquet(tmp_path / "old.parquet")
    run("export", CHAT, "--db", tmp_path / "w.duckdb", "--whatif", tmp_path / "old.parquet")
    con = duckdb.connect(str(tmp_path / "w.duckdb"), read_only=True)
    got = con.sql("SELECT * FROM whatif").pl()
    assert sorted(got.columns) == sorted(new.columns)
    for c in new.columns:
        if new[c].dtype.is_float():
            assert got[c].is_null().to_list() == new[c].is_null().to_list(), c
            assert got[c].drop_nulls().to_list() == pytest.approx(new[c].drop_nulls().to_list(), rel=1e-12), c
        else:
            assert got[c].to_list() == new[c].to_list(), c


def test_a_name_reused_for_another_quantity_is_renamed_only_in_its_own_release():
    # sizing's flash level was `flash_read_mean_bytes_per_s` beside `h_flash`; today the
    # same name is the shared pool's own reads in a what-if table
    old_size = pl.DataFrame({"h_dram": [0.5], "h_flash": [0.25], "flash_read_mean_bytes_per_s": [7.0],
                             "mean_ms": [3.0]})
    got = names.canonical_table(old_size)
    assert got.columns == ["dram_prefix_token_hit_rate", "ssd_prefix_token_hit_rate", "ssd_read_mean_bytes_per_s",
                           "service_time_mean_ms"]
    today = pl.DataFrame({"flash_prefix_token_hit_rate": [0.25], "flash_read_mean_bytes_per_s": [7.0]})
    assert names.canonical_table(today).equals(today)


def test_sql_macros_take_the_column_names_and_the_short_words(tmp_path):
    run("export", MIXED, "--db", tmp_path / "m.duckdb")
    con = duckdb.connect(str(tmp_path / "m.duckdb"), read_only=True)
    for word, col in names.SQL_METRICS.items():
        if col == "request_half_prefix_hit_rate" and "request_half_prefix_hit_rate" not in \
                con.sql("SELECT * FROM curve LIMIT 0").columns:
            continue
        a, b, curve = con.sql(f"SELECT hit_rate_at(capacity_bytes, metric := '{word}'), "
                              f"hit_rate_at(capacity_bytes, metric := '{col}'), {col} FROM curve "
                              "WHERE capacity_bytes = (SELECT max(capacity_bytes) FROM curve)").fetchall()[0]
        assert a == b == pytest.approx(curve, rel=1e-12), word
        assert names.canonical_metric(word) == col
