"""What kind of file a trace path names, checked before anything opens it.

A trace is a regular file, a directory of JSONL shards, or a pipe (a FIFO, a
``<(...)`` process substitution, ``/dev/stdin``). A pipe can be read only once and
never sought: it is read exactly once, from Python, into memory, waiting in slices
that Ctrl+C ends (:func:`_pipe_chunks`), with a bound derived from the memory
available; formats that need random access (Parquet) are refused. Anything else (a
character or block device such as ``/dev/zero``, a socket) is refused before any read:
a device can be endless.

Every reader of a trace path (:func:`kvtrace.ingest.read_requests`, the streamed
Parquet reader, the CLI) calls :func:`check_input_kind` first.
"""

from __future__ import annotations

import os
import re
import select
import stat

from kvtrace.errors import KvtraceError, UsageError

#: what a pipe, a device or a socket is instead of a trace file
EXPECTED = "expected a regular file, a directory of JSONL shards or a pipe"
#: the first bytes of a gzip and a zstd stream, and a UTF-8 byte-order mark
GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
BOM = b"\xef\xbb\xbf"
#: file names a directory of shards is read from (compressed or not)
SHARD_PATTERN = re.compile(r".*\.(jsonl|ndjson|json)(\.(gz|gzip|zst|zstd))?$", re.IGNORECASE)
#: bytes asked for per read of a pipe (a pipe hands out at most its buffer, 64 KiB)
_READ_SIZE = 1 << 20
#: longest uninterruptible wait on a pipe, milliseconds (see :func:`_pipe_chunks`)
_POLL_MS = 200


def check_input_kind(path: str | os.PathLike, *, random_access: bool = False) -> str:
    """``"file"``, ``"directory"`` or ``"pipe"`` (a FIFO, ``/dev/fd/N``, ``/dev/stdin``
    on a pipe); anything else is refused before it is opened.

    Parameters
    ----------
    path : path-like
        The trace as the user gave it.
    random_access : bool
        The format needs random access (Parquet: its metadata is at the end): a pipe
        is refused too, with what to do instead.

    Raises
    ------
    UsageError
        An empty path (it would silently be the current directory).
    KvtraceError
        No such file, or a character/block device or a socket, naming the file.
    """
    p = os.fspath(path)
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not p.strip():
        raise UsageError("expected a trace path, got an empty string")
    try:
        mode = os.stat(p).st_mode  # stat does not open: a FIFO without a writer does not block here
    except FileNotFoundError:
        raise KvtraceError("no such file", path=p) from None
    except OSError as exc:
        raise KvtraceError(f"cannot read it ({exc.strerror or type(exc).__name__})", path=p) from None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "directory"
    if stat.S_ISFIFO(mode):
        if random_access:
            raise pipe_refused(p)
        return "pipe"
    what = ("a character device" if stat.S_ISCHR(mode) else "a block device" if stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
    raise KvtraceError(f"is {what}: {EXPECTED}", path=p)


def pipe_refused(path: str) -> KvtraceError:
    """The one line for a Parquet trace given as a pipe."""
    return KvtraceError("is a pipe, and a Parquet trace is read with random access (its metadata is at its end): "
                        "write it to a file first and give that file", path=path)


def pipe_limit() -> tuple[int | None, str]:
    """(bytes a pipe may deliver, where the figure comes from): half the memory budget
    (:func:`kvtrace.trace.budget.memory_budget`; the bytes are held twice while joined),
    None when unknown."""
    from kvtrace.trace.budget import memory_budget

    room, where = memory_budget()
    return (None, where) if room is None else (room // 2, where)


def read_pipe(path: str) -> bytes:
    """Everything a pipe delivers, read once (:func:`_pipe_chunks`: Ctrl+C ends the
    wait for a writer or for data). Past :func:`pipe_limit` bytes the read stops with
    one line naming the file, before memory runs out (an endless writer such as
    ``<(yes)``)."""
    from kvtrace.trace.budget import MEMORY_BUDGET_ENV
    from kvtrace.units import format_bytes

    limit, where = pipe_limit()
    chunks: list[bytes] = []
    got = 0
    try:
        for chunk in _pipe_chunks(path):
            got += len(chunk)
            if limit is not None and got > limit:
                chunks.clear()
                room = (f"{MEMORY_BUDGET_ENV} allows {format_bytes(2 * limit)}" if where.startswith("$")
                        else f"only {format_bytes(2 * limit)} is {where}")
                raise KvtraceError(
                    f"is a pipe longer than {format_bytes(limit)} (stopped there): a piped trace is held in memory, "
                    f"twice while it is read, but {room}: write it to a file (a plain JSONL file is read without a "
                    f"copy) or analyse a part of it; or set {MEMORY_BUDGET_ENV}=SIZE to run it anyway", path=path)
            chunks.append(chunk)
    except OSError as exc:
        raise KvtraceError(f"cannot read it ({exc.strerror or type(exc).__name__})", path=path) from None
    return b"".join(chunks)


def _pipe_chunks(path: str):
    """The bytes of a pipe as they arrive, until every writer has closed it.

    Not a blocking ``open()``: Polars installs its SIGINT handler with ``SA_RESTART``,
    so the kernel restarts an ``open()`` (or ``read()``) of a FIFO interrupted by Ctrl+C
    and Python never sees it (PEP 475 cannot help), and a signal that lands on another
    thread does not interrupt the main one at all. The FIFO is opened non-blocking
    (that returns at once, writer or not) and waited on with ``poll`` in short slices:
    each return to the interpreter runs a pending SIGINT's handler
    (``KeyboardInterrupt``). Until a first writer comes and goes, a FIFO reports no
    hang-up, so an empty wait does not end the read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while True:
            if not poller.poll(_POLL_MS):
                continue
            try:
                chunk = os.read(fd, _READ_SIZE)
            except BlockingIOError:
                continue
            if not chunk:  # every writer has closed it
                return
            yield chunk
    finally:
        os.close(fd)


def third_party_text(exc: BaseException) -> str:
    """A reader library's error message fit for a one-line error that quotes no file
    content: its first line, back-quoted spans elided (Polars quotes the offending
    text there, newlines and all), at most 160 characters."""
    text = re.sub(r"`[^`]*`", "...", str(exc), flags=re.S).strip()
    text = text.splitlines()[0].strip() if text else ""
    text = text if len(text) <= 160 else text[:157] + "..."
    return text or type(exc).__name__


# --------------------------------------------------------------------------- directories of shards
def natural_key(name: str) -> list:
    """Sort key putting ``part-2`` before ``part-10``."""
    return [int(t) if t.isdigit() else t.lower() for t in re.split(r"(\d+)", name)]


def shard_files(directory: str) -> tuple[list[str], list[str]]:
    """The JSONL shards of a directory in read order, and the other (ignored) entries.

    Hidden files (kvtrace's own temporary files among them) are skipped silently."""
    shards, other = [], []
    for name in sorted(os.listdir(directory), key=natural_key):
        if name.startswith("."):
            continue
        full = os.path.join(directory, name)
        if os.path.isfile(full) and SHARD_PATTERN.match(name):
            shards.append(full)
        else:
            other.append(name)
    return shards, other
