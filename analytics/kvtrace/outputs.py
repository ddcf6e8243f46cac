"""Atomic output files and result-table writers.

Every file kvtrace writes goes through :func:`atomic_path`: the content is written to
a temporary file in the destination directory, flushed to disk, then renamed over the
destination. A failure or an interrupt leaves the previous file untouched and no
temporary file behind; on Linux the temporary file has no name until it is complete,
so even a process killed outright (SIGKILL) leaves none.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Iterable, Iterator

import polars as pl

from .errors import KvtraceError, UsageError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None, *, named: bool = False) -> Iterator[Path]:
    """Yield a temporary path in ``path``'s directory; move it onto ``path`` on success.

    The content becomes visible at ``path`` only once complete and flushed to disk
    (fsync of the file, rename, fsync of the directory). On an exception or an
    interrupt the temporary file is removed and any previous ``path`` is untouched.

    Where the operating system allows it (Linux ``O_TMPFILE``) the temporary file has
    no name until it is complete: the yielded path is ``/proc/self/fd/N``, which any
    writer can open, and a process killed outright (SIGKILL, out of memory) leaves
    nothing behind. Elsewhere, and with ``named=True``, it is a hidden file
    ``.NAME.HOST-PID.RANDOM[SUFFIX].tmp`` next to ``path``; one left by a process that
    no longer runs is removed by the next write to the same destination.

    Parameters
    ----------
    path : path-like
        Final destination.
    suffix : str, optional
        Suffix of a named temporary file (some writers choose the format from it);
        defaults to the destination's suffix.
    named : bool
        Always use a named temporary file: for writers that create sibling files
        next to theirs (DuckDB's ``.wal``) or that delete and re-create it.
    """
    dest = Path(path)
    if dest.is_dir():  # else os.replace fails naming the temporary file
        raise KvtraceError("is a directory, expected a file name", path=str(dest))
    directory = dest.parent if str(dest.parent) else Path(".")
    if not directory.exists():
        raise KvtraceError("directory does not exist", path=str(directory))
    if not directory.is_dir():
        raise KvtraceError("is not a directory", path=str(directory))
    remove_stale_temps(dest)
    fd = None if named else _anonymous_file(directory)
    if fd is not None:
        try:
            yield Path(f"/proc/self/fd/{fd}")
            os.fsync(fd)
            _link_into_place(fd, dest)
        finally:
            os.close(fd)
        _fsync_directory(directory)
        return
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f"{_temp_prefix(dest.name)}{_owner()}.",
            suffix=(suffix if suffix is not None else dest.suffix) + ".tmp", dir=directory,
        )
    except OSError as exc:
        raise KvtraceError(f"cannot write here: {exc.strerror or exc}", path=str(dest)) from None
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get normal modes
        os.replace(tmp_path, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise
    _fsync_directory(directory)


def _anonymous_file(directory: Path) -> int | None:
    """An unnamed file in ``directory`` (Linux O_TMPFILE), or None where unsupported."""
    flag = getattr(os, "O_TMPFILE", None)
    if flag is None or os.environ.get("KVTRACE_NAMED_TEMP") == "1" or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        # the mode is filtered by the umask like any new file's
        return os.open(directory, flag | os.O_RDWR | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EROFS, errno.ENOSPC, errno.EDQUOT):
            raise KvtraceError(f"cannot write here: {exc.strerror or exc}", path=str(directory)) from None
        return None  # the file system has no O_TMPFILE (EOPNOTSUPP, EISDIR, EINVAL)


def _link_into_place(fd: int, dest: Path) -> None:
    """Give the unnamed file ``fd`` the name ``dest`` (replacing any file there).

    ``linkat`` cannot replace a file, so the file gets a temporary name first and
    is renamed onto ``dest``: the only moment a kill can leave a temporary file."""
    directory = dest.parent if str(dest.parent) else Path(".")
    for _ in range(100):
        tmp = directory / f"{_temp_prefix(dest.name)}{_owner()}.{os.urandom(4).hex()}.tmp"
        try:
            # follow_symlinks with a dir fd makes Python call linkat(AT_SYMLINK_FOLLOW)
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.link(f"/proc/self/fd/{fd}", tmp.name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=True)
            finally:
                os.close(dfd)
            break
        except FileExistsError:
            continue
    else:  # pragma: no cover - 100 collisions of 32 random bits
        raise KvtraceError("cannot name the temporary file", path=str(dest))
    try:
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _temp_prefix(name: str) -> str:
    return f".{name}."


def _owner() -> str:
    """HOST-PID of this process, so that a later run can tell its temporary files are stale."""
    host = "".join(c for c in socket.gethostname() if c.isalnum())[:16] or "host"
    return f"{host}-{os.getpid()}"


def remove_stale_temps(dest: str | os.PathLike) -> list[Path]:
    """Remove the temporary files of writes to ``dest`` whose process no longer runs
    (killed outright); those of running processes, and of other hosts, are kept.

    Returns the files removed.
    """
    dest = Path(dest)
    directory = dest.parent if str(dest.parent) else Path(".")
    prefix = _temp_prefix(dest.name)
    host = _owner().rsplit("-", 1)[0]
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(prefix) or not (name.endswith(".tmp") or name.endswith(".tmp.wal")):
            continue
        owner = name[len(prefix):].split(".", 1)[0]
        who, _, pid = owner.rpartition("-")
        if who != host or not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            (directory / name).unlink()
            removed.append(directory / name)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _fsync_directory(directory: Path) -> None:
    """Make a rename durable (best effort: not every platform opens directories)."""
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dfd)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_bytes_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | os.PathLike, obj: object) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically (non-finite floats as null)."""
    write_text_atomic(path, json.dumps(_json_safe(obj), indent=2, sort_keys=False) + "\n")


def _json_safe(obj: object) -> object:
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _json_safe(obj.item())
    return obj


TABLE_FORMATS = ("parquet", "csv", "json")


def table_format(path: str | os.PathLike) -> str:
    """The table format implied by a file name's suffix (parquet, csv or json)."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix in ("parquet", "pq"):
        return "parquet"
    if suffix in ("csv", "json"):
        return suffix
    found = f"suffix '.{suffix}'" if suffix else "no suffix"
    raise UsageError(f"unsupported output file ({found}): expected .parquet, .csv or .json", path=str(path))


def write_table(df: pl.DataFrame, path: str | os.PathLike, metadata: dict | None = None) -> None:
    """Write a result table atomically as Parquet, CSV or JSON (by suffix).

    Parquet files carry ``metadata`` as the JSON value of the key ``kvtrace``; JSON
    files are ``{"metadata": ..., "rows": [...]}``; CSV has no metadata.
    """
    fmt = table_format(path)
    with atomic_path(path) as tmp:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            table = df.to_arrow()
            if metadata is not None:
                md = dict(table.schema.metadata or {})
                md[b"kvtrace"] = json.dumps(_json_safe(metadata), sort_keys=True).encode()
                table = table.replace_schema_metadata(md)
            pq.write_table(table, tmp, compression="zstd")
        elif fmt == "csv":
            df.write_csv(tmp)
        else:
            payload = {"metadata": metadata or {}, "rows": df.to_dicts()}
            tmp.write_text(json.dumps(_json_safe(payload), indent=1) + "\n", encoding="utf-8")


def write_table_chunks(frames: Iterable[pl.DataFrame], path: str | os.PathLike, metadata: dict | None = None) -> None:
    """:func:`write_table` for a table made chunk by chunk (too large to hold).

    ``frames`` are consecutive pieces of the table, all with the same schema (at least
    one, possibly empty, so that the schema is known). The file holds the same table
    as ``write_table(pl.concat(frames), ...)``: a Parquet file with one row group per
    chunk or more, CSV and JSON byte for byte the same. It is written atomically: an
    exception while the frames are made leaves no file (and any previous one intact).
    """
    fmt = table_format(path)
    with atomic_path(path) as tmp:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            writer = None
            try:
                for df in frames:
                    table = df.to_arrow()
                    if writer is None:
                        md = dict(table.schema.metadata or {})
                        if metadata is not None:
                            md[b"kvtrace"] = json.dumps(_json_safe(metadata), sort_keys=True).encode()
                        writer = pq.ParquetWriter(tmp, table.schema.with_metadata(md), compression="zstd")
                    writer.write_table(table.replace_schema_metadata(writer.schema.metadata))
                if writer is None:
                    raise ValueError("write_table_chunks needs at least one frame (the schema)")
            finally:
                if writer is not None:
                    writer.close()
        elif fmt == "csv":
            with open(tmp, "wb") as fh:
                for i, df in enumerate(frames):
                    df.write_csv(fh, include_header=i == 0)
        else:
            head = json.dumps(_json_safe({"metadata": metadata or {}}), indent=1)
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(head[:-2] + ',\n "rows": [')  # json.dumps(..., indent=1) of the whole payload
                sep = "\n"
                for df in frames:
                    for row in df.to_dicts():
                        fh.write(sep + "\n".join("  " + ln for ln in json.dumps(_json_safe(row), indent=1).split("\n")))
                        sep = ",\n"
                fh.write("]\n}\n" if sep == "\n" else "\n ]\n}\n")
