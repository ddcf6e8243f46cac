"""``kvtrace value``: the future-reuse value of keeping each block."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kvtrace.cli.console import console, progress, report_written, write_json
from kvtrace.cli.errors import handles_errors
from kvtrace.cli.inputs import check_paths, check_tables, kv_model, open_trace, storage_costs
from kvtrace.cli.options import (BlockTokensOpt, DtypeOpt, Fmt, FormatOpt, GpuPriceOpt, HorizonDefault, KvBytesOpt,
                                 MfuOpt, ModelOpt, ShareTenantsOpt, TraceArg, parse_path, with_log_options)
from kvtrace.results import present
from kvtrace.units import format_bytes, format_seconds


@handles_errors
@with_log_options
def value(
    trace_path: Path = TraceArg,
    model: Optional[str] = ModelOpt,
    kv_bytes_per_token: Optional[int] = KvBytesOpt,
    dtype: Optional[str] = DtypeOpt,
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU preset that prices the compute a reuse avoids."),
    mfu: Optional[float] = MfuOpt,
    gpu_price: Optional[float] = GpuPriceOpt,
    horizon: str = typer.Option(
        HorizonDefault, "--horizon", help="Count reuses up to this far ahead: 90s, 10min, 2h or inf."),
    write_cost: Optional[float] = typer.Option(
        None, "--write-cost", help="$ per TB written to the tier (default 0.20, illustrative)."),
    read_cost: Optional[float] = typer.Option(None, "--read-cost", help="$ per TB read from the tier (default 0)."),
    occupancy_cost: Optional[float] = typer.Option(
        None, "--occupancy-cost", help="$ per TB-month stored (default 20, illustrative)."),
    top: int = typer.Option(10, "--top", min=1, max=1_000_000, help="How many prefixes to list."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", parser=parse_path, help="Write the per-block table: .parquet, .csv or .json."),
    prefixes_out: Optional[Path] = typer.Option(
        None, "--prefixes-out", parser=parse_path, help="Write the per-prefix rollup (.parquet/.csv/.json)."),
    accesses_out: Optional[Path] = typer.Option(
        None, "--accesses-out", parser=parse_path, help="Write per-access next use, reuses and value "
                                                        "(.parquet/.csv/.json)."),
    json_out: Optional[str] = typer.Option(
        None, "--json", help="Write the summary and top prefixes as JSON ('-' = stdout only)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
    stream: Optional[bool] = typer.Option(
        None, "--stream/--no-stream", help="Read a Parquet trace in chunks, memory bounded by its distinct blocks and "
                                           "requests (any horizon), same results bit for bit (default: when the "
                                           "in-memory run would exceed half the available memory or "
                                           "$KVTRACE_MEMORY_BUDGET)."),
) -> None:
    """Future-reuse value: which blocks are worth keeping, and which prompts are one-shot.

    Per access: the next use, the reuses within the horizon and the value of keeping
    the block = compute those reuses avoid - write, read and occupancy costs. Per block
    and per prefix family: total value, value per byte and the clairvoyant bound.
    """
    from kvtrace.analyses.value import parse_horizon, value_report
    from kvtrace.model import resolve_gpu
    from kvtrace.outputs import write_table

    check_tables(out, prefixes_out, accesses_out)
    check_paths({"out": out, "prefixes-out": prefixes_out, "accesses-out": accesses_out}, {"TRACE": trace_path},
                 json_out)
    h = parse_horizon(horizon)
    costs = storage_costs(write_cost, read_cost, occupancy_cost)
    m = kv_model(model, kv_bytes_per_token, dtype)
    g = resolve_gpu(gpu, mfu=mfu, dollars_per_hour=gpu_price)
    trace, streamed = open_trace(trace_path, fmt, block_tokens, share_tenants, stream, "value")
    with trace:  # a streamed trace's close removes its spill files
        t0 = time.perf_counter()
        with progress() as prog:
            task = prog.add_task("future reuse (streaming)", total=max(trace.n_accesses, 1), visible=streamed)
            cb = lambda done, total: prog.update(task, completed=done, total=total)  # noqa: E731
            result = value_report(trace, model=m, gpu=g, horizon_s=h, costs=costs, progress=cb)
        elapsed = time.perf_counter() - t0
        if json_out == "-":
            write_json("-", result.to_dict(top))
        else:
            _render_value(trace_path, result, top, elapsed)
        if out is not None:
            write_table(result.per_block, out, metadata=result.summary)
        if prefixes_out is not None:
            write_table(result.per_prefix, prefixes_out, metadata=result.summary)
        if accesses_out is not None:  # made again chunk by chunk and written atomically
            with progress() as prog:
                task = prog.add_task("per-access table (streaming)", total=max(trace.n_accesses, 1), visible=streamed)
                result.future.write_table(accesses_out, metadata=result.summary,
                                          progress=lambda d, t: prog.update(task, completed=d, total=t))
        if json_out and json_out != "-":
            write_json(json_out, result.to_dict(top))
    report_written((("blocks", out), ("prefixes", prefixes_out), ("accesses", accesses_out), ("json", json_out)))


def _render_value(trace_path: Path, result, top: int, elapsed: float) -> None:
    s = result.summary
    horizon = "infinite" if s.get("horizon_s") is None else format_seconds(s["horizon_s"])
    t = Table(title=f"{trace_path.name}: future-reuse value ({s['model']}, {s['gpu']}, horizon {horizon})",
              show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    depth = s.get("shared_root_blocks") or 0
    below = " below the shared root" if depth else ""
    families = [("blocks / prefix families", f"{s['blocks']:,} / {s['prefixes']:,}")]
    if depth:  # every request starts alike: the families are grouped below that root (analyses.value.shared_root)
        hashes = s["shared_root_hashes"]
        shown = ", ".join(str(h) for h in hashes[:4]) + (f", ... ({len(hashes):,} hashes)" if len(hashes) > 4 else "")
        families = [(f"blocks / prefix families below the shared root ({depth:,} block{'s' if depth > 1 else ''}, "
                     f"carried by {present.rate(s['shared_root_request_share'])} of requests)",
                     f"{s['blocks']:,} / {s['prefixes']:,}"),
                    ("shared root skipped (hashes)", shown)]
    rows = [
        *families,
        ("distinct bytes", format_bytes(s["distinct_bytes"])),
        ("bytes never reused (one-shot)", f"{format_bytes(s['never_reused_bytes'])} "
                                          f"({present.rate(s['never_reused_bytes_share'])})"),
        ("accesses with no reuse within the horizon", present.rate(s["no_reuse_in_horizon_access_share"])),
        ("compute a keep-for-the-horizon cache avoids", present.plain_dollars(s["gain_usd"])),
        ("write + read + occupancy cost", present.plain_dollars(s["write_cost_usd"] + s["read_cost_usd"]
                                                + s["occupancy_cost_usd"])),
        ("net value of keeping for the horizon", present.plain_dollars(s["total_value_usd"])),
        ("clairvoyant bound (best keep/drop per block)", present.plain_dollars(s["clairvoyant_bound_usd"])),
        ("bytes in blocks of negative value", present.rate(s["negative_value_bytes_share"])),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    q = s.get("value_usd_per_byte_quantiles") or {}
    if q:
        qt = Table(title="value density, $ per TB kept (quantiles over bytes)")
        for k in q:
            qt.add_column(k, justify="right")
        qt.add_row(*[present.per_tb(v) for v in q.values()])
        console.print(qt)
    pt = Table(title=f"top {top} prefix families{below} by value")
    for c in ("root hash", "blocks", "bytes", "accesses", "never reused", "value", "$ per TB", "bound"):
        pt.add_column(c, justify="right")
    for r in result.top_prefixes(top).iter_rows(named=True):
        shared = depth and r["root_hash"] == s["shared_root_hashes"][0]
        pt.add_row(f"{r['root_hash']} (shared root)" if shared else str(r["root_hash"]), f"{r['blocks']:,}",
                   format_bytes(r["bytes"]), f"{r['accesses']:,}",
                   format_bytes(r["never_reused_bytes"]), present.plain_dollars(r["total_value_usd"]),
                   present.per_tb(r["value_usd_per_byte"]),
                   present.plain_dollars(r["clairvoyant_value_usd"]))
    console.print(pt)
    console.print(f"[dim]computed in {elapsed:.2f} s[/dim]")
