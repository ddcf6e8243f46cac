"""Trace statistics (``kvtrace stats``): size, arrivals, lengths, reuse, shared prefixes.

:func:`trace_stats` takes an in-memory :class:`~kvtrace.trace.Trace` or a
:class:`~kvtrace.ingest.stream.StreamedTrace` (a Parquet trace scanned in chunks,
``kvtrace stats --stream``) and gives the same figures for both, **bit for bit**
(``tests/test_stats_stream.py``). A streamed trace is read in chunks of whole requests
from its spill file, with memory O(distinct blocks + requests + one chunk):

1. *visits*: each access's previous request of the same block, with per-block state
   carried across chunks (:func:`kvtrace.kernels.reuse.visit_blocks`: counts, first
   and last request, first position); the reuse times go to a spill file (8 bytes per
   re-reference) and the per-group counts are added up.
2. *prefixes and groups*: a block is dominated when a child has as many accesses (this
   needs the final counts), and each group's distinct blocks are one bit per block and
   group (up to 64 groups per pass; 1-8 bytes per block).
3. *reuse-time figures* from the spill file: exact order statistics out of core
   (:mod:`kvtrace.analyses.quantiles`: radix selection, at most five reads) turned into
   ``np.percentile``'s interpolation, and the mean as numpy's own pairwise sum fed in
   chunks (:class:`kvtrace.kernels.sums.PairwiseSum`) divided as ``np.mean`` divides,
   so it is the in-memory mean to the bit.
4. *top prefixes*: ranked a chunk of blocks at a time (no per-block temporary).

Memory, per distinct block M and request R (bytes): 18 x M for the passes (count,
first and last request, first position: int32 below 2**31 accesses and requests;
the dominated flag; 1-8 bytes of group bits) + 4 x R per group column (label codes) +
one chunk of accesses (``CHUNK_ACCESSES``, about 300 MB with temporaries), on top of
the streamed trace (20 x M + 20 x R, and the kept request columns: 8 bytes each for
the token counts and the session, 4 for ``type`` and ``tenant``, kept Categorical).
The scan itself is the peak: measured on 300M accesses, 51.9M blocks, 19.4M
requests, 5.14 GB in the scan and 4.39 GB after it (106-117 s end to end).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import polars as pl

from kvtrace.trace import source as source_mod
from kvtrace.ingest.rechain import access_chain_report
from kvtrace.kernels.reuse import previous_access, visit_blocks
from kvtrace.kernels.sums import PairwiseSum
from kvtrace.model import ModelSpec, resolve_model
from kvtrace.analyses.quantiles import linear_percentile, order_statistics, percentile_ranks
from kvtrace.trace import Trace, index_dtype

PERCENTILES = (50, 90, 99, 99.9)
#: Request columns the figures read besides the timestamp: what a streamed trace must
#: keep (``open_stream(path, columns=STREAM_COLUMNS)``).
STREAM_COLUMNS = ("input_tokens", "output_tokens", "session_id", "type", "tenant")
GROUP_COLUMNS = ("type", "tenant")
_BITS_PER_PASS = 64


@dataclass
class TraceStats:
    """Output of :func:`trace_stats`.

    Attributes
    ----------
    summary : dict
        Scalar figures (units in the key names).
    lengths : polars.DataFrame
        ``quantity`` (input_tokens, output_tokens, reuse_time_s), ``mean`` and
        ``p50``..``p99.9`` columns.
    top_prefixes : polars.DataFrame
        The 10 shared prefixes with the most bytes x reuses.
    groups : dict[str, polars.DataFrame]
        Per ``type`` / ``tenant`` rows, when the trace has them.
    """

    summary: dict
    lengths: pl.DataFrame
    top_prefixes: pl.DataFrame
    groups: dict

    def to_dict(self) -> dict:
        return {
            "summary": self.summary,
            "lengths": self.lengths.to_dicts(),
            "top_prefixes": self.top_prefixes.to_dicts(),
            "groups": {k: v.to_dicts() for k, v in self.groups.items()},
        }


@dataclass
class _AccessFigures:
    """What the figures need from the accesses: O(distinct blocks + groups).

    ``count``, ``depth`` (position of the first access + 1), ``dominated``,
    ``first_request`` and ``last_request`` are per dense block id; ``groups`` holds,
    per group column, ``g``, ``block_accesses``, ``rereference_share`` and
    ``distinct_blocks`` of the labels that have accesses.
    """

    accessed_tokens: int
    rereferenced: int
    reuse_row: dict
    count: np.ndarray
    depth: np.ndarray
    dominated: np.ndarray
    first_request: np.ndarray
    last_request: np.ndarray
    groups: dict


def _percentile_row(name: str, x: np.ndarray) -> dict:
    row = {"quantity": name, "count": int(x.size), "mean": float(x.mean()) if x.size else None}
    for p in PERCENTILES:
        row[f"p{p:g}"] = float(np.percentile(x, p)) if x.size else None
    return row


def _block_chunks(trace):
    """(dense block ids, request offsets) of a trace: once in memory, by chunk streamed."""
    if isinstance(trace, Trace):
        yield trace.accesses.block, trace.accesses.req_start
        return
    for ch in trace.access_chunks():
        yield ch.block, ch.lrs


def trace_stats(trace, model: ModelSpec | str | None = None, top: int = 10,
                progress: Callable[[int, int], None] | None = None) -> TraceStats:
    """Summary statistics of a trace.

    Parameters
    ----------
    trace : Trace or StreamedTrace
        A streamed trace must keep :data:`STREAM_COLUMNS`; its figures equal the
        in-memory ones bit for bit (see the module docstring).
    model : ModelSpec or str, optional
        Sets KV bytes per token for the byte figures (default Llama-3.1-70B).
    top : int
        How many shared prefixes to list.
    progress : callable, optional
        ``progress(done, total)`` in accesses read (a streamed trace only).
    """
    model = model if isinstance(model, ModelSpec) else resolve_model(model)
    bpt = int(model.kv_bytes_per_token)
    req = trace.requests
    ts = trace.request_timestamp
    duration = trace.duration
    n_req, n_acc, n_blk = trace.n_requests, trace.n_accesses, trace.n_blocks
    cols = [c for c in GROUP_COLUMNS if c in req.columns and req[c].null_count() < n_req]
    if isinstance(trace, Trace):
        fig = _in_memory_figures(trace, cols)
    else:
        missing = [c for c in STREAM_COLUMNS if c not in req.columns]
        if missing:
            raise ValueError(f"open the stream with columns=kvtrace.analyses.stats.STREAM_COLUMNS (missing {missing})")
        fig = _streamed_figures(trace, cols, progress)

    chain = access_chain_report(_block_chunks(trace), n_blk)
    minute = np.floor(ts / 60.0).astype(np.int64) if n_req else np.zeros(0, np.int64)
    per_minute = np.bincount(minute - minute.min()) if n_req else np.zeros(1, np.int64)
    summary = {
        "source": trace.meta.source,
        "source_format": trace.meta.source_format,
        "block_tokens": trace.meta.block_tokens,
        "model": model.name,
        "kv_bytes_per_token": bpt,
        "requests": n_req,
        "duration_s": duration,
        "arrival_rate_per_s": n_req / duration if duration > 0 else None,
        "peak_arrivals_per_minute": int(per_minute.max()) if per_minute.size else 0,
        "mean_arrivals_per_minute": float(per_minute.mean()) if per_minute.size else 0.0,
        "block_accesses": n_acc,
        "distinct_blocks": n_blk,
        "input_tokens": int(req["input_tokens"].sum()),
        "output_tokens": int(req["output_tokens"].sum()),
        "accessed_kv_bytes": fig.accessed_tokens * bpt,
        "distinct_kv_bytes": int(trace.block_size.sum()) * bpt,
        # the mean of the per-access booleans: count / n, exactly
        "rereference_share": fig.rereferenced / n_acc if n_acc else 0.0,
        "sessions": int(req["session_id"].drop_nulls().n_unique()) if req["session_id"].null_count() < n_req else None,
        # blocks seen after more than one parent block: none when the ids are prefix-chained
        "multi_parent_block_share": chain.share,
        "chained": chain.chained,
        "warnings": list(trace.warnings),
    }
    lengths = pl.DataFrame(
        [
            _percentile_row("input_tokens", req["input_tokens"].to_numpy()),
            _percentile_row("output_tokens", req["output_tokens"].to_numpy()),
            fig.reuse_row,
        ]
    )
    groups = {col: _group_rows(trace, col, fig.groups[col]) for col in cols}
    return TraceStats(summary, lengths, _top_prefixes(trace, fig, bpt, top), groups)


def should_stream(path: str | os.PathLike, fmt: str = "auto", stream: bool | None = None) -> bool:
    """Whether ``kvtrace stats`` streams this trace: :func:`kvtrace.ingest.stream.should_stream`
    costing the in-memory run with the stats' own peak per block access
    (:data:`kvtrace.ingest.guard.PROFILES`)."""
    from kvtrace.ingest.stream import should_stream as stream_should_stream

    return stream_should_stream(path, fmt, stream, workload="stats")


# ----------------------------------------------------------------- in memory
def _in_memory_figures(trace: Trace, cols: list[str]) -> _AccessFigures:
    a = trace.accesses
    M = trace.n_blocks
    prev = previous_access(a.block, M)
    rereferenced = prev >= 0
    acc_ts = trace.request_timestamp[a.request]
    reuse_time = acc_ts[rereferenced] - acc_ts[prev[rereferenced]]

    count = np.bincount(a.block, minlength=M)
    first_t = np.full(M, -1, dtype=np.int64)
    first_t[a.block[::-1]] = np.arange(a.block.shape[0] - 1, -1, -1)
    last_t = np.zeros(M, dtype=np.int64)
    last_t[a.block] = np.arange(a.block.shape[0])
    depth = a.pos[first_t].astype(np.int64) + 1 if M else np.zeros(0, np.int64)
    dominated = np.zeros(M, dtype=bool)
    child = np.flatnonzero(a.pos > 0)
    parent = a.block[child - 1]
    same = count[a.block[child]] == count[parent]
    dominated[parent[same]] = True

    groups = {}
    for col in cols:
        label = trace.requests[col].fill_null("(none)")
        acc = pl.DataFrame({"g": label.to_numpy()[a.request], "reref": rereferenced, "block": a.block})
        groups[col] = acc.group_by("g").agg(
            pl.len().alias("block_accesses"),
            pl.col("reref").mean().alias("rereference_share"),
            pl.col("block").n_unique().alias("distinct_blocks"),
        )
    return _AccessFigures(
        accessed_tokens=int(a.tokens.astype(np.int64).sum()),
        rereferenced=int(np.count_nonzero(rereferenced)),
        reuse_row=_percentile_row("reuse_time_s", reuse_time),
        count=count, depth=depth, dominated=dominated,
        first_request=a.request[first_t], last_request=a.request[last_t], groups=groups,
    )


# ------------------------------------------------------------------ streamed
def _label_codes(column: pl.Series) -> tuple[pl.Series, np.ndarray]:
    """(sorted distinct labels, int32 code per request) of a group column: String, or
    Categorical as a streamed trace keeps it (then through a table of the few
    categories, without a string per request)."""
    label = column.fill_null("(none)")
    if label.dtype != pl.Categorical:
        names = label.unique().sort()
        return names, names.search_sorted(label).to_numpy().astype(np.int32)
    cats = label.unique()
    names = cats.cast(pl.String).sort()
    physical = cats.to_physical().to_numpy().astype(np.int64)
    table = np.zeros(int(physical.max()) + 1 if physical.size else 0, dtype=np.int32)
    table[physical] = names.search_sorted(cats.cast(pl.String)).to_numpy()
    return names, table[label.to_physical().to_numpy()]


def _read_chunks(trace, size: int):
    """(block ids int64, request int32/int64, pos int32, tokens int32) of chunks of whole
    requests of a streamed trace, read back from its spill file in trace order."""
    ridx = index_dtype(trace.n_requests)
    for ch in trace.access_chunks(size=size):
        yield ch.block, (ch.local_req + ch.r).astype(ridx), ch.pos, ch.tokens


def _streamed_figures(trace, cols: list[str], progress) -> _AccessFigures:
    from kvtrace.ingest import stream

    size = int(source_mod.CHUNK_ACCESSES)  # read at call time (tests shrink it)
    M, n = trace.n_blocks, trace.n_accesses
    ridx = index_dtype(trace.n_requests)
    count = np.zeros(M, dtype=index_dtype(n))
    first_request = np.full(M, -1, dtype=ridx)
    first_pos = np.zeros(M, dtype=np.int32)
    last_request = np.full(M, -1, dtype=ridx)
    ts = trace.request_timestamp
    labels = {c: _label_codes(trace.requests[c]) for c in cols}
    accesses = {c: np.zeros(len(labels[c][0]), dtype=np.int64) for c in cols}
    rerefs = {c: np.zeros(len(labels[c][0]), dtype=np.int64) for c in cols}
    # one bit per (group label, block) per pass over the blocks
    flat = [(c, j) for c in cols for j in range(len(labels[c][0]))]
    batches = [flat[i:i + _BITS_PER_PASS] for i in range(0, len(flat), _BITS_PER_PASS)] or [[]]
    total, done = n * (1 + len(batches)), 0

    # pass 1: visits, reuse times (spilled), per-group counts
    rereferenced = accessed_tokens = 0
    reuse_path = trace.spill / "stats-reuse-times"
    with open(reuse_path, "wb") as out:
        for block, request, pos, tokens in _read_chunks(trace, size):
            prev = np.empty(block.shape[0], dtype=ridx)
            visit_blocks(block, request, pos, count, first_request, first_pos, last_request, prev)
            re = prev >= 0
            rereferenced += int(np.count_nonzero(re))
            accessed_tokens += int(tokens.sum(dtype=np.int64))
            (ts[request[re]] - ts[prev[re]]).tofile(out)
            for c, (names, code) in labels.items():
                g = code[request]
                accesses[c] += np.bincount(g, minlength=len(names))
                rerefs[c] += np.bincount(g[re], minlength=len(names))
            done += block.shape[0]
            if progress is not None:
                progress(done, total)

    # passes 2..: dominated prefixes (first pass only) and distinct blocks per group
    dominated = np.zeros(M, dtype=bool)
    distinct = {c: np.zeros(len(labels[c][0]), dtype=np.int64) for c in cols}
    for i, batch in enumerate(batches):
        dtype = np.dtype(f"uint{max(8, 1 << math.ceil(math.log2(max(len(batch), 1))))}")
        bit = {c: np.zeros(len(labels[c][0]), dtype=dtype) for c in cols}
        for k, (c, j) in enumerate(batch):
            bit[c][j] = dtype.type(1) << dtype.type(k)
        seen = np.zeros(M if batch else 0, dtype=dtype)
        for block, request, pos, _ in _read_chunks(trace, size):
            if i == 0:
                child = np.flatnonzero(pos > 0)  # a chunk holds whole requests: the parent is in it
                parent = block[child - 1]
                same = count[block[child]] == count[parent]
                dominated[parent[same]] = True
            for c, (_, code) in labels.items():
                v = bit[c][code[request]]
                has = v != 0
                np.bitwise_or.at(seen, block[has], v[has])
            done += block.shape[0]
            if progress is not None:
                progress(done, total)
        for k, (c, j) in enumerate(batch):
            b = dtype.type(1) << dtype.type(k)
            distinct[c][j] = sum(int(np.count_nonzero(seen[s:s + size] & b)) for s in range(0, M, size))
        del seen

    names_of = {c: names for c, (names, _) in labels.items()}
    del labels  # the per-request codes
    groups = {}
    idx = pl.select(pl.len()).dtypes[0]  # Polars' count type, as the in-memory group_by gives
    for c in cols:
        names, has = names_of[c], accesses[c] > 0
        groups[c] = pl.DataFrame({
            "g": names.filter(pl.Series(has)),
            "block_accesses": accesses[c][has],
            "rereference_share": rerefs[c][has] / accesses[c][has],  # a boolean mean: count / n
            "distinct_blocks": distinct[c][has],
        }).cast({"block_accesses": idx, "distinct_blocks": idx})
    try:
        reuse_row = _spilled_percentile_row("reuse_time_s", reuse_path, rereferenced, size)
    finally:
        reuse_path.unlink(missing_ok=True)  # 8 bytes per re-reference: free the disk now
    first_pos += 1  # the depth, in place (one per-block array less)
    return _AccessFigures(
        accessed_tokens=accessed_tokens, rereferenced=rereferenced, reuse_row=reuse_row,
        count=count, depth=first_pos, dominated=dominated,
        first_request=first_request, last_request=last_request, groups=groups,
    )


def _spilled_percentile_row(name: str, path, n: int, chunk: int) -> dict:
    """:func:`_percentile_row` of the ``n`` float64 values in a spill file, exactly."""
    row = {"quantity": name, "count": n, "mean": _spilled_mean(path, n, chunk) if n else None}
    value = order_statistics(path, n, percentile_ranks(n, PERCENTILES), chunk) if n else {}
    for p in PERCENTILES:
        row[f"p{p:g}"] = linear_percentile(n, p, value) if n else None
    return row


def _spilled_mean(path, n: int, chunk: int) -> float:
    """numpy's mean of the ``n`` float64 values in a file, read in chunks: numpy's
    pairwise sum (:class:`kvtrace.kernels.sums.PairwiseSum`, the same additions in the
    same order) divided by ``n``, as ``np.mean`` divides. A memory-mapped read would
    count every page of the file (8 bytes per re-reference) in the resident set."""
    total = PairwiseSum(n)
    with open(path, "rb") as fh:
        for lo in range(0, n, chunk):
            total.add(np.fromfile(fh, dtype=np.float64, count=min(chunk, n - lo)))
    return float(np.float64(total.value) / n)


# -------------------------------------------------------------------- shared
def _top_prefixes(trace, fig: _AccessFigures, bpt: int, top: int, chunk: int = 1 << 22) -> pl.DataFrame:
    """Shared prefixes ranked by prefix bytes x reuses.

    A block id names a whole prefix (hashes are chained). A prefix whose every use
    continues into the same longer prefix (a child block with as many accesses) is
    left out in favour of the longer one. Ties: lower block id first. The blocks are
    ranked ``chunk`` at a time (each chunk's ``top`` hold the whole trace's), so no
    per-block temporary is made.
    """

    def figures(idx):  # prefix tokens, reuses and score (bytes x reuses) of some blocks
        prefix_tokens = (fig.depth[idx].astype(np.int64) - 1) * trace.meta.block_tokens + trace.block_size[idx]
        reuses = fig.count[idx].astype(np.int64) - 1
        return prefix_tokens, reuses, prefix_tokens.astype(np.float64) * bpt * reuses

    best = []
    for lo in range(0, fig.count.shape[0], chunk):
        _, reuses, score = figures(slice(lo, lo + chunk))
        cand = np.flatnonzero((reuses > 0) & ~fig.dominated[lo:lo + chunk])
        best.append(lo + cand[np.lexsort((cand, -score[cand]))][:top])
    cand = np.concatenate(best) if best else np.zeros(0, np.int64)
    order = cand[np.lexsort((cand, -figures(cand)[2]))][:top]
    prefix_tokens, reuses, score = figures(order)
    ts = trace.request_timestamp
    return pl.DataFrame(
        {
            "block": order,
            "hash": trace.block_hash[order],
            "depth_blocks": fig.depth[order],
            "prefix_tokens": prefix_tokens,
            "prefix_bytes": prefix_tokens * bpt,
            "accesses": fig.count[order],
            "reuses": reuses,
            "first_seen_s": ts[fig.first_request[order]] if order.size else np.zeros(0),
            "last_seen_s": ts[fig.last_request[order]] if order.size else np.zeros(0),
            "bytes_x_reuses": score,
        },
        schema_overrides={"block": pl.Int64, "hash": pl.UInt64, "depth_blocks": pl.Int64,
                          "prefix_tokens": pl.Int64, "prefix_bytes": pl.Int64, "accesses": pl.Int64,
                          "reuses": pl.Int64},
    )


def _group_rows(trace, col: str, per_acc: pl.DataFrame) -> pl.DataFrame:
    label = trace.requests[col].fill_null("(none)")
    per_req = trace.requests.with_columns(label.alias("g")).group_by("g").agg(
        pl.len().alias("requests"),
        pl.col("input_tokens").mean().alias("mean_input_tokens"),
        pl.col("output_tokens").mean().alias("mean_output_tokens"),
    ).with_columns(pl.col("g").cast(pl.String))  # a streamed trace's labels are Categorical
    return (
        per_req.join(per_acc, on="g", how="left")
        .rename({"g": col})
        .with_columns(pl.col("block_accesses", "distinct_blocks").fill_null(0),
                      pl.col("rereference_share").fill_null(0.0))
        .sort(["requests", col], descending=[True, False])  # ties: by name, not hash order
    )
