"""Prefix chaining and block size of a canonical request table.

kvtrace's block ids must be *chained* (DESIGN §1): equal id at position j means equal
tokens 0..(j+1)*B, so a block can only be reused after the same prefix. Some logs hash
each block on its own content (an id says nothing about what came before).

- :func:`chain_report` measures it: the share of distinct block ids seen after more
  than one distinct parent id (the id before it in its request; position 0 has the
  parent "none"). A chained trace has share 0 (up to hash collisions).
- :func:`rechain` turns per-block hashes into chained ids: ``c_0 = mix(ROOT, h_0)``,
  ``c_j = mix(c_{j-1}, h_j)``, a 64-bit mix of (parent id, raw hash), so ``c_j`` depends
  on ``h_0..h_j``.
- :func:`reblock` coarsens a chained trace from B to k*B tokens per block exactly: new
  block i is the chained id of the last fine block it covers, so two requests share new
  block i iff they share fine blocks 0..min((i+1)k, n)-1. The tail group (fewer than k
  fine blocks) is the partial last block; its tokens follow ``input_tokens``.

All three work on the exploded hash lists with numpy (no per-block Python loop); the
tables are canonical request tables (``REQUEST_SCHEMA``), in any row order, and the
result keeps every other column.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from kvtrace.errors import KvtraceError
from kvtrace.trace import TraceMeta

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
#: Parent of position 0 in :func:`rechain` (any fixed value; this is splitmix64(0)).
ROOT = np.uint64(0xE220A8397B1DCDAF)


def _fmix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, a bijection on uint64 (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


def mix(parent: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """64-bit id of (parent id, raw hash): ``fmix(fmix(parent) ^ fmix(raw + GOLDEN))``."""
    with np.errstate(over="ignore"):
        return _fmix(_fmix(parent) ^ _fmix(raw + _GOLDEN))


def _flat(df: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    lengths = df["block_ids"].list.len().fill_null(0).to_numpy().astype(np.int64)
    starts = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    flat = (df["block_ids"].explode(empty_as_null=False).to_numpy().astype(np.uint64) if starts[-1]
            else np.empty(0, np.uint64))
    return flat, starts


def _with_ids(df: pl.DataFrame, ids: np.ndarray, starts: np.ndarray) -> pl.DataFrame:
    import pyarrow as pa

    arr = pa.LargeListArray.from_arrays(pa.array(starts, type=pa.int64()), pa.array(ids, type=pa.uint64()))
    return df.with_columns(pl.Series("block_ids", pl.from_arrow(arr)).cast(pl.List(pl.UInt64)))


@dataclass(frozen=True)
class ChainReport:
    """How prefix-chained a trace's block ids are.

    Attributes
    ----------
    blocks : int
        Distinct block ids (per tenant unless tenants share).
    multi_parent : int
        Of those, ids seen after more than one distinct parent id.
    share : float
        ``multi_parent / blocks`` (0 for a chained trace, 0 for an empty one).
    """

    blocks: int
    multi_parent: int
    share: float

    @property
    def chained(self) -> bool:
        return self.multi_parent == 0


def chain_report(df: pl.DataFrame, meta: TraceMeta | None = None) -> ChainReport:
    """Whether the block ids of a canonical request table are prefix-chained.

    Parameters
    ----------
    df : polars.DataFrame
        Canonical request table.
    meta : TraceMeta, optional
        When given and ``share_tenants`` is off, ids are told apart by tenant.
    """
    flat, starts = _flat(df)
    n = flat.shape[0]
    if n == 0:
        return ChainReport(0, 0, 0.0)
    lengths = np.diff(starts)
    first = np.zeros(n, dtype=bool)
    first[starts[:-1][lengths > 0]] = True
    parent = np.empty(n, dtype=np.uint64)
    parent[1:] = flat[:-1]
    parent[first] = 0
    cols = {"id": flat, "parent": parent, "root": first}
    if meta is not None and not meta.share_tenants and "tenant" in df.columns \
            and df["tenant"].null_count() < df.height:
        cols["tenant"] = np.repeat(df["tenant"].fill_null("").to_numpy(), lengths)
    table = pl.DataFrame(cols)
    keys = ["id"] + (["tenant"] if "tenant" in cols else [])
    per = table.unique().group_by(keys).len()
    multi = int((per["len"] > 1).sum())
    return ChainReport(per.height, multi, multi / per.height)


def access_chain_report(chunks, n_blocks: int) -> ChainReport:
    """:func:`chain_report` of a built trace's access stream: ``chunks`` yields
    ``(block, req_start)`` pairs of dense block ids and the offsets of whole requests in
    them (one pair for an in-memory trace, one per chunk of a streamed one). Dense ids
    already tell tenants apart. Memory: O(n_blocks) (each block's first parent and a
    flag), plus one chunk's pairs."""
    first_parent = np.full(n_blocks, -2, dtype=np.int64)  # -2: not seen; -1: the parent "none"
    multi = np.zeros(n_blocks, dtype=bool)
    width = np.int64(n_blocks + 1)
    for block, req_start in chunks:
        block = np.asarray(block, dtype=np.int64)
        if block.shape[0] == 0:
            continue
        parent = np.empty_like(block)
        parent[1:] = block[:-1]
        rs = np.asarray(req_start, dtype=np.int64)
        parent[rs[:-1][rs[1:] > rs[:-1]]] = -1  # position 0 of each request
        pairs = np.unique(block * width + (parent + 1))
        b, par = pairs // width, pairs % width - 1
        heads = np.ones(b.shape[0], dtype=bool)
        heads[1:] = b[1:] != b[:-1]
        multi[b[~heads]] = True  # two parents of one block in this chunk
        b, par = b[heads], par[heads]
        known = first_parent[b]
        multi[b[(known != -2) & (known != par)]] = True
        first_parent[b[known == -2]] = par[known == -2]
    seen = int(np.count_nonzero(first_parent != -2))
    count = int(np.count_nonzero(multi))
    return ChainReport(seen, count, count / seen if seen else 0.0)


def rechain(df: pl.DataFrame) -> pl.DataFrame:
    """Per-block hashes -> prefix-chained ids (see the module docstring).

    Vectorised by position: step j mixes position j of every request that has one,
    with requests sorted by length so the active ones are a prefix (O(total blocks) work,
    one numpy step per position of the longest request)."""
    flat, starts = _flat(df)
    if flat.shape[0] == 0:
        return df
    lengths = np.diff(starts)
    order = np.argsort(-lengths, kind="stable")
    sorted_len = lengths[order]
    sorted_start = starts[:-1][order]
    out = np.empty_like(flat)
    parent = np.full(order.shape[0], ROOT, dtype=np.uint64)
    active = order.shape[0]
    for j in range(int(sorted_len[0])):
        while active and sorted_len[active - 1] <= j:
            active -= 1
        idx = sorted_start[:active] + j
        parent = mix(parent[:active], flat[idx])
        out[idx] = parent
    return _with_ids(df, out, starts)


def reblock(df: pl.DataFrame, meta: TraceMeta, block_tokens: int, *, check: bool = True) -> tuple[pl.DataFrame, TraceMeta]:
    """Coarsen a chained trace to ``block_tokens`` = k * ``meta.block_tokens`` tokens per block.

    Parameters
    ----------
    df : polars.DataFrame
        Canonical request table with chained ids at ``meta.block_tokens`` tokens per block.
    meta : TraceMeta
    block_tokens : int
        New tokens per block, a multiple of the current size.
    check : bool
        Refuse a trace that is not chained (:func:`chain_report`): coarsening per-block
        hashes would merge unrelated prefixes. Pass False to skip the check (one pass
        over the ids).

    Returns
    -------
    (request table, TraceMeta) with ``block_tokens`` set.

    Raises
    ------
    KvtraceError
        A smaller or non-multiple size (refining needs the tokens), or ids not chained.
    """
    B = int(meta.block_tokens)
    if block_tokens < B or block_tokens % B:
        what = "smaller than" if block_tokens < B else "not a multiple of"
        raise KvtraceError(f"cannot re-block to {block_tokens} tokens: {what} the trace's {B}-token blocks "
                           "(only coarsening by a whole factor is exact; refining needs the tokens)",
                           field="block_tokens")
    if check:
        rep = chain_report(df, meta)
        if not rep.chained:
            raise KvtraceError(f"block ids are not prefix-chained ({rep.share:.1%} of blocks follow more than one "
                               "parent): rechain them first", field="block_ids")
    k = block_tokens // B
    new_meta = TraceMeta(**{**meta.to_dict(), "block_tokens": int(block_tokens)})
    if k == 1:
        return df, new_meta
    flat, starts = _flat(df)
    lengths = np.diff(starts)
    groups = -(-lengths // k)
    gstarts = np.zeros(groups.shape[0] + 1, dtype=np.int64)
    np.cumsum(groups, out=gstarts[1:])
    req = np.repeat(np.arange(lengths.shape[0], dtype=np.int64), groups)
    i = np.arange(int(gstarts[-1]), dtype=np.int64) - gstarts[req]
    last = np.minimum((i + 1) * k, lengths[req]) - 1
    return _with_ids(df, flat[starts[req] + last], gstarts), new_meta
