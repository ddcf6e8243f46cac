"""Analyst SQL: a trace as a DuckDB database (``kvtrace export``; DESIGN §6).

:func:`build_database` runs the exact analyses once (reuse distances, the curve, the
future-reuse value) and loads their results as tables into a DuckDB connection, then
installs the macros and views of ``sql/`` (:func:`install_sql`). :func:`export_database`
does that in a new database file, built at a temporary path next to the destination
and renamed into place: a failed export leaves no partial database and never clobbers
an existing one.

The tables, their columns and units are listed in :data:`TABLES`; the same text is
stored in the database as table and column comments (``FROM duckdb_columns()``).
Conventions: distances in tokens of KV cache (x KV bytes per token = bytes), a first
access is a cold miss with distance ``inf``; times in seconds from the start of the
trace; rates are shares in [0, 1] of the measured (post-warm-up) accesses or requests;
an access hits an LRU of capacity C bytes iff its distance in bytes is <= C.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from kvtrace import __version__
from kvtrace.analyses.curves import GROUPINGS, RATE_COLUMNS, compute_curve, half_prefix_keys
from kvtrace.analyses.distances import COLD, distances_table, normalise_eviction, reuse_distances
from kvtrace.errors import KvtraceError, UsageError
from kvtrace.model import GpuSpec, ModelSpec, resolve_gpu, resolve_model
from kvtrace.names import CURVE_COLUMNS, canonical_table
from kvtrace.outputs import atomic_path
from kvtrace.trace import Trace
from kvtrace.analyses.value import StorageCosts, parse_horizon, value_report

__all__ = ["ExportResult", "TABLES", "build_database", "example_files", "export_database", "install_sql",
           "is_database", "parquet_views_sql", "run_sql_file", "sql_dir"]

#: Files of ``sql/`` installed in every database, in order (macros first: views use them).
SQL_FILES = ("macros.sql", "views.sql")

#: The curve's columns, described with their units (:data:`kvtrace.names.CURVE_COLUMNS`).
_CURVE_COLUMNS = {k: f"{meaning} ({unit})" for k, (unit, meaning) in CURVE_COLUMNS.items()}

#: Every table of an exported database: (description, {column: description with unit}).
TABLES: dict[str, tuple[str, dict[str, str]]] = {
    "trace_meta": ("One row: the trace and the options the database was made with.", {
        "kvtrace_version": "kvtrace version that wrote the database",
        "exported_at": "when the database was written (UTC)",
        "source": "trace file name",
        "source_format": "mooncake, bailian, parquet, csv or canonical",
        "block_tokens": "tokens per full block",
        "share_tenants": "equal hashes in different tenants are the same block",
        "model": "model preset (sets KV bytes per token and prefill FLOPs)",
        "kv_bytes_per_token": "KV-cache bytes per token",
        "prefill_flops_per_token": "a: prefill FLOPs per token independent of position",
        "prefill_flops_per_token_position": "b: extra prefill FLOPs per token per earlier token (a block of k "
                                            "tokens at position s costs a*k + b*(k*s + k*(k-1)/2))",
        "gpu": "GPU preset that prices compute",
        "mfu": "prefill model FLOPs utilisation, share",
        "gpu_effective_flops": "sustained prefill FLOP/s (peak x mfu)",
        "dollars_per_gpu_hour": "$ per GPU-hour",
        "eviction": "LRU model of every distance: prefix-aware or flat",
        "warmup": "warm-up as given (NULL: none); earlier requests only fill the cache",
        "first_measured_request": "first request (index) counted in rates",
        "requests": "requests in the trace",
        "accesses": "block accesses in the trace",
        "distinct_blocks": "distinct blocks",
        "distinct_bytes": "bytes of all distinct blocks",
        "duration_s": "seconds from the first to the last arrival",
        "measured_requests": "requests counted in rates (after warm-up)",
        "measured_accesses": "accesses counted in rates (after warm-up)",
        "measured_duration_s": "seconds from the first measured arrival to the last",
        "horizon_s": "horizon of the future-reuse value, seconds (inf: unbounded)",
        "write_dollars_per_tb": "value cost of writing a block, $ per TB (10^12 bytes)",
        "read_dollars_per_tb": "value cost of reading a block back, $ per TB",
        "occupancy_dollars_per_tb_month": "value cost of storing a block, $ per TB-month (730 h)",
        **{f"ceiling_{k}": f"{k} of an infinite cache" for k in RATE_COLUMNS},
        "ceiling_capacity_bytes": "capacity at which every rate reaches its ceiling, bytes",
    }),
    "requests": ("One row per request, in trace order (sorted by arrival, stable on file order).", {
        "request": "request index in trace order (key; accesses.request refers to it)",
        "request_id": "request id as read from the trace",
        "timestamp": "arrival, seconds from the start of the trace",
        "session_id": "session (NULL: unknown)",
        "parent_id": "parent request id (NULL: none or unknown)",
        "turn": "turn number in the session (NULL: unknown)",
        "type": "request type (NULL: unknown)",
        "tenant": "tenant, a namespace for block hashes (NULL: none)",
        "input_tokens": "prompt tokens",
        "output_tokens": "generated tokens",
        "blocks": "block accesses (hashes) of the prompt",
        "prompt_tokens": "tokens covered by the block hashes",
        "measured": "counted in rates (not in the warm-up)",
        "hit_distance_tokens": "usable-prefix distance of the first block, tokens: the request hits (usable "
                               "prefix >= 1 block) at capacity C iff this x kv_bytes_per_token <= C; inf: cold "
                               "or no blocks",
        "hit_distance_bytes": "the same in bytes",
        "half_prefix_distance_tokens": "smallest capacity, tokens, at which the usable prefix holds at least "
                                       "half the request's prompt tokens (request_half_prefix_hit_rate); inf: "
                                       "never or no blocks",
        "half_prefix_distance_bytes": "the same in bytes",
        "block_ids": "chained prefix hashes of the prompt, as read",
    }),
    "accesses": ("One row per block access, in trace order: the canonical access table with per-access "
                 "results.", {
        "t": "access index in trace order (key)",
        "request": "request index (requests.request)",
        "pos": "block index inside the request (0 = first block of the prompt)",
        "block": "dense block id (blocks.block)",
        "tokens": "tokens of this block in this request (the last block may be partial)",
        "timestamp": "arrival of the request, seconds from the start of the trace",
        "measured": "counted in rates (not in the warm-up)",
        "reuse_distance_tokens": "byte-LRU stack distance, tokens: any-block hit at capacity C iff "
                                 "reuse_distance_bytes <= C; inf: first access (cold)",
        "usable_distance_tokens": "usable-prefix distance, tokens (running max of reuse distances along the "
                                  "request): usable-prefix hit at C iff usable_distance_bytes <= C; inf: cold",
        "reuse_distance_bytes": "reuse distance, bytes",
        "usable_distance_bytes": "usable-prefix distance, bytes",
        "reuse_distance_blocks": "reuse distance in blocks (distinct blocks touched, this one included); inf: cold",
        "reuse_time_s": "seconds since the block's previous touch; inf: first access",
        "prefill_flops": "prefill FLOPs of this block at its position (what a usable-prefix hit avoids)",
        "next_t": "index of the next access of the same block (NULL: none)",
        "next_gap_s": "seconds to the next access of the same block (inf: none)",
        "reuses": "later accesses of the block within the value horizon",
        "value_usd": "future-reuse value of keeping the block after this access for the horizon, $ "
                         "(compute the reuses avoid - write, read and occupancy cost; windows overlap: do "
                         "not sum)",
        "interval_value_usd": "this access's part of the block's keep-for-the-horizon value, $ (sums to "
                                  "blocks.total_value_usd)",
    }),
    "blocks": ("One row per distinct block (dense id in order of first appearance), with its future-reuse "
               "value.", {
        "block": "dense block id (key)",
        "hash": "source hash of the block",
        "tenant": "tenant of the request in which the block first appears (NULL: none)",
        "size_tokens": "tokens the block occupies in a cache (its largest size in the trace)",
        "bytes": "bytes the block occupies (size_tokens x kv_bytes_per_token)",
        "root_block": "its prefix family: the block just below the shared root (the leading blocks >= 99 % of "
                      "requests carry, none in most traces; at position 0 then) in the request in which the block "
                      "first appears; the shared root's own family is labelled with its first block",
        "first_seen_s": "arrival of its first access, seconds",
        "last_seen_s": "arrival of its last access, seconds",
        "accesses": "accesses in the trace",
        "reused": "accessed more than once",
        "horizon_hits": "accesses whose previous access is within the horizon",
        "gain_gpu_seconds": "GPU-seconds of prefill a keep-for-the-horizon store avoids",
        "cost_usd": "write + read + occupancy cost of that store, $",
        "total_value_usd": "net value of that store, $",
        "value_usd_per_byte": "total_value_usd / bytes, $ per byte",
        "clairvoyant_value_usd": "best keep/drop schedule value, $ (>= 0)",
    }),
    "curve": ("The capacity-hit curve, one row per capacity (~log-spaced from one block to all distinct "
              "bytes), as `kvtrace curve --out`; rates are cumulative in capacity.", _CURVE_COLUMNS),
    "curve_by_group": ("The curve per group under one shared cache, for every grouping the trace has "
                       "(type, tenant, turn, session-length).", {
        "group_by": "grouping: type, tenant, turn or session-length",
        "group_name": "group (turn and session-length are bucketed: 1, 2, 3, 4-7, 8-15, 16-31, 32+)",
        **_CURVE_COLUMNS,
    }),
    "curve_steps": ("The curve's exact per-distance hit data: one row per kind and distinct distance of the "
                    "measured accesses (requests); hits at capacity C = sums over the rows with "
                    "distance_bytes <= C (read by the macros hit_rate_at and capacity_for).", {
        "kind": "prefix (usable-prefix distances of accesses), any (any-block distances of accesses), "
                "request (requests.hit_distance_tokens) or half_prefix (requests.half_prefix_distance_tokens)",
        "distance_tokens": "distance, tokens (inf: cold, never hits)",
        "distance_bytes": "distance, bytes",
        "accesses": "accesses (requests for kind request) at this distance",
        "tokens": "tokens of those accesses (NULL for requests)",
        "cache_tokens": "tokens their blocks occupy in a cache (NULL for requests)",
        "position_token_sum": "sum over their tokens of the token's position in the prompt (prefill FLOPs = "
                              "a*tokens + b*position_token_sum; NULL for requests)",
    }),
    "knees": ("Smallest capacity reaching each share of the ceiling, per metric (exact), as `kvtrace "
              "curve --json`.", {
        "metric": "curve column",
        "fraction": "share of the ceiling",
        "target_rate": "fraction x the ceiling rate",
        "capacity_bytes": "smallest capacity reaching it, bytes",
        "capacity_tokens": "the same in tokens",
    }),
}

#: Optional table, present when ``--whatif`` is given.
WHATIF_TABLE = ("whatif", "A `kvtrace whatif --out` comparison table, loaded as written.")


@dataclass
class ExportResult:
    """Output of :func:`export_database`.

    Attributes
    ----------
    path : pathlib.Path
        The database written.
    tables : dict
        Rows per table.
    bytes : int
        Size of the database file, bytes.
    seconds : float
        Wall time of the export, seconds.
    parquet : list of pathlib.Path
        Parquet files written (``parquet_dir``).
    """

    path: Path
    tables: dict
    bytes: int
    seconds: float
    parquet: list = field(default_factory=list)


# ----------------------------------------------------------------------------- sql/ files


def sql_dir() -> Path:
    """The directory of the SQL files: the :mod:`kvtrace.sql` package."""
    d = Path(str(resources.files("kvtrace.sql")))
    if (d / "views.sql").is_file():
        return d
    raise KvtraceError("the kvtrace SQL files (views.sql, macros.sql) are missing from the installation", path=str(d))


def example_files() -> list[Path]:
    """The example queries of ``sql/examples``, in name order."""
    return sorted((sql_dir() / "examples").glob("*.sql"))


def _duck():
    import duckdb

    return duckdb


def run_sql_file(con, path: Path) -> None:
    """Execute every statement of a SQL file; a failure names the file."""
    duckdb = _duck()
    text = Path(path).read_text(encoding="utf-8")
    try:
        for stmt in con.extract_statements(text):
            con.execute(stmt.query).fetchall()
    except duckdb.Error as exc:
        raise KvtraceError(f"SQL error: {str(exc).splitlines()[0]}", path=str(path)) from None


def install_sql(con) -> None:
    """Install the macros and views of ``sql/`` in a connection that holds the tables."""
    for name in SQL_FILES:
        run_sql_file(con, sql_dir() / name)


# ----------------------------------------------------------------------------- tables


def _as_float(x: np.ndarray) -> np.ndarray:
    out = x.astype(np.float64)
    out[x == COLD] = np.inf
    return out


def _first_access(block: np.ndarray, n_blocks: int) -> np.ndarray:
    first = np.full(n_blocks, -1, dtype=np.int64)
    first[block[::-1]] = np.arange(block.shape[0] - 1, -1, -1, dtype=np.int64)
    return first


def _int64(df: pl.DataFrame) -> pl.DataFrame:
    """Widen integer columns to int64: sums of int32 products overflow in SQL."""
    narrow = [c for c, t in df.schema.items() if t in (pl.Int8, pl.Int16, pl.Int32, pl.UInt8, pl.UInt16,
                                                       pl.UInt32)]
    return df.with_columns(pl.col(narrow).cast(pl.Int64)) if narrow else df


def _tables(trace: Trace, m: ModelSpec, g: GpuSpec, ev: str, warmup, points: int, horizon: float,
            costs: StorageCosts | None, progress) -> tuple[dict[str, pl.DataFrame], dict]:
    """The result tables of a trace (all but curve_steps, which SQL derives)."""

    def step(name: str, done: int, total: int) -> None:
        if progress is not None:
            progress(name, done, total)

    bpt = int(m.kv_bytes_per_token)
    fa, fb = m.flops_coefficients()
    B = int(trace.meta.block_tokens)
    a = trace.accesses
    R, N, M = trace.n_requests, trace.n_accesses, trace.n_blocks

    d = reuse_distances(trace, ev, details=True,
                        progress=lambda done, total: step("reuse distances", done, total))
    step("curve", 0, 1)
    cr = compute_curve(trace, model=m, gpu=g, eviction=ev, points=points, warmup=warmup, distances=d)
    by_group = []
    req = trace.requests
    available = {
        "type": req["type"].null_count() < R,
        "tenant": req["tenant"].null_count() < R,
        "turn": req["turn"].null_count() < R,
        "session-length": req["session_id"].null_count() < R,
    }
    for by in GROUPINGS:
        if available[by]:
            gr = compute_curve(trace, model=m, gpu=g, eviction=ev, points=points, warmup=warmup, by=by,
                               distances=d)
            by_group.append(gr.by_group
                            .insert_column(0, pl.lit(by).alias("group_by")))
    step("value", 0, 1)
    vr = value_report(trace, model=m, gpu=g, horizon_s=horizon, costs=costs)
    fr = vr.future
    first_req = int(cr.info["first_measured_request"])

    k = a.tokens.astype(np.int64)
    s = a.pos.astype(np.int64) * B
    q = k * s + k * (k - 1) // 2
    acc = distances_table(trace, d, bpt).with_columns(
        pl.Series("measured", a.request >= first_req),
    ).select("t", "request", "pos", "block", "tokens", "timestamp", "measured", "reuse_distance_tokens",
             "usable_distance_tokens", "reuse_distance_bytes", "usable_distance_bytes", "reuse_distance_blocks",
             "reuse_time_s")
    acc = acc.with_columns(
        pl.Series("prefill_flops", fa * k.astype(np.float64) + fb * q.astype(np.float64)),
        pl.Series("next_t", fr.next_t).replace(-1, None),
        pl.Series("next_gap_s", fr.next_gap_s),
        pl.Series("reuses", fr.reuses),
        pl.Series("value_usd", fr.value_usd),
        pl.Series("interval_value_usd", fr.interval_value_usd),
    )

    rs = a.req_start
    nonempty = rs[1:] > rs[:-1]
    hit = np.full(R, COLD, dtype=np.int64)
    hit[nonempty] = d.usable[rs[:-1][nonempty]]
    hit_f = _as_float(hit)
    half_f = _as_float(half_prefix_keys(d.usable, a.tokens, rs))
    requests = req.select(
        pl.Series("request", np.arange(R, dtype=np.int64)),
        "request_id", "timestamp", "session_id", "parent_id", "turn", "type", "tenant", "input_tokens",
        "output_tokens",
        pl.Series("blocks", np.diff(rs).astype(np.int64)),
        pl.Series("prompt_tokens", np.bincount(a.request, weights=k, minlength=R).astype(np.int64)),
        pl.Series("measured", np.arange(R) >= first_req),
        pl.Series("hit_distance_tokens", hit_f),
        pl.Series("hit_distance_bytes", hit_f * bpt),
        pl.Series("half_prefix_distance_tokens", half_f),
        pl.Series("half_prefix_distance_bytes", half_f * bpt),
        "block_ids",
    )

    first_t = _first_access(a.block, M)
    tenant = req["tenant"].to_numpy()[a.request[first_t]] if M else np.empty(0, dtype=object)
    blocks = vr.per_block.with_columns(
        pl.Series("tenant", tenant, dtype=pl.String),
        pl.Series("size_tokens", trace.block_size.astype(np.int64)),
    ).select("block", "hash", "tenant", "size_tokens", "bytes", "root_block", "first_seen_s", "last_seen_s",
             "accesses", "reused", "horizon_hits", "gain_gpu_seconds", "cost_usd", "total_value_usd",
             "value_usd_per_byte", "clairvoyant_value_usd")

    curve_by_group = (pl.concat(by_group) if by_group else
                      pl.DataFrame(schema={"group_by": pl.String, "group_name": pl.String, **cr.curve.schema}))

    info = cr.info
    c = vr.summary
    meta = {
        "kvtrace_version": __version__,
        "exported_at": _export_time(),
        "source": trace.meta.source,
        "source_format": trace.meta.source_format,
        "block_tokens": B,
        "share_tenants": bool(trace.meta.share_tenants),
        "model": m.name,
        "kv_bytes_per_token": bpt,
        "prefill_flops_per_token": float(fa),
        "prefill_flops_per_token_position": float(fb),
        "gpu": g.name,
        "mfu": float(g.mfu),
        "gpu_effective_flops": float(g.effective_flops),
        "dollars_per_gpu_hour": float(g.dollars_per_hour),
        "eviction": ev,
        "warmup": None if warmup in (None, "", 0) else str(warmup),
        "first_measured_request": first_req,
        "requests": R,
        "accesses": N,
        "distinct_blocks": M,
        "distinct_bytes": int(trace.block_size.sum()) * bpt,
        "duration_s": float(trace.duration),
        "measured_requests": int(info["measured_requests"]),
        "measured_accesses": int(info["measured_accesses"]),
        "measured_duration_s": float(info["measured_duration_s"]),
        "horizon_s": float(fr.horizon_s),
        "write_dollars_per_tb": float(c["write_dollars_per_tb"]),
        "read_dollars_per_tb": float(c["read_dollars_per_tb"]),
        "occupancy_dollars_per_tb_month": float(c["occupancy_dollars_per_tb_month"]),
        **{f"ceiling_{k_}": cr.ceiling[k_] for k_ in RATE_COLUMNS},
        "ceiling_capacity_bytes": int(cr.ceiling["capacity_bytes"]),
    }
    nullable = {"warmup": pl.String, **{f"ceiling_{k_}": pl.Float64 for k_ in RATE_COLUMNS}}
    trace_meta = pl.DataFrame([meta], schema_overrides=nullable)
    tables = {
        "trace_meta": trace_meta,
        "requests": requests,
        "accesses": acc,
        "blocks": blocks,
        "curve": cr.curve,
        "curve_by_group": curve_by_group,
        "knees": cr.knees,
    }
    return {name: _int64(df) for name, df in tables.items()}, meta


_CURVE_STEPS_SQL = """
CREATE TABLE curve_steps AS
WITH acc AS (
    SELECT a.reuse_distance_tokens AS d_any, a.usable_distance_tokens AS d_pre, a.tokens AS k,
           a.pos * m.block_tokens AS s, b.size_tokens AS size
    FROM accesses AS a JOIN blocks AS b USING (block), trace_meta AS m
    WHERE a.measured
),
steps AS (
    SELECT 'prefix' AS kind, d_pre AS distance_tokens, count(*) AS accesses, sum(k) AS tokens,
           sum(size) AS cache_tokens, sum(k * s + k * (k - 1) // 2) AS position_token_sum
    FROM acc GROUP BY d_pre
    UNION ALL
    SELECT 'any', d_any, count(*), sum(k), sum(size), sum(k * s + k * (k - 1) // 2)
    FROM acc GROUP BY d_any
    UNION ALL
    SELECT 'request', hit_distance_tokens, count(*), NULL, NULL, NULL
    FROM requests WHERE measured GROUP BY hit_distance_tokens
    UNION ALL
    SELECT 'half_prefix', half_prefix_distance_tokens, count(*), NULL, NULL, NULL
    FROM requests WHERE measured GROUP BY half_prefix_distance_tokens
)
SELECT s.kind, s.distance_tokens, s.distance_tokens * m.kv_bytes_per_token AS distance_bytes,
       CAST(s.accesses AS BIGINT) AS accesses, CAST(s.tokens AS BIGINT) AS tokens,
       CAST(s.cache_tokens AS BIGINT) AS cache_tokens,
       CAST(s.position_token_sum AS BIGINT) AS position_token_sum
FROM steps AS s, trace_meta AS m
ORDER BY s.kind, s.distance_tokens
"""


def _comment(con, table: str, description: str, columns: dict[str, str]) -> None:
    def lit(text: str) -> str:
        return "'" + text.replace("'", "''") + "'"

    con.execute(f"COMMENT ON TABLE {table} IS {lit(description)}")
    for col, text in columns.items():
        con.execute(f'COMMENT ON COLUMN {table}."{col}" IS {lit(text)}')


def _read_result_table(path: str | os.PathLike) -> pl.DataFrame:
    """A table written by a kvtrace command (``--out``): Parquet, CSV or JSON by suffix,
    with the column names of an earlier release mapped onto the current ones
    (:func:`kvtrace.names.canonical_table`)."""
    p = Path(path)
    return canonical_table(_read_table_file(p))


def _read_table_file(p: Path) -> pl.DataFrame:
    from kvtrace.outputs import table_format

    fmt = table_format(p)
    if not p.is_file():
        raise KvtraceError("no such file", path=str(p))
    try:
        if fmt == "parquet":
            return pl.read_parquet(p)
        if fmt == "csv":
            return pl.read_csv(p)
        rows = json.loads(p.read_text(encoding="utf-8"))
        rows = rows.get("rows") if isinstance(rows, dict) else rows
        if not isinstance(rows, list):
            raise KvtraceError("expected a JSON table: {\"rows\": [...]} or a list of rows", path=str(p))
        return pl.DataFrame(rows)
    except (OSError, ValueError, pl.exceptions.PolarsError) as exc:
        raise KvtraceError(f"cannot read the table: {str(exc).splitlines()[0]}", path=str(p)) from None


def build_database(
    con,
    trace: Trace,
    *,
    model: ModelSpec | str | None = None,
    gpu: GpuSpec | str | None = None,
    eviction: str = "prefix-aware",
    warmup: str | float | None = None,
    points: int = 200,
    horizon_s: float | str | None = None,
    costs: StorageCosts | None = None,
    whatif: str | os.PathLike | None = None,
    progress: Callable[[str, int, int], None] | None = None,
) -> dict[str, int]:
    """Analyse ``trace`` and load the results, macros and views into a DuckDB connection.

    Parameters
    ----------
    con : duckdb.DuckDBPyConnection
        An empty database (a file or ``duckdb.connect()`` in memory).
    trace : Trace
    model : ModelSpec or str, optional
        Sets KV bytes per token and prefill FLOPs (default Llama-3.1-70B).
    gpu : GpuSpec or str, optional
        Prices compute (default H100).
    eviction : str
        ``prefix-aware`` (default) or ``flat``: the LRU model of every distance.
    warmup : str or float, optional
        Fraction of requests or a duration that only fills the cache (``measured``
        columns and every rate).
    points : int
        Capacities of the curve table (~log-spaced).
    horizon_s : float or str, optional
        Horizon of the future-reuse value, seconds or a duration (default 1 h).
    costs : StorageCosts, optional
        Write / read / occupancy costs of the value (default: illustrative flash).
    whatif : path-like, optional
        A ``kvtrace whatif --out`` table to load as table ``whatif``.
    progress : callable, optional
        ``progress(stage, done, total)``.

    Returns
    -------
    dict
        Rows per table.
    """
    duckdb = _duck()
    m = model if isinstance(model, ModelSpec) else resolve_model(model)
    g = gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu)
    ev = normalise_eviction(eviction)
    horizon = parse_horizon(horizon_s)
    if points < 2:
        raise UsageError(f"expected at least 2 curve points, got {points}", field="points")
    extra = _read_result_table(whatif) if whatif is not None else None
    tables, _ = _tables(trace, m, g, ev, warmup, points, horizon, costs, progress)
    if progress is not None:
        progress("writing tables", 0, len(tables) + 1)
    try:
        for i, (name, df) in enumerate(tables.items()):
            con.register("_kvtrace_src", df.to_arrow())
            try:
                con.execute(f"CREATE TABLE {name} AS SELECT * FROM _kvtrace_src")
            finally:
                con.unregister("_kvtrace_src")
            _comment(con, name, *TABLES[name])
            if progress is not None:
                progress("writing tables", i + 1, len(tables) + 1)
        con.execute(_CURVE_STEPS_SQL)
        _comment(con, "curve_steps", *TABLES["curve_steps"])
        counts = {name: df.height for name, df in tables.items()}
        counts["curve_steps"] = con.execute("SELECT count(*) FROM curve_steps").fetchall()[0][0]
        if extra is not None:
            con.register("_kvtrace_src", extra.to_arrow())
            try:
                con.execute(f"CREATE TABLE {WHATIF_TABLE[0]} AS SELECT * FROM _kvtrace_src")
            finally:
                con.unregister("_kvtrace_src")
            con.execute(f"COMMENT ON TABLE {WHATIF_TABLE[0]} IS '{WHATIF_TABLE[1]}'")
            counts[WHATIF_TABLE[0]] = extra.height
    except duckdb.Error as exc:
        raise KvtraceError(f"cannot build the database: {str(exc).splitlines()[0]}") from None
    install_sql(con)
    if progress is not None:
        progress("writing tables", len(tables) + 1, len(tables) + 1)
    return counts


# ----------------------------------------------------------------------------- files


def _export_time() -> _dt.datetime:
    """Now (UTC, whole seconds), or ``SOURCE_DATE_EPOCH`` when set: the reproducible-builds
    convention, so that two exports of the same trace and options are byte-identical."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        try:
            return _dt.datetime.fromtimestamp(int(epoch), _dt.timezone.utc).replace(tzinfo=None)
        except (ValueError, OverflowError, OSError):
            raise KvtraceError(f"expected whole seconds since 1970, got {epoch!r}", field="SOURCE_DATE_EPOCH") from None
    return _dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None, microsecond=0)


_MAGIC = b"DUCK"


def is_database(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a DuckDB database file (by its header, not its name)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(12)
    except OSError:
        return False
    return len(head) >= 12 and head[8:12] == _MAGIC


def export_database(
    trace: Trace,
    path: str | os.PathLike,
    *,
    parquet_dir: str | os.PathLike | None = None,
    **options,
) -> ExportResult:
    """Write ``trace``'s analysis database to ``path`` atomically.

    The database is built at a temporary path in the destination directory,
    checkpointed, closed and renamed onto ``path``: a failure leaves no partial
    database and keeps any previous file. An existing file that is not a DuckDB
    database is never replaced.

    Parameters
    ----------
    trace : Trace
    path : path-like
        Database file to write (``.duckdb``).
    parquet_dir : path-like, optional
        Also write every table as ``parquet_dir/TABLE.parquet`` (views and macros of
        ``sql/`` work over them; see the README).
    **options
        As for :func:`build_database`.

    Returns
    -------
    ExportResult
    """
    duckdb = _duck()
    t0 = time.perf_counter()
    dest = Path(path)
    if dest.exists() and not dest.is_dir() and not is_database(dest):
        raise KvtraceError("exists and is not a DuckDB database: refusing to replace it", path=str(dest))
    out_dir = None
    if parquet_dir is not None:  # created when missing (its parent must exist), once the tables are built
        out_dir = Path(parquet_dir)
        if out_dir.exists() and not out_dir.is_dir():
            raise KvtraceError("is not a directory", path=str(out_dir))
        parent = out_dir.parent if str(out_dir.parent) else Path(".")
        if not parent.is_dir():
            raise KvtraceError("directory does not exist", path=str(parent))
    written: list[Path] = []
    with atomic_path(dest, suffix=".duckdb", named=True) as tmp:  # DuckDB adds its .wal next to it
        tmp.unlink()  # DuckDB makes its own file; an empty one is not a database
        wal = Path(str(tmp) + ".wal")
        try:
            con = duckdb.connect(str(tmp))
            try:
                counts = build_database(con, trace, **options)
                if out_dir is not None:
                    written = _write_parquet(con, counts, out_dir)
                con.execute("CHECKPOINT")
            finally:
                con.close()
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                wal.unlink()  # atomic_path removes the database itself
            raise
        size = tmp.stat().st_size  # the destination may be replaced only when the command's outputs are all done
    return ExportResult(dest, counts, size, time.perf_counter() - t0, written)


def parquet_files(parquet_dir: str | os.PathLike, whatif: bool = False) -> list[Path]:
    """The files ``export_database(..., parquet_dir=...)`` writes (every table, and the
    ``whatif`` table when one is loaded), for checking them before the export runs."""
    names = list(TABLES) + ([WHATIF_TABLE[0]] if whatif else [])
    return [Path(parquet_dir) / f"{name}.parquet" for name in names]


def _write_parquet(con, counts: dict, out_dir: Path) -> list[Path]:
    out_dir.mkdir(exist_ok=True)
    written = []
    for name in counts:
        dest = out_dir / f"{name}.parquet"
        with atomic_path(dest) as tmp:
            # USE_TMP_FILE false: the temporary file is atomic_path's (DuckDB's own would sit in /proc/self/fd)
            con.execute(f"COPY {name} TO '{_sql_path(tmp)}' (FORMAT parquet, COMPRESSION zstd, USE_TMP_FILE false)")
        written.append(dest)
    return written


def _sql_path(p: Path) -> str:
    return str(p).replace("'", "''")


def parquet_views_sql(parquet_dir: str | os.PathLike, tables=None) -> str:
    """SQL creating a view per table over ``parquet_dir/TABLE.parquet`` (then read
    macros.sql and views.sql)."""
    d = Path(parquet_dir)
    names = list(tables) if tables is not None else [n for n in TABLES if (d / f"{n}.parquet").exists()]
    return "".join(f"CREATE OR REPLACE VIEW {n} AS SELECT * FROM read_parquet('{_sql_path(d / (n + '.parquet'))}');\n"
                   for n in names)
