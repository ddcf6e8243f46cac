"""Opening a command's inputs: a trace in memory or streamed in chunks, the model, and the
checks every output path passes before any work."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from kvtrace.cli.console import err_console, progress, warn
from kvtrace.cli.options import Fmt, log_options
from kvtrace.errors import UsageError


def load(path: Path, fmt: Fmt, block_tokens: Optional[int], share_tenants: bool = False,
         workload: Optional[str] = None):
    """Load a trace; ``workload`` (a key of kvtrace.ingest.guard.PROFILES) refuses, before the
    access table is built, a run that would not fit in memory."""
    from kvtrace.ingest import load_trace

    trace = load_trace(path, fmt=fmt.value, block_tokens=block_tokens, share_tenants=share_tenants,
                       workload=workload, log=log_options())
    for w in trace.warnings:
        warn(path, w)
    return trace


def scan_streamed(trace_path: Path, fmt: Fmt, block_tokens: Optional[int], share_tenants: bool, columns=()):
    """Pass 1 of a streamed run (kvtrace.ingest.stream.open_stream) with a progress bar;
    ``columns``: the request columns to keep (O(requests) memory each)."""
    from kvtrace.ingest.stream import open_stream

    log = log_options()
    if log is not None and (log.rechain or log.reblock):
        raise UsageError("--rechain and --reblock rewrite every request's block ids in memory: write the trace "
                         "once with `kvtrace ingest TRACE --rechain --reblock N -o t.parquet` (or run --no-stream)",
                         field="stream")
    err_console.print(f"kvtrace: streaming {trace_path.name} in row-group chunks: memory bounded by its distinct "
                      "blocks, results equal to the in-memory run", markup=False, soft_wrap=True)
    with progress() as prog:
        task = prog.add_task("scan (streaming)", total=1)
        trace = open_stream(trace_path, fmt=fmt.value, block_tokens=block_tokens, share_tenants=share_tenants,
                            columns=columns, progress=lambda d, t: prog.update(task, completed=d, total=t), log=log)
    for w in trace.warnings:
        warn(trace_path, w)
    return trace


def kv_model(model: Optional[str], kv_bytes: Optional[int], dtype: Optional[str]):
    """The model of ``--model``, ``--kv-bytes-per-token`` and ``--dtype`` (kvtrace.model.resolve_model)."""
    from kvtrace.model import resolve_model

    return resolve_model(model, dtype=dtype, kv_bytes_per_token=kv_bytes)


def check_paths(outputs: dict, inputs: dict | None = None, json_out: Optional[str] = None) -> None:
    """Before any work: ``--json``'s suffix, and every output against the inputs and each
    other (kvtrace.outputs.check_outputs: never an input, never two outputs in one file,
    every location writable)."""
    from kvtrace.outputs import check_json_target, check_outputs

    check_json_target(json_out)
    check_outputs({**outputs, "json": json_out}, inputs)


def check_suffix(path: Optional[Path], option: str, suffixes: tuple[str, ...], expected: str) -> None:
    """A chart or report file named with one of ``suffixes`` (lower case), else a usage error."""
    if path is not None and path.suffix.lower() not in suffixes:
        found = f"suffix '{path.suffix}'" if path.suffix else "no suffix"
        raise UsageError(f"unsupported {option} file ({found}): expected {expected}", field=option)


def check_tables(*paths: Optional[Path]) -> None:
    """Every given table output has a suffix kvtrace writes (before the work, not after)."""
    from kvtrace.outputs import table_format

    for p in paths:
        if p is not None:
            table_format(p)


def open_trace(trace_path: Path, fmt: Fmt, block_tokens: Optional[int], share_tenants: bool,
               stream: Optional[bool], workload: str, columns=()):
    """(trace, streamed): the trace in memory, or scanned in chunks (kvtrace.ingest.stream)
    keeping the request ``columns``. Left to itself (``stream`` None) it streams a Parquet
    trace whose in-memory run, costed by the guard's ``workload`` profile, would exceed
    the streaming budget."""
    from kvtrace.ingest.stream import should_stream

    if not should_stream(trace_path, fmt.value, stream, workload=workload):
        return load(trace_path, fmt, block_tokens, share_tenants, workload=workload), False
    return scan_streamed(trace_path, fmt, block_tokens, share_tenants, columns), True


def storage_costs(write_cost: Optional[float], read_cost: Optional[float], occupancy_cost: Optional[float]):
    """The tier's storage costs of ``--write-cost``, ``--read-cost`` and ``--occupancy-cost``
    ($ per TB, $ per TB-month); an option left out takes kvtrace.analyses.value.DEFAULT_COSTS's."""
    from kvtrace.analyses.value import DEFAULT_COSTS, StorageCosts

    base = DEFAULT_COSTS.to_dict()
    return StorageCosts.per_tb(
        write_dollars_per_tb=base["write_dollars_per_tb"] if write_cost is None else write_cost,
        read_dollars_per_tb=base["read_dollars_per_tb"] if read_cost is None else read_cost,
        occupancy_dollars_per_tb_month=base["occupancy_dollars_per_tb_month"] if occupancy_cost is None
        else occupancy_cost,
    )
