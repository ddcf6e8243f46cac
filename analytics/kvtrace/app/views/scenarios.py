"""Scenarios: the trace replayed under a scenario file's events (``kvtrace scenario``):
the file to edit or upload, the side-by-side table, the prestaging figures, the
timeline with the events marked, and the JSON and report to download."""

import json
import sys

import polars as pl
import streamlit as st
from kvtrace.app import cached, sidebar

from kvtrace.analyses.scenario import scenario_from_dict
from kvtrace.errors import KvtraceError
from kvtrace.outputs import json_safe
from kvtrace.results.scenario_report import prefetch_rows, prewarm_rows, table_rows, timeline_chart

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

ctx = sidebar.trace_context()
st.title("Scenarios")
state = st.session_state


def _example() -> str:
    from kvtrace.app import launcher

    return (launcher.sample_dir() / "scenario.example.toml").read_text(encoding="utf-8")


def _load_file() -> None:
    f = state.get("sc_upload")
    if f is None:
        return
    try:
        state["sc_text"] = f.getvalue().decode("utf-8")
        state["_sc_msg"] = ("info", f"loaded {f.name}")
    except UnicodeDecodeError as exc:
        state["_sc_msg"] = ("error", f"{f.name}: not UTF-8 text (byte {exc.start})")


if "sc_text" not in state:
    state["sc_text"] = _example()

st.caption(f"{ctx.label}: cold start, restored metadata, migration, a lost flash target, a catalog outage, a model "
           "rollout, TTL and prestaging, each replayed exactly beside the baseline, with TTFT under the load model "
           f"(`kvtrace scenario`). The model and GPU are the sidebar's ({ctx.model_name}, {ctx.gpu_name}); "
           "everything else is the file's.")
cols = st.columns([2, 1])
cols[0].file_uploader("Load a scenario.toml", type=["toml"], key="sc_upload", on_change=_load_file,
                      help="The file `kvtrace scenario --config` reads (sample_traces/scenario.example.toml).")
if cols[1].button("Reset to the example file"):
    state["sc_text"] = _example()
    state.pop("_sc_msg", None)
msg = state.get("_sc_msg")
if msg:
    (st.error if msg[0] == "error" else st.info)(msg[1])
st.text_area("Scenario file (TOML)", key="sc_text", height=360,
             help="Tiers, load model, run options and the scenarios with their events: every key is documented in "
                  "sample_traces/scenario.example.toml.")
run = st.button("Run the scenarios", type="primary")
if run:
    state["sc_ran"] = state["sc_text"]
text = state.get("sc_ran")
if text is None:
    st.info("Edit or upload a scenario file, then run it. Prestaging needs a trace with sessions "
            "(the mixed.parquet and agent_bailian.jsonl samples have them).")
    st.stop()

try:
    data = tomllib.loads(text)
    cfg = scenario_from_dict(data, "scenario.toml")
except tomllib.TOMLDecodeError as exc:
    st.error(f"scenario.toml: not valid TOML: {exc}", icon=":material/error:")
    st.stop()
except KvtraceError as exc:
    st.error(exc.one_line(), icon=":material/error:")
    st.stop()
try:
    result = cached.scenarios(ctx.key, text, ctx.model_name, ctx.gpu_name, ctx.trace, cfg)
except KvtraceError as exc:
    st.error(exc.one_line(), icon=":material/error:")
    st.stop()

head, rows = table_rows(result.table)
st.subheader("Side by side")
st.dataframe(pl.DataFrame(rows, schema=head, orient="row"), hide_index=True, use_container_width=True)
for (head, rows), title in ((prefetch_rows(result.table), "Prestaging"), (prewarm_rows(result.table), "Prewarming")):
    if rows:
        st.subheader(title)
        st.dataframe(pl.DataFrame(rows, schema=head, orient="row"), hide_index=True, use_container_width=True)
st.subheader("Timeline")
st.altair_chart(timeline_chart(result), use_container_width=False)
st.subheader("Events")
ev = result.events
if ev.height:
    st.dataframe(ev.select("scenario", "text", "at_s", "first_request", "dropped_blocks", "dropped_bytes",
                           "lost_bytes"), hide_index=True, use_container_width=True)
st.caption(f"Assumed: {result.info['assumptions']}.")
dl = st.columns(3)
dl[0].download_button("JSON", json.dumps(json_safe(result.to_dict()), indent=1), file_name="scenarios.json",
                      mime="application/json")
md, html = cached.scenario_reports(ctx.key, text, ctx.model_name, ctx.gpu_name, ctx.label, result)
dl[1].download_button("Report (Markdown)", md, file_name="scenarios.md", mime="text/markdown")
dl[2].download_button("Report (HTML)", html, file_name="scenarios.html", mime="text/html")
