"""The ``kvtrace`` command line (Typer + Rich).

Commands are thin: open inputs, call one library function that returns a typed
result, render it, and write machine-readable output on request. User and data errors
print one line and exit 1 (bad option values exit 2); ``--debug`` shows the traceback.

One module per command or family (``curve``, ``stats``, ``value``, ``whatif``,
``size``, ``estimate``, ``sql`` with ``export``, ``ingest`` with ``synth``, ``models``,
``dashboard`` for ``kvtrace app``, ``cache``); what they share: :mod:`kvtrace.cli.options` (option
definitions, the request-log options), :mod:`kvtrace.cli.inputs` (opening a trace,
checking outputs), :mod:`kvtrace.cli.console` (printing, progress, ``--json``) and
:mod:`kvtrace.cli.errors` (the one-line error contract). Formats come from
:mod:`kvtrace.results.present`, shared with the dashboard.
"""

from __future__ import annotations

import sys

import typer

from kvtrace import __version__
from kvtrace.cli import (cache, curve, dashboard, estimate, ingest, load, models, scenario, size, sql, stats, value,
                         whatif)
from kvtrace.cli.console import console
from kvtrace.cli.errors import OneLineUsageErrors, state


def _keep_option_names_whole() -> None:
    """``--help`` never cuts an option's name (``--kv-bytes-per-…`` at 80 columns and in
    pipes): the columns of typer's option table that hold names and short flags take
    their widest entry and do not wrap; the type and help columns give way instead.
    Run before help is printed (:attr:`OneLineUsageErrors.before_help`): typer's help
    formatting is imported only then."""
    from rich.table import Table as RichTable
    from typer import rich_utils

    if getattr(rich_utils.Table, "keeps_names_whole", False):
        return

    class _OptionsTable(RichTable):
        def add_row(self, *renderables, **kwargs):
            super().add_row(*renderables, **kwargs)
            for column, cell in zip(self.columns[:-2], renderables[:-2]):  # all but the types and the help
                plain = getattr(cell, "plain", str(cell))
                column.min_width = max(column.min_width or 0, len(plain))
                column.no_wrap = True

    _OptionsTable.keeps_names_whole = True
    rich_utils.Table = _OptionsTable


OneLineUsageErrors.before_help = staticmethod(_keep_option_names_whole)

app = typer.Typer(
    name="kvtrace",
    cls=OneLineUsageErrors,
    help="Where should KV-cache context live, and how much memory and flash to buy? "
    "Replays LLM request traces (prompts as chains of block hashes) through exact cache models.",
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        console.print(f"kvtrace {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: bool = typer.Option(False, "--debug", help="Show full tracebacks for errors."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Show the version."),
) -> None:
    state["debug"] = debug


# the order of `kvtrace --help`
app.command()(ingest.ingest)
app.command()(stats.stats)
app.command()(models.models)
app.command("app")(dashboard.app_command)
app.command()(ingest.synth)
app.command()(curve.curve)
app.command()(value.value)
app.command()(whatif.whatif)
app.command()(load.load)
app.add_typer(estimate.estimate_app, name="estimate")
app.command()(size.size)
app.command()(scenario.scenario)
app.command()(sql.export)
app.command()(sql.sql)
app.command()(cache.cache)


def main() -> None:
    """Console-script entry point."""
    import faulthandler
    import signal

    # A crash inside native code (Numba, Arrow, Polars) prints the Python stack on
    # stderr instead of dying silently: the one trace a report needs.
    faulthandler.enable()
    # huge pages for the kernels' tables only, not for every per-access array, which is
    # read once in order and would pay for faulting them in (kvtrace.kernels.memory)
    from kvtrace.config import stop_numpy_huge_pages

    stop_numpy_huge_pages()

    def terminated(signum, frame):  # SIGTERM unwinds like Ctrl+C: temporary files are removed
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)
    try:
        app()
    except SystemExit as stop:
        _exit(stop.code)


def _exit(code) -> None:
    """End the process the way ``SystemExit(code)`` would, without the interpreter's
    teardown: exit handlers run (a prepared trace still being stored is waited for) and
    the output streams are flushed, then the process ends at once; freeing the
    analysis's arrays one by one only delays the return to the shell."""
    import atexit
    import os

    if code is not None and not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more to say
            pass
    os._exit(code or 0)
