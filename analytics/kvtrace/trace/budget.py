"""The memory budget: the bytes one run may use, the one figure behind both memory decisions.

``kvtrace curve`` streams a Parquet trace whose in-memory run would exceed the budget
(:func:`kvtrace.ingest.stream.should_stream`), and the resource guard refuses a run whose
estimate exceeds it (:mod:`kvtrace.ingest.guard`). Both read :func:`memory_budget`, so in a
memory-limited container a run that does not fit is streamed or refused, never started in
memory against a figure the container's limit does not allow.

The budget is ``$KVTRACE_MEMORY_BUDGET`` (a size, e.g. ``64GiB``) when set; else the least of
the system's available memory (``MemAvailable`` in :data:`MEMINFO`) and the cgroup's remaining
allowance (v2 ``memory.max - memory.current``, v1 ``limit_in_bytes - usage_in_bytes``, the
files in :data:`CGROUP_FILES`); else, where neither can be read, the physical memory.
"""

from __future__ import annotations

import os

from kvtrace.units import parse_size

MEMORY_BUDGET_ENV = "KVTRACE_MEMORY_BUDGET"
MEMINFO = "/proc/meminfo"
#: (limit file, usage file) of cgroup v2, then v1; the first pair that can be read counts.
CGROUP_FILES = (
    ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
    ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
)
#: A cgroup limit at or above this is "no limit" (v1 writes a page-rounded 2**63 - 1).
_NO_LIMIT = 1 << 60


def memory_budget() -> tuple[int | None, str]:
    """(bytes this run may use, where that figure comes from), or ``(None, "")`` when
    nothing tells.

    The source is ``"$KVTRACE_MEMORY_BUDGET"``, ``"available"``, ``"left in this cgroup"``
    or ``"the physical memory"``, worded to follow "only 2 GiB is ..." in a message.
    """
    env = os.environ.get(MEMORY_BUDGET_ENV)
    if env:
        return parse_size(env, field=MEMORY_BUDGET_ENV), f"${MEMORY_BUDGET_ENV}"
    found: list[tuple[int, str]] = []
    avail = _mem_available()
    if avail is not None:
        found.append((avail, "available"))
    room = cgroup_room()
    if room is not None:
        found.append((room, "left in this cgroup"))
    if found:
        return min(found)
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "the physical memory"
    except (AttributeError, OSError, ValueError):
        return None, ""


def _mem_available() -> int | None:
    try:
        with open(MEMINFO) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_room() -> int | None:
    """Bytes this cgroup may still use (its limit minus its usage, at least 0), or None
    without a limit."""
    for limit_file, usage_file in CGROUP_FILES:
        try:
            with open(limit_file) as fh:
                limit = fh.read().strip()
            with open(usage_file) as fh:
                usage = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        if not limit.isdigit() or int(limit) >= _NO_LIMIT:  # "max": no limit
            return None
        return max(int(limit) - usage, 0)
    return None
