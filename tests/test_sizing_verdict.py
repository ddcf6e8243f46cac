"""Honest sizing verdicts (issue 18): ``kvtrace size`` never presents a configuration that
fails its own checks as the recommendation.

The traces are the cyclic one of ``test_sizing`` (200 requests one second apart cycling
over 4 one-block prompts of 1 GiB each) with its tiny config, so every figure below is
derived by hand: a 1 GiB restore takes 1 GiB / 50 GB/s = 21.47 ms from the local SSD
(+ 0.1 ms latency + 0.5 ms overhead = 22.07 ms), 1 GiB / 25 GB/s = 42.95 ms from DRAM
(+ 0.2 ms = 43.15 ms); with 1 GiB of DRAM every request evicts one block to flash: 199
GiB in 199 s, 86,400 GiB/day, 10,800 drive writes/day on 8 GiB.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from kvtrace.cli import app
from kvtrace.ingest import load_trace
from kvtrace.analyses.sizing import recommend, whatif_args

from test_sizing import GiB, mooncake, row, tiny_config


@pytest.fixture(scope="module")
def cyclic(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("verdict") / "cyclic.jsonl"
    p.write_text("".join(mooncake(i, [i % 4]) for i in range(200)))
    return p


def nothing_feasible():
    """P99 <= 10 ms: no tier restores 1 GiB that fast; flash rated 10,000 DWPD."""
    return tiny_config(slo_p99_ms=10.0, tier_changes={"local_ssd": {"endurance_dwpd": 10000.0},
                                                      "shared_flash": {"endurance_dwpd": 10000.0}})


def test_closest_is_by_normalised_shortfall_not_by_checks_passed(cyclic):
    """expand DRAM passes two checks (bandwidth, endurance) and misses P99 by 331 %; the
    local SSD passes one (bandwidth) and misses P99 by 121 % and endurance by 8 %. The
    old ranking (checks passed first) put expand DRAM on top; the closest is the SSD."""
    res = recommend(load_trace(cyclic), nothing_feasible())
    slo = res.candidates.filter(pl.col("lens") == "same-slo").sort("rank")
    assert not slo["feasible"].any()
    local, dram = row(res, "same-slo", "add-local-ssd"), row(res, "same-slo", "expand-dram")
    assert local["service_time_p99_ms"] == pytest.approx(2**30 / 50e9 * 1e3 + 0.6)
    assert local["ssd_dwpd"] == pytest.approx(10800)
    assert local["shortfall"] == pytest.approx(max(local["service_time_p99_ms"] / 10 - 1, 10800 / 10000 - 1))
    assert dram["service_time_p99_ms"] == pytest.approx(2**30 / 25e9 * 1e3 + 0.2)
    assert dram["shortfall"] == pytest.approx(dram["service_time_p99_ms"] / 10 - 1)
    assert local["rank"] < dram["rank"] and slo["candidate"][0] == "add-local-ssd"
    assert local["shortfalls"] == "P99 +120.7 %, endurance (DWPD) +8.0 %"


def test_no_feasible_candidate_is_not_a_recommendation(cyclic):
    rec = recommend(load_trace(cyclic), nothing_feasible()).recommendation
    assert not rec.feasible
    assert rec.headline.startswith("no configuration meets the SLO P99 <= 10 ms: closest is add local SSD "
                                   "(DRAM 1 GiB + local SSD 8 GiB, admission all), short by P99 +120.7 %")
    assert set(rec.shortfalls) == {"slo_p99", "endurance"}
    # what would be needed, searched on the curves: even all 4 GiB in DRAM restore in 43.15 ms
    assert rec.needed[0].startswith("No cache size meets the SLO: with every distinct block in DRAM (4 GiB) the "
                                    "estimate is still mean")
    assert "P99 43.1 ms" in rec.needed[0]
    assert any("rated for 10,800.00 drive writes/day (configured 10000)" in n for n in rec.needed)


def test_cli_says_it_in_the_first_line_and_json_carries_it(cyclic, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(nothing_feasible().to_toml())
    out = tmp_path / "s.json"
    res = CliRunner().invoke(app, ["size", str(cyclic), "--config", str(cfg), "--json", str(out)],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.stderr
    assert res.stdout.splitlines()[0].startswith("no configuration meets the SLO P99 <= 10 ms: closest is add local "
                                                 "SSD")
    assert "recommendation:" not in res.stdout
    d = json.loads(out.read_text())
    assert d["feasible"] is False and d["recommendation"]["feasible"] is False
    assert d["recommendation"]["shortfalls"]["slo_p99"] == pytest.approx(2**30 / 50e9 * 1e3 / 10 + 0.06 - 1)
    assert d["recommendation"]["needed"]


def test_only_endurance_separates_two_candidates(cyclic):
    """Both flash tiers meet the SLO and the bandwidth; the local SSD is cheaper and nets
    more, but writes 10,800 DWPD against a 1,000 rating: shared flash is recommended."""
    cfg = tiny_config(policies=("all",), tier_changes={"dram": {"max_bytes": GiB},
                                                       "local_ssd": {"endurance_dwpd": 1000.0}})
    res = recommend(load_trace(cyclic), cfg)
    local, shared = row(res, "same-slo", "add-local-ssd"), row(res, "same-slo", "add-shared-flash")
    assert local["meets_slo"] and local["bandwidth_headroom"] >= 1 and not local["feasible"]
    assert local["shortfalls"] == "endurance (DWPD) +980.0 %"
    assert local["net_usd_per_month"] > shared["net_usd_per_month"] and shared["feasible"]
    rec = res.recommendation
    assert rec.feasible and rec.candidate == "add-shared-flash"
    assert rec.headline == f"recommendation: add shared flash ({shared['config']}, admission all)"
    assert rec.shortfalls == {} and rec.needed == []
    # the replay holds the recommended sizes, and its command writes them with their units, exactly
    assert (rec.replay.dram_bytes, rec.replay.local_ssd_bytes, rec.replay.flash_bytes) == (GiB, 0, 3 * GiB)
    assert whatif_args(rec.replay)[1:5] == ["--dram", "1GiB", "--flash", "3GiB"]


def test_a_feasible_recommendation_comes_first_in_the_cli(cyclic, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(tiny_config().to_toml())
    res = CliRunner().invoke(app, ["size", str(cyclic), "--config", str(cfg)], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.stderr
    rec = recommend(load_trace(cyclic), tiny_config()).recommendation
    assert rec.feasible and rec.headline.startswith("recommendation: ")
    assert res.stdout.splitlines()[0] == rec.headline
