"""Trace sources of the dashboard (``kvtrace app``): reading options, request-log
options from the page, the paths a browser may make the server read, content hashes,
and loading a trace to a one-line error at worst. No Streamlit here.

- **what is read**: an uploaded file (bytes) or a server-side path (the bundled samples
  are one), read with :func:`kvtrace.ingest.load_trace` like every command, request logs
  (``tokens``, ``openai``) with the commands' request-log options
  (:attr:`LoadOptions.log`, :func:`log_options_from_form`). A source is identified by
  the SHA-256 of its bytes plus the load options (:attr:`Loaded.key`), the key the
  app's caches use together with the analysis parameters. A source that cannot be
  read gives a one-line error (:attr:`Loaded.error`), never a traceback;
- **the rules a browser is held to**: anyone who can open the page chooses what the
  server reads, so a server path, and a chat log's tokenizer and template, are
  confined to the data directory (``kvtrace app --data-dir``; :func:`server_path`,
  :func:`server_log_file`), sources are refused above a size limit before they are
  read (``--max-trace-bytes``), and the page's error lines name the structure that was
  expected, never content of the file (:func:`error_line`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kvtrace.errors import KvtraceError
from kvtrace.ingest import LOG_FORMATS, LogOptions
from kvtrace.ingest.chat_template import tokenizer_files
from kvtrace.ingest.tokens import TIME_UNITS
from kvtrace.ingest.vllm_hash import HASH_FUNCTIONS
from kvtrace.trace import Trace
from kvtrace.units import format_bytes

#: Suffixes the upload widget accepts (the last suffix of a name, without the dot).
UPLOAD_TYPES = ("jsonl", "json", "gz", "parquet", "pq", "csv")
_HASH_CHUNK = 1 << 22


@dataclass(frozen=True)
class LoadOptions:
    """How to read a trace file (the options of every command that reads one).

    Attributes
    ----------
    fmt : str
        ``auto``, ``mooncake``, ``bailian``, ``parquet``, ``csv``, or a request log:
        ``tokens`` or ``openai``.
    block_tokens : int or None
        Tokens per block (None: the format's default; vLLM's 16 for request logs).
    share_tenants : bool
        Equal hashes in different tenants are the same block.
    log : LogOptions or None
        The request-log options (``--tokens-field`` ... ``--chat-template``), passed to
        :func:`kvtrace.ingest.load_trace` as ``log``; None: the defaults.
    """

    fmt: str = "auto"
    block_tokens: int | None = None
    share_tenants: bool = False
    log: LogOptions | None = None

    @property
    def tag(self) -> str:
        """The options in a trace's cache key: ``fmt/block size/tenants``, then, when
        request-log options other than the defaults are set, ``log-<digest>``
        (:func:`log_digest`)."""
        tag = f"{self.fmt}/{self.block_tokens or 'default'}/{'shared' if self.share_tenants else 'split'}"
        if self.log is not None and self.log != LogOptions():
            tag += f"/log-{log_digest(self.log)}"
        return tag


#: The request-log options each log format reads (the parameter names of
#: :meth:`kvtrace.ingest.LogOptions.from_options`, as the commands' options are named).
LOG_FIELDS = {
    "tokens": ("tokens_field", "time_field", "salt_field", "lora_field", "time_unit", "hash_fn", "hash_seed"),
    "openai": ("tokenizer", "chat_template", "time_unit", "hash_fn", "hash_seed"),
}
#: The request-log options that take one of a few values, and those values.
LOG_CHOICES = {"time_unit": TIME_UNITS, "hash_fn": HASH_FUNCTIONS}
#: Request-log options that name a file the server reads: confined as a trace is (:func:`server_log_file`).
LOG_PATHS = ("tokenizer", "chat_template")


def log_form_values(log: LogOptions | None = None) -> dict[str, str]:
    """Every request-log option of :data:`LOG_FIELDS` as form text (unset: "")."""
    log = log or LogOptions()
    out = {opt: getattr(log.fields, attr) for opt, attr in LogOptions.FIELD_OPTIONS.items()}
    out.update({k: getattr(log, k) for k in ("time_unit", "hash_fn", "hash_seed", *LOG_PATHS)})
    return {k: "" if v is None else str(v) for k, v in out.items()}


def log_options_from_form(fmt: str, values: dict[str, str], root: str | os.PathLike, *, max_bytes: int,
                          base: LogOptions | None = None) -> LogOptions | None:
    """The request-log options typed in the page, for a trace read as ``fmt``.

    Parameters
    ----------
    fmt : str
        The format chosen; only a log format's own options (:data:`LOG_FIELDS`) are
        read from ``values``.
    values : dict
        Option name (``tokens_field``, ``tokenizer``, ...) -> text; empty text is the
        option's default. The tokenizer and chat template are paths under ``root``
        (:func:`server_log_file`).
    root : path-like
        The data directory.
    max_bytes : int
        Size limit in bytes of a tokenizer's files, of a chat template.
    base : LogOptions, optional
        The options ``kvtrace app`` was launched with: what the page does not show is
        kept from them.

    Returns
    -------
    LogOptions or None
        ``base`` unchanged when ``fmt`` is not a request log.

    Raises
    ------
    KvtraceError
        A tokenizer or template outside ``root``, not a regular file, or too large.
    """
    if fmt not in LOG_FORMATS:
        return base
    default = LogOptions()
    log = base or default
    fields, others = {}, {}
    for opt in LOG_FIELDS[fmt]:
        text = str(values.get(opt) or "").strip()
        if opt in LogOptions.FIELD_OPTIONS:
            attr = LogOptions.FIELD_OPTIONS[opt]
            fields[attr] = text or getattr(default.fields, attr)
        elif opt in LOG_PATHS:
            others[opt] = str(server_log_file(text, root, option=opt, max_bytes=max_bytes)) if text else None
        else:
            others[opt] = text or getattr(default, opt)
    return dataclasses.replace(log, fields=dataclasses.replace(log.fields, **fields), **others)


def log_digest(log: LogOptions) -> str:
    """16 hex digits naming request-log options and the bytes they read: the options'
    values, and the (path, size, mtime) of each file of the tokenizer and template, so
    that a tokenizer edited in place gives another key."""
    values = dataclasses.asdict(log)
    files = [(f, *_size_mtime(f)) for f in _log_files(log)]
    text = json.dumps({"options": values, "files": files}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def _size_mtime(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return -1, -1
    return int(st.st_size), int(st.st_mtime_ns)


def _log_files(log: LogOptions) -> list[str]:
    out = [str(f) for f in tokenizer_files(log.tokenizer)] if log.tokenizer else []
    return out + ([log.chat_template] if log.chat_template else [])




def is_inside(path: str, root: str) -> bool:
    """Whether the resolved ``path`` is ``root`` or under it (both resolved: :func:`os.path.realpath`)."""
    return os.path.commonpath([path, root]) == root

def _over_limit(size: int, max_bytes: int) -> str:
    return (f"{format_bytes(size)}, above the dashboard's limit of {format_bytes(max_bytes)} per trace "
            "(kvtrace app --max-trace-bytes)")


def server_path(text: str, root: str | os.PathLike, *, max_bytes: int) -> Path:
    """The trace a path typed in the page names, or a one-line refusal.

    A relative path is relative to ``root``. The path is resolved (``..``, symlinks:
    :func:`os.path.realpath`) and must stay inside ``root``
    (:func:`os.path.commonpath`); it must be a regular file, or a directory whose JSONL
    shards are regular files inside ``root`` too (FIFOs, devices and sockets are
    refused: reading them may never end); and it may hold at most ``max_bytes``.
    Nothing is opened: only ``stat`` and directory listings.

    Parameters
    ----------
    text : str
        The path as typed; error messages name it so.
    root : path-like
        The data directory.
    max_bytes : int
        Size limit in bytes (a directory: its shards together).

    Returns
    -------
    Path
        The resolved path.

    Raises
    ------
    KvtraceError
        Outside ``root``, missing, not a regular file or directory, or too large.
    """
    root_real = os.path.realpath(root)
    real = _resolve_inside(text, root_real, "traces")
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise KvtraceError("no such file", path=text) from None
    except OSError as exc:
        raise KvtraceError(exc.strerror or "cannot be read", path=text) from None
    if stat.S_ISDIR(st.st_mode):
        size = sum(s.st_size for s in _shard_stats(real, root_real, text))
    elif stat.S_ISREG(st.st_mode):
        size = st.st_size
    else:
        raise KvtraceError("not a regular file (a device, FIFO or socket): expected a trace file or a directory "
                           "of JSONL shards", path=text)
    if size > max_bytes:
        raise KvtraceError(_over_limit(size, max_bytes), path=text)
    return Path(real)


def _resolve_inside(text: str, root_real: str, what: str, field: str | None = None) -> str:
    """``text`` resolved under ``root_real`` (:func:`os.path.realpath`), refused when outside it."""
    try:
        real = os.path.realpath(os.path.join(root_real, text))
    except ValueError:  # an embedded NUL
        raise KvtraceError("not a valid path", path=repr(text), field=field) from None
    if not is_inside(real, root_real):  # checked first: outside, existing or not, is one answer
        raise KvtraceError(f"outside the data directory {root_real}: the dashboard reads {what} under it only "
                           "(kvtrace app --data-dir)", path=text, field=field)
    return real


def server_log_file(text: str, root: str | os.PathLike, *, option: str, max_bytes: int) -> Path:
    """The tokenizer (``option="tokenizer"``) or chat template (``"chat_template"``)
    a path typed in the page names, or a one-line refusal.

    Confined as :func:`server_path` confines a trace: resolved under ``root`` and
    inside it; a tokenizer directory's files (the ones the tokenizer loader reads, as
    a directory's shards are checked) and a template must be regular files inside
    ``root`` too, together at most ``max_bytes``. A path that does not exist is
    returned resolved: the loader's own line says what to pass. Nothing is opened.

    Raises
    ------
    KvtraceError
        Outside ``root``, not a regular file or directory, or too large; the message
        names the path as typed and the option.
    """
    root_real = os.path.realpath(root)
    real = _resolve_inside(text, root_real, "files", option)
    if not os.path.lexists(real):
        return Path(real)
    files = [str(f) for f in tokenizer_files(real)] if option == "tokenizer" else [real]
    folder = real if os.path.isdir(real) else os.path.dirname(real)
    size = 0
    for f in files:
        f_real = os.path.realpath(f)
        name = os.path.relpath(f, folder)
        if not is_inside(f_real, root_real):
            raise KvtraceError(f"{name} is outside the data directory {root_real}", path=text, field=option)
        try:
            st = os.stat(f_real)
        except FileNotFoundError:
            continue  # the loader says what is missing
        if not stat.S_ISREG(st.st_mode):
            expected = "a tokenizer directory or tokenizer.json" if option == "tokenizer" else "a template file"
            raise KvtraceError(f"{name} is not a regular file: expected {expected}", path=text, field=option)
        size += st.st_size
    if size > max_bytes:
        raise KvtraceError(_over_limit(size, max_bytes), path=text, field=option)
    return Path(real)


def _shard_stats(directory: str, root: str, text: str) -> list[os.stat_result]:
    """``stat`` of each JSONL shard of a directory, each checked as :func:`server_path` checks a file."""
    from kvtrace.ingest.jsonl import shard_files

    out = []
    for f in shard_files(directory)[0]:
        real = os.path.realpath(f)
        name = os.path.basename(f)
        if not is_inside(real, root):
            raise KvtraceError(f"shard {name} is outside the data directory {root}", path=text)
        st = os.stat(real)
        if not stat.S_ISREG(st.st_mode):
            raise KvtraceError(f"shard {name} is not a regular file", path=text)
        out.append(st)
    return out


def _source_files(path: str) -> list[str]:
    """The files a source is read from: itself, or a directory's shards in read order."""
    if os.path.isdir(path):
        from kvtrace.ingest.jsonl import shard_files

        return shard_files(path)[0]
    return [path]


def bytes_sha256(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | os.PathLike, *, max_bytes: int | None = None,
                progress: Callable[[int, int], None] | None = None) -> str:
    """Hex SHA-256 of a file's bytes, read in 4 MiB chunks (a directory of shards: each
    shard's name and bytes, in read order).

    Parameters
    ----------
    path : path-like
    max_bytes : int, optional
        Read at most this many bytes (a file that grew past it is refused).
    progress : callable, optional
        ``progress(bytes_done, bytes_total)`` after each chunk; it may raise to stop.

    Raises
    ------
    KvtraceError
        More than ``max_bytes``.
    """
    files = _source_files(os.fspath(path))
    total = sum(os.stat(f).st_size for f in files)
    h = hashlib.sha256()
    done = 0
    for name in files:
        if len(files) > 1 or name != os.fspath(path):
            h.update(os.path.basename(name).encode("utf-8", "surrogateescape") + b"\0")
        with open(name, "rb") as f:
            while chunk := f.read(_HASH_CHUNK):
                done += len(chunk)
                if max_bytes is not None and done > max_bytes:
                    raise KvtraceError(_over_limit(done, max_bytes), path=str(path))
                h.update(chunk)
                if progress is not None:
                    progress(done, max(total, done))
    return h.hexdigest()


def file_signature(path: str | os.PathLike) -> tuple[str, int, int]:
    """(resolved path, size, mtime_ns): changes whenever the file's content may have.

    A directory of shards: its shards' total size and the latest mtime of it and of
    them. The app hashes a file's content once per signature instead of on every rerun.
    """
    p = Path(path).expanduser().resolve()
    stats = [os.stat(f) for f in _source_files(str(p))]
    mtime = max([p.stat().st_mtime_ns, *(s.st_mtime_ns for s in stats)])
    return str(p), int(sum(s.st_size for s in stats)), int(mtime)


@dataclass
class Loaded:
    """A trace read for the app, or why it could not be.

    Attributes
    ----------
    trace : Trace or None
        None when the source could not be read.
    key : str
        ``sha256:<hex of the source bytes>:<load options>``: the cache key of the trace
        and, with the analysis parameters, of every result computed from it.
    label : str
        The file name shown in the page.
    error : str or None
        One line naming the file, the line or row and what was expected.
    source : str
        The path (or upload name) the error names.
    """

    trace: Trace | None
    key: str
    label: str
    error: str | None = None
    source: str = ""

    def renamed(self, label: str, source: str) -> "Loaded":
        """The same trace under another name (same bytes read from another file)."""
        error = self.error
        if error is not None and self.source:
            error = error.replace(self.source, source, 1)
        return dataclasses.replace(self, label=label, error=error, source=source)


def trace_key(digest: str, options: LoadOptions) -> str:
    """The cache key of a source: ``sha256:<digest>:<options.tag>`` (:attr:`Loaded.key`)."""
    return f"sha256:{digest}:{options.tag}"


#: Where a kvtrace message turns from what was expected to what the file held
#: (``expected numbers, got 'soon'``; ``...; found columns: a, b``): cut there.
_FOUND = re.compile(r"(?:[,;:]\s*|\s)(?:got|found)\s.*$", re.DOTALL)


def _third_party_texts(exc: BaseException) -> list[str]:
    """First lines of the non-kvtrace exceptions behind ``exc`` (its cause and context
    chain): Polars, Arrow, zlib ... messages quote the bytes they failed on."""
    out, seen, todo = [], set(), [exc.__cause__, exc.__context__]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        todo += [e.__cause__, e.__context__]
        if isinstance(e, (KvtraceError, json.JSONDecodeError)):  # JSON's own messages never quote the text
            continue
        for text in (str(e), str(getattr(e, "msg", "") or "")):
            if text.strip():
                out.append(text.strip().splitlines()[0])
    return sorted(set(out), key=len, reverse=True)


def _structure_only(message: str, exc: BaseException) -> str:
    """``message`` without the file's content: third-party text and what was found."""
    for text in _third_party_texts(exc):
        message = message.replace(text, "")
    message = _FOUND.sub("", message)
    message = re.sub(r"\s*\(\s*\)", "", message)  # "corrupt gzip stream ()"
    return re.sub(r"[\s:;,]+$", "", message) or "not a readable trace"


def error_line(exc: BaseException, label: str, internal_path: str | None = None) -> str:
    """One line for a source that failed to load (no traceback), as the page shows it.

    The line names the file, the line or row, the field and what was expected, never
    what the file holds: the value found (``..., got 'soon'``, ``found columns: ...``)
    and any third-party exception text (Polars, Arrow, zlib messages quote the bytes
    they failed on) are dropped. ``internal_path`` (a temporary copy of an upload) is
    replaced by ``label``.
    """
    if isinstance(exc, KvtraceError):
        path = exc.path
        if path is None or (internal_path is not None and str(path) == str(internal_path)):
            path = label
        err = type(exc)(_structure_only(exc.message, exc), path=path, line=exc.line, row=exc.row, field=exc.field)
        text = err.one_line()
    elif isinstance(exc, MemoryError):
        text = f"{label}: out of memory while reading the trace: try a smaller trace or the CLI with --sample-rate"
    elif isinstance(exc, OSError):
        text = f"{label}: {exc.strerror or type(exc).__name__}"
    else:
        text = f"{label}: not a readable trace ({type(exc).__name__})"
    if internal_path is not None:
        text = text.replace(str(internal_path), label)
    return " ".join(text.split())


def _load(path: str, options: LoadOptions) -> Trace:
    from kvtrace.ingest import load_trace

    # workload "stats" (the first page): the memory guard bounds decompression and refuses
    # a trace that would not fit before parsing it
    return load_trace(path, fmt=options.fmt, block_tokens=options.block_tokens,
                      share_tenants=options.share_tenants, workload="stats", log=options.log)


def load_file(path: str | os.PathLike, options: LoadOptions = LoadOptions(), *, digest: str | None = None,
              label: str | None = None) -> Loaded:
    """Read a trace file (or directory of JSONL shards) on this machine: a sample, or a
    server-side path already checked by :func:`server_path`.

    Parameters
    ----------
    path : path-like
    options : LoadOptions
    digest : str, optional
        The file's SHA-256 when already known (:func:`file_sha256`).
    label : str, optional
        Name shown in the page (default: the file name).
    """
    p = Path(path).expanduser()
    label = label or p.name or str(path)
    try:
        if not p.exists():
            raise KvtraceError("no such file", path=str(path))
        digest = digest or file_sha256(p)
        trace = _load(str(p), options)
    except Exception as exc:  # noqa: BLE001 - every failure becomes one line in the page
        return Loaded(None, trace_key(digest or "unreadable", options), label, error_line(exc, str(path)), str(path))
    return Loaded(trace, trace_key(digest, options), label, source=str(path))


def _safe_name(name: str) -> str:
    base = Path(name.replace("\\", "/")).name or "upload"
    return re.sub(r"[^A-Za-z0-9._-]", "_", base)[-120:]


def load_upload(name: str, data: bytes, options: LoadOptions = LoadOptions(), *,
                digest: str | None = None, max_bytes: int | None = None) -> Loaded:
    """Read an uploaded trace (its bytes; the name's suffix tells the format).

    The bytes are written to a private temporary file under the upload's name (the
    readers detect the format from the suffix), read, and the file removed. Above
    ``max_bytes`` the upload is refused before anything is written or read.
    """
    label = Path(name).name or "upload"
    if max_bytes is not None and len(data) > max_bytes:
        return Loaded(None, "", label, f"{label}: {_over_limit(len(data), max_bytes)}", label)
    digest = digest or bytes_sha256(data)
    key = trace_key(digest, options)
    with tempfile.TemporaryDirectory(prefix="kvtrace-upload-") as tmp:
        path = os.path.join(tmp, _safe_name(name))
        try:
            if not data:
                raise KvtraceError("the uploaded file is empty", path=label)
            with open(path, "wb") as f:
                f.write(data)
            trace = _load(path, options)
        except Exception as exc:  # noqa: BLE001 - every failure becomes one line in the page
            return Loaded(None, key, label, error_line(exc, label, internal_path=path), label)
    trace.meta = dataclasses.replace(trace.meta, source=label)
    return Loaded(trace, key, label, source=label)


