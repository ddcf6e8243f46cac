"""``kvtrace export`` (a DuckDB database of a trace) and ``kvtrace sql`` (queries over one,
or over a trace analysed on the fly)."""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from kvtrace.cli.console import console, err_console, progress, stage_progress
from kvtrace.cli.errors import handles_errors
from kvtrace.cli.inputs import check_paths, kv_model, load, storage_costs
from kvtrace.cli.options import (BlockTokensOpt, DtypeOpt, Eviction, Fmt, FormatOpt, GpuPriceOpt, HorizonDefault,
                                 KvBytesOpt, MfuOpt, ModelOpt, ShareTenantsOpt, TraceArg, parse_path, with_log_options)
from kvtrace.errors import KvtraceError, UsageError
from kvtrace.units import format_bytes


@handles_errors
@with_log_options
def export(
    trace_path: Path = TraceArg,
    db: Path = typer.Option(
        ..., "--db", "-o", parser=parse_path, help="DuckDB database to write; an existing one is replaced atomically."),
    model: Optional[str] = ModelOpt,
    kv_bytes_per_token: Optional[int] = KvBytesOpt,
    dtype: Optional[str] = DtypeOpt,
    gpu: Optional[str] = typer.Option(None, "--gpu", help="GPU preset that prices compute: H100, H200, B200, A100."),
    mfu: Optional[float] = MfuOpt,
    gpu_price: Optional[float] = GpuPriceOpt,
    eviction: Eviction = typer.Option(
        Eviction.prefix_aware, "--eviction", help="LRU model of every distance, as for kvtrace curve."),
    warmup: Optional[str] = typer.Option(
        None, "--warmup", help="Only measure after a warm-up: a fraction of requests (0.1, 10%) or a duration "
                               "(10min)."),
    points: int = typer.Option(200, "--points", min=2, max=100000, help="Capacities of the curve table (log-spaced)."),
    horizon: str = typer.Option(
        HorizonDefault, "--horizon", help="Horizon of the future-reuse value: 90s, 10min, 2h or inf."),
    write_cost: Optional[float] = typer.Option(
        None, "--write-cost", help="Value: $ per TB written (default 0.20, illustrative)."),
    read_cost: Optional[float] = typer.Option(None, "--read-cost", help="Value: $ per TB read (default 0)."),
    occupancy_cost: Optional[float] = typer.Option(
        None, "--occupancy-cost", help="Value: $ per TB-month stored (default 20, illustrative)."),
    whatif: Optional[Path] = typer.Option(
        None, "--whatif", parser=parse_path, help="Also load a `kvtrace whatif --out` table as table whatif."),
    parquet: Optional[Path] = typer.Option(
        None, "--parquet", parser=parse_path, help="Also write every table as DIR/TABLE.parquet (the sql/ views work "
                                                   "over them); DIR is created if missing."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
) -> None:
    """Write a DuckDB database of a trace for SQL: requests, accesses, blocks, curve, views and macros.

    Runs the exact analyses once (reuse distances, the curve, the future-reuse value)
    and stores per-request, per-access and per-block results with the sql/ views and
    macros. Open it with the DuckDB CLI or any DuckDB client, or with `kvtrace sql`.
    """
    from kvtrace.analyses.value import parse_horizon
    from kvtrace.model import resolve_gpu
    from kvtrace.results.export import export_database, parquet_files

    # --parquet DIR: the table files when DIR exists, else DIR itself (created, like a file, in an existing directory)
    tables = None if parquet is None else parquet_files(parquet, whatif is not None) if parquet.is_dir() else parquet
    check_paths({"db": db, "parquet": tables}, {"TRACE": trace_path, "--whatif": whatif})
    h = parse_horizon(horizon)
    costs = storage_costs(write_cost, read_cost, occupancy_cost)
    m = kv_model(model, kv_bytes_per_token, dtype)
    g = resolve_gpu(gpu, mfu=mfu, dollars_per_hour=gpu_price)
    trace = load(trace_path, fmt, block_tokens, share_tenants, workload="export")
    with progress() as prog:
        result = export_database(trace, db, parquet_dir=parquet, model=m, gpu=g, eviction=eviction.value,
                                 warmup=warmup, points=points, horizon_s=h, costs=costs, whatif=whatif,
                                 progress=stage_progress(prog))
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


@handles_errors
@with_log_options
def sql(
    target: Path = typer.Argument(
        ..., metavar="TRACE_OR_DB", parser=parse_path, help="A database from `kvtrace export`, or a trace file "
                                                            "(analysed into a temporary in-memory database)."),
    command: Optional[str] = typer.Option(
        None, "--command", "-c", help="SQL to run (several statements separated by ';')."),
    file: Optional[Path] = typer.Option(None, "--file", "-f", parser=parse_path, help="Run the SQL in this file."),
    example: Optional[str] = typer.Option(
        None, "--example", "-e", help="Run a bundled example query of sql/examples, by name or number (e.g. 08)."),
    out_format: Optional[SqlFormat] = typer.Option(
        None, "--format", help="table (terminal), csv, json or parquet (needs -o); default: from the -o suffix, else "
                               "table."),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", parser=parse_path, help="Write the result of the last statement to this file."),
    max_rows: int = typer.Option(200, "--max-rows", min=1, help="Rows shown per result in table format."),
    set_vars: Optional[list[str]] = typer.Option(
        None, "--set", help="NAME=SQL: set a variable before the query (the examples' parameters), e.g. --set "
                            "window_s=600."),
    write: bool = typer.Option(False, "--write", help="Open the database for writing (default read-only)."),
    model: Optional[str] = ModelOpt,
    kv_bytes_per_token: Optional[int] = KvBytesOpt,
    dtype: Optional[str] = DtypeOpt,
    gpu: Optional[str] = typer.Option(None, "--gpu", help="For a trace: GPU preset that prices compute."),
    eviction: Optional[Eviction] = typer.Option(
        None, "--eviction", help="For a trace: LRU model (default prefix-aware)."),
    warmup: Optional[str] = typer.Option(None, "--warmup", help="For a trace: warm-up fraction or duration."),
    horizon: Optional[str] = typer.Option(
        None, "--horizon", help="For a trace: horizon of the future-reuse value (default 1h)."),
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
    from kvtrace.sql.shell import (analyse_in_memory, example_by_name, has_dot_commands, open_database, output_format,
                                   repl, result_text, run_input, run_script, write_result)

    fmt_name = output_format(out_format.value if out_format else None, out)
    check_paths({"out": out}, {"TRACE_OR_DB": target, "--file": file})
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

        trace = load(target, trace_format, block_tokens, share_tenants, workload="sql")
        with progress() as prog:
            con = analyse_in_memory(trace, model=kv_model(model, kv_bytes_per_token, dtype), gpu=gpu,
                                    eviction=(eviction or Eviction.prefix_aware).value, warmup=warmup,
                                    horizon_s=parse_horizon(horizon), progress=stage_progress(prog))
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
