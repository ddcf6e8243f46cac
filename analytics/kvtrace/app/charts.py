"""Altair charts of the dashboard, drawn from kvtrace result tables (no figures of
their own). The what-if frontier is :func:`kvtrace.results.charts.frontier_chart`, the chart
``kvtrace whatif --plot`` writes. As there, an empty table gives an empty frame with a
note (:func:`kvtrace.results.charts.no_data_note`), and every field is typed."""

from __future__ import annotations

import altair as alt
import polars as pl

from kvtrace.results.charts import capacity_layers, no_data_note

HEIGHT = 300


def arrivals(df: pl.DataFrame) -> alt.LayerChart:
    """Requests per minute of trace time, with the mean."""
    bars = alt.Chart(df).mark_area(interpolate="step-after", opacity=0.7).encode(
        x=alt.X("minute:Q", title="minutes from the first arrival"),
        y=alt.Y("requests:Q", title="requests per minute"),
        tooltip=["minute:Q", "requests:Q"],
    )
    mean = alt.Chart(df).mark_rule(strokeDash=[4, 4], color="gray").encode(y="mean(requests):Q")
    layers = [bars, mean] + ([no_data_note("no requests")] if df.height == 0 else [])
    return alt.layer(*layers).properties(width="container", height=HEIGHT, title="Arrivals over time")


def log_histogram(df: pl.DataFrame, *, x_title: str, y_title: str, title: str, unit: str,
                  empty: str = "no values") -> alt.LayerChart:
    """Bars over ``[bin_lo, bin_hi)`` on a log axis; a ``[0, x)`` first bin is drawn
    from x/2 (a log axis has no 0) and labelled ``< x``. ``empty``: the note of a chart
    without bins."""
    d = df.with_columns(
        pl.when(pl.col("bin_lo") > 0).then(pl.col("bin_lo")).otherwise(pl.col("bin_hi") / 2).alias("x0"),
        pl.when(pl.col("bin_lo") > 0)
        .then(pl.format("{} to {} " + unit, pl.col("bin_lo").round_sig_figs(3), pl.col("bin_hi").round_sig_figs(3)))
        .otherwise(pl.format("< {} " + unit, pl.col("bin_hi"))).alias("range"),
    )
    bars = alt.Chart(d).mark_rect(stroke="white", strokeWidth=0.5).encode(
        x=alt.X("x0:Q", scale=alt.Scale(type="log"), title=x_title, axis=alt.Axis(tickCount=8)),
        x2="bin_hi:Q",
        y=alt.Y("count:Q", title=y_title),
        y2=alt.datum(0),
        tooltip=["range:N", "count:Q"],
    )
    layers = [bars] + ([no_data_note(empty)] if d.height == 0 else [])
    return alt.layer(*layers).properties(width="container", height=HEIGHT, title=title)


def curve(lines: pl.DataFrame, knees: pl.DataFrame, ceiling: float | None, marks: dict[str, int],
          metric_label: str, subtitle: str) -> alt.LayerChart:
    """Hit-rate lines (one per group) on a log capacity axis in binary units, with the
    ceiling, the knees, the tier capacities and, for a sampled curve, a +-2
    standard-error band: the layers of ``kvtrace curve --plot``
    (:func:`kvtrace.results.charts.capacity_layers`)."""
    layers = capacity_layers(lines.rename({"group_name": "series"}), knees=knees, ceiling=ceiling, marks=marks,
                             y_title=f"hit rate: {metric_label}", series_title="group",
                             of=" of all" if lines["group_name"].n_unique() > 1 else "")
    return alt.layer(*layers).properties(
        width="container", height=420, title=alt.TitleParams("KV-cache capacity-hit curve", subtitle=subtitle))


def latency(df: pl.DataFrame) -> alt.LayerChart:
    """Reusable-prefix service-time percentiles per configuration (ms, log axis): one
    row per configuration, a dot per percentile on a line from p50 to p99.9."""
    d = df.filter(pl.col("ms") > 0)
    order = d["config"].unique(maintain_order=True).to_list()
    y = alt.Y("config:N", sort=order, title=None, axis=alt.Axis(labelLimit=0))
    x = alt.X("ms:Q", scale=alt.Scale(type="log"), title="reusable-prefix service time per request (ms, log)")
    span = alt.Chart(d).mark_rule(color="lightgray", strokeWidth=2).encode(y=y, x="min(ms):Q", x2="max(ms):Q")
    dots = alt.Chart(d).mark_point(filled=True, size=90).encode(
        y=y, x=x,
        color=alt.Color("percentile:N", sort=["p50", "p90", "p99", "p99.9"], title="percentile",
                        scale=alt.Scale(scheme="viridis")),
        tooltip=["config:N", "percentile:N", alt.Tooltip("ms:Q", format=",.1f")],
    )
    layers = [span, dots]
    if d.height == 0:
        layers.append(no_data_note("no reusable-prefix service time above 0 ms: nothing to restore or recompute"))
    return alt.layer(*layers).properties(width="container", height=110 + 40 * max(1, len(order)),
                                         title="Latency percentiles")
