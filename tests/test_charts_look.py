"""What the charts draw (their Vega-Lite specs) and that every chart renders to a PNG.

The gallery (``scripts/gallery.py`` -> ``docs/gallery/*.png``) is the same set of
charts: a test checks that it covers every public chart builder, and each is rendered
here with vl-convert (the renderer of ``--plot x.png``).
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from pathlib import Path

import polars as pl
import pytest

from kvtrace.results import charts

ROOT = Path(__file__).resolve().parent.parent
GiB, TiB = 2**30, 2**40


@pytest.fixture(scope="module")
def gallery(monkeypatch_module=None):
    spec = importlib.util.spec_from_file_location("kvtrace_gallery", ROOT / "scripts" / "gallery.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _layers(chart) -> list[dict]:
    return chart.to_dict()["layer"]


def _marks(chart) -> list[dict]:
    return [m["mark"] if isinstance(m["mark"], dict) else {"type": m["mark"]} for m in _layers(chart)]


def test_a_sparse_curve_is_drawn_as_points_only(gallery):
    """`kvtrace curve X --capacity 64GiB,1TiB --plot`: no line (let alone a step)
    between two far-apart capacities; the exact knees are drawn beside the points."""
    result = gallery._curve("chat.jsonl", capacities=(64 * GiB, TiB))
    assert not charts.is_dense(result.curve["capacity_bytes"])
    marks = _marks(charts.curve_chart(result))
    assert not any(m["type"] in ("line", "area") or "interpolate" in m for m in marks)
    assert any(m["type"] == "point" for m in marks)
    three = gallery._curve("chat.jsonl", capacities=(16 * GiB, 64 * GiB, TiB))
    assert not any(m["type"] == "line" for m in _marks(charts.curve_chart(three)))


def test_a_dense_curve_is_a_line_without_steps(gallery):
    result = gallery._curve("chat.jsonl")
    assert charts.is_dense(result.curve["capacity_bytes"])
    lines = [m for m in _marks(charts.curve_chart(result)) if m["type"] == "line"]
    assert lines and not any("step" in m.get("interpolate", "") for m in lines)


def test_curve_by_group_draws_one_series_per_group_with_a_legend_for_knees_and_ceiling(gallery):
    """`kvtrace curve mixed.parquet --by type --plot`: one line per group (and all), the
    table's metric name, a legend entry for the knees and the ceiling."""
    result = gallery._curve("mixed.parquet", "type")
    chart = charts.curve_chart(result)
    spec = chart.to_dict()
    data = {k: pl.DataFrame(v) for k, v in spec["datasets"].items()}
    main = next(lay for lay in spec["layer"] if (lay["mark"]["type"] if isinstance(lay["mark"], dict)
                                                 else lay["mark"]) == "line")
    series = data[main["data"]["name"]]["series"].unique(maintain_order=True).to_list()
    assert series == ["all", *result.info["groups"]]
    assert main["encoding"]["color"]["title"] == "prefix tokens, by type"  # `kvtrace curve`'s column name
    legends = json.dumps([lay["encoding"] for lay in spec["layer"]])
    assert "knees of all: capacity reaching 50%, 80%, 90%, 95%, 99% of the ceiling" in legends
    assert f"ceiling of all (infinite cache): {100 * result.ceiling['prefix_token_hit_rate']:.2f}%" in legends


def test_curve_metric_names_are_the_tables():
    assert list(charts.CURVE_METRICS.values()) == ["prefix tokens", "requests", "any-block tokens", "compute saved"]


def test_capacity_axis_reads_in_binary_units():
    x = charts.capacity_x(100 * 2**20, 1.2 * TiB).to_dict()
    values = x["axis"]["values"]
    assert all(v == 2 ** round(__import__("math").log2(v)) for v in values)  # powers of two
    assert TiB in values and x["scale"]["domain"][1] >= 1.2 * TiB
    expr = x["axis"]["labelExpr"]
    assert f"datum.value >= {TiB} ?" in expr and "' TiB'" in expr and "' GiB'" in expr


def test_frontier_colours_by_policy_shapes_by_flash_and_draws_the_pareto_frontier(gallery):
    """The issue's 18-configuration grid: three colours (policies), three shapes
    (flash sizes), two sizes (DRAM), and a line through the non-dominated points."""
    table = gallery._whatif_table()
    chart = charts.frontier_chart(table)
    spec = chart.to_dict()
    line, points = spec["layer"][0], spec["layer"][1]
    enc = points["encoding"]
    assert (enc["color"]["field"], enc["shape"]["field"], enc["size"]["field"]) == ("policy", "flash", "DRAM")
    assert "TiB/day" in enc["x"]["title"] and enc["y"]["axis"]["format"] == "%"
    front = pl.DataFrame(spec["datasets"][line["data"]["name"]])
    w = table["flash_write_bytes_per_day"].fill_null(0) + table["local_write_bytes_per_day"].fill_null(0)
    s = table["flash_prefix_token_hit_rate"].fill_null(0) + table["local_prefix_token_hit_rate"].fill_null(0)
    dominated = [any((w[j] <= w[i] and s[j] >= s[i]) and (w[j] < w[i] or s[j] > s[i]) for j in range(len(w)))
                 for i in range(len(w))]
    want = sorted(c for c, d in zip(table["config"], dominated) if not d)
    assert sorted(front["config"].to_list()) == want and 1 < len(want) < table.height


def test_pareto_front():
    assert charts.pareto_front([1, 2, 3, 2], [0.1, 0.3, 0.2, 0.3]) == [True, True, False, True]  # ties both stay


def test_cost_axis_has_readable_dollar_ticks():
    assert charts.money_ticks(4_000) == [0.0, 10, 20, 50, 100, 200, 500, 1_000, 2_000]
    assert charts.money_ticks(5_000)[-1] == 5_000


def test_every_public_chart_builder_is_in_the_gallery(gallery):
    from kvtrace.app import charts as app_charts

    builders = {f"kvtrace.results.charts.{n}" for n, f in inspect.getmembers(charts, inspect.isfunction)
                if n.endswith("_chart") and n != "save_chart" and f.__module__ == charts.__name__}
    builders |= {f"kvtrace.app.charts.{n}" for n, f in inspect.getmembers(app_charts, inspect.isfunction)
                 if not n.startswith("_") and f.__module__ == app_charts.__name__}
    shown = {builder for builder, _ in gallery.GALLERY.values()}
    assert builders <= shown, builders - shown


@pytest.mark.parametrize("name", ["curve", "curve-sparse", "curve-by-type", "frontier", "sizing-curve",
                                  "sizing-cost", "app-arrivals", "app-input-length", "app-reuse-time",
                                  "app-curve-by-type", "app-latency"])
def test_every_chart_renders_to_a_png(gallery, name):
    png = gallery.render(gallery.GALLERY[name][1]())
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert len(png) < 400_000  # modest: the gallery is committed


def test_the_gallery_covers_this_list(gallery):
    assert set(gallery.GALLERY) == {p.stem for p in (ROOT / "docs" / "gallery").glob("*.png")}
