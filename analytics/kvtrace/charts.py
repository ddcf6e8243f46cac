"""Altair charts of kvtrace results (HTML self-contained; PNG/SVG rendered offline).

Every builder draws whatever its table holds, none included: a trace of zero-length
prompts has no capacity to plot, no flash traffic and no latency. Such a chart is an
empty frame with a note saying why (:func:`no_data_note`), never an error; and every
field is typed (``:Q``, ``:N``), since Altair cannot infer the type of an empty column.
"""

from __future__ import annotations

import os
from pathlib import Path

import altair as alt
import polars as pl

from .errors import UsageError
from .outputs import atomic_path

CURVE_METRICS = {
    "prefix_token_hit_rate": "usable-prefix tokens",
    "request_hit_rate": "requests",
    "compute_saved_rate": "prefill compute saved",
    "block_hit_rate": "any-block blocks",
}
PLOT_FORMATS = ("html", "png", "svg")
#: The note of a capacity-hit curve with fewer than two capacities to draw a line through.
NO_CURVE = "no curve to draw: fewer than two capacities (the trace has few or no block accesses)"


def no_data_note(text: str) -> alt.Chart:
    """A text layer for a chart with nothing to draw, saying why (top left of the frame)."""
    return alt.Chart(pl.DataFrame({"note": [text]})).mark_text(
        align="left", baseline="top", color="gray", fontSize=13).encode(
        x=alt.value(8), y=alt.value(8), text="note:N")


def curve_chart(result, *, metrics=tuple(CURVE_METRICS), marks: dict[str, float] | None = None,
                title: str | None = None) -> alt.LayerChart:
    """Hit-rate curves against capacity (log axis), with the headline's knee capacities.

    Parameters
    ----------
    result : CurveResult
    metrics : sequence of str
        Rate columns to draw.
    marks : dict, optional
        Named capacities in bytes to draw as vertical rules (e.g. DRAM, flash).
    """
    df = result.curve
    cap = df.select(pl.col("capacity_bytes").cast(pl.Float64) / 2**30).to_series().alias("capacity_gib")
    long = (
        df.with_columns(cap)
        .select(["capacity_gib", *metrics])
        .unpivot(index="capacity_gib", variable_name="metric", value_name="rate")
        .with_columns(pl.col("metric").replace_strict(CURVE_METRICS, default=pl.col("metric")))
        .filter(pl.col("capacity_gib") > 0)
    )
    x = alt.X("capacity_gib:Q", scale=alt.Scale(type="log"), title="cache capacity (GiB)")
    lines = (
        alt.Chart(long)
        .mark_line(interpolate="step-after")
        .encode(x=x, y=alt.Y("rate:Q", title="hit rate", scale=alt.Scale(domain=[0, 1])),
                color=alt.Color("metric:N", title=None), tooltip=["metric:N", "capacity_gib:Q", "rate:Q"])
    )
    layers = [lines]
    if long.drop_nulls("rate")["capacity_gib"].n_unique() < 2:  # a line needs two capacities
        layers.append(no_data_note(NO_CURVE))
    knees = result.knees.filter(pl.col("metric") == "prefix_token_hit_rate").drop_nulls("capacity_bytes")
    if knees.height:
        kd = knees.with_columns(
            (pl.col("capacity_bytes").cast(pl.Float64) / 2**30).alias("capacity_gib"),
            (pl.col("fraction") * 100).round(0).cast(pl.Int64).cast(pl.String).alias("label"),
        ).with_columns((pl.col("label") + "% of ceiling").alias("label"))
        layers.append(
            alt.Chart(kd)
            .mark_point(shape="diamond", size=60, filled=True, color="black")
            .encode(x="capacity_gib:Q", y="target_rate:Q",
                    tooltip=["label:N", "capacity_gib:Q", "target_rate:Q"])
        )
    ceiling = result.ceiling.get("prefix_token_hit_rate")
    if ceiling is not None:
        layers.append(
            alt.Chart(pl.DataFrame({"rate": [ceiling], "label": ["ceiling (infinite cache)"]}))
            .mark_rule(strokeDash=[4, 4], color="gray")
            .encode(y="rate:Q")
        )
    for name, value in (marks or {}).items():
        layers.append(
            alt.Chart(pl.DataFrame({"capacity_gib": [value / 2**30], "tier": [name]}))
            .mark_rule(color="firebrick")
            .encode(x="capacity_gib:Q", tooltip=["tier:N", "capacity_gib:Q"])
        )
    info = result.info
    subtitle = f"{info.get('model')} ({info.get('kv_bytes_per_token'):,} B/token), {info.get('eviction')} LRU"
    if result.approximate:
        subtitle += f", SHARDS sample rate {info['sample_rate']:g} (approximate)"
    return alt.layer(*layers).properties(
        width=640, height=360, title=alt.TitleParams(title or "KV-cache capacity-hit curve", subtitle=subtitle)
    )


def save_chart(chart: alt.TopLevelMixin, path: str | os.PathLike) -> None:
    """Save a chart atomically as HTML (self-contained, works offline), PNG or SVG."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in PLOT_FORMATS:
        found = f"suffix '.{fmt}'" if fmt else "no suffix"
        raise UsageError(f"unsupported plot file ({found}): expected .html, .png or .svg", path=str(path))
    import vl_convert as vlc

    spec = chart.to_json()
    with atomic_path(path) as tmp:
        if fmt == "html":
            tmp.write_text(vlc.vegalite_to_html(spec, bundle=True), encoding="utf-8")
        elif fmt == "png":
            tmp.write_bytes(vlc.vegalite_to_png(spec, scale=2))
        else:
            tmp.write_text(vlc.vegalite_to_svg(spec), encoding="utf-8")


def frontier_chart(table) -> alt.LayerChart:
    """What-if frontier: flash hit share (usable-prefix tokens) against flash bytes
    written per day, one point per configuration."""
    df = table.with_columns(
        ((pl.col("h_flash_token").fill_null(0.0) + pl.col("h_local_token").fill_null(0.0))).alias("flash_share"),
        ((pl.col("flash_write_bytes_per_day").fill_null(0.0) + pl.col("local_write_bytes_per_day").fill_null(0.0))
         / 2**40).alias("writes_tib_per_day"),
        pl.col("config").cast(pl.String),
    ).select("config", "flash_share", "writes_tib_per_day", "hit_rate_compute")
    points = alt.Chart(df).mark_point(filled=True, size=80).encode(
        x=alt.X("writes_tib_per_day:Q", title="flash writes (TiB/day)"),
        y=alt.Y("flash_share:Q", title="share of prompt tokens served from flash", axis=alt.Axis(format="%")),
        color=alt.Color("config:N", title=None),
        tooltip=["config:N", "flash_share:Q", "writes_tib_per_day:Q", "hit_rate_compute:Q"],
    )
    layers = [points]
    if df.height == 0:
        layers.append(no_data_note("no configuration to draw"))
    return alt.layer(*layers).properties(width=640, height=360, title="Flash admission frontier: gain vs wear")


def sizing_curve_chart(result) -> alt.LayerChart:
    """The capacity-hit curve of a sizing run with today's and the recommended
    capacities marked (all nodes and tiers pooled, bytes on a log axis).

    Parameters
    ----------
    result : kvtrace.sizing.SizingResult
    """
    base = curve_chart(result.curve, metrics=("prefix_token_hit_rate", "compute_saved_rate"),
                       title="Capacity-hit curve with today's and the recommended capacities")
    fig = result.recommendation.figures
    nodes = result.config.nodes
    marks = [("today: DRAM", result.config.current_dram_bytes * nodes)]
    if fig.get("dram_bytes"):
        marks.append(("recommended: DRAM", fig["dram_bytes"] * nodes))
    if fig.get("flash_bytes") or fig.get("local_ssd_bytes"):
        marks.append(("recommended: all tiers", fig["total_bytes"]))
    data = pl.DataFrame({"label": [m[0] for m in marks],
                         "capacity_gib": [float(m[1]) / 2**30 for m in marks]}).filter(pl.col("capacity_gib") > 0)
    rules = alt.Chart(data).mark_rule(strokeWidth=2).encode(
        x="capacity_gib:Q", color=alt.Color("label:N", title="marked", scale=alt.Scale(scheme="dark2")),
        tooltip=["label:N", "capacity_gib:Q"])
    return alt.layer(*base.layer, rules).resolve_scale(color="independent").properties(
        width=640, height=360, title=base.title)


def cost_slo_chart(result) -> alt.LayerChart:
    """Monthly cost against the SLO metric (P99, or the mean when only a mean target is
    set) of every configuration the sizing search evaluated, with the cost-latency
    frontier, the SLO target and the replayed same-SLO candidates.

    Parameters
    ----------
    result : kvtrace.sizing.SizingResult
    """
    cfg = result.config
    metric, target = ("p99_ms", cfg.slo_p99_ms) if cfg.slo_p99_ms is not None else ("mean_ms", cfg.slo_mean_ms)
    label = "P99" if metric == "p99_ms" else "mean"
    pts = result.search.select("candidate", "monthly_cost_usd", metric, "total_bytes", "within_limits").drop_nulls(
        metric).filter(pl.col(metric) > 0).with_columns(
        (pl.col("total_bytes").cast(pl.Float64) / 2**30).alias("total_gib"))
    front = pts.filter(pl.col("within_limits")).sort("monthly_cost_usd", metric)
    keep, best = [], float("inf")
    for c, v in zip(front["monthly_cost_usd"], front[metric]):
        keep.append(v < best)
        best = min(best, v)
    front = front.filter(pl.Series(keep))
    x = alt.X("monthly_cost_usd:Q", title="monthly cost of the configuration ($)", scale=alt.Scale(type="symlog"))
    y = alt.Y(f"{metric}:Q", title=f"{label} reusable-prefix time (ms)", scale=alt.Scale(type="log"))
    layers = [
        alt.Chart(pts).mark_point(opacity=0.35, size=30).encode(
            x=x, y=y, color=alt.Color("candidate:N", title="candidate"),
            shape=alt.Shape("within_limits:N", title="within bandwidth and endurance"),
            tooltip=["candidate:N", "monthly_cost_usd:Q", f"{metric}:Q", "total_gib:Q", "within_limits:N"]),
        alt.Chart(front).mark_line(interpolate="step-after", color="gray", strokeDash=[2, 2]).encode(x=x, y=y),
    ]
    if target is not None:
        layers.append(alt.Chart(pl.DataFrame({"target": [float(target)], "label": [f"SLO {label}"]}))
                      .mark_rule(color="firebrick", strokeDash=[6, 3]).encode(y="target:Q", tooltip=["label:N"]))
    conf = result.candidates.filter((pl.col("lens") == "same-slo") & pl.col("config").is_not_null()).select(
        "candidate", "config", "policy", "monthly_cost_usd", metric, "feasible").filter(pl.col(metric) > 0)
    layers.append(alt.Chart(conf).mark_point(size=140, filled=True, shape="diamond").encode(
        x=x, y=y, color=alt.Color("candidate:N"), stroke=alt.value("black"),
        tooltip=["candidate:N", "config:N", "policy:N", "monthly_cost_usd:Q", f"{metric}:Q", "feasible:N"]))
    rec = result.recommendation
    if rec.figures.get(metric):
        star = pl.DataFrame({"monthly_cost_usd": [rec.figures["monthly_cost_usd"]], metric: [rec.figures[metric]],
                             "label": [f"recommended: {rec.candidate}"]})
        layers.append(alt.Chart(star).mark_point(shape="cross", size=400, color="black", strokeWidth=2).encode(
            x=x, y=y, tooltip=["label:N", "monthly_cost_usd:Q", f"{metric}:Q"]))
    if pts.height == 0 and conf.height == 0:
        layers.append(no_data_note(f"no configuration has a {label} reusable-prefix time above 0 ms to draw"))
    return alt.layer(*layers).properties(
        width=640, height=360,
        title=alt.TitleParams("Cost against the SLO metric", subtitle="small points: search estimates (admit-all); "
                              "diamonds: replayed same-SLO candidates; dashed: cost-latency frontier within "
                              "bandwidth and endurance"))
