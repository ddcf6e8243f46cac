"""What a kept block earns and costs (``kvtrace value``): storage costs, the horizon,
and the per-access value formulas of :mod:`kvtrace.analyses.value`.

Every function of a per-access quantity here is elementwise, so a chunk of accesses
gets the same bits as the whole trace would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvtrace.errors import UsageError
from kvtrace.model import GpuSpec, ModelSpec, resolve_gpu, resolve_model
from kvtrace.units import parse_duration

#: Default horizon, seconds: reuses more than an hour away are not counted. An hour
#: covers a conversation's follow-up turns and an agent's tool calls; pass ``inf`` to
#: count every later reuse.
DEFAULT_HORIZON_S = 3600.0

#: The same default as a duration, as ``kvtrace value --horizon`` and the dashboard's
#: ``value >= v`` policy take it (``parse_horizon(DEFAULT_HORIZON) == DEFAULT_HORIZON_S``).
DEFAULT_HORIZON = "1h"

_TB = 1e12  # storage is priced in decimal terabytes
_MONTH_S = 730.0 * 3600.0  # a month of 730 hours (the seed's cost model, §8)


@dataclass(frozen=True)
class StorageCosts:
    """What keeping a block in a store costs, per byte.

    Parameters
    ----------
    write_dollars_per_byte : float
        $ per byte written, paid once each time a block is stored (endurance of the
        medium, write bandwidth).
    read_dollars_per_byte : float
        $ per byte read back, paid at every reuse served from the store.
    occupancy_dollars_per_byte_second : float
        $ per byte per second stored (the capacity's amortised cost).

    All must be finite and >= 0. :meth:`per_tb` takes the units prices are quoted in.
    """

    write_dollars_per_byte: float = 0.0
    read_dollars_per_byte: float = 0.0
    occupancy_dollars_per_byte_second: float = 0.0

    def __post_init__(self) -> None:
        for name in ("write_dollars_per_byte", "read_dollars_per_byte", "occupancy_dollars_per_byte_second"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise UsageError(f"expected a number, got {value!r}", field=name)
            if not math.isfinite(value) or value < 0:
                raise UsageError(f"expected a finite cost >= 0, got {value!r}", field=name)
            object.__setattr__(self, name, float(value))

    @classmethod
    def per_tb(
        cls,
        *,
        write_dollars_per_tb: float = 0.0,
        read_dollars_per_tb: float = 0.0,
        occupancy_dollars_per_tb_month: float = 0.0,
    ) -> "StorageCosts":
        """Costs from $ per TB written / read and $ per TB-month stored.

        TB = 10**12 bytes; a month = 730 hours.
        """
        given = {"write_dollars_per_tb": write_dollars_per_tb, "read_dollars_per_tb": read_dollars_per_tb,
                 "occupancy_dollars_per_tb_month": occupancy_dollars_per_tb_month}
        for name, value in given.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise UsageError(f"expected a finite cost >= 0, got {value!r}", field=name)
        return cls(
            write_dollars_per_byte=write_dollars_per_tb / _TB,
            read_dollars_per_byte=read_dollars_per_tb / _TB,
            occupancy_dollars_per_byte_second=occupancy_dollars_per_tb_month / _TB / _MONTH_S,
        )

    def to_dict(self) -> dict:
        return {
            "write_dollars_per_byte": self.write_dollars_per_byte,
            "read_dollars_per_byte": self.read_dollars_per_byte,
            "occupancy_dollars_per_byte_second": self.occupancy_dollars_per_byte_second,
            "write_dollars_per_tb": self.write_dollars_per_byte * _TB,
            "read_dollars_per_tb": self.read_dollars_per_byte * _TB,
            "occupancy_dollars_per_tb_month": self.occupancy_dollars_per_byte_second * _TB * _MONTH_S,
        }


#: Illustrative costs of a shared flash tier (the admission question of seed §9), not
#: quotes: pass your own.
#:
#: - occupancy $20 per TB-month: enterprise NVMe at about $150/TB raw, times ~3 for the
#:   servers, DPUs, network and spare capacity around it, over 36 months, plus power;
#: - write $0.20 per TB written: a 1-drive-write-per-day drive over 5 years takes 1,825
#:   full writes ($150 / 1,825 = $0.08 per TB), times ~2.5 write amplification;
#: - read $0: reads do not wear flash; the GPU time a restore takes is a latency
#:   question (``kvtrace estimate``), not a per-byte cost here.
#:
#: For Llama-3.1-70B (fp16, 512-token blocks = 168 MB) on an H100 at $2.50/h, one reuse
#: of a block at position 0 saves about $1.0e-4; storing the block for a day costs
#: $1.1e-4 and writing it $3.4e-5.
DEFAULT_COSTS = StorageCosts.per_tb(write_dollars_per_tb=0.20, occupancy_dollars_per_tb_month=20.0)


def parse_horizon(value: float | str | None) -> float:
    """A horizon in seconds: a number, a duration (``90s``, ``10min``, ``2h``) or ``inf``.

    ``None`` gives :data:`DEFAULT_HORIZON_S`.

    Raises
    ------
    UsageError
        A negative, NaN or unparsable horizon.
    """
    if value is None:
        return DEFAULT_HORIZON_S
    if isinstance(value, str):
        text = value.strip().lower()
        seconds = math.inf if text in ("inf", "infinite", "infinity", "none") else parse_duration(text, field="horizon")
    elif isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise UsageError(f"expected a number of seconds, got {value!r}", field="horizon")
    else:
        seconds = float(value)
    if math.isnan(seconds) or seconds < 0:
        raise UsageError(f"expected a horizon >= 0 seconds, got {value!r}", field="horizon")
    return seconds


def setup(model, gpu, horizon_s, costs) -> tuple[ModelSpec, GpuSpec, float, StorageCosts]:
    """Resolved model, GPU, horizon (seconds) and costs of a value run (None: the defaults:
    Llama-3.1-70B, H100, :data:`DEFAULT_HORIZON_S`, :data:`DEFAULT_COSTS`)."""
    m = model if isinstance(model, ModelSpec) else resolve_model(model)
    g = gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu)
    horizon = parse_horizon(horizon_s)
    c = DEFAULT_COSTS if costs is None else costs
    if not isinstance(c, StorageCosts):
        raise UsageError(f"expected StorageCosts, got {type(c).__name__}", field="costs")
    return m, g, horizon, c


def info(m: ModelSpec, g: GpuSpec) -> dict:
    """``FutureReuse.info``: the model, GPU and KV bytes per token of a run."""
    return {"model": m.name, "kv_bytes_per_token": int(m.kv_bytes_per_token), "gpu": g.name,
            "gpu_dollars_per_hour": g.dollars_per_hour, "gpu_effective_flops": g.effective_flops}


def prefill_gpu_seconds(m: ModelSpec, g: GpuSpec, tokens: np.ndarray, pos_token_sum: np.ndarray) -> np.ndarray:
    """GPU-seconds of ``a*k + b*q`` prefill FLOPs, elementwise (int64 token counts and
    position-token sums in)."""
    coef_a, coef_b = m.flops_coefficients()
    return g.gpu_seconds(coef_a * tokens.astype(np.float64) + coef_b * pos_token_sum.astype(np.float64))


def pos_token_sums(tokens: np.ndarray, pos: np.ndarray, block_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """(k, q) int64: tokens of each access and the sum of their prompt positions,
    ``q = k*s + k*(k-1)/2`` from the access's first position ``s = pos x block_tokens``
    (exact in int64)."""
    k = tokens.astype(np.int64)
    start = pos.astype(np.int64) * int(block_tokens)
    return k, k * start + k * (k - 1) // 2


def window_values(m, g, c, horizon, fbytes, reuses, last_gap, reuse_tokens, reuse_q):
    """Window value columns of :class:`kvtrace.analyses.value.FutureReuse` (``fbytes``:
    float64 bytes): (hold_s, gain_gpu_seconds, gain_usd, cost_usd, value_usd)."""
    tail = horizon if math.isfinite(horizon) else 0.0
    gain_s = prefill_gpu_seconds(m, g, reuse_tokens, reuse_q)
    gain_d = gain_s * (g.dollars_per_hour / 3600.0)
    hold = np.where(reuses > 0, last_gap, tail)
    cost = fbytes * (c.write_dollars_per_byte + c.read_dollars_per_byte * reuses
                     + c.occupancy_dollars_per_byte_second * hold)
    return hold, gain_s, gain_d, cost, gain_d - cost


def interval_values(g, c, horizon, fbytes, keep, next_gap, interval_gain, starts_stay):
    """Interval value of each access (the time-to-live schedule, split by access;
    ``keep``: ``reuses > 0``), $."""
    tail = horizon if math.isfinite(horizon) else 0.0
    occupied = np.where(keep, next_gap, tail)
    return interval_gain * (g.dollars_per_hour / 3600.0) - fbytes * (
        c.read_dollars_per_byte * keep + c.occupancy_dollars_per_byte_second * occupied
        + c.write_dollars_per_byte * starts_stay)


def cost_parts(c: StorageCosts, fbytes, keep, next_gap, starts_stay, tail: float):
    """Write, read and occupancy $ of each access's interval (time-to-live schedule;
    ``fbytes``: float64 bytes, ``tail``: the horizon if finite, else 0)."""
    write_acc = fbytes * c.write_dollars_per_byte * starts_stay
    read_acc = fbytes * c.read_dollars_per_byte * keep
    occ_acc = fbytes * c.occupancy_dollars_per_byte_second * np.where(keep, next_gap, tail)
    return write_acc, read_acc, occ_acc


def clairvoyant_interval(dollars_per_hour: float, interval_gain, read_acc, occ_acc, keep):
    """Net $ of keeping each access's interval, before the write (the keep/drop
    programme's input)."""
    return interval_gain * (dollars_per_hour / 3600.0) - read_acc - np.where(keep, occ_acc, 0.0)
