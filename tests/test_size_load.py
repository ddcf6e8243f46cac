"""``kvtrace size`` decides on TTFT under load when the config sets a TTFT target
(issue 21): every applicable same-SLO candidate is simulated with queues at the
replayed load, must meet the target there, and reports its headroom; without a
target the unloaded risk line stays."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtrace.analyses.load import LoadLevel, replay_demand, run_level
from kvtrace.analyses.sizing import default_config, recommend
from kvtrace.analyses.sizing.lenses import Point
from kvtrace.analyses.whatif import TierConfig
from kvtrace.cli import app
from kvtrace.ingest import load_trace

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "sample_traces" / "chat.jsonl"
TIERS = ROOT / "sample_traces" / "tiers.example.toml"



@pytest.fixture(scope="module")
def chat():
    return load_trace(CHAT)


def test_loaded_sizing_reports_ttft_and_headroom_that_hold(chat):
    cfg = dataclasses.replace(default_config(), slo_ttft_p99_ms=4000.0)
    res = recommend(chat, cfg)
    slo = res.candidates.filter(res.candidates["lens"] == "same-slo")
    applicable = slo.filter(slo["config"].is_not_null())
    assert applicable["loaded_ttft_p99_ms"].null_count() == 0
    assert not any("unloaded" in r for r in res.recommendation.risks)
    top = res.recommendation.figures
    assert any("Under load" in r and "that rate" in r for r in res.recommendation.reasons)
    # the headroom holds: an independent run at the factor meets the target, 5 % above it does not
    load = cfg.load_model()
    p = Point(top["dram_bytes"], top["local_ssd_bytes"], top["flash_bytes"])
    from kvtrace.model import resolve_gpu
    from kvtrace.analyses.response import ResponseModel

    gpu = resolve_gpu(cfg.gpu, mfu=cfg.gpu_mfu, dollars_per_hour=cfg.gpu_dollars_per_hour,
                      peak_flops=cfg.gpu_peak_tflops * 1e12)
    spec = cfg.tiers["dram"]
    response = ResponseModel(dram_fixed_s=spec.latency_ms / 1e3, dram_bytes_per_s=spec.restore_gbps * 1e9,
                             recompute_flops_per_s=gpu.effective_flops)
    assert p.flash_tier is None  # the sample's winner is a DRAM configuration
    demand, _ = replay_demand(chat, TierConfig(dram_bytes=p.dram), load, model=cfg.model, gpu=gpu,
                              response=response)
    try:
        k = top["load_headroom_factor"]
        at, _, _ = run_level(demand, LoadLevel(k), load, response)
        above, _, _ = run_level(demand, LoadLevel(k * 1.05), load, response)
        one, _, _ = run_level(demand, LoadLevel(1.0), load, response)
    finally:
        demand.close()
    assert cfg.meets_ttft(at) and not cfg.meets_ttft(above)
    assert one["ttft_p99_ms"] == pytest.approx(top["loaded_ttft_p99_ms"], rel=1e-12)


def test_a_ttft_target_no_candidate_meets_under_load_is_no_recommendation(chat):
    cfg = dataclasses.replace(default_config(), slo_ttft_p99_ms=50.0)
    res = recommend(chat, cfg)
    rec = res.recommendation
    assert not rec.feasible and rec.headline.startswith("no configuration meets")
    slo = res.candidates.filter(res.candidates["lens"] == "same-slo").filter(res.candidates.filter(
        res.candidates["lens"] == "same-slo")["config"].is_not_null())
    assert not any(slo["feasible"].to_list())
    assert all("TTFT under load" in (s or "") for s in slo["shortfalls"].to_list())


def test_load_resources_without_a_ttft_target_is_a_one_line_error(tmp_path):
    text = TIERS.read_text().replace("[load]\n", "[load]\ngpus_per_node = 4\n", 1)
    conf = tmp_path / "t.toml"
    conf.write_text(text)
    res = CliRunner().invoke(app, ["size", str(CHAT), "--config", str(conf)])
    assert res.exit_code != 0
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "slo.ttft_p99_ms" in err[0] and "t.toml" in err[0], res.stderr
    bad = TIERS.read_text().replace("[load]\n", "[load]\nlink_discipline = \"lifo\"\n", 1).replace(
        "p99_ms = 600.0\n", "p99_ms = 600.0\nttft_p99_ms = 900.0\n", 1)
    conf.write_text(bad)
    res = CliRunner().invoke(app, ["size", str(CHAT), "--config", str(conf)])
    assert res.exit_code != 0 and "link_discipline" in res.stderr and "Traceback" not in res.stderr
