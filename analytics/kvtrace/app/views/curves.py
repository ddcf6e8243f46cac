"""Curves: capacity-hit curves (``kvtrace curve``) by metric and group, with the
ceiling, the knees and the DRAM / flash capacities on the chart."""

import polars as pl
import streamlit as st
from kvtrace.app import cached, charts, choices, sidebar

from kvtrace.errors import KvtraceError
from kvtrace.names import label
from kvtrace.results import chart_data
from kvtrace.results.present import KNEE_HEADS, bandwidth, format_bytes, knee_table, money, rate
from kvtrace.units import parse_size

SAMPLE_RATES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)

ctx = sidebar.trace_context()
trace = ctx.trace
large = trace.n_accesses > choices.LARGE_TRACE_ACCESSES
state = st.session_state
state.setdefault("curve_sample", large)
state.setdefault("curve_rate", 0.01)
state.setdefault("curve_dram", choices.DEFAULT_TIERS["dram"])  # the What-ifs page starts from the same sizes
state.setdefault("curve_flash", choices.DEFAULT_TIERS["flash"])

st.title("Capacity-hit curves")
st.caption(f"{ctx.label}: what each cache size saves. Exact byte-LRU reuse distances, one kernel pass for "
           "every capacity (`kvtrace curve`).")
c1, c2, c3 = st.columns([2, 1, 1])
metric_label = c1.radio("Metric", list(choices.CURVE_METRICS), horizontal=True, key="curve_metric",
                        help="prefix tokens: usable-prefix prompt tokens served from cache (the headline); requests: "
                             "requests reusing at least one block; half-prefix requests: requests whose usable prefix "
                             "covers at least half their prompt; prefix bytes: usable-prefix bytes; compute saved: "
                             "prefill FLOPs avoided.")
metric = choices.CURVE_METRICS[metric_label]
groups = choices.groupings(trace)
by = c2.selectbox("Break down by", ["none", *groups], key="curve_by",
                  help="One line per group under one shared cache." if groups else "This trace has no type, "
                       "tenant, turn or session columns to group by.")
state.setdefault("curve_rules", "ideal")
rules = c3.radio("Cache rules", ["ideal", "vllm", "sglang"], key="curve_rules", horizontal=True,
                 help="ideal: kvtrace's request-atomic LRU, every capacity in one pass; vllm / sglang: the "
                      "engine's own prefix-cache rules (vLLM's block pool, SGLang's radix cache), one exact "
                      "replay per capacity on a thinned grid: what the engine would report.")
c3.toggle("SHARDS sampling", key="curve_sample", disabled=rules != "ideal",
          help=f"Approximate curve from a spatial sample of blocks; on by default above "
               f"{choices.LARGE_TRACE_ACCESSES:,} block accesses (ideal rules only).")
sampled = bool(state["curve_sample"]) and rules == "ideal"
if sampled:
    c3.select_slider("Sample rate", SAMPLE_RATES, key="curve_rate")
d1, d2, _ = st.columns([1, 1, 2])
d1.text_input("DRAM capacity", key="curve_dram", help="A size with its unit, e.g. 64GiB or 500GB (a bare number "
              "is refused); drawn on the chart.")
d2.text_input("Flash capacity (under DRAM)", key="curve_flash", help="A size with its unit, e.g. 1TiB; 0 for none; "
              "drawn at DRAM + flash.")
try:
    dram = parse_size(state["curve_dram"], field="DRAM capacity") if state["curve_dram"].strip() not in ("", "0") else 0
    flash = parse_size(state["curve_flash"], field="flash capacity") if state["curve_flash"].strip() not in ("", "0") \
        else 0
except KvtraceError as exc:
    st.error(exc.one_line())
    dram = flash = 0
marks = chart_data.tier_marks(dram, flash)

sample_rate = float(state["curve_rate"]) if sampled else None
if rules == "ideal":
    dist = None if sampled else cached.distances(ctx.key, ctx.eviction, _trace=trace)
    result = cached.curve(ctx.key, ctx.model_name, ctx.gpu_name, ctx.eviction, None if by == "none" else by,
                          sample_rate, tuple(marks.values()), _trace=trace, _distances=dist)
else:
    result = cached.engine_curve(ctx.key, ctx.model_name, ctx.gpu_name, rules, None if by == "none" else by,
                                 tuple(marks.values()), _trace=trace)
info = result.info

if result.approximate:
    err = info["error_estimate"]
    st.warning(f"APPROXIMATE: SHARDS sample rate {info['sample_rate']:g} ({info['sampled_accesses']:,} of "
               f"{trace.n_accesses:,} accesses evaluated); estimated standard error of the usable-prefix token "
               f"rate: mean {100 * (err['mean_standard_error'] or 0):.2f} pts, "
               f"max {100 * (err['max_standard_error'] or 0):.2f} pts (band: +-2 standard errors).")

ceiling = result.ceiling.get(metric)
knees = chart_data.knee_points(result, metric)
m1, m2, m3, m4 = st.columns(4)
m1.metric(f"ceiling ({metric_label})", rate(ceiling), help="Hit rate of an infinite cache.")
m2.metric("capacity to reach the ceiling", format_bytes(result.ceiling["capacity_bytes"]))
for col, frac in ((m3, 0.8), (m4, 0.95)):
    k = knees.filter(pl.col("fraction") == frac)
    col.metric(f"capacity for {100 * frac:g}% of the ceiling",
               format_bytes(k["capacity_bytes"][0]) if k.height else "-",
               help=None if k.height else "kvtrace computes knees for requests, usable-prefix tokens and compute.")

if info.get("cache_rules"):
    st.info(f"Rules applied: {info['cache_rules_text']}. {info['grid']}; knees at the grid's resolution.")
subtitle = (f"{info['model']} ({info['kv_bytes_per_token']:,} B/token), "
            + (f"{info['cache_rules']} cache rules" if info.get("cache_rules") else f"{info['eviction']} LRU")
            + (f", SHARDS sample rate {info['sample_rate']:g} (approximate)" if result.approximate else ""))
st.altair_chart(charts.curve(chart_data.metric_lines(result, metric), knees, ceiling, marks, metric_label, subtitle))

if result.display is not None and marks:
    st.subheader("At your tiers")
    st.caption("DRAM + flash behaves as one LRU of both capacities (admit-all, exclusive, promote on hit): "
               "the What-ifs page simulates the tiers exactly.")
    rows = []
    for name, r in zip(marks, result.display.iter_rows(named=True)):
        rows.append({
            "tier": name, "capacity": format_bytes(r["capacity_bytes"]),
            **{label(m): rate(r[m]) for m in ("request_hit_rate", "prefix_token_hit_rate", "prefix_byte_hit_rate",
                                              "compute_saved_rate")},
            label("gpu_seconds_saved_per_hour"): "-" if r["gpu_seconds_saved_per_hour"] is None
            else f"{r['gpu_seconds_saved_per_hour']:,.1f}",
            label("usd_saved_per_hour"): money(r["usd_saved_per_hour"]),
            label("read_mean_bytes_per_s"): bandwidth(r["read_mean_bytes_per_s"]),
        })
    st.dataframe(pl.DataFrame(rows), hide_index=True, key="at_tiers")

st.subheader("Knees: capacity needed to reach a share of the ceiling")
st.dataframe(knee_table(result.knees).rename(KNEE_HEADS), hide_index=True, key="knees")
st.caption(f"{info['measured_accesses']:,} accesses measured, {info['distinct_blocks']:,} distinct blocks "
           f"({format_bytes(info['distinct_bytes'])}).")
