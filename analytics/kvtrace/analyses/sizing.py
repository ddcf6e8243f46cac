"""Tier-sizing recommendation (``kvtrace size``; DESIGN §4-5, seed §1, §6-8, §15).

The question: *keep today's DRAM, expand it, add a local SSD, add a shared flash pool,
tier both, or just recompute — and why, in dollars and milliseconds?*

:func:`recommend` answers it for one trace and one :class:`SizingConfig` (a TOML file,
documented in ``sample_traces/tiers.example.toml``):

1. **Curves.** One pass of the stack-distance kernel gives every access's reuse
   distance (per node too when ``nodes > 1``): the capacity-hit curve, its knee, and
   the raw material of the search.
2. **Search on the curves.** Under the DESIGN §2 invariant (admit-all, exclusive tiers,
   promote on hit: DRAM ``C_d`` over flash ``C_f`` is one LRU of ``C_d + C_f``), an
   access is a DRAM hit iff its distance is ``<= C_d`` and a flash hit iff it is ``<=
   C_d + C_f``. That gives, for any capacities and without replaying, every request's
   bytes from each tier and recompute FLOPs, hence the per-request reusable-prefix time
   (:func:`kvtrace.analyses.response.request_times`), its mean and P99, the read bandwidth (mean
   and peak window), the flash writes of admit-all (DRAM evictions) and the compute
   saved. Capacities are searched on each tier's purchase grid (multiples of its
   ``step`` up to ``max``). With ``nodes > 1`` DRAM and local SSD use per-node
   distances (exact); a shared pool is approximated by the pooled distance ``<= N C_d +
   C_f``. Traces with more than 2M measured accesses are searched on a systematic
   1-in-k request sample (the finalists are then replayed in full).
3. **Lenses** (seed §8). Six candidates — ``keep-dram``, ``expand-dram``,
   ``add-local-ssd``, ``add-shared-flash``, ``dram+flash`` (more DRAM *and* a shared
   pool) and ``recompute-only`` (no host KV tier) — each under three lenses:

   - ``same-slo``: per candidate the *cheapest* configuration meeting the SLO (mean
     and/or P99 reusable-prefix time), the bandwidth and the endurance limits. The
     closest lens to a production decision: the recommendation comes from it.
   - ``same-capacity``: every candidate holds the same total capacity (``economics.
     same_capacity``, default the curve's 95 %-of-ceiling knee, rounded up to the DRAM
     step); ``dram+flash`` picks its best split.
   - ``same-budget``: every candidate spends at most the same monthly budget
     (``economics.budget_monthly_usd``, default the monthly cost of the same-SLO
     winner): the most capacity that money buys (``dram+flash``: its best split).

   ``keep-dram`` and ``recompute-only`` are fixed configurations: they appear, with
   the same figures, under every lens as references.
4. **Confirmation.** Every finalist is replayed with the exact tier simulator
   (:func:`kvtrace.analyses.whatif.simulate`) under each admission policy of
   ``search.policies``; a row keeps the policy that meets every constraint with the
   best net benefit. A same-SLO finalist the simulator shows missing a constraint is
   stepped up its purchase grid (at most 3 times). Every figure in the table comes from
   the simulator, not from the search.

Money (:mod:`kvtrace.analyses.estimate`): a configuration's monthly cost is the sum over its
tiers of ``hardware / amortisation + support + kW x hours x $/kWh + reserve``, with
hardware = ``$/TiB x TiB + $/unit x units`` (units = servers, enclosures or drives:
``ceil(capacity / unit_capacity)``, per node for DRAM and local SSD). Existing DRAM is
priced like new DRAM in every option (replacement cost, seed §8). GPU-hours freed =
(compute saved by the candidate - by today's deployment) per month, at ``$/GPU-hour``;
realised value = realisation x value when positive, the full value when negative (a
candidate that needs more GPU time pays for it); net = realised - incremental monthly
cost; break-even realisation = incremental / value. The trace is taken as
representative of every hour of the month, replayed at ``load.scale`` x its arrival
rate (timestamps divided by the scale: hit shares and service times do not change;
bandwidth, writes per day and $ per month scale with it).

Not modelled: queueing (service times are unloaded; the bandwidth check is the guard),
the GPU time a restore itself costs, HBM prefix caching (common to every option),
replicas and failure domains.

Candidates table (:attr:`SizingResult.candidates`, one row per candidate x lens): the
columns of ``kvtrace.names.TABLES["size"]``, each with its unit. ``rank`` 1 is the best
of its lens: feasible rows first (net benefit, then cost), then infeasible ones by
shortfall (closest first). ``shortfall`` is the normalised shortfall: the largest excess
of a failed constraint over its limit as a share of the limit (0.25: 25 % over; 0 when
feasible): mean / target - 1, P99 / target - 1, DRAM reads / DRAM bandwidth - 1, peak
flash reads / flash bandwidth - 1, DWPD / rating - 1. The ``ssd_`` columns are the
candidate's flash level (its local SSDs or the shared pool).

Search table (:attr:`SizingResult.search`, every evaluated point): ``candidate``,
``dram_bytes``, ``local_ssd_bytes``, ``flash_bytes``, ``total_bytes``, ``dram_prefix_token_hit_rate``,
``ssd_prefix_token_hit_rate``, ``service_time_mean_ms``, ``service_time_p99_ms``, ``ssd_read_mean_bytes_per_s``,
``ssd_read_peak_bytes_per_s``, ``dram_read_mean_bytes_per_s``, ``ssd_dwpd`` (admit-all),
``gpu_seconds_saved_per_hour``, ``cost_usd_per_month``, ``net_usd_per_month``,
``meets_slo``, ``within_limits`` (bandwidth and endurance), ``feasible`` (all three); all
estimates.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from kvtrace.errors import KvtraceError, UsageError
from kvtrace.analyses.estimate import HOURS_PER_MONTH, MonthlyCost, cost_benefit, monthly_cost
from kvtrace.units import format_bytes, parse_size, size_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = ["CANDIDATES", "LENSES", "Recommendation", "SizingConfig", "SizingResult", "TierSpec", "default_config",
           "load_config", "recommend", "report_html", "report_markdown"]

TIB = 2**40
GIB = 2**30
TIERS = ("dram", "local_ssd", "shared_flash")
CANDIDATES = ("keep-dram", "expand-dram", "add-local-ssd", "add-shared-flash", "dram+flash", "recompute-only")
LENSES = ("same-slo", "same-capacity", "same-budget")
CANDIDATE_TEXT = {
    "keep-dram": "keep DRAM", "expand-dram": "expand DRAM", "add-local-ssd": "add local SSD",
    "add-shared-flash": "add shared flash", "dram+flash": "DRAM + flash", "recompute-only": "recompute only",
}
_DAY_S = 86400.0
_SEARCH_MAX_ACCESSES = 2_000_000  # above this the search evaluates a systematic request sample
_GRID_POINTS = 24
_DRAM_SPLIT_POINTS = 10
_REFINE_STEPS = 3


# =========================================================================== config


@dataclass(frozen=True)
class TierSpec:
    """Prices, limits and speeds of one tier (``[tiers.NAME]`` in the TOML).

    All prices are the user's (the example file's are illustrative, not quotes).

    Parameters
    ----------
    step_bytes : int
        Purchase granularity, bytes (``step``): capacities are multiples of it.
    max_bytes : int
        Largest capacity considered, bytes (``max``): per node for DRAM and local SSD,
        the whole pool for shared flash.
    dollars_per_tib : float
        Hardware $ per TiB of capacity (media).
    dollars_per_unit : float
        Hardware $ per unit (a drive, a server, or an enclosure with its DPUs, NICs
        and switch ports).
    unit_bytes : int or None
        Capacity one unit holds, bytes (``unit_capacity``); units = ceil(capacity /
        unit_bytes), per node for DRAM and local SSD. None: one unit per node (or one
        for the pool).
    support_monthly_per_unit : float
        Software support and maintenance, $ per unit per month.
    watts_per_tib, watts_per_unit : float
        Average power, W.
    reserve_monthly_per_tib : float
        Replacement reserve, $ per TiB per month.
    amortisation_months : float
        Straight-line amortisation, months.
    latency_ms : float
        Fixed restore latency, ms.
    restore_gbps : float
        Bandwidth one restore gets, GB/s (10**9 bytes/s): the response model.
    bandwidth_gbps : float
        Deliverable read bandwidth per unit, GB/s: the bandwidth check.
    overhead_ms : float
        Per-request overhead of having this tier (flash tiers), ms.
    endurance_dwpd : float or None
        Rated drive writes per day (flash tiers).
    """

    step_bytes: int
    max_bytes: int
    dollars_per_tib: float
    latency_ms: float
    restore_gbps: float
    bandwidth_gbps: float
    dollars_per_unit: float = 0.0
    unit_bytes: int | None = None
    support_monthly_per_unit: float = 0.0
    watts_per_tib: float = 0.0
    watts_per_unit: float = 0.0
    reserve_monthly_per_tib: float = 0.0
    amortisation_months: float = 36.0
    overhead_ms: float = 0.0
    endurance_dwpd: float | None = None


#: TOML key -> (TierSpec attribute, kind, required for dram, required for flash tiers)
_TIER_KEYS = {
    "step": ("step_bytes", "size", True, True),
    "max": ("max_bytes", "size", True, True),
    "dollars_per_tib": ("dollars_per_tib", "money", True, True),
    "dollars_per_unit": ("dollars_per_unit", "money", False, False),
    "unit_capacity": ("unit_bytes", "size", False, False),
    "support_monthly_per_unit": ("support_monthly_per_unit", "money", False, False),
    "watts_per_tib": ("watts_per_tib", "nonneg", False, False),
    "watts_per_unit": ("watts_per_unit", "nonneg", False, False),
    "reserve_monthly_per_tib": ("reserve_monthly_per_tib", "money", False, False),
    "amortisation_months": ("amortisation_months", "positive", False, False),
    "latency_ms": ("latency_ms", "nonneg", True, True),
    "restore_gbps": ("restore_gbps", "positive", True, True),
    "bandwidth_gbps": ("bandwidth_gbps", "positive", True, True),
    "overhead_ms": ("overhead_ms", "nonneg", False, True),
    "endurance_dwpd": ("endurance_dwpd", "positive", False, True),
}

#: section -> {key: (SizingConfig attribute, kind)}
_SECTIONS = {
    "model": {"name": ("model", "str"), "kv_bytes_per_token": ("kv_bytes_per_token", "int"),
              "dtype": ("dtype", "str")},
    "gpu": {"name": ("gpu", "str"), "dollars_per_hour": ("gpu_dollars_per_hour", "money"),
            "peak_tflops": ("gpu_peak_tflops", "positive"), "mfu": ("gpu_mfu", "fraction")},
    "slo": {"mean_ms": ("slo_mean_ms", "positive"), "p99_ms": ("slo_p99_ms", "positive")},
    "economics": {"realisation": ("realisation", "share"), "dollars_per_kwh": ("dollars_per_kwh", "money"),
                  "hours_per_month": ("hours_per_month", "positive"),
                  "budget_monthly_usd": ("budget_monthly_usd", "positive"),
                  "same_capacity": ("same_capacity_bytes", "size")},
    "load": {"scale": ("load_scale", "positive"), "window_s": ("window_s", "positive"),
             "warmup": ("warmup", "str")},
    "deployment": {"nodes": ("nodes", "int"), "routing": ("routing", "str"), "dram": ("current_dram_bytes", "size0")},
    "search": {"policies": ("policies", "strlist"), "eviction": ("eviction", "str")},
}
_REQUIRED = {("deployment", "dram"), ("economics", "realisation")}


@dataclass(frozen=True)
class SizingConfig:
    """Everything :func:`recommend` needs besides the trace (the TOML file, flattened).

    Sizes in bytes, times in ms (SLO) or s (window), money in $. Build one with
    :func:`load_config`, :meth:`from_dict` or :func:`default_config` and change fields
    with :func:`dataclasses.replace`; :meth:`to_toml` writes it back.

    Parameters
    ----------
    model, kv_bytes_per_token, dtype : str, int, str
        Model preset or ``config.json`` path, and overrides (``[model]``).
    gpu, gpu_dollars_per_hour, gpu_peak_tflops, gpu_mfu : str, float, float, float
        GPU preset and overrides: $ per GPU-hour, dense peak TFLOP/s, MFU (``[gpu]``).
    slo_mean_ms, slo_p99_ms : float or None
        Targets for the reusable-prefix service time; at least one (``[slo]``).
    realisation : float
        Share of freed GPU time that becomes money (``[economics]``).
    dollars_per_kwh, hours_per_month : float
    budget_monthly_usd : float or None
        Budget of the same-budget lens, $ per month (default: the same-SLO winner's cost).
    same_capacity_bytes : int or None
        Total capacity of the same-capacity lens (default: the curve's 95 % knee).
    load_scale : float
        Replay at this multiple of the trace's arrival rate (``[load] scale``).
    window_s : float
        Window of the peak read bandwidth, s.
    warmup : str or None
        Fraction of requests or duration that only fills the tiers (``10%``, ``5min``).
    nodes, routing : int, str
        Nodes of the deployment and request routing (``[deployment]``).
    current_dram_bytes : int
        Today's DRAM per node, bytes (``[deployment] dram``).
    policies : tuple of str
        Admission policies tried on the flash finalists (``[search]``).
    eviction : str
        ``prefix-aware`` or ``flat`` LRU model.
    tiers : dict of str to TierSpec
        ``dram`` (required), ``local_ssd`` and ``shared_flash`` (a missing flash tier
        drops its candidates).
    """

    current_dram_bytes: int
    realisation: float
    tiers: dict
    slo_mean_ms: float | None = None
    slo_p99_ms: float | None = None
    model: str = "Llama-3.1-70B"
    kv_bytes_per_token: int | None = None
    dtype: str | None = None
    gpu: str = "H100"
    gpu_dollars_per_hour: float | None = None
    gpu_peak_tflops: float | None = None
    gpu_mfu: float | None = None
    dollars_per_kwh: float = 0.12
    hours_per_month: float = HOURS_PER_MONTH
    budget_monthly_usd: float | None = None
    same_capacity_bytes: int | None = None
    load_scale: float = 1.0
    window_s: float = 60.0
    warmup: str | None = None
    nodes: int = 1
    routing: str = "session"
    policies: tuple = ("all", "second-hit", "tinylfu")
    eviction: str = "prefix-aware"

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_dict(cls, d: dict, source: str = "<config>") -> "SizingConfig":
        """Validate a nested dict in the TOML layout (see ``sample_traces/tiers.example.toml``).

        Raises
        ------
        KvtraceError
            One line naming ``source``, the key (``section.key``) and what was expected.
        """

        def err(key: str, msg: str) -> KvtraceError:
            return KvtraceError(msg, path=source, field=key)

        if not isinstance(d, dict):
            raise err("", "expected a table of sections")
        known = set(_SECTIONS) | {"tiers"}
        for sec in d:
            if sec not in known:
                raise err(sec, f"unknown section; expected one of {', '.join(sorted(known))}")
        kw: dict = {}
        for sec, keys in _SECTIONS.items():
            body = d.get(sec, {})
            if not isinstance(body, dict):
                raise err(sec, f"expected a [{sec}] table, got {type(body).__name__}")
            for k in body:
                if k not in keys:
                    raise err(f"{sec}.{k}", f"unknown key; expected one of {', '.join(keys)}")
            for k, (attr, kind) in keys.items():
                if k in body:
                    kw[attr] = _value(body[k], kind, f"{sec}.{k}", err)
                elif (sec, k) in _REQUIRED:
                    raise err(f"{sec}.{k}", f"missing; expected {_KIND_TEXT[kind]}")
        if "slo_mean_ms" not in kw and "slo_p99_ms" not in kw:
            raise err("slo", "expected at least one target: mean_ms and/or p99_ms (reusable-prefix time, ms)")
        tiers_in = d.get("tiers")
        if not isinstance(tiers_in, dict) or "dram" not in tiers_in:
            raise err("tiers.dram", "missing; expected a [tiers.dram] table (prices, step, max, latency_ms, "
                                    "restore_gbps, bandwidth_gbps)")
        tiers = {}
        for name, body in tiers_in.items():
            if name not in TIERS:
                raise err(f"tiers.{name}", f"unknown tier; expected one of {', '.join(TIERS)}")
            if not isinstance(body, dict):
                raise err(f"tiers.{name}", f"expected a table, got {type(body).__name__}")
            tkw = {}
            for k in body:
                if k not in _TIER_KEYS:
                    raise err(f"tiers.{name}.{k}", f"unknown key; expected one of {', '.join(_TIER_KEYS)}")
            for k, (attr, kind, req_dram, req_flash) in _TIER_KEYS.items():
                key = f"tiers.{name}.{k}"
                if k in body:
                    tkw[attr] = _value(body[k], kind, key, err)
                elif (req_dram if name == "dram" else req_flash):
                    raise err(key, f"missing; expected {_KIND_TEXT[kind]}")
            if tkw["step_bytes"] <= 0:
                raise err(f"tiers.{name}.step", "expected a positive size")
            if tkw["max_bytes"] < tkw["step_bytes"]:
                raise err(f"tiers.{name}.max", f"expected at least the step ({format_bytes(tkw['step_bytes'])})")
            tiers[name] = TierSpec(**tkw)
        kw["tiers"] = {t: tiers[t] for t in TIERS if t in tiers}
        if "nodes" in kw and not 1 <= kw["nodes"] <= 64:
            raise err("deployment.nodes", f"expected 1..64 nodes, got {kw['nodes']}")
        if "routing" in kw and kw["routing"] not in ("session", "round-robin", "prefix"):
            raise err("deployment.routing", f"expected session, round-robin or prefix, got '{kw['routing']}'")
        if "eviction" in kw and kw["eviction"] not in ("prefix-aware", "flat"):
            raise err("search.eviction", f"expected prefix-aware or flat, got '{kw['eviction']}'")
        if "kv_bytes_per_token" in kw and kw["kv_bytes_per_token"] < 1:
            raise err("model.kv_bytes_per_token", "expected a positive number of bytes per token")
        if "policies" in kw:
            from kvtrace.analyses.whatif import parse_policy

            if not kw["policies"]:
                raise err("search.policies", "expected at least one admission policy, e.g. [\"all\"]")
            for p in kw["policies"]:
                try:
                    pol = parse_policy(p)
                except UsageError as exc:
                    raise err("search.policies", exc.message) from None
                if pol.kind == "value":
                    raise err("search.policies", "value>=v needs per-access values: not available in kvtrace size")
            kw["policies"] = tuple(kw["policies"])
        if "warmup" in kw:
            from kvtrace.analyses.curves import parse_warmup

            try:
                parse_warmup(kw["warmup"])
            except UsageError as exc:
                raise err("load.warmup", exc.message) from None
        return cls(**kw)

    # ------------------------------------------------------------------ writing
    def to_dict(self) -> dict:
        """The nested TOML layout (sizes as exact strings such as ``64GiB``; unset keys left out)."""
        out: dict = {}
        for sec, keys in _SECTIONS.items():
            body = {}
            for k, (attr, kind) in keys.items():
                v = getattr(self, attr)
                if v is None:
                    continue
                body[k] = size_text(v) if kind in ("size", "size0") else list(v) if kind == "strlist" else v
            out[sec] = body
        out["tiers"] = {}
        for name, spec in self.tiers.items():
            body = {}
            for k, (attr, kind, _, _) in _TIER_KEYS.items():
                v = getattr(spec, attr)
                if v is None:
                    continue
                body[k] = size_text(v) if kind == "size" else v
            out["tiers"][name] = body
        return out

    def to_toml(self) -> str:
        """TOML text that :func:`load_config` reads back to an equal config."""
        lines = ["# kvtrace size configuration (see sample_traces/tiers.example.toml for every key)", ""]
        d = self.to_dict()
        for sec in _SECTIONS:
            lines.append(f"[{sec}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in d[sec].items()]
            lines.append("")
        for name, body in d["tiers"].items():
            lines.append(f"[tiers.{name}]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in body.items()]
            lines.append("")
        return "\n".join(lines)

    # ------------------------------------------------------------------ derived
    @property
    def has_slo(self) -> bool:
        return self.slo_mean_ms is not None or self.slo_p99_ms is not None

    def slo_text(self) -> str:
        parts = []
        if self.slo_mean_ms is not None:
            parts.append(f"mean <= {self.slo_mean_ms:g} ms")
        if self.slo_p99_ms is not None:
            parts.append(f"P99 <= {self.slo_p99_ms:g} ms")
        return " and ".join(parts)


_KIND_TEXT = {
    "str": "a string", "int": "an integer", "money": "a number of dollars >= 0", "positive": "a positive number",
    "nonneg": "a number >= 0", "fraction": "a number in (0, 1]", "share": "a number in [0, 1]",
    "size": "a size with a unit such as '64GiB' or '3.84TB'", "size0": "a size with a unit such as '64GiB' (or '0')",
    "strlist": "a list of strings",
}


def _value(v, kind: str, key: str, err):
    expected = _KIND_TEXT[kind]
    if kind == "str":
        if not isinstance(v, str) or not v.strip():
            raise err(key, f"expected {expected}, got {v!r}")
        return v.strip()
    if kind == "strlist":
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise err(key, f"expected {expected}, got {v!r}")
        return [x.strip() for x in v]
    if kind == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            raise err(key, f"expected {expected}, got {v!r}")
        return int(v)
    if kind in ("size", "size0"):
        if kind == "size0" and (v == 0 or v == "0"):
            return 0
        if not isinstance(v, str):
            raise err(key, f"expected {expected}, got {v!r} (give the unit: bytes are ambiguous)")
        try:
            n = parse_size(v, field=key)
        except UsageError as exc:
            raise err(key, exc.message) from None
        if not any(c.isalpha() for c in v):
            raise err(key, f"expected {expected}, got {v!r} (give the unit)")
        return n
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        unit = " (numbers only: the unit is in the key's name)" if isinstance(v, str) else ""
        raise err(key, f"expected {expected}, got {v!r}{unit}")
    v = float(v)
    ok = {"money": v >= 0, "positive": v > 0, "nonneg": v >= 0, "fraction": 0 < v <= 1, "share": 0 <= v <= 1}[kind]
    if not ok:
        raise err(key, f"expected {expected}, got {v:g}")
    return v




def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: JSON escapes are TOML escapes
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {v!r} as TOML")


def load_config(path: str | os.PathLike) -> SizingConfig:
    """Read and validate a sizing TOML file.

    Raises
    ------
    KvtraceError
        Unreadable file, bad TOML (with its line), or a bad key, naming the file.
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise KvtraceError(f"cannot read the config: {exc.strerror or exc}", path=str(p)) from None
    try:
        d = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise KvtraceError("expected UTF-8 TOML text", path=str(p)) from None
    except tomllib.TOMLDecodeError as exc:
        raise KvtraceError(f"invalid TOML: {exc}", path=str(p)) from None
    return SizingConfig.from_dict(d, source=str(p))


def default_config() -> SizingConfig:
    """The numbers of ``sample_traces/tiers.example.toml`` (illustrative, not quotes).

    Sized for ``sample_traces/chat.jsonl``: today's 64 GiB of DRAM sits on the steep part
    of its curve (the 95 % knee is near 300 GiB for Llama-3.1-70B).
    """
    return SizingConfig(
        current_dram_bytes=64 * GIB,
        realisation=0.6,
        slo_mean_ms=100.0,
        slo_p99_ms=600.0,
        model="Llama-3.1-70B",
        gpu="H100",
        gpu_dollars_per_hour=2.5,
        gpu_peak_tflops=989.0,
        gpu_mfu=0.5,
        dollars_per_kwh=0.12,
        hours_per_month=730.0,
        load_scale=1.0,
        window_s=60.0,
        nodes=1,
        routing="session",
        policies=("all", "second-hit", "tinylfu"),
        eviction="prefix-aware",
        tiers={
            "dram": TierSpec(step_bytes=64 * GIB, max_bytes=1 * TIB, dollars_per_tib=12000.0, latency_ms=0.2,
                             restore_gbps=25.0, bandwidth_gbps=50.0, watts_per_tib=150.0,
                             amortisation_months=36.0),
            "local_ssd": TierSpec(step_bytes=parse_size("3.84TB"), max_bytes=parse_size("30.72TB"),
                                  dollars_per_tib=320.0, unit_bytes=parse_size("3.84TB"), watts_per_unit=12.0,
                                  amortisation_months=48.0, latency_ms=0.1, restore_gbps=12.0, bandwidth_gbps=6.0,
                                  overhead_ms=0.5, endurance_dwpd=3.0),
            "shared_flash": TierSpec(step_bytes=16 * TIB, max_bytes=512 * TIB, dollars_per_tib=200.0,
                                     dollars_per_unit=40000.0, unit_bytes=parse_size("368.64TB"),
                                     support_monthly_per_unit=500.0, watts_per_tib=4.0, watts_per_unit=800.0,
                                     amortisation_months=48.0, latency_ms=1.0, restore_gbps=6.0, bandwidth_gbps=80.0,
                                     overhead_ms=2.0, endurance_dwpd=1.0),
        },
    )


# =========================================================================== engine

#: candidate -> the flash tier it adds (None: DRAM only)
FLASH_TIER = {"keep-dram": None, "expand-dram": None, "add-local-ssd": "local_ssd",
              "add-shared-flash": "shared_flash", "dram+flash": "shared_flash", "recompute-only": None}


@dataclass(frozen=True)
class _Point:
    """A tier configuration: DRAM and local SSD per node, shared flash pool (bytes)."""

    dram: int
    local: int = 0
    flash: int = 0

    @property
    def flash_tier(self) -> str | None:
        return "local_ssd" if self.local else "shared_flash" if self.flash else None


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

    def evaluate(self, p: _Point, response) -> dict:
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
            "dram_prefix_token_hit_rate": float(self.tokens[usable & (run == 0)].sum()) / self.total_tokens if self.total_tokens else None,
            "ssd_prefix_token_hit_rate": float(self.tokens[usable & (run > 0)].sum()) / self.total_tokens if self.total_tokens else None,
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


def _point_cost(config: SizingConfig, p: _Point) -> tuple[float, list[MonthlyCost], dict]:
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


_TIER_TEXT = {"dram": "DRAM", "local_ssd": "local SSD", "shared_flash": "shared flash"}

#: constraint key of a shortfall -> how the output names it
SHORTFALL_TEXT = {"slo_mean": "mean", "slo_p99": "P99", "dram_bandwidth": "DRAM bandwidth",
                  "flash_bandwidth": "flash bandwidth", "endurance": "endurance (DWPD)"}


def _shortfall_text(short: dict[str, float]) -> str:
    """``P99 +146.0 %, endurance (DWPD) +12.5 %``: each failed constraint's excess over its limit."""
    return ", ".join(f"{SHORTFALL_TEXT[k]} " + ("+inf" if math.isinf(v) else f"+{100 * v:,.1f} %")
                     for k, v in short.items())


def _label(config: SizingConfig, p: _Point) -> str:
    parts = [f"DRAM {format_bytes(p.dram)}" + (f"/node x {config.nodes}" if config.nodes > 1 else "")]
    if p.local:
        parts.append(f"local SSD {format_bytes(p.local)}" + ("/node" if config.nodes > 1 else ""))
    if p.flash:
        parts.append(f"shared flash {format_bytes(p.flash)}")
    return " + ".join(parts) if p.dram or p.local or p.flash else "no KV tier"


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
    whatif_command : str
        A ``kvtrace whatif`` command that replays the chosen configuration.
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
    whatif_command: str
    feasible: bool = True
    headline: str = ""
    shortfalls: dict = field(default_factory=dict)
    needed: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class SizingResult:
    """Output of :func:`recommend` (schemas in the module docstring).

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


_COLUMNS = {
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


class _Sizer:
    """State of one :func:`recommend` run: estimates, simulations, money."""

    def __init__(self, trace, config: SizingConfig, model, gpu, evaluator: _Evaluator, progress):
        self.trace, self.config, self.model, self.gpu, self.ev = trace, config, model, gpu, evaluator
        self.progress = progress
        self.responses = {t: _response(config, gpu, t) for t in (None, "local_ssd", "shared_flash")
                          if t is None or t in config.tiers}
        self.keep = _Point(config.current_dram_bytes)
        self.search_rows: dict = {}
        self.sims: dict = {}
        self.scratch = None  # the replays' block table, reused from one to the next
        self.costs: dict = {}
        self.keep_est = self.ev.evaluate(self.keep, self.responses[None])
        self.keep_sim = self.recompute_sim = None  # replays of today's DRAM and of no KV tier

    # ---------------------------------------------------------------- money
    def money(self, p: _Point, gs_per_hour: float | None, base_cost: float, base_gs: float | None) -> dict:
        cost, parts, bw = _point_cost(self.config, p)
        self.costs[_label(self.config, p)] = [c.to_dict() for c in parts]
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

    def endurance_ok(self, p: _Point, dwpd) -> bool:
        t = p.flash_tier
        if t is None or dwpd is None:
            return True
        rated = self.config.tiers[t].endurance_dwpd
        return rated is None or dwpd <= rated

    def shortfalls(self, p: _Point, sim: dict, dram_bw, flash_bw, rated) -> dict[str, float]:
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

    def bandwidth_ok(self, p: _Point, bw: dict, dram_mean, flash_peak) -> bool:
        ok = dram_mean is None or p.dram == 0 or dram_mean <= bw.get("dram", math.inf)
        t = p.flash_tier
        if t is not None and flash_peak is not None:
            ok = ok and flash_peak <= bw.get(t, math.inf)
        return ok

    # ---------------------------------------------------------------- search
    def est(self, cand: str, p: _Point) -> dict:
        key = (cand, p)
        if key in self.search_rows:
            return self.search_rows[key]
        e = self.ev.evaluate(p, self.responses[p.flash_tier])
        keep_cost = _point_cost(self.config, self.keep)[0]
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

    def cheapest(self, cand: str, values: list[int], make, need) -> _Point | None:
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
    def sim(self, p: _Point, policy: str) -> dict:
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
                        policy=pol, window_s=c.window_s, name=_label(c, p))
        r = simulate(self.trace, tc, model=self.model, gpu=self.gpu, response=resp, eviction=c.eviction,
                     warmup=c.warmup, scratch=self.scratch)
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
            "ssd_prefix_token_hit_rate": (s["flash_prefix_token_hit_rate"] or 0.0) + (s["local_prefix_token_hit_rate"] or 0.0),
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
            self.progress(None, f"replayed {_label(c, p)}" + (f" ({pol})" if p.flash_tier else ""))
        return out

    def judge(self, cand: str, lens: str, sim: dict) -> dict:
        """A table row from a replay: money vs keep-dram, checks, reasons."""
        c, p = self.config, sim["point"]
        keep = self.keep_sim
        keep_cost = _point_cost(c, self.keep)[0]
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
            "candidate": cand, "lens": lens, "rank": None, "config": _label(c, p), "policy": sim["policy"],
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
            "shortfall": max(short.values(), default=0.0), "shortfalls": _shortfall_text(short) or None,
            "estimated_service_time_mean_ms": est["service_time_mean_ms"],
            "estimated_service_time_p99_ms": est["service_time_p99_ms"], "_shortfalls": short,
        }
        if cand == "keep-dram":
            row["break_even_realisation"] = None
        return row

    def confirm(self, cand: str, lens: str, points: list[_Point], grow=None) -> dict:
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
                 + (", net " + _signed_usd(r["net_usd_per_month"]) if r["net_usd_per_month"] is not None else "")
                 for r in same]
        best = dict(best)
        best["reasons"] = "; ".join(filter(None, [best["reasons"], "admission at this size: " + " | ".join(parts)]))
        return best


def _not_applicable(cand: str, lens: str, why: str, nodes: int) -> dict:
    row = {k: None for k in _COLUMNS}
    row.update({"candidate": cand, "lens": lens, "nodes": nodes, "meets_slo": False, "feasible": False,
                "reasons": f"not applicable: {why}", "shortfall": None})
    return row


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
    scaled = _scaled(trace, c.load_scale)
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

    sz = _Sizer(scaled, c, model, gpu, ev, sim_progress)
    sz.keep_sim = sz.sim(sz.keep, "all")
    sz.recompute_sim = sz.sim(_Point(0), "all")
    slo_rows = _rank(_same_slo(sz, report))
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
    cap_rows = _rank(_same_capacity(sz, target))

    report(0.8, "same-budget lens")
    if c.budget_monthly_usd is not None:
        budget, budget_src = c.budget_monthly_usd, "config"
    else:
        budget = winner["cost_usd_per_month"] if winner["cost_usd_per_month"] is not None else _point_cost(c,
                                                                                                           sz.keep)[0]
        budget_src = f"monthly cost of the same-SLO winner ({winner['candidate']})"
    bud_rows = _rank(_same_budget(sz, budget))

    report(0.97, "recommendation")
    all_rows = slo_rows + cap_rows + bud_rows
    table = pl.DataFrame([{k: r.get(k) for k in _COLUMNS} for r in all_rows], schema=_COLUMNS, orient="row")
    search = pl.DataFrame([{k: r.get(k) for k in _SEARCH_COLUMNS} for r in sz.search_rows.values()],
                          schema=_SEARCH_COLUMNS, orient="row").sort("candidate", "cost_usd_per_month")
    info = {
        "trace": trace.meta.source, "requests": trace.n_requests, "accesses": trace.n_accesses,
        "duration_s": trace.duration, "replayed_duration_s": scaled.duration, "load_scale": c.load_scale,
        "first_measured_request": first_req, "model": model.name, "kv_bytes_per_token": model.kv_bytes_per_token,
        "gpu": gpu.name, "gpu_dollars_per_hour": gpu.dollars_per_hour, "gpu_effective_flops": gpu.effective_flops,
        "slo": c.slo_text(), "same_capacity_bytes": target, "same_capacity_source": target_src,
        "budget_monthly_usd": budget, "budget_source": budget_src, "knee_95_bytes": knee_bytes,
        "ceiling_prefix_token_hit_rate": curve.ceiling.get("prefix_token_hit_rate"),
        "distinct_bytes": curve.info.get("distinct_bytes"),
        "search_points": len(sz.search_rows), "search_sample_every": ev.sample_every,
        "replays": len(sz.sims), "eviction": c.eviction, "nodes": c.nodes, "routing": c.routing,
    }
    rec = _recommendation(sz, slo_rows, cap_rows, bud_rows, info, trace_name or trace.meta.source or "TRACE")
    info["elapsed_s"] = time.perf_counter() - t_start
    report(1.0, "done")
    sims = {f"{_label(c, k[0])} | {k[1]}": v["summary"] for k, v in sz.sims.items()}
    shown = set(table["config"].drop_nulls().to_list())
    costs = {k: v for k, v in sz.costs.items() if k in shown}
    return SizingResult(table, rec, search, curve, c, info, costs, sims)


# --------------------------------------------------------------------------- lenses


def _grow(values: list[int], attr: str):
    """Step a point's ``attr`` up the purchase grid ``values``: ``steps`` steps, or to
    the last value (the tier's max) with ``steps=None``."""
    def grow(p: _Point, steps: int | None):
        later = [x for x in values if x > getattr(p, attr)]
        if not later:
            return None
        v = later[-1] if steps is None else later[min(steps, len(later)) - 1]
        return dataclasses.replace(p, **{attr: v})
    return grow


def _grids(sz: _Sizer) -> tuple[list[int], list[int], list[int]]:
    """Purchasable DRAM above today's, local SSD and shared flash capacities."""
    t = sz.config.tiers
    return (_multiples(t["dram"], above=sz.config.current_dram_bytes),
            _multiples(t["local_ssd"]) if "local_ssd" in t else [],
            _multiples(t["shared_flash"]) if "shared_flash" in t else [])


def _references(sz: _Sizer, lens: str) -> list[dict]:
    """keep-dram and recompute-only: fixed configurations, listed under every lens."""
    return [sz.judge("keep-dram", lens, sz.keep_sim), sz.judge("recompute-only", lens, sz.recompute_sim)]


def _slo(e: dict) -> bool:
    return e["meets_slo"]


def _slo_and_endurance(e: dict) -> bool:
    return e["meets_slo"] and e["_endurance"]


def _same_slo(sz: _Sizer, report) -> list[dict]:
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
        p = sz.cheapest("expand-dram", dram_up, lambda v: _Point(v), _slo)
        rows.append(sz.confirm("expand-dram", lens, [p], _grow(dram_up, "dram")) if p else
                    at_max("expand-dram", _Point(dram_up[-1]), "the DRAM max"))
    report(0.35, "same-SLO lens")
    for cand, values, attr, tier in (("add-local-ssd", locals_, "local", "local_ssd"),
                                     ("add-shared-flash", flashes, "flash", "shared_flash")):
        if not values:
            rows.append(_not_applicable(cand, lens, f"no [tiers.{tier}] in the config", N))
            continue
        mk = lambda v, attr=attr: dataclasses.replace(_Point(cd0), **{attr: v})  # noqa: E731
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
            q = sz.cheapest("dram+flash", flashes, lambda v, d=d: _Point(d, 0, v), need)
            if q is not None:
                cost = _point_cost(sz.config, q)[0]
                if kind not in best or cost < best[kind][0]:
                    best[kind] = (cost, q)
    pts = [q for _, q in best.values()]
    rows.append(sz.confirm("dram+flash", lens, pts, _grow(flashes, "flash")) if pts else
                at_max("dram+flash", _Point(dram_up[-1], 0, flashes[-1]), "the DRAM and flash maxima"))
    return rows


def _same_capacity(sz: _Sizer, target: int) -> list[dict]:
    """Every candidate holds ``target`` bytes in total, exactly (not rounded to purchase
    steps: the lens compares media, not shopping lists); DRAM + flash picks its split."""
    lens, c = "same-capacity", sz.config
    tiers, N, cd0 = c.tiers, c.nodes, c.current_dram_bytes
    rows = _references(sz, lens)
    per_node = target // N
    fixed = {
        "expand-dram": _Point(per_node) if cd0 < per_node <= tiers["dram"].max_bytes else None,
        "add-local-ssd": (_Point(cd0, per_node - cd0) if "local_ssd" in tiers
                          and 0 < per_node - cd0 <= tiers["local_ssd"].max_bytes else None),
        "add-shared-flash": (_Point(cd0, 0, target - cd0 * N) if "shared_flash" in tiers
                             and 0 < target - cd0 * N <= tiers["shared_flash"].max_bytes else None),
    }
    for cand, p in fixed.items():
        rows.append(sz.confirm(cand, lens, [p]) if p else _not_applicable(
            cand, lens, f"{format_bytes(target)} in total does not fit this candidate's limits", N))
    splits = [_Point(d, 0, target - d * N) for d in _multiples(tiers["dram"], above=cd0, upto=per_node - 1)
              if "shared_flash" in tiers and 0 < target - d * N <= tiers["shared_flash"].max_bytes]
    if splits:
        best = max(_thin(splits, _DRAM_SPLIT_POINTS),
                   key=lambda q: (sz.est("dram+flash", q)["feasible"], sz.est("dram+flash", q)["net_usd_per_month"]))
        rows.append(sz.confirm("dram+flash", lens, [best]))
    else:
        rows.append(_not_applicable("dram+flash", lens, f"no DRAM step between today's and "
                                    f"{format_bytes(per_node)}/node leaves room for flash", N))
    return rows


def _same_budget(sz: _Sizer, budget: float) -> list[dict]:
    """Per candidate, the largest purchasable configuration costing at most ``budget``
    $ per month; DRAM + flash picks its best split."""
    lens, c = "same-budget", sz.config
    N, cd0 = c.nodes, c.current_dram_bytes
    dram_up, locals_, flashes = _grids(sz)
    rows = _references(sz, lens)

    def largest(values, mk):
        fit = [v for v in values if _point_cost(c, mk(v))[0] <= budget + 1e-9]
        return mk(fit[-1]) if fit else None

    for cand, values, mk in (("expand-dram", dram_up, lambda v: _Point(v)),
                             ("add-local-ssd", locals_, lambda v: _Point(cd0, v)),
                             ("add-shared-flash", flashes, lambda v: _Point(cd0, 0, v))):
        p = largest(values, mk) if values else None
        rows.append(sz.confirm(cand, lens, [p]) if p else _not_applicable(
            cand, lens, f"its smallest step costs more than ${budget:,.2f}/month" if values
            else "the tier is not configured", N))
    pairs = [q for d in _thin(dram_up, _DRAM_SPLIT_POINTS) if flashes
             for q in [largest(flashes, lambda v, d=d: _Point(d, 0, v))] if q is not None]
    if pairs:
        best = max(pairs, key=lambda q: (sz.est("dram+flash", q)["feasible"],
                                         sz.est("dram+flash", q)["net_usd_per_month"]))
        rows.append(sz.confirm("dram+flash", lens, [best]))
    else:
        rows.append(_not_applicable("dram+flash", lens, f"no DRAM + flash pair fits ${budget:,.2f}/month", N))
    return rows


def _net(r: dict) -> float:
    return r["net_usd_per_month"] if r["net_usd_per_month"] is not None else -math.inf


def _rank(rows: list[dict]) -> list[dict]:
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


def _usd(x) -> str:
    if x is None:
        return "-"
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"


def _signed_usd(x) -> str:
    return "-" if x is None else (f"+${x:,.2f}" if x >= 0 else f"-${-x:,.2f}")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f} %"


def _msf(x) -> str:
    return "-" if x is None else f"{x:,.1f} ms"


def _rate(x) -> str:
    return "-" if x is None else f"{format_bytes(x)}/s"


def _whatif_command(sz: _Sizer, row: dict, trace_name: str) -> str:
    import shlex

    c, gpu = sz.config, sz.gpu
    p = _Point(row["dram_bytes"], row["local_ssd_bytes"], row["flash_bytes"])
    resp = sz.responses[p.flash_tier]
    args = ["kvtrace", "whatif", trace_name, "--dram", size_text(p.dram)]
    if p.flash:
        args += ["--flash", size_text(p.flash)]
    if p.local:
        args += ["--local-ssd", size_text(p.local)]
    if p.flash_tier:
        args += ["--policy", row["policy"]]
    if c.nodes > 1:
        args += ["--nodes", str(c.nodes), "--routing", c.routing]
    args += ["--model", c.model]
    if c.kv_bytes_per_token is not None:
        args += ["--kv-bytes-per-token", str(c.kv_bytes_per_token)]
    if c.dtype is not None:
        args += ["--dtype", c.dtype]
    args += ["--gpu", c.gpu, "--mfu", repr(gpu.mfu), "--gpu-price", repr(gpu.dollars_per_hour)]
    args += ["--dram-gbps", repr(resp.dram_bytes_per_s / 1e9), "--dram-latency-ms", repr(resp.dram_fixed_s * 1e3)]
    if p.flash_tier:
        args += ["--flash-gbps", repr(resp.flash_bytes_per_s / 1e9),
                 "--flash-latency-ms", repr(resp.flash_fixed_s * 1e3), "--overhead-ms", repr(resp.overhead_s * 1e3)]
    if c.eviction != "prefix-aware":
        args += ["--eviction", c.eviction]
    if c.warmup:
        args += ["--warmup", c.warmup]
    return shlex.join(args)


def _recommendation(sz: _Sizer, slo_rows, cap_rows, bud_rows, info, trace_name: str) -> Recommendation:
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
                       f"mean {_msf(top['service_time_mean_ms'])}, P99 {_msf(top['service_time_p99_ms'])}, within {checks}.")
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
               f"; it breaks even at a realisation ratio of {_pct(be)}")
    if top["candidate"] == "keep-dram":
        reasons.append(f"It costs {_usd(top['cost_usd_per_month'])}/month and needs no new spend.")
    elif top["gpu_hours_saved_per_month"] is None:  # a trace that spans no time has no rate per month
        reasons.append(
            f"It costs {_usd(top['cost_usd_per_month'])}/month ({_signed_usd(top['incremental_cost_usd_per_month'])} vs today's "
            f"{keep['config']}); the trace spans no time (its requests share one timestamp), so the GPU-hours it "
            "frees per month, their value and the net are unknown: replay a longer trace.")
    else:
        reasons.append(
            f"It costs {_usd(top['cost_usd_per_month'])}/month ({_signed_usd(top['incremental_cost_usd_per_month'])} vs today's "
            f"{keep['config']}); it frees {top['gpu_hours_saved_per_month']:,.1f} GPU-h/month worth "
            f"{_usd(top['value_usd_per_month'])}, {_usd(top['realised_value_usd_per_month'])} realised at "
            f"{_pct(c.realisation)}: net {_signed_usd(top['net_usd_per_month'])}/month{be_text}.")
    if top["break_even_restore_ms"] is not None:
        reasons.append(f"Flash restores average {_msf(top['restore_mean_ms'])}; flash pays off on average while "
                       f"they stay under {_msf(top['break_even_restore_ms'])} (R - O / h_F of the requests reading it).")
    if info["knee_95_bytes"]:
        reasons.append(
            f"Curve knee: 95 % of the reuse ceiling ({_pct(info['ceiling_prefix_token_hit_rate'])} of prompt "
            f"tokens) needs {format_bytes(info['knee_95_bytes'])} of cache; this configuration holds "
            f"{format_bytes(top['total_bytes'])} and serves {_pct((top['dram_prefix_token_hit_rate'] or 0) + (top['ssd_prefix_token_hit_rate'] or 0))} of "
            f"prompt tokens from cache ({_pct(top['dram_prefix_token_hit_rate'])} DRAM, {_pct(top['ssd_prefix_token_hit_rate'])} flash).")
    reasons.append(f"P99 {_msf(keep['service_time_p99_ms'])} -> {_msf(top['service_time_p99_ms'])}, mean {_msf(keep['service_time_mean_ms'])} -> "
                   f"{_msf(top['service_time_mean_ms'])} (today: {keep['config']}).")
    bw = []
    if top["dram_read_mean_bytes_per_s"] and top["dram_bandwidth_bytes_per_s"]:
        bw.append(f"DRAM reads {_rate(top['dram_read_mean_bytes_per_s'])} of "
                  f"{_rate(top['dram_bandwidth_bytes_per_s'])}")
    if top["ssd_read_peak_bytes_per_s"] is not None and top["ssd_bandwidth_bytes_per_s"]:
        bw.append(f"flash peaks at {_rate(top['ssd_read_peak_bytes_per_s'])} per {c.window_s:g} s window "
                  f"(mean {_rate(top['ssd_read_mean_bytes_per_s'])}) of {_rate(top['ssd_bandwidth_bytes_per_s'])}")
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
                       f"net {_signed_usd(runner['net_usd_per_month'])}/month, {_usd(gap)}/month less.")
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
        f"{lens_best(cap_rows)}; at the same budget ({_usd(info['budget_monthly_usd'])}/month) "
        f"{lens_best(bud_rows)}.")

    # risks
    for r in slo_rows:
        if (r["config"] is not None and r["candidate"] != "keep-dram" and r["service_time_mean_ms"] is not None
                and keep["service_time_mean_ms"] is not None and r["service_time_mean_ms"] < keep["service_time_mean_ms"] and r["service_time_p99_ms"] >= keep["service_time_p99_ms"]):
            who = "the recommendation" if r is top else CANDIDATE_TEXT[r["candidate"]]
            risks.append(f"Mean improves but P99 does not for {who}: mean {_msf(keep['service_time_mean_ms'])} -> "
                         f"{_msf(r['service_time_mean_ms'])}, P99 {_msf(keep['service_time_p99_ms'])} -> {_msf(r['service_time_p99_ms'])}.")
    for target, got, what in ((c.slo_p99_ms, top["service_time_p99_ms"], "P99"), (c.slo_mean_ms,
                                                                                  top["service_time_mean_ms"], "mean")):
        if target is not None and got is not None and 0.9 * target < got <= target:
            risks.append(f"Thin margin: {what} {_msf(got)} is within 10 % of its {target:g} ms target.")
    if top["bandwidth_headroom"] is not None and top["bandwidth_headroom"] < 1.5:
        risks.append(f"Bandwidth headroom is only {top['bandwidth_headroom']:.2f}x: bursts beyond the "
                     f"{c.window_s:g} s window, queueing and rebuild traffic are not modelled.")
    if top["dwpd_headroom"] is not None and top["dwpd_headroom"] < 2:
        risks.append(f"Endurance headroom is only {top['dwpd_headroom']:.2f}x the rated DWPD.")
    if be is not None and be > c.realisation:
        risks.append(f"It pays off only if {_pct(be)} of freed GPU time becomes money (assumed {_pct(c.realisation)}):"
                     " meeting the SLO is what is being bought.")
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
    risks.append("Service times are unloaded (no queueing) and exclude the GPU time restores cost; prices are the "
                 "config's.")
    figures = {k: v for k, v in top.items() if not k.startswith("_")}
    figures.update({"before_service_time_mean_ms": keep["service_time_mean_ms"],
                    "before_service_time_p99_ms": keep["service_time_p99_ms"],
                    "before_config": keep["config"], "knee_95_bytes": info["knee_95_bytes"]})
    command = (_whatif_command(sz, top, trace_name) if top["config"] is not None else "")
    return Recommendation(top["candidate"], "same-slo", top["config"], top["policy"], reasons, risks, figures,
                          command, feasible=bool(top["feasible"]), headline=headline,
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


def _needed(sz: _Sizer, top: dict, info: dict) -> list[str]:
    """What would meet the constraints that no candidate meets, searched on the same
    curves as the candidates (admit-all estimates, :class:`_Evaluator`).

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
        full = ev.evaluate(_Point(distinct), resp)
        if not meets(full):
            ceiling = info["ceiling_prefix_token_hit_rate"] or 0.0
            out.append(f"No cache size meets the SLO: with every distinct block in DRAM ({format_bytes(distinct)}"
                       f"{' per node' if c.nodes > 1 else ''}) the estimate is still mean {_msf(full['service_time_mean_ms'])}, "
                       f"P99 {_msf(full['service_time_p99_ms'])}, set by DRAM restores at {c.tiers['dram'].restore_gbps:g} GB/s "
                       f"and the prefill of the {_pct(1.0 - ceiling)} of prompt tokens no cache can hold (the reuse "
                       f"ceiling is {_pct(ceiling)}): it takes faster restores or prefill (GPU, MFU), or a looser SLO.")
        else:
            lo = max(float(c.current_dram_bytes), 1.0)
            need = int(lo)
            if not meets(ev.evaluate(_Point(need), resp)):
                need = int(_bisect(lo, float(distinct), lambda x: meets(ev.evaluate(_Point(int(x)), resp)),
                                   steps=20))
            dram_max = c.tiers["dram"].max_bytes
            beyond = f", beyond the configured DRAM maximum of {format_bytes(dram_max)}" if dram_max and need > dram_max \
                else ""
            out.append(f"DRAM alone meets the SLO from about {format_bytes(need)}{' per node' if c.nodes > 1 else ''}"
                       f" (estimated on the curves, admit-all){beyond}.")
    p = _Point(top["dram_bytes"] or 0, top["local_ssd_bytes"] or 0, top["flash_bytes"] or 0)
    t = p.flash_tier
    tier = _TIER_TEXT.get(t, "")
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
        out.append(f"Its peak {c.window_s:g} s window reads {_rate(top['ssd_read_peak_bytes_per_s'])}: the "
                   f"{tier} must deliver that (configured {_rate(top['ssd_bandwidth_bytes_per_s'])}).")
    if "dram_bandwidth" in short:
        out.append(f"Its DRAM reads {_rate(top['dram_read_mean_bytes_per_s'])} on average: DRAM must deliver that "
                   f"(configured {_rate(top['dram_bandwidth_bytes_per_s'])}).")
    return out


# =========================================================================== reports

_LENS_TITLE = {
    "same-slo": "Same SLO: per candidate, the cheapest configuration meeting the SLO, bandwidth and endurance",
    "same-capacity": "Same capacity: every candidate holds {capacity} in total (exact capacities)",
    "same-budget": "Same budget: the most each candidate buys for {budget}/month",
}
_TABLE_HEAD = ("rank", "candidate", "configuration", "admission", "DRAM", "SSD/flash", "mean", "P99", "$/month",
               "vs today", "net $/month", "break-even realisation", "DWPD", "feasible", "notes")


def _table_rows(result: SizingResult, lens: str) -> list[list[str]]:
    rows = []
    for r in result.candidates.filter(pl.col("lens") == lens).sort("rank").iter_rows(named=True):
        rows.append([
            str(r["rank"]), CANDIDATE_TEXT[r["candidate"]], r["config"] or "-", r["policy"] or "-",
            _pct(r["dram_prefix_token_hit_rate"]), _pct(r["ssd_prefix_token_hit_rate"]),
            _msf(r["service_time_mean_ms"]), _msf(r["service_time_p99_ms"]),
            _usd(r["cost_usd_per_month"]), _signed_usd(r["incremental_cost_usd_per_month"]),
            _signed_usd(r["net_usd_per_month"]),
            _pct(r["break_even_realisation"]), "-" if r["ssd_dwpd"] is None else f"{r['ssd_dwpd']:,.2f}",
            "yes" if r["feasible"] else "no", r["reasons"] or "",
        ])
    return rows


def _blocks(result: SizingResult) -> list[tuple]:
    """The report as neutral blocks, rendered to Markdown or HTML."""
    c, info, rec = result.config, result.info, result.recommendation
    gpu = f"{info['gpu']} at ${info['gpu_dollars_per_hour']:g}/GPU-hour ({info['gpu_effective_flops'] / 1e12:,.1f} " \
          "TFLOP/s sustained prefill)"
    b: list[tuple] = [
        ("h1", f"kvtrace size: {info['trace']}"),
        ("ul", [
            f"Trace: {info['requests']:,} requests, {info['accesses']:,} block accesses over "
            f"{info['duration_s'] / 60:,.1f} min, replayed at {c.load_scale:g} x its arrival rate"
            + (f" (measured after request {info['first_measured_request']:,})"
               if info["first_measured_request"] else ""),
            f"Model: {info['model']} ({info['kv_bytes_per_token']:,} KV bytes per token); GPU: {gpu}",
            f"SLO (reusable-prefix time per request): {c.slo_text()}; realisation ratio {_pct(c.realisation)}",
            f"Deployment today: DRAM {format_bytes(c.current_dram_bytes)} per node x {c.nodes} node(s), "
            f"{c.routing} routing, {c.eviction} LRU",
            "Prices, power and speeds are the config's: the example file's numbers are illustrative, not quotes.",
        ]),
        ("h2", rec.headline[:1].upper() + rec.headline[1:]),
        *([("p", "What would meet them:"), ("ul", rec.needed)] if rec.needed else []),
        ("ul", rec.reasons),
        ("h3", "Risks"),
        ("ul", rec.risks),
    ]
    if rec.whatif_command:
        b += [("p", "Replay the chosen configuration on its own (hit shares and service times match this report"
                    + ("; per-hour figures differ by the load scale" if c.load_scale != 1 else "") + "):"),
              ("code", rec.whatif_command)]
    b.append(("h2", "Candidates"))
    for lens in LENSES:
        title = _LENS_TITLE[lens].format(capacity=format_bytes(info["same_capacity_bytes"]),
                                         budget=_usd(info["budget_monthly_usd"]))
        b.append(("h3", title))
        if lens == "same-capacity":
            b.append(("p", f"Target: {info['same_capacity_source']}."))
        if lens == "same-budget":
            b.append(("p", f"Budget: {info['budget_source']}."))
        b.append(("table", _TABLE_HEAD, _table_rows(result, lens)))
    b.append(("p", "DRAM, SSD/flash: unconditional shares of prompt tokens served from DRAM and from the local SSD "
                   "or shared flash (usable prefix; dram_ and ssd_prefix_token_hit_rate); times are the reusable prefix's per-request service time from the exact tier replay; "
                   "'vs today' and 'net' compare with keeping today's DRAM; net = realised GPU value - incremental "
                   "cost. Rows are ranked feasible first, then by net benefit."))
    costs = result.costs.get(rec.config or "", [])
    if costs:
        b.append(("h2", "Monthly cost of the recommendation"))
        b.append(("ul", [line for part in costs for line in part["explain"]]))
    b += [("h2", "Charts"), ("chart", "curve"), ("chart", "cost")]
    b += [("h2", "Method"), ("ul", [
        "Search: reuse distances give, for any capacities, each request's bytes from DRAM and flash and its "
        "recompute FLOPs under admit-all exclusive tiers (DESIGN §2 invariant); "
        f"{info['search_points']:,} configurations evaluated"
        + (f" on 1 in {info['search_sample_every']} requests" if info['search_sample_every'] > 1 else "") + ".",
        f"Confirmation: {info['replays']:,} exact replays with the tier simulator (kvtrace whatif), one per "
        f"finalist and admission policy ({', '.join(c.policies)}); every table figure comes from a replay.",
        "Money: hardware / amortisation + support + kW x hours x $/kWh + reserve per tier; existing DRAM at "
        "replacement cost; freed GPU-hours x $/GPU-hour x realisation (a loss of saved compute is paid in full).",
        "Not modelled: queueing, the GPU time restores cost, HBM prefix caching, replicas and failures.",
    ])]
    return b


def _md_escape(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def report_markdown(result: SizingResult, *, charts: bool = True) -> str:
    """The sizing report as Markdown (charts as embedded SVG data URIs when ``charts``)."""
    import base64

    out: list[str] = []
    for blk in _blocks(result):
        kind = blk[0]
        if kind in ("h1", "h2", "h3"):
            out += ["#" * int(kind[1]) + " " + blk[1], ""]
        elif kind == "p":
            out += [blk[1], ""]
        elif kind == "ul":
            out += [f"- {x}" for x in blk[1]] + [""]
        elif kind == "code":
            out += ["```sh", blk[1], "```", ""]
        elif kind == "table":
            head, rows = blk[1], blk[2]
            out.append("| " + " | ".join(head) + " |")
            out.append("|" + "|".join("---" if i in (1, 2, 3, 14) else "--:" for i in range(len(head))) + "|")
            out += ["| " + " | ".join(_md_escape(x) for x in row) + " |" for row in rows]
            out.append("")
        elif kind == "chart" and charts:
            import vl_convert as vlc

            chart, title = _chart(result, blk[1])
            svg = vlc.vegalite_to_svg(chart.to_json())
            out += [f"![{title}](data:image/svg+xml;base64,{base64.b64encode(svg.encode()).decode()})", ""]
    return "\n".join(out)


def _chart(result: SizingResult, name: str):
    from kvtrace.results.charts import cost_slo_chart, sizing_curve_chart

    if name == "curve":
        return sizing_curve_chart(result), "capacity-hit curve with the chosen capacities"
    return cost_slo_chart(result), "cost against the SLO metric"


_CSS = """body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1400px;margin:2em auto;padding:0 1em;
color:#222;line-height:1.45}table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:right;vertical-align:top}
td:nth-child(2),td:nth-child(3),td:nth-child(4),td:nth-child(15),th{text-align:left}
tr.no td{color:#777}code,pre{background:#f4f4f4;padding:2px 4px}pre{padding:0.6em;overflow-x:auto}
h2{border-bottom:1px solid #ddd;padding-bottom:0.2em}"""


def report_html(result: SizingResult) -> str:
    """The sizing report as one self-contained HTML page (Altair charts embedded with
    the Vega libraries inline: it opens offline)."""
    import html

    import vl_convert as vlc

    esc = html.escape
    body: list[str] = []
    specs: list[tuple[str, str]] = []
    for blk in _blocks(result):
        kind = blk[0]
        if kind in ("h1", "h2", "h3"):
            body.append(f"<{kind}>{esc(blk[1])}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{esc(blk[1])}</p>")
        elif kind == "ul":
            body.append("<ul>" + "".join(f"<li>{esc(x)}</li>" for x in blk[1]) + "</ul>")
        elif kind == "code":
            body.append(f"<pre><code>{esc(blk[1])}</code></pre>")
        elif kind == "table":
            head, rows = blk[1], blk[2]
            t = ["<table><thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr></thead><tbody>"]
            for row in rows:
                cls = "" if row[13] == "yes" else ' class="no"'
                t.append(f"<tr{cls}>" + "".join(f"<td>{esc(x)}</td>" for x in row) + "</tr>")
            t.append("</tbody></table>")
            body.append("".join(t))
        elif kind == "chart":
            chart, title = _chart(result, blk[1])
            div = f"chart-{blk[1]}"
            body.append(f'<div id="{div}" title="{esc(title)}"></div>')
            specs.append((div, chart.to_json(indent=None)))
    safe = [(div, spec.replace("</", "<\\/")) for div, spec in specs]  # no "</script>" inside the script
    embeds = "\n".join(f"vegaEmbed('#{div}', {spec}, {{\"renderer\": \"svg\"}}).catch(console.error);"
                       for div, spec in safe)
    bundle = vlc.javascript_bundle().replace("</script", "<\\/script")
    title = esc(f"kvtrace size: {result.info['trace']}")
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{title}</title>"
            f"<style>{_CSS}</style>\n<script type=\"text/javascript\">{bundle}</script></head>\n<body>\n"
            + "\n".join(body) + f"\n<script type=\"text/javascript\">\n{embeds}\n</script>\n</body></html>\n")
