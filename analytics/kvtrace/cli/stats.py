"""``kvtrace stats``: what is in a trace."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kvtrace.cli.console import console, progress, write_json
from kvtrace.cli.errors import handles_errors
from kvtrace.cli.inputs import check_paths, kv_model, open_trace
from kvtrace.cli.options import (BlockTokensOpt, DtypeOpt, Fmt, FormatOpt, KvBytesOpt, ModelOpt, ShareTenantsOpt,
                                 TraceArg, with_log_options)
from kvtrace.results import present
from kvtrace.units import format_bytes, format_seconds


@handles_errors
@with_log_options
def stats(
    trace_path: Path = TraceArg,
    model: Optional[str] = ModelOpt,
    kv_bytes_per_token: Optional[int] = KvBytesOpt,
    dtype: Optional[str] = DtypeOpt,
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
    json_out: Optional[str] = typer.Option(
        None, "--json", help="Also write the figures as JSON to this file ('-' = stdout only)."),
    stream: Optional[bool] = typer.Option(
        None, "--stream/--no-stream", help="Read a Parquet trace in chunks, memory bounded by its distinct blocks and "
                                           "requests, same figures bit for bit (default: when the in-memory run would "
                                           "exceed half the available memory or $KVTRACE_MEMORY_BUDGET)."),
) -> None:
    """What is in a trace: size, arrivals, lengths, reuse and the most valuable shared prefixes."""
    from kvtrace.analyses.stats import STREAM_COLUMNS, trace_stats

    check_paths({}, {"TRACE": trace_path}, json_out)
    m = kv_model(model, kv_bytes_per_token, dtype)  # before a long scan
    trace, streamed = open_trace(trace_path, fmt, block_tokens, share_tenants, stream, "stats", STREAM_COLUMNS)
    with trace, progress() as prog:  # a streamed trace's close removes its spill files
        task = prog.add_task("stats (streaming)", total=max(trace.n_accesses, 1), visible=streamed)
        result = trace_stats(trace, m, progress=lambda d, t: prog.update(task, completed=d, total=t))
    if json_out == "-":
        write_json("-", result.to_dict())
        return
    s = result.summary
    t = Table(title=f"{trace_path.name} ({s['source_format']}, {s['block_tokens']} tokens/block)", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [
        ("requests", present.count(s["requests"])),
        ("duration", format_seconds(s["duration_s"])),
        ("arrival rate (mean)", f"{s['arrival_rate_per_s']:.3g} /s" if s["arrival_rate_per_s"] else "-"),
        ("arrivals per minute (mean / peak)", f"{s['mean_arrivals_per_minute']:.1f} / {s['peak_arrivals_per_minute']}"),
        ("block accesses", present.count(s["block_accesses"])),
        ("distinct blocks", present.count(s["distinct_blocks"])),
        ("sessions", present.count(s["sessions"])),
        ("input / output tokens", f"{s['input_tokens']:,} / {s['output_tokens']:,}"),
        (f"distinct KV bytes ({s['model']}, {s['kv_bytes_per_token']:,} B/token)",
         format_bytes(s["distinct_kv_bytes"])),
        ("KV bytes accessed", format_bytes(s["accessed_kv_bytes"])),
        ("accesses that re-reference a block", present.rate(s["rereference_share"])),
        ("block ids prefix-chained", "yes" if s["chained"] else
         f"no: {present.rate(s['multi_parent_block_share'])} of blocks follow more than one parent (--rechain)"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    lt = Table(title="distributions")
    for c in result.lengths.columns:
        lt.add_column(c, justify="left" if c == "quantity" else "right")
    for row in result.lengths.iter_rows():
        lt.add_row(row[0], *[present.count(v) for v in row[1:]])
    console.print(lt)
    pt = Table(title="top shared prefixes (prefix bytes x reuses)")
    for c in ("hash", "depth", "prefix", "reuses", "first seen", "last seen", "bytes x reuses"):
        pt.add_column(c, justify="right")
    for r in result.top_prefixes.iter_rows(named=True):
        pt.add_row(str(r["hash"]), str(r["depth_blocks"]), format_bytes(r["prefix_bytes"]), f"{r['reuses']:,}",
                   format_seconds(r["first_seen_s"]), format_seconds(r["last_seen_s"]),
                   format_bytes(r["bytes_x_reuses"]))
    console.print(pt)
    for name, g in result.groups.items():
        gt = Table(title=f"by {name}")
        for c in g.columns:
            gt.add_column(c, justify="left" if c == name else "right")
        for row in g.iter_rows():
            gt.add_row(str(row[0]), *[present.rate(v) if c == "rereference_share" else present.count(v)
                                      for c, v in zip(g.columns[1:], row[1:])])
        console.print(gt)
    if json_out:
        write_json(json_out, result.to_dict())

