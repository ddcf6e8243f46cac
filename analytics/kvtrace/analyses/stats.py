"""Trace statistics (``kvtrace stats``): size, arrivals, lengths, reuse, shared prefixes.

:func:`trace_stats` is one fold over the chunks of a trace source
(:mod:`kvtrace.trace.source`): an in-memory :class:`~kvtrace.trace.Trace` and a
:class:`~kvtrace.ingest.stream.StreamedTrace` (``kvtrace stats --stream``) run the same
code, so they give the same figures by construction.

Passes over ``trace.chunks()``, and the state each carries:

1. *visits* (:func:`kvtrace.kernels.reuse.visit_blocks`): per block its access
   ``count``, first and last request and first position; per group label its accesses
   and re-references. Each access's reuse time (seconds since the previous access of
   its block, :data:`_FIRST` at a first access) goes to a per-access column of the
   source (``trace.column``: an array in memory, a spill file streamed).
2. *dominated prefixes*: a block is dominated when a child access has as many accesses
   (this needs the final counts).

   Passes 1 and 2 also mark the distinct blocks of up to 64 group labels each, one bit
   per label and block (1-8 bytes per block); more labels take more passes.
3. *prefix chains* (:func:`kvtrace.ingest.rechain.access_chain_report`).
4. *reuse-time figures*, from the column. The order of every float reduction is fixed
   by the values, not by the chunking: the mean is :func:`block_sum` of the reuse times
   in trace order divided by their count; the percentiles are ``np.percentile``'s
   (method ``linear``) from exact order statistics (:func:`order_statistics`, radix
   selection reading the column, at most five reads) interpolated by ``np.quantile``
   (:func:`linear_percentile`).
5. *top prefixes*: ranked a chunk of blocks at a time (no per-block temporary).

Memory beside the source, per distinct block M and request R (bytes): 18 x M for the
passes (count, first and last request, first position: int32 below 2**31 accesses and
requests; the dominated flag; 1-8 bytes of group bits) + 4 x R per group column (label
codes) + one chunk of accesses (``CHUNK_ACCESSES``) + one run of :func:`block_sum`
(8 x :data:`SUM_BLOCK`), and the reuse-time column, 8 bytes per access (in memory, or
on disk streamed). A streamed source itself holds 20 x M + 20 x R and the kept request
columns (8 bytes each for the token counts and the session, 4 for ``type`` and
``tenant``, kept Categorical).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
import polars as pl

from kvtrace.config import plain_numpy_pages
from kvtrace.ingest.rechain import access_chain_report
from kvtrace.kernels.reuse import visit_blocks
from kvtrace.model import ModelSpec, resolve_model
from kvtrace.trace import index_dtype
from kvtrace.trace import source as source_mod

PERCENTILES = (50, 90, 99, 99.9)
#: Request columns the figures read besides the timestamp: what a streamed trace must
#: keep (``open_stream(path, columns=STREAM_COLUMNS)``).
STREAM_COLUMNS = ("input_tokens", "output_tokens", "session_id", "type", "tenant")
GROUP_COLUMNS = ("type", "tenant")
#: Values per run of :func:`block_sum` (a fixed order of additions, whatever the chunks).
SUM_BLOCK = 1 << 22
_BITS_PER_PASS = 64
#: The reuse-time column's value at a first access. Reuse times are >= 0 (trace order is
#: timestamp order), or NaN from a NaN timestamp, which is kept as ``np.percentile`` keeps it.
_FIRST = -1.0


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


@plain_numpy_pages
def trace_stats(trace, model: ModelSpec | str | None = None, top: int = 10,
                progress: Callable[[int, int], None] | None = None) -> TraceStats:
    """Summary statistics of a trace.

    Parameters
    ----------
    trace : TraceSource
        A :class:`~kvtrace.trace.Trace`, or a streamed trace that keeps
        :data:`STREAM_COLUMNS` (the same figures, see the module docstring).
    model : ModelSpec or str, optional
        Sets KV bytes per token for the byte figures (default Llama-3.1-70B).
    top : int
        How many shared prefixes to list.
    progress : callable, optional
        ``progress(done, total)`` in accesses read by the passes over the blocks (1 and 2 of
        the module docstring, and one per further 64 group labels).
    """
    model = model if isinstance(model, ModelSpec) else resolve_model(model)
    bpt = int(model.kv_bytes_per_token)
    req = trace.requests
    missing = [c for c in STREAM_COLUMNS if c not in req.columns]
    if missing:
        raise ValueError(f"open the stream with columns=kvtrace.analyses.stats.STREAM_COLUMNS (missing {missing})")
    ts = trace.request_timestamp
    duration = trace.duration
    n_req, n_acc, n_blk = trace.n_requests, trace.n_accesses, trace.n_blocks
    cols = [c for c in GROUP_COLUMNS if c in req.columns and req[c].null_count() < n_req]
    fig = _access_figures(trace, cols, progress)
    chain = access_chain_report(((ch.block, ch.lrs) for ch in trace.chunks()), n_blk)
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


# ------------------------------------------------------------ the access passes
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


class _GroupBits:
    """The distinct blocks of up to 64 group labels (``batch``: (column, label code)
    pairs), one bit per label in a per-block word carried across the chunks of a pass."""

    def __init__(self, labels: dict, batch: list, n_blocks: int) -> None:
        self.batch = batch
        self.dtype = np.dtype(f"uint{max(8, 1 << math.ceil(math.log2(max(len(batch), 1))))}")
        self.bit = {c: np.zeros(len(names), dtype=self.dtype) for c, (names, _) in labels.items()}
        for k, (c, j) in enumerate(batch):
            self.bit[c][j] = self.dtype.type(1) << self.dtype.type(k)
        self.seen = np.zeros(n_blocks if batch else 0, dtype=self.dtype)

    def add(self, block: np.ndarray, codes: dict) -> None:
        """Mark the blocks of one chunk; ``codes``: column -> label code of each access."""
        if not self.batch:
            return
        for c, g in codes.items():
            v = self.bit[c][g]
            has = v != 0
            np.bitwise_or.at(self.seen, block[has], v[has])

    def count_into(self, distinct: dict, size: int) -> None:
        """Set ``distinct[column][code]`` of the batch's labels (``size`` blocks at a time)."""
        for k, (c, j) in enumerate(self.batch):
            b = self.dtype.type(1) << self.dtype.type(k)
            distinct[c][j] = sum(int(np.count_nonzero(self.seen[s:s + size] & b))
                                 for s in range(0, self.seen.shape[0], size))


def _access_figures(trace, cols: list[str], progress) -> _AccessFigures:
    """Passes 1, 2 and 4 of the module docstring."""
    size = int(source_mod.CHUNK_ACCESSES)  # read at call time (tests shrink it)
    M, n = trace.n_blocks, trace.n_accesses
    ridx = index_dtype(trace.n_requests)
    # carried across the chunks of pass 1: each block's visits
    count = np.zeros(M, dtype=index_dtype(n))
    first_request = np.full(M, -1, dtype=ridx)
    first_pos = np.zeros(M, dtype=np.int32)
    last_request = np.full(M, -1, dtype=ridx)
    ts = trace.request_timestamp
    labels = {c: _label_codes(trace.requests[c]) for c in cols}
    accesses = {c: np.zeros(len(names), dtype=np.int64) for c, (names, _) in labels.items()}
    rerefs = {c: np.zeros(len(names), dtype=np.int64) for c, (names, _) in labels.items()}
    distinct = {c: np.zeros(len(names), dtype=np.int64) for c, (names, _) in labels.items()}
    flat = [(c, j) for c in cols for j in range(len(labels[c][0]))]
    batches = [flat[i:i + _BITS_PER_PASS] for i in range(0, len(flat), _BITS_PER_PASS)]
    n_passes = max(2, len(batches))
    total, done = n * n_passes, 0
    dominated = np.zeros(M, dtype=bool)
    rereferenced = accessed_tokens = 0
    reuse = trace.column("stats-reuse-times", np.float64)
    try:
        for i in range(n_passes):
            bits = _GroupBits(labels, batches[i] if i < len(batches) else [], M)
            for ch in trace.chunks():
                request = (ch.local_req + ch.r).astype(ridx, copy=False)
                codes = {c: code[request] for c, (_, code) in labels.items()} if i == 0 or bits.batch else {}
                if i == 0:
                    prev = np.empty(ch.block.shape[0], dtype=ridx)
                    visit_blocks(ch.block, request, ch.pos, count, first_request, first_pos, last_request, prev)
                    re = prev >= 0
                    rereferenced += int(np.count_nonzero(re))
                    accessed_tokens += int(ch.tokens.sum(dtype=np.int64))
                    reuse.write(ch.lo, np.where(re, ts[request] - ts[prev], _FIRST))
                    for c, g in codes.items():
                        accesses[c] += np.bincount(g, minlength=len(accesses[c]))
                        rerefs[c] += np.bincount(g[re], minlength=len(rerefs[c]))
                if i == 1:
                    child = np.flatnonzero(ch.pos > 0)  # a chunk holds whole requests: the parent is in it
                    parent = ch.block[child - 1]
                    dominated[parent[count[ch.block[child]] == count[parent]]] = True
                bits.add(ch.block, codes)
                done += ch.hi - ch.lo
                if progress is not None:
                    progress(done, total)
            bits.count_into(distinct, size)
            del bits
        reuse.close()
        reuse_row = _reuse_row(trace, reuse, rereferenced, size)
    finally:
        reuse.drop()  # 8 bytes per access: free them now

    names_of = {c: names for c, (names, _) in labels.items()}
    del labels  # the per-request codes
    groups = {}
    idx = pl.select(pl.len()).dtypes[0]  # Polars' count type, as a group_by gives
    for c in cols:
        names, has = names_of[c], accesses[c] > 0
        groups[c] = pl.DataFrame({
            "g": names.filter(pl.Series(has)),
            "block_accesses": accesses[c][has],
            "rereference_share": rerefs[c][has] / accesses[c][has],  # a boolean mean: count / n
            "distinct_blocks": distinct[c][has],
        }).cast({"block_accesses": idx, "distinct_blocks": idx})
    first_pos += 1  # the depth, in place (one per-block array less)
    return _AccessFigures(
        accessed_tokens=accessed_tokens, rereferenced=rereferenced, reuse_row=reuse_row,
        count=count, depth=first_pos, dominated=dominated,
        first_request=first_request, last_request=last_request, groups=groups,
    )


# ---------------------------------------------------------- reuse-time figures
def _reuse_row(trace, column, n: int, chunk: int) -> dict:
    """:func:`_percentile_row` of the ``n`` reuse times in ``column`` (first accesses
    left out), each read back through ``trace.chunks``."""

    def values() -> Iterator[np.ndarray]:
        for ch in trace.chunks(blocks=False, layout=False, columns=[column]):
            v = ch.extra[0]
            yield v[v != _FIRST]

    row = {"quantity": "reuse_time_s", "count": n, "mean": block_sum(values()) / n if n else None}
    value = order_statistics(values, n, percentile_ranks(n, PERCENTILES), chunk) if n else {}
    for p in PERCENTILES:
        row[f"p{p:g}"] = linear_percentile(n, p, value) if n else None
    return row


def block_sum(chunks: Iterable[np.ndarray]) -> float:
    """The sum of float64 values given in consecutive pieces, in one order whatever the
    pieces: ``np.sum`` of each run of :data:`SUM_BLOCK` consecutive values (the last run
    shorter), then ``np.sum`` of the runs' sums. Up to ``SUM_BLOCK`` values it is
    ``np.sum`` of all of them at once, as ``np.mean`` adds them. Carries one run."""
    run = np.empty(SUM_BLOCK, dtype=np.float64)
    sums, held = [], 0
    for x in chunks:
        while x.shape[0]:
            take = min(SUM_BLOCK - held, x.shape[0])
            run[held:held + take] = x[:take]
            held, x = held + take, x[take:]
            if held == SUM_BLOCK:
                sums.append(np.sum(run))
                held = 0
    if held:
        sums.append(np.sum(run[:held]))
    return float(np.sum(np.array(sums, dtype=np.float64)))


def percentile_ranks(n: int, percentiles: Iterable[float]) -> list[int]:
    """The 0-based ranks (ascending) whose values :func:`linear_percentile` needs for
    these percentiles of ``n`` values."""
    ranks = set()
    for p in percentiles:
        vi = (n - 1) * (p / 100)
        if vi >= n - 1:
            ranks.add(n - 1)
        else:
            k = math.floor(vi)
            ranks.update((k, k + 1))
    return sorted(ranks)


def linear_percentile(n: int, p: float, value: dict) -> float:
    """``np.percentile(x, p)`` of ``n`` values from their order statistics ``value``
    (``rank -> k-th smallest``, the ranks of :func:`percentile_ranks`).

    numpy's method ``linear`` takes the virtual index ``(n - 1) * (p / 100)``: at or past
    the last index, the largest value; otherwise it interpolates the two values around
    it by the fractional part ``g``, which is ``np.quantile([a, b], g)`` (virtual index
    ``1 * g``), numpy's own interpolation.
    """
    vi = (n - 1) * (p / 100)
    if vi >= n - 1:
        return float(value[n - 1])
    k = math.floor(vi)
    return float(np.quantile(np.array([value[k], value[k + 1]], dtype=np.float64), vi - k))


_DIGIT_BITS = 16
_SIGN = np.uint64(1 << 63)


def _keys(x: np.ndarray) -> np.ndarray:
    """uint64 keys in the order of the float64 values (-0.0 folded into +0.0)."""
    bits = (x + 0.0).view(np.uint64)  # -0.0 + 0.0 is +0.0 (and a copy, changed in place)
    flip = bits >> np.uint64(63)
    np.negative(flip, out=flip)  # all ones below a negative value, else none
    flip |= _SIGN
    bits ^= flip  # negative: every bit flipped; else the sign bit set
    return bits


def _value(key: int) -> float:
    k = np.uint64(key)
    bits = k & ~_SIGN if k & _SIGN else ~k
    return float(np.array(bits, dtype=np.uint64).view(np.float64))


def order_statistics(read: Callable[[], Iterable[np.ndarray]], n: int, ranks: Sequence[int], chunk: int,
                     limit: int | None = None) -> dict:
    """The k-th smallest of ``n`` float64 values, for each k in ``ranks``, exactly, with
    the values read in pieces (out of core).

    Radix selection on the values' order-preserving 64-bit keys: each read counts, for
    every rank still open, the next 16 bits of the keys that share the rank's prefix
    (65,536 counters); the bucket that holds the rank becomes the new prefix. Once the
    values under a prefix number at most ``limit`` they are gathered in one more read
    and ``np.partition`` picks the rank; when all 64 bits are fixed the value is known.
    At most five reads; memory O(65,536 x ranks + limit). Values compare as numbers:
    -0.0 and +0.0 are one key (as ``np.partition`` sees them); a NaN anywhere makes
    every value NaN (as ``np.percentile``).

    Parameters
    ----------
    read : callable
        ``read()`` yields the ``n`` values in pieces (float64 arrays), the same each time.
    n : int
        How many values ``read`` gives.
    ranks : sequence of int
        0-based ranks in [0, n).
    chunk : int
        About how many values a piece holds (sets the default ``limit``).
    limit : int, optional
        Most values gathered in memory for one rank's final selection (default
        ``chunk // len(ranks)``, so all gathered values together are about one chunk).

    Returns
    -------
    dict
        ``rank -> value`` (float).
    """
    ranks = sorted(set(int(k) for k in ranks))
    if not ranks:
        return {}
    if ranks[0] < 0 or ranks[-1] >= n:
        raise ValueError(f"ranks must be in [0, {n}), got {ranks}")
    limit = max(1, chunk // len(ranks)) if limit is None else max(1, int(limit))
    # per rank: [prefix, free bits below it, values with a smaller key, values under the prefix]
    state = {k: [0, 64, 0, n] for k in ranks}
    out: dict = {}
    first = True
    while len(out) < len(ranks):
        todo: dict = {}
        for k, (prefix, free, _, _) in state.items():
            if k in out:
                continue
            if free == 0:  # every bit fixed: the value itself
                out[k] = _value(prefix)
            else:
                todo.setdefault((prefix, free), []).append(k)
        if not todo:
            break
        gather = {g for g, ks in todo.items() if state[ks[0]][3] <= limit}
        hist = {g: np.zeros(1 << _DIGIT_BITS, dtype=np.int64) for g in todo if g not in gather}
        parts: dict = {g: [] for g in gather}
        got = 0
        for x in read():
            got += x.shape[0]
            if first and np.isnan(x).any():
                return {k: math.nan for k in ranks}
            key = _keys(x)
            for g in todo:
                prefix, free = g
                sel = key if free == 64 else key[(key >> np.uint64(free)) == np.uint64(prefix)]
                if g in gather:
                    parts[g].append(sel)
                else:
                    digit = (sel >> np.uint64(free - _DIGIT_BITS)) & np.uint64((1 << _DIGIT_BITS) - 1)
                    hist[g] += np.bincount(digit.astype(np.intp), minlength=1 << _DIGIT_BITS)
        if got != n:
            raise ValueError(f"read {got:,} values, expected {n:,}")
        first = False
        for g, ks in todo.items():
            if g in gather:
                keys = np.concatenate(parts.pop(g)) if parts[g] else np.empty(0, np.uint64)
                keys.partition(sorted(k - state[k][2] for k in ks))
                for k in ks:
                    out[k] = _value(int(keys[k - state[k][2]]))
                continue
            cum = np.cumsum(hist[g])
            for k in ks:
                prefix, free, below, _ = state[k]
                j = int(np.searchsorted(cum, k - below, side="right"))
                state[k] = [(prefix << _DIGIT_BITS) | j, free - _DIGIT_BITS,
                            below + (int(cum[j - 1]) if j else 0), int(hist[g][j])]
    return {k: out[k] for k in ranks}


# ---------------------------------------------------------------- presentation
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
