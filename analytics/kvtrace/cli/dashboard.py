"""``kvtrace app``: the Streamlit dashboard, served on localhost."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kvtrace.cli.console import err_console
from kvtrace.cli.errors import handles_errors
from kvtrace.cli.options import BlockTokensOpt, Fmt, FormatOpt, ShareTenantsOpt, log_options, with_log_options


@handles_errors
@with_log_options
def app_command(
    trace_path: Optional[Path] = typer.Argument(
        None, metavar="TRACE", help="Trace to open (default: the bundled sample chat.jsonl)."),
    port: int = typer.Option(8501, "--port", "-p", min=1, max=65535, help="Port to serve on (localhost)."),
    headless: bool = typer.Option(False, "--headless", help="Do not open a browser tab (servers, CI)."),
    fmt: Fmt = FormatOpt,
    block_tokens: Optional[int] = BlockTokensOpt,
    share_tenants: bool = ShareTenantsOpt,
    data_dir: Optional[Path] = typer.Option(
        None, "--data-dir", help="Directory that paths typed in the page are confined to (default: TRACE's directory, "
                                 "else the bundled samples)."),
    max_trace_bytes: str = typer.Option(
        "4GiB", "--max-trace-bytes", help="Largest trace file, directory of shards or upload the page reads, e.g. "
                                          "4GiB."),
) -> None:
    """Interactive dashboard (Streamlit): overview, curves, what-ifs and sizing in the browser.

    Serves on localhost until Ctrl+C; opens on TRACE, or on the bundled sample when
    none is given. Every figure comes from the same functions as the commands. Paths
    typed in the page are read under --data-dir only, up to --max-trace-bytes.
    """
    import signal
    import subprocess

    from kvtrace.app.launcher import streamlit_command
    from kvtrace.app.sources import LoadOptions
    from kvtrace.errors import require_extra
    from kvtrace.units import parse_size

    for module, package in (("streamlit", "streamlit"), ("vl_convert", "vl-convert-python")):  # the sizing report
        require_extra(module, "app", package=package, what="kvtrace app", load=False)
    argv, env = streamlit_command(trace_path, port=port, headless=headless,
                                  options=LoadOptions(fmt.value, block_tokens, share_tenants, log=log_options()),
                                  data_dir=data_dir,
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
