"""libCacheSim's LRU as an independent reference for kvtrace's ``flat`` model.

kvtrace's flat model is a plain byte-LRU over the chain-order block stream (DESIGN §2),
which is what libCacheSim's ``LRU`` computes when it is fed that stream with object
sizes. This module feeds it the stream the fastest faithful way and returns integer
hit counts.

How the stream reaches libCacheSim
----------------------------------
The stream is written once as an *oracleGeneral* binary trace (the format libCacheSim
reads natively, ``traceReader/customizedReader/oracle/oracleGeneralBin.h``): packed
little-endian 24-byte records ``{uint32 clock_time; uint64 obj_id; uint32 obj_size;
int64 next_access_vtime}``. Every capacity then runs ``cache.process_trace(reader)``,
a C loop over ``cache->get``: about 20-60 ms per capacity on the 288,500 accesses of
the Mooncake conversation trace, against ~0.5 s for a Python loop of ``cache.get``
reusing one ``Request`` and 2.5-3.5 s building a ``Request`` per access. The cache's
hash table is sized to what it can hold (:func:`hashpower_for`); libCacheSim's default
(2**24 buckets) alone costs ~0.45 s per capacity.

``process_trace`` returns only ``(1 - n_hit/n_req, 1 - bytes_hit/bytes_req)`` as
doubles. We know ``n_req`` and ``bytes_req`` (we wrote the trace), so the integer hit
counts are recovered by rounding and then *proved* unique: the candidate must
reproduce the returned double bit for bit while its neighbours must not (the map
count -> double is monotone, so this pins the count). Any ambiguity raises.

libCacheSim semantics that matter here (0.3.5, checked in its source and by hand)
-------------------------------------------------------------------------------
- ``consider_obj_metadata=False`` (the default) makes ``obj_md_size`` 0: an object
  occupies exactly ``obj_size`` bytes.
- A miss evicts from the LRU tail while ``occupied + obj_size > cache_size``, so a
  cache filled to exactly ``cache_size`` holds: an access hits iff its byte stack
  distance ``d <= C``, as in kvtrace.
- An object with ``obj_size > cache_size`` is not admitted and evicts nothing
  (``cache_can_insert_default``; it logs one warning). kvtrace's stack model passes
  such an object through the recency stack, so the two agree only when every object
  fits (capacity >= the largest size).
- On a hit the cached size is kept, so an object must have one size throughout;
  :func:`write_oracle_general` checks it.
- Zero-size records are skipped by the reader (``ignore_size_zero_req``) and
  ``obj_size`` is 32-bit: sizes must be in [1, 2**32).
- Objects carry a TTL (``default_ttl`` = 300 days, in the trace's clock units);
  every record is written with ``clock_time = 0`` so nothing can expire.
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass

import numpy as np

#: One oracleGeneral record (packed, little-endian, 24 bytes).
ORACLE_GENERAL = np.dtype(
    [("clock_time", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"), ("next_access_vtime", "<i8")]
)
assert ORACLE_GENERAL.itemsize == 24

_MAX_OBJ_SIZE = 2**32 - 1


@dataclass(frozen=True)
class HitCounts:
    """Integer LRU outcome at one capacity (bytes)."""

    n_hits: int
    bytes_hit: int
    n_req: int
    bytes_req: int

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.n_hits, self.bytes_hit, self.n_req, self.bytes_req)


def _validate(block, size_bytes) -> tuple[np.ndarray, np.ndarray]:
    block = np.ascontiguousarray(block, dtype=np.int64)
    size_bytes = np.ascontiguousarray(size_bytes, dtype=np.int64)
    if block.ndim != 1 or block.shape != size_bytes.shape:
        raise ValueError(f"block and size_bytes must be 1-d of one length, got {block.shape}, {size_bytes.shape}")
    if block.size == 0:
        return block, size_bytes
    if block.min() < 0:
        raise ValueError("block ids must be >= 0 (they become uint64 obj_ids)")
    if size_bytes.min() < 1 or size_bytes.max() > _MAX_OBJ_SIZE:
        raise ValueError("object sizes must be in [1, 2**32) bytes: oracleGeneral stores uint32 and "
                         "libCacheSim's reader drops zero-size records")
    per_block = np.zeros(int(block.max()) + 1, dtype=np.int64)
    per_block[block] = size_bytes
    if not np.array_equal(per_block[block], size_bytes):
        raise ValueError("an object must keep one size (libCacheSim keeps the size of its first insert)")
    return block, size_bytes


def next_access_vtime(block: np.ndarray) -> np.ndarray:
    """Index of the next access of the same object, -1 if none (oracleGeneral's field)."""
    n = block.shape[0]
    out = np.full(n, -1, dtype=np.int64)
    if n:
        order = np.argsort(block, kind="stable")
        same = block[order[1:]] == block[order[:-1]]
        out[order[:-1][same]] = order[1:][same]
    return out


def write_oracle_general(path: str | os.PathLike, block, size_bytes) -> int:
    """Write an access stream as a libCacheSim oracleGeneral binary trace.

    Parameters
    ----------
    path : path-like
        Output file.
    block : int64[N]
        Object id of each access (kvtrace dense block id), in trace order.
    size_bytes : int64[N]
        Size of the accessed object in bytes (one size per object, in [1, 2**32)).

    Returns
    -------
    int
        Number of records written (N).
    """
    block, size_bytes = _validate(block, size_bytes)
    rec = np.zeros(block.shape[0], dtype=ORACLE_GENERAL)
    # clock_time stays 0: LRU ignores time and a constant clock keeps every TTL alive.
    rec["obj_id"] = block
    rec["obj_size"] = size_bytes
    rec["next_access_vtime"] = next_access_vtime(block)
    rec.tofile(os.fspath(path))
    return int(rec.shape[0])


def open_reader(path: str | os.PathLike):
    """A libCacheSim ``TraceReader`` over an oracleGeneral file."""
    import libcachesim as lcs

    return lcs.TraceReader(os.fspath(path), lcs.TraceType.ORACLE_GENERAL_TRACE)


def hashpower_for(n_objects: int) -> int:
    """Hash-table size (log2 buckets) for about ``n_objects`` cached objects.

    Performance only: libCacheSim's table chains and grows, so any value is correct,
    but its default (24: 16 M buckets, 128 MiB) costs ~0.4 s per cache to touch.
    """
    return int(min(24, max(12, math.ceil(math.log2(max(2, n_objects))))))


def _count_from_miss_ratio(miss_ratio: float, total: int) -> int:
    """The unique integer ``hit`` with ``1.0 - hit/total == miss_ratio`` in doubles."""
    if total == 0:
        return 0

    def image(h: int) -> float:
        return 1.0 - float(h) / float(total)  # the C expression: 1.0 - (double)hit / total

    hit = int(round((1.0 - miss_ratio) * total))
    for cand in (hit, hit - 1, hit + 1, hit - 2, hit + 2):
        if 0 <= cand <= total and image(cand) == miss_ratio:
            hit = cand
            break
    else:
        raise AssertionError(f"no integer hit count reproduces miss ratio {miss_ratio!r} of {total}")
    for nb in (hit - 1, hit + 1):
        if 0 <= nb <= total and image(nb) == miss_ratio:
            raise AssertionError(f"miss ratio {miss_ratio!r} of {total} does not pin an integer hit count")
    return hit


def run_lru(reader, capacity_bytes: int, n_req: int, bytes_req: int, n_objects: int) -> HitCounts:
    """One libCacheSim LRU of ``capacity_bytes`` over an open oracleGeneral reader."""
    import libcachesim as lcs

    cache = lcs.LRU(cache_size=int(capacity_bytes), hashpower=hashpower_for(n_objects))
    assert cache._cache.obj_md_size == 0  # an object occupies exactly obj_size bytes
    obj_miss, byte_miss = cache.process_trace(reader)
    return HitCounts(_count_from_miss_ratio(obj_miss, n_req), _count_from_miss_ratio(byte_miss, bytes_req),
                     n_req, bytes_req)


def _loop_counts(block: np.ndarray, size_bytes: np.ndarray, capacity_bytes: int) -> HitCounts:
    """The same through a Python loop of ``cache.get`` (slow; integer counts directly)."""
    import libcachesim as lcs

    n_distinct = int(np.unique(block).shape[0]) if block.size else 1
    cache = lcs.LRU(cache_size=int(capacity_bytes), hashpower=hashpower_for(n_distinct))
    req = lcs.Request()
    req.op = lcs.ReqOp.OP_GET
    get = cache.get
    n_hits = 0
    bytes_hit = 0
    for b, s in zip(block.tolist(), size_bytes.tolist()):
        req.obj_id = b
        req.obj_size = s
        if get(req):
            n_hits += 1
            bytes_hit += s
    return HitCounts(n_hits, bytes_hit, int(block.shape[0]), int(size_bytes.sum()))


def lru_hit_counts_many(block, size_bytes, capacities, *, method: str = "trace") -> list[HitCounts]:
    """libCacheSim LRU hit counts of one stream at several byte capacities.

    Parameters
    ----------
    block : int64[N]
        Object id of each access, in trace order.
    size_bytes : int64[N]
        Size of the accessed object, bytes.
    capacities : sequence of int
        Cache capacities, bytes.
    method : str
        ``trace`` (oracleGeneral file + ``process_trace``, fast) or ``loop`` (a Python
        loop of ``cache.get``, slow; integer counts without recovery from ratios).

    Returns
    -------
    list of HitCounts
        One per capacity, in order.
    """
    block, size_bytes = _validate(block, size_bytes)
    if method == "loop":
        return [_loop_counts(block, size_bytes, c) for c in capacities]
    if method != "trace":
        raise ValueError(f"method must be 'trace' or 'loop', got {method!r}")
    n_req = int(block.shape[0])
    bytes_req = int(size_bytes.sum())
    if n_req == 0:
        return [HitCounts(0, 0, 0, 0) for _ in capacities]
    n_distinct = int(np.unique(block).shape[0])
    min_size = int(size_bytes.min())
    with tempfile.TemporaryDirectory(prefix="kvtrace-lcs-") as tmp:
        path = os.path.join(tmp, "stream.oracleGeneral")
        write_oracle_general(path, block, size_bytes)
        # No reader.close(): the binding's destructor frees the reader too (0.3.5 aborts
        # with a double free when both run); on POSIX the file may go while mapped.
        reader = open_reader(path)
        out = [run_lru(reader, c, n_req, bytes_req, min(n_distinct, int(c) // min_size + 1))
               for c in capacities]
        del reader
        return out


def lru_hit_counts(block, size_bytes, capacity_bytes: int, *, method: str = "trace") -> tuple[int, int, int, int]:
    """``(n_hits, bytes_hit, n_req, bytes_req)`` of libCacheSim's LRU at one capacity (bytes)."""
    return lru_hit_counts_many(block, size_bytes, [capacity_bytes], method=method)[0].as_tuple()
