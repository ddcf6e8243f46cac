"""The search and the verdict of ``kvtrace size``: reuse distances to per-configuration
estimates, :func:`recommend` (search, lenses, confirmation by replay) and the
:class:`Recommendation` it makes, with its reasons, risks and ``kvtrace whatif``
reproduction. The tables' schemas are in the :mod:`kvtrace.analyses.sizing` docstring.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import polars as pl

from kvtrace.analyses.sizing.config import CANDIDATE_TEXT, SizingConfig
from kvtrace.analyses.sizing.lenses import (COLUMNS, TIER_TEXT, Point, Sizer, config_label, ms_text, pct_text,
                                            point_cost, rank_rows, rate_text, same_budget, same_capacity, same_slo,
                                            shortfall_text, signed_usd_text, usd_text)
from kvtrace.analyses.sizing.replay import WhatifReplay, whatif_command
from kvtrace.errors import KvtraceError
from kvtrace.units import format_bytes

_DAY_S = 86400.0
_SEARCH_MAX_ACCESSES = 2_000_000  # above this the search evaluates a systematic request sample

def _scaled(trace, k: float):
    """The trace replayed at ``k`` x its arrival rate (timestamps / k)."""
    if k == 1.0:
        return trace
    return dataclasses.replace(trace, requests=trace.requests.with_columns(pl.col("timestamp") / k))


def _node_distances(trace, node: np.ndarray, nodes: int, eviction: str) -> np.ndarray:
    """Per-node reuse distances (tokens) of every access, in global access order."""
    from kvtrace.analyses.distances import reuse_distances
    from kvtrace.trace import Accesses

    a = trace.accesses
    lens = np.diff(a.req_start)
    out = np.empty(trace.n_accesses, dtype=np.int64)
    for k in range(nodes):
        reqs = np.flatnonzero(node == k)
        if reqs.size == 0:
            continue
        idx = np.flatnonzero(np.repeat(node == k, lens))
        sub_rs = np.concatenate([[0], np.cumsum(lens[reqs])]).astype(np.int64)
        sub = dataclasses.replace(
            trace, requests=trace.requests[reqs],
            accesses=Accesses(request=np.repeat(np.arange(reqs.size), lens[reqs]), pos=a.pos[idx],
                              block=a.block[idx], tokens=a.tokens[idx], req_start=sub_rs))
        out[idx] = reuse_distances(sub, eviction).dist
    return out


class _Evaluator:
    """Search-phase estimates from reuse distances (admit-all, exclusive, promote-on-hit).

    An access is served from DRAM iff its (per-node) distance is ``<= C_d``, from the
    local SSD iff ``<= C_d + C_l``, from the shared pool iff its pooled distance is
    ``<= N C_d + C_f``; the usable prefix ends at the first miss, the reusable prefix at
    the first cold access (as in the tier simulator's accounting).
    """

    def __init__(self, trace, d_glob, d_node, node, model, gpu, first_req: int, nodes: int, window_s: float):
        from kvtrace.kernels.stackdist import COLD

        a = trace.accesses
        rs = a.req_start
        R = trace.n_requests
        ts = trace.request_timestamp
        n_meas = int(rs[R] - rs[first_req]) if R else 0
        self.sample_every = max(1, math.ceil(n_meas / _SEARCH_MAX_ACCESSES))
        reqs = np.arange(first_req, R)[:: self.sample_every]
        lens = np.diff(rs)
        keep = np.zeros(R, dtype=bool)
        keep[reqs] = True
        idx = np.flatnonzero(np.repeat(keep, lens))
        self.n_req = int(reqs.size)
        self.req = np.repeat(np.arange(self.n_req, dtype=np.int64), lens[reqs])
        a_coef, b_coef = model.flops_coefficients()
        bpt = int(model.kv_bytes_per_token)
        B = float(trace.meta.block_tokens)
        tok = a.tokens[idx].astype(np.float64)
        q = tok * (a.pos[idx].astype(np.float64) * B) + tok * (tok - 1.0) * 0.5
        self.tokens = tok
        self.flops = a_coef * tok + b_coef * q
        self.size = trace.block_size[a.block[idx]].astype(np.float64) * bpt
        self.dn = d_node[idx]
        self.dg = d_glob[idx]
        self.node = np.asarray(node)[a.request[idx]]
        cold = (self.dg == COLD).astype(np.int64)
        self.reusable = (np.maximum.accumulate(self.req * 2 + cold) - self.req * 2) == 0
        self.seconds = float(ts[-1] - ts[first_req]) if R else 0.0
        self.window = np.floor((ts[reqs] - (ts[first_req] if R else 0.0)) / window_s).astype(np.int64)
        self.window_s = window_s
        self.total_tokens = float(tok.sum())
        self.bpt, self.nodes, self.gpu, self.warm = bpt, nodes, gpu, first_req > 0
        self.cache: dict = {}

    def evaluate(self, p: Point, response) -> dict:
        key = (p, response)
        if key in self.cache:
            return self.cache[key]
        from kvtrace.analyses.response import request_times

        bpt, N, k = self.bpt, self.nodes, self.sample_every
        cd, cl, cf = p.dram // bpt, p.local // bpt, p.flash // bpt
        lvl = np.full(self.dn.shape[0], 3, dtype=np.int64)
        if cf > 0:
            lvl[self.dg <= N * cd + cf] = 2
        if cl > 0:
            lvl[self.dn <= cd + cl] = 1
        lvl[self.dn <= cd] = 0
        run = np.maximum.accumulate(self.req * 4 + lvl) - self.req * 4  # deepest tier so far in the request
        usable = run < 3
        from_d = usable & (lvl == 0)
        from_f = usable & (lvl > 0)
        n = self.n_req
        bd = np.bincount(self.req[from_d], self.size[from_d], minlength=n)
        bf = np.bincount(self.req[from_f], self.size[from_f], minlength=n)
        ff = np.bincount(self.req[from_f], self.flops[from_f], minlength=n)
        rec = self.reusable & ~usable
        fm = np.bincount(self.req[rec], self.flops[rec], minlength=n)
        has_flash = p.local > 0 or p.flash > 0
        t = request_times(bd, bf, ff, fm, response, has_flash) if n else np.zeros(0)
        sec = self.seconds
        hours = sec / 3600.0
        ins = self.dn > cd  # accesses that bring a block into DRAM (misses and flash hits)
        inserted = np.bincount(self.node[ins], self.size[ins], minlength=N) * k
        evicted = inserted if self.warm else np.maximum(inserted - p.dram, 0.0)
        wpd = float(evicted.sum()) / sec * _DAY_S if sec > 0 else None
        flash_cap = p.flash if p.flash else p.local * N
        out = {
            "dram_prefix_token_hit_rate": (float(self.tokens[usable & (run == 0)].sum()) / self.total_tokens
                                           if self.total_tokens else None),
            "ssd_prefix_token_hit_rate": (float(self.tokens[usable & (run > 0)].sum()) / self.total_tokens
                                          if self.total_tokens else None),
            "service_time_mean_ms": float(t.mean()) * 1e3 if n else None,
            "service_time_p99_ms": float(np.percentile(t, 99, method="inverted_cdf")) * 1e3 if n else None,
            "ssd_read_mean_bytes_per_s": float(bf.sum()) * k / sec if sec > 0 else None,
            "ssd_read_peak_bytes_per_s": (float(np.bincount(self.window, bf).max()) * k / self.window_s
                                            if n else 0.0),
            "dram_read_mean_bytes_per_s": float(bd.sum()) * k / sec if sec > 0 else None,
            "ssd_dwpd": (wpd / flash_cap) if (wpd is not None and has_flash and flash_cap > 0) else None,
            "gpu_seconds_saved_per_hour": (float(self.gpu.gpu_seconds(self.flops[usable].sum())) * k / hours
                                           if hours > 0 else None),
        }
        self.cache[key] = out
        return out


# --------------------------------------------------------------------------- result


@dataclass
class Recommendation:
    """The recommended candidate and why.

    Attributes
    ----------
    candidate : str
        One of :data:`CANDIDATES`.
    lens : str
        The lens it was chosen under (``same-slo``).
    config : str
        Tier configuration label.
    policy : str or None
        Flash admission policy.
    reasons : list of str
        The case for it, one line each (cost, net, break-even, knee, P99 before/after,
        bandwidth and DWPD headroom, the runner-up).
    risks : list of str
        What could make it wrong (mean improves but P99 does not, thin headroom, ...).
    figures : dict
        Key figures (the candidate's table row, plus before/after).
    replay : WhatifReplay or None
        The ``kvtrace whatif`` options that replay the chosen configuration (None when
        it has no configuration); :attr:`whatif_command` writes them as a command.
    feasible : bool
        Whether it meets every constraint (SLO, bandwidth, endurance). When False no
        candidate does: ``candidate`` is the closest one (smallest normalised
        shortfall), not a recommendation, and :attr:`headline` says so.
    headline : str
        The verdict's first line: ``recommendation: ...`` or ``no configuration meets ...``.
    shortfalls : dict
        Failed constraint -> its excess over the limit as a share of it (empty when
        feasible; keys of :data:`SHORTFALL_TEXT`).
    needed : list of str
        When infeasible, what would meet the constraints (estimated on the curves):
        the DRAM capacity that meets the SLO, or that no size can; the flash latency,
        endurance rating or bandwidth the closest configuration would need.
    """

    candidate: str
    lens: str
    config: str | None
    policy: str | None
    reasons: list
    risks: list
    figures: dict
    replay: WhatifReplay | None
    feasible: bool = True
    headline: str = ""
    shortfalls: dict = field(default_factory=dict)
    needed: list = field(default_factory=list)

    @property
    def whatif_command(self) -> str:
        """The ``kvtrace whatif`` command of :attr:`replay` ("" without one)."""
        return whatif_command(self.replay)

    def to_dict(self) -> dict:
        """JSON-ready, with the replay written as its command (``whatif_command``)."""
        d = dataclasses.asdict(self)
        return {("whatif_command" if k == "replay" else k): (self.whatif_command if k == "replay" else v)
                for k, v in d.items()}


@dataclass
class SizingResult:
    """Output of :func:`recommend` (schemas in the :mod:`kvtrace.analyses.sizing` docstring).

    Attributes
    ----------
    candidates : polars.DataFrame
        One row per candidate x lens, ranked within each lens.
    recommendation : Recommendation
    search : polars.DataFrame
        Every configuration the search evaluated (estimates).
    curve : CurveResult
        The capacity-hit curve of the (load-scaled) trace.
    config : SizingConfig
    info : dict
        Trace, model, GPU, lens targets, timings.
    costs : dict
        Configuration label -> list of per-tier :meth:`MonthlyCost.to_dict`.
    simulations : dict
        ``"label | policy"`` -> the simulator's summary of every replayed finalist.
    """

    candidates: pl.DataFrame
    recommendation: Recommendation
    search: pl.DataFrame
    curve: object
    config: SizingConfig
    info: dict = field(default_factory=dict)
    costs: dict = field(default_factory=dict)
    simulations: dict = field(default_factory=dict)

    def file_info(self) -> dict:
        """``info`` without the run time: files written from a result are byte-identical
        from run to run (the terminal and the app show the time)."""
        return {k: v for k, v in self.info.items() if k != "elapsed_s"}

    def to_dict(self) -> dict:
        """JSON-ready: config, info, recommendation, candidates, costs, knees, search."""
        return {
            "config": self.config.to_dict(),
            "info": self.file_info(),
            "feasible": self.recommendation.feasible,
            "recommendation": self.recommendation.to_dict(),
            "candidates": self.candidates.to_dicts(),
            "costs": self.costs,
            "knees": self.curve.knees.to_dicts(),
            "ceiling": self.curve.ceiling,
            "search": self.search.to_dicts(),
        }


_SEARCH_COLUMNS = {
    "candidate": pl.String, "dram_bytes": pl.Int64, "local_ssd_bytes": pl.Int64, "flash_bytes": pl.Int64,
    "total_bytes": pl.Int64, "dram_prefix_token_hit_rate": pl.Float64, "ssd_prefix_token_hit_rate": pl.Float64,
    "service_time_mean_ms": pl.Float64,
    "service_time_p99_ms": pl.Float64, "ssd_read_mean_bytes_per_s": pl.Float64, "ssd_read_peak_bytes_per_s": pl.Float64,
    "dram_read_mean_bytes_per_s": pl.Float64, "ssd_dwpd": pl.Float64, "gpu_seconds_saved_per_hour": pl.Float64,
    "cost_usd_per_month": pl.Float64, "net_usd_per_month": pl.Float64, "meets_slo": pl.Boolean,
    "within_limits": pl.Boolean, "feasible": pl.Boolean,
}


# --------------------------------------------------------------------------- recommend


def recommend(trace, config: SizingConfig, progress: Callable[[float, str], None] | None = None, *,
              trace_name: str | None = None) -> SizingResult:
    """Evaluate the six candidates under the three lenses and recommend one.

    Parameters
    ----------
    trace : Trace
        As returned by :func:`kvtrace.ingest.load_trace`.
    config : SizingConfig
    progress : callable, optional
        ``progress(fraction, message)`` with ``fraction`` in [0, 1].
    trace_name : str, optional
        Path shown in the ``kvtrace whatif`` command of the recommendation (default:
        the trace's source file name).

    Returns
    -------
    SizingResult
    """
    from kvtrace.analyses.curves import compute_curve, parse_warmup, warmup_first_request
    from kvtrace.analyses.distances import reuse_distances
    from kvtrace.model import resolve_gpu, resolve_model
    from kvtrace.analyses.whatif import route

    t_start = time.perf_counter()
    c = config
    done = [0.0]

    def report(frac, msg):
        if frac is not None:
            done[0] = max(done[0], min(1.0, frac))
        if progress is not None:
            progress(done[0], msg)

    model = resolve_model(c.model, dtype=c.dtype, kv_bytes_per_token=c.kv_bytes_per_token)
    gpu = resolve_gpu(c.gpu, mfu=c.gpu_mfu, dollars_per_hour=c.gpu_dollars_per_hour,
                      peak_flops=None if c.gpu_peak_tflops is None else c.gpu_peak_tflops * 1e12)
    if trace.n_requests == 0:
        raise KvtraceError("the trace has no requests: nothing to size", path=trace.meta.source or None)
    scale = c.load_scale
    if c.load_rps is not None:
        base = trace.n_requests / trace.duration if trace.duration > 0 else None
        if not base:
            raise KvtraceError("[load] rps needs a trace whose requests span some time", field="load.rps")
        scale = c.load_rps / base
    scaled = _scaled(trace, scale)
    first_req = warmup_first_request(scaled, parse_warmup(c.warmup))
    if first_req >= scaled.n_requests:
        raise KvtraceError("the warm-up covers the whole trace: nothing left to measure", field="load.warmup")

    report(0.0, "reuse distances")
    dist = reuse_distances(scaled, c.eviction)
    node = route(scaled, c.nodes, c.routing)
    d_node = dist.dist if c.nodes == 1 else _node_distances(scaled, node, c.nodes, c.eviction)
    report(0.15, "capacity-hit curve")
    curve = compute_curve(scaled, model=model, gpu=gpu, eviction=c.eviction, warmup=c.warmup, distances=dist)
    ev = _Evaluator(scaled, dist.dist, d_node, node, model, gpu, first_req, c.nodes, c.window_s)
    report(0.2, "search on the curves")

    def sim_progress(_, msg):
        report(min(0.95, done[0] + 0.01), msg)

    sz = Sizer(scaled, c, model, gpu, ev, sim_progress)
    sz.keep_sim = sz.sim(sz.keep, "all")
    sz.recompute_sim = sz.sim(Point(0), "all")
    slo_rows = rank_rows(same_slo(sz, report))
    if c.loaded:
        report(0.6, "under load")
        slo_rows = rank_rows(_under_load(sz, slo_rows))
    winner = slo_rows[0]

    report(0.65, "same-capacity lens")
    knee = curve.knees.filter((pl.col("metric") == "prefix_token_hit_rate") & (pl.col("fraction") == 0.95))
    knee_bytes = int(knee["capacity_bytes"][0]) if knee.height and knee["capacity_bytes"][0] is not None else None
    if c.same_capacity_bytes is not None:
        target, target_src = c.same_capacity_bytes, "config"
    else:
        step = c.tiers["dram"].step_bytes
        target = -(-(knee_bytes or c.current_dram_bytes * c.nodes) // step) * step
        target_src = "curve knee (95 % of the ceiling) rounded up to the DRAM step"
    cap_rows = rank_rows(same_capacity(sz, target))

    report(0.8, "same-budget lens")
    if c.budget_monthly_usd is not None:
        budget, budget_src = c.budget_monthly_usd, "config"
    else:
        budget = winner["cost_usd_per_month"] if winner["cost_usd_per_month"] is not None else point_cost(c,
                                                                                                           sz.keep)[0]
        budget_src = f"monthly cost of the same-SLO winner ({winner['candidate']})"
    bud_rows = rank_rows(same_budget(sz, budget))

    report(0.97, "recommendation")
    all_rows = slo_rows + cap_rows + bud_rows
    table = pl.DataFrame([{k: r.get(k) for k in COLUMNS} for r in all_rows], schema=COLUMNS, orient="row")
    search = pl.DataFrame([{k: r.get(k) for k in _SEARCH_COLUMNS} for r in sz.search_rows.values()],
                          schema=_SEARCH_COLUMNS, orient="row").sort("candidate", "cost_usd_per_month")
    info = {
        "trace": trace.meta.source, "requests": trace.n_requests, "accesses": trace.n_accesses,
        "duration_s": trace.duration, "replayed_duration_s": scaled.duration, "load_scale": scale,
        "load_assumptions": c.load_model().assumptions(sz.responses[None]) if c.loaded else None,
        "first_measured_request": first_req, "model": model.name, "kv_bytes_per_token": model.kv_bytes_per_token,
        "gpu": gpu.name, "gpu_dollars_per_hour": gpu.dollars_per_hour, "gpu_effective_flops": gpu.effective_flops,
        "slo": c.slo_text(), "same_capacity_bytes": target, "same_capacity_source": target_src,
        "budget_monthly_usd": budget, "budget_source": budget_src, "knee_95_bytes": knee_bytes,
        "ceiling_prefix_token_hit_rate": curve.ceiling.get("prefix_token_hit_rate"),
        "distinct_bytes": curve.info.get("distinct_bytes"),
        "search_points": len(sz.search_rows), "search_sample_every": ev.sample_every,
        "replays": len(sz.sims), "eviction": c.eviction, "cache_rules": c.cache_rules, "nodes": c.nodes,
        "routing": c.routing,
    }
    rec = _recommendation(sz, slo_rows, cap_rows, bud_rows, info, trace_name or trace.meta.source or "TRACE")
    info["elapsed_s"] = time.perf_counter() - t_start
    report(1.0, "done")
    sims = {f"{config_label(c, k[0])} | {k[1]}": v["summary"] for k, v in sz.sims.items()}
    shown = set(table["config"].drop_nulls().to_list())
    costs = {k: v for k, v in sz.costs.items() if k in shown}
    return SizingResult(table, rec, search, curve, c, info, costs, sims)


# --------------------------------------------------------------------------- under load


def _under_load(sz: Sizer, rows: list[dict]) -> list[dict]:
    """Each applicable row also simulated with queues (:mod:`kvtrace.analyses.load`) at
    the replayed load: its TTFT there (``loaded_ttft_*``), the highest load factor at
    which it still meets the TTFT targets (``load_headroom_factor``, to 2 %) and the
    resource that saturates first there (``loaded_bottleneck``). A row missing the
    targets at the configured load is not feasible (shortfall ``ttft``)."""
    from kvtrace.analyses.load import LoadLevel, headroom, replay_demand, run_level
    from kvtrace.analyses.whatif import TierConfig

    c = sz.config
    load = c.load_model()
    for row in rows:
        if row["config"] is None:
            continue
        p = Point(row["dram_bytes"], row["local_ssd_bytes"], row["flash_bytes"])
        response = sz.responses[p.flash_tier]
        cfg = TierConfig(dram_bytes=p.dram, local_ssd_bytes=p.local, flash_bytes=p.flash, nodes=c.nodes,
                         routing=c.routing, policy=row["policy"] or "all")
        demand, _ = replay_demand(sz.trace, cfg, load, model=sz.model, gpu=sz.gpu, response=response,
                                  eviction=c.eviction, cache_rules=c.cache_rules, warmup=c.warmup)
        try:
            at, _, _ = run_level(demand, LoadLevel(1.0), load, response)
            factor, best = headroom(demand, load, response, c.meets_ttft)
        finally:
            demand.close()
        row["loaded_ttft_mean_ms"] = at["ttft_mean_ms"]
        row["loaded_ttft_p99_ms"] = at["ttft_p99_ms"]
        row["loaded_bottleneck"] = at["bottleneck"]
        row["load_headroom_factor"] = factor
        row["headroom_bottleneck"] = None if best is None else best["bottleneck"]
        if not c.meets_ttft(at):
            short = dict(row.get("_shortfalls") or {})
            excess = [got / target - 1 for target, got in ((c.slo_ttft_mean_ms, at["ttft_mean_ms"]),
                                                           (c.slo_ttft_p99_ms, at["ttft_p99_ms"]))
                      if target is not None and got is not None and got > target]
            short["ttft"] = math.inf if at["overloaded"] else max(excess, default=math.inf)
            why = (f"overloaded under load: {at['overload_resource']} saturates" if at["overloaded"] else
                   f"{c.ttft_slo_text()} missed: TTFT mean {ms_text(at['ttft_mean_ms'])}, "
                   f"P99 {ms_text(at['ttft_p99_ms'])} (bottleneck {at['bottleneck']})")
            row.update(meets_slo=False, feasible=False, _shortfalls=short, shortfall=max(short.values()),
                       shortfalls=shortfall_text(short),
                       reasons="; ".join(filter(None, [row["reasons"], why])))
    return rows


# --------------------------------------------------------------------------- verdict


def _replay(sz: Sizer, row: dict, trace_name: str) -> WhatifReplay:
    """The ``kvtrace whatif`` options that replay ``row``'s configuration as the run did."""
    c, gpu = sz.config, sz.gpu
    p = Point(row["dram_bytes"], row["local_ssd_bytes"], row["flash_bytes"])
    resp = sz.responses[p.flash_tier]
    flash = p.flash_tier is not None
    return WhatifReplay(
        trace=trace_name, dram_bytes=p.dram, local_ssd_bytes=p.local, flash_bytes=p.flash,
        policy=row["policy"] if flash else None, nodes=c.nodes, routing=c.routing, model=c.model,
        kv_bytes_per_token=c.kv_bytes_per_token, dtype=c.dtype, gpu=c.gpu, mfu=gpu.mfu,
        gpu_dollars_per_hour=gpu.dollars_per_hour, dram_gbps=resp.dram_gbps, dram_latency_ms=resp.dram_latency_ms,
        flash_gbps=resp.flash_gbps if flash else None, flash_latency_ms=resp.flash_latency_ms if flash else None,
        overhead_ms=resp.overhead_ms if flash else None, eviction=c.eviction, warmup=c.warmup,
        cache_rules=c.cache_rules)


def _recommendation(sz: Sizer, slo_rows, cap_rows, bud_rows, info, trace_name: str) -> Recommendation:
    c = sz.config
    top = slo_rows[0]
    keep = next(r for r in slo_rows if r["candidate"] == "keep-dram")
    name = CANDIDATE_TEXT[top["candidate"]]
    pol = f", admission {top['policy']}" if top["policy"] else ""
    reasons: list[str] = []
    risks: list[str] = []
    needed: list[str] = []
    if top["feasible"]:
        checks = "the read bandwidth" + (" and the flash endurance" if top["ssd_dwpd"] is not None else "")
        reasons.append(f"{name} ({top['config']}{pol}) is the best candidate meeting the SLO ({c.slo_text()}): "
                       f"mean {ms_text(top['service_time_mean_ms'])}, P99 {ms_text(top['service_time_p99_ms'])}, "
                       f"within {checks}.")
        headline = f"recommendation: {name}" + (f" ({top['config']}{pol})" if top["config"] else "")
    else:
        applicable = [r for r in slo_rows if r["config"] is not None]
        if applicable and all(not r["meets_slo"] for r in applicable):
            what = f"the SLO {c.slo_text()}"
        else:
            what = f"every constraint (the SLO {c.slo_text()}, the read bandwidth and the endurance ratings)"
        headline = (f"no configuration meets {what}: closest is {name}"
                    + (f" ({top['config']}{pol})" if top["config"] else "")
                    + f", short by {top['shortfalls'] or 'an unknown margin'}")
        reasons.append(f"No candidate meets every constraint (SLO {c.slo_text()}, bandwidth, endurance); the "
                       f"closest, by normalised shortfall (the largest excess of a failed constraint over its "
                       f"limit), is {name} ({top['config']}{pol}): {top['reasons']}.")
        needed = _needed(sz, top, info)
    be = top["break_even_realisation"]
    be_text = ("" if be is None else "; it pays at any realisation ratio" if be == 0 else
               f"; it breaks even at a realisation ratio of {pct_text(be)}")
    if top["candidate"] == "keep-dram":
        reasons.append(f"It costs {usd_text(top['cost_usd_per_month'])}/month and needs no new spend.")
    elif top["gpu_hours_saved_per_month"] is None:  # a trace that spans no time has no rate per month
        reasons.append(
            f"It costs {usd_text(top['cost_usd_per_month'])}/month "
            f"({signed_usd_text(top['incremental_cost_usd_per_month'])} vs today's "
            f"{keep['config']}); the trace spans no time (its requests share one timestamp), so the GPU-hours it "
            "frees per month, their value and the net are unknown: replay a longer trace.")
    else:
        reasons.append(
            f"It costs {usd_text(top['cost_usd_per_month'])}/month "
            f"({signed_usd_text(top['incremental_cost_usd_per_month'])} vs today's "
            f"{keep['config']}); it frees {top['gpu_hours_saved_per_month']:,.1f} GPU-h/month worth "
            f"{usd_text(top['value_usd_per_month'])}, {usd_text(top['realised_value_usd_per_month'])} realised at "
            f"{pct_text(c.realisation)}: net {signed_usd_text(top['net_usd_per_month'])}/month{be_text}.")
    if top["break_even_restore_ms"] is not None:
        reasons.append(f"Flash restores average {ms_text(top['restore_mean_ms'])}; flash pays off on average while "
                       f"they stay under {ms_text(top['break_even_restore_ms'])} "
                       "(R - O / h_F of the requests reading it).")
    if info["knee_95_bytes"]:
        reasons.append(
            f"Curve knee: 95 % of the reuse ceiling ({pct_text(info['ceiling_prefix_token_hit_rate'])} of prompt "
            f"tokens) needs {format_bytes(info['knee_95_bytes'])} of cache; this configuration holds "
            f"{format_bytes(top['total_bytes'])} and serves "
            f"{pct_text((top['dram_prefix_token_hit_rate'] or 0) + (top['ssd_prefix_token_hit_rate'] or 0))} of "
            f"prompt tokens from cache ({pct_text(top['dram_prefix_token_hit_rate'])} DRAM, "
            f"{pct_text(top['ssd_prefix_token_hit_rate'])} flash).")
    reasons.append(f"P99 {ms_text(keep['service_time_p99_ms'])} -> {ms_text(top['service_time_p99_ms'])}, "
                   f"mean {ms_text(keep['service_time_mean_ms'])} -> "
                   f"{ms_text(top['service_time_mean_ms'])} (today: {keep['config']}).")
    bw = []
    if top["dram_read_mean_bytes_per_s"] and top["dram_bandwidth_bytes_per_s"]:
        bw.append(f"DRAM reads {rate_text(top['dram_read_mean_bytes_per_s'])} of "
                  f"{rate_text(top['dram_bandwidth_bytes_per_s'])}")
    if top["ssd_read_peak_bytes_per_s"] is not None and top["ssd_bandwidth_bytes_per_s"]:
        bw.append(f"flash peaks at {rate_text(top['ssd_read_peak_bytes_per_s'])} per {c.window_s:g} s window "
                  f"(mean {rate_text(top['ssd_read_mean_bytes_per_s'])}) of "
                  f"{rate_text(top['ssd_bandwidth_bytes_per_s'])}")
    if bw:
        head = top["bandwidth_headroom"]
        reasons.append("Bandwidth: " + "; ".join(bw) + ("" if head is None else f" (headroom {head:,.1f}x)") + ".")
    if top["ssd_dwpd"] is not None:
        reasons.append(f"Endurance: {top['ssd_dwpd']:,.2f} drive writes per day against {top['endurance_dwpd']:g} rated"
                       + ("" if top["dwpd_headroom"] is None else f" ({top['dwpd_headroom']:,.1f}x headroom)") + ".")
    runner = next((r for r in slo_rows[1:] if r["feasible"]), None)
    if runner is not None and top["feasible"]:
        gap = (top["net_usd_per_month"] or 0) - (runner["net_usd_per_month"] or 0)
        reasons.append(f"Next best under the same SLO: {CANDIDATE_TEXT[runner['candidate']]} ({runner['config']}) at "
                       f"net {signed_usd_text(runner['net_usd_per_month'])}/month, {usd_text(gap)}/month less.")
    for r in slo_rows:
        if r is top or r["feasible"]:
            continue
        why = r["reasons"] or "infeasible"
        reasons.append(f"Ruled out: {CANDIDATE_TEXT[r['candidate']]}"
                       + (f" ({r['config']}{', ' + r['policy'] if r['policy'] else ''})" if r["config"] else "")
                       + f": {why}.")
    def lens_best(rows) -> str:
        r = rows[0]
        if not r["feasible"]:
            return "no candidate meets every constraint"
        return f"the best is {CANDIDATE_TEXT[r['candidate']]} ({r['config']})"

    reasons.append(
        f"Other lenses: at the same capacity ({format_bytes(info['same_capacity_bytes'])} in total) "
        f"{lens_best(cap_rows)}; at the same budget ({usd_text(info['budget_monthly_usd'])}/month) "
        f"{lens_best(bud_rows)}.")

    # risks
    for r in slo_rows:
        if (r["config"] is not None and r["candidate"] != "keep-dram" and r["service_time_mean_ms"] is not None
                and keep["service_time_mean_ms"] is not None
                and r["service_time_mean_ms"] < keep["service_time_mean_ms"]
                and r["service_time_p99_ms"] >= keep["service_time_p99_ms"]):
            who = "the recommendation" if r is top else CANDIDATE_TEXT[r["candidate"]]
            risks.append(f"Mean improves but P99 does not for {who}: mean {ms_text(keep['service_time_mean_ms'])} -> "
                         f"{ms_text(r['service_time_mean_ms'])}, P99 {ms_text(keep['service_time_p99_ms'])} -> "
                         f"{ms_text(r['service_time_p99_ms'])}.")
    for target, got, what in ((c.slo_p99_ms, top["service_time_p99_ms"], "P99"), (c.slo_mean_ms,
                                                                                  top["service_time_mean_ms"], "mean")):
        if target is not None and got is not None and 0.9 * target < got <= target:
            risks.append(f"Thin margin: {what} {ms_text(got)} is within 10 % of its {target:g} ms target.")
    if top["bandwidth_headroom"] is not None and top["bandwidth_headroom"] < 1.5:
        risks.append(f"Bandwidth headroom is only {top['bandwidth_headroom']:.2f}x: bursts beyond the "
                     f"{c.window_s:g} s window, queueing and rebuild traffic are not modelled.")
    if top["dwpd_headroom"] is not None and top["dwpd_headroom"] < 2:
        risks.append(f"Endurance headroom is only {top['dwpd_headroom']:.2f}x the rated DWPD.")
    if be is not None and be > c.realisation:
        risks.append(f"It pays off only if {pct_text(be)} of freed GPU time becomes money "
                     f"(assumed {pct_text(c.realisation)}): meeting the SLO is what is being bought.")
    if info["replayed_duration_s"] < 3600:
        risks.append(f"The replay covers {info['replayed_duration_s'] / 60:,.1f} minutes: writes per day, bandwidth "
                     "and $/month take it as representative of every hour; the warm-up of large tiers is not "
                     "reached in so short a trace.")
    if c.nodes == 1 and top["flash_bytes"]:
        risks.append("With one node a shared pool's advantage over local SSDs (pooling across nodes) is not exercised.")
    from kvtrace.model import resolve_gpu

    if sz.gpu.peak_flops != resolve_gpu(c.gpu).peak_flops and top["config"] is not None:
        risks.append("kvtrace whatif cannot set the GPU peak of the config: its replay uses the preset's peak, "
                     "so its recompute times differ from this report's.")
    if info["search_sample_every"] > 1:
        risks.append(f"The search estimated on 1 in {info['search_sample_every']} requests; the table is replayed "
                     "in full.")
    if c.cache_rules == "ideal":
        risks.append("Cache rules: kvtrace's ideal model (every block, partial ones included, reusable); the "
                     "engines recompute a request's last block and store only full blocks: set [search] "
                     "cache_rules = \"vllm\" or \"sglang\" to replay with their rules.")
    else:
        reasons.append(f"Every replay applies {c.cache_rules}'s reuse rules to the tiers (a request's last block "
                       "recomputed, only full blocks stored); the search's estimates are the ideal model's, so "
                       "each candidate is confirmed by replay.")
    if c.loaded:
        if top.get("load_headroom_factor") is not None:
            reasons.append(
                f"Under load ({info['load_assumptions']}): TTFT mean {ms_text(top['loaded_ttft_mean_ms'])}, P99 "
                f"{ms_text(top['loaded_ttft_p99_ms'])} at the replayed rate; it meets {c.ttft_slo_text()} up to "
                f"{top['load_headroom_factor']:.2f}x that rate, where {top['headroom_bottleneck']} is the busiest "
                "resource (the first to saturate).")
        elif top["config"] is not None:
            reasons.append(f"Under load ({info['load_assumptions']}) it meets {c.ttft_slo_text()} at no load "
                           f"tried: {top['loaded_bottleneck']} saturates first.")
        risks.append("Under load, restores and prefills queue on the configured resources; the cache's behaviour "
                     "is the trace's own at every load, and prices are the config's.")
    else:
        risks.append("Service times are unloaded (no queueing) and exclude the GPU time restores cost; prices are "
                     "the config's (set [slo] ttft_p99_ms and the [load] resources to decide under load).")
    figures = {k: v for k, v in top.items() if not k.startswith("_")}
    figures.update({"before_service_time_mean_ms": keep["service_time_mean_ms"],
                    "before_service_time_p99_ms": keep["service_time_p99_ms"],
                    "before_config": keep["config"], "knee_95_bytes": info["knee_95_bytes"]})
    replay = _replay(sz, top, trace_name) if top["config"] is not None else None
    return Recommendation(top["candidate"], "same-slo", top["config"], top["policy"], reasons, risks, figures,
                          replay, feasible=bool(top["feasible"]), headline=headline,
                          shortfalls=dict(top.get("_shortfalls") or {}), needed=needed)


def _bisect(lo: float, hi: float, ok: Callable[[float], bool], *, steps: int = 24) -> float:
    """The smallest x in [lo, hi] with ``ok(x)`` (``ok`` monotone: false below, true
    above; ``ok(hi)`` true), to a relative precision of about 2**-steps (geometric on
    a positive range)."""
    for _ in range(steps):
        mid = math.sqrt(lo * hi) if lo > 0 else (lo + hi) / 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _needed(sz: Sizer, top: dict, info: dict) -> list[str]:
    """What would meet the constraints that no candidate meets, searched on the same
    curves as the candidates (admit-all estimates, ``_Evaluator``).

    * The SLO with DRAM alone: the smallest DRAM per node meeting it (bisection on the
      estimate, which is monotone in capacity), or, when even a DRAM holding every
      distinct block misses it, that no cache size can: the reuse ceiling is too low.
    * The closest configuration's flash: the restore latency at which it meets the SLO
      (bisection on the flash tier's fixed latency), the DWPD rating its writes need
      (or the larger pool that would bring them under the rating), the read bandwidth
      its peak window needs.
    """
    c, ev, out = sz.config, sz.ev, []
    short = top.get("_shortfalls") or {}
    slo_missed = "slo_mean" in short or "slo_p99" in short
    resp = sz.responses[None]
    meets = lambda e: sz.meets_slo(e["service_time_mean_ms"], e["service_time_p99_ms"])  # noqa: E731
    distinct = int(info.get("distinct_bytes") or 0)
    if slo_missed and c.has_slo and distinct > 0:
        full = ev.evaluate(Point(distinct), resp)
        if not meets(full):
            ceiling = info["ceiling_prefix_token_hit_rate"] or 0.0
            out.append(f"No cache size meets the SLO: with every distinct block in DRAM ({format_bytes(distinct)}"
                       f"{' per node' if c.nodes > 1 else ''}) the estimate is still mean "
                       f"{ms_text(full['service_time_mean_ms'])}, P99 {ms_text(full['service_time_p99_ms'])}, set by "
                       f"DRAM restores at {c.tiers['dram'].restore_gbps:g} GB/s and the prefill of the "
                       f"{pct_text(1.0 - ceiling)} of prompt tokens no cache can hold (the reuse ceiling is "
                       f"{pct_text(ceiling)}): it takes faster restores or prefill (GPU, MFU), or a looser SLO.")
        else:
            lo = max(float(c.current_dram_bytes), 1.0)
            need = int(lo)
            if not meets(ev.evaluate(Point(need), resp)):
                need = int(_bisect(lo, float(distinct), lambda x: meets(ev.evaluate(Point(int(x)), resp)),
                                   steps=20))
            dram_max = c.tiers["dram"].max_bytes
            beyond = (f", beyond the configured DRAM maximum of {format_bytes(dram_max)}"
                      if dram_max and need > dram_max else "")
            out.append(f"DRAM alone meets the SLO from about {format_bytes(need)}{' per node' if c.nodes > 1 else ''}"
                       f" (estimated on the curves, admit-all){beyond}.")
    p = Point(top["dram_bytes"] or 0, top["local_ssd_bytes"] or 0, top["flash_bytes"] or 0)
    t = p.flash_tier
    tier = TIER_TEXT.get(t, "")
    if t is not None and slo_missed:
        base = sz.responses[t]
        lat_ms = c.tiers[t].latency_ms
        at = lambda ms: ev.evaluate(p, dataclasses.replace(base, flash_fixed_s=ms / 1e3))  # noqa: E731
        if meets(at(0.0)):
            ms = _bisect(0.0, lat_ms, lambda x: meets(at(x)), steps=30) if lat_ms > 0 else 0.0
            out.append(f"At {top['config']} the SLO is met with a {tier} restore latency of "
                       f"{ms:,.3g} ms or less (configured {lat_ms:g} ms; estimated on the curves).")
        else:
            out.append(f"At {top['config']} no {tier} latency meets the SLO (even 0 ms: estimated on "
                       "the curves): it takes more capacity, restore bandwidth or faster prefill.")
    if t is not None and "endurance" in short:
        rated = c.tiers[t].endurance_dwpd
        out.append(f"Its writes need a {tier} rated for {top['ssd_dwpd']:,.2f} drive writes/day "
                   f"(configured {rated:g}), or about {top['ssd_dwpd'] / rated:,.2f}x the capacity at the same writes, "
                   "or a stricter admission policy.")
    if t is not None and "flash_bandwidth" in short:
        out.append(f"Its peak {c.window_s:g} s window reads {rate_text(top['ssd_read_peak_bytes_per_s'])}: the "
                   f"{tier} must deliver that (configured {rate_text(top['ssd_bandwidth_bytes_per_s'])}).")
    if "dram_bandwidth" in short:
        out.append(f"Its DRAM reads {rate_text(top['dram_read_mean_bytes_per_s'])} on average: DRAM must deliver that "
                   f"(configured {rate_text(top['dram_bandwidth_bytes_per_s'])}).")
    return out

