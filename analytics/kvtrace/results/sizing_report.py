"""The ``kvtrace size`` report: neutral blocks rendered to Markdown or to one
self-contained HTML page (Altair charts embedded with the Vega libraries inline)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

from kvtrace.analyses.sizing.config import CANDIDATE_TEXT, LENSES
from kvtrace.analyses.sizing.lenses import ms_text, pct_text, signed_usd_text, usd_text
from kvtrace.errors import require_extra
from kvtrace.units import format_bytes

if TYPE_CHECKING:
    from kvtrace.analyses.sizing.search import SizingResult

_LENS_TITLE = {
    "same-slo": "Same SLO: per candidate, the cheapest configuration meeting the SLO, bandwidth and endurance",
    "same-capacity": "Same capacity: every candidate holds {capacity} in total (exact capacities)",
    "same-budget": "Same budget: the most each candidate buys for {budget}/month",
}
_TABLE_HEAD = ("rank", "candidate", "configuration", "admission", "DRAM", "SSD/flash", "mean", "P99", "$/month",
               "vs today", "net $/month", "break-even realisation", "DWPD", "feasible", "notes")


def _table_rows(result: SizingResult, lens: str) -> list[list[str]]:
    rows = []
    for r in result.candidates.filter(pl.col("lens") == lens).sort("rank").iter_rows(named=True):
        rows.append([
            str(r["rank"]), CANDIDATE_TEXT[r["candidate"]], r["config"] or "-", r["policy"] or "-",
            pct_text(r["dram_prefix_token_hit_rate"]), pct_text(r["ssd_prefix_token_hit_rate"]),
            ms_text(r["service_time_mean_ms"]), ms_text(r["service_time_p99_ms"]),
            usd_text(r["cost_usd_per_month"]), signed_usd_text(r["incremental_cost_usd_per_month"]),
            signed_usd_text(r["net_usd_per_month"]),
            pct_text(r["break_even_realisation"]), "-" if r["ssd_dwpd"] is None else f"{r['ssd_dwpd']:,.2f}",
            "yes" if r["feasible"] else "no", r["reasons"] or "",
        ])
    return rows


def _blocks(result: SizingResult) -> list[tuple]:
    """The report as neutral blocks, rendered to Markdown or HTML."""
    c, info, rec = result.config, result.info, result.recommendation
    gpu = f"{info['gpu']} at ${info['gpu_dollars_per_hour']:g}/GPU-hour ({info['gpu_effective_flops'] / 1e12:,.1f} " \
          "TFLOP/s sustained prefill)"
    b: list[tuple] = [
        ("h1", f"kvtrace size: {info['trace']}"),
        ("ul", [
            f"Trace: {info['requests']:,} requests, {info['accesses']:,} block accesses over "
            f"{info['duration_s'] / 60:,.1f} min, replayed at {c.load_scale:g} x its arrival rate"
            + (f" (measured after request {info['first_measured_request']:,})"
               if info["first_measured_request"] else ""),
            f"Model: {info['model']} ({info['kv_bytes_per_token']:,} KV bytes per token); GPU: {gpu}",
            f"SLO (reusable-prefix time per request): {c.slo_text()}; realisation ratio {pct_text(c.realisation)}",
            f"Deployment today: DRAM {format_bytes(c.current_dram_bytes)} per node x {c.nodes} node(s), "
            f"{c.routing} routing, {c.eviction} LRU, {c.cache_rules} cache rules",
            "Prices, power and speeds are the config's: the example file's numbers are illustrative, not quotes.",
        ]),
        ("h2", rec.headline[:1].upper() + rec.headline[1:]),
        *([("p", "What would meet them:"), ("ul", rec.needed)] if rec.needed else []),
        ("ul", rec.reasons),
        ("h3", "Risks"),
        ("ul", rec.risks),
    ]
    if rec.whatif_command:
        b += [("p", "Replay the chosen configuration on its own (hit shares and service times match this report"
                    + ("; per-hour figures differ by the load scale" if c.load_scale != 1 else "") + "):"),
              ("code", rec.whatif_command)]
    b.append(("h2", "Candidates"))
    for lens in LENSES:
        title = _LENS_TITLE[lens].format(capacity=format_bytes(info["same_capacity_bytes"]),
                                         budget=usd_text(info["budget_monthly_usd"]))
        b.append(("h3", title))
        if lens == "same-capacity":
            b.append(("p", f"Target: {info['same_capacity_source']}."))
        if lens == "same-budget":
            b.append(("p", f"Budget: {info['budget_source']}."))
        b.append(("table", _TABLE_HEAD, _table_rows(result, lens)))
    b.append(("p", "DRAM, SSD/flash: unconditional shares of prompt tokens served from DRAM and from the local SSD "
                   "or shared flash (usable prefix; dram_ and ssd_prefix_token_hit_rate); times are the reusable "
                   "prefix's per-request service time from the exact tier replay; "
                   "'vs today' and 'net' compare with keeping today's DRAM; net = realised GPU value - incremental "
                   "cost. Rows are ranked feasible first, then by net benefit."))
    costs = result.costs.get(rec.config or "", [])
    if costs:
        b.append(("h2", "Monthly cost of the recommendation"))
        b.append(("ul", [line for part in costs for line in part["explain"]]))
    b += [("h2", "Charts"), ("chart", "curve"), ("chart", "cost")]
    b += [("h2", "Method"), ("ul", [
        "Search: reuse distances give, for any capacities, each request's bytes from DRAM and flash and its "
        "recompute FLOPs under admit-all exclusive tiers (DESIGN §2 invariant); "
        f"{info['search_points']:,} configurations evaluated"
        + (f" on 1 in {info['search_sample_every']} requests" if info['search_sample_every'] > 1 else "") + ".",
        f"Confirmation: {info['replays']:,} exact replays with the tier simulator (kvtrace whatif), one per "
        f"finalist and admission policy ({', '.join(c.policies)}); every table figure comes from a replay.",
        "Money: hardware / amortisation + support + kW x hours x $/kWh + reserve per tier; existing DRAM at "
        "replacement cost; freed GPU-hours x $/GPU-hour x realisation (a loss of saved compute is paid in full).",
        "Not modelled: queueing, the GPU time restores cost, HBM prefix caching, replicas and failures.",
    ])]
    return b


def _md_escape(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def report_markdown(result: SizingResult, *, charts: bool = True) -> str:
    """The sizing report as Markdown (charts as embedded SVG data URIs when ``charts``)."""
    import base64

    out: list[str] = []
    for blk in _blocks(result):
        kind = blk[0]
        if kind in ("h1", "h2", "h3"):
            out += ["#" * int(kind[1]) + " " + blk[1], ""]
        elif kind == "p":
            out += [blk[1], ""]
        elif kind == "ul":
            out += [f"- {x}" for x in blk[1]] + [""]
        elif kind == "code":
            out += ["```sh", blk[1], "```", ""]
        elif kind == "table":
            head, rows = blk[1], blk[2]
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "|".join("---" if i in (1, 2, 3, 14) else "--:" for i in range(len(head))) + "|")
            out += ["| " + " | ".join(_md_escape(x) for x in row) + " |" for row in rows]
            out.append("")
        elif kind == "chart" and charts:
            vlc = require_extra("vl_convert", "png", package="vl-convert-python", what="a report with charts")

            chart, title = _chart(result, blk[1])
            svg = vlc.vegalite_to_svg(chart.to_json())
            out += [f"![{title}](data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()})", ""]
    return "\n".join(out)


def _chart(result: SizingResult, name: str):
    from kvtrace.results.charts import cost_slo_chart, sizing_curve_chart

    if name == "curve":
        return sizing_curve_chart(result), "capacity-hit curve with the chosen capacities"
    return cost_slo_chart(result), "cost against the SLO metric"


REPORT_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1400px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;vertical-align:top}
td:nth-child(2),td:nth-child(3),td:nth-child(4),td:nth-child(15),th{text-align:left}
tr.no td{color:#777}code,pre{background:#f4f4f4;padding:2px 4px}pre{padding:0.6em;overflow-x:auto}
h2{border-bottom:1px solid #ddd;padding-bottom:0.2em}"""


def report_html(result: SizingResult) -> str:
    """The sizing report as one self-contained HTML page (Altair charts embedded with
    the Vega libraries inline: it opens offline)."""
    import html

    vlc = require_extra("vl_convert", "png", package="vl-convert-python", what="an HTML sizing report")

    esc = html.escape
    body: list[str] = []
    specs: list[tuple[str, str]] = []
    for blk in _blocks(result):
        kind = blk[0]
        if kind in ("h1", "h2", "h3"):
            body.append(f"<{kind}>{esc(blk[1])}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{esc(blk[1])}</p>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{esc(x)}</li>" for x in blk[1]) + "</ul>")
        elif kind == "code":
            body.append(f"<pre><code>{esc(blk[1])}</code></pre>")
        elif kind == "table":
            head, rows = blk[1], blk[2]
            t = ["<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>"]
            for row in rows:
                cls = "" if row[13] == "yes" else ' class="no"'
                t.append(f"<tr{cls}>" + "".join(f"<td>{esc(x)}</td>" for x in row) + "</tr>")
            t.append("</tbody></table>")
            body.append("".join(t))
        elif kind == "chart":
            chart, title = _chart(result, blk[1])
            div = f"chart-{blk[1]}"
            body.append(f'<div id="{div}" title="{esc(title)}"></div>')
            specs.append((div, chart.to_json(indent=None)))
    safe = [(div, spec.replace("</", "<\\/")) for div, spec in specs]  # no "</script>" inside the script
    embeds = "\n".join(f"vegaEmbed('#{div}', {spec}, {{\"renderer\": \"svg\"}}).catch(console.error);"
                       for div, spec in safe)
    bundle = vlc.javascript_bundle().replace("</script", "<\\/script")
    title = esc(f"kvtrace size: {result.info['trace']}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{REPORT_CSS}</style>\n<script type=\"text/javascript\">{bundle}</script></head>\n<body>\n"
            + "\n".join(body) + f"\n<script type=\"text/javascript\">\n{embeds}\n</script>\n</body></html>\n")
