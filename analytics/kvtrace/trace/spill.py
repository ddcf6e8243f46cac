"""Spill directories of streamed runs: made with an owner record, removed once stale.

A streamed run (:mod:`kvtrace.ingest.stream`) keeps its per-access arrays in a temporary
directory (12 bytes per access: many GB for a fleet trace) and removes it on close. A
run killed outright (SIGKILL, the OOM killer, a power cut) cannot, so each spill
directory holds a small owner record, ``owner.json``: the process id, its start time
(``/proc/<pid>/stat``, so that a reused id is not taken for the owner), the boot id and
the host name. Every new streamed run first removes the sibling spill directories
(same parent, name ``kvtrace-stream-*``) whose owner is gone, and logs one line
(``kvtrace: removed ...``, on stderr unless logging is configured) when it removed any.

A directory is removed only when that is certain to be safe:

- it is a real directory (never a symbolic link) owned by this user;
- its record names this host (a shared file system may hold other machines' runs) and
  a process that no longer runs: no such process id, a zombie, a different start
  time, or a boot since;
- a directory without a readable record (a run being created this instant, or a
  kvtrace from before owner records) is removed only once nothing in it has changed
  for :data:`UNMARKED_GRACE_S`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import tempfile
import time
from pathlib import Path

from kvtrace.units import format_bytes

PREFIX = "kvtrace-stream-"
OWNER_FILE = "owner.json"
#: Seconds a spill directory without an owner record must have been left untouched
#: before it counts as stale.
UNMARKED_GRACE_S = 24 * 3600

log = logging.getLogger(__name__)


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(4096).decode("ascii", "replace")
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of a process, from
    ``/proc/<pid>/stat``; None where there is no such file."""
    text = _read(f"/proc/{pid}/stat")
    if not text:
        return None
    fields = text[text.rfind(")") + 2:].split()  # the name in parentheses may hold spaces
    return (fields[0], fields[19]) if len(fields) > 19 else None


def _boot_id() -> str | None:
    text = _read("/proc/sys/kernel/random/boot_id")
    return text.strip() if text else None


def owner_record() -> dict:
    """This process's owner record."""
    st = _proc_stat(os.getpid())
    return {"pid": os.getpid(), "start": st[1] if st else None, "boot": _boot_id(), "host": socket.gethostname()}


def owner_gone(owner: dict) -> bool:
    """Whether the process of an owner record has certainly ended (False when unsure)."""
    if os.name == "nt" or owner.get("host") != socket.gethostname():
        return False  # os.kill would terminate on Windows; another host's process is not ours to judge
    boot = _boot_id()
    if owner.get("boot") and boot and owner["boot"] != boot:
        return True  # the machine rebooted since
    pid = owner.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # a live process of another user (the id was reused): the start time tells
    except OSError:
        return False
    st = _proc_stat(pid)
    if st is None:
        return False
    return st[0] == "Z" or (owner.get("start") is not None and st[1] != owner["start"])


def make_spill_dir(parent: str | os.PathLike | None = None) -> Path:
    """A new spill directory in ``parent`` (default: the system's temporary directory),
    with this process's owner record."""
    spill = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    try:
        with open(spill / OWNER_FILE, "w") as fh:
            json.dump(owner_record(), fh)
    except BaseException:
        shutil.rmtree(spill, ignore_errors=True)
        raise
    return spill


def _owner_of(path: str) -> dict | None:
    try:
        fd = os.open(os.path.join(path, OWNER_FILE), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as fh:
            owner = json.loads(fh.read(4096))
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) else None


def _files(path: str) -> list[os.stat_result]:
    """lstat of the entries of a (flat) spill directory."""
    out = []
    try:
        with os.scandir(path) as it:
            for e in it:
                try:
                    out.append(e.stat(follow_symlinks=False))
                except OSError:
                    pass
    except OSError:
        pass
    return out


def remove_stale(parent: str | os.PathLike | None = None) -> list[tuple[Path, int]]:
    """Remove the stale spill directories in ``parent`` (see the module docstring).

    Returns
    -------
    list of (path, bytes)
        The directories removed and the bytes their files held.
    """
    parent = tempfile.gettempdir() if parent is None else os.fspath(parent)
    uid = os.getuid() if hasattr(os, "getuid") else None
    removed = []
    try:
        with os.scandir(parent) as it:
            entries = [e for e in it if e.name.startswith(PREFIX)]
    except OSError:
        return []
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or (uid is not None and st.st_uid != uid):
            continue  # symbolic links and other users' directories: never
        files = _files(e.path)
        owner = _owner_of(e.path)
        if owner is None:
            newest = max([st.st_mtime, *(f.st_mtime for f in files)])
            if time.time() - newest < UNMARKED_GRACE_S:
                continue
        elif not owner_gone(owner):
            continue
        shutil.rmtree(e.path, ignore_errors=True)
        if not os.path.lexists(e.path):
            removed.append((Path(e.path), sum(f.st_size for f in files if stat.S_ISREG(f.st_mode))))
    return removed


def clean_stale(parent: str | os.PathLike | None = None) -> list[tuple[Path, int]]:
    """:func:`remove_stale`, logging one line (warning level) when it removed anything."""
    removed = remove_stale(parent)
    if len(removed) == 1:
        path, size = removed[0]
        log.warning(f"kvtrace: removed the spill directory of a streamed run that was killed: {path} "
                    f"({format_bytes(size)})")
    elif removed:
        log.warning(f"kvtrace: removed {len(removed)} spill directories of streamed runs that were killed, in "
                    f"{removed[0][0].parent} ({format_bytes(sum(s for _, s in removed))})")
    return removed


__all__ = ["OWNER_FILE", "PREFIX", "UNMARKED_GRACE_S", "clean_stale", "make_spill_dir", "owner_gone",
           "owner_record", "remove_stale"]
