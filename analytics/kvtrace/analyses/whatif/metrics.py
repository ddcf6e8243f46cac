"""What a what-if measures: the per-request fold that runs as the simulator finishes
each chunk (:class:`RequestFold`), the summary row built from a run's counters
(:func:`summarise`; the columns of ``kvtrace.names.TABLES["whatif"]``), the residency
table and the comparison table of many rows (:func:`summary_table`). The package
docstring gives the definitions."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
from numba import njit

from kvtrace import names
from kvtrace.analyses.response import ResponseModel, percentiles
from kvtrace.analyses.whatif.config import TierConfig
from kvtrace.config import NJIT
from kvtrace.kernels import tiers as K

_DAY_S = 86400.0


def _div(x, y):
    return float(x) / float(y) if y else None


@njit(**NJIT)
def _windows(ts, first, window_s):
    """Read-rate windows the measured requests ``first..`` span (at least 1)."""
    n_win = 1
    for r in range(first, ts.shape[0]):
        w = np.int64(np.floor((ts[r] - ts[first]) / window_s))
        if w + 1 > n_win:
            n_win = w + 1
    return n_win


@njit(**NJIT)
def _fold_requests(req_out, base, lo, hi, req_first, req_start, ts, first, window_s, bpt, a, b, dram_fixed, dram_bps,
                   flash_fixed, flash_bps, overhead, rate, by_first, read_tokens, per_win, times, cols):
    """Add requests ``lo..hi-1`` (all measured: >= ``first``) of a run to the per-request
    metrics; ``req_out[r - base]`` is request r's row of the simulator's (., 7) output.

    Accumulates ``by_first`` (int64[4]: requests by the decision of their first block,
    ``MISS`` if empty), ``read_tokens`` (float64[3]: occupied tokens of the usable
    prefixes by source tier) and ``per_win`` (float64[2, windows]: local and flash bytes
    per ``window_s`` window, summed in request order as ``np.bincount`` does); writes
    ``times[r - first]``, the reusable-prefix service time
    (:func:`kvtrace.analyses.response.request_times`: the same operations, in the same order),
    and, when ``cols`` has room, ``cols[:, r - first]``: DRAM, local and flash bytes,
    flash recompute and miss recompute FLOPs. Folding a run chunk by chunk gives the
    sums of one pass over it, bit for bit."""
    table = cols.shape[1] > 0
    for r in range(lo, hi):
        by_first[req_first[r] if req_start[r + 1] > req_start[r] else K.MISS] += 1
        q = r - base
        sd, sl, sf = req_out[q, 0], req_out[q, 1], req_out[q, 2]
        read_tokens[0] += sd
        read_tokens[1] += sl
        read_tokens[2] += sf
        bytes_d, bytes_l, bytes_f = sd * bpt, sl * bpt, sf * bpt
        w = np.int64(np.floor((ts[r] - ts[first]) / window_s))
        per_win[0, w] += bytes_l
        per_win[1, w] += bytes_f
        flops_f = a * req_out[q, 3] + b * req_out[q, 4]
        flops_m = a * req_out[q, 5] + b * req_out[q, 6]
        d = dram_fixed + bytes_d / dram_bps if bytes_d > 0 else 0.0
        bf = bytes_l + bytes_f
        restore = flash_fixed + bf / flash_bps if bf > 0 else 0.0
        f = min(restore, flops_f / rate)
        i = r - first
        times[i] = d + f + flops_m / rate + overhead
        if table:
            cols[0, i] = bytes_d
            cols[1, i] = bytes_l
            cols[2, i] = bytes_f
            cols[3, i] = flops_f
            cols[4, i] = flops_m


class RequestFold:
    """The per-request metrics of a run, folded in as the simulator finishes each chunk
    of requests (:func:`_fold_requests`): what a streamed replay keeps per request is
    the service time (8 bytes, for exact percentiles) and, only with the requests
    table, its five columns."""

    def __init__(self, trace, first_req: int, config: TierConfig, bpt: int, a: float, b: float,
                 response: ResponseModel, requests_table: bool) -> None:
        R = trace.n_requests
        self.ts = np.ascontiguousarray(trace.request_timestamp, dtype=np.float64)
        self.rs = trace.req_start
        self.first = int(first_req)
        n = max(0, R - self.first)
        self.window_s = float(config.window_s)
        self.args = (float(bpt), float(a), float(b), response.dram_fixed_s, response.dram_bytes_per_s,
                     response.flash_fixed_s, response.flash_bytes_per_s,
                     response.overhead_s if config.has_flash else 0.0, response.recompute_flops_per_s)
        self.by_first = np.zeros(4, dtype=np.int64)
        self.read_tokens = np.zeros(3, dtype=np.float64)
        self.per_win = np.zeros((2, _windows(self.ts, self.first, self.window_s) if n else 1), dtype=np.float64)
        self.times = np.empty(n, dtype=np.float64)
        self.cols = np.empty((5, n if requests_table else 0), dtype=np.float64)

    def add(self, req_out: np.ndarray, base: int, req_first: np.ndarray) -> None:
        """Requests ``base..base + len(req_out) - 1`` (their rows of the simulator's
        output), the warm-up ones skipped."""
        lo, hi = max(int(base), self.first), int(base) + req_out.shape[0]
        if hi > lo:
            _fold_requests(req_out, int(base), lo, hi, req_first, self.rs, self.ts, self.first, self.window_s,
                           *self.args, self.by_first, self.read_tokens, self.per_win, self.times, self.cols)

    def peaks(self) -> np.ndarray:
        """float64[3]: peak read rate per window, bytes/s (local and flash; 0 for DRAM)."""
        out = np.zeros(3, dtype=np.float64)
        out[1:] = self.per_win.max(axis=1) / self.window_s
        return out


def summarise(trace, config, run: K.TierRun, fold: RequestFold, node, first_req, bpt, a, b, gpu, vals,
             requests_table=True):
    c, s = run.counts, run.sums
    R = trace.n_requests
    rs = trace.req_start
    n_req = R - first_req
    ts = trace.request_timestamp
    seconds = float(ts[-1] - ts[first_req]) if R else 0.0
    out: dict = {}

    # the measured requests, folded as the simulator went: first-block tiers, reads, service times
    by_first, read_tokens, peak, times, cols = fold.by_first, fold.read_tokens, fold.peaks(), fold.times, fold.cols
    tiers = ("dram", "local", "flash")
    units = {
        "request": ([by_first[i] for i in range(3)], n_req),
        "token": ([s[f"prefix_{t}_tokens"] for t in tiers], s["total_tokens"]),
        "byte": ([s[f"prefix_{t}_size"] for t in tiers], s["total_size"]),
        "compute": ([a * s[f"prefix_{t}_tokens"] + b * s[f"prefix_{t}_q"] for t in tiers],
                    a * s["total_tokens"] + b * s["total_q"]),
    }
    for unit, (hits, total) in units.items():
        shares = [_div(h, total) for h in hits]
        for t, x in zip(tiers, shares):
            out[names.tier_rate(t, unit)] = x
        out[names.RATE_OF_UNIT[unit]] = None if total == 0 else float(sum(hits)) / float(total)
        out[names.MISS_OF_UNIT[unit]] = None if total == 0 else 1.0 - out[names.RATE_OF_UNIT[unit]]
    n_acc = sum(c[f"acc_{d}"] for d in (*tiers, "miss"))
    for d in (*tiers, "miss"):
        out["block_miss_rate" if d == "miss" else f"{d}_block_hit_rate"] = _div(c[f"acc_{d}"], n_acc)
    out["ssd_reading_request_share"] = _div(c["req_local"] + c["req_flash"], n_req)

    def per_day(x):
        return x / seconds * _DAY_S if seconds > 0 else None

    caps_bytes = {"flash": config.flash_bytes, "local": config.local_ssd_bytes * config.nodes}
    for t in ("flash", "local"):
        wb = c[f"write_{t}_tokens"] * bpt
        out[f"{t}_write_bytes"] = wb
        out[f"{t}_write_bytes_per_day"] = per_day(wb)
        pd = out[f"{t}_write_bytes_per_day"]
        out[f"{t}_dwpd"] = pd / caps_bytes[t] if pd is not None and caps_bytes[t] > 0 else None
        out[f"{t}_write_opportunities"] = c[f"offer_{t}"]
        out[f"{t}_admitted_share"] = _div(c[f"write_{t}"], c[f"offer_{t}"])
    for t in tiers:
        out[f"{t}_eviction_bytes"] = c[f"evict_{t}_tokens"] * bpt

    # reads: usable-prefix bytes by source tier, mean and peak per window
    for i, t in enumerate(tiers):
        total = float(read_tokens[i]) * bpt
        out[f"{t}_read_bytes"] = total
        out[f"{t}_read_mean_bytes_per_s"] = total / seconds if seconds > 0 else None
        if t != "dram":
            out[f"{t}_read_peak_bytes_per_s"] = float(peak[i])
    out["promotions"] = c["promote_local"] + c["promote_flash"]
    out["promotion_bytes"] = (c["promote_local_tokens"] + c["promote_flash_tokens"]) * bpt
    if vals is not None:
        out["value_captured_usd"] = s["value_captured"]
        out["value_bound_usd"] = s["value_bound"]
        out["value_capture_ratio"] = _div(s["value_captured"], s["value_bound"])
    else:
        out["value_captured_usd"] = out["value_bound_usd"] = out["value_capture_ratio"] = None

    hours = seconds / 3600.0
    flops_all = sum(units["compute"][0])
    flops_flash = units["compute"][0][1] + units["compute"][0][2]
    out["gpu_seconds_saved_per_hour"] = gpu.gpu_seconds(flops_all) / hours if hours > 0 else None
    out["ssd_gpu_seconds_saved_per_hour"] = gpu.gpu_seconds(flops_flash) / hours if hours > 0 else None
    out["usd_saved_per_hour"] = gpu.dollars(flops_all) / hours if hours > 0 else None

    # per-request service time of the reusable prefix (DESIGN §4)
    pct = percentiles(times)
    for k, v in (("mean", "mean_s"), ("p50", "p50_s"), ("p90", "p90_s"), ("p99", "p99_s"), ("p999", "p99.9_s")):
        out[f"service_time_{k}_ms"] = None if pct[v] is None else pct[v] * 1e3
    out["measured_requests"] = n_req
    out["measured_accesses"] = int(rs[-1] - rs[first_req]) if R else 0
    out["measured_duration_s"] = seconds

    if not requests_table:
        return out, None
    branch = pl.Series("branch", ["dram", "local", "flash", "miss"]).gather(run.req_level[first_req:].astype(np.uint32))
    requests = pl.DataFrame({
        "request": np.arange(first_req, R, dtype=np.int64),
        "node": np.asarray(node)[first_req:].astype(np.int32),
        "branch": branch,
        "dram_bytes": cols[0],
        "local_bytes": cols[1],
        "flash_bytes": cols[2],
        "flash_recompute_flops": cols[3],
        "miss_recompute_flops": cols[4],
        "service_time_ms": times * 1e3,
    })
    return out, requests


def residency_table(hist: np.ndarray, config: TierConfig, shift: int) -> pl.DataFrame:
    edges = K.HIST_EDGES
    present = [0] + ([1] if config.local_ssd_bytes > 0 else []) + ([2] if config.flash_bytes > 0 else [])
    rows = []
    for tier in present:
        for m, metric in enumerate(K.HIST_METRICS):
            for i in range(edges.shape[0]):
                if 1 <= i <= shift:  # merged into bin 0 by a coarser time quantum
                    continue
                lo = float(edges[i])
                hi = float(edges[i + 1]) if i + 1 < edges.shape[0] else math.inf
                if i == 0:
                    hi = float(edges[shift + 1]) if shift + 1 < edges.shape[0] else math.inf
                rows.append((K.HIST_TIERS[tier], metric, lo, hi, int(hist[tier, m, i])))
    return pl.DataFrame(rows, schema={"tier": pl.String, "metric": pl.String, "bin_lo_s": pl.Float64,
                                      "bin_hi_s": pl.Float64, "count": pl.Int64}, orient="row")


_STRING_COLUMNS = {"config", "routing", "policy", "flash_order", "promotion", "write_mode", "eviction", "cache_rules",
                   "model"}
_INT_COLUMNS = {"dram_bytes", "local_ssd_bytes", "flash_bytes", "nodes", "kv_bytes_per_token", "flash_write_bytes",
                "local_write_bytes", "flash_write_opportunities", "local_write_opportunities",
                "dram_eviction_bytes", "local_eviction_bytes", "flash_eviction_bytes", "promotions",
                "promotion_bytes", "measured_requests", "measured_accesses"}


def summary_table(rows: list[dict]) -> pl.DataFrame:
    """Summaries as a table with stable column types (str, bool, int64, float64)."""
    if not rows:
        return pl.DataFrame()
    schema = {}
    for k in rows[0]:
        if k in _STRING_COLUMNS:
            schema[k] = pl.String
        elif k == "inclusive":
            schema[k] = pl.Boolean
        elif k in _INT_COLUMNS:
            schema[k] = pl.Int64
        else:
            schema[k] = pl.Float64
    return pl.DataFrame([{k: r.get(k) for k in schema} for r in rows], schema=schema, orient="row")


def tier_share(row: dict) -> float:
    """The flash share of a what-if summary row: the usable-prefix token shares served
    from the local SSDs and from the shared flash, added (a tier the configuration
    lacks, or a None rate, counts 0)."""
    return (row.get("flash_prefix_token_hit_rate") or 0.0) + (row.get("local_prefix_token_hit_rate") or 0.0)


__all__ = ["RequestFold", "residency_table", "summarise", "summary_table", "tier_share"]
