"""The value report (``kvtrace value``): per-block and per-prefix tables and a summary,
one fold over the chunks of any trace source (module docstring of
:mod:`kvtrace.analyses.value`).

Passes, each over the source's chunks (the first two are :mod:`kvtrace.analyses.value.access`'s)
-------------------------------------------------------------------------------------------
1. **Windows** (forward): each access's window value (only its sign is reported) and
   two flags for the reduce (a reuse within the horizon; the access starts a stay),
   a uint8 column of the source; the lead's counts are each block's accesses.
2. **Next access** (backward): three columns (:func:`kvtrace.analyses.value.access.next_accesses`).
3. **Shared root** (:func:`kvtrace.analyses.value.families.shared_root`): one gather
   pass per leading position it tests.
4. **Reduce** (forward): the schedule's writes, hits, gains and costs, per-block sums,
   the best keep/drop schedule's programme with its per-block state carried, each
   block's first and last request and, from the chunk holding its first request, its
   prefix family; the per-access write, read and occupancy costs go to three columns.
5. **Tables**: the per-prefix table and the summary; the per-block table is built on
   first use (``ValueResult.per_block``; it alone is about 105 bytes per block).

Order of float sums (the same for every source and every chunk size): a per-block sum
adds its accesses' values one by one in trace order from 0.0 (``np.add.at``, which is
``np.bincount(block, weights=x)``'s order); a total over accesses is ``np.sum`` of the
whole per-access column (numpy's pairwise summation); a total over blocks is ``np.sum``
of the per-block array.

Memory, per distinct block M (bytes; counts and indices int32 below 2**31): the windows
49 x M, the next accesses 20 x M, the reduce 60 x M (gain, cost and value sums, the
schedule's two states, hits, first and last request, accesses, family), then the
tables 32 x M plus about 32 x M of temporaries; the first and last request, hits and
cost (20 x M) wait for the per-block table on disk when the source spills (a spill
directory of their own beside the source's). On top, one chunk of
:func:`kvtrace.analyses.value.access.chunk_accesses` accesses (about 300 bytes each
with temporaries) per cursor. Disk of a streamed source: 1 + 24 + 24 bytes per access
(flags, next accesses, costs; the costs are removed once summed).
"""

from __future__ import annotations

import math
import shutil
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from kvtrace.errors import UsageError
from kvtrace.kernels.future import best_keep_value_into, block_extent
from kvtrace.model import GpuSpec, ModelSpec
from kvtrace.trace import index_dtype
from kvtrace.trace import spill as spill_mod
from kvtrace.trace.source import Column, TraceSource
from kvtrace.analyses.value.access import (
    FutureReuse,
    FutureReuseChunks,
    WindowState,
    chunk_accesses,
    request_times,
    windows,
)
from kvtrace.analyses.value.families import BlockIds, family_roots, shared_root
from kvtrace.analyses.value.pricing import (
    StorageCosts,
    clairvoyant_interval,
    cost_parts,
    interval_values,
    window_values,
)

#: Quantiles of the value-density distribution reported in the summary.
QUANTILES = (0.10, 0.25, 0.50, 0.75, 0.90, 0.99)


@dataclass
class ValueResult:
    """Output of :func:`value_report` (schemas in the module docstring).

    Attributes
    ----------
    per_block : polars.DataFrame
        One row per block, built on first use (it alone holds about 105 bytes per
        block), partly from arrays the report parked (on disk for a streamed source).
    per_prefix : polars.DataFrame
        One row per root prefix, most valuable first.
    summary : dict
        Scalar figures, units in the key names (see :func:`value_report`).
    future : FutureReuseChunks
        What makes the per-access arrays the tables were built from, chunk by chunk
        (``write_table(path, metadata)``) or whole (``future.value_usd`` ...).
    """

    _per_block: pl.DataFrame | Callable[[], pl.DataFrame]  # a builder until first read
    per_prefix: pl.DataFrame
    summary: dict
    future: FutureReuseChunks

    @property
    def per_block(self) -> pl.DataFrame:
        if not isinstance(self._per_block, pl.DataFrame):
            self._per_block = self._per_block()
        return self._per_block

    def top_prefixes(self, n: int = 10) -> pl.DataFrame:
        """The ``n`` root prefixes of highest total value."""
        return self.per_prefix.head(n)

    def to_dict(self, top: int = 10) -> dict:
        """Summary and the ``top`` prefixes, JSON-ready (non-finite floats: use
        :func:`kvtrace.outputs.write_json_atomic`, which writes them as null)."""
        return {"summary": self.summary, "top_prefixes": self.top_prefixes(top).to_dicts()}


def weighted_quantiles(x: np.ndarray, weight: Callable[[np.ndarray], np.ndarray], total_weight: int, qs,
                        chunk: int = 1 << 22) -> dict:
    """Inverted-CDF quantiles of ``x`` weighted by ``weight(indices)`` (integers >= 0,
    summing to ``total_weight``): the smallest x whose cumulative weight reaches
    q x total.

    The cumulative weight is ``np.cumsum(w[order].astype(np.float64))`` with ``order``
    the stable ascending order of ``x``, made chunk by chunk with the same additions
    in the same order (a chunk's first value is added to the previous chunk's last),
    read twice (its last value, then the positions of the quantiles): one per-block
    array (``order``) instead of three.
    """
    if x.size == 0 or total_weight <= 0:
        return {f"p{round(100 * q)}": None for q in qs}
    order = np.argsort(x, kind="stable")

    def cumulative():
        carry = None
        for lo in range(0, order.shape[0], chunk):
            part = weight(order[lo:lo + chunk]).astype(np.float64)
            if carry is not None:
                part[0] += carry
            np.cumsum(part, out=part)
            carry = part[-1]
            yield lo, part

    for _, part in cumulative():
        last = part[-1]
    targets = [q * last for q in qs]
    found = [x.size] * len(qs)  # np.searchsorted's answer when no value reaches the target
    for lo, part in cumulative():
        for k, target in enumerate(targets):
            if found[k] == x.size and part[-1] >= target:
                found[k] = lo + int(np.searchsorted(part, target, side="left"))
        if all(f < x.size for f in found):
            break
    return {f"p{round(100 * q)}": float(x[order[min(i, x.size - 1)]]) for q, i in zip(qs, found)}


def value_report(
    trace: TraceSource,
    *,
    model: ModelSpec | str | None = None,
    gpu: GpuSpec | str | None = None,
    horizon_s: float | str | None = None,
    costs: StorageCosts | None = None,
    future: FutureReuse | FutureReuseChunks | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ValueResult:
    """Per-block and per-prefix future-reuse value of a trace, and a summary.

    Parameters
    ----------
    trace : TraceSource
        In memory (:class:`kvtrace.trace.Trace`) or streamed
        (:func:`kvtrace.ingest.stream.open_stream`): the same passes over its chunks
        (module docstring), the same results bit for bit. ``ValueResult.future`` is a
        :class:`FutureReuseChunks`, which makes the per-access arrays again on demand.
    model, gpu, horizon_s, costs
        As for :func:`future_reuse` (None: the same defaults).
    future : FutureReuse or FutureReuseChunks, optional
        The future reuse of this same source (:func:`future_reuse`, or an earlier
        report's ``future``): its model, GPU, horizon and costs are used (then
        ``model``, ``gpu``, ``horizon_s`` and ``costs`` must not be given).
    progress : callable, optional
        ``progress(done, total)`` during the passes.

    Returns
    -------
    ValueResult
        Tables as in the module docstring; ``summary`` keys:

        - ``model``, ``kv_bytes_per_token`` (bytes), ``gpu``, ``gpu_dollars_per_hour``,
          ``horizon_s`` (None = infinite), the costs (:meth:`StorageCosts.to_dict`);
        - ``accesses``, ``blocks``, ``prefixes`` (prefix families, the shared one
          included), ``distinct_bytes``;
        - ``shared_root_blocks`` (its depth k, 0: none), ``shared_root_hashes`` (the
          source hashes of its blocks, position 0 first; [] for none),
          ``shared_root_request_share`` (share of the non-empty requests whose first k
          blocks are the shared root; None for none): the root the prefix families
          are grouped below (:func:`shared_root`);
        - ``never_reused_blocks``, ``never_reused_bytes``, ``never_reused_bytes_share``
          (share of distinct bytes in blocks accessed once: one-shot prompts),
          ``never_reused_access_share`` (share of accesses that touch such blocks),
          ``no_reuse_in_horizon_access_share`` (share of accesses with no reuse
          within the horizon);
        - ``gain_gpu_seconds``, ``gain_usd``, ``write_cost_usd``,
          ``read_cost_usd``, ``occupancy_cost_usd``, ``total_value_usd``
          (= gain - the three costs) of the time-to-live schedule;
        - ``clairvoyant_bound_usd``: sum of the per-block best schedules;
        - ``negative_value_bytes_share``: share of distinct bytes in blocks whose total
          value is < 0; ``positive_window_value_access_share``: share of accesses with
          a window value > 0 (what a ``value > 0`` admission would store);
        - ``value_usd_per_byte_quantiles``: {"p10", "p25", "p50", "p75", "p90", "p99"} of
          the blocks' ``value_usd_per_byte`` ($/byte), weighted by bytes (inverted CDF:
          the smallest density such that that share of the bytes is at or below it).

        Shares and quantiles are None for a trace without accesses.
    """
    if future is None:
        fut = FutureReuseChunks.of(trace, model, gpu, horizon_s, costs)
    else:
        if any(x is not None for x in (model, gpu, horizon_s, costs)):
            raise UsageError("pass either a computed FutureReuse or model/gpu/horizon/costs, not both",
                             field="future")
        if future.source is not trace:
            raise UsageError("the FutureReuse was computed on another trace (a streamed trace computes its own)",
                             field="future")
        fut = future if isinstance(future, FutureReuseChunks) else FutureReuseChunks(
            trace, future.model, future.gpu, future.horizon_s, future.costs)
    t = trace
    M, N = t.n_blocks, t.n_accesses
    bpt = int(fut.info["kv_bytes_per_token"])
    report = (lambda done: None) if progress is None else (lambda done: progress(done, 3 * N))
    req_ts = request_times(t)

    flags = t.column(f"value-flags-{fut.tag}", np.uint8)
    spill = None if flags.path is None else flags.path.parent  # where the source spills its columns
    try:
        state = WindowState(M, N, latest=False)
        positive = 0
        for lag, w in windows(t, fut.horizon_s, req_ts, state):
            fbytes = (t.block_size[lag.block].astype(np.int64) * bpt).astype(np.float64)
            value = window_values(fut.model, fut.gpu, fut.costs, fut.horizon_s, fbytes, w.reuses, w.last_gap,
                                  w.reuse_tokens, w.reuse_q)[-1]
            positive += int(np.count_nonzero(value > 0))
            flags.write(lag.lo, (w.reuses > 0).view(np.uint8) | (w.starts_stay.view(np.uint8) << 1))
            report(lag.lo + lag.block.shape[0])
        flags.close()
        accesses = state.count  # the lead has read every access
        del state
        next_cols = fut.next_columns(req_ts, lambda d: report(N + d))
        shared = shared_root(t.req_start, BlockIds(t))
        cols = _reduce(fut, req_ts, flags, next_cols[1:], shared[0], lambda d: report(2 * N + d))
    finally:
        flags.drop()
    first_req, last_req, hits, cost = cols.pop("first_req"), cols.pop("last_req"), cols.pop("hits"), cols.pop("cost")
    parked = _Parked(None if spill is None else spill.parent, first_req=first_req, last_req=last_req, hits=hits,
                     cost=cost)
    del first_req, last_req, hits, cost
    blocks = {"root_block": cols.pop("root"), "accesses": accesses, "gain_gpu_seconds": cols.pop("gain_s"),
              "total_value_usd": cols.pop("total"), "clairvoyant_value_usd": cols.pop("free")}
    del accesses
    cols["positive_window_value"] = positive
    per_prefix_df, summary = _tables(t, fut, N, blocks, cols, shared)
    ts = t.request_timestamp

    def per_block() -> pl.DataFrame:
        more = parked.load()
        return _block_table(t, bpt, {**blocks, "root_block": blocks["root_block"].astype(np.int64),
                                     "accesses": blocks["accesses"].astype(np.int64),
                                     "first_seen_s": ts[more["first_req"]], "last_seen_s": ts[more["last_req"]],
                                     "horizon_hits": more["hits"].astype(np.int64), "cost_usd": more["cost"]})

    return ValueResult(per_block, per_prefix_df, summary, fut)


def _reduce(fut: FutureReuseChunks, req_ts: np.ndarray, flags: Column, next_cols: tuple[Column, Column],
            root: np.ndarray, progress: Callable[[int], None]) -> dict:
    """The reduce pass (module docstring): per-block sums, schedules and families, and
    the per-access totals, in trace order, from the window flags and the next accesses
    (``next_cols``: gap and prefill GPU-seconds of the next access)."""
    t = fut.source
    c = fut.costs
    M, N = t.n_blocks, t.n_accesses
    tail = fut.horizon_s if math.isfinite(fut.horizon_s) else 0.0
    bpt = int(fut.info["kv_bytes_per_token"])
    dollars = fut.info["gpu_dollars_per_hour"]
    idx, ridx = index_dtype(N), index_dtype(t.n_requests)
    gain_s = np.zeros(M, dtype=np.float64)
    cost = np.zeros(M, dtype=np.float64)
    total = np.zeros(M, dtype=np.float64)
    stored = np.full(M, -np.inf, dtype=np.float64)
    free = np.zeros(M, dtype=np.float64)
    hits = np.zeros(M, dtype=idx)
    first_req = np.full(M, -1, dtype=ridx)
    last_req = np.zeros(M, dtype=ridx)
    family = np.zeros(M, dtype=index_dtype(M))
    parts = [t.column(f"value-{name}-{fut.tag}", np.float64) for name in ("write", "read", "occupancy")]
    no_reuse = 0
    try:
        for ch in t.chunks(size=chunk_accesses(), columns=[flags, *next_cols]):
            block = ch.block
            f, next_gap, next_gain = ch.extra
            keep, starts_stay = (f & 1).view(bool), (f >> 1).view(bool)
            fbytes = (t.block_size[block].astype(np.int64) * bpt).astype(np.float64)
            interval_gain = np.where(keep, next_gain, 0.0)
            interval_value = interval_values(fut.gpu, c, fut.horizon_s, fbytes, keep, next_gap, interval_gain,
                                             starts_stay)
            write_acc, read_acc, occ_acc = cost_parts(c, fbytes, keep, next_gap, starts_stay, tail)
            np.add.at(gain_s, block, interval_gain)
            np.add.at(cost, block, write_acc + read_acc + occ_acc)
            np.add.at(total, block, interval_value)
            best_keep_value_into(block, keep, clairvoyant_interval(dollars, interval_gain, read_acc, occ_acc, keep),
                                 fbytes * c.write_dollars_per_byte, stored, free)
            np.add.at(hits, block, (~starts_stay).astype(hits.dtype))
            new = np.empty(block.shape[0], dtype=np.int64)
            new = new[:block_extent(block, ch.local_req, ch.r, first_req, last_req, new)]
            family[new] = family_roots(first_req[new] - ch.r, ch.lrs, block, root, ids=new)
            for col, x in zip(parts, (write_acc, read_acc, occ_acc)):
                col.write(ch.lo, x)
            no_reuse += int(np.count_nonzero(~keep))
            progress(ch.hi)
        sums = [_column_sum(col) for col in parts]
    finally:
        for col in parts:
            col.drop()
    return {"gain_s": gain_s, "cost": cost, "total": total, "free": free, "hits": hits, "first_req": first_req,
            "last_req": last_req, "root": family, "write_cost_usd": sums[0], "read_cost_usd": sums[1],
            "occupancy_cost_usd": sums[2], "no_reuse": no_reuse}


def _column_sum(col: Column) -> float:
    """``np.sum`` of a whole float64 column (a memory map of its file when it spills)."""
    col.close()
    if col.array is not None:
        return float(col.array.sum())
    if col.n == 0:
        return 0.0
    return float(np.memmap(col.path, dtype=col.dtype, mode="r", shape=(col.n,)).sum())


class _Parked:
    """Per-block arrays of a report that its summary does not read, kept until the
    per-block table is built: in memory for an in-memory source, else on disk (20 bytes
    per block less in memory while the summary runs) in a spill directory of their own
    (:mod:`kvtrace.trace.spill`) in ``parent``, beside the source's, so the table can still be built
    after the source is closed; the directory goes with its builder: once the table is
    built, or with the result (or as stale, after a killed run)."""

    def __init__(self, parent: Path | None, **arrays: np.ndarray) -> None:
        self.dir = None
        self.arrays = arrays
        if parent is None:
            return
        self.dir = spill_mod.make_spill_dir(parent)
        self._remove = weakref.finalize(self, shutil.rmtree, self.dir, True)
        self.dtypes = {}
        try:
            for name, x in arrays.items():
                x.tofile(self.dir / name)
                self.dtypes[name] = x.dtype
        except BaseException:
            self._remove()
            raise
        self.arrays = None

    def load(self) -> dict:
        if self.dir is None:
            return self.arrays
        return {name: np.fromfile(self.dir / name, dtype=dtype) for name, dtype in self.dtypes.items()}


def _block_bytes(trace, bpt: int, lo: int = 0, hi: int | None = None) -> np.ndarray:
    """int64 bytes of blocks ``lo .. hi - 1``: cache size in tokens x KV bytes per token."""
    return trace.block_size[lo:hi].astype(np.int64) * bpt


def _block_table(trace, bpt: int, blocks: dict) -> pl.DataFrame:
    """The per-block table (module docstring) from per-block arrays (``blocks``:
    root_block, first_seen_s, last_seen_s, accesses, horizon_hits (int64),
    gain_gpu_seconds, cost_usd, total_value_usd, clairvoyant_value_usd)."""
    M = trace.n_blocks
    bytes_b = _block_bytes(trace, bpt)
    accesses, total = blocks["accesses"], blocks["total_value_usd"]
    return pl.DataFrame(
        {
            "block": np.arange(M, dtype=np.int64),
            "hash": trace.block_hash.astype(np.uint64),
            "root_block": blocks["root_block"],
            "first_seen_s": blocks["first_seen_s"],
            "last_seen_s": blocks["last_seen_s"],
            "accesses": accesses,
            "reused": accesses > 1,
            "horizon_hits": blocks["horizon_hits"],
            "bytes": bytes_b,
            "gain_gpu_seconds": blocks["gain_gpu_seconds"],
            "cost_usd": blocks["cost_usd"],
            "total_value_usd": total,
            "value_usd_per_byte": total / bytes_b,  # bytes >= 1: a block holds >= 1 token of >= 1 byte
            "clairvoyant_value_usd": blocks["clairvoyant_value_usd"],
        },
        schema_overrides={"first_seen_s": pl.Float64, "last_seen_s": pl.Float64},
    )


def _tables(trace, fr, N: int, blocks: dict, sums: dict, shared: tuple, chunk: int = 1 << 22):
    """The per-prefix table and the summary from per-block arrays (``blocks``:
    root_block and accesses (int32 or int64), gain_gpu_seconds, total_value_usd,
    clairvoyant_value_usd), per-access totals (``sums``) and the shared root
    (``shared``: :func:`shared_root`'s result). Beyond its inputs it holds at most
    about three per-block arrays at a time (the value densities and their order; then
    the bytes and the per-prefix frame's int64 columns)."""
    c = fr.costs
    M = trace.n_blocks
    bpt = int(fr.info["kv_bytes_per_token"])
    accesses, gain_s, total = blocks["accesses"], blocks["gain_gpu_seconds"], blocks["total_value_usd"]
    clair = blocks["clairvoyant_value_usd"]
    dollars_per_gpu_s = fr.info["gpu_dollars_per_hour"] / 3600.0

    # value density (as the per-block table's value_usd_per_byte) and its quantiles over bytes
    density = np.empty(M, dtype=np.float64)
    for lo in range(0, M, chunk):
        density[lo:lo + chunk] = total[lo:lo + chunk] / _block_bytes(trace, bpt, lo, lo + chunk)
    distinct = sum(int(_block_bytes(trace, bpt, lo, lo + chunk).sum()) for lo in range(0, M, chunk))
    quantiles = weighted_quantiles(density, lambda idx: trace.block_size[idx].astype(np.int64) * bpt, distinct,
                                    QUANTILES, chunk)
    del density

    bytes_b = _block_bytes(trace, bpt)
    families = (
        pl.DataFrame({"root_block": blocks["root_block"].astype(np.int64, copy=False), "bytes": bytes_b,
                      "accesses": accesses.astype(np.int64, copy=False), "reused": accesses > 1,
                      "gain_gpu_seconds": gain_s, "total_value_usd": total, "clairvoyant_value_usd": clair})
        .group_by("root_block")
        .agg(
            pl.len().cast(pl.Int64).alias("blocks"),
            pl.col("bytes").sum(),
            pl.col("accesses").sum(),
            pl.col("bytes").filter(~pl.col("reused")).sum().alias("never_reused_bytes"),
            pl.col("gain_gpu_seconds").sum(),
            pl.col("total_value_usd").sum(),
            pl.col("clairvoyant_value_usd").sum(),
        )
        .with_columns((pl.col("total_value_usd") / pl.col("bytes")).alias("value_usd_per_byte"))
    )
    per_prefix_df = (
        families.with_columns(
            pl.Series("root_hash", trace.block_hash[families["root_block"].to_numpy()], dtype=pl.UInt64))
        .select("root_block", "root_hash", "blocks", "bytes", "accesses", "never_reused_bytes", "gain_gpu_seconds",
                "total_value_usd", "value_usd_per_byte", "clairvoyant_value_usd")
        .sort(["total_value_usd", "root_block"], descending=[True, False])
    )

    once = accesses == 1

    def share(x, y):
        return float(x) / float(y) if y else None

    summary = {
        "model": fr.info["model"],
        "kv_bytes_per_token": bpt,
        "gpu": fr.info["gpu"],
        "gpu_dollars_per_hour": fr.info["gpu_dollars_per_hour"],
        "horizon_s": fr.horizon_s if math.isfinite(fr.horizon_s) else None,
        **c.to_dict(),
        "accesses": N,
        "blocks": M,
        "prefixes": per_prefix_df.height,
        "shared_root_blocks": int(shared[0].shape[0]),
        "shared_root_hashes": [int(h) for h in trace.block_hash[shared[0]]],
        "shared_root_request_share": shared[1],
        "distinct_bytes": distinct,
        "never_reused_blocks": int(once.sum()),
        "never_reused_bytes": int(bytes_b[once].sum()),
        "never_reused_bytes_share": share(bytes_b[once].sum(), distinct),
        "never_reused_access_share": share(once.sum(), N),
        "no_reuse_in_horizon_access_share": share(sums["no_reuse"], N),
        "gain_gpu_seconds": float(gain_s.sum()),
        "gain_usd": float(gain_s.sum() * dollars_per_gpu_s),
        "write_cost_usd": sums["write_cost_usd"],
        "read_cost_usd": sums["read_cost_usd"],
        "occupancy_cost_usd": sums["occupancy_cost_usd"],
        "total_value_usd": float(total.sum()),
        "clairvoyant_bound_usd": float(clair.sum()),
        "negative_value_bytes_share": share(bytes_b[total < 0].sum(), distinct),
        "positive_window_value_access_share": share(sums["positive_window_value"], N),
        "value_usd_per_byte_quantiles": quantiles,
    }
    return per_prefix_df, summary
