"""The sizing configuration: its TOML schema, validation, reading and writing, and the
illustrative defaults of ``sample_traces/tiers.example.toml``.

:data:`SECTIONS` and :data:`TIER_KEYS` are the schema: every TOML key with the
attribute it fills and its kind (``str``, ``int``, ``size``, ``size0``, ``money``,
``positive``, ``nonneg``, ``fraction``, ``share``, ``strlist``); the dashboard's form
is built from them. Sizes are bytes, SLO times ms, windows s, money $.
"""

from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from kvtrace.analyses.estimate import HOURS_PER_MONTH
from kvtrace.analyses.response import ResponseModel
from kvtrace.errors import KvtraceError, UsageError
from kvtrace.gpu import DEFAULT_GPU, GPUS
from kvtrace.units import format_bytes, parse_size, size_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

TIB = 2**40
GIB = 2**30
TIERS = ("dram", "local_ssd", "shared_flash")
CANDIDATES = ("keep-dram", "expand-dram", "add-local-ssd", "add-shared-flash", "dram+flash", "recompute-only")
LENSES = ("same-slo", "same-capacity", "same-budget")
CANDIDATE_TEXT = {
    "keep-dram": "keep DRAM", "expand-dram": "expand DRAM", "add-local-ssd": "add local SSD",
    "add-shared-flash": "add shared flash", "dram+flash": "DRAM + flash", "recompute-only": "recompute only",
}


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
TIER_KEYS = {
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
SECTIONS = {
    "model": {"name": ("model", "str"), "kv_bytes_per_token": ("kv_bytes_per_token", "int"),
              "dtype": ("dtype", "str")},
    "gpu": {"name": ("gpu", "str"), "dollars_per_hour": ("gpu_dollars_per_hour", "money"),
            "peak_tflops": ("gpu_peak_tflops", "positive"), "mfu": ("gpu_mfu", "fraction")},
    "slo": {"mean_ms": ("slo_mean_ms", "positive"), "p99_ms": ("slo_p99_ms", "positive"),
            "ttft_mean_ms": ("slo_ttft_mean_ms", "positive"), "ttft_p99_ms": ("slo_ttft_p99_ms", "positive")},
    "economics": {"realisation": ("realisation", "share"), "dollars_per_kwh": ("dollars_per_kwh", "money"),
                  "hours_per_month": ("hours_per_month", "positive"),
                  "budget_monthly_usd": ("budget_monthly_usd", "positive"),
                  "same_capacity": ("same_capacity_bytes", "size")},
    "load": {"scale": ("load_scale", "positive"), "rps": ("load_rps", "positive"),
             "window_s": ("window_s", "positive"), "warmup": ("warmup", "str"),
             **{k: (f"queue_{k}", kind) for k, kind in (
                 ("gpus_per_node", "int"), ("prefill_tokens_per_s", "positive"), ("prefill_batch_tokens", "int"),
                 ("prefill_pass_ms", "nonneg"), ("host_link_gbps", "nonneg"), ("nic_gbps", "nonneg"),
                 ("local_ssd_gbps", "nonneg"), ("flash_pool_gbps", "nonneg"), ("flash_iops", "nonneg"),
                 ("flash_targets", "int"), ("uplink_gbps", "nonneg"), ("flash_write_gbps", "nonneg"),
                 ("link_discipline", "str"), ("overlap", "share"), ("route_ms", "nonneg"), ("decode_ms", "nonneg"),
                 ("max_wait_s", "positive"))}},
    "deployment": {"nodes": ("nodes", "int"), "routing": ("routing", "str"), "dram": ("current_dram_bytes", "size0")},
    "search": {"policies": ("policies", "strlist"), "eviction": ("eviction", "str"),
               "cache_rules": ("cache_rules", "str")},
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
    slo_ttft_mean_ms, slo_ttft_p99_ms : float or None
        Targets for the time to first token under load (``[slo] ttft_mean_ms`` /
        ``ttft_p99_ms``): given, every candidate is also simulated with queues at the
        configured load (:mod:`kvtrace.analyses.load`) and must meet them there.
    realisation : float
        Share of freed GPU time that becomes money (``[economics]``).
    dollars_per_kwh, hours_per_month : float
    budget_monthly_usd : float or None
        Budget of the same-budget lens, $ per month (default: the same-SLO winner's cost).
    same_capacity_bytes : int or None
        Total capacity of the same-capacity lens (default: the curve's 95 % knee).
    load_scale : float
        Replay at this multiple of the trace's arrival rate (``[load] scale``, the growth
        factor).
    load_rps : float or None
        Replay at this arrival rate instead (``[load] rps``).
    queue_* : optional
        The resources of the load model (``[load] gpus_per_node``, ``nic_gbps`` ... as
        :class:`kvtrace.analyses.load.LoadModel` and ``kvtrace load``'s options; unset:
        its defaults); see :meth:`load_model`.
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
    cache_rules : str
        ``ideal``, ``vllm`` or ``sglang``: the engine reuse rules every replay applies
        to the tiers (:data:`kvtrace.analyses.whatif.TIER_RULES`; the search's
        estimates from reuse distances stay the ideal model's, each candidate shown
        is replayed under the rules).
    tiers : dict of str to TierSpec
        ``dram`` (required), ``local_ssd`` and ``shared_flash`` (a missing flash tier
        drops its candidates).
    """

    current_dram_bytes: int
    realisation: float
    tiers: dict
    slo_mean_ms: float | None = None
    slo_p99_ms: float | None = None
    slo_ttft_mean_ms: float | None = None
    slo_ttft_p99_ms: float | None = None
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
    load_rps: float | None = None
    queue_gpus_per_node: int | None = None
    queue_prefill_tokens_per_s: float | None = None
    queue_prefill_batch_tokens: int | None = None
    queue_prefill_pass_ms: float | None = None
    queue_host_link_gbps: float | None = None
    queue_nic_gbps: float | None = None
    queue_local_ssd_gbps: float | None = None
    queue_flash_pool_gbps: float | None = None
    queue_flash_iops: float | None = None
    queue_flash_targets: int | None = None
    queue_uplink_gbps: float | None = None
    queue_flash_write_gbps: float | None = None
    queue_link_discipline: str | None = None
    queue_overlap: float | None = None
    queue_route_ms: float | None = None
    queue_decode_ms: float | None = None
    queue_max_wait_s: float | None = None
    window_s: float = 60.0
    warmup: str | None = None
    nodes: int = 1
    routing: str = "session"
    policies: tuple = ("all", "second-hit", "tinylfu")
    eviction: str = "prefix-aware"
    cache_rules: str = "ideal"

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
        known = set(SECTIONS) | {"tiers"}
        for sec in d:
            if sec not in known:
                raise err(sec, f"unknown section; expected one of {', '.join(sorted(known))}")
        kw: dict = {}
        for sec, keys in SECTIONS.items():
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
                if k not in TIER_KEYS:
                    raise err(f"tiers.{name}.{k}", f"unknown key; expected one of {', '.join(TIER_KEYS)}")
            for k, (attr, kind, req_dram, req_flash) in TIER_KEYS.items():
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
        if "cache_rules" in kw and kw["cache_rules"] not in ("ideal", "vllm", "sglang"):
            raise err("search.cache_rules", f"expected ideal, vllm or sglang, got '{kw['cache_rules']}'")
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
        if "load_rps" in kw and "load_scale" in kw:
            raise err("load.rps", "give [load] scale or rps, not both")
        queue = {k: v for k, v in kw.items() if k.startswith("queue_")}
        if queue and "slo_ttft_mean_ms" not in kw and "slo_ttft_p99_ms" not in kw:
            raise err("slo.ttft_p99_ms", "the [load] resources are simulated against a TTFT target: expected "
                                         "[slo] ttft_p99_ms and/or ttft_mean_ms (ms)")
        try:
            if queue or "slo_ttft_mean_ms" in kw or "slo_ttft_p99_ms" in kw:
                cls(**{**kw, "current_dram_bytes": 0, "realisation": 0.0, "tiers": {}}).load_model()
        except UsageError as exc:
            raise err(f"load.{exc.field.replace('-', '_')}" if exc.field else "load", exc.message) from None
        if "warmup" in kw:
            from kvtrace.analyses.curves import parse_warmup

            try:
                parse_warmup(kw["warmup"])
            except UsageError as exc:
                raise err("load.warmup", exc.message) from None
        return cls(**kw)

    @property
    def loaded(self) -> bool:
        """Whether candidates are also simulated under load (a TTFT target is set)."""
        return self.slo_ttft_mean_ms is not None or self.slo_ttft_p99_ms is not None

    def load_model(self):
        """The :class:`kvtrace.analyses.load.LoadModel` of the ``[load]`` resources (its
        defaults where unset); the TTFT SLO is ``ttft_p99_ms`` (else ``ttft_mean_ms``)."""
        from kvtrace.analyses.load import LoadModel

        kw = {f[len("queue_"):]: getattr(self, f) for f in self.__dataclass_fields__ if f.startswith("queue_")}
        slo = self.slo_ttft_p99_ms if self.slo_ttft_p99_ms is not None else self.slo_ttft_mean_ms
        if slo is not None:
            kw["slo_ttft_s"] = slo / 1e3
        return LoadModel.in_units(**kw)

    def ttft_slo_text(self) -> str:
        """``TTFT P99 <= 2000 ms under load``."""
        parts = []
        if self.slo_ttft_mean_ms is not None:
            parts.append(f"TTFT mean <= {self.slo_ttft_mean_ms:g} ms")
        if self.slo_ttft_p99_ms is not None:
            parts.append(f"TTFT P99 <= {self.slo_ttft_p99_ms:g} ms")
        return " and ".join(parts) + " under load"

    def meets_ttft(self, row: dict) -> bool:
        """Whether a load level's row meets the TTFT targets (every request finished)."""
        if row.get("overloaded"):
            return False
        for target, got in ((self.slo_ttft_mean_ms, row.get("ttft_mean_ms")),
                            (self.slo_ttft_p99_ms, row.get("ttft_p99_ms"))):
            if target is not None and (got is None or got > target):
                return False
        return True

    # ------------------------------------------------------------------ writing
    def to_dict(self) -> dict:
        """The nested TOML layout (sizes as exact strings such as ``64GiB``; unset keys left out)."""
        out: dict = {}
        for sec, keys in SECTIONS.items():
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
            for k, (attr, kind, _, _) in TIER_KEYS.items():
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
        for sec in SECTIONS:
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
    return config_from_toml(data, str(p))


def config_from_toml(data: bytes, source: str) -> SizingConfig:
    """Validate the bytes of a sizing TOML file (read from disk, or uploaded) named ``source``
    in every error (bad UTF-8, bad TOML with its line, a bad key)."""
    try:
        d = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise KvtraceError("expected UTF-8 TOML text", path=source) from None
    except tomllib.TOMLDecodeError as exc:
        raise KvtraceError(f"invalid TOML: {exc}", path=source) from None
    return SizingConfig.from_dict(d, source=source)


def default_config() -> SizingConfig:
    """The numbers of ``sample_traces/tiers.example.toml`` (illustrative, not quotes).

    Sized for ``sample_traces/chat.jsonl``: today's 64 GiB of DRAM sits on the steep part
    of its curve (the 95 % knee is near 300 GiB for Llama-3.1-70B).

    The restore speeds of DRAM and of the shared pool are those of
    :class:`kvtrace.analyses.response.ResponseModel` (``ResponseModel()``), the GPU is the
    :data:`kvtrace.gpu.DEFAULT_GPU` preset. The shared pool's per-request overhead is
    larger than the response model's (a lookup across the network, not in the host), and
    the local SSD has its own speeds.
    """
    r = ResponseModel()
    gpu = GPUS[DEFAULT_GPU]
    return SizingConfig(
        current_dram_bytes=64 * GIB,
        realisation=0.6,
        slo_mean_ms=100.0,
        slo_p99_ms=600.0,
        model="Llama-3.1-70B",
        gpu=DEFAULT_GPU,
        gpu_dollars_per_hour=gpu.dollars_per_hour,
        gpu_peak_tflops=gpu.peak_flops / 1e12,
        gpu_mfu=gpu.mfu,
        dollars_per_kwh=0.12,
        hours_per_month=HOURS_PER_MONTH,
        load_scale=1.0,
        window_s=60.0,
        nodes=1,
        routing="session",
        policies=("all", "second-hit", "tinylfu"),
        eviction="prefix-aware",
        tiers={
            "dram": TierSpec(step_bytes=64 * GIB, max_bytes=1 * TIB, dollars_per_tib=12000.0,
                             latency_ms=r.dram_latency_ms, restore_gbps=r.dram_gbps, bandwidth_gbps=50.0,
                             watts_per_tib=150.0, amortisation_months=36.0),
            "local_ssd": TierSpec(step_bytes=parse_size("3.84TB"), max_bytes=parse_size("30.72TB"),
                                  dollars_per_tib=320.0, unit_bytes=parse_size("3.84TB"), watts_per_unit=12.0,
                                  amortisation_months=48.0, latency_ms=0.1, restore_gbps=12.0, bandwidth_gbps=6.0,
                                  overhead_ms=0.5, endurance_dwpd=3.0),
            "shared_flash": TierSpec(step_bytes=16 * TIB, max_bytes=512 * TIB, dollars_per_tib=200.0,
                                     dollars_per_unit=40000.0, unit_bytes=parse_size("368.64TB"),
                                     support_monthly_per_unit=500.0, watts_per_tib=4.0, watts_per_unit=800.0,
                                     amortisation_months=48.0, latency_ms=r.flash_latency_ms,
                                     restore_gbps=r.flash_gbps, bandwidth_gbps=80.0, overhead_ms=2.0,
                                     endurance_dwpd=1.0),
        },
    )
