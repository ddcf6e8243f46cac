"""Display formats of the dashboard (the CLI's conventions: rates as 2-decimal
percentages, binary byte units, durations via :func:`kvtrace.units.format_seconds`)."""

from __future__ import annotations

import math

from kvtrace.units import format_bytes, format_seconds

__all__ = ["bandwidth", "dollars", "format_bytes", "format_seconds", "ms", "num", "pct"]


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def pct(x) -> str:
    """A share as ``12.34%`` (``-`` when missing)."""
    return "-" if _missing(x) else f"{100 * x:.2f}%"


def num(x, digits: int = 3) -> str:
    """An integer with thousands separators, or a float to ``digits`` significant digits."""
    if _missing(x):
        return "-"
    if isinstance(x, int) or (float(x).is_integer() and abs(x) < 1e15):
        return f"{int(x):,}"
    return f"{x:,.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"


def dollars(x) -> str:
    """``$1,234.56``; negative amounts as ``-$868.52``."""
    if _missing(x):
        return "-"
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"


def ms(milliseconds) -> str:
    """Milliseconds: ``181.0 ms``."""
    return "-" if _missing(milliseconds) else f"{milliseconds:,.1f} ms"


def bandwidth(bytes_per_s) -> str:
    return "-" if _missing(bytes_per_s) else format_bytes(bytes_per_s) + "/s"
