"""What the CLI prints and writes besides its result files: the two consoles, progress bars,
warnings, the ``wrote ...`` lines and ``--json`` documents."""

from __future__ import annotations

import json
import os
import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

# Wide tables wrap badly at Rich's 80-column default for pipes and logs (the whatif
# comparison is about 180 columns wide; tables take only the width they need).
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200
console = Console(highlight=False, width=_WIDTH)
err_console = Console(stderr=True, highlight=False)


def progress() -> Progress:
    """A transient progress display on standard error, shown only on a terminal."""
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


def stage_progress(prog: Progress):
    """A ``progress(stage, done, total)`` callback driving one Rich task."""
    task = prog.add_task("loading", total=1)

    def update(stage: str, done: int, total: int) -> None:
        prog.update(task, description=stage, completed=done, total=max(total, 1))

    return update


def warn(where, text: str) -> None:
    """``kvtrace: warning: WHERE: TEXT`` on standard error."""
    err_console.print(f"kvtrace: warning: {where}: {text}", markup=False, soft_wrap=True)


def report_written(outputs) -> None:
    """``wrote LABEL: PATH`` on standard error for each (label, path) given a file (not ``-``)."""
    for label, p in outputs:
        if p is not None and p != "-":
            err_console.print(f"wrote {label}: {p}", markup=False)


def write_json(path: str, obj) -> None:
    """``obj`` as indented JSON to ``path``, atomically, or to standard output for ``-``."""
    from kvtrace.outputs import json_safe, write_json_atomic

    if path == "-":
        sys.stdout.write(json.dumps(json_safe(obj), indent=2) + "\n")
    else:
        write_json_atomic(path, obj)
