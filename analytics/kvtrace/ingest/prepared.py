"""Prepared traces: a trace's access table and dense ids built once, then memory-mapped.

Loading a trace costs a decode of its file, the dense-id pass (:func:`kvtrace.kernels.
densify.densify`) and the request layout; repeated commands on the same file repeat all
three. A prepared trace stores what :func:`kvtrace.ingest.canonical.build_trace` returns
(the request table as an uncompressed Arrow IPC file, every array as a ``.npy`` file)
under a key, and a later load maps those files instead of building them again.

Invariants:

- **Same trace, bit for bit.** A prepared trace is the :class:`~kvtrace.trace.Trace`
  the build returned: the same request table (schema and values), the same arrays
  (dtype, shape, values), metadata and warnings. Arrays are mapped copy-on-write, so
  a caller that writes into one changes its own pages only, never the stored file.
- **Keyed by content, never by name.** The key is a SHA-256 over the file's bytes, the
  load options that shape the trace (format, block size, tenant sharing, re-chaining
  and re-blocking), the store's format number, kvtrace's version and the source of the
  modules that build a trace. A changed file, option or ingest code misses; a copy or a
  rename of the same bytes hits. The file's digest is remembered under its identity and
  change time (:func:`content_digest`), so an unchanged file is not read to find its key.
- **Complete or absent.** An entry is written in a private directory and renamed into
  place in one step; a reader never sees half an entry. An entry that cannot be read
  (a truncated file, a format from another version) is a miss and is removed.
- **Never in the way.** Storing is best effort and runs on a background thread while
  the analysis goes on (:func:`store_in_background`; the process waits for it before
  it exits): no room, no permission, or a read-only cache directory skips it silently
  and the command's results are unchanged. Only regular files are prepared (not pipes,
  directories of shards or chat logs read with a tokenizer).

Where: ``$KVTRACE_CACHE_DIR`` (``off`` or empty: no prepared traces), else
``$XDG_CACHE_HOME/kvtrace/prepared``, else ``~/.cache/kvtrace/prepared``. The store
keeps at most ``$KVTRACE_CACHE_MAX`` (bytes with an optional unit, default 16 GiB),
removing the least recently used entries after each store, and leaves at least
:data:`MIN_FREE_BYTES` free on its file system.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvtrace.trace import Accesses, Trace, TraceMeta

#: Bumped whenever the stored layout changes; older entries then miss.
FORMAT = 1
CACHE_DIR_ENV = "KVTRACE_CACHE_DIR"
CACHE_MAX_ENV = "KVTRACE_CACHE_MAX"
DEFAULT_MAX_BYTES = 16 << 30
#: A store never leaves less than this free on the cache's file system.
MIN_FREE_BYTES = 1 << 30
_OFF = ("", "off", "0", "none")
#: The Trace arrays stored, by file name: (object path, attribute).
_ARRAYS = {
    "request": ("accesses", "request"), "pos": ("accesses", "pos"), "block": ("accesses", "block"),
    "tokens": ("accesses", "tokens"), "req_start": ("accesses", "req_start"),
    "block_hash": (None, "block_hash"), "block_tenant": (None, "block_tenant"), "block_size": (None, "block_size"),
}
#: The packages and modules whose source shapes a built trace (their digest is in every key).
_CODE = ("ingest", "trace", "kernels/densify.py", "kernels/layout.py")


@dataclass(frozen=True)
class Counts:
    """Sizes of a prepared trace, known without touching its arrays."""

    accesses: int
    blocks: int
    requests: int


def cache_root() -> Path | None:
    """The directory prepared traces live in, or None when they are switched off."""
    given = os.environ.get(CACHE_DIR_ENV)
    if given is not None:
        return None if given.strip().lower() in _OFF else Path(given).expanduser() / "prepared"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kvtrace" / "prepared"


def max_bytes() -> int:
    """``$KVTRACE_CACHE_MAX`` in bytes (``16GiB``, ``500MB``, a plain number), else 16 GiB;
    anything else is a one-line usage error naming the variable (not a silent default)."""
    raw = os.environ.get(CACHE_MAX_ENV)
    if not raw or not raw.strip():
        return DEFAULT_MAX_BYTES
    if raw.strip().isdigit():
        return int(raw)
    from kvtrace.units import parse_size

    return int(parse_size(raw.strip(), field=CACHE_MAX_ENV))


_code_digest: str | None = None


def code_digest() -> str:
    """SHA-256 of kvtrace's version and the source of the modules that build a trace."""
    global _code_digest
    if _code_digest is None:
        from kvtrace import __version__

        pkg = Path(__file__).resolve().parents[1]
        h = hashlib.sha256(f"{FORMAT}:{__version__}".encode())
        for part in _CODE:
            p = pkg / part
            for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
                h.update(str(f.relative_to(pkg)).encode())
                with contextlib.suppress(OSError):
                    h.update(f.read_bytes())
        _code_digest = h.hexdigest()
    return _code_digest


def trace_key(path: str | os.PathLike, options: dict | None) -> str | None:
    """The key of ``path`` loaded with ``options`` (JSON-able values), or None when the
    store is off, ``options`` is None or ``path`` is not a regular file."""
    if options is None or cache_root() is None:
        return None
    try:
        if not os.path.isfile(path):
            return None
        content = content_digest(path)
    except OSError:
        return None
    text = json.dumps({"content": content, "options": options, "code": code_digest()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def file_digest(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, read in 8 MiB pieces."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(8 << 20)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def content_digest(path: str | os.PathLike) -> str:
    """:func:`file_digest` of ``path``, remembered in the store under the file's identity
    and state (real path, device, inode, size, modification and change times in ns):
    the same file unchanged is not read again. Any write changes the change time (which
    no user can set back), so a changed file is hashed anew; the entry keys stay
    content digests."""
    root = cache_root()
    st = os.stat(path)
    ident = (f"{os.path.realpath(path)}\0{st.st_dev}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}"
             f"\0{st.st_ctime_ns}")
    memo = root / "digests" / hashlib.sha256(ident.encode()).hexdigest() if root is not None else None
    if memo is not None:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            known = memo.read_text()
            if len(known) == 64:
                return known
    digest = file_digest(path)
    if memo is not None:
        with contextlib.suppress(OSError):
            memo.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo.with_name(f".{memo.name}.{os.getpid()}")
            tmp.write_text(digest)
            os.replace(tmp, memo)
    return digest


def _entry(key: str) -> Path:
    return cache_root() / key[:2] / key


def fetch(key: str | None) -> tuple[Trace, Counts] | None:
    """The prepared trace of ``key`` (arrays mapped copy-on-write), or None on a miss."""
    if key is None:
        return None
    d = _entry(key)
    if not (d / "trace.json").is_file():  # absent (an entry is renamed into place whole)
        return None
    try:
        info = json.loads((d / "trace.json").read_text())
        if info.get("format") != FORMAT:
            raise ValueError("another format")
        arrays = {name: _map_array(d / f"{name}.npy", info["arrays"][name]) for name in _ARRAYS}
        requests = _map_table(d / "requests.arrow")
        if requests.height != info["counts"]["requests"]:
            raise ValueError("request count")
    except Exception:  # a damaged, partly removed or foreign entry: a miss, and out of the way
        shutil.rmtree(d, ignore_errors=True)
        return None
    with contextlib.suppress(OSError):
        os.utime(d)  # recency for the least-recently-used pruning
    trace = Trace(
        requests=requests,
        accesses=Accesses(**{attr: arrays[name] for name, (owner, attr) in _ARRAYS.items() if owner}),
        block_hash=arrays["block_hash"], block_tenant=arrays["block_tenant"], block_size=arrays["block_size"],
        meta=TraceMeta.from_dict(info["meta"]),
        warnings=list(info["warnings"]),
    )
    return trace, Counts(**info["counts"])


def _map_array(path: Path, want: dict) -> np.ndarray:
    """A stored array, mapped copy-on-write, as a plain ndarray (what the kernels take)."""
    mapped = np.load(path, mmap_mode="c")
    if str(mapped.dtype) != want["dtype"] or list(mapped.shape) != want["shape"]:
        raise ValueError(f"{path.name}: dtype or shape differs")
    return np.asarray(mapped) if mapped.size else np.zeros(mapped.shape, dtype=mapped.dtype)


def _map_table(path: Path):
    """The request table of an Arrow IPC file, its buffers mapped (no copy)."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.ipc

    with pa.memory_map(str(path)) as src:
        table = pa.ipc.open_file(src).read_all()
    return pl.from_arrow(table, rechunk=False)


def store(key: str | None, trace: Trace) -> bool:
    """Store ``trace`` under ``key``, best effort; True when an entry now exists."""
    if key is None:
        return False
    root = cache_root()
    final = _entry(key)
    if final.is_dir():
        return True
    arrays = {name: getattr(getattr(trace, owner) if owner else trace, attr) for name, (owner, attr) in _ARRAYS.items()}
    need = sum(int(a.nbytes) for a in arrays.values()) + int(trace.requests.estimated_size())
    limit = max_bytes()
    tmp = None
    try:
        if need > limit:
            return False
        root.mkdir(parents=True, exist_ok=True)
        if shutil.disk_usage(root).free < need + MIN_FREE_BYTES:
            return False
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=root))
        for name, a in arrays.items():
            np.save(tmp / f"{name}.npy", np.ascontiguousarray(a), allow_pickle=False)
        trace.requests.write_ipc(tmp / "requests.arrow", compression="uncompressed")
        info = {
            "format": FORMAT,
            "meta": trace.meta.to_dict(),
            "warnings": list(trace.warnings),
            "counts": {"accesses": trace.n_accesses, "blocks": trace.n_blocks, "requests": trace.n_requests},
            "arrays": {name: {"dtype": str(a.dtype), "shape": list(a.shape)} for name, a in arrays.items()},
        }
        (tmp / "trace.json").write_text(json.dumps(info, sort_keys=True))
        final.parent.mkdir(exist_ok=True)
        try:
            os.rename(tmp, final)
            tmp = None
        except OSError:  # another process stored it first: theirs is as good
            return final.is_dir()
        prune(root, limit, keep=final)
        return True
    except OSError:
        return False
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


_pending: list[threading.Thread] = []


def store_in_background(key: str | None, trace: Trace) -> None:
    """:func:`store` on a thread of its own; the interpreter waits for it at exit
    (:func:`wait`), so a command's first run overlaps the writing with its analysis."""
    if key is None or _entry(key).is_dir():
        return
    max_bytes()  # a bad $KVTRACE_CACHE_MAX stops the command here, not silently on the writer thread
    if not _pending:
        atexit.register(wait)
    thread = threading.Thread(target=store, args=(key, trace), name="kvtrace-prepare", daemon=True)
    _pending.append(thread)
    thread.start()


def wait() -> None:
    """Wait for the prepared traces being stored."""
    while _pending:
        _pending.pop().join()


def entries(root: Path | None = None) -> list[tuple[Path, int, float]]:
    """Every complete entry: (directory, bytes, last use), least recently used first."""
    root = root or cache_root()
    out = []
    if root is None or not root.is_dir():
        return out
    for d in root.glob("??/*"):
        try:
            size = sum(f.stat().st_size for f in d.iterdir())
            out.append((d, size, d.stat().st_mtime))
        except OSError:
            continue
    return sorted(out, key=lambda e: e[2])


def prune(root: Path, limit: int, keep: Path | None = None) -> None:
    """Remove the least recently used entries until the store holds at most ``limit``
    bytes (never ``keep``), and private directories of writers that died."""
    all_ = entries(root)
    total = sum(size for _, size, _ in all_)
    for d, size, _ in all_:
        if total <= limit:
            break
        if d != keep:
            shutil.rmtree(d, ignore_errors=True)
            total -= size
    for tmp in root.glob(".tmp-*"):
        if not _alive(tmp.name.split("-")[1]):
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: str) -> bool:
    """Whether process ``pid`` (text) still runs (unparseable: assumed so)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, OverflowError):
        return True
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def clear() -> int:
    """Remove every prepared trace (and the remembered file digests); the bytes freed."""
    freed = 0
    for d, size, _ in entries():
        shutil.rmtree(d, ignore_errors=True)
        freed += size
    root = cache_root()
    if root is not None:
        shutil.rmtree(root / "digests", ignore_errors=True)
    return freed
