"""Capacity-hit curves weighted by what a hit is worth (DESIGN §3).

One pass of the stack-distance kernel gives every access's distance; hits at any
capacity follow exactly (``dist <= C``). :func:`compute_curve` turns the distances into
the result tables below.

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

from kvtrace.analyses.distances import Distances, _distances_of, normalise_eviction
from kvtrace.errors import KvtraceError, UsageError
from kvtrace.kernels.hitcurve import binned_hits, keys_in_ranges, max_finite
from kvtrace.analyses.sampled import SUBSAMPLES, sampled_pass, subsample_error
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


_NO_SCALE = np.empty(0, dtype=np.float64)  # binning weights: all 1 (sampled passes bin themselves)


@dataclass
class _Stream:
    """Arrays the curve needs: the whole trace's, or (chunked passes) request offsets
    only, or (sampled passes) the sampled requests' trace indices."""

    block: np.ndarray
    size: np.ndarray
    req_start: np.ndarray  # offsets of the stream's requests (exact: all R, possibly empty)
    tokens: np.ndarray
    pos: np.ndarray
    request: np.ndarray  # the stream's request index of each access
    req_ids: np.ndarray | None = None  # trace request of each stream request (None: the identity)

    def first_request(self, first_req: int) -> int:
        """The stream's first request at or after trace request ``first_req``."""
        return first_req if self.req_ids is None else int(np.searchsorted(self.req_ids, first_req))

    def request_groups(self, req_group: np.ndarray | None) -> np.ndarray | None:
        """Per-request group labels for the stream's requests."""
        if req_group is None or self.req_ids is None:
            return req_group
        return req_group[self.req_ids]


def _full_stream(trace: Trace) -> _Stream:
    a = trace.accesses
    return _Stream(a.block, trace.block_size, a.req_start, a.tokens, a.pos, a.request)


def _request_keys(d: Distances, s: _Stream, first_req: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Usable-prefix key of each measured request's first block, which requests count
    (every measured request: an empty one never hits), and each request's half-prefix
    key (:func:`half_prefix_keys`)."""
    rs = s.req_start
    nonempty = rs[1:] > rs[:-1]
    members = np.arange(rs.shape[0] - 1) >= first_req
    keys = np.full(rs.shape[0] - 1, COLD, dtype=np.int64)
    keys[nonempty] = d.usable[rs[:-1][nonempty]]
    return keys, members, half_prefix_keys(d.usable, s.tokens, rs)


def half_prefix_keys(usable: np.ndarray, tokens: np.ndarray, req_start: np.ndarray) -> np.ndarray:
    """int64[R]: the smallest capacity (tokens) at which each request's usable prefix
    holds at least half its prompt tokens; COLD for an empty request or one that never
    gets there.

    ``usable`` is non-decreasing along a request (a running max), so at capacity C the
    usable prefix is the blocks with ``usable <= C`` and reaches half the tokens iff the
    block at which the request's cumulative tokens first reach ``ceil(total / 2)`` is in
    it: the key is that block's usable distance (one ``searchsorted`` over the cumulative
    tokens; every block has >= 1 token, so the sums are strictly increasing).
    """
    rs = np.asarray(req_start, dtype=np.int64)
    keys = np.full(rs.shape[0] - 1, COLD, dtype=np.int64)
    if usable.shape[0] == 0:
        return keys
    cum = np.cumsum(tokens, dtype=np.int64)
    start, end = rs[:-1], rs[1:]
    nonempty = end > start
    st, en = start[nonempty], end[nonempty]
    base = np.where(st > 0, cum[np.maximum(st - 1, 0)], 0)
    total = cum[en - 1] - base
    at = np.searchsorted(cum, base + (total + 1) // 2, side="left")
    keys[nonempty] = usable[at]
    return keys


def _request_hist(keys, members, weights, req_group, n_groups, grid) -> np.ndarray:
    """Requests per bin, float64[n_groups, G + 2] (bin G: above the grid, G + 1: cold)."""
    G = grid.shape[0]
    k = keys[members]
    idx = np.where(k == COLD, G + 1, np.searchsorted(grid, k, side="left"))
    g = (req_group[members] if req_group is not None else np.zeros(k.shape[0], dtype=np.int32)).astype(np.int64)
    w = None if weights is None else weights[members]
    flat = np.bincount(g * (G + 2) + idx, weights=w, minlength=n_groups * (G + 2))
    return flat.reshape(n_groups, G + 2).astype(np.float64)


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


def _evaluate(d, s, first_req, B, req_group, n_groups, grid, a, b, passed=None) -> _Evaluation:
    first = int(s.req_start[first_req])
    kgrid = grid
    G = kgrid.shape[0]
    if passed is not None:  # binned chunk by chunk already (kvtrace.ingest.stream, kvtrace.analyses.distributed)
        h, (rkeys, rmembers, *half) = passed.hist, passed.request_keys
        hkeys = half[0] if half else None  # sampled and partitioned passes have no half-prefix keys
    else:
        group_acc = req_group[s.request].astype(np.int32) if req_group is not None else np.empty(0, np.int32)
        h = binned_hits(d.dist, d.usable, first, s.tokens, s.pos, s.block, s.size, B, group_acc, n_groups, kgrid,
                        _NO_SCALE)
        rkeys, rmembers, hkeys = _request_keys(d, s, first_req)
    rweights = None if passed is None else passed.request_weights  # sampled: its first evaluated access's
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

    Parameters
    ----------
    trace : Trace
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
        Reuse already computed exact distances (same eviction model).
    progress : callable, optional
        ``progress(done, total)`` while the kernel runs.
    """
    model = model if isinstance(model, ModelSpec) else resolve_model(model)
    gpu = gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu)
    ev = normalise_eviction(eviction)
    bpt = int(model.kv_bytes_per_token)
    a_coef, b_coef = model.flops_coefficients()
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

    passed = None
    if rate < 1.0:
        # one chunked pass, binned as it goes (kvtrace.analyses.sampled), in memory or streamed
        passed = sampled_pass(trace, ev, rate, grid, first_req, req_group, len(names), B, progress=progress)
        stream, d = passed.stream, passed.distances
    elif hasattr(trace, "binned_pass"):
        # a trace too large to hold (kvtrace.ingest.stream, kvtrace.analyses.distributed): its accesses are
        # binned on the grid chunk by chunk; per-access arrays never exist whole
        passed = trace.binned_pass(ev, grid, first_req, req_group, len(names), B, progress=progress)
        stream, d = passed.stream, passed.distances
    else:
        stream = _full_stream(trace)
        if distances is not None:
            if distances.eviction != ev:
                raise ValueError("distances were computed with another eviction model")
            d = distances
        else:
            d = _distances_of(stream.block, stream.size, stream.req_start, ev, progress=progress)

    # the stream's own request numbering (a sampled stream holds only some requests)
    s_first, s_group = stream.first_request(first_req), stream.request_groups(req_group)
    ev_all = _evaluate(d, stream, s_first, B, s_group, len(names), grid, a_coef, b_coef, passed)
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

    main_tokens = base_grid if user_tokens is None else user_tokens
    main_bytes = None if user_tokens is None else capacities
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
        "measured_accesses": int(trace.n_accesses - trace.accesses.req_start[first_req]),
        "measured_duration_s": seconds,
        "distinct_blocks": trace.n_blocks,
        "distinct_bytes": total_tokens * bpt,
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
            "mean_standard_error": _nan_none(np.nanmean(se[sel])) if np.isfinite(se[sel]).any() else None,
            "max_standard_error": _nan_none(np.nanmax(se[sel])) if np.isfinite(se[sel]).any() else None,
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

    ceiling = {k: _nan_none(ev_all.ceiling[k]) for k in RATE_COLUMNS}
    # the capacity at which every metric reaches its ceiling: the largest finite key
    measured = int(stream.req_start[s_first])
    top = (passed.top if passed is not None
           else max(0, int(max_finite(d.dist, measured)), int(max_finite(d.usable, measured))))
    ceiling["capacity_bytes"] = top * bpt
    knees = _knees(d, stream, s_first, B, grid, a_coef, b_coef, ev_all, bpt, passed)
    result = CurveResult(curve=curve, by_group=by_group, ceiling=ceiling, knees=knees, info=info)
    result.display = display
    if by is not None:
        result.group_summary = _group_summary(d, stream, s_first, B, s_group, names, grid, a_coef, b_coef, ev_all,
                                              knees, bpt, passed)
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
    from kvtrace.analyses.whatif import _first_blocks

    first = _first_blocks(trace)[first_req:]
    first = first[first >= 0]
    if first.size == 0:
        return None
    block, share = dominant_block(first)
    if share < SHARED_FIRST_BLOCK_SHARE:
        return None
    block_hash = trace.block_hash[block] if getattr(trace, "block_hash", None) is not None else None
    return {"hash": None if block_hash is None else int(block_hash), "share": share}


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


def _group_summary(d, stream, s_first, B, s_group, names, grid, a, b, ev_all, knees, bpt, passed) -> pl.DataFrame:
    """Per group: the rates at the capacity where the whole trace reaches
    :data:`GROUP_SUMMARY_FRACTION` of its usable-prefix token ceiling (the knee, found
    exactly), and each group's own ceiling (infinite cache).

    With exact distances in memory the rates are evaluated at the knee capacity itself
    (a one-point binning pass); a streamed, partitioned or sampled run has only its
    grid, so its rates are those of the largest grid capacity not above the knee, and
    ``capacity_bytes`` says which (``at_knee`` false).
    """
    sel = knees.filter((pl.col("metric") == HEADLINE) & (pl.col("fraction") == GROUP_SUMMARY_FRACTION))
    knee = sel["capacity_tokens"][0] if sel.height else None
    n = len(names)
    if knee is None:
        at, exact, rates = None, False, {k: np.full(n, np.nan) for k in RATE_COLUMNS}
    elif passed is None:
        one = _evaluate(d, stream, s_first, B, s_group, n, np.array([int(knee)], dtype=np.int64), a, b)
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


def _nan_none(x):
    x = float(x)
    return None if math.isnan(x) else x


def _knees(d, s, first_req, B, grid, a, b, ev_all: _Evaluation, bpt, passed=None) -> pl.DataFrame:
    """Exact smallest capacity reaching each fraction of the ceiling, per knee metric."""
    first = int(s.req_start[first_req])
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
    ks, rng, tok, q = (passed.keys_in_ranges(lo_keys, hi_keys) if passed is not None else
                       keys_in_ranges(d.usable, first, s.tokens, s.pos, B, lo_keys, hi_keys, _NO_SCALE))
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
