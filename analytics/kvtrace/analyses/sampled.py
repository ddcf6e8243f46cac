"""The sampled curve (``--sample-rate``): one chunked pass, in memory or streamed.

:func:`sampled_pass` feeds the trace to the SHARDS kernel (:class:`kvtrace.kernels.shards.Sampler`)
in chunks of whole requests and bins each chunk's evaluated accesses at once, with
their Horvitz-Thompson weights, into the histogram :func:`kvtrace.analyses.curves.compute_curve`
evaluates (and into the eight sub-sample histograms behind the error estimate). What it
keeps is O(tracked blocks) for the kernel, O(sampled requests) for the request-hit
keys, and the usable keys of the evaluated accesses for the exact knee search: in
memory for an in-memory trace; on disk, next to the other spill files, for a streamed
one. The per-access arrays of a chunk never outlive it.

The result does not depend on the chunking (the kernel carries its state, the bins add
in trace order, the rest is concatenated in order), so an in-memory trace and the same
trace streamed from Parquet give the same curve bit for bit.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from kvtrace.analyses.curve_pass import CurvePass
from kvtrace.kernels.hitcurve import binned_hits_into, keys_in_ranges, max_finite
from kvtrace.kernels.shards import HEAVY_STEP, Sampler, heavy_from_counts, strided_counts_into
from kvtrace.kernels.stackdist import COLD
from kvtrace.trace.source import read_exact

#: Hash-disjoint sub-samples behind a sampled curve's error estimate.
SUBSAMPLES = 8


class _KneeKeys:
    """The usable keys of the measured evaluated accesses, with tokens, positions and
    weights, in trace order: what the exact knee search reads back. Held in memory, or
    appended to ``path`` (24 bytes per evaluated access) when given."""

    _DTYPE = np.dtype([("key", np.int64), ("tokens", np.int32), ("pos", np.int32), ("w", np.float64)])

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.parts: list[np.ndarray] = []
        self.lengths: list[int] = []
        self._fh = open(path, "wb") if path is not None else None

    def add(self, key, tokens, pos, w) -> None:
        rec = np.empty(key.shape[0], dtype=self._DTYPE)
        rec["key"], rec["tokens"], rec["pos"], rec["w"] = key, tokens, pos, w
        if self._fh is None:
            self.parts.append(rec)
        else:
            rec.tofile(self._fh)
            self.lengths.append(rec.shape[0])

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _records(self) -> Iterator[np.ndarray]:
        if self.path is None:
            yield from self.parts
            return
        with open(self.path, "rb") as fh:
            for n in self.lengths:
                yield read_exact(fh, self._DTYPE, n, self.path)

    def in_ranges(self, lo_keys: np.ndarray, hi_keys: np.ndarray, block_tokens: int):
        """:func:`kvtrace.kernels.hitcurve.keys_in_ranges` over every evaluated access."""
        parts = [keys_in_ranges(np.ascontiguousarray(rec["key"]), 0, np.ascontiguousarray(rec["tokens"]),
                                np.ascontiguousarray(rec["pos"]), block_tokens, lo_keys, hi_keys,
                                np.ascontiguousarray(rec["w"]))
                 for rec in self._records()]
        if not parts:
            return keys_in_ranges(np.empty(0, np.int64), 0, np.empty(0, np.int32), np.empty(0, np.int32),
                                  block_tokens, lo_keys, hi_keys, np.empty(0, np.float64))
        return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))


def _as_key(x: np.ndarray) -> np.ndarray:
    """Integer distance keys of float estimates: hit at C iff estimate <= C (COLD: inf)."""
    out = np.full(x.shape[0], COLD, dtype=np.int64)
    finite = np.isfinite(x)
    out[finite] = np.ceil(x[finite] - 1e-9).astype(np.int64)
    return out


def find_heavy(trace, rate: float) -> np.ndarray:
    """The heavy blocks of ``trace`` at ``rate`` (strided counts, chunk by chunk)."""
    counts = np.zeros(trace.n_blocks, dtype=np.uint32)
    for ch in trace.chunks(layout=False, block_dtype=None):
        strided_counts_into(counts, ch.block, (-ch.lo) % HEAVY_STEP, HEAVY_STEP)
    return heavy_from_counts(counts, rate)


def sampled_pass(trace, ev: str, rate: float, grid: np.ndarray, first_req: int, req_group: np.ndarray | None,
                 n_groups: int, block_tokens: int, progress: Callable[[int, int], None] | None = None) -> CurvePass:
    """The sampled pass (see the module docstring) over a
    :class:`kvtrace.trace.source.TraceSource`, as a
    :class:`kvtrace.analyses.curve_pass.CurvePass` over the sampled requests, with
    their weights, the sub-sample histograms and the evaluated count.

    Carried state: the SHARDS kernel's (:class:`kvtrace.kernels.shards.Sampler`), the
    histograms, the sampled requests' keys and the knee keys (:class:`_KneeKeys`)."""
    rs = trace.req_start
    n = int(rs[-1]) if rs.shape[0] else 0
    first_acc = int(rs[first_req]) if rs.shape[0] > first_req else n
    heavy = find_heavy(trace, rate)
    sampler = Sampler(trace.block_size, trace.block_hash, trace.block_tenant, heavy, rate, ev == "prefix-aware", rs)
    G = grid.shape[0]
    hist = np.zeros((2, n_groups, G + 2, 4), dtype=np.float64)
    sub_hist = np.zeros((2, SUBSAMPLES, G + 2, 4), dtype=np.float64)
    spill = trace.spill  # a source that spills its columns keeps the knee keys there too
    knee = _KneeKeys(Path(spill) / "sampled_keys" if spill is not None else None)
    req_ids, req_keys, req_members, req_weights = [], [], [], []
    top = 0
    n_eval = 0
    no_group = np.empty(0, dtype=np.int32)
    try:
        for ch in trace.chunks(block_dtype=None):  # block ids as the source stores them
            smp = sampler.feed(ch.block, ch.lo, ch.r)
            m = smp.t.shape[0]
            n_eval += m
            local = smp.t - ch.lo
            tokens = np.ascontiguousarray(ch.tokens[local], dtype=np.int32)
            pos = np.ascontiguousarray(ch.pos[local], dtype=np.int32)
            dk, uk = _as_key(smp.dist), _as_key(smp.usable)
            first = int(np.searchsorted(smp.t, first_acc))  # earlier ones only warmed the cache
            ident = np.arange(m, dtype=np.int64)  # each evaluated access is its own "block" of its size
            group = no_group if req_group is None else req_group[smp.request].astype(np.int32)
            binned_hits_into(hist, dk, uk, first, tokens, pos, ident, smp.size, block_tokens, group, grid,
                             smp.weight)
            # sub-samples: by block for sampled blocks, by access for heavy ones
            with np.errstate(over="ignore"):
                acc_mix = (smp.t.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)
                blk_mix = (smp.tracked_index.astype(np.uint64) * np.uint64(0xD1B54A32D192ED03)) >> np.uint64(32)
            sub = (np.where(smp.heavy, acc_mix, blk_mix) & np.uint64(SUBSAMPLES - 1)).astype(np.int32)
            binned_hits_into(sub_hist, dk, uk, first, tokens, pos, ident, smp.size, block_tokens, sub, grid,
                             smp.weight)
            if m:
                # a request is in the sample iff its first block is; its key and weight
                # are its first evaluated access's
                new = np.empty(m, dtype=bool)
                new[0] = True
                np.not_equal(smp.request[1:], smp.request[:-1], out=new[1:])
                starts = np.flatnonzero(new)
                rq = smp.request[starts]
                req_ids.append(rq)
                req_keys.append(uk[starts])
                req_members.append((pos[starts] == 0) & (rq >= first_req))
                req_weights.append(smp.weight[starts])
                top = max(top, int(max_finite(dk, first)), int(max_finite(uk, first)))
                knee.add(uk[first:], tokens[first:], pos[first:], smp.weight[first:])
            if progress is not None:
                progress(ch.hi, n)
    finally:
        knee.close()

    def cat(parts, dtype):
        return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)

    ids = cat(req_ids, np.int64)
    return CurvePass(hist, cat(req_keys, np.int64), cat(req_members, bool), top,
                     lambda lo_keys, hi_keys: knee.in_ranges(lo_keys, hi_keys, block_tokens),
                     request_group=None if req_group is None else req_group[ids],
                     request_weights=cat(req_weights, np.float64), sub_hist=sub_hist, n_evaluated=n_eval)


def subsample_error(sub_hist: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Standard error of the sampled headline rate (usable-prefix tokens) at each
    capacity, by random groups: the evaluated accesses fall into ``SUBSAMPLES``
    hash-disjoint groups (by block for sampled blocks, by access for heavy ones); the
    spread of the groups' rates over sqrt(groups) estimates the standard error of the
    whole sample's rate."""
    pre = sub_hist[1]  # [groups, G + 2, 4]
    hits = np.cumsum(pre[:, : grid.shape[0], 1], axis=1)
    total = pre[:, :, 1].sum(axis=1)
    ok = total > 0
    if ok.sum() < 2:
        return np.full(grid.shape[0], np.nan)
    rates = hits[ok] / total[ok][:, None]
    return np.std(rates, axis=0, ddof=1) / math.sqrt(rates.shape[0])
