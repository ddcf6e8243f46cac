"""kvtrace's exact flat curve against libCacheSim's LRU at many capacities, same run.

kvtrace computes every capacity from one pass of reuse distances; libCacheSim
simulates one LRU per capacity. :func:`time_libcachesim` times libCacheSim the fastest
faithful way we found (one oracleGeneral trace file, then ``process_trace`` per
capacity, hash table sized to the cache; see ``tests/libcachesim_ref.py``), so other
benchmark scripts can put it next to kvtrace's timing.

Run standalone on the Mooncake conversation trace::

    python benchmarks/lcs_compare.py [--trace PATH] [--model Llama-3.1-70B] [--points 20]

It prints kvtrace's time (``reuse_distances`` + ``compute_curve``), libCacheSim's time
for the same capacities (trace-file writing reported apart), their ratio, and checks
that the hit counts agree at every capacity.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TRACE = ROOT.parent / "shared" / "traces" / "mooncake_conversation.jsonl"
sys.path.insert(0, str(ROOT / "tests"))  # the libCacheSim reference lives with the tests

from libcachesim_ref import HitCounts, open_reader, run_lru, write_oracle_general  # noqa: E402


@dataclass
class LcsTiming:
    """Wall-clock seconds of libCacheSim over one capacity list.

    Attributes
    ----------
    write_seconds : float
        Writing the oracleGeneral trace file (once, shared by every capacity).
    per_capacity_seconds : list of float
        One LRU simulation per capacity: create the cache, ``process_trace``, free it.
    counts : list of HitCounts
        Integer hits at each capacity (for checking against kvtrace).
    """

    write_seconds: float
    per_capacity_seconds: list[float] = field(default_factory=list)
    counts: list[HitCounts] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        """Seconds for the whole capacity list, file writing excluded."""
        return float(sum(self.per_capacity_seconds))


def time_libcachesim(block, size_bytes, capacities) -> LcsTiming:
    """Time libCacheSim's LRU over a block stream at each capacity.

    Parameters
    ----------
    block : int64[N]
        Object (dense block) id of each access, in trace order.
    size_bytes : int64[N]
        Size of the accessed object, bytes (one size per object).
    capacities : sequence of int
        Cache capacities, bytes.

    Returns
    -------
    LcsTiming
        ``.seconds`` for the capacity list (file writing excluded, reported as
        ``.write_seconds``), per-capacity seconds and hit counts.
    """
    block = np.ascontiguousarray(block, dtype=np.int64)
    size_bytes = np.ascontiguousarray(size_bytes, dtype=np.int64)
    n_req = int(block.shape[0])
    bytes_req = int(size_bytes.sum())
    n_distinct = int(np.unique(block).shape[0])
    min_size = int(size_bytes.min())
    with tempfile.TemporaryDirectory(prefix="kvtrace-lcs-") as tmp:
        path = os.path.join(tmp, "stream.oracleGeneral")
        t0 = time.perf_counter()
        write_oracle_general(path, block, size_bytes)
        timing = LcsTiming(write_seconds=time.perf_counter() - t0)
        reader = open_reader(path)
        for c in capacities:
            t0 = time.perf_counter()
            counts = run_lru(reader, int(c), n_req, bytes_req, min(n_distinct, int(c) // min_size + 1))
            timing.per_capacity_seconds.append(time.perf_counter() - t0)
            timing.counts.append(counts)
        del reader  # not reader.close(): libcachesim 0.3.5 then frees it twice
    return timing


def time_kvtrace(trace, model: str, capacities) -> tuple[float, float, object, object]:
    """Seconds of ``reuse_distances`` and of ``compute_curve`` (flat), and their results."""
    from kvtrace.analyses.curves import compute_curve
    from kvtrace.analyses.distances import reuse_distances

    t0 = time.perf_counter()
    d = reuse_distances(trace, "flat")
    t1 = time.perf_counter()
    res = compute_curve(trace, model=model, eviction="flat", capacities=list(capacities), distances=d)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, d, res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trace", default=str(DEFAULT_TRACE))
    ap.add_argument("--model", default="Llama-3.1-70B")
    ap.add_argument("--points", type=int, default=20, help="capacities, log-spaced (default 20)")
    ap.add_argument("--repeat", type=int, default=3, help="best of this many runs (default 3)")
    args = ap.parse_args(argv)

    try:
        import libcachesim  # noqa: F401
    except ImportError:
        print("libcachesim is not installed (pip install 'kvtrace[dev]')", file=sys.stderr)
        return 2
    if not Path(args.trace).is_file():
        print(f"trace not found: {args.trace}", file=sys.stderr)
        return 2

    from kvtrace.ingest import load_trace
    from kvtrace.model import resolve_model

    trace = load_trace(args.trace)
    bpt = int(resolve_model(args.model).kv_bytes_per_token)
    B = int(trace.meta.block_tokens)
    block = trace.accesses.block
    size_bytes = trace.block_size[block] * bpt
    # From 128 full blocks (>= every object, where both tools model the same cache) to
    # every distinct byte of the trace.
    lo, hi = 128 * B * bpt, int(trace.block_size.sum()) * bpt
    capacities = [int(c) for c in np.unique(np.round(np.geomspace(lo, hi, args.points)).astype(np.int64))]

    t0 = time.perf_counter()
    time_kvtrace(trace, args.model, capacities)  # JIT compile or on-disk cache load
    first = time.perf_counter() - t0
    kv_best = (float("inf"), 0.0, 0.0)
    for _ in range(max(1, args.repeat)):
        td, tc, d, _res = time_kvtrace(trace, args.model, capacities)
        kv_best = min(kv_best, (td + tc, td, tc))
    lcs_best = None
    for _ in range(max(1, args.repeat)):
        t = time_libcachesim(block, size_bytes, capacities)
        lcs_best = t if lcs_best is None or t.seconds < lcs_best.seconds else lcs_best

    mismatches = []
    for c, w in zip(capacities, lcs_best.counts):
        hit = d.dist <= c // bpt
        got = (int(hit.sum()), int(size_bytes[hit].sum()))
        if got != (w.n_hits, w.bytes_hit):
            mismatches.append((c, got, (w.n_hits, w.bytes_hit)))

    kv_total, kv_dist, kv_curve = kv_best
    print(f"trace      {Path(args.trace).name}: {trace.n_accesses:,} block accesses, {trace.n_blocks:,} distinct "
          f"blocks; model {args.model} ({bpt:,} B/token); {len(capacities)} capacities "
          f"{capacities[0] / 2**30:,.0f}-{capacities[-1] / 2**30:,.0f} GiB; best of {args.repeat}")
    print(f"kvtrace    exact flat curve {kv_total:.3f} s  (reuse_distances {kv_dist:.3f} s + compute_curve "
          f"{kv_curve:.3f} s, which also evaluates its ~200-point default grid; first call with JIT/cache "
          f"load {first:.2f} s)")
    print(f"libCacheSim LRU x {len(capacities)} capacities {lcs_best.seconds:.3f} s  "
          f"(per capacity {min(lcs_best.per_capacity_seconds):.3f}-{max(lcs_best.per_capacity_seconds):.3f} s; "
          f"oracleGeneral file written once in {lcs_best.write_seconds:.3f} s, not included)")
    print(f"ratio      libCacheSim / kvtrace = {lcs_best.seconds / kv_total:.1f}x")
    if mismatches:
        print(f"MISMATCH at {len(mismatches)} capacities: {mismatches[:3]}")
        return 1
    print(f"check      hit counts and bytes hit equal at all {len(capacities)} capacities")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
