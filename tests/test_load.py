"""``kvtrace load`` (issue #21): TTFT under load from the exact queue simulation.

Golden values come from independent computations: the prefill of a prompt's tokens from
the model's shape and the GPU's peak x MFU (not from the simulator's demand), the
Pollaczek-Khinchine mean wait of an M/D/1 queue, the what-if's per-request service
times (:func:`kvtrace.analyses.response.request_times`), the restore-or-recompute
deadline applied by hand, and the trace's own timestamps. Nothing here is a recorded
simulator output.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from cli_helpers import one_line_error
from kvtrace.analyses.load import COLUMNS, RESOURCES, LoadLevel, LoadModel, load_curve, replay_demand, run_level
from kvtrace.analyses.load import run as load_run
from kvtrace.analyses.load.demand import D_BF, D_READS
from kvtrace.analyses.response import ResponseModel, request_times
from kvtrace.analyses.whatif import TierConfig, simulate
from kvtrace.cli import app
from kvtrace.ingest import load_trace
from kvtrace.model import resolve_gpu, resolve_model
from kvtrace.trace import source as source_mod

ROOT = Path(__file__).resolve().parents[1]
CHAT = ROOT / "sample_traces" / "chat.jsonl"
MIXED = ROOT / "sample_traces" / "mixed.parquet"
GiB, TiB = 2**30, 2**40
BLOCK = 512  # Mooncake's block size, chat.jsonl's

MODEL = resolve_model("Llama-3.1-70B")
GPU = resolve_gpu("H100")
#: Prefill FLOP/s of one GPU, from its spec: peak x MFU.
RATE = GPU.peak_flops * GPU.mfu
#: Per-token prefill FLOPs a + b x position, from the model's shape (DESIGN: 2 x active
#: parameters, 4 x layers x query heads x head dim).
A_FLOPS = 2.0 * MODEL.active_params
B_FLOPS = 4.0 * MODEL.layers * MODEL.q_heads * MODEL.head_dim
RUNNER = CliRunner()


def prefill_s(n_tokens, start=0):
    """Prefill seconds of ``n_tokens`` tokens at positions ``start..``: FLOPs / (peak x MFU)."""
    n = np.asarray(n_tokens, dtype=np.float64)
    return (A_FLOPS * n + B_FLOPS * (n * start + n * (n - 1.0) / 2.0)) / RATE


def prefill_after_reusable(rows: list[dict]) -> np.ndarray:
    """Per request of a Mooncake trace: the prefill (s) of its tokens after its reusable
    prefix (the blocks before the first one no earlier request touched)."""
    seen: set = set()
    out = []
    for r in rows:
        ids, n = r["hash_ids"], r["input_length"]
        j = 0
        while j < len(ids) and ids[j] in seen:
            j += 1
        start = BLOCK * j
        out.append(float(prefill_s(max(0, n - start), start)))
        seen.update(ids)
    return np.array(out)


def write_mooncake(path: Path, rows: list[dict]) -> Path:
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    return path


def chat_rows() -> list[dict]:
    return [json.loads(line) for line in CHAT.read_text().splitlines()]


def invoke(args, seconds: float = 120.0, columns: int = 200):
    """``kvtrace`` in process, in a daemon thread: a hang fails the test instead of hanging it."""
    box: dict = {}
    th = threading.Thread(target=lambda: box.update(res=RUNNER.invoke(app, [str(a) for a in args],
                                                                      env={"COLUMNS": str(columns)})), daemon=True)
    t0 = time.perf_counter()
    th.start()
    th.join(seconds)
    assert not th.is_alive(), f"kvtrace {' '.join(map(str, args))} still running after {seconds} s"
    box["elapsed"] = time.perf_counter() - t0
    return box["res"]


def ok(res):
    assert res.exit_code == 0, (res.exit_code, res.stdout, res.stderr, res.exception)
    assert "Traceback" not in res.stdout + res.stderr
    return res


@pytest.fixture(scope="module")
def chat():
    return load_trace(CHAT)


@pytest.fixture(scope="module")
def spread(tmp_path_factory):
    """chat.jsonl's first 2,000 requests 100 s apart: nothing queues (the longest TTFT,
    background writes included, is far shorter), and absolute times stay small enough
    (< 2e5 s) for TTFTs to keep 1e-10 s of precision."""
    rows = [dict(r, timestamp=i * 100_000.0) for i, r in enumerate(chat_rows()[:2000])]
    path = write_mooncake(tmp_path_factory.mktemp("load") / "spread.jsonl", rows)
    return load_trace(path), rows, path


def whatif_service_s(trace, config, response):
    """Per measured request: the what-if's reusable-prefix service time, recomputed with
    :func:`request_times` from the what-if's request table (and checked against its own)."""
    req = simulate(trace, config, model=MODEL, gpu=GPU, response=response).requests
    times = request_times(req["dram_bytes"].to_numpy(), (req["local_bytes"] + req["flash_bytes"]).to_numpy(),
                          req["flash_recompute_flops"].to_numpy(), req["miss_recompute_flops"].to_numpy(),
                          response, config.has_flash)
    np.testing.assert_allclose(times, req["service_time_ms"].to_numpy() / 1e3, rtol=1e-12, atol=0)
    return times, req


# ----------------------------------------------------------------------------- 1. zero-load limit

FAST = ResponseModel(recompute_flops_per_s=RATE)
SLOW_FLASH = ResponseModel(flash_bytes_per_s=1.1e9, recompute_flops_per_s=RATE)  # restore loses for some


@pytest.mark.parametrize("config,targets,response", [
    (TierConfig(8 * GiB), 1, FAST),
    (TierConfig(8 * GiB, flash_bytes=TiB), 1, FAST),
    (TierConfig(8 * GiB, flash_bytes=TiB), 4, FAST),
    (TierConfig(8 * GiB, flash_bytes=TiB), 4, SLOW_FLASH),
    (TierConfig(4 * GiB, local_ssd_bytes=16 * GiB, flash_bytes=TiB, nodes=2), 8, FAST),
], ids=["dram", "flash-T1", "flash-T4", "flash-T4-slow-flash", "local-flash-2nodes-T8"])
def test_zero_load_ttft_is_the_whatif_service_time_plus_the_prefill_of_the_rest(spread, config, targets, response):
    trace, rows, _ = spread
    load = LoadModel(flash_targets=targets)
    # the conditions of the limit: every resource at least as fast as the per-request flash rate
    assert min(load.nic_bytes_per_s, load.local_ssd_bytes_per_s, load.flash_bytes_per_s / targets,
               load.host_link(response)) >= response.flash_bytes_per_s
    demand, _ = replay_demand(trace, config, load, model=MODEL, gpu=GPU, response=response)
    try:
        row, _, ttft = run_level(demand, LoadLevel(1.0), load, response, keep_ttft=True)
    finally:
        demand.close()
    service, req = whatif_service_s(trace, config, response)
    want = service + prefill_after_reusable(rows)
    assert not row["overloaded"] and not np.isnan(ttft).any()
    err = np.abs(ttft - want)
    assert err.max() <= 1e-9, (int(err.argmax()), ttft[err.argmax()], want[err.argmax()])
    # the trace exercises what the formula covers
    assert (req["dram_bytes"] > 0).sum() > 100
    if config.has_flash:
        tier = (req["local_bytes"] + req["flash_bytes"] > 0).to_numpy()
        assert tier.sum() > 100
        if response is SLOW_FLASH:  # both branches of the deadline min(F, R)
            assert 0 < row["restore_share"] < 1


# ----------------------------------------------------------------------------- 2. M/D/1

@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_all_miss_poisson_trace_on_one_gpu_waits_as_md1(tmp_path, rho):
    """Distinct blocks, equal prompts, Poisson arrivals, one node with one GPU: an M/D/1
    queue, whose mean wait is rho S / (2 (1 - rho)) (Pollaczek-Khinchine)."""
    n, tokens = 40_000, 1024
    S = float(prefill_s(tokens))  # every request prefills its whole prompt: nothing is ever reused
    lam = rho / S
    rng = np.random.default_rng(21)
    t = np.cumsum(rng.exponential(1.0 / lam, n))
    rows = [{"timestamp": float(x * 1e3), "input_length": tokens, "output_length": 1, "hash_ids": [2 * i, 2 * i + 1]}
            for i, x in enumerate(t)]
    trace = load_trace(write_mooncake(tmp_path / "md1.jsonl", rows))
    load = LoadModel(gpus_per_node=1)
    demand, _ = replay_demand(trace, TierConfig(GiB), load, model=MODEL, gpu=GPU, response=FAST)
    try:
        row, res_rows, ttft = run_level(demand, LoadLevel(1.0), load, FAST, keep_ttft=True)
    finally:
        demand.close()
    assert not row["overloaded"] and not np.isnan(ttft).any()
    wait = ttft - S
    assert wait.min() == pytest.approx(0.0, abs=1e-9)  # the unloaded TTFT is the prefill alone
    assert row["ttft_mean_ms"] == pytest.approx(ttft.mean() * 1e3, rel=1e-12)
    w = wait[2_000:]  # past the start from an empty queue
    batches = w[: w.size // 40 * 40].reshape(40, -1).mean(axis=1)
    se = batches.std(ddof=1) / math.sqrt(batches.size)
    pk = rho * S / (2 * (1 - rho))
    assert se < 0.1 * pk  # the test can tell
    assert abs(w.mean() - pk) <= 4 * se, (w.mean(), pk, se)
    # the table's figures over the same TTFTs: exact percentiles, goodput within the SLO
    assert row["ttft_p99_ms"] == np.percentile(ttft, 99, method="inverted_cdf") * 1e3
    met = np.count_nonzero(ttft <= load.slo_ttft_s)
    assert 0 < met < n
    assert row["slo_attainment"] == met / n
    span = (rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1e3
    assert row["goodput_rps"] == pytest.approx(met / span, rel=1e-12)
    # the GPU's p99 queue wait, from a histogram: at most 2**(1/64) - 1 = 1.09 % above the exact one
    exact = np.sort(wait)[math.ceil(0.99 * n) - 1]
    assert exact <= row["wait_p99_gpu_ms"] / 1e3 * (1 + 1e-9) <= exact * 2 ** (1 / 64) * (1 + 1e-9) + 1e-9
    gpu = [r for r in res_rows if r["resource"] == "gpu"]
    assert len(gpu) == 1 and gpu[0]["util"] == pytest.approx(rho, rel=0.05)
    assert row["util_gpu"] == gpu[0]["util"] and row["bottleneck"] == "gpu"


# ----------------------------------------------------------------------------- 3. flash targets

def test_flash_target_columns_sum_to_the_requests_flash_bytes_and_reads(chat):
    T = 4
    load = LoadModel(flash_targets=T)
    config = TierConfig(8 * GiB, flash_bytes=TiB)
    demand, whatif = replay_demand(chat, config, load, model=MODEL, gpu=GPU, response=FAST)
    try:
        rows = np.array(demand.rows)
    finally:
        demand.close()
    c0 = len(COLUMNS)
    by_target, reads = rows[:, c0:c0 + T], rows[:, c0 + T:c0 + 2 * T]
    assert np.array_equal(by_target.sum(axis=1), rows[:, D_BF])
    assert np.array_equal(reads.sum(axis=1), rows[:, D_READS])
    # a real split: every target serves, some requests read from several, whole blocks only
    assert (by_target.sum(axis=0) > 0).all()
    assert ((by_target > 0).sum(axis=1) >= 2).sum() > 50
    bpt = MODEL.kv_bytes_per_token
    assert np.array_equal(by_target % bpt, np.zeros_like(by_target))
    assert (reads[by_target > 0] >= 1).all() and (reads[by_target == 0] == 0).all()
    assert rows[:, D_BF].sum() == whatif.summary["flash_read_bytes"]


def test_bytes_read_per_tier_agree_with_whatif(spread):
    _, _, path = spread  # nothing queues: every restore beats its recompute, as unloaded
    cfg = ["--dram", "4GiB", "--local-ssd", "16GiB", "--flash", "1TiB", "--nodes", "2"]
    w = json.loads(ok(invoke(["whatif", path, *cfg, "--json", "-"])).stdout)["configs"][0]
    doc = json.loads(ok(invoke(["load", path, *cfg, "--flash-targets", "4", "--json", "-"])).stdout)
    level = doc["levels"][0]
    assert level["restore_share"] == 1.0  # every tier prefix is read: the what-if counts all of them
    for tier in ("dram", "local", "flash"):
        assert w[f"{tier}_read_bytes"] > 0
        assert level[f"{tier}_read_bytes"] == w[f"{tier}_read_bytes"], tier
    assert level["tier_reading_request_share"] == pytest.approx(w["ssd_reading_request_share"], rel=1e-12)


# ----------------------------------------------------------------------------- 4. streamed

def test_streamed_equals_in_memory(monkeypatch):
    monkeypatch.setattr(source_mod, "CHUNK_ACCESSES", 3_000)  # many replay chunks
    spilled = []
    real = load_run.Demand

    def spy(*args, **kwargs):
        d = real(*args, **kwargs)
        spilled.append(d.path is not None)
        return d

    monkeypatch.setattr(load_run, "Demand", spy)
    args = ["load", MIXED, "--dram", "2GiB", "--flash", "16GiB", "--local-ssd", "4GiB", "--nodes", "2",
            "--policy", "all,second-hit", "--flash-targets", "3", "--load", "1x,8x,64x", "--json", "-"]
    streamed = json.loads(ok(invoke(args + ["--stream"])).stdout)
    assert spilled == [True, True]  # the streamed run kept its demand in a spill file
    in_memory = json.loads(ok(invoke(args + ["--no-stream"])).stdout)
    assert spilled[2:] == [False, False]
    assert streamed["levels"] == in_memory["levels"]
    assert streamed["resources"] == in_memory["resources"]
    assert len(streamed["levels"]) == 6 and any(r["overloaded"] for r in streamed["levels"])


# ----------------------------------------------------------------------------- 5. overload

NOTE = re.compile(r"at (\S+)x: overloaded: (\w+) at 100 % from t = (\d+\.\d{3}) s")


@pytest.mark.parametrize("extra,resource", [
    (["--gpus-per-node", "0"], "gpu"),
    (["--flash", "1TiB", "--nic-gbps", "0"], "nic"),
    (["--flash", "1TiB", "--flash-pool-gbps", "0"], "flash"),
    (["--host-link-gbps", "0"], "host_link"),
    (["--flash", "1TiB", "--local-ssd", "16GiB", "--local-ssd-gbps", "0"], "local_ssd"),
    (["--load", "10000x"], None),
], ids=["no-gpu", "zero-nic", "zero-flash", "zero-host-link", "zero-local-ssd", "10000x"])
def test_overload_stops_the_run_and_says_where(tmp_path, extra, resource):
    out = tmp_path / "t.json"
    res = ok(invoke(["load", CHAT, "--dram", "8GiB", *extra, "--json", out], seconds=60))
    notes = NOTE.findall(res.stdout)
    assert len(notes) == 1, res.stdout
    level, = json.loads(out.read_text())["levels"]
    factor, name, since = notes[0]
    assert level["overloaded"] is True and level["overload_resource"] == name == level["bottleneck"]
    assert name == resource if resource else name in RESOURCES
    assert since == f"{level['overload_from_s']:.3f}"
    assert 0 <= level["overload_from_s"] <= level["overload_at_s"]
    assert level["completed_requests"] < level["measured_requests"]  # stopped: the rest miss the SLO
    assert level["slo_attainment"] <= level["completed_requests"] / level["measured_requests"]


# ----------------------------------------------------------------------------- 6. CLI

TABLE_COLUMNS = ("config", "load_factor", "target_rps", "arrival_rate_rps", "ttft_mean_ms", "ttft_p50_ms",
                 "ttft_p90_ms", "ttft_p99_ms", "ttft_p999_ms", "goodput_rps", "slo_attainment", "bottleneck",
                 *(f"util_{r}" for r in RESOURCES), *(f"wait_p99_{r}_ms" for r in RESOURCES), "restore_share",
                 "recompute_share", "tier_reading_request_share", "dram_read_bytes", "local_read_bytes",
                 "flash_read_bytes", "completed_requests", "overloaded", "overload_resource", "overload_from_s",
                 "overload_at_s", "prefix_token_hit_rate", "service_time_p99_ms")
RESOURCE_COLUMNS = ("config", "load_factor", "resource", "instance", "util", "jobs", "job_rate_per_s",
                    "mean_jobs_present", "mean_sojourn_ms", "mean_work_ms")


def test_cli_writes_the_table_resources_plot_and_json(tmp_path):
    out, resources, plot, js = (tmp_path / n for n in ("t.parquet", "r.csv", "p.html", "d.json"))
    res = ok(invoke(["load", CHAT, "--dram", "8GiB", "--flash", "1TiB", "--load", "1x,2x,4x", "--out", out,
                     "--resources-out", resources, "--plot", plot, "--json", js]))
    table = pl.read_parquet(out)
    assert set(TABLE_COLUMNS) <= set(table.columns), set(TABLE_COLUMNS) - set(table.columns)
    assert table.height == 3 and table["load_factor"].to_list() == [1.0, 2.0, 4.0]
    doc = json.loads(js.read_text())
    assert doc["levels"] == table.to_dicts()
    r = pl.read_csv(resources)
    assert set(RESOURCE_COLUMNS) <= set(r.columns) and r.height == len(doc["resources"]) > 0
    assert "vega" in plot.read_text().lower()
    # arrivals over the measured span at the trace's times / k: exactly k times the 1x rate
    rate = table["arrival_rate_rps"].to_list()
    assert rate[1] == 2 * rate[0] and rate[2] == 4 * rate[0]
    rows = chat_rows()
    assert rate[0] == pytest.approx(len(rows) / ((rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1e3), rel=1e-12)
    # the busy share of a resource grows with the load
    assert table["util_gpu"].to_list() == sorted(table["util_gpu"].to_list())
    assert "TTFT under load" in res.stdout


def test_rps_levels_arrive_at_the_rate_asked_for():
    rows = chat_rows()
    base = len(rows) / ((rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1e3)
    doc = json.loads(ok(invoke(["load", CHAT, "--dram", "8GiB", "--rps", "3,7.5", "--json", "-"])).stdout)
    for level, want in zip(doc["levels"], (3.0, 7.5)):
        assert level["target_rps"] == want
        assert level["load_factor"] == pytest.approx(want / base, rel=1e-12)
        assert level["arrival_rate_rps"] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("extra,needles", [
    (["--load", "abc"], ("'load'", "0.5x,1x,2x", "'abc'")),
    (["--load", "-1x"], ("'load'", "'-1x'")),
    (["--load", "0x"], ("'load'", "positive", "'0x'")),
    (["--rps", "0"], ("'rps'", "positive", "'0'")),
    (["--rps", "2x"], ("'rps'", "50,100,200")),
    (["--flash-targets", "0"], ("--flash-targets", "1")),
    (["--gpus-per-node", "-1"], ("--gpus-per-node",)),
    (["--load", "1x", "--rps", "5"], ("--load", "--rps", "not both")),
    (["--max-wait", "0"], ("'max-wait'", "positive")),
    (["--slo-ttft", "-1"], ("'slo-ttft'", ">= 0")),
    (["--out", "t.txt"], ("out",)),
], ids=lambda v: "_".join(v) if isinstance(v, list) else None)
def test_malformed_options_are_one_line_errors(extra, needles):
    one_line_error(invoke(["load", CHAT, "--dram", "8GiB", *extra], columns=80), 2, *needles)


@pytest.mark.parametrize("option", ["--nic-gbps", "--host-link-gbps", "--local-ssd-gbps", "--flash-pool-gbps",
                                    "--uplink-gbps", "--flash-write-gbps", "--flash-iops", "--prefill-tokens-per-s",
                                    "--flash-gbps", "--dram-gbps"])
def test_a_negative_rate_is_a_one_line_error_naming_the_option_and_the_value_typed(option):
    """The error names the option as typed (as ``field 'max-wait'`` does for --max-wait)
    and the value in the option's unit (-5, not -5e9 bytes/s)."""
    line = one_line_error(invoke(["load", CHAT, "--dram", "8GiB", "--flash", "1TiB", option, "-5"], columns=80), 2)
    assert f"field '{option[2:]}'" in line, line
    assert re.search(r"got -5(\.0)?$", line), f"the value is not in the option's unit: {line}"


# ----------------------------------------------------------------------------- 7. restore or recompute

def test_restore_and_recompute_shares_follow_the_deadline_rule_at_zero_load(spread):
    trace, _, _ = spread
    config = TierConfig(8 * GiB, flash_bytes=TiB)
    load = LoadModel(flash_targets=2)
    for response in (FAST, SLOW_FLASH):
        _, req = whatif_service_s(trace, config, response)
        tier_bytes = (req["local_bytes"] + req["flash_bytes"]).to_numpy()
        tier = tier_bytes > 0
        restore_s = response.flash_fixed_s + tier_bytes / response.flash_bytes_per_s
        recompute_s = req["flash_recompute_flops"].to_numpy() / RATE
        want = np.count_nonzero(tier & (restore_s <= recompute_s)) / np.count_nonzero(tier)
        demand, _ = replay_demand(trace, config, load, model=MODEL, gpu=GPU, response=response)
        try:
            row, _, _ = run_level(demand, LoadLevel(1.0), load, response)
        finally:
            demand.close()
        assert row["restore_share"] == want
        assert row["restore_share"] + row["recompute_share"] == 1.0
        assert row["tier_reading_request_share"] == np.count_nonzero(tier) / len(tier)
        if response is FAST:
            assert want == 1.0  # restore beats recompute for every tier prefix
        else:
            assert 0.05 < want < 0.95


@pytest.mark.parametrize("extra", [["--flash-iops", "1e-3"], ["--flash-gbps", "1e-6"]],
                         ids=["slow-pool-reads", "slow-client"])
def test_a_very_slow_flash_recomputes_every_tier_prefix(extra):
    args = ["load", CHAT, "--dram", "8GiB", "--flash", "1TiB", "--load", "1x,4x", *extra, "--json", "-"]
    for level in json.loads(ok(invoke(args)).stdout)["levels"]:
        assert level["tier_reading_request_share"] > 0.1
        assert level["restore_share"] == 0.0 and level["recompute_share"] == 1.0
        assert level["flash_read_bytes"] == 0.0


def test_shares_sum_to_one_under_load(chat):
    res = load_curve(chat, [TierConfig(8 * GiB, flash_bytes=TiB)], [LoadLevel(k) for k in (1.0, 16.0, 32.0, 64.0)],
                     LoadModel(gpus_per_node=2), model=MODEL, gpu=GPU, response=FAST)
    shares = res.table.select("restore_share", "recompute_share").rows()
    assert all(r + c == pytest.approx(1.0, abs=1e-15) for r, c in shares)
    assert shares[0][0] == 1.0 and min(r for r, _ in shares) < 1.0  # queues turn some restores into recomputes


# ----------------------------------------------------------------------------- 8. Little's law

@pytest.mark.parametrize("discipline", ["fcfs", "ps"])
def test_littles_law_holds_per_station(chat, discipline):
    config = TierConfig(4 * GiB, local_ssd_bytes=16 * GiB, flash_bytes=TiB, nodes=2)
    load = LoadModel(link_discipline=discipline, flash_targets=3, gpus_per_node=4)
    res = load_curve(chat, [config], [LoadLevel(1.0), LoadLevel(4.0)], load, model=MODEL, gpu=GPU, response=FAST)
    assert not any(res.table["overloaded"].to_list())
    assert res.table["util_gpu"][1] > 0.5  # queues form at 4x
    r = res.resources.filter(pl.col("jobs") > 0)
    assert set(r["resource"].to_list()) == {"host_link", "nic", "local_ssd", "flash", "gpu"}
    for row in r.iter_rows(named=True):
        little = row["job_rate_per_s"] * row["mean_sojourn_ms"] / 1e3
        # window edges: jobs that arrived before the last arrival and leave after it
        assert row["mean_jobs_present"] == pytest.approx(little, rel=1e-2), row
        assert row["mean_sojourn_ms"] >= row["mean_work_ms"] * (1 - 1e-12), row
