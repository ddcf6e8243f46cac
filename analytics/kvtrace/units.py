"""Parsing and formatting of sizes (bytes) and durations (seconds)."""

from __future__ import annotations

import math
import re
from fractions import Fraction

from kvtrace.errors import UsageError

_BINARY = {"b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50,
           "k": 2**10, "ki": 2**10, "m": 2**20, "mi": 2**20, "g": 2**30, "gi": 2**30,
           "t": 2**40, "ti": 2**40, "p": 2**50, "pi": 2**50}
_DECIMAL = {"kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str, *, field: str = "capacity") -> int:
    """Parse a byte size: ``64GiB``, ``1.5TiB``, ``500GB``, ``4096B``.

    Binary units (KiB..PiB, and bare K/M/G/T/P) are powers of 1024; decimal units
    (KB..PB) are powers of 1000; ``B`` is bytes. The unit is required: a bare number
    (``64``) is refused rather than read as bytes, the mistake it nearly always is
    (``--capacity 64`` meant 64 GiB). Case-insensitive, a space allowed before it.
    Returns whole bytes (rounded down).
    """
    m = _SIZE_RE.match(str(text))
    if not m:
        raise UsageError(f"expected a size such as 64GiB, 500GB or 4096B, got '{text}'", field=field)
    number, unit = float(m.group(1)), m.group(2).lower()
    if not unit:
        shown = str(text).strip()
        raise UsageError(f"'{shown}' has no unit: write {shown}GiB, {shown}GB or {shown}B", field=field)
    if unit in _BINARY:
        scale = _BINARY[unit]
    elif unit in _DECIMAL:
        scale = _DECIMAL[unit]
    else:
        raise UsageError(f"unknown size unit '{m.group(2)}' in '{text}' (use KiB..PiB or KB..PB)", field=field)
    value = number * scale
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"expected a positive size, got '{text}'", field=field)
    exact = int(Fraction(m.group(1)) * scale)  # exact: the float 8.2 * 10**9 floors to 8199999999
    if exact < 1:
        raise UsageError(f"expected at least one byte, got '{text}'", field=field)
    if exact >= 2**63:  # sizes are int64 bytes everywhere downstream
        raise UsageError(f"expected a size below 8 EiB (2**63 bytes), got '{text}'", field=field)
    return exact


_SIZE_UNITS = (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10),
               ("PB", 10**15), ("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))


def size_text(n: int) -> str:
    """The exact size as :func:`parse_size` reads it back, in its shortest whole-number
    form: ``448GiB``, ``3840GB``, ``4097B`` (``0`` for zero, which options read as none)."""
    n = int(n)
    if n == 0:
        return "0"
    forms = [f"{n // scale}{unit}" for unit, scale in _SIZE_UNITS if n % scale == 0] + [f"{n}B"]
    return min(forms, key=lambda s: (len(s.rstrip("BKMGTPi")), len(s)))


def parse_sizes(text: str, *, field: str = "capacity") -> list[int]:
    """Parse a comma-separated list of sizes (see :func:`parse_size`)."""
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise UsageError("expected at least one size", field=field)
    return [parse_size(p, field=field) for p in parts]


_DURATION = {"": 1.0, "s": 1.0, "sec": 1.0, "ms": 1e-3, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_DUR_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_duration(text: str, *, field: str = "duration") -> float:
    """Parse a duration in seconds: ``90``, ``90s``, ``250ms``, ``10min``, ``2h``, ``1d``."""
    m = _DUR_RE.match(str(text))
    if not m or m.group(2).lower() not in _DURATION:
        raise UsageError(f"expected a duration such as 90s, 10min or 2h, got '{text}'", field=field)
    return float(m.group(1)) * _DURATION[m.group(2).lower()]


def format_bytes(n: float) -> str:
    """Human-readable binary size: ``1.5 TiB``."""
    if n is None or math.isnan(n):
        return "-"
    if math.isinf(n):
        return "inf"
    for unit, scale in (("PiB", 2**50), ("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.3g} {unit}" if v < 100 else f"{v:.0f} {unit}"
    return f"{n:.0f} B"


def format_seconds(s: float) -> str:
    """Human-readable duration: ``42 ms``, ``3.2 s``, ``5.1 min``, ``2.0 h``."""
    if s is None or not math.isfinite(s):
        return "-"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{s / 60:.3g} min"
    return f"{s / 3600:.3g} h"
