"""Altair charts of kvtrace results (HTML self-contained; PNG/SVG rendered offline).

Every builder draws whatever its table holds, none included: a trace of zero-length
prompts has no capacity to plot, no flash traffic and no latency. Such a chart is an
empty frame with a note saying why (:func:`no_data_note`), never an error; and every
field is typed (``:Q``, ``:N``), since Altair cannot infer the type of an empty column.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import altair as alt
import polars as pl

from kvtrace.analyses.whatif import tier_share
from kvtrace.errors import UsageError, require_extra
from kvtrace.names import label
from kvtrace.outputs import atomic_path
from kvtrace.results.chart_data import knee_points
from kvtrace.units import format_bytes

#: Rate columns :func:`curve_chart` draws, under their labels (:data:`kvtrace.names.LABELS`).
CURVE_METRICS = {m: label(m) for m in ("prefix_token_hit_rate", "request_hit_rate", "token_hit_rate",
                                       "compute_saved_rate")}
#: The rate a breakdown (``--by``), the knees and the ceiling are drawn for (the headline).
HEADLINE = "prefix_token_hit_rate"
PLOT_FORMATS = ("html", "png", "svg")
#: The note of a capacity-hit curve with fewer than two capacities to draw a line through.
NO_CURVE = "no curve to draw: fewer than two capacities (the trace has few or no block accesses)"
#: A curve table is dense, and drawn as a line, when no two neighbouring capacities are
#: more than this ratio apart (the default grid of ~200 log-spaced points is ~1.05 apart).
DENSE_RATIO = 1.25
_UNITS = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))


def no_data_note(text: str) -> alt.Chart:
    """A text layer for a chart with nothing to draw, saying why (top left of the frame)."""
    return alt.Chart(pl.DataFrame({"note": [text]})).mark_text(
        align="left", baseline="top", color="gray", fontSize=13).encode(
        x=alt.value(8), y=alt.value(8), text="note:N")


def is_dense(capacities_bytes) -> bool:
    """Whether a curve's capacities are close enough for a line between them to be the
    curve: at least two positive ones, no neighbours more than :data:`DENSE_RATIO` apart.

    Between two capacities the exact curve (a non-decreasing step function: a hit needs
    ``distance <= capacity``) lies between their two rates; on a dense grid any line
    joining them is within one grid step of it. On a sparse grid (``--capacity
    64GiB,1TiB``) it is not, and the chart draws the points alone.
    """
    c = sorted({float(x) for x in capacities_bytes if x is not None and x > 0})
    return len(c) >= 2 and all(b / a <= DENSE_RATIO for a, b in zip(c, c[1:]))


def byte_label_expr(field: str = "datum.value") -> str:
    """A Vega expression writing a byte count in binary units (``512 GiB``, ``4 TiB``)."""
    expr = f"format({field}, ',.3~g') + ' B'"
    for unit, size in reversed(_UNITS):
        expr = f"{field} >= {size} ? format({field} / {size}, ',.3~g') + ' {unit}' : {expr}"
    return expr


def capacity_x(lo_bytes: float, hi_bytes: float, *, title: str = "cache capacity (log scale)") -> alt.X:
    """A log capacity axis in bytes with ticks at powers of two labelled in binary units
    (GiB up to 512 GiB, then TiB), spanning ``[lo_bytes, hi_bytes]``."""
    lo = max(1.0, float(lo_bytes or 1))
    hi = max(lo * 2, float(hi_bytes or 2))
    a, b = math.floor(math.log2(lo)), math.ceil(math.log2(hi))
    step = max(1, math.ceil((b - a) / 10))  # at most ~10 labels
    values = [2.0**e for e in range(a, b + 1, step)]
    return alt.X("capacity_bytes:Q", title=title,
                 scale=alt.Scale(type="log", base=2, domain=[2.0**a, 2.0**b], nice=False),
                 axis=alt.Axis(values=values, labelExpr=byte_label_expr(), grid=True))


def capacity_layers(lines: pl.DataFrame, *, knees: pl.DataFrame | None = None, ceiling: float | None = None,
                    marks: dict[str, int] | None = None, y_title: str = "hit rate",
                    series_title: str | None = None, of: str = "", span_bytes=()) -> list:
    """The layers of a capacity-hit chart (the CLI's, the sizing report's and the dashboard's).

    Parameters
    ----------
    lines : polars.DataFrame
        ``series`` str (legend name) · ``capacity_bytes`` int · ``rate`` float, and
        optionally ``se`` (standard error of a sampled rate: a +-2 se band is drawn).
    knees : polars.DataFrame, optional
        ``capacity_bytes`` · ``target_rate`` · ``label``: exact knee capacities (diamonds).
    ceiling : float, optional
        Hit rate of an infinite cache (dashed rule).
    marks : dict, optional
        Name -> capacity in bytes (vertical rules with their names).
    of : str
        The series the knees and the ceiling belong to, for their legend entries.
    span_bytes : sequence of int
        More capacities the axis must show (marks drawn by another layer).

    Each series is a line through its capacities when they are dense
    (:func:`is_dense`, the default grid), and its points alone otherwise: a line
    between two far-apart capacities would draw a curve that is not the data.
    """
    lines = lines.filter(pl.col("capacity_bytes") > 0).with_columns(
        pl.col("capacity_bytes").cast(pl.Float64), pl.col("rate").cast(pl.Float64),
        pl.col("capacity_bytes").map_elements(format_bytes, return_dtype=pl.String).alias("capacity"))
    knees = knees if knees is not None and knees.height else None
    marks = {k: v for k, v in (marks or {}).items() if v and v > 0}
    span = [*lines["capacity_bytes"].to_list(), *marks.values(), *(float(v) for v in span_bytes if v and v > 0),
            *([] if knees is None else knees["capacity_bytes"].to_list())]
    x = capacity_x(min(span, default=2**30), max(span, default=2**40))
    y = alt.Y("rate:Q", title=y_title, scale=alt.Scale(domain=[0, 1]), axis=alt.Axis(format="%"))
    order = lines["series"].unique(maintain_order=True).to_list()
    color = alt.Color("series:N", title=series_title, sort=order, scale=alt.Scale(scheme="tableau10"),
                      legend=alt.Legend(labelLimit=0, symbolStrokeWidth=3, orient="bottom", direction="horizontal"))
    tooltip = ["series:N", "capacity:N", alt.Tooltip("rate:Q", format=".2%")]
    layers = []
    dense = all(is_dense(g["capacity_bytes"]) for g in lines.drop_nulls("rate").partition_by("series")) \
        if lines.height else False
    if "se" in lines.columns and lines["se"].drop_nulls().len():
        band = lines.drop_nulls("se").with_columns((pl.col("rate") - 2 * pl.col("se")).clip(0, 1).alias("lo"),
                                                   (pl.col("rate") + 2 * pl.col("se")).clip(0, 1).alias("hi"))
        mark = alt.Chart(band).mark_area(opacity=0.2) if dense else alt.Chart(band).mark_rule(strokeWidth=2)
        layers.append(mark.encode(x=x, y="lo:Q", y2="hi:Q", color=alt.Color("series:N", sort=order, legend=None)))
    base = alt.Chart(lines)
    drawn = base.mark_line(strokeWidth=2.5) if dense else base.mark_point(filled=True, size=90, opacity=1)
    layers.append(drawn.encode(x=x, y=y, color=color, tooltip=tooltip))
    if lines.drop_nulls("rate")["capacity_bytes"].n_unique() < 2:  # a curve needs two capacities
        layers.append(no_data_note(NO_CURVE))
    if ceiling is not None:
        what = f"ceiling{of} (infinite cache): {100 * ceiling:.2f}%"
        c = pl.DataFrame({"rate": [float(ceiling)], "what": [what]})
        layers.append(alt.Chart(c).mark_rule(color="gray", strokeWidth=1.5).encode(
            y="rate:Q", tooltip=["what:N"],
            strokeDash=alt.StrokeDash("what:N", title=None, scale=alt.Scale(domain=[what], range=[[6, 4]]),
                                      legend=alt.Legend(labelLimit=0, symbolStrokeColor="gray", orient="bottom"))))
    if knees is not None:
        shares = ", ".join(knees["label"].str.replace(" of ceiling", "").to_list())
        what = f"knees{of}: capacity reaching {shares} of the ceiling"
        kd = knees.with_columns(pl.lit(what).alias("what"), pl.col("capacity_bytes").cast(pl.Float64),
                                pl.col("capacity_bytes").map_elements(format_bytes, return_dtype=pl.String)
                                .alias("capacity"))
        layers.append(alt.Chart(kd).mark_point(filled=True, size=110, color="black", opacity=1).encode(
            x="capacity_bytes:Q", y="target_rate:Q",
            shape=alt.Shape("what:N", title=None, scale=alt.Scale(domain=[what], range=["diamond"]),
                            legend=alt.Legend(labelLimit=0, symbolFillColor="black", symbolStrokeColor="black",
                                               orient="bottom")),
            tooltip=["label:N", "capacity:N", alt.Tooltip("target_rate:Q", format=".2%")]))
    if marks:
        m = pl.DataFrame({"tier": list(marks), "capacity_bytes": [float(v) for v in marks.values()],
                          "capacity": [format_bytes(v) for v in marks.values()]})
        layers.append(alt.Chart(m).mark_rule(color="firebrick", strokeWidth=2).encode(
            x="capacity_bytes:Q", tooltip=["tier:N", "capacity:N"]))
        layers.append(alt.Chart(m).mark_text(align="right", dx=-4, dy=-6, color="firebrick", fontWeight="bold").encode(
            x="capacity_bytes:Q", y=alt.value(12), text="tier:N"))
    return layers


def curve_lines(result, metrics=tuple(CURVE_METRICS)) -> tuple[pl.DataFrame, str]:
    """The series :func:`curve_chart` draws and their legend title: one per metric, or,
    for a curve broken down by group (``--by``), one per group of the headline rate
    (``all`` first)."""
    cols = ["capacity_bytes", *(["prefix_token_hit_rate_se"] if "prefix_token_hit_rate_se" in result.curve.columns
                                else [])]
    if result.by_group is not None:
        frames = [result.curve.with_columns(pl.lit("all").alias("group_name")), result.by_group]
        lines = pl.concat([f.select(pl.col("group_name").cast(pl.String).alias("series"), "capacity_bytes",
                                    pl.col(HEADLINE).cast(pl.Float64).alias("rate")) for f in frames])
        return lines, f"{CURVE_METRICS[HEADLINE]}, by {result.info.get('by', 'group')}"
    long = (result.curve.select([*cols, *metrics])
            .unpivot(index=cols, on=list(metrics), variable_name="series", value_name="rate")
            .with_columns(pl.col("series").replace_strict(CURVE_METRICS, default=pl.col("series")),
                          pl.col("rate").cast(pl.Float64)))
    if "prefix_token_hit_rate_se" in cols:  # the band is the headline's
        long = long.with_columns(pl.when(pl.col("series") == CURVE_METRICS[HEADLINE])
                                 .then(pl.col("prefix_token_hit_rate_se")).alias("se")).drop("prefix_token_hit_rate_se")
    return long, "metric"


def knee_table(result, metric: str = HEADLINE) -> pl.DataFrame:
    """The exact knees of one metric (:func:`kvtrace.results.chart_data.knee_points`):
    ``capacity_bytes``, ``target_rate``, ``label``."""
    return knee_points(result, metric).select("capacity_bytes", "target_rate", "label")


def curve_chart(result, *, metrics=tuple(CURVE_METRICS), marks: dict[str, float] | None = None,
                title: str | None = None) -> alt.LayerChart:
    """Hit-rate curves against capacity (log axis in binary units), with the exact knee
    capacities of the headline rate (diamonds) and its ceiling (dashed).

    One series per metric, named as in ``kvtrace curve``'s table; a curve broken down
    by group (``--by``) draws the headline rate (prefix tokens) once per group and
    for ``all``. A dense capacity grid (the default, :func:`is_dense`) is drawn as
    lines; a sparse one (``--capacity 64GiB,1TiB``) as its points only, since a line
    between them would not be the curve.

    Parameters
    ----------
    result : CurveResult
    metrics : sequence of str
        Rate columns to draw (without a breakdown).
    marks : dict, optional
        Named capacities in bytes to draw as vertical rules (e.g. DRAM, flash).
    """
    lines, series_title = curve_lines(result, metrics)
    layers = capacity_layers(lines, knees=knee_table(result), ceiling=result.ceiling.get(HEADLINE), marks=marks,
                             series_title=series_title,
                             of=f" of {'all' if result.by_group is not None else CURVE_METRICS[HEADLINE]}")
    info = result.info
    subtitle = f"{info.get('model')} ({info.get('kv_bytes_per_token'):,} B/token), {info.get('eviction')} LRU"
    if result.approximate:
        subtitle += f", SHARDS sample rate {info['sample_rate']:g} (approximate)"
    if not is_dense(result.curve["capacity_bytes"]) and result.curve.height:
        subtitle += "; points: the capacities asked for"
    return alt.layer(*layers).properties(
        width=640, height=360, title=alt.TitleParams(title or "KV-cache capacity-hit curve", subtitle=subtitle)
    )


def save_chart(chart: alt.TopLevelMixin, path: str | os.PathLike) -> None:
    """Save a chart atomically as HTML (self-contained, works offline), PNG or SVG."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in PLOT_FORMATS:
        found = f"suffix '.{fmt}'" if fmt else "no suffix"
        raise UsageError(f"unsupported plot file ({found}): expected .html, .png or .svg", path=str(path))
    vlc = require_extra("vl_convert", "png", package="vl-convert-python", what="writing a chart file")
    spec = chart.to_json()
    with atomic_path(path) as tmp:
        if fmt == "html":
            tmp.write_text(vlc.vegalite_to_html(spec, bundle=True), encoding="utf-8")
        elif fmt == "png":
            tmp.write_bytes(vlc.vegalite_to_png(spec, scale=2))
        else:
            tmp.write_text(vlc.vegalite_to_svg(spec), encoding="utf-8")


def pareto_front(x, y) -> list[bool]:
    """Which points are not dominated when a lower ``x`` and a higher ``y`` are better:
    no other point has ``x' <= x`` and ``y' >= y`` with one of them strict."""
    n = len(x)  # a what-if grid has at most a few dozen configurations: the definition, directly
    return [not any(x[j] <= x[i] and y[j] >= y[i] and (x[j] < x[i] or y[j] > y[i]) for j in range(n))
            for i in range(n)]


def _rate_unit(max_bytes: float) -> tuple[str, int]:
    """The binary unit a byte axis reads best in (its largest value >= 1 of it)."""
    return next(((u, n) for u, n in _UNITS if max_bytes >= n), ("B", 1))


def frontier_chart(table) -> alt.LayerChart:
    """What-if frontier: flash hit share (usable-prefix tokens served from local SSD or
    shared flash) against flash bytes written per day, one point per configuration,
    coloured by admission policy, shaped by flash size, sized by DRAM size, with the
    Pareto frontier: the configurations no other one beats on both (fewer bytes
    written per day and a share at least as high)."""
    df = table.with_columns(
        pl.Series("flash_share", [tier_share(r) for r in table.iter_rows(named=True)], dtype=pl.Float64),
        (pl.col("flash_write_bytes_per_day").fill_null(0.0) + pl.col("local_write_bytes_per_day").fill_null(0.0))
        .alias("writes"),
        (pl.col("flash_bytes").fill_null(0) + pl.col("local_ssd_bytes").fill_null(0)).alias("flash_total"),
        pl.col("config").cast(pl.String), pl.col("policy").cast(pl.String).fill_null("-"),
    )
    unit, size = _rate_unit(df["writes"].max() or 0.0)
    df = df.with_columns(
        (pl.col("writes") / size).alias("writes_per_day"),
        pl.col("flash_total").map_elements(format_bytes, return_dtype=pl.String).alias("flash"),
        pl.col("dram_bytes").map_elements(format_bytes, return_dtype=pl.String).alias("DRAM"),
    ).sort("flash_total", "dram_bytes")
    df = df.with_columns(pl.Series("pareto", pareto_front(df["writes"].to_list(), df["flash_share"].to_list()),
                                   dtype=pl.Boolean)).select(
        "config", "policy", "flash", "DRAM", "flash_share", "writes_per_day", "compute_saved_rate", "pareto",
        "flash_total", "dram_bytes")
    flash_order = df["flash"].unique(maintain_order=True).to_list()
    dram_order = df.sort("dram_bytes")["DRAM"].unique(maintain_order=True).to_list()
    x = alt.X("writes_per_day:Q", title=f"bytes written to flash per day ({unit}/day; lower wears less)")
    y = alt.Y("flash_share:Q", title="share of prompt tokens served from flash (higher is better)",
              axis=alt.Axis(format="%"))
    tooltip = ["config:N", alt.Tooltip("flash_share:Q", format=".2%", title="flash share"),
               alt.Tooltip("writes_per_day:Q", format=",.3~g", title=f"{unit}/day"),
               alt.Tooltip("compute_saved_rate:Q", format=".2%", title="compute saved"), "pareto:N"]
    front = df.filter(pl.col("pareto")).sort("writes_per_day").with_columns(
        pl.lit("Pareto frontier: no configuration writes less for as high a share").alias("what"))
    layers = [
        alt.Chart(front).mark_line(color="black", strokeWidth=1.5, opacity=0.7).encode(
            x=x, y=y, strokeDash=alt.StrokeDash("what:N", title=None, legend=alt.Legend(
                labelLimit=0, orient="bottom", symbolStrokeColor="black"),
                scale=alt.Scale(range=[[5, 3]]))),
        alt.Chart(df).mark_point(filled=False, strokeWidth=2.5, opacity=0.9).encode(
            x=x, y=y,
            color=alt.Color("policy:N", title="admission policy", scale=alt.Scale(scheme="tableau10"),
                            legend=alt.Legend(labelLimit=0, orient="bottom", direction="horizontal")),
            shape=alt.Shape("flash:N", title="flash", sort=flash_order,
                            legend=alt.Legend(orient="bottom", direction="horizontal")),
            size=alt.Size("DRAM:O", title="DRAM", sort=dram_order, scale=alt.Scale(range=[90, 380]),
                          legend=alt.Legend(orient="bottom", direction="horizontal")),
            tooltip=tooltip),
    ]
    if df.height == 0:
        layers.append(no_data_note("no configuration to draw"))
    same = df.height - df.select(pl.col("writes_per_day").round_sig_figs(6), pl.col("flash_share").round(6)) \
        .unique().height
    return alt.layer(*layers).properties(
        width=640, height=360,
        title=alt.TitleParams("Flash admission frontier: gain vs wear",
                              subtitle=f"{df.height} configuration(s); dashed: the Pareto frontier"
                              + (f"; {same} share their point with another (the same result)" if same else "")))


#: Sizing marks and their colours (none of the curves' tableau10 colours).
_SIZING_MARKS = {"today: DRAM": "#555555", "recommended: DRAM": "#d62728", "recommended: all tiers": "#9467bd"}


def sizing_curve_chart(result) -> alt.LayerChart:
    """The capacity-hit curve of a sizing run with today's and the recommended
    capacities marked (all nodes and tiers pooled, bytes on a log axis).

    Parameters
    ----------
    result : kvtrace.analyses.sizing.SizingResult
    """
    fig = result.recommendation.figures
    nodes = result.config.nodes
    marks = [("today: DRAM", result.config.current_dram_bytes * nodes)]
    if fig.get("dram_bytes"):
        marks.append(("recommended: DRAM", fig["dram_bytes"] * nodes))
    if fig.get("flash_bytes") or fig.get("local_ssd_bytes"):
        marks.append(("recommended: all tiers", fig["total_bytes"]))
    data = pl.DataFrame({"label": [m[0] for m in marks],
                         "capacity_bytes": [float(m[1]) for m in marks],
                         "capacity": [format_bytes(m[1]) for m in marks]}).filter(pl.col("capacity_bytes") > 0)
    curve = result.curve
    lines, _ = curve_lines(curve, ("prefix_token_hit_rate", "compute_saved_rate"))
    layers = capacity_layers(lines, knees=knee_table(curve), ceiling=curve.ceiling.get(HEADLINE),
                             series_title="metric", of=f" of {CURVE_METRICS[HEADLINE]}",
                             span_bytes=data["capacity_bytes"].to_list())
    rules = alt.Chart(data).mark_rule(strokeWidth=2.5).encode(
        x="capacity_bytes:Q", tooltip=["label:N", "capacity:N"],
        color=alt.Color("label:N", title="marked", legend=alt.Legend(labelLimit=0, orient="bottom"),
                        sort=list(_SIZING_MARKS),
                        scale=alt.Scale(domain=list(_SIZING_MARKS), range=list(_SIZING_MARKS.values()))))
    info = curve.info
    subtitle = f"{info.get('model')} ({info.get('kv_bytes_per_token'):,} B/token), {info.get('eviction')} LRU"
    return alt.layer(*layers, rules).resolve_scale(color="independent").properties(
        width=640, height=360, title=alt.TitleParams("Capacity-hit curve with today's and the recommended capacities",
                                                     subtitle=subtitle))


def money_ticks(top: float) -> list[float]:
    """Tick values of a symmetric-log money axis from 0 to ``top`` dollars: 0 and the
    1-2-5 steps of every decade from $10 (readable at any width)."""
    ticks, decade = [0.0], 10.0
    while decade <= max(top, 10.0) * 1.001:
        ticks += [v * decade for v in (1, 2, 5) if v * decade <= max(top * 1.05, 10.0)]
        decade *= 10
    return ticks


def cost_slo_chart(result) -> alt.LayerChart:
    """Monthly cost against the SLO metric (P99, or the mean when only a mean target is
    set) of every configuration the sizing search evaluated, with the cost-latency
    frontier, the SLO target and the replayed same-SLO candidates.

    Parameters
    ----------
    result : kvtrace.analyses.sizing.SizingResult
    """
    cfg = result.config
    metric, target = ("service_time_p99_ms",
                      cfg.slo_p99_ms) if cfg.slo_p99_ms is not None else ("service_time_mean_ms", cfg.slo_mean_ms)
    label = "P99" if metric == "service_time_p99_ms" else "mean"
    pts = result.search.select("candidate", "cost_usd_per_month", metric, "total_bytes", "within_limits").drop_nulls(
        metric).filter(pl.col(metric) > 0).with_columns(
        (pl.col("total_bytes").cast(pl.Float64) / 2**30).alias("total_gib"),
        pl.when(pl.col("within_limits")).then(pl.lit("yes")).otherwise(pl.lit("no")).alias("limits"))
    front = pts.filter(pl.col("within_limits")).sort("cost_usd_per_month", metric)
    keep, best = [], float("inf")
    for c, v in zip(front["cost_usd_per_month"], front[metric]):
        keep.append(v < best)
        best = min(best, v)
    front = front.filter(pl.Series(keep))
    costs = [v for v in (*pts["cost_usd_per_month"].to_list(), *result.candidates["cost_usd_per_month"].to_list())
             if v is not None]
    x = alt.X("cost_usd_per_month:Q", title="monthly cost of the configuration ($, symmetric log scale)",
              scale=alt.Scale(type="symlog", constant=10),
              axis=alt.Axis(values=money_ticks(max(costs, default=0.0)), format="$,.0f", labelOverlap=True,
                            labelFlush=False))
    y = alt.Y(f"{metric}:Q", title=f"{label} reusable-prefix time (ms)", scale=alt.Scale(type="log"))
    layers = [
        alt.Chart(pts).mark_point(opacity=0.85, size=40, strokeWidth=1.5).encode(
            x=x, y=y, color=alt.Color("candidate:N", title="candidate", scale=alt.Scale(scheme="tableau10"),
                                      legend=alt.Legend(labelLimit=0)),
            shape=alt.Shape("limits:N", title="within bandwidth and endurance", sort=["yes", "no"],
                            scale=alt.Scale(domain=["yes", "no"], range=["circle", "triangle-down"])),
            tooltip=["candidate:N", "cost_usd_per_month:Q", f"{metric}:Q", "total_gib:Q", "limits:N"]),
        alt.Chart(front).mark_line(interpolate="step-after", color="gray", strokeDash=[2, 2]).encode(x=x, y=y),
    ]
    if target is not None:
        layers.append(alt.Chart(pl.DataFrame({"target": [float(target)], "label": [f"SLO {label}"]}))
                      .mark_rule(color="firebrick", strokeDash=[6, 3]).encode(y="target:Q", tooltip=["label:N"]))
    conf = result.candidates.filter((pl.col("lens") == "same-slo") & pl.col("config").is_not_null()).select(
        "candidate", "config", "policy", "cost_usd_per_month", metric, "feasible").filter(pl.col(metric) > 0)
    layers.append(alt.Chart(conf).mark_point(size=140, filled=True, shape="diamond").encode(
        x=x, y=y, color=alt.Color("candidate:N"), stroke=alt.value("black"),
        tooltip=["candidate:N", "config:N", "policy:N", "cost_usd_per_month:Q", f"{metric}:Q", "feasible:N"]))
    rec = result.recommendation
    if rec.figures.get(metric):
        star = pl.DataFrame({"cost_usd_per_month": [rec.figures["cost_usd_per_month"]], metric: [rec.figures[metric]],
                             "label": [f"recommended: {rec.candidate}"]})
        layers.append(alt.Chart(star).mark_point(shape="cross", size=400, color="black", strokeWidth=2).encode(
            x=x, y=y, tooltip=["label:N", "cost_usd_per_month:Q", f"{metric}:Q"]))
    if pts.height == 0 and conf.height == 0:
        layers.append(no_data_note(f"no configuration has a {label} reusable-prefix time above 0 ms to draw"))
    return alt.layer(*layers).properties(
        width=640, height=360,
        title=alt.TitleParams("Cost against the SLO metric", subtitle="small points: search estimates (admit-all); "
                              "diamonds: replayed same-SLO candidates; dashed: cost-latency frontier within "
                              "bandwidth and endurance"))


def load_chart(table) -> alt.VConcatChart:
    """Load curve: TTFT p50 (dashed) and p99 (solid) against the arrival rate, one
    colour per configuration, the SLO as a rule, and below it the goodput (requests/s
    within the SLO); the first level of each configuration at which a resource
    saturates (utilisation >= 95 %, or overloaded) is marked with its name."""
    from kvtrace.analyses.load import RESOURCES, SATURATED

    rows = []
    marks = []
    for cfg in table["config"].unique(maintain_order=True).to_list():
        sub = table.filter(pl.col("config") == cfg).sort("load_factor")
        marked = False
        for r in sub.iter_rows(named=True):
            x = r["arrival_rate_rps"]
            if x is None:
                continue
            for pct, col in (("p50", "ttft_p50_ms"), ("p99", "ttft_p99_ms")):
                if r[col] is not None:
                    rows.append({"config": cfg, "rate": x, "percentile": pct, "ttft_ms": r[col],
                                 "load": f"{r['load_factor']:g}x", "goodput": r["goodput_rps"],
                                 "bottleneck": r["bottleneck"], "overloaded": r["overloaded"]})
            hot = [res for res in RESOURCES if (r.get(f"util_{res}") or 0.0) >= SATURATED]
            if not marked and (r["overloaded"] or hot):
                marked = True
                what = r["overload_resource"] or r["bottleneck"]
                marks.append({"config": cfg, "rate": x, "ttft_ms": r["ttft_p99_ms"],
                              "what": f"{what} saturates" + (" (overloaded)" if r["overloaded"] else "")})
    df = pl.DataFrame(rows, schema={"config": pl.String, "rate": pl.Float64, "percentile": pl.String,
                                    "ttft_ms": pl.Float64, "load": pl.String, "goodput": pl.Float64,
                                    "bottleneck": pl.String, "overloaded": pl.Boolean})
    x = alt.X("rate:Q", title="arrival rate (requests/s)", scale=alt.Scale(zero=False))
    color = alt.Color("config:N", title="configuration", scale=alt.Scale(scheme="tableau10"),
                      legend=alt.Legend(labelLimit=0, orient="bottom", direction="vertical"))
    tooltip = ["config:N", "load:N", alt.Tooltip("rate:Q", format=",.3~g", title="requests/s"), "percentile:N",
               alt.Tooltip("ttft_ms:Q", format=",.1f", title="TTFT ms"), "bottleneck:N", "overloaded:N"]
    slo = float(table["slo_ttft_ms"][0])
    ttft = alt.Chart(df).mark_line(point=True).encode(
        x=x, y=alt.Y("ttft_ms:Q", title="time to first token (ms, log)", scale=alt.Scale(type="log")),
        color=color, strokeDash=alt.StrokeDash("percentile:N", title="TTFT", sort=["p99", "p50"],
                                               scale=alt.Scale(range=[[1, 0], [5, 3]])),
        tooltip=tooltip)
    rule = alt.Chart(pl.DataFrame({"slo": [slo], "what": [f"SLO {slo:g} ms"]})).mark_rule(
        color="firebrick", strokeDash=[2, 2]).encode(y="slo:Q", tooltip=["what:N"])
    layers = [ttft, rule]
    if marks:
        mk = pl.DataFrame(marks)
        layers += [alt.Chart(mk).mark_point(shape="diamond", size=220, filled=True, color="black").encode(
                       x="rate:Q", y="ttft_ms:Q", tooltip=["config:N", "what:N"]),
                   alt.Chart(mk).mark_text(dy=-14, fontSize=11).encode(x="rate:Q", y="ttft_ms:Q", text="what:N")]
    top = alt.layer(*layers).properties(width=640, height=300, title="TTFT under load")
    good = alt.Chart(df.filter(pl.col("percentile") == "p99")).mark_line(point=True).encode(
        x=x, y=alt.Y("goodput:Q", title="goodput (requests/s within the SLO)"), color=color,
        tooltip=["config:N", "load:N", alt.Tooltip("goodput:Q", format=",.3~g")]).properties(width=640, height=200)
    return alt.vconcat(top, good)
