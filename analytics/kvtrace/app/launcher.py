"""What ``kvtrace app`` passes to the Streamlit process it starts, and how the running
app reads it back: the trace and its load options, the data directory server paths are
confined to, the size limit, the sample traces' directory. All of it travels in
environment variables (:data:`ENV_TRACE` ...); :func:`streamlit_command` writes them,
:func:`launch_options`, :func:`data_dir`, :func:`max_trace_bytes` and
:func:`sample_dir` read them. No Streamlit here: the CLI imports this module to launch.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from importlib import resources
from pathlib import Path

from kvtrace.app.sources import LOG_PATHS, LoadOptions, is_inside
from kvtrace.errors import KvtraceError
from kvtrace.ingest import LogOptions
from kvtrace.ingest.tokens import TokenFields

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

#: The dashboard's directory and entry file (in this package, beside this module).
APP_DIR = Path(__file__).resolve().parent
APP_ENTRY = APP_DIR / "kvtrace_app.py"
DEFAULT_SAMPLE = "chat.jsonl"
TRACE_SUFFIXES = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".parquet", ".pq", ".csv", ".csv.gz")


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


def _launch_log_file(given: str, root: str, option: str) -> str:
    """A tokenizer or template given to ``kvtrace app``, resolved; refused outside ``root``."""
    real = os.path.realpath(Path(given).expanduser())
    if not is_inside(real, root):
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
        ``data_dir``, or ``data_dir`` is not a directory.
    """
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
        if not is_inside(real, root):
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
