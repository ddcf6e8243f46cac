"""Labels that say exactly what they show (issue 18): warnings for what a run cannot do
as asked, and sizes written back with their units."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtrace.cli import app

ROOT = Path(__file__).resolve().parent.parent
CHAT = ROOT / "sample_traces" / "chat.jsonl"  # Mooncake: no session ids
MIXED = ROOT / "sample_traces" / "mixed.parquet"  # sessions
RUNNER = CliRunner()


def run(*args):
    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def test_session_routing_without_session_ids_warns_once_and_says_what_it_did():
    res = run("whatif", CHAT, "--dram", "1GiB", "--nodes", "2", "--policy", "all,second-hit", "--flash", "1TiB",
              "--json", "-")
    assert res.exit_code == 0, res.stderr
    warnings = [line for line in res.stderr.splitlines() if "--routing session" in line]
    assert warnings == [f"kvtrace: warning: {CHAT}: --routing session: the trace has no session ids, so each "
                        "request is routed by a hash of its own id (a session's turns land on any node, as with "
                        "random routing); --routing prefix keeps requests that share a first block on one node"]
    assert len(json.loads(res.stdout)["configs"]) == 2


def test_no_warning_where_it_does_not_apply():
    for args in ((MIXED, "--dram", "1GiB", "--nodes", "2"), (CHAT, "--dram", "1GiB"),
                 (CHAT, "--dram", "1GiB", "--nodes", "2", "--routing", "round-robin")):
        res = run("whatif", *args, "--json", "-")
        assert res.exit_code == 0 and "warning" not in res.stderr, res.stderr


def test_compare_local_rows_state_their_tiers_and_only_their_figures():
    args = ("whatif", MIXED, "--dram", "1GiB", "--nodes", "4", "--local-ssd", "64GiB", "--compare-local")
    configs = {c["config"]: c for c in json.loads(run(*args, "--json", "-").stdout)["configs"]}
    res = run(*args)
    assert res.exit_code == 0, res.stderr
    rows: dict[str, list[str]] = {}
    for line in (ln for ln in res.stdout.splitlines() if ln.startswith("│ ")):
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if cells[0]:
            key = cells[0]
            rows[key] = cells[1:]
        else:  # a wrapped cell goes on below its row
            rows[key] = [" ".join(filter(None, (a, b))) for a, b in zip(rows[key], cells[1:])]
    from kvtrace.units import format_bytes

    local, shared = configs["local-ssd"], configs["shared-flash"]
    # tiers, DRAM, SSD/flash, miss, compute saved, writes/day, DWPD, read mean, peak, ...
    assert rows["local-ssd"][0] == "DRAM 1 GiB/node + local SSD 64 GiB/node x 4 nodes"
    assert rows["local-ssd"][5] == format_bytes(local["local_write_bytes_per_day"]) != "0 B"
    assert rows["local-ssd"][6] == f"{local['local_dwpd']:.2f}"
    assert rows["local-ssd"][2] == f"{100 * local['local_prefix_token_hit_rate']:.2f}%"
    assert rows["shared-flash"][0] == "DRAM 1 GiB/node + shared flash 256 GiB x 4 nodes"
    assert rows["shared-flash"][5] == format_bytes(shared["flash_write_bytes_per_day"])
    assert rows["shared-flash"][6] == f"{shared['flash_dwpd']:.2f}"


def test_group_table_is_at_the_knee_itself_with_each_groups_true_ceiling():
    """curve --by: the per-group rates at exactly the capacity where the whole trace
    reaches 80 % of its ceiling, and each group's ceiling, checked against curves
    evaluated at those capacities directly."""
    import polars as pl

    from kvtrace.analyses.curves import compute_curve
    from kvtrace.ingest import load_trace

    trace = load_trace(MIXED)
    res = compute_curve(trace, by="type", points=20)
    knee = res.knees.filter((pl.col("metric") == "prefix_token_hit_rate") & (pl.col("fraction") == 0.8))
    knee_bytes = int(knee["capacity_bytes"][0])
    gs = res.group_summary
    assert gs["at_knee"].all() and (gs["capacity_bytes"] == knee_bytes).all()
    at = compute_curve(trace, by="type", capacities=[knee_bytes]).by_group
    big = compute_curve(trace, by="type", capacities=[res.info["distinct_bytes"]]).by_group  # holds every block
    for r in gs.iter_rows(named=True):
        ref = at.filter(pl.col("group_name") == r["group_name"]).row(0, named=True)
        for k in ("request_hit_rate", "prefix_token_hit_rate", "compute_saved_rate"):
            assert r[k] == ref[k], (r["group_name"], k)
        top = big.filter(pl.col("group_name") == r["group_name"])["prefix_token_hit_rate"][0]
        assert r["ceiling_prefix_token_hit_rate"] == top
    # the old table showed the grid point below the knee and the rate at the largest capacity given
    assert knee_bytes not in res.by_group["capacity_bytes"].to_list()


def test_group_table_header_says_where_it_is():
    res = run("curve", MIXED, "--by", "type", "--points", "20")
    assert res.exit_code == 0, res.stderr
    assert "the capacity reaching 80% of the overall ceiling" in " ".join(res.stdout.split())


def test_a_first_block_every_request_shares_is_pointed_out(tmp_path):
    t = tmp_path / "sys.jsonl"
    rows = [{"timestamp": i, "input_length": 1024, "output_length": 1, "hash_ids": [7, 100 + i % 5]}
            for i in range(200)]
    t.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = run("curve", t)
    assert res.exit_code == 0, res.stderr
    assert ("note: every request starts with the same block (hash 7): the request hit rate is about that at every "
            "capacity that holds one block and says nothing about sizing") in " ".join(res.stdout.split())
    info = json.loads(run("curve", t, "--json", "-").stdout)["info"]
    assert info["shared_first_block"] == {"hash": 7, "share": 1.0}
    # 198 of 200 (99 %) still do; 197 (98.5 %) no longer
    for k, expect in ((2, 0.99), (3, None)):
        rows2 = [dict(r, hash_ids=[900 + i] + r["hash_ids"][1:]) if i < k else r for i, r in enumerate(rows)]
        t.write_text("".join(json.dumps(r) + "\n" for r in rows2))
        got = json.loads(run("curve", t, "--json", "-").stdout)["info"]["shared_first_block"]
        assert (got and got["share"]) == expect
    assert json.loads(run("curve", CHAT, "--json", "-").stdout)["info"]["shared_first_block"] is None


def test_sweep_parallelism_follows_the_estimated_work(monkeypatch):
    import os

    from kvtrace.analyses import whatif

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    rate, start = whatif.REPLAY_ACCESSES_PER_S, whatif.WORKER_START_S
    # 4 configurations of the 32k-access sample: 0.014 s of replay, far below the start of 2 workers
    assert whatif.plan_workers(4, 32_158)[0] == 1
    # serial 4 x N / rate against start + 2 x N / rate: parallel pays once 2 N / rate > start
    n_even = int(start * rate / 2)
    assert whatif.plan_workers(4, n_even - 1000)[0] == 1 and whatif.plan_workers(4, n_even + 1000)[0] == 2
    assert whatif.plan_workers(1, 10**9) == (1, "serially (one configuration)")
    assert whatif.plan_workers(4, 10, workers=2) == (2, "on 2 worker processes (--workers 2)")
    assert whatif.plan_workers(3, 10**9, workers=8)[0] == 3


def test_whatif_says_how_it_ran():
    res = run("whatif", CHAT, "--grid", "--dram", "16GiB,64GiB", "--flash", "1TiB,4TiB")
    assert res.exit_code == 0, res.stderr
    tail = " ".join(res.stdout.split()[-40:])
    assert "4 configuration(s) in" in tail and ", serially (estimated 0.0 s of replay;" in tail


def test_the_half_prefix_request_rate_tells_what_the_request_rate_cannot(tmp_path):
    # every request starts with block 7 (a system prompt); its second block is one of 5
    # (each reused every 5 requests), its third block is new: 3 blocks of 512 tokens,
    # 1,536 tokens, so half the prompt (768 tokens) needs blocks 7 and the second one
    t = tmp_path / "sys.jsonl"
    rows = [{"timestamp": i, "input_length": 1536, "output_length": 1, "hash_ids": [7, 100 + i % 5, 1000 + i]}
            for i in range(200)]
    t.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bpt = 327680  # Llama-3.1-70B, the default model
    block = 512 * bpt
    # the LRU distance of the second block is 7 + the 5 second blocks + 4 or 5 cold blocks
    # between its uses; below one block nothing hits, at 2 blocks block 7 always does
    data = json.loads(run("curve", t, "--capacity", f"{2 * block}B,{16 * block}B", "--json", "-").stdout)
    small, big = data["rows"]
    assert small["request_hit_rate"] == big["request_hit_rate"] == pytest.approx(199 / 200)  # the first is cold
    assert small["request_half_prefix_hit_rate"] == 0.0
    assert big["request_half_prefix_hit_rate"] == pytest.approx(195 / 200)  # the first 5 second blocks are cold
    assert data["ceiling"]["request_half_prefix_hit_rate"] == pytest.approx(195 / 200)
    out = " ".join(run("curve", t).stdout.split())
    assert "half-prefix requests" in out and "(half-prefix requests)" in out
