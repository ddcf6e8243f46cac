"""``kvtrace estimate latency|cost|bandwidth``: back-of-the-envelope calculators on given
numbers (kvtrace.analyses.estimate)."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from kvtrace.cli.console import console, report_written, write_json
from kvtrace.cli.errors import handles_errors
from kvtrace.cli.inputs import check_paths
from kvtrace.errors import UsageError
from kvtrace.results import present
from kvtrace.units import format_bytes

estimate_app = typer.Typer(
    help="Back-of-the-envelope calculators on given numbers: latency, cost and bandwidth (DESIGN sections 4-5).",
    no_args_is_help=True,
    rich_markup_mode="rich",
)


def _print_explain(lines) -> None:
    console.print("how each number is computed:", style="bold")
    for line in lines:
        console.print(f"  {line}", markup=False, soft_wrap=True)


@estimate_app.command("latency")
@handles_errors
def estimate_latency(
    h_dram: float = typer.Option(..., "--h-dram", help="Share of all requests served from DRAM (unconditional), 0-1."),
    h_flash: float = typer.Option(
        0.0, "--h-flash", help="Share of all requests served from flash (unconditional: not the hit rate among DRAM "
                               "misses), 0-1."),
    dram_ms: float = typer.Option(..., "--dram-ms", help="DRAM restore time D, ms."),
    flash_ms: float = typer.Option(..., "--flash-ms", help="Flash restore time F, ms."),
    recompute_ms: float = typer.Option(..., "--recompute-ms", help="Recompute time R of a miss, ms."),
    overhead_ms: float = typer.Option(
        0.0, "--overhead-ms", help="Per-request overhead O of having the flash tier, ms (every request pays it)."),
    json_out: Optional[str] = typer.Option(
        None, "--json", help="Write the figures as JSON to this file ('-' = stdout only)."),
) -> None:
    """Mean and tail reusable-prefix time per option, the branch table and the break-even flash latency.

    Means are h_D D + h_F F + (1 - h_D - h_F) R + O; percentiles come from the branch
    distribution, never from averaging.
    """
    from kvtrace.analyses.estimate import latency

    check_paths({}, None, json_out)
    r = latency(h_dram, h_flash, dram_ms, flash_ms, recompute_ms, overhead_ms)
    if json_out == "-":
        write_json("-", r.to_dict())
        return
    ms = present.milliseconds
    t = Table(title="reusable-prefix service time per option")
    for h in ("option", "mean", "P50", "P90", "P99", "P99.9"):
        t.add_column(h, justify="left" if h == "option" else "right")
    for o in r.options:
        t.add_row(o["option"], ms(o["service_time_mean_ms"]), ms(o["service_time_p50_ms"]),
                  ms(o["service_time_p90_ms"]), ms(o["service_time_p99_ms"]), ms(o["service_time_p999_ms"]))
    console.print(t)
    b = Table(title="branches (each a point mass at its time)")
    for h in ("option", "branch", "share", "time"):
        b.add_column(h, justify="left" if h in ("option", "branch") else "right")
    for row in r.branches:
        b.add_row(row["option"], row["branch"], f"{row['share']:.4g}", ms(row["time_ms"]))
    console.print(b)
    be = "none (h_F = 0)" if r.h_flash == 0 else ms(r.break_even_restore_ms)
    console.print(f"break-even flash latency: F < {be}; F = {flash_ms:g} ms "
                  f"{'pays off' if r.flash_pays_off else 'does not pay off'} on average", markup=False)
    _print_explain(r.explain)
    if json_out:
        write_json(json_out, r.to_dict())
        report_written((("json", json_out),))


@estimate_app.command("cost")
@handles_errors
def estimate_cost(
    hardware: Optional[float] = typer.Option(None, "--hardware", help="Hardware budget of the current option, $."),
    months: float = typer.Option(36.0, "--months", help="Amortisation, months (straight line, zero residual)."),
    support: float = typer.Option(0.0, "--support", help="Software support of the current option, $ per month."),
    kw: float = typer.Option(0.0, "--kw", help="Power of the current option, kW."),
    kwh_price: float = typer.Option(0.12, "--kwh-price", help="Electricity, $ per kWh."),
    reserve: float = typer.Option(0.0, "--reserve", help="Replacement reserve of the current option, $ per month."),
    hours_per_month: float = typer.Option(730.0, "--hours-per-month", help="Hours in a month."),
    new_hardware: Optional[float] = typer.Option(
        None, "--new-hardware", help="Hardware budget of the proposed option, $ (its months and $/kWh as above)."),
    new_support: float = typer.Option(
        0.0, "--new-support", help="Software support of the proposed option, $ per month."),
    new_kw: float = typer.Option(0.0, "--new-kw", help="Power of the proposed option, kW."),
    new_reserve: float = typer.Option(
        0.0, "--new-reserve", help="Replacement reserve of the proposed option, $ per month."),
    incremental: Optional[float] = typer.Option(
        None, "--incremental", help="Incremental monthly cost of the proposal, $ (instead of --new-*)."),
    gpu_hours: Optional[float] = typer.Option(None, "--gpu-hours", help="GPU-hours the proposal frees per month."),
    requests: Optional[float] = typer.Option(
        None, "--requests", help="Requests per month (with --share and --gpu-seconds instead of --gpu-hours)."),
    share: Optional[float] = typer.Option(None, "--share", help="Share of requests with an extra hit, 0-1."),
    gpu_seconds: Optional[float] = typer.Option(
        None, "--gpu-seconds", help="Prefill GPU-seconds one extra hit avoids."),
    restore_gpu_seconds: float = typer.Option(0.0, "--restore-gpu-seconds", help="GPU-seconds a restore itself costs."),
    gpu_price: Optional[float] = typer.Option(None, "--gpu-price", help="$ per GPU-hour (needed for the value side)."),
    realisation: float = typer.Option(1.0, "--realisation", help="Share of freed GPU time that becomes money, 0-1."),
    json_out: Optional[str] = typer.Option(
        None, "--json", help="Write the figures as JSON to this file ('-' = stdout only)."),
) -> None:
    """Monthly cost of an option, the increment of a proposal, and its value, net and break-even realisation.

    Monthly cost = hardware / months + support + kW x hours x $/kWh + reserve. Value =
    GPU-hours freed x $/GPU-hour; only a realised share of it becomes money.
    """
    from kvtrace.analyses.estimate import cost_benefit, monthly_cost

    check_paths({}, None, json_out)
    common = dict(amortisation_months=months, dollars_per_kwh=kwh_price, hours_per_month=hours_per_month)
    current = None if hardware is None else monthly_cost(
        hardware, support_usd_per_month=support, kw=kw, reserve_usd_per_month=reserve, label="current", **common)
    proposed = None if new_hardware is None else monthly_cost(
        new_hardware, support_usd_per_month=new_support, kw=new_kw, reserve_usd_per_month=new_reserve, label="proposed",
        **common)
    if incremental is not None and proposed is not None:
        raise UsageError("give --incremental or --new-hardware, not both", field="incremental")
    value_side = gpu_hours is not None or requests is not None
    if current is None and proposed is None and incremental is None:
        raise UsageError("nothing to price: give --hardware (and --new-hardware or --incremental)", field="hardware")
    result = None
    if value_side:
        if gpu_price is None:
            raise UsageError("the value side needs --gpu-price ($ per GPU-hour)", field="gpu-price")
        if incremental is not None:
            result = cost_benefit(dollars_per_gpu_hour=gpu_price, realisation=realisation,
                                  incremental_cost_usd_per_month=incremental, gpu_hours=gpu_hours,
                                  requests_per_month=requests, share=share, gpu_seconds_avoided=gpu_seconds,
                                  gpu_seconds_restore=restore_gpu_seconds)
        else:
            result = cost_benefit(dollars_per_gpu_hour=gpu_price, realisation=realisation, current=current,
                                  proposed=proposed, gpu_hours=gpu_hours, requests_per_month=requests, share=share,
                                  gpu_seconds_avoided=gpu_seconds, gpu_seconds_restore=restore_gpu_seconds)
    payload = {"current": current.to_dict() if current else None, "proposed": proposed.to_dict() if proposed else None,
               "benefit": result.to_dict() if result else None}
    if result is None and incremental is None and proposed is not None:
        payload["incremental_cost_usd_per_month"] = (proposed.cost_usd_per_month
                                                     - (current.cost_usd_per_month if current else 0.0))
    if json_out == "-":
        write_json("-", payload)
        return
    t = Table(title="monthly cost and benefit", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    for c in (current, proposed):
        if c is not None:
            t.add_row(f"{c.label}: monthly cost", present.money(c.cost_usd_per_month))
    if result is not None:
        inc = result.incremental_cost_usd_per_month
        t.add_row("incremental cost", present.signed_money(inc))
        t.add_row("GPU-hours freed per month", f"{result.gpu_hours_saved_per_month:,.6g}")
        t.add_row("value per month", present.money(result.value_usd_per_month))
        t.add_row(f"realised at {100 * result.realisation:g} %", present.money(result.realised_value_usd_per_month))
        t.add_row("net per month", present.money(result.net_usd_per_month))
        be = result.break_even_realisation
        t.add_row("break-even realisation", "-" if be is None else f"{100 * be:.1f} %")
        lines = (current.explain if incremental is not None and current is not None else []) + result.explain
    else:
        if "incremental_cost_usd_per_month" in payload:
            inc = payload["incremental_cost_usd_per_month"]
            t.add_row("incremental cost", present.signed_money(inc))
        lines = [line for c in (current, proposed) if c is not None for line in c.explain]
    console.print(t)
    _print_explain(lines)
    if json_out:
        write_json(json_out, payload)
        report_written((("json", json_out),))


@estimate_app.command("bandwidth")
@handles_errors
def estimate_bandwidth(
    rate: float = typer.Option(..., "--rate", help="Request arrivals per second (mean)."),
    share: float = typer.Option(..., "--share", help="Share of requests that read the tier, 0-1."),
    read_bytes: str = typer.Option(..., "--bytes", help="Bytes read per such request, e.g. 8GiB or 1.3GB."),
    peak_rate: Optional[float] = typer.Option(None, "--peak-rate", help="Arrivals per second in the busiest window."),
    tier_bandwidth: Optional[str] = typer.Option(
        None, "--tier-bandwidth", help="What the tier delivers, e.g. 200GiB/s or 80GB/s."),
    restore_bandwidth: Optional[str] = typer.Option(
        None, "--restore-bandwidth", help="Bandwidth one restore gets, e.g. 32GiB/s (gives the transfer floor)."),
    json_out: Optional[str] = typer.Option(
        None, "--json", help="Write the figures as JSON to this file ('-' = stdout only)."),
) -> None:
    """Read bandwidth a tier must serve: arrival rate x share reading it x bytes per read, mean and peak.

    Compared with what the tier delivers; check the busiest window, not only the mean.
    """
    from kvtrace.analyses.estimate import bandwidth, parse_rate
    from kvtrace.units import parse_size

    check_paths({}, None, json_out)
    r = bandwidth(rate, share, parse_size(read_bytes, field="bytes"),
                  tier_bytes_per_s=None if tier_bandwidth is None else parse_rate(tier_bandwidth,
                                                                                  field="tier-bandwidth"),
                  peak_arrival_rate_per_s=peak_rate,
                  restore_bytes_per_s=None if restore_bandwidth is None else parse_rate(restore_bandwidth,
                                                                                       field="restore-bandwidth"))
    if json_out == "-":
        write_json("-", r.to_dict())
        return
    bw = lambda x: "-" if x is None else f"{format_bytes(x)}/s ({x / 1e9:,.4g} GB/s)"  # noqa: E731
    t = Table(title="read bandwidth", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("mean need", bw(r.needed_bytes_per_s))
    if r.peak_needed_bytes_per_s is not None:
        t.add_row("peak need", bw(r.peak_needed_bytes_per_s))
    if r.tier_bytes_per_s is not None:
        t.add_row("tier delivers", bw(r.tier_bytes_per_s))
        t.add_row("mean utilisation", present.rate(r.utilisation))
        if r.peak_utilisation is not None:
            t.add_row("peak utilisation", present.rate(r.peak_utilisation))
        t.add_row("headroom", f"{r.headroom:,.2f}x" + ("" if r.fits else " (does NOT fit)"))
    if r.transfer_floor_ms is not None:
        t.add_row("transfer floor of one read", f"{r.transfer_floor_ms:,.1f} ms")
    console.print(t)
    _print_explain(r.explain)
    if json_out:
        write_json(json_out, r.to_dict())
        report_written((("json", json_out),))
