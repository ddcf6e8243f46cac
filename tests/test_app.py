"""The dashboard (``app/``, ``kvtrace app``) under Streamlit's AppTest, and its modules
without Streamlit (:mod:`kvtrace.app.sources`, :mod:`kvtrace.app.launcher`,
:mod:`kvtrace.results.chart_data`, ...).

One parametrised test launches every page; the page tests drive widgets and check
that the numbers shown change and equal the library's results, computed here
independently from the trace file. The real-browser run is ``test_app_browser.py``.
"""

from __future__ import annotations

import gzip
import hashlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from kvtrace.app import choices, launcher, sizing_form, sources
from kvtrace.results import chart_data
from kvtrace.cli import app as cli_app
from kvtrace.analyses.curves import compute_curve
from kvtrace.ingest import load_trace
from kvtrace.model import resolve_gpu, resolve_model
from kvtrace.analyses.response import ResponseModel
from kvtrace.analyses.stats import trace_stats
from kvtrace.units import format_bytes
from kvtrace.analyses.whatif import TierConfig, simulate

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest

ROOT = Path(__file__).resolve().parent.parent
ENTRY = ROOT / "analytics" / "kvtrace" / "app" / "kvtrace_app.py"
CHAT = ROOT / "sample_traces" / "chat.jsonl"
MIXED = ROOT / "sample_traces" / "mixed.parquet"
PAGES = ("views/overview.py", "views/curves.py", "views/whatifs.py", "views/sizing.py", "views/scenarios.py")
GiB = 2**30
TIMEOUT = 120  # seconds per script run: the first one compiles the kernels when the Numba cache is cold


def pct(x: float) -> str:
    return f"{100 * x:.2f}%"


@pytest.fixture(autouse=True)
def _app_env(monkeypatch):
    """As ``streamlit run`` does: the entry file's directory on sys.path; no launch trace."""
    monkeypatch.syspath_prepend(str(ENTRY.parent))
    for k in (launcher.ENV_TRACE, launcher.ENV_FORMAT, launcher.ENV_BLOCK_TOKENS, launcher.ENV_SHARE_TENANTS,
              launcher.ENV_SAMPLES, launcher.ENV_DATA_DIR, launcher.ENV_MAX_TRACE_BYTES,
              launcher.ENV_LOG_OPTIONS):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture(scope="module")
def chat():
    return load_trace(CHAT)


@pytest.fixture(scope="module")
def mixed():
    return load_trace(MIXED)


def launch(page: str | None = None) -> AppTest:
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT).run()
    if page:
        at.switch_page(page).run()
    clean(at)
    return at


def clean(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def table(at: AppTest, column: str) -> pl.DataFrame:
    """The (first) table shown with this column."""
    for df in at.dataframe:
        if column in df.value.columns:
            return pl.from_pandas(df.value)
    raise AssertionError(f"no table with a column '{column}'")


def charts(at: AppTest) -> list[list[pa.Table]]:
    """Each Vega-Lite chart's datasets, decoded."""
    out = []
    for el in at.get("vega_lite_chart"):
        out.append([pa.ipc.open_stream(ds.data.data).read_all() for ds in el.proto.datasets])
    return out


def set_sidebar(at: AppTest, key: str, value) -> AppTest:
    widget = next(w for kind in ("selectbox", "radio", "text_input", "checkbox", "number_input")
                  for w in getattr(at.sidebar, kind) if w.key == key)
    widget.set_value(value)
    at.run()
    clean(at)
    return at


# --------------------------------------------------------------------------- every page


@pytest.mark.parametrize("page", PAGES)
def test_every_page_launches(page):
    at = launch(page)
    assert not at.error, [e.value for e in at.error]
    assert at.title, "the page drew no title"
    assert at.sidebar.selectbox, "the shared sidebar is missing"


# --------------------------------------------------------------------------- overview


def test_overview_shows_the_stats_figures_and_follows_the_model(chat):
    at = launch()
    s = trace_stats(chat, resolve_model("Llama-3.1-70B")).summary
    m = metrics(at)
    assert m["requests"] == f"{s['requests']:,}" == "4,000"
    assert m["block accesses"] == f"{s['block_accesses']:,}"
    assert m["distinct blocks"] == f"{s['distinct_blocks']:,}"
    assert m["distinct KV bytes"] == format_bytes(s["distinct_kv_bytes"])
    assert m["accesses that re-reference a block"] == pct(s["rereference_share"])
    assert m["arrivals per minute (mean / peak)"] == (f"{s['mean_arrivals_per_minute']:.1f} / "
                                                       f"{s['peak_arrivals_per_minute']}")

    set_sidebar(at, "kv_model", "Llama-3.1-8B")
    s8 = trace_stats(chat, resolve_model("Llama-3.1-8B")).summary
    m8 = metrics(at)
    assert m8["distinct KV bytes"] != m["distinct KV bytes"]
    assert m8["distinct KV bytes"] == format_bytes(s8["distinct_kv_bytes"])
    assert m8["KV bytes accessed"] == format_bytes(s8["accessed_kv_bytes"])
    assert m8["requests"] == m["requests"]  # the model changes bytes only


def test_overview_tables_and_charts_are_the_librarys(mixed):
    at = launch()
    set_sidebar(at, "kv_sample", "mixed.parquet")
    result = trace_stats(mixed, resolve_model("Llama-3.1-70B"))
    assert metrics(at)["requests"] == "3,000"
    top = table(at, "hash")
    assert top["hash"].to_list() == [str(h) for h in result.top_prefixes["hash"]]
    assert top["reuses"].to_list() == result.top_prefixes["reuses"].to_list()
    lengths = table(at, "quantity")
    assert lengths["quantity"].to_list() == ["input_tokens", "output_tokens", "reuse_time_s"]
    np.testing.assert_allclose(lengths["p99"].to_numpy(), result.lengths["p99"].to_numpy())
    # per-type and per-tenant tables, as kvtrace stats prints them
    assert set(result.groups) == {"type", "tenant"}
    assert table(at, "type")["requests"].to_list() == result.groups["type"]["requests"].to_list()
    # the three charts: arrivals, reuse time, input length
    data = charts(at)
    assert len(data) == 3
    arrivals = data[0][0]
    assert sum(arrivals.column("requests").to_pylist()) == 3000
    assert max(arrivals.column("requests").to_pylist()) == result.summary["peak_arrivals_per_minute"]


# --------------------------------------------------------------------------- curves


def _at_tiers(at) -> pl.DataFrame:
    return table(at, "tier")


def test_curves_numbers_equal_compute_curve_and_follow_widgets(chat):
    at = launch("views/curves.py")
    caps = [64 * GiB, 64 * GiB + 2**40]  # DRAM 64GiB, DRAM + flash 1TiB: the defaults (choices.DEFAULT_TIERS)
    ref = compute_curve(chat, capacities=caps)
    m = metrics(at)
    assert m["ceiling (prefix tokens)"] == pct(ref.ceiling["prefix_token_hit_rate"])
    assert m["capacity to reach the ceiling"] == format_bytes(ref.ceiling["capacity_bytes"])
    knee80 = ref.knees.filter((pl.col("metric") == "prefix_token_hit_rate") & (pl.col("fraction") == 0.8))
    assert m["capacity for 80% of the ceiling"] == format_bytes(knee80["capacity_bytes"][0])
    tiers = _at_tiers(at)
    assert tiers["tier"].to_list() == ["DRAM", "DRAM + flash"]
    assert tiers["prefix tokens"].to_list() == [pct(x) for x in ref.curve["prefix_token_hit_rate"]]
    assert tiers["requests"].to_list() == [pct(x) for x in ref.curve["request_hit_rate"]]
    assert tiers["compute saved"].to_list() == [pct(x) for x in ref.curve["compute_saved_rate"]]
    # the chart's line is the library's default curve; the tiers are drawn at DRAM and DRAM + flash
    full = compute_curve(chat)
    line, ceiling, knees, marks = charts(at)[0]
    expect = full.curve.filter(pl.col("capacity_bytes") > 0)
    np.testing.assert_allclose(line.column("rate").to_numpy(), expect["prefix_token_hit_rate"].to_numpy())
    assert ceiling.column("rate").to_pylist() == [full.ceiling["prefix_token_hit_rate"]]
    assert knees.column("capacity_bytes").to_pylist() == full.knees.filter(
        pl.col("metric") == "prefix_token_hit_rate")["capacity_bytes"].to_list()
    np.testing.assert_allclose(marks.column("capacity_bytes").to_numpy(), [64 * GiB, 64 * GiB + 2**40])

    # metric switch: the ceiling card follows
    next(r for r in at.radio if r.key == "curve_metric").set_value("requests")
    at.run()
    clean(at)
    assert metrics(at)["ceiling (requests)"] == pct(ref.ceiling["request_hit_rate"])

    # a smaller DRAM: the row changes and equals the library at 16 GiB
    next(t for t in at.text_input if t.key == "curve_dram").set_value("16GiB")
    at.run()
    clean(at)
    ref16 = compute_curve(chat, capacities=[16 * GiB, 16 * GiB + 2**40])
    tiers16 = _at_tiers(at)
    assert tiers16["capacity"].to_list() == ["16 GiB", "1.02 TiB"]
    assert tiers16["prefix tokens"].to_list() == [pct(x) for x in ref16.curve["prefix_token_hit_rate"]]
    assert tiers16["prefix tokens"][0] != tiers["prefix tokens"][0]

    # the model switch rescales bytes: same capacity in bytes, fewer bytes per token, more hits
    set_sidebar(at, "kv_model", "Llama-3.1-8B")
    ref8 = compute_curve(chat, model=resolve_model("Llama-3.1-8B"), capacities=[16 * GiB, 16 * GiB + 2**40])
    tiers8 = _at_tiers(at)
    assert tiers8["prefix tokens"].to_list() == [pct(x) for x in ref8.curve["prefix_token_hit_rate"]]
    assert tiers8["prefix tokens"][0] != tiers16["prefix tokens"][0]
    assert metrics(at)["capacity to reach the ceiling"] == format_bytes(ref8.ceiling["capacity_bytes"])

    # the flat LRU model
    set_sidebar(at, "kv_eviction", "flat")
    ref_flat = compute_curve(chat, model=resolve_model("Llama-3.1-8B"), eviction="flat",
                             capacities=[16 * GiB, 16 * GiB + 2**40])
    assert _at_tiers(at)["prefix tokens"].to_list() == [pct(x) for x in ref_flat.curve["prefix_token_hit_rate"]]


def test_curves_under_vllm_rules_equal_engine_curve(chat):
    """The Cache rules radio: the tiers table, the ceiling and the chart's line equal
    engine_curve's; the rules are stated; sampling is off."""
    from kvtrace.analyses.engine import engine_curve

    at = launch("views/curves.py")
    next(r for r in at.radio if r.key == "curve_rules").set_value("vllm")
    at.run()
    clean(at)
    caps = [64 * GiB, 64 * GiB + 2**40]
    ref = engine_curve(chat, "vllm", display_capacities=caps)
    assert metrics(at)["ceiling (prefix tokens)"] == pct(ref.ceiling["prefix_token_hit_rate"])
    tiers = _at_tiers(at)
    assert tiers["prefix tokens"].to_list() == [pct(x) for x in ref.display["prefix_token_hit_rate"]]
    assert tiers["prefix tokens"].to_list() != [pct(x) for x in compute_curve(chat, capacities=caps)
                                                .curve["prefix_token_hit_rate"]]
    line = charts(at)[0][0]
    np.testing.assert_allclose(line.column("rate").to_numpy(),
                               ref.curve.filter(pl.col("capacity_bytes") > 0)["prefix_token_hit_rate"].to_numpy())
    assert any("Rules applied: vLLM v1" in i.value for i in at.info)
    assert next(t for t in at.toggle if t.key == "curve_sample").disabled


def test_curves_sampling_shows_the_error_estimate(chat):
    at = launch("views/curves.py")
    assert not at.warning
    next(t for t in at.toggle if t.key == "curve_sample").set_value(True)
    at.run()
    clean(at)
    ref = compute_curve(chat, sample_rate=0.01)
    err = ref.info["error_estimate"]
    text = at.warning[0].value
    assert "APPROXIMATE" in text and "sample rate 0.01" in text
    assert f"mean {100 * err['mean_standard_error']:.2f} pts" in text
    assert f"max {100 * err['max_standard_error']:.2f} pts" in text
    line = charts(at)[0][1]  # the first layer is the +-2 SE band, then the line
    np.testing.assert_allclose(line.column("se").to_numpy(),
                               ref.curve.filter(pl.col("capacity_bytes") > 0)["prefix_token_hit_rate_se"].to_numpy())
    next(s for s in at.select_slider if s.key == "curve_rate").set_value(0.1)
    at.run()
    clean(at)
    err10 = compute_curve(chat, sample_rate=0.1).info["error_estimate"]
    assert f"mean {100 * err10['mean_standard_error']:.2f} pts" in at.warning[0].value


def test_curves_group_breakdown(mixed):
    at = launch("views/curves.py")
    set_sidebar(at, "kv_sample", "mixed.parquet")
    by = next(s for s in at.selectbox if s.key == "curve_by")
    assert by.options == ["none", "type", "tenant", "turn", "session-length"]
    by.set_value("type")
    at.run()
    clean(at)
    ref = compute_curve(mixed, by="type")
    line = pl.from_arrow(charts(at)[0][0])
    assert sorted(line["series"].unique().to_list()) == sorted(["all", *ref.info["groups"]])
    for g in ref.info["groups"]:
        want = ref.by_group.filter((pl.col("group_name") == g)
                                   & (pl.col("capacity_bytes") > 0))["prefix_token_hit_rate"]
        np.testing.assert_allclose(line.filter(pl.col("series") == g)["rate"].to_numpy(), want.to_numpy())


def test_curves_bad_capacity_is_one_line(chat):
    at = launch("views/curves.py")
    next(t for t in at.text_input if t.key == "curve_dram").set_value("64 furlongs")
    at.run()
    clean(at)
    assert len(at.error) == 1
    msg = at.error[0].value
    assert "furlongs" in msg and "\n" not in msg and "Traceback" not in msg


# --------------------------------------------------------------------------- what-ifs


def _whatif_ref(trace, dram: str, flash: str, policy: str, model="Llama-3.1-70B", cache_rules="ideal") -> dict:
    gpu = resolve_gpu("H100")
    response = ResponseModel(dram_fixed_s=0.2e-3, dram_bytes_per_s=25e9, flash_fixed_s=1e-3, flash_bytes_per_s=6e9,
                             overhead_s=1e-3, recompute_flops_per_s=gpu.effective_flops)
    return simulate(trace, TierConfig(dram, flash_bytes=flash, policy=policy), model=resolve_model(model), gpu=gpu,
                    response=response, cache_rules=cache_rules).summary


def test_whatifs_under_engine_rules_equal_simulate(chat):
    """The Cache rules radio: every row is simulate(cache_rules=...)'s, the rules are stated."""
    at = launch("views/whatifs.py")
    next(w for w in at.multiselect if w.key == "wi_policies").set_value(["all"])
    next(r for r in at.radio if r.key == "wi_rules").set_value("vllm")
    at.button[0].click()
    at.run()
    clean(at)
    row = table(at, "config").row(0, named=True)
    ref = _whatif_ref(chat, "64GiB", "1TiB", "all", cache_rules="vllm")
    ideal = _whatif_ref(chat, "64GiB", "1TiB", "all")
    assert row["DRAM"] == pct(ref["dram_prefix_token_hit_rate"]) != pct(ideal["dram_prefix_token_hit_rate"])
    assert row["SSD/flash"] == pct(ref["flash_prefix_token_hit_rate"])
    assert row["p99"] == f"{ref['service_time_p99_ms']:,.1f} ms"
    assert any("Cache rules (vllm): vLLM v1" in c.value for c in at.caption)


def test_whatifs_table_equals_simulate_and_follows_the_form(chat):
    at = launch("views/whatifs.py")
    t = table(at, "config")
    assert t["config"].to_list() == ["dram=64 GiB flash=1 TiB all", "dram=64 GiB flash=1 TiB freq>=2",
                                     "dram=64 GiB flash=1 TiB tinylfu"]
    for row, policy in zip(t.iter_rows(named=True), ("all", "second-hit", "tinylfu")):
        ref = _whatif_ref(chat, "64GiB", "1TiB", policy)
        assert row["DRAM"] == pct(ref["dram_prefix_token_hit_rate"])
        assert row["SSD/flash"] == pct(ref["flash_prefix_token_hit_rate"])
        assert row["miss"] == pct(ref["prefix_token_miss_rate"])
        assert row["flash writes/day"] == format_bytes(ref["flash_write_bytes_per_day"])
        assert row["p99"] == f"{ref['service_time_p99_ms']:,.1f} ms"
    assert len(charts(at)) == 2  # frontier and latency
    lat = pl.from_arrow(charts(at)[1][0])
    ref_all = _whatif_ref(chat, "64GiB", "1TiB", "all")
    got = lat.filter((pl.col("config") == "dram=64 GiB flash=1 TiB all") & (pl.col("percentile") == "p99"))
    assert got["ms"][0] == pytest.approx(ref_all["service_time_p99_ms"])

    next(w for w in at.text_input if w.key == "wi_dram").set_value("16GiB")
    next(w for w in at.text_input if w.key == "wi_flash").set_value("256GiB")
    next(w for w in at.multiselect if w.key == "wi_policies").set_value(["all"])
    at.button[0].click()  # the form's submit button
    at.run()
    clean(at)
    t2 = table(at, "config")
    ref = _whatif_ref(chat, "16GiB", "256GiB", "all")
    assert t2["config"].to_list() == ["dram=16 GiB flash=256 GiB all"]
    assert t2["DRAM"][0] == pct(ref["dram_prefix_token_hit_rate"]) != t["DRAM"][0]
    assert t2["SSD/flash"][0] == pct(ref["flash_prefix_token_hit_rate"])

    set_sidebar(at, "kv_model", "Llama-3.1-8B")
    ref8 = _whatif_ref(chat, "16GiB", "256GiB", "all", model="Llama-3.1-8B")
    assert table(at, "config")["DRAM"][0] == pct(ref8["dram_prefix_token_hit_rate"]) != t2["DRAM"][0]


def test_whatifs_invalid_options_are_one_line():
    at = launch("views/whatifs.py")
    next(w for w in at.selectbox if w.key == "wi_promotion").set_value("copy")  # needs inclusive tiers
    at.button[0].click()
    at.run()
    clean(at)
    assert len(at.error) == 1 and "inclusive" in at.error[0].value and "\n" not in at.error[0].value


# --------------------------------------------------------------------------- sizing

def _card(at: AppTest) -> str:
    return next(h.value for h in at.subheader if h.value.startswith(("Recommendation: ", "No configuration meets")))


def _md(text: str) -> str:
    return text.replace("\\", "\\\\").replace("$", "\\$").replace("*", "\\*").replace("_", "\\_")


def _expected_card(rec) -> str:
    """The card's headline: the library's verdict line, capitalised."""
    return _md(rec.headline[:1].upper() + rec.headline[1:])


def _sizing_tables(at: AppTest) -> dict[str, pl.DataFrame]:
    """The candidate table under each lens (the lens radio switched through)."""
    from kvtrace.analyses.sizing import LENSES

    out = {}
    radio = next(w for w in at.radio if w.key == "sz_lens")
    for lens in LENSES:
        radio.set_value(lens)
        at.run()
        clean(at)
        radio = next(w for w in at.radio if w.key == "sz_lens")
        tables = [pl.from_pandas(d.value) for d in at.dataframe if "break-even" in d.value.columns]
        assert len(tables) == 1
        out[lens] = tables[0]
    radio.set_value(LENSES[0])
    at.run()
    return out


def _sz_field(at: AppTest, key: str):
    """A field of the sizing form (opened first: it is drawn only while editing)."""
    edit = next(w for w in at.toggle if w.key == "sz_edit")
    if not edit.value:
        edit.set_value(True)
        at.run()
        clean(at)
    return next(w for w in at.text_input if w.key == f"sz.{key}")


def test_sizing_page_shows_the_librarys_recommendation(chat):
    import dataclasses

    from kvtrace.analyses.sizing import LENSES, default_config, recommend

    at = launch("views/sizing.py")
    assert not at.error
    base = default_config()
    form = sizing_form.sizing_config_from_form({k[3:]: v for k, v in at.session_state.items()
                                            if k.startswith("sz.") and not k.startswith("sz.tier.")})
    assert form == base  # the fresh form is the example tiers.toml (H100 in the sidebar)
    ref = recommend(chat, base)
    assert _card(at) == _expected_card(ref.recommendation)
    m = metrics(at)
    fig = ref.recommendation.figures
    assert m["monthly cost"] == f"${fig['cost_usd_per_month']:,.2f}"
    assert m["P99 reusable-prefix time"] == f"{fig['service_time_p99_ms']:,.1f} ms"
    shown = _sizing_tables(at)
    for lens in LENSES:
        want = sizing_form.sizing_table(ref, lens)
        assert shown[lens]["configuration"].to_list() == [c or "-" for c in want["config"]]
        assert shown[lens]["P99"].to_list() == ["-" if x is None else f"{x:,.1f} ms"
                                                for x in want["service_time_p99_ms"]]
        assert shown[lens]["feasible"].to_list() == ["yes" if f else "no" for f in want["feasible"]]
    assert len(charts(at)) == 2

    # a tighter P99 target: the shown recommendation follows and equals the library's
    _sz_field(at, "slo.p99_ms").set_value("200")
    next(b for b in at.button if b.label == "Recommend").click()
    at.run()
    clean(at)
    ref2 = recommend(chat, dataclasses.replace(base, slo_p99_ms=200.0))
    assert _card(at) == _expected_card(ref2.recommendation)
    assert _sizing_tables(at)["same-slo"]["P99"].to_list() == [
        "-" if x is None else f"{x:,.1f} ms" for x in sizing_form.sizing_table(ref2, "same-slo")["service_time_p99_ms"]]
    assert _card(at) != _expected_card(ref.recommendation)

    # the sidebar's GPU is the config's: a B200 prices and computes differently
    set_sidebar(at, "kv_gpu", "B200")
    g = resolve_gpu("B200")
    ref3 = recommend(chat, dataclasses.replace(base, slo_p99_ms=200.0, gpu="B200", gpu_mfu=g.mfu,
                                               gpu_dollars_per_hour=g.dollars_per_hour,
                                               gpu_peak_tflops=g.peak_flops / 1e12))
    assert metrics(at)["monthly cost"] == f"${ref3.recommendation.figures['cost_usd_per_month']:,.2f}"
    assert _sizing_tables(at)["same-slo"]["net $/month"].to_list() == [
        f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"
        for x in sizing_form.sizing_table(ref3, "same-slo")["net_usd_per_month"]]


def test_sizing_page_under_engine_rules_is_the_librarys(chat):
    import dataclasses

    from kvtrace.analyses.sizing import default_config, recommend

    at = launch("views/sizing.py")
    next(r for r in at.radio if r.key == "sz.search.cache_rules").set_value("sglang")
    at.run()
    clean(at)
    ref = recommend(chat, dataclasses.replace(default_config(), cache_rules="sglang"))
    assert _card(at) == _expected_card(ref.recommendation)
    assert _sizing_tables(at)["same-slo"]["P99"].to_list() == [
        "-" if x is None else f"{x:,.1f} ms" for x in sizing_form.sizing_table(ref, "same-slo")["service_time_p99_ms"]]
    form = sizing_form.sizing_config_from_form({k[3:]: v for k, v in at.session_state.items()
                                                if k.startswith("sz.") and not k.startswith("sz.tier.")})
    assert form.cache_rules == "sglang" and 'cache_rules = "sglang"' in form.to_toml()


def test_sizing_card_says_when_no_configuration_is_feasible(chat):
    """A 1 ms P99 SLO no candidate meets: the card is the library's 'no configuration
    meets ...' verdict shown as a warning with what would meet it, never a
    'Recommendation:' headline or a success."""
    import dataclasses

    from kvtrace.analyses.sizing import default_config, recommend

    at = launch("views/sizing.py")
    assert at.success and not at.warning  # the default config is feasible
    _sz_field(at, "slo.p99_ms").set_value("1")
    next(b for b in at.button if b.label == "Recommend").click()
    at.run()
    clean(at)
    rec = recommend(chat, dataclasses.replace(default_config(), slo_p99_ms=1.0)).recommendation
    assert not rec.feasible and rec.needed
    assert _card(at) == _expected_card(rec) and _card(at).startswith("No configuration meets")
    assert not any(h.value.startswith("Recommendation") for h in at.subheader)
    assert not at.success
    warning = at.warning[0].value
    assert "What would meet them" in warning and all(_md(n) in warning for n in rec.needed)


def test_sizing_page_decides_under_load_when_a_ttft_target_is_set(chat):
    """The form's [slo] ttft_p99_ms and [load] fields reach the library: the card shows
    the loaded TTFT, the headroom and what saturates first, the table a column each,
    all equal to ``recommend`` on the same config; the 'unloaded' risk line is gone."""
    import dataclasses

    from kvtrace.analyses.sizing import default_config, recommend

    at = launch("views/sizing.py")
    assert "P99 TTFT under load" not in metrics(at)
    _sz_field(at, "slo.ttft_p99_ms").set_value("4000")
    _sz_field(at, "load.gpus_per_node").set_value("4")
    next(b for b in at.button if b.label == "Recommend").click()
    at.run()
    clean(at)
    ref = recommend(chat, dataclasses.replace(default_config(), slo_ttft_p99_ms=4000.0, queue_gpus_per_node=4))
    fig = ref.recommendation.figures
    assert fig["load_headroom_factor"] is not None
    m = metrics(at)
    assert m["P99 TTFT under load"] == f"{fig['loaded_ttft_p99_ms']:,.1f} ms"
    assert m["load headroom"] == f"{fig['load_headroom_factor']:.2f}x"
    assert m["saturates first"] == fig["headroom_bottleneck"]
    assert _card(at) == _expected_card(ref.recommendation)
    shown = _sizing_tables(at)["same-slo"]
    want = sizing_form.sizing_table(ref, "same-slo")
    assert shown["headroom"].to_list() == ["-" if x is None else f"{x:.2f}x" for x in want["load_headroom_factor"]]
    assert not any("unloaded" in r.value for r in at.markdown)


def test_curves_and_whatifs_start_from_the_same_sizes():
    """One set of default tier sizes (choices.DEFAULT_TIERS), with units, on both pages."""
    curves = launch("views/curves.py")
    whatifs = launch("views/whatifs.py")
    c = {w.key: w.value for w in curves.text_input}
    w = {x.key: x.value for x in whatifs.text_input}
    assert c["curve_dram"] == w["wi_dram"] == choices.DEFAULT_TIERS["dram"] == "64GiB"
    assert c["curve_flash"] == w["wi_flash"] == choices.DEFAULT_TIERS["flash"] == "1TiB"
    for at in (curves, whatifs):
        for widget in at.text_input:
            if widget.key in ("curve_dram", "curve_flash", "wi_dram", "wi_flash", "wi_local"):
                assert "unit" in widget.help, widget.key  # the help says a size carries its unit


def test_whatifs_response_defaults_are_the_librarys():
    """The response-model form starts from ResponseModel(), in the form's units, and the
    value>=v horizon is the library's default."""
    from kvtrace.analyses.value import DEFAULT_HORIZON

    at = launch("views/whatifs.py")
    got = {w.key: w.value for w in at.number_input}
    r = ResponseModel()
    assert (got["wi_dram_gbps"], got["wi_dram_ms"], got["wi_flash_gbps"], got["wi_flash_ms"], got["wi_overhead_ms"]) \
        == (r.dram_gbps, r.dram_latency_ms, r.flash_gbps, r.flash_latency_ms, r.overhead_ms)
    policies = next(w for w in at.multiselect if w.key == "wi_policies")
    assert f"over a {DEFAULT_HORIZON} horizon" in policies.help


def test_whatifs_table_shows_the_percentiles_next_to_the_shares():
    """Every column fits at 1,280 px: the percentiles follow the hit shares, narrow, with
    the configuration pinned."""
    at = launch("views/whatifs.py")
    el = next(d for d in at.dataframe if "config" in d.value.columns)
    cols = list(el.value.columns)
    assert cols[:7] == ["config", "DRAM", "SSD/flash", "miss", "compute saved", "p50", "p99"]
    import json

    config = json.loads(el.proto.columns)
    assert config["config"]["pinned"] is True
    assert all(config[c]["width"] == "small" for c in ("DRAM", "SSD/flash", "miss", "p50", "p99"))


def test_sizing_config_upload_and_errors(chat, tmp_path):
    from kvtrace.analyses.sizing import load_config, recommend

    example = (ROOT / "sample_traces" / "tiers.example.toml").read_text()
    text = example.replace('dram = "64GiB"', 'dram = "128GiB"').replace("p99_ms = 600.0", "p99_ms = 900.0")
    assert text != example
    path = tmp_path / "mine.toml"
    path.write_text(text)
    at = launch("views/sizing.py")
    at.file_uploader[0].set_value(("mine.toml", text.encode(), "application/toml"))
    at.run()
    clean(at)
    assert any("loaded mine.toml" in i.value for i in at.info)
    assert _sz_field(at, "deployment.dram").value == "128GiB"
    ref = recommend(chat, load_config(path))
    assert _card(at) == _expected_card(ref.recommendation)
    assert metrics(at)["monthly cost"] == f"${ref.recommendation.figures['cost_usd_per_month']:,.2f}"

    # a bad file: one line naming it and the key; the form keeps its values
    at.file_uploader[0].set_value(("bad.toml", b'[slo]\np99_ms = "fast"\n', "application/toml"))
    at.run()
    clean(at)
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and "bad.toml" in errors[0] and "slo.p99_ms" in errors[0] and "\n" not in errors[0]
    at.file_uploader[0].set_value(("broken.toml", b"[slo\n", "application/toml"))
    at.run()
    clean(at)
    assert len(at.error) == 1 and "invalid TOML" in at.error[0].value

    # a bad value in the form: one line, no result
    _sz_field(at, "economics.realisation").set_value("lots")
    next(b for b in at.button if b.label == "Recommend").click()
    at.run()
    clean(at)
    assert any("economics.realisation" in e.value and "expected a number" in e.value for e in at.error)
    assert not any(h.value.startswith("Recommendation: ") for h in at.subheader)


# --------------------------------------------------------------------------- sources


def _choose_upload(at: AppTest, name: str, data: bytes) -> AppTest:
    set_sidebar(at, "kv_source", "upload")
    at.sidebar.file_uploader[0].set_value((name, data, "application/octet-stream"))
    at.run()
    clean(at)
    return at


def test_upload_reads_the_file_and_keys_on_its_content():
    data = CHAT.read_bytes()
    at = _choose_upload(launch(), "mine.jsonl", data)
    assert metrics(at)["requests"] == "4,000"
    caption = at.sidebar.caption[-1].value
    assert "mine.jsonl" in caption and hashlib.sha256(data).hexdigest()[:12] in caption
    # the upload survives a page switch, and the other pages use it
    at.switch_page("views/curves.py").run()
    clean(at)
    assert "mine.jsonl" in at.sidebar.caption[-1].value


@pytest.mark.parametrize("name, data, needle", [
    ("bad.jsonl", b"this is not json\n", "bad.jsonl"),
    ("empty.jsonl", b"", "empty"),
    ("broken.parquet", b"PAR1 not really parquet", "broken.parquet"),
    # a last line cut off without a newline is skipped with a warning (README, bad input); with one it is an error
    ("cut.jsonl", b'{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 5, \n',
     "cut.jsonl"),
    ("trace.jsonl.gz", gzip.compress(b'{"timestamp": "soon"}\n'), "trace.jsonl.gz"),
])
def test_bad_upload_is_one_line_in_the_page(name, data, needle):
    at = _choose_upload(launch(), name, data)
    assert len(at.error) == 1
    msg = at.error[0].value
    assert needle in msg and "\n" not in msg and "Traceback" not in msg
    assert "kvtrace-upload-" not in msg  # the temporary copy's path is not shown
    assert not at.metric


def test_server_path_source(tmp_path):
    at = launch()
    set_sidebar(at, "kv_source", "server path")
    assert any("Choose a trace" in i.value for i in at.info)
    assert any(f"Data directory: `{MIXED.parent.resolve()}`" in c.value and "4 GiB" in c.value
               for c in at.sidebar.caption)  # the samples by default, and the size limit
    set_sidebar(at, "kv_path", "missing.jsonl")
    assert len(at.error) == 1 and at.error[0].value == "missing.jsonl: no such file"
    set_sidebar(at, "kv_path", str(MIXED))
    assert metrics(at)["requests"] == "3,000"
    set_sidebar(at, "kv_path", "mixed.parquet")  # relative to the data directory
    assert metrics(at)["requests"] == "3,000"


def test_launch_trace_opens_first(monkeypatch):
    monkeypatch.setenv(launcher.ENV_TRACE, str(MIXED))
    at = launch()
    assert metrics(at)["requests"] == "3,000"
    assert next(w for w in at.sidebar.radio if w.key == "kv_source").value == "server path"


def test_sidebar_choices_survive_a_page_switch():
    at = launch()
    set_sidebar(at, "kv_model", "Qwen2.5-7B")
    set_sidebar(at, "kv_gpu", "B200")
    for page in ("views/curves.py", "views/overview.py"):
        at.switch_page(page).run()
        clean(at)
        assert next(w for w in at.sidebar.selectbox if w.key == "kv_model").value == "Qwen2.5-7B"
        assert next(w for w in at.sidebar.selectbox if w.key == "kv_gpu").value == "B200"
    assert "Qwen2.5-7B" in at.caption[0].value


def test_results_are_cached_per_content_hash_and_parameters(tmp_path, monkeypatch):
    from kvtrace.ingest import synth

    df, meta = synth.generate("chat", 300, 4242)  # a trace no other test has cached
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    synth.write(df, meta, a, "mooncake")
    b.write_bytes(a.read_bytes())
    monkeypatch.setenv(launcher.ENV_DATA_DIR, str(tmp_path))
    at = launch()
    import kvtrace.app.cached

    calls = {"load": 0, "distances": 0}
    real_load, real_dist = sources._load, kvtrace.app.cached.reuse_distances

    def load(*args, **kw):
        calls["load"] += 1
        return real_load(*args, **kw)

    def dist(*args, **kw):
        calls["distances"] += 1
        return real_dist(*args, **kw)

    monkeypatch.setattr(sources, "_load", load)
    monkeypatch.setattr(kvtrace.app.cached, "reuse_distances", dist)
    set_sidebar(at, "kv_source", "server path")
    set_sidebar(at, "kv_path", str(a))
    at.switch_page("views/curves.py").run()
    clean(at)
    assert calls == {"load": 1, "distances": 1}
    set_sidebar(at, "kv_path", str(b))  # same bytes elsewhere: same key, nothing recomputed
    set_sidebar(at, "kv_model", "Llama-3.1-8B")  # a model switch re-bins the same distances
    assert calls == {"load": 1, "distances": 1}
    set_sidebar(at, "kv_eviction", "flat")  # another LRU model: new distances, once
    set_sidebar(at, "kv_eviction", "prefix-aware")
    set_sidebar(at, "kv_eviction", "flat")
    assert calls == {"load": 1, "distances": 2}
    b.write_bytes(a.read_bytes().replace(b'"timestamp":', b'"timestamp": ', 1))  # new bytes, same requests
    at.run()
    clean(at)
    assert calls["load"] == 2


# --------------------------------------------------------------------------- sources, chart tables


def test_trace_key_is_the_content_hash_plus_options(tmp_path):
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(CHAT.read_bytes())
    a, b = sources.load_file(CHAT), sources.load_file(copy)
    up = sources.load_upload("x.jsonl", CHAT.read_bytes())
    digest = hashlib.sha256(CHAT.read_bytes()).hexdigest()
    assert a.key == b.key == up.key == f"sha256:{digest}:auto/default/split"
    assert sources.load_file(CHAT, sources.LoadOptions(share_tenants=True)).key != a.key
    assert up.trace.meta.source == "x.jsonl"
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b"nope\n")
    loaded = sources.load_file(bad)
    assert loaded.error == f"{bad}:1: malformed JSON (Expecting value)"
    other = loaded.renamed("same.jsonl", "/elsewhere/same.jsonl")  # the same bytes under another path
    assert other.error == "/elsewhere/same.jsonl:1: malformed JSON (Expecting value)" and other.label == "same.jsonl"


def test_chart_tables_match_stats(chat):
    s = trace_stats(chat)
    arr = chart_data.arrivals_per_minute(chat)
    assert arr["requests"].sum() == s.summary["requests"]
    assert arr["requests"].max() == s.summary["peak_arrivals_per_minute"]
    assert arr["requests"].mean() == pytest.approx(s.summary["mean_arrivals_per_minute"])
    rt = chart_data.reuse_times(chat)
    row = s.lengths.filter(pl.col("quantity") == "reuse_time_s").row(0, named=True)
    assert rt.size == row["count"]
    for p in (50, 90, 99, 99.9):
        assert np.percentile(rt, p) == pytest.approx(row[f"p{p:g}"])
    hist = chart_data.reuse_time_histogram(chat)
    assert hist["count"].sum() == rt.size
    assert (hist["bin_lo"] < hist["bin_hi"]).all()
    ih = chart_data.input_length_histogram(chat)
    assert ih["count"].sum() == chat.n_requests
    x = chat.requests["input_tokens"].to_numpy()
    for r in ih.iter_rows(named=True):
        assert r["count"] == int(((x >= r["bin_lo"]) & (x < r["bin_hi"])).sum())


def test_curve_lines_and_knees(mixed):
    res = compute_curve(mixed, by="tenant")
    lines = chart_data.metric_lines(res, "compute_saved_rate")
    assert set(lines["group_name"].unique()) == {"all", *res.info["groups"]}
    np.testing.assert_allclose(lines.filter(pl.col("group_name") == "all")["rate"].to_numpy(),
                               res.curve.filter(pl.col("capacity_bytes") > 0)["compute_saved_rate"].to_numpy())
    k = chart_data.knee_points(res, "compute_saved_rate")
    assert k["capacity_bytes"].to_list() == res.knees.filter(pl.col("metric") == "compute_saved_rate")[
        "capacity_bytes"].to_list()
    assert chart_data.knee_points(res, "prefix_byte_hit_rate").height == 0
    assert chart_data.tier_marks(0, 0) == {} and chart_data.tier_marks(5, 7) == {"DRAM": 5, "DRAM + flash": 12}


def test_error_line_replaces_the_temporary_path():
    from kvtrace.errors import KvtraceError

    exc = KvtraceError("expected a number", path="/tmp/kvtrace-upload-x/t.jsonl", line=3, field="timestamp")
    assert sources.error_line(exc, "t.jsonl", internal_path="/tmp/kvtrace-upload-x/t.jsonl") == \
        "t.jsonl:3: field 'timestamp': expected a number"
    assert sources.error_line(ValueError("bad\nmore"), "f.parquet") == \
        "f.parquet: not a readable trace (ValueError)"  # a third-party message may quote the file


# --------------------------------------------------------------------------- kvtrace app


def test_app_command_starts_streamlit(monkeypatch):
    seen = {}

    class FakePopen:
        def __init__(self, argv, env):
            seen["argv"], seen["env"] = argv, env

        def wait(self, timeout=None):
            return 0

    import subprocess

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    res = CliRunner().invoke(cli_app, ["app", str(MIXED), "--port", "9123", "--headless", "--block-tokens", "512"])
    assert res.exit_code == 0, res.output
    argv, env = seen["argv"], seen["env"]
    assert argv[1:4] == ["-m", "streamlit", "run"] and argv[4] == str(launcher.APP_ENTRY)
    opts = dict(zip(argv[5::2], argv[6::2]))
    assert opts["--server.port"] == "9123" and opts["--server.headless"] == "true"
    assert opts["--server.address"] == "localhost"
    assert env[launcher.ENV_TRACE] == str(MIXED.resolve()) and env[launcher.ENV_BLOCK_TOKENS] == "512"
    assert env[launcher.ENV_DATA_DIR] == str(MIXED.parent.resolve())  # the trace's directory by default
    assert env[launcher.ENV_MAX_TRACE_BYTES] == str(4 * GiB) and opts["--server.maxUploadSize"] == "4096"

    res = CliRunner().invoke(cli_app, ["app"])
    assert res.exit_code == 0
    assert launcher.ENV_TRACE not in seen["env"]
    assert seen["argv"][seen["argv"].index("--server.headless") + 1] == "false"


def test_app_command_stops_streamlit_on_sigterm(tmp_path):
    import os
    import signal
    import socket
    import time
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTRACE_APP_")}
    proc = subprocess.Popen([sys.executable, "-m", "kvtrace.cli", "app", "--headless", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tmp_path,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://localhost:{port}/_stcore/health", timeout=2) as r:
                    assert r.read().strip() == b"ok"
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "kvtrace app did not start"
                time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)  # to kvtrace only, as a supervisor would
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 30
        while True:  # Streamlit, its child, is gone too: the session's process group is empty
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, "Streamlit outlived kvtrace app"
            time.sleep(0.2)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_app_command_missing_trace_is_one_line():
    res = CliRunner().invoke(cli_app, ["app", "no/such/trace.jsonl"])
    assert res.exit_code == 1
    assert res.stderr.strip() == "kvtrace: error: no/such/trace.jsonl: no such file"


def test_app_modules_never_import_streamlit():
    code = ("import sys, kvtrace.app.sources, kvtrace.app.launcher, kvtrace.app.choices, kvtrace.app.sizing_form, "
            "kvtrace.results.present, kvtrace.results.chart_data, kvtrace.cli; "
            "assert 'streamlit' not in sys.modules, 'streamlit imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- scenarios
def test_scenarios_page_runs_the_example_and_shows_the_librarys_table(mixed):
    from kvtrace.analyses.scenario import load_scenario, run_scenarios
    from kvtrace.results.scenario_report import table_rows

    at = launch("views/scenarios.py")
    assert not at.error
    assert not charts(at)  # nothing runs before the button
    set_sidebar(at, "kv_sample", "mixed.parquet")
    next(b for b in at.button if b.label == "Run the scenarios").click()
    at.run()
    clean(at)
    assert not at.error, [e.value for e in at.error]
    g = resolve_gpu(None)
    ref = run_scenarios(mixed, load_scenario(ROOT / "sample_traces" / "scenario.example.toml"),
                        model=resolve_model(None), gpu=g,
                        response=ResponseModel(recompute_flops_per_s=g.effective_flops))
    head, rows = table_rows(ref.table)
    shown = table(at, "TTFT p99 ms")
    assert shown.columns == head
    assert [list(r) for r in shown.rows()] == rows
    assert table(at, "coverage").height == 2  # the two prestaging scenarios
    assert len(charts(at)) == 1


def test_scenarios_page_bad_file_is_one_line():
    at = launch("views/scenarios.py")
    at.text_area(key="sc_text").set_value("[system]\ndram = 'lots'\n[[scenario]]\nname = 'x'\n")
    next(b for b in at.button if b.label == "Run the scenarios").click()
    at.run()
    clean(at)
    assert len(at.error) == 1
    assert "scenario.toml: field 'system.dram'" in at.error[0].value
    assert not charts(at)
