"""The scenario timeline chart and report (``kvtrace scenario --plot / --report``)."""

from __future__ import annotations

import math

import altair as alt
import polars as pl

from kvtrace.errors import require_extra
from kvtrace.units import format_bytes

#: The timeline chart's panels: (column, title).
PANELS = (("prefix_token_hit_rate", "prefix-token hit rate"), ("prefill_gpu_seconds", "prefill GPU-s per bin"),
          ("ttft_p99_ms", "TTFT p99, ms"), ("util_flash_offered", "flash pool offered utilisation"))

#: Line colours of the scenarios after the baseline (Tableau 10, then Tableau 20's light shades).
_PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f",
            "#bab0ac", "#a0cbe8", "#ffbe7d", "#8cd17d", "#b6992d", "#499894", "#86bcb6", "#d37295", "#fabfd2",
            "#d4a6c8")

#: The side-by-side table: (column, heading, format).
TABLE = (("scenario", "scenario", "s"), ("ttft_p50_ms", "TTFT p50 ms", "ms"), ("ttft_p99_ms", "TTFT p99 ms", "ms"),
         ("slo_attainment", "within SLO", "%"), ("overloaded", "overloaded", "yn"), ("goodput_rps", "goodput rps", "f"),
         ("prefix_token_hit_rate", "prefix tokens hit", "%"), ("dram_read_share", "DRAM share", "%"),
         ("local_read_share", "local share", "%"), ("flash_read_share", "flash share", "%"),
         ("flash_read_bytes", "flash read", "B"), ("flash_write_bytes", "flash written", "B"),
         ("flash_write_amplification_ratio", "flash writes / computed", "f2"),
         ("recompute_gpu_seconds", "recompute GPU-s", "f"), ("prefill_gpu_seconds", "prefill GPU-s", "f"),
         ("extra_prefill_gpu_seconds", "extra prefill vs plain", "f"),
         ("hit_rate_shortfall", "worst bin below plain", "pp"), ("recovered_after_s", "recovered after", "t"),
         ("wait_p99_flash_ms", "flash wait p99 ms", "ms"), ("wait_p99_gpu_ms", "GPU wait p99 ms", "ms"),
         ("lost_to_capacity_bytes", "missed: capacity", "B"), ("lost_to_events_bytes", "missed: events", "B"),
         ("dropped_bytes", "dropped", "B"))


def _fmt(v, kind: str, row: dict | None = None) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        if kind == "t" and row is not None and row.get("recovered") is False:
            return "not within the trace"
        return "-"
    if kind == "s":
        return str(v)
    if kind == "yn":
        return "yes" if v else "-"
    if kind == "%":
        return f"{v:.1%}"
    if kind == "pp":
        return f"{v * 100:.1f} pp"
    if kind == "B":
        return format_bytes(v)
    if kind == "ms":
        return f"{v:,.0f}"
    if kind == "n":
        return f"{v:,}"
    if kind == "Bs":
        return f"{format_bytes(v)}-s"
    if kind == "t":
        return f"{v:,.0f} s"
    if kind == "f2":
        return f"{v:,.2f}"
    return f"{v:,.1f}"


#: The prestaging figures (rows with a prestage event): (column, heading, format).
PREFETCH = (("scenario", "scenario", "s"), ("prefetch_requests", "prefetches", "n"),
            ("prefetch_bytes", "moved", "B"), ("prefetch_useful_share", "read from DRAM", "%"),
            ("prefetch_extra_bytes", "extra traffic", "B"), ("prefetch_coverage_share", "coverage", "%"),
            ("prefetch_dram_byte_seconds", "DRAM held", "Bs"), ("prefetch_displaced_bytes", "displaced", "B"))


#: The prewarming figures (rows with a prewarm event): (column, heading, format).
PREWARM = (("scenario", "scenario", "s"), ("prewarm_bytes", "moved", "B"),
           ("prewarm_useful_share", "read from DRAM", "%"), ("prewarm_displaced_bytes", "displaced", "B"),
           ("background_read_bytes", "background reads", "B"),
           ("ttft_p99_recovery_ms", "TTFT p99 to recovery ms", "ms"),
           ("wait_p99_flash_ms", "flash wait p99 ms", "ms"), ("recovered_after_s", "recovered after", "t"))


def prefetch_rows(table: pl.DataFrame, spec=PREFETCH, key: str = "prefetch_requests"
                  ) -> tuple[list[str], list[list[str]]]:
    """Headings and formatted rows of the prestaging figures (no rows without a prestage
    event; ``spec=PREWARM, key="prewarm_bytes"``: the prewarming figures)."""
    rows = [r for r in table.to_dicts() if r.get(key) is not None]
    return [h for _, h, _ in spec], [[_fmt(r.get(c), k, r) for c, _, k in spec] for r in rows]


def prewarm_rows(table: pl.DataFrame) -> tuple[list[str], list[list[str]]]:
    return prefetch_rows(table, PREWARM, "prewarm_bytes")


#: The columns of :data:`TABLE` the terminal shows.
TERMINAL = ("scenario", "ttft_p50_ms", "ttft_p99_ms", "slo_attainment", "overloaded", "prefix_token_hit_rate",
            "flash_read_share", "recompute_gpu_seconds", "extra_prefill_gpu_seconds", "hit_rate_shortfall",
            "recovered_after_s", "dropped_bytes")


def table_rows(table: pl.DataFrame, columns=None) -> tuple[list[str], list[list[str]]]:
    """Headings and formatted rows of the side-by-side table (``columns``: a subset of
    :data:`TABLE`'s, in its order)."""
    spec = [t for t in TABLE if columns is None or t[0] in columns]
    head = [h for _, h, _ in spec]
    rows = [[_fmt(r.get(c), k, r) for c, _, k in spec] for r in table.to_dicts()]
    return head, rows


def timeline_chart(result) -> alt.VConcatChart:
    """Per bin, one panel per :data:`PANELS` metric, a line per scenario; the events'
    times as vertical rules."""
    tl = result.timeline.to_pandas()
    ev = result.events
    first = float(result.info.get("first_measured_s") or 0.0)
    rules = None
    if ev.height and "at_s" in ev.columns:  # the events inside the measured window (or at its opening)
        bin_s = float(result.info.get("bin_s") or 0.0)
        rules = ev.filter(pl.col("at_s").is_not_null() & (pl.col("at_s") >= first - bin_s)).select(
            "scenario", "text", pl.col("at_s").alias("bin_start_s")).to_pandas()
    panels = []
    order = result.table["scenario"].to_list()  # the baseline first, in black
    color = alt.Color("scenario:N", title="scenario", sort=order,
                      scale=alt.Scale(domain=order, range=["black", *_PALETTE]))
    for col, title in PANELS:
        line = alt.Chart(tl).mark_line(interpolate="step-after").encode(
            x=alt.X("bin_start_s:Q", title="seconds after the trace's first request", scale=alt.Scale(zero=False)),
            y=alt.Y(f"{col}:Q", title=title), color=color,
            strokeWidth=alt.condition(alt.datum.scenario == order[0], alt.value(2.5), alt.value(1.5)),
            tooltip=["scenario", "bin_start_s", alt.Tooltip(f"{col}:Q", format=",.3f")])
        layer = line
        if rules is not None and len(rules):
            layer = line + alt.Chart(rules).mark_rule(strokeDash=[4, 3]).encode(
                x="bin_start_s:Q", color=color, tooltip=["scenario", "text"])
        panels.append(layer.properties(width=640, height=150))
    bin_s = result.info.get("bin_s")
    return alt.vconcat(*panels).properties(
        title=f"scenarios per {bin_s:g} s bin (dashed: the events)" if bin_s else "scenarios")


def _blocks(result, trace_name: str) -> list[tuple]:
    info = result.info
    head, rows = table_rows(result.table)
    ev = result.events
    ev_rows = [[r["scenario"], r["text"], "-" if r.get("at_s") is None else f"{r['at_s']:,.0f} s",
                "-" if r.get("first_request") is None else f"{r['first_request']:,}", f"{r['dropped_blocks']:,}",
                format_bytes(r["dropped_bytes"]), format_bytes(r["lost_bytes"])] for r in ev.to_dicts()] \
        if ev.height else []
    return [
        ("h1", f"kvtrace scenario: {trace_name}"),
        ("p", f"Assumed: {info['assumptions']}."),
        ("h2", "Side by side"),
        ("table", head, rows),
        *([("h2", "Prestaging"), ("table", *prefetch_rows(result.table))] if prefetch_rows(result.table)[1] else []),
        *([("h2", "Prewarming"), ("table", *prewarm_rows(result.table))] if prewarm_rows(result.table)[1] else []),
        ("h2", "Events"),
        ("table", ["scenario", "event", "at", "first request", "blocks dropped", "bytes dropped",
                   "missed because of it"], ev_rows),
        ("h2", "Timeline"),
        ("chart",),
    ]


def report_markdown(result, trace_name: str, *, charts: bool = True) -> str:
    """The scenario report as Markdown (the timeline as an embedded SVG when ``charts``)."""
    import base64

    out: list[str] = []
    for blk in _blocks(result, trace_name):
        if blk[0] == "h1":
            out += [f"# {blk[1]}", ""]
        elif blk[0] == "h2":
            out += [f"## {blk[1]}", ""]
        elif blk[0] == "p":
            out += [blk[1], ""]
        elif blk[0] == "table":
            out.append("| " + " | ".join(blk[1]) + " |")
            out.append("|" + "|".join(["---"] + ["--:"] * (len(blk[1]) - 1)) + "|")
            out += ["| " + " | ".join(str(x).replace("|", "\\|") for x in row) + " |" for row in blk[2]]
            out.append("")
        elif blk[0] == "chart" and charts:
            vlc = require_extra("vl_convert", "png", package="vl-convert-python", what="a report with charts")
            svg = vlc.vegalite_to_svg(timeline_chart(result).to_json())
            out += [f"![timeline](data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()})", ""]
    return "\n".join(out)


def report_html(result, trace_name: str) -> str:
    """The scenario report as one self-contained HTML page (the chart embedded with the
    Vega libraries inline: it opens offline)."""
    import html

    from kvtrace.results.sizing_report import REPORT_CSS

    vlc = require_extra("vl_convert", "png", package="vl-convert-python", what="an HTML scenario report")
    esc = html.escape
    body = []
    spec = None
    for blk in _blocks(result, trace_name):
        if blk[0] in ("h1", "h2"):
            body.append(f"<{blk[0]}>{esc(blk[1])}</{blk[0]}>")
        elif blk[0] == "p":
            body.append(f"<p>{esc(blk[1])}</p>")
        elif blk[0] == "table":
            body.append("<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in blk[1]) + "</tr></thead><tbody>"
                        + "".join("<tr>" + "".join(f"<td>{esc(str(x))}</td>" for x in row) + "</tr>"
                                  for row in blk[2]) + "</tbody></table>")
        elif blk[0] == "chart":
            body.append('<div id="timeline"></div>')
            spec = timeline_chart(result).to_json(indent=None).replace("</", "<\\/")
    bundle = vlc.javascript_bundle().replace("</script", "<\\/script")
    embed = f"vegaEmbed('#timeline', {spec}, {{\"renderer\": \"svg\"}}).catch(console.error);" if spec else ""
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>"
            f"{esc('kvtrace scenario: ' + trace_name)}</title><style>{REPORT_CSS}</style>\n"
            f"<script type=\"text/javascript\">{bundle}</script></head>\n<body>\n" + "\n".join(body)
            + f"\n<script type=\"text/javascript\">\n{embed}\n</script>\n</body></html>\n")


__all__ = ["PANELS", "PREFETCH", "TABLE", "TERMINAL", "prefetch_rows", "report_html", "report_markdown", "table_rows",
           "timeline_chart"]
