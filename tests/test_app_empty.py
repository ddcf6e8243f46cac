"""Traces with (almost) nothing to draw: zero-length prompts (readable, documented:
``input_length`` 0 and an empty hash list) and a single request. Every page renders
without exception, every chart builder gives a chart that Vega renders (an empty frame
with a note), and the CLI writes its charts (``curve --plot``, ``whatif --plot``,
``size --report``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtrace.app import launcher
from kvtrace.results import chart_data
from kvtrace.cli import app as cli_app

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest

ROOT = Path(__file__).resolve().parent.parent
ENTRY = ROOT / "analytics" / "kvtrace" / "app" / "kvtrace_app.py"
PAGES = ("views/overview.py", "views/curves.py", "views/whatifs.py", "views/sizing.py")
TRACES = {
    "zero-length": [{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []},
                    {"timestamp": 600, "input_length": 0, "output_length": 1, "hash_ids": []}],
    "one-request": [{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1]}],
}
@pytest.fixture
def trace_file(request, tmp_path, monkeypatch) -> Path:
    monkeypatch.syspath_prepend(str(ENTRY.parent))
    for k in (launcher.ENV_TRACE, launcher.ENV_FORMAT, launcher.ENV_BLOCK_TOKENS, launcher.ENV_SHARE_TENANTS,
              launcher.ENV_SAMPLES, launcher.ENV_DATA_DIR, launcher.ENV_MAX_TRACE_BYTES,
              launcher.ENV_LOG_OPTIONS):
        monkeypatch.delenv(k, raising=False)
    path = tmp_path / f"{request.param}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in TRACES[request.param]))
    monkeypatch.setenv(launcher.ENV_TRACE, str(path))
    monkeypatch.setenv(launcher.ENV_DATA_DIR, str(tmp_path))
    return path


def _cases():
    for name in TRACES:
        for page in PAGES:
            yield pytest.param(name, page, id=f"{name}-{page.split('/')[1][:-3]}")


@pytest.mark.parametrize("trace_file, page", list(_cases()), indirect=["trace_file"])
def test_every_page_renders(trace_file, page):
    at = AppTest.from_file(str(ENTRY), default_timeout=120).run()
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert at.title and at.sidebar.caption[-1].value.startswith(f"**{trace_file.name}**")


@pytest.mark.parametrize("trace_file", ["zero-length"], indirect=True)
def test_every_chart_builder_renders_empty_data_with_a_note(trace_file):
    import vl_convert as vlc
    from kvtrace.app import charts as app_charts

    from kvtrace.results import charts
    from kvtrace.analyses.curves import compute_curve
    from kvtrace.ingest import load_trace
    from kvtrace.analyses.sizing import default_config, recommend
    from kvtrace.analyses.whatif import TierConfig, simulate, summary_table

    trace = load_trace(trace_file)
    curve = compute_curve(trace)
    lines = chart_data.metric_lines(curve, "prefix_token_hit_rate")
    table = summary_table([simulate(trace, TierConfig("16GiB", flash_bytes="256GiB")).summary])
    sizing = recommend(trace, default_config())
    built = {
        "arrivals": app_charts.arrivals(chart_data.arrivals_per_minute(trace).clear()),
        "reuse times": app_charts.log_histogram(chart_data.reuse_time_histogram(trace), x_title="s", y_title="n",
                                                title="Reuse time", unit="s", empty="no block is accessed twice"),
        "curve (app)": app_charts.curve(lines, chart_data.knee_points(curve, "prefix_token_hit_rate"), None,
                                        chart_data.tier_marks(64 * 2**30, 0), "prefix tokens", ""),
        "latency": app_charts.latency(chart_data.latency_table(table)),
        "curve": charts.curve_chart(curve),
        "frontier": charts.frontier_chart(table.clear()),
        "sizing curve": charts.sizing_curve_chart(sizing),
        "cost": charts.cost_slo_chart(sizing),
    }
    assert lines.drop_nulls("rate").height == 0 and chart_data.reuse_time_histogram(trace).height == 0
    for name, chart in built.items():
        spec = chart.properties(width=400).to_json()
        svg = vlc.vegalite_to_svg(spec)
        # the latency has the per-request overhead, the sizing charts today's capacity and the SLO to draw
        if name not in ("latency", "sizing curve", "cost"):
            assert ">no " in svg, name  # the note is drawn


@pytest.mark.parametrize("trace_file", ["zero-length", "one-request"], indirect=True)
def test_cli_charts_are_written(trace_file, tmp_path):
    runs = {
        "curve.html": ["curve", str(trace_file), "--plot"],
        "whatif.html": ["whatif", str(trace_file), "--dram", "16GiB", "--flash", "256GiB", "--plot"],
        "size.html": ["size", str(trace_file), "--report"],
    }
    failed = {}
    for out, argv in runs.items():
        res = CliRunner().invoke(cli_app, [*argv, str(tmp_path / out)])
        if res.exit_code != 0:
            failed[out] = res.output
            continue
        html = (tmp_path / out).read_text()
        assert "vega" in html.lower() and len(html) > 10_000, out
    assert not failed, failed
