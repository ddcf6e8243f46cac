"""How numbers and result tables read on a surface: the formats and presentation tables the CLI
and the dashboard share.

Conventions: a missing value (``None``) reads ``-``; rates and shares are 2-decimal percentages
(``12.34%``); sizes are binary byte units (:func:`kvtrace.units.format_bytes`); durations go
through :func:`kvtrace.units.format_seconds`; money is dollars with cents, a negative amount
``-$868.52``. Functions here return strings or string tables; they never draw.
"""

from __future__ import annotations

import polars as pl

from kvtrace.units import format_bytes, format_seconds

__all__ = [
    "KNEE_HEADS", "WHATIF_HEADS", "bandwidth", "count", "curve_table", "format_bytes", "format_seconds", "knee_table",
    "LOAD_HEADS", "milliseconds", "money", "per_tb", "rate", "signed_money", "plain_dollars", "whatif_rows",
    "load_notes", "load_rows",
]


def rate(x) -> str:
    """A rate or share as a percentage with two decimals: ``0.1234`` -> ``12.34%``."""
    return "-" if x is None else f"{100 * x:.2f}%"


def count(x, digits: int = 3) -> str:
    """A count with thousands separators (``1,234``); a non-integral number to ``digits``
    significant digits below 1000 (``12.3``), else rounded (``12,346``)."""
    if x is None:
        return "-"
    if isinstance(x, int) or float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:,.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"


def money(x) -> str:
    """Dollars with cents: ``$1,234.56``, a negative amount ``-$868.52``."""
    if x is None:
        return "-"
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"


def plain_dollars(x) -> str:
    """Dollars with cents, a negative amount with the sign after the dollar: ``$-0.05``
    (the value and curve tables; elsewhere :func:`money`)."""
    return "-" if x is None else f"${x:,.2f}"


def signed_money(x) -> str:
    """Dollars with an explicit sign: ``+$12.00``, ``-$3.50``."""
    return "-" if x is None else ("+" if x >= 0 else "") + money(x)


def milliseconds(x) -> str:
    """Milliseconds with one decimal: ``181.0 ms``."""
    return "-" if x is None else f"{x:,.1f} ms"


def seconds(x) -> str:
    """Seconds with three decimals: ``1.250 s``."""
    return "-" if x is None else f"{x:,.3f} s"


def bandwidth(bytes_per_s) -> str:
    """A bandwidth in binary byte units per second: ``1.5 GiB/s``."""
    return "-" if bytes_per_s is None else format_bytes(bytes_per_s) + "/s"


def per_tb(dollars_per_byte) -> str:
    """A value density, dollars per byte, as dollars per TB (10**12 bytes): ``1,234.56``."""
    return "-" if dollars_per_byte is None else f"{dollars_per_byte * 1e12:,.2f}"


#: The knee metrics of a capacity-hit curve and their short column heads.
KNEE_HEADS = {"prefix_token_hit_rate": "prefix tokens", "request_hit_rate": "requests",
              "compute_saved_rate": "compute saved"}


def knee_table(knees: pl.DataFrame, metrics=tuple(KNEE_HEADS)) -> pl.DataFrame:
    """The capacity that reaches each share of the ceiling, one row per share.

    Parameters
    ----------
    knees : polars.DataFrame
        A curve's knees (:attr:`kvtrace.analyses.curves.CurveResult.knees`): ``metric``,
        ``fraction``, ``target_rate``, ``capacity_bytes``.
    metrics : sequence of str
        The metrics to pivot into columns, in order.

    Returns
    -------
    polars.DataFrame
        ``share of ceiling`` str (``80%``), then one str column per metric, named by the
        metric: ``64 GiB (41.23%)`` (capacity and the rate it reaches), ``-`` when no
        capacity of the grid reaches the share.
    """
    table: dict[str, list[str]] = {"share of ceiling": []}
    for m in metrics:
        table[m] = []
    for f in sorted(set(knees["fraction"].to_list())):
        table["share of ceiling"].append(f"{100 * f:g}%")
        for m in metrics:
            sel = knees.filter((knees["metric"] == m) & (knees["fraction"] == f))
            cap = sel["capacity_bytes"][0] if sel.height else None
            target = sel["target_rate"][0] if sel.height else None
            table[m].append("-" if cap is None else f"{format_bytes(cap)} ({rate(target)})")
    return pl.DataFrame(table, schema={c: pl.String for c in table})


def curve_table(result) -> pl.DataFrame:
    """The rows of a curve as a file holds them (``kvtrace curve --out`` and ``--json``).

    Without a breakdown, :attr:`~kvtrace.analyses.curves.CurveResult.curve`. With one
    (``by``), ``group_by`` str · ``group_name`` str, then the curve's columns: the overall
    curve as group ``all``, followed by every group's rows.
    """
    if result.by_group is None:
        return result.curve
    return pl.concat([result.curve.insert_column(0, pl.lit("all").alias("group_name")), result.by_group],
                     how="diagonal_relaxed").insert_column(0, pl.lit(result.info["by"]).alias("group_by"))


#: Column heads of :func:`whatif_rows`.
WHATIF_HEADS = ("config", "tiers", "DRAM", "SSD/flash", "miss", "compute saved", "writes/day", "DWPD", "read mean",
                "peak", "promotions", "p50", "p99")


def whatif_rows(table: pl.DataFrame) -> list[tuple[str, ...]]:
    """The what-if comparison as text rows under :data:`WHATIF_HEADS`.

    Each row states its own configuration and only its own tiers' figures: the
    ``SSD/flash`` share, writes and read bandwidth add a row's local SSD and shared
    flash; DWPD and peak read bandwidth list them ``local / flash``.
    """
    from kvtrace.analyses.whatif import tier_share

    rows = []
    pre = {"local_ssd": "local", "flash": "flash"}
    for r in table.iter_rows(named=True):
        tiers = [(k, r.get(f"{k}_bytes") or 0) for k in ("local_ssd", "flash")]
        own = [k for k, b in tiers if b]
        many = (r.get("nodes") or 1) > 1
        per_node = "/node" if many else ""
        label = " + ".join([f"DRAM {format_bytes(r['dram_bytes'])}{per_node}"]
                           + [f"local SSD {format_bytes(b)}{per_node}" if k == "local_ssd" else
                              f"shared flash {format_bytes(b)}" for k, b in tiers if b]) + (
            f" x {r['nodes']} nodes" if many else "")
        writes = sum(r.get(f"{pre[k]}_write_bytes_per_day") or 0.0 for k in own)
        dwpd = [r.get(f"{pre[k]}_dwpd") for k in own]
        rows.append((
            str(r["config"]), label, rate(r.get("dram_prefix_token_hit_rate")), rate(tier_share(r)) if own else "-",
            rate(r.get("prefix_token_miss_rate")), rate(r.get("compute_saved_rate")),
            format_bytes(writes) if own else "-",
            " / ".join("-" if d is None else f"{d:.2f}" for d in dwpd) if own else "-",
            bandwidth(sum(r.get(f"{pre[k]}_read_mean_bytes_per_s") or 0.0 for k in own)) if own else "-",
            " / ".join(bandwidth(r.get(f"{pre[k]}_read_peak_bytes_per_s") or 0.0) for k in own) if own else "-",
            f"{r.get('promotions') or 0:,}", milliseconds(r.get("service_time_p50_ms")),
            milliseconds(r.get("service_time_p99_ms")),
        ))
    return rows



LOAD_HEADS = ("config", "load", "arrivals/s", "TTFT mean", "p50", "p99", "p99.9", "SLO met", "goodput/s",
              "bottleneck", "GPU", "host link", "NIC", "flash", "restore")


def load_rows(table: pl.DataFrame) -> list[tuple[str, ...]]:
    """The load table as text rows under :data:`LOAD_HEADS` (utilisations of the
    busiest instance; an overloaded level's figures are those up to the overload)."""
    rows = []
    for r in table.iter_rows(named=True):
        load = f"{r['load_factor']:g}x" if r.get("target_rps") is None else f"{r['target_rps']:g} rps"
        bottleneck = r["bottleneck"] or "-"
        if r["overloaded"]:
            bottleneck = f"{bottleneck} OVERLOADED"
        rows.append((r["config"], load, count(r["arrival_rate_rps"]) if r["arrival_rate_rps"] is not None else "-",
                     milliseconds(r["ttft_mean_ms"]), milliseconds(r["ttft_p50_ms"]), milliseconds(r["ttft_p99_ms"]),
                     milliseconds(r["ttft_p999_ms"]), rate(r["slo_attainment"]),
                     count(r["goodput_rps"]) if r["goodput_rps"] is not None else "-", bottleneck,
                     rate(r["util_gpu"]), rate(r["util_host_link"]), rate(r["util_nic"]), rate(r["util_flash"]),
                     rate(r["restore_share"])))
    return rows


def load_notes(table: pl.DataFrame) -> list[str]:
    """One line per overloaded level, and where each configuration saturates."""
    from kvtrace.analyses.load import RESOURCES, SATURATED

    out = []
    for r in table.iter_rows(named=True):
        if r["overloaded"]:
            out.append(f"{r['config']} at {r['load_factor']:g}x: overloaded: {r['overload_resource']} at 100 % "
                       f"from t = {r['overload_from_s']:.3f} s, queue grows without bound (stopped at "
                       f"t = {r['overload_at_s']:.3f} s; figures up to then, unfinished requests miss the SLO)")
    for cfg in table["config"].unique(maintain_order=True).to_list():
        sub = table.filter(pl.col("config") == cfg).sort("load_factor")
        for r in sub.iter_rows(named=True):
            hot = [(res, r[f"util_{res}"]) for res in RESOURCES if r.get(f"util_{res}") is not None]
            hot = [h for h in hot if h[1] >= SATURATED]
            if r["overloaded"] or hot:
                res = r["overload_resource"] or max(hot, key=lambda h: h[1])[0]
                out.append(f"{cfg}: {res} saturates first, at {r['load_factor']:g}x "
                           f"({count(r['arrival_rate_rps'])} requests/s)")
                break
        else:
            last = sub.row(-1, named=True)
            busiest = last["bottleneck"]
            util = last.get(f"util_{busiest}") if busiest else None
            out.append(f"{cfg}: no resource saturates up to {last['load_factor']:g}x; the busiest is "
                       f"{busiest or '-'} at {rate(util)}")
    return out
