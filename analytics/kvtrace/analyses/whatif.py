"""Tier what-ifs (``kvtrace whatif``): DRAM over local SSD / shared flash, exactly.

:func:`simulate` replays a trace through one tier configuration (:class:`TierConfig`)
with the event simulator of :mod:`kvtrace.kernels.tiers` (its docstring states the
semantics in full); :func:`sweep` runs many configurations in parallel processes and
returns one comparison table. Capacities are given in bytes and simulated in tokens
(``bytes // kv_bytes_per_token``); a block occupies its cache size (its largest token
count in the trace).

Semantics decided here (beyond DESIGN §2)
-----------------------------------------
- **Same LRU model as the curve.** DRAM is an LRU of ``C_d`` under the prefix-aware
  (default) or flat model; with ``promote`` or ``copy`` it sees every touch, so on one
  node its hits equal the curve's ``H(C_d)`` whatever the admission policy, whenever
  ``C_d >= the largest block`` (below that the curve's stack model lets a too-large
  block flush the cache, while here it passes through DRAM, as in a real cache; a
  flash hit too large for DRAM is read in place, never promoted).
- **Request-atomic touches pin the request's blocks** (they are in use): they are not
  victims of the request's own inserts unless the request alone overflows DRAM; a
  block repeated in a request is touched once. With one block size and ``C_d >=`` one
  block, ``all`` + exclusive + ``promote`` + write-on-evict (LRU or FIFO flash: flash
  blocks are never touched in place) is exactly one LRU of ``C_d + C_f`` (of
  ``C_d + C_l + C_f`` with a local SSD). With mixed sizes and every tier holding the
  largest block, it hits every access the curve hits at ``C_d + C_f - (largest block
  - 1)`` tokens and none that it misses at ``C_d + C_f`` (DRAM's unused slack is under
  one block).
- **inclusive / exclusive** only restricts the options: exclusive allows ``promote``
  or ``none`` with write-on-evict (a block is then never in two tiers of a node's
  path); ``copy`` and write-through keep copies and need ``inclusive=True``.
  Across nodes a shared-flash block may also sit in another node's DRAM.
- **write-through** writes a miss to flash when it enters DRAM (if admitted); nothing
  is written at eviction. Under write-through, ``promote`` moves a flash hit out of
  flash for good.
- **Local SSD** (``local_ssd_bytes`` per node) is a tier between the node's DRAM and
  the shared flash: DRAM victims go to it, its victims to the shared flash, both
  through the admission policy. ``nodes=N, local_ssd_bytes=X`` vs ``nodes=N,
  flash_bytes=N*X`` compares the same flash bought as local SSDs or as one pool
  (:func:`local_vs_shared`).
- **Routing**: ``session`` (hash of ``session_id``, the request id when null),
  ``round-robin`` (trace order), ``prefix`` (hash of the first block's source hash;
  the request id for an empty request). Hash: splitmix64 of the key xor a fixed
  seed, modulo N.
- **reuse-oracle** (clairvoyant): a first pass runs the same configuration with
  ``all``; the policy then admits a write iff the block's next access was served from
  flash in that pass. With one block size, exclusive ``promote`` and write-on-evict it
  reproduces the admit-all hits exactly while writing only blocks that are read back
  (one write per block read back): the write floor at the admit-all hit rate. It
  costs two replays.
- **value>=v** reads a per-access value ($ of keeping the block after that access,
  :attr:`kvtrace.analyses.value.FutureReuse.value_usd`) at the block's latest access.
  ``value_captured`` sums the values of the writes made, ``value_bound`` the positive
  values over all write opportunities (what a perfect value filter would keep).
- **tinylfu**: count-min sketch, width = the power of two >= 4 x the flash capacity
  (shared + all local SSDs) in full blocks, capped at 4 x the trace's distinct blocks;
  strict ``>`` against the victim, no admission window (see the kernel docstring).
- **group>=p** (``group:type>=p``, ``group:tenant>=p``, ``group:turn>=p``): online
  re-reference probability of the group of the block's latest access, from the past
  only (Laplace prior 1/2).
- **Request shares.** A request counts in ``dram_request_hit_rate`` if its first block is
  served from DRAM (so it equals the curve's request hit rate at ``C_d``),
  ``local_request_hit_rate`` / ``flash_request_hit_rate`` if it is served from that tier, else
  ``request_miss_rate``. Token/byte/compute shares weight each usable-prefix block at the
  *deepest tier so far in its request* (DRAM alone would not have served a DRAM block
  that follows a flash block): ``h_dram = H(C_d)`` in every unit.
- **Response time** of a request's reusable prefix (the blocks before its first cold
  one): :func:`kvtrace.analyses.response.request_times` with the usable prefix's bytes read
  from DRAM and from flash (local SSD reads use the flash parameters), the prefill
  FLOPs of those flash blocks (restore-or-recompute deadline) and of the reusable
  blocks beyond the usable prefix (recomputed). Every request of a configuration with
  a flash tier pays the overhead O.

Summary (:attr:`WhatIfResult.summary`, one row per configuration in :func:`sweep`): the
columns of ``kvtrace.names.TABLES["whatif"]``, each with its unit. Per unit (``request``,
``token``, ``byte``, ``compute``) the DRAM, local SSD, flash and miss shares are
unconditional and sum to 1 (``names.tier_rate``, ``names.MISS_OF_UNIT``); DWPD divides a
tier's daily writes by its capacity (all nodes' SSDs for local); peaks are over windows
of ``window_s``.

Residency table (:attr:`WhatIfResult.residency`): ``tier`` (dram/local/flash) ·
``metric`` (``lifetime_s``: insert to exit by eviction or promotion;
``idle_before_eviction_s``: last touch to eviction; ``reuse_gap_s``: last touch to a
hit in the tier) · ``bin_lo_s``, ``bin_hi_s`` (octaves; last bin open, ``inf``) ·
``count``. Times are quantised to 2**-10 s (coarser for traces over 24 days);
blocks still resident at the end are not counted.

Request table (:attr:`WhatIfResult.requests`, measured requests): ``request`` (row of
the request table) · ``node`` · ``branch`` (deepest tier of its usable prefix, or
``miss``) · ``dram_bytes``, ``local_bytes``, ``flash_bytes`` (usable-prefix bytes
read) · ``flash_recompute_flops`` · ``miss_recompute_flops`` · ``service_time_ms``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import multiprocessing
import os
import re
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl
from numba import njit

from kvtrace import names
from kvtrace.config import NJIT
from kvtrace.analyses.curves import GROUPINGS, group_labels, parse_warmup, warmup_first_request
from kvtrace.analyses.distances import normalise_eviction
from kvtrace.errors import UsageError
from kvtrace.kernels import tiers as K
from kvtrace.kernels.memory import Scratch
from kvtrace.model import GpuSpec, ModelSpec, resolve_gpu, resolve_model
from kvtrace.analyses.response import ResponseModel, percentiles
from kvtrace.ingest.stream import StreamedTrace
from kvtrace.trace import Accesses, Trace
from kvtrace.units import format_bytes, parse_duration, parse_size

__all__ = ["Policy", "TierConfig", "WhatIfResult", "local_vs_shared", "parse_policy", "route", "simulate",
           "summary_table", "sweep"]

ROUTINGS = ("session", "round-robin", "prefix")
PROMOTIONS = {"promote": K.PROMOTE, "copy": K.COPY, "none": K.NO_PROMOTION}
FLASH_ORDERS = ("lru", "fifo")
WRITE_MODES = ("write-on-evict", "write-through")
MAX_NODES = 64
_ROUTE_SEED = 0xD6E8FEB86659FD93
_DAY_S = 86400.0


# --------------------------------------------------------------------------- policy


@dataclass(frozen=True)
class Policy:
    """A parsed admission policy.

    Attributes
    ----------
    kind : str
        ``all``, ``none``, ``freq``, ``prob``, ``idle``, ``value``, ``reuse-oracle``,
        ``tinylfu`` or ``group``.
    param : float
        k (freq, accesses), p (prob, probability), T (idle, seconds), v (value, $),
        threshold (group, probability); 0 otherwise.
    by : str or None
        Grouping of the ``group`` policy.
    """

    kind: str
    param: float = 0.0
    by: str | None = None

    @property
    def code(self) -> int:
        return {"all": K.P_ALL, "none": K.P_NONE, "freq": K.P_FREQ, "prob": K.P_PROB, "idle": K.P_IDLE,
                "value": K.P_VALUE, "reuse-oracle": K.P_ORACLE, "tinylfu": K.P_TINYLFU,
                "group": K.P_GROUP}[self.kind]

    def __str__(self) -> str:
        if self.kind == "freq":
            return f"freq>={int(self.param)}"
        if self.kind == "prob":
            return f"prob:{self.param:g}"
        if self.kind == "idle":
            return f"idle<{self.param:g}s"
        if self.kind == "value":
            return f"value>={self.param:g}"
        if self.kind == "group":
            return f"group:{self.by}>={self.param:g}"
        return self.kind


_FLOAT = r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)"


def parse_policy(text: str, *, group_by: str = "type") -> Policy:
    """Parse an admission policy.

    ``all`` · ``none`` · ``freq>=k`` (``second-hit`` = ``freq>=2``) · ``prob:p`` ·
    ``idle<T`` (a duration: ``90s``, ``10min``) · ``value>=v`` ($, may be negative) ·
    ``reuse-oracle`` · ``tinylfu`` · ``group>=p`` / ``group:BY>=p`` (BY in type,
    tenant, turn, session-length; default ``group_by``).

    Each comparison has a spelling a shell leaves alone (``>`` and ``<`` are
    redirections there): ``freq:k``, ``idle:T``, ``value:v``, ``group:p`` and
    ``group:BY:p`` mean the same as the forms above.
    """
    s = str(text).strip().lower().replace(" ", "")
    m = re.fullmatch(r"(freq|idle|value|group(?::[a-z-]+)?):([^:<>=]+)", s)
    if m and not (m.group(1) == "group" and re.fullmatch(r"[a-z-]+", m.group(2))):
        s = m.group(1) + ("<" if m.group(1) == "idle" else ">=") + m.group(2)
    if s in ("all", "admit-all", "always"):
        return Policy("all")
    if s in ("none", "never"):
        return Policy("none")
    if s in ("second-hit", "second_hit"):
        return Policy("freq", 2.0)
    if s in ("reuse-oracle", "oracle"):
        return Policy("reuse-oracle")
    if s == "tinylfu":
        return Policy("tinylfu")
    m = re.fullmatch(r"freq>=([0-9]+)", s)
    if m:
        k = int(m.group(1))
        if k < 1:
            raise UsageError(f"freq>=k needs k >= 1, got '{text}'", field="policy")
        return Policy("freq", float(k))
    m = re.fullmatch(r"prob[:=]" + _FLOAT, s)
    if m:
        p = float(m.group(1))
        if not 0 <= p <= 1:
            raise UsageError(f"prob:p needs p in [0, 1], got '{text}'", field="policy")
        return Policy("prob", p)
    m = re.fullmatch(r"idle<(.+)", s)
    if m:
        return Policy("idle", parse_duration(m.group(1), field="policy"))
    m = re.fullmatch(r"value>=(-?[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)", s)
    if m:
        return Policy("value", float(m.group(1)))
    m = re.fullmatch(r"group(?::([a-z-]+))?>=" + _FLOAT, s)
    if m:
        by = m.group(1) or group_by
        if by not in GROUPINGS:
            raise UsageError(f"unknown grouping '{by}' in '{text}': expected one of {', '.join(GROUPINGS)}",
                             field="policy")
        p = float(m.group(2))
        if not 0 <= p <= 1:
            raise UsageError(f"group>=p needs p in [0, 1], got '{text}'", field="policy")
        return Policy("group", p, by)
    raise UsageError(
        f"unknown admission policy '{text}': expected all, none, freq>=k, second-hit, prob:p, idle<T, "
        "value>=v, reuse-oracle, tinylfu or group[:by]>=p (or, safe in a shell, freq:k, idle:T, value:v, "
        "group[:by]:p)",
        field="policy",
    )


# --------------------------------------------------------------------------- config


def _bytes(value, field_name: str) -> int:
    if isinstance(value, str):
        if value.strip() in ("0", ""):
            return 0
        return parse_size(value, field=field_name)
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < 2**63:
        raise UsageError(f"expected a number of bytes in [0, 2**63), got {value!r}", field=field_name)
    return int(value)


@dataclass(frozen=True)
class TierConfig:
    """One tier configuration. Sizes are bytes (int) or strings such as ``64GiB``.

    Parameters
    ----------
    dram_bytes : int or str
        DRAM per node, bytes.
    flash_bytes : int or str
        Shared flash pool, bytes (0: none).
    local_ssd_bytes : int or str
        Local SSD per node, bytes (0: none).
    nodes : int
        Nodes (1..64), each with its own DRAM and local SSD.
    routing : str
        ``session``, ``round-robin`` or ``prefix``.
    policy : str
        Flash admission policy (:func:`parse_policy`).
    flash_order : str
        ``lru`` or ``fifo`` (log-structured) for the flash tiers.
    promotion : str
        On a flash hit: ``promote`` (move into DRAM), ``copy`` (copy into DRAM, keep
        the flash copy) or ``none`` (serve from flash, leave it there).
    write_mode : str
        ``write-on-evict`` (DRAM victims are written) or ``write-through`` (misses are
        written when they enter DRAM).
    inclusive : bool
        Allow a block in two tiers (needed by ``copy`` and write-through).
    window_s : float
        Window for peak read bandwidth, seconds.
    group_by : str
        Grouping of a ``group>=p`` policy without an explicit one.
    name : str, optional
        Label in tables (default: generated from the options).
    """

    dram_bytes: int | str
    flash_bytes: int | str = 0
    local_ssd_bytes: int | str = 0
    nodes: int = 1
    routing: str = "session"
    policy: str = "all"
    flash_order: str = "lru"
    promotion: str = "promote"
    write_mode: str = "write-on-evict"
    inclusive: bool = False
    window_s: float = 60.0
    group_by: str = "type"
    name: str | None = None

    def __post_init__(self) -> None:
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        set_("dram_bytes", _bytes(self.dram_bytes, "dram"))
        set_("flash_bytes", _bytes(self.flash_bytes, "flash"))
        set_("local_ssd_bytes", _bytes(self.local_ssd_bytes, "local-ssd"))
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, (int, np.integer)) or not (
                1 <= self.nodes <= MAX_NODES):
            raise UsageError(f"expected 1..{MAX_NODES} nodes, got {self.nodes!r}", field="nodes")
        set_("nodes", int(self.nodes))
        routing = str(self.routing).strip().lower().replace("_", "-")
        routing = {"rr": "round-robin", "roundrobin": "round-robin", "affinity": "prefix"}.get(routing, routing)
        if routing not in ROUTINGS:
            raise UsageError(f"unknown routing '{self.routing}': expected {', '.join(ROUTINGS)}", field="routing")
        set_("routing", routing)
        set_("policy", str(parse_policy(self.policy, group_by=self.group_by)))
        order = str(self.flash_order).strip().lower()
        if order in ("log", "log-structured"):
            order = "fifo"
        if order not in FLASH_ORDERS:
            raise UsageError(f"unknown flash order '{self.flash_order}': expected lru or fifo", field="flash-order")
        set_("flash_order", order)
        promotion = str(self.promotion).strip().lower()
        if promotion not in PROMOTIONS:
            raise UsageError(f"unknown promotion '{self.promotion}': expected promote, copy or none",
                             field="promotion")
        set_("promotion", promotion)
        mode = str(self.write_mode).strip().lower().replace("_", "-")
        mode = {"evict": "write-on-evict", "on-evict": "write-on-evict", "write-back": "write-on-evict",
                "through": "write-through"}.get(mode, mode)
        if mode not in WRITE_MODES:
            raise UsageError(f"unknown write mode '{self.write_mode}': expected write-on-evict or write-through",
                             field="write-mode")
        set_("write_mode", mode)
        set_("inclusive", bool(self.inclusive))
        if not self.inclusive and (promotion == "copy" or mode == "write-through"):
            what = "promotion 'copy'" if promotion == "copy" else "write-through"
            raise UsageError(
                f"exclusive tiers never hold a block twice, but {what} keeps a copy in DRAM and flash: "
                "use inclusive tiers (--inclusive) or promote/none with write-on-evict",
                field="inclusive",
            )
        if not (isinstance(self.window_s, (int, float)) and math.isfinite(self.window_s) and self.window_s > 0):
            raise UsageError(f"expected a positive window in seconds, got {self.window_s!r}", field="window")
        set_("window_s", float(self.window_s))

    @property
    def parsed_policy(self) -> Policy:
        return parse_policy(self.policy, group_by=self.group_by)

    @property
    def has_flash(self) -> bool:
        """A flash tier exists (shared pool or local SSDs)."""
        return self.flash_bytes > 0 or self.local_ssd_bytes > 0

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        parts = [f"dram={format_bytes(self.dram_bytes)}"]
        if self.local_ssd_bytes:
            parts.append(f"local={format_bytes(self.local_ssd_bytes)}")
        if self.flash_bytes:
            parts.append(f"flash={format_bytes(self.flash_bytes)}")
        if self.nodes > 1:
            parts.append(f"nodes={self.nodes}/{self.routing}")
        if self.has_flash:
            parts.append(self.policy)
            defaults = {"flash_order": "lru", "promotion": "promote", "write_mode": "write-on-evict"}
            parts += [getattr(self, k) for k, v in defaults.items() if getattr(self, k) != v]
            if self.inclusive:
                parts.append("inclusive")
        return " ".join(parts)


def local_vs_shared(dram_bytes, ssd_bytes_per_node, nodes: int, **options) -> list[TierConfig]:
    """The same flash bought two ways: a local SSD per node vs one shared pool of
    ``nodes x ssd_bytes_per_node`` (G3 vs G3.5). Other options apply to both."""
    ssd = _bytes(ssd_bytes_per_node, "local-ssd")
    base = {k: v for k, v in options.items() if k not in ("name", "flash_bytes", "local_ssd_bytes")}
    return [
        TierConfig(dram_bytes, local_ssd_bytes=ssd, nodes=nodes, name="local-ssd", **base),
        TierConfig(dram_bytes, flash_bytes=ssd * nodes, nodes=nodes, name="shared-flash", **base),
    ]


# --------------------------------------------------------------------------- routing


def _mix64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def route(trace: Trace, nodes: int, routing: str) -> np.ndarray:
    """int32[R]: the node (0..nodes-1) serving each request (see the module docstring)."""
    R = trace.n_requests
    if nodes == 1:
        return np.zeros(R, dtype=np.int32)
    if routing == "round-robin":
        return (np.arange(R, dtype=np.int64) % nodes).astype(np.int32)
    req = trace.requests
    rid = req["request_id"].to_numpy().astype(np.int64)
    if routing == "session":
        sess = req["session_id"]
        key = np.where(sess.is_null().to_numpy(), rid, sess.fill_null(0).to_numpy().astype(np.int64))
        key = key.astype(np.int64).view(np.uint64)
    elif routing == "prefix":
        rs = trace.accesses.req_start
        nonempty = rs[1:] > rs[:-1]
        key = rid.view(np.uint64).copy()
        first = _first_blocks(trace)[nonempty]
        key[nonempty] = trace.block_hash[first].astype(np.uint64)
    else:
        raise UsageError(f"unknown routing '{routing}'", field="routing")
    return (_mix64(key ^ np.uint64(_ROUTE_SEED)) % np.uint64(nodes)).astype(np.int32)


def has_session_ids(trace) -> bool:
    """Whether any request carries a session id (``--routing session`` needs them:
    without, each request is routed by its own id, which spreads a session over the
    nodes like random routing)."""
    req = trace.requests
    return "session_id" in req.columns and req["session_id"].null_count() < req.height


def _first_blocks(trace) -> np.ndarray:
    """int64[R]: the first block of each request (-1 if empty); a streamed trace is
    read chunk by chunk."""
    rs = trace.accesses.req_start
    nonempty = rs[1:] > rs[:-1]
    first = np.full(rs.shape[0] - 1, -1, dtype=np.int64)
    if not isinstance(trace, StreamedTrace):
        first[nonempty] = trace.accesses.block[rs[:-1][nonempty]]
        return first
    for ch in trace.access_chunks():
        ne = ch.lrs[1:] > ch.lrs[:-1]
        first[ch.r:ch.r_end][ne] = ch.block[ch.lrs[:-1][ne]]
    return first


# --------------------------------------------------------------------------- streamed traces


def _streamed_oracle_flags(trace: StreamedTrace, decisions: Path, out: Path) -> None:
    """:func:`kvtrace.kernels.tiers.reuse_oracle_flags` of a streamed trace, from the
    admit-all run's decisions in the spill file ``decisions`` (int8 per access), written
    to ``out`` (int8 per access): chunks are read last to first, carrying one byte per
    block."""
    next_flash = np.zeros(trace.n_blocks, dtype=np.int8)
    with open(out, "wb") as fh:
        fh.truncate(trace.n_accesses)
        for ch in trace.access_chunks(layout=False, extra=[(decisions, np.int8)], reverse=True, block_dtype=None):
            flags = np.empty(ch.hi - ch.lo, dtype=np.int8)
            K.oracle_flags_chunk(ch.block, ch.extra[0], next_flash, flags)
            fh.seek(ch.lo)
            flags.tofile(fh)


# --------------------------------------------------------------------------- simulate


@dataclass
class WhatIfResult:
    """Output of :func:`simulate` (schemas in the module docstring).

    Attributes
    ----------
    config : TierConfig
    summary : dict
        Every metric of the configuration (one row of :func:`sweep`'s table).
    residency : polars.DataFrame
        Residency histograms per tier.
    requests : polars.DataFrame or None
        Per measured request: bytes by tier, recompute FLOPs, service time (None
        when :func:`simulate` was asked not to build it).
    info : dict
        Model, capacities in tokens, warm-up, counters of the run.
    """

    config: TierConfig
    summary: dict
    residency: pl.DataFrame
    requests: pl.DataFrame | None
    info: dict = field(default_factory=dict)

    @property
    def table(self) -> pl.DataFrame:
        """The summary as a one-row table."""
        return summary_table([self.summary])

    def to_dict(self) -> dict:
        """Summary, non-empty residency bins and run information (JSON-ready)."""
        return {
            "summary": self.summary,
            "residency": self.residency.filter(pl.col("count") > 0).to_dicts(),
            "info": self.info,
        }


def _values_array(values, n: int) -> np.ndarray | Path | None:
    if values is None:
        return None
    if isinstance(values, (str, Path)):  # a streamed trace's spill file: float64 per access
        path = Path(values)
        if path.stat().st_size != 8 * n:
            raise UsageError(f"{path.name}: expected {n} float64 values, one per block access", field="values")
        return path
    arr = getattr(values, "value_usd", values)
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if arr.shape != (n,):
        raise UsageError(f"expected one value per block access ({n}), got shape {arr.shape}", field="values")
    return arr


def _run_kernel(trace: Trace | StreamedTrace, config: TierConfig, tokens_cap, prefix_aware: bool, first_req: int,
                node, policy, values, oracle_ok=None, group=None, n_groups=1, decisions_out: Path | None = None,
                progress=None, keep_decisions: bool = False, scratch=None,
                fold: _RequestFold | None = None) -> K.TierRun:
    """One replay. A streamed trace is fed chunk by chunk (``values`` and
    ``oracle_ok`` then name spill files; ``decisions_out``, if given, receives the
    int8 decisions); an in-memory one in one call (arrays; the per-access decisions
    and cold flags are returned with ``keep_decisions``). ``fold``, if given, receives
    the per-request outputs as each chunk finishes (a streamed replay keeps no more of
    them)."""
    a = trace.accesses
    d, loc, fl = tokens_cap
    width = K.sketch_width(fl + config.nodes * loc, trace.meta.block_tokens, trace.n_blocks)
    sim = K.TierSimulator(
        trace.block_size, trace.request_timestamp, node, block_tokens=trace.meta.block_tokens,
        prefix_aware=prefix_aware, dram=d, local=loc, flash=fl, n_nodes=config.nodes, policy=policy.code,
        param=policy.param, flash_lru=config.flash_order == "lru", promotion=PROMOTIONS[config.promotion],
        write_through=config.write_mode == "write-through", first_measured=first_req, req_group=group,
        n_groups=n_groups, has_values=values is not None, sketch_width=width, scratch=scratch,
        chunk_columns=isinstance(trace, StreamedTrace),
    )
    if not isinstance(trace, StreamedTrace):
        decision = sim.feed(a.block, a.tokens, a.pos, a.req_start, values, oracle_ok)
        if fold is not None:
            fold.add(sim.req_cols.T, 0, sim.req_first)
        if not keep_decisions:
            return sim.finish()
        cold = (decision & K.COLD_FLAG) != 0
        decision &= 3
        return sim.finish(decision, cold)
    extra = [(p, dt) for p, dt in ((values, np.float64), (oracle_ok, np.int8)) if p is not None]
    out = open(decisions_out, "wb") if decisions_out is not None else None
    try:
        for ch in trace.access_chunks(extra=extra):
            cols = list(ch.extra)
            v = cols.pop(0) if values is not None else None
            o = cols.pop(0) if oracle_ok is not None else None
            decision = sim.feed(ch.block, ch.tokens, ch.pos, ch.lrs, v, o)
            if fold is not None:
                fold.add(sim.chunk_out, ch.r, sim.req_first)
            if out is not None:
                decision.tofile(out)
            if progress is not None:
                progress(ch.hi, trace.n_accesses)
    finally:
        if out is not None:
            out.close()
    return sim.finish()


def simulate(
    trace: Trace,
    config: TierConfig,
    *,
    model: ModelSpec | str | None = None,
    gpu: GpuSpec | str | None = None,
    response: ResponseModel | None = None,
    eviction: str = "prefix-aware",
    values=None,
    warmup: str | float | None = None,
    progress=None,
    requests_table: bool = True,
    scratch: Scratch | None = None,
) -> WhatIfResult:
    """Replay ``trace`` through one tier configuration.

    Parameters
    ----------
    trace : Trace or StreamedTrace
        In memory, or scanned once by :func:`kvtrace.ingest.stream.open_stream` (then
        replayed chunk by chunk from its spill file, results bit for bit the same;
        memory bounded by distinct blocks and requests).
    config : TierConfig
    model : ModelSpec or str, optional
        Bytes per token and prefill FLOPs (default Llama-3.1-70B).
    gpu : GpuSpec or str, optional
        GPU-seconds and $ of the compute saved (default H100).
    response : ResponseModel, optional
        Branch times for the per-request service time; default
        ``ResponseModel(recompute_flops_per_s=gpu.effective_flops)``.
    eviction : str
        ``prefix-aware`` (default) or ``flat`` LRU model, as for the curve.
    values : float64[N] or FutureReuse, optional
        Value ($) of keeping the block after each access (``value>=v`` policy and the
        value columns); for a streamed trace, the path of a float64 spill file
        (:func:`kvtrace.analyses.value.streamed_values`).
    warmup : str or float, optional
        Fraction of requests or duration that only fills the tiers.
    progress : callable, optional
        ``progress(accesses_done, accesses_total)`` per chunk of a streamed trace.
    requests_table : bool
        Build the per-request table (``requests``; None without it: a sweep needs
        only the summary, and the table is ~60 bytes per request).
    scratch : kvtrace.kernels.memory.Scratch, optional
        Memory for the simulator's block table and per-request outputs, kept between
        calls that run one after another (:func:`sweep` passes one to all its
        configurations); results do not depend on it.

    Returns
    -------
    WhatIfResult
    """
    model = model if isinstance(model, ModelSpec) else resolve_model(model)
    gpu = gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu)
    response = response if response is not None else ResponseModel(recompute_flops_per_s=gpu.effective_flops)
    ev = normalise_eviction(eviction)
    prefix_aware = ev == "prefix-aware"
    bpt = int(model.kv_bytes_per_token)
    a_coef, b_coef = model.flops_coefficients()
    policy = config.parsed_policy
    wu = parse_warmup(warmup)
    first_req = warmup_first_request(trace, wu)
    if first_req >= trace.n_requests and trace.n_requests:
        raise UsageError("the warm-up covers the whole trace: nothing left to measure", field="warmup")
    caps = (config.dram_bytes // bpt, config.local_ssd_bytes // bpt, config.flash_bytes // bpt)
    node = route(trace, config.nodes, config.routing)
    vals = _values_array(values, trace.n_accesses)
    if policy.kind == "value" and vals is None:
        raise UsageError("the value>=v policy needs per-access values (kvtrace.analyses.value.future_reuse(...))",
                         field="values")
    group, n_groups = None, 1
    if policy.kind == "group":
        group, names = group_labels(trace, policy.by)
        n_groups = len(names)
    oracle = None
    streamed = isinstance(trace, StreamedTrace)
    if policy.kind == "reuse-oracle":
        scratch = scratch if scratch is not None else Scratch()  # the two runs share it
        if streamed:  # admit-all decisions and the flags go through spill files
            fd, name = tempfile.mkstemp(prefix="oracle-", dir=trace.spill)
            os.close(fd)
            decisions, oracle = Path(name), Path(name + ".flags")
            try:
                _run_kernel(trace, config, caps, prefix_aware, first_req, node, Policy("all"), None,
                            decisions_out=decisions, progress=progress, scratch=scratch)
                _streamed_oracle_flags(trace, decisions, oracle)
            finally:
                decisions.unlink(missing_ok=True)
        else:
            first = _run_kernel(trace, config, caps, prefix_aware, first_req, node, Policy("all"), None,
                                keep_decisions=True, scratch=scratch)
            oracle = K.reuse_oracle_flags(trace.accesses.block, trace.n_blocks, first.decision)
    try:
        fold = _RequestFold(trace, first_req, config, bpt, a_coef, b_coef, response, requests_table)
        run = _run_kernel(trace, config, caps, prefix_aware, first_req, node, policy, vals, oracle, group, n_groups,
                          progress=progress, scratch=scratch, fold=fold)
    finally:
        if streamed and oracle is not None:
            oracle.unlink(missing_ok=True)

    summary, requests = _metrics(trace, config, run, fold, node, first_req, bpt, a_coef, b_coef, gpu, vals,
                                 requests_table)
    summary = {
        "config": config.label, "dram_bytes": config.dram_bytes, "local_ssd_bytes": config.local_ssd_bytes,
        "flash_bytes": config.flash_bytes, "nodes": config.nodes, "routing": config.routing,
        "policy": config.policy, "flash_order": config.flash_order, "promotion": config.promotion,
        "write_mode": config.write_mode, "inclusive": config.inclusive, "eviction": ev, "model": model.name,
        "kv_bytes_per_token": bpt, **summary,
    }
    shift = run.time_shift
    info = {
        "model": model.name, "kv_bytes_per_token": bpt, "gpu": gpu.name, "eviction": ev,
        "capacity_tokens": {"dram": caps[0], "local_ssd": caps[1], "flash": caps[2]},
        "warmup": None if wu is None else {"kind": wu[0], "value": wu[1]},
        "first_measured_request": first_req, "response": dataclasses.asdict(response),
        "counts": run.counts, "time_quantum_s": 2.0 ** (K.HIST_MIN_EXP + shift),
    }
    return WhatIfResult(config, summary, _residency(run.hist, config, shift), requests, info)


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


class _RequestFold:
    """The per-request metrics of a run, folded in as the simulator finishes each chunk
    of requests (:func:`_fold_requests`): what a streamed replay keeps per request is
    the service time (8 bytes, for exact percentiles) and, only with the requests
    table, its five columns."""

    def __init__(self, trace, first_req: int, config: TierConfig, bpt: int, a: float, b: float,
                 response: ResponseModel, requests_table: bool) -> None:
        R = trace.n_requests
        self.ts = np.ascontiguousarray(trace.request_timestamp, dtype=np.float64)
        self.rs = trace.accesses.req_start
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


def _metrics(trace, config, run: K.TierRun, fold: _RequestFold, node, first_req, bpt, a, b, gpu, vals,
             requests_table=True):
    c, s = run.counts, run.sums
    R = trace.n_requests
    rs = trace.accesses.req_start
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


def _residency(hist: np.ndarray, config: TierConfig, shift: int) -> pl.DataFrame:
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


_STRING_COLUMNS = {"config", "routing", "policy", "flash_order", "promotion", "write_mode", "eviction", "model"}
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


# --------------------------------------------------------------------------- sweep

_WORKER: dict = {}


class _MappedTrace:
    """An in-memory trace handed to the sweep's worker processes through files: its
    arrays as ``.npy`` files and its request table as uncompressed Arrow IPC in a
    temporary directory, which each worker maps (copy-on-write) instead of receiving a
    pickled copy: the pages are the OS's page cache, shared by every worker, and a
    worker starts at once. (Pickled, the 30M-access benchmark trace is 1.3 GB: 2.4 s to
    pickle and 5 s to unpickle per worker, a copy each.) The per-access values of
    ``value>=v`` go the same way."""

    _ARRAYS = ("request", "pos", "block", "tokens", "req_start")
    _BLOCK_ARRAYS = ("block_hash", "block_tenant", "block_size")

    def __init__(self, trace: Trace, values: np.ndarray | None, directory: Path) -> None:
        self.directory = Path(directory)
        for name in self._ARRAYS:
            np.save(self.directory / f"{name}.npy", getattr(trace.accesses, name))
        for name in self._BLOCK_ARRAYS:
            np.save(self.directory / f"{name}.npy", getattr(trace, name))
        if values is not None:
            np.save(self.directory / "values.npy", values)
        trace.requests.write_ipc(self.directory / "requests.arrow", compression="uncompressed")
        self.has_values = values is not None
        self.meta = trace.meta
        self.warnings = list(trace.warnings)

    def _array(self, name: str) -> np.ndarray:
        # copy-on-write: writable arrays (what the kernels were compiled for), the file unchanged
        return np.load(self.directory / f"{name}.npy", mmap_mode="c").view(np.ndarray)

    def open(self) -> tuple[Trace, np.ndarray | None]:
        """The trace (and values) backed by the files."""
        trace = Trace(requests=pl.read_ipc(self.directory / "requests.arrow"),
                      accesses=Accesses(**{name: self._array(name) for name in self._ARRAYS}),
                      **{name: self._array(name) for name in self._BLOCK_ARRAYS}, meta=self.meta,
                      warnings=self.warnings)
        return trace, self._array("values") if self.has_values else None


def _shared_tmp(trace: Trace) -> str | None:
    """Where the sweep writes the trace for its workers: ``/dev/shm`` (memory: written
    at memory speed, no disk writeback; 1.3 GB of the 30M-access benchmark trace in
    0.4 s there, 1.9 s in a disk-backed /tmp) when it has room for it twice over and
    ``TMPDIR`` does not say otherwise; else the usual temporary directory."""
    if os.environ.get("TMPDIR") or not os.path.isdir("/dev/shm"):
        return None
    need = (sum(getattr(trace.accesses, name).nbytes for name in _MappedTrace._ARRAYS)
            + trace.requests.estimated_size())
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        return None
    return "/dev/shm" if free > 2 * need and os.access("/dev/shm", os.W_OK) else None


def _init_worker(trace, kwargs) -> None:
    if isinstance(trace, _MappedTrace):
        trace, values = trace.open()
        if values is not None:
            kwargs = {**kwargs, "values": values}
    _WORKER["trace"] = trace
    _WORKER["kwargs"] = kwargs
    _WORKER["scratch"] = Scratch()  # one block table for the worker's configurations


def _summary_in_worker(config: TierConfig) -> dict:
    return simulate(_WORKER["trace"], config, **_WORKER["kwargs"], requests_table=False,
                    scratch=_WORKER["scratch"]).summary


#: starting a parallel sweep's worker processes (spawn, imports, mapping the trace, loading
#: the cached kernels): a 4-configuration sweep of the 32k-access sample took 1.96-2.11 s
#: serially and 4.45-4.54 s on 2 workers (``kvtrace whatif sample_traces/chat.jsonl --grid
#: --dram 16GiB,64GiB --flash 1TiB,4TiB --workers 1|2``), the replays themselves negligible
WORKER_START_S = 2.5
#: one configuration's replay on one core, block accesses per second (simulate with its
#: per-request metrics; the README's performance table has the kernels alone)
REPLAY_ACCESSES_PER_S = 9e6


def plan_workers(n_configs: int, n_accesses: int, workers: int | None = None) -> tuple[int, str]:
    """How many processes a sweep should use, and why, in words for the output.

    ``workers`` given: that many (at most one per configuration). ``None``: by the
    estimated work: serial replay takes ``n_configs x n_accesses /
    REPLAY_ACCESSES_PER_S`` seconds; ``w`` workers (at most the CPUs this process may
    use) take :data:`WORKER_START_S` more plus ``ceil(n_configs / w)`` replays each;
    the smaller estimate wins.
    """
    if workers is not None:
        w = max(1, min(workers, n_configs))
        return w, ("serially (--workers 1)" if w == 1 else f"on {w} worker processes (--workers {workers})")
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    w = max(1, min(cpus, n_configs))
    one = n_accesses / REPLAY_ACCESSES_PER_S
    serial = n_configs * one
    if w == 1:
        return 1, "serially (one configuration)" if n_configs <= 1 else f"serially ({cpus} CPU)"
    parallel = WORKER_START_S + math.ceil(n_configs / w) * one
    if parallel < serial:
        return w, f"on {w} worker processes (estimated {parallel:,.1f} s against {serial:,.1f} s serially)"
    return 1, (f"serially (estimated {serial:,.1f} s of replay; {w} worker processes would take {parallel:,.1f} s "
               f"with the ~{WORKER_START_S:g} s they need to start)")


def sweep(
    trace: Trace,
    configs: list[TierConfig],
    *,
    model: ModelSpec | str | None = None,
    gpu: GpuSpec | str | None = None,
    response: ResponseModel | None = None,
    eviction: str = "prefix-aware",
    values=None,
    warmup: str | float | None = None,
    workers: int = 2,
    progress=None,
) -> pl.DataFrame:
    """Simulate every configuration and compare them in one table.

    Configurations run in ``workers`` processes (``spawn``: each worker maps the trace
    from files written once, :class:`_MappedTrace`, then runs one configuration at a
    time); each one is a deterministic single
    thread replay, so the table equals the serial one. ``workers <= 1`` runs serially
    in this process. As with any ``spawn`` pool, a script calling this must do so under
    ``if __name__ == "__main__":`` (the workers re-import the main module).

    ``progress(done, total)`` is called as configurations finish (in order). A
    streamed trace (:class:`kvtrace.ingest.stream.StreamedTrace`) reaches the workers
    without its accesses: each replays from the same spill file.

    Returns
    -------
    polars.DataFrame
        One row per configuration, in the given order (:meth:`WhatIfResult.summary`).
    """
    kwargs = {"model": model if isinstance(model, ModelSpec) else resolve_model(model),
              "gpu": gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu), "response": response,
              "eviction": eviction, "values": None if values is None else _values_array(values, trace.n_accesses),
              "warmup": warmup}
    configs = list(configs)
    rows = []

    def done(row) -> None:
        rows.append(row)
        if progress is not None:
            progress(len(rows), len(configs))

    if workers <= 1 or len(configs) <= 1:
        scratch = Scratch()  # one block table for every configuration, in turn
        for c in configs:
            done(simulate(trace, c, **kwargs, requests_table=False, scratch=scratch).summary)
        return summary_table(rows)
    ctx = multiprocessing.get_context("spawn")  # fork is unsafe with Polars' and Numba's threads
    # workers map an in-memory trace from files (a streamed trace is small without its accesses)
    to_map = isinstance(trace, Trace)
    with (tempfile.TemporaryDirectory(prefix="kvtrace-sweep-", dir=_shared_tmp(trace)) if to_map
          else contextlib.nullcontext()) as tmp:
        handle = trace
        if to_map:
            values = kwargs["values"]
            mapped = isinstance(values, np.ndarray)
            handle = _MappedTrace(trace, values if mapped else None, Path(tmp))
            if mapped:
                kwargs = {**kwargs, "values": None}
        with ProcessPoolExecutor(max_workers=min(workers, len(configs)), mp_context=ctx,
                                 initializer=_init_worker, initargs=(handle, kwargs)) as pool:
            for row in pool.map(_summary_in_worker, configs):
                done(row)
    return summary_table(rows)
