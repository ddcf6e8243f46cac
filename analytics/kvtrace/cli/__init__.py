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
import typer.core
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from kvtrace import __version__, names
from kvtrace.errors import KvtraceError, UsageError, _printable
from kvtrace.units import format_bytes, format_seconds, parse_sizes

def _click_exceptions():
    """The exceptions module of the click that typer runs on (typer >= 0.20 vendors its own)."""
    return sys.modules[typer.BadParameter.__module__]


class _OneLineUsageErrors(typer.core.TyperGroup):
    """Usage errors found while parsing the command line (an unknown option, a value of
    the wrong type, a missing argument) as one ``kvtrace: error:`` line, exit 2, like
    every other error (DESIGN: one error contract); click would print a boxed block."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        click = _click_exceptions()
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.NoArgsIsHelpError as exc:  # `kvtrace` alone: the help, as usual
            from typer import rich_utils

            rich_utils.rich_format_error(exc)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            where = exc.ctx.command_path if getattr(exc, "ctx", None) is not None else "kvtrace"
            msg = " ".join(exc.format_message().split())
            err_console.print(f"kvtrace: error: {msg} (see '{where} --help')", markup=False, soft_wrap=True)
            sys.exit(exc.exit_code)
        except typer.Abort:
            err_console.print("kvtrace: aborted", markup=False)
            sys.exit(1)
        # non-standalone click returns a command's exit code, and a command returns None
        sys.exit(code if isinstance(code, int) and not isinstance(code, bool) else 0)


def _keep_option_names_whole() -> None:
    """``--help`` never cuts an option's name (``--kv-bytes-per-…`` at 80 columns and in
    pipes): the columns of typer's option table that hold names and short flags take
    their widest entry and do not wrap; the type and help columns give way instead."""
    from rich.table import Table as RichTable
    from typer import rich_utils

    class _OptionsTable(RichTable):
        def add_row(self, *renderables, **kwargs):
            super().add_row(*renderables, **kwargs)
            for column, cell in zip(self.columns[:-2], renderables[:-2]):  # all but the types and the help
                plain = getattr(cell, "plain", str(cell))
                column.min_width = max(column.min_width or 0, len(plain))
                column.no_wrap = True

    rich_utils.Table = _OptionsTable


_keep_option_names_whole()

app = typer.Typer(
    name="kvtrace",
    cls=_OneLineUsageErrors,
    help="Where should KV-cache context live, and how much memory and flash to buy? "
    "Replays LLM request traces (prompts as chains of block hashes) through exact cache models.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
# Wide tables wrap badly at Rich's 80-column default for pipes and logs (the whatif
# comparison is about 180 columns wide; tables take only the width they need).
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200
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


#: library field names (dataclass attributes) -> the command-line option that sets them
_OPTION_OF_FIELD = {
    "dollars_per_hour": "gpu-price", "peak_flops": "gpu", "recompute_flops_per_s": "gpu",
    "dram_fixed_s": "dram-latency-ms", "dram_bytes_per_s": "dram-gbps", "flash_fixed_s": "flash-latency-ms",
    "flash_bytes_per_s": "flash-gbps", "overhead_s": "overhead-ms", "write_dollars_per_tb": "write-cost",
    "read_dollars_per_tb": "read-cost", "occupancy_dollars_per_tb_month": "occupancy-cost",
    "kv_bytes_per_token": "kv-bytes-per-token", "block_tokens": "block-tokens", "rate_per_s": "rate",
}


def _path(value: str) -> Path:
    """A path option or argument: an empty string is a usage error (``Path('')`` would
    silently be the current directory)."""
    if not value.strip():
        raise typer.BadParameter("expected a path, got an empty string")
    return Path(value)


#: what to try when a command runs out of memory, by command
_OUT_OF_MEMORY_ADVICE = {
    "curve": "try --stream (a Parquet trace; convert it once with kvtrace ingest) or --sample-rate 0.01",
    "stats": "try --stream (a Parquet trace; convert it once with kvtrace ingest)",
    "value": "try --stream (a Parquet trace; convert it once with kvtrace ingest)",
    "whatif": "try --stream (a Parquet trace; convert it once with kvtrace ingest) or --workers 1",
}


def _out_of_memory(command: str, kwargs: dict) -> str:
    """The one line for a MemoryError: the trace, the command and what would help."""
    trace = next((kwargs[k] for k in ("trace_path", "src", "target") if kwargs.get(k) is not None), None)
    advice = _OUT_OF_MEMORY_ADVICE.get(command, "analyse a part of the trace (a time window, or fewer shards)")
    where = f"{trace}: " if trace is not None else ""
    return f"{where}out of memory in kvtrace {command.replace('_', ' ')}: {advice}"


def handles_errors(fn: Callable) -> Callable:
    """One-line errors: KvtraceError -> exit 1 (UsageError -> 2); tracebacks only with --debug.

    The command's outputs form one transaction (kvtrace.outputs.output_transaction):
    they replace their destinations together when the command returns, and an error
    or an interrupt leaves every destination as it was."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from kvtrace.outputs import output_transaction

        try:
            with output_transaction():
                return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, _click_exceptions().ClickException):
            raise
        except KvtraceError as exc:
            if _state["debug"]:
                raise
            if exc.path is None and exc.field in _OPTION_OF_FIELD:  # the option the user typed, not the attribute
                exc.field = _OPTION_OF_FIELD[exc.field]
            err_console.print(f"kvtrace: error: {exc.one_line()}", markup=False, soft_wrap=True)
            raise typer.Exit(2 if isinstance(exc, UsageError) else 1) from None
        except KeyboardInterrupt:
            err_console.print("kvtrace: interrupted", markup=False)
            raise typer.Exit(130) from None
        except MemoryError:
            if _state["debug"]:
                raise
            err_console.print(f"kvtrace: error: {_printable(_out_of_memory(fn.__name__, kwargs))}", markup=False,
                              soft_wrap=True)
            raise typer.Exit(1) from None
        except OSError as exc:
            if _state["debug"]:
                raise
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            err_console.print(f"kvtrace: error: {where}{exc.strerror or exc}", markup=False, soft_wrap=True)
            raise typer.Exit(1) from None
        except Exception as exc:  # a bug, or bad input that no check anticipated: still one line
            if _state["debug"]:
                raise
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            err_console.print(f"kvtrace: error: internal error ({type(exc).__name__}: {first}); "
                              "rerun with --debug for the traceback and please report it",
                              markup=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper


class Fmt(str, Enum):
    auto = "auto"
    mooncake = "mooncake"
    bailian = "bailian"
    parquet = "parquet"
    csv = "csv"
    tokens = "tokens"
    openai = "openai"


#: the request-log options of the current command (--format tokens|openai), set by with_log_options
_LOG_OPTIONS: "contextvars.ContextVar" = None  # type: ignore[assignment]
#: (parameter, option, help) of every request-log option; the defaults are kvtrace.ingest.LogOptions's
_LOG_PARAMS = (
    ("tokens_field", "--tokens-field", "Token log: the field of the prompt's token ids (default prompt_token_ids)."),
    ("time_field", "--time-field", "Token log: the arrival time field (default timestamp; seconds, ms or ISO-8601: "
     "detected and stated)."),
    ("time_unit", "--time-unit", "Request logs: the timestamps' unit, s, ms, us, ns or iso (default: detected and "
     "stated)."),
    ("salt_field", "--salt-field", "Token log: the cache-salt field (default cache_salt; vLLM hashes it into the "
     "first block)."),
    ("lora_field", "--lora-field", "Token log: the LoRA adapter name field (default lora_name; part of vLLM's block "
     "hashes)."),
    ("hash_fn", "--hash", "Request logs: vLLM's prefix-cache hash, sha256 (vLLM's default) or sha256_cbor."),
    ("hash_seed", "--hash-seed", "Request logs: the PYTHONHASHSEED vLLM ran with (it seeds NONE_HASH; default 0)."),
    ("tokenizer", "--tokenizer", "Chat log (--format openai): a local Hugging Face tokenizer, DIR or tokenizer.json "
     "(nothing is downloaded)."),
    ("chat_template", "--chat-template", "Chat log: a Jinja chat template overriding the tokenizer's."),
)


def with_log_options(fn: Callable) -> Callable:
    """Give a command the request-log options (``--tokens-field`` ... ``--chat-template``)
    without repeating them in its signature: they are added to the signature typer
    reads and handed to :func:`_load` as one :class:`kvtrace.ingest.LogOptions`."""
    import contextvars
    import inspect

    global _LOG_OPTIONS
    if _LOG_OPTIONS is None:
        _LOG_OPTIONS = contextvars.ContextVar("kvtrace_log_options", default=None)
    sig = inspect.signature(fn)
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=Optional[str],
                               default=typer.Option(None, opt, help=text, rich_help_panel="Request logs"))
             for name, opt, text in _LOG_PARAMS]
    extra += [
        inspect.Parameter("rechain", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
            False, "--rechain", rich_help_panel="Block ids",
            help="The trace hashes each block on its own: chain its ids so that a block is reused only after "
                 "the same prefix (kvtrace stats reports whether a trace is chained).")),
        inspect.Parameter("reblock", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[int], default=typer.Option(
            None, "--reblock", min=1, max=1 << 20, rich_help_panel="Block ids",
            help="Coarsen the trace to N tokens per block, a whole multiple of its own (what if the engine used "
                 "larger blocks); on a canonical Parquet trace --block-tokens N does the same.")),
    ]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from kvtrace.ingest import LogOptions

        given = {name: kwargs.pop(name, None) for name, _, _ in _LOG_PARAMS}
        token = _LOG_OPTIONS.set(LogOptions.from_options(**given, rechain=kwargs.pop("rechain", False),
                                                         reblock=kwargs.pop("reblock", None)))
        try:
            return fn(*args, **kwargs)
        finally:
            _LOG_OPTIONS.reset(token)

    wrapper.__signature__ = sig.replace(parameters=list(sig.parameters.values()) + extra)
    wrapper.__annotations__ = {**getattr(fn, "__annotations__", {}), **{p.name: p.annotation for p in extra}}
    return wrapper


def _log_options():
    return None if _LOG_OPTIONS is None else _LOG_OPTIONS.get()


class Eviction(str, Enum):
    prefix_aware = "prefix-aware"
    flat = "flat"


class Engine(str, Enum):
    local = "local"
    dask = "dask"


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


class ExportFmt(str, Enum):
    mooncake = "mooncake"
    bailian = "bailian"


class SynthFmt(str, Enum):
    mooncake = "mooncake"
    bailian = "bailian"
    parquet = "parquet"


# Options shared by the commands that read a trace or need a model.
FormatOpt = typer.Option(Fmt.auto, "--format", "-f", help="Input format (auto-detected from suffix and fields).")
BlockTokensOpt = typer.Option(None, "--block-tokens", min=1, max=1 << 20, help="Tokens per block (default: the format's; required for generic tables).")
ShareTenantsOpt = typer.Option(False, "--share-tenants", help="Equal hashes in different tenants are the same block.")
ModelOpt = typer.Option(None, "--model", "-m", help="Model preset or path to a Hugging Face config.json (default Llama-3.1-70B; see `kvtrace models`).")
KvBytesOpt = typer.Option(None, "--kv-bytes-per-token", min=1, max=1 << 24, help="Override KV bytes per token.")
DtypeOpt = typer.Option(None, "--dtype", help="KV-cache dtype: fp32, bf16, fp16, fp8, int8, fp4.")
EngineOpt = typer.Option(Engine.local, "--engine", help="local (this machine) or dask (a Dask cluster; pip install 'kvtrace\\[dask]'): curve gives a partitioned estimate with its error bound, whatif runs one configuration per task.")
SchedulerOpt = typer.Option(None, "--scheduler", help="Dask scheduler address, e.g. tcp://10.0.0.5:8786 (default: start a local cluster of --workers processes).")


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


def _load(path: Path, fmt: Fmt, block_tokens: Optional[int], share_tenants: bool = False,
          workload: Optional[str] = None):
    """Load a trace; ``workload`` (a key of kvtrace.ingest.guard.PROFILES) refuses, before the
    access table is built, a run that would not fit in memory."""
    from kvtrace.ingest import load_trace

    trace = load_trace(path, fmt=fmt.value, block_tokens=block_tokens, share_tenants=share_tenants,
                       workload=workload, log=_log_options())
    for w in trace.warnings:
        err_console.print(f"kvtrace: warning: {path}: {w}", markup=False, soft_wrap=True)
    return trace


def _model(model: Optional[str], kv_bytes: Optional[int], dtype: Optional[str]):
    from kvtrace.model import resolve_model

    return resolve_model(model, dtype=dtype, kv_bytes_per_token=kv_bytes)


def _fmt_rate(x) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def _fmt_num(x, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, int) or float(x).is_integer() and abs(x) < 1e15:
        return f"{int(x):,}"
    return f"{x:,.{digits}g}" if abs(x) < 1000 else f"{x:,.0f}"


def _check_paths(outputs: dict, inputs: dict | None = None, json_out: Optional[str] = None) -> None:
    """Before any work: ``--json``'s suffix, and every output against the inputs and each
    other (kvtrace.outputs.check_outputs: never an input, never two outputs in one file,
    every location writable)."""
    from kvtrace.outputs import check_json_target, check_outputs

    check_json_target(json_out)
    check_outputs({**outputs, "json": json_out}, inputs)


def _write_json(path: str, obj) -> None:
    from kvtrace.outputs import _json_safe, write_json_atomic

    if path == "-":
        sys.stdout.write(json.dumps(_json_safe(obj), indent=2) + "\n")
    else:
        write_json_atomic(path, obj)


# ---------------------------------------------------------------------------- ingest
@app.command()
@handles_errors
@with_log_options
def ingest(
    src: Path = typer.Argument(..., parser=_path, help="Trace: Mooncake/Bailian JSONL (gzip/zstd ok, or a directory of shards), Parquet or CSV."),
    out: Path = typer.Option(..., "--out", "-o", parser=_path, help="Canonical Parquet to write (a .jsonl with "
                                                                       "--anonymize)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
    anonymize: bool = typer.Option(False, "--anonymize", help="Write a shareable JSONL instead: dense block ids, "
                                                              "trace-relative times, lengths; no tokens or text."),
    to: ExportFmt = typer.Option(ExportFmt.mooncake, "--to", help="The --anonymize format: mooncake or bailian."),
) -> None:
    """Convert a trace to kvtrace's canonical Parquet (request table + metadata).

    Every other command reads the source formats directly; ingest once to skip
    re-parsing large JSONL files (and hashing or tokenizing request logs).
    """
    from kvtrace.ingest import build_trace, distinct_blocks, load_requests, write_canonical

    if anonymize and out.suffix != ".jsonl":
        raise UsageError(f"--anonymize writes JSONL: name the output .jsonl, got '{out.name}'", field="out")
    _check_paths({"out": out}, {"TRACE": src})
    t0 = time.perf_counter()
    log = _log_options()
    if fmt.value == "tokens" and not (anonymize or log.rechain or log.reblock) and _ingest_token_log(
            src, out, block_tokens, share_tenants, log, t0):
        return
    df, meta, warnings = load_requests(src, fmt=fmt.value, block_tokens=block_tokens, share_tenants=share_tenants,
                                       workload="ingest", log=log)
    for w in warnings:
        err_console.print(f"kvtrace: warning: {src}: {w}", markup=False, soft_wrap=True)
    if anonymize:
        from kvtrace.ingest.anonymize import write_anonymized
        from kvtrace.ingest.jsonl import BAILIAN_BLOCK_TOKENS, MOONCAKE_BLOCK_TOKENS

        n = write_anonymized(build_trace(df, meta, []), out, to.value)
        native = {"mooncake": MOONCAKE_BLOCK_TOKENS, "bailian": BAILIAN_BLOCK_TOKENS}[to.value]
        again = "" if meta.block_tokens == native else f" --block-tokens {meta.block_tokens}"
        console.print(f"wrote {out}: {n:,} requests as anonymised {to.value} JSONL ({meta.block_tokens} tokens/block) "
                      f"in {time.perf_counter() - t0:.2f} s; read it back with `kvtrace curve {out.name}{again}`",
                      soft_wrap=True, markup=False)
        return
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


def _ingest_token_log(src: Path, out: Path, block_tokens: Optional[int], share_tenants: bool, log,
                      t0: float) -> bool:
    """Hash a token log chunk by chunk into ``out`` (memory: one chunk); False when its
    timestamps go back (then the in-memory read sorts it)."""
    import pyarrow.parquet as pq

    from kvtrace.ingest.guard import parquet_list_values
    from kvtrace.ingest.tokens import UnsortedLog, write_token_parquet
    from kvtrace.outputs import atomic_path

    spec = log.hash_spec(block_tokens)
    try:
        with atomic_path(out) as tmp:
            got = write_token_parquet(src, tmp, fields=log.fields, spec=spec, time_unit=log.time_unit,
                                      share_tenants=share_tenants)
            md = pq.read_metadata(tmp)
            rows, n_acc = md.num_rows, parquet_list_values(md)[0]  # a log's every request has >= 1 block
    except UnsortedLog:
        return False
    for w in got.notes:
        err_console.print(f"kvtrace: warning: {src}: {w}", markup=False, soft_wrap=True)
    console.print(f"wrote {out}: {rows:,} requests, {n_acc:,} block accesses (tokens, {spec.block_tokens} "
                  f"tokens/block, {spec.hash_fn}) in {time.perf_counter() - t0:.2f} s, hashed chunk by chunk",
                  soft_wrap=True, markup=False)
    return True


# ---------------------------------------------------------------------------- stats
@app.command()
@handles_errors
@with_log_options
def stats(
    trace_path: Path = typer.Argument(..., metavar="TRACE", parser=_path, help="Trace file (JSONL, Parquet or CSV)."),
    model: Optional[str] = ModelOpt,
    kv_bytes_per_token: Optional[int] = KvBytesOpt,
    dtype: Optional[str] = DtypeOpt,
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
    json_out: Optional[str] = typer.Option(None, "--json", help="Also write the figures as JSON to this file ('-' = stdout only)."),
    stream: Optional[bool] = typer.Option(None, "--stream/--no-stream", help="Read a Parquet trace in chunks, memory bounded by its distinct blocks and requests, same figures bit for bit (default: when the in-memory run would exceed half the available memory or $KVTRACE_MEMORY_BUDGET)."),
) -> None:
    """What is in a trace: size, arrivals, lengths, reuse and the most valuable shared prefixes."""
    from kvtrace.analyses.stats import trace_stats

    _check_paths({}, {"TRACE": trace_path}, json_out)
    m = _model(model, kv_bytes_per_token, dtype)  # before a long scan
    trace = _open_stats_trace(trace_path, fmt, block_tokens, share_tenants, stream)
    if hasattr(trace, "close"):  # streamed: passes over the spill files, which close removes
        try:
            with _progress() as prog:
                task = prog.add_task("stats (streaming)", total=max(trace.n_accesses, 1))
                result = trace_stats(trace, m, progress=lambda d, t: prog.update(task, completed=d, total=t))
        finally:
            trace.close()
    else:
        result = trace_stats(trace, m)
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
        ("block ids prefix-chained", "yes" if s["chained"] else
         f"no: {_fmt_rate(s['multi_parent_block_share'])} of blocks follow more than one parent (--rechain)"),
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


def _open_stats_trace(trace_path: Path, fmt: Fmt, block_tokens: Optional[int], share_tenants: bool,
                      stream: Optional[bool]):
    """The trace in memory, or scanned in chunks (kvtrace.ingest.stream) when stats should stream."""
    from kvtrace.analyses.stats import STREAM_COLUMNS, should_stream

    if not should_stream(trace_path, fmt.value, stream):
        return _load(trace_path, fmt, block_tokens, share_tenants, workload="stats")
    return _scan_streamed(trace_path, fmt, block_tokens, share_tenants, STREAM_COLUMNS)


# ---------------------------------------------------------------------------- models
@app.command()
@handles_errors
def models(
    block_tokens: int = typer.Option(512, "--block-tokens", min=1, max=1 << 20, help="Block size for the bytes-per-block column."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the tables as JSON to this file ('-' = stdout)."),
) -> None:
    """Model presets (KV bytes per token and per block) and GPU presets."""
    from kvtrace.model import gpus_table, models_table

    _check_paths({}, None, json_out)
    mt, gt = models_table(block_tokens), gpus_table()
    if json_out:
        _write_json(json_out, {"models": mt.to_dicts(), "gpus": gt.to_dicts()})
        if json_out == "-":
            return
    t = Table(title=f"model presets (bytes per block at {block_tokens} tokens)")
    heads = {"kv_bytes_per_token": "KV bytes/token", "bytes_per_block": "bytes/block", "active_params": "active params"}
    for c in mt.columns:
        t.add_column(heads.get(c, c), justify="left" if c in ("name", "attention", "dtype") else "right")
    for r in mt.iter_rows(named=True):
        t.add_row(*[f"{v / 1e9:,.1f} B" if c == "active_params" else _fmt_num(v) if isinstance(v, (int, float))
                    else str(v) for c, v in r.items()])
    console.print(t)
    g = Table(title="GPU presets (dense BF16 peak; prices illustrative)")
    for head in ("name", "peak TFLOP/s", "MFU", "effective TFLOP/s", "$/GPU-hour"):
        g.add_column(head, justify="left" if head == "name" else "right")
    for r in gt.iter_rows(named=True):
        g.add_row(r["name"], f"{r['peak_flops'] / 1e12:,.0f}", f"{r['mfu']:g}", f"{r['effective_flops'] / 1e12:,.1f}",
                  f"${r['dollars_per_hour']:,.2f}")
    console.print(g)


# ---------------------------------------------------------------------------- app
@app.command("app")
@handles_errors
@with_log_options
def app_command(
    trace_path: Optional[Path] = typer.Argument(None, metavar="TRACE", help="Trace to open (default: the bundled sample chat.jsonl)."),
    port: int = typer.Option(8501, "--port", "-p", min=1, max=65535, help="Port to serve on (localhost)."),
    headless: bool = typer.Option(False, "--headless", help="Do not open a browser tab (servers, CI)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
    data_dir: Optional[Path] = typer.Option(None, "--data-dir", help="Directory that paths typed in the page are confined to (default: TRACE's directory, else the bundled samples)."),
    max_trace_bytes: str = typer.Option("4GiB", "--max-trace-bytes", help="Largest trace file, directory of shards or upload the page reads, e.g. 4GiB."),
) -> None:
    """Interactive dashboard (Streamlit): overview, curves, what-ifs and sizing in the browser.

    Serves on localhost until Ctrl+C; opens on TRACE, or on the bundled sample when
    none is given. Every figure comes from the same functions as the commands. Paths
    typed in the page are read under --data-dir only, up to --max-trace-bytes.
    """
    import signal
    import subprocess

    from kvtrace.results.appdata import LoadOptions, streamlit_command
    from kvtrace.units import parse_size

    argv, env = streamlit_command(trace_path, port=port, headless=headless,
                                  options=LoadOptions(fmt.value, block_tokens, share_tenants, log=_log_options()), data_dir=data_dir,
                                  max_trace_bytes=parse_size(max_trace_bytes, field="max-trace-bytes"))
    err_console.print(f"kvtrace app: serving on http://localhost:{port} (Ctrl+C stops it)", markup=False)
    proc = subprocess.Popen(argv, env=env)
    stopped = []

    def stop(signum, frame):  # a SIGTERM (supervisor, CI) must not leave Streamlit running orphaned
        stopped.append(signum)
        proc.terminate()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        code = proc.wait()
    except KeyboardInterrupt:  # Streamlit got the same SIGINT: let it shut down
        stopped.append(signal.SIGINT)
        try:
            code = proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.terminate()
            code = proc.wait()
    finally:
        signal.signal(signal.SIGTERM, previous)
    if code and not stopped:
        raise typer.Exit(code)


# ---------------------------------------------------------------------------- synth
@app.command()
@handles_errors
def synth(
    kind: SynthKind = typer.Option(SynthKind.chat, "--kind", help="Workload: chat, agent, rag or mixed."),
    requests: int = typer.Option(2000, "--requests", "-n", min=1, help="Number of requests."),
    seed: int = typer.Option(0, "--seed", min=0, max=2**63 - 1, help="Random seed (same seed, same trace)."),
    out: Path = typer.Option(..., "--out", "-o", parser=_path, help="File to write."),
    fmt: SynthFmt = typer.Option(SynthFmt.mooncake, "--format", help="mooncake / bailian JSONL, or canonical parquet."),
    block_tokens: Optional[int] = typer.Option(None, "--block-tokens", min=1, max=1 << 20, help="Tokens per block (default 512; 16 for bailian)."),
    rate: Optional[float] = typer.Option(None, "--rate", min=1e-6, help="Mean session arrival rate, per second."),
    chunk_requests: Optional[int] = typer.Option(None, "--chunk-requests", min=1, help="Generate and write in chunks of this many requests (very large traces)."),
) -> None:
    """Generate a realistic synthetic trace (multi-turn chat, tool agents, RAG, shared system prompts)."""
    from kvtrace.ingest import synth as synth_mod

    _check_paths({"out": out})
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
@with_log_options
def curve(
    trace_path: Path = typer.Argument(..., metavar="TRACE", parser=_path, help="Trace file (JSONL, Parquet or CSV)."),
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
    out: Optional[Path] = typer.Option(None, "--out", "-o", parser=_path, help="Write the curve table: .parquet, .csv or .json."),
    plot: Optional[Path] = typer.Option(None, "--plot", parser=_path, help="Write a chart: .html (self-contained), .png or .svg."),
    distances_out: Optional[Path] = typer.Option(None, "--distances-out", parser=_path, help="Write per-access distances (.parquet/.csv/.json) for SQL."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the curve rows (as --out x.json), ceiling, knees and info as JSON ('-' = stdout only)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
    stream: Optional[bool] = typer.Option(None, "--stream/--no-stream", help="Read a Parquet trace in chunks, memory bounded by its distinct blocks, same results bit for bit (default: when the in-memory run would exceed half the available memory or $KVTRACE_MEMORY_BUDGET)."),
    engine: Engine = EngineOpt,
    scheduler: Optional[str] = SchedulerOpt,
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes of the local Dask cluster (--engine dask without --scheduler; default 2)."),
    partitions: Optional[int] = typer.Option(None, "--partitions", min=1, help="Spatial partitions of a Dask curve (default: the cluster's worker threads, at least 2)."),
) -> None:
    """Capacity-hit curves: what each cache size saves, in requests, tokens, bytes and GPU compute.

    Exact byte-LRU reuse distances (one pass) give hits at every capacity. Prints a
    table at round capacities, the ceiling (infinite cache) and the capacities that
    reach 50/80/90/95/99 % of it.
    """
    from kvtrace.analyses.curves import compute_curve
    from kvtrace.analyses.distances import distances_table, reuse_distances
    from kvtrace.model import resolve_gpu
    from kvtrace.outputs import table_format, write_table

    for p in (out, distances_out):
        if p is not None:
            table_format(p)  # fail on a bad suffix before the work, not after
    if plot is not None and plot.suffix.lower() not in (".html", ".png", ".svg"):
        found = f"suffix '{plot.suffix}'" if plot.suffix else "no suffix"
        raise UsageError(f"unsupported plot file ({found}): expected .html, .png or .svg", field="plot")
    if sample_rate is not None and not 2.0**-24 <= sample_rate <= 1:
        raise UsageError(f"expected a rate in [2**-24, 1] (the sampling hash resolves 2**-24), got {sample_rate}",
                         field="sample-rate")
    if sample_rate is not None and distances_out is not None and sample_rate < 1:
        raise UsageError("--distances-out needs exact distances: drop --sample-rate", field="distances-out")
    if capacity is not None and not capacity.strip(" ,"):
        raise UsageError("expected sizes such as 64GiB,1TiB, got an empty list (leave --capacity out for the "
                         "default grid)", field="capacity")
    _dask_only(engine, scheduler=scheduler, workers=workers, partitions=partitions)
    _check_paths({"out": out, "plot": plot, "distances-out": distances_out}, {"TRACE": trace_path}, json_out)
    m = _model(model, kv_bytes_per_token, dtype)
    g = resolve_gpu(gpu, mfu=mfu, dollars_per_hour=gpu_price)
    caps = parse_sizes(capacity) if capacity else None
    dist = None
    if engine == Engine.dask:
        for flag, value in (("distances-out", distances_out), ("by", by), ("sample-rate", sample_rate)):
            if value is not None:
                raise UsageError(f"--{flag} is not available with --engine dask", field=flag)
        t0 = time.perf_counter()
        result = _curve_on_dask(trace_path, scheduler, workers or 2, partitions, fmt, block_tokens, share_tenants,
                                model=m, gpu=g, eviction=eviction.value, capacities=caps, points=points,
                                warmup=warmup)
    else:
        trace = _open_curve_trace(trace_path, fmt, block_tokens, share_tenants, stream, by, distances_out)
        t0 = time.perf_counter()
        display_caps = None
        if caps is None:
            display_caps = _round_capacities(trace.meta.block_tokens * m.kv_bytes_per_token,
                                             int(trace.block_size.sum()) * m.kv_bytes_per_token) or None
        with _progress() as prog:
            task = prog.add_task("reuse distances", total=max(trace.n_accesses, 1))
            cb = lambda done, total: prog.update(task, completed=done, total=total)  # noqa: E731
            if distances_out is not None:
                dist = reuse_distances(trace, eviction.value, details=True, progress=cb)
            try:
                result = compute_curve(
                    trace, model=m, gpu=g, eviction=eviction.value, capacities=caps,
                    display_capacities=display_caps, points=points, warmup=warmup, by=by.value if by else None,
                    sample_rate=sample_rate, distances=dist, progress=cb,
                )
                from kvtrace.analyses.curves import shared_first_block

                result.info["shared_first_block"] = shared_first_block(trace, result.info["first_measured_request"])
            finally:
                if hasattr(trace, "close"):  # a streamed trace removes its spill files
                    trace.close()
    display = result.display if result.display is not None else result.curve
    elapsed = time.perf_counter() - t0

    meta = {"info": result.info, "ceiling": result.ceiling, "knees": result.knees.to_dicts()}
    import polars as pl

    table = result.curve
    if result.by_group is not None:
        table = pl.concat([result.curve.insert_column(0, pl.lit("all").alias("group_name")), result.by_group],
                          how="diagonal_relaxed").insert_column(0, pl.lit(result.info["by"]).alias("group_by"))
    document = {**meta, "rows": table.to_dicts()} if json_out else None  # the rows of --out x.json, and the rest
    if json_out == "-":
        _write_json("-", document)
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
        _write_json(json_out, document)
    for label, p in (("curve", out), ("plot", plot), ("distances", distances_out), ("json", json_out)):
        if p is not None and p != "-":
            err_console.print(f"wrote {label}: {p}", markup=False)


def _dask_only(engine: "Engine", **given) -> None:
    """Options that only a Dask run reads are usage errors without ``--engine dask``
    (rather than silently ignored)."""
    if engine == Engine.dask:
        return
    for name, value in given.items():
        if value is not None:
            raise UsageError(f"--{name} applies only with --engine dask", field=name)


def _open_curve_trace(trace_path: Path, fmt: Fmt, block_tokens: Optional[int], share_tenants: bool,
                      stream: Optional[bool], by, distances_out):
    """The trace in memory, or scanned in chunks (kvtrace.ingest.stream) when it should stream."""
    from kvtrace.ingest.stream import should_stream

    if not should_stream(trace_path, fmt.value, stream):
        return _load(trace_path, fmt, block_tokens, share_tenants,
                     workload="curve-distances" if distances_out is not None else "curve")
    if distances_out is not None:
        raise UsageError("--distances-out writes every access: not available on a streamed trace (--no-stream)",
                         field="distances-out")
    keep = {"type": ("type",), "tenant": ("tenant",), "turn": ("turn",),
            "session-length": ("session_id",)}.get(by.value if by else "", ())
    return _scan_streamed(trace_path, fmt, block_tokens, share_tenants, keep)


def _scan_streamed(trace_path: Path, fmt: Fmt, block_tokens: Optional[int], share_tenants: bool, columns=()):
    """Pass 1 of a streamed run (kvtrace.ingest.stream.open_stream) with a progress bar;
    ``columns``: the request columns to keep (O(requests) memory each)."""
    from kvtrace.ingest.stream import open_stream

    log = _log_options()
    if log is not None and (log.rechain or log.reblock):
        raise UsageError("--rechain and --reblock rewrite every request's block ids in memory: write the trace "
                         "once with `kvtrace ingest TRACE --rechain --reblock N -o t.parquet` (or run --no-stream)",
                         field="stream")
    err_console.print(f"kvtrace: streaming {trace_path.name} in row-group chunks: memory bounded by its distinct "
                      "blocks, results equal to the in-memory run", markup=False, soft_wrap=True)
    with _progress() as prog:
        task = prog.add_task("scan (streaming)", total=1)
        trace = open_stream(trace_path, fmt=fmt.value, block_tokens=block_tokens, share_tenants=share_tenants,
                            columns=columns, progress=lambda d, t: prog.update(task, completed=d, total=t), log=log)
    for w in trace.warnings:
        err_console.print(f"kvtrace: warning: {trace_path}: {w}", markup=False, soft_wrap=True)
    return trace


def _curve_on_dask(trace_path: Path, scheduler: Optional[str], workers: int, partitions: Optional[int], fmt: Fmt,
                   block_tokens: Optional[int], share_tenants: bool, **options):
    """A partitioned-estimate curve on a Dask cluster (kvtrace.analyses.distributed)."""
    from kvtrace.analyses.distributed import dask_client, partitioned_curve

    bpt = options["model"].kv_bytes_per_token
    if options.get("capacities") is None:
        options["display_capacities"] = lambda b, total: _round_capacities(b * bpt, total * bpt) or None
    with dask_client(scheduler, workers) as client, _progress() as prog:
        task = prog.add_task("partitions (dask)", total=1)
        result = partitioned_curve(trace_path, client=client, partitions=partitions, fmt=fmt.value,
                                   block_tokens=block_tokens, share_tenants=share_tenants,
                                   progress=lambda d, t: prog.update(task, completed=d, total=t), **options)
    for w in result.info.get("warnings", []):
        err_console.print(f"kvtrace: warning: {trace_path}: {w}", markup=False, soft_wrap=True)
    return result


def _render_curve(trace_path: Path, result, display, elapsed: float) -> None:
    info = result.info
    title = (f"{trace_path.name}: {info['model']} ({info['kv_bytes_per_token']:,} B/token), "
             f"{info['eviction']} LRU")
    if result.approximate:
        err = info["error_estimate"]
        pts = lambda x: "-" if x is None else f"{100 * x:.2f}"  # noqa: E731  (None: too few sampled accesses)
        title += (f"\nAPPROXIMATE: SHARDS sample rate {info['sample_rate']:g}, est. standard error of the "
                  f"usable-prefix token rate: mean {pts(err['mean_standard_error'])} pts, "
                  f"max {pts(err['max_standard_error'])} pts; half-prefix requests: exact runs only")
    part = info.get("partitioned")
    if part:
        title += (f"\nPARTITIONED ESTIMATE: {part['partitions']} spatial partitions on Dask; error bound of the "
                  f"usable-prefix token rate (3-sigma capacity band, estimated): max {100 * part['max_error_bound']:.2f} "
                  f"pts, mean {100 * part['mean_error_bound']:.2f} pts; half-prefix requests: exact runs only")
    t = Table(title=title)
    cols = ("request_hit_rate", "request_half_prefix_hit_rate", "prefix_token_hit_rate", "token_hit_rate",
            "compute_saved_rate", "gpu_seconds_saved_per_hour", "usd_saved_per_hour", "read_mean_bytes_per_s")
    for head in ("capacity", *map(names.label, cols)):
        t.add_column(head, justify="right")
    for r in display.iter_rows(named=True):
        t.add_row(
            format_bytes(r["capacity_bytes"]), _fmt_rate(r["request_hit_rate"]),
            _fmt_rate(r["request_half_prefix_hit_rate"]), _fmt_rate(r["prefix_token_hit_rate"]),
            _fmt_rate(r["token_hit_rate"]), _fmt_rate(r["compute_saved_rate"]),
            "-" if r["gpu_seconds_saved_per_hour"] is None else f"{r['gpu_seconds_saved_per_hour']:,.1f}",
            "-" if r["usd_saved_per_hour"] is None else f"${r['usd_saved_per_hour']:,.2f}",
            "-" if r["read_mean_bytes_per_s"] is None else format_bytes(r["read_mean_bytes_per_s"]) + "/s",
        )
    c = result.ceiling
    t.add_row(f"∞ ({format_bytes(c['capacity_bytes'])})", _fmt_rate(c["request_hit_rate"]),
              _fmt_rate(c["request_half_prefix_hit_rate"]), _fmt_rate(c["prefix_token_hit_rate"]),
              _fmt_rate(c["token_hit_rate"]),
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
        t.add_row(r["group_name"], _fmt_rate(r["request_hit_rate"]), _fmt_rate(r["prefix_token_hit_rate"]),
                  _fmt_rate(r["compute_saved_rate"]), _fmt_rate(r["ceiling_prefix_token_hit_rate"]))
    console.print(t)


# ---------------------------------------------------------------------------- value
@app.command()
@handles_errors
@with_log_options
def value(
    trace_path: Path = typer.Argument(..., metavar="TRACE", parser=_path, help="Trace file (JSONL, Parquet or CSV)."),
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
    top: int = typer.Option(10, "--top", min=1, max=1_000_000, help="How many prefixes to list."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", parser=_path, help="Write the per-block table: .parquet, .csv or .json."),
    prefixes_out: Optional[Path] = typer.Option(None, "--prefixes-out", parser=_path, help="Write the per-prefix rollup (.parquet/.csv/.json)."),
    accesses_out: Optional[Path] = typer.Option(None, "--accesses-out", parser=_path, help="Write per-access next use, reuses and value (.parquet/.csv/.json)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the summary and top prefixes as JSON ('-' = stdout only)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
    stream: Optional[bool] = typer.Option(None, "--stream/--no-stream", help="Read a Parquet trace in chunks, memory bounded by its distinct blocks and requests (any horizon), same results bit for bit (default: when the in-memory run would exceed half the available memory or $KVTRACE_MEMORY_BUDGET)."),
) -> None:
    """Future-reuse value: which blocks are worth keeping, and which prompts are one-shot.

    Per access: the next use, the reuses within the horizon and the value of keeping
    the block = compute those reuses avoid - write, read and occupancy costs. Per block
    and per prefix family: total value, value per byte and the clairvoyant bound.
    """
    from kvtrace.model import resolve_gpu
    from kvtrace.outputs import table_format, write_table
    from kvtrace.analyses.value import DEFAULT_COSTS, StorageCosts, parse_horizon, value_report

    for p in (out, prefixes_out, accesses_out):
        if p is not None:
            table_format(p)
    _check_paths({"out": out, "prefixes-out": prefixes_out, "accesses-out": accesses_out}, {"TRACE": trace_path},
                 json_out)
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
    trace, streamed = _open_value_trace(trace_path, fmt, block_tokens, share_tenants, stream)
    try:
        t0 = time.perf_counter()
        with _progress() as prog:
            task = prog.add_task("future reuse (streaming)", total=max(trace.n_accesses, 1), visible=streamed)
            cb = lambda done, total: prog.update(task, completed=done, total=total)  # noqa: E731
            result = value_report(trace, model=m, gpu=g, horizon_s=h, costs=costs, progress=cb if streamed else None)
        elapsed = time.perf_counter() - t0
        if json_out == "-":
            _write_json("-", result.to_dict(top))
        else:
            _render_value(trace_path, result, top, elapsed)
        if out is not None:
            write_table(result.per_block, out, metadata=result.summary)
        if prefixes_out is not None:
            write_table(result.per_prefix, prefixes_out, metadata=result.summary)
        if accesses_out is not None:  # a streamed trace makes it again and writes it chunk by chunk, atomically
            with _progress() as prog:
                task = prog.add_task("per-access table (streaming)", total=max(trace.n_accesses, 1), visible=streamed)
                kw = {"progress": lambda d, t: prog.update(task, completed=d, total=t)} if streamed else {}
                result.future.write_table(accesses_out, metadata=result.summary, **kw)
        if json_out and json_out != "-":
            _write_json(json_out, result.to_dict(top))
    finally:
        if streamed:  # removes the spill files
            trace.close()
    for label, p in (("blocks", out), ("prefixes", prefixes_out), ("accesses", accesses_out), ("json", json_out)):
        if p is not None and p != "-":
            err_console.print(f"wrote {label}: {p}", markup=False)


def _open_value_trace(trace_path: Path, fmt: Fmt, block_tokens: Optional[int], share_tenants: bool,
                      stream: Optional[bool]):
    """(trace, streamed): in memory, or scanned in chunks (kvtrace.ingest.stream). Left to
    itself it streams a Parquet trace whose in-memory value run (the guard's "value"
    profile, heavier than a curve's) would exceed the streaming budget."""
    from kvtrace.ingest.stream import should_stream

    if not should_stream(trace_path, fmt.value, stream, workload="value"):
        return _load(trace_path, fmt, block_tokens, share_tenants, workload="value"), False
    return _scan_streamed(trace_path, fmt, block_tokens, share_tenants), True


def _render_value(trace_path: Path, result, top: int, elapsed: float) -> None:
    s = result.summary
    horizon = "infinite" if s.get("horizon_s") is None else format_seconds(s["horizon_s"])
    t = Table(title=f"{trace_path.name}: future-reuse value ({s['model']}, {s['gpu']}, horizon {horizon})",
              show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    money = lambda x: "-" if x is None else f"${x:,.2f}"  # noqa: E731
    depth = s.get("shared_root_blocks") or 0
    below = " below the shared root" if depth else ""
    families = [("blocks / prefix families", f"{s['blocks']:,} / {s['prefixes']:,}")]
    if depth:  # every request starts alike: the families are grouped below that root (kvtrace.analyses.value.shared_root)
        hashes = s["shared_root_hashes"]
        shown = ", ".join(str(h) for h in hashes[:4]) + (f", ... ({len(hashes):,} hashes)" if len(hashes) > 4 else "")
        families = [(f"blocks / prefix families below the shared root ({depth:,} block{'s' if depth > 1 else ''}, "
                     f"carried by {_fmt_rate(s['shared_root_request_share'])} of requests)",
                     f"{s['blocks']:,} / {s['prefixes']:,}"),
                    ("shared root skipped (hashes)", shown)]
    rows = [
        *families,
        ("distinct bytes", format_bytes(s["distinct_bytes"])),
        ("bytes never reused (one-shot)", f"{format_bytes(s['never_reused_bytes'])} "
                                          f"({_fmt_rate(s['never_reused_bytes_share'])})"),
        ("accesses with no reuse within the horizon", _fmt_rate(s["no_reuse_in_horizon_access_share"])),
        ("compute a keep-for-the-horizon cache avoids", money(s["gain_usd"])),
        ("write + read + occupancy cost", money(s["write_cost_usd"] + s["read_cost_usd"]
                                                + s["occupancy_cost_usd"])),
        ("net value of keeping for the horizon", money(s["total_value_usd"])),
        ("clairvoyant bound (best keep/drop per block)", money(s["clairvoyant_bound_usd"])),
        ("bytes in blocks of negative value", _fmt_rate(s["negative_value_bytes_share"])),
    ]
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    q = s.get("value_usd_per_byte_quantiles") or {}
    if q:
        qt = Table(title="value density, $ per TB kept (quantiles over bytes)")
        for k in q:
            qt.add_column(k, justify="right")
        qt.add_row(*["-" if v is None else f"{v * 1e12:,.2f}" for v in q.values()])
        console.print(qt)
    pt = Table(title=f"top {top} prefix families{below} by value")
    for c in ("root hash", "blocks", "bytes", "accesses", "never reused", "value", "$ per TB", "bound"):
        pt.add_column(c, justify="right")
    for r in result.top_prefixes(top).iter_rows(named=True):
        shared = depth and r["root_hash"] == s["shared_root_hashes"][0]
        pt.add_row(f"{r['root_hash']} (shared root)" if shared else str(r["root_hash"]), f"{r['blocks']:,}", format_bytes(r["bytes"]), f"{r['accesses']:,}",
                   format_bytes(r["never_reused_bytes"]), money(r["total_value_usd"]),
                   "-" if r["value_usd_per_byte"] is None else f"{r['value_usd_per_byte'] * 1e12:,.2f}",
                   money(r["clairvoyant_value_usd"]))
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
@with_log_options
def whatif(
    trace_path: Path = typer.Argument(..., metavar="TRACE", parser=_path, help="Trace file (JSONL, Parquet or CSV)."),
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
    stream: Optional[bool] = typer.Option(None, "--stream/--no-stream", help="Replay a Parquet trace chunk by chunk from a spill file, memory bounded by its distinct blocks and requests, same results bit for bit (default: when an in-memory run would exceed half the available memory or $KVTRACE_MEMORY_BUDGET)."),
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
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes for several configurations (default: by the estimated work, serial when starting workers costs more than it saves; with --engine dask: the local cluster's workers, default 2)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", parser=_path, help="Write the comparison table (.parquet/.csv/.json)."),
    plot: Optional[Path] = typer.Option(None, "--plot", parser=_path, help="Frontier chart: flash hit share vs flash bytes written (.html/.png/.svg)."),
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
    from kvtrace.model import resolve_gpu
    from kvtrace.outputs import table_format
    from kvtrace.analyses.response import ResponseModel
    from kvtrace.analyses.whatif import TierConfig, local_vs_shared

    if out is not None:
        table_format(out)
    if plot is not None and plot.suffix.lower() not in (".html", ".png", ".svg"):
        found = f"suffix '{plot.suffix}'" if plot.suffix else "no suffix"
        raise UsageError(f"unsupported plot file ({found}): expected .html, .png or .svg", field="plot")
    drams, flashes, policies = (_comma_list(v, name, example) for v, name, example in (
        (dram, "dram", "256GiB"), (flash, "flash", "8TiB or 0"), (policy, "policy", "all,second-hit")))
    if not grid and (len(drams) > 1 or len(flashes) > 1):
        raise UsageError("several --dram or --flash sizes need --grid", field="grid")
    if engine != Engine.dask and scheduler is not None:
        raise UsageError("--scheduler applies only with --engine dask", field="scheduler")
    _check_paths({"out": out, "plot": plot}, {"TRACE": trace_path}, json_out)
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
    parallel = engine != Engine.dask and min(workers or 2, len(configs)) > 1  # the guard's worst case
    from kvtrace.ingest.stream import should_stream

    if engine == Engine.dask and stream:
        raise UsageError("--engine dask ships the trace to the workers: not with --stream", field="stream")
    streamed = engine != Engine.dask and should_stream(trace_path, fmt.value, stream)
    if streamed:  # keep only the request columns the configurations read (O(requests) each)
        keep = {"request_id", "session_id"} if any(c.nodes > 1 and c.routing != "round-robin"
                                                   for c in configs) else set()
        keep.update(c.parsed_policy.by for c in configs if c.parsed_policy.kind == "group")
        trace = _scan_streamed(trace_path, fmt, block_tokens, share_tenants,
                               sorted({"session-length": "session_id"}.get(k, k) for k in keep))
        if not any(c.nodes > 1 and c.routing == "prefix" for c in configs):
            trace.block_hash = trace.block_tenant = None  # only prefix routing reads them: 12 bytes per block
    else:
        trace = _load(trace_path, fmt, block_tokens, share_tenants,
                      workload="whatif-parallel" if parallel else "whatif")
    try:
        from kvtrace.analyses.whatif import has_session_ids

        if any(c.nodes > 1 and c.routing == "session" for c in configs) and not has_session_ids(trace):
            err_console.print(f"kvtrace: warning: {trace_path}: --routing session: the trace has no session ids, so "
                              "each request is routed by a hash of its own id (a session's turns land on any node, "
                              "as with random routing); --routing prefix keeps requests that share a first block on "
                              "one node", markup=False, soft_wrap=True)
        _whatif_run(trace_path, trace, configs, m, g, response, horizon, eviction, warmup, workers, engine,
                    scheduler, out, plot, json_out)
    finally:
        if streamed:
            trace.close()


def _comma_list(text: str, name: str, example: str) -> list[str]:
    """The items of a comma-separated option; none at all is a usage error."""
    items = [x.strip() for x in text.split(",") if x.strip()]
    if not items:
        raise UsageError(f"expected one or more values such as {example}, got '{text}'", field=name)
    return items


def _whatif_run(trace_path, trace, configs, m, g, response, horizon, eviction, warmup, workers, engine, scheduler,
                out, plot, json_out) -> None:
    from kvtrace.outputs import write_table
    from kvtrace.ingest.stream import StreamedTrace
    from kvtrace.analyses.whatif import sweep

    values = None
    if any(c.parsed_policy.kind == "value" for c in configs):
        from kvtrace.analyses.value import future_reuse, parse_horizon
        from kvtrace.analyses.value_stream import streamed_values

        if isinstance(trace, StreamedTrace):
            values = streamed_values(trace, model=m, gpu=g, horizon_s=parse_horizon(horizon))
        else:
            values = future_reuse(trace, model=m, gpu=g, horizon_s=parse_horizon(horizon)).value_usd
    t0 = time.perf_counter()
    if engine == Engine.dask:  # one configuration per task; the table equals a one-process sweep
        from kvtrace.analyses.distributed import dask_client
        from kvtrace.analyses.distributed import sweep as dask_sweep

        how = "on Dask"
        with dask_client(scheduler, workers or 2) as client, _progress() as prog:
            task = prog.add_task("configurations (dask)", total=len(configs))
            table = dask_sweep(trace, configs, client=client, model=m, gpu=g, response=response,
                               eviction=eviction.value, values=values, warmup=warmup,
                               progress=lambda d, t: prog.update(task, completed=d, total=t))
    else:
        from kvtrace.analyses.whatif import plan_workers

        n_workers, how = plan_workers(len(configs), trace.n_accesses, workers)
        with _progress() as prog:
            task = prog.add_task("configurations", total=len(configs))
            table = sweep(trace, configs, model=m, gpu=g, response=response, eviction=eviction.value,
                          values=values, warmup=warmup, workers=n_workers,
                          progress=lambda d, t: prog.update(task, completed=d, total=t))
    elapsed = time.perf_counter() - t0
    if json_out == "-":
        _write_json("-", {"configs": table.to_dicts()})
    else:
        _render_whatif(trace_path, table, elapsed, len(configs), how)
    if out is not None:
        write_table(table, out, metadata={"model": m.name, "kv_bytes_per_token": m.kv_bytes_per_token,
                                          "eviction": eviction.value})
    if plot is not None:
        from kvtrace.results.charts import frontier_chart, save_chart

        save_chart(frontier_chart(table), plot)
    if json_out and json_out != "-":
        _write_json(json_out, {"configs": table.to_dicts()})
    for label, p in (("table", out), ("plot", plot), ("json", json_out)):
        if p is not None and p != "-":
            err_console.print(f"wrote {label}: {p}", markup=False)


def _render_whatif(trace_path: Path, table, elapsed: float, n: int, how: str = "") -> None:
    t = Table(title=f"{trace_path.name}: tier what-ifs (usable-prefix token shares, unconditional)")
    heads = ("config", "tiers", "DRAM", "SSD/flash", "miss", "compute saved", "writes/day", "DWPD", "read mean",
             "peak", "promotions", "p50", "p99")
    for h in heads:
        t.add_column(h, justify="left" if h in ("config", "tiers") else "right")
    ms = lambda x: "-" if x is None else f"{x:,.1f} ms"  # noqa: E731
    bw = lambda x: format_bytes(x) + "/s"  # noqa: E731
    for r in table.iter_rows(named=True):
        # each row states its own configuration and only its own tiers' figures (local SSD, shared flash or both)
        tiers = [(k, r.get(f"{k}_bytes") or 0) for k in ("local_ssd", "flash")]
        own = [k for k, b in tiers if b]
        per_node = "/node" if (r.get("nodes") or 1) > 1 else ""
        label = " + ".join([f"DRAM {format_bytes(r['dram_bytes'])}{per_node}"]
                           + [f"local SSD {format_bytes(b)}{per_node}" if k == "local_ssd" else
                              f"shared flash {format_bytes(b)}" for k, b in tiers if b]) + (
            f" x {r['nodes']} nodes" if (r.get("nodes") or 1) > 1 else "")
        pre = {"local_ssd": "local", "flash": "flash"}
        share = sum(r.get(f"{pre[k]}_prefix_token_hit_rate") or 0.0 for k in own)
        writes = sum(r.get(f"{pre[k]}_write_bytes_per_day") or 0.0 for k in own)
        dwpd = [r.get(f"{pre[k]}_dwpd") for k in own]
        t.add_row(
            str(r["config"]), label, _fmt_rate(r.get("dram_prefix_token_hit_rate")), _fmt_rate(share) if own else "-",
            _fmt_rate(r.get("prefix_token_miss_rate")), _fmt_rate(r.get("compute_saved_rate")),
            format_bytes(writes) if own else "-",
            " / ".join("-" if d is None else f"{d:.2f}" for d in dwpd) if own else "-",
            bw(sum(r.get(f"{pre[k]}_read_mean_bytes_per_s") or 0.0 for k in own)) if own else "-",
            " / ".join(bw(r.get(f"{pre[k]}_read_peak_bytes_per_s") or 0.0) for k in own) if own else "-",
            f"{r.get('promotions') or 0:,}", ms(r.get("service_time_p50_ms")), ms(r.get("service_time_p99_ms")),
        )
    console.print(t)
    console.print(f"{n} configuration(s) in {elapsed:.2f} s" + (f", {how}" if how else ""), style="dim",
                  markup=False, soft_wrap=True)


# ---------------------------------------------------------------------------- estimate
estimate_app = typer.Typer(
    help="Back-of-the-envelope calculators on given numbers: latency, cost and bandwidth (DESIGN sections 4-5).",
    no_args_is_help=True,
    rich_markup_mode="rich",
)
app.add_typer(estimate_app, name="estimate")


def _print_explain(lines) -> None:
    console.print("how each number is computed:", style="bold")
    for line in lines:
        console.print(f"  {line}", markup=False, soft_wrap=True)


def _money(x) -> str:
    if x is None:
        return "-"
    return f"-${-x:,.2f}" if x < 0 else f"${x:,.2f}"


@estimate_app.command("latency")
@handles_errors
def estimate_latency(
    h_dram: float = typer.Option(..., "--h-dram", help="Share of all requests served from DRAM (unconditional), 0-1."),
    h_flash: float = typer.Option(0.0, "--h-flash", help="Share of all requests served from flash (unconditional: not the hit rate among DRAM misses), 0-1."),
    dram_ms: float = typer.Option(..., "--dram-ms", help="DRAM restore time D, ms."),
    flash_ms: float = typer.Option(..., "--flash-ms", help="Flash restore time F, ms."),
    recompute_ms: float = typer.Option(..., "--recompute-ms", help="Recompute time R of a miss, ms."),
    overhead_ms: float = typer.Option(0.0, "--overhead-ms", help="Per-request overhead O of having the flash tier, ms (every request pays it)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the figures as JSON to this file ('-' = stdout only)."),
) -> None:
    """Mean and tail reusable-prefix time per option, the branch table and the break-even flash latency.

    Means are h_D D + h_F F + (1 - h_D - h_F) R + O; percentiles come from the branch
    distribution, never from averaging.
    """
    from kvtrace.analyses.estimate import latency

    _check_paths({}, None, json_out)
    r = latency(h_dram, h_flash, dram_ms, flash_ms, recompute_ms, overhead_ms)
    if json_out == "-":
        _write_json("-", r.to_dict())
        return
    ms = lambda x: f"{x:,.1f} ms"  # noqa: E731
    t = Table(title="reusable-prefix service time per option")
    for h in ("option", "mean", "P50", "P90", "P99", "P99.9"):
        t.add_column(h, justify="left" if h == "option" else "right")
    for o in r.options:
        t.add_row(o["option"], ms(o["service_time_mean_ms"]), ms(o["service_time_p50_ms"]),
                  ms(o["service_time_p90_ms"]), ms(o["service_time_p99_ms"]), ms(o["service_time_p999_ms"]))
    console.print(t)
    b = Table(title="branches (each a point mass at its time)")
    for h in ("option", "branch", "share", "time"):
        b.add_column(h, justify="left" if h in ("option", "branch") else "right")
    for row in r.branches:
        b.add_row(row["option"], row["branch"], f"{row['share']:.4g}", ms(row["time_ms"]))
    console.print(b)
    be = "none (h_F = 0)" if r.h_flash == 0 else ms(r.break_even_restore_ms)
    console.print(f"break-even flash latency: F < {be}; F = {flash_ms:g} ms "
                  f"{'pays off' if r.flash_pays_off else 'does not pay off'} on average", markup=False)
    _print_explain(r.explain)
    if json_out:
        _write_json(json_out, r.to_dict())
        err_console.print(f"wrote json: {json_out}", markup=False)


@estimate_app.command("cost")
@handles_errors
def estimate_cost(
    hardware: Optional[float] = typer.Option(None, "--hardware", help="Hardware budget of the current option, $."),
    months: float = typer.Option(36.0, "--months", help="Amortisation, months (straight line, zero residual)."),
    support: float = typer.Option(0.0, "--support", help="Software support of the current option, $ per month."),
    kw: float = typer.Option(0.0, "--kw", help="Power of the current option, kW."),
    kwh_price: float = typer.Option(0.12, "--kwh-price", help="Electricity, $ per kWh."),
    reserve: float = typer.Option(0.0, "--reserve", help="Replacement reserve of the current option, $ per month."),
    hours_per_month: float = typer.Option(730.0, "--hours-per-month", help="Hours in a month."),
    new_hardware: Optional[float] = typer.Option(None, "--new-hardware", help="Hardware budget of the proposed option, $ (its months and $/kWh as above)."),
    new_support: float = typer.Option(0.0, "--new-support", help="Software support of the proposed option, $ per month."),
    new_kw: float = typer.Option(0.0, "--new-kw", help="Power of the proposed option, kW."),
    new_reserve: float = typer.Option(0.0, "--new-reserve", help="Replacement reserve of the proposed option, $ per month."),
    incremental: Optional[float] = typer.Option(None, "--incremental", help="Incremental monthly cost of the proposal, $ (instead of --new-*)."),
    gpu_hours: Optional[float] = typer.Option(None, "--gpu-hours", help="GPU-hours the proposal frees per month."),
    requests: Optional[float] = typer.Option(None, "--requests", help="Requests per month (with --share and --gpu-seconds instead of --gpu-hours)."),
    share: Optional[float] = typer.Option(None, "--share", help="Share of requests with an extra hit, 0-1."),
    gpu_seconds: Optional[float] = typer.Option(None, "--gpu-seconds", help="Prefill GPU-seconds one extra hit avoids."),
    restore_gpu_seconds: float = typer.Option(0.0, "--restore-gpu-seconds", help="GPU-seconds a restore itself costs."),
    gpu_price: Optional[float] = typer.Option(None, "--gpu-price", help="$ per GPU-hour (needed for the value side)."),
    realisation: float = typer.Option(1.0, "--realisation", help="Share of freed GPU time that becomes money, 0-1."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the figures as JSON to this file ('-' = stdout only)."),
) -> None:
    """Monthly cost of an option, the increment of a proposal, and its value, net and break-even realisation.

    Monthly cost = hardware / months + support + kW x hours x $/kWh + reserve. Value =
    GPU-hours freed x $/GPU-hour; only a realised share of it becomes money.
    """
    from kvtrace.analyses.estimate import cost_benefit, monthly_cost

    _check_paths({}, None, json_out)
    common = dict(amortisation_months=months, dollars_per_kwh=kwh_price, hours_per_month=hours_per_month)
    current = None if hardware is None else monthly_cost(
        hardware, support_usd_per_month=support, kw=kw, reserve_usd_per_month=reserve, label="current", **common)
    proposed = None if new_hardware is None else monthly_cost(
        new_hardware, support_usd_per_month=new_support, kw=new_kw, reserve_usd_per_month=new_reserve, label="proposed",
        **common)
    if incremental is not None and proposed is not None:
        raise UsageError("give --incremental or --new-hardware, not both", field="incremental")
    value_side = gpu_hours is not None or requests is not None
    if current is None and proposed is None and incremental is None:
        raise UsageError("nothing to price: give --hardware (and --new-hardware or --incremental)", field="hardware")
    result = None
    if value_side:
        if gpu_price is None:
            raise UsageError("the value side needs --gpu-price ($ per GPU-hour)", field="gpu-price")
        if incremental is not None:
            result = cost_benefit(dollars_per_gpu_hour=gpu_price, realisation=realisation,
                                  incremental_cost_usd_per_month=incremental, gpu_hours=gpu_hours,
                                  requests_per_month=requests, share=share, gpu_seconds_avoided=gpu_seconds,
                                  gpu_seconds_restore=restore_gpu_seconds)
        else:
            result = cost_benefit(dollars_per_gpu_hour=gpu_price, realisation=realisation, current=current,
                                  proposed=proposed, gpu_hours=gpu_hours, requests_per_month=requests, share=share,
                                  gpu_seconds_avoided=gpu_seconds, gpu_seconds_restore=restore_gpu_seconds)
    payload = {"current": current.to_dict() if current else None, "proposed": proposed.to_dict() if proposed else None,
               "benefit": result.to_dict() if result else None}
    if result is None and incremental is None and proposed is not None:
        payload["incremental_cost_usd_per_month"] = proposed.cost_usd_per_month - (current.cost_usd_per_month if current else 0.0)
    if json_out == "-":
        _write_json("-", payload)
        return
    t = Table(title="monthly cost and benefit", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    for c in (current, proposed):
        if c is not None:
            t.add_row(f"{c.label}: monthly cost", _money(c.cost_usd_per_month))
    if result is not None:
        inc = result.incremental_cost_usd_per_month
        t.add_row("incremental cost", ("+" if inc >= 0 else "") + _money(inc))
        t.add_row("GPU-hours freed per month", f"{result.gpu_hours_saved_per_month:,.6g}")
        t.add_row("value per month", _money(result.value_usd_per_month))
        t.add_row(f"realised at {100 * result.realisation:g} %", _money(result.realised_value_usd_per_month))
        t.add_row("net per month", _money(result.net_usd_per_month))
        be = result.break_even_realisation
        t.add_row("break-even realisation", "-" if be is None else f"{100 * be:.1f} %")
        lines = (current.explain if incremental is not None and current is not None else []) + result.explain
    else:
        if "incremental_cost_usd_per_month" in payload:
            inc = payload["incremental_cost_usd_per_month"]
            t.add_row("incremental cost", ("+" if inc >= 0 else "") + _money(inc))
        lines = [line for c in (current, proposed) if c is not None for line in c.explain]
    console.print(t)
    _print_explain(lines)
    if json_out:
        _write_json(json_out, payload)
        err_console.print(f"wrote json: {json_out}", markup=False)


@estimate_app.command("bandwidth")
@handles_errors
def estimate_bandwidth(
    rate: float = typer.Option(..., "--rate", help="Request arrivals per second (mean)."),
    share: float = typer.Option(..., "--share", help="Share of requests that read the tier, 0-1."),
    read_bytes: str = typer.Option(..., "--bytes", help="Bytes read per such request, e.g. 8GiB or 1.3GB."),
    peak_rate: Optional[float] = typer.Option(None, "--peak-rate", help="Arrivals per second in the busiest window."),
    tier_bandwidth: Optional[str] = typer.Option(None, "--tier-bandwidth", help="What the tier delivers, e.g. 200GiB/s or 80GB/s."),
    restore_bandwidth: Optional[str] = typer.Option(None, "--restore-bandwidth", help="Bandwidth one restore gets, e.g. 32GiB/s (gives the transfer floor)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the figures as JSON to this file ('-' = stdout only)."),
) -> None:
    """Read bandwidth a tier must serve: arrival rate x share reading it x bytes per read, mean and peak.

    Compared with what the tier delivers; check the busiest window, not only the mean.
    """
    from kvtrace.analyses.estimate import bandwidth, parse_rate
    from kvtrace.units import parse_size

    _check_paths({}, None, json_out)
    r = bandwidth(rate, share, parse_size(read_bytes, field="bytes"),
                  tier_bytes_per_s=None if tier_bandwidth is None else parse_rate(tier_bandwidth, field="tier-bandwidth"),
                  peak_arrival_rate_per_s=peak_rate,
                  restore_bytes_per_s=None if restore_bandwidth is None else parse_rate(restore_bandwidth,
                                                                                       field="restore-bandwidth"))
    if json_out == "-":
        _write_json("-", r.to_dict())
        return
    bw = lambda x: "-" if x is None else f"{format_bytes(x)}/s ({x / 1e9:,.4g} GB/s)"  # noqa: E731
    t = Table(title="read bandwidth", show_header=False)
    t.add_column("figure")
    t.add_column("value", justify="right")
    t.add_row("mean need", bw(r.needed_bytes_per_s))
    if r.peak_needed_bytes_per_s is not None:
        t.add_row("peak need", bw(r.peak_needed_bytes_per_s))
    if r.tier_bytes_per_s is not None:
        t.add_row("tier delivers", bw(r.tier_bytes_per_s))
        t.add_row("mean utilisation", _fmt_rate(r.utilisation))
        if r.peak_utilisation is not None:
            t.add_row("peak utilisation", _fmt_rate(r.peak_utilisation))
        t.add_row("headroom", f"{r.headroom:,.2f}x" + ("" if r.fits else " (does NOT fit)"))
    if r.transfer_floor_ms is not None:
        t.add_row("transfer floor of one read", f"{r.transfer_floor_ms:,.1f} ms")
    console.print(t)
    _print_explain(r.explain)
    if json_out:
        _write_json(json_out, r.to_dict())
        err_console.print(f"wrote json: {json_out}", markup=False)


# ---------------------------------------------------------------------------- size
@app.command()
@handles_errors
@with_log_options
def size(
    trace_path: Path = typer.Argument(..., metavar="TRACE", parser=_path, help="Trace file (JSONL, Parquet or CSV)."),
    config_path: Optional[Path] = typer.Option(None, "--config", "-c", parser=_path, help="Sizing TOML (see sample_traces/tiers.example.toml); default: that file's illustrative numbers."),
    report: Optional[Path] = typer.Option(None, "--report", parser=_path, help="Write a self-contained report: .html (embedded Altair charts) or .md."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", parser=_path, help="Write the candidates table (.parquet/.csv/.json)."),
    json_out: Optional[str] = typer.Option(None, "--json", help="Write the whole result as JSON ('-' = stdout only)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
) -> None:
    """Tier sizing: keep, expand DRAM, add local SSD or shared flash, tier both, or recompute — and why.

    Six candidates under three lenses (same SLO, same capacity, same budget): searched
    on the capacity-hit curves, confirmed by exact tier replays with the admission
    policy chosen, checked for bandwidth and endurance, priced per month.
    """
    from kvtrace.outputs import table_format, write_table, write_text_atomic
    from kvtrace.analyses.sizing import default_config, load_config, recommend, report_html, report_markdown

    if out is not None:
        table_format(out)
    if report is not None and report.suffix.lower() not in (".html", ".htm", ".md", ".markdown"):
        found = f"suffix '{report.suffix}'" if report.suffix else "no suffix"
        raise UsageError(f"unsupported report file ({found}): expected .html or .md", field="report")
    _check_paths({"out": out, "report": report}, {"TRACE": trace_path, "--config": config_path}, json_out)
    if config_path is None:
        config = default_config()
        err_console.print("kvtrace: warning: no --config: using the illustrative numbers of "
                          "sample_traces/tiers.example.toml", markup=False, soft_wrap=True)
    else:
        config = load_config(config_path)
    trace = _load(trace_path, fmt, block_tokens, share_tenants, workload="size")
    with _progress() as prog:
        task = prog.add_task("sizing", total=1000)
        cb = lambda frac, msg: prog.update(task, completed=int(1000 * frac), description=msg[:40])  # noqa: E731
        result = recommend(trace, config, progress=cb, trace_name=str(trace_path))
    if json_out == "-":
        _write_json("-", result.to_dict())
    else:
        _render_size(trace_path, result)
    if out is not None:
        write_table(result.candidates, out, metadata={"info": result.file_info(), "config": config.to_dict()})
    if report is not None:
        text = report_html(result) if report.suffix.lower() in (".html", ".htm") else report_markdown(result)
        write_text_atomic(report, text)
    if json_out and json_out != "-":
        _write_json(json_out, result.to_dict())
    for label, p in (("candidates", out), ("report", report), ("json", json_out)):
        if p is not None and p != "-":
            err_console.print(f"wrote {label}: {p}", markup=False)


def _render_size(trace_path: Path, result) -> None:
    from kvtrace.analyses.sizing import CANDIDATE_TEXT, LENSES

    info, cfg = result.info, result.config
    ms = lambda x: "-" if x is None else f"{x:,.1f} ms"  # noqa: E731
    signed = lambda x: "-" if x is None else ("+" if x >= 0 else "") + _money(x)  # noqa: E731
    titles = {"same-slo": f"same SLO ({cfg.slo_text()}): cheapest configuration per candidate",
              "same-capacity": f"same capacity ({format_bytes(info['same_capacity_bytes'])} in total)",
              "same-budget": f"same budget ({_money(info['budget_monthly_usd'])}/month)"}
    rec = result.recommendation
    # the verdict comes first: a recommendation, or that no configuration meets the constraints
    console.print(rec.headline, style="bold", markup=False, soft_wrap=True)
    for lens in LENSES:
        t = Table(title=f"{trace_path.name}: {titles[lens]}")
        for h in ("#", "candidate", "configuration", "admission", "DRAM", "SSD/flash", "mean", "P99", "$/month", "net/month",
                  "break-even", "DWPD", "ok", "short by"):
            t.add_column(h, justify="left" if h in ("candidate", "configuration", "admission") else "right")
        for r in result.candidates.filter(result.candidates["lens"] == lens).sort("rank").iter_rows(named=True):
            t.add_row(str(r["rank"]), CANDIDATE_TEXT[r["candidate"]], r["config"] or "-", r["policy"] or "-",
                      _fmt_rate(r["dram_prefix_token_hit_rate"]), _fmt_rate(r["ssd_prefix_token_hit_rate"]),
                      ms(r["service_time_mean_ms"]), ms(r["service_time_p99_ms"]),
                      _money(r["cost_usd_per_month"]), signed(r["net_usd_per_month"]),
                      _fmt_rate(r["break_even_realisation"]), "-" if r["ssd_dwpd"] is None else f"{r['ssd_dwpd']:,.2f}",
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


# ---------------------------------------------------------------------------- export / sql
def _export_costs(write_cost: Optional[float], read_cost: Optional[float], occupancy_cost: Optional[float]):
    from kvtrace.analyses.value import DEFAULT_COSTS, StorageCosts

    base = DEFAULT_COSTS.to_dict()
    return StorageCosts.per_tb(
        write_dollars_per_tb=base["write_dollars_per_tb"] if write_cost is None else write_cost,
        read_dollars_per_tb=base["read_dollars_per_tb"] if read_cost is None else read_cost,
        occupancy_dollars_per_tb_month=base["occupancy_dollars_per_tb_month"] if occupancy_cost is None
        else occupancy_cost,
    )


def _stage_progress(prog: Progress):
    """A ``progress(stage, done, total)`` callback driving one Rich task."""
    task = prog.add_task("loading", total=1)

    def update(stage: str, done: int, total: int) -> None:
        prog.update(task, description=stage, completed=done, total=max(total, 1))

    return update


@app.command()
@handles_errors
@with_log_options
def export(
    trace_path: Path = typer.Argument(..., metavar="TRACE", parser=_path, help="Trace file (JSONL, Parquet or CSV)."),
    db: Path = typer.Option(..., "--db", "-o", parser=_path, help="DuckDB database to write; an existing one is replaced atomically."),
    model: Optional[str] = ModelOpt,
    kv_bytes_per_token: Optional[int] = KvBytesOpt,
    dtype: Optional[str] = DtypeOpt,
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU preset that prices compute: H100, H200, B200, A100."),
    mfu: Optional[float] = typer.Option(None, "--mfu", help="Prefill model FLOPs utilisation (0-1]."),
    gpu_price: Optional[float] = typer.Option(None, "--gpu-price", help="$ per GPU-hour."),
    eviction: Eviction = typer.Option(Eviction.prefix_aware, "--eviction", help="LRU model of every distance, as for kvtrace curve."),
    warmup: Optional[str] = typer.Option(None, "--warmup", help="Only measure after a warm-up: a fraction of requests (0.1, 10%) or a duration (10min)."),
    points: int = typer.Option(200, "--points", min=2, max=100000, help="Capacities of the curve table (log-spaced)."),
    horizon: str = typer.Option("1h", "--horizon", help="Horizon of the future-reuse value: 90s, 10min, 2h or inf."),
    write_cost: Optional[float] = typer.Option(None, "--write-cost", help="Value: $ per TB written (default 0.20, illustrative)."),
    read_cost: Optional[float] = typer.Option(None, "--read-cost", help="Value: $ per TB read (default 0)."),
    occupancy_cost: Optional[float] = typer.Option(None, "--occupancy-cost", help="Value: $ per TB-month stored (default 20, illustrative)."),
    whatif: Optional[Path] = typer.Option(None, "--whatif", parser=_path, help="Also load a `kvtrace whatif --out` table as table whatif."),
    parquet: Optional[Path] = typer.Option(None, "--parquet", parser=_path, help="Also write every table as DIR/TABLE.parquet (the sql/ views work over them); DIR is created if missing."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
) -> None:
    """Write a DuckDB database of a trace for SQL: requests, accesses, blocks, curve, views and macros.

    Runs the exact analyses once (reuse distances, the curve, the future-reuse value)
    and stores per-request, per-access and per-block results with the sql/ views and
    macros. Open it with the DuckDB CLI or any DuckDB client, or with `kvtrace sql`.
    """
    from kvtrace.results.export import export_database, parquet_files
    from kvtrace.model import resolve_gpu
    from kvtrace.analyses.value import parse_horizon

    # --parquet DIR: the table files when DIR exists, else DIR itself (created, like a file, in an existing directory)
    tables = None if parquet is None else parquet_files(parquet, whatif is not None) if parquet.is_dir() else parquet
    _check_paths({"db": db, "parquet": tables}, {"TRACE": trace_path, "--whatif": whatif})
    h = parse_horizon(horizon)
    costs = _export_costs(write_cost, read_cost, occupancy_cost)
    m = _model(model, kv_bytes_per_token, dtype)
    g = resolve_gpu(gpu, mfu=mfu, dollars_per_hour=gpu_price)
    trace = _load(trace_path, fmt, block_tokens, share_tenants, workload="export")
    with _progress() as prog:
        result = export_database(trace, db, parquet_dir=parquet, model=m, gpu=g, eviction=eviction.value,
                                 warmup=warmup, points=points, horizon_s=h, costs=costs, whatif=whatif,
                                 progress=_stage_progress(prog))
    t = Table()
    t.add_column("table")
    t.add_column("rows", justify="right")
    for name, rows in result.tables.items():
        t.add_row(name, f"{rows:,}")
    console.print(t)
    console.print(f"wrote {db}: {format_bytes(result.bytes)} in {result.seconds:.2f} s; open it with "
                  f"`duckdb {db}` or `kvtrace sql {db}`", soft_wrap=True, markup=False)
    for p in result.parquet:
        err_console.print(f"wrote parquet: {p}", markup=False)


class SqlFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"
    parquet = "parquet"


def _sql_cell(value) -> str:
    import decimal
    import math

    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}" if math.isfinite(value) else str(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    return str(value)


def _render_sql(result, max_rows: int) -> None:
    import pyarrow as pa

    t = Table(show_lines=False)
    for name, field in zip(result.columns, result.table.schema):
        numeric = pa.types.is_integer(field.type) or pa.types.is_floating(field.type) or pa.types.is_decimal(field.type)
        t.add_column(name, justify="right" if numeric else "left")
    rows = result.rows()
    for row in rows[:max_rows]:
        t.add_row(*[_sql_cell(v) for v in row])
    console.print(t)
    if len(rows) > max_rows:
        console.print(f"[dim]{len(rows) - max_rows:,} more rows (--max-rows, or write them with -o)[/dim]")
    elif not rows:
        console.print("[dim](no rows)[/dim]")


@app.command()
@handles_errors
@with_log_options
def sql(
    target: Path = typer.Argument(..., metavar="TRACE_OR_DB", parser=_path, help="A database from `kvtrace export`, or a trace file (analysed into a temporary in-memory database)."),
    command: Optional[str] = typer.Option(None, "--command", "-c", help="SQL to run (several statements separated by ';')."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", parser=_path, help="Run the SQL in this file."),
    example: Optional[str] = typer.Option(None, "--example", "-e", help="Run a bundled example query of sql/examples, by name or number (e.g. 08)."),
    out_format: Optional[SqlFormat] = typer.Option(None, "--format", help="table (terminal), csv, json or parquet (needs -o); default: from the -o suffix, else table."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", parser=_path, help="Write the result of the last statement to this file."),
    max_rows: int = typer.Option(200, "--max-rows", min=1, help="Rows shown per result in table format."),
    set_vars: Optional[list[str]] = typer.Option(None, "--set", help="NAME=SQL: set a variable before the query (the examples' parameters), e.g. --set window_s=600."),
    write: bool = typer.Option(False, "--write", help="Open the database for writing (default read-only)."),
    model: Optional[str] = ModelOpt,
    kv_bytes_per_token: Optional[int] = KvBytesOpt,
    dtype: Optional[str] = DtypeOpt,
    gpu: Optional[str] = typer.Option(None, "--gpu", help="For a trace: GPU preset that prices compute."),
    eviction: Optional[Eviction] = typer.Option(None, "--eviction", help="For a trace: LRU model (default prefix-aware)."),
    warmup: Optional[str] = typer.Option(None, "--warmup", help="For a trace: warm-up fraction or duration."),
    horizon: Optional[str] = typer.Option(None, "--horizon", help="For a trace: horizon of the future-reuse value (default 1h)."),
    trace_format: Fmt = typer.Option(Fmt.auto, "--trace-format", help="For a trace: input format (auto-detected)."),
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
) -> None:
    """Query a trace in SQL (DuckDB): an exported database, or a trace analysed on the fly.

    Runs -c, -f or --example and prints the results; with none of them, reads SQL from
    standard input, or opens an interactive prompt with history on a terminal. The
    tables, views and macros are those of `kvtrace export`.
    """
    from kvtrace.results.export import is_database
    from kvtrace.sql.shell import (analyse_in_memory, example_by_name, has_dot_commands, open_database, output_format, repl,
                           result_text, run_input, run_script, write_result)

    fmt_name = output_format(out_format.value if out_format else None, out)
    _check_paths({"out": out}, {"TRACE_OR_DB": target, "--file": file})
    variables = []
    for item in set_vars or []:
        name, eq, value = item.partition("=")
        if not eq or not name.strip().isidentifier() or not value.strip():
            raise UsageError(f"expected NAME=VALUE (a SQL expression), got '{item}'", field="set")
        variables.append(f"SET VARIABLE {name.strip()} = {value.strip()};")
    sources = [x for x in (command, file, example) if x is not None]
    if len(sources) > 1:
        raise UsageError("give one of -c, -f and --example", field="command")
    if is_database(target):
        given = {"--model": model, "--kv-bytes-per-token": kv_bytes_per_token, "--dtype": dtype, "--gpu": gpu,
                 "--eviction": eviction, "--warmup": warmup, "--horizon": horizon, "--block-tokens": block_tokens}
        used = [k for k, v in given.items() if v is not None] + (["--share-tenants"] if share_tenants else [])
        if used:
            raise UsageError(f"{', '.join(used)} only apply to a trace: the database was made with its own "
                             "options (see trace_meta); re-export to change them", field=used[0].lstrip("-"))
        con = open_database(target, write=write)
    else:
        from kvtrace.analyses.value import parse_horizon

        trace = _load(target, trace_format, block_tokens, share_tenants, workload="sql")
        with _progress() as prog:
            con = analyse_in_memory(trace, model=_model(model, kv_bytes_per_token, dtype), gpu=gpu,
                                    eviction=(eviction or Eviction.prefix_aware).value, warmup=warmup,
                                    horizon_s=parse_horizon(horizon), progress=_stage_progress(prog))
    try:
        if variables:
            run_script(con, "\n".join(variables), source="--set")
        if command is not None:
            text, source = command, "query"
        elif file is not None:
            if not file.is_file():
                raise KvtraceError("no such file", path=str(file))
            text, source = file.read_text(encoding="utf-8"), str(file)
        elif example is not None:
            path = example_by_name(example)
            text, source = path.read_text(encoding="utf-8"), path.name
        elif sys.stdin.isatty():
            if out is not None:
                raise UsageError("-o needs a query (-c, -f or --example)", field="out")

            def show(result) -> None:
                if fmt_name == "table":
                    _render_sql(result, max_rows)
                else:
                    sys.stdout.write(result_text(result, fmt_name))

            repl(con, show, lambda line: console.print(line, markup=False, highlight=False))
            return
        else:
            text, source = sys.stdin.read(), "stdin"
            if not text.strip():
                raise UsageError("no query: give -c, -f or --example, or SQL on standard input", field="command")
        if has_dot_commands(text) and command is None:  # a script from a pipe or -f may use .tables, .schema, ...
            results = run_input(con, text, lambda line: console.print(line, markup=False, highlight=False),
                                source=source)
        else:
            results = run_script(con, text, source=source)
        if out is not None:
            if not results:
                raise KvtraceError("nothing to write: the last statement returns no rows", path=str(out))
            write_result(results[-1], out, fmt_name)
            err_console.print(f"wrote {fmt_name}: {out} ({results[-1].table.num_rows:,} rows)", markup=False)
        elif fmt_name == "table":
            for r in results:
                _render_sql(r, max_rows)
        elif results:
            sys.stdout.write(result_text(results[-1], fmt_name))
    finally:
        con.close()


def main() -> None:
    """Console-script entry point."""
    import faulthandler
    import signal

    # A crash inside native code (Numba, Arrow, Polars) prints the Python stack on
    # stderr instead of dying silently: the one trace a report needs.
    faulthandler.enable()
    # huge pages for the kernels' tables only, not for every per-access array
    # (kvtrace.kernels.memory: about 2 s of system time on a 30M-access curve)
    from kvtrace.config import stop_numpy_huge_pages

    stop_numpy_huge_pages()

    def terminated(signum, frame):  # SIGTERM unwinds like Ctrl+C: temporary files are removed
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    app()
