"""Trace statistics (``kvtrace stats``): size, arrivals, lengths, reuse, shared prefixes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from .kernels.reuse import previous_access
from .model import ModelSpec, resolve_model
from .trace import Trace

PERCENTILES = (50, 90, 99, 99.9)


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


def _percentile_row(name: str, x: np.ndarray) -> dict:
    row = {"quantity": name, "count": int(x.size), "mean": float(x.mean()) if x.size else None}
    for p in PERCENTILES:
        row[f"p{p:g}"] = float(np.percentile(x, p)) if x.size else None
    return row


def trace_stats(trace: Trace, model: ModelSpec | str | None = None, top: int = 10) -> TraceStats:
    """Summary statistics of a trace.

    Parameters
    ----------
    trace : Trace
    model : ModelSpec or str, optional
        Sets KV bytes per token for the byte figures (default Llama-3.1-70B).
    top : int
        How many shared prefixes to list.
    """
    model = model if isinstance(model, ModelSpec) else resolve_model(model)
    bpt = int(model.kv_bytes_per_token)
    a = trace.accesses
    req = trace.requests
    ts = trace.request_timestamp
    duration = trace.duration
    n_req, n_acc, n_blk = trace.n_requests, trace.n_accesses, trace.n_blocks

    minute = np.floor(ts / 60.0).astype(np.int64) if n_req else np.zeros(0, np.int64)
    per_minute = np.bincount(minute - minute.min()) if n_req else np.zeros(1, np.int64)
    prev = previous_access(a.block, n_blk)
    rereferenced = prev >= 0
    acc_ts = ts[a.request]
    reuse_time = acc_ts[rereferenced] - acc_ts[prev[rereferenced]]

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
        "accessed_kv_bytes": int(a.tokens.astype(np.int64).sum()) * bpt,
        "distinct_kv_bytes": int(trace.block_size.sum()) * bpt,
        "rereference_share": float(rereferenced.mean()) if n_acc else 0.0,
        "sessions": int(req["session_id"].drop_nulls().n_unique()) if req["session_id"].null_count() < n_req else None,
        "warnings": list(trace.warnings),
    }
    lengths = pl.DataFrame(
        [
            _percentile_row("input_tokens", req["input_tokens"].to_numpy()),
            _percentile_row("output_tokens", req["output_tokens"].to_numpy()),
            _percentile_row("reuse_time_s", reuse_time),
        ]
    )
    groups = {}
    for col in ("type", "tenant"):
        if req[col].null_count() < n_req:
            groups[col] = _group_rows(trace, col, rereferenced)
    return TraceStats(summary, lengths, _top_prefixes(trace, bpt, top), groups)


def _top_prefixes(trace: Trace, bpt: int, top: int) -> pl.DataFrame:
    """Shared prefixes ranked by prefix bytes x reuses.

    A block id names a whole prefix (hashes are chained). A prefix whose every use
    continues into the same longer prefix (a child block with as many accesses) is
    left out in favour of the longer one.
    """
    a = trace.accesses
    M = trace.n_blocks
    count = np.bincount(a.block, minlength=M)
    first_t = np.full(M, -1, dtype=np.int64)
    first_t[a.block[::-1]] = np.arange(a.block.shape[0] - 1, -1, -1)
    last_t = np.zeros(M, dtype=np.int64)
    last_t[a.block] = np.arange(a.block.shape[0])
    depth = a.pos[first_t].astype(np.int64) + 1 if M else np.zeros(0, np.int64)
    prefix_tokens = (depth - 1) * trace.meta.block_tokens + trace.block_size
    dominated = np.zeros(M, dtype=bool)
    child = np.flatnonzero(a.pos > 0)
    parent = a.block[child - 1]
    same = count[a.block[child]] == count[parent]
    dominated[parent[same]] = True
    reuses = count - 1
    score = prefix_tokens.astype(np.float64) * bpt * reuses
    cand = np.flatnonzero((reuses > 0) & ~dominated)
    order = cand[np.lexsort((cand, -score[cand]))][:top]
    ts = trace.request_timestamp
    return pl.DataFrame(
        {
            "block": order,
            "hash": trace.block_hash[order],
            "depth_blocks": depth[order],
            "prefix_tokens": prefix_tokens[order],
            "prefix_bytes": prefix_tokens[order] * bpt,
            "accesses": count[order],
            "reuses": reuses[order],
            "first_seen_s": ts[a.request[first_t[order]]] if order.size else np.zeros(0),
            "last_seen_s": ts[a.request[last_t[order]]] if order.size else np.zeros(0),
            "bytes_x_reuses": score[order],
        },
        schema_overrides={"block": pl.Int64, "hash": pl.UInt64, "depth_blocks": pl.Int64,
                          "prefix_tokens": pl.Int64, "prefix_bytes": pl.Int64, "accesses": pl.Int64,
                          "reuses": pl.Int64},
    )


def _group_rows(trace: Trace, col: str, rereferenced: np.ndarray) -> pl.DataFrame:
    a = trace.accesses
    label = trace.requests[col].fill_null("(none)")
    acc = pl.DataFrame({"g": label.to_numpy()[a.request], "reref": rereferenced, "block": a.block})
    per_acc = acc.group_by("g").agg(
        pl.len().alias("block_accesses"),
        pl.col("reref").mean().alias("rereference_share"),
        pl.col("block").n_unique().alias("distinct_blocks"),
    )
    per_req = trace.requests.with_columns(label.alias("g")).group_by("g").agg(
        pl.len().alias("requests"),
        pl.col("input_tokens").mean().alias("mean_input_tokens"),
        pl.col("output_tokens").mean().alias("mean_output_tokens"),
    )
    return (
        per_req.join(per_acc, on="g", how="left")
        .rename({"g": col})
        .with_columns(pl.col("block_accesses", "distinct_blocks").fill_null(0),
                      pl.col("rereference_share").fill_null(0.0))
        .sort(["requests", col], descending=[True, False])  # ties: by name, not hash order
    )
