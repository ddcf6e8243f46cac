"""Resource guard: refuse, before the work starts, a run that would not fit in memory.

After the request table is read and validated, and before the access table is built,
:func:`check_memory` estimates the peak memory of the analysis that follows from the
trace's block accesses N, distinct blocks M and requests R::

    bytes ~ a x N + b x M + c x R

with per-command coefficients measured on synthetic chat traces (peak resident set
size of the command at 2.0M and 10.0M accesses, slope between the two; the README
performance table gives 2.34 GB for a 30.0M-access curve, which this model reproduces
within 3 %). M is first bounded by N; only when that bound does not fit are the
distinct blocks counted (one pass over the hashes, O(M) memory).

The run is refused, with a one-line error giving the estimate, the memory available
and what to do instead, when the estimate exceeds the memory available:
``$KVTRACE_MEMORY_BUDGET`` (a size, e.g. ``64GiB``; the same variable sets when
``kvtrace curve`` streams a Parquet trace) if set, else the least of the system's
available memory (``MemAvailable``) and the cgroup's remaining allowance.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import KvtraceError
from .units import format_bytes, parse_size

MEMORY_BUDGET_ENV = "KVTRACE_MEMORY_BUDGET"


@dataclass(frozen=True)
class Profile:
    """Peak bytes of a command per block access, per distinct block and per request
    (beyond the request table, which is in memory when the check runs)."""

    per_access: float
    per_block: float = 64.0
    per_request: float = 100.0
    what: str = ""


#: Measured profiles (see the module docstring), by workload name.
PROFILES: dict[str, Profile] = {
    "ingest": Profile(18, 48, 0, "kvtrace ingest"),
    "stats": Profile(134, what="kvtrace stats"),
    "curve": Profile(56, what="an exact kvtrace curve"),
    "curve-sampled": Profile(36, what="a sampled kvtrace curve"),
    "curve-distances": Profile(150, what="kvtrace curve --distances-out"),
    "value": Profile(254, what="kvtrace value"),
    "whatif": Profile(48, 96, what="kvtrace whatif"),
    # every worker process receives the trace (2 workers: the default)
    "whatif-parallel": Profile(48 + 2 * 40, 96 + 2 * 64, what="kvtrace whatif (2 worker processes)"),
    "size": Profile(120, 96, what="kvtrace size"),
    "export": Profile(445, what="kvtrace export"),
    "sql": Profile(750, what="kvtrace sql on a trace (an in-memory database)"),
}


def estimate_bytes(workload: str, accesses: int, blocks: int, requests: int) -> int:
    """Estimated peak bytes of ``workload`` on a trace of that size (beyond the request
    table); an unknown workload is costed like ``sql``, the heaviest."""
    p = PROFILES.get(workload, PROFILES["sql"])
    return int(p.per_access * accesses + p.per_block * blocks + p.per_request * requests)


def available_bytes() -> tuple[int | None, str]:
    """(bytes this run may use, where that figure comes from); (None, ...) when unknown."""
    env = os.environ.get(MEMORY_BUDGET_ENV)
    if env:
        return parse_size(env, field=MEMORY_BUDGET_ENV), f"${MEMORY_BUDGET_ENV}"
    found: list[tuple[int, str]] = []
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found.append((int(line.split()[1]) * 1024, "available"))
                    break
    except (OSError, ValueError, IndexError):
        pass
    cg = _cgroup_room()
    if cg is not None:
        found.append((cg, "left in this cgroup"))
    if not found:
        return None, ""
    return min(found)


def _cgroup_room() -> int | None:
    """Memory this cgroup may still use (v2 ``memory.max - memory.current``; v1 limit -
    usage), or None without a limit."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as fh:
                limit = fh.read().strip()
            with open(usage_file) as fh:
                usage = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:
            return None
        return max(int(limit) - usage, 0)
    return None


def check_memory(df, meta, workload: str, *, source: str) -> None:
    """Refuse (:class:`~kvtrace.errors.KvtraceError`) a ``workload`` on a prepared
    request table whose estimated peak exceeds the memory available.

    Parameters
    ----------
    df : polars.DataFrame
        The validated request table (:func:`kvtrace.ingest.prepare_requests`).
    meta : TraceMeta
    workload : str
        A key of :data:`PROFILES`.
    source : str
        The trace's file, for the message.
    """
    room, where = available_bytes()
    if room is None:
        return
    n = int(df["block_ids"].list.len().sum() or 0)
    r = df.height
    need = estimate_bytes(workload, n, n, r)  # distinct blocks <= accesses
    if need <= room:
        return
    from .ingest.canonical import distinct_blocks

    m = distinct_blocks(df, meta)
    need = estimate_bytes(workload, n, m, r)
    if need <= room:
        return
    what = PROFILES.get(workload, PROFILES["sql"]).what or f"kvtrace {workload}"
    raise KvtraceError(
        f"{what} of this trace needs about {format_bytes(need)} of memory ({n:,} block accesses, {m:,} distinct "
        f"blocks, {r:,} requests) but "
        + (f"{MEMORY_BUDGET_ENV} allows {format_bytes(room)}" if where.startswith("$")
           else f"only {format_bytes(room)} is {where}") + ": "
        + _advice(workload, n, m, r, room)
        + f"; or set {MEMORY_BUDGET_ENV}=SIZE to run it anyway",
        path=source,
    )


def _advice(workload: str, n: int, m: int, r: int, room: int) -> str:
    """What to do instead, as a clause: only what would help."""
    tips = []
    if workload.startswith("curve"):
        if workload == "curve-distances":
            tips.append("drop --distances-out (it holds every access)")
        tips.append("try --stream (memory bounded by the distinct blocks; it reads Parquet: convert the trace "
                    "once with kvtrace ingest)")
        sampled = estimate_bytes("curve-sampled", n, m, r)
        if workload == "curve" and sampled <= room:
            tips.append(f"or --sample-rate 0.01 (about {format_bytes(sampled)})")
        return "; ".join(tips)
    if workload == "whatif-parallel" and estimate_bytes("whatif", n, m, r) <= room:
        tips.append(f"try --workers 1 (about {format_bytes(estimate_bytes('whatif', n, m, r))})")
    tips.append("this command holds the whole trace in memory: analyse a part of it (a time window, or fewer "
                "shards)")
    return "; ".join(tips)
