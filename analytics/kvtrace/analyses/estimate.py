"""Back-of-the-envelope calculators of DESIGN §4 and §5 (``kvtrace estimate``).

Three calculators on numbers the planner gives (no trace):

- :func:`latency`: mean reusable-prefix time per option (DRAM only, DRAM + flash,
  DRAM + flash with a restore deadline, DRAM big enough to hold what flash adds), the
  branch table, the break-even flash latency and tail percentiles taken from the
  branch distribution (never averaged);
- :func:`monthly_cost` and :func:`cost_benefit`: monthly cost of a tier (hardware
  amortised + support + power + replacement reserve), the incremental cost between
  two options, the GPU-hours a tier frees, their value, the realised value, the net
  and the break-even realisation ratio;
- :func:`bandwidth`: read bandwidth a tier must serve (arrival rate x share of
  requests reading it x bytes per read), mean and peak, against the tier's bandwidth.

Every result is a frozen dataclass with ``to_dict()`` and ``explain`` (one line per
figure, the arithmetic written out). They reproduce the worked examples of DESIGN §4
(416 / 181 / 119 / 466 ms, 1866.7 ms, P99 2020 vs 2000 ms) and §5 ($1,749.56,
+$872.56, 625 GPU-h, $1,250, $750, -$122.56, 69.8 %) exactly; ``tests/test_estimate.py``
asserts them. :mod:`kvtrace.analyses.sizing` prices its candidates with the same functions.

Conventions: times in milliseconds (``_ms``), money in US dollars per month
(``_usd``, ``monthly``), bandwidth in bytes per second, shares in [0, 1]. A month is
``hours_per_month`` hours (730 by default, the seed's).
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

import numpy as np

from kvtrace.errors import UsageError
from kvtrace.analyses.response import PERCENTILES, branch_latency, weighted_quantile
from kvtrace.units import format_bytes, parse_size

__all__ = ["BandwidthEstimate", "CostEstimate", "LatencyEstimate", "MonthlyCost", "bandwidth", "cost_benefit",
           "gpu_hours_saved_per_month", "latency", "monthly_cost", "parse_rate", "HOURS_PER_MONTH"]

#: Hours in a month of the cost model (seed §8).
HOURS_PER_MONTH = 730.0
_MS = 1e-3


def _num(value, name: str, *, lo: float | None = 0.0, hi: float | None = None, open_lo: bool = False) -> float:
    """A finite real in [lo, hi] (``(lo, hi]`` with ``open_lo``), else a one-line UsageError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise UsageError(f"expected a number, got {value!r}", field=name)
    v = float(value)
    bad = not math.isfinite(v) or (lo is not None and (v <= lo if open_lo else v < lo)) or (hi is not None and v > hi)
    if bad:
        rng = f"{'(' if open_lo else '['}{'-inf' if lo is None else f'{lo:g}'}, {'inf' if hi is None else f'{hi:g}'}]"
        raise UsageError(f"expected a finite number in {rng}, got {value!r}", field=name)
    return v


def _ms(x: float) -> str:
    return f"{x:,.1f} ms"


def _usd(x: float) -> str:
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _n(x: float) -> str:
    """A count: ``10,000,000``, or up to 6 significant digits when fractional."""
    return f"{x:,.0f}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:,.6g}"


# --------------------------------------------------------------------------- latency


@dataclass(frozen=True)
class LatencyEstimate:
    """Reusable-prefix service time per option (DESIGN §4). Times in ms.

    Attributes
    ----------
    h_dram, h_flash : float
        Unconditional request shares served from DRAM and from flash.
    dram_ms, flash_ms, recompute_ms, overhead_ms : float
        Branch times D, F, R and the per-request overhead O of the flash tier.
    options : list of dict
        One row per option: ``option``, ``service_time_mean_ms``, ``service_time_p50_ms``, ``service_time_p90_ms``,
        ``service_time_p99_ms``, ``service_time_p999_ms``, ``formula``. Options: ``DRAM only``, ``DRAM + flash``,
        ``DRAM + flash, restore deadline`` (flash branch = min(F, R)) and
        ``DRAM for h_D + h_F`` (a DRAM big enough to hold what flash adds, no O).
    branches : list of dict
        ``option``, ``branch`` (DRAM / flash / recompute), ``share``, ``time_ms`` (the
        branch's time including O where the option pays it).
    break_even_restore_ms : float
        Flash pays off on average iff ``F < R - O / h_F`` (``-inf`` when h_F = 0).
    flash_pays_off : bool
        ``F < break_even_restore_ms``.
    explain : list of str
        One line per figure.
    """

    h_dram: float
    h_flash: float
    dram_ms: float
    flash_ms: float
    recompute_ms: float
    overhead_ms: float
    options: list
    branches: list
    break_even_restore_ms: float
    flash_pays_off: bool
    explain: list

    def option(self, name: str) -> dict:
        """The row of ``options`` named ``name``."""
        for row in self.options:
            if row["option"] == name:
                return row
        raise KeyError(name)

    def to_dict(self) -> dict:
        return asdict(self)


def _tails(times_ms: list[float], shares: list[float]) -> dict:
    t, w = np.asarray(times_ms, dtype=np.float64), np.asarray(shares, dtype=np.float64)
    keep = w > 0
    return {f"service_time_p{p:g}_ms".replace(".", ""): weighted_quantile(t[keep], w[keep], p / 100)
            for p in PERCENTILES}


def latency(h_dram: float, h_flash: float, dram_ms: float, flash_ms: float, recompute_ms: float,
            overhead_ms: float = 0.0) -> LatencyEstimate:
    """Mean and tail reusable-prefix time for DRAM only, DRAM + flash and a bigger DRAM.

    Parameters
    ----------
    h_dram, h_flash : float
        Unconditional shares of requests served from DRAM and from flash (flash is
        *not* the hit rate among DRAM misses: 75 % of a 20 % miss stream is 0.15).
    dram_ms, flash_ms, recompute_ms : float
        Branch times D, F, R in milliseconds.
    overhead_ms : float
        Per-request overhead O of having the flash tier, ms; every request of the
        DRAM + flash option pays it.

    Returns
    -------
    LatencyEstimate

    Notes
    -----
    Means are ``E = h_D D + h_F F + (1 - h_D - h_F) R + O``. Percentiles come from the
    branch distribution (each branch a point mass at its time, inverted CDF), never
    from averaging: with 5 % of requests recomputing at 2 s, P99 is 2 s whatever the
    mean.
    """
    h_dram = _num(h_dram, "h-dram", hi=1.0)
    h_flash = _num(h_flash, "h-flash", hi=1.0)
    D, F, R, O = (_num(v, n) for v, n in ((dram_ms, "dram-ms"), (flash_ms, "flash-ms"),
                                            (recompute_ms, "recompute-ms"), (overhead_ms, "overhead-ms")))
    b = branch_latency(h_dram, h_flash, D * _MS, F * _MS, R * _MS, O * _MS)  # the §4 arithmetic, in seconds
    miss = max(0.0, 1.0 - h_dram - h_flash)
    h_big = h_dram + h_flash
    Fd = min(F, R)
    rows = [
        ("DRAM only", b.dram_only_mean_s / _MS, [D, R], [h_dram, 1 - h_dram],
         f"{h_dram:g} x {D:g} + {1 - h_dram:g} x {R:g}"),
        ("DRAM + flash", b.tiered_mean_s / _MS, [D + O, F + O, R + O], [h_dram, h_flash, miss],
         f"{h_dram:g} x {D:g} + {h_flash:g} x {F:g} + {miss:g} x {R:g} + {O:g}"),
        ("DRAM + flash, restore deadline", b.tiered_with_deadline_mean_s / _MS, [D + O, Fd + O, R + O],
         [h_dram, h_flash, miss], f"{h_dram:g} x {D:g} + {h_flash:g} x min({F:g}, {R:g}) + {miss:g} x {R:g} + {O:g}"),
        ("DRAM for h_D + h_F", b.big_dram_mean_s / _MS, [D, R], [h_big, miss],
         f"{h_big:g} x {D:g} + {miss:g} x {R:g}"),
    ]
    options = []
    branches = []
    for name, mean, times, shares, formula in rows:
        options.append({"option": name, "service_time_mean_ms": mean, **_tails(times, shares), "formula": formula})
        labels = ["DRAM", "recompute"] if len(times) == 2 else ["DRAM", "flash", "recompute"]
        branches += [{"option": name, "branch": lab, "share": s, "time_ms": t}
                     for lab, s, t in zip(labels, shares, times)]
    be = b.break_even_flash_s / _MS
    only, tiered = options[0], options[1]
    explain = [f"{o['option']}: {o['formula']} = {_ms(o['service_time_mean_ms'])}" for o in options]
    if h_flash > 0:
        explain.append(f"break-even flash latency: flash pays off on average iff F < R - O / h_F = "
                       f"{R:g} - {O:g} / {h_flash:g} = {_ms(be)}; F = {F:g} ms "
                       f"{'pays off' if F < be else 'does not pay off'}")
    else:
        explain.append("break-even flash latency: none (h_F = 0: flash serves no request)")
    p99_only, p99_tiered = only["service_time_p99_ms"], tiered["service_time_p99_ms"]
    p99 = f"P99 from the branch distribution: DRAM only {_ms(p99_only)}, DRAM + flash {_ms(p99_tiered)}"
    if p99_tiered >= p99_only and tiered["service_time_mean_ms"] < only["service_time_mean_ms"]:
        p99 += f" (every tiered request pays O = {O:g} ms); a lower mean does not make a lower P99"
    explain.append(p99)
    return LatencyEstimate(h_dram, h_flash, D, F, R, O, options, branches, be, bool(F < be), explain)


# --------------------------------------------------------------------------- cost


@dataclass(frozen=True)
class MonthlyCost:
    """Monthly cost of one option (DESIGN §5): ``hardware / months + support + kW x
    hours x $/kWh + reserve``. Money in $, power in kW.
    """

    label: str
    hardware_usd: float
    amortisation_months: float
    support_usd_per_month: float
    kw: float
    dollars_per_kwh: float
    reserve_usd_per_month: float
    hours_per_month: float
    hardware_usd_per_month: float
    power_usd_per_month: float
    cost_usd_per_month: float
    explain: list

    def to_dict(self) -> dict:
        return asdict(self)


def monthly_cost(hardware_usd: float, *, amortisation_months: float = 36.0, support_usd_per_month: float = 0.0,
                 kw: float = 0.0, dollars_per_kwh: float = 0.12, reserve_usd_per_month: float = 0.0,
                 hours_per_month: float = HOURS_PER_MONTH, label: str = "option") -> MonthlyCost:
    """Monthly cost of an option: straight-line amortisation with zero residual value.

    Parameters
    ----------
    hardware_usd : float
        Hardware budget, $ (servers, media, DPUs, NICs, switch ports).
    amortisation_months : float
        Months of straight-line amortisation (> 0).
    support_usd_per_month : float
        Software support and maintenance, $ per month.
    kw : float
        Power drawn, kW (average, including the share of shared equipment).
    dollars_per_kwh : float
        Electricity price, $ per kWh.
    reserve_usd_per_month : float
        Replacement reserve for drives that wear out beyond the initial set, $ per
        month (the initial drives are in the hardware already: do not count them twice).
    hours_per_month : float
        Hours in a month (730).
    """
    hw = _num(hardware_usd, "hardware")
    months = _num(amortisation_months, "months", open_lo=True)
    support = _num(support_usd_per_month, "support")
    kw_ = _num(kw, "kw")
    price = _num(dollars_per_kwh, "kwh-price")
    reserve = _num(reserve_usd_per_month, "reserve")
    hours = _num(hours_per_month, "hours-per-month", open_lo=True)
    hw_m = hw / months
    power = kw_ * hours * price
    total = hw_m + support + power + reserve
    explain = [
        f"{label}: hardware {_usd(hw)} / {months:g} months = {_usd(hw_m)}/month",
        f"{label}: power {kw_:g} kW x {hours:g} h x ${price:g}/kWh = {_usd(power)}/month",
        f"{label}: {_usd(hw_m)} + support {_usd(support)} + power {_usd(power)} + reserve {_usd(reserve)}"
        f" = {_usd(total)}/month",
    ]
    return MonthlyCost(label, hw, months, support, kw_, price, reserve, hours, hw_m, power, total, explain)


def gpu_hours_saved_per_month(requests_per_month: float, share: float, gpu_seconds_avoided: float,
                    gpu_seconds_restore: float = 0.0) -> float:
    """GPU-hours a tier frees per month: ``requests x share x (avoided - restore) / 3600``.

    ``gpu_seconds_avoided`` is the prefill GPU time one extra hit avoids,
    ``gpu_seconds_restore`` the GPU time the restore itself costs. GPU-hours are not
    the prefix's wall-clock time: they are the compute that no longer has to run.
    """
    n = _num(requests_per_month, "requests")
    s = _num(share, "share", hi=1.0)
    a = _num(gpu_seconds_avoided, "gpu-seconds")
    r = _num(gpu_seconds_restore, "restore-gpu-seconds")
    return n * s * (a - r) / 3600.0


@dataclass(frozen=True)
class CostEstimate:
    """Incremental cost against realised GPU value (DESIGN §5). Money in $ per month.

    Attributes
    ----------
    current, proposed : MonthlyCost or None
        The two options, when given as cost breakdowns.
    incremental_cost_usd_per_month : float
        ``proposed - current`` (or the increment given directly).
    gpu_hours_saved_per_month : float
        GPU-hours per month the proposal frees (negative: it needs more).
    dollars_per_gpu_hour : float
    value_usd_per_month : float
        ``gpu_hours_saved_per_month x $/GPU-hour``: the theoretical value.
    realisation : float
        Share of freed GPU time that becomes money (cancelled spend or a deferred
        purchase); owned or reserved GPUs are not refunded for idling.
    realised_value_usd_per_month : float
        ``realisation x value`` when the value is positive; a negative value (the
        proposal needs *more* GPU time) is charged in full.
    net_usd_per_month : float
        ``realised - incremental``.
    break_even_realisation : float or None
        ``incremental / value``: the realisation ratio at which the net is zero (None
        when it frees no GPU time; 0 when it frees some and costs nothing more). Above
        1 it cannot pay off.
    explain : list of str
    """

    current: MonthlyCost | None
    proposed: MonthlyCost | None
    incremental_cost_usd_per_month: float
    requests_per_month: float | None
    share: float | None
    gpu_seconds_avoided: float | None
    gpu_seconds_restore: float | None
    gpu_hours_saved_per_month: float
    dollars_per_gpu_hour: float
    value_usd_per_month: float
    realisation: float
    realised_value_usd_per_month: float
    net_usd_per_month: float
    break_even_realisation: float | None
    explain: list

    def to_dict(self) -> dict:
        d = asdict(self)
        return d


def realised_value(value_usd: float, realisation: float) -> float:
    """``realisation x value`` for a gain; a loss (negative value) is charged in full."""
    return realisation * value_usd if value_usd > 0 else value_usd


def break_even_realisation(incremental_usd: float, value_usd: float) -> float | None:
    """Realisation ratio at which ``realisation x value = incremental``.

    None when the option frees no GPU time (its net does not depend on the ratio), 0
    when it frees some and costs nothing more (it pays at any ratio).
    """
    if value_usd <= 0:
        return None
    if incremental_usd <= 0:
        return 0.0
    return incremental_usd / value_usd


def cost_benefit(
    *,
    dollars_per_gpu_hour: float,
    realisation: float,
    incremental_cost_usd_per_month: float | None = None,
    current: MonthlyCost | None = None,
    proposed: MonthlyCost | None = None,
    gpu_hours: float | None = None,
    requests_per_month: float | None = None,
    share: float | None = None,
    gpu_seconds_avoided: float | None = None,
    gpu_seconds_restore: float = 0.0,
) -> CostEstimate:
    """Net monthly benefit of a proposal over the current option.

    Give the increment either directly (``incremental_cost_usd_per_month``) or as two
    :class:`MonthlyCost` (``proposed - current``; ``current`` alone is the increment of
    building it from nothing). Give the GPU time either as ``gpu_hours`` per month or
    as ``requests_per_month x share x (gpu_seconds_avoided - gpu_seconds_restore)``.

    Parameters
    ----------
    dollars_per_gpu_hour : float
        $ per GPU-hour.
    realisation : float
        Share in [0, 1] of freed GPU time that becomes money.
    """
    price = _num(dollars_per_gpu_hour, "gpu-price")
    r = _num(realisation, "realisation", hi=1.0)
    explain: list[str] = []
    if incremental_cost_usd_per_month is not None:
        if current is not None or proposed is not None:
            raise UsageError("give the increment directly or as two options, not both", field="incremental")
        inc = _num(incremental_cost_usd_per_month, "incremental", lo=None)
        explain.append(f"incremental cost (given): {_usd(inc)}/month")
    elif proposed is not None:
        base = current.cost_usd_per_month if current is not None else 0.0
        inc = proposed.cost_usd_per_month - base
        explain += (current.explain if current is not None else []) + proposed.explain
        explain.append(f"incremental cost: {_usd(proposed.cost_usd_per_month)} - {_usd(base)} = {_usd(inc)}/month")
    elif current is not None:
        inc = current.cost_usd_per_month
        explain += current.explain
        explain.append(f"incremental cost (from nothing): {_usd(inc)}/month")
    else:
        raise UsageError("give the incremental cost or the option costs", field="incremental")

    if gpu_hours is not None:
        if requests_per_month is not None:
            raise UsageError("give GPU-hours or requests x share x GPU-seconds, not both", field="gpu-hours")
        hours = _num(gpu_hours, "gpu-hours", lo=None)
        explain.append(f"GPU-hours freed (given): {_n(hours)} GPU-h/month")
    else:
        if requests_per_month is None or share is None or gpu_seconds_avoided is None:
            raise UsageError("give --gpu-hours, or --requests, --share and --gpu-seconds", field="gpu-hours")
        hours = gpu_hours_saved_per_month(requests_per_month, share, gpu_seconds_avoided, gpu_seconds_restore)
        explain.append(
            f"GPU-hours freed: {_n(requests_per_month)} requests x {share:g} x ({gpu_seconds_avoided:g} - "
            f"{gpu_seconds_restore:g}) GPU-s / 3600 = {_n(hours)} GPU-h/month")
    value = hours * price
    realised = realised_value(value, r)
    net = realised - inc
    be = break_even_realisation(inc, value)
    explain.append(f"value: {_n(hours)} GPU-h x ${price:g}/GPU-h = {_usd(value)}/month")
    if value > 0:
        explain.append(f"realised at {_pct(r)}: {_usd(realised)}/month (freed GPU time is money only if it "
                       "cancels spend)")
    else:
        explain.append(f"realised: {_usd(realised)}/month (more GPU time is paid in full)")
    explain.append(f"net: {_usd(realised)} - {_usd(inc)} = {_usd(net)}/month")
    if be is None:
        explain.append("break-even realisation: none (no GPU time freed: the net does not depend on the ratio)")
    elif be == 0.0:
        explain.append("break-even realisation: 0 % (the proposal costs nothing more)")
    else:
        explain.append(f"break-even realisation: {_usd(inc)} / {_usd(value)} = {_pct(be)}"
                       + (" (above 100 %: cannot pay off)" if be > 1 else ""))
    return CostEstimate(current, proposed, inc, requests_per_month, share, gpu_seconds_avoided,
                        gpu_seconds_restore if gpu_hours is None else None, hours, price, value, r, realised, net,
                        be, explain)


# --------------------------------------------------------------------------- bandwidth

_RATE_RE = re.compile(r"^\s*(.+?)\s*(?:/\s*s(?:ec)?|ps)?\s*$", re.IGNORECASE)


def parse_rate(text: str, *, field: str = "bandwidth") -> float:
    """A bandwidth in bytes/s: ``32GiB/s``, ``25GB/s``, ``6 GB/s`` (``/s`` optional).

    Binary units (KiB..PiB) are powers of 1024, decimal units (KB..PB) powers of 1000.
    A bare number is refused: say which unit.
    """
    s = str(text).strip()
    m = _RATE_RE.match(s)
    body = m.group(1) if m else s
    if not re.search(r"[a-zA-Z]", body):
        raise UsageError(f"expected a bandwidth with a unit such as 32GiB/s or 25GB/s, got '{text}'", field=field)
    return float(parse_size(body, field=field))


@dataclass(frozen=True)
class BandwidthEstimate:
    """Read bandwidth a tier must serve (DESIGN §4). Rates in bytes/s.

    Attributes
    ----------
    arrival_rate_per_s : float
        Mean request arrivals per second.
    share_reading : float
        Share of requests that read the tier.
    bytes_per_read : float
        Mean bytes read per such request.
    needed_bytes_per_s : float
        ``arrival_rate x share x bytes``.
    peak_arrival_rate_per_s, peak_needed_bytes_per_s : float or None
        The same in the busiest window, when given.
    tier_bytes_per_s : float or None
        What the tier can deliver (after replicas, network and contention).
    utilisation, peak_utilisation : float or None
        needed / tier.
    headroom : float or None
        tier / (peak need if given, else mean need).
    fits : bool or None
        The peak (else the mean) need fits the tier.
    restore_bytes_per_s, transfer_floor_ms : float or None
        With one request's restore bandwidth: the transfer time floor of one read,
        ``bytes / bandwidth`` (before metadata, queueing and device latency).
    explain : list of str
    """

    arrival_rate_per_s: float
    share_reading: float
    bytes_per_read: float
    needed_bytes_per_s: float
    peak_arrival_rate_per_s: float | None
    peak_needed_bytes_per_s: float | None
    tier_bytes_per_s: float | None
    utilisation: float | None
    peak_utilisation: float | None
    headroom: float | None
    fits: bool | None
    restore_bytes_per_s: float | None
    transfer_floor_ms: float | None
    explain: list

    def to_dict(self) -> dict:
        return asdict(self)


def _rate(x: float) -> str:
    return f"{format_bytes(x)}/s ({x / 1e9:,.4g} GB/s)"


def bandwidth(arrival_rate_per_s: float, share_reading: float, bytes_per_read: float, *,
              tier_bytes_per_s: float | None = None, peak_arrival_rate_per_s: float | None = None,
              restore_bytes_per_s: float | None = None) -> BandwidthEstimate:
    """Read bandwidth needed from a tier, mean and peak, against what it delivers.

    Parameters
    ----------
    arrival_rate_per_s : float
        Requests per second (mean).
    share_reading : float
        Share of requests that read the tier, in [0, 1] (unconditional).
    bytes_per_read : float
        Bytes read per such request.
    tier_bytes_per_s : float, optional
        Deliverable read bandwidth of the tier, bytes/s.
    peak_arrival_rate_per_s : float, optional
        Requests per second in the busiest window: check peaks, not only the mean.
    restore_bytes_per_s : float, optional
        Bandwidth one restore gets, bytes/s (gives the transfer floor of one read).
    """
    q = _num(arrival_rate_per_s, "rate")
    p = _num(share_reading, "share", hi=1.0)
    b = _num(bytes_per_read, "bytes")
    need = q * p * b
    explain = [f"mean need: {q:g} req/s x {p:g} x {format_bytes(b)} = {_rate(need)}"]
    peak_q = None if peak_arrival_rate_per_s is None else _num(peak_arrival_rate_per_s, "peak-rate")
    peak_need = None if peak_q is None else peak_q * p * b
    if peak_need is not None:
        explain.append(f"peak need: {peak_q:g} req/s x {p:g} x {format_bytes(b)} = {_rate(peak_need)}")
    tier = None if tier_bytes_per_s is None else _num(tier_bytes_per_s, "tier-bandwidth", open_lo=True)
    util = peak_util = headroom = fits = None
    if tier is not None:
        util = need / tier
        peak_util = None if peak_need is None else peak_need / tier
        worst = peak_need if peak_need is not None else need
        headroom = tier / worst if worst > 0 else math.inf
        fits = bool(worst <= tier)
        which = "peak" if peak_need is not None else "mean"
        explain.append(f"tier delivers {_rate(tier)}: mean utilisation {_pct(util)}"
                       + ("" if peak_util is None else f", peak {_pct(peak_util)}")
                       + f"; {which} need {'fits' if fits else 'does NOT fit'} (headroom {headroom:.2f}x)")
    restore = None if restore_bytes_per_s is None else _num(restore_bytes_per_s, "restore-bandwidth", open_lo=True)
    floor_ms = None if restore is None else b / restore / _MS
    if floor_ms is not None:
        explain.append(f"transfer floor of one read: {format_bytes(b)} / {format_bytes(restore)}/s = "
                       f"{_ms(floor_ms)} (before metadata, queueing and device latency)")
    explain.append("not included: prefetch, re-reads, replication, writes and rebuilds; check each link of the "
                   "topology, not only the cluster total")
    return BandwidthEstimate(q, p, b, need, peak_q, peak_need, tier, util, peak_util, headroom, fits, restore,
                             floor_ms, explain)
