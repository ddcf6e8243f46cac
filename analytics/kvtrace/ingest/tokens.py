"""Token-id request logs (format ``tokens``) -> canonical request table.

A token log has one request per row: the prompt's token ids and an arrival time, and
optionally an output token count, request id, session id, tenant, type, cache salt and
LoRA name. It is read in chunks (JSONL in line chunks, plain or gzip; Parquet in record
batches; CSV in blocks), and each chunk's prompts are hashed into block ids exactly as
vLLM v1's prefix cache hashes them (:mod:`kvtrace.ingest.vllm_hash`), so memory holds
one chunk of tokens plus the output table (8 bytes per block, never the tokens).

Entry points
------------
- :func:`read_token_log` -> :class:`TokenLog`: the canonical request table in file
  order (absolute timestamps in seconds), its :class:`~kvtrace.trace.TraceMeta`, the
  detected time unit and a ``locate`` for messages. Feed it to
  :func:`~kvtrace.ingest.canonical.prepare_requests` with ``already_relative=False``.
- :func:`load_token_trace`: the same, prepared and built into a
  :class:`~kvtrace.trace.Trace`.
- :func:`iter_token_chunks`: the chunks themselves, for a bounded-memory conversion.

Timestamps: numbers are seconds, milliseconds, microseconds or nanoseconds, taken from
``time_unit`` or detected from the first chunk's magnitudes (Unix-epoch values: above
1e17 ns, 1e14 us, 1e11 ms, else s) or a field name ending in ``_ms`` / ``_us`` /
``_ns``; strings are ISO-8601 (a time without offset is read as UTC). The unit and the
reason are reported in ``TokenLog.time_note`` so a CLI can state them.

Errors are :class:`~kvtrace.errors.KvtraceError` naming the file, the line (JSONL, CSV;
1-based) or row (Parquet; 0-based), the field and what was expected.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import polars as pl

from kvtrace.errors import KvtraceError, UsageError
from kvtrace.trace import REQUEST_SCHEMA, Trace, TraceMeta
from kvtrace.ingest.vllm_hash import MAX_TOKEN_ID, HashSpec, hash_prompts

FORMAT = "tokens"
#: Requests per chunk (JSONL lines, Parquet batch rows).
CHUNK_ROWS = 1 << 14
TIME_UNITS = ("auto", "s", "ms", "us", "ns", "iso")
_PER_SECOND = {"s": 1.0, "ms": 1e3, "us": 1e6, "ns": 1e9}
_UNIT_NAMES = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds",
               "iso": "ISO-8601 date-times"}


@dataclass(frozen=True)
class TokenFields:
    """Field (column) names of a token log. An optional field absent from the file is
    simply not read; ``tokens`` and ``timestamp`` are required."""

    tokens: str = "prompt_token_ids"
    timestamp: str = "timestamp"
    output_tokens: str = "output_tokens"
    request_id: str = "request_id"
    session_id: str = "session_id"
    tenant: str = "tenant"
    type: str = "type"
    cache_salt: str = "cache_salt"
    lora_name: str = "lora_name"

    def optional(self) -> dict[str, str]:
        return {"output_tokens": self.output_tokens, "request_id": self.request_id,
                "session_id": self.session_id, "tenant": self.tenant, "type": self.type,
                "cache_salt": self.cache_salt, "lora_name": self.lora_name}


@dataclass
class TokenLog:
    """A token log read into canonical form.

    Attributes
    ----------
    requests : polars.DataFrame
        Canonical request table (``REQUEST_SCHEMA``) in file order; ``timestamp`` in
        seconds as read (not yet relative to the first request).
    meta : TraceMeta
        ``source_format="tokens"``, ``block_tokens`` = the hashing block size.
    spec : HashSpec
        How the block ids were derived.
    time_unit : str
        ``s``, ``ms``, ``us``, ``ns`` or ``iso``.
    time_note : str
        What the timestamps were read as, and why (for the CLI to print).
    locate : callable
        Row of ``requests`` -> ``{"path", "line"}`` or ``{"path", "row"}``.
    warnings : list of str
    """

    requests: pl.DataFrame
    meta: TraceMeta
    spec: HashSpec
    time_unit: str
    time_note: str
    locate: Callable[[int], dict]
    warnings: list[str] = field(default_factory=list)

    @property
    def notes(self) -> list[str]:
        """What to tell the user: how the timestamps were read (when it was decided),
        then the warnings."""
        return [self.time_note, *self.warnings] if self.time_note else list(self.warnings)


def detect_kind(path: str | os.PathLike) -> str:
    """``jsonl``, ``parquet`` or ``csv`` from the file name (JSONL otherwise)."""
    name = Path(path).name.lower()
    for suffix in (".gz",):
        name = name[: -len(suffix)] if name.endswith(suffix) else name
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith(".csv"):
        return "csv"
    return "jsonl"


class TokenLogReader:
    """State carried across chunks: the time unit, id codes, locations."""

    def __init__(self, path: str, kind: str, fields: TokenFields, spec: HashSpec, time_unit: str,
                 max_token_id: int):
        if time_unit not in TIME_UNITS:
            raise UsageError(f"unknown time unit '{time_unit}': expected one of {', '.join(TIME_UNITS)}",
                             field="time-unit")
        if not 0 <= max_token_id <= MAX_TOKEN_ID:
            raise UsageError(f"the token-id bound must be in [0, 2^31 - 1], got {max_token_id}",
                             field="max-token-id")
        self.path, self.kind, self.fields, self.spec = path, kind, fields, spec
        self.unit = None if time_unit == "auto" else time_unit
        self.note = "" if self.unit is None else f"timestamps read as {_UNIT_NAMES[self.unit]} (as given)"
        self.max_token_id = max_token_id
        self.codes: dict[str, dict] = {"request_id": {}, "session_id": {}}
        self.coded: set[str] = set()
        self.rows = 0
        self.lines: list[np.ndarray] = []
        self.warnings: list[str] = []

    def where(self, loc: np.ndarray | None, i: int) -> dict:
        if loc is not None:
            return {"path": self.path, "line": int(loc[i])}
        return {"path": self.path, "row": self.rows + int(i)}

    # -- one chunk -------------------------------------------------------------------
    def convert(self, df: pl.DataFrame, loc: np.ndarray | None) -> pl.DataFrame:
        """A raw chunk (the file's columns) -> canonical request chunk."""
        f = self.fields

        def at(i: int) -> dict:
            return self.where(loc, i)

        if f.tokens not in df.columns:
            raise KvtraceError("missing (required): expected a list of prompt token ids", field=f.tokens, **at(0))
        if f.timestamp not in df.columns:
            raise KvtraceError("missing (required): expected a timestamp", field=f.timestamp, **at(0))
        toks = self._token_lists(df[f.tokens], at)
        lens = toks.list.len().to_numpy().astype(np.int64)
        flat = toks.explode(empty_as_null=False).to_numpy() if lens.sum() else np.empty(0, np.int64)
        starts = np.zeros(lens.shape[0] + 1, dtype=np.int64)
        np.cumsum(lens, out=starts[1:])
        lora = self._strings(df, f.lora_name, at)
        salt = self._strings(df, f.cache_salt, at)
        ids, bstarts = hash_prompts(flat, starts, self.spec, lora.to_list() if lora is not None else None,
                                    salt.to_list() if salt is not None else None)
        out = {
            "timestamp": self._timestamps(df[f.timestamp], f.timestamp, at),
            "input_tokens": pl.Series(lens),
            "block_ids": _list_column(ids, bstarts),
        }
        n = df.height
        if f.output_tokens in df.columns:
            out["output_tokens"] = self._counts(df[f.output_tokens], f.output_tokens, at)
        else:
            out["output_tokens"] = pl.Series(np.zeros(n, dtype=np.int64))
        for name in ("request_id", "session_id"):
            col = getattr(f, name)
            if col in df.columns:
                out[name] = self._ids(df[col], name, col, at)
        if "request_id" not in out:
            out["request_id"] = pl.Series(np.arange(self.rows, self.rows + n, dtype=np.int64))
        for name in ("tenant", "type"):
            s = self._strings(df, getattr(f, name), at)
            if s is not None:
                out[name] = s
        self.rows += n
        if loc is not None:
            self.lines.append(loc)
        cols = {name: (out[name].alias(name) if name in out else pl.Series(name, [None] * n, dtype=dtype))
                for name, dtype in REQUEST_SCHEMA.items()}
        return pl.DataFrame(cols).cast(REQUEST_SCHEMA)

    def _token_lists(self, col: pl.Series, at) -> pl.Series:
        name = self.fields.tokens
        if col.dtype == pl.String:  # CSV cells: "[1, 2, 3]", "1 2 3" or "1;2;3"
            col = self._parse_token_strings(col, at)
        dt = col.dtype
        if not isinstance(dt, pl.List) or not (dt.inner.is_integer() or dt.inner == pl.Null):
            bad = int(col.is_not_null().arg_true()[0]) if col.is_not_null().any() else 0
            raise KvtraceError(f"expected a list of integer token ids, got {short_text(col[bad])}", field=name,
                               **at(bad))
        nulls = col.is_null()
        if nulls.any():
            raise KvtraceError("missing value (required): expected a list of prompt token ids", field=name,
                               **at(int(nulls.arg_true()[0])))
        lens = col.list.len()
        if (lens == 0).any():
            raise KvtraceError("expected a non-empty list of token ids (vLLM rejects empty prompts)", field=name,
                               **at(int((lens == 0).arg_true()[0])))
        inner_null = col.list.eval(pl.element().is_null().any()).list.first()
        if inner_null.any():
            raise KvtraceError("expected integer token ids, got null", field=name, **at(int(inner_null.arg_true()[0])))
        lo, hi = col.list.min(), col.list.max()
        bad = (lo < 0) | (hi > self.max_token_id)
        if bad.any():
            i = int(bad.arg_true()[0])
            v = lo[i] if lo[i] < 0 else hi[i]
            raise KvtraceError(f"expected token ids in [0, {self.max_token_id}], got {v}", field=name, **at(i))
        return col.cast(pl.List(pl.Int64))

    def _parse_token_strings(self, col: pl.Series, at) -> pl.Series:
        cleaned = col.str.replace_all(r"[\[\]]", "").str.replace_all(r"[,;\s]+", " ").str.strip_chars()
        split = cleaned.str.split(" ").list.eval(pl.element().filter(pl.element() != ""))
        cast = split.list.eval(pl.element().cast(pl.Int64, strict=False))
        bad = (split.list.len() != cast.list.eval(pl.element().is_not_null().sum()).list.first()) & col.is_not_null()
        if bad.any():
            i = int(bad.arg_true()[0])
            raise KvtraceError(f"expected a list of integer token ids, got {short_text(col[i])}",
                               field=self.fields.tokens, **at(i))
        return cast

    def _strings(self, df: pl.DataFrame, name: str, at) -> pl.Series | None:
        if name not in df.columns:
            return None
        col = df[name]
        if col.dtype == pl.Null:
            return pl.Series(name, [None] * df.height, dtype=pl.String)
        if col.dtype != pl.String:
            if col.dtype.is_integer():
                return col.cast(pl.String)
            bad = int(col.is_not_null().arg_true()[0])
            raise KvtraceError(f"expected a string, got {short_text(col[bad])}", field=name, **at(bad))
        return col

    def _counts(self, col: pl.Series, name: str, at) -> pl.Series:
        if col.dtype == pl.Null:
            return pl.Series(np.zeros(col.len(), dtype=np.int64))
        loose = col.cast(pl.Int64, strict=False) if not col.dtype.is_float() else \
            pl.Series(np.where(np.isfinite(col.to_numpy()) & (col.to_numpy() == np.floor(col.to_numpy())),
                               col.to_numpy(), np.nan)).cast(pl.Int64, strict=False)
        bad = (loose.is_null() & col.is_not_null()) | (loose < 0).fill_null(False)
        if bad.any() or col.dtype == pl.Boolean:
            i = int(bad.arg_true()[0]) if bad.any() else 0
            raise KvtraceError(f"expected a non-negative integer (tokens), got {short_text(col[i])}", field=name,
                               **at(i))
        return loose.fill_null(0)

    def _ids(self, col: pl.Series, name: str, source: str, at) -> pl.Series:
        """Integer ids as they are; strings (vLLM's ``cmpl-...``) numbered in order of
        first appearance across the log."""
        if col.dtype.is_integer() or col.dtype == pl.Null:
            return col.cast(pl.Int64)
        if col.dtype == pl.String:
            asint = col.cast(pl.Int64, strict=False)
            if name not in self.coded and not (asint.is_null() & col.is_not_null()).any():
                return asint
            codes = self.codes[name]
            if name not in self.coded:
                self.coded.add(name)
                self.warnings.append(f"field '{source}' holds strings: numbered 0, 1, ... in order of first "
                                     "appearance")
            out = [None if v is None else codes.setdefault(v, len(codes)) for v in col.to_list()]
            return pl.Series(out, dtype=pl.Int64)
        bad = int(col.is_not_null().arg_true()[0])
        raise KvtraceError(f"expected an integer or string id, got {short_text(col[bad])}", field=source, **at(bad))

    def _timestamps(self, col: pl.Series, name: str, at) -> pl.Series:
        nulls = col.is_null()
        if nulls.any():
            raise KvtraceError("missing value (required): expected a timestamp", field=name,
                               **at(int(nulls.arg_true()[0])))
        if isinstance(col.dtype, pl.Datetime):
            self._fix("iso", "timestamps are date-times")
            return pl.Series(col.dt.epoch("ns").cast(pl.Float64).to_numpy() / 1e9)
        if col.dtype == pl.String:
            num = col.cast(pl.Float64, strict=False)
            numeric = self.unit not in (None, "iso") or (self.unit is None and num[0] is not None)
            if not numeric:
                self._fix("iso", "timestamps are strings")
                return pl.Series(_iso_seconds(col, name, at))
            if num.is_null().any():  # numbers written as text (CSV), or a mix
                i = int(num.is_null().arg_true()[0])
                raise KvtraceError(f"expected a number like the rows before, got {short_text(col[i])}", field=name,
                                   **at(i))
            col = num
        if col.dtype == pl.Boolean or not col.dtype.is_numeric():
            raise KvtraceError(f"expected a number or an ISO-8601 string, got {short_text(col[0])}", field=name,
                               **at(0))
        values = col.cast(pl.Float64).to_numpy()
        bad = ~np.isfinite(values)
        if bad.any():
            raise KvtraceError(f"expected a finite number, got {values[np.argmax(bad)]}", field=name,
                               **at(int(np.argmax(bad))))
        if self.unit is None:
            self._detect(values, name)
        if self.unit == "iso":
            raise KvtraceError("expected an ISO-8601 string like the rows before, got a number", field=name, **at(0))
        return pl.Series(values / _PER_SECOND[self.unit])

    def _fix(self, unit: str, why: str) -> None:
        if self.unit is None:
            self.unit = unit
            self.note = f"timestamps read as {_UNIT_NAMES[unit]} ({why}; a time without offset is UTC)"

    def _detect(self, values: np.ndarray, name: str) -> None:
        lname = name.lower()
        for suffix, unit in (("_ms", "ms"), ("_us", "us"), ("_ns", "ns"), ("_s", "s")):
            if lname.endswith(suffix):
                self.unit, self.note = unit, f"timestamps read as {_UNIT_NAMES[unit]} (field name '{name}')"
                return
        top = float(np.max(np.abs(values))) if values.size else 0.0
        for bound, unit in ((1e17, "ns"), (1e14, "us"), (1e11, "ms")):
            if top >= bound:
                self.unit = unit
                self.note = (f"timestamps read as {_UNIT_NAMES[unit]} (values up to {top:.3g}: Unix time in "
                             f"{_UNIT_NAMES[unit]}; pass a time unit to override)")
                return
        self.unit = "s"
        self.note = (f"timestamps read as seconds (values up to {top:.3g}, below 1e11; pass a time unit if they "
                     "are milliseconds)")


def _iso_seconds(col: pl.Series, name: str, at) -> np.ndarray:
    try:
        fast = col.str.to_datetime(strict=False, time_zone="UTC", time_unit="us")
    except Exception:
        fast = pl.Series([None] * col.len(), dtype=pl.Datetime("us", "UTC"))
    out = fast.dt.epoch("us").cast(pl.Float64).to_numpy() / 1e6
    for i in np.flatnonzero(np.isnan(out)).tolist():  # other ISO-8601 spellings
        text = col[i]
        try:
            d = datetime.fromisoformat(text.strip())
        except (ValueError, AttributeError):
            raise KvtraceError(f"expected a number or an ISO-8601 date-time, got {short_text(text)}", field=name,
                               **at(i)) from None
        if d.tzinfo is None:
            d = d.replace(tzinfo=timezone.utc)
        out[i] = d.timestamp()
    return out


def _list_column(ids: np.ndarray, bstarts: np.ndarray) -> pl.Series:
    """uint64 ids + offsets -> a Polars list<u64> column (no per-row Python objects)."""
    import pyarrow as pa

    arr = pa.LargeListArray.from_arrays(pa.array(bstarts, type=pa.int64()), pa.array(ids, type=pa.uint64()))
    return pl.Series("block_ids", pl.from_arrow(arr)).cast(pl.List(pl.UInt64))


def short_text(v, limit: int = 60) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + "..."


# -- raw chunk readers: (DataFrame of the file's columns, 1-based lines or None) -------

def open_binary(path: str):
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic[:2] == b"\x1f\x8b":
        return gzip.open(path, "rb")
    if magic == b"\x28\xb5\x2f\xfd":
        try:
            import zstandard
        except ImportError:
            raise KvtraceError("zstd-compressed: decompress it first (zstd -d) or install zstandard",
                               path=path) from None
        return zstandard.open(path, "rb")
    return open(path, "rb")


def _jsonl_chunks(path: str, fields: TokenFields, rows: int) -> Iterator[tuple[pl.DataFrame, np.ndarray]]:
    with open_binary(path) as fh:
        lines: list[bytes] = []
        where: list[int] = []
        for lineno, line in enumerate(fh, start=1):
            if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):
                line = line[3:]
            if not line.strip():
                continue
            lines.append(line.rstrip(b"\r\n"))
            where.append(lineno)
            if len(lines) >= rows:
                yield _parse_jsonl(path, lines, where, fields), np.array(where, dtype=np.int64)
                lines, where = [], []
        if lines:
            yield _parse_jsonl(path, lines, where, fields), np.array(where, dtype=np.int64)


def _parse_jsonl(path: str, lines: list[bytes], where: list[int], fields: TokenFields) -> pl.DataFrame:
    try:
        df = pl.read_ndjson(io.BytesIO(b"\n".join(lines)), infer_schema_length=None)
        if df.height == len(lines):
            col = df[fields.tokens] if fields.tokens in df.columns else None
            if col is None or (isinstance(col.dtype, pl.List) and (col.dtype.inner.is_integer()
                                                                    or col.dtype.inner == pl.Null)):
                return df
    except Exception:
        df = None
    err = _scan_jsonl(path, lines, where, fields)
    if err is not None:
        raise err
    if df is not None:
        return df
    raise KvtraceError("cannot read as JSONL", path=path, line=where[0])


def _scan_jsonl(path: str, lines: list[bytes], where: list[int], fields: TokenFields) -> KvtraceError | None:
    """Record-by-record validation of a chunk that the fast reader rejected: the first
    problem, named by line."""
    for line, lineno in zip(lines, where):
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return KvtraceError(f"malformed JSON ({getattr(exc, 'msg', 'not UTF-8')})", path=path, line=lineno)
        if not isinstance(rec, dict):
            return KvtraceError("expected a JSON object per line", path=path, line=lineno)
        toks = rec.get(fields.tokens)
        if toks is None:
            return KvtraceError("missing (required): expected a list of prompt token ids", path=path, line=lineno,
                                field=fields.tokens)
        if not isinstance(toks, list):
            return KvtraceError(f"expected a list of integer token ids, got {short_text(toks)}", path=path,
                                line=lineno, field=fields.tokens)
        for v in toks:
            if isinstance(v, bool) or not isinstance(v, int):
                return KvtraceError(f"expected integer token ids, got {short_text(v)}", path=path, line=lineno,
                                    field=fields.tokens)
    return None


def _parquet_chunks(path: str, fields: TokenFields, rows: int) -> Iterator[tuple[pl.DataFrame, None]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:
        raise KvtraceError(f"cannot read as parquet: {str(exc).splitlines()[0]}", path=path) from None
    wanted = [fields.tokens, fields.timestamp, *fields.optional().values()]
    present = [c for c in pf.schema_arrow.names if c in wanted]
    for batch in pf.iter_batches(batch_size=rows, columns=present):
        yield pl.from_arrow(batch), None


def _csv_chunks(path: str, fields: TokenFields, rows: int) -> Iterator[tuple[pl.DataFrame, np.ndarray]]:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    names = [fields.tokens, fields.timestamp, *fields.optional().values()]
    try:
        reader = pcsv.open_csv(path, read_options=pcsv.ReadOptions(block_size=1 << 24),
                               convert_options=pcsv.ConvertOptions(column_types={n: pa.string() for n in names},
                                                                   strings_can_be_null=True))
    except Exception as exc:
        raise KvtraceError(f"cannot read as CSV: {str(exc).splitlines()[0]}", path=path) from None
    row = 0
    while True:
        try:
            batch = reader.read_next_batch()
        except StopIteration:
            return
        except Exception as exc:
            raise KvtraceError(f"cannot read as CSV: {str(exc).splitlines()[0]}", path=path) from None
        df = pl.from_arrow(batch)
        yield df, np.arange(row + 2, row + 2 + df.height, dtype=np.int64)  # the header is line 1
        row += df.height


def iter_token_chunks(path: str | os.PathLike, *, kind: str = "auto", fields: TokenFields = TokenFields(),
                      spec: HashSpec = HashSpec(), time_unit: str = "auto", max_token_id: int = MAX_TOKEN_ID,
                      chunk_rows: int = CHUNK_ROWS, _state: list | None = None) -> Iterator[pl.DataFrame]:
    """Canonical request chunks of a token log, in file order (see :func:`read_token_log`).

    Each chunk follows ``REQUEST_SCHEMA`` with absolute timestamps in seconds; the
    time unit is fixed by the first chunk."""
    p = str(path)
    if not os.path.isfile(p):
        raise KvtraceError("no such file", path=p)
    kind = detect_kind(p) if kind == "auto" else kind
    readers = {"jsonl": _jsonl_chunks, "parquet": _parquet_chunks, "csv": _csv_chunks}
    if kind not in readers:
        raise UsageError(f"unknown token-log kind '{kind}': expected jsonl, parquet or csv", field="format")
    state = TokenLogReader(p, kind, fields, spec, time_unit, max_token_id)
    if _state is not None:
        _state.append(state)
    for raw, loc in readers[kind](p, fields, chunk_rows):
        if raw.height:
            yield state.convert(raw, loc)


def read_token_log(path: str | os.PathLike, *, kind: str = "auto", fields: TokenFields = TokenFields(),
                   spec: HashSpec = HashSpec(), time_unit: str = "auto", max_token_id: int = MAX_TOKEN_ID,
                   chunk_rows: int = CHUNK_ROWS) -> TokenLog:
    """Read a token-id request log into a canonical request table.

    Parameters
    ----------
    path : path-like
        JSONL (plain or gzip), Parquet or CSV; one request per row.
    kind : str
        ``auto`` (from the suffix: ``.parquet``, ``.csv``, else JSONL), ``jsonl``,
        ``parquet`` or ``csv``.
    fields : TokenFields
        Field names (CLI: ``--tokens-field``, ``--time-field``, ``--salt-field``,
        ``--lora-field``).
    spec : HashSpec
        vLLM hash function, ``PYTHONHASHSEED`` and block size in tokens (CLI:
        ``--hash``, ``--hash-seed``, ``--block-tokens``).
    time_unit : str
        ``auto`` (detected, see the module docstring), ``s``, ``ms``, ``us``, ``ns`` or
        ``iso``.
    max_token_id : int
        Largest token id accepted (default 2^31 - 1).
    chunk_rows : int
        Requests per chunk.

    Returns
    -------
    TokenLog
    """
    holder: list = []
    chunks = list(iter_token_chunks(path, kind=kind, fields=fields, spec=spec, time_unit=time_unit,
                                    max_token_id=max_token_id, chunk_rows=chunk_rows, _state=holder))
    state = holder[0]
    if not chunks:
        raise KvtraceError("no requests: the log is empty", path=str(path))
    df = pl.concat(chunks, rechunk=False)
    lines = np.concatenate(state.lines) if state.lines else None
    p = str(path)
    locate = (lambda row: {"path": p, "line": int(lines[row])}) if lines is not None else \
        (lambda row: {"path": p, "row": int(row)})
    meta = TraceMeta(block_tokens=int(spec.block_tokens), source_format=FORMAT, source=os.path.basename(p))
    return TokenLog(requests=df, meta=meta, spec=spec, time_unit=state.unit or "s", time_note=state.note,
                    locate=locate, warnings=list(state.warnings))


def load_token_trace(path: str | os.PathLike, *, share_tenants: bool = False, **options) -> tuple[Trace, TokenLog]:
    """A token log as a :class:`~kvtrace.trace.Trace` (trace order, timestamps relative
    to the first request), and the :class:`TokenLog` it came from (time unit, notes).
    ``options`` are those of :func:`read_token_log`."""
    from kvtrace.ingest.canonical import build_trace, prepare_requests

    log = read_token_log(path, **options)
    meta = log.meta if not share_tenants else TraceMeta(**{**log.meta.to_dict(), "share_tenants": True})
    df, warn = prepare_requests(log.requests, meta, source=str(path), already_relative=False, locate=log.locate)
    return build_trace(df, meta, log.warnings + warn), log


class UnsortedLog(KvtraceError):
    """A log whose timestamps decrease, met by a chunked read (it cannot sort)."""


def write_token_parquet(path: str | os.PathLike, out: str | os.PathLike, *, kind: str = "auto",
                        fields: TokenFields = TokenFields(), spec: HashSpec = HashSpec(), time_unit: str = "auto",
                        max_token_id: int = MAX_TOKEN_ID, chunk_rows: int = CHUNK_ROWS,
                        share_tenants: bool = False) -> TokenLog:
    """Hash a token log chunk by chunk into a canonical Parquet request table (one row
    group per chunk, written to ``out`` as it goes: wrap it in
    :func:`kvtrace.outputs.atomic_path` for a user's file): memory is one chunk, not the log, so every streamed
    pass can read a log of any size (:func:`kvtrace.ingest.stream.open_stream`).

    Equal to :func:`load_token_trace` then :func:`~kvtrace.ingest.canonical.write_canonical`
    for a log in arrival order (timestamps relative to the first request); a log whose
    timestamps decrease is refused with the line or row where they do (the in-memory
    read sorts it instead). Returns the :class:`TokenLog` without its requests (an
    empty table), for its notes and metadata.
    """
    import pyarrow.parquet as pq

    from kvtrace.ingest.canonical import METADATA_KEY, conform

    holder: list = []
    meta = TraceMeta(block_tokens=int(spec.block_tokens), source_format=FORMAT, source=os.path.basename(str(path)),
                     share_tenants=share_tenants)
    md = {METADATA_KEY: json.dumps({"version": 1, **meta.to_dict()}, sort_keys=True).encode()}
    t0 = last = None
    rows = 0
    writer = None
    try:
        for chunk in iter_token_chunks(path, kind=kind, fields=fields, spec=spec, time_unit=time_unit,
                                       max_token_id=max_token_id, chunk_rows=chunk_rows, _state=holder):
            ts = chunk["timestamp"].to_numpy()
            t0 = float(ts[0]) if t0 is None else t0
            back = np.flatnonzero(np.diff(np.concatenate([[ts[0] if last is None else last], ts])) < 0)
            if back.size:
                at = holder[0].lines[-1][back[0]] if holder[0].lines else None
                where = {"line": int(at)} if at is not None else {"row": rows + int(back[0])}
                raise UnsortedLog("timestamps go back in time: a streamed log must be in arrival order "
                                  "(read it without --stream to sort it)", path=str(path),
                                  field=fields.timestamp, **where)
            last = float(ts[-1])
            table = conform(chunk.with_columns(pl.col("timestamp") - t0)).to_arrow()
            if writer is None:
                writer = pq.ParquetWriter(str(out), table.schema.with_metadata(md), compression="zstd")
            writer.write_table(table.replace_schema_metadata(md))
            rows += chunk.height
    finally:
        if writer is not None:
            writer.close()
    if not rows:
        raise KvtraceError("no requests: the log is empty", path=str(path))
    state = holder[0]
    return TokenLog(requests=pl.DataFrame(schema=REQUEST_SCHEMA), meta=meta, spec=spec, time_unit=state.unit or "s",
                    time_note=state.note, locate=lambda row: {"path": str(path), "row": int(row)},
                    warnings=list(state.warnings))
