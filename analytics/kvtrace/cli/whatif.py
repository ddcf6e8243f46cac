"""``kvtrace whatif``: tier what-ifs, exact event simulations of DRAM over local SSD or
shared flash."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kvtrace.cli.console import console, progress, report_written, warn, write_json
from kvtrace.cli.errors import handles_errors
from kvtrace.cli.inputs import check_paths, check_suffix, check_tables, kv_model, load, scan_streamed
from kvtrace.cli.options import (BlockTokensOpt, CacheRules, DtypeOpt, Engine, EngineOpt, Eviction, Fmt, FormatOpt,
                                 GpuPriceOpt, HorizonDefault, KvBytesOpt, LibraryDefault, MfuOpt, ModelOpt,
                                 SchedulerOpt, ShareTenantsOpt, TierCacheRulesOpt, TraceArg, parse_path,
                                 with_log_options)
from kvtrace.errors import UsageError
from kvtrace.results import present


def _response_default(field: str) -> LibraryDefault:
    """A default of kvtrace.analyses.response.ResponseModel, in the option's unit (its property)."""
    return LibraryDefault("kvtrace.analyses.response", "ResponseModel", field=field)


_DRAM_GBPS, _DRAM_MS, _FLASH_GBPS, _FLASH_MS, _OVERHEAD_MS = map(
    _response_default, ("dram_gbps", "dram_latency_ms", "flash_gbps", "flash_latency_ms", "overhead_ms"))


class Promotion(str, Enum):
    promote = "promote"
    copy = "copy"
    none = "none"


class WriteMode(str, Enum):
    on_evict = "write-on-evict"
    through = "write-through"


class Routing(str, Enum):
    session = "session"
    round_robin = "round-robin"
    prefix = "prefix"


class FlashOrder(str, Enum):
    lru = "lru"
    fifo = "fifo"


# Options shared with ``kvtrace load`` (one definition each).
DramOpt = typer.Option(..., "--dram", help="DRAM per node, e.g. 256GiB (a comma list with --grid).")
FlashOpt = typer.Option("0", "--flash", help="Shared flash pool, e.g. 8TiB (a comma list with --grid; 0 = none).")
LocalSsdOpt = typer.Option("0", "--local-ssd", help="Local SSD per node (0 = none).")
PolicyOpt = typer.Option(
    "all", "--policy", help="Flash admission, comma-separated: all, none, second-hit, freq>=k, prob:p, idle<T, "
                            "value>=v, reuse-oracle, tinylfu, group:type>=p.")
GridOpt = typer.Option(False, "--grid", help="Sweep every (DRAM, flash) pair of the --dram and --flash lists.")
RoutingOpt = typer.Option(Routing.session, "--routing", help="Request routing across nodes.")
PromotionOpt = typer.Option(Promotion.promote, "--promotion", help="On a flash hit: promote, copy or none.")
WriteModeOpt = typer.Option(WriteMode.on_evict, "--write-mode", help="write-on-evict or write-through.")
InclusiveOpt = typer.Option(False, "--inclusive", help="Allow a block in two tiers (copy, write-through).")
FlashOrderOpt = typer.Option(FlashOrder.lru, "--flash-order", help="Flash replacement: lru or fifo (log-structured).")
EvictionOpt = typer.Option(Eviction.prefix_aware, "--eviction", help="LRU model, as for kvtrace curve.")
StreamOpt = typer.Option(
    None, "--stream/--no-stream", help="Replay a Parquet trace chunk by chunk from a spill file, memory bounded "
                                       "by its distinct blocks and requests, same results bit for bit (default: "
                                       "when an in-memory run would exceed half the available memory or "
                                       "$KVTRACE_MEMORY_BUDGET).")
WarmupOpt = typer.Option(None, "--warmup", help="Only measure after a warm-up (fraction or duration).")
DramGbpsOpt = typer.Option(_DRAM_GBPS, "--dram-gbps", help="DRAM restore bandwidth, GB/s (illustrative default).")
DramLatencyOpt = typer.Option(_DRAM_MS, "--dram-latency-ms", help="DRAM restore fixed latency, ms.")
FlashGbpsOpt = typer.Option(_FLASH_GBPS, "--flash-gbps",
                            help="Flash restore bandwidth of one request, GB/s (illustrative default).")
FlashLatencyOpt = typer.Option(_FLASH_MS, "--flash-latency-ms", help="Flash restore fixed latency, ms.")
OverheadOpt = typer.Option(_OVERHEAD_MS, "--overhead-ms", help="Per-request overhead of having a flash tier, ms.")


@handles_errors
@with_log_options
def whatif(
    trace_path: Path = TraceArg,
    dram: str = DramOpt,
    flash: str = FlashOpt,
    local_ssd: str = LocalSsdOpt,
    policy: str = PolicyOpt,
    grid: bool = GridOpt,
    compare_local: bool = typer.Option(
        False, "--compare-local", help="Also run the same flash as a local SSD per node vs one shared pool (needs "
                                       "--nodes > 1 and --local-ssd)."),
    nodes: int = typer.Option(1, "--nodes", min=1, max=64, help="Nodes, each with its own DRAM (and local SSD)."),
    routing: Routing = RoutingOpt,
    promotion: Promotion = PromotionOpt,
    write_mode: WriteMode = WriteModeOpt,
    inclusive: bool = InclusiveOpt,
    flash_order: FlashOrder = FlashOrderOpt,
    eviction: Eviction = EvictionOpt,
    cache_rules: CacheRules = TierCacheRulesOpt,
    stream: Optional[bool] = StreamOpt,
    warmup: Optional[str] = WarmupOpt,
    model: Optional[str] = ModelOpt,
    kv_bytes_per_token: Optional[int] = KvBytesOpt,
    dtype: Optional[str] = DtypeOpt,
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU preset for recompute time and savings."),
    mfu: Optional[float] = MfuOpt,
    gpu_price: Optional[float] = GpuPriceOpt,
    dram_gbps: float = DramGbpsOpt,
    dram_latency_ms: float = DramLatencyOpt,
    flash_gbps: float = FlashGbpsOpt,
    flash_latency_ms: float = FlashLatencyOpt,
    overhead_ms: float = OverheadOpt,
    horizon: str = typer.Option(
        HorizonDefault, "--horizon", help="Horizon of the value kernel for value>=v policies."),
    workers: Optional[int] = typer.Option(
        None, "--workers", min=1, help="Processes for several configurations (default: by the estimated work, serial "
                                       "when starting workers costs more than it saves; with --engine dask: the local "
                                       "cluster's workers, default 2)."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", parser=parse_path, help="Write the comparison table (.parquet/.csv/.json)."),
    plot: Optional[Path] = typer.Option(
        None, "--plot", parser=parse_path, help="Frontier chart: flash hit share vs flash bytes written "
                                                "(.html/.png/.svg)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the comparison as JSON ('-' = stdout only)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
    engine: Engine = EngineOpt,
    scheduler: Optional[str] = SchedulerOpt,
) -> None:
    """Tier what-ifs: DRAM over local SSD / shared flash, admission policies, nodes.

    Exact event simulation under the same LRU model as the curve: hit shares by tier
    (unconditional), flash writes and DWPD, read bandwidth (mean and peak), promotions,
    value captured, residency, and reusable-prefix service-time percentiles.
    """
    from kvtrace.analyses.response import ResponseModel
    from kvtrace.analyses.whatif import config_grid, has_session_ids, local_vs_shared, trace_needs
    from kvtrace.ingest.stream import should_stream
    from kvtrace.model import resolve_gpu

    check_tables(out)
    check_suffix(plot, "plot", (".html", ".png", ".svg"), ".html, .png or .svg")
    drams, flashes, policies = (comma_list(v, name, example) for v, name, example in (
        (dram, "dram", "256GiB"), (flash, "flash", "8TiB or 0"), (policy, "policy", "all,second-hit")))
    if not grid and (len(drams) > 1 or len(flashes) > 1):
        raise UsageError("several --dram or --flash sizes need --grid", field="grid")
    if engine != Engine.dask and scheduler is not None:
        raise UsageError("--scheduler applies only with --engine dask", field="scheduler")
    check_paths({"out": out, "plot": plot}, {"TRACE": trace_path}, json_out)
    common = dict(local_ssd_bytes=local_ssd, nodes=nodes, routing=routing.value, flash_order=flash_order.value,
                  promotion=promotion.value, write_mode=write_mode.value, inclusive=inclusive)
    configs = config_grid(drams, flashes, policies, unique=False, **common)
    if compare_local:
        if nodes < 2 or local_ssd in ("0", ""):
            raise UsageError("--compare-local needs --nodes > 1 and --local-ssd SIZE", field="compare-local")
        extra = {k: v for k, v in common.items() if k not in ("local_ssd_bytes", "nodes")}
        for d in drams:
            for p in policies:
                configs += local_vs_shared(d, local_ssd, nodes, policy=p, **extra)
    m = kv_model(model, kv_bytes_per_token, dtype)
    g = resolve_gpu(gpu, mfu=mfu, dollars_per_hour=gpu_price)
    response = ResponseModel.in_units(dram_gbps=dram_gbps, dram_latency_ms=dram_latency_ms, flash_gbps=flash_gbps,
                                      flash_latency_ms=flash_latency_ms, overhead_ms=overhead_ms,
                                      recompute_flops_per_s=g.effective_flops)
    parallel = engine != Engine.dask and min(workers or 2, len(configs)) > 1  # the guard's worst case
    if engine == Engine.dask and stream:
        raise UsageError("--engine dask ships the trace to the workers: not with --stream", field="stream")
    streamed = engine != Engine.dask and should_stream(trace_path, fmt.value, stream)
    if streamed:  # keep only what the configurations read
        columns, hashes = trace_needs(configs)
        trace = scan_streamed(trace_path, fmt, block_tokens, share_tenants, columns)
        if not hashes:
            trace.block_hash = trace.block_tenant = None
    else:
        trace = load(trace_path, fmt, block_tokens, share_tenants,
                     workload="whatif-parallel" if parallel else "whatif")
    with trace:  # a streamed trace's close removes its spill files
        if any(c.nodes > 1 and c.routing == "session" for c in configs) and not has_session_ids(trace):
            warn(trace_path, "--routing session: the trace has no session ids, so each request is routed by a hash "
                 "of its own id (a session's turns land on any node, as with random routing); --routing prefix "
                 "keeps requests that share a first block on one node")
        _whatif_run(trace_path, trace, configs, m, g, response, horizon, eviction, cache_rules.value, warmup,
                    workers, engine, scheduler, out, plot, json_out)


def comma_list(text: str, name: str, example: str) -> list[str]:
    """The items of a comma-separated option; none at all is a usage error."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise UsageError(f"expected one or more values such as {example}, got '{text}'", field=name)
    return items


def _whatif_run(trace_path, trace, configs, m, g, response, horizon, eviction, cache_rules, warmup, workers, engine,
                scheduler, out, plot, json_out) -> None:
    from kvtrace.analyses.whatif import TIER_RULE_TEXT, sweep
    from kvtrace.outputs import write_table

    values = None
    if any(c.parsed_policy.kind == "value" for c in configs):
        from kvtrace.analyses.value import access_values, parse_horizon

        values = access_values(trace, model=m, gpu=g, horizon_s=parse_horizon(horizon))
    t0 = time.perf_counter()
    if engine == Engine.dask:  # one configuration per task; the table equals a one-process sweep
        from kvtrace.analyses.distributed import dask_client
        from kvtrace.analyses.distributed import sweep as dask_sweep

        how = "on Dask"
        with dask_client(scheduler, workers or 2) as client, progress() as prog:
            task = prog.add_task("configurations (dask)", total=len(configs))
            table = dask_sweep(trace, configs, client=client, model=m, gpu=g, response=response,
                               eviction=eviction.value, cache_rules=cache_rules, values=values, warmup=warmup,
                               progress=lambda d, t: prog.update(task, completed=d, total=t))
    else:
        from kvtrace.analyses.whatif import plan_workers

        n_workers, how = plan_workers(len(configs), trace.n_accesses, workers)
        with progress() as prog:
            task = prog.add_task("configurations", total=len(configs))
            table = sweep(trace, configs, model=m, gpu=g, response=response, eviction=eviction.value,
                          cache_rules=cache_rules, values=values, warmup=warmup, workers=n_workers,
                          progress=lambda d, t: prog.update(task, completed=d, total=t))
    elapsed = time.perf_counter() - t0
    if json_out == "-":
        write_json("-", {"configs": table.to_dicts()})
    else:
        _render_whatif(trace_path, table, elapsed, len(configs), how, TIER_RULE_TEXT[cache_rules])
    if out is not None:
        write_table(table, out, metadata={"model": m.name, "kv_bytes_per_token": m.kv_bytes_per_token,
                                          "eviction": eviction.value, "cache_rules": cache_rules})
    if plot is not None:
        from kvtrace.results.charts import frontier_chart, save_chart

        save_chart(frontier_chart(table), plot)
    if json_out and json_out != "-":
        write_json(json_out, {"configs": table.to_dicts()})
    report_written((("table", out), ("plot", plot), ("json", json_out)))


def _render_whatif(trace_path: Path, table, elapsed: float, n: int, how: str = "", rules: str = "") -> None:
    t = Table(title=f"{trace_path.name}: tier what-ifs (usable-prefix token shares, unconditional)")
    for h in present.WHATIF_HEADS:
        t.add_column(h, justify="left" if h in ("config", "tiers") else "right")
    for row in present.whatif_rows(table):
        t.add_row(*row)
    console.print(t)
    if rules:
        console.print(f"cache rules: {rules}", style="dim", markup=False, soft_wrap=True)
    console.print(f"{n} configuration(s) in {elapsed:.2f} s" + (f", {how}" if how else ""), style="dim",
                  markup=False, soft_wrap=True)
