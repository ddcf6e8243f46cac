"""Data glue for the Streamlit dashboard (``kvtrace app``); no Streamlit here.

The pages in ``app/`` are UI only. What they need beyond the analysis functions the
CLI calls (:func:`kvtrace.analyses.stats.trace_stats`, :func:`kvtrace.analyses.curves.compute_curve`,
:func:`kvtrace.analyses.whatif.simulate`, ...) lives here:

- **trace sources**: the bundled samples, an uploaded file (bytes) or a server-side
  path, read with :func:`kvtrace.ingest.load_trace` like every command, request logs
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
  expected, never content of the file (:func:`error_line`);
- **chart tables**: small Polars tables (arrivals per minute, length and reuse-time
  histograms, curve lines per metric and group, latency percentiles) shaped from the
  library's results. They add no figures of their own: the tests check each against
  the library function behind it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import stat
import tempfile
from importlib import resources
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from kvtrace.analyses.curves import GROUPINGS, KNEE_METRICS, CurveResult
from kvtrace.errors import KvtraceError
from kvtrace.ingest import LOG_FORMATS, LogOptions
from kvtrace.ingest.chat_template import tokenizer_files
from kvtrace.ingest.tokens import TIME_UNITS, TokenFields
from kvtrace.ingest.vllm_hash import HASH_FUNCTIONS
from kvtrace.names import label
from kvtrace.trace import Trace
from kvtrace.units import format_bytes, parse_size

#: Environment variables ``kvtrace app`` sets for the Streamlit process.
ENV_TRACE = "KVTRACE_APP_TRACE"
ENV_FORMAT = "KVTRACE_APP_FORMAT"
ENV_BLOCK_TOKENS = "KVTRACE_APP_BLOCK_TOKENS"
ENV_SHARE_TENANTS = "KVTRACE_APP_SHARE_TENANTS"
ENV_DATA_DIR = "KVTRACE_APP_DATA_DIR"
ENV_MAX_TRACE_BYTES = "KVTRACE_APP_MAX_TRACE_BYTES"
ENV_LOG_OPTIONS = "KVTRACE_APP_LOG_OPTIONS"  # JSON of the request-log options (LogOptions)
ENV_SAMPLES = "KVTRACE_SAMPLES"  # a directory of sample traces instead of the bundled one
#: Default of ``kvtrace app --max-trace-bytes``: the largest trace file (or directory of
#: shards, or upload) the dashboard reads.
DEFAULT_MAX_TRACE_BYTES = 4 * 2**30

APP_DIR = Path(__file__).resolve().parents[1] / "app"
APP_ENTRY = APP_DIR / "kvtrace_app.py"
DEFAULT_SAMPLE = "chat.jsonl"
TRACE_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet", ".pq", ".csv", ".csv.gz")
#: Suffixes the upload widget accepts (the last suffix of a name, without the dot).
UPLOAD_TYPES = ("jsonl", "json", "gz", "parquet", "pq", "csv")
_HASH_CHUNK = 1 << 22


# --------------------------------------------------------------------------- sources


def sample_dir() -> Path:
    """The directory of bundled sample traces (``$KVTRACE_SAMPLES`` overrides)."""
    return Path(os.environ.get(ENV_SAMPLES) or str(resources.files("kvtrace.samples")))


def sample_traces() -> dict[str, Path]:
    """Bundled sample traces by file name, :data:`DEFAULT_SAMPLE` first."""
    d = sample_dir()
    files = sorted(p for p in d.iterdir() if p.is_file() and p.name.lower().endswith(TRACE_SUFFIXES)) \
        if d.is_dir() else []
    files.sort(key=lambda p: (p.name != DEFAULT_SAMPLE, p.name))
    return {p.name: p for p in files}


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


def _log_to_json(log: LogOptions) -> str:
    return json.dumps(dataclasses.asdict(log), sort_keys=True)


def _log_from_json(text: str) -> LogOptions:
    d = json.loads(text)
    return LogOptions(fields=TokenFields(**d.pop("fields", {})), **d)


def launch_options() -> tuple[Path | None, LoadOptions]:
    """The trace and load options ``kvtrace app TRACE`` passed in the environment."""
    path = os.environ.get(ENV_TRACE) or None
    bt = os.environ.get(ENV_BLOCK_TOKENS) or None
    log = os.environ.get(ENV_LOG_OPTIONS) or None
    opts = LoadOptions(fmt=os.environ.get(ENV_FORMAT) or "auto", block_tokens=int(bt) if bt else None,
                       share_tenants=os.environ.get(ENV_SHARE_TENANTS) == "1",
                       log=_log_from_json(log) if log else None)
    return (Path(path) if path else None), opts


def data_dir_default() -> Path:
    """The data directory without ``--data-dir`` or a trace: the sample traces' directory."""
    return Path(os.path.realpath(sample_dir()))


def data_dir() -> Path:
    """The directory server paths are confined to (``kvtrace app --data-dir``), resolved.

    Default: the sample traces' directory (:func:`data_dir_default`).
    """
    return Path(os.path.realpath(os.environ.get(ENV_DATA_DIR) or data_dir_default()))


def max_trace_bytes() -> int:
    """The size limit in bytes of a server-path trace or an upload (``--max-trace-bytes``)."""
    text = os.environ.get(ENV_MAX_TRACE_BYTES)
    return int(text) if text else DEFAULT_MAX_TRACE_BYTES


def upload_limit_mb(max_bytes: int) -> int:
    """``max_bytes`` in Streamlit's upload-limit unit (MiB, rounded up, at least 1)."""
    return max(1, -(-int(max_bytes) // 2**20))


def _inside(path: str, root: str) -> bool:
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
    if not _inside(real, root_real):  # checked first: outside, existing or not, is one answer
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
        if not _inside(f_real, root_real):
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
        if not _inside(real, root):
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


# --------------------------------------------------------------------------- overview


def arrivals_per_minute(trace: Trace) -> pl.DataFrame:
    """Requests per minute of trace time, as ``kvtrace stats`` counts them.

    Returns
    -------
    polars.DataFrame
        ``minute`` int64 (minutes from the first arrival's minute), ``requests`` int64.
        Its mean and maximum are the stats' ``mean_arrivals_per_minute`` and
        ``peak_arrivals_per_minute``.
    """
    ts = trace.request_timestamp
    if ts.size == 0:
        return pl.DataFrame({"minute": [], "requests": []}, schema={"minute": pl.Int64, "requests": pl.Int64})
    minute = np.floor(ts / 60.0).astype(np.int64)
    counts = np.bincount(minute - minute.min())
    return pl.DataFrame({"minute": np.arange(counts.shape[0], dtype=np.int64), "requests": counts.astype(np.int64)})


def _log_histogram(x: np.ndarray, *, zero_below: float | None = None, per_octave: int = 2) -> pl.DataFrame:
    """Counts of ``x`` in log-spaced bins (``per_octave`` bins per doubling).

    Values below ``zero_below`` (e.g. a reuse in the same second) go to a first bin
    ``[0, zero_below)``.
    """
    schema = {"bin_lo": pl.Float64, "bin_hi": pl.Float64, "count": pl.Int64}
    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0:
        return pl.DataFrame({"bin_lo": [], "bin_hi": [], "count": []}, schema=schema)
    rows = []
    if zero_below is not None:
        small = x < zero_below
        if small.any():
            rows.append((0.0, float(zero_below), int(small.sum())))
        x = x[~small]
    if x.size:
        lo = max(float(x.min()), 1e-300)
        lo_e = math.floor(math.log2(lo) * per_octave)
        hi_e = math.floor(math.log2(float(x.max())) * per_octave) + 1
        edges = 2.0 ** (np.arange(lo_e, hi_e + 1) / per_octave)
        counts, _ = np.histogram(x, bins=edges)
        rows += [(float(edges[i]), float(edges[i + 1]), int(c)) for i, c in enumerate(counts)]
    return pl.DataFrame(rows, schema=schema, orient="row")


def input_length_histogram(trace: Trace) -> pl.DataFrame:
    """Requests by prompt length (``input_tokens``), two log bins per doubling.

    Columns ``bin_lo``, ``bin_hi`` (tokens, the bin is ``[lo, hi)``), ``count``
    (requests). Zero-length prompts fall in a ``[0, 1)`` bin.
    """
    return _log_histogram(trace.requests["input_tokens"].to_numpy(), zero_below=1.0)


def reuse_times(trace: Trace) -> np.ndarray:
    """float64: seconds between consecutive accesses of the same block.

    The same values (as a multiset) as ``kvtrace stats``' ``reuse_time_s`` row: one per
    access that re-references a block, measured from the block's previous access.
    """
    a = trace.accesses
    if len(a) == 0:
        return np.zeros(0)
    order = np.argsort(a.block, kind="stable")  # trace order within each block
    blk = a.block[order]
    ts = trace.request_timestamp[a.request[order]]
    same = blk[1:] == blk[:-1]
    return (ts[1:] - ts[:-1])[same]


def reuse_time_histogram(trace: Trace) -> pl.DataFrame:
    """Block re-references by seconds since the previous access of the block.

    Columns ``bin_lo``, ``bin_hi`` (seconds, ``[lo, hi)``), ``count`` (accesses).
    Reuses under a millisecond (the same request, or requests arriving together)
    share a first ``[0, 0.001)`` bin.
    """
    return _log_histogram(reuse_times(trace), zero_below=1e-3)


# --------------------------------------------------------------------------- curves

#: Metric choices of the Curves page: label (:data:`kvtrace.names.LABELS`) -> curve-table column.
CURVE_METRICS = {label(m): m for m in ("prefix_token_hit_rate", "request_hit_rate", "request_half_prefix_hit_rate",
                                       "prefix_byte_hit_rate", "compute_saved_rate")}
#: Above this many block accesses the Curves page proposes SHARDS sampling.
LARGE_TRACE_ACCESSES = 5_000_000


def groupings(trace: Trace) -> list[str]:
    """The ``--by`` groupings this trace has values for (type, tenant, turn, session-length)."""
    req = trace.requests
    col = {"type": "type", "tenant": "tenant", "turn": "turn", "session-length": "session_id"}
    return [g for g in GROUPINGS if req[col[g]].null_count() < req.height]


def curve_lines(result: CurveResult, metric: str) -> pl.DataFrame:
    """One line per group (``all`` without a breakdown) of one curve metric.

    Returns
    -------
    polars.DataFrame
        ``group`` str · ``capacity_bytes`` int64 · ``capacity_gib`` float64 ·
        ``rate`` float64 · ``se`` float64 (estimated standard error of a sampled
        headline rate; null otherwise). Capacity 0 is dropped (log axis).
    """
    se_col = f"{metric}_se"
    base = result.curve.with_columns(pl.lit("all").alias("group_name"))
    frames = [base]
    if result.by_group is not None:
        frames.append(result.by_group)
    out = []
    for df in frames:
        se = pl.col(se_col) if se_col in df.columns else pl.lit(None, dtype=pl.Float64)
        out.append(df.select(
            pl.col("group_name").cast(pl.String),
            pl.col("capacity_bytes").cast(pl.Int64),
            (pl.col("capacity_bytes").cast(pl.Float64) / 2**30).alias("capacity_gib"),
            pl.col(metric).cast(pl.Float64).alias("rate"),
            se.cast(pl.Float64).alias("se"),
        ))
    return pl.concat(out).filter(pl.col("capacity_bytes") > 0)


def knee_points(result: CurveResult, metric: str) -> pl.DataFrame:
    """The library's knees of ``metric`` (none for metrics it has no knees for).

    Columns ``fraction``, ``target_rate``, ``capacity_bytes``, ``capacity_gib``,
    ``label`` (e.g. ``80% of ceiling``).
    """
    schema = {"fraction": pl.Float64, "target_rate": pl.Float64, "capacity_bytes": pl.Int64,
              "capacity_gib": pl.Float64, "label": pl.String}
    if metric not in KNEE_METRICS:
        return pl.DataFrame(schema=schema)
    k = result.knees.filter(pl.col("metric") == metric).drop_nulls("capacity_bytes")
    return k.select(
        "fraction", "target_rate", "capacity_bytes",
        (pl.col("capacity_bytes").cast(pl.Float64) / 2**30).alias("capacity_gib"),
        ((pl.col("fraction") * 100).round(0).cast(pl.Int64).cast(pl.String) + "% of ceiling").alias("label"),
    ).cast(schema)


#: The tier sizes every page starts from (Curves draws them, What-ifs simulates them), as
#: the text of their inputs: a size always carries its unit (:func:`kvtrace.units.parse_size`).
#: DRAM is the sizing config's "today" (``[deployment] current_dram``).
DEFAULT_TIERS = {"dram": "64GiB", "flash": "1TiB"}
DEFAULT_TIERS_BYTES = tuple(parse_size(v, field=k) for k, v in DEFAULT_TIERS.items())  # (DRAM, flash) bytes


def tier_marks(dram_bytes: int, flash_bytes: int) -> dict[str, int]:
    """Capacities to draw on a curve: DRAM, and DRAM + flash (one LRU of both, DESIGN §2)."""
    marks = {}
    if dram_bytes > 0:
        marks["DRAM"] = int(dram_bytes)
    if flash_bytes > 0:
        marks["DRAM + flash"] = int(dram_bytes) + int(flash_bytes)
    return marks


# --------------------------------------------------------------------------- what-ifs

#: Admission policies offered by the What-ifs page (any ``--policy`` spelling works).
WHATIF_POLICIES = ("all", "second-hit", "tinylfu", "reuse-oracle", "prob:0.3", "idle<60s", "value>=0", "none")
#: Percentile columns of a what-if table and their labels.
LATENCY_COLUMNS = {"service_time_p50_ms": "p50", "service_time_p90_ms": "p90", "service_time_p99_ms": "p99",
                   "service_time_p999_ms": "p99.9"}


def latency_table(table: pl.DataFrame) -> pl.DataFrame:
    """Reusable-prefix service-time percentiles of a what-if table, long format.

    Columns ``config`` str · ``percentile`` str (p50, p90, p99, p99.9) · ``ms``
    float64 (the table's ``service_time_*_ms``).
    """
    cols = [c for c in LATENCY_COLUMNS if c in table.columns]
    return (
        table.select(pl.col("config").cast(pl.String), *cols)
        .unpivot(index="config", variable_name="percentile", value_name="ms")
        .with_columns(pl.col("percentile").replace_strict(LATENCY_COLUMNS))
    )


# --------------------------------------------------------------------------- sizing

#: Tiers of a sizing config; the first is required, the others drop their candidates when left out.
SIZING_TIERS = ("dram", "local_ssd", "shared_flash")
_NUMBER_KINDS = ("money", "positive", "nonneg", "fraction", "share")


def sizing_available() -> bool:
    """Whether this kvtrace has :mod:`kvtrace.analyses.sizing` (``kvtrace size``)."""
    try:
        from kvtrace.analyses import sizing
    except ImportError:
        return False
    return all(hasattr(sizing, n) for n in ("SizingConfig", "default_config", "recommend", "report_markdown",
                                             "report_html"))


def sizing_fields() -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """The TOML layout a sizing config is written in, with each value's kind.

    Returns ``({section: {key: kind}}, {tier key: kind})``; kinds are those of
    :mod:`kvtrace.analyses.sizing` (``str``, ``int``, ``size``, ``size0``, ``money``,
    ``positive``, ``nonneg``, ``fraction``, ``share``, ``strlist``). Read from the
    sizing module's own key tables, so the dashboard's form has exactly the keys
    ``kvtrace size --config`` accepts.
    """
    from kvtrace.analyses import sizing

    sections = {sec: {k: kind for k, (_attr, kind) in keys.items()} for sec, keys in sizing._SECTIONS.items()}
    tiers = {k: spec[1] for k, spec in sizing._TIER_KEYS.items()}
    return sections, tiers


def _field_text(v) -> str:
    if v is None:
        return ""
    if isinstance(v, (list, tuple)):
        return ", ".join(str(x) for x in v)
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)
    return str(v)


def sizing_form_values(config) -> dict[str, str]:
    """A sizing config as form text: ``{"section.key": text}`` and
    ``{"tiers.NAME.key": text}`` for every key of :func:`sizing_fields` (unset: "")."""
    sections, tier_keys = sizing_fields()
    d = config.to_dict()
    out = {f"{sec}.{k}": _field_text(d.get(sec, {}).get(k)) for sec, keys in sections.items() for k in keys}
    for tier in SIZING_TIERS:
        body = d.get("tiers", {}).get(tier, {})
        out.update({f"tiers.{tier}.{k}": _field_text(body.get(k)) for k in tier_keys})
    return out


def _parse_field(text: str, kind: str, key: str, source: str):
    t = text.strip()
    if kind in ("str", "size", "size0"):
        return t
    if kind == "strlist":
        return [x.strip() for x in t.split(",") if x.strip()]
    try:
        return int(t) if kind == "int" else float(t)
    except ValueError:
        what = "an integer" if kind == "int" else "a number"
        raise KvtraceError(f"expected {what}, got '{t}'", path=source, field=key) from None


def sizing_config_from_form(values: dict[str, str], tiers: tuple[str, ...] = SIZING_TIERS,
                            source: str = "the form"):
    """Build and validate a :class:`kvtrace.analyses.sizing.SizingConfig` from form text.

    Parameters
    ----------
    values : dict
        ``"section.key"`` / ``"tiers.NAME.key"`` -> text; empty text leaves a key out
        (its default applies), as a commented-out line in the TOML would.
    tiers : tuple of str
        The tiers to include (``dram`` is always required).
    source : str
        Name used in error messages.

    Raises
    ------
    KvtraceError
        One line naming the key and what was expected (the sizing module's checks).
    """
    from kvtrace.analyses.sizing import SizingConfig

    sections, tier_keys = sizing_fields()
    d: dict = {}
    for sec, keys in sections.items():
        body = {}
        for k, kind in keys.items():
            text = values.get(f"{sec}.{k}", "")
            if str(text).strip():
                body[k] = _parse_field(str(text), kind, f"{sec}.{k}", source)
        d[sec] = body
    d["tiers"] = {}
    for tier in SIZING_TIERS:
        if tier not in tiers:
            continue
        body = {}
        for k, kind in tier_keys.items():
            text = values.get(f"tiers.{tier}.{k}", "")
            if str(text).strip():
                body[k] = _parse_field(str(text), kind, f"tiers.{tier}.{k}", source)
        d["tiers"][tier] = body
    return SizingConfig.from_dict(d, source=source)


def sizing_config_from_toml(name: str, data: bytes):
    """Parse an uploaded ``tiers.toml`` (one-line :class:`KvtraceError` naming ``name``)."""
    import sys

    from kvtrace.analyses.sizing import SizingConfig

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    try:
        d = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise KvtraceError("expected UTF-8 TOML text", path=name) from None
    except tomllib.TOMLDecodeError as exc:
        raise KvtraceError(f"invalid TOML: {exc}", path=name) from None
    return SizingConfig.from_dict(d, source=name)


def sizing_table(result, lens: str) -> pl.DataFrame:
    """One lens of :attr:`SizingResult.candidates`, ranked, with the columns the
    dashboard shows (the library's values, unformatted)."""
    cols = ["rank", "candidate", "config", "policy", "dram_prefix_token_hit_rate", "ssd_prefix_token_hit_rate",
            "service_time_mean_ms", "service_time_p99_ms", "cost_usd_per_month",
            "net_usd_per_month", "break_even_realisation", "feasible", "reasons"]
    c = result.candidates
    return c.filter(pl.col("lens") == lens).sort("rank").select([x for x in cols if x in c.columns])


# --------------------------------------------------------------------------- launch


def _launch_log_file(given: str, root: str, option: str) -> str:
    """A tokenizer or template given to ``kvtrace app``, resolved; refused outside ``root``."""
    real = os.path.realpath(Path(given).expanduser())
    if not _inside(real, root):
        raise KvtraceError(f"outside --data-dir {root}: the dashboard reads files under it only (give a --data-dir "
                           f"that holds the trace and the {option.replace('_', ' ')})", path=given,
                           field=option.replace("_", "-"))
    return real


def streamlit_command(trace: str | os.PathLike | None = None, *, port: int = 8501, headless: bool = False,
                      options: LoadOptions = LoadOptions(), data_dir: str | os.PathLike | None = None,
                      max_trace_bytes: int = DEFAULT_MAX_TRACE_BYTES) -> tuple[list[str], dict[str, str]]:
    """The command line and environment that serve the dashboard (``kvtrace app``).

    Parameters
    ----------
    trace : path-like, optional
        The trace to open on (default: the first bundled sample).
    port : int
        TCP port on localhost.
    headless : bool
        Do not open a browser tab.
    options : LoadOptions
        How to read ``trace``; a request log's tokenizer and chat template (relative:
        to the working directory, as on the command line) must be under ``data_dir``.
    data_dir : path-like, optional
        The directory server paths typed in the page are confined to (default: the
        directory of ``trace``, else the sample traces' directory).
    max_trace_bytes : int
        Size limit in bytes of a server-path trace or an upload (Streamlit's upload
        limit is set from it).

    Returns
    -------
    (argv, env)
        ``python -m streamlit run .../kvtrace/app/kvtrace_app.py ...`` and the environment that
        passes the trace, its load options (request-log options as JSON in
        ``$KVTRACE_APP_LOG_OPTIONS``), the data directory and the limit to the app.

    Raises
    ------
    KvtraceError
        The trace does not exist or it, the tokenizer or the chat template is outside
        ``data_dir``, ``data_dir`` is not a directory, or this copy of kvtrace has no
        ``app/`` directory.
    """
    import sys

    if not APP_ENTRY.is_file():
        raise KvtraceError("the dashboard (app/) is not installed with this copy of kvtrace: run kvtrace app "
                           "from a source checkout (pip install -e .)", path=str(APP_ENTRY))
    ours = (ENV_TRACE, ENV_FORMAT, ENV_BLOCK_TOKENS, ENV_SHARE_TENANTS, ENV_DATA_DIR, ENV_MAX_TRACE_BYTES,
            ENV_LOG_OPTIONS)
    env = {k: v for k, v in os.environ.items() if k not in ours}
    if max_trace_bytes < 1:
        raise KvtraceError(f"expected at least one byte, got {max_trace_bytes}", field="max-trace-bytes")
    root = None
    if data_dir is not None:
        root = os.path.realpath(Path(data_dir).expanduser())
        if not os.path.isdir(root):
            raise KvtraceError("not a directory", path=str(data_dir), field="data-dir")
    if trace is not None:
        p = Path(trace).expanduser()
        if not p.exists():
            raise KvtraceError("no such file", path=str(trace))
        real = os.path.realpath(p)
        root = root or (real if p.is_dir() else os.path.dirname(real))
        if not _inside(real, root):
            raise KvtraceError(f"outside --data-dir {root}: the dashboard reads traces under it only", path=str(trace))
        env[ENV_TRACE] = real
    root = root or str(data_dir_default())
    env[ENV_DATA_DIR] = root
    log = options.log
    if log is not None and log != LogOptions():
        paths = {k: _launch_log_file(getattr(log, k), root, k) for k in LOG_PATHS if getattr(log, k)}
        env[ENV_LOG_OPTIONS] = _log_to_json(dataclasses.replace(log, **paths))
    env[ENV_MAX_TRACE_BYTES] = str(int(max_trace_bytes))
    env[ENV_FORMAT] = options.fmt
    if options.block_tokens:
        env[ENV_BLOCK_TOKENS] = str(int(options.block_tokens))
    if options.share_tenants:
        env[ENV_SHARE_TENANTS] = "1"
    argv = [sys.executable, "-m", "streamlit", "run", str(APP_ENTRY),
            "--server.port", str(int(port)), "--server.address", "localhost",
            "--server.headless", "true" if headless else "false",
            "--browser.serverAddress", "localhost", "--browser.gatherUsageStats", "false",
            "--server.fileWatcherType", "none", "--client.toolbarMode", "minimal",
            "--server.maxUploadSize", str(upload_limit_mb(max_trace_bytes))]
    return argv, env
