"""Exact percentiles of float64 values in a file, read in chunks (out of core).

A streamed ``kvtrace stats`` (:mod:`kvtrace.analyses.stats`) writes one reuse time per
re-reference to a spill file: O(accesses), too many to hold. Its percentiles must
equal ``np.percentile`` of the same values in memory, so no histogram estimate will
do. Two exact steps:

1. **Order statistics** (:func:`order_statistics`): radix selection on the values'
   order-preserving 64-bit keys. Each pass over the file counts, for every rank still
   open, the next 16 bits of the keys that share the rank's prefix (65,536 counters);
   the bucket that holds the rank becomes the new prefix. Once the values left under a
   prefix fit in memory (``limit``) they are gathered in one more pass and
   ``np.partition`` picks the rank; when all 64 bits are fixed the value is known. At
   most five passes, memory O(65,536 x ranks + limit).
2. **Interpolation** (:func:`linear_percentile`): numpy's default method (``linear``)
   from the two order statistics around its virtual index, with numpy's operations in
   numpy's order (``tests/test_stats_stream.py`` checks it against ``np.percentile``
   over every sample size up to a few hundred and random large ones).

Values compare as numbers: -0.0 and +0.0 are one key (as ``np.partition`` sees them);
a NaN anywhere makes every percentile NaN (as ``np.percentile``).
"""

from __future__ import annotations

import math
import os
from typing import Iterable, Sequence

import numpy as np

_DIGIT_BITS = 16
_SIGN = np.uint64(1 << 63)


def percentile_ranks(n: int, percentiles: Iterable[float]) -> list[int]:
    """The 0-based ranks (in ascending order) whose values :func:`linear_percentile`
    needs for these percentiles of ``n`` values."""
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
    """``np.percentile(x, p)`` (method ``linear``) of ``n`` values from their order
    statistics.

    Parameters
    ----------
    n : int
        Number of values (>= 1).
    p : float
        Percentile in [0, 100].
    value : dict
        ``rank -> k-th smallest value`` for the ranks of :func:`percentile_ranks`.

    Notes
    -----
    Mirrors ``numpy.lib._function_base_impl._quantile``: virtual index ``(n - 1) * q``
    with ``q = p / 100``; at or past the last index the largest value; otherwise
    ``a + (b - a) * g``, or ``b - (b - a) * (1 - g)`` when ``g >= 0.5`` (numpy's
    ``_lerp``), with ``g`` the fractional part. Python floats are IEEE doubles and the
    operations are numpy's, one by one, so the result is numpy's to the bit.
    """
    vi = (n - 1) * (p / 100)
    if vi >= n - 1:
        return float(value[n - 1])
    k = math.floor(vi)
    g = vi - k
    a, b = float(value[k]), float(value[k + 1])
    d = b - a
    return b - d * (1 - g) if g >= 0.5 else a + d * g


def _keys(x: np.ndarray) -> np.ndarray:
    """uint64 keys in the order of the float64 values (-0.0 folded into +0.0)."""
    bits = (x + 0.0).view(np.uint64)  # -0.0 + 0.0 is +0.0
    return np.where(bits & _SIGN, ~bits, bits | _SIGN)


def _value(key: int) -> float:
    k = np.uint64(key)
    bits = k & ~_SIGN if k & _SIGN else ~k
    return float(np.array(bits, dtype=np.uint64).view(np.float64))


def _chunks(path: str | os.PathLike, n: int, chunk: int):
    with open(path, "rb") as fh:
        done = 0
        while done < n:
            x = np.fromfile(fh, dtype=np.float64, count=min(chunk, n - done))
            if x.shape[0] == 0:
                raise EOFError(f"{path}: {done:,} of {n:,} values")
            done += x.shape[0]
            yield x


def order_statistics(path: str | os.PathLike, n: int, ranks: Sequence[int], chunk: int,
                     limit: int | None = None) -> dict:
    """The k-th smallest of the ``n`` float64 values in a file, for each k in ``ranks``.

    Parameters
    ----------
    path : path-like
        Raw native-endian float64 values (``ndarray.tofile``).
    n : int
        How many values the file holds.
    ranks : sequence of int
        0-based ranks in [0, n).
    chunk : int
        Values read at a time.
    limit : int, optional
        Most values gathered in memory for one rank's final selection (default
        ``chunk // len(ranks)``, so all gathered values together are about one chunk).

    Returns
    -------
    dict
        ``rank -> value`` (float). If a value is NaN, every rank's value is NaN.
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
        nan = False
        for x in _chunks(path, n, chunk):
            if first and np.isnan(x).any():
                nan = True
                break
            key = _keys(x)
            for g in todo:
                prefix, free = g
                sel = key if free == 64 else key[(key >> np.uint64(free)) == np.uint64(prefix)]
                if g in gather:
                    parts[g].append(sel)
                else:
                    digit = (sel >> np.uint64(free - _DIGIT_BITS)) & np.uint64((1 << _DIGIT_BITS) - 1)
                    hist[g] += np.bincount(digit.astype(np.intp), minlength=1 << _DIGIT_BITS)
        if nan:
            return {k: math.nan for k in ranks}
        first = False
        for g, ks in todo.items():
            if g in gather:
                keys = np.concatenate(parts.pop(g)) if parts[g] else np.empty(0, np.uint64)
                local = sorted(k - state[k][2] for k in ks)
                keys.partition(local)
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


__all__ = ["linear_percentile", "order_statistics", "percentile_ranks"]
