"""The DESIGN §4-5 calculators (``kvtrace.analyses.estimate``, ``kvtrace estimate``).

Golden values are DESIGN's published worked examples (seed §5-8); every other
expectation is computed by hand in the test.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from typer.testing import CliRunner

from cli_helpers import one_line_error
from kvtrace.cli import app
from kvtrace.errors import UsageError
from kvtrace.analyses.estimate import bandwidth, cost_benefit, gpu_hours_saved_per_month, latency, monthly_cost, parse_rate

GiB = 2**30
RUNNER = CliRunner()


def run(*args):
    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def flat(text: str) -> str:
    return " ".join(re.sub(r"[│┃║]", " ", text).split())


# ----------------------------------------------------------------------------- §4 latency


def test_design_section4_worked_example():
    # h_D 0.80, D 20 ms, R 2000 ms; flash adds h_F 0.15 at F 300 ms with O 20 ms
    r = latency(0.80, 0.15, 20, 300, 2000, 20)
    assert round(r.option("DRAM only")["service_time_mean_ms"], 6) == 416  # 0.8*20 + 0.2*2000
    assert round(r.option("DRAM + flash")["service_time_mean_ms"], 6) == 181  # 16 + 45 + 100 + 20
    assert round(r.option("DRAM for h_D + h_F")["service_time_mean_ms"], 6) == 119  # 0.95*20 + 0.05*2000
    assert round(r.break_even_restore_ms, 1) == 1866.7  # 2000 - 20/0.15
    assert r.flash_pays_off
    # tails from the branch distribution: 5 % recompute at R + O = 2020 ms vs 2000 ms
    assert round(r.option("DRAM + flash")["service_time_p99_ms"], 6) == 2020
    assert round(r.option("DRAM only")["service_time_p99_ms"], 6) == 2000
    slow = latency(0.80, 0.15, 20, 2200, 2000, 20)
    assert round(slow.option("DRAM + flash")["service_time_mean_ms"], 6) == 466  # 16 + 330 + 100 + 20
    assert not slow.flash_pays_off


def test_branch_distribution_tails_by_hand():
    r = latency(0.80, 0.15, 20, 300, 2000, 20)
    tiered = r.option("DRAM + flash")
    # cumulative shares: 0.80 at 40 ms (D + O), 0.95 at 320 ms (F + O), 1.0 at 2020 ms
    assert tiered["service_time_p50_ms"] == pytest.approx(40) and tiered["service_time_p90_ms"] == pytest.approx(320)
    assert tiered["service_time_p999_ms"] == pytest.approx(2020)
    big = r.option("DRAM for h_D + h_F")
    assert big["service_time_p90_ms"] == pytest.approx(20) and big["service_time_p99_ms"] == pytest.approx(2000)
    # a restore deadline caps the flash branch at R: 16 + 0.15*2000 + 100 + 20 = 436
    slow = latency(0.80, 0.15, 20, 2200, 2000, 20)
    assert slow.option("DRAM + flash, restore deadline")["service_time_mean_ms"] == pytest.approx(436)
    assert slow.option("DRAM + flash")["service_time_p90_ms"] == pytest.approx(2220)
    branches = {(b["option"], b["branch"]): (b["share"], b["time_ms"]) for b in r.branches}
    assert branches[("DRAM + flash", "flash")] == (pytest.approx(0.15), pytest.approx(320))
    assert branches[("DRAM only", "recompute")] == (pytest.approx(0.2), pytest.approx(2000))


def test_latency_explains_every_number():
    r = latency(0.80, 0.15, 20, 300, 2000, 20)
    text = "\n".join(r.explain)
    for figure in ("416.0 ms", "181.0 ms", "119.0 ms", "1,866.7 ms", "2,020.0 ms", "2,000.0 ms"):
        assert figure in text, figure
    assert len(r.explain) == len(r.options) + 2
    assert json.loads(json.dumps(r.to_dict()))["options"][0]["option"] == "DRAM only"


def test_latency_without_flash_hits():
    r = latency(0.9, 0.0, 10, 300, 1000, 5)
    assert r.break_even_restore_ms == -math.inf and not r.flash_pays_off
    assert "none" in r.explain[4]


@pytest.mark.parametrize("args", [(1.2, 0.0, 20, 300, 2000), (-0.1, 0.1, 20, 300, 2000),
                                  (0.9, 0.2, 20, 300, 2000), (0.8, 0.1, -20, 300, 2000),
                                  (0.8, 0.1, 20, float("nan"), 2000), (0.8, "0.1", 20, 300, 2000)])
def test_latency_rejects_bad_inputs(args):
    with pytest.raises(UsageError):
        latency(*args)


# ----------------------------------------------------------------------------- §5 cost


def test_design_section5_monthly_cost():
    # 2 TiB DRAM: $52,000 / 36 + $200 + 1.2 kW x 730 h x $0.12 = 1444.44 + 200 + 105.12
    c = monthly_cost(52000, amortisation_months=36, support_usd_per_month=200, kw=1.2, dollars_per_kwh=0.12)
    assert round(c.cost_usd_per_month, 2) == 1749.56
    assert c.hardware_usd_per_month == pytest.approx(52000 / 36)
    assert c.power_usd_per_month == pytest.approx(105.12)
    assert "$1,749.56" in c.explain[-1]


def test_design_section5_benefit():
    # 10 M requests x 15 % x (1.6 - 0.1) GPU-s = 625 GPU-h -> $1,250 -> 60 % = $750
    # -> net 750 - 872.56 = -122.56; break-even 872.56 / 1250 = 69.8 %
    e = cost_benefit(dollars_per_gpu_hour=2.0, realisation=0.6, incremental_cost_usd_per_month=872.56,
                     requests_per_month=10_000_000, share=0.15, gpu_seconds_avoided=1.6, gpu_seconds_restore=0.1)
    assert e.gpu_hours_saved_per_month == pytest.approx(625)
    assert round(e.value_usd_per_month, 2) == 1250.00
    assert round(e.realised_value_usd_per_month, 2) == 750.00
    assert round(e.net_usd_per_month, 2) == -122.56
    assert round(100 * e.break_even_realisation, 1) == 69.8
    text = "\n".join(e.explain)
    for figure in ("625 GPU-h", "$1,250.00", "$750.00", "-$122.56", "69.8 %"):
        assert figure in text, figure
    assert gpu_hours_saved_per_month(10_000_000, 0.15, 1.6, 0.1) == pytest.approx(625)


def test_incremental_from_two_options_by_hand():
    cur = monthly_cost(52000, support_usd_per_month=200, kw=1.2)
    new = monthly_cost(60000, support_usd_per_month=300, kw=2.0, reserve_usd_per_month=25)
    # 60000/36 + 300 + 2.0*730*0.12 + 25 = 1666.667 + 300 + 175.2 + 25
    assert new.cost_usd_per_month == pytest.approx(60000 / 36 + 300 + 175.2 + 25)
    e = cost_benefit(dollars_per_gpu_hour=2.0, realisation=0.6, current=cur, proposed=new, gpu_hours=625)
    inc = new.cost_usd_per_month - cur.cost_usd_per_month
    assert e.incremental_cost_usd_per_month == pytest.approx(inc)
    assert e.net_usd_per_month == pytest.approx(750 - inc)
    assert e.break_even_realisation == pytest.approx(inc / 1250)


def test_losses_are_paid_in_full_and_break_even_edges():
    # an option that needs 100 more GPU-h is charged at 100 %, whatever the realisation
    loss = cost_benefit(dollars_per_gpu_hour=2.0, realisation=0.5, incremental_cost_usd_per_month=-50, gpu_hours=-100)
    assert loss.realised_value_usd_per_month == pytest.approx(-200) and loss.net_usd_per_month == pytest.approx(-150)
    assert loss.break_even_realisation is None
    free = cost_benefit(dollars_per_gpu_hour=2.0, realisation=0.5, incremental_cost_usd_per_month=-10, gpu_hours=10)
    assert free.break_even_realisation == 0.0 and free.net_usd_per_month == pytest.approx(20)
    with pytest.raises(UsageError):
        cost_benefit(dollars_per_gpu_hour=2.0, realisation=1.5, incremental_cost_usd_per_month=1, gpu_hours=1)
    with pytest.raises(UsageError):
        cost_benefit(dollars_per_gpu_hour=2.0, realisation=0.5, incremental_cost_usd_per_month=1)
    with pytest.raises(UsageError):
        monthly_cost(1000, amortisation_months=0)


# ----------------------------------------------------------------------------- §4 bandwidth


def test_bandwidth_by_hand():
    # seed §7: 100 req/s x 20 % x 8 GiB = 160 GiB/s; seed §5: 8 GiB at 32 GiB/s = 250 ms
    r = bandwidth(100, 0.2, 8 * GiB, tier_bytes_per_s=200 * GiB, peak_arrival_rate_per_s=150,
                  restore_bytes_per_s=32 * GiB)
    assert r.needed_bytes_per_s == pytest.approx(160 * GiB)
    assert r.peak_needed_bytes_per_s == pytest.approx(240 * GiB)
    assert r.utilisation == pytest.approx(0.8) and r.peak_utilisation == pytest.approx(1.2)
    assert r.headroom == pytest.approx(200 / 240) and r.fits is False
    assert r.transfer_floor_ms == pytest.approx(250)
    assert bandwidth(100, 0.2, 8 * GiB, tier_bytes_per_s=200 * GiB).fits is True


def test_parse_rate():
    assert parse_rate("32GiB/s") == 32 * GiB
    assert parse_rate("25GB/s") == 25 * 10**9
    assert parse_rate("6 GB/s") == 6 * 10**9
    assert parse_rate("1.5TiB") == int(1.5 * 2**40)
    with pytest.raises(UsageError, match="unit"):
        parse_rate("200")
    with pytest.raises(UsageError):
        parse_rate("fast")


# ----------------------------------------------------------------------------- CLI


def test_cli_latency_prints_the_worked_example():
    res = run("estimate", "latency", "--h-dram", 0.8, "--h-flash", 0.15, "--dram-ms", 20, "--flash-ms", 300,
              "--recompute-ms", 2000, "--overhead-ms", 20)
    assert res.exit_code == 0, res.stderr
    out = flat(res.stdout)
    assert "DRAM only 416.0 ms 20.0 ms 2,000.0 ms 2,000.0 ms 2,000.0 ms" in out
    assert "DRAM + flash 181.0 ms 40.0 ms 320.0 ms 2,020.0 ms 2,020.0 ms" in out
    assert "DRAM for h_D + h_F 119.0 ms" in out
    assert "F < 1,866.7 ms" in out
    res = run("estimate", "latency", "--h-dram", 0.8, "--h-flash", 0.15, "--dram-ms", 20, "--flash-ms", 2200,
              "--recompute-ms", 2000, "--overhead-ms", 20, "--json", "-")
    d = json.loads(res.stdout)
    assert [o["service_time_mean_ms"] for o in d["options"]] == pytest.approx([416, 466, 436, 119])


def test_cli_cost_prints_the_worked_example(tmp_path):
    args = ("estimate", "cost", "--hardware", 52000, "--support", 200, "--kw", 1.2, "--months", 36,
            "--kwh-price", 0.12, "--incremental", 872.56, "--requests", 10_000_000, "--share", 0.15,
            "--gpu-seconds", 1.6, "--restore-gpu-seconds", 0.1, "--gpu-price", 2, "--realisation", 0.6)
    res = run(*args)
    assert res.exit_code == 0, res.stderr
    out = flat(res.stdout)
    for row in ("current: monthly cost $1,749.56", "incremental cost +$872.56", "GPU-hours freed per month 625",
                "value per month $1,250.00", "realised at 60 % $750.00", "net per month -$122.56",
                "break-even realisation 69.8 %"):
        assert row in out, row
    target = tmp_path / "cost.json"
    assert run(*args, "--json", target).exit_code == 0
    d = json.loads(target.read_text())
    assert d["current"]["cost_usd_per_month"] == pytest.approx(1749.5644444)
    assert d["benefit"]["net_usd_per_month"] == pytest.approx(-122.56)
    assert d["benefit"]["break_even_realisation"] == pytest.approx(0.698048)


def test_cli_cost_of_two_options():
    res = run("estimate", "cost", "--hardware", 52000, "--support", 200, "--kw", 1.2, "--new-hardware", 60000,
              "--new-support", 300, "--new-kw", 2.0, "--json", "-")
    d = json.loads(res.stdout)
    assert d["incremental_cost_usd_per_month"] == pytest.approx(60000 / 36 + 300 + 175.2 - (52000 / 36 + 200 + 105.12))


def test_cli_bandwidth():
    res = run("estimate", "bandwidth", "--rate", 100, "--share", 0.2, "--bytes", "8GiB", "--tier-bandwidth",
              "200GiB/s", "--peak-rate", 150, "--restore-bandwidth", "32GiB/s")
    assert res.exit_code == 0, res.stderr
    out = flat(res.stdout)
    assert "mean need 160 GiB/s" in out and "peak need 240 GiB/s" in out
    assert "does NOT fit" in out and "transfer floor of one read 250.0 ms" in out


def test_cli_estimate_errors_are_one_line():
    one_line_error(run("estimate", "latency", "--h-dram", 1.2, "--dram-ms", 20, "--flash-ms", 300,
                       "--recompute-ms", 2000), 2, "h-dram")
    one_line_error(run("estimate", "cost"), 2, "hardware")
    one_line_error(run("estimate", "cost", "--hardware", 1000, "--gpu-hours", 10), 2, "gpu-price")
    one_line_error(run("estimate", "bandwidth", "--rate", 1, "--share", 0.5, "--bytes", "8GiB",
                       "--tier-bandwidth", "200"), 2, "tier-bandwidth", "unit")
