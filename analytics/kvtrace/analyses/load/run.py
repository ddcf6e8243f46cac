"""Load levels over a replay's demand: one queue simulation per level
(:func:`run_level`), a load curve over configurations and levels (:func:`load_curve`),
and the highest load that still meets an SLO (:func:`headroom`)."""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from kvtrace.analyses.curves import parse_warmup, warmup_first_request
from kvtrace.analyses.load.demand import (COLUMNS, D_BD, D_BF, D_BL, D_KFL, D_KREST, D_NODE, D_SFL, D_SREST, D_WF,
                                          D_WL, Demand, Transfers)
from kvtrace.analyses.load.model import LoadLevel, LoadModel
from kvtrace.analyses.response import ResponseModel, percentiles
from kvtrace.analyses.whatif.config import TierConfig
from kvtrace.analyses.whatif.simulate import simulate
from kvtrace.config import plain_numpy_pages
from kvtrace.errors import UsageError
from kvtrace.kernels import queueing as Q
from kvtrace.model import GpuSpec, ModelSpec, resolve_gpu, resolve_model

#: Requests fed to the queue simulator per call.
BATCH = 1 << 16
#: Resource types, in table order (``util_<resource>`` columns).
RESOURCES = Q.STATION_TYPES
#: A resource at or above this utilisation is saturated (the load curve's mark).
SATURATED = 0.95


@dataclass
class LoadResult:
    """Output of :func:`load_curve` (schemas in the package docstring).

    Attributes
    ----------
    table : polars.DataFrame
        One row per configuration and load level.
    resources : polars.DataFrame
        One row per configuration, level and resource instance.
    info : dict
        Model, load model, response model, warm-up.
    """

    table: pl.DataFrame
    resources: pl.DataFrame
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"levels": self.table.to_dicts(), "resources": self.resources.to_dicts(), "info": self.info}


def _fp(load: LoadModel, response: ResponseModel, config: TierConfig, w0: float, w1: float) -> np.ndarray:
    fp = np.zeros(Q.N_FP, dtype=np.float64)
    fp[Q.FP_ROUTE] = load.route_s + (response.overhead_s if config.has_flash else 0.0)
    fp[Q.FP_DRAM_FIXED] = response.dram_fixed_s
    fp[Q.FP_FLASH_FIXED] = response.flash_fixed_s
    fp[Q.FP_CLIENT_S_PER_B] = 1.0 / response.flash_bytes_per_s
    fp[Q.FP_WRITE_S_PER_B] = 0.0 if load.flash_write_bytes_per_s is None else _inv(load.flash_write_bytes_per_s)
    fp[Q.FP_OVERLAP] = load.overlap
    fp[Q.FP_PASS] = load.prefill_pass_s
    fp[Q.FP_DECODE] = load.decode_s
    fp[Q.FP_MAX_WAIT] = load.max_wait_s
    fp[Q.FP_W0], fp[Q.FP_W1] = w0, w1
    fp[Q.FP_BATCH_TOKENS] = 0.0 if load.prefill_batch_tokens is None else float(load.prefill_batch_tokens)
    return fp


def _inv(rate: float) -> float:
    return math.inf if rate == 0 else 1.0 / rate


def _inverse_rates(load: LoadModel, response: ResponseModel, nodes: int):
    T = load.flash_targets
    inv_b = np.concatenate([
        np.full(nodes, _inv(load.host_link(response))), np.full(nodes, _inv(load.nic_bytes_per_s)),
        np.full(nodes, _inv(load.local_ssd_bytes_per_s)), np.full(T, _inv(load.flash_bytes_per_s / T)),
        [0.0 if load.uplink_bytes_per_s is None else _inv(load.uplink_bytes_per_s)]])
    inv_io = np.zeros_like(inv_b)
    inv_io[3 * nodes:3 * nodes + T] = _inv(load.flash_iops / T)
    return inv_b, inv_io


def station_names(nodes: int, targets: int) -> list[tuple[str, int]]:
    """(resource, instance) of every station of the queue simulator, in its order."""
    return ([("host_link", n) for n in range(nodes)] + [("nic", n) for n in range(nodes)]
            + [("local_ssd", n) for n in range(nodes)] + [("flash", t) for t in range(targets)] + [("uplink", 0)]
            + [("gpu", n) for n in range(nodes)])


def link_stations(resource: str, instance: int | None, nodes: int, targets: int) -> list[int]:
    """The queue simulator's stations of a link resource (one instance: a node, a target)."""
    first, count = {"host_link": (0, nodes), "nic": (nodes, nodes), "local_ssd": (2 * nodes, nodes),
                    "flash": (3 * nodes, targets), "uplink": (3 * nodes + targets, 1)}[resource]
    return [first + i for i in range(count) if instance is None or i == instance]


def _present(config: TierConfig, load: LoadModel) -> set:
    """The resource types a configuration's requests can load."""
    out = {"gpu", "host_link"}
    if config.local_ssd_bytes > 0:
        out.add("local_ssd")
    if config.flash_bytes > 0:
        out |= {"nic", "flash"}
        if load.uplink_bytes_per_s is not None:
            out.add("uplink")
    return out


def _wait_p99(hist: np.ndarray) -> float | None:
    """The p99 queue wait (s) of a histogram: the upper edge of the bin the 99th
    percentile falls in (at most 2**(1/64) - 1 = 1.09 % above the exact value)."""
    total = int(hist.sum())
    if total == 0:
        return None
    c = np.cumsum(hist)
    i = int(np.searchsorted(c, math.ceil(0.99 * total), side="left"))
    return 0.0 if i == 0 else Q.WAIT_BIN0_S * 2.0 ** (i / Q.WAIT_BINS_PER_OCTAVE)


def run_level(demand: Demand, level: LoadLevel, load: LoadModel, response: ResponseModel, *,
              keep_ttft: bool = False, congestion=(), transfers: Transfers | None = None
              ) -> tuple[dict, list[dict], np.ndarray | None]:
    """One load level: the summary row, the per-station rows and (``keep_ttft``) the
    TTFT of every measured request (NaN if it did not finish: an overloaded run).

    ``congestion``: ``(resource, instance or None, from_s, to_s, share)`` windows in which
    those links serve at ``share`` of their bandwidth (times in the trace's seconds after
    its first request, compressed by the load factor as the arrivals are;
    :meth:`kvtrace.kernels.queueing.QueueSim.congest`). ``transfers``: background moves
    (:class:`~kvtrace.analyses.load.demand.Transfers`) fed between the requests by time,
    compressed as the arrivals are, a transfer before a request arriving at its time."""
    config = demand.config
    k = float(level.factor)
    R = demand.arrival_s.shape[0]
    first = demand.first
    n_meas = max(0, R - first)
    arrival = demand.arrival_s / k
    w0 = float(arrival[first]) if n_meas else 0.0
    w1 = float(arrival[-1]) if n_meas else 0.0
    nodes, T = config.nodes, demand.targets
    inv_b, inv_io = _inverse_rates(load, response, nodes)
    sim = Q.QueueSim(nodes, T, load.gpus_per_node, inv_b, inv_io, _fp(load, response, config, w0, w1),
                     ps=load.link_discipline == "ps", uplink=load.uplink_bytes_per_s is not None, n_measured=n_meas)
    for resource, instance, t0, t1, share in congestion:
        for s in link_stations(resource, instance, nodes, T):
            sim.congest(s, t0 / k, t1 / k, share)
    c0 = len(COLUMNS)
    tr = transfers.arrays() if transfers is not None and len(transfers) else None
    if tr is not None:
        tr = (tr[0] / k,) + tr[1:]
    t_lo = 0
    for lo in range(0, R, BATCH):
        hi = min(R, lo + BATCH)
        rows = np.asarray(demand.rows[lo:hi])
        mix = np.arange(lo, hi, dtype=np.int64) - first
        mix[mix < 0] = -1
        cols = [arrival[lo:hi], rows[:, D_NODE].astype(np.int64), mix, rows[:, D_BD], rows[:, D_BL], rows[:, D_BF],
                rows[:, c0:c0 + T], rows[:, c0 + T:c0 + 2 * T], rows[:, D_SREST], rows[:, D_KREST], rows[:, D_SFL],
                rows[:, D_KFL], rows[:, D_WL], rows[:, D_WF]]
        flag = None
        if tr is not None:
            t_hi = tr[0].shape[0] if hi == R else int(np.searchsorted(tr[0], arrival[hi], side="left"))
            cols, flag = _with_transfers(cols, [x[t_lo:t_hi] for x in tr])
            t_lo = t_hi
        sim.feed(*cols, final=hi == R, transfer=flag)
        if sim.overloaded:
            break
    return _summarise(sim, demand, level, load, response, w0, w1, n_meas, keep_ttft)


def _with_transfers(cols: list, tr: list) -> tuple[list, np.ndarray | None]:
    """A batch's request columns with its transfers merged in by time (a transfer
    before a request at its time), and the transfer flags."""
    t, node, bl, bft, rft = tr
    if t.shape[0] == 0:
        return cols, None
    at = np.searchsorted(cols[0], t, side="left")
    K = t.shape[0]
    z = np.zeros(K)
    extra = [t, node, np.full(K, -1, np.int64), z, bl, bft.sum(axis=1), bft, rft, z, z, z, z, z, z]
    merged = [np.insert(c, at, e, axis=0) for c, e in zip(cols, extra)]
    return merged, np.insert(np.zeros(cols[0].shape[0], dtype=bool), at, True)


def _summarise(sim, demand, level, load, response, w0, w1, n_meas, keep_ttft):
    config = demand.config
    nodes, T = config.nodes, demand.targets
    over = sim.overloaded
    end = min(w1, float(sim.out[Q.O_OVER_AT])) if over else w1
    window = end - w0
    ttft = sim.ttft
    done = ttft[~np.isnan(ttft)]
    pct = percentiles(done)
    slo = load.slo_ttft_s
    met = int(np.count_nonzero(done <= slo))
    row: dict = {"config": config.label, "load_factor": level.factor, "target_rps": level.rps}
    row["arrival_rate_rps"] = n_meas / (w1 - w0) if w1 > w0 else None
    for k, v in (("mean", "mean_s"), ("p50", "p50_s"), ("p90", "p90_s"), ("p99", "p99_s"), ("p999", "p99.9_s")):
        row[f"ttft_{k}_ms"] = None if pct[v] is None else pct[v] * 1e3
    row["goodput_rps"] = met / (w1 - w0) if w1 > w0 else None
    row["slo_ttft_ms"] = slo * 1e3
    row["slo_attainment"] = met / n_meas if n_meas else None
    names = station_names(nodes, T)
    present = _present(config, load)
    util: dict = {}
    rows = []
    c = max(1, load.gpus_per_node)
    for s, (res, inst) in enumerate(names):
        f = sim.sf[s]
        busy = f[Q.SF_BUSY] / (c if res == "gpu" else 1)
        u = min(1.0, busy / window) if window > 0 else None
        if res in present:
            util[res] = max(util.get(res) or 0.0, u or 0.0) if u is not None else util.get(res)
            jobs = f[Q.SF_JOBS]
            rows.append({"config": config.label, "load_factor": level.factor, "resource": res, "instance": inst,
                         "util": u, "jobs": int(jobs),
                         "job_rate_per_s": jobs / (w1 - w0) if w1 > w0 else None,
                         "mean_jobs_present": f[Q.SF_AREA] / (w1 - w0) if w1 > w0 else None,
                         "mean_sojourn_ms": f[Q.SF_SOJOURN] / jobs * 1e3 if jobs else None,
                         "mean_work_ms": f[Q.SF_WORK] / jobs * 1e3 if jobs else None})
    for res in RESOURCES:
        row[f"util_{res}"] = util.get(res) if res in present else None
    for i, res in enumerate(RESOURCES):
        w = _wait_p99(sim.whist[i]) if res in present else None
        row[f"wait_p99_{res}_ms"] = None if w is None else w * 1e3
    if over:
        res, inst = names[int(sim.cnt[Q.C_OVER_STATION])]
        row["bottleneck"] = res
    else:
        live = {k: v for k, v in util.items() if v is not None}
        row["bottleneck"] = max(live, key=lambda k: live[k]) if live else None
    b = sim.branches
    with_tier = int(b[Q.B_RESTORE] + b[Q.B_RECOMPUTE])
    row["restore_share"] = b[Q.B_RESTORE] / with_tier if with_tier else None
    row["recompute_share"] = b[Q.B_RECOMPUTE] / with_tier if with_tier else None
    row["tier_reading_request_share"] = with_tier / n_meas if n_meas else None
    row["dram_read_bytes"] = float(sim.out[Q.O_BYTES_D])
    row["local_read_bytes"] = float(sim.out[Q.O_BYTES_L])
    row["flash_read_bytes"] = float(sim.out[Q.O_BYTES_F])
    row["completed_requests"] = int(done.shape[0])
    row["measured_requests"] = n_meas
    row["overloaded"] = over
    row["overload_resource"] = names[int(sim.cnt[Q.C_OVER_STATION])][0] if over else None
    row["overload_from_s"] = float(sim.out[Q.O_OVER_FROM]) - w0 if over else None
    row["overload_at_s"] = float(sim.out[Q.O_OVER_AT]) - w0 if over else None
    return row, rows, (ttft.copy() if keep_ttft else None)


@plain_numpy_pages
def replay_demand(trace, config: TierConfig, load: LoadModel, *, model: ModelSpec | str | None = None,
                  gpu: GpuSpec | str | None = None, response: ResponseModel | None = None,
                  eviction: str = "prefix-aware", cache_rules: str = "ideal", warmup=None, values=None,
                  progress=None):
    """One replay of ``trace`` through ``config`` (under ``cache_rules``, as
    :func:`kvtrace.analyses.whatif.simulate`): its :class:`Demand` and what-if summary."""
    model = model if isinstance(model, ModelSpec) else resolve_model(model)
    gpu = gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu)
    response = response if response is not None else ResponseModel(recompute_flops_per_s=gpu.effective_flops)
    a, b = model.flops_coefficients()
    first = min(warmup_first_request(trace, parse_warmup(warmup)), trace.n_requests)
    demand = Demand(trace, config, first, load.flash_targets, int(model.kv_bytes_per_token), a, b, response,
                    load.prefill_tokens_per_s)
    try:
        result = simulate(trace, config, model=model, gpu=gpu, response=response, eviction=eviction,
                          cache_rules=cache_rules, values=values, warmup=warmup, progress=progress,
                          requests_table=False, on_chunk=demand.add)
    except BaseException:
        demand.close()
        raise
    return demand, result


@plain_numpy_pages
def load_curve(trace, configs: list[TierConfig], levels: list[LoadLevel], load: LoadModel, *,
               model: ModelSpec | str | None = None, gpu: GpuSpec | str | None = None,
               response: ResponseModel | None = None, eviction: str = "prefix-aware", cache_rules: str = "ideal",
               warmup=None, values=None, progress=None, threads: int | None = None) -> LoadResult:
    """Every configuration at every load level: one replay per configuration, one
    queue simulation per level over its demand (levels run ``threads`` at a time, by
    default one per core: the simulator releases the GIL; results do not depend on it)."""
    if not levels:
        raise UsageError("no load level to run", field="load")
    model = model if isinstance(model, ModelSpec) else resolve_model(model)
    gpu = gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu)
    response = response if response is not None else ResponseModel(recompute_flops_per_s=gpu.effective_flops)
    rows, res_rows = [], []
    total = len(configs) * (len(levels) + 1)
    done = 0
    for config in configs:
        demand, whatif = replay_demand(trace, config, load, model=model, gpu=gpu, response=response,
                                       eviction=eviction, cache_rules=cache_rules, warmup=warmup,
                                       values=values)
        done += 1
        if progress is not None:
            progress(done, total)
        try:
            for row, rs in _levels(demand, levels, load, response, threads):
                s = whatif.summary
                row.update({"dram_bytes": config.dram_bytes, "local_ssd_bytes": config.local_ssd_bytes,
                            "flash_bytes": config.flash_bytes, "nodes": config.nodes, "policy": config.policy,
                            "prefix_token_hit_rate": s.get("prefix_token_hit_rate"),
                            "service_time_p99_ms": s.get("service_time_p99_ms")})
                rows.append(row)
                res_rows += rs
                done += 1
                if progress is not None:
                    progress(done, total)
        finally:
            demand.close()
    from kvtrace.analyses.whatif import TIER_RULE_TEXT

    info = {"model": model.name, "gpu": gpu.name, "load": load.to_dict(),
            "assumptions": load.assumptions(response) + f"; cache rules: {cache_rules}",
            "cache_rules": cache_rules, "cache_rules_text": TIER_RULE_TEXT[cache_rules],
            "response": response.__dict__.copy(), "warmup": warmup}
    return LoadResult(table_of(rows), pl.DataFrame(res_rows, infer_schema_length=None) if res_rows
                      else pl.DataFrame(), info)


def _levels(demand: Demand, levels: list[LoadLevel], load: LoadModel, response: ResponseModel,
            threads: int | None):
    """``(row, resource rows)`` of each level, in the order of ``levels``, computed on up
    to ``threads`` threads (each level is an independent simulation over ``demand``)."""
    threads = max(1, min(len(levels), threads or os.cpu_count() or 1))
    if threads == 1:
        for level in levels:
            row, rs, _ = run_level(demand, level, load, response)
            yield row, rs
        return
    with ThreadPoolExecutor(threads) as pool:
        for row, rs, _ in pool.map(lambda level: run_level(demand, level, load, response), levels):
            yield row, rs


def table_of(rows: list[dict]) -> pl.DataFrame:
    """Load rows as a table with stable column types."""
    if not rows:
        return pl.DataFrame()
    strings = {"config", "bottleneck", "overload_resource", "policy"}
    ints = {"completed_requests", "measured_requests", "dram_bytes", "local_ssd_bytes", "flash_bytes", "nodes"}
    schema = {}
    for k in rows[0]:
        schema[k] = pl.String if k in strings else pl.Int64 if k in ints else pl.Boolean if k == "overloaded" \
            else pl.Float64
    return pl.DataFrame([{k: r.get(k) for k in schema} for r in rows], schema=schema, orient="row")


def headroom(demand: Demand, load: LoadModel, response: ResponseModel, meets, *, start: float = 1.0,
             precision: float = 0.02, max_factor: float = 1024.0) -> tuple[float | None, dict | None]:
    """The highest load factor at which ``meets(row)`` holds (to ``precision``
    relative), and the row there; None if even ``start / 1024`` fails. The rule
    decides on each level's simulated figures; bisection assumes that a level meeting
    it implies every lower one does."""

    def at(k: float):
        row, _, _ = run_level(demand, LoadLevel(k), load, response)
        return meets(row), row

    ok, row = at(start)
    lo, lo_row, hi = (start, row, None) if ok else (None, None, start)
    while lo is None or hi is None:  # bracket: doubling from a pass, halving from a failure
        if hi is None and lo >= max_factor:
            return lo, lo_row
        if lo is None and hi <= start / 1024:
            return None, None
        k = lo * 2 if hi is None else hi / 2
        ok, row = at(k)
        if ok:
            lo, lo_row = k, row
        else:
            hi = k
    while hi / lo > 1 + precision:
        k = math.sqrt(lo * hi)
        ok, row = at(k)
        if ok:
            lo, lo_row = k, row
        else:
            hi = k
    return lo, lo_row


__all__ = ["BATCH", "LoadResult", "RESOURCES", "SATURATED", "headroom", "link_stations", "load_curve", "replay_demand",
           "run_level",
           "station_names", "table_of"]
