"""Large tables read at random: backed by transparent huge pages where the OS allows.

The kernels keep one row (or slot) per distinct block and touch them in trace order,
which is random order over hundreds of megabytes. With 4 KiB pages nearly every such
touch also misses the TLB (a page-table walk, itself often a cache miss); 2 MiB pages
cut the pages of a 340 MB table from ~83,000 to ~170, which the TLB holds. Linux maps
huge pages into a private anonymous mapping advised with ``MADV_HUGEPAGE`` when
transparent huge pages are enabled (``always`` or ``madvise``); elsewhere the mapping
is ordinary memory. Contents and results never depend on the page size.
"""

from __future__ import annotations

import mmap

import numpy as np

HUGE_PAGE = 1 << 21
#: Smaller tables gain nothing from huge pages (and would round up to 2 MiB).
MIN_HUGE_BYTES = 8 * HUGE_PAGE


def empty_table(nbytes: int) -> np.ndarray:
    """uint8[nbytes], uninitialised, starting on a 2 MiB boundary when large (a 64-byte
    one otherwise) and backed by huge pages where available. The mapping is released
    when the last view of it goes."""
    nbytes = int(nbytes)
    advise = getattr(mmap, "MADV_HUGEPAGE", None)
    private = getattr(mmap, "MAP_PRIVATE", None)
    if nbytes < MIN_HUGE_BYTES or advise is None or private is None:
        buf = np.empty(nbytes + 64, dtype=np.uint8)
        off = -buf.ctypes.data % 64
        return buf[off:off + nbytes]
    m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=private | mmap.MAP_ANONYMOUS)
    try:
        m.madvise(advise)
    except OSError:  # THP disabled ("never") or not supported: ordinary pages
        pass
    buf = np.frombuffer(m, dtype=np.uint8)
    off = -buf.ctypes.data % HUGE_PAGE
    return buf[off:off + nbytes]


def zeros_table(nbytes: int) -> np.ndarray:
    """:func:`empty_table` filled with zeros."""
    buf = empty_table(nbytes)
    buf.fill(0)
    return buf
