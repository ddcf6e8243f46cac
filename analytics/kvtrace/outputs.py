"""Atomic output files, the output checks of a run, and result-table writers.

Every file kvtrace writes goes through :func:`atomic_path`: the content is written to
a temporary file in the destination directory, flushed to disk, then renamed over the
destination. A failure or an interrupt leaves the previous file untouched and no
temporary file behind; on Linux the temporary file has no name until it is complete,
so even a process killed outright (SIGKILL) leaves none, with one exception: a kill
that lands between the two system calls that replace an *existing* file (``linkat``
of the finished file to a hidden name, then ``rename`` onto the destination) leaves
that complete hidden copy, ``.NAME.HOST-PID.RANDOM.tmp``, which the next write to the
same destination removes. A new destination is linked in one call and leaves nothing.

A command's outputs form one unit (:func:`output_transaction`): :func:`check_outputs`
refuses, before any work, an output that is an input (same file through symlinks and
hard links, or a file inside an input directory), two outputs at one path, and a
destination that cannot be written; the files are then written to temporary files and
replace their destinations together, only once every one is complete. A replaced
file keeps its permission bits (and, for root, its owner).
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import json
import os
import signal
import socket
import stat
import tempfile
import threading
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import polars as pl

from kvtrace.errors import KvtraceError, UsageError


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
    staged = _STAGED.get()
    fd = None if named else _anonymous_file(directory)
    if fd is not None:
        try:
            yield Path(f"/proc/self/fd/{fd}")
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        _Pending(dest, fd=fd).hand_over(staged)
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
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise
    _Pending(dest, tmp=tmp_path).hand_over(staged)


#: the outputs of the current :func:`output_transaction`, written and waiting to replace their destinations
_STAGED: contextvars.ContextVar[list | None] = contextvars.ContextVar("kvtrace_staged_outputs", default=None)


class _Pending:
    """A complete, flushed temporary file waiting to replace ``dest``: an unnamed
    file (``fd``, Linux ``O_TMPFILE``) or a hidden named one (``tmp``)."""

    def __init__(self, dest: Path, *, fd: int | None = None, tmp: Path | None = None) -> None:
        self.dest, self.fd, self.tmp = dest, fd, tmp

    def hand_over(self, staged: list | None) -> None:
        """Commit now, or wait in ``staged`` (the current :func:`output_transaction`)."""
        if staged is not None:
            staged.append(self)
        else:
            self.commit()

    def commit(self) -> None:
        """Give the file its destination's name (keeping the mode of a file replaced)."""
        directory = self.dest.parent if str(self.dest.parent) else Path(".")
        try:
            _keep_attributes(self.dest, fd=self.fd, path=self.tmp)
            if self.fd is not None:
                _link_into_place(self.fd, self.dest)
            else:
                os.replace(self.tmp, self.dest)
        finally:
            self.discard()
        _fsync_directory(directory)

    def discard(self) -> None:
        """Drop the temporary file (a no-op once committed)."""
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)
        elif self.tmp is not None:
            tmp, self.tmp = self.tmp, None
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


@contextlib.contextmanager
def output_transaction() -> Iterator[None]:
    """Make the files written inside the block (through :func:`atomic_path`) replace
    their destinations together, once the block ends without an exception.

    Until then each output is a complete temporary file; an exception (a later output
    that fails, an interrupt) discards them all and leaves every destination as it
    was. The replacements run with SIGINT and SIGTERM held back (in the main thread),
    so an interrupt cannot land between two of them. A block inside another one joins
    it.
    """
    if _STAGED.get() is not None:
        yield
        return
    pending: list[_Pending] = []
    token = _STAGED.set(pending)
    try:
        yield
    except BaseException:
        _STAGED.reset(token)
        for p in pending:
            p.discard()
        raise
    _STAGED.reset(token)
    held = threading.current_thread() is threading.main_thread() and hasattr(signal, "pthread_sigmask")
    if held:
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        for i, p in enumerate(pending):
            try:
                p.commit()
            except BaseException:
                for rest in pending[i + 1:]:
                    rest.discard()
                raise
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _keep_attributes(dest: Path, *, fd: int | None, path: Path | None) -> None:
    """Give the new file the permission bits (and, as root, the owner) of the regular
    file it replaces; a new destination keeps the mode the umask gave it."""
    try:
        st = os.stat(dest)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        return
    mode = stat.S_IMODE(st.st_mode)
    if fd is not None:
        os.fchmod(fd, mode)
    else:
        os.chmod(path, mode)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        with contextlib.suppress(OSError):
            if fd is not None:
                os.fchown(fd, st.st_uid, st.st_gid)
            else:
                os.chown(path, st.st_uid, st.st_gid)


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

    A new destination is linked in one call (``linkat``), which leaves nothing behind
    whenever a kill lands. ``linkat`` cannot replace a file, so an existing one is
    replaced by linking to a hidden temporary name and renaming that onto ``dest``:
    a kill between those two calls is the only moment a temporary file is left."""
    directory = dest.parent if str(dest.parent) else Path(".")
    dfd = os.open(directory, os.O_RDONLY)
    try:
        # follow_symlinks with a dir fd makes Python call linkat(AT_SYMLINK_FOLLOW)
        os.link(f"/proc/self/fd/{fd}", dest.name, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=True)
        return
    except FileExistsError:
        pass
    finally:
        os.close(dfd)
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


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a pipe (FIFO)"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _option(name: str) -> str:
    return name if name.startswith("-") or name.isupper() else f"--{name}"


def check_outputs(outputs: Mapping[str, object], inputs: Mapping[str, object] | None = None) -> None:
    """Refuse, before any work, outputs that would lose data or cannot be written.

    Raises :class:`~kvtrace.errors.UsageError` (one line, exit 2) naming the output
    and the option that gave it when an output

    * is the same file as an input: same device and inode (so through symlinks and
      hard links), or a path inside an input directory (a directory of shards);
    * is the same file as another output of the run (same resolved path or inode);
    * is empty, an existing directory, device, pipe or socket (replacing it would
      replace that node), or lies in a directory that does not exist or cannot be
      written.

    Parameters
    ----------
    outputs : mapping
        Option name (``out``, ``--plot``, ...) -> path, a list of paths (a directory
        output's files), ``None`` (not given) or ``"-"`` (standard output).
    inputs : mapping, optional
        Option or argument name (``TRACE``, ``--config``, ...) -> path or ``None``.
    """
    files: list[tuple[str, str]] = []
    for name, value in outputs.items():
        for path in (value if isinstance(value, (list, tuple)) else [value]):
            if path is None or str(path) == "-":
                continue
            files.append((_option(name), os.fspath(path)))
    if not files:
        return
    identities: dict[tuple[int, int], str] = {}
    directories: list[tuple[str, str]] = []
    for name, value in (inputs or {}).items():
        if value is None or not str(value):
            continue
        p = os.fspath(value)
        try:
            st = os.stat(p)
        except OSError:
            continue  # a missing input is the reader's error, with its own message
        identities[(st.st_dev, st.st_ino)] = name
        if stat.S_ISDIR(st.st_mode):
            directories.append((name, os.path.realpath(p)))
            with contextlib.suppress(OSError):
                for entry in os.scandir(p):
                    with contextlib.suppress(OSError):
                        est = entry.stat()
                        identities.setdefault((est.st_dev, est.st_ino), name)
    seen: dict[object, tuple[str, str]] = {}
    for name, path in files:
        if not path.strip():
            raise UsageError("expected a file name, got an empty string", field=name.lstrip("-"))
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):  # the directory checks below say which
            st = None
        except OSError as exc:
            raise UsageError(f"cannot use as an output: {exc.strerror or exc}", path=path,
                             field=name.lstrip("-")) from None
        real = os.path.realpath(path)
        if st is not None and not stat.S_ISREG(st.st_mode):
            raise UsageError(f"is {_kind(st.st_mode)}: expected a regular file to write (an output replaces "
                             "the file at its path)", path=path, field=name.lstrip("-"))
        if st is not None and (st.st_dev, st.st_ino) in identities:
            source = identities[(st.st_dev, st.st_ino)]
            raise UsageError(f"is the input {source}: an output never replaces an input; choose another file",
                             path=path, field=name.lstrip("-"))
        for source, root in directories:
            if os.path.commonpath([root, real]) == root:
                raise UsageError(f"lies inside the input directory {source}: an output never goes into an "
                                 "input; choose another place", path=path, field=name.lstrip("-"))
        for key in (real, (st.st_dev, st.st_ino) if st is not None else None):
            if key is not None and key in seen and seen[key][0] != name:
                raise UsageError(f"is also the {seen[key][0]} output of this run: give each output its own file",
                                 path=path, field=name.lstrip("-"))
            if key is not None:
                seen.setdefault(key, (name, path))
        directory = os.path.dirname(path) or "."
        if not os.path.exists(directory):
            raise UsageError("the output's directory does not exist", path=path, field=name.lstrip("-"))
        if not os.path.isdir(directory):
            raise UsageError("the output's directory is not a directory", path=path, field=name.lstrip("-"))
        if not os.access(directory, os.W_OK | os.X_OK):
            raise UsageError("the output's directory is not writable", path=path, field=name.lstrip("-"))


def check_json_target(path: str | None, field: str = "json") -> None:
    """``--json`` takes ``-`` (standard output) or a ``.json`` file, like ``--out``'s suffix check."""
    if path is None or path == "-":
        return
    suffix = Path(path).suffix
    if suffix.lower() != ".json":
        found = f"suffix '{suffix}'" if suffix else "no suffix"
        raise UsageError(f"unsupported JSON file ({found}): expected a .json file or - (standard output)",
                         path=path, field=field)


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
    write_text_atomic(path, json.dumps(json_safe(obj), indent=2, sort_keys=False) + "\n")


def json_safe(obj: object) -> object:
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return json_safe(obj.item())
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
                md[b"kvtrace"] = json.dumps(json_safe(metadata), sort_keys=True).encode()
                table = table.replace_schema_metadata(md)
            pq.write_table(table, tmp, compression="zstd")
        elif fmt == "csv":
            df.write_csv(tmp)
        else:
            payload = {"metadata": metadata or {}, "rows": df.to_dicts()}
            tmp.write_text(json.dumps(json_safe(payload), indent=1) + "\n", encoding="utf-8")


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
                            md[b"kvtrace"] = json.dumps(json_safe(metadata), sort_keys=True).encode()
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
            head = json.dumps(json_safe({"metadata": metadata or {}}), indent=1)
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(head[:-2] + ',\n "rows": [')  # json.dumps(..., indent=1) of the whole payload
                sep = "\n"
                for df in frames:
                    for row in df.to_dicts():
                        fh.write(sep + "\n".join("  " + ln for ln in json.dumps(json_safe(row), indent=1).split("\n")))
                        sep = ",\n"
                fh.write("]\n}\n" if sep == "\n" else "\n ]\n}\n")
