"""Anonymised export of a trace as Mooncake or Qwen-Bailian JSONL (DESIGN §1).

What is written: arrival times relative to the first request, prompt and output
lengths, and block ids remapped to dense ids 0, 1, 2, ... in order of first appearance
(the trace's own dense ids, so blocks of different tenants stay different); no tokens,
text, raw hashes, request ids, tenants, salts or LoRA names.

- ``mooncake``: ``timestamp`` (integer milliseconds), ``input_length``,
  ``output_length``, ``hash_ids``.
- ``bailian``: ``chat_id`` (0..R-1 in trace order), ``parent_chat_id`` (the parent's
  ``chat_id``, -1 for a root or a parent outside the trace), ``timestamp`` (seconds),
  ``input_length``, ``output_length``, ``type`` (``text`` when unknown), ``turn`` (1 when
  unknown), ``hash_ids``.

Re-reading the file (``load_trace(path, block_tokens=B)``) gives the same access
stream, hence the same curves; the file does not store its block size, so state it
when re-reading (Mooncake's default is 512 tokens, Bailian's 16).
"""

from __future__ import annotations

import os

import numpy as np
import polars as pl

from kvtrace.errors import UsageError
from kvtrace.outputs import atomic_path
from kvtrace.trace import Trace

EXPORT_FORMATS = ("mooncake", "bailian")


def anonymized_table(trace: Trace, to: str) -> pl.DataFrame:
    """The rows :func:`write_anonymized` writes, as a DataFrame (trace order)."""
    if to not in EXPORT_FORMATS:
        raise UsageError(f"unknown export format '{to}': expected one of {', '.join(EXPORT_FORMATS)}", field="to")
    df = trace.requests
    acc = trace.accesses
    import pyarrow as pa

    hashes = pl.from_arrow(pa.LargeListArray.from_arrays(pa.array(acc.req_start, type=pa.int64()),
                                                         pa.array(acc.block.astype(np.int64), type=pa.int64())))
    ts = df["timestamp"].to_numpy()
    rel = ts - (ts[0] if ts.size else 0.0)
    cols: dict[str, pl.Series] = {}
    if to == "mooncake":
        cols["timestamp"] = pl.Series(np.rint(rel * 1000.0).astype(np.int64))  # rounding keeps the order
    else:
        n = df.height
        cols["chat_id"] = pl.Series(np.arange(n, dtype=np.int64))
        cols["parent_chat_id"] = pl.Series(_parent_rows(df), dtype=pl.Int64)
        cols["timestamp"] = pl.Series(rel)
    cols["input_length"] = df["input_tokens"]
    cols["output_length"] = df["output_tokens"]
    if to == "bailian":
        cols["type"] = df["type"].fill_null("text")
        cols["turn"] = df["turn"].fill_null(1)
    cols["hash_ids"] = pl.Series(hashes)
    return pl.DataFrame({k: v.alias(k) for k, v in cols.items()})


def _parent_rows(df: pl.DataFrame) -> np.ndarray:
    """Row (new chat_id) of each request's parent, -1 when it has none in the trace."""
    parent = df["parent_id"]
    out = np.full(df.height, -1, dtype=np.int64)
    if parent.null_count() == df.height or df["request_id"].null_count():
        return out
    ids = df["request_id"].to_numpy()
    order = np.argsort(ids, kind="stable")
    has = parent.is_not_null().to_numpy()
    p = parent.fill_null(0).to_numpy()
    pos = np.searchsorted(ids[order], p)
    pos = np.minimum(pos, ids.shape[0] - 1)
    found = has & (ids[order][pos] == p)
    rows = order[pos]
    # a parent must come before its child in the file (the Bailian reader walks chains)
    ok = found & (rows < np.arange(df.height))
    out[ok] = rows[ok]
    return out


def write_anonymized(trace: Trace, path: str | os.PathLike, to: str = "mooncake") -> int:
    """Write ``trace`` as anonymised Mooncake or Bailian JSONL, atomically.

    Parameters
    ----------
    trace : Trace
    path : path-like
        Destination ``.jsonl`` file.
    to : str
        ``mooncake`` or ``bailian``.

    Returns
    -------
    int
        Requests written.
    """
    table = anonymized_table(trace, to)
    with atomic_path(path) as tmp:
        table.write_ndjson(tmp)
    return table.height
