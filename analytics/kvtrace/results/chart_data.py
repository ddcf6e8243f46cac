"""The tables the charts draw, shaped from a trace or from the library's results:
arrivals per minute, length and reuse-time histograms, curve lines per group of one
metric, knees, tier marks, latency percentiles. They add no figures of their own: the
tests check each against the library function behind it (``kvtrace stats``,
:func:`kvtrace.analyses.curves.compute_curve`, :func:`kvtrace.analyses.whatif.summary_table`).
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from kvtrace.analyses.curves import KNEE_METRICS, CurveResult
from kvtrace.trace import Trace


# --------------------------------------------------------------------------- overview


def arrivals_per_minute(trace: Trace) -> pl.DataFrame:
    """Requests per minute of trace time, as ``kvtrace stats`` counts them.

    Returns
    -------
    polars.DataFrame
        ``minute`` int64 (minutes from the first arrival's minute), ``requests`` int64.
        Its mean and maximum are the stats' ``mean_arrivals_per_minute`` and
        ``peak_arrivals_per_minute``.
    """
    ts = trace.request_timestamp
    if ts.size == 0:
        return pl.DataFrame({"minute": [], "requests": []}, schema={"minute": pl.Int64, "requests": pl.Int64})
    minute = np.floor(ts / 60.0).astype(np.int64)
    counts = np.bincount(minute - minute.min())
    return pl.DataFrame({"minute": np.arange(counts.shape[0], dtype=np.int64), "requests": counts.astype(np.int64)})


def _log_histogram(x: np.ndarray, *, zero_below: float | None = None, per_octave: int = 2) -> pl.DataFrame:
    """Counts of ``x`` in log-spaced bins (``per_octave`` bins per doubling).

    Values below ``zero_below`` (e.g. a reuse in the same second) go to a first bin
    ``[0, zero_below)``.
    """
    schema = {"bin_lo": pl.Float64, "bin_hi": pl.Float64, "count": pl.Int64}
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return pl.DataFrame({"bin_lo": [], "bin_hi": [], "count": []}, schema=schema)
    rows = []
    if zero_below is not None:
        small = x < zero_below
        if small.any():
            rows.append((0.0, float(zero_below), int(small.sum())))
        x = x[~small]
    if x.size:
        lo = max(float(x.min()), 1e-300)
        lo_e = math.floor(math.log2(lo) * per_octave)
        hi_e = math.floor(math.log2(float(x.max())) * per_octave) + 1
        edges = 2.0 ** (np.arange(lo_e, hi_e + 1) / per_octave)
        counts, _ = np.histogram(x, bins=edges)
        rows += [(float(edges[i]), float(edges[i + 1]), int(c)) for i, c in enumerate(counts)]
    return pl.DataFrame(rows, schema=schema, orient="row")


def input_length_histogram(trace: Trace) -> pl.DataFrame:
    """Requests by prompt length (``input_tokens``), two log bins per doubling.

    Columns ``bin_lo``, ``bin_hi`` (tokens, the bin is ``[lo, hi)``), ``count``
    (requests). Zero-length prompts fall in a ``[0, 1)`` bin.
    """
    return _log_histogram(trace.requests["input_tokens"].to_numpy(), zero_below=1.0)


def reuse_times(trace: Trace) -> np.ndarray:
    """float64: seconds between consecutive accesses of the same block.

    The same values (as a multiset) as ``kvtrace stats``' ``reuse_time_s`` row: one per
    access that re-references a block, measured from the block's previous access.
    """
    a = trace.accesses
    if len(a) == 0:
        return np.zeros(0)
    order = np.argsort(a.block, kind="stable")  # trace order within each block
    blk = a.block[order]
    ts = trace.request_timestamp[a.request[order]]
    same = blk[1:] == blk[:-1]
    return (ts[1:] - ts[:-1])[same]


def reuse_time_histogram(trace: Trace) -> pl.DataFrame:
    """Block re-references by seconds since the previous access of the block.

    Columns ``bin_lo``, ``bin_hi`` (seconds, ``[lo, hi)``), ``count`` (accesses).
    Reuses under a millisecond (the same request, or requests arriving together)
    share a first ``[0, 0.001)`` bin.
    """
    return _log_histogram(reuse_times(trace), zero_below=1e-3)


# --------------------------------------------------------------------------- curves


def metric_lines(result: CurveResult, metric: str) -> pl.DataFrame:
    """One line per group (``all`` without a breakdown) of one curve metric.

    Returns
    -------
    polars.DataFrame
        ``group_name`` str · ``capacity_bytes`` int64 · ``capacity_gib`` float64 ·
        ``rate`` float64 · ``se`` float64 (estimated standard error of a sampled
        headline rate; null otherwise). Capacity 0 is dropped (log axis).
    """
    se_col = f"{metric}_se"
    base = result.curve.with_columns(pl.lit("all").alias("group_name"))
    frames = [base]
    if result.by_group is not None:
        frames.append(result.by_group)
    out = []
    for df in frames:
        se = pl.col(se_col) if se_col in df.columns else pl.lit(None, dtype=pl.Float64)
        out.append(df.select(
            pl.col("group_name").cast(pl.String),
            pl.col("capacity_bytes").cast(pl.Int64),
            (pl.col("capacity_bytes").cast(pl.Float64) / 2**30).alias("capacity_gib"),
            pl.col(metric).cast(pl.Float64).alias("rate"),
            se.cast(pl.Float64).alias("se"),
        ))
    return pl.concat(out).filter(pl.col("capacity_bytes") > 0)


def knee_points(result: CurveResult, metric: str) -> pl.DataFrame:
    """The library's knees of ``metric`` (none for metrics it has no knees for).

    Columns ``fraction``, ``target_rate``, ``capacity_bytes``, ``capacity_gib``,
    ``label`` (e.g. ``80% of ceiling``).
    """
    schema = {"fraction": pl.Float64, "target_rate": pl.Float64, "capacity_bytes": pl.Int64,
              "capacity_gib": pl.Float64, "label": pl.String}
    if metric not in KNEE_METRICS:
        return pl.DataFrame(schema=schema)
    k = result.knees.filter(pl.col("metric") == metric).drop_nulls("capacity_bytes")
    return k.select(
        "fraction", "target_rate", "capacity_bytes",
        (pl.col("capacity_bytes").cast(pl.Float64) / 2**30).alias("capacity_gib"),
        ((pl.col("fraction") * 100).round(0).cast(pl.Int64).cast(pl.String) + "% of ceiling").alias("label"),
    ).cast(schema)


def tier_marks(dram_bytes: int, flash_bytes: int) -> dict[str, int]:
    """Capacities to draw on a curve: DRAM, and DRAM + flash (one LRU of both, DESIGN §2)."""
    marks = {}
    if dram_bytes > 0:
        marks["DRAM"] = int(dram_bytes)
    if flash_bytes > 0:
        marks["DRAM + flash"] = int(dram_bytes) + int(flash_bytes)
    return marks


# --------------------------------------------------------------------------- what-ifs

#: Percentile columns of a what-if table and their labels.
LATENCY_COLUMNS = {"service_time_p50_ms": "p50", "service_time_p90_ms": "p90", "service_time_p99_ms": "p99",
                   "service_time_p999_ms": "p99.9"}


def latency_table(table: pl.DataFrame) -> pl.DataFrame:
    """Reusable-prefix service-time percentiles of a what-if table, long format.

    Columns ``config`` str · ``percentile`` str (p50, p90, p99, p99.9) · ``ms``
    float64 (the table's ``service_time_*_ms``).
    """
    cols = [c for c in LATENCY_COLUMNS if c in table.columns]
    return (
        table.select(pl.col("config").cast(pl.String), *cols)
        .unpivot(index="config", variable_name="percentile", value_name="ms")
        .with_columns(pl.col("percentile").replace_strict(LATENCY_COLUMNS))
    )
