"""What-ifs: DRAM over local SSD / shared flash, admission policies, promotion, nodes
(``kvtrace whatif``): comparison table, gain-vs-wear frontier, latency percentiles."""

import json

import polars as pl
import streamlit as st
from kvtrace.app import cached, charts, sidebar
from kvtrace.app.fmt import bandwidth, dollars, format_bytes, ms, num, pct

from kvtrace.results import appdata
from kvtrace.results.charts import frontier_chart
from kvtrace.errors import KvtraceError
from kvtrace.outputs import _json_safe
from kvtrace.analyses.whatif import FLASH_ORDERS, PROMOTIONS, ROUTINGS, WRITE_MODES, TierConfig, summary_table

MAX_CONFIGS = 48

ctx = sidebar.trace_context()
state = st.session_state
for k, v in {"wi_dram": appdata.DEFAULT_TIERS["dram"], "wi_flash": appdata.DEFAULT_TIERS["flash"],  # as Curves
             "wi_local": "0", "wi_policies": ["all", "second-hit", "tinylfu"],
             "wi_promotion": "promote", "wi_write_mode": "write-on-evict", "wi_order": "lru", "wi_inclusive": False,
             "wi_nodes": 1, "wi_routing": "session", "wi_warmup": "", "wi_dram_gbps": 25.0, "wi_dram_ms": 0.2,
             "wi_flash_gbps": 6.0, "wi_flash_ms": 1.0, "wi_overhead_ms": 1.0}.items():
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
    c2.multiselect("Admission policies", appdata.WHATIF_POLICIES, key="wi_policies",
                   help="What enters flash; value>=v uses future-reuse values over a 1 h horizon.")
    c2.selectbox("Promotion on a flash hit", list(PROMOTIONS), key="wi_promotion")
    c2.selectbox("Write mode", WRITE_MODES, key="wi_write_mode")
    c3.number_input("Nodes", min_value=1, max_value=64, step=1, key="wi_nodes")
    c3.selectbox("Routing", ROUTINGS, key="wi_routing")
    c3.selectbox("Flash order", FLASH_ORDERS, key="wi_order")
    c3.checkbox("Inclusive tiers (needed by copy / write-through)", key="wi_inclusive")
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
    out, seen = [], set()
    for d in drams:
        for f in flashes:
            for p in policies:
                c = TierConfig(d, flash_bytes=f, policy=p, **common)
                if c.label not in seen:  # without flash the policy does not matter
                    seen.add(c.label)
                    out.append(c)
    if len(out) > MAX_CONFIGS:
        raise KvtraceError(f"{len(out)} configurations: at most {MAX_CONFIGS} per run (fewer sizes or policies)")
    return out


try:
    configs = _configs()
except KvtraceError as exc:
    st.error(exc.one_line())
    st.stop()

gpu = ctx.gpu
response = {"dram_fixed_s": state["wi_dram_ms"] / 1e3, "dram_bytes_per_s": state["wi_dram_gbps"] * 1e9,
            "flash_fixed_s": state["wi_flash_ms"] / 1e3, "flash_bytes_per_s": state["wi_flash_gbps"] * 1e9,
            "overhead_s": state["wi_overhead_ms"] / 1e3, "recompute_flops_per_s": gpu.effective_flops}
warmup = state["wi_warmup"].strip() or None
values = None
if any(c.parsed_policy.kind == "value" for c in configs):
    values = cached.future_values(ctx.key, ctx.model_name, ctx.gpu_name, "1h", _trace=ctx.trace)

bar = st.progress(0.0, text=f"Simulating {len(configs)} configuration(s)…")
rows = []
try:
    for i, c in enumerate(configs):
        bar.progress(i / len(configs), text=f"Simulating {c.label} ({i + 1} of {len(configs)})")
        rows.append(cached.whatif(ctx.key, cached.config_dict(c), ctx.model_name, ctx.gpu_name, ctx.eviction,
                                  response, warmup, _trace=ctx.trace, _values=values))
except KvtraceError as exc:
    bar.empty()
    st.error(exc.one_line())
    st.stop()
bar.empty()
table = summary_table(rows)

st.subheader("Comparison")
rows_shown = []
for r in table.iter_rows(named=True):  # the columns of `kvtrace whatif`'s table
    dwpd = r["flash_dwpd"] if r["flash_dwpd"] is not None else r["local_dwpd"]
    writes = r["flash_write_bytes_per_day"]
    rows_shown.append({
        "config": r["config"], "DRAM": pct(r["dram_prefix_token_hit_rate"]),
        "SSD/flash": pct((r["flash_prefix_token_hit_rate"] or 0.0) + (r["local_prefix_token_hit_rate"] or 0.0)),
        "miss": pct(r["prefix_token_miss_rate"]),
        "compute saved": pct(r["compute_saved_rate"]),
        "p50": ms(r["service_time_p50_ms"]), "p99": ms(r["service_time_p99_ms"]),
        "$ saved /h": dollars(r["usd_saved_per_hour"]),
        "flash writes/day": "-" if writes is None else format_bytes(writes),
        "DWPD": "-" if dwpd is None else f"{dwpd:.2f}",
        "flash read mean": bandwidth(r["flash_read_mean_bytes_per_s"]),
        "peak": bandwidth(r["flash_read_peak_bytes_per_s"]), "promotions": num(r["promotions"] or 0),
    })
display = pl.DataFrame(rows_shown)
# the latency percentiles next to the hit shares, the narrow columns narrow: every column fits 1,280 px
st.dataframe(display, hide_index=True, key="comparison", column_config={
    "config": st.column_config.TextColumn(pinned=True, width="medium"),
    **{c: st.column_config.TextColumn(width="small") for c in ("DRAM", "SSD/flash", "miss", "p50", "p99", "DWPD")}})
d1, d2, _ = st.columns([1, 1, 3])
d1.download_button("Download table (CSV)", table.write_csv(), file_name="whatif.csv", mime="text/csv")
d2.download_button("Download table (JSON)", json.dumps(_json_safe({"configs": table.to_dicts()}), indent=2),
                   file_name="whatif.json", mime="application/json")

st.altair_chart(frontier_chart(table).properties(width="container"))
st.altair_chart(charts.latency(appdata.latency_table(table)))
st.caption("Frontier: share of prompt tokens served from flash against flash bytes written per day (wear). "
           "Latency: per-request reusable-prefix service time from the response model (restore or recompute, "
           "byte-dependent), percentiles of the per-request distribution.")
