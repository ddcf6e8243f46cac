"""``kvtrace curve``: capacity-hit curves, in memory, streamed, sampled or on Dask."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kvtrace import names
from kvtrace.cli.console import console, progress, report_written, warn, write_json
from kvtrace.cli.errors import handles_errors
from kvtrace.cli.inputs import check_paths, check_suffix, check_tables, kv_model, load, scan_streamed
from kvtrace.cli.options import (BlockTokensOpt, CacheRules, DtypeOpt, Engine, EngineOpt, Eviction, Fmt,
                                 FormatOpt, GpuPriceOpt, KvBytesOpt, MfuOpt, ModelOpt, SchedulerOpt, ShareTenantsOpt,
                                 TraceArg, parse_path, with_log_options)
from kvtrace.errors import UsageError
from kvtrace.results import present
from kvtrace.units import format_bytes, parse_sizes


class By(str, Enum):
    type = "type"
    tenant = "tenant"
    turn = "turn"
    session_length = "session-length"


def _round_capacities(lo: float, hi: float) -> list[int]:
    """Powers of two in bytes (x1 and x4 steps) between lo and hi, for the terminal table."""
    out = []
    p = 1 << 30
    while p > lo and p > 1:
        p >>= 2
    while p <= hi * 1.0001:
        if p >= lo:
            out.append(p)
        p <<= 2
    return out


@handles_errors
@with_log_options
def curve(
    trace_path: Path = TraceArg,
    model: Optional[str] = ModelOpt,
    kv_bytes_per_token: Optional[int] = KvBytesOpt,
    dtype: Optional[str] = DtypeOpt,
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU preset for compute savings: H100, H200, B200, A100."),
    mfu: Optional[float] = MfuOpt,
    gpu_price: Optional[float] = GpuPriceOpt,
    eviction: Eviction = typer.Option(
        Eviction.prefix_aware, "--eviction", help="prefix-aware (request-atomic, radix-tree-like) or flat (plain "
                                                  "block LRU over the chain stream)."),
    cache_rules: CacheRules = typer.Option(
        CacheRules.ideal, "--cache-rules", help="ideal (kvtrace's request-atomic LRU, one pass, every capacity), "
                                                "vllm or sglang: the engine's own prefix-cache rules, one exact "
                                                "replay per capacity on a thinned grid (what the engine would "
                                                "report)."),
    in_flight: bool = typer.Option(
        False, "--in-flight", help="With --cache-rules vllm or sglang: requests hold their blocks while in "
                                   "flight (--service-time), first come first served; adds waiting and pool-full "
                                   "figures."),
    service_time: str = typer.Option(
        "input/5000 + output/50", "--service-time", help="Seconds a request is in flight, from its input and "
                                                         "output tokens (numbers, + - * /, min, max), or 'trace': "
                                                         "its end_timestamp - timestamp."),
    cache_decode: bool = typer.Option(
        False, "--cache-decode", help="In flight, a request also holds the blocks its output tokens fill."),
    capacity: Optional[str] = typer.Option(
        None, "--capacity", "-c", help="Exact capacities, e.g. 64GiB,1TiB,500GB (default: ~200 log-spaced from one "
                                       "block to all distinct bytes)."),
    points: Optional[int] = typer.Option(
        None, "--points", min=2, max=100000, help="Grid points of the default capacity grid (default 200; 24 pool "
                                                  "sizes with --cache-rules vllm or sglang)."),
    warmup: Optional[str] = typer.Option(
        None, "--warmup", help="Only measure after a warm-up: a fraction of requests (0.1, 10%) or a duration "
                               "(10min)."),
    by: Optional[By] = typer.Option(
        None, "--by", help="Break metrics down by type, tenant, turn or session-length (shared cache)."),
    sample_rate: Optional[float] = typer.Option(
        None, "--sample-rate", help="SHARDS spatial sampling rate in (0, 1): approximate, with an error estimate."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", parser=parse_path, help="Write the curve table: .parquet, .csv or .json."),
    plot: Optional[Path] = typer.Option(
        None, "--plot", parser=parse_path, help="Write a chart: .html (self-contained), .png or .svg."),
    distances_out: Optional[Path] = typer.Option(
        None, "--distances-out", parser=parse_path, help="Write per-access distances (.parquet/.csv/.json) for SQL."),
    json_out: Optional[str] = typer.Option(
        None, "--json", help="Write the curve rows (as --out x.json), ceiling, knees and info as JSON ('-' = stdout "
                             "only)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
    stream: Optional[bool] = typer.Option(
        None, "--stream/--no-stream", help="Read a Parquet trace in chunks, memory bounded by its distinct blocks, "
                                           "same results bit for bit (default: when the in-memory run would exceed "
                                           "half the available memory or $KVTRACE_MEMORY_BUDGET)."),
    engine: Engine = EngineOpt,
    scheduler: Optional[str] = SchedulerOpt,
    workers: Optional[int] = typer.Option(
        None, "--workers", min=1, help="Processes of the local Dask cluster (--engine dask without --scheduler; "
                                       "default 2)."),
    partitions: Optional[int] = typer.Option(
        None, "--partitions", min=1, help="Spatial partitions of a Dask curve (default: the cluster's worker threads, "
                                          "at least 2)."),
) -> None:
    """Capacity-hit curves: what each cache size saves, in requests, tokens, bytes and GPU compute.

    Exact byte-LRU reuse distances (one pass) give hits at every capacity. Prints a
    table at round capacities, the ceiling (infinite cache) and the capacities that
    reach 50/80/90/95/99 % of it.
    """
    from kvtrace.analyses.curves import compute_curve, shared_first_block
    from kvtrace.analyses.distances import distances_table, reuse_distances
    from kvtrace.model import resolve_gpu
    from kvtrace.outputs import write_table

    check_tables(out, distances_out)
    check_suffix(plot, "plot", (".html", ".png", ".svg"), ".html, .png or .svg")
    if sample_rate is not None and not 2.0**-24 <= sample_rate <= 1:
        raise UsageError(f"expected a rate in [2**-24, 1] (the sampling hash resolves 2**-24), got {sample_rate}",
                         field="sample-rate")
    if sample_rate is not None and distances_out is not None and sample_rate < 1:
        raise UsageError("--distances-out needs exact distances: drop --sample-rate", field="distances-out")
    if capacity is not None and not capacity.strip(" ,"):
        raise UsageError("expected sizes such as 64GiB,1TiB, got an empty list (leave --capacity out for the "
                         "default grid)", field="capacity")
    _dask_only(engine, scheduler=scheduler, workers=workers, partitions=partitions)
    if cache_rules == CacheRules.ideal:
        for flag, given in (("in-flight", in_flight), ("cache-decode", cache_decode)):
            if given:
                raise UsageError(f"--{flag} needs an engine's rules (--cache-rules vllm or sglang)", field=flag)
    if cache_rules != CacheRules.ideal:
        for flag, value, given in (("eviction", eviction, eviction != Eviction.prefix_aware),
                                   ("sample-rate", sample_rate, sample_rate is not None),
                                   ("distances-out", distances_out, distances_out is not None),
                                   ("engine", engine, engine == Engine.dask)):
            if given:
                raise UsageError(f"--{flag} applies to the ideal model only (--cache-rules {cache_rules.value} "
                                 "replays the engine's own rules)", field=flag)
    check_paths({"out": out, "plot": plot, "distances-out": distances_out}, {"TRACE": trace_path}, json_out)
    m = kv_model(model, kv_bytes_per_token, dtype)
    g = resolve_gpu(gpu, mfu=mfu, dollars_per_hour=gpu_price)
    caps = parse_sizes(capacity) if capacity else None
    dist = None
    if engine == Engine.dask:
        for flag, value in (("distances-out", distances_out), ("by", by), ("sample-rate", sample_rate)):
            if value is not None:
                raise UsageError(f"--{flag} is not available with --engine dask", field=flag)
        t0 = time.perf_counter()
        result = _curve_on_dask(trace_path, scheduler, workers or 2, partitions, fmt, block_tokens, share_tenants,
                                model=m, gpu=g, eviction=eviction.value, capacities=caps, points=points or 200,
                                warmup=warmup)
    else:
        trace = _open_curve_trace(trace_path, fmt, block_tokens, share_tenants, stream, by, distances_out,
                                  in_flight and cache_rules != CacheRules.ideal, service_time.strip() == "trace")
        with trace:  # a streamed trace's close removes its spill files
            t0 = time.perf_counter()
            display_caps = None
            if caps is None:
                display_caps = _round_capacities(trace.meta.block_tokens * m.kv_bytes_per_token,
                                                 int(trace.block_size.sum()) * m.kv_bytes_per_token) or None
            with progress() as prog:
                task = prog.add_task("reuse distances", total=max(trace.n_accesses, 1))
                cb = lambda done, total: prog.update(task, completed=done, total=total)  # noqa: E731
                if distances_out is not None:
                    dist = reuse_distances(trace, eviction.value, details=True, progress=cb)
                if cache_rules != CacheRules.ideal:
                    from kvtrace.analyses.engine import ENGINE_POINTS, engine_curve

                    prog.update(task, description=f"{cache_rules.value} replays")
                    result = engine_curve(trace, cache_rules.value, model=m, gpu=g, capacities=caps,
                                          points=points or ENGINE_POINTS, warmup=warmup,
                                          by=by.value if by else None, in_flight=in_flight,
                                          service_time=service_time, cache_decode=cache_decode, progress=cb)
                else:
                    result = compute_curve(
                        trace, model=m, gpu=g, eviction=eviction.value, capacities=caps,
                        display_capacities=display_caps, points=points or 200, warmup=warmup,
                        by=by.value if by else None, sample_rate=sample_rate, distances=dist, progress=cb,
                    )
                result.info["shared_first_block"] = shared_first_block(trace, result.info["first_measured_request"])
    display = result.display if result.display is not None else result.curve
    elapsed = time.perf_counter() - t0

    meta = {"info": result.info, "ceiling": result.ceiling, "knees": result.knees.to_dicts()}
    table = present.curve_table(result)
    document = {**meta, "rows": table.to_dicts()} if json_out else None  # the rows of --out x.json, and the rest
    if json_out == "-":
        write_json("-", document)
    else:
        _render_curve(trace_path, result, display, elapsed)
    if out is not None:
        write_table(table, out, metadata=meta)
    if plot is not None:
        from kvtrace.results.charts import curve_chart, save_chart

        save_chart(curve_chart(result), plot)
    if distances_out is not None:
        write_table(distances_table(trace, dist, m.kv_bytes_per_token), distances_out,
                    metadata={"eviction": dist.eviction, "kv_bytes_per_token": m.kv_bytes_per_token,
                              "cold": "inf", "model": m.name})
    if json_out and json_out != "-":
        write_json(json_out, document)
    report_written((("curve", out), ("plot", plot), ("distances", distances_out), ("json", json_out)))


def _dask_only(engine: "Engine", **given) -> None:
    """Options that only a Dask run reads are usage errors without ``--engine dask``
    (rather than silently ignored)."""
    if engine == Engine.dask:
        return
    for name, value in given.items():
        if value is not None:
            raise UsageError(f"--{name} applies only with --engine dask", field=name)


def _open_curve_trace(trace_path: Path, fmt: Fmt, block_tokens: Optional[int], share_tenants: bool,
                      stream: Optional[bool], by, distances_out, in_flight: bool = False, end_times: bool = False):
    """The trace in memory, or scanned in chunks (kvtrace.ingest.stream) when it should
    stream (requests in flight keep the request columns their service times read)."""
    from kvtrace.ingest.stream import should_stream

    if not should_stream(trace_path, fmt.value, stream):
        return load(trace_path, fmt, block_tokens, share_tenants,
                    workload="curve-distances" if distances_out is not None else "curve")
    if distances_out is not None:
        raise UsageError("--distances-out writes every access: not available on a streamed trace (--no-stream)",
                         field="distances-out")
    keep = {"type": ("type",), "tenant": ("tenant",), "turn": ("turn",),
            "session-length": ("session_id",)}.get(by.value if by else "", ())
    if in_flight:
        keep = (*keep, "input_tokens", "output_tokens", *(("end_timestamp",) if end_times else ()))
    return scan_streamed(trace_path, fmt, block_tokens, share_tenants, keep)


def _curve_on_dask(trace_path: Path, scheduler: Optional[str], workers: int, partitions: Optional[int], fmt: Fmt,
                   block_tokens: Optional[int], share_tenants: bool, **options):
    """A partitioned-estimate curve on a Dask cluster (kvtrace.analyses.distributed)."""
    from kvtrace.analyses.distributed import dask_client, partitioned_curve

    bpt = options["model"].kv_bytes_per_token
    if options.get("capacities") is None:
        options["display_capacities"] = lambda b, total: _round_capacities(b * bpt, total * bpt) or None
    with dask_client(scheduler, workers) as client, progress() as prog:
        task = prog.add_task("partitions (dask)", total=1)
        result = partitioned_curve(trace_path, client=client, partitions=partitions, fmt=fmt.value,
                                   block_tokens=block_tokens, share_tenants=share_tenants,
                                   progress=lambda d, t: prog.update(task, completed=d, total=t), **options)
    for w in result.info.get("warnings", []):
        warn(trace_path, w)
    return result


def _render_curve(trace_path: Path, result, display, elapsed: float) -> None:
    info = result.info
    rules = info.get("cache_rules")
    title = (f"{trace_path.name}: {info['model']} ({info['kv_bytes_per_token']:,} B/token), "
             + (f"{rules} cache rules, {info['grid']}" if rules else f"{info['eviction']} LRU"))
    if result.approximate:
        err = info["error_estimate"]
        pts = lambda x: "-" if x is None else f"{100 * x:.2f}"  # noqa: E731  (None: too few sampled accesses)
        title += (f"\nAPPROXIMATE: SHARDS sample rate {info['sample_rate']:g}, est. standard error of the "
                  f"usable-prefix token rate: mean {pts(err['mean_standard_error'])} pts, "
                  f"max {pts(err['max_standard_error'])} pts; half-prefix requests: exact runs only")
    part = info.get("partitioned")
    if part:
        title += (f"\nPARTITIONED ESTIMATE: {part['partitions']} spatial partitions on Dask; error bound of the "
                  "usable-prefix token rate (3-sigma capacity band, estimated): "
                  f"max {100 * part['max_error_bound']:.2f} "
                  f"pts, mean {100 * part['mean_error_bound']:.2f} pts; half-prefix requests: exact runs only")
    t = Table(title=title)
    engine_rate = "engine_prefix_token_hit_rate" in display.columns
    cols = ("request_hit_rate", "request_half_prefix_hit_rate", "prefix_token_hit_rate",
            *(("engine_prefix_token_hit_rate",) if engine_rate else ()), "token_hit_rate",
            "compute_saved_rate", "gpu_seconds_saved_per_hour", "usd_saved_per_hour", "read_mean_bytes_per_s")
    for head in ("capacity", *map(names.label, cols)):
        t.add_column(head, justify="right")
    for r in display.iter_rows(named=True):
        t.add_row(
            format_bytes(r["capacity_bytes"]), present.rate(r["request_hit_rate"]),
            present.rate(r["request_half_prefix_hit_rate"]), present.rate(r["prefix_token_hit_rate"]),
            *((present.rate(r["engine_prefix_token_hit_rate"]),) if engine_rate else ()),
            present.rate(r["token_hit_rate"]), present.rate(r["compute_saved_rate"]),
            "-" if r["gpu_seconds_saved_per_hour"] is None else f"{r['gpu_seconds_saved_per_hour']:,.1f}",
            present.plain_dollars(r["usd_saved_per_hour"]), present.bandwidth(r["read_mean_bytes_per_s"]),
        )
    c = result.ceiling
    t.add_row(f"∞ ({format_bytes(c['capacity_bytes'])})", present.rate(c["request_hit_rate"]),
              present.rate(c["request_half_prefix_hit_rate"]), present.rate(c["prefix_token_hit_rate"]),
              *((present.rate(c["prefix_token_hit_rate"]),) if engine_rate else ()),
              present.rate(c["token_hit_rate"]),
              present.rate(c["compute_saved_rate"]), "", "", "", style="bold")
    console.print(t)
    knees = present.knee_table(result.knees)
    k = Table(title="capacity needed to reach a share of the ceiling (knee)")
    for c in knees.columns:
        k.add_column(present.KNEE_HEADS.get(c, c), justify="right")
    for row in knees.iter_rows():
        k.add_row(*row)
    console.print(k)
    if result.by_group is not None:
        _render_groups(result)
    shared = info.get("shared_first_block")
    if shared:
        who = ("every request starts" if shared["share"] == 1 else
               f"{min(100 * shared['share'], 99.99):.2f}% of the requests start")
        console.print(f"note: {who} with the same block (hash "
                      f"{shared['hash']}): the request hit rate is about that at every capacity that holds one block "
                      "and says nothing about sizing; read the usable-prefix token rate (prefix tokens) and the "
                      "share of requests whose usable prefix covers at least half their prompt (half-prefix "
                      "requests)",
                      markup=False, soft_wrap=True)
    if rules and info.get("in_flight"):
        st = info["in_flight"]["service_time"]
        w = Table(title="requests in flight (" + ("end_timestamp - timestamp each" if st.strip() == "trace" else
                                                 f"{st} s each")
                        + (", output blocks held" if info["in_flight"]["cache_decode"] else "") + ")")
        for head in ("capacity", "mean wait", "p99 wait", "pool full"):
            w.add_column(head, justify="right")
        for r in result.curve.iter_rows(named=True):
            w.add_row(format_bytes(r["capacity_bytes"]), present.seconds(r["wait_mean_s"]),
                      present.seconds(r["wait_p99_s"]), present.rate(r["pool_full_share"]))
        console.print(w)
    if rules:
        rejected = [x for x in result.curve["rejected_request_share"].to_list() if x]
        console.print(f"rules applied: {info['cache_rules_text']}. \"engine's own rate\" is what the engine's "
                      "prefix-cache counter reports (vLLM's num_cached_tokens over the prompt tokens of the "
                      "requests it admitted); knees at the grid's resolution"
                      + (f"; up to {100 * max(rejected):.2f}% of the requests are rejected as larger than the pool "
                         "(misses in every other column)" if rejected else ""), markup=False, soft_wrap=True)
    console.print(f"[dim]{info['measured_accesses']:,} accesses measured"
                  f"{' after warm-up' if info['warmup'] else ''}, {info['distinct_blocks']:,} distinct blocks "
                  f"({format_bytes(info['distinct_bytes'])}); computed in {elapsed:.2f} s[/dim]")


def _render_groups(result) -> None:
    gs = result.group_summary
    cap = gs["capacity_bytes"][0] if gs is not None and gs.height else None
    if cap is None:
        where = "(the overall ceiling is zero: no knee)"
    elif gs["at_knee"][0]:
        where = f"at {format_bytes(cap)}, the capacity reaching 80% of the overall ceiling"
    else:
        where = (f"at {format_bytes(cap)}, the largest capacity of the grid not above the knee reaching 80% of the "
                 "overall ceiling")
    t = Table(title=f"by {result.info['by']} (shared cache; {where})")
    for c in ("group", "requests", "prefix tokens", "compute saved", "ceiling (prefix tokens)"):
        t.add_column(c, justify="left" if c == "group" else "right")
    for r in gs.iter_rows(named=True):
        t.add_row(r["group_name"], present.rate(r["request_hit_rate"]), present.rate(r["prefix_token_hit_rate"]),
                  present.rate(r["compute_saved_rate"]), present.rate(r["ceiling_prefix_token_hit_rate"]))
    console.print(t)
