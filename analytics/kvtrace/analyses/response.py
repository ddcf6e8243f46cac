"""Response-time model of the reusable prefix (DESIGN §4, seed §5-7).

A request's reusable prefix is served by branches: read from DRAM, read from flash,
or recomputed on the GPU. Two views:

- :func:`branch_latency` works on given branch shares and times (the planner's
  back-of-the-envelope, and the worked example of DESIGN §4);
- :func:`request_times` works per request from a replay: bytes read from each tier and
  the prefill FLOPs of what missed, with byte-dependent restore times and a
  restore-or-recompute deadline. Percentiles come from that per-request distribution,
  never from averaging branches.

Branch time of a tier = fixed latency + bytes / bandwidth (0 when nothing is read).
``O`` is the per-request overhead of having the extra tier (lookups, metadata): it is
paid by every request of a configuration that has the tier.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from kvtrace.errors import UsageError
from kvtrace.gpu import resolve_gpu

#: Percentiles reported everywhere (per cent).
PERCENTILES = (50.0, 90.0, 99.0, 99.9)


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """Smallest value whose cumulative weight share reaches ``q`` (inverted CDF)."""
    order = np.argsort(values, kind="stable")
    v, w = values[order], weights[order]
    c = np.cumsum(w) / w.sum()
    i = int(np.searchsorted(c, q - 1e-12, side="left"))
    return float(v[min(i, v.shape[0] - 1)])


@dataclass(frozen=True)
class BranchLatency:
    """Means and tails of the reusable-prefix time for the options of DESIGN §4.

    All times in seconds. ``explain`` holds one line per figure.
    """

    dram_only_mean_s: float
    tiered_mean_s: float
    tiered_with_deadline_mean_s: float
    big_dram_mean_s: float
    break_even_flash_s: float
    dram_only_percentiles_s: dict
    tiered_percentiles_s: dict
    branches: list
    explain: list

    def to_dict(self) -> dict:
        return asdict(self)


def branch_latency(
    h_dram: float, h_flash: float, dram_s: float, flash_s: float, recompute_s: float, overhead_s: float = 0.0
) -> BranchLatency:
    """Mean and percentile reusable-prefix time for DRAM-only, DRAM + flash, and a DRAM
    big enough to hold what flash adds.

    Parameters
    ----------
    h_dram, h_flash : float
        Unconditional shares of requests served from DRAM and from flash (flash is not
        "hit rate among DRAM misses").
    dram_s, flash_s, recompute_s : float
        Branch times, seconds.
    overhead_s : float
        Per-request overhead of the flash tier, seconds (paid by every request).

    Notes
    -----
    ``tiered_mean_s`` is DESIGN §4's ``h_D D + h_F F + (1 - h_D - h_F) R + O``; with a
    restore deadline the flash branch costs ``min(F, R)`` (``tiered_with_deadline``).
    Flash pays off on average iff ``F < R - O / h_F``.
    """
    for name, v in (("h-dram", h_dram), ("h-flash", h_flash)):
        if not 0 <= v <= 1:
            raise UsageError(f"expected a share in [0, 1], got {v}", field=name)
    if h_dram + h_flash > 1 + 1e-12:
        raise UsageError(f"h_dram + h_flash = {h_dram + h_flash:g} exceeds 1", field="h-flash")
    for name, v in (("dram-ms", dram_s), ("flash-ms", flash_s), ("recompute-ms", recompute_s),
                    ("overhead-ms", overhead_s)):
        if not np.isfinite(v) or v < 0:
            raise UsageError(f"expected a non-negative time, got {v}", field=name)
    miss = max(0.0, 1.0 - h_dram - h_flash)
    D, F, R, O = dram_s, flash_s, recompute_s, overhead_s
    dram_only = h_dram * D + (1 - h_dram) * R
    tiered = h_dram * D + h_flash * F + miss * R + O
    tiered_deadline = h_dram * D + h_flash * min(F, R) + miss * R + O
    big_dram = (h_dram + h_flash) * D + miss * R
    break_even = R - O / h_flash if h_flash > 0 else float("-inf")
    shares_only = np.array([h_dram, 1 - h_dram])
    times_only = np.array([D, R])
    shares_tiered = np.array([h_dram, h_flash, miss])
    times_tiered = np.array([D + O, F + O, R + O])
    keep_o, keep_t = shares_only > 0, shares_tiered > 0
    pct_only = {f"p{p:g}": weighted_quantile(times_only[keep_o], shares_only[keep_o], p / 100) for p in PERCENTILES}
    pct_tiered = {f"p{p:g}": weighted_quantile(times_tiered[keep_t], shares_tiered[keep_t], p / 100)
                  for p in PERCENTILES}
    ms = 1e3
    explain = [
        f"DRAM only: {h_dram:g} x {D * ms:g} ms + {1 - h_dram:g} x {R * ms:g} ms = {dram_only * ms:.1f} ms",
        f"DRAM + flash: {h_dram:g} x {D * ms:g} + {h_flash:g} x {F * ms:g} + {miss:g} x {R * ms:g} + O {O * ms:g}"
        f" = {tiered * ms:.1f} ms",
        f"DRAM + flash with a restore deadline (flash branch = min(F, R) = {min(F, R) * ms:g} ms): "
        f"{tiered_deadline * ms:.1f} ms",
        f"DRAM big enough for {h_dram + h_flash:g}: {h_dram + h_flash:g} x {D * ms:g} + {miss:g} x {R * ms:g}"
        f" = {big_dram * ms:.1f} ms",
        f"flash pays off on average iff F < R - O / h_F = {R * ms:g} - {O * ms:g} / {h_flash:g}"
        f" = {break_even * ms:.1f} ms",
        f"P99: DRAM only {pct_only['p99'] * ms:g} ms vs DRAM + flash {pct_tiered['p99'] * ms:g} ms "
        "(from the branch distribution, every tiered request pays O)",
    ]
    branches = [
        {"option": "DRAM only", "branch": "DRAM", "share": h_dram, "time_s": D},
        {"option": "DRAM only", "branch": "recompute", "share": 1 - h_dram, "time_s": R},
        {"option": "DRAM + flash", "branch": "DRAM", "share": h_dram, "time_s": D + O},
        {"option": "DRAM + flash", "branch": "flash", "share": h_flash, "time_s": F + O},
        {"option": "DRAM + flash", "branch": "recompute", "share": miss, "time_s": R + O},
    ]
    return BranchLatency(dram_only, tiered, tiered_deadline, big_dram, break_even, pct_only, pct_tiered,
                         branches, explain)


@dataclass(frozen=True)
class ResponseModel:
    """Byte-dependent branch times for per-request service times.

    Defaults are illustrative (a host-DRAM restore over PCIe 5 at ~25 GB/s, a flash
    restore at ~6 GB/s per GPU, 1 ms per-request overhead for a flash tier, the
    :data:`kvtrace.gpu.DEFAULT_GPU` preset at its default MFU for recompute): pass
    measured values. ``ResponseModel()`` is the one source of these defaults: the CLI's
    options, the dashboard's form and :func:`kvtrace.analyses.sizing.default_config` read
    them from it, in their units through :attr:`dram_gbps`, :attr:`dram_latency_ms`,
    :attr:`flash_gbps`, :attr:`flash_latency_ms` and :attr:`overhead_ms`.

    Parameters
    ----------
    dram_fixed_s, dram_bytes_per_s : float
        DRAM restore: fixed latency (s) and bandwidth (bytes/s).
    flash_fixed_s, flash_bytes_per_s : float
        Flash restore: fixed latency (s) and bandwidth (bytes/s).
    overhead_s : float
        Per-request overhead of a configuration with a flash tier (s).
    recompute_flops_per_s : float
        Sustained prefill FLOP/s of the GPU (peak x MFU).
    """

    dram_fixed_s: float = 0.0002
    dram_bytes_per_s: float = 25e9
    flash_fixed_s: float = 0.001
    flash_bytes_per_s: float = 6e9
    overhead_s: float = 0.001
    recompute_flops_per_s: float = resolve_gpu().effective_flops

    def __post_init__(self) -> None:
        for name in ("dram_bytes_per_s", "flash_bytes_per_s", "recompute_flops_per_s"):
            if not getattr(self, name) > 0:
                raise UsageError(f"expected a positive rate, got {getattr(self, name)}", field=name)
        for name in ("dram_fixed_s", "flash_fixed_s", "overhead_s"):
            if not getattr(self, name) >= 0:
                raise UsageError(f"expected a non-negative time, got {getattr(self, name)}", field=name)

    @classmethod
    def in_units(cls, *, dram_gbps: float, dram_latency_ms: float, flash_gbps: float, flash_latency_ms: float,
                 overhead_ms: float, recompute_flops_per_s: float) -> "ResponseModel":
        """The model from the units people type (GB/s = 10**9 bytes/s, ms): the inverse of
        the properties below, as ``kvtrace whatif`` options and the dashboard take it.
        Values are checked in those units (an error names the option, ``flash-gbps``)."""
        for name, v in (("dram-gbps", dram_gbps), ("flash-gbps", flash_gbps)):
            if not v > 0:
                raise UsageError(f"expected a positive rate in GB/s, got {v:g}", field=name)
        for name, v in (("dram-latency-ms", dram_latency_ms), ("flash-latency-ms", flash_latency_ms),
                        ("overhead-ms", overhead_ms)):
            if not v >= 0:
                raise UsageError(f"expected a non-negative time in ms, got {v:g}", field=name)
        return cls(dram_fixed_s=dram_latency_ms / 1e3, dram_bytes_per_s=dram_gbps * 1e9,
                   flash_fixed_s=flash_latency_ms / 1e3, flash_bytes_per_s=flash_gbps * 1e9,
                   overhead_s=overhead_ms / 1e3, recompute_flops_per_s=recompute_flops_per_s)

    @property
    def dram_gbps(self) -> float:
        """DRAM restore bandwidth, GB/s (10**9 bytes/s)."""
        return self.dram_bytes_per_s / 1e9

    @property
    def dram_latency_ms(self) -> float:
        """DRAM restore fixed latency, ms."""
        return self.dram_fixed_s * 1e3

    @property
    def flash_gbps(self) -> float:
        """Flash restore bandwidth, GB/s (10**9 bytes/s)."""
        return self.flash_bytes_per_s / 1e9

    @property
    def flash_latency_ms(self) -> float:
        """Flash restore fixed latency, ms."""
        return self.flash_fixed_s * 1e3

    @property
    def overhead_ms(self) -> float:
        """Per-request overhead of a configuration with a flash tier, ms."""
        return self.overhead_s * 1e3


def request_times(bytes_d, bytes_f, flops_f, flops_miss, model: ResponseModel, has_flash: bool) -> np.ndarray:
    """Per-request reusable-prefix service time, seconds.

    Parameters
    ----------
    bytes_d, bytes_f : float64[R]
        Reusable-prefix bytes each request reads from DRAM and from flash.
    flops_f : float64[R]
        Prefill FLOPs those flash bytes would cost to recompute (the deadline).
    flops_miss : float64[R]
        Prefill FLOPs of reusable tokens that were not cached.
    has_flash : bool
        Whether the configuration has a flash tier (then every request pays O).

    Returns
    -------
    float64[R]
        ``D(bytes_d) + min(F(bytes_f), flops_f / rate) + flops_miss / rate (+ O)``.
    """
    bytes_d = np.asarray(bytes_d, dtype=np.float64)
    bytes_f = np.asarray(bytes_f, dtype=np.float64)
    rate = model.recompute_flops_per_s
    d = np.where(bytes_d > 0, model.dram_fixed_s + bytes_d / model.dram_bytes_per_s, 0.0)
    restore = np.where(bytes_f > 0, model.flash_fixed_s + bytes_f / model.flash_bytes_per_s, 0.0)
    f = np.minimum(restore, np.asarray(flops_f, dtype=np.float64) / rate)
    r = np.asarray(flops_miss, dtype=np.float64) / rate
    return d + f + r + (model.overhead_s if has_flash else 0.0)


def percentiles(times) -> dict:
    """``mean_s`` and ``p50_s`` .. ``p99.9_s`` of per-request times (inverted-CDF quantiles)."""
    t = np.asarray(times, dtype=np.float64)
    if t.size == 0:
        return {"mean_s": None, **{f"p{p:g}_s": None for p in PERCENTILES}}
    out = {"mean_s": float(t.mean())}
    for p, x in zip(PERCENTILES, np.percentile(t, list(PERCENTILES), method="inverted_cdf")):
        out[f"p{p:g}_s"] = float(x)
    return out
