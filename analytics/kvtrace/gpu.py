"""GPU descriptions: the prefill speed and price that turn avoided FLOPs into time and money.

GPU time and money follow DESIGN §1: GPU-seconds = FLOPs / (peak_flops x mfu), dollars
= GPU-seconds x $/GPU-hour / 3600. Prefill FLOPs come from :class:`kvtrace.model.ModelSpec`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from kvtrace.errors import UsageError
from kvtrace.presets import Presets, is_real

if TYPE_CHECKING:
    from kvtrace.model import ModelSpec

__all__ = ["DEFAULT_GPU", "DEFAULT_MFU", "GPUS", "GpuSpec", "gpus_table", "resolve_gpu"]

#: Default model FLOPs utilisation for prefill. Prefill is compute-bound and large
#: batched prompts reach roughly 0.4-0.6 of dense peak on Hopper-class GPUs; 0.5 is the
#: middle. Savings scale as 1/mfu, so set a measured value (or use
#: :meth:`GpuSpec.from_throughput`) when the answer matters.
DEFAULT_MFU = 0.5


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """A GPU's prefill speed and price.

    Parameters
    ----------
    name : str
        Display name.
    peak_flops : float
        Dense (no sparsity) BF16 tensor-core peak, FLOP/s.
    dollars_per_hour : float
        Price of one GPU-hour, $/h. Preset prices are illustrative cloud rates, not
        quotes: pass your own.
    mfu : float
        Model FLOPs utilisation achieved by prefill, in (0, 1]; default
        :data:`DEFAULT_MFU`.
    """

    name: str
    peak_flops: float
    dollars_per_hour: float
    mfu: float = DEFAULT_MFU

    def __post_init__(self) -> None:
        for field in ("peak_flops", "dollars_per_hour", "mfu"):
            value = getattr(self, field)
            if not is_real(value) or not math.isfinite(value):
                raise UsageError(f"expected a number, got {value!r}", field=field)
            object.__setattr__(self, field, float(value))
        if self.peak_flops <= 0:
            raise UsageError(f"expected a positive FLOP/s, got {self.peak_flops!r}", field="peak_flops")
        if self.dollars_per_hour < 0:
            raise UsageError(f"expected a non-negative price, got {self.dollars_per_hour!r}", field="dollars_per_hour")
        if not 0 < self.mfu <= 1:
            raise UsageError(f"expected a fraction in (0, 1], got {self.mfu!r}", field="mfu")

    @property
    def effective_flops(self) -> float:
        """Sustained prefill FLOP/s: ``peak_flops x mfu``."""
        return self.peak_flops * self.mfu

    def gpu_seconds(self, flops):
        """GPU-seconds to compute ``flops`` FLOPs (scalar or array): ``flops / (peak x mfu)``."""
        return flops / self.effective_flops

    def dollars(self, flops):
        """Dollars to compute ``flops`` FLOPs: GPU-seconds x $/h / 3600."""
        return self.gpu_seconds(flops) * (self.dollars_per_hour / 3600.0)

    @classmethod
    def from_throughput(
        cls,
        tokens_per_s: float,
        model: ModelSpec,
        *,
        prompt_tokens: int,
        gpu: GpuSpec | str | None = None,
    ) -> GpuSpec:
        """A GPU whose ``mfu`` is calibrated from a measured prefill throughput.

        The measured rate fixes the sustained FLOP/s at one prompt length; FLOPs still
        depend on position, so a token late in a long prompt stays dearer than an early
        one (a flat seconds-per-token rate would lose that).

        Parameters
        ----------
        tokens_per_s : float
            Measured prefill throughput per GPU, tokens/s (divide a tensor-parallel
            group's throughput by its GPU count).
        model : ModelSpec
            The model the throughput was measured on.
        prompt_tokens : int
            Prompt length of the measurement, tokens (its mean FLOPs per token is
            ``model.prefill_flops(prompt_tokens) / prompt_tokens``).
        gpu : GpuSpec or str, optional
            The GPU measured (peak and price); default :data:`DEFAULT_GPU`.

        Raises
        ------
        UsageError
            A non-positive input, or a throughput above the GPU's dense BF16 peak
            (e.g. an FP8 measurement: pass a GpuSpec with the FP8 peak).
        """
        base = gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu)
        if not (is_real(tokens_per_s) and math.isfinite(tokens_per_s) and tokens_per_s > 0):
            raise UsageError(f"expected a positive throughput, got {tokens_per_s!r}", field="prefill_tokens_per_s")
        if isinstance(prompt_tokens, bool) or not isinstance(prompt_tokens, (int, np.integer)) or prompt_tokens <= 0:
            raise UsageError(f"expected a positive integer, got {prompt_tokens!r}", field="prompt_tokens")
        flops_per_token = model.prefill_flops(int(prompt_tokens)) / prompt_tokens
        mfu = tokens_per_s * flops_per_token / base.peak_flops
        if mfu > 1:
            raise UsageError(
                f"{tokens_per_s:g} tokens/s on {model.name} needs {mfu:.2f}x the {base.name} peak "
                f"of {base.peak_flops:.3g} FLOP/s; check the model, the per-GPU rate or peak_flops",
                field="prefill_tokens_per_s",
            )
        return dataclasses.replace(base, name=f"{base.name} (measured)", mfu=mfu)


# Dense BF16 tensor peaks from NVIDIA datasheets (the "with sparsity" figures are 2x
# these). Prices are illustrative on-demand cloud rates per GPU-hour, not quotes.
_GPU_LIST = [
    GpuSpec(name="A100", peak_flops=312e12, dollars_per_hour=1.50),
    GpuSpec(name="H100", peak_flops=989e12, dollars_per_hour=2.50),
    GpuSpec(name="H200", peak_flops=989e12, dollars_per_hour=3.50),
    GpuSpec(name="B200", peak_flops=2.25e15, dollars_per_hour=5.00),
]
_GPU_ALIASES = {
    "A100": ("A100-SXM", "A100-80GB", "A100-SXM4-80GB"),
    "H100": ("H100-SXM", "H100-SXM5", "H100-80GB", "H100-SXM5-80GB"),
    "H200": ("H200-SXM", "H200-141GB"),
    "B200": ("HGX-B200", "DGX-B200"),
}

#: Preset GPUs (SXM parts), case-insensitive lookup with aliases.
GPUS: Mapping[str, GpuSpec] = Presets({g.name: g for g in _GPU_LIST}, _GPU_ALIASES)

DEFAULT_GPU = "H100"


def resolve_gpu(
    name: str | None = None,
    *,
    mfu: float | None = None,
    dollars_per_hour: float | None = None,
    peak_flops: float | None = None,
) -> GpuSpec:
    """A preset GPU, with optional overrides.

    Parameters
    ----------
    name : str, optional
        Preset name (see :data:`GPUS`); default :data:`DEFAULT_GPU`.
    mfu : float, optional
        Prefill model FLOPs utilisation in (0, 1].
    dollars_per_hour : float, optional
        Price per GPU-hour, $/h.
    peak_flops : float, optional
        Dense BF16 peak, FLOP/s.

    Raises
    ------
    UsageError
        Unknown name (with close matches) or an invalid override.
    """
    text = DEFAULT_GPU if name is None else str(name)
    canonical = GPUS.canonical(text)  # type: ignore[attr-defined]
    if canonical is None:
        close = GPUS.close_matches(text)  # type: ignore[attr-defined]
        hint = f"did you mean {', '.join(close)}?" if close else f"known GPUs: {', '.join(GPUS)}"
        raise UsageError(f"unknown GPU '{text}'; {hint}", field="gpu")
    overrides = {k: v for k, v in (("mfu", mfu), ("dollars_per_hour", dollars_per_hour),
                                   ("peak_flops", peak_flops)) if v is not None}
    return dataclasses.replace(GPUS[canonical], **overrides)


def gpus_table() -> pl.DataFrame:
    """The preset GPUs as a table.

    Returns
    -------
    polars.DataFrame
        ``name`` str · ``peak_flops`` float64 (dense BF16 FLOP/s) · ``mfu`` float64 ·
        ``effective_flops`` float64 (FLOP/s) · ``dollars_per_hour`` float64
        (illustrative $/GPU-hour).
    """
    rows = [
        {"name": g.name, "peak_flops": g.peak_flops, "mfu": g.mfu,
         "effective_flops": g.effective_flops, "dollars_per_hour": g.dollars_per_hour}
        for g in GPUS.values()
    ]
    schema = {"name": pl.String, "peak_flops": pl.Float64, "mfu": pl.Float64,
              "effective_flops": pl.Float64, "dollars_per_hour": pl.Float64}
    return pl.DataFrame(rows, schema=schema)
