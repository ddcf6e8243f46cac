"""The kernels' table allocator (kvtrace.kernels.memory): what it returns must behave
as the numpy arrays it replaces, small (plain numpy) or large (an advised mapping)."""

from __future__ import annotations

import ctypes
import os
import platform
import re
import sys

import numpy as np
import pytest

from kvtrace.config import stop_numpy_huge_pages
from kvtrace.kernels import memory


@pytest.mark.parametrize("shape", [7, (3, 5), (memory.HUGE_MIN_BYTES // 8 + 3,), (memory.HUGE_MIN_BYTES // 64, 2, 4)])
@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_tables_are_zeroed_writable_arrays(shape, dtype):
    a = memory.table_zeros(shape, dtype)
    want = (shape,) if isinstance(shape, int) else shape
    assert a.shape == want and a.dtype == dtype and a.flags.writeable and a.flags.c_contiguous
    assert not a.any()
    a[...] = 3
    assert (a == 3).all()
    b = memory.table_full(shape, -1, np.int64)
    assert b.shape == want and (b == -1).all()


def test_a_large_table_is_its_own_mapping_and_outlives_its_name():
    a = memory.table_zeros(memory.HUGE_MIN_BYTES // 4, np.int32)
    assert a.ctypes.data % 4096 == 0  # page-aligned anonymous memory
    view = a[10:20]
    del a
    view[:] = 5  # the mapping lives as long as any view of it
    assert view.sum() == 50


def test_numpy_huge_pages_can_be_switched_off():
    setter = np._core.multiarray._set_madvise_hugepage
    before = setter(True)
    try:
        stop_numpy_huge_pages()
        assert setter(False) is False  # what stop_numpy_huge_pages left
    finally:
        setter(before)


def test_scratch_hands_out_the_same_memory_until_it_must_grow():
    s = memory.Scratch()
    a = s.get(1000)
    a[:] = 7
    b = s.get(600)
    assert b.shape == (600,) and b.ctypes.data == a.ctypes.data and (b == 7).all()  # reused, not zeroed
    c = s.get(memory.HUGE_MIN_BYTES + 1)  # grows: new memory, a mapping of its own
    assert c.shape == (memory.HUGE_MIN_BYTES + 1,) and c.ctypes.data % 4096 == 0
    assert s.get(10).ctypes.data == c.ctypes.data
    other = s.get(10, "requests")  # another name, other memory
    assert other.ctypes.data != c.ctypes.data and s.get(10, "requests").ctypes.data == other.ctypes.data
    s.release()
    assert s.get(10).shape == (10,)


def _resident_bytes(a: np.ndarray) -> int:
    """Resident bytes of the pages holding ``a`` (page-aligned), by mincore(2)."""
    page = os.sysconf("SC_PAGE_SIZE")
    pages = -(-a.nbytes // page)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    if libc.mincore(a.ctypes.data, a.nbytes, vec) != 0:
        raise OSError(ctypes.get_errno(), "mincore")
    return sum(b & 1 for b in vec) * page


def _linux_at_least(major: int, minor: int) -> bool:
    m = re.match(r"(\d+)\.(\d+)", platform.release())
    return sys.platform.startswith("linux") and m is not None and (int(m[1]), int(m[2])) >= (major, minor)


@pytest.mark.skipif(not _linux_at_least(5, 14), reason="MADV_POPULATE_WRITE is Linux 5.14+")
def test_a_populated_table_is_resident_before_it_is_written():
    n = 4 * memory.HUGE_MIN_BYTES
    lazy = memory.table_zeros(n, np.uint8)
    assert _resident_bytes(lazy) < n // 2  # faults in as it is written
    full = memory.table_zeros(n, np.uint8, populate=True)
    assert _resident_bytes(full) >= n  # every page in at once
    lazy[:] = 1
    assert _resident_bytes(lazy) >= n


def _smaps_entry(addr: int) -> dict[str, int]:
    """The kB fields of the mapping of this process that holds ``addr`` (/proc/self/smaps)."""
    fields: dict[str, int] | None = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
            if head:
                if fields is not None:
                    break
                if int(head[1], 16) <= addr < int(head[2], 16):
                    fields = {}
            elif fields is not None:
                m = re.match(r"(\w+):\s+(\d+) kB", line)
                if m:
                    fields[m[1]] = int(m[2])
    assert fields is not None, f"no mapping holds {addr:#x}"
    return fields


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs Linux's /proc/self/smaps")
def test_a_large_table_is_private_anonymous_memory():
    # Python's anonymous mmap is MAP_SHARED unless told otherwise: shared memory
    # (shmem), which the usual THP settings never back with huge pages and which is
    # slower to fault in and unmap; its resident pages are not counted as Anonymous
    n = 4 * memory.HUGE_MIN_BYTES
    a = memory.table_zeros(n, np.uint8)
    a[:] = 1
    entry = _smaps_entry(a.ctypes.data)
    assert entry["Rss"] >= n // 1024
    assert entry["Anonymous"] == entry["Rss"] and entry.get("Shared_Dirty", 0) == 0


def test_library_entry_points_run_with_numpy_huge_pages_off_and_restore_them():
    """A program calling kvtrace keeps numpy's huge-page setting for its own arrays: an
    entry point turns it off while it runs (nested and concurrent calls share one
    switch) and puts back what the caller had."""
    import threading

    from kvtrace.config import plain_numpy_pages

    setter = np._core.multiarray._set_madvise_hugepage
    seen = []

    @plain_numpy_pages
    def inner():
        seen.append(setter(False))  # what numpy had inside: off
        return 7

    @plain_numpy_pages
    def outer():
        assert inner() == 7
        seen.append(setter(False))  # still off after the nested call returned
        threads = [threading.Thread(target=inner) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seen.append(setter(False))

    before = setter(True)
    try:
        outer()
        assert seen == [False] * 7
        assert setter(True) is True  # restored
        setter(False)
        outer()
        assert setter(False) is False  # a caller that had it off keeps it off
    finally:
        setter(before)


def test_the_entry_points_are_wrapped():
    from kvtrace.analyses.curves import compute_curve
    from kvtrace.analyses.whatif.simulate import simulate
    from kvtrace.ingest import load_trace

    for fn in (load_trace, compute_curve, simulate):
        assert fn.__wrapped__.__name__ == fn.__name__
