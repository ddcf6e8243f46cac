"""``kvtrace size``: tier sizing, six candidates under three lenses, and why."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kvtrace.cli.console import console, err_console, progress, report_written, write_json
from kvtrace.cli.errors import handles_errors
from kvtrace.cli.inputs import check_paths, check_suffix, check_tables, load
from kvtrace.cli.options import (BlockTokensOpt, CacheRules, Fmt, FormatOpt, ShareTenantsOpt, TraceArg, parse_path,
                                 with_log_options)
from kvtrace.results import present
from kvtrace.units import format_bytes


@handles_errors
@with_log_options
def size(
    trace_path: Path = TraceArg,
    config_path: Optional[Path] = typer.Option(
        None, "--config", "-c", parser=parse_path, help="Sizing TOML (see sample_traces/tiers.example.toml); default: "
                                                        "that file's illustrative numbers."),
    report: Optional[Path] = typer.Option(
        None, "--report", parser=parse_path, help="Write a self-contained report: .html (embedded Altair charts) or "
                                                  ".md."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", parser=parse_path, help="Write the candidates table (.parquet/.csv/.json)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the whole result as JSON ('-' = stdout only)."),
    cache_rules: Optional[CacheRules] = typer.Option(
        None, "--cache-rules", help="ideal, vllm or sglang: the engine's reuse rules in every replay (a request's "
                                    "last block recomputed, only full blocks stored); default: the config's "
                                    "[search] cache_rules, else ideal."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
) -> None:
    """Tier sizing: keep, expand DRAM, add local SSD or shared flash, tier both, or recompute — and why.

    Six candidates under three lenses (same SLO, same capacity, same budget): searched
    on the capacity-hit curves, confirmed by exact tier replays with the admission
    policy chosen, checked for bandwidth and endurance, priced per month.
    """
    from kvtrace.outputs import write_table, write_text_atomic
    from kvtrace.analyses.sizing import default_config, load_config, recommend
    from kvtrace.results.sizing_report import report_html, report_markdown

    check_tables(out)
    check_suffix(report, "report", (".html", ".htm", ".md", ".markdown"), ".html or .md")
    check_paths({"out": out, "report": report}, {"TRACE": trace_path, "--config": config_path}, json_out)
    if config_path is None:
        config = default_config()
        err_console.print("kvtrace: warning: no --config: using the illustrative numbers of "
                          "sample_traces/tiers.example.toml", markup=False, soft_wrap=True)
    else:
        config = load_config(config_path)
    if cache_rules is not None:
        import dataclasses

        config = dataclasses.replace(config, cache_rules=cache_rules.value)
    trace = load(trace_path, fmt, block_tokens, share_tenants, workload="size")
    with progress() as prog:
        task = prog.add_task("sizing", total=1000)
        cb = lambda frac, msg: prog.update(task, completed=int(1000 * frac), description=msg[:40])  # noqa: E731
        result = recommend(trace, config, progress=cb, trace_name=str(trace_path))
    if json_out == "-":
        write_json("-", result.to_dict())
    else:
        _render_size(trace_path, result)
    if out is not None:
        write_table(result.candidates, out, metadata={"info": result.file_info(), "config": config.to_dict()})
    if report is not None:
        text = report_html(result) if report.suffix.lower() in (".html", ".htm") else report_markdown(result)
        write_text_atomic(report, text)
    if json_out and json_out != "-":
        write_json(json_out, result.to_dict())
    report_written((("candidates", out), ("report", report), ("json", json_out)))


def _render_size(trace_path: Path, result) -> None:
    from kvtrace.analyses.sizing import CANDIDATE_TEXT, LENSES

    info, cfg = result.info, result.config
    ms, signed = present.milliseconds, present.signed_money
    titles = {"same-slo": f"same SLO ({cfg.slo_text()}): cheapest configuration per candidate",
              "same-capacity": f"same capacity ({format_bytes(info['same_capacity_bytes'])} in total)",
              "same-budget": f"same budget ({present.money(info['budget_monthly_usd'])}/month)"}
    rec = result.recommendation
    # the verdict comes first: a recommendation, or that no configuration meets the constraints
    console.print(rec.headline, style="bold", markup=False, soft_wrap=True)
    for lens in LENSES:
        t = Table(title=f"{trace_path.name}: {titles[lens]}")
        for h in ("#", "candidate", "configuration", "admission", "DRAM", "SSD/flash", "mean", "P99", "$/month",
                  "net/month", "break-even", "DWPD", "ok", "short by"):
            t.add_column(h, justify="left" if h in ("candidate", "configuration", "admission") else "right")
        for r in result.candidates.filter(result.candidates["lens"] == lens).sort("rank").iter_rows(named=True):
            t.add_row(str(r["rank"]), CANDIDATE_TEXT[r["candidate"]], r["config"] or "-", r["policy"] or "-",
                      present.rate(r["dram_prefix_token_hit_rate"]), present.rate(r["ssd_prefix_token_hit_rate"]),
                      ms(r["service_time_mean_ms"]), ms(r["service_time_p99_ms"]),
                      present.money(r["cost_usd_per_month"]), signed(r["net_usd_per_month"]),
                      present.rate(r["break_even_realisation"]),
                      "-" if r["ssd_dwpd"] is None else f"{r['ssd_dwpd']:,.2f}",
                      "yes" if r["feasible"] else "no", r["shortfalls"] or "", style=None if r["feasible"] else "dim")
        console.print(t)
    if rec.needed:
        console.print("what would meet them:", style="bold")
        for line in rec.needed:
            console.print(f"  - {line}", markup=False, soft_wrap=True)
    console.print("why:" if rec.feasible else "the closest configuration:", style="bold")
    for line in rec.reasons:
        console.print(f"  - {line}", markup=False, soft_wrap=True)
    console.print("risks:", style="bold")
    for line in rec.risks:
        console.print(f"  - {line}", markup=False, soft_wrap=True)
    if rec.whatif_command:
        console.print("replay it: " + rec.whatif_command, markup=False, soft_wrap=True)
    console.print(f"[dim]{info['search_points']:,} configurations searched, {info['replays']:,} replays; "
                  f"computed in {info['elapsed_s']:.2f} s[/dim]")
