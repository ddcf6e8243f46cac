"""Render every chart kvtrace makes, from the bundled sample traces, to docs/gallery/NAME.png.

    .venv/bin/python scripts/gallery.py [OUT_DIR]

The PNGs are the charts as people see them: the CLI's ``--plot`` charts at their own
size, the dashboard's at the width of a 1,280 px browser window (two columns on the
Overview page, one on the others). Scale 1 keeps the files small; the same inputs give
the same bytes. :data:`GALLERY` lists one entry per public chart builder (a test checks
that none is missing: ``tests/test_charts_look.py``).
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "analytics")]

from kvtrace.app import choices  # noqa: E402
from kvtrace.results import chart_data  # noqa: E402

SAMPLES = ROOT / "sample_traces"
OUT = ROOT / "docs" / "gallery"
#: Width of a dashboard chart in a 1,280 px window: the main column, and half of it (Overview).
APP_WIDTH, APP_HALF_WIDTH = 860, 420
GiB, TiB = 2**30, 2**40


@lru_cache(maxsize=None)
def _trace(name: str):
    from kvtrace.ingest import load_trace

    return load_trace(SAMPLES / name)


@lru_cache(maxsize=None)
def _curve(name: str, by: str | None = None, capacities: tuple = ()):
    from kvtrace.analyses.curves import compute_curve

    return compute_curve(_trace(name), by=by, capacities=list(capacities) or None)


@lru_cache(maxsize=None)
def _whatif_table():
    """The issue's grid: ``kvtrace whatif chat.jsonl --grid --dram 16GiB,64GiB
    --flash 1TiB,4TiB,16TiB --policy all,second-hit,tinylfu`` (18 configurations)."""
    from kvtrace.analyses.whatif import TierConfig, simulate, summary_table

    rows = [simulate(_trace("chat.jsonl"), TierConfig(d, flash_bytes=f, policy=p)).summary
            for d in ("16GiB", "64GiB") for f in ("1TiB", "4TiB", "16TiB") for p in ("all", "second-hit", "tinylfu")]
    return summary_table(rows)


@lru_cache(maxsize=None)
def _sizing():
    from kvtrace.analyses.sizing import default_config, recommend

    return recommend(_trace("chat.jsonl"), default_config(), trace_name="chat.jsonl")


def _app_curve(name: str, by: str | None):
    from kvtrace.app import charts as app_charts

    result = _curve(name, by)
    metric = "prefix_token_hit_rate"
    info = result.info
    return app_charts.curve(chart_data.metric_lines(result, metric), chart_data.knee_points(result, metric),
                            result.ceiling.get(metric), chart_data.tier_marks(*choices.DEFAULT_TIERS_BYTES),
                            "usable-prefix tokens", f"{info['model']} ({info['kv_bytes_per_token']:,} B/token), "
                            f"{info['eviction']} LRU").properties(width=APP_WIDTH)


def _overview(kind: str):
    from kvtrace.app import charts as app_charts

    t = _trace("chat.jsonl")
    if kind == "arrivals":
        return app_charts.arrivals(chart_data.arrivals_per_minute(t)).properties(width=APP_HALF_WIDTH)
    if kind == "input":
        return app_charts.log_histogram(chart_data.input_length_histogram(t), x_title="prompt tokens",
                                        y_title="requests",
                                        title="Input length", unit="tokens").properties(width=APP_HALF_WIDTH)
    return app_charts.log_histogram(chart_data.reuse_time_histogram(t), x_title="seconds since the block's previous "
                                    "access", y_title="block accesses", title="Reuse time",
                                    unit="s").properties(width=APP_HALF_WIDTH)


def _charts():
    from kvtrace.results import charts

    return charts


def _load_table():
    from kvtrace.analyses.load import LoadLevel, LoadModel, load_curve
    from kvtrace.analyses.whatif import TierConfig
    from kvtrace.ingest import load_trace

    trace = load_trace(SAMPLES / "chat.jsonl")
    configs = [TierConfig(dram_bytes=256 * GiB, flash_bytes=8 * TiB), TierConfig(dram_bytes=64 * GiB)]
    return load_curve(trace, configs, [LoadLevel(x) for x in (0.5, 1, 2, 4, 16, 64)], LoadModel()).table


def _scenarios():
    from kvtrace.analyses.response import ResponseModel
    from kvtrace.analyses.scenario import load_scenario, run_scenarios
    from kvtrace.ingest import load_trace
    from kvtrace.model import resolve_gpu, resolve_model

    gpu = resolve_gpu(None)
    return run_scenarios(load_trace(SAMPLES / "mixed.parquet"), load_scenario(SAMPLES / "scenario.example.toml"),
                         model=resolve_model(None), gpu=gpu,
                         response=ResponseModel(recompute_flops_per_s=gpu.effective_flops))


def _scenario_report():
    from kvtrace.results import scenario_report

    return scenario_report


def _app_charts():
    from kvtrace.app import charts as app_charts

    return app_charts


#: name -> (the builder it shows, as "module.function", a function returning the chart).
GALLERY = {
    "curve": ("kvtrace.results.charts.curve_chart", lambda: _charts().curve_chart(_curve("chat.jsonl"))),
    "curve-sparse": ("kvtrace.results.charts.curve_chart",
                     lambda: _charts().curve_chart(_curve("chat.jsonl", capacities=(64 * GiB, TiB)))),
    "curve-by-type": ("kvtrace.results.charts.curve_chart",
                      lambda: _charts().curve_chart(_curve("mixed.parquet", "type"))),
    "frontier": ("kvtrace.results.charts.frontier_chart", lambda: _charts().frontier_chart(_whatif_table())),
    "load": ("kvtrace.results.charts.load_chart", lambda: _charts().load_chart(_load_table())),
    "scenario-timeline": ("kvtrace.results.scenario_report.timeline_chart",
                          lambda: _scenario_report().timeline_chart(_scenarios())),
    "sizing-curve": ("kvtrace.results.charts.sizing_curve_chart", lambda: _charts().sizing_curve_chart(_sizing())),
    "sizing-cost": ("kvtrace.results.charts.cost_slo_chart", lambda: _charts().cost_slo_chart(_sizing())),
    "app-arrivals": ("kvtrace.app.charts.arrivals", lambda: _overview("arrivals")),
    "app-input-length": ("kvtrace.app.charts.log_histogram", lambda: _overview("input")),
    "app-reuse-time": ("kvtrace.app.charts.log_histogram", lambda: _overview("reuse")),
    "app-curve-by-type": ("kvtrace.app.charts.curve", lambda: _app_curve("mixed.parquet", "type")),
    "app-latency": ("kvtrace.app.charts.latency",
                    lambda: _app_charts().latency(chart_data.latency_table(_whatif_table().head(9)))
                    .properties(width=APP_WIDTH)),
}


def render(chart, *, scale: float = 1) -> bytes:
    """A chart as PNG bytes (vl-convert, offline)."""
    import vl_convert as vlc

    return vlc.vegalite_to_png(chart.to_json(), scale=scale)


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else OUT
    out.mkdir(parents=True, exist_ok=True)
    for name, (_, build) in GALLERY.items():
        path = out / f"{name}.png"
        path.write_bytes(render(build()))
        print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {path.stat().st_size:,} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
