"""The lenses and the money of ``kvtrace size``: what a configuration costs per month, how a
replay becomes a table row, and the three lenses that pick each candidate's finalists.

A :class:`Point` is a tier configuration (DRAM and local SSD per node, a shared pool);
:class:`Sizer` holds one :func:`kvtrace.analyses.sizing.recommend` run: the search
estimates (:meth:`Sizer.est`, from the reuse-distance evaluator), the exact replays
(:meth:`Sizer.sim`), the rows they give (:meth:`Sizer.judge`) and the confirmation of
finalists (:meth:`Sizer.confirm`). :func:`same_slo`, :func:`same_capacity` and
:func:`same_budget` are the lenses; :func:`rank_rows` orders a lens's rows.

Money (:mod:`kvtrace.analyses.estimate`): a tier's monthly cost is ``hardware /
amortisation + support + kW x hours x $/kWh + reserve`` with hardware = ``$/TiB x TiB +
$/unit x units`` and units = ``ceil(capacity / unit_capacity)``, per node for DRAM and
local SSD (:func:`point_cost`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import polars as pl

from kvtrace.analyses.estimate import MonthlyCost, cost_benefit, monthly_cost
from kvtrace.analyses.sizing.config import CANDIDATES, TIB, SizingConfig, TierSpec
from kvtrace.units import format_bytes

_GRID_POINTS = 24
_DRAM_SPLIT_POINTS = 10
_REFINE_STEPS = 3

#: candidate -> the flash tier it adds (None: DRAM only)
FLASH_TIER = {"keep-dram": None, "expand-dram": None, "add-local-ssd": "local_ssd",
              "add-shared-flash": "shared_flash", "dram+flash": "shared_flash", "recompute-only": None}


@dataclass(frozen=True)
class Point:
    """A tier configuration: DRAM and local SSD per node, shared flash pool (bytes)."""

    dram: int
    local: int = 0
    flash: int = 0

    @property
    def flash_tier(self) -> str | None:
        return "local_ssd" if self.local else "shared_flash" if self.flash else None


# --------------------------------------------------------------------------- money


def _units(spec: TierSpec, capacity: int) -> int:
    if capacity <= 0:
        return 0
    if spec.unit_bytes is None:
        return 1
    return max(1, -(-capacity // spec.unit_bytes))


def _tier_cost(config: SizingConfig, tier: str, capacity: int) -> tuple[MonthlyCost | None, float]:
    """Monthly cost of ``capacity`` bytes of ``tier`` (per node for DRAM / local SSD) and
    the bandwidth it delivers (bytes/s, all units)."""
    spec = config.tiers[tier]
    per_node = tier != "shared_flash"
    n = config.nodes if per_node else 1
    if capacity <= 0:
        return None, 0.0
    units = _units(spec, capacity) * n
    tib = capacity / TIB * n
    where = f" x {n} nodes" if per_node and n > 1 else ""
    cost = monthly_cost(
        spec.dollars_per_tib * tib + spec.dollars_per_unit * units,
        amortisation_months=spec.amortisation_months,
        support_usd_per_month=spec.support_monthly_per_unit * units,
        kw=(spec.watts_per_tib * tib + spec.watts_per_unit * units) / 1000.0,
        dollars_per_kwh=config.dollars_per_kwh,
        reserve_usd_per_month=spec.reserve_monthly_per_tib * tib,
        hours_per_month=config.hours_per_month,
        label=f"{tier.replace('_', ' ')} {format_bytes(capacity)}{where} ({units} unit{'s' if units != 1 else ''})",
    )
    return cost, spec.bandwidth_gbps * 1e9 * units


def point_cost(config: SizingConfig, p: Point) -> tuple[float, list[MonthlyCost], dict]:
    """Monthly cost of a configuration ($), its per-tier costs, and each tier's deliverable
    read bandwidth (bytes/s, all units)."""
    total, parts, bw = 0.0, [], {}
    for tier, cap in (("dram", p.dram), ("local_ssd", p.local), ("shared_flash", p.flash)):
        if cap <= 0:
            continue
        c, b = _tier_cost(config, tier, cap)
        total += c.cost_usd_per_month
        parts.append(c)
        bw[tier] = b
    return total, parts, bw


def _response(config: SizingConfig, gpu, flash_tier: str | None):
    from kvtrace.analyses.response import ResponseModel

    d = config.tiers["dram"]
    f = config.tiers[flash_tier] if flash_tier else d
    return ResponseModel(dram_fixed_s=d.latency_ms / 1e3, dram_bytes_per_s=d.restore_gbps * 1e9,
                         flash_fixed_s=f.latency_ms / 1e3, flash_bytes_per_s=f.restore_gbps * 1e9,
                         overhead_s=(f.overhead_ms / 1e3) if flash_tier else 0.0,
                         recompute_flops_per_s=gpu.effective_flops)


TIER_TEXT = {"dram": "DRAM", "local_ssd": "local SSD", "shared_flash": "shared flash"}

#: constraint key of a shortfall -> how the output names it
SHORTFALL_TEXT = {"slo_mean": "mean", "slo_p99": "P99", "dram_bandwidth": "DRAM bandwidth",
                  "flash_bandwidth": "flash bandwidth", "endurance": "endurance (DWPD)", "ttft": "TTFT under load"}


def shortfall_text(short: dict[str, float]) -> str:
    """``P99 +146.0 %, endurance (DWPD) +12.5 %``: each failed constraint's excess over its limit."""
    return ", ".join(f"{SHORTFALL_TEXT[k]} " + ("+inf" if math.isinf(v) else f"+{100 * v:,.1f} %")
                     for k, v in short.items())


def config_label(config: SizingConfig, p: Point) -> str:
    """``DRAM 64 GiB + local SSD 3.84 TB``: how tables and reports name a configuration."""
    parts = [f"DRAM {format_bytes(p.dram)}" + (f"/node x {config.nodes}" if config.nodes > 1 else "")]
    if p.local:
        parts.append(f"local SSD {format_bytes(p.local)}" + ("/node" if config.nodes > 1 else ""))
    if p.flash:
        parts.append(f"shared flash {format_bytes(p.flash)}")
    return " + ".join(parts) if p.dram or p.local or p.flash else "no KV tier"


# --------------------------------------------------------------------------- text


def usd_text(x) -> str:
    """``$1,234.50`` / ``-$12.00``; ``-`` for None."""
    if x is None:
        return "-"
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"


def signed_usd_text(x) -> str:
    """``+$1,234.50`` / ``-$12.00``; ``-`` for None."""
    return "-" if x is None else (f"+${x:,.2f}" if x >= 0 else f"-${-x:,.2f}")


def pct_text(x) -> str:
    """A share as ``12.5 %``; ``-`` for None."""
    return "-" if x is None else f"{100 * x:.1f} %"


def ms_text(x) -> str:
    """Milliseconds as ``1,234.5 ms``; ``-`` for None."""
    return "-" if x is None else f"{x:,.1f} ms"


def rate_text(x) -> str:
    """Bytes per second as ``1.5 GiB/s``; ``-`` for None."""
    return "-" if x is None else f"{format_bytes(x)}/s"


# --------------------------------------------------------------------------- rows


COLUMNS = {
    "candidate": pl.String, "lens": pl.String, "rank": pl.Int64, "config": pl.String, "policy": pl.String,
    "nodes": pl.Int64, "dram_bytes": pl.Int64, "local_ssd_bytes": pl.Int64, "flash_bytes": pl.Int64,
    "total_bytes": pl.Int64, "dram_prefix_token_hit_rate": pl.Float64, "ssd_prefix_token_hit_rate": pl.Float64,
    "prefix_token_miss_rate": pl.Float64,
    "dram_request_hit_rate": pl.Float64, "ssd_request_hit_rate": pl.Float64, "service_time_mean_ms": pl.Float64,
    "service_time_p50_ms": pl.Float64,
    "service_time_p99_ms": pl.Float64, "cost_usd_per_month": pl.Float64, "incremental_cost_usd_per_month": pl.Float64,
    "gpu_hours_saved_per_month": pl.Float64, "value_usd_per_month": pl.Float64,
    "realised_value_usd_per_month": pl.Float64,
    "net_usd_per_month": pl.Float64, "break_even_realisation": pl.Float64, "break_even_restore_ms": pl.Float64,
    "restore_mean_ms": pl.Float64, "ssd_read_mean_bytes_per_s": pl.Float64,
    "ssd_read_peak_bytes_per_s": pl.Float64, "ssd_bandwidth_bytes_per_s": pl.Float64,
    "dram_read_mean_bytes_per_s": pl.Float64, "dram_bandwidth_bytes_per_s": pl.Float64,
    "bandwidth_headroom": pl.Float64, "ssd_dwpd": pl.Float64, "endurance_dwpd": pl.Float64,
    "dwpd_headroom": pl.Float64, "meets_slo": pl.Boolean, "feasible": pl.Boolean, "shortfall": pl.Float64,
    "shortfalls": pl.String, "reasons": pl.String,
    "estimated_service_time_mean_ms": pl.Float64, "estimated_service_time_p99_ms": pl.Float64,
    "loaded_ttft_mean_ms": pl.Float64, "loaded_ttft_p99_ms": pl.Float64, "loaded_bottleneck": pl.String,
    "load_headroom_factor": pl.Float64, "headroom_bottleneck": pl.String,
}

# --------------------------------------------------------------------------- sizer


def _multiples(spec: TierSpec, above: int = 0, upto: int | None = None) -> list[int]:
    """Purchasable capacities of a tier: multiples of its step in ``(above, min(upto, max)]``."""
    hi = spec.max_bytes if upto is None else min(upto, spec.max_bytes)
    step = spec.step_bytes
    first = above // step + 1
    return [m * step for m in range(first, hi // step + 1)]


def _thin(values: list, points: int) -> list:
    """At most ``points`` values, log-spaced by index (always the first and the last)."""
    if len(values) <= points:
        return list(values)
    idx = np.unique(np.round(np.geomspace(1, len(values), points)).astype(np.int64) - 1)
    return [values[i] for i in idx]


class Sizer:
    """State of one :func:`kvtrace.analyses.sizing.recommend` run: estimates, simulations, money.

    ``evaluator`` gives the search's estimates (``evaluate(point, response) -> dict``,
    from reuse distances); ``progress(fraction, message)`` is told of every replay.
    """

    def __init__(self, trace, config: SizingConfig, model, gpu, evaluator, progress):
        self.trace, self.config, self.model, self.gpu, self.ev = trace, config, model, gpu, evaluator
        self.progress = progress
        self.responses = {t: _response(config, gpu, t) for t in (None, "local_ssd", "shared_flash")
                          if t is None or t in config.tiers}
        self.keep = Point(config.current_dram_bytes)
        self.search_rows: dict = {}
        self.sims: dict = {}
        self.scratch = None  # the replays' block table, reused from one to the next
        self.costs: dict = {}
        self.keep_est = self.ev.evaluate(self.keep, self.responses[None])
        self.keep_sim = self.recompute_sim = None  # replays of today's DRAM and of no KV tier

    # ---------------------------------------------------------------- money
    def money(self, p: Point, gs_per_hour: float | None, base_cost: float, base_gs: float | None) -> dict:
        cost, parts, bw = point_cost(self.config, p)
        self.costs[config_label(self.config, p)] = [c.to_dict() for c in parts]
        out = {"cost_usd_per_month": cost, "incremental_cost_usd_per_month": cost - base_cost, "bandwidth": bw}
        if gs_per_hour is None or base_gs is None:
            return {**out, "gpu_hours_saved_per_month": None, "value_usd_per_month": None,
                    "realised_value_usd_per_month": None,
                    "net_usd_per_month": None, "break_even_realisation": None}
        cb = cost_benefit(dollars_per_gpu_hour=self.gpu.dollars_per_hour, realisation=self.config.realisation,
                          incremental_cost_usd_per_month=cost - base_cost,
                          gpu_hours=(gs_per_hour - base_gs) * self.config.hours_per_month / 3600.0)
        return {**out, "gpu_hours_saved_per_month": cb.gpu_hours_saved_per_month,
                "value_usd_per_month": cb.value_usd_per_month,
                "realised_value_usd_per_month": cb.realised_value_usd_per_month,
                "net_usd_per_month": cb.net_usd_per_month,
                "break_even_realisation": cb.break_even_realisation}

    # ---------------------------------------------------------------- checks
    def meets_slo(self, mean_ms, p99_ms) -> bool:
        c = self.config
        if mean_ms is None or p99_ms is None:
            return False
        return (c.slo_mean_ms is None or mean_ms <= c.slo_mean_ms) and (c.slo_p99_ms is None or p99_ms <= c.slo_p99_ms)

    def endurance_ok(self, p: Point, dwpd) -> bool:
        t = p.flash_tier
        if t is None or dwpd is None:
            return True
        rated = self.config.tiers[t].endurance_dwpd
        return rated is None or dwpd <= rated

    def shortfalls(self, p: Point, sim: dict, dram_bw, flash_bw, rated) -> dict[str, float]:
        """Each failed constraint's excess over its limit, as a share of the limit
        (:data:`SHORTFALL_TEXT` names them); empty when every constraint holds. A
        configuration with no measured requests misses the SLO by an infinite share."""
        c, out = self.config, {}
        for key, got, limit in (("slo_mean", sim["service_time_mean_ms"], c.slo_mean_ms), ("slo_p99",
                                                                                           sim["service_time_p99_ms"],
                                                                                           c.slo_p99_ms)):
            if limit is not None and (got is None or got > limit):
                out[key] = math.inf if got is None else got / limit - 1.0
        dram_read = sim["dram_read_mean_bytes_per_s"]
        if p.dram and dram_bw and dram_read and dram_read > dram_bw:
            out["dram_bandwidth"] = dram_read / dram_bw - 1.0
        flash_peak = sim["ssd_read_peak_bytes_per_s"]
        if p.flash_tier and flash_bw and flash_peak and flash_peak > flash_bw:
            out["flash_bandwidth"] = flash_peak / flash_bw - 1.0
        if p.flash_tier and rated and sim["ssd_dwpd"] is not None and sim["ssd_dwpd"] > rated:
            out["endurance"] = sim["ssd_dwpd"] / rated - 1.0
        return out

    def bandwidth_ok(self, p: Point, bw: dict, dram_mean, flash_peak) -> bool:
        ok = dram_mean is None or p.dram == 0 or dram_mean <= bw.get("dram", math.inf)
        t = p.flash_tier
        if t is not None and flash_peak is not None:
            ok = ok and flash_peak <= bw.get(t, math.inf)
        return ok

    # ---------------------------------------------------------------- search
    def est(self, cand: str, p: Point) -> dict:
        key = (cand, p)
        if key in self.search_rows:
            return self.search_rows[key]
        e = self.ev.evaluate(p, self.responses[p.flash_tier])
        keep_cost = point_cost(self.config, self.keep)[0]
        m = self.money(p, e["gpu_seconds_saved_per_hour"], keep_cost, self.keep_est["gpu_seconds_saved_per_hour"])
        slo = self.meets_slo(e["service_time_mean_ms"], e["service_time_p99_ms"])
        within = (self.endurance_ok(p, e["ssd_dwpd"])
                  and self.bandwidth_ok(p, m["bandwidth"], e["dram_read_mean_bytes_per_s"],
                                        e["ssd_read_peak_bytes_per_s"]))
        row = {"candidate": cand, "dram_bytes": p.dram, "local_ssd_bytes": p.local, "flash_bytes": p.flash,
               "total_bytes": (p.dram + p.local) * self.config.nodes + p.flash, **e,
               "cost_usd_per_month": m["cost_usd_per_month"], "net_usd_per_month": m["net_usd_per_month"],
               "meets_slo": slo, "within_limits": within, "feasible": slo and within,
               "_endurance": self.endurance_ok(p, e["ssd_dwpd"])}
        self.search_rows[key] = row
        return row

    def cheapest(self, cand: str, values: list[int], make, need) -> Point | None:
        """Smallest value (on the purchase grid) whose point satisfies ``need``, assuming
        ``need`` is monotone in it (the SLO and endurance are): thinned scan + bisection."""
        where = {v: i for i, v in enumerate(values)}
        lo = 0
        for g in _thin(values, _GRID_POINTS):
            i = where[g]
            if need(self.est(cand, make(g))):
                a, b = lo, i
                while a < b:
                    mid = (a + b) // 2
                    if need(self.est(cand, make(values[mid]))):
                        b = mid
                    else:
                        a = mid + 1
                return make(values[a])
            lo = i + 1
        return None

    # ---------------------------------------------------------------- simulate
    def sim(self, p: Point, policy: str) -> dict:
        pol = policy if p.flash_tier else "all"
        key = (p, pol)
        if key in self.sims:
            return self.sims[key]
        from kvtrace.kernels.memory import Scratch
        from kvtrace.analyses.whatif import TierConfig, simulate

        if self.scratch is None:
            self.scratch = Scratch()
        c = self.config
        resp = self.responses[p.flash_tier]
        tc = TierConfig(p.dram, flash_bytes=p.flash, local_ssd_bytes=p.local, nodes=c.nodes, routing=c.routing,
                        policy=pol, window_s=c.window_s, name=config_label(c, p))
        r = simulate(self.trace, tc, model=self.model, gpu=self.gpu, response=resp, eviction=c.eviction,
                     cache_rules=c.cache_rules, warmup=c.warmup, scratch=self.scratch)
        s = r.summary
        req = r.requests
        fb = (req["local_bytes"] + req["flash_bytes"]).to_numpy()
        reading = fb > 0
        restore_ms = be_ms = None
        if p.flash_tier and reading.any():
            restore_ms = float((resp.flash_fixed_s + fb[reading] / resp.flash_bytes_per_s).mean()) * 1e3
            recompute_s = float(req["flash_recompute_flops"].to_numpy()[reading].mean()) / resp.recompute_flops_per_s
            h_f = float(reading.sum()) / req.height
            be_ms = (recompute_s - resp.overhead_s / h_f) * 1e3
        dwpd = s.get("local_dwpd") if p.local else s.get("flash_dwpd") if p.flash else None
        flash_mean = ((s.get("local_read_mean_bytes_per_s") or 0.0) + (s.get("flash_read_mean_bytes_per_s") or 0.0)
                      if p.flash_tier else None)
        flash_peak = (s.get("local_read_peak_bytes_per_s") if p.local else s.get("flash_read_peak_bytes_per_s")
                      if p.flash else None)
        out = {
            "point": p, "policy": pol if p.flash_tier else None, "summary": s,
            "dram_prefix_token_hit_rate": s["dram_prefix_token_hit_rate"],
            "ssd_prefix_token_hit_rate": ((s["flash_prefix_token_hit_rate"] or 0.0)
                                          + (s["local_prefix_token_hit_rate"] or 0.0)),
            "prefix_token_miss_rate": s["prefix_token_miss_rate"], "dram_request_hit_rate": s["dram_request_hit_rate"],
            "ssd_request_hit_rate": (s["flash_request_hit_rate"] or 0.0) + (s["local_request_hit_rate"] or 0.0),
            "service_time_mean_ms": s["service_time_mean_ms"], "service_time_p50_ms": s["service_time_p50_ms"],
            "service_time_p99_ms": s["service_time_p99_ms"], "restore_mean_ms": restore_ms,
            "break_even_restore_ms": be_ms,
            "ssd_read_mean_bytes_per_s": flash_mean, "ssd_read_peak_bytes_per_s": flash_peak,
            "dram_read_mean_bytes_per_s": s["dram_read_mean_bytes_per_s"], "ssd_dwpd": dwpd,
            "gpu_seconds_saved_per_hour": s["gpu_seconds_saved_per_hour"],
        }
        self.sims[key] = out
        if self.progress is not None:
            self.progress(None, f"replayed {config_label(c, p)}" + (f" ({pol})" if p.flash_tier else ""))
        return out

    def judge(self, cand: str, lens: str, sim: dict) -> dict:
        """A table row from a replay: money vs keep-dram, checks, reasons."""
        c, p = self.config, sim["point"]
        keep = self.keep_sim
        keep_cost = point_cost(c, self.keep)[0]
        m = self.money(p, sim["gpu_seconds_saved_per_hour"], keep_cost, keep["gpu_seconds_saved_per_hour"])
        bw = m["bandwidth"]
        reasons = []
        slo = self.meets_slo(sim["service_time_mean_ms"], sim["service_time_p99_ms"])
        if not slo:
            miss = []
            if c.slo_mean_ms is not None and sim["service_time_mean_ms"] > c.slo_mean_ms:
                miss.append(f"mean {sim['service_time_mean_ms']:,.1f} ms > {c.slo_mean_ms:g} ms")
            if c.slo_p99_ms is not None and sim["service_time_p99_ms"] > c.slo_p99_ms:
                miss.append(f"P99 {sim['service_time_p99_ms']:,.1f} ms > {c.slo_p99_ms:g} ms")
            reasons.append("misses the SLO: " + ", ".join(miss))
        t = p.flash_tier
        heads = []
        dram_bw = bw.get("dram")
        if p.dram and dram_bw and sim["dram_read_mean_bytes_per_s"]:
            heads.append(dram_bw / sim["dram_read_mean_bytes_per_s"])
            if sim["dram_read_mean_bytes_per_s"] > dram_bw:
                reasons.append(f"DRAM reads {format_bytes(sim['dram_read_mean_bytes_per_s'])}/s exceed the "
                               f"{format_bytes(dram_bw)}/s it delivers")
        flash_bw = bw.get(t) if t else None
        if t and sim["ssd_read_peak_bytes_per_s"]:
            heads.append(flash_bw / sim["ssd_read_peak_bytes_per_s"])
            if sim["ssd_read_peak_bytes_per_s"] > flash_bw:
                reasons.append(f"peak {c.window_s:g} s window reads {format_bytes(sim['ssd_read_peak_bytes_per_s'])}"
                               f"/s from {t.replace('_', ' ')}, above the {format_bytes(flash_bw)}/s it delivers")
        bw_ok = self.bandwidth_ok(p, bw, sim["dram_read_mean_bytes_per_s"], sim["ssd_read_peak_bytes_per_s"])
        rated = c.tiers[t].endurance_dwpd if t else None
        end_ok = self.endurance_ok(p, sim["ssd_dwpd"])
        if not end_ok:
            reasons.append(f"writes {sim['ssd_dwpd']:,.1f} drive writes/day, above the {rated:g} DWPD rating")
        feasible = slo and bw_ok and end_ok
        short = self.shortfalls(p, sim, dram_bw, flash_bw, rated)
        est = self.est(cand, p)
        row = {
            "candidate": cand, "lens": lens, "rank": None, "config": config_label(c, p), "policy": sim["policy"],
            "nodes": c.nodes, "dram_bytes": p.dram, "local_ssd_bytes": p.local, "flash_bytes": p.flash,
            "total_bytes": (p.dram + p.local) * c.nodes + p.flash,
            **{k: sim[k] for k in ("dram_prefix_token_hit_rate", "ssd_prefix_token_hit_rate", "prefix_token_miss_rate",
                                   "dram_request_hit_rate", "ssd_request_hit_rate", "service_time_mean_ms",
                                   "service_time_p50_ms", "service_time_p99_ms")},
            **{k: m[k] for k in ("cost_usd_per_month", "incremental_cost_usd_per_month", "gpu_hours_saved_per_month",
                                 "value_usd_per_month", "realised_value_usd_per_month", "net_usd_per_month",
                                 "break_even_realisation")},
            "break_even_restore_ms": sim["break_even_restore_ms"], "restore_mean_ms": sim["restore_mean_ms"],
            "ssd_read_mean_bytes_per_s": sim["ssd_read_mean_bytes_per_s"],
            "ssd_read_peak_bytes_per_s": sim["ssd_read_peak_bytes_per_s"],
            "ssd_bandwidth_bytes_per_s": flash_bw, "dram_read_mean_bytes_per_s": sim["dram_read_mean_bytes_per_s"],
            "dram_bandwidth_bytes_per_s": dram_bw if p.dram else None,
            "bandwidth_headroom": min(heads) if heads else None, "ssd_dwpd": sim["ssd_dwpd"], "endurance_dwpd": rated,
            "dwpd_headroom": (rated / sim["ssd_dwpd"]) if (rated and sim["ssd_dwpd"]) else None,
            "meets_slo": slo, "feasible": feasible, "reasons": "; ".join(reasons) if reasons else None,
            "shortfall": max(short.values(), default=0.0), "shortfalls": shortfall_text(short) or None,
            "estimated_service_time_mean_ms": est["service_time_mean_ms"],
            "estimated_service_time_p99_ms": est["service_time_p99_ms"], "_shortfalls": short,
        }
        if cand == "keep-dram":
            row["break_even_realisation"] = None
        return row

    def confirm(self, cand: str, lens: str, points: list[Point], grow=None) -> dict:
        """Replay ``points`` under every admission policy and keep the best row; for the
        same-SLO lens a row missing a constraint is stepped up the purchase grid."""
        pols = self.config.policies if FLASH_TIER[cand] else ("all",)
        seen = []
        for p in points:
            if p is not None and p not in seen:
                seen.append(p)
        rows = [self.judge(cand, lens, self.sim(p, pol)) for p in seen for pol in pols]
        if lens == "same-slo":
            key = lambda r: (r["feasible"], -r["shortfall"], -r["cost_usd_per_month"], _net(r))  # noqa: E731
        else:
            key = lambda r: (r["feasible"], -r["shortfall"], _net(r), -r["cost_usd_per_month"])  # noqa: E731
        best = max(rows, key=key)
        best = self._policy_note(best, rows, pols)
        if lens == "same-slo" and not best["feasible"] and grow is not None:
            # step up the purchase grid (1, 2, 4 steps, then the tier's max); if nothing
            # is feasible, show the largest size tried: the closest to the limits
            top = max(seen, key=lambda p: (p.dram, p.local, p.flash))
            tried = set(seen)
            last = None
            for steps in (1, 2, 4, None)[-(_REFINE_STEPS + 1):]:
                q = grow(top, steps)
                if q is None or q in tried:
                    continue
                tried.add(q)
                more = [self.judge(cand, lens, self.sim(q, pol)) for pol in pols]
                last = self._policy_note(max(more, key=key), more, pols)
                if last["feasible"]:
                    best = last
                    best["reasons"] = "; ".join(filter(None, [best["reasons"], "stepped up the purchase grid: the "
                                                              "search's admit-all estimate missed a constraint"]))
                    break
            if not best["feasible"] and last is not None and last["shortfall"] <= best["shortfall"]:
                best = last
                best["reasons"] = "; ".join(filter(None, [best["reasons"], "infeasible at every size tried up to "
                                                          f"{best['config']}"]))
        return best


    @staticmethod
    def _policy_note(best: dict, rows: list[dict], pols) -> dict:
        """Add how every admission policy fared at the chosen size (flash rows)."""
        if best["policy"] is None or len(pols) < 2:
            return best
        same = [r for r in rows if r["config"] == best["config"]]
        if len(same) < 2:
            return best
        parts = [f"{r['policy']}: P99 {r['service_time_p99_ms']:,.1f} ms, "
                 + ("-" if r["ssd_dwpd"] is None else f"{r['ssd_dwpd']:,.2f}") + " DWPD"
                 + (", net " + signed_usd_text(r["net_usd_per_month"]) if r["net_usd_per_month"] is not None else "")
                 for r in same]
        best = dict(best)
        best["reasons"] = "; ".join(filter(None, [best["reasons"], "admission at this size: " + " | ".join(parts)]))
        return best


def _not_applicable(cand: str, lens: str, why: str, nodes: int) -> dict:
    row = {k: None for k in COLUMNS}
    row.update({"candidate": cand, "lens": lens, "nodes": nodes, "meets_slo": False, "feasible": False,
                "reasons": f"not applicable: {why}", "shortfall": None})
    return row


# --------------------------------------------------------------------------- lenses


def _grow(values: list[int], attr: str):
    """Step a point's ``attr`` up the purchase grid ``values``: ``steps`` steps, or to
    the last value (the tier's max) with ``steps=None``."""
    def grow(p: Point, steps: int | None):
        later = [x for x in values if x > getattr(p, attr)]
        if not later:
            return None
        v = later[-1] if steps is None else later[min(steps, len(later)) - 1]
        return dataclasses.replace(p, **{attr: v})
    return grow


def _grids(sz: Sizer) -> tuple[list[int], list[int], list[int]]:
    """Purchasable DRAM above today's, local SSD and shared flash capacities."""
    t = sz.config.tiers
    return (_multiples(t["dram"], above=sz.config.current_dram_bytes),
            _multiples(t["local_ssd"]) if "local_ssd" in t else [],
            _multiples(t["shared_flash"]) if "shared_flash" in t else [])


def _references(sz: Sizer, lens: str) -> list[dict]:
    """keep-dram and recompute-only: fixed configurations, listed under every lens."""
    return [sz.judge("keep-dram", lens, sz.keep_sim), sz.judge("recompute-only", lens, sz.recompute_sim)]


def _slo(e: dict) -> bool:
    return e["meets_slo"]


def _slo_and_endurance(e: dict) -> bool:
    return e["meets_slo"] and e["_endurance"]


def same_slo(sz: Sizer, report) -> list[dict]:
    """Per candidate, the cheapest purchasable configuration meeting the SLO (and, as a
    second finalist, the SLO and the endurance) on the search; confirmed by replay."""
    lens, N, cd0 = "same-slo", sz.config.nodes, sz.config.current_dram_bytes
    dram_up, locals_, flashes = _grids(sz)
    rows = _references(sz, lens)

    def at_max(cand, p, what):
        """The best a candidate can do when no size meets the SLO: its largest size."""
        row = sz.confirm(cand, lens, [p])
        row["reasons"] = "; ".join(filter(None, [row["reasons"], f"no size up to {what} meets the SLO (estimate): "
                                                 "shown at that size"]))
        return row

    if not dram_up:
        rows.append(_not_applicable("expand-dram", lens, "today's DRAM is already the tier's max", N))
    else:
        p = sz.cheapest("expand-dram", dram_up, lambda v: Point(v), _slo)
        rows.append(sz.confirm("expand-dram", lens, [p], _grow(dram_up, "dram")) if p else
                    at_max("expand-dram", Point(dram_up[-1]), "the DRAM max"))
    report(0.35, "same-SLO lens")
    for cand, values, attr, tier in (("add-local-ssd", locals_, "local", "local_ssd"),
                                     ("add-shared-flash", flashes, "flash", "shared_flash")):
        if not values:
            rows.append(_not_applicable(cand, lens, f"no [tiers.{tier}] in the config", N))
            continue
        mk = lambda v, attr=attr: dataclasses.replace(Point(cd0), **{attr: v})  # noqa: E731
        pa, pb = sz.cheapest(cand, values, mk, _slo), sz.cheapest(cand, values, mk, _slo_and_endurance)
        if pa is None and pb is None:
            rows.append(at_max(cand, mk(values[-1]), "the tier's max"))
        else:
            rows.append(sz.confirm(cand, lens, [pa, pb], _grow(values, attr)))
    report(0.5, "same-SLO lens: DRAM + flash")
    if not (flashes and dram_up):
        rows.append(_not_applicable("dram+flash", lens, "needs [tiers.shared_flash] and room to add DRAM", N))
        return rows
    best: dict = {}  # finalist kind -> (monthly cost, point), over the DRAM splits
    for d in _thin(dram_up, _DRAM_SPLIT_POINTS):
        for kind, need in (("slo", _slo), ("slo+endurance", _slo_and_endurance)):
            q = sz.cheapest("dram+flash", flashes, lambda v, d=d: Point(d, 0, v), need)
            if q is not None:
                cost = point_cost(sz.config, q)[0]
                if kind not in best or cost < best[kind][0]:
                    best[kind] = (cost, q)
    pts = [q for _, q in best.values()]
    rows.append(sz.confirm("dram+flash", lens, pts, _grow(flashes, "flash")) if pts else
                at_max("dram+flash", Point(dram_up[-1], 0, flashes[-1]), "the DRAM and flash maxima"))
    return rows


def same_capacity(sz: Sizer, target: int) -> list[dict]:
    """Every candidate holds ``target`` bytes in total, exactly (not rounded to purchase
    steps: the lens compares media, not shopping lists); DRAM + flash picks its split."""
    lens, c = "same-capacity", sz.config
    tiers, N, cd0 = c.tiers, c.nodes, c.current_dram_bytes
    rows = _references(sz, lens)
    per_node = target // N
    fixed = {
        "expand-dram": Point(per_node) if cd0 < per_node <= tiers["dram"].max_bytes else None,
        "add-local-ssd": (Point(cd0, per_node - cd0) if "local_ssd" in tiers
                          and 0 < per_node - cd0 <= tiers["local_ssd"].max_bytes else None),
        "add-shared-flash": (Point(cd0, 0, target - cd0 * N) if "shared_flash" in tiers
                             and 0 < target - cd0 * N <= tiers["shared_flash"].max_bytes else None),
    }
    for cand, p in fixed.items():
        rows.append(sz.confirm(cand, lens, [p]) if p else _not_applicable(
            cand, lens, f"{format_bytes(target)} in total does not fit this candidate's limits", N))
    splits = [Point(d, 0, target - d * N) for d in _multiples(tiers["dram"], above=cd0, upto=per_node - 1)
              if "shared_flash" in tiers and 0 < target - d * N <= tiers["shared_flash"].max_bytes]
    if splits:
        best = max(_thin(splits, _DRAM_SPLIT_POINTS),
                   key=lambda q: (sz.est("dram+flash", q)["feasible"], sz.est("dram+flash", q)["net_usd_per_month"]))
        rows.append(sz.confirm("dram+flash", lens, [best]))
    else:
        rows.append(_not_applicable("dram+flash", lens, f"no DRAM step between today's and "
                                    f"{format_bytes(per_node)}/node leaves room for flash", N))
    return rows


def same_budget(sz: Sizer, budget: float) -> list[dict]:
    """Per candidate, the largest purchasable configuration costing at most ``budget``
    $ per month; DRAM + flash picks its best split."""
    lens, c = "same-budget", sz.config
    N, cd0 = c.nodes, c.current_dram_bytes
    dram_up, locals_, flashes = _grids(sz)
    rows = _references(sz, lens)

    def largest(values, mk):
        fit = [v for v in values if point_cost(c, mk(v))[0] <= budget + 1e-9]
        return mk(fit[-1]) if fit else None

    for cand, values, mk in (("expand-dram", dram_up, lambda v: Point(v)),
                             ("add-local-ssd", locals_, lambda v: Point(cd0, v)),
                             ("add-shared-flash", flashes, lambda v: Point(cd0, 0, v))):
        p = largest(values, mk) if values else None
        rows.append(sz.confirm(cand, lens, [p]) if p else _not_applicable(
            cand, lens, f"its smallest step costs more than ${budget:,.2f}/month" if values
            else "the tier is not configured", N))
    pairs = [q for d in _thin(dram_up, _DRAM_SPLIT_POINTS) if flashes
             for q in [largest(flashes, lambda v, d=d: Point(d, 0, v))] if q is not None]
    if pairs:
        best = max(pairs, key=lambda q: (sz.est("dram+flash", q)["feasible"],
                                         sz.est("dram+flash", q)["net_usd_per_month"]))
        rows.append(sz.confirm("dram+flash", lens, [best]))
    else:
        rows.append(_not_applicable("dram+flash", lens, f"no DRAM + flash pair fits ${budget:,.2f}/month", N))
    return rows


def _net(r: dict) -> float:
    return r["net_usd_per_month"] if r["net_usd_per_month"] is not None else -math.inf


def rank_rows(rows: list[dict]) -> list[dict]:
    """Feasible rows first (by net benefit, then cost); then the infeasible ones by
    their normalised shortfall (the closest to meeting every constraint first), then
    net benefit; not-applicable rows last. How many checks a row passes never ranks it:
    a configuration 10 % over one limit is closer than one 900 % over a single limit."""
    def key(r):
        applicable = r["config"] is not None
        cost = r["cost_usd_per_month"] if r["cost_usd_per_month"] is not None else math.inf
        short = r["shortfall"] if r.get("shortfall") is not None else math.inf
        return (not applicable, not r["feasible"], 0.0 if r["feasible"] else short, -_net(r), cost,
                CANDIDATES.index(r["candidate"]))

    out = sorted(rows, key=key)
    for i, r in enumerate(out, 1):
        r["rank"] = i
    return out

