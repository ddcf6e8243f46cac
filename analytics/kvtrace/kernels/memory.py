"""Memory for the kernels' random-access tables: huge pages where they pay.

The kernels read per-block tables (the tier simulator's rows, the stack's slot arrays,
the densify hash table) at random, hundreds of MB of them: with 4 KiB pages nearly
every access also misses the TLB, and 2 MiB pages (transparent huge pages) remove most
of those misses. numpy asks for huge pages for every large array, but the per-access
arrays, read once in order, gain nothing from them and pay for them: on a kernel that
only grants huge pages on request (``madvise``, the usual default) and compacts memory
to find them, faulting in gigabytes of them costs seconds of system time. So the CLI
turns numpy's request off (:func:`kvtrace.config.stop_numpy_huge_pages`) and the tables
ask for huge pages themselves (:func:`table_zeros`, :func:`table_full`). Under nested
paging (a VM) the kernels need not run faster on huge pages; what they save there is
the cost of faulting tables in and unmapping them. A table written whole at once
(``populate``) takes ordinary pages, faulted in by one call: asked for at once, hundreds
of MB of huge pages make the kernel find (compact) that many free 2 MiB regions before
the call returns, a cost that varies tenfold with the state of memory, where ordinary
pages cost the same each time. Results never depend on any of this.
"""

from __future__ import annotations

import mmap
import sys

import numpy as np

#: Tables smaller than this stay ordinary numpy arrays (a few huge pages gain nothing).
HUGE_MIN_BYTES = 8 << 20
#: Linux's MADV_POPULATE_WRITE (Python's mmap module names it from 3.13 only).
_MADV_POPULATE_WRITE = 23


def table_zeros(shape, dtype, populate: bool = False) -> np.ndarray:
    """A zeroed array for a random-access table, its memory advised to be backed by
    huge pages unless ``populate`` (anonymous memory: zero-filled, page-aligned; a plain
    numpy array when small, or where the system has no such advice).

    The mapping is private: Python's anonymous ``mmap`` is ``MAP_SHARED`` unless told
    otherwise, i.e. shared memory, which the usual settings never back with huge pages
    (``shmem_enabled`` is ``never`` by default) and which is slower to fault in and to
    unmap.

    ``populate``: the caller will write all of it, so fault every page in now, in one
    call (``MADV_POPULATE_WRITE``, Linux 5.14+; elsewhere the pages fault in as they are
    first written, as without it), cheaper than faulting page by page; a table
    written only in part must not ask for it (every page would count as resident)."""
    dtype = np.dtype(dtype)
    shape = (int(shape),) if np.isscalar(shape) else tuple(int(s) for s in shape)
    n = int(np.prod(shape, dtype=np.int64))
    nbytes = n * dtype.itemsize
    if nbytes < HUGE_MIN_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.zeros(shape, dtype=dtype)
    mm = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)  # not the default MAP_SHARED (see above)
    if not populate:  # written whole at once: ordinary pages (module docstring)
        try:
            mm.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # not supported here: ordinary pages
            pass
    if populate and sys.platform.startswith("linux"):
        try:
            mm.madvise(getattr(mmap, "MADV_POPULATE_WRITE", _MADV_POPULATE_WRITE))
        except OSError:  # an older kernel: pages fault in on first write
            pass
    return np.frombuffer(mm, dtype=dtype, count=n).reshape(shape)  # the array keeps the mapping alive


def table_full(shape, value, dtype) -> np.ndarray:
    """:func:`table_zeros` filled with ``value`` (populated at once when it is not 0)."""
    out = table_zeros(shape, dtype, populate=value != 0)
    if value != 0:
        out.fill(value)
    return out


class Scratch:
    """Memory for a run's tables, kept from one run to the next: runs that follow one
    another (a sweep's configurations) reuse it instead of faulting in fresh pages and
    unmapping them again (:func:`table_zeros` gives the cost).

    :meth:`get` hands out the same memory for the same ``name`` each time (grown when a
    run needs more), *not zeroed*: the caller initialises all of it, and the previous
    run must be done with it.
    """

    def __init__(self) -> None:
        self._bufs: dict[str, np.ndarray] = {}

    def get(self, nbytes: int, name: str = "table") -> np.ndarray:
        """uint8[nbytes], contents unspecified (huge pages as :func:`table_zeros`)."""
        nbytes = int(nbytes)
        buf = self._bufs.get(name)
        if buf is None or buf.shape[0] < nbytes:
            self._bufs.pop(name, None)  # the old mapping goes before the new one comes
            del buf
            buf = self._bufs[name] = table_zeros(nbytes, np.uint8, populate=True)
        return buf[:nbytes]

    def release(self) -> None:
        """Give the memory back (it is also freed with this object)."""
        self._bufs.clear()
