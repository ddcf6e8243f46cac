"""Sizing: the tier-sizing recommendation (``kvtrace size``) from a form that mirrors
``tiers.toml``: the recommendation card with its reasons, the candidates under the
three lenses, the charts, and the config, JSON and report to download."""

import json

import polars as pl
import streamlit as st
from kvtrace.app import cached, sidebar, sizing_form

from kvtrace.analyses.sizing import CANDIDATE_TEXT, LENSES, TIERS, default_config
from kvtrace.errors import KvtraceError
from kvtrace.model import GPUS, MODELS, resolve_gpu
from kvtrace.outputs import json_safe
from kvtrace.results.present import format_bytes, milliseconds, money, rate, signed_money

ctx = sidebar.trace_context()
st.title("Tier sizing")

state = st.session_state
SECTIONS, TIER_KEYS = sizing_form.sizing_fields()
_FIRST = ("slo", "economics", "deployment", "load", "search")  # the model and GPU follow the sidebar
SECTIONS = {**{s: SECTIONS[s] for s in _FIRST if s in SECTIONS}, **SECTIONS}
FROM_SIDEBAR = {"model.name": "Model", "gpu.name": "GPU", "search.eviction": "LRU model"}
OPTIONAL_TIERS = ("local_ssd", "shared_flash")
LENS_TEXT = {
    "same-slo": "Per candidate, the cheapest configuration meeting the SLO, the bandwidth and the endurance limits. "
                "The recommendation comes from this lens.",
    "same-capacity": "Every candidate holds the same total capacity.",
    "same-budget": "The most each candidate buys for the same monthly budget.",
}


def _md(text: str) -> str:
    """Plain text for st.markdown: '$' would start LaTeX, '*' and '_' emphasis."""
    return text.replace("\\", "\\\\").replace("$", "\\$").replace("*", "\\*").replace("_", "\\_")


def _set_form(values: dict, tiers) -> None:
    for k, v in values.items():
        state[f"sz.{k}"] = v
    for t in OPTIONAL_TIERS:
        state[f"sz.tier.{t}"] = t in tiers


def _gpu_preset(name: str) -> None:
    """The [gpu] overrides of a fresh form are the sidebar GPU's preset figures."""
    g = resolve_gpu(name)
    state["sz.gpu.dollars_per_hour"] = f"{g.dollars_per_hour:g}"
    state["sz.gpu.peak_tflops"] = f"{g.peak_flops / 1e12:g}"
    state["sz.gpu.mfu"] = f"{g.mfu:g}"
    state["_sz_gpu_for"] = name


def _load_toml() -> None:
    f = state.get("sz_upload")
    if f is None:
        return
    try:
        cfg = sizing_form.sizing_config_from_toml(f.name, f.getvalue())
    except KvtraceError as exc:
        state["_sz_upload_msg"] = ("error", exc.one_line())
        return
    _set_form(sizing_form.sizing_form_values(cfg), cfg.tiers)
    notes = []  # the model, GPU and LRU model are the sidebar's, shared by every page
    model, gpu = MODELS.canonical(cfg.model), GPUS.canonical(cfg.gpu)
    if model:
        state["kv_model"] = model
    else:
        notes.append(f"model '{cfg.model}' is not a preset: the sidebar's model is used")
    if gpu:
        state["kv_gpu"] = gpu
        state["_sz_gpu_for"] = gpu
    else:
        notes.append(f"GPU '{cfg.gpu}' is not a preset: the sidebar's GPU is used")
    state["kv_eviction"] = cfg.eviction
    state["_sz_upload_msg"] = ("info", f"loaded {f.name}" + (f" ({'; '.join(notes)})" if notes else ""))


if "_sz_ready" not in state:
    base = default_config()
    _set_form(sizing_form.sizing_form_values(base), base.tiers)
    _gpu_preset(ctx.gpu_name)
    state["_sz_ready"] = True
if state.get("_sz_gpu_for") != ctx.gpu_name:
    _gpu_preset(ctx.gpu_name)
for key, widget in (("model.name", ctx.model_name), ("gpu.name", ctx.gpu_name), ("search.eviction", ctx.eviction)):
    state[f"sz.{key}"] = widget

st.caption(f"{ctx.label}: keep DRAM, expand it, add a local SSD, add shared flash, tier both, or recompute only? "
           "Six candidates under three lenses, every figure of the table replayed by the tier simulator "
           "(`kvtrace size`).")

cfg_cols = st.columns([2, 1])
cfg_cols[0].file_uploader("Load a tiers.toml", type=["toml"], key="sz_upload", on_change=_load_toml,
                          help="The file `kvtrace size --config` reads (sample_traces/tiers.example.toml).")
msg = state.get("_sz_upload_msg")
if msg:
    (st.error if msg[0] == "error" else st.info)(msg[1])
if state.get("sz.search.cache_rules") not in ("ideal", "vllm", "sglang"):
    state["sz.search.cache_rules"] = "ideal"
st.radio("Cache rules", ["ideal", "vllm", "sglang"], key="sz.search.cache_rules", horizontal=True,
         help="ideal: kvtrace's model; vllm / sglang: every replay applies the engine's reuse rules to the tiers "
              "(a request's last block recomputed, only full blocks stored): [search] cache_rules.")
state.setdefault("sz_edit", False)
cfg_cols[1].toggle("Edit the configuration", key="sz_edit",
                   help="A form with every key of tiers.toml, one tab per section and tier.")
if state["sz_edit"]:
    with st.form("sizing_form"):
        tabs = st.tabs([*SECTIONS, *(f"tiers.{t}" for t in TIERS)])
        for tab, (sec, keys) in zip(tabs, SECTIONS.items()):  # SECTIONS: SLO and money first
            cols = tab.columns(3)
            for i, (k, kind) in enumerate(keys.items()):
                name = f"{sec}.{k}"
                if name == "search.cache_rules":
                    continue  # the Cache rules radio above the form sets it
                side = FROM_SIDEBAR.get(name)
                cols[i % 3].text_input(k, key=f"sz.{name}", disabled=side is not None,
                                       help=f"set with the sidebar's {side} selector" if side else
                                       f"[{sec}] {k}: {kind}; empty = not set (the default applies)")
        for tab, tier in zip(tabs[len(SECTIONS):], TIERS):
            if tier in OPTIONAL_TIERS:
                tab.checkbox(f"include the {tier} tier (without it, its candidates are dropped)", key=f"sz.tier.{tier}")
            cols = tab.columns(3)
            for i, (k, kind) in enumerate(TIER_KEYS.items()):
                cols[i % 3].text_input(k, key=f"sz.tiers.{tier}.{k}",
                                       help=f"[tiers.{tier}] {k}: {kind}; empty = not set")
        st.form_submit_button("Recommend", type="primary")

values = {k[3:]: v for k, v in state.items() if k.startswith("sz.") and not k.startswith("sz.tier.")}
tiers = ("dram", *(t for t in OPTIONAL_TIERS if state.get(f"sz.tier.{t}")))
try:
    config = sizing_form.sizing_config_from_form(values, tiers)
except KvtraceError as exc:
    st.error(exc.one_line())
    st.stop()
toml_text = config.to_toml()
st.download_button("Download this config (tiers.toml)", toml_text, file_name="tiers.toml", mime="application/toml")

try:
    result = cached.sizing(ctx.key, toml_text, ctx.label, _trace=ctx.trace, _config=config)
except KvtraceError as exc:
    st.error(exc.one_line())
    st.stop()

# ---------------------------------------------------------------- recommendation
rec = result.recommendation
fig = rec.figures
with st.container(border=True):
    headline = rec.headline or f"recommendation: {CANDIDATE_TEXT[rec.candidate]}"  # the library's verdict line
    st.subheader(_md(headline[:1].upper() + headline[1:]))
    if rec.feasible:
        st.success("Meets the SLO, the read bandwidth and the endurance limits.", icon=":material/check_circle:")
    else:
        st.warning("No configuration meets every constraint (SLO, bandwidth, endurance): the figures below are "
                   "the closest one's, not a recommendation."
                   + ("\n\n**What would meet them:**\n" + "\n".join(f"- {_md(n)}" for n in rec.needed)
                      if rec.needed else ""), icon=":material/warning:")
    inc, before_p99, before_mean = (fig.get("incremental_cost_usd_per_month"), fig.get("before_service_time_p99_ms"),
                                    fig.get("before_service_time_mean_ms"))
    p99, mean = fig.get("service_time_p99_ms"), fig.get("service_time_mean_ms")
    m = st.columns(5)
    m[0].metric("monthly cost", money(fig.get("cost_usd_per_month")), delta_color="inverse",
                delta=None if inc is None else f"{signed_money(inc)} vs today")
    m[1].metric("net benefit per month", money(fig.get("net_usd_per_month")))
    m[2].metric("P99 reusable-prefix time", milliseconds(p99), delta_color="inverse",
                delta=None if None in (p99, before_p99) else f"{p99 - before_p99:+,.1f} ms vs today")
    m[3].metric("mean reusable-prefix time", milliseconds(mean), delta_color="inverse",
                delta=None if None in (mean, before_mean) else f"{mean - before_mean:+,.1f} ms vs today")
    m[4].metric("break-even realisation", rate(fig.get("break_even_realisation")),
                help=f"Share of freed GPU time that must become money; assumed {rate(config.realisation)}.")
    if config.loaded:  # [slo] ttft targets: every same-SLO candidate was simulated with queues
        head, neck = fig.get("load_headroom_factor"), fig.get("headroom_bottleneck") or fig.get("loaded_bottleneck")
        u = st.columns(4)
        u[0].metric("P99 TTFT under load", milliseconds(fig.get("loaded_ttft_p99_ms")),
                    help=f"At the replayed load; target {config.ttft_slo_text()}.")
        u[1].metric("mean TTFT under load", milliseconds(fig.get("loaded_ttft_mean_ms")))
        u[2].metric("load headroom", "-" if head is None else f"{head:.2f}x",
                    help="The highest multiple of the replayed load at which the TTFT targets still hold (2 %).")
        u[3].metric("saturates first", neck or "-")
    st.markdown("\n".join(f"- {_md(r)}" for r in rec.reasons))
    if rec.risks:
        st.markdown("**Risks**\n" + "\n".join(f"- {_md(r)}" for r in rec.risks))
    if rec.whatif_command:
        st.caption("Replay the recommendation with the tier simulator:")
        st.code(rec.whatif_command, language="sh")

# ---------------------------------------------------------------- candidates
st.subheader("Candidates under the three lenses")
state.setdefault("sz_lens", LENSES[0])
lens = st.radio("Lens", LENSES, key="sz_lens", horizontal=True, label_visibility="collapsed")
t = sizing_form.sizing_table(result, lens)
st.caption(LENS_TEXT.get(lens, ""))
st.dataframe(
    pl.DataFrame({
        "rank": t["rank"],
        "candidate": [CANDIDATE_TEXT.get(c, c) for c in t["candidate"]],
        "configuration": [c or "-" for c in t["config"]],
        "admission": [p or "-" for p in t["policy"]],
        "DRAM": [rate(x) for x in t["dram_prefix_token_hit_rate"]],
        "SSD/flash": [rate(x) for x in t["ssd_prefix_token_hit_rate"]],
        "mean": [milliseconds(x) for x in t["service_time_mean_ms"]],
        "P99": [milliseconds(x) for x in t["service_time_p99_ms"]],
        "$/month": [money(x) for x in t["cost_usd_per_month"]],
        "net $/month": [money(x) for x in t["net_usd_per_month"]],
        "break-even": [rate(x) for x in t["break_even_realisation"]],
        **({"TTFT P99 under load": [milliseconds(x) for x in t["loaded_ttft_p99_ms"]],
            "headroom": ["-" if x is None else f"{x:.2f}x" for x in t["load_headroom_factor"]],
            "saturates first": [x or "-" for x in t["headroom_bottleneck"]]}
           if config.loaded else {}),
        "feasible": ["yes" if f else "no" for f in t["feasible"]],
        "reasons": [r or "" for r in t["reasons"]],
    }), hide_index=True, key=f"sz_table_{lens}")

# ---------------------------------------------------------------- charts
for spec in cached.sizing_charts(ctx.key, toml_text, _result=result):
    st.vega_lite_chart(spec)

# ---------------------------------------------------------------- downloads
st.subheader("Downloads")
d = st.columns(4)
d[0].download_button("Result (JSON)", json.dumps(json_safe(result.to_dict()), indent=2), file_name="sizing.json",
                     mime="application/json")
report_id = f"{ctx.key}|{toml_text}"
if state.get("_sz_report_for") == report_id:
    md, html = cached.sizing_reports(ctx.key, toml_text, _result=result)
    d[1].download_button("Report (Markdown)", md, file_name="sizing.md", mime="text/markdown")
    d[2].download_button("Report (HTML)", html, file_name="sizing.html", mime="text/html")
elif d[1].button("Build the report", help="Markdown and a self-contained HTML page with the charts "
                                         "(a few seconds: the charts are rendered)."):
    state["_sz_report_for"] = report_id
    st.rerun()
st.caption(f"{result.info.get('replays', 0)} replays, {result.info.get('search_points', 0)} search points, "
           f"computed in {result.info.get('elapsed_s', 0):.2f} s · sizes: DRAM today "
           f"{format_bytes(config.current_dram_bytes)} per node, {config.nodes} node(s).")
