"""The scenario file (``kvtrace scenario TRACE --config scenario.toml``): its schema,
validated by pydantic models (unknown keys refused), and the objects the run needs.

Layout (``sample_traces/scenario.example.toml`` documents every key)::

    [model] [gpu] [response]   as kvtrace load's options (model, GPU, restore times)
    [system]                   the tiers and policies, as kvtrace load / whatif
    [load]                     the load model's resources (kvtrace load's options, in
                               their units) and ``scale``, the load factor
    [run]                      warm-up, timeline bin, recovery tolerance
    [[scenario]]               a name and its events, [[scenario.event]] each

Times of events (``at``, ``duration``, ``ramp``, ``ttl``, ``step``, ``sweep``) are
seconds, a duration string (``90s``, ``30min``, ``2h``) or, for ``at``, a share of
the trace's span (``"50%"``): seconds after the trace's first request.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kvtrace.errors import KvtraceError, UsageError
from kvtrace.units import parse_size

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

_UNITS = {"ms": 1e-3, "s": 1.0, "sec": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([a-z]+)?\s*$")


def seconds(v, *, what: str = "a duration") -> float:
    """A duration in seconds from a number (seconds) or a string with a unit (``90s``,
    ``30min``, ``2h``, ``250ms``); ``inf`` for no limit."""
    if isinstance(v, bool):
        raise ValueError(f"expected {what} (seconds or a string such as '30min'), got {v!r}")
    if isinstance(v, (int, float)):
        x = float(v)
    elif isinstance(v, str) and v.strip().lower() in ("inf", "infinity", "none"):
        return math.inf
    elif isinstance(v, str) and (m := _DURATION.match(v.lower())):
        unit = m.group(2) or "s"
        if unit not in _UNITS:
            raise ValueError(f"expected {what} with a unit of ms, s, min, h or d, got {v!r}")
        x = float(m.group(1)) * _UNITS[unit]
    else:
        raise ValueError(f"expected {what} (seconds or a string such as '30min'), got {v!r}")
    if not x >= 0:
        raise ValueError(f"expected {what} >= 0, got {v!r}")
    return x


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class When(_Strict):
    """An event time: seconds after the first request, or a share of the span."""

    seconds: float | None = None
    share: float | None = None

    def resolve(self, span_s: float) -> float:
        return self.seconds if self.seconds is not None else self.share * span_s


def _when(v) -> When:
    if isinstance(v, When):
        return v
    if isinstance(v, str) and v.strip().endswith("%"):
        try:
            p = float(v.strip()[:-1]) / 100.0
        except ValueError:
            raise ValueError(f"expected a share such as '50%', got {v!r}") from None
        if not 0 <= p <= 1:
            raise ValueError(f"expected a share of the trace's span in 0%..100%, got {v!r}")
        return When(share=p)
    return When(seconds=seconds(v, what="a time"))


class _Event(_Strict):
    at: When = Field(description="When: seconds after the first request, a duration string or a share ('50%').")

    @field_validator("at", mode="before")
    @classmethod
    def _at(cls, v):
        return _when(v)


class ColdStart(_Event):
    """Every tier of every node loses its content (a restart of the whole cache)."""

    kind: Literal["cold-start"]


class Restored(_Event):
    """DRAM loses its content; the local SSDs and the shared flash keep theirs with
    their metadata (the catalog restored after a restart: data cold in the hot tier)."""

    kind: Literal["restored"]


class Migration(_Event):
    """From ``at`` on, a share of the sessions (by a hash of the session id, else the
    request id) is served by the next node (node + 1 mod nodes): their node-local
    state is not there; the shared flash can serve them."""

    kind: Literal["migration"]
    share: float = Field(1.0, ge=0.0, le=1.0)


class TargetLoss(_Event):
    """Flash target ``target`` of the load model's ``flash_targets`` loses its blocks
    (placed by hash, as the load model places reads); it keeps serving, empty."""

    kind: Literal["target-loss"]
    target: int = Field(0, ge=0)


class CatalogOutage(_Event):
    """The shared flash's catalog is down for ``duration``: its blocks stay but are
    unreachable (lookups miss, nothing is written there), and reachable again after."""

    kind: Literal["catalog-outage"]
    duration: float = Field(description="Seconds (or a duration string) until the catalog is back.")

    @field_validator("duration", mode="before")
    @classmethod
    def _d(cls, v):
        return seconds(v)


class Rollout(_Event):
    """From ``at``, a share of sessions (ramping linearly to ``share`` over ``ramp``)
    moves to a new model version whose blocks live in a new namespace (nothing is reused
    across versions; a session stays on the new version once moved). With
    ``retire_gbps``, every ``step`` seconds after the ramp each tier deletes up to
    ``retire_gbps x step`` GB of the old version's blocks, least recent first (0: they
    age out by the tiers' own eviction)."""

    kind: Literal["rollout"]
    share: float = Field(1.0, ge=0.0, le=1.0)
    ramp: float = 0.0
    retire_gbps: float = Field(0.0, ge=0.0)
    step: float = 60.0

    @field_validator("ramp", "step", mode="before")
    @classmethod
    def _t(cls, v):
        return seconds(v)


class Ttl(_Event):
    """Per-tier time to live (seconds or durations; omitted or ``inf``: none), from
    ``at`` on: a sweep every ``sweep`` seconds deletes the blocks idle longer than their
    tier's TTL (since their last touch; in a FIFO flash tier, since they were written),
    wherever they stand in the tier's order. A block that expires between sweeps is
    still served until the next one, as with a periodic expiry scan.

    With ``by = "type"`` or ``"tenant"`` a tier's TTL may be a table by class (``{chat =
    "10min", agent = "2h", "*" = "1h"}``; ``*``: the other classes, else none): a block's
    class is that of the request that first used it."""

    kind: Literal["ttl"]
    dram: float | dict[str, float] = math.inf
    local_ssd: float | dict[str, float] = math.inf
    shared_flash: float | dict[str, float] = math.inf
    sweep: float = 1.0
    by: Literal["type", "tenant"] | None = None

    @field_validator("dram", "local_ssd", "shared_flash", mode="before")
    @classmethod
    def _t(cls, v):
        if isinstance(v, dict):
            return {str(k): seconds(x, what=f"the TTL of class {k!r}") for k, x in v.items()}
        return seconds(v)

    @field_validator("sweep", mode="before")
    @classmethod
    def _s(cls, v):
        return seconds(v)

    @model_validator(mode="after")
    def _classes(self):
        if self.by is None and any(isinstance(x, dict) for x in (self.dram, self.local_ssd, self.shared_flash)):
            raise ValueError("a TTL by class needs by = \"type\" or \"tenant\"")
        return self

    def of_class(self, tier: str, name: str) -> float:
        """The TTL (seconds) of tier ``dram``, ``local_ssd`` or ``shared_flash`` for a class."""
        v = getattr(self, tier)
        if not isinstance(v, dict):
            return v
        return v.get(name, v.get("*", math.inf))


class Congestion(_Event):
    """From ``at`` for ``duration``, the load model's ``resource`` links (``host_link``,
    ``nic``, ``local_ssd``, ``flash`` targets or the ``uplink``; one ``instance``, a node
    or a target, or all of them) serve at ``share`` of their bandwidth (0: stopped).
    The tiers' contents do not change; the queues do."""

    kind: Literal["congestion"]
    duration: float
    resource: Literal["host_link", "nic", "local_ssd", "flash", "uplink"] = "flash"
    share: float = Field(0.5, ge=0.0, le=1.0)
    instance: int | None = Field(None, ge=0)

    @field_validator("duration", mode="before")
    @classmethod
    def _d(cls, v):
        return seconds(v)


class Prestage(_Event):
    """From ``at`` on, when a session pauses between two turns (the previous turn's end,
    ``turn_time`` after its arrival, before the next turn's arrival), the prefix the next
    turn will need is moved from the flash tiers into its node's DRAM ahead of it.

    ``predictor``: ``oracle`` (the next turn's own blocks), ``last-context`` (the
    previous turn's blocks) or ``none``. The move is issued ``lead`` seconds before the
    next turn's arrival, never before the previous turn's end (``inf``: at its end), and
    prefetches share ``gbps`` of bandwidth first come first served (``inf``: none), a
    prefetch's blocks landing in DRAM together when its transfer completes.
    ``turn_time``: a turn's duration, an expression of ``input`` and ``output`` tokens
    (seconds; numbers, + - * /, min, max) or ``trace`` (its end_timestamp)."""

    kind: Literal["prestage"]
    at: When = When(seconds=0.0)
    predictor: Literal["oracle", "last-context", "none"] = "oracle"
    lead: float = math.inf
    gbps: float = Field(math.inf, gt=0.0)
    turn_time: str = "input/5000 + output/50"

    @field_validator("lead", mode="before")
    @classmethod
    def _l(cls, v):
        return seconds(v)

    @field_validator("gbps", mode="before")
    @classmethod
    def _g(cls, v):
        return math.inf if isinstance(v, str) and v.strip().lower() in ("inf", "infinity", "none") else v


class Prewarm(_Event):
    """From ``at``, every node's DRAM is refilled from the tiers below it (its local SSD,
    the shared flash) under a budget of ``gbps`` GB/s per node, up to ``limit`` x its
    DRAM capacity; the moves are read from the same links as the requests' restores and
    queue with them (the prewarm storm). The candidates of a node are the blocks last
    used on it before ``at`` that, at ``at``, a tier below holds and its DRAM does not;
    ``order``: ``value`` (most prefill compute per token avoided by their accesses within
    ``horizon`` after ``at``: clairvoyant, as ``kvtrace value``), ``recency`` (most
    recently used first) or ``scan`` (the store's own order, by content hash: a full
    scan). A block lands in DRAM when its share of the budget has been transferred
    (first come first served); one gone from the tiers below or already in DRAM by then
    is skipped, its share of the budget spent."""

    kind: Literal["prewarm"]
    order: Literal["value", "recency", "scan"] = "value"
    gbps: float = Field(gt=0.0, allow_inf_nan=False)
    limit: float = Field(1.0, gt=0.0, allow_inf_nan=False)
    horizon: float = math.inf

    @field_validator("horizon", mode="before")
    @classmethod
    def _h(cls, v):
        return seconds(v)


Event = Annotated[Union[ColdStart, Restored, Migration, TargetLoss, CatalogOutage, Rollout, Ttl, Prestage,
                        Congestion, Prewarm], Field(discriminator="kind")]
EVENT_KINDS = ("cold-start", "restored", "migration", "target-loss", "catalog-outage", "rollout", "ttl", "prestage",
               "congestion", "prewarm")


class Scenario(_Strict):
    name: str = Field(min_length=1)
    event: list[Event] = Field(default_factory=list)


class ModelSection(_Strict):
    name: str | None = None
    kv_bytes_per_token: int | None = Field(None, ge=1)
    dtype: str | None = None


class GpuSection(_Strict):
    name: str | None = None
    mfu: float | None = Field(None, gt=0.0, le=1.0)
    dollars_per_hour: float | None = Field(None, ge=0.0)


class ResponseSection(_Strict):
    dram_gbps: float | None = Field(None, gt=0.0)
    dram_latency_ms: float | None = Field(None, ge=0.0)
    flash_gbps: float | None = Field(None, gt=0.0)
    flash_latency_ms: float | None = Field(None, ge=0.0)
    overhead_ms: float | None = Field(None, ge=0.0)


def _size(v) -> int:
    if isinstance(v, bool):
        raise ValueError(f"expected a size such as '64GiB', got {v!r}")
    if isinstance(v, int):
        return v
    if str(v).strip() == "0":  # no tier
        return 0
    try:
        return int(parse_size(str(v)))
    except UsageError as exc:
        raise ValueError(exc.message) from None


class SystemSection(_Strict):
    dram: int
    local_ssd: int = 0
    flash: int = 0
    nodes: int = Field(1, ge=1, le=64)
    routing: Literal["session", "round-robin", "prefix"] = "session"
    policy: str = "all"
    promotion: Literal["promote", "copy", "none"] = "promote"
    write_mode: Literal["write-on-evict", "write-through"] = "write-on-evict"
    flash_order: Literal["lru", "fifo"] = "lru"
    inclusive: bool = False
    eviction: Literal["prefix-aware", "flat"] = "prefix-aware"
    cache_rules: Literal["ideal", "vllm", "sglang"] = "ideal"

    @field_validator("dram", "local_ssd", "flash", mode="before")
    @classmethod
    def _sz(cls, v):
        return _size(v)


class LoadSection(_Strict):
    scale: float = Field(1.0, gt=0.0)
    slo_ttft_ms: float | None = Field(None, gt=0.0)
    gpus_per_node: int | None = Field(None, ge=0)
    prefill_tokens_per_s: float | None = Field(None, gt=0.0)
    prefill_batch_tokens: int | None = Field(None, ge=1)
    prefill_pass_ms: float | None = Field(None, ge=0.0)
    host_link_gbps: float | None = Field(None, ge=0.0)
    nic_gbps: float | None = Field(None, ge=0.0)
    local_ssd_gbps: float | None = Field(None, ge=0.0)
    flash_pool_gbps: float | None = Field(None, ge=0.0)
    flash_iops: float | None = Field(None, ge=0.0)
    flash_targets: int | None = Field(None, ge=1, le=4096)
    uplink_gbps: float | None = Field(None, ge=0.0)
    flash_write_gbps: float | None = Field(None, ge=0.0)
    link_discipline: Literal["fcfs", "ps"] | None = None
    overlap: float | None = Field(None, ge=0.0, le=1.0)
    route_ms: float | None = Field(None, ge=0.0)
    decode_ms: float | None = Field(None, ge=0.0)
    max_wait_s: float | None = Field(None, gt=0.0)


class RunSection(_Strict):
    warmup: str | None = None
    bin: float = 60.0
    recovery_tolerance: float = Field(0.01, gt=0.0, lt=1.0)
    baseline: bool = True  # run the plain replay too (the extra prefill, shortfall and recovery need it)

    @field_validator("bin", mode="before")
    @classmethod
    def _b(cls, v):
        x = seconds(v)
        if not 0 < x < math.inf:
            raise ValueError(f"expected a positive, finite bin width, got {v!r}")
        return x

    @field_validator("warmup", mode="before")
    @classmethod
    def _w(cls, v):
        return None if v is None else str(v)


class ScenarioFile(_Strict):
    model: ModelSection = ModelSection()
    gpu: GpuSection = GpuSection()
    response: ResponseSection = ResponseSection()
    system: SystemSection
    load: LoadSection = LoadSection()
    run: RunSection = RunSection()
    scenario: list[Scenario] = Field(min_length=1)

    def tier_config(self):
        """The :class:`kvtrace.analyses.whatif.TierConfig` of ``[system]``."""
        from kvtrace.analyses.whatif.config import TierConfig

        s = self.system
        return TierConfig(dram_bytes=s.dram, flash_bytes=s.flash, local_ssd_bytes=s.local_ssd, nodes=s.nodes,
                          routing=s.routing, policy=s.policy, flash_order=s.flash_order, promotion=s.promotion,
                          write_mode=s.write_mode, inclusive=s.inclusive)

    def load_model(self):
        """The :class:`kvtrace.analyses.load.LoadModel` of ``[load]`` (its defaults where unset)."""
        from kvtrace.analyses.load import LoadModel

        kw = self.load.model_dump(exclude={"scale"}, exclude_none=True)
        return LoadModel.in_units(**kw)


def _loc(loc: tuple, data: dict) -> str:
    """``scenario[2].event[0].at`` from pydantic's location (the scenario's name in place
    of its index when it has one)."""
    out, node = [], data
    for part in loc:
        if isinstance(part, int):
            name = node[part].get("name") if isinstance(node, list) and isinstance(node[part], dict) else None
            out[-1] += f"[{part}]" if not name else f"['{name}']"
            node = node[part] if isinstance(node, list) and part < len(node) else None
        elif part in EVENT_KINDS or str(part).startswith("tagged-union["):
            continue  # the union's branch: the event's own kind says it
        else:
            out.append(str(part))
            node = node.get(part) if isinstance(node, dict) else None
    return ".".join(out)


def scenario_from_dict(data: dict, source: str = "<scenario>") -> ScenarioFile:
    """Validate a scenario file's tables; one-line :class:`KvtraceError` naming
    ``source``, the key and what was expected."""
    try:
        cfg = ScenarioFile.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        key = _loc(tuple(e["loc"]), data)
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        elif e["type"] == "missing":
            msg = "missing"
        elif e["type"] == "union_tag_invalid":
            msg = f"unknown event kind {e.get('input', {}).get('kind')!r}; expected one of {', '.join(EVENT_KINDS)}"
        elif e["type"] == "union_tag_not_found":
            msg = f"missing kind; expected one of {', '.join(EVENT_KINDS)}"
        msg = msg.removeprefix("Value error, ")
        raise KvtraceError(msg, path=source, field=key) from None
    names = [s.name for s in cfg.scenario]
    dup = next((n for n in names if names.count(n) > 1 or n == "plain"), None)
    if dup is not None:
        raise KvtraceError(f"scenario name {dup!r} is used twice or is the reserved baseline's ('plain')",
                           path=source, field="scenario.name")
    from kvtrace.analyses.whatif import parse_policy

    try:
        parse_policy(cfg.system.policy)
        cfg.tier_config()
    except UsageError as exc:
        raise KvtraceError(exc.message, path=source, field=f"system.{(exc.field or 'policy').replace('-', '_')}") \
            from None
    try:
        cfg.load_model()
    except UsageError as exc:
        raise KvtraceError(exc.message, path=source, field=f"load.{(exc.field or '').replace('-', '_')}") from None
    if cfg.run.warmup is not None:
        from kvtrace.analyses.curves import parse_warmup

        try:
            parse_warmup(cfg.run.warmup)
        except UsageError as exc:
            raise KvtraceError(exc.message, path=source, field="run.warmup") from None
    return cfg


def load_scenario(path: str | Path) -> ScenarioFile:
    """Read and validate a scenario TOML file."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise KvtraceError("no such file", path=str(path)) from None
    except UnicodeDecodeError as exc:
        raise KvtraceError(f"not UTF-8 text (byte {exc.start})", path=str(path)) from None
    except tomllib.TOMLDecodeError as exc:
        raise KvtraceError(f"not valid TOML: {exc}", path=str(path)) from None
    return scenario_from_dict(data, str(path))


__all__ = ["CatalogOutage", "ColdStart", "Congestion", "EVENT_KINDS", "Migration", "Prestage", "Prewarm", "Restored",
           "Rollout",
           "Scenario", "ScenarioFile", "TargetLoss", "Ttl", "load_scenario", "scenario_from_dict", "seconds"]
