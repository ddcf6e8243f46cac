"""Slow, obviously correct twins of the kernels (the specification).

Every kernel in :mod:`kvtrace.kernels` has a function of the same name here, written in
plain Python for clarity, not speed (O(N x M) and worse). Tests compare the kernels
with these twins on random and degenerate inputs.

Conventions shared with the kernels
-----------------------------------
- Sizes, distances and capacities are in tokens (one unit; bytes = tokens x
  kv_bytes_per_token).
- ``COLD`` (int64 max, "infinity") is the distance of a first access; its
  ``prev_request`` is -1.
- The accesses of request r are ``block[req_start[r]:req_start[r+1]]``.
"""

from __future__ import annotations

import collections

from collections import OrderedDict

import numpy as np

COLD = int(np.iinfo(np.int64).max)


def _as_ints(a) -> list[int]:
    return [int(x) for x in np.asarray(a).ravel()]


def _check_trace(block: list[int], size: list[int], starts: list[int]) -> None:
    assert len(starts) >= 1 and starts[0] == 0 and starts[-1] == len(block), starts
    assert all(a <= b for a, b in zip(starts, starts[1:])), starts
    assert all(0 <= b < len(size) for b in block), (block, len(size))
    assert all(s >= 1 for s in size), size


def stack_distances(block, size, req_start, prefix_aware):
    """Byte-LRU stack distances, by walking an explicit recency list.

    Parameters
    ----------
    block : int[N]
        Dense block id of each access, in trace order.
    size : int[M]
        Tokens each block occupies (>= 1).
    req_start : int[R+1]
        Request offsets.
    prefix_aware : bool
        True: request-atomic model (every access of request r is answered against
        the recency list as r found it; then r's blocks are touched tail-first, so
        position 0 ends most recent). False: a plain sequential LRU (each access
        queries, then touches).

    Returns
    -------
    dist, dist_blocks, prev_request : int64[N]
        Depth of the block in the recency list in tokens (own size included) and in
        blocks (1 = most recent), and the request of its previous touch; COLD, COLD,
        -1 for a first access.
    """
    block, size, starts = _as_ints(block), _as_ints(size), _as_ints(req_start)
    _check_trace(block, size, starts)
    n = len(block)
    dist, dist_blocks, prev_request = [COLD] * n, [COLD] * n, [-1] * n
    recency: list[int] = []  # most recent first
    last_request: dict[int, int] = {}

    def query(t: int) -> None:
        b = block[t]
        if b in recency:
            depth = recency.index(b) + 1
            dist[t] = sum(size[x] for x in recency[:depth])
            dist_blocks[t] = depth
            prev_request[t] = last_request[b]

    def touch(t: int, r: int) -> None:
        b = block[t]
        if b in recency:
            recency.remove(b)
        recency.insert(0, b)
        last_request[b] = r

    for r in range(len(starts) - 1):
        lo, hi = starts[r], starts[r + 1]
        if prefix_aware:
            for t in range(lo, hi):
                query(t)
            for t in reversed(range(lo, hi)):
                touch(t, r)
        else:
            for t in range(lo, hi):
                query(t)
                touch(t, r)

    as_array = lambda xs: np.array(xs, dtype=np.int64).reshape(n)  # noqa: E731
    return as_array(dist), as_array(dist_blocks), as_array(prev_request)


def usable_distances(dist, req_start):
    """Usable-prefix distance: ``u[r, j] = max(dist[r, 0..j])``; COLD propagates."""
    dist, starts = _as_ints(dist), _as_ints(req_start)
    out = []
    for r in range(len(starts) - 1):
        request = dist[starts[r]:starts[r + 1]]
        out.extend(max(request[: j + 1]) for j in range(len(request)))
    return np.array(out, dtype=np.int64).reshape(len(out))


def lru_simulate(block, size, req_start, capacity, prefix_aware):
    """Replay the trace through an explicit byte-LRU of ``capacity`` tokens.

    A miss inserts the block as most recent, then evicts least-recent blocks until
    the cache holds at most ``capacity`` tokens; a block larger than ``capacity``
    therefore evicts everything, itself last, and is never cached. A hit only moves
    the block to most recent.

    flat: each access checks membership (hit), then touches. prefix-aware: all hits
    of request r are decided against the cache as r found it, then r's blocks are
    touched tail-first.

    Returns
    -------
    hits : bool[N]
    cache_after_each_request : list[set[int]]
        The cached block ids after each request (one entry per request, empty
        requests included).
    """
    block, size, starts = _as_ints(block), _as_ints(size), _as_ints(req_start)
    _check_trace(block, size, starts)
    capacity = int(capacity)
    cache: OrderedDict[int, int] = OrderedDict()  # least recent first
    used = 0
    hits = [False] * len(block)
    after: list[set[int]] = []

    def touch(b: int) -> None:
        nonlocal used
        if b in cache:
            cache.move_to_end(b)
            return
        cache[b] = size[b]
        used += size[b]
        while used > capacity:
            _, evicted = cache.popitem(last=False)
            used -= evicted

    for r in range(len(starts) - 1):
        lo, hi = starts[r], starts[r + 1]
        if prefix_aware:
            for t in range(lo, hi):
                hits[t] = block[t] in cache
            for t in reversed(range(lo, hi)):
                touch(block[t])
        else:
            for t in range(lo, hi):
                hits[t] = block[t] in cache
                touch(block[t])
        assert used == sum(cache.values()) and used <= capacity
        after.append(set(cache))
    return np.array(hits, dtype=bool).reshape(len(hits)), after


# --- curve metrics twin ---
#
# The specification of every column of the curve table (kvtrace.analyses.curves, DESIGN §3) at
# one capacity, by replaying the trace through ``lru_simulate`` (an explicit
# OrderedDict byte-LRU). Nothing here uses kvtrace's kernels, distances or grids.

from typing import NamedTuple  # noqa: E402


class CurveTrace(NamedTuple):
    """What the curve metrics need of a trace, as plain lists in trace order.

    ``block``, ``tokens``, ``pos`` per access; ``size`` (tokens a block occupies in a
    cache: the max over its accesses) per dense block; ``req_start`` request offsets;
    ``timestamp`` (s) per request; ``block_tokens`` tokens of a full block.
    """

    block: list
    tokens: list
    pos: list
    size: list
    req_start: list
    timestamp: list
    block_tokens: int


def curve_trace(rows, block_tokens: int, share_tenants: bool = False):
    """Canonical request rows (dicts) -> (CurveTrace, trace-order row indices).

    A restatement of DESIGN §1: requests stably sorted by ``timestamp``; blocks in
    chain order; the last block holds ``input_tokens - B*(n-1)`` tokens clamped to
    [1, B]; equal hashes in different tenants are different blocks (unless shared);
    a block's size is its largest token count in the trace.
    """
    B = int(block_tokens)
    order = sorted(range(len(rows)), key=lambda i: float(rows[i]["timestamp"]))
    ids: dict = {}
    block, tokens, pos, size, starts, ts = [], [], [], [], [0], []
    for i in order:
        row = rows[i]
        hashes = [int(h) for h in row["block_ids"]]
        n = len(hashes)
        tenant = None if share_tenants else row.get("tenant")
        for j, h in enumerate(hashes):
            k = B if j < n - 1 else min(max(int(row["input_tokens"]) - B * (n - 1), 1), B)
            b = ids.setdefault((tenant, h), len(ids))
            if b == len(size):
                size.append(k)
            size[b] = max(size[b], k)
            block.append(b)
            tokens.append(k)
            pos.append(j)
        starts.append(len(block))
        ts.append(float(row["timestamp"]))
    return CurveTrace(block, tokens, pos, size, starts, ts, B), order


def _curve_trace_of(trace_like) -> CurveTrace:
    if isinstance(trace_like, CurveTrace):
        return trace_like
    # a kvtrace Trace: read its canonical access table only
    a = trace_like.accesses
    return CurveTrace(_as_ints(a.block), _as_ints(a.tokens), _as_ints(a.pos), _as_ints(trace_like.block_size),
                      _as_ints(a.req_start), [float(x) for x in trace_like.request_timestamp],
                      int(trace_like.meta.block_tokens))


def curve_metrics(trace_like, capacity_tokens, model, gpu, prefix_aware, first_measured_request,
                  *, capacity_bytes=None, requests=None):
    """Every metric of the curve table at one capacity, by direct LRU simulation.

    Parameters
    ----------
    trace_like : CurveTrace or kvtrace Trace
    capacity_tokens : int or math.inf
        Cache capacity in tokens (inf: nothing is ever evicted).
    model : ModelSpec
        Gives ``kv_bytes_per_token`` and ``flops_coefficients()`` = (a, b): a token at
        0-based prompt position p costs a + b*p FLOPs.
    gpu : GpuSpec
        ``peak_flops`` x ``mfu`` FLOP/s at ``dollars_per_hour``.
    prefix_aware : bool
        Request-atomic LRU (True) or flat block LRU (False).
    first_measured_request : int
        Requests before it (trace order) only warm the cache.
    capacity_bytes : int, optional
        Capacity in bytes instead (wins over ``capacity_tokens``); blocks are then
        sized in bytes, so a capacity that is not a multiple of bytes/token is
        simulated as given.
    requests : set of int, optional
        Count only these requests (trace order; a group), cache still shared by all.

    Returns
    -------
    dict
        Every rate and value column of the curve table (NaN where the denominator is
        0), and the underlying counts/sums.
    """
    tr = _curve_trace_of(trace_like)
    bpt = int(model.kv_bytes_per_token)
    a, b = model.flops_coefficients()
    B = tr.block_tokens
    size_bytes = [s * bpt for s in tr.size]
    if capacity_bytes is None:
        capacity_bytes = sum(size_bytes) if capacity_tokens == float("inf") else int(capacity_tokens) * bpt
    hits, _ = lru_simulate(tr.block, size_bytes, tr.req_start, capacity_bytes, prefix_aware)

    n_req = len(tr.req_start) - 1
    c = dict.fromkeys(["requests", "hit_requests", "half_prefix_requests", "blocks", "hit_blocks", "prefix_blocks",
                       "tokens",
                       "hit_tokens", "prefix_tokens", "bytes", "hit_bytes", "prefix_bytes",
                       "pos_sum", "prefix_pos_sum"], 0)
    for r in range(first_measured_request, n_req):
        if requests is not None and r not in requests:
            continue
        lo, hi = tr.req_start[r], tr.req_start[r + 1]
        c["requests"] += 1
        c["hit_requests"] += int(hi > lo and bool(hits[lo]))
        prefix = True
        request_tokens = request_prefix_tokens = 0
        for t in range(lo, hi):
            k = tr.tokens[t]
            start = tr.pos[t] * B
            q = sum(range(start, start + k))  # exact sum of the block's token positions
            nbytes = size_bytes[tr.block[t]]
            hit = bool(hits[t])
            prefix = prefix and hit
            c["blocks"] += 1
            c["tokens"] += k
            request_tokens += k
            c["bytes"] += nbytes
            c["pos_sum"] += q
            if hit:
                c["hit_blocks"] += 1
                c["hit_tokens"] += k
                c["hit_bytes"] += nbytes
            if prefix:
                c["prefix_blocks"] += 1
                c["prefix_tokens"] += k
                request_prefix_tokens += k
                c["prefix_bytes"] += nbytes
                c["prefix_pos_sum"] += q
        # at least half of the request's prompt tokens in its usable prefix
        c["half_prefix_requests"] += int(hi > lo and 2 * request_prefix_tokens >= request_tokens)

    def ratio(x, y):
        return x / y if y else float("nan")

    flops_saved = a * c["prefix_tokens"] + b * c["prefix_pos_sum"]
    flops_all = a * c["tokens"] + b * c["pos_sum"]
    seconds = tr.timestamp[-1] - tr.timestamp[first_measured_request] if n_req else 0.0
    gpu_seconds = flops_saved / (gpu.peak_flops * gpu.mfu)
    per_hour = 3600.0 / seconds if seconds > 0 else float("nan")
    return {
        "request_hit_rate": ratio(c["hit_requests"], c["requests"]),
        "request_half_prefix_hit_rate": ratio(c["half_prefix_requests"], c["requests"]),
        "prefix_token_hit_rate": ratio(c["prefix_tokens"], c["tokens"]),
        "prefix_byte_hit_rate": ratio(c["prefix_bytes"], c["bytes"]),
        "prefix_block_hit_rate": ratio(c["prefix_blocks"], c["blocks"]),
        "block_hit_rate": ratio(c["hit_blocks"], c["blocks"]),
        "token_hit_rate": ratio(c["hit_tokens"], c["tokens"]),
        "byte_hit_rate": ratio(c["hit_bytes"], c["bytes"]),
        "compute_saved_rate": ratio(flops_saved, flops_all),
        "gpu_seconds_saved_per_hour": gpu_seconds * per_hour,
        "usd_saved_per_hour": gpu_seconds * gpu.dollars_per_hour / 3600.0 * per_hour,
        "read_mean_bytes_per_s": c["prefix_bytes"] / seconds if seconds > 0 else float("nan"),
        "flops_saved": flops_saved,
        "measured_duration_s": seconds,
        **c,
    }


# --- future reuse twin ---
#
# The specification of kvtrace.kernels.future and kvtrace.analyses.value (DESIGN §2 "Future
# reuse", seed §9), by brute force over plain lists: every access scans every later
# access (O(N^2)), the keep/drop optimum is searched over runs of kept intervals, and
# the time-to-live schedule is replayed stay by stay. Nothing here uses kvtrace's
# kernels.
#
# Conventions: a later access u > t (trace order) of the same block is within the
# horizon of t iff ts[u] - ts[t] <= horizon (ties count; horizon may be inf); "none"
# is -1 for an index, inf for a gap.

import math  # noqa: E402


def future_windows(block, ts, tokens, pos_token_sum, n_blocks, horizon):
    """Next access and reuses within the horizon of every access, by scanning.

    Returns ``next_t, next_gap, reuses, last_t, last_gap, reuse_tokens, reuse_q`` as
    the kernel does: next access index (-1) and gap (inf); number of later accesses of
    the block within the horizon, the last of them (-1) and its gap (0.0 when none);
    sums of ``tokens`` and ``pos_token_sum`` over them.
    """
    block, tokens, q = _as_ints(block), _as_ints(tokens), _as_ints(pos_token_sum)
    ts = [float(x) for x in np.asarray(ts).ravel()]
    n = len(block)
    assert all(0 <= b < n_blocks for b in block)
    assert all(a <= b for a, b in zip(ts, ts[1:])), "timestamps must be non-decreasing"
    next_t, next_gap, reuses, last_t, last_gap, rtok, rq = ([] for _ in range(7))
    for t in range(n):
        later = [u for u in range(t + 1, n) if block[u] == block[t]]
        inside = [u for u in later if ts[u] - ts[t] <= horizon]
        next_t.append(later[0] if later else -1)
        next_gap.append(ts[later[0]] - ts[t] if later else math.inf)
        reuses.append(len(inside))
        last_t.append(inside[-1] if inside else -1)
        last_gap.append(ts[inside[-1]] - ts[t] if inside else 0.0)
        rtok.append(sum(tokens[u] for u in inside))
        rq.append(sum(q[u] for u in inside))

    def ints(x):
        return np.array(x, dtype=np.int64).reshape(n)

    def floats(x):
        return np.array(x, dtype=np.float64).reshape(n)

    return ints(next_t), floats(next_gap), ints(reuses), ints(last_t), floats(last_gap), ints(rtok), ints(rq)


def _chains(block, n_blocks):
    chains = [[] for _ in range(n_blocks)]
    for t, b in enumerate(block):
        chains[b].append(t)
    return chains


def best_keep_value(block, n_blocks, keepable, interval_value, write_cost):
    """Best keep/drop schedule per block, searched over runs of kept intervals.

    Interval i of a block runs from its i-th access to its (i+1)-th. A schedule keeps
    disjoint, non-adjacent runs of consecutive keepable intervals; a run earns the sum
    of its interval values minus one write. ``best(i)`` = the best value of intervals
    i.. when interval i-1 is not kept: skip i, or keep a run i..e and skip e+1.
    """
    block = _as_ints(block)
    keep = [bool(x) for x in np.asarray(keepable).ravel()]
    val = [float(x) for x in np.asarray(interval_value).ravel()]
    out = []
    for b, chain in enumerate(_chains(block, n_blocks)):
        ivals = chain[:-1]  # an interval per access that has a next access
        memo: dict[int, float] = {}

        def best(i: int) -> float:
            if i >= len(ivals):
                return 0.0
            if i not in memo:
                options = [best(i + 1)]
                run = 0.0
                for e in range(i, len(ivals)):
                    if not keep[ivals[e]]:
                        break
                    run += val[ivals[e]]
                    options.append(run - float(write_cost[b]) + best(e + 2))
                memo[i] = max(options)
            return memo[i]

        out.append(best(0))
    return np.array(out, dtype=np.float64).reshape(n_blocks)


def best_keep_value_enumerated(block, n_blocks, keepable, interval_value, write_cost):
    """The same optimum by trying every subset of keepable intervals (small inputs)."""
    from itertools import product

    block = _as_ints(block)
    out = []
    for b, chain in enumerate(_chains(block, n_blocks)):
        ivals = [t for t in chain[:-1] if keepable[t]]
        assert len(ivals) <= 14, "too many intervals to enumerate"
        position = {t: i for i, t in enumerate(chain)}
        best = 0.0
        for choice in product((False, True), repeat=len(ivals)):
            kept = [t for t, c in zip(ivals, choice) if c]
            runs = sum(1 for t in kept if position[t] == 0 or chain[position[t] - 1] not in kept)
            best = max(best, sum(float(interval_value[t]) for t in kept) - runs * float(write_cost[b]))
        out.append(best)
    return np.array(out, dtype=np.float64).reshape(n_blocks)


def value_tables(trace_like, model, gpu, horizon, write, read, occupancy):
    """Everything kvtrace.analyses.value reports, from the access lists by brute force.

    Parameters
    ----------
    trace_like : CurveTrace or kvtrace Trace
    model, gpu : ModelSpec, GpuSpec
        A token at prompt position p costs a + b*p FLOPs; GPU-seconds = FLOPs /
        (peak x mfu); $ = GPU-seconds x $/h / 3600.
    horizon : float
        Seconds (inf allowed).
    write, read, occupancy : float
        $ per byte written, per byte read, per byte-second stored.

    Returns
    -------
    dict
        ``access``: per-access dicts (window and interval values); ``block``: per-block
        dicts keyed by dense id; ``prefix``: per-root dicts; ``summary``: the figures.
    """
    tr = _curve_trace_of(trace_like)
    bpt = int(model.kv_bytes_per_token)
    a, b = model.flops_coefficients()
    flops_per_s = gpu.peak_flops * gpu.mfu
    dollars_per_s = gpu.dollars_per_hour / 3600.0
    B = tr.block_tokens
    n = len(tr.block)
    request = [r for r in range(len(tr.req_start) - 1) for _ in range(tr.req_start[r], tr.req_start[r + 1])]
    ts = [tr.timestamp[request[t]] for t in range(n)]
    tail = horizon if math.isfinite(horizon) else 0.0

    def gpu_s(t):  # prefill GPU-seconds of access t: sum over its token positions
        start = tr.pos[t] * B
        return sum(a + b * p for p in range(start, start + tr.tokens[t])) / flops_per_s

    def nbytes(t):
        return tr.size[tr.block[t]] * bpt

    access = []
    for t in range(n):
        later = [u for u in range(t + 1, n) if tr.block[u] == tr.block[t]]
        inside = [u for u in later if ts[u] - ts[t] <= horizon]
        hold = ts[inside[-1]] - ts[t] if inside else tail
        gain = sum(gpu_s(u) for u in inside)
        cost = nbytes(t) * (write + read * len(inside) + occupancy * hold)
        access.append({"reuses": len(inside), "hold_s": hold, "gain_gpu_seconds": gain,
                       "gain_usd": gain * dollars_per_s, "cost_usd": cost,
                       "value_usd": gain * dollars_per_s - cost,
                       "next_t": later[0] if later else -1})

    # the time-to-live schedule, stay by stay: a stay starts at an access whose
    # previous access is not within the horizon and lasts H' past its last access
    chains = _chains(tr.block, len(tr.size))
    blocks = {}
    for blk, chain in enumerate(chains):
        size = tr.size[blk] * bpt
        stays, hits, gain, stored_s = [], 0, 0.0, 0.0
        for i, t in enumerate(chain):
            if i > 0 and ts[t] - ts[chain[i - 1]] <= horizon:
                stays[-1].append(t)
                hits += 1
                gain += gpu_s(t)
            else:
                stays.append([t])
        for stay in stays:
            stored_s += ts[stay[-1]] - ts[stay[0]] + tail
        cost = size * (write * len(stays) + read * hits + occupancy * stored_s)
        # clairvoyant: intervals between consecutive accesses within the horizon
        ivals = {t: gpu_s(u) * dollars_per_s - size * (read + occupancy * (ts[u] - ts[t]))
                 for t, u in zip(chain, chain[1:]) if ts[u] - ts[t] <= horizon}
        first = chain[0]
        root = tr.block[tr.req_start[request[first]]]
        blocks[blk] = {
            "root_block": root, "first_seen_s": ts[first], "last_seen_s": ts[chain[-1]],
            "accesses": len(chain), "reused": len(chain) > 1, "horizon_hits": hits, "bytes": size,
            "gain_gpu_seconds": gain, "cost_usd": cost, "stays": len(stays), "stored_s": stored_s,
            "total_value_usd": gain * dollars_per_s - cost,
            "value_usd_per_byte": (gain * dollars_per_s - cost) / size,
            "intervals": ivals,
        }
    keepable = [False] * n
    ival = [0.0] * n
    for blk in blocks.values():
        for t, v in blk["intervals"].items():
            keepable[t], ival[t] = True, v
    clair = best_keep_value(tr.block, len(tr.size), keepable, ival,
                            [tr.size[blk] * bpt * write for blk in range(len(tr.size))])
    for blk, v in zip(blocks.values(), clair):
        blk["clairvoyant_value_usd"] = float(v)

    prefix = naive_prefix_rollup(blocks.values())

    distinct = sum(blk["bytes"] for blk in blocks.values())
    once = [blk for blk in blocks.values() if not blk["reused"]]
    # byte-weighted quantiles: walk the blocks in density order until the share is reached
    ranked = sorted(blocks.values(), key=lambda x: x["value_usd_per_byte"])
    quantiles = {}
    for q in (0.10, 0.25, 0.50, 0.75, 0.90, 0.99):
        seen = 0
        for blk in ranked:
            seen += blk["bytes"]
            if seen >= q * distinct:
                quantiles[f"p{round(100 * q)}"] = blk["value_usd_per_byte"]
                break
    summary = {
        "accesses": n, "blocks": len(blocks), "prefixes": len(prefix), "distinct_bytes": distinct,
        "never_reused_blocks": len(once),
        "never_reused_bytes": sum(blk["bytes"] for blk in once),
        "never_reused_bytes_share": sum(blk["bytes"] for blk in once) / distinct if distinct else None,
        "never_reused_access_share": len(once) / n if n else None,
        "no_reuse_in_horizon_access_share": sum(x["reuses"] == 0 for x in access) / n if n else None,
        "gain_gpu_seconds": sum(blk["gain_gpu_seconds"] for blk in blocks.values()),
        "write_cost_usd": sum(blk["bytes"] * write * blk["stays"] for blk in blocks.values()),
        "read_cost_usd": sum(blk["bytes"] * read * blk["horizon_hits"] for blk in blocks.values()),
        "occupancy_cost_usd": sum(blk["bytes"] * occupancy * blk["stored_s"] for blk in blocks.values()),
        "total_value_usd": sum(blk["total_value_usd"] for blk in blocks.values()),
        "clairvoyant_bound_usd": sum(blk["clairvoyant_value_usd"] for blk in blocks.values()),
        "negative_value_bytes_share": (sum(blk["bytes"] for blk in blocks.values() if blk["total_value_usd"] < 0)
                                       / distinct if distinct else None),
        "positive_window_value_access_share": sum(x["value_usd"] > 0 for x in access) / n if n else None,
        "value_usd_per_byte_quantiles": quantiles if n else {k: None for k in ("p10", "p25", "p50", "p75", "p90",
                                                                               "p99")},
    }
    return {"access": access, "block": blocks, "prefix": prefix, "summary": summary}


def visit_blocks(block, request, pos, n_blocks):
    """Per-block visits of a whole trace: (prev_request[N], count[M], first_request[M],
    first_pos[M], last_request[M]); -1 where a block has no such access."""
    prev, count = [], [0] * n_blocks
    first_request, first_pos, last_request = [-1] * n_blocks, [-1] * n_blocks, [-1] * n_blocks
    for b, r, p in zip(_as_ints(block), _as_ints(request), _as_ints(pos)):
        prev.append(last_request[b])
        if count[b] == 0:
            first_request[b], first_pos[b] = r, p
        count[b] += 1
        last_request[b] = r
    return prev, count, first_request, first_pos, last_request


#: the threshold of kvtrace.analyses.value's shared root (kvtrace.analyses.curves.SHARED_FIRST_BLOCK_SHARE)
SHARED_FIRST_BLOCK_SHARE_TWIN = 0.99


def naive_families(requests):
    """(root, request_share, family): the shared root (block ids, position 0 first),
    the share of non-empty requests whose first k blocks are it (None without one),
    and each block's family root, from request block lists in trace order."""
    full = [r for r in requests if r]
    root = []
    while True:
        at = [r[len(root)] for r in full if len(r) > len(root)]
        if not at:
            break
        block, count = collections.Counter(at).most_common(1)[0]
        if count / len(at) < SHARED_FIRST_BLOCK_SHARE_TWIN:
            break
        root.append(block)
    k = len(root)
    share = sum(r[:k] == root for r in full) / len(full) if root else None
    family = {}
    for r in requests:
        for b in r:
            if b in family:
                continue
            if not k:
                family[b] = r[0]
                continue
            label = r[k] if len(r) > k else root[0]
            family[b] = root[0] if b in root or label in root else label
    return root, share, family


def naive_prefix_rollup(blocks) -> dict[int, dict]:
    """The per-prefix table of the value twin: block dicts summed by ``root_block``."""
    prefix: dict[int, dict] = {}
    for blk in blocks:
        p = prefix.setdefault(blk["root_block"], {"blocks": 0, "bytes": 0, "accesses": 0, "never_reused_bytes": 0,
                                                  "gain_gpu_seconds": 0.0, "total_value_usd": 0.0,
                                                  "clairvoyant_value_usd": 0.0})
        p["blocks"] += 1
        p["bytes"] += blk["bytes"]
        p["accesses"] += blk["accesses"]
        p["never_reused_bytes"] += 0 if blk["reused"] else blk["bytes"]
        for k in ("gain_gpu_seconds", "total_value_usd", "clairvoyant_value_usd"):
            p[k] += blk[k]
    for p in prefix.values():
        p["value_usd_per_byte"] = p["total_value_usd"] / p["bytes"]
    return prefix
