"""The resources of the load model and the load levels to run (:mod:`kvtrace.analyses.load`)."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

from kvtrace.analyses.response import ResponseModel
from kvtrace.errors import UsageError

LINK_DISCIPLINES = ("fcfs", "ps")


@dataclass(frozen=True)
class LoadModel:
    """Queues a request crosses and what they serve, in SI units (bytes/s, s).

    Defaults are illustrative, as :class:`kvtrace.analyses.response.ResponseModel`'s
    are (8 GPUs per node, a 400 Gb/s NIC, two PCIe 5 NVMe drives of local SSD, a shared
    flash pool of 200 GB/s and 5 M reads/s, no uplink limit, no write budget, a
    one-minute queue-wait bound): pass measured values. ``host_link_bytes_per_s`` None
    is the response model's DRAM restore bandwidth, so that with no queueing the
    model is the response model (:mod:`kvtrace.analyses.load`, "zero-load limit").

    Parameters
    ----------
    gpus_per_node : int
        Prefill servers per node (0: nothing can be prefilled: overloaded at once).
    prefill_tokens_per_s : float, optional
        A measured prefill throughput of one GPU; None: the compute model (prefill
        FLOPs / the response model's ``recompute_flops_per_s``, peak x MFU).
    host_link_bytes_per_s, nic_bytes_per_s, local_ssd_bytes_per_s : float
        Per node: host-to-GPU link (None: the response model's DRAM bandwidth), NIC,
        local SSD (reads and writes).
    flash_bytes_per_s, flash_iops : float
        The shared flash pool's aggregate read/write bandwidth and reads per second,
        split evenly over ``flash_targets`` targets.
    flash_targets : int
        Targets of the pool; a block lives on the target its hash selects.
    uplink_bytes_per_s : float, optional
        A rack uplink every shared-flash byte crosses (None: not limiting).
    flash_write_bytes_per_s : float, optional
        Write budget of the background flash writes (None: none).
    route_s, decode_s : float
        Fixed routing/queueing overhead per request and first decode step.
    overlap : float
        Share of a request's prefill that may run while its restore is in flight
        (layer-wise load; 0 = none).
    link_discipline : str
        ``fcfs`` or ``ps`` (processor sharing) on every link.
    prefill_batch_tokens : int, optional
        Batch prefills on a GPU up to this many tokens (None: one request per pass).
    prefill_pass_s : float
        Fixed time of every GPU pass (what batching amortises).
    slo_ttft_s : float
        The TTFT a request must meet to count in the goodput.
    max_wait_s : float
        A queue wait beyond this declares the resource overloaded and stops the run.
    """

    gpus_per_node: int = 8
    prefill_tokens_per_s: float | None = None
    host_link_bytes_per_s: float | None = None
    nic_bytes_per_s: float = 50e9
    local_ssd_bytes_per_s: float = 14e9
    flash_bytes_per_s: float = 200e9
    flash_iops: float = 5e6
    flash_targets: int = 1
    uplink_bytes_per_s: float | None = None
    flash_write_bytes_per_s: float | None = None
    route_s: float = 0.0
    decode_s: float = 0.0
    overlap: float = 0.0
    link_discipline: str = "fcfs"
    prefill_batch_tokens: int | None = None
    prefill_pass_s: float = 0.0
    slo_ttft_s: float = 1.0
    max_wait_s: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.gpus_per_node, int) or self.gpus_per_node < 0:
            raise UsageError(f"expected a whole number of GPUs >= 0, got {self.gpus_per_node}", field="gpus-per-node")
        if not isinstance(self.flash_targets, int) or not 1 <= self.flash_targets <= 4096:
            raise UsageError(f"expected 1..4096 flash targets, got {self.flash_targets}", field="flash-targets")
        rates = ("prefill_tokens_per_s", "host_link_bytes_per_s", "nic_bytes_per_s", "local_ssd_bytes_per_s",
                 "flash_bytes_per_s", "flash_iops", "uplink_bytes_per_s", "flash_write_bytes_per_s")
        for name in rates:
            v = getattr(self, name)
            if v is not None and not (v >= 0 and v < math.inf):
                raise UsageError(f"expected a rate >= 0 (0: the resource cannot serve), got {v}", field=_opt(name))
        for name in ("route_s", "decode_s", "prefill_pass_s", "slo_ttft_s", "max_wait_s"):
            v = getattr(self, name)
            if not (v >= 0 and v < math.inf):
                raise UsageError(f"expected a time >= 0, got {v}", field=_opt(name))
        if not self.max_wait_s > 0:
            raise UsageError("expected a positive queue-wait bound", field="max-wait")
        if not 0 <= self.overlap <= 1:
            raise UsageError(f"expected an overlap fraction in [0, 1], got {self.overlap}", field="overlap")
        if self.link_discipline not in LINK_DISCIPLINES:
            raise UsageError(f"expected fcfs or ps, got '{self.link_discipline}'", field="link-discipline")
        if self.prefill_batch_tokens is not None and not (isinstance(self.prefill_batch_tokens, int)
                                                          and self.prefill_batch_tokens >= 1):
            raise UsageError(f"expected a token budget >= 1, got {self.prefill_batch_tokens}",
                             field="prefill-batch-tokens")

    @classmethod
    def in_units(cls, **kw) -> "LoadModel":
        """The model from the units people type, as ``kvtrace load``'s options and the
        ``[load]`` section take them: ``*_gbps`` (GB/s = 10**9 bytes/s) for
        ``*_bytes_per_s``, ``*_ms`` for ``*_s`` (``max_wait_s`` stays in seconds), the rest
        as the fields. Values are checked in those units, an error naming the option
        (``nic-gbps``) and the value as typed; None leaves a field at its default."""
        out = {}
        for key, v in kw.items():
            if v is None:
                continue
            if key.endswith("_gbps"):
                field, scale, what = _GBPS_FIELDS.get(key, key[:-5] + "_bytes_per_s"), 1e9, "a rate >= 0 GB/s"
            elif key.endswith("_ms"):
                field, scale, what = key[:-3] + "_s", 1e-3, "a time >= 0 ms"
            else:
                field, scale, what = key, None, None
            if field not in cls.__dataclass_fields__:
                raise TypeError(f"LoadModel has no field for {key}")
            if scale is not None:
                if not (v >= 0 and v < math.inf):
                    raise UsageError(f"expected {what}, got {v:g}", field=key.replace("_", "-"))
                v = v * scale
            out[field] = v
        return cls(**out)

    @property
    def nic_gbps(self) -> float:
        """NIC bandwidth, GB/s (10**9 bytes/s): the unit of ``kvtrace load``'s options."""
        return self.nic_bytes_per_s / 1e9

    @property
    def local_ssd_gbps(self) -> float:
        """Local SSD bandwidth, GB/s."""
        return self.local_ssd_bytes_per_s / 1e9

    @property
    def flash_pool_gbps(self) -> float:
        """Shared flash pool bandwidth, GB/s."""
        return self.flash_bytes_per_s / 1e9

    @property
    def slo_ttft_ms(self) -> float:
        """The TTFT SLO, ms."""
        return self.slo_ttft_s * 1e3

    def host_link(self, response: ResponseModel) -> float:
        """The host-to-GPU link's bandwidth, bytes/s."""
        return response.dram_bytes_per_s if self.host_link_bytes_per_s is None else self.host_link_bytes_per_s

    def to_dict(self) -> dict:
        return asdict(self)

    def assumptions(self, response: ResponseModel) -> str:
        """One line of what a verdict under this model assumed."""
        gpu = (f"{self.prefill_tokens_per_s:g} tokens/s per GPU" if self.prefill_tokens_per_s is not None
               else f"prefill at {response.recompute_flops_per_s / 1e12:g} TFLOP/s per GPU")
        links = (f"host link {self.host_link(response) / 1e9:g} GB/s, NIC {self.nic_bytes_per_s / 1e9:g} GB/s, "
                 f"local SSD {self.local_ssd_bytes_per_s / 1e9:g} GB/s, flash {self.flash_bytes_per_s / 1e9:g} GB/s "
                 f"and {self.flash_iops:g} reads/s over {self.flash_targets} target(s)")
        if self.uplink_bytes_per_s is not None:
            links += f", uplink {self.uplink_bytes_per_s / 1e9:g} GB/s"
        if self.flash_write_bytes_per_s is not None:
            links += f", write budget {self.flash_write_bytes_per_s / 1e9:g} GB/s"
        batch = ("one request per GPU pass" if self.prefill_batch_tokens is None
                 else f"prefill batches of <= {self.prefill_batch_tokens} tokens")
        return (f"{self.gpus_per_node} GPU(s) per node, {gpu}, {batch}; {links}; links "
                f"{self.link_discipline.upper()}; routing {self.route_s * 1e3:g} ms, first decode "
                f"{self.decode_s * 1e3:g} ms, restore/prefill overlap {self.overlap:g}")


#: ``in_units`` keys whose field is not ``<key minus _gbps>_bytes_per_s``.
_GBPS_FIELDS = {"flash_pool_gbps": "flash_bytes_per_s"}
#: Field -> the option that sets it (its unit is the option's; see :meth:`LoadModel.in_units`).
_OPTIONS = {"host_link_bytes_per_s": "host-link-gbps", "nic_bytes_per_s": "nic-gbps",
            "local_ssd_bytes_per_s": "local-ssd-gbps", "flash_bytes_per_s": "flash-pool-gbps",
            "uplink_bytes_per_s": "uplink-gbps", "flash_write_bytes_per_s": "flash-write-gbps",
            "prefill_tokens_per_s": "prefill-tokens-per-s", "flash_iops": "flash-iops", "route_s": "route-ms",
            "decode_s": "decode-ms", "prefill_pass_s": "prefill-pass-ms", "slo_ttft_s": "slo-ttft",
            "max_wait_s": "max-wait"}


def _opt(name: str) -> str:
    return _OPTIONS.get(name, name.replace("_", "-"))


@dataclass(frozen=True)
class LoadLevel:
    """A load to run: arrival times divided by ``factor`` (``rps``: the rate asked for)."""

    factor: float
    rps: float | None = None

    @property
    def label(self) -> str:
        return f"{self.rps:g} rps" if self.rps is not None else f"{self.factor:g}x"


_LEVEL = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(x?)\s*$", re.IGNORECASE)


def parse_levels(load: str | None, rps: str | None, base_rps: float | None) -> list[LoadLevel]:
    """``--load 0.5x,1x,2x`` (factors) or ``--rps 50,100`` (target arrival rates, over
    the trace's own measured rate ``base_rps``); default ``1x``."""
    if load is not None and rps is not None:
        raise UsageError("give --load or --rps, not both", field="load")
    text, field = (rps, "rps") if rps is not None else (load or "1x", "load")
    out = []
    for item in text.split(","):
        m = _LEVEL.match(item)
        if not m or (field == "rps" and m.group(2)):
            example = "50,100,200" if field == "rps" else "0.5x,1x,2x"
            raise UsageError(f"expected a comma list such as {example}, got '{item.strip()}'", field=field)
        v = float(m.group(1))
        if not v > 0 or not math.isfinite(v):
            raise UsageError(f"expected a positive value, got '{item.strip()}'", field=field)
        if field == "rps":
            if not base_rps:
                raise UsageError("--rps needs a trace with a measured arrival rate (two requests or more, "
                                 "different times); use --load", field="rps")
            out.append(LoadLevel(v / base_rps, v))
        else:
            out.append(LoadLevel(v))
    return out


__all__ = ["LINK_DISCIPLINES", "LoadLevel", "LoadModel", "parse_levels"]
