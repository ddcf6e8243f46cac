"""``kvtrace load``: time to first token as traffic grows, with the links, flash and
GPUs as queues (:mod:`kvtrace.analyses.load`)."""

from __future__ import annotations

import time
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kvtrace.cli.console import console, progress, report_written, write_json
from kvtrace.cli.errors import handles_errors
from kvtrace.cli.inputs import check_paths, check_suffix, check_tables, kv_model, load as load_input, scan_streamed
from kvtrace.cli.options import (BlockTokensOpt, CacheRules, DtypeOpt, Eviction, Fmt, FormatOpt, GpuPriceOpt,
                                 KvBytesOpt, LibraryDefault, MfuOpt, ModelOpt, ShareTenantsOpt, TierCacheRulesOpt,
                                 TraceArg, parse_path, with_log_options)
from kvtrace.cli.whatif import (DramGbpsOpt, DramLatencyOpt, DramOpt, EvictionOpt, FlashGbpsOpt, FlashLatencyOpt,
                                FlashOpt, FlashOrder, FlashOrderOpt, GridOpt, InclusiveOpt, LocalSsdOpt, OverheadOpt,
                                PolicyOpt, Promotion, PromotionOpt, Routing, RoutingOpt, StreamOpt, WarmupOpt,
                                WriteMode, WriteModeOpt, comma_list)
from kvtrace.errors import UsageError
from kvtrace.results import present


def _load_default(field: str) -> LibraryDefault:
    return LibraryDefault("kvtrace.analyses.load.model", "LoadModel", field=field)


class Discipline(str, Enum):
    fcfs = "fcfs"
    ps = "ps"


@handles_errors
@with_log_options
def load(
    trace_path: Path = TraceArg,
    dram: str = DramOpt,
    flash: str = FlashOpt,
    local_ssd: str = LocalSsdOpt,
    policy: str = PolicyOpt,
    grid: bool = GridOpt,
    load_levels: Optional[str] = typer.Option(
        None, "--load", help="Load factors: arrival times divided by each, e.g. 0.5x,1x,2x,4x (default 1x)."),
    rps: Optional[str] = typer.Option(None, "--rps", help="Target arrival rates instead, e.g. 50,100,200."),
    slo_ttft_ms: float = typer.Option(
        _load_default("slo_ttft_ms"), "--slo-ttft", help="TTFT a request must meet for the goodput, ms."),
    gpus_per_node: int = typer.Option(
        _load_default("gpus_per_node"), "--gpus-per-node", min=0, help="Prefill GPUs per node."),
    prefill_tokens_per_s: Optional[float] = typer.Option(
        None, "--prefill-tokens-per-s", help="Measured prefill tokens/s of one GPU (default: FLOPs / (peak x MFU))."),
    prefill_batch_tokens: Optional[int] = typer.Option(
        None, "--prefill-batch-tokens", min=1, help="Batch prefills on a GPU up to this many tokens."),
    prefill_pass_ms: float = typer.Option(0.0, "--prefill-pass-ms", help="Fixed time of every GPU pass, ms."),
    host_link_gbps: Optional[float] = typer.Option(
        None, "--host-link-gbps", help="Host-to-GPU link per node, GB/s (default: --dram-gbps)."),
    nic_gbps: float = typer.Option(_load_default("nic_gbps"), "--nic-gbps", help="NIC per node, GB/s."),
    local_ssd_gbps: float = typer.Option(
        _load_default("local_ssd_gbps"), "--local-ssd-gbps", help="Local SSD per node, GB/s."),
    flash_pool_gbps: float = typer.Option(
        _load_default("flash_pool_gbps"), "--flash-pool-gbps", help="Shared flash pool, aggregate GB/s."),
    flash_iops: float = typer.Option(
        _load_default("flash_iops"), "--flash-iops", help="Shared flash pool, reads per second."),
    flash_targets: int = typer.Option(1, "--flash-targets", min=1, max=4096,
                                      help="Flash targets; a block is on the one its hash selects."),
    uplink_gbps: Optional[float] = typer.Option(None, "--uplink-gbps", help="Rack uplink, GB/s (default: none)."),
    flash_write_gbps: Optional[float] = typer.Option(
        None, "--flash-write-gbps", help="Write budget of background flash writes, GB/s (default: none)."),
    link_discipline: Discipline = typer.Option(Discipline.fcfs, "--link-discipline",
                                               help="Links: fcfs or ps (processor sharing)."),
    overlap: float = typer.Option(0.0, "--overlap", min=0.0, max=1.0,
                                  help="Share of the prefill that may run during the restore (layer-wise load)."),
    route_ms: float = typer.Option(0.0, "--route-ms", help="Routing/queueing overhead per request, ms."),
    decode_ms: float = typer.Option(0.0, "--decode-ms", help="First decode step, ms."),
    max_wait: float = typer.Option(
        _load_default("max_wait_s"), "--max-wait", help="A queue wait past this (s) declares overload."),
    nodes: int = typer.Option(1, "--nodes", min=1, max=64, help="Nodes, each with its own DRAM and GPUs."),
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
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU preset for prefill time."),
    mfu: Optional[float] = MfuOpt,
    gpu_price: Optional[float] = GpuPriceOpt,
    dram_gbps: float = DramGbpsOpt,
    dram_latency_ms: float = DramLatencyOpt,
    flash_gbps: float = FlashGbpsOpt,
    flash_latency_ms: float = FlashLatencyOpt,
    overhead_ms: float = OverheadOpt,
    out: Optional[Path] = typer.Option(None, "--out", "-o", parser=parse_path,
                                       help="Write the load table (.parquet/.csv/.json)."),
    resources_out: Optional[Path] = typer.Option(
        None, "--resources-out", parser=parse_path, help="Write the per-resource table (.parquet/.csv/.json)."),
    plot: Optional[Path] = typer.Option(None, "--plot", parser=parse_path,
                                        help="Load curve: TTFT p50/p99 and goodput vs arrival rate (.html/.png/.svg)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the result as JSON ('-' = stdout only)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
) -> None:
    """Under load: TTFT percentiles, goodput and the saturating resource as traffic grows.

    Exact discrete-event simulation over the tier replay: requests arrive at the
    trace's times compressed by each load factor; GPUs, host links, NICs, local SSDs,
    flash targets and the uplink are queues; each request restores or recomputes its
    flash prefix by the queue state.
    """
    from kvtrace.analyses.load import LoadModel, load_curve, parse_levels
    from kvtrace.analyses.response import ResponseModel
    from kvtrace.analyses.whatif import config_grid, trace_needs
    from kvtrace.ingest.stream import should_stream
    from kvtrace.model import resolve_gpu

    check_tables(out)
    check_tables(resources_out)
    check_suffix(plot, "plot", (".html", ".png", ".svg"), ".html, .png or .svg")
    drams, flashes, policies = (comma_list(v, name, example) for v, name, example in (
        (dram, "dram", "256GiB"), (flash, "flash", "8TiB or 0"), (policy, "policy", "all,second-hit")))
    if not grid and (len(drams) > 1 or len(flashes) > 1):
        raise UsageError("several --dram or --flash sizes need --grid", field="grid")
    check_paths({"out": out, "resources-out": resources_out, "plot": plot}, {"TRACE": trace_path}, json_out)
    if not slo_ttft_ms >= 0:
        raise UsageError(f"expected a time >= 0 ms, got {slo_ttft_ms:g}", field="slo-ttft")
    load_model = LoadModel.in_units(
        gpus_per_node=gpus_per_node, prefill_tokens_per_s=prefill_tokens_per_s, host_link_gbps=host_link_gbps,
        nic_gbps=nic_gbps, local_ssd_gbps=local_ssd_gbps, flash_pool_gbps=flash_pool_gbps, flash_iops=flash_iops,
        flash_targets=flash_targets, uplink_gbps=uplink_gbps, flash_write_gbps=flash_write_gbps, route_ms=route_ms,
        decode_ms=decode_ms, overlap=overlap, link_discipline=link_discipline.value,
        prefill_batch_tokens=prefill_batch_tokens, prefill_pass_ms=prefill_pass_ms, slo_ttft_s=slo_ttft_ms / 1e3,
        max_wait_s=max_wait)
    configs = config_grid(drams, flashes, policies, unique=False, local_ssd_bytes=local_ssd, nodes=nodes,
                          routing=routing.value, flash_order=flash_order.value, promotion=promotion.value,
                          write_mode=write_mode.value, inclusive=inclusive)
    m = kv_model(model, kv_bytes_per_token, dtype)
    g = resolve_gpu(gpu, mfu=mfu, dollars_per_hour=gpu_price)
    response = ResponseModel.in_units(dram_gbps=dram_gbps, dram_latency_ms=dram_latency_ms, flash_gbps=flash_gbps,
                                      flash_latency_ms=flash_latency_ms, overhead_ms=overhead_ms,
                                      recompute_flops_per_s=g.effective_flops)
    if load_levels is not None and rps is not None:
        raise UsageError("give --load or --rps, not both", field="load")
    if rps is None:
        levels = parse_levels(load_levels, None, None)  # checked before the trace is read
    if should_stream(trace_path, fmt.value, stream):
        columns, hashes = trace_needs(configs)
        trace = scan_streamed(trace_path, fmt, block_tokens, share_tenants, columns)
        if not hashes:
            trace.block_hash = trace.block_tenant = None
    else:
        trace = load_input(trace_path, fmt, block_tokens, share_tenants, workload="whatif")
    with trace:
        if rps is not None:
            levels = parse_levels(None, rps, _base_rps(trace, warmup))
        values = None
        if any(c.parsed_policy.kind == "value" for c in configs):
            from kvtrace.analyses.value import access_values

            values = access_values(trace, model=m, gpu=g)
        t0 = time.perf_counter()
        with progress() as prog:
            task = prog.add_task("replays and load levels", total=len(configs) * (len(levels) + 1))
            result = load_curve(trace, configs, levels, load_model, model=m, gpu=g, response=response,
                                eviction=eviction.value, cache_rules=cache_rules.value, warmup=warmup, values=values,
                                progress=lambda d, t: prog.update(task, completed=d, total=t))
        elapsed = time.perf_counter() - t0
    doc = result.to_dict()
    if json_out == "-":
        write_json("-", doc)
    else:
        _render(trace_path, result, elapsed)
    from kvtrace.outputs import write_table

    meta = {"model": m.name, "kv_bytes_per_token": m.kv_bytes_per_token, "assumptions": result.info["assumptions"]}
    if out is not None:
        write_table(result.table, out, metadata=meta)
    if resources_out is not None:
        write_table(result.resources, resources_out, metadata=meta)
    if plot is not None:
        from kvtrace.results.charts import load_chart, save_chart

        save_chart(load_chart(result.table), plot)
    if json_out and json_out != "-":
        write_json(json_out, doc)
    report_written((("table", out), ("resources", resources_out), ("plot", plot), ("json", json_out)))


def _base_rps(trace, warmup) -> float | None:
    """The trace's measured arrival rate (requests over the measured span)."""
    from kvtrace.analyses.curves import parse_warmup, warmup_first_request

    first = warmup_first_request(trace, parse_warmup(warmup))
    ts = trace.request_timestamp
    n = trace.n_requests - first
    span = float(ts[-1] - ts[first]) if n > 1 else 0.0
    return n / span if span > 0 else None


def _render(trace_path: Path, result, elapsed: float) -> None:
    table = result.table
    t = Table(title=f"{trace_path.name}: TTFT under load (SLO {table['slo_ttft_ms'][0]:g} ms)")
    for h in present.LOAD_HEADS:
        t.add_column(h, justify="left" if h in ("config", "bottleneck") else "right")
    for row in present.load_rows(table):
        t.add_row(*row)
    console.print(t)
    for line in present.load_notes(table):
        console.print(line, markup=False, soft_wrap=True)
    console.print(f"assumed: {result.info['assumptions']}", style="dim", markup=False, soft_wrap=True)
    console.print(f"cache rules: {result.info['cache_rules_text']}", style="dim", markup=False, soft_wrap=True)
    console.print(f"{table.height} level(s) in {elapsed:.2f} s", style="dim", markup=False)
