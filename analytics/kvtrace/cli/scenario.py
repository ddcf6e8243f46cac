"""``kvtrace scenario``: one tier system under dynamic conditions — warm states,
migration, fault drills, a model rollout, TTL — side by side with the baseline
(:mod:`kvtrace.analyses.scenario`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kvtrace.cli.console import console, progress, report_written, write_json
from kvtrace.cli.errors import handles_errors
from kvtrace.cli.inputs import check_paths, check_suffix, check_tables, kv_model, load as load_input
from kvtrace.cli.options import (BlockTokensOpt, Fmt, FormatOpt, ShareTenantsOpt, TraceArg, parse_path,
                                 with_log_options)


@handles_errors
@with_log_options
def scenario(
    trace_path: Path = TraceArg,
    config_path: Path = typer.Option(
        ..., "--config", "-c", parser=parse_path, help="Scenario TOML (see sample_traces/scenario.example.toml)."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", parser=parse_path, help="Write the side-by-side table (.parquet/.csv/.json)."),
    timeline_out: Optional[Path] = typer.Option(
        None, "--timeline-out", parser=parse_path, help="Write the per-bin timeline (.parquet/.csv/.json)."),
    plot: Optional[Path] = typer.Option(
        None, "--plot", parser=parse_path, help="Write the timeline chart: .html, .png or .svg."),
    report: Optional[Path] = typer.Option(
        None, "--report", parser=parse_path, help="Write a self-contained report: .html or .md."),
    json_out: Optional[str] = typer.Option(
        None, "--json", help="Write the table, timeline, events and assumptions as JSON ('-' = stdout only)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
) -> None:
    """Scenarios: cold start, restored metadata, migration, a lost flash target, a
    catalog outage, a model rollout, TTL expiry and prestaging, each replayed exactly
    beside the baseline, with TTFT under the load model, a timeline and the time to
    recover.
    """
    from kvtrace.analyses.response import ResponseModel
    from kvtrace.analyses.scenario import load_scenario, run_scenarios
    from kvtrace.model import resolve_gpu
    from kvtrace.outputs import write_table, write_text_atomic

    check_tables(out)
    check_tables(timeline_out)
    check_suffix(plot, "plot", (".html", ".png", ".svg"), ".html, .png or .svg")
    check_suffix(report, "report", (".html", ".htm", ".md", ".markdown"), ".html or .md")
    check_paths({"out": out, "timeline-out": timeline_out, "plot": plot, "report": report},
                {"TRACE": trace_path, "--config": config_path}, json_out)
    cfg = load_scenario(config_path)
    m = kv_model(cfg.model.name, cfg.model.kv_bytes_per_token, cfg.model.dtype)
    g = resolve_gpu(cfg.gpu.name, mfu=cfg.gpu.mfu, dollars_per_hour=cfg.gpu.dollars_per_hour)
    d = ResponseModel()
    given = {k: getattr(d, k) for k in ("dram_gbps", "dram_latency_ms", "flash_gbps", "flash_latency_ms",
                                        "overhead_ms")}
    given.update(cfg.response.model_dump(exclude_none=True))  # [response]: the file's values over the defaults
    response = ResponseModel.in_units(**given, recompute_flops_per_s=g.effective_flops)
    trace = load_input(trace_path, fmt, block_tokens, share_tenants, workload="whatif")
    with trace:
        t0 = time.perf_counter()
        with progress() as prog:
            task = prog.add_task("scenario replays", total=1)
            result = run_scenarios(trace, cfg, model=m, gpu=g, response=response,
                                   progress=lambda done, total: prog.update(task, completed=done, total=total))
        elapsed = time.perf_counter() - t0
    doc = result.to_dict()
    if json_out == "-":
        write_json("-", doc)
    else:
        _render(trace_path, result, elapsed)
    meta = {"model": m.name, "kv_bytes_per_token": m.kv_bytes_per_token, "assumptions": result.info["assumptions"]}
    if out is not None:
        write_table(result.table, out, metadata=meta)
    if timeline_out is not None:
        write_table(result.timeline, timeline_out, metadata=meta)
    if plot is not None:
        from kvtrace.results.charts import save_chart
        from kvtrace.results.scenario_report import timeline_chart

        save_chart(timeline_chart(result), plot)
    if report is not None:
        from kvtrace.results.scenario_report import report_html, report_markdown

        html = report.suffix.lower() in (".html", ".htm")
        write_text_atomic(report, report_html(result, trace_path.name) if html
                          else report_markdown(result, trace_path.name))
    if json_out and json_out != "-":
        write_json(json_out, doc)
    report_written((("table", out), ("timeline", timeline_out), ("plot", plot), ("report", report),
                    ("json", json_out)))


def _render(trace_path: Path, result, elapsed: float) -> None:
    from kvtrace.results.scenario_report import TERMINAL, prefetch_rows, prewarm_rows, table_rows

    head, rows = table_rows(result.table, TERMINAL)
    t = Table(title=f"{trace_path.name}: scenarios side by side")
    for h in head:
        t.add_column(h, justify="left" if h == "scenario" else "right")
    for row in rows:
        t.add_row(*row)
    console.print(t)
    for (head, rows), title in ((prefetch_rows(result.table), "prestaging: what the prefetches moved and what "
                                                               "they bought"),
                                (prewarm_rows(result.table), "prewarming: what it moved, what it bought, what the "
                                                             "foreground paid")):
        if rows:
            t = Table(title=title)
            for h in head:
                t.add_column(h, justify="left" if h == "scenario" else "right")
            for row in rows:
                t.add_row(*row)
            console.print(t)
    for ev in result.events.to_dicts():
        when = "never (after the trace's end)" if ev.get("first_request") is None else \
            f"before request {ev['first_request']:,}"
        console.print(f"{ev['scenario']}: {ev['text']} - {when}", markup=False, soft_wrap=True)
    console.print(f"assumed: {result.info['assumptions']}", style="dim", markup=False, soft_wrap=True)
    console.print(f"{result.table.height} run(s) in {elapsed:.2f} s", style="dim", markup=False)
