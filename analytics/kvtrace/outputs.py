"""Atomic output files and result-table writers.

Every file kvtrace writes goes through :func:`atomic_path`: the content is written to
a temporary file in the destination directory, flushed to disk, then renamed over the
destination. A failure or an interrupt leaves the previous file untouched and no
temporary file behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator

import polars as pl

from .errors import KvtraceError, UsageError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` on success.

    Parameters
    ----------
    path : path-like
        Final destination.
    suffix : str, optional
        Suffix for the temporary file (some writers choose the format from it);
        defaults to the destination's suffix.
    """
    dest = Path(path)
    if dest.is_dir():  # else os.replace fails naming the temporary file
        raise KvtraceError("is a directory, expected a file name", path=str(dest))
    directory = dest.parent if str(dest.parent) else Path(".")
    if not directory.exists():
        raise KvtraceError("directory does not exist", path=str(directory))
    try:
        fd, tmp = tempfile.mkstemp(
            prefix=f".{dest.name}.", suffix=(suffix if suffix is not None else dest.suffix) + ".tmp",
            dir=directory,
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
