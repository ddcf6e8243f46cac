"""Overview: the ``kvtrace stats`` figures, arrivals, length and reuse-time
distributions, and the top shared prefixes."""

import polars as pl
import streamlit as st
from kvtrace.app import cached, charts, sidebar

from kvtrace.results.present import count, format_bytes, format_seconds, rate

ctx = sidebar.trace_context()
result = cached.stats(ctx.key, ctx.model_name, _trace=ctx.trace)
tables = cached.overview_tables(ctx.key, _trace=ctx.trace)
s = result.summary

st.title("Overview")
st.caption(f"{ctx.label} · {s['source_format']} · {s['block_tokens']} tokens per block · the figures of "
           f"`kvtrace stats` for {s['model']} ({s['kv_bytes_per_token']:,} B/token)")
for w in s["warnings"]:
    st.warning(w)

cards = [
    ("requests", count(s["requests"])),
    ("duration", format_seconds(s["duration_s"])),
    ("arrival rate (mean)", f"{s['arrival_rate_per_s']:.3g} /s" if s["arrival_rate_per_s"] else "-"),
    ("arrivals per minute (mean / peak)", f"{s['mean_arrivals_per_minute']:.1f} / {s['peak_arrivals_per_minute']}"),
    ("block accesses", count(s["block_accesses"])),
    ("distinct blocks", count(s["distinct_blocks"])),
    ("sessions", count(s["sessions"])),
    ("input tokens", count(s["input_tokens"])),
    ("output tokens", count(s["output_tokens"])),
    ("distinct KV bytes", format_bytes(s["distinct_kv_bytes"])),
    ("KV bytes accessed", format_bytes(s["accessed_kv_bytes"])),
    ("accesses that re-reference a block", rate(s["rereference_share"])),
]
for row in range(0, len(cards), 4):
    for col, (label, value) in zip(st.columns(4), cards[row:row + 4]):
        col.metric(label, value)

left, right = st.columns(2)
with left:
    st.altair_chart(charts.arrivals(tables["arrivals"]))
    st.altair_chart(charts.log_histogram(tables["reuse_times"], x_title="seconds since the block's previous access",
                                         y_title="block accesses", title="Reuse time", unit="s",
                                         empty="no block is accessed twice"))
with right:
    st.altair_chart(charts.log_histogram(tables["input_lengths"], x_title="prompt tokens", y_title="requests",
                                         title="Input length", unit="tokens", empty="no requests"))
    st.markdown("**Distributions** (tokens; reuse time in seconds)")
    st.dataframe(result.lengths, hide_index=True, key="lengths",
                 column_config={c: st.column_config.NumberColumn(format="%.4g")
                                for c in result.lengths.columns if c not in ("quantity", "count")})

st.subheader("Top shared prefixes (prefix bytes x reuses)")
top = result.top_prefixes
st.dataframe(
    pl.DataFrame({
        "hash": [str(h) for h in top["hash"]],
        "depth (blocks)": top["depth_blocks"],
        "prefix": [format_bytes(b) for b in top["prefix_bytes"]],
        "reuses": top["reuses"],
        "first seen": [format_seconds(x) for x in top["first_seen_s"]],
        "last seen": [format_seconds(x) for x in top["last_seen_s"]],
        "bytes x reuses": [format_bytes(b) for b in top["bytes_x_reuses"]],
    }),
    hide_index=True, key="top_prefixes",
)
for name, g in result.groups.items():
    st.subheader(f"By {name}")
    st.dataframe(g, hide_index=True, key=f"group_{name}")
