"""Tier sizing (``kvtrace.analyses.sizing``, ``kvtrace size``).

Lens tests run on a small cyclic trace whose answer is worked out by hand below:
200 one-block requests cycling over 4 blocks A B C D, one second apart, 512-token
blocks of 2 MiB per token (one block = 1 GiB). An LRU of fewer than 4 blocks never
hits; from 4 blocks on every access after the first round hits. So a configuration
serves all 196 reusable requests from cache iff its DRAM (+ flash) holds >= 4 GiB.
Prices are chosen to make monthly costs round: DRAM $10 per GiB-month, local SSD and
shared flash $1 per GiB-month, the shared pool $100/month for its enclosure.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from cli_helpers import one_line_error
from kvtrace.cli import app
from kvtrace.errors import KvtraceError
from kvtrace.ingest import load_trace
from kvtrace.model import resolve_gpu, resolve_model
from kvtrace.analyses.sizing import (CANDIDATES, LENSES, SizingConfig, TierSpec, default_config, load_config, recommend,
                                    whatif_args, whatif_command)
from kvtrace.results.sizing_report import report_html, report_markdown

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
CHAT = ROOT / "sample_traces" / "chat.jsonl"
EXAMPLE = ROOT / "sample_traces" / "tiers.example.toml"
GiB = 2**30
MONTH_GIB = 36 * 1024  # $/TiB that amortises to $1 per GiB-month over 36 months
RUNNER = CliRunner()


def run(*args):
    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": "250"})


def mooncake(i: int, hashes: list[int], n_in: int | None = None) -> str:
    return json.dumps({"timestamp": 1000 * i, "input_length": n_in or 512 * len(hashes), "output_length": 1,
                       "hash_ids": hashes}) + "\n"


@pytest.fixture(scope="module")
def cyclic(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("sizing") / "cyclic.jsonl"
    p.write_text("".join(mooncake(i, [i % 4]) for i in range(200)))
    return p


def tiny_config(**changes) -> SizingConfig:
    tiers = {
        "dram": TierSpec(step_bytes=GiB, max_bytes=8 * GiB, dollars_per_tib=10 * MONTH_GIB, latency_ms=0.2,
                         restore_gbps=25.0, bandwidth_gbps=1000.0),
        "local_ssd": TierSpec(step_bytes=GiB, max_bytes=8 * GiB, dollars_per_tib=MONTH_GIB, latency_ms=0.1,
                              restore_gbps=50.0, bandwidth_gbps=1000.0, overhead_ms=0.5, endurance_dwpd=1e9),
        "shared_flash": TierSpec(step_bytes=GiB, max_bytes=8 * GiB, dollars_per_tib=MONTH_GIB,
                                 dollars_per_unit=3600.0, latency_ms=1.0, restore_gbps=50.0, bandwidth_gbps=1000.0,
                                 overhead_ms=2.0, endurance_dwpd=1e9),
    }
    for name, upd in changes.pop("tier_changes", {}).items():
        tiers[name] = dataclasses.replace(tiers[name], **upd)
    base = SizingConfig(current_dram_bytes=GiB, realisation=0.6, slo_p99_ms=100.0, kv_bytes_per_token=2**21,
                        policies=("all", "second-hit"), tiers=tiers, same_capacity_bytes=4 * GiB,
                        budget_monthly_usd=35.0)
    return dataclasses.replace(base, **changes)


def row(result, lens: str, cand: str) -> dict:
    rows = result.candidates.filter((pl.col("lens") == lens) & (pl.col("candidate") == cand)).to_dicts()
    assert len(rows) == 1
    return rows[0]


def recompute_ms_of_one_block() -> float:
    """Prefill of 512 tokens at positions 0..511 on an H100 at 50 % MFU, ms."""
    return resolve_model("Llama-3.1-70B").prefill_flops(512) / resolve_gpu("H100").effective_flops * 1e3


# ----------------------------------------------------------------------------- config


def test_example_file_is_the_default_config():
    assert load_config(EXAMPLE) == default_config()


@pytest.mark.parametrize("cfg", [default_config(), tiny_config(),
                                 tiny_config(warmup="10%", load_scale=2.5, nodes=3, routing="prefix", dtype="fp8",
                                             slo_mean_ms=12.5, gpu_peak_tflops=500.0, eviction="flat")])
def test_config_round_trips_through_toml(cfg, tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(cfg.to_toml())
    assert load_config(p) == cfg
    assert SizingConfig.from_dict(tomllib.loads(cfg.to_toml())) == cfg
    assert SizingConfig.from_dict(cfg.to_dict()) == cfg


def example_dict() -> dict:
    return tomllib.loads(EXAMPLE.read_text())


@pytest.mark.parametrize("edit, key, expected", [
    (lambda d: d["deployment"].pop("dram"), "deployment.dram", "missing"),
    (lambda d: d["deployment"].update(dram=64), "deployment.dram", "give the unit"),
    (lambda d: d["tiers"]["dram"].update(latency_ms="20ms"), "tiers.dram.latency_ms", "unit is in the key"),
    (lambda d: d["tiers"]["dram"].update(step="64 apples"), "tiers.dram.step", "unknown size unit"),
    (lambda d: d["tiers"]["dram"].update(max="32GiB"), "tiers.dram.max", "at least the step"),
    (lambda d: d["tiers"]["dram"].update(dolars_per_tib=1.0), "tiers.dram.dolars_per_tib", "unknown key"),
    (lambda d: d["tiers"]["shared_flash"].pop("endurance_dwpd"), "tiers.shared_flash.endurance_dwpd", "missing"),
    (lambda d: d["tiers"].update(tape={}), "tiers.tape", "unknown tier"),
    (lambda d: d.pop("slo"), "slo", "at least one target"),
    (lambda d: d["economics"].update(realisation=1.5), "economics.realisation", "[0, 1]"),
    (lambda d: d["search"].update(policies=["sometimes"]), "search.policies", "unknown admission policy"),
    (lambda d: d.update(extra={}), "extra", "unknown section"),
])
def test_config_errors_name_the_file_key_and_expectation(edit, key, expected, tmp_path):
    d = example_dict()
    edit(d)
    with pytest.raises(KvtraceError) as e:
        SizingConfig.from_dict(d, source="tiers.toml")
    msg = e.value.one_line()
    assert msg.startswith("tiers.toml: ") and f"'{key}'" in msg and expected in msg, msg
    assert "\n" not in msg


def test_bad_toml_and_bad_config_are_one_line_cli_errors(cyclic, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[slo]\np99_ms = \n")
    out = tmp_path / "c.csv"
    one_line_error(run("size", cyclic, "--config", bad, "--out", out), 1, str(bad), "invalid TOML", "line 2")
    wrong = tmp_path / "wrong.toml"
    wrong.write_text(EXAMPLE.read_text().replace("restore_gbps = 12.0", 'restore_gbps = "12GB/s"'))
    one_line_error(run("size", cyclic, "--config", wrong), 1, str(wrong), "tiers.local_ssd.restore_gbps",
                   "positive number")
    one_line_error(run("size", cyclic, "--config", tmp_path / "missing.toml"), 1, "missing.toml")
    one_line_error(run("size", cyclic, "--config", EXAMPLE, "--report", tmp_path / "r.pdf"), 2, "report")
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))


# ----------------------------------------------------------------------------- lenses (worked by hand)


def test_same_slo_lens_by_hand(cyclic):
    res = recommend(load_trace(cyclic), tiny_config())
    R = recompute_ms_of_one_block()
    # today (1 GiB) and no tier at all: every reusable request recomputes -> P99 = R
    for cand in ("keep-dram", "recompute-only"):
        r = row(res, "same-slo", cand)
        assert r["service_time_p99_ms"] == pytest.approx(R) and not r["feasible"]
    # cheapest configurations holding 4 blocks: DRAM 4 GiB ($40); 1 GiB DRAM + 3 GiB
    # local ($10 + $3); 1 GiB DRAM + 3 GiB shared ($10 + $3 + $100); DRAM + flash needs
    # DRAM > 1 GiB and flash >= 1 GiB: 2 + 2 ($20 + $2 + $100) beats 3 + 1 ($131)
    expect = {"expand-dram": (4, 0, 0, 40.0), "add-local-ssd": (1, 3, 0, 13.0),
              "add-shared-flash": (1, 0, 3, 113.0), "dram+flash": (2, 0, 2, 122.0)}
    for cand, (d, loc, f, cost) in expect.items():
        r = row(res, "same-slo", cand)
        assert (r["dram_bytes"], r["local_ssd_bytes"], r["flash_bytes"]) == (d * GiB, loc * GiB, f * GiB), cand
        assert r["cost_usd_per_month"] == pytest.approx(cost), cand
        assert r["feasible"] and r["dram_prefix_token_hit_rate"] + r["ssd_prefix_token_hit_rate"] == pytest.approx(196 / 200), cand
    # the hits' restore time: latency + 1 GiB / bandwidth (+ O for a flash tier)
    assert row(res, "same-slo", "expand-dram")["service_time_p99_ms"] == pytest.approx(0.2 + GiB / 25e9 * 1e3)
    assert row(res, "same-slo", "add-local-ssd")["service_time_p99_ms"] == pytest.approx(0.1 + GiB / 50e9 * 1e3 + 0.5)
    # value: 196 avoided recomputes in 199 s, per hour x 730 h x $2.5/GPU-h; 60 % realised
    value = 196 * R / 1e3 * 3600 / 199 * 730 / 3600 * 2.5
    local = row(res, "same-slo", "add-local-ssd")
    assert local["value_usd_per_month"] == pytest.approx(value)
    assert local["net_usd_per_month"] == pytest.approx(0.6 * value - 3.0)
    assert local["break_even_realisation"] == pytest.approx(3.0 / value)
    # equal value, so the ranking is by cost; second-hit loses hits, so "all" is chosen
    order = res.candidates.filter(pl.col("lens") == "same-slo").sort("rank")["candidate"].to_list()
    assert order[:4] == ["add-local-ssd", "expand-dram", "add-shared-flash", "dram+flash"]
    assert local["policy"] == "all" and "second-hit" in local["reasons"]
    rec = res.recommendation
    assert (rec.candidate, rec.lens, rec.config, rec.policy) == ("add-local-ssd", "same-slo",
                                                                  "DRAM 1 GiB + local SSD 3 GiB", "all")


def test_same_capacity_and_same_budget_lenses_by_hand(cyclic):
    res = recommend(load_trace(cyclic), tiny_config())
    # same capacity, 4 GiB in total: DRAM 4; 1 + 3 local; 1 + 3 shared; DRAM + flash
    # splits 2 + 2 ($122) or 3 + 1 ($131): equal value, so the cheaper split
    cap = {c: row(res, "same-capacity", c) for c in CANDIDATES}
    assert cap["expand-dram"]["dram_bytes"] == 4 * GiB
    assert (cap["dram+flash"]["dram_bytes"], cap["dram+flash"]["flash_bytes"]) == (2 * GiB, 2 * GiB)
    assert all(cap[c]["total_bytes"] == 4 * GiB for c in ("expand-dram", "add-local-ssd", "add-shared-flash",
                                                           "dram+flash"))
    assert cap["add-local-ssd"]["rank"] == 1
    # same budget, $35/month: DRAM buys 3 GiB ($30; 4 GiB is $40) and misses the SLO;
    # 1 GiB DRAM + local SSD up to its 8 GiB max costs $18; shared flash needs $110+
    bud = {c: row(res, "same-budget", c) for c in CANDIDATES}
    assert bud["expand-dram"]["dram_bytes"] == 3 * GiB and not bud["expand-dram"]["meets_slo"]
    assert bud["add-local-ssd"]["local_ssd_bytes"] == 8 * GiB and bud["add-local-ssd"]["feasible"]
    assert bud["add-local-ssd"]["cost_usd_per_month"] == pytest.approx(18.0)
    assert bud["add-shared-flash"]["config"] is None and "not applicable" in bud["add-shared-flash"]["reasons"]
    assert bud["add-local-ssd"]["rank"] == 1
    assert res.info["budget_source"] == "config" and res.info["same_capacity_bytes"] == 4 * GiB


def test_endurance_rules_out_flash_by_hand(cyclic):
    # with 1 GiB of DRAM every access brings a block into DRAM: 200 inserts, 199
    # evictions written to flash in 199 s -> 86,400 GiB/day; at the 8 GiB max that is
    # 10,800 drive writes per day, over a 1,000 DWPD rating. DRAM + flash only avoids
    # writes once DRAM holds all 4 blocks (4 + 1 GiB: $141), so DRAM 4 GiB ($40) wins.
    cfg = tiny_config(tier_changes={"local_ssd": {"endurance_dwpd": 1000.0},
                                    "shared_flash": {"endurance_dwpd": 1000.0}})
    res = recommend(load_trace(cyclic), cfg)
    local = row(res, "same-slo", "add-local-ssd")
    # no local SSD size is feasible: the row shown is the closest by normalised shortfall, the
    # second-hit admission (P99 +47 %, 10,583 DWPD) rather than admit-all (SLO met, 10,800 DWPD)
    assert not local["feasible"] and local["local_ssd_bytes"] == 8 * GiB
    assert local["shortfall"] == pytest.approx(local["ssd_dwpd"] / 1000 - 1) and local["ssd_dwpd"] < 10800
    assert "1000 DWPD rating" in local["reasons"] and "all: P99 22.1 ms, 10,800.00 DWPD" in local["reasons"]
    both = row(res, "same-slo", "dram+flash")
    assert (both["dram_bytes"], both["flash_bytes"]) == (4 * GiB, GiB) and both["ssd_dwpd"] == pytest.approx(0)
    rec = res.recommendation
    assert (rec.candidate, rec.config) == ("expand-dram", "DRAM 4 GiB")
    assert any("Ruled out: add local SSD" in r and "DWPD" in r for r in rec.reasons)


def test_bandwidth_rules_out_a_tier(cyclic):
    # about one 1 GiB read per second from the local SSD: far above 0.01 GB/s
    cfg = tiny_config(tier_changes={"local_ssd": {"bandwidth_gbps": 0.01}})
    res = recommend(load_trace(cyclic), cfg)
    local = row(res, "same-slo", "add-local-ssd")
    assert not local["feasible"] and "peak 60 s window reads" in local["reasons"]
    assert local["bandwidth_headroom"] < 1
    assert res.recommendation.candidate == "expand-dram"


def test_mean_improves_but_p99_does_not(tmp_path):
    # 220 requests: the cycle over 4 blocks, and every 11th request one of 10 "far"
    # blocks, each read twice 110 requests apart. Between the two reads 14 distinct
    # blocks are touched, more than any configuration holds (DRAM and flash max 4 GiB
    # each: 8 blocks), so 10 / 220 = 4.5 % of requests always recompute: every P99 stays
    # at R (or R + O with a flash tier) while the cycle's hits lower the mean.
    lines = []
    for i in range(220):
        k, r = divmod(i, 11)
        lines.append(mooncake(i, [100 + (k % 10)] if r == 5 else [i % 4]))
    p = tmp_path / "far.jsonl"
    p.write_text("".join(lines))
    cfg = tiny_config(slo_p99_ms=None, slo_mean_ms=60.0, same_capacity_bytes=None, budget_monthly_usd=None,
                      tier_changes={t: {"max_bytes": 4 * GiB} for t in ("dram", "local_ssd", "shared_flash")})
    res = recommend(load_trace(p), cfg)
    keep = row(res, "same-slo", "keep-dram")
    R = recompute_ms_of_one_block()
    assert keep["service_time_p99_ms"] == pytest.approx(R)
    rec = res.recommendation
    assert rec.figures["service_time_p99_ms"] >= keep["service_time_p99_ms"] and rec.figures["service_time_mean_ms"] < keep["service_time_mean_ms"]
    assert any(r.startswith("Mean improves but P99 does not for the recommendation") for r in rec.risks)
    assert res.info["budget_source"].startswith("monthly cost of the same-SLO winner")


# ----------------------------------------------------------------------------- search vs replay


def test_search_estimates_equal_the_replay_with_one_block_size(tmp_path):
    # DESIGN §2 invariant: with one block size, admit-all exclusive promote-on-hit DRAM
    # over flash is one LRU of C_d + C_f, so the curve-based search and the replay agree
    rng = np.random.default_rng(3)
    lines, sessions = [], {}
    for i in range(400):
        s = int(rng.integers(0, 40))
        n = sessions.get(s, 0) + int(rng.integers(1, 3))
        sessions[s] = n
        lines.append(mooncake(i, [0] + [1000 * s + j for j in range(1, n + 1)]))
    p = tmp_path / "sessions.jsonl"
    p.write_text("".join(lines))
    cfg = tiny_config(slo_p99_ms=400.0, policies=("all",), budget_monthly_usd=60.0, same_capacity_bytes=16 * GiB,
                      tier_changes={t: {"max_bytes": 64 * GiB} for t in ("dram", "local_ssd", "shared_flash")})
    res = recommend(load_trace(p), cfg)
    rows = res.candidates.filter(pl.col("config").is_not_null())
    assert rows.height >= 12
    for r in rows.iter_rows(named=True):
        assert r["estimated_service_time_mean_ms"] == pytest.approx(r["service_time_mean_ms"], rel=1e-9), r["config"]
        assert r["estimated_service_time_p99_ms"] == pytest.approx(r["service_time_p99_ms"], rel=1e-9), r["config"]


# ----------------------------------------------------------------------------- outputs


def test_result_is_json_and_reports_are_self_contained(cyclic):
    calls = []
    res = recommend(load_trace(cyclic), tiny_config(), progress=lambda f, m: calls.append((f, m)))
    fr = [f for f, _ in calls]
    assert fr == sorted(fr) and fr[-1] == 1.0 and all(0 <= f <= 1 for f in fr)
    d = json.loads(json.dumps(res.to_dict(), allow_nan=False))
    assert d["recommendation"]["candidate"] == "add-local-ssd"
    assert {r["lens"] for r in d["candidates"]} == set(LENSES) and len(d["candidates"]) == 18
    assert set(res.candidates.columns) >= {"candidate", "lens", "dram_bytes", "flash_bytes",
                                           "dram_prefix_token_hit_rate", "ssd_prefix_token_hit_rate",
                                           "service_time_mean_ms", "service_time_p99_ms", "cost_usd_per_month",
                                           "net_usd_per_month",
                                           "break_even_realisation", "feasible", "reasons"}
    md = report_markdown(res, charts=False)
    assert "## Recommendation: add local SSD (DRAM 1 GiB + local SSD 3 GiB, admission all)" in md
    assert md.count("| rank | candidate |") == 3 and "kvtrace whatif" in md
    html = report_html(res)
    assert html.count("vegaEmbed('#chart-") == 2 and "<script src" not in html
    assert "add local SSD" in html and "</html>" in html


def test_cli_size_writes_outputs(cyclic, tmp_path):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(tiny_config().to_toml())
    out, rep, js, md = tmp_path / "c.parquet", tmp_path / "r.html", tmp_path / "r.json", tmp_path / "r.md"
    res = run("size", cyclic, "--config", cfg, "--out", out, "--report", rep, "--json", js)
    assert res.exit_code == 0, (res.stdout, res.stderr)
    text = " ".join(res.stdout.split())
    assert "recommendation: add local SSD (DRAM 1 GiB + local SSD 3 GiB, admission all)" in text
    assert pl.read_parquet(out).height == 18
    assert json.loads(js.read_text())["recommendation"]["config"] == "DRAM 1 GiB + local SSD 3 GiB"
    assert rep.read_text().startswith("<!DOCTYPE html>")
    assert run("size", cyclic, "--config", cfg, "--report", md).exit_code == 0
    assert md.read_text().startswith("# kvtrace size: cyclic.jsonl")
    assert not list(tmp_path.glob(".*.tmp"))


def whatif_json(*args) -> dict:
    """What ``kvtrace whatif ARGS --json -`` says of its one configuration."""
    res = run("whatif", *args, "--json", "-")
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout)["configs"][0]


def whatif_figures(replay, trace: Path) -> dict:
    """Run the replay a recommendation carries (its options as data) on ``trace``."""
    assert replay is not None and replay.trace
    args = whatif_args(replay)
    assert args[0] == replay.trace
    assert whatif_command(replay) == shlex.join(["kvtrace", "whatif", *args])
    return whatif_json(*whatif_args(dataclasses.replace(replay, trace=str(trace))))


def test_recommended_flash_configuration_replays_identically_with_whatif(cyclic):
    res = recommend(load_trace(cyclic), tiny_config(), trace_name=str(cyclic))
    assert res.recommendation.replay.trace == str(cyclic)
    w = whatif_figures(res.recommendation.replay, cyclic)
    f = res.recommendation.figures
    assert w["dram_prefix_token_hit_rate"] == f["dram_prefix_token_hit_rate"]
    assert w["local_prefix_token_hit_rate"] + w["flash_prefix_token_hit_rate"] == f["ssd_prefix_token_hit_rate"]
    assert w["service_time_p99_ms"] == f["service_time_p99_ms"]
    assert w["local_dwpd"] == f["ssd_dwpd"]


def test_sample_trace_size_is_fast_and_consistent_with_whatif(tmp_path):
    js = tmp_path / "size.json"
    t0 = time.perf_counter()
    res = run("size", CHAT, "--config", EXAMPLE, "--json", js)
    elapsed = time.perf_counter() - t0
    assert res.exit_code == 0, (res.stdout, res.stderr)
    assert elapsed < 60, elapsed
    d = json.loads(js.read_text())
    rec = d["recommendation"]
    assert rec["candidate"] in CANDIDATES and rec["figures"]["feasible"]
    # the JSON's command is the library's replay, written out
    lib = recommend(load_trace(CHAT), load_config(EXAMPLE), trace_name=str(CHAT)).recommendation
    assert rec["whatif_command"] == lib.whatif_command == whatif_command(lib.replay)
    w = whatif_figures(lib.replay, CHAT)
    f = rec["figures"]
    assert w["dram_prefix_token_hit_rate"] == pytest.approx(f["dram_prefix_token_hit_rate"], rel=1e-12)
    assert (w["flash_prefix_token_hit_rate"] or 0) + (w["local_prefix_token_hit_rate"] or 0) == pytest.approx(f["ssd_prefix_token_hit_rate"], rel=1e-12, abs=0)
    assert w["service_time_p99_ms"] == pytest.approx(f["service_time_p99_ms"], rel=1e-12)
    # and the table's today row is what kvtrace whatif says of today's DRAM
    today = whatif_json(str(CHAT), "--dram", "64GiB")
    assert today["service_time_p99_ms"] == pytest.approx(f["before_service_time_p99_ms"], rel=1e-12)
    assert re.search(r"expand DRAM|add local SSD|add shared flash|DRAM \+ flash|keep DRAM|recompute only",
                     res.stdout)
