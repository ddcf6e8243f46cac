"""A what-if's tier configuration (:class:`TierConfig`), the grids of them a sweep
runs (:func:`config_grid`, :func:`local_vs_shared`) and request routing across nodes
(:func:`route`: splitmix64 of the key xor a fixed seed, modulo N; the keys are the
package docstring's)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvtrace.analyses.whatif.policy import Policy, parse_policy
from kvtrace.errors import UsageError
from kvtrace.kernels import tiers as K
from kvtrace.trace.source import TraceSource
from kvtrace.units import format_bytes, parse_size

ROUTINGS = ("session", "round-robin", "prefix")
PROMOTIONS = {"promote": K.PROMOTE, "copy": K.COPY, "none": K.NO_PROMOTION}
FLASH_ORDERS = ("lru", "fifo")
WRITE_MODES = ("write-on-evict", "write-through")
MAX_NODES = 64
_ROUTE_SEED = 0xD6E8FEB86659FD93


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


def config_grid(drams, flashes=("0",), policies=("all",), *, unique: bool = True, **common) -> list[TierConfig]:
    """Every DRAM x flash x admission policy, in that nesting order (DRAM outermost),
    each configuration once: a configuration whose label repeats an earlier one's is
    left out (without a flash tier the policy does not matter), unless ``unique`` is
    False (``kvtrace whatif`` replays every combination it is given).

    Parameters
    ----------
    drams, flashes : sequence of int or str
        DRAM per node and shared flash pool sizes, bytes or strings such as ``64GiB``.
    policies : sequence of str
        Admission policies (:func:`parse_policy`).
    **common
        Every other :class:`TierConfig` option, the same for all.
    """
    out, seen = [], set()
    for d in drams:
        for f in flashes:
            for p in policies:
                c = TierConfig(d, flash_bytes=f, policy=p, **common)
                if not unique or c.label not in seen:
                    seen.add(c.label)
                    out.append(c)
    return out


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


def mix64(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def session_keys(requests) -> np.ndarray:
    """uint64[R]: each request's session id, its own request id when it has none (the
    key of session routing and of a scenario's per-session coins)."""
    rid = requests["request_id"].to_numpy().astype(np.int64)
    if "session_id" not in requests.columns:
        return rid.view(np.uint64)
    sess = requests["session_id"]
    key = np.where(sess.is_null().to_numpy(), rid, sess.fill_null(0).to_numpy().astype(np.int64))
    return key.astype(np.int64).view(np.uint64)


def route(trace: TraceSource, nodes: int, routing: str) -> np.ndarray:
    """int32[R]: the node (0..nodes-1) serving each request (routing keys in the
    package docstring)."""
    R = trace.n_requests
    if nodes == 1:
        return np.zeros(R, dtype=np.int32)
    if routing == "round-robin":
        return (np.arange(R, dtype=np.int64) % nodes).astype(np.int32)
    req = trace.requests
    rid = req["request_id"].to_numpy().astype(np.int64)
    if routing == "session":
        key = session_keys(req)
    elif routing == "prefix":
        first = trace.first_blocks()
        nonempty = first >= 0
        key = rid.view(np.uint64).copy()
        key[nonempty] = trace.block_hash[first[nonempty]].astype(np.uint64)
    else:
        raise UsageError(f"unknown routing '{routing}'", field="routing")
    return (mix64(key ^ np.uint64(_ROUTE_SEED)) % np.uint64(nodes)).astype(np.int32)


def has_session_ids(trace) -> bool:
    """Whether any request carries a session id (``--routing session`` needs them:
    without, each request is routed by its own id, which spreads a session over the
    nodes like random routing)."""
    req = trace.requests
    return "session_id" in req.columns and req["session_id"].null_count() < req.height


def trace_needs(configs: list[TierConfig]) -> tuple[list[str], bool]:
    """What of a trace these configurations read besides the accesses: the request
    columns (routing by session or request id, ``group:COLUMN`` policies), and whether the
    block hashes (prefix routing). A streamed run keeps only these (O(requests) per
    column, 12 bytes per block for the hashes and tenants)."""
    keep = {"request_id", "session_id"} if any(c.nodes > 1 and c.routing != "round-robin" for c in configs) else set()
    keep.update(c.parsed_policy.by for c in configs if c.parsed_policy.kind == "group")
    columns = sorted({"session-length": "session_id"}.get(k, k) for k in keep)
    return columns, any(c.nodes > 1 and c.routing == "prefix" for c in configs)


__all__ = ["FLASH_ORDERS", "MAX_NODES", "PROMOTIONS", "ROUTINGS", "WRITE_MODES", "TierConfig", "config_grid",
           "has_session_ids", "local_vs_shared", "route", "trace_needs"]
