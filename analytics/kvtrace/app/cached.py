"""Streamlit caches around the kvtrace functions the pages call.

Every cache is keyed on the trace key (SHA-256 of the source bytes + load options,
:attr:`kvtrace.app.sources.Loaded.key`) and the analysis parameters; the trace and other
large inputs are passed as ``_``-prefixed arguments, which Streamlit leaves out of
the key. Traces and reuse distances are shared objects (``cache_resource``); results
are copied per session (``cache_data``). The bodies call the same library functions
as the corresponding CLI commands.

Long work reports progress, and every progress callback is also where the work stops
when its script run is asked to (:func:`stop_if_asked`): a closed browser tab (its
session is disconnected and the run told to stop), a new run after a widget change.
"""

from __future__ import annotations

import dataclasses

import streamlit as st

from kvtrace.app import sources
from kvtrace.analyses.curves import compute_curve
from kvtrace.analyses.distances import reuse_distances
from kvtrace.model import resolve_gpu, resolve_model
from kvtrace.analyses.response import ResponseModel
from kvtrace.analyses.stats import trace_stats
from kvtrace.analyses.whatif import TierConfig, simulate
from kvtrace.results import chart_data

try:  # Streamlit >= 1.50: the check every st.* call makes, raising StopException / RerunException
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_run_yield_check
except ImportError:  # pragma: no cover - older Streamlit: stop at the next drawn progress step only
    def get_run_yield_check():
        return None

_PROGRESS_STEPS = 50  # at most this many progress messages per computation (they are recorded for replay)


def stop_if_asked() -> None:
    """Raise Streamlit's StopException (or RerunException) when this script run has
    been asked to stop (its session closed) or to rerun; nothing otherwise.

    Streamlit checks this only when the script draws something, and a progress bar is
    redrawn at most :data:`_PROGRESS_STEPS` times: without this call, work between two
    steps (or a whole computation without a bar) would run to its end for nobody.
    """
    check = get_run_yield_check()
    if check is not None:
        check()


def _progress_bar(label: str):
    """A progress bar drawn inside a cached function and removed at its end; its
    update function stops the work when the run is asked to (:func:`stop_if_asked`).

    Drawn inside the function, so that Streamlit's replay of a cache hit (which
    re-enqueues the elements the function drew) finds the bar it updates.
    """
    bar = st.progress(0.0, text=label)
    last = [-1]

    def update(done: int, total: int) -> None:
        stop_if_asked()
        frac = min(1.0, done / total) if total else 1.0
        step = int(frac * _PROGRESS_STEPS)
        if step != last[0]:
            last[0] = step
            bar.progress(frac, text=f"{label}: {done:,} of {total:,}")

    return bar, update


# --------------------------------------------------------------------------- traces


@st.cache_data(show_spinner=False, max_entries=64)
def file_digest(path: str, size: int, mtime_ns: int, max_bytes: int) -> str:
    """SHA-256 of a file (or directory of shards), once per (path, size, mtime); reads
    at most ``max_bytes``."""
    bar, update = _progress_bar(f"Hashing {size:,} bytes")
    digest = sources.file_sha256(path, max_bytes=max_bytes, progress=update)
    bar.empty()
    return digest


@st.cache_resource(show_spinner="Reading the trace…", max_entries=3)
def trace_from_file(key: str, _path: str, _options: sources.LoadOptions) -> sources.Loaded:
    """A trace file, read once per content (the same bytes under another name too)."""
    digest = key.split(":")[1]
    return sources.load_file(_path, _options, digest=digest)


@st.cache_resource(show_spinner="Reading the uploaded trace…", max_entries=3)
def trace_from_upload(key: str, _name: str, _data: bytes, _options: sources.LoadOptions,
                      _max_bytes: int | None = None) -> sources.Loaded:
    """An uploaded trace, read once per content."""
    digest = key.split(":")[1]
    return sources.load_upload(_name, _data, _options, digest=digest, max_bytes=_max_bytes)


# --------------------------------------------------------------------------- overview


@st.cache_data(show_spinner="Computing trace statistics…", max_entries=32)
def stats(key: str, model: str, _trace):
    """:func:`kvtrace.analyses.stats.trace_stats` (``kvtrace stats``)."""
    return trace_stats(_trace, resolve_model(model))


@st.cache_data(show_spinner=False, max_entries=16)
def overview_tables(key: str, _trace) -> dict:
    """Arrivals per minute, input-length and reuse-time histograms."""
    return {
        "arrivals": chart_data.arrivals_per_minute(_trace),
        "input_lengths": chart_data.input_length_histogram(_trace),
        "reuse_times": chart_data.reuse_time_histogram(_trace),
    }


# --------------------------------------------------------------------------- curves


@st.cache_resource(show_spinner=False, max_entries=2)  # two int64 arrays per access: keep few
def distances(key: str, eviction: str, _trace):
    """Exact reuse distances (tokens): one kernel pass serves every model and capacity."""
    bar, update = _progress_bar(f"Replaying {_trace.n_accesses:,} block accesses ({eviction} LRU)")
    d = reuse_distances(_trace, eviction, progress=update)
    bar.empty()
    return d


@st.cache_data(show_spinner="Computing the curve…", max_entries=32)
def curve(key: str, model: str, gpu: str, eviction: str, by: str | None, sample_rate: float | None,
          capacities: tuple, _trace, _distances=None):
    """:func:`kvtrace.analyses.curves.compute_curve` (``kvtrace curve``), with the exact
    distances when given (then a model switch only re-bins them)."""
    return compute_curve(_trace, model=resolve_model(model), gpu=resolve_gpu(gpu), eviction=eviction,
                         display_capacities=list(capacities) or None, by=by, sample_rate=sample_rate,
                         distances=_distances if sample_rate is None else None)


@st.cache_data(show_spinner="Replaying the engine's cache rules…", max_entries=16)
def engine_curve(key: str, model: str, gpu: str, rules: str, by: str | None, capacities: tuple, _trace):
    """:func:`kvtrace.analyses.engine.engine_curve` (``kvtrace curve --cache-rules``)."""
    from kvtrace.analyses.engine import engine_curve as replay

    return replay(_trace, rules, model=resolve_model(model), gpu=resolve_gpu(gpu),
                  display_capacities=list(capacities) or None, by=by)


# --------------------------------------------------------------------------- what-ifs


@st.cache_resource(show_spinner="Computing future-reuse values…", max_entries=4)
def future_values(key: str, model: str, gpu: str, horizon: str, _trace):
    """Per-access keep values for ``value>=v`` policies, as ``kvtrace whatif`` computes them."""
    from kvtrace.analyses.value import future_reuse, parse_horizon

    return future_reuse(_trace, model=resolve_model(model), gpu=resolve_gpu(gpu),
                        horizon_s=parse_horizon(horizon)).value_usd


@st.cache_data(show_spinner=False, max_entries=256)
def whatif(key: str, config: dict, model: str, gpu: str, eviction: str, response: dict, warmup: str | None,
           _trace, _values=None, cache_rules: str = "ideal") -> dict:
    """One configuration through :func:`kvtrace.analyses.whatif.simulate`: its summary row
    (``kvtrace whatif`` builds its table from the same rows)."""
    return simulate(_trace, TierConfig(**config), model=resolve_model(model), gpu=resolve_gpu(gpu),
                    response=ResponseModel(**response), eviction=eviction, cache_rules=cache_rules, values=_values,
                    warmup=warmup).summary


def config_dict(config: TierConfig) -> dict:
    """A TierConfig as the plain dict the what-if cache is keyed on."""
    return dataclasses.asdict(config)


# --------------------------------------------------------------------------- sizing


@st.cache_data(show_spinner=False, max_entries=16)
def sizing(key: str, config_toml: str, trace_name: str, _trace, _config):
    """:func:`kvtrace.analyses.sizing.recommend` (``kvtrace size``), keyed on the config's TOML text."""
    from kvtrace.analyses.sizing import recommend

    bar = st.progress(0.0, text="Sizing")
    last = [-1]

    def update(frac: float, message: str) -> None:
        stop_if_asked()
        step = int(frac * _PROGRESS_STEPS)
        if step != last[0]:
            last[0] = step
            bar.progress(min(1.0, max(0.0, frac)), text=f"Sizing: {message}")

    result = recommend(_trace, _config, progress=update, trace_name=trace_name)
    bar.empty()
    return result


@st.cache_data(show_spinner="Writing the report…", max_entries=8)
def sizing_reports(key: str, config_toml: str, _result) -> tuple[str, str]:
    """The sizing report as Markdown and as self-contained HTML."""
    from kvtrace.results.sizing_report import report_html, report_markdown

    return report_markdown(_result), report_html(_result)


@st.cache_data(show_spinner=False, max_entries=16)
def sizing_charts(key: str, config_toml: str, _result) -> list[dict]:
    """The sizing report's charts (:mod:`kvtrace.results.charts`) as Vega-Lite specs, built and
    validated once per result rather than on every rerun."""
    from kvtrace.results import charts

    return [make(_result).properties(width="container").to_dict()
            for make in (charts.sizing_curve_chart, charts.cost_slo_chart)]


@st.cache_data(show_spinner=False, max_entries=8)
def scenarios(key: str, scenario_toml: str, model: str, gpu: str, _trace, _config):
    """:func:`kvtrace.analyses.scenario.run_scenarios` (``kvtrace scenario``), keyed on the
    scenario file's text and the sidebar's model and GPU."""
    from kvtrace.analyses.scenario import run_scenarios

    g = resolve_gpu(gpu)
    bar, update = _progress_bar("Replaying the scenarios")
    result = run_scenarios(_trace, _config, model=resolve_model(model), gpu=g,
                           response=ResponseModel(recompute_flops_per_s=g.effective_flops), progress=update)
    bar.empty()
    return result


@st.cache_data(show_spinner="Writing the report…", max_entries=8)
def scenario_reports(key: str, scenario_toml: str, model: str, gpu: str, trace_name: str, _result) -> tuple[str, str]:
    """The scenario report as Markdown and as self-contained HTML."""
    from kvtrace.results.scenario_report import report_html, report_markdown

    return report_markdown(_result, trace_name), report_html(_result, trace_name)
