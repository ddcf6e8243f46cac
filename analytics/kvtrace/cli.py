"""The ``kvtrace`` command line (Typer + Rich).

Commands are thin: open inputs, call one library function that returns a typed
result, render it, and write machine-readable output on request. User and data errors
print one line and exit 1 (bad option values exit 2); ``--debug`` shows the traceback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from enum import Enum
from pathlib import Path
from typing import Callable, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from . import __version__
from .errors import KvtraceError, UsageError
from .units import format_bytes, format_seconds, parse_sizes

app = typer.Typer(
    name="kvtrace",
    help="Where should KV-cache context live, and how much memory and flash to buy? "
    "Replays LLM request traces (prompts as chains of block hashes) through exact cache models.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
# Wide tables wrap badly at Rich's 80-column default for pipes and logs.
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 140
console = Console(highlight=False, width=_WIDTH)
err_console = Console(stderr=True, highlight=False)
_state = {"debug": False}


def _version(value: bool) -> None:
    if value:
        console.print(f"kvtrace {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    _state["debug"] = debug


def handles_errors(fn: Callable) -> Callable:
    """One-line errors: KvtraceError -> exit 1 (UsageError -> 2); tracebacks only with --debug."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KvtraceError as exc:
            if _state["debug"]:
                raise
            err_console.print(f"kvtrace: error: {exc.one_line()}", markup=False, soft_wrap=True)
            raise typer.Exit(2 if isinstance(exc, UsageError) else 1) from None
        except KeyboardInterrupt:
            err_console.print("kvtrace: interrupted", markup=False)
            raise typer.Exit(130) from None
        except MemoryError:
            if _state["debug"]:
                raise
            err_console.print("kvtrace: error: out of memory: try --sample-rate 0.01", markup=False, soft_wrap=True)
            raise typer.Exit(1) from None
        except OSError as exc:
            if _state["debug"]:
                raise
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            err_console.print(f"kvtrace: error: {where}{exc.strerror or exc}", markup=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


class Fmt(str, Enum):
    auto = "auto"
    mooncake = "mooncake"
    bailian = "bailian"
    parquet = "parquet"
    csv = "csv"


class Eviction(str, Enum):
    prefix_aware = "prefix-aware"
    flat = "flat"


class By(str, Enum):
    type = "type"
    tenant = "tenant"
    turn = "turn"
    session_length = "session-length"


class SynthKind(str, Enum):
    chat = "chat"
    agent = "agent"
    rag = "rag"
    mixed = "mixed"


class SynthFmt(str, Enum):
    mooncake = "mooncake"
    bailian = "bailian"
    parquet = "parquet"


# Options shared by the commands that read a trace or need a model.
FormatOpt = typer.Option(Fmt.auto, "--format", "-f", help="Input format (auto-detected from suffix and fields).")
BlockTokensOpt = typer.Option(None, "--block-tokens", min=1, help="Tokens per block (default: the format's; required for generic tables).")
ShareTenantsOpt = typer.Option(False, "--share-tenants", help="Equal hashes in different tenants are the same block.")
ModelOpt = typer.Option(None, "--model", "-m", help="Model preset or path to a Hugging Face config.json (default Llama-3.1-70B; see `kvtrace models`).")
KvBytesOpt = typer.Option(None, "--kv-bytes-per-token", min=1, help="Override KV bytes per token.")
DtypeOpt = typer.Option(None, "--dtype", help="KV-cache dtype: fp32, bf16, fp16, fp8, int8, fp4.")


def _progress() -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
        disable=not err_console.is_terminal,
    )


def _load(path: Path, fmt: Fmt, block_tokens: Optional[int], share_tenants: bool = False):
    from .ingest import load_trace

    trace = load_trace(path, fmt=fmt.value, block_tokens=block_tokens, share_tenants=share_tenants)
    for w in trace.warnings:
        err_console.print(f"kvtrace: warning: {path}: {w}", markup=False, soft_wrap=True)
    return trace


def _model(model: Optional[str], kv_bytes: Optional[int], dtype: Optional[str]):
    from .model import resolve_model

    return resolve_model(model, dtype=dtype, kv_bytes_per_token=kv_bytes)


def _fmt_rate(x) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _fmt_num(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, int) or float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:,.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"


def _write_json(path: str, obj) -> None:
    from .outputs import _json_safe, write_json_atomic

    if path == "-":
        sys.stdout.write(json.dumps(_json_safe(obj), indent=2) + "\n")
    else:
        write_json_atomic(path, obj)


# ---------------------------------------------------------------------------- ingest
@app.command()
@handles_errors
def ingest(
    src: Path = typer.Argument(..., help="Trace file: Mooncake/Bailian JSONL (.gz ok), Parquet or CSV."),
    out: Path = typer.Option(..., "--out", "-o", help="Canonical Parquet to write."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
) -> None:
    """Convert a trace to kvtrace's canonical Parquet (request table + metadata).

    Every other command reads the source formats directly; ingest once to skip
    re-parsing large JSONL files.
    """
    from .ingest import distinct_blocks, load_requests, write_canonical

    t0 = time.perf_counter()
    df, meta, warnings = load_requests(src, fmt=fmt.value, block_tokens=block_tokens, share_tenants=share_tenants)
    for w in warnings:
        err_console.print(f"kvtrace: warning: {src}: {w}", markup=False, soft_wrap=True)
    write_canonical(df, meta, out)
    # the counts need only the dense-id table, not the access table: a lower peak of memory
    n_acc = int(df["block_ids"].list.len().sum())
    n_blocks = distinct_blocks(df, meta)
    dt = time.perf_counter() - t0
    console.print(
        f"wrote {out}: {df.height:,} requests, {n_acc:,} block accesses, "
        f"{n_blocks:,} distinct blocks ({meta.source_format}, {meta.block_tokens} tokens/block) "
        f"in {dt:.2f} s",
        soft_wrap=True,
    )


# ---------------------------------------------------------------------------- stats
@app.command()
@handles_errors
def stats(
    trace_path: Path = typer.Argument(..., metavar="TRACE", help="Trace file (JSONL, Parquet or CSV)."),
    model: Optional[str] = ModelOpt,
    kv_bytes_per_token: Optional[int] = KvBytesOpt,
    dtype: Optional[str] = DtypeOpt,
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write the figures as JSON to this file ('-' = stdout only)."),
) -> None:
    """What is in a trace: size, arrivals, lengths, reuse and the most valuable shared prefixes."""
    from .stats import trace_stats

    trace = _load(trace_path, fmt, block_tokens, share_tenants)
    result = trace_stats(trace, _model(model, kv_bytes_per_token, dtype))
    if json_out == "-":
        _write_json("-", result.to_dict())
        return
    s = result.summary
    t = Table(title=f"{trace_path.name} ({s['source_format']}, {s['block_tokens']} tokens/block)", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [
        ("requests", _fmt_num(s["requests"])),
        ("duration", format_seconds(s["duration_s"])),
        ("arrival rate (mean)", f"{s['arrival_rate_per_s']:.3g} /s" if s["arrival_rate_per_s"] else "-"),
        ("arrivals per minute (mean / peak)", f"{s['mean_arrivals_per_minute']:.1f} / {s['peak_arrivals_per_minute']}"),
        ("block accesses", _fmt_num(s["block_accesses"])),
        ("distinct blocks", _fmt_num(s["distinct_blocks"])),
        ("sessions", _fmt_num(s["sessions"])),
        ("input / output tokens", f"{s['input_tokens']:,} / {s['output_tokens']:,}"),
        (f"distinct KV bytes ({s['model']}, {s['kv_bytes_per_token']:,} B/token)", format_bytes(s["distinct_kv_bytes"])),
        ("KV bytes accessed", format_bytes(s["accessed_kv_bytes"])),
        ("accesses that re-reference a block", _fmt_rate(s["rereference_share"])),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    lt = Table(title="distributions")
    for c in result.lengths.columns:
        lt.add_column(c, justify="left" if c == "quantity" else "right")
    for row in result.lengths.iter_rows():
        lt.add_row(row[0], *[_fmt_num(v) for v in row[1:]])
    console.print(lt)
    pt = Table(title="top shared prefixes (prefix bytes x reuses)")
    for c in ("hash", "depth", "prefix", "reuses", "first seen", "last seen", "bytes x reuses"):
        pt.add_column(c, justify="right")
    for r in result.top_prefixes.iter_rows(named=True):
        pt.add_row(str(r["hash"]), str(r["depth_blocks"]), format_bytes(r["prefix_bytes"]), f"{r['reuses']:,}",
                   format_seconds(r["first_seen_s"]), format_seconds(r["last_seen_s"]), format_bytes(r["bytes_x_reuses"]))
    console.print(pt)
    for name, g in result.groups.items():
        gt = Table(title=f"by {name}")
        for c in g.columns:
            gt.add_column(c, justify="left" if c == name else "right")
        for row in g.iter_rows():
            gt.add_row(str(row[0]), *[_fmt_rate(v) if c == "rereference_share" else _fmt_num(v)
                                      for c, v in zip(g.columns[1:], row[1:])])
        console.print(gt)
    if json_out:
        _write_json(json_out, result.to_dict())


# ---------------------------------------------------------------------------- models
@app.command()
@handles_errors
def models(
    block_tokens: int = typer.Option(512, "--block-tokens", min=1, help="Block size for the bytes-per-block column."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the tables as JSON to this file ('-' = stdout)."),
) -> None:
    """Model presets (KV bytes per token and per block) and GPU presets."""
    from .model import gpus_table, models_table

    mt, gt = models_table(block_tokens), gpus_table()
    if json_out:
        _write_json(json_out, {"models": mt.to_dicts(), "gpus": gt.to_dicts()})
        if json_out == "-":
            return
    t = Table(title=f"model presets (bytes per block at {block_tokens} tokens)")
    for c in mt.columns:
        t.add_column(c, justify="left" if c in ("name", "attention", "dtype") else "right")
    for row in mt.iter_rows():
        t.add_row(*[_fmt_num(v) if isinstance(v, (int, float)) else str(v) for v in row])
    console.print(t)
    g = Table(title="GPU presets (prices illustrative)")
    for c in gt.columns:
        g.add_column(c, justify="left" if c == "name" else "right")
    for row in gt.iter_rows():
        g.add_row(*[_fmt_num(v) if isinstance(v, (int, float)) else str(v) for v in row])
    console.print(g)


# ---------------------------------------------------------------------------- synth
@app.command()
@handles_errors
def synth(
    kind: SynthKind = typer.Option(SynthKind.chat, "--kind", help="Workload: chat, agent, rag or mixed."),
    requests: int = typer.Option(2000, "--requests", "-n", min=1, help="Number of requests."),
    seed: int = typer.Option(0, "--seed", help="Random seed (same seed, same trace)."),
    out: Path = typer.Option(..., "--out", "-o", help="File to write."),
    fmt: SynthFmt = typer.Option(SynthFmt.mooncake, "--format", help="mooncake / bailian JSONL, or canonical parquet."),
    block_tokens: Optional[int] = typer.Option(None, "--block-tokens", min=1, help="Tokens per block (default 512; 16 for bailian)."),
    rate: Optional[float] = typer.Option(None, "--rate", min=0.0, help="Mean session arrival rate, per second."),
    chunk_requests: Optional[int] = typer.Option(None, "--chunk-requests", min=1, help="Generate and write in chunks of this many requests (very large traces)."),
) -> None:
    """Generate a realistic synthetic trace (multi-turn chat, tool agents, RAG, shared system prompts)."""
    from . import synth as synth_mod

    t0 = time.perf_counter()
    if chunk_requests:
        synth_mod.write_chunked(kind.value, requests, seed, out, fmt.value, block_tokens=block_tokens,
                                rate_per_s=rate, chunk_requests=chunk_requests)
        console.print(f"wrote {out} ({requests:,} requests, {fmt.value}) in {time.perf_counter() - t0:.2f} s",
                      soft_wrap=True)
        return
    df, meta = synth_mod.generate(kind.value, requests, seed, block_tokens=block_tokens, rate_per_s=rate)
    synth_mod.write(df, meta, out, fmt.value)
    n_acc = int(df["block_ids"].list.len().sum())
    console.print(f"wrote {out}: {df.height:,} requests, {n_acc:,} block accesses ({kind.value}, {fmt.value}) "
                  f"in {time.perf_counter() - t0:.2f} s", soft_wrap=True)


# ---------------------------------------------------------------------------- curve
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


@app.command()
@handles_errors
def curve(
    trace_path: Path = typer.Argument(..., metavar="TRACE", help="Trace file (JSONL, Parquet or CSV)."),
    model: Optional[str] = ModelOpt,
    kv_bytes_per_token: Optional[int] = KvBytesOpt,
    dtype: Optional[str] = DtypeOpt,
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU preset for compute savings: H100, H200, B200, A100."),
    mfu: Optional[float] = typer.Option(None, "--mfu", help="Prefill model FLOPs utilisation (0-1]."),
    gpu_price: Optional[float] = typer.Option(None, "--gpu-price", help="$ per GPU-hour."),
    eviction: Eviction = typer.Option(Eviction.prefix_aware, "--eviction", help="prefix-aware (request-atomic, radix-tree-like) or flat (plain block LRU over the chain stream)."),
    capacity: Optional[str] = typer.Option(None, "--capacity", "-c", help="Exact capacities, e.g. 64GiB,1TiB,500GB (default: ~200 log-spaced from one block to all distinct bytes)."),
    points: int = typer.Option(200, "--points", min=2, max=100000, help="Grid points of the default capacity grid."),
    warmup: Optional[str] = typer.Option(None, "--warmup", help="Only measure after a warm-up: a fraction of requests (0.1, 10%) or a duration (10min)."),
    by: Optional[By] = typer.Option(None, "--by", help="Break metrics down by type, tenant, turn or session-length (shared cache)."),
    sample_rate: Optional[float] = typer.Option(None, "--sample-rate", help="SHARDS spatial sampling rate in (0, 1): approximate, with an error estimate."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the curve table: .parquet, .csv or .json."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Write a chart: .html (self-contained), .png or .svg."),
    distances_out: Optional[Path] = typer.Option(None, "--distances-out", help="Write per-access distances (.parquet/.csv/.json) for SQL."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write ceiling, knees and info as JSON ('-' = stdout only)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
) -> None:
    """Capacity-hit curves: what each cache size saves, in requests, tokens, bytes and GPU compute.

    Exact byte-LRU reuse distances (one pass) give hits at every capacity. Prints a
    table at round capacities, the ceiling (infinite cache) and the capacities that
    reach 50/80/90/95/99 % of it.
    """
    from .curves import compute_curve
    from .distances import distances_table, reuse_distances
    from .model import resolve_gpu
    from .outputs import table_format, write_table

    for p in (out, distances_out):
        if p is not None:
            table_format(p)  # fail on a bad suffix before the work, not after
    if plot is not None and plot.suffix.lower() not in (".html", ".png", ".svg"):
        found = f"suffix '{plot.suffix}'" if plot.suffix else "no suffix"
        raise UsageError(f"unsupported plot file ({found}): expected .html, .png or .svg", field="plot")
    if sample_rate is not None and not 0 < sample_rate <= 1:
        raise UsageError(f"expected a rate in (0, 1], got {sample_rate}", field="sample-rate")
    if sample_rate is not None and distances_out is not None and sample_rate < 1:
        raise UsageError("--distances-out needs exact distances: drop --sample-rate", field="distances-out")
    m = _model(model, kv_bytes_per_token, dtype)
    g = resolve_gpu(gpu, mfu=mfu, dollars_per_hour=gpu_price)
    caps = parse_sizes(capacity) if capacity else None
    trace = _load(trace_path, fmt, block_tokens, share_tenants)

    t0 = time.perf_counter()
    dist = None
    display_caps = None
    if caps is None:
        display_caps = _round_capacities(trace.meta.block_tokens * m.kv_bytes_per_token,
                                         int(trace.block_size.sum()) * m.kv_bytes_per_token) or None
    with _progress() as prog:
        task = prog.add_task("reuse distances", total=max(trace.n_accesses, 1))
        cb = lambda done, total: prog.update(task, completed=done, total=total)  # noqa: E731
        if distances_out is not None:
            dist = reuse_distances(trace, eviction.value, details=True, progress=cb)
        result = compute_curve(
            trace, model=m, gpu=g, eviction=eviction.value, capacities=caps, display_capacities=display_caps,
            points=points, warmup=warmup, by=by.value if by else None, sample_rate=sample_rate, distances=dist,
            progress=cb,
        )
    display = result.display if result.display is not None else result.curve
    elapsed = time.perf_counter() - t0

    meta = {"info": result.info, "ceiling": result.ceiling, "knees": result.knees.to_dicts()}
    if json_out == "-":
        _write_json("-", meta)
    else:
        _render_curve(trace_path, result, display, elapsed)
    if out is not None:
        import polars as pl

        table = result.curve
        if result.by_group is not None:
            table = pl.concat([result.curve.insert_column(0, pl.lit("all").alias("group")), result.by_group],
                              how="diagonal_relaxed")
        write_table(table, out, metadata=meta)
    if plot is not None:
        from .charts import curve_chart, save_chart

        save_chart(curve_chart(result), plot)
    if distances_out is not None:
        write_table(distances_table(trace, dist, m.kv_bytes_per_token), distances_out,
                    metadata={"eviction": dist.eviction, "kv_bytes_per_token": m.kv_bytes_per_token,
                              "cold": "inf", "model": m.name})
    if json_out and json_out != "-":
        _write_json(json_out, meta)
    for label, p in (("curve", out), ("plot", plot), ("distances", distances_out), ("json", json_out)):
        if p is not None and p != "-":
            err_console.print(f"wrote {label}: {p}", markup=False)


def _render_curve(trace_path: Path, result, display, elapsed: float) -> None:
    info = result.info
    title = (f"{trace_path.name}: {info['model']} ({info['kv_bytes_per_token']:,} B/token), "
             f"{info['eviction']} LRU")
    if result.approximate:
        err = info["error_estimate"]
        title += (f"\nAPPROXIMATE: SHARDS sample rate {info['sample_rate']:g}, est. standard error of the "
                  f"usable-prefix token rate: mean {100 * err['mean_standard_error']:.2f} pts, "
                  f"max {100 * err['max_standard_error']:.2f} pts")
    t = Table(title=title)
    cols = [("capacity", "capacity_bytes"), ("requests", "request_hit_rate"),
            ("prefix tokens", "prefix_token_hit_rate"), ("any-block tokens", "token_hit_rate"),
            ("compute saved", "compute_saved_rate"), ("GPU-h saved /h", "gpu_seconds_saved_per_hour"),
            ("$ saved /h", "dollars_saved_per_hour"), ("read BW", "read_bandwidth_bytes_per_s")]
    for head, _ in cols:
        t.add_column(head, justify="right")
    for r in display.iter_rows(named=True):
        t.add_row(
            format_bytes(r["capacity_bytes"]), _fmt_rate(r["request_hit_rate"]), _fmt_rate(r["prefix_token_hit_rate"]),
            _fmt_rate(r["token_hit_rate"]), _fmt_rate(r["compute_saved_rate"]),
            "-" if r["gpu_seconds_saved_per_hour"] is None else f"{r['gpu_seconds_saved_per_hour'] / 3600:,.2f}",
            "-" if r["dollars_saved_per_hour"] is None else f"${r['dollars_saved_per_hour']:,.2f}",
            "-" if r["read_bandwidth_bytes_per_s"] is None else format_bytes(r["read_bandwidth_bytes_per_s"]) + "/s",
        )
    c = result.ceiling
    t.add_row(f"∞ ({format_bytes(c['capacity_bytes'])})", _fmt_rate(c["request_hit_rate"]),
              _fmt_rate(c["prefix_token_hit_rate"]), _fmt_rate(c["token_hit_rate"]),
              _fmt_rate(c["compute_saved_rate"]), "", "", "", style="bold")
    console.print(t)
    k = Table(title="capacity needed to reach a share of the ceiling (knee)")
    k.add_column("share of ceiling", justify="right")
    for metric, head in (("prefix_token_hit_rate", "prefix tokens"), ("request_hit_rate", "requests"),
                         ("compute_saved_rate", "compute saved")):
        k.add_column(head, justify="right")
    knees = result.knees
    for f in sorted(set(knees["fraction"].to_list())):
        row = [f"{100 * f:g}%"]
        for metric in ("prefix_token_hit_rate", "request_hit_rate", "compute_saved_rate"):
            sel = knees.filter((knees["metric"] == metric) & (knees["fraction"] == f))
            cap = sel["capacity_bytes"][0] if sel.height else None
            rate = sel["target_rate"][0] if sel.height else None
            row.append("-" if cap is None else f"{format_bytes(cap)} ({_fmt_rate(rate)})")
        k.add_row(*row)
    console.print(k)
    if result.by_group is not None:
        _render_groups(result)
    console.print(f"[dim]{info['measured_accesses']:,} accesses measured"
                  f"{' after warm-up' if info['warmup'] else ''}, {info['distinct_blocks']:,} distinct blocks "
                  f"({format_bytes(info['distinct_bytes'])}); computed in {elapsed:.2f} s[/dim]")


def _render_groups(result) -> None:
    import polars as pl

    bg = result.by_group
    knees = result.knees.filter((pl.col("metric") == "prefix_token_hit_rate") & (pl.col("fraction") == 0.8))
    ref = knees["capacity_bytes"][0] if knees.height else None
    t = Table(title=f"by {result.info['by']} (shared cache; at the capacity reaching 80% of the overall ceiling)")
    for c in ("group", "capacity", "requests", "prefix tokens", "compute saved", "ceiling (prefix tokens)"):
        t.add_column(c, justify="left" if c == "group" else "right")
    for name in result.info["groups"]:
        rows = bg.filter(pl.col("group") == name)
        if ref is not None:
            at = rows.filter(pl.col("capacity_bytes") <= ref).tail(1)
            at = at if at.height else rows.head(1)
        else:
            at = rows.tail(1)
        r = at.row(0, named=True)
        top = rows.tail(1).row(0, named=True)
        t.add_row(name, format_bytes(r["capacity_bytes"]), _fmt_rate(r["request_hit_rate"]),
                  _fmt_rate(r["prefix_token_hit_rate"]), _fmt_rate(r["compute_saved_rate"]),
                  _fmt_rate(top["prefix_token_hit_rate"]))
    console.print(t)


# ---------------------------------------------------------------------------- value
@app.command()
@handles_errors
def value(
    trace_path: Path = typer.Argument(..., metavar="TRACE", help="Trace file (JSONL, Parquet or CSV)."),
    model: Optional[str] = ModelOpt,
    kv_bytes_per_token: Optional[int] = KvBytesOpt,
    dtype: Optional[str] = DtypeOpt,
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU preset that prices the compute a reuse avoids."),
    mfu: Optional[float] = typer.Option(None, "--mfu", help="Prefill model FLOPs utilisation (0-1]."),
    gpu_price: Optional[float] = typer.Option(None, "--gpu-price", help="$ per GPU-hour."),
    horizon: str = typer.Option("1h", "--horizon", help="Count reuses up to this far ahead: 90s, 10min, 2h or inf."),
    write_cost: Optional[float] = typer.Option(None, "--write-cost", help="$ per TB written to the tier (default 0.20, illustrative)."),
    read_cost: Optional[float] = typer.Option(None, "--read-cost", help="$ per TB read from the tier (default 0)."),
    occupancy_cost: Optional[float] = typer.Option(None, "--occupancy-cost", help="$ per TB-month stored (default 20, illustrative)."),
    top: int = typer.Option(10, "--top", min=1, help="How many prefixes to list."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the per-block table: .parquet, .csv or .json."),
    prefixes_out: Optional[Path] = typer.Option(None, "--prefixes-out", help="Write the per-prefix rollup (.parquet/.csv/.json)."),
    accesses_out: Optional[Path] = typer.Option(None, "--accesses-out", help="Write per-access next use, reuses and value (.parquet/.csv/.json)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the summary and top prefixes as JSON ('-' = stdout only)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
) -> None:
    """Future-reuse value: which blocks are worth keeping, and which prompts are one-shot.

    Per access: the next use, the reuses within the horizon and the value of keeping
    the block = compute those reuses avoid - write, read and occupancy costs. Per block
    and per prefix family: total value, value per byte and the clairvoyant bound.
    """
    from .model import resolve_gpu
    from .outputs import table_format, write_table
    from .value import DEFAULT_COSTS, StorageCosts, parse_horizon, value_report

    for p in (out, prefixes_out, accesses_out):
        if p is not None:
            table_format(p)
    h = parse_horizon(horizon)
    base = DEFAULT_COSTS.to_dict()
    costs = StorageCosts.per_tb(
        write_dollars_per_tb=base["write_dollars_per_tb"] if write_cost is None else write_cost,
        read_dollars_per_tb=base["read_dollars_per_tb"] if read_cost is None else read_cost,
        occupancy_dollars_per_tb_month=base["occupancy_dollars_per_tb_month"] if occupancy_cost is None
        else occupancy_cost,
    )
    m = _model(model, kv_bytes_per_token, dtype)
    g = resolve_gpu(gpu, mfu=mfu, dollars_per_hour=gpu_price)
    trace = _load(trace_path, fmt, block_tokens, share_tenants)
    t0 = time.perf_counter()
    result = value_report(trace, model=m, gpu=g, horizon_s=h, costs=costs)
    elapsed = time.perf_counter() - t0
    if json_out == "-":
        _write_json("-", result.to_dict(top))
    else:
        _render_value(trace_path, result, top, elapsed)
    if out is not None:
        write_table(result.per_block, out, metadata=result.summary)
    if prefixes_out is not None:
        write_table(result.per_prefix, prefixes_out, metadata=result.summary)
    if accesses_out is not None:
        write_table(result.future.table(), accesses_out, metadata=result.summary)
    if json_out and json_out != "-":
        _write_json(json_out, result.to_dict(top))
    for label, p in (("blocks", out), ("prefixes", prefixes_out), ("accesses", accesses_out), ("json", json_out)):
        if p is not None and p != "-":
            err_console.print(f"wrote {label}: {p}", markup=False)


def _render_value(trace_path: Path, result, top: int, elapsed: float) -> None:
    s = result.summary
    horizon = "infinite" if s.get("horizon_s") is None else format_seconds(s["horizon_s"])
    t = Table(title=f"{trace_path.name}: future-reuse value ({s['model']}, {s['gpu']}, horizon {horizon})",
              show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    money = lambda x: "-" if x is None else f"${x:,.2f}"  # noqa: E731
    rows = [
        ("blocks / prefix families", f"{s['blocks']:,} / {s['prefixes']:,}"),
        ("distinct bytes", format_bytes(s["distinct_bytes"])),
        ("bytes never reused (one-shot)", f"{format_bytes(s['never_reused_bytes'])} "
                                          f"({_fmt_rate(s['never_reused_bytes_share'])})"),
        ("accesses with no reuse within the horizon", _fmt_rate(s["no_reuse_in_horizon_access_share"])),
        ("compute a keep-for-the-horizon cache avoids", money(s["gain_dollars"])),
        ("write + read + occupancy cost", money(s["write_cost_dollars"] + s["read_cost_dollars"]
                                                + s["occupancy_cost_dollars"])),
        ("net value of keeping for the horizon", money(s["total_value_dollars"])),
        ("clairvoyant bound (best keep/drop per block)", money(s["clairvoyant_bound_dollars"])),
        ("bytes in blocks of negative value", _fmt_rate(s["negative_value_bytes_share"])),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    q = s.get("value_per_byte_quantiles") or {}
    if q:
        qt = Table(title="value density, $ per TB kept (quantiles over bytes)")
        for k in q:
            qt.add_column(k, justify="right")
        qt.add_row(*["-" if v is None else f"{v * 1e12:,.2f}" for v in q.values()])
        console.print(qt)
    pt = Table(title=f"top {top} prefix families by value")
    for c in ("root hash", "blocks", "bytes", "accesses", "never reused", "value", "$ per TB", "bound"):
        pt.add_column(c, justify="right")
    for r in result.top_prefixes(top).iter_rows(named=True):
        pt.add_row(str(r["root_hash"]), f"{r['blocks']:,}", format_bytes(r["bytes"]), f"{r['accesses']:,}",
                   format_bytes(r["never_reused_bytes"]), money(r["total_value_dollars"]),
                   "-" if r["value_per_byte"] is None else f"{r['value_per_byte'] * 1e12:,.2f}",
                   money(r["clairvoyant_value_dollars"]))
    console.print(pt)
    console.print(f"[dim]computed in {elapsed:.2f} s[/dim]")


# ---------------------------------------------------------------------------- whatif
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


@app.command()
@handles_errors
def whatif(
    trace_path: Path = typer.Argument(..., metavar="TRACE", help="Trace file (JSONL, Parquet or CSV)."),
    dram: str = typer.Option(..., "--dram", help="DRAM per node, e.g. 256GiB (a comma list with --grid)."),
    flash: str = typer.Option("0", "--flash", help="Shared flash pool, e.g. 8TiB (a comma list with --grid; 0 = none)."),
    local_ssd: str = typer.Option("0", "--local-ssd", help="Local SSD per node (0 = none)."),
    policy: str = typer.Option("all", "--policy", help="Flash admission, comma-separated: all, none, second-hit, freq>=k, prob:p, idle<T, value>=v, reuse-oracle, tinylfu, group:type>=p."),
    grid: bool = typer.Option(False, "--grid", help="Sweep every (DRAM, flash) pair of the --dram and --flash lists."),
    compare_local: bool = typer.Option(False, "--compare-local", help="Also run the same flash as a local SSD per node vs one shared pool (needs --nodes > 1 and --local-ssd)."),
    nodes: int = typer.Option(1, "--nodes", min=1, max=64, help="Nodes, each with its own DRAM (and local SSD)."),
    routing: Routing = typer.Option(Routing.session, "--routing", help="Request routing across nodes."),
    promotion: Promotion = typer.Option(Promotion.promote, "--promotion", help="On a flash hit: promote, copy or none."),
    write_mode: WriteMode = typer.Option(WriteMode.on_evict, "--write-mode", help="write-on-evict or write-through."),
    inclusive: bool = typer.Option(False, "--inclusive", help="Allow a block in two tiers (copy, write-through)."),
    flash_order: FlashOrder = typer.Option(FlashOrder.lru, "--flash-order", help="Flash replacement: lru or fifo (log-structured)."),
    eviction: Eviction = typer.Option(Eviction.prefix_aware, "--eviction", help="LRU model, as for kvtrace curve."),
    warmup: Optional[str] = typer.Option(None, "--warmup", help="Only measure after a warm-up (fraction or duration)."),
    model: Optional[str] = ModelOpt,
    kv_bytes_per_token: Optional[int] = KvBytesOpt,
    dtype: Optional[str] = DtypeOpt,
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU preset for recompute time and savings."),
    mfu: Optional[float] = typer.Option(None, "--mfu", help="Prefill model FLOPs utilisation (0-1]."),
    gpu_price: Optional[float] = typer.Option(None, "--gpu-price", help="$ per GPU-hour."),
    dram_gbps: float = typer.Option(25.0, "--dram-gbps", help="DRAM restore bandwidth, GB/s (illustrative default)."),
    dram_latency_ms: float = typer.Option(0.2, "--dram-latency-ms", help="DRAM restore fixed latency, ms."),
    flash_gbps: float = typer.Option(6.0, "--flash-gbps", help="Flash restore bandwidth, GB/s (illustrative default)."),
    flash_latency_ms: float = typer.Option(1.0, "--flash-latency-ms", help="Flash restore fixed latency, ms."),
    overhead_ms: float = typer.Option(1.0, "--overhead-ms", help="Per-request overhead of having a flash tier, ms."),
    horizon: str = typer.Option("1h", "--horizon", help="Horizon of the value kernel for value>=v policies."),
    workers: int = typer.Option(2, "--workers", min=1, help="Processes for several configurations."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the comparison table (.parquet/.csv/.json)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Frontier chart: flash hit share vs flash bytes written (.html/.png/.svg)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the comparison as JSON ('-' = stdout only)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
) -> None:
    """Tier what-ifs: DRAM over local SSD / shared flash, admission policies, nodes.

    Exact event simulation under the same LRU model as the curve: hit shares by tier
    (unconditional), flash writes and DWPD, read bandwidth (mean and peak), promotions,
    value captured, residency, and reusable-prefix service-time percentiles.
    """
    from .model import resolve_gpu
    from .outputs import table_format, write_table
    from .response import ResponseModel
    from .whatif import TierConfig, local_vs_shared, sweep

    if out is not None:
        table_format(out)
    if plot is not None and plot.suffix.lower() not in (".html", ".png", ".svg"):
        found = f"suffix '{plot.suffix}'" if plot.suffix else "no suffix"
        raise UsageError(f"unsupported plot file ({found}): expected .html, .png or .svg", field="plot")
    drams = [d.strip() for d in dram.split(",") if d.strip()]
    flashes = [f.strip() for f in flash.split(",") if f.strip()]
    if not grid and (len(drams) > 1 or len(flashes) > 1):
        raise UsageError("several --dram or --flash sizes need --grid", field="grid")
    policies = [p.strip() for p in policy.split(",") if p.strip()]
    common = dict(local_ssd_bytes=local_ssd, nodes=nodes, routing=routing.value, flash_order=flash_order.value,
                  promotion=promotion.value, write_mode=write_mode.value, inclusive=inclusive)
    configs = [TierConfig(d, flash_bytes=f, policy=p, **common) for d in drams for f in flashes for p in policies]
    if compare_local:
        if nodes < 2 or local_ssd in ("0", ""):
            raise UsageError("--compare-local needs --nodes > 1 and --local-ssd SIZE", field="compare-local")
        extra = {k: v for k, v in common.items() if k not in ("local_ssd_bytes", "nodes")}
        for d in drams:
            for p in policies:
                configs += local_vs_shared(d, local_ssd, nodes, policy=p, **extra)
    m = _model(model, kv_bytes_per_token, dtype)
    g = resolve_gpu(gpu, mfu=mfu, dollars_per_hour=gpu_price)
    response = ResponseModel(dram_fixed_s=dram_latency_ms / 1e3, dram_bytes_per_s=dram_gbps * 1e9,
                             flash_fixed_s=flash_latency_ms / 1e3, flash_bytes_per_s=flash_gbps * 1e9,
                             overhead_s=overhead_ms / 1e3, recompute_flops_per_s=g.effective_flops)
    trace = _load(trace_path, fmt, block_tokens, share_tenants)
    values = None
    if any(c.parsed_policy.kind == "value" for c in configs):
        from .value import future_reuse, parse_horizon

        values = future_reuse(trace, model=m, gpu=g, horizon_s=parse_horizon(horizon)).value_dollars
    t0 = time.perf_counter()
    table = sweep(trace, configs, model=m, gpu=g, response=response, eviction=eviction.value, values=values,
                  warmup=warmup, workers=min(workers, len(configs)))
    elapsed = time.perf_counter() - t0
    if json_out == "-":
        _write_json("-", {"configs": table.to_dicts()})
    else:
        _render_whatif(trace_path, table, elapsed, len(configs))
    if out is not None:
        write_table(table, out, metadata={"model": m.name, "kv_bytes_per_token": m.kv_bytes_per_token,
                                          "eviction": eviction.value})
    if plot is not None:
        from .charts import frontier_chart, save_chart

        save_chart(frontier_chart(table), plot)
    if json_out and json_out != "-":
        _write_json(json_out, {"configs": table.to_dicts()})
    for label, p in (("table", out), ("plot", plot), ("json", json_out)):
        if p is not None and p != "-":
            err_console.print(f"wrote {label}: {p}", markup=False)


def _render_whatif(trace_path: Path, table, elapsed: float, n: int) -> None:
    t = Table(title=f"{trace_path.name}: tier what-ifs (usable-prefix token shares, unconditional)")
    heads = ("config", "DRAM", "flash", "miss", "compute saved", "flash writes/day", "DWPD", "flash read mean",
             "peak", "promotions", "p50", "p99")
    for h in heads:
        t.add_column(h, justify="left" if h == "config" else "right")
    ms = lambda x: "-" if x is None else f"{x * 1e3:,.1f} ms"  # noqa: E731
    for r in table.iter_rows(named=True):
        flash_share = (r.get("h_flash_token") or 0.0) + (r.get("h_local_token") or 0.0)
        bw = lambda x: "-" if x is None else format_bytes(x) + "/s"  # noqa: E731
        dwpd = r.get("flash_dwpd") if r.get("flash_dwpd") is not None else r.get("local_dwpd")
        t.add_row(
            str(r["config"]), _fmt_rate(r.get("h_dram_token")), _fmt_rate(flash_share), _fmt_rate(r.get("miss_token")),
            _fmt_rate(r.get("hit_rate_compute")),
            "-" if r.get("flash_write_bytes_per_day") is None else format_bytes(r["flash_write_bytes_per_day"]),
            "-" if dwpd is None else f"{dwpd:.2f}",
            bw(r.get("flash_read_bytes_per_s_mean")), bw(r.get("flash_read_bytes_per_s_peak")),
            f"{r.get('promotions') or 0:,}", ms(r.get("service_time_p50_s")), ms(r.get("service_time_p99_s")),
        )
    console.print(t)
    console.print(f"[dim]{n} configuration(s) in {elapsed:.2f} s[/dim]")


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
