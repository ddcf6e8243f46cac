"""Numba and memory settings for every kernel, in one place.

Kernels read their decorator flags from here rather than hard-coding them, so a user
(or a test) can change them with environment variables:

- ``KVTRACE_NUMBA_CACHE`` (default ``1``): cache compiled kernels on disk. A CLI pays
  the JIT on every start otherwise (seconds per command).
- ``KVTRACE_FASTMATH`` (default ``0``): kernels accumulate exact integer token counts
  and float sums whose order matters for bit-for-bit reproducibility, so fast-math
  stays off unless asked for.
"""

from __future__ import annotations

import functools
import os
import threading
from typing import Callable


def _flag(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() not in {"0", "false", "no", "off", ""}


NUMBA_CACHE: bool = _flag("KVTRACE_NUMBA_CACHE", True)
FASTMATH: bool = _flag("KVTRACE_FASTMATH", False)

#: Keyword arguments for ``numba.njit`` on serial kernels.
NJIT = {"cache": NUMBA_CACHE, "fastmath": FASTMATH, "nogil": True}
#: Small helpers of hot loops, inlined at the Numba IR level (a call with many array
#: arguments costs more than the helper's body).
NJIT_INLINE = {**NJIT, "inline": "always"}
#: Keyword arguments for ``numba.njit`` on kernels that use ``prange``.
NJIT_PARALLEL = {**NJIT, "parallel": True}


def stop_numpy_huge_pages() -> None:
    """Stop numpy asking the OS for huge pages for every large array (the CLI calls it
    for its own process). The kernels' random-access tables ask for huge pages
    themselves (:mod:`kvtrace.kernels.memory`); the per-access arrays, read once in
    order, gain nothing from them and pay for them: faulting in gigabytes of huge pages
    (with the usual ``madvise`` defrag, which compacts memory to find them) costs
    system time in proportion to the accesses. numpy reads
    ``NUMPY_MADVISE_HUGEPAGE`` at import, too early for a console script to set; this
    is the switch that variable sets."""
    setter = _numpy_huge_page_switch()
    if setter is not None:
        setter(False)


def _numpy_huge_page_switch():
    """numpy's ``_set_madvise_hugepage`` (returns the previous setting), or None."""
    import numpy as np

    core = getattr(np, "_core", None) or getattr(np, "core", None)
    return getattr(getattr(core, "multiarray", None), "_set_madvise_hugepage", None)


_plain_lock = threading.Lock()
_plain_depth = [0, None]  # calls inside plain_numpy_pages, numpy's setting before the first


def plain_numpy_pages(fn: Callable) -> Callable:
    """Run ``fn`` with numpy's huge-page request off (:func:`stop_numpy_huge_pages`),
    then put back what the caller had: the library's entry points (loading a trace,
    a curve, a replay) run at the CLI's speed when called from a program, which keeps
    numpy's default for its own arrays. Nested and concurrent calls share one switch:
    the first in turns it off, the last out restores it."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        setter = _numpy_huge_page_switch()
        if setter is None:
            return fn(*args, **kwargs)
        with _plain_lock:
            if _plain_depth[0] == 0:
                _plain_depth[1] = setter(False)
            _plain_depth[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            with _plain_lock:
                _plain_depth[0] -= 1
                if _plain_depth[0] == 0:
                    setter(_plain_depth[1])

    return wrapper
