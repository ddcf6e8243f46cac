"""Capacity-hit curves weighted by what a hit is worth (DESIGN §3).

One pass of the stack-distance kernel gives every access's distance; hits at any
capacity follow exactly (``dist <= C``). The pass is a fold over the chunks of any
trace source, binning the distances on the evaluation grid as it goes
(:mod:`kvtrace.analyses.curve_pass`; sampled: :mod:`kvtrace.analyses.sampled`;
partitioned: :mod:`kvtrace.analyses.distributed`); :func:`compute_curve` plans it
(:func:`plan_curve`) and turns what it hands over into the result tables below
(:func:`curve_from_pass`).

Curve table (one row per capacity; rates are shares of the measured accesses, i.e.
after warm-up, and are cumulative in capacity):

================================  ==========================================================
capacity_bytes                    cache capacity, bytes (= capacity_tokens x kv_bytes_per_token)
capacity_tokens                   capacity in tokens of KV cache
capacity_blocks                   capacity in full blocks (capacity_tokens / block_tokens)
request_hit_rate                  share of requests whose usable prefix is >= 1 block
request_half_prefix_hit_rate      share of requests whose usable prefix holds >= half their
                                  prompt tokens (exact runs; null when sampled or partitioned)
prefix_token_hit_rate             usable-prefix tokens / all prompt tokens (headline)
prefix_byte_hit_rate              usable-prefix block bytes / all block bytes accessed
prefix_block_hit_rate             usable-prefix blocks / all block accesses
block_hit_rate                    any-block hits / block accesses
token_hit_rate                    tokens of any-block hits / prompt tokens
byte_hit_rate                     block bytes of any-block hits / block bytes accessed
compute_saved_rate                prefill FLOPs of usable-prefix tokens / all prefill FLOPs
gpu_seconds_saved_per_hour        GPU-seconds of prefill avoided per hour of trace
usd_saved_per_hour            the same in $ (GPU $/h)
read_mean_bytes_per_s        mean bytes/s read from the cache to serve the hits
================================  ==========================================================

"Prompt tokens" are the tokens covered by block hashes. Byte rates weight a block by
the tokens it occupies in a cache (its largest size in the trace), token rates by the
tokens of the access; they differ only when a hash appears with different sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import polars as pl

from kvtrace.analyses.curve_pass import NO_GROUP, NO_SCALE, CurvePass, exact_pass, half_prefix_keys  # noqa: F401
from kvtrace.analyses.distances import Distances, normalise_eviction
from kvtrace.analyses.sampled import SUBSAMPLES, sampled_pass, subsample_error
from kvtrace.config import plain_numpy_pages
from kvtrace.errors import KvtraceError, UsageError
from kvtrace.kernels.hitcurve import binned_requests
from kvtrace.kernels.stackdist import COLD
from kvtrace.model import GpuSpec, ModelSpec, resolve_gpu, resolve_model
from kvtrace.trace import Trace
from kvtrace.units import parse_duration

HEADLINE = "prefix_token_hit_rate"
RATE_COLUMNS = (
    "request_hit_rate",
    "request_half_prefix_hit_rate",
    "prefix_token_hit_rate",
    "prefix_byte_hit_rate",
    "prefix_block_hit_rate",
    "block_hit_rate",
    "token_hit_rate",
    "byte_hit_rate",
    "compute_saved_rate",
)
VALUE_COLUMNS = ("gpu_seconds_saved_per_hour", "usd_saved_per_hour", "read_mean_bytes_per_s")
KNEE_FRACTIONS = (0.5, 0.8, 0.9, 0.95, 0.99)
KNEE_METRICS = ("prefix_token_hit_rate", "request_hit_rate", "compute_saved_rate")
GROUPINGS = ("type", "tenant", "turn", "session-length")
KNEE_GRID_POINTS = 4096


@dataclass
class CurveResult:
    """Output of :func:`compute_curve`.

    Attributes
    ----------
    curve : polars.DataFrame
        One row per capacity (schema in the module docstring); sampled curves add
        ``prefix_token_hit_rate_se`` (estimated standard error).
    by_group : polars.DataFrame or None
        The same metrics per group (first column ``group``), shared cache.
    ceiling : dict
        Every rate at infinite capacity, plus ``capacity_bytes`` needed to reach it.
    knees : polars.DataFrame
        ``metric``, ``fraction``, ``target_rate``, ``capacity_bytes``,
        ``capacity_tokens``: smallest capacity reaching ``fraction`` of the ceiling.
    info : dict
        Model, eviction, warm-up, counts, sampling and error estimate.
    group_summary : polars.DataFrame or None
        With ``by``: per group, the rates at the capacity where the whole trace reaches
        80 % of its usable-prefix token ceiling, and the group's own ceiling
        (:func:`_group_summary` states how exact each is).
    """

    curve: pl.DataFrame
    by_group: pl.DataFrame | None
    ceiling: dict
    knees: pl.DataFrame
    info: dict = field(default_factory=dict)
    group_summary: pl.DataFrame | None = None

    @property
    def approximate(self) -> bool:
        return bool(self.info.get("sample_rate", 1.0) < 1.0)


def default_grid(total_tokens: int, block_tokens: int, points: int = 200) -> np.ndarray:
    """About ``points`` log-spaced capacities (tokens) from one block to all distinct tokens."""
    lo = max(1, min(int(block_tokens), int(total_tokens)))
    hi = max(lo, int(total_tokens))
    grid = np.unique(np.round(np.geomspace(lo, hi, num=max(2, points))).astype(np.int64))
    grid[-1] = hi
    return np.unique(grid)


def parse_warmup(text: str | float | None) -> tuple[str, float] | None:
    """``0.1`` or ``10%`` -> ("fraction", 0.1); ``10min``/``600s`` -> ("seconds", 600)."""
    if text is None or text == "" or text == 0:
        return None
    s = str(text).strip()
    try:
        if s.endswith("%"):
            value = float(s[:-1]) / 100.0
        else:
            value = float(s)
        if not 0 <= value < 1:
            raise UsageError(f"a warm-up fraction must be in [0, 1), got '{text}'", field="warmup")
        return ("fraction", value)
    except ValueError:
        return ("seconds", parse_duration(s, field="warmup"))


#: Smallest sample rate: blocks are kept by a 24-bit hash threshold (kernels.shards).
MIN_SAMPLE_RATE = 2.0**-24


def warmup_first_request(trace: Trace, warmup: tuple[str, float] | None) -> int:
    """Index of the first measured request (earlier ones only warm the cache)."""
    if warmup is None:
        return 0
    kind, value = warmup
    if kind == "fraction":
        return int(math.floor(value * trace.n_requests))
    ts = trace.request_timestamp
    return int(np.searchsorted(ts, ts[0] + value, side="left")) if ts.size else 0


def group_labels(trace: Trace, by: str) -> tuple[np.ndarray, list[str]]:
    """int32 group index per request, and the group names."""
    req = trace.requests
    if by in ("type", "tenant"):
        col = req[by]
        if col.null_count() == req.height:
            raise KvtraceError(f"the trace has no '{by}' column values to group by", field="by")
        labels = col.fill_null("(none)").cast(pl.String)
    elif by == "turn":
        if req["turn"].null_count() == req.height:
            raise KvtraceError("the trace has no turn numbers to group by", field="by")
        labels = _bucket_counts(req["turn"]).fill_null("(none)")
    elif by == "session-length":
        if req["session_id"].null_count() == req.height:
            raise KvtraceError("the trace has no session ids to group by", field="by")
        size = req.select(pl.len().over("session_id").cast(pl.Int64).alias("n"))["n"]
        labels = _bucket_counts(size).fill_null("(none)")
        labels = pl.Series([f"{x} req" if x != "(none)" else x for x in labels.to_list()])
    else:
        raise UsageError(f"unknown grouping '{by}': expected one of {', '.join(GROUPINGS)}", field="by")
    names = sorted(labels.unique().to_list(), key=_natural_key)
    index = labels.replace_strict(names, list(range(len(names))), return_dtype=pl.Int32).to_numpy()
    return index, names


def _bucket_counts(s: pl.Series) -> pl.Series:
    edges = [(1, 1, "1"), (2, 2, "2"), (3, 3, "3"), (4, 7, "4-7"), (8, 15, "8-15"), (16, 31, "16-31")]
    out = [None] * len(s)
    for i, v in enumerate(s.to_list()):
        if v is None:
            continue
        label = "32+"
        for lo, hi, name in edges:
            if lo <= v <= hi:
                label = name
                break
        out[i] = label
    return pl.Series(out, dtype=pl.String)


def _natural_key(x: str):
    head = x.split("-")[0].rstrip("+").split(" ")[0]
    return (0, int(head), x) if head.isdigit() else (1, 0, x)


def _request_hist(keys, members, weights, req_group, n_groups, grid) -> np.ndarray:
    """Requests per bin, float64[n_groups, G + 2] (bin G: above the grid, G + 1: cold)."""
    return binned_requests(keys, np.ascontiguousarray(members, dtype=np.bool_),
                           NO_SCALE if weights is None else np.ascontiguousarray(weights, dtype=np.float64),
                           NO_GROUP if req_group is None else np.ascontiguousarray(req_group, dtype=np.int32),
                           n_groups, np.ascontiguousarray(grid, dtype=np.int64))


def _rates(any_hits, any_tot, pre_hits, pre_tot, req_hits, req_tot, half_hits, half_tot, a, b):
    """Rate columns from hit sums (arrays over capacities); ``half_hits`` None: the
    half-prefix request rate is not known (NaN)."""

    def div(x, y):
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(y > 0, x / np.where(y > 0, y, 1), np.nan)

    flops_hit = a * pre_hits[..., 1] + b * pre_hits[..., 3]
    flops_tot = a * pre_tot[..., 1] + b * pre_tot[..., 3]
    requests = div(req_hits, req_tot)
    return {
        "request_hit_rate": requests,
        "request_half_prefix_hit_rate": (np.full_like(requests, np.nan) if half_hits is None
                                         else div(half_hits, half_tot)),
        "prefix_token_hit_rate": div(pre_hits[..., 1], pre_tot[..., 1]),
        "prefix_byte_hit_rate": div(pre_hits[..., 2], pre_tot[..., 2]),
        "prefix_block_hit_rate": div(pre_hits[..., 0], pre_tot[..., 0]),
        "block_hit_rate": div(any_hits[..., 0], any_tot[..., 0]),
        "token_hit_rate": div(any_hits[..., 1], any_tot[..., 1]),
        "byte_hit_rate": div(any_hits[..., 2], any_tot[..., 2]),
        "compute_saved_rate": div(flops_hit, flops_tot),
    }, flops_hit


@dataclass
class _Evaluation:
    """Hit sums on the evaluation grid, overall and per group."""

    rates: dict  # name -> float64[n_groups (+1: the whole trace, when grouped), G]
    flops_hit: np.ndarray  # [n_rows, G]
    prefix_bytes_hit: np.ndarray  # [n_rows, G] block tokens of usable-prefix hits
    ceiling: dict  # name -> float (overall)
    row_ceiling: dict  # name -> float64[n_rows]: the ceiling of each group (and of the whole trace, last)
    prefix_hist: np.ndarray  # [G + 2, 4] overall usable-prefix histogram
    request_keys: np.ndarray
    request_members: np.ndarray
    request_weights: np.ndarray | None


def evaluate_pass(passed: CurvePass, n_groups: int, grid: np.ndarray, a, b,
                  hist: np.ndarray | None = None, request_hists: tuple | None = None) -> _Evaluation:
    """Rates on ``grid`` from a pass's histogram (``hist``: another histogram of the
    same pass, e.g. :attr:`CurvePass.at_capacity`'s) and its request keys, or
    ``request_hists``: the requests per bin already counted (float64[n_groups, G + 2],
    the request hits and the half-prefix ones, or None for the latter)."""
    kgrid = grid
    G = kgrid.shape[0]
    h = passed.hist if hist is None else hist
    rkeys, rmembers, hkeys = passed.request_keys, passed.request_members, passed.half_keys
    rweights, req_group = passed.request_weights, passed.request_group  # sampled: its first evaluated access's
    if request_hists is not None:
        rh, hh = request_hists
    else:
        rh = _request_hist(rkeys, rmembers, rweights, req_group, n_groups, kgrid)
        hh = None if hkeys is None else _request_hist(hkeys, rmembers, rweights, req_group, n_groups, kgrid)
    any_h, pre_h = h[0], h[1]
    if req_group is not None:  # the last row is the whole trace
        any_h = np.concatenate([any_h, any_h.sum(axis=0, keepdims=True)])
        pre_h = np.concatenate([pre_h, pre_h.sum(axis=0, keepdims=True)])
        rh = np.concatenate([rh, rh.sum(axis=0, keepdims=True)])
        hh = None if hh is None else np.concatenate([hh, hh.sum(axis=0, keepdims=True)])
    cum_any = np.cumsum(any_h[:, :G, :], axis=1)
    cum_pre = np.cumsum(pre_h[:, :G, :], axis=1)
    cum_req = np.cumsum(rh[:, :G], axis=1)
    any_tot, pre_tot, req_tot = any_h.sum(axis=1), pre_h.sum(axis=1), rh.sum(axis=1)

    def half(part):  # (hits, totals) of the half-prefix request rate, or (None, None)
        return (None, None) if hh is None else part(hh)

    rates, flops_hit = _rates(cum_any, any_tot[:, None, :], cum_pre, pre_tot[:, None, :],
                              cum_req, req_tot[:, None],
                              *half(lambda x: (np.cumsum(x[:, :G], axis=1), x.sum(axis=1)[:, None])), a, b)
    # ceiling: every finite key hits (bins 0..G)
    all_any, all_pre, all_req = any_h[-1], pre_h[-1], rh[-1]
    crates, _ = _rates(all_any[: G + 1].sum(axis=0), all_any.sum(axis=0), all_pre[: G + 1].sum(axis=0),
                       all_pre.sum(axis=0), all_req[: G + 1].sum(), all_req.sum(),
                       *half(lambda x: (x[-1, : G + 1].sum(), x[-1].sum())), a, b)
    row_ceiling, _ = _rates(any_h[:, : G + 1].sum(axis=1), any_tot, pre_h[:, : G + 1].sum(axis=1), pre_tot,
                            rh[:, : G + 1].sum(axis=1), req_tot,
                            *half(lambda x: (x[:, : G + 1].sum(axis=1), x.sum(axis=1))), a, b)
    return _Evaluation(rates, flops_hit, cum_pre[..., 2], {k: float(v) for k, v in crates.items()}, row_ceiling,
                       all_pre, rkeys, rmembers, rweights)


@plain_numpy_pages
def compute_curve(
    trace: Trace,
    *,
    model: ModelSpec | str | None = None,
    gpu: GpuSpec | str | None = None,
    eviction: str = "prefix-aware",
    capacities: list[int] | None = None,
    display_capacities: list[int] | None = None,
    points: int = 200,
    warmup: str | float | None = None,
    by: str | None = None,
    sample_rate: float | None = None,
    distances: Distances | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CurveResult:
    """Capacity-hit curves of ``trace`` under an exact byte-LRU.

    One pass over the trace's chunks, whatever the source (in memory or streamed):
    :func:`kvtrace.analyses.curve_pass.exact_pass`, or with ``sample_rate`` below 1
    :func:`kvtrace.analyses.sampled.sampled_pass`.

    Parameters
    ----------
    trace : TraceSource
        A :class:`kvtrace.trace.Trace` or a :class:`kvtrace.ingest.stream.StreamedTrace`.
    model : ModelSpec or str, optional
        Sets bytes per token and prefill FLOPs (default Llama-3.1-70B).
    gpu : GpuSpec or str, optional
        Converts FLOPs saved to GPU-seconds and $ (default H100).
    eviction : str
        ``prefix-aware`` (default) or ``flat``.
    capacities : list of int, optional
        Capacities in bytes; default ~``points`` log-spaced ones from one block to all
        distinct bytes.
    display_capacities : list of int, optional
        More capacities (bytes) evaluated in the same pass and returned as
        ``result.display`` (e.g. round numbers for a terminal table).
    warmup : str or float, optional
        Fraction of requests (``0.1``, ``10%``) or a duration (``10min``) that only fills
        the cache.
    by : str, optional
        Break metrics down by ``type``, ``tenant``, ``turn`` or ``session-length``.
    sample_rate : float, optional
        SHARDS spatial sampling rate in (0, 1); the result is approximate and carries
        an error estimate from hash-disjoint sub-samples.
    distances : Distances, optional
        Reuse already computed exact distances of an in-memory trace (same eviction
        model; :func:`kvtrace.analyses.distances.reuse_distances`).
    progress : callable, optional
        ``progress(done, total)`` while the kernel runs.
    """
    plan = plan_curve(trace, model=model, gpu=gpu, eviction=eviction, capacities=capacities,
                      display_capacities=display_capacities, points=points, warmup=warmup, by=by,
                      sample_rate=sample_rate)
    if plan.rate < 1.0:
        passed = sampled_pass(trace, plan.eviction, plan.rate, plan.grid, plan.first_req, plan.req_group,
                              len(plan.names), plan.block_tokens, progress=progress)
    else:
        if distances is not None and distances.eviction != plan.eviction:
            raise ValueError("distances were computed with another eviction model")
        passed = exact_pass(trace, plan.eviction, plan.grid, plan.first_req, plan.req_group, len(plan.names),
                            distances=distances, progress=progress)
    try:
        return curve_from_pass(trace, plan, passed)
    finally:
        passed.close()


@dataclass
class CurvePlan:
    """What :func:`compute_curve` fixes before its pass: the model, the measured
    requests, the evaluation grid (tokens) and the groups (:func:`plan_curve`)."""

    model: ModelSpec
    gpu: GpuSpec
    eviction: str
    block_tokens: int
    total_tokens: int  # distinct tokens of the trace
    warmup: tuple[str, float] | None
    first_req: int
    rate: float
    base_grid: np.ndarray
    user_tokens: np.ndarray | None
    disp_tokens: np.ndarray | None
    capacities: list[int] | None
    display_capacities: list[int] | None
    grid: np.ndarray  # the evaluation grid: every capacity asked for and the knee grid
    by: str | None
    req_group: np.ndarray | None
    names: list[str]


def plan_curve(trace, *, model=None, gpu=None, eviction: str = "prefix-aware", capacities=None,
               display_capacities=None, points: int = 200, warmup=None, by=None, sample_rate=None) -> CurvePlan:
    """The plan of a curve (options as :func:`compute_curve`'s), from what any source
    holds in memory: metadata, block sizes and the request table."""
    model = model if isinstance(model, ModelSpec) else resolve_model(model)
    gpu = gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu)
    ev = normalise_eviction(eviction)
    bpt = int(model.kv_bytes_per_token)
    B = int(trace.meta.block_tokens)
    total_tokens = int(trace.block_size.sum())
    wu = parse_warmup(warmup)
    first_req = warmup_first_request(trace, wu)
    if first_req >= trace.n_requests and trace.n_requests:
        raise UsageError("the warm-up covers the whole trace: nothing left to measure", field="warmup")
    rate = 1.0 if sample_rate is None else float(sample_rate)
    if not MIN_SAMPLE_RATE <= rate <= 1:
        raise UsageError(f"a sample rate must be in [2**-24, 1] (the sampling hash resolves 2**-24), got "
                         f"{sample_rate}", field="sample-rate")

    base_grid = default_grid(total_tokens, B, points)
    user_tokens = None if not capacities else np.array([int(c) // bpt for c in capacities], dtype=np.int64)
    disp_tokens = None if not display_capacities else np.array([int(c) // bpt for c in display_capacities],
                                                               dtype=np.int64)
    # The evaluation grid: what is asked for, plus a fine log grid on which the knees
    # are bracketed before the exact search (a narrow bracket holds few accesses).
    parts = [base_grid, default_grid(total_tokens, B, KNEE_GRID_POINTS)]
    if user_tokens is not None:
        parts.append(user_tokens)
    if disp_tokens is not None:
        parts.append(disp_tokens)
    grid = np.unique(np.concatenate(parts))

    req_group = None
    names = ["all"]
    if by is not None:
        req_group, names = group_labels(trace, by)
    return CurvePlan(model, gpu, ev, B, total_tokens, wu, first_req, rate, base_grid, user_tokens, disp_tokens,
                     capacities, display_capacities, grid, by, req_group, names)


def curve_from_pass(trace, plan: CurvePlan, passed: CurvePass) -> CurveResult:
    """The result tables of a finished pass (:func:`compute_curve`; a partitioned run
    merges its partitions' passes first, :mod:`kvtrace.analyses.distributed`)."""
    model, gpu, ev, B, grid, names, by = plan.model, plan.gpu, plan.eviction, plan.block_tokens, plan.grid, \
        plan.names, plan.by
    first_req, rate, wu = plan.first_req, plan.rate, plan.warmup
    bpt = int(model.kv_bytes_per_token)
    a_coef, b_coef = model.flops_coefficients()
    ev_all = evaluate_pass(passed, len(names), grid, a_coef, b_coef)
    seconds = float(trace.request_timestamp[-1] - trace.request_timestamp[first_req]) if trace.n_requests else 0.0
    hours = seconds / 3600.0
    nan = np.full(grid.shape, np.nan)

    def table(gi: int) -> pl.DataFrame:
        out = {"capacity_bytes": grid * bpt, "capacity_tokens": grid, "capacity_blocks": grid / B}
        for k in RATE_COLUMNS:
            out[k] = ev_all.rates[k][gi]
        flops = ev_all.flops_hit[gi]  # sampled sums are already weighted up to the whole trace
        out["gpu_seconds_saved_per_hour"] = gpu.gpu_seconds(flops) / hours if hours > 0 else nan
        out["usd_saved_per_hour"] = gpu.dollars(flops) / hours if hours > 0 else nan
        out["read_mean_bytes_per_s"] = (ev_all.prefix_bytes_hit[gi] * bpt / seconds
                                             if seconds > 0 else nan)
        return pl.DataFrame(out).with_columns(pl.col(pl.Float64).fill_nan(None))

    def select(df: pl.DataFrame, wanted_tokens, wanted_bytes) -> pl.DataFrame:
        df = df[np.searchsorted(grid, wanted_tokens)]
        if wanted_bytes is not None:
            df = df.with_columns(pl.Series("capacity_bytes", np.asarray(wanted_bytes, dtype=np.int64)))
        return df

    disp_tokens, display_capacities = plan.disp_tokens, plan.display_capacities
    main_tokens = plan.base_grid if plan.user_tokens is None else plan.user_tokens
    main_bytes = None if plan.user_tokens is None else plan.capacities
    overall = table(len(names) if by is not None else 0)
    curve = select(overall, main_tokens, main_bytes)
    display = select(overall, disp_tokens, display_capacities) if disp_tokens is not None else None

    info: dict = {
        "model": model.name,
        "kv_bytes_per_token": bpt,
        "gpu": gpu.name,
        "mfu": gpu.mfu,
        "dollars_per_gpu_hour": gpu.dollars_per_hour,
        "eviction": ev,
        "block_tokens": B,
        "warmup": None if wu is None else {"kind": wu[0], "value": wu[1]},
        "first_measured_request": first_req,
        "measured_requests": trace.n_requests - first_req,
        "measured_accesses": int(trace.n_accesses - trace.req_start[first_req]),
        "measured_duration_s": seconds,
        "distinct_blocks": trace.n_blocks,
        "distinct_bytes": plan.total_tokens * bpt,
        "sample_rate": rate,
        "approximate": rate < 1.0,
    }
    if rate < 1.0:
        se = subsample_error(passed.sub_hist, grid)
        sel = np.searchsorted(grid, main_tokens)
        curve = curve.with_columns(pl.Series(f"{HEADLINE}_se", se[sel]))
        if display is not None:
            display = display.with_columns(pl.Series(f"{HEADLINE}_se", se[np.searchsorted(grid, disp_tokens)]))
        info["sampled_accesses"] = int(passed.n_evaluated)
        info["error_estimate"] = {
            "metric": HEADLINE,
            "mean_standard_error": nan_none(np.nanmean(se[sel])) if np.isfinite(se[sel]).any() else None,
            "max_standard_error": nan_none(np.nanmax(se[sel])) if np.isfinite(se[sel]).any() else None,
            "method": f"spread of {SUBSAMPLES} hash-disjoint sub-samples (random-groups estimator)",
            "heavy_blocks_exact": "blocks with accesses x rate >= 1 (at most 64) are tracked exactly",
        }

    by_group = None
    if by is not None:
        parts = [select(table(gi), main_tokens, main_bytes).insert_column(0, pl.lit(name).alias("group_name"))
                 for gi, name in enumerate(names)]
        by_group = pl.concat(parts)
        info["by"] = by
        info["groups"] = names

    ceiling = {k: nan_none(ev_all.ceiling[k]) for k in RATE_COLUMNS}
    # the capacity at which every metric reaches its ceiling: the largest finite key
    ceiling["capacity_bytes"] = passed.top * bpt
    knees = _knees(passed, grid, a_coef, b_coef, ev_all, bpt)
    result = CurveResult(curve=curve, by_group=by_group, ceiling=ceiling, knees=knees, info=info)
    result.display = display
    if by is not None:
        result.group_summary = _group_summary(passed, names, grid, a_coef, b_coef, ev_all, knees, bpt)
    return result


#: a first block this common makes the request hit rate say nothing (:func:`shared_first_block`)
SHARED_FIRST_BLOCK_SHARE = 0.99


def shared_first_block(trace, first_req: int = 0) -> dict | None:
    """The block most measured requests start with, when at least
    :data:`SHARED_FIRST_BLOCK_SHARE` of the non-empty ones do (a system prompt every
    request carries, as in the Mooncake traces): ``{"hash", "share"}``, else None.

    Then the request hit rate (usable prefix >= 1 block) is about that share at every
    capacity that holds one block, and tells a planner nothing; the usable-prefix token
    rate is the figure to read.
    """
    first = trace.first_blocks()[first_req:]
    first = first[first >= 0]
    if first.size == 0:
        return None
    block, share = dominant_block(first)
    if share < SHARED_FIRST_BLOCK_SHARE:
        return None
    return {"hash": int(trace.block_hash[block]), "share": share}


def dominant_block(blocks: np.ndarray) -> tuple[int, float]:
    """(the block most of ``blocks`` are, its share), exact whenever that share is above
    one half (then it is the median: an O(n) selection, no sort); below, the block
    returned is the median, whose share is below one half too. ``blocks`` non-empty."""
    at = np.asarray(blocks).astype(np.int64, copy=False)
    top = at.shape[0] // 2
    candidate = int(np.partition(at, top)[top])
    return candidate, float(np.count_nonzero(at == candidate)) / at.shape[0]


#: the share of the overall ceiling at which ``CurveResult.group_summary`` compares the groups
GROUP_SUMMARY_FRACTION = 0.8


def _group_summary(passed: CurvePass, names, grid, a, b, ev_all, knees, bpt) -> pl.DataFrame:
    """Per group: the rates at the capacity where the whole trace reaches
    :data:`GROUP_SUMMARY_FRACTION` of its usable-prefix token ceiling (the knee, found
    exactly), and each group's own ceiling (infinite cache).

    An exact pass evaluates the rates at the knee capacity itself (one more pass over
    its usable distances, :attr:`CurvePass.at_capacity`); a sampled pass has only its
    grid, so its rates are those of the largest grid capacity not above the knee, and
    ``capacity_bytes`` says which (``at_knee`` false).
    """
    sel = knees.filter((pl.col("metric") == HEADLINE) & (pl.col("fraction") == GROUP_SUMMARY_FRACTION))
    knee = sel["capacity_tokens"][0] if sel.height else None
    n = len(names)
    if knee is None:
        at, exact, rates = None, False, {k: np.full(n, np.nan) for k in RATE_COLUMNS}
    elif passed.at_capacity is not None:
        one = evaluate_pass(passed, n, np.array([int(knee)], dtype=np.int64), a, b, hist=passed.at_capacity(int(knee)))
        at, exact, rates = int(knee), True, {k: one.rates[k][:n, 0] for k in RATE_COLUMNS}
    else:
        gi = max(int(np.searchsorted(grid, int(knee), side="right")) - 1, 0)
        at, exact, rates = int(grid[gi]), bool(grid[gi] == knee), {k: ev_all.rates[k][:n, gi] for k in RATE_COLUMNS}
    out = {"group_name": names, "capacity_bytes": [None if at is None else at * bpt] * n,
           "at_knee": [exact] * n}
    for k in ("request_hit_rate", "prefix_token_hit_rate", "compute_saved_rate"):
        out[k] = rates[k]
    out["ceiling_prefix_token_hit_rate"] = ev_all.row_ceiling[HEADLINE][:n]
    return pl.DataFrame(out, schema_overrides={"capacity_bytes": pl.Int64}).with_columns(
        pl.col(pl.Float64).fill_nan(None))


def nan_none(x):
    x = float(x)
    return None if math.isnan(x) else x


def _knees(passed: CurvePass, grid, a, b, ev_all: _Evaluation, bpt) -> pl.DataFrame:
    """Exact smallest capacity reaching each fraction of the ceiling, per knee metric."""
    kgrid = grid
    G = kgrid.shape[0]
    hist = ev_all.prefix_hist  # [G + 2, 4]
    weights = {"prefix_token_hit_rate": hist[:, 1], "compute_saved_rate": a * hist[:, 1] + b * hist[:, 3]}
    targets = {}
    wanted = set()
    for metric, w in weights.items():
        cw = np.cumsum(w[: G + 1])
        ceiling_w = float(cw[-1]) if cw.size else 0.0
        for f in KNEE_FRACTIONS:
            if ceiling_w <= 0:
                continue
            target = f * ceiling_w
            j = int(np.searchsorted(cw, target * (1 - 1e-12), side="left"))
            j = min(j, G)
            wanted.add(j)
            targets[(metric, f)] = (target, j, float(cw[j - 1]) if j > 0 else 0.0)
    # bin j holds keys in (grid[j-1], grid[j]] (bin G: above the grid, finite)
    bins_sorted = np.array(sorted(wanted), dtype=np.int64)
    lo_keys = np.array([kgrid[j - 1] if j > 0 else -1 for j in bins_sorted], dtype=np.int64)
    hi_keys = np.array([kgrid[j] if j < G else COLD - 1 for j in bins_sorted], dtype=np.int64)
    ks, rng, tok, q = passed.keys_in_ranges(lo_keys, hi_keys)
    bins = bins_sorted[rng] if rng.size else rng
    order = np.lexsort((ks, bins))
    ks, bins, tok, q = ks[order], bins[order], tok[order], q[order]
    rows = []
    req_sorted = None  # request keys sorted once, with cumulative weights
    for metric in KNEE_METRICS:
        ceiling_rate = ev_all.ceiling[metric]
        for f in KNEE_FRACTIONS:
            if metric == "request_hit_rate":
                if req_sorted is None:
                    rk = ev_all.request_keys[ev_all.request_members]
                    rw = None if ev_all.request_weights is None else ev_all.request_weights[ev_all.request_members]
                    warm = rk != COLD
                    rk = rk[warm]
                    if rw is None:  # every request weighs 1: the i-th smallest key, no sort
                        req_sorted = (rk, None)
                    else:
                        order = np.argsort(rk, kind="stable")
                        req_sorted = (rk[order], np.cumsum(rw[warm][order]))
                rk, c = req_sorted
                if rk.size == 0:
                    rows.append((metric, f, 0.0, None, None))
                    continue
                if c is None:  # cumulative weights 1, 2, ..., n
                    n = rk.shape[0]
                    i = min(max(math.ceil(f * n * (1 - 1e-12)) - 1, 0), n - 1)
                    key = int(np.partition(rk, i)[i])
                else:
                    i = int(np.searchsorted(c, f * c[-1] * (1 - 1e-12), side="left"))
                    key = int(rk[min(i, rk.shape[0] - 1)])
            else:
                if (metric, f) not in targets:
                    rows.append((metric, f, 0.0, None, None))
                    continue
                target, j, before = targets[(metric, f)]
                lo, hi = np.searchsorted(bins, j, side="left"), np.searchsorted(bins, j, side="right")
                w = tok[lo:hi] if metric == "prefix_token_hit_rate" else a * tok[lo:hi] + b * q[lo:hi]
                c = before + np.cumsum(w)
                i = int(np.searchsorted(c, target * (1 - 1e-12), side="left"))
                key = int(ks[lo + min(i, hi - lo - 1)])
            cap_tokens = key
            rows.append((metric, f, float(f * ceiling_rate), cap_tokens * bpt, cap_tokens))
    return pl.DataFrame(
        rows, schema={"metric": pl.String, "fraction": pl.Float64, "target_rate": pl.Float64,
                      "capacity_bytes": pl.Int64, "capacity_tokens": pl.Int64}, orient="row",
    )
