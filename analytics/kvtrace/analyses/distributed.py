"""Distributed runs on Dask (``kvtrace curve|whatif --engine dask [--scheduler ADDRESS]``).

Needs the optional extra: ``pip install 'kvtrace[dask]'`` (``dask[distributed]``).
Without ``--scheduler`` a local cluster of ``--workers`` processes is started; with
it, kvtrace connects to an existing scheduler, whose workers must see the trace at the
same path (a shared file system) and have kvtrace installed.

Curves: a partitioned estimate
------------------------------
The block key space is cut into P spatial partitions by a hash of the block
(:mod:`kvtrace.kernels.partition`; partition 0 is exactly the SHARDS sample at rate
1/P, and every partition is such a sample of another slice). Every block falls in one
partition with all its accesses, so each partition's access stream is a complete
trace of its own:

1. **map** (one task per Parquet row group: the worker's share of the file): read and
   validate the row group (:mod:`kvtrace.ingest.chunks`), split its accesses by
   partition;
2. **reduce** (one task per partition): concatenate the partition's pieces in trace
   order into an in-memory :class:`kvtrace.trace.Trace` of its own (its blocks with
   dense ids of their own, the accesses grouped into the requests they belong to);
3. **curve** (one task per partition, on the worker holding it): the same exact curve
   fold as any trace's (:func:`kvtrace.analyses.curve_pass.exact_pass`), each distance
   scaled to an estimate: ``d_hat = size[b] + P x (d_p - size[b])``, where ``d_p`` is
   the exact distance inside the partition. Each other distinct block in the reuse
   window is in the partition with probability 1/P, so ``d_hat`` is unbiased; its
   variance is ``(P - 1) x sum of the squared sizes of those blocks <= (P - 1) x B x d``
   (B the largest block, tokens);
4. **merge** on the client: the partitions' capacity histograms are added (every
   access is counted once, with weight 1) and the curve is evaluated as in memory
   (:func:`kvtrace.analyses.curves.curve_from_pass`).

What is exact: accesses, tokens, bytes, cold misses, the ceiling (infinite capacity),
distinct blocks and bytes. What is estimated: which capacity each reuse needs.

**Error bound.** If every estimate lies within ``k sigma(C)`` of its true distance,
``sigma(C) = sqrt((P - 1) x B x C)``, the estimated rate at capacity C lies between the
true rates at ``C - k sigma`` and ``C + k sigma``, so ``|H_hat(C) - H(C)| <= H(C + k
sigma) - H(C - k sigma)``. kvtrace reports that band width with ``k = 3``, evaluated on
the estimated curve itself (column ``prefix_token_hit_rate_bound``, and its maximum in
the run's info): a per-capacity bound on the headline usable-prefix token rate,
labelled as an estimate. Under the prefix-aware model (the default) a request's
distances grow along its chain, so the usable-prefix distance is the access's own and
the bound covers it; under ``--eviction flat`` the running max inside a partition
skips the other partitions' blocks, which biases usable-prefix rates upward beyond the
bound (any-block rates are unaffected).

What-if sweeps: one configuration per task
------------------------------------------
:func:`sweep` ships the loaded trace to every worker once and runs each configuration
as one task (:func:`kvtrace.analyses.whatif.simulate`, a deterministic single-thread replay),
so the table equals a single-process sweep exactly.
"""

from __future__ import annotations

import contextlib
import operator
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import polars as pl

from kvtrace.analyses.curve_pass import CurvePass, exact_pass
from kvtrace.analyses.curves import HEADLINE, CurveResult, curve_from_pass, plan_curve
from kvtrace.errors import KvtraceError, UsageError
from kvtrace.ingest.chunks import ChunkInfo, ParquetRequests, chunk_accesses
from kvtrace.kernels.densify import densify
from kvtrace.kernels.partition import partition_of
from kvtrace.kernels.stackdist import COLD
from kvtrace.trace import Accesses, Trace, TraceMeta, index_dtype

#: Width of the reported error band, in standard deviations of a distance estimate.
BOUND_SIGMAS = 3.0
ENGINES = ("local", "dask")


# --------------------------------------------------------------------------- clusters
def require_dask() -> None:
    """Raise a one-line error when ``dask[distributed]`` is not installed."""
    try:
        import dask  # noqa: F401
        import distributed  # noqa: F401
    except ImportError:
        raise KvtraceError("--engine dask needs the dask extra: pip install 'kvtrace[dask]'") from None


@contextlib.contextmanager
def dask_client(scheduler: str | None = None, workers: int = 2) -> Iterator[object]:
    """A ``distributed.Client``: connected to ``scheduler`` (``tcp://host:8786``), or to a
    local cluster of ``workers`` single-threaded processes started (and stopped) here."""
    require_dask()
    from distributed import Client, LocalCluster

    if scheduler:
        try:
            client = Client(scheduler, timeout="30s")
        except (OSError, TimeoutError) as exc:
            raise KvtraceError(f"cannot reach the Dask scheduler at {scheduler}: {exc}", field="scheduler") from None
        with client:
            yield client
        return
    with LocalCluster(n_workers=int(workers), threads_per_worker=1, processes=True, dashboard_address=":0") as cl:
        with Client(cl) as client:
            yield client


class SerialClient:
    """The part of ``distributed.Client`` this module uses, run in this process in
    submission order. Same tasks, same merge: the reference a Dask run equals."""

    class _Done:
        def __init__(self, value) -> None:
            self._value = value

        def result(self):
            return self._value

    def submit(self, fn, *args, pure: bool = True, **kwargs):
        args = [a.result() if isinstance(a, SerialClient._Done) else a for a in args]
        args = [[x.result() if isinstance(x, SerialClient._Done) else x for x in a] if isinstance(a, list) else a
                for a in args]
        return SerialClient._Done(fn(*args, **kwargs))

    def gather(self, futures):
        return [f.result() for f in futures]

    def scatter(self, value, broadcast: bool = False):
        return SerialClient._Done(value)


def n_workers(client) -> int:
    """Worker threads of a client's cluster (1 for :class:`SerialClient`)."""
    if isinstance(client, SerialClient):
        return 1
    info = client.scheduler_info()
    return max(1, sum(int(w.get("nthreads", 1)) for w in info.get("workers", {}).values()))


# --------------------------------------------------------------------------- tasks
@dataclass(frozen=True)
class _Source:
    """How a worker opens the trace (plain values: pickled into every task)."""

    path: str
    block_tokens: int | None
    share_tenants: bool

    def open(self) -> ParquetRequests:
        return ParquetRequests(self.path, block_tokens=self.block_tokens, share_tenants=self.share_tenants)


def _tenants_task(src: _Source, groups: list[int]) -> list:
    return src.open().tenant_names(groups) or []


def _map_task(src: _Source, groups: list[int], names: list[str] | None, n_parts: int):
    """Read row groups, split their accesses by partition.

    Returns ``(requests, part_0, ..., part_{P-1})``: ``requests`` = (first row,
    timestamps, blocks per request, length mismatches, request ids); a part = (global request,
    position, tokens, hash, namespace) of the partition's accesses, in trace order.
    """
    p = src.open()
    B = int(p.meta.block_tokens)
    info = ChunkInfo()
    ts, ids, lens, req, pos, tok, hsh, nss = [], [], [], [], [], [], [], []
    row_first = int(p.row_offsets[groups[0]]) if groups else 0
    for row0, df in p.chunks(columns=("request_id", "timestamp", "input_tokens", "block_ids", "tenant"),
                             row_groups=groups,
                             info=info):
        lengths, hashes, ns, tokens, _ = chunk_accesses(df, B, names)
        starts = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=starts[1:])
        r = np.repeat(np.arange(row0, row0 + df.height, dtype=np.int64), lengths)
        ts.append(df["timestamp"].to_numpy())
        ids.append(df["request_id"].to_numpy())
        lens.append(lengths)
        req.append(r)
        pos.append((np.arange(hashes.shape[0], dtype=np.int64) - np.repeat(starts[:-1], lengths)).astype(np.int32))
        tok.append(tokens)
        hsh.append(hashes)
        nss.append(ns)

    def cat(parts, dtype):
        return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)

    req_a, pos_a, tok_a = cat(req, np.int64), cat(pos, np.int32), cat(tok, np.int32)
    hsh_a, ns_a = cat(hsh, np.uint64), cat(nss, np.int32)
    part = partition_of(hsh_a, ns_a, n_parts)
    order = np.argsort(part, kind="stable")  # trace order inside each partition
    bounds = np.searchsorted(part[order], np.arange(n_parts + 1))
    out = [(row_first, cat(ts, np.float64), cat(lens, np.int64), info.length_mismatches, cat(ids, np.int64))]
    for q in range(n_parts):
        sel = order[bounds[q]:bounds[q + 1]]
        out.append((req_a[sel], pos_a[sel], tok_a[sel], hsh_a[sel], ns_a[sel]))
    return tuple(out)


def _reduce_task(pieces: list, meta: TraceMeta) -> Trace:
    """One partition as an in-memory :class:`kvtrace.trace.Trace` of its own: the
    accesses of its blocks in trace order, grouped into the requests they belong to,
    with dense ids of its own. ``requests`` holds the trace's index of each of its
    requests (``request``); ``pos`` and ``tokens`` are the accesses' own in the trace."""
    req = np.concatenate([x[0] for x in pieces]) if pieces else np.empty(0, np.int64)
    pos = np.concatenate([x[1] for x in pieces]) if pieces else np.empty(0, np.int32)
    tok = np.concatenate([x[2] for x in pieces]) if pieces else np.empty(0, np.int32)
    hsh = np.concatenate([x[3] for x in pieces]) if pieces else np.empty(0, np.uint64)
    ns = np.concatenate([x[4] for x in pieces]) if pieces else np.empty(0, np.int32)
    del pieces
    block, state = densify(hsh, ns, tok)
    block_hash, block_ns, size = (a.copy() for a in state.arrays())
    del state, hsh, ns
    n = req.shape[0]
    new = np.ones(n, dtype=bool)
    if n:
        np.not_equal(req[1:], req[:-1], out=new[1:])
    heads = np.flatnonzero(new)
    req_start = np.append(heads, n).astype(np.int64)
    local = np.repeat(np.arange(heads.shape[0], dtype=index_dtype(heads.shape[0])), np.diff(req_start))
    accesses = Accesses(local, pos, block.astype(np.int64, copy=False), tok, req_start)
    return Trace(pl.DataFrame({"request": req[heads]}), accesses, block_hash, block_ns,
                 np.ascontiguousarray(size, dtype=np.int64), meta)


def _totals_task(part: Trace) -> tuple[int, int, int]:
    return part.n_blocks, int(part.block_size.sum()), part.n_accesses


def _curve_task(part: Trace, eviction: str, grid: np.ndarray, first_req: int, n_parts: int) -> CurvePass:
    """The exact curve fold on one partition, its distances scaled to estimates
    (:func:`kvtrace.analyses.curve_pass.exact_pass`); stays on its worker."""
    first = int(np.searchsorted(part.requests["request"].to_numpy(), first_req))
    return exact_pass(part, eviction, grid, first, None, 1, partitions=n_parts)


def _heads_task(part: Trace, passed: CurvePass):
    """What the merge needs of a partition's pass: its histogram, the trace requests
    whose first block is in the partition with their keys, and its top distance."""
    heads = part.accesses.pos[part.req_start[:-1]] == 0
    return passed.hist, part.requests["request"].to_numpy()[heads], passed.request_keys[heads], passed.top


def _ranges_task(passed: CurvePass, lo_keys, hi_keys):
    return passed.keys_in_ranges(lo_keys, hi_keys)


# --------------------------------------------------------------------------- the trace
class PartitionedTrace:
    """A trace mapped into P partitions on a cluster (see the module docstring).

    It holds what a curve plans from that is O(requests) (timestamps, offsets); each
    partition is an in-memory :class:`kvtrace.trace.Trace` held by a worker.
    ``block_size`` holds the distinct tokens of each partition (their sum is the
    trace's; per-block sizes stay on the workers).
    """

    def __init__(self, client, src: _Source, n_parts: int,
                 progress: Callable[[int, int], None] | None = None) -> None:
        self.client = client
        self.n_parts = int(n_parts)
        p = src.open()
        self.meta: TraceMeta = p.meta
        groups = [g for g in range(p.n_row_groups) if p.row_offsets[g + 1] > p.row_offsets[g]]
        steps = 2 * len(groups) + 2 * self.n_parts
        done = 0

        def tick(k: int = 1) -> None:
            nonlocal done
            done += k
            if progress is not None:
                progress(done, steps)

        submit = client.submit
        names = None
        if not p.meta.share_tenants:  # namespace codes rank the whole file's tenant names
            found: set = set()
            for part in client.gather([submit(_tenants_task, src, [g], pure=False) for g in groups]):
                found.update(part)
            names = sorted(found) or None
        tick(len(groups))
        maps = [submit(_map_task, src, [g], names, self.n_parts, pure=False) for g in groups]
        heads = client.gather([submit(operator.getitem, m, 0) for m in maps])
        tick(len(groups))
        last = -np.inf
        mismatches = 0
        for row_first, ts, _, mm, _ in heads:
            if ts.size and ts[0] < last:
                raise KvtraceError(
                    "requests are not in timestamp order (this row arrives before the one above it): a streaming "
                    "or distributed run reads the table in order; sort it first", path=src.path, row=row_first,
                    field="timestamp")
            if ts.size:
                last = float(ts[-1])
            mismatches += mm
        ts = np.concatenate([h[1] for h in heads]) if heads else np.empty(0)
        lengths = np.concatenate([h[2] for h in heads]) if heads else np.empty(0, np.int64)
        p.check_whole(np.concatenate([h[4] for h in heads]) if heads else np.empty(0, np.int64), ts)
        self.requests = pl.DataFrame({"timestamp": ts})
        self.req_start = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=self.req_start[1:])
        self.warnings = p.warnings(ChunkInfo(rows=int(lengths.shape[0]), length_mismatches=mismatches))
        self.parts = []
        for q in range(self.n_parts):
            pieces = [submit(operator.getitem, m, q + 1) for m in maps]
            self.parts.append(submit(_reduce_task, pieces, self.meta, pure=False))
        del pieces  # the map outputs are released as soon as the reduces have read them
        totals = client.gather([submit(_totals_task, r) for r in self.parts])
        del maps
        tick(self.n_parts)
        self.partition_blocks = np.array([t[0] for t in totals], dtype=np.int64)
        self.block_size = np.array([t[1] for t in totals], dtype=np.int64)
        self.partition_accesses = np.array([t[2] for t in totals], dtype=np.int64)
        self._tick = tick

    @property
    def n_requests(self) -> int:
        return self.requests.height

    @property
    def n_accesses(self) -> int:
        return int(self.req_start[-1])

    @property
    def n_blocks(self) -> int:
        return int(self.partition_blocks.sum())

    @property
    def request_timestamp(self) -> np.ndarray:
        return self.requests["timestamp"].to_numpy()

    def curve_pass(self, eviction: str, grid: np.ndarray, first_req: int) -> CurvePass:
        """The curve fold on every partition (on its worker), merged: histograms added
        in partition order (every access counted once, weight 1), each request's key
        from the partition holding its first block, the largest top distance; the knee
        search asks every partition for its keys in the ranges."""
        client = self.client
        passes = [client.submit(_curve_task, part, eviction, grid, first_req, self.n_parts, pure=False)
                  for part in self.parts]
        merged = client.gather([client.submit(_heads_task, part, p) for part, p in zip(self.parts, passes)])
        self._tick(self.n_parts)
        hist = merged[0][0].copy()
        for h in merged[1:]:
            hist += h[0]
        n_req = self.n_requests
        keys = np.full(n_req, COLD, dtype=np.int64)
        for _, heads, k, _ in merged:
            keys[heads] = k
        members = np.arange(n_req) >= first_req
        top = max([h[3] for h in merged] + [0])

        def in_ranges(lo_keys, hi_keys):
            res = client.gather([client.submit(_ranges_task, p, lo_keys, hi_keys) for p in passes])
            return tuple(np.concatenate([x[i] for x in res]) for i in range(4))

        return CurvePass(hist, keys, members, top, in_ranges)

    def close(self) -> None:
        """Release the partitions held by the workers."""
        self.parts = []


def error_band(grid: np.ndarray, hist: np.ndarray, capacities_tokens: np.ndarray, n_parts: int,
               block_tokens: int, sigmas: float = BOUND_SIGMAS) -> np.ndarray:
    """Width of the headline rate's error band at each capacity (module docstring).

    ``H_hat(C + k sigma) - H_hat(C - k sigma)`` with ``sigma = sqrt((P - 1) x B x C)``,
    read conservatively on the evaluation grid (the next grid point above the upper
    end, the last one below the lower end).
    """
    pre = hist[1, 0, :, 1]  # usable-prefix tokens per bin
    total = float(pre.sum())
    G = grid.shape[0]
    if total <= 0 or n_parts <= 1:  # one partition is the exact curve
        return np.zeros(capacities_tokens.shape[0])
    cum = np.cumsum(pre[:G]) / total
    ceiling = float(pre[: G + 1].sum()) / total
    c = capacities_tokens.astype(np.float64)
    sigma = np.sqrt(max(n_parts - 1, 0) * float(block_tokens) * c)
    hi_i = np.searchsorted(grid, c + sigmas * sigma, side="left")
    upper = np.where(hi_i < G, cum[np.minimum(hi_i, G - 1)], ceiling)
    lo_i = np.searchsorted(grid, c - sigmas * sigma, side="right") - 1
    lower = np.where(lo_i >= 0, cum[np.maximum(lo_i, 0)], 0.0)
    return np.maximum(upper - lower, 0.0)


def partitioned_curve(path, *, client, partitions: int | None = None, fmt: str = "auto",
                      block_tokens: int | None = None, share_tenants: bool = False, eviction: str = "prefix-aware",
                      progress: Callable[[int, int], None] | None = None, **curve_options) -> CurveResult:
    """A partitioned-estimate curve of a Parquet trace, computed on a Dask cluster.

    Parameters
    ----------
    path : path-like
        Parquet request table (time-sorted); the workers read it at this path.
    client : distributed.Client or SerialClient
        Where the tasks run (:func:`dask_client`).
    partitions : int, optional
        P (default: the cluster's worker threads, at least 2).
    eviction, fmt, block_tokens, share_tenants
        As for :func:`kvtrace.analyses.curves.compute_curve` and :func:`kvtrace.ingest.load_trace`.
    progress : callable, optional
        ``progress(steps_done, steps_total)`` over the map, reduce and bin steps.
    **curve_options
        ``model``, ``gpu``, ``capacities``, ``display_capacities``, ``points``,
        ``warmup`` of :func:`kvtrace.analyses.curves.compute_curve` (not ``by``,
        ``sample_rate`` or ``distances``). ``display_capacities`` may be a callable
        ``(block_tokens, distinct_tokens) -> list of bytes``.

    Returns
    -------
    CurveResult
        ``info["approximate"]`` is True and ``info["partitioned"]`` describes the
        estimate and its error bound; the curve tables gain
        ``prefix_token_hit_rate_bound`` (band width, module docstring).
    """
    from kvtrace.ingest.stream import is_parquet

    for bad in ("by", "sample_rate", "distances"):
        if curve_options.pop(bad, None) is not None:
            raise UsageError(f"--{bad.replace('_', '-')} is not available with --engine dask", field=bad)
    if not is_parquet(path, fmt):
        raise UsageError("--engine dask reads Parquet request tables: convert the trace once with kvtrace ingest",
                         field="engine")
    P = int(partitions) if partitions else max(2, n_workers(client))
    if P < 1:
        raise UsageError(f"expected at least one partition, got {P}", field="partitions")
    src = _Source(str(path), block_tokens, share_tenants)
    trace = PartitionedTrace(client, src, P, progress=progress)
    disp = curve_options.get("display_capacities")
    if callable(disp):  # capacities that depend on the trace's distinct tokens, known only now
        curve_options["display_capacities"] = disp(int(trace.meta.block_tokens), int(trace.block_size.sum()))
    try:
        plan = plan_curve(trace, eviction=eviction, **curve_options)
        passed = trace.curve_pass(plan.eviction, plan.grid, plan.first_req)
        result = curve_from_pass(trace, plan, passed)
        grid, hist = plan.grid, passed.hist
    finally:
        trace.close()
    B = int(trace.meta.block_tokens)
    bound_col = f"{HEADLINE}_bound"

    def with_bound(df: pl.DataFrame | None) -> pl.DataFrame | None:
        if df is None:
            return None
        band = error_band(grid, hist, df["capacity_tokens"].to_numpy(), P, B)
        return df.with_columns(pl.Series(bound_col, band))

    result.curve = with_bound(result.curve)
    result.display = with_bound(getattr(result, "display", None))
    band = result.curve[bound_col].to_numpy()
    result.info["approximate"] = True
    result.info["engine"] = "dask"
    result.info["partitioned"] = {
        "partitions": P,
        "method": "spatial partitions by block hash, each an exact stack-distance pass scaled by P; "
                  "histograms merged",
        "exact": "accesses, tokens, cold misses, ceiling, distinct blocks and bytes",
        "metric": HEADLINE,
        "bound_column": bound_col,
        "bound_sigmas": BOUND_SIGMAS,
        "sigma": "sqrt((P - 1) x block_tokens x capacity_tokens) tokens",
        "max_error_bound": float(band.max()) if band.size else 0.0,
        "mean_error_bound": float(band.mean()) if band.size else 0.0,
        "partition_accesses": trace.partition_accesses.tolist(),
    }
    for w in trace.warnings:
        result.info.setdefault("warnings", []).append(w)
    return result


# --------------------------------------------------------------------------- what-ifs
def _simulate_task(trace, config, kwargs) -> dict:
    from kvtrace.analyses.whatif import simulate

    return simulate(trace, config, **kwargs).summary


def sweep(trace, configs: list, *, client, model=None, gpu=None, response=None, eviction: str = "prefix-aware",
          cache_rules: str = "ideal",
          values=None, warmup=None,
          progress: Callable[[int, int], None] | None = None) -> pl.DataFrame:
    """:func:`kvtrace.analyses.whatif.sweep` with one configuration per Dask task.

    The trace (and the per-access values of ``value>=v`` policies) is scattered to
    every worker once; each task is the same deterministic replay as in one process,
    so the table is identical to :func:`kvtrace.analyses.whatif.sweep`'s.
    """
    from kvtrace.model import GpuSpec, ModelSpec, resolve_gpu, resolve_model
    from kvtrace.analyses.whatif import summary_table, values_array

    kwargs = {"model": model if isinstance(model, ModelSpec) else resolve_model(model),
              "gpu": gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu), "response": response,
              "eviction": eviction, "cache_rules": cache_rules,
              "values": None if values is None else values_array(values, trace.n_accesses),
              "warmup": warmup}
    shared = client.scatter(trace, broadcast=True)
    futures = [client.submit(_simulate_task, shared, c, kwargs, pure=False) for c in configs]
    rows = []
    for i, f in enumerate(futures):
        rows.append(f.result())
        if progress is not None:
            progress(i + 1, len(futures))
    return summary_table(rows)


#: Bytes per access a worker holds (tracemalloc on a partition of the benchmark trace):
#: map output waiting for its reduce; the reduce task's peak on top of its input; a
#: finished partition until the curve is done.
MAP_BYTES_PER_ACCESS = 28
REDUCE_PEAK_BYTES_PER_ACCESS = 81
HELD_BYTES_PER_ACCESS = 42


def estimate_cluster(accesses: int, per_worker_accesses_per_s: float, nodes: int,
                     partitions_per_node: int = 4) -> dict:
    """Time and memory of a partitioned curve of ``accesses`` on ``nodes`` nodes of one
    worker each, from a measured end-to-end per-worker throughput (accesses/s).

    Time scales linearly (the work per access is the same in every partition; hash
    partitions balance blocks, not accesses, so allow for an uneven split). Memory per node, in
    bytes: its share of the map output, one reduce task's peak on a partition, and the
    finished partitions it holds until the curve is done.
    """
    per_node = accesses / nodes
    per_partition = per_node / partitions_per_node
    return {
        "nodes": nodes, "partitions": nodes * partitions_per_node, "accesses_per_node": per_node,
        "seconds": per_node / per_worker_accesses_per_s,
        "peak_bytes_per_node": per_node * (MAP_BYTES_PER_ACCESS + HELD_BYTES_PER_ACCESS)
        + per_partition * REDUCE_PEAK_BYTES_PER_ACCESS,
        "shuffle_bytes": accesses * MAP_BYTES_PER_ACCESS * (nodes - 1) / nodes,
    }


__all__ = ["BOUND_SIGMAS", "ENGINES", "PartitionedTrace", "SerialClient", "dask_client", "error_band",
           "estimate_cluster", "n_workers", "partitioned_curve", "require_dask", "sweep"]
