"""The CLI's one error contract: every error is one ``kvtrace: error:`` line on standard
error; user and data errors exit 1, usage errors (bad options) 2, an interrupt 130;
``--debug`` shows the traceback instead."""

from __future__ import annotations

import functools
import sys
from typing import Callable

import typer
import typer.core

from kvtrace.cli.console import err_console
from kvtrace.errors import KvtraceError, UsageError, printable

#: set by the ``--debug`` option of the main callback
state = {"debug": False}


def _click_exceptions():
    """The exceptions module of the click that typer runs on (typer >= 0.20 vendors its own)."""
    return sys.modules[typer.BadParameter.__module__]


class OneLineUsageErrors(typer.core.TyperGroup):
    """Usage errors found while parsing the command line (an unknown option, a value of
    the wrong type, a missing argument) as one ``kvtrace: error:`` line, exit 2, like
    every other error (DESIGN: one error contract); click would print a boxed block.

    ``before_help`` runs before a command line that asks for help (``--help``, or no
    arguments) is parsed: help's formatting is set up only when help is printed."""

    before_help: Callable[[], None] | None = None

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        argv = sys.argv[1:] if args is None else list(args)
        if self.before_help is not None and (not argv or "--help" in argv):
            type(self).before_help()
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



#: library field names (dataclass attributes) -> the command-line option that sets them
_OPTION_OF_FIELD = {
    "dollars_per_hour": "gpu-price", "peak_flops": "gpu", "recompute_flops_per_s": "gpu",
    "dram_fixed_s": "dram-latency-ms", "dram_bytes_per_s": "dram-gbps", "flash_fixed_s": "flash-latency-ms",
    "flash_bytes_per_s": "flash-gbps", "overhead_s": "overhead-ms", "write_dollars_per_tb": "write-cost",
    "read_dollars_per_tb": "read-cost", "occupancy_dollars_per_tb_month": "occupancy-cost",
    "kv_bytes_per_token": "kv-bytes-per-token", "block_tokens": "block-tokens", "rate_per_s": "rate",
}



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
            if state["debug"]:
                raise
            if exc.path is None and exc.field in _OPTION_OF_FIELD:  # the option the user typed, not the attribute
                exc.field = _OPTION_OF_FIELD[exc.field]
            err_console.print(f"kvtrace: error: {exc.one_line()}", markup=False, soft_wrap=True)
            raise typer.Exit(2 if isinstance(exc, UsageError) else 1) from None
        except KeyboardInterrupt:
            err_console.print("kvtrace: interrupted", markup=False)
            raise typer.Exit(130) from None
        except MemoryError:
            if state["debug"]:
                raise
            err_console.print(f"kvtrace: error: {printable(_out_of_memory(fn.__name__, kwargs))}", markup=False,
                              soft_wrap=True)
            raise typer.Exit(1) from None
        except OSError as exc:
            if state["debug"]:
                raise
            where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
            err_console.print(f"kvtrace: error: {where}{exc.strerror or exc}", markup=False, soft_wrap=True)
            raise typer.Exit(1) from None
        except Exception as exc:  # a bug, or bad input that no check anticipated: still one line
            if state["debug"]:
                raise
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            err_console.print(f"kvtrace: error: internal error ({type(exc).__name__}: {first}); "
                              "rerun with --debug for the traceback and please report it",
                              markup=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper
