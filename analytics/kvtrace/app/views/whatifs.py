"""What-ifs: DRAM over local SSD / shared flash, admission policies, promotion, nodes
(``kvtrace whatif``): comparison table, gain-vs-wear frontier, latency percentiles."""

import dataclasses
import json

import polars as pl
import streamlit as st
from kvtrace.app import cached, charts, choices, sidebar

from kvtrace.analyses.response import ResponseModel
from kvtrace.analyses.value import DEFAULT_HORIZON
from kvtrace.analyses.whatif import (FLASH_ORDERS, PROMOTIONS, ROUTINGS, TIER_RULE_TEXT, WRITE_MODES, TierConfig,
                                     config_grid, summary_table)
from kvtrace.errors import KvtraceError
from kvtrace.outputs import json_safe
from kvtrace.results import chart_data
from kvtrace.results.charts import frontier_chart
from kvtrace.results.present import WHATIF_HEADS, money, whatif_rows

MAX_CONFIGS = 48

ctx = sidebar.trace_context()
state = st.session_state
_response = ResponseModel()  # the response-model defaults, in the form's units
for k, v in {"wi_dram": choices.DEFAULT_TIERS["dram"], "wi_flash": choices.DEFAULT_TIERS["flash"],  # as Curves
             "wi_local": "0", "wi_policies": ["all", "second-hit", "tinylfu"],
             "wi_promotion": "promote", "wi_write_mode": "write-on-evict", "wi_order": "lru", "wi_inclusive": False,
             "wi_nodes": 1, "wi_routing": "session", "wi_warmup": "", "wi_dram_gbps": _response.dram_gbps,
             "wi_dram_ms": _response.dram_latency_ms, "wi_flash_gbps": _response.flash_gbps,
             "wi_flash_ms": _response.flash_latency_ms, "wi_overhead_ms": _response.overhead_ms,
             "wi_rules": "ideal"}.items():
    state.setdefault(k, v)

st.title("Tier what-ifs")
st.caption(f"{ctx.label}: exact event simulation of DRAM over local SSD / shared flash under the same LRU model as "
           "the curve (`kvtrace whatif`). Shares are unconditional (of all usable-prefix tokens).")

with st.form("whatif_form"):
    c1, c2, c3 = st.columns(3)
    c1.text_input("DRAM per node", key="wi_dram", help="A size with its unit (64GiB, 500GB; a bare number is "
                  "refused), or a comma list: every DRAM x flash pair is run.")
    c1.text_input("Shared flash", key="wi_flash", help="Sizes with their units, e.g. 1TiB,4TiB; 0 = no flash.")
    c1.text_input("Local SSD per node", key="wi_local", help="A size with its unit, e.g. 3.84TB; 0 = none.")
    c2.multiselect("Admission policies", choices.WHATIF_POLICIES, key="wi_policies",
                   help=f"What enters flash; value>=v uses future-reuse values over a {DEFAULT_HORIZON} horizon.")
    c2.selectbox("Promotion on a flash hit", list(PROMOTIONS), key="wi_promotion")
    c2.selectbox("Write mode", WRITE_MODES, key="wi_write_mode")
    c3.number_input("Nodes", min_value=1, max_value=64, step=1, key="wi_nodes")
    c3.selectbox("Routing", ROUTINGS, key="wi_routing")
    c3.selectbox("Flash order", FLASH_ORDERS, key="wi_order")
    c3.checkbox("Inclusive tiers (needed by copy / write-through)", key="wi_inclusive")
    c3.radio("Cache rules", list(TIER_RULE_TEXT), key="wi_rules", horizontal=True,
             help="ideal: kvtrace's model; vllm / sglang: the engine's reuse rules on the tiers (a request's last "
                  "block recomputed, only full blocks stored), as kvtrace whatif --cache-rules.")
    with st.expander("Response model and warm-up"):
        r1, r2, r3 = st.columns(3)
        r1.number_input("DRAM restore GB/s", min_value=0.1, key="wi_dram_gbps")
        r1.number_input("DRAM latency ms", min_value=0.0, key="wi_dram_ms")
        r2.number_input("Flash restore GB/s", min_value=0.1, key="wi_flash_gbps")
        r2.number_input("Flash latency ms", min_value=0.0, key="wi_flash_ms")
        r3.number_input("Flash-tier overhead per request, ms", min_value=0.0, key="wi_overhead_ms")
        r3.text_input("Warm-up (fraction or duration)", key="wi_warmup", placeholder="0.1 or 10min")
    st.form_submit_button("Run what-ifs", type="primary")


def _configs() -> list[TierConfig]:
    drams = [d.strip() for d in state["wi_dram"].split(",") if d.strip()]
    flashes = [f.strip() for f in state["wi_flash"].split(",") if f.strip()] or ["0"]
    policies = state["wi_policies"] or ["all"]
    if not drams:
        raise KvtraceError("give at least one DRAM size", field="DRAM per node")
    common = dict(local_ssd_bytes=state["wi_local"].strip() or "0", nodes=int(state["wi_nodes"]),
                  routing=state["wi_routing"], flash_order=state["wi_order"], promotion=state["wi_promotion"],
                  write_mode=state["wi_write_mode"], inclusive=bool(state["wi_inclusive"]))
    out = config_grid(drams, flashes, policies, **common)
    if len(out) > MAX_CONFIGS:
        raise KvtraceError(f"{len(out)} configurations: at most {MAX_CONFIGS} per run (fewer sizes or policies)")
    return out


try:
    configs = _configs()
except KvtraceError as exc:
    st.error(exc.one_line())
    st.stop()

gpu = ctx.gpu
try:  # a dict: the Streamlit cache's key
    response = dataclasses.asdict(ResponseModel.in_units(
        dram_gbps=state["wi_dram_gbps"], dram_latency_ms=state["wi_dram_ms"], flash_gbps=state["wi_flash_gbps"],
        flash_latency_ms=state["wi_flash_ms"], overhead_ms=state["wi_overhead_ms"],
        recompute_flops_per_s=gpu.effective_flops))
except KvtraceError as exc:
    st.error(exc.one_line())
    st.stop()
warmup = state["wi_warmup"].strip() or None
values = None
if any(c.parsed_policy.kind == "value" for c in configs):
    values = cached.future_values(ctx.key, ctx.model_name, ctx.gpu_name, DEFAULT_HORIZON, _trace=ctx.trace)

bar = st.progress(0.0, text=f"Simulating {len(configs)} configuration(s)…")
rows = []
try:
    for i, c in enumerate(configs):
        bar.progress(i / len(configs), text=f"Simulating {c.label} ({i + 1} of {len(configs)})")
        rows.append(cached.whatif(ctx.key, cached.config_dict(c), ctx.model_name, ctx.gpu_name, ctx.eviction,
                                  response, warmup, _trace=ctx.trace, _values=values,
                                  cache_rules=state["wi_rules"]))
except KvtraceError as exc:
    bar.empty()
    st.error(exc.one_line())
    st.stop()
bar.empty()
table = summary_table(rows)

st.subheader("Comparison")
st.caption(f"Cache rules ({state['wi_rules']}): {TIER_RULE_TEXT[state['wi_rules']]}.")
# `kvtrace whatif`'s columns (present.whatif_rows) with the latency percentiles next to the hit shares,
# and the dollars saved; the configuration label names the tiers
COLUMNS = ("config", "DRAM", "SSD/flash", "miss", "compute saved", "p50", "p99", "$ saved /h", "writes/day", "DWPD",
           "read mean", "peak", "promotions")
HEADS = {"writes/day": "flash writes/day", "read mean": "flash read mean"}
rows_shown = []
for r, texts in zip(table.iter_rows(named=True), whatif_rows(table)):
    row = {**dict(zip(WHATIF_HEADS, texts)), "$ saved /h": money(r["usd_saved_per_hour"])}
    rows_shown.append({HEADS.get(c, c): row[c] for c in COLUMNS})
display = pl.DataFrame(rows_shown)
# the narrow columns narrow: every column fits 1,280 px
st.dataframe(display, hide_index=True, key="comparison", column_config={
    "config": st.column_config.TextColumn(pinned=True, width="medium"),
    **{c: st.column_config.TextColumn(width="small") for c in ("DRAM", "SSD/flash", "miss", "p50", "p99", "DWPD")}})
d1, d2, _ = st.columns([1, 1, 3])
d1.download_button("Download table (CSV)", table.write_csv(), file_name="whatif.csv", mime="text/csv")
d2.download_button("Download table (JSON)", json.dumps(json_safe({"configs": table.to_dicts()}), indent=2),
                   file_name="whatif.json", mime="application/json")

st.altair_chart(frontier_chart(table).properties(width="container"))
st.altair_chart(charts.latency(chart_data.latency_table(table)))
st.caption("Frontier: share of prompt tokens served from flash against flash bytes written per day (wear). "
           "Latency: per-request reusable-prefix service time from the response model (restore or recompute, "
           "byte-dependent), percentiles of the per-request distribution.")
