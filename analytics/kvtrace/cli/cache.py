"""``kvtrace cache``: the prepared traces (kvtrace.ingest.prepared) that repeated
commands map instead of decoding their trace again."""

from __future__ import annotations

import os

import typer

from kvtrace.cli.console import console
from kvtrace.cli.errors import handles_errors


@handles_errors
def cache(
    clear: bool = typer.Option(False, "--clear", help="Remove every prepared trace."),
) -> None:
    """Where prepared traces are kept, how many and how large; --clear removes them.

    A command that reads a trace file stores its access table and dense block ids,
    keyed by the file's content and the load options, so the next command on the same
    file maps them instead of decoding and densifying it again. KVTRACE_CACHE_DIR moves
    the store (off: none), KVTRACE_CACHE_MAX bounds it (default 16GiB).
    """
    from kvtrace.ingest import prepared
    from kvtrace.units import format_bytes

    root = prepared.cache_root()
    if root is None:
        setting = os.environ.get(prepared.CACHE_DIR_ENV, "")
        console.print(f"prepared traces are off ({prepared.CACHE_DIR_ENV}={setting})", markup=False)
        return
    if clear:
        freed = prepared.clear()
        console.print(f"removed the prepared traces in {root}: {format_bytes(freed)} freed", markup=False)
        return
    found = prepared.entries(root)
    total = sum(size for _, size, _ in found)
    console.print(f"{root}: {len(found):,} prepared trace{'' if len(found) == 1 else 's'}, {format_bytes(total)} "
                  f"(at most {format_bytes(prepared.max_bytes())}, least recently used removed first)", markup=False)

