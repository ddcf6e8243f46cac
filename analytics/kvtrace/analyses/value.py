"""Future-reuse value of keeping KV blocks (``kvtrace value``; DESIGN §2, seed §9).

Seed §9: a cached block is worth *expected future reuses x the compute each reuse
avoids - write, read and occupancy costs*; one-shot long prompts can fill capacity and
never come back, while a medium prefix reused often can be worth more per byte.

Two per-access quantities, both clairvoyant (they read the future of the trace):

**Window value** (``FutureReuse.value_usd``): the value of storing the block right
after access ``t`` for the horizon ``H``. Its reuses are the later accesses of the block
whose gap ``ts[u] - ts[t]`` is at most ``H`` (ties count, see
:mod:`kvtrace.kernels.future`)::

    gain  = GPU $ of the prefill FLOPs of those reuses (a*k + b*q of each reuse's own
            tokens at its own position; with chained hashes this is reuses x the
            compute of the block at t)
    hold  = time from t to the last of those reuses; with no reuse, H if H is finite
            (a block nothing reuses is dropped when its time-to-live runs out) else 0
            (an infinite horizon only keeps a block as long as it is needed)
    value = gain - bytes x (write + read x reuses + occupancy x hold)

Every window value pays one write: it prices the decision "store the block now" on
its own. It is the score for a clairvoyant ``value >= v`` admission policy. Windows of
successive accesses overlap (a reuse lies in the window of every earlier access within
``H``), so window values must not be summed.

**Interval value** (``FutureReuse.interval_value_usd``): the decomposition of one
schedule, *keep every block for H after its latest access* (a time-to-live cache of
unbounded capacity; with ``H = inf``, keep each block until its last access), into
disjoint per-access parts that sum to the block's net value under that schedule::

    interval value of t = [next access within H] x (gain of the next access
                                                    - bytes x (read + occupancy x gap))
                        + [no next access within H] x (- bytes x occupancy x H')
                        + [t starts a stay in the store] x (- bytes x write)

where ``H' = H`` if finite else 0 and an access *starts a stay* when its previous
access is not within ``H`` (or it is the block's first). The per-block and per-prefix
``total_value_usd`` are sums of interval values.

**Clairvoyant bound** (``clairvoyant_value_usd``): the best net value any
keep/drop schedule can reach with unbounded capacity, when a block may only be kept
across gaps of at most ``H`` (so that bound and schedule see the same reuses): per
block, the best subset of its keepable intervals, each maximal run of kept intervals
paying one write (:func:`kvtrace.kernels.future.best_keep_value`). With free writes it
is the sum over keepable intervals of max(0, gain of the next access - bytes x (read +
occupancy x gap)); it is always >= max(0, total value). (A sum of positive *window*
values is no bound: it counts a reuse once for every earlier access whose window holds
it.)

Units: bytes = tokens a block occupies in a cache (its largest size in the trace) x
KV bytes per token; seconds from trace start; $ at the GPU's $/GPU-hour. Costs are
per byte (write, read) and per byte-second (occupancy); see :class:`StorageCosts`.
Not modelled: expiry or model-switch probability, compression, replicas.

**Prefix families below the shared root.** When (almost) every request starts with
the same blocks (a system prompt; on the Mooncake traces every request starts with
hash 0), grouping blocks by their request's position-0 block gives one family. So
families are rooted below the *shared root* (:func:`shared_root`): the longest run of
leading positions p = 0, 1, ... at each of which one block is the position-p block
of at least :data:`kvtrace.analyses.curves.SHARED_FIRST_BLOCK_SHARE` (99 %) of the non-empty
requests that have a position p (are longer than p blocks). Its depth k may be 0 (no
shared root: the families are those of position 0, as before). A block's family
root is the block at position k of the request in which the block first appears; the
*shared family*, labelled with the shared root's first block, holds the shared-root
blocks themselves, the blocks whose request (where they first appear) is no longer
than k blocks, and the blocks whose position-k block is itself a shared-root block
(only with repeated hashes). The summary names the skipped root
(``shared_root_hashes``, ``shared_root_blocks``, ``shared_root_request_share``).
With k = 1 at p = 0 the test is the one behind ``kvtrace curve``'s shared-first-block
note (:func:`kvtrace.analyses.curves.shared_first_block`).

Per-block table (``ValueResult.per_block``, one row per dense block id, ascending):

==========================  ========  ===================================================
block                       int64     dense block id
hash                        uint64    source hash of the block
root_block                  int64     its prefix family: the block at position k (the
                                      shared root's depth, 0 without one) of the
                                      request in which the block first appears; the
                                      shared root's first block for the shared family
first_seen_s                float64   arrival of its first access, seconds
last_seen_s                 float64   arrival of its last access, seconds
accesses                    int64     accesses in the trace
reused                      bool      accessed more than once (at any distance)
horizon_hits                int64     accesses whose previous access is within H (hits
                                      of the time-to-live schedule)
bytes                       int64     bytes the block occupies
gain_gpu_seconds            float64   GPU-seconds of prefill the schedule avoids
cost_usd                float64   write + read + occupancy cost of the schedule, $
total_value_usd         float64   sum of its interval values, $ (gain $ - cost)
value_usd_per_byte              float64   total_value_usd / bytes, $ per byte
clairvoyant_value_usd   float64   best keep/drop schedule value, $ (>= 0)
==========================  ========  ===================================================

Per-prefix table (``ValueResult.per_prefix``, one row per root block, sorted by
``total_value_usd`` descending, then ``root_block``): ``root_block`` int64 ·
``root_hash`` uint64 · ``blocks`` int64 (blocks of the family) · ``bytes`` int64 ·
``accesses`` int64 · ``never_reused_bytes`` int64 (bytes of its blocks accessed once) ·
``gain_gpu_seconds`` float64 · ``total_value_usd`` float64 ($) · ``value_usd_per_byte``
float64 ($/byte) · ``clairvoyant_value_usd`` float64 ($). With a shared root, the
shared family's row is the one whose ``root_hash`` is ``shared_root_hashes[0]``.

Summary (``ValueResult.summary``; units in the key names): see :func:`value_report`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np
import polars as pl

from kvtrace.analyses.curves import SHARED_FIRST_BLOCK_SHARE, dominant_block
from kvtrace.errors import KvtraceError, UsageError
from kvtrace.kernels.future import best_keep_value, future_windows
from kvtrace.model import GpuSpec, ModelSpec, resolve_gpu, resolve_model
from kvtrace.trace import Trace
from kvtrace.units import parse_duration

if TYPE_CHECKING:
    from kvtrace.ingest.stream import StreamedTrace
    from kvtrace.analyses.value_stream import StreamedFutureReuse

__all__ = [
    "DEFAULT_COSTS",
    "DEFAULT_HORIZON_S",
    "FutureReuse",
    "QUANTILES",
    "StorageCosts",
    "ValueResult",
    "future_reuse",
    "parse_horizon",
    "shared_root",
    "value_report",
]

#: Default horizon, seconds: reuses more than an hour away are not counted. An hour
#: covers a conversation's follow-up turns and an agent's tool calls; pass ``inf`` to
#: count every later reuse.
DEFAULT_HORIZON_S = 3600.0

#: Quantiles of the value-density distribution reported in the summary.
QUANTILES = (0.10, 0.25, 0.50, 0.75, 0.90, 0.99)

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


def shared_root(req_start: np.ndarray, block: np.ndarray) -> tuple[np.ndarray, float | None]:
    """The shared root of a trace (module docstring) and the share of requests carrying it.

    Parameters
    ----------
    req_start : int[R + 1]
        Request offsets into the access table.
    block : int[N] array or memory map
        Dense block id of every access; only the requests' leading positions are read.

    Returns
    -------
    root : int64[k]
        Dense ids of the blocks at positions 0 .. k - 1; empty (k = 0) when no block
        reaches :data:`kvtrace.analyses.curves.SHARED_FIRST_BLOCK_SHARE` at position 0.
    request_share : float or None
        Share of the non-empty requests whose first k blocks are the root (requests
        shorter than k blocks do not carry it); None when k = 0.

    Each position costs a gather and an O(n) selection over the requests longer than
    it, so all positions together read at most every access once.
    """
    assert SHARED_FIRST_BLOCK_SHARE > 0.5  # dominant_block is exact above one half
    rs = np.asarray(req_start, dtype=np.int64)
    length = np.diff(rs)
    nonempty = np.flatnonzero(length > 0)
    start, length = rs[:-1][nonempty], length[nonempty]
    carries = np.ones(nonempty.shape[0], dtype=bool)
    reach = np.arange(nonempty.shape[0])  # the non-empty requests longer than p blocks
    root: list[int] = []
    while reach.shape[0]:
        p = len(root)
        at = np.asarray(block[start[reach] + p]).astype(np.int64, copy=False)
        candidate, share = dominant_block(at)
        if share < SHARED_FIRST_BLOCK_SHARE:
            break
        same = at == candidate
        root.append(candidate)
        carries[reach[~same]] = False
        reach = reach[length[reach] > p + 1]
    if not root:
        return np.empty(0, dtype=np.int64), None
    carries &= length >= len(root)
    return np.array(root, dtype=np.int64), float(np.count_nonzero(carries)) / carries.shape[0]


def family_roots(first_request: np.ndarray, req_start: np.ndarray, block: np.ndarray, root: np.ndarray,
                 dtype=np.int64, chunk: int = 1 << 22) -> np.ndarray:
    """Each block's prefix family (the per-block ``root_block``; module docstring).

    Parameters
    ----------
    first_request : int[M]
        The request in which each dense block first appears.
    req_start : int[R + 1]
        Request offsets into the access table.
    block : int[N] array or memory map
        Dense block id of every access.
    root : int64[k]
        The shared root (:func:`shared_root`).
    dtype : numpy dtype
        Of the result (int64, or int32 for a streamed trace with fewer than 2**31 blocks).

    Returns
    -------
    ``dtype[M]``: the block at position k of each block's first request, or
    ``root[0]`` for the shared family. Made ``chunk`` blocks at a time (a few
    chunk-size temporaries).
    """
    M, k = first_request.shape[0], root.shape[0]
    out = np.empty(M, dtype=dtype)
    for lo in range(0, M, chunk):
        r = first_request[lo:lo + chunk].astype(np.int64)
        start = req_start[r]
        if k == 0:
            out[lo:lo + r.shape[0]] = block[start]
            continue
        family = np.full(r.shape[0], root[0], dtype=np.int64)
        longer = req_start[r + 1] - start > k
        family[longer] = block[start[longer] + k]
        family[np.isin(family, root)] = root[0]  # a position-k block of the shared root (repeated hashes)
        out[lo:lo + r.shape[0]] = family
    if k:
        out[root] = root[0]
    return out


@dataclass
class FutureReuse:
    """Output of :func:`future_reuse`: per-access arrays, all in trace order (length N).

    Attributes
    ----------
    block : int64[N]
        Dense block id (the trace's access table, not a copy).
    timestamp : float64[N]
        Arrival of the access's request, seconds.
    next_t : int64[N]
        Index of the next access of the same block; -1 for none.
    next_gap_s : float64[N]
        Seconds to the next access; inf for none.
    reuses : int64[N]
        Later accesses of the block within the horizon (gap <= horizon, ties count).
    last_reuse_t : int64[N]
        Index of the last of those reuses; -1 when ``reuses == 0``.
    hold_s : float64[N]
        Seconds the window value holds the block: to the last reuse; with none, the
        horizon if finite, else 0.
    reuse_tokens : int64[N]
        Tokens of those reuses.
    bytes : int64[N]
        Bytes the block occupies (its cache size in tokens x KV bytes per token).
    gain_gpu_seconds : float64[N]
        GPU-seconds of prefill the reuses within the horizon avoid.
    gain_usd : float64[N]
        The same in $.
    cost_usd : float64[N]
        ``bytes x (write + read x reuses + occupancy x hold_s)``, $.
    value_usd : float64[N]
        Window value ``gain_usd - cost_usd``, $: the clairvoyant admission
        score (a ``value >= v`` policy admits a block when the value of its latest
        access reaches ``v``). Windows overlap; do not sum.
    interval_gain_gpu_seconds : float64[N]
        GPU-seconds the *next* access avoids when it is within the horizon, else 0.
    interval_value_usd : float64[N]
        Interval value, $ (module docstring); sums to the block's total value.
    starts_stay : bool[N]
        The access starts a stay of the time-to-live schedule (its previous access is
        not within the horizon, or it has none): the block is written here. The other
        accesses are the schedule's hits.
    horizon_s : float
        The horizon, seconds (inf allowed).
    costs : StorageCosts
    info : dict
        Model, GPU and KV bytes per token used.
    """

    block: np.ndarray
    timestamp: np.ndarray
    next_t: np.ndarray
    next_gap_s: np.ndarray
    reuses: np.ndarray
    last_reuse_t: np.ndarray
    hold_s: np.ndarray
    reuse_tokens: np.ndarray
    bytes: np.ndarray
    gain_gpu_seconds: np.ndarray
    gain_usd: np.ndarray
    cost_usd: np.ndarray
    value_usd: np.ndarray
    interval_gain_gpu_seconds: np.ndarray
    interval_value_usd: np.ndarray
    starts_stay: np.ndarray
    horizon_s: float
    costs: StorageCosts
    info: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.block.shape[0])

    @property
    def keepable(self) -> np.ndarray:
        """bool[N]: the next access is within the horizon (``reuses > 0``)."""
        return self.reuses > 0

    def table(self) -> pl.DataFrame:
        """The per-access arrays as a table (for Parquet / SQL), one row per access.

        Columns: ``t`` int64 (access index) · ``block`` · ``timestamp`` · and every
        array attribute above under its name (units as documented there).
        """
        n = len(self)
        return pl.DataFrame(
            {
                "t": np.arange(n, dtype=np.int64),
                "block": self.block.astype(np.int64, copy=False),
                "timestamp": self.timestamp,
                "next_t": self.next_t,
                "next_gap_s": self.next_gap_s,
                "reuses": self.reuses,
                "last_reuse_t": self.last_reuse_t,
                "hold_s": self.hold_s,
                "reuse_tokens": self.reuse_tokens,
                "bytes": self.bytes,
                "gain_gpu_seconds": self.gain_gpu_seconds,
                "gain_usd": self.gain_usd,
                "cost_usd": self.cost_usd,
                "value_usd": self.value_usd,
                "interval_gain_gpu_seconds": self.interval_gain_gpu_seconds,
                "interval_value_usd": self.interval_value_usd,
                "starts_stay": self.starts_stay,
            }
        )

    def write_table(self, path: str | os.PathLike, metadata: dict | None = None) -> None:
        """Write :meth:`table` atomically (.parquet, .csv or .json; see
        :func:`kvtrace.outputs.write_table`)."""
        from kvtrace.outputs import write_table

        write_table(self.table(), path, metadata=metadata)


def _resolve(model, gpu) -> tuple[ModelSpec, GpuSpec]:
    m = model if isinstance(model, ModelSpec) else resolve_model(model)
    g = gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu)
    return m, g


def future_reuse(
    trace: Trace,
    *,
    model: ModelSpec | str | None = None,
    gpu: GpuSpec | str | None = None,
    horizon_s: float | str | None = DEFAULT_HORIZON_S,
    costs: StorageCosts | None = None,
) -> FutureReuse:
    """Next access, reuses within a horizon and the value of keeping every access's block.

    Parameters
    ----------
    trace : Trace
    model : ModelSpec or str, optional
        Sets KV bytes per token and prefill FLOPs (default Llama-3.1-70B).
    gpu : GpuSpec or str, optional
        Turns FLOPs into GPU-seconds and $ (default H100).
    horizon_s : float or str, optional
        Horizon, seconds (``inf`` = unbounded), or a duration such as ``1h``. Default
        :data:`DEFAULT_HORIZON_S`.
    costs : StorageCosts, optional
        Write, read and occupancy costs; default :data:`DEFAULT_COSTS` (illustrative
        flash tier). ``StorageCosts()`` values the avoided compute alone.

    Returns
    -------
    FutureReuse
        Per-access arrays in trace order (see its attributes and the module docstring).
    """
    m, g, horizon, c = _setup(model, gpu, horizon_s, costs)
    a = trace.accesses
    ts = trace.access_timestamp.astype(np.float64, copy=False)
    if ts.size > 1 and np.any(np.diff(ts) < 0):
        raise KvtraceError("access timestamps must be non-decreasing in trace order", field="timestamp")
    B = int(trace.meta.block_tokens)
    k = a.tokens.astype(np.int64)
    start = a.pos.astype(np.int64) * B
    q = k * start + k * (k - 1) // 2  # position-token sum, exact in int64
    next_t, next_gap, reuses, last_t, last_gap, reuse_tokens, reuse_q = future_windows(
        a.block.astype(np.int64, copy=False), ts, k, q, trace.n_blocks, horizon)

    bpt = int(m.kv_bytes_per_token)
    nbytes = trace.block_size.astype(np.int64)[a.block] * bpt

    # the time-to-live schedule's interval of t ends at its next access if within H
    keep = reuses > 0
    own_s = _prefill_gpu_seconds(m, g, k, q)
    interval_gain = np.zeros(ts.shape[0], dtype=np.float64)
    interval_gain[keep] = own_s[next_t[keep]]
    starts_stay = np.ones(ts.shape[0], dtype=bool)
    starts_stay[next_t[keep]] = False
    hold, gain_s, gain_d, cost, value, interval_value = _access_values(
        m, g, c, horizon, nbytes, reuses, last_gap, reuse_tokens, reuse_q, next_gap, interval_gain, starts_stay)

    return FutureReuse(
        block=a.block, timestamp=ts, next_t=next_t, next_gap_s=next_gap, reuses=reuses, last_reuse_t=last_t,
        hold_s=hold, reuse_tokens=reuse_tokens, bytes=nbytes, gain_gpu_seconds=gain_s, gain_usd=gain_d,
        cost_usd=cost, value_usd=value, interval_gain_gpu_seconds=interval_gain,
        interval_value_usd=interval_value, starts_stay=starts_stay, horizon_s=horizon, costs=c,
        info=_info(m, g),
    )


def _setup(model, gpu, horizon_s, costs) -> tuple[ModelSpec, GpuSpec, float, StorageCosts]:
    """Resolved model, GPU, horizon (seconds) and costs of :func:`future_reuse`."""
    m, g = _resolve(model, gpu)
    horizon = parse_horizon(horizon_s)
    c = DEFAULT_COSTS if costs is None else costs
    if not isinstance(c, StorageCosts):
        raise UsageError(f"expected StorageCosts, got {type(c).__name__}", field="costs")
    return m, g, horizon, c


def _info(m: ModelSpec, g: GpuSpec) -> dict:
    return {"model": m.name, "kv_bytes_per_token": int(m.kv_bytes_per_token), "gpu": g.name,
            "gpu_dollars_per_hour": g.dollars_per_hour, "gpu_effective_flops": g.effective_flops}


def _prefill_gpu_seconds(m: ModelSpec, g: GpuSpec, tokens: np.ndarray, pos_token_sum: np.ndarray) -> np.ndarray:
    """GPU-seconds of ``a*k + b*q`` prefill FLOPs, elementwise (int64 token counts and
    position-token sums in)."""
    coef_a, coef_b = m.flops_coefficients()
    return g.gpu_seconds(coef_a * tokens.astype(np.float64) + coef_b * pos_token_sum.astype(np.float64))


def _access_values(m, g, c, horizon, nbytes, reuses, last_gap, reuse_tokens, reuse_q, next_gap, interval_gain,
                   starts_stay):
    """The per-access float columns of :class:`FutureReuse` from the window counts, all
    elementwise, so a streamed run computes them chunk by chunk with the same bits:
    (hold_s, gain_gpu_seconds, gain_usd, cost_usd, value_usd,
    interval_value_usd)."""
    fbytes = nbytes.astype(np.float64)
    hold, gain_s, gain_d, cost, value = _window_values(m, g, c, horizon, fbytes, reuses, last_gap, reuse_tokens,
                                                       reuse_q)
    interval_value = _interval_values(g, c, horizon, fbytes, reuses > 0, next_gap, interval_gain, starts_stay)
    return hold, gain_s, gain_d, cost, value, interval_value


def _window_values(m, g, c, horizon, fbytes, reuses, last_gap, reuse_tokens, reuse_q):
    """Window value columns of :func:`_access_values` (``fbytes``: float64 bytes):
    (hold_s, gain_gpu_seconds, gain_usd, cost_usd, value_usd)."""
    tail = horizon if math.isfinite(horizon) else 0.0
    gain_s = _prefill_gpu_seconds(m, g, reuse_tokens, reuse_q)
    gain_d = gain_s * (g.dollars_per_hour / 3600.0)
    hold = np.where(reuses > 0, last_gap, tail)
    cost = fbytes * (c.write_dollars_per_byte + c.read_dollars_per_byte * reuses
                     + c.occupancy_dollars_per_byte_second * hold)
    return hold, gain_s, gain_d, cost, gain_d - cost


def _interval_values(g, c, horizon, fbytes, keep, next_gap, interval_gain, starts_stay):
    """Interval value of :func:`_access_values` (the time-to-live schedule, split by
    access; ``keep``: ``reuses > 0``), $."""
    tail = horizon if math.isfinite(horizon) else 0.0
    occupied = np.where(keep, next_gap, tail)
    return interval_gain * (g.dollars_per_hour / 3600.0) - fbytes * (
        c.read_dollars_per_byte * keep + c.occupancy_dollars_per_byte_second * occupied
        + c.write_dollars_per_byte * starts_stay)


@dataclass
class ValueResult:
    """Output of :func:`value_report` (schemas in the module docstring).

    Attributes
    ----------
    per_block : polars.DataFrame
        One row per block. A streamed trace's is built on first use (it alone holds
        about 105 bytes per block), partly from columns its report left on disk.
    per_prefix : polars.DataFrame
        One row per root prefix, most valuable first.
    summary : dict
        Scalar figures, units in the key names (see :func:`value_report`).
    future : FutureReuse or StreamedFutureReuse
        The per-access arrays the tables were built from; for a streamed trace, what
        writes them chunk by chunk (:class:`kvtrace.analyses.value_stream.StreamedFutureReuse`).
        Both have ``write_table(path, metadata)``.
    """

    _per_block: pl.DataFrame | Callable[[], pl.DataFrame]  # a builder until first read
    per_prefix: pl.DataFrame
    summary: dict
    future: FutureReuse | StreamedFutureReuse

    @property
    def per_block(self) -> pl.DataFrame:
        if not isinstance(self._per_block, pl.DataFrame):
            self._per_block = self._per_block()
        return self._per_block

    def top_prefixes(self, n: int = 10) -> pl.DataFrame:
        """The ``n`` root prefixes of highest total value."""
        return self.per_prefix.head(n)

    def to_dict(self, top: int = 10) -> dict:
        """Summary and the ``top`` prefixes, JSON-ready (non-finite floats: use
        :func:`kvtrace.outputs.write_json_atomic`, which writes them as null)."""
        return {"summary": self.summary, "top_prefixes": self.top_prefixes(top).to_dicts()}


def _weighted_quantiles(x: np.ndarray, weight: Callable[[np.ndarray], np.ndarray], total_weight: int, qs,
                        chunk: int = 1 << 22) -> dict:
    """Inverted-CDF quantiles of ``x`` weighted by ``weight(indices)`` (integers >= 0,
    summing to ``total_weight``): the smallest x whose cumulative weight reaches
    q x total.

    The cumulative weight is ``np.cumsum(w[order].astype(np.float64))`` with ``order``
    the stable ascending order of ``x``, made chunk by chunk with the same additions
    in the same order (a chunk's first value is added to the previous chunk's last),
    read twice (its last value, then the positions of the quantiles): one per-block
    array (``order``) instead of three.
    """
    if x.size == 0 or total_weight <= 0:
        return {f"p{round(100 * q)}": None for q in qs}
    order = np.argsort(x, kind="stable")

    def cumulative():
        carry = None
        for lo in range(0, order.shape[0], chunk):
            part = weight(order[lo:lo + chunk]).astype(np.float64)
            if carry is not None:
                part[0] += carry
            np.cumsum(part, out=part)
            carry = part[-1]
            yield lo, part

    for _, part in cumulative():
        last = part[-1]
    targets = [q * last for q in qs]
    found = [x.size] * len(qs)  # np.searchsorted's answer when no value reaches the target
    for lo, part in cumulative():
        for k, target in enumerate(targets):
            if found[k] == x.size and part[-1] >= target:
                found[k] = lo + int(np.searchsorted(part, target, side="left"))
        if all(f < x.size for f in found):
            break
    return {f"p{round(100 * q)}": float(x[order[min(i, x.size - 1)]]) for q, i in zip(qs, found)}


def value_report(
    trace: Trace | StreamedTrace,
    *,
    model: ModelSpec | str | None = None,
    gpu: GpuSpec | str | None = None,
    horizon_s: float | str | None = None,
    costs: StorageCosts | None = None,
    future: FutureReuse | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ValueResult:
    """Per-block and per-prefix future-reuse value of a trace, and a summary.

    Parameters
    ----------
    trace : Trace or StreamedTrace
        A streamed trace (:func:`kvtrace.ingest.stream.open_stream`) is valued chunk by chunk
        (:mod:`kvtrace.analyses.value_stream`) with the same results bit for bit; its
        ``ValueResult.future`` is then a :class:`kvtrace.analyses.value_stream.StreamedFutureReuse`
        (per-access arrays are not held: it writes them chunk by chunk).
    model, gpu, horizon_s, costs
        As for :func:`future_reuse` (None: the same defaults).
    future : FutureReuse, optional
        Reuse an already computed :func:`future_reuse` of this trace (then ``model``,
        ``gpu``, ``horizon_s`` and ``costs`` are taken from it and must not be given).
        Not for a streamed trace.
    progress : callable, optional
        ``progress(done, total)`` during the passes of a streamed trace.

    Returns
    -------
    ValueResult
        Tables as in the module docstring; ``summary`` keys:

        - ``model``, ``kv_bytes_per_token`` (bytes), ``gpu``, ``gpu_dollars_per_hour``,
          ``horizon_s`` (None = infinite), the costs (:meth:`StorageCosts.to_dict`);
        - ``accesses``, ``blocks``, ``prefixes`` (prefix families, the shared one
          included), ``distinct_bytes``;
        - ``shared_root_blocks`` (its depth k, 0: none), ``shared_root_hashes`` (the
          source hashes of its blocks, position 0 first; [] for none),
          ``shared_root_request_share`` (share of the non-empty requests whose first k
          blocks are the shared root; None for none): the root the prefix families
          are grouped below (:func:`shared_root`);
        - ``never_reused_blocks``, ``never_reused_bytes``, ``never_reused_bytes_share``
          (share of distinct bytes in blocks accessed once: one-shot prompts),
          ``never_reused_access_share`` (share of accesses that touch such blocks),
          ``no_reuse_in_horizon_access_share`` (share of accesses with no reuse
          within the horizon);
        - ``gain_gpu_seconds``, ``gain_usd``, ``write_cost_usd``,
          ``read_cost_usd``, ``occupancy_cost_usd``, ``total_value_usd``
          (= gain - the three costs) of the time-to-live schedule;
        - ``clairvoyant_bound_usd``: sum of the per-block best schedules;
        - ``negative_value_bytes_share``: share of distinct bytes in blocks whose total
          value is < 0; ``positive_window_value_access_share``: share of accesses with
          a window value > 0 (what a ``value > 0`` admission would store);
        - ``value_usd_per_byte_quantiles``: {"p10", "p25", "p50", "p75", "p90", "p99"} of
          the blocks' ``value_usd_per_byte`` ($/byte), weighted by bytes (inverted CDF:
          the smallest density such that that share of the bytes is at or below it).

        Shares and quantiles are None for a trace without accesses.
    """
    from kvtrace.ingest.stream import StreamedTrace

    if isinstance(trace, StreamedTrace):
        from kvtrace.analyses.value_stream import streamed_value_report

        if future is not None:
            raise UsageError("a streamed trace computes its own future reuse: do not pass one", field="future")
        return streamed_value_report(trace, model=model, gpu=gpu, horizon_s=horizon_s, costs=costs,
                                     progress=progress)
    if future is None:
        fr = future_reuse(trace, model=model, gpu=gpu, horizon_s=horizon_s, costs=costs)
    else:
        if any(x is not None for x in (model, gpu, horizon_s, costs)):
            raise UsageError("pass either a computed FutureReuse or model/gpu/horizon/costs, not both",
                             field="future")
        if len(future) != trace.n_accesses:
            raise UsageError("the FutureReuse was computed on another trace", field="future")
        fr = future
    c = fr.costs
    a = trace.accesses
    M, N = trace.n_blocks, trace.n_accesses
    block = a.block.astype(np.int64, copy=False)
    tail = fr.horizon_s if math.isfinite(fr.horizon_s) else 0.0
    bpt = int(fr.info["kv_bytes_per_token"])

    accesses = np.bincount(block, minlength=M).astype(np.int64)
    first_t = np.full(M, -1, dtype=np.int64)
    first_t[block[::-1]] = np.arange(N - 1, -1, -1, dtype=np.int64)
    last_t = np.full(M, -1, dtype=np.int64)
    last_t[block] = np.arange(N, dtype=np.int64)
    first_request = a.request[first_t]
    shared = shared_root(a.req_start, block)
    root = family_roots(first_request, a.req_start, block, shared[0])
    bytes_b = trace.block_size.astype(np.int64) * bpt

    keep = fr.keepable
    write_acc, read_acc, occ_acc = _cost_parts(c, fr.bytes, keep, fr.next_gap_s, fr.starts_stay, tail)

    def per_block(x) -> np.ndarray:
        return np.bincount(block, weights=x, minlength=M).astype(np.float64)

    gain_s = per_block(fr.interval_gain_gpu_seconds)
    cost = per_block(write_acc + read_acc + occ_acc)
    total = per_block(fr.interval_value_usd)
    clair_interval = _clairvoyant_interval(fr.info, fr.interval_gain_gpu_seconds, read_acc, occ_acc, keep)
    clair = best_keep_value(block, M, keep, clair_interval, _write_cost(c, bytes_b))
    req_ts = trace.request_timestamp
    blocks = {
        "root_block": root.astype(np.int64),
        "first_seen_s": req_ts[first_request],
        "last_seen_s": req_ts[a.request[last_t]],
        "accesses": accesses,
        "horizon_hits": np.bincount(block, weights=~fr.starts_stay, minlength=M).astype(np.int64),
        "gain_gpu_seconds": gain_s,
        "cost_usd": cost,
        "total_value_usd": total,
        "clairvoyant_value_usd": clair,
    }
    sums = {
        "write_cost_usd": float(write_acc.sum()),
        "read_cost_usd": float(read_acc.sum()),
        "occupancy_cost_usd": float(occ_acc.sum()),
        "no_reuse": int(np.count_nonzero(~keep)),
        "positive_window_value": int(np.count_nonzero(fr.value_usd > 0)),
    }
    per_prefix_df, summary = _tables(trace, fr, N, blocks, sums, shared)
    return ValueResult(_block_table(trace, bpt, blocks), per_prefix_df, summary, fr)


def _cost_parts(c: StorageCosts, nbytes, keep, next_gap, starts_stay, tail: float):
    """Write, read and occupancy $ of each access's interval (time-to-live schedule)."""
    fbytes = nbytes.astype(np.float64)
    write_acc = fbytes * c.write_dollars_per_byte * starts_stay
    read_acc = fbytes * c.read_dollars_per_byte * keep
    occ_acc = fbytes * c.occupancy_dollars_per_byte_second * np.where(keep, next_gap, tail)
    return write_acc, read_acc, occ_acc


def _clairvoyant_interval(info: dict, interval_gain, read_acc, occ_acc, keep):
    """Net $ of keeping each access's interval, before the write (best_keep_value's input)."""
    return interval_gain * (info["gpu_dollars_per_hour"] / 3600.0) - read_acc - np.where(keep, occ_acc, 0.0)


def _write_cost(c: StorageCosts, bytes_b: np.ndarray) -> np.ndarray:
    return bytes_b.astype(np.float64) * c.write_dollars_per_byte


def _block_bytes(trace, bpt: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """int64 bytes of blocks ``lo .. hi - 1``: cache size in tokens x KV bytes per token."""
    return trace.block_size[lo:hi].astype(np.int64) * bpt


def _block_table(trace, bpt: int, blocks: dict) -> pl.DataFrame:
    """The per-block table (module docstring) from per-block arrays (``blocks``:
    root_block, first_seen_s, last_seen_s, accesses, horizon_hits (int64),
    gain_gpu_seconds, cost_usd, total_value_usd, clairvoyant_value_usd)."""
    M = trace.n_blocks
    bytes_b = _block_bytes(trace, bpt)
    accesses, total = blocks["accesses"], blocks["total_value_usd"]
    return pl.DataFrame(
        {
            "block": np.arange(M, dtype=np.int64),
            "hash": trace.block_hash.astype(np.uint64),
            "root_block": blocks["root_block"],
            "first_seen_s": blocks["first_seen_s"],
            "last_seen_s": blocks["last_seen_s"],
            "accesses": accesses,
            "reused": accesses > 1,
            "horizon_hits": blocks["horizon_hits"],
            "bytes": bytes_b,
            "gain_gpu_seconds": blocks["gain_gpu_seconds"],
            "cost_usd": blocks["cost_usd"],
            "total_value_usd": total,
            "value_usd_per_byte": total / bytes_b,  # bytes >= 1: a block holds >= 1 token of >= 1 byte
            "clairvoyant_value_usd": blocks["clairvoyant_value_usd"],
        },
        schema_overrides={"first_seen_s": pl.Float64, "last_seen_s": pl.Float64},
    )


def _tables(trace, fr, N: int, blocks: dict, sums: dict, shared: tuple, chunk: int = 1 << 22):
    """The per-prefix table and the summary from per-block arrays (``blocks``:
    root_block and accesses (int32 or int64), gain_gpu_seconds, total_value_usd,
    clairvoyant_value_usd), per-access totals (``sums``) and the shared root
    (``shared``: :func:`shared_root`'s result); shared by the
    in-memory and streamed runs. Beyond its inputs it holds at most about three
    per-block arrays at a time (the value densities and their order; then the bytes
    and the per-prefix frame's int64 columns): a streamed trace holds little else."""
    c = fr.costs
    M = trace.n_blocks
    bpt = int(fr.info["kv_bytes_per_token"])
    accesses, gain_s, total = blocks["accesses"], blocks["gain_gpu_seconds"], blocks["total_value_usd"]
    clair = blocks["clairvoyant_value_usd"]
    dollars_per_gpu_s = fr.info["gpu_dollars_per_hour"] / 3600.0

    # value density (as the per-block table's value_usd_per_byte) and its quantiles over bytes
    density = np.empty(M, dtype=np.float64)
    for lo in range(0, M, chunk):
        density[lo:lo + chunk] = total[lo:lo + chunk] / _block_bytes(trace, bpt, lo, lo + chunk)
    distinct = sum(int(_block_bytes(trace, bpt, lo, lo + chunk).sum()) for lo in range(0, M, chunk))
    quantiles = _weighted_quantiles(density, lambda idx: trace.block_size[idx].astype(np.int64) * bpt, distinct,
                                    QUANTILES, chunk)
    del density

    bytes_b = _block_bytes(trace, bpt)
    families = (
        pl.DataFrame({"root_block": blocks["root_block"].astype(np.int64, copy=False), "bytes": bytes_b,
                      "accesses": accesses.astype(np.int64, copy=False), "reused": accesses > 1,
                      "gain_gpu_seconds": gain_s, "total_value_usd": total, "clairvoyant_value_usd": clair})
        .group_by("root_block")
        .agg(
            pl.len().cast(pl.Int64).alias("blocks"),
            pl.col("bytes").sum(),
            pl.col("accesses").sum(),
            pl.col("bytes").filter(~pl.col("reused")).sum().alias("never_reused_bytes"),
            pl.col("gain_gpu_seconds").sum(),
            pl.col("total_value_usd").sum(),
            pl.col("clairvoyant_value_usd").sum(),
        )
        .with_columns((pl.col("total_value_usd") / pl.col("bytes")).alias("value_usd_per_byte"))
    )
    per_prefix_df = (
        families.with_columns(
            pl.Series("root_hash", trace.block_hash[families["root_block"].to_numpy()], dtype=pl.UInt64))
        .select("root_block", "root_hash", "blocks", "bytes", "accesses", "never_reused_bytes", "gain_gpu_seconds",
                "total_value_usd", "value_usd_per_byte", "clairvoyant_value_usd")
        .sort(["total_value_usd", "root_block"], descending=[True, False])
    )

    once = accesses == 1

    def share(x, y):
        return float(x) / float(y) if y else None

    summary = {
        "model": fr.info["model"],
        "kv_bytes_per_token": bpt,
        "gpu": fr.info["gpu"],
        "gpu_dollars_per_hour": fr.info["gpu_dollars_per_hour"],
        "horizon_s": fr.horizon_s if math.isfinite(fr.horizon_s) else None,
        **c.to_dict(),
        "accesses": N,
        "blocks": M,
        "prefixes": per_prefix_df.height,
        "shared_root_blocks": int(shared[0].shape[0]),
        "shared_root_hashes": [int(h) for h in trace.block_hash[shared[0]]],
        "shared_root_request_share": shared[1],
        "distinct_bytes": distinct,
        "never_reused_blocks": int(once.sum()),
        "never_reused_bytes": int(bytes_b[once].sum()),
        "never_reused_bytes_share": share(bytes_b[once].sum(), distinct),
        "never_reused_access_share": share(once.sum(), N),
        "no_reuse_in_horizon_access_share": share(sums["no_reuse"], N),
        "gain_gpu_seconds": float(gain_s.sum()),
        "gain_usd": float(gain_s.sum() * dollars_per_gpu_s),
        "write_cost_usd": sums["write_cost_usd"],
        "read_cost_usd": sums["read_cost_usd"],
        "occupancy_cost_usd": sums["occupancy_cost_usd"],
        "total_value_usd": float(total.sum()),
        "clairvoyant_bound_usd": float(clair.sum()),
        "negative_value_bytes_share": share(bytes_b[total < 0].sum(), distinct),
        "positive_window_value_access_share": share(sums["positive_window_value"], N),
        "value_usd_per_byte_quantiles": quantiles,
    }
    return per_prefix_df, summary
