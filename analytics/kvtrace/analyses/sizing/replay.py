"""The ``kvtrace whatif`` reproduction of a sizing configuration: the options as data
(:class:`WhatifReplay`), and the one place that writes them as a command line
(:func:`whatif_args`, :func:`whatif_command`), which the report, the CLI and the JSON
result share.

The command line leaves out what ``kvtrace whatif`` assumes by default: the flash
options without a flash tier, ``--nodes`` / ``--routing`` on one node, ``--eviction``
for the prefix-aware LRU, and the optional model and warm-up overrides when unset.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from kvtrace.units import size_text

__all__ = ["WhatifReplay", "whatif_args", "whatif_command"]


@dataclass(frozen=True)
class WhatifReplay:
    """The options of ``kvtrace whatif`` that replay one configuration as the sizing run did.

    Parameters
    ----------
    trace : str
        The trace path the command names.
    dram_bytes, local_ssd_bytes, flash_bytes : int
        DRAM and local SSD per node, shared flash pool, bytes (0: no such tier).
    policy : str or None
        Flash admission policy; None without a flash tier.
    nodes : int
    routing : str
    model : str
        Model preset or ``config.json`` path.
    kv_bytes_per_token : int or None
        Override of the model's KV bytes per token.
    dtype : str or None
        Override of the model's KV cache dtype.
    gpu : str
        GPU preset name.
    mfu : float
        Prefill model FLOPs utilisation.
    gpu_dollars_per_hour : float
        $ per GPU-hour.
    dram_gbps, dram_latency_ms : float
        DRAM restore bandwidth (GB/s) and fixed latency (ms).
    flash_gbps, flash_latency_ms, overhead_ms : float or None
        Flash restore bandwidth (GB/s), fixed latency (ms) and per-request overhead (ms)
        of the flash tier; None without one.
    eviction : str
        ``prefix-aware`` or ``flat``.
    cache_rules : str
        ``ideal``, ``vllm`` or ``sglang``.
    warmup : str or None
        Warm-up fraction or duration.
    """

    trace: str
    dram_bytes: int
    local_ssd_bytes: int
    flash_bytes: int
    policy: str | None
    nodes: int
    routing: str
    model: str
    kv_bytes_per_token: int | None
    dtype: str | None
    gpu: str
    mfu: float
    gpu_dollars_per_hour: float
    dram_gbps: float
    dram_latency_ms: float
    flash_gbps: float | None
    flash_latency_ms: float | None
    overhead_ms: float | None
    eviction: str
    warmup: str | None
    cache_rules: str = "ideal"

    @property
    def has_flash(self) -> bool:
        """Whether the configuration has a flash tier (local SSD or a shared pool)."""
        return bool(self.local_ssd_bytes or self.flash_bytes)


def whatif_args(replay: WhatifReplay) -> list[str]:
    """The arguments of ``kvtrace whatif`` (after the command name) that replay ``replay``:
    the trace, then the options; sizes exactly, with their units (``64GiB``)."""
    r = replay
    args = [r.trace, "--dram", size_text(r.dram_bytes)]
    if r.flash_bytes:
        args += ["--flash", size_text(r.flash_bytes)]
    if r.local_ssd_bytes:
        args += ["--local-ssd", size_text(r.local_ssd_bytes)]
    if r.has_flash:
        args += ["--policy", r.policy]
    if r.nodes > 1:
        args += ["--nodes", str(r.nodes), "--routing", r.routing]
    args += ["--model", r.model]
    if r.kv_bytes_per_token is not None:
        args += ["--kv-bytes-per-token", str(r.kv_bytes_per_token)]
    if r.dtype is not None:
        args += ["--dtype", r.dtype]
    args += ["--gpu", r.gpu, "--mfu", repr(r.mfu), "--gpu-price", repr(r.gpu_dollars_per_hour)]
    args += ["--dram-gbps", repr(r.dram_gbps), "--dram-latency-ms", repr(r.dram_latency_ms)]
    if r.has_flash:
        args += ["--flash-gbps", repr(r.flash_gbps), "--flash-latency-ms", repr(r.flash_latency_ms),
                 "--overhead-ms", repr(r.overhead_ms)]
    if r.eviction != "prefix-aware":
        args += ["--eviction", r.eviction]
    if r.cache_rules != "ideal":
        args += ["--cache-rules", r.cache_rules]
    if r.warmup:
        args += ["--warmup", r.warmup]
    return args


def whatif_command(replay: WhatifReplay | None) -> str:
    """``kvtrace whatif ...``: the shell command that replays ``replay`` ("" for None)."""
    if replay is None:
        return ""
    return shlex.join(["kvtrace", "whatif", *whatif_args(replay)])
