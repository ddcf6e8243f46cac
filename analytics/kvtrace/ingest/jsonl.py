"""Mooncake (FAST'25) and Qwen-Bailian (ATC'25) JSONL readers.

Fast path: Polars' native NDJSON reader with an explicit schema. When it fails, or when
validation finds a bad value, a line-by-line scan (only on that error path) finds the
first offending line and field so the message can name them.

A source is one file or a directory of shards (read in natural name order, as if
concatenated). Files may be gzip- or zstd-compressed (recognised by their first
bytes, not their names). Tolerated with a warning: a UTF-8 byte-order mark, a last
line cut off mid-record (no final newline and not valid JSON: the tail of a trace
still being written, or of an interrupted copy) and a compressed stream that ends
early (the records before the cut are read). Everything else that is not a valid
record is an error naming the file, the line and the field.
"""

from __future__ import annotations

import io
import json
import math
import os
import zlib
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from kvtrace.errors import KvtraceError
from kvtrace.trace import TraceMeta
from kvtrace.ingest.inputs import (BOM, GZIP_MAGIC, ZSTD_MAGIC, check_input_kind, read_pipe, shard_files,
                                   third_party_text)

MOONCAKE_BLOCK_TOKENS = 512
BAILIAN_BLOCK_TOKENS = 16
INT64_MAX = 2**63 - 1

_MOONCAKE_SCHEMA = {
    "timestamp": pl.Float64,
    "input_length": pl.Int64,
    "output_length": pl.Int64,
    "hash_ids": pl.List(pl.UInt64),
    "end_timestamp": pl.Float64,  # optional: when the request finished, in the unit of ``timestamp``
}
_BAILIAN_SCHEMA = {
    "chat_id": pl.Int64,
    "parent_chat_id": pl.Int64,
    "timestamp": pl.Float64,
    "input_length": pl.Int64,
    "output_length": pl.Int64,
    "type": pl.String,
    "turn": pl.Int64,
    "hash_ids": pl.List(pl.UInt64),
    "end_timestamp": pl.Float64,
}
#: field -> kind, for the line-by-line validator
_REQUIRED = {
    "mooncake": {"timestamp": "number", "input_length": "count", "output_length": "count", "hash_ids": "hashes"},
    "bailian": {
        "chat_id": "int", "parent_chat_id": "int", "timestamp": "number", "input_length": "count",
        "output_length": "count", "hash_ids": "hashes",
    },
}
_OPTIONAL = {"mooncake": {"end_timestamp": "number or null"},
             "bailian": {"type": "string", "turn": "int", "end_timestamp": "number or null"}}
#: canonical column -> the field it comes from, per format (for messages)
JSONL_NAMES = {
    "mooncake": {"input_tokens": "input_length", "output_tokens": "output_length", "block_ids": "hash_ids"},
    "bailian": {"input_tokens": "input_length", "output_tokens": "output_length", "block_ids": "hash_ids",
                "request_id": "chat_id", "parent_id": "parent_chat_id"},
}

#: how the message of a file without a record starts (an empty shard among others is skipped)
NO_REQUESTS = "no requests: "
DUPLICATE_KEY = "duplicate key in one record"


# ----------------------------------------------------------------------------- sources


@dataclass
class Shard:
    """One file of a source: ``data`` is its path (a plain file, read by Polars without
    a Python copy) or its bytes (decompressed, or repaired)."""

    path: str
    data: str | bytes


@dataclass
class JsonlSource:
    """A JSONL trace: one file, or the shards of a directory in read order."""

    path: str
    shards: list[Shard]
    warnings: list[str] = field(default_factory=list)

    def locate(self, row: int) -> dict:
        """``path`` and ``line`` of request ``row`` (0-based over the non-blank lines of
        all shards); a line-by-line count, for error messages only."""
        seen = 0
        for shard in self.shards:
            for lineno, line in enumerate(_lines(shard.data), start=1):
                if line.strip():
                    if seen == row:
                        return {"path": shard.path, "line": lineno}
                    seen += 1
        return {"path": self.path, "row": row}

    def scan_for_error(self, fmt: str) -> KvtraceError | None:
        """The first invalid record of any shard, or None."""
        for shard in self.shards:
            err = scan_for_error(shard.data, shard.path, fmt)
            if err is not None:
                return err
        return None


def open_source(path: str, data: bytes | None = None) -> JsonlSource:
    """A file or a directory of shards, ready for the readers (see the module docstring).

    ``data``: the bytes of ``path`` already read (a pipe, read once:
    :func:`kvtrace.ingest.inputs.read_pipe`); ``path`` then only names them."""
    warnings: list[str] = []
    if data is not None:
        return JsonlSource(path, [_open_shard(path, warnings, "", data)], warnings)
    if os.path.isdir(path):
        files, other = shard_files(path)
        if not files:
            raise KvtraceError("no JSONL shards in this directory (expected *.jsonl, *.jsonl.gz or *.jsonl.zst "
                               "files)", path=path)
        if other:
            shown = ", ".join(other[:3]) + (", ..." if len(other) > 3 else "")
            warnings.append(f"ignored {len(other)} entr{'y' if len(other) == 1 else 'ies'} that "
                            f"{'is not a JSONL shard' if len(other) == 1 else 'are not JSONL shards'}: {shown}")
        shards = [_open_shard(f, warnings, os.path.basename(f)) for f in files]
    else:
        shards = [_open_shard(path, warnings, "")]
    return JsonlSource(path, shards, warnings)


def _magic(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(4)


def _open_shard(path: str, warnings: list[str], label: str, raw: bytes | None = None) -> Shard:
    """``label``: the shard's name in warnings ("" for a single file, which the caller
    names); ``raw``: the file's bytes when already read (a pipe: never opened again)."""
    head = _magic(path) if raw is None else raw[:4]
    if raw is not None:
        data = _inflate(raw, path, warnings, label) if head[:2] == GZIP_MAGIC or head == ZSTD_MAGIC else raw
    elif head[:2] == GZIP_MAGIC or head == ZSTD_MAGIC:
        data = _decompress(path, warnings, label)
    elif head[:3] == BOM:
        with open(path, "rb") as fh:
            data = fh.read()
    else:
        data = path
    if isinstance(data, bytes) and data[:3] == BOM:
        data = data[3:]
        warnings.append(_at(label) + "a UTF-8 byte-order mark at the start was skipped")
    return Shard(path, _drop_truncated_tail(path, data, warnings, label))


def _at(label: str, line: int | None = None) -> str:
    """Where a warning applies, as its prefix: ``part-2.jsonl:5: ``, ``line 5: ``."""
    if line is None:
        return f"{label}: " if label else ""
    return f"{label}:{line}: " if label else f"line {line}: "


def _decompress(path: str, warnings: list[str], label: str = "") -> bytes:
    """A gzip or zstd file's content; a stream cut short gives what precedes the cut.

    Under the resource guard (:func:`kvtrace.ingest.guard.reading`) the output is bounded: past
    :func:`kvtrace.ingest.guard.decompressed_limit` bytes (a bomb, or a trace too large for
    memory) it stops with one line naming the file, before memory runs out."""
    from kvtrace.ingest.guard import decompressed_limit, decompression_refused

    zstd = _magic(path) == ZSTD_MAGIC
    chunks: list[bytes] = []
    limit = decompressed_limit()
    try:
        if zstd:
            import pyarrow as pa

            got = 0
            with pa.input_stream(path, compression="zstd") as stream:
                while chunk := stream.read(1 << 18):  # small reads: a cut loses at most one
                    chunks.append(chunk)
                    got += len(chunk)
                    if limit is not None and got > limit:
                        chunks.clear()
                        raise decompression_refused(path, got)
            truncated = False
        else:
            truncated = _gunzip(path, chunks, limit)
            if truncated is None:
                got = sum(map(len, chunks))
                chunks.clear()
                raise decompression_refused(path, got)
    except (OSError, zlib.error, EOFError) as exc:
        _raise_unless_cut_short(exc, zstd, path)
        truncated = True
    return _joined(chunks, truncated, zstd, path, warnings, label)


def _gunzip(path: str, chunks: list[bytes], limit: int | None = None) -> bool | None:
    """Decompress every member of a gzip file into ``chunks``; True if it is cut short,
    None once the output passes ``limit`` bytes (decompression stops there).

    (zlib directly rather than the gzip module: at a cut, the gzip module drops the
    content of its last read. Output is taken in pieces of at most 4 MiB: 1 MiB of
    input can inflate to 1 GB.)"""
    d = None
    pending = b""
    got = 0
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            block, pending = pending + block, b""
            while block:
                if d is None:  # the start of a member (a file may hold several)
                    if len(block) < 2:
                        pending = block
                        break
                    if block[:2] != GZIP_MAGIC:
                        raise zlib.error("not a gzip stream after the first member")
                    d = zlib.decompressobj(wbits=31)
                out = d.decompress(block, 1 << 22)
                chunks.append(out)
                got += len(out)
                if limit is not None and got > limit:
                    return None
                if d.eof:
                    block, d = d.unused_data, None
                else:
                    block = d.unconsumed_tail
    if d is None:
        return bool(pending)
    chunks.append(d.flush())
    return not d.eof


def _inflate(raw: bytes, path: str, warnings: list[str], label: str = "") -> bytes:
    """:func:`_decompress` for bytes already read (a pipe, which cannot be opened
    twice): the same bound (:func:`kvtrace.ingest.guard.decompressed_limit`), the same
    messages and the same tolerance of a stream cut short."""
    from kvtrace.ingest.guard import decompressed_limit, decompression_refused

    zstd = raw[:4] == ZSTD_MAGIC
    chunks: list[bytes] = []
    limit = decompressed_limit()
    got = 0
    truncated = False
    try:
        if zstd:
            import pyarrow as pa

            with pa.input_stream(pa.py_buffer(raw), compression="zstd") as stream:
                while chunk := stream.read(1 << 18):
                    chunks.append(chunk)
                    got += len(chunk)
                    if limit is not None and got > limit:
                        chunks.clear()
                        raise decompression_refused(path, got)
        else:
            block, d = memoryview(raw), None
            while block:
                if d is None:  # the start of a member (a file may hold several)
                    if len(block) < 2:
                        truncated = True
                        break
                    if bytes(block[:2]) != GZIP_MAGIC:
                        raise zlib.error("not a gzip stream after the first member")
                    d = zlib.decompressobj(wbits=31)
                out = d.decompress(block, 1 << 22)  # in pieces: 1 MiB can inflate to 1 GB
                chunks.append(out)
                got += len(out)
                if limit is not None and got > limit:
                    chunks.clear()
                    raise decompression_refused(path, got)
                block, d = (memoryview(d.unused_data), None) if d.eof else (memoryview(d.unconsumed_tail), d)
            if d is not None:
                chunks.append(d.flush())
                truncated = not d.eof
    except (OSError, zlib.error, EOFError) as exc:
        _raise_unless_cut_short(exc, zstd, path)
        truncated = True
    return _joined(chunks, truncated, zstd, path, warnings, label)


def _raise_unless_cut_short(exc: Exception, zstd: bool, path: str) -> None:
    """A decompression error: a stream cut short is tolerated (the caller keeps what
    precedes the cut), anything else is a corrupt stream, one line naming the file."""
    msg = str(exc)
    if "Truncated" not in msg:
        kind = "zstd" if zstd else "gzip"
        raise KvtraceError(f"corrupt {kind} stream ({msg.splitlines()[0] if msg else type(exc).__name__})",
                           path=path) from None


def _joined(chunks: list[bytes], truncated: bool, zstd: bool, path: str, warnings: list[str], label: str) -> bytes:
    """The decompressed bytes; a stream cut short warns with what was read, or fails if nothing was."""
    if truncated:
        got = sum(map(len, chunks))
        if not got:
            raise KvtraceError(f"corrupt or cut-short {'zstd' if zstd else 'gzip'} stream: nothing could be "
                               "decompressed", path=path)
        warnings.append(_at(label) + f"the compressed stream is cut short: read the {got:,} bytes before the cut")
    return b"".join(chunks)


def _drop_truncated_tail(path: str, data: str | bytes, warnings: list[str], label: str = "") -> str | bytes:
    """Drop a last line cut off mid-record: no final newline and not valid JSON."""
    if isinstance(data, bytes):
        end = len(data)
        while end > 0 and data[end - 1] in b" \t\r":
            end -= 1
        if end == 0 or data[end - 1] == 0x0A:
            return data
        start = data.rfind(b"\n", 0, end) + 1
        tail = data[start:end]
    else:
        size = os.path.getsize(data)
        step = 1 << 16
        with open(data, "rb") as fh:
            while True:  # only the end of the file is read, unless its last line is long
                start = max(0, size - step)
                fh.seek(start)
                stripped = fh.read().rstrip(b" \t\r")
                if stripped.endswith(b"\n") or (not stripped and start == 0):
                    return data
                nl = stripped.rfind(b"\n")
                if nl >= 0 or start == 0:
                    tail, start = stripped[nl + 1:], start + nl + 1
                    break
                step *= 4
    if start == 0:
        return data  # the only line: reported as malformed, not dropped
    if not tail.strip():
        return data
    try:
        json.loads(tail)
        return data  # a complete last record without a final newline
    except RecursionError:
        return data  # complete or not, the line-by-line scan reports it as nested too deeply
    except (ValueError, UnicodeDecodeError):
        pass
    lineno = (data.count(b"\n", 0, start) if isinstance(data, bytes) else _count_newlines(data, start)) + 1
    warnings.append(_at(label, lineno) + "the last line is cut off (no final newline, not valid JSON): ignored")
    if isinstance(data, bytes):
        return data[:start]
    with open(data, "rb") as fh:
        return fh.read(start)


def _count_newlines(path: str, upto: int) -> int:
    n = 0
    with open(path, "rb") as fh:
        left = upto
        while left > 0:
            block = fh.read(min(left, 1 << 22))
            if not block:
                break
            n += block.count(b"\n")
            left -= len(block)
    return n


def read_bytes(path: str | os.PathLike) -> bytes:
    """The file's bytes, decompressed transparently (gzip, zstd); a pipe is read once
    (:mod:`kvtrace.ingest.inputs`), a device refused."""
    p = str(path)
    if check_input_kind(p) == "pipe":
        raw = read_pipe(p)
        head = raw[:4]
    else:
        raw, head = None, _magic(p)
    if head[:2] == GZIP_MAGIC or head == ZSTD_MAGIC:
        warnings: list[str] = []
        data = _decompress(p, warnings) if raw is None else _inflate(raw, p, warnings)
        if warnings:  # a truncated stream read through here is an error
            raise KvtraceError("corrupt or truncated compressed stream", path=p)
        return data
    if raw is not None:
        return raw
    with open(p, "rb") as fh:
        return fh.read()


def jsonl_source(path: str) -> str | bytes:
    """What the readers take: the path itself (Polars reads it without a Python copy),
    or the bytes of a compressed file (decompressed) or of a pipe (read once)."""
    if check_input_kind(path) == "pipe":
        return read_bytes(path)
    head = _magic(path)
    return read_bytes(path) if head[:2] == GZIP_MAGIC or head == ZSTD_MAGIC else path


def _lines(src: str | bytes):
    """Lines of a source: bytes, or a file path (read decompressed)."""
    if isinstance(src, bytes):
        yield from io.BytesIO(src)
        return
    head = _magic(src)
    if head[:2] == GZIP_MAGIC or head == ZSTD_MAGIC:
        yield from io.BytesIO(read_bytes(src))
        return
    with open(src, "rb") as fh:
        yield from fh


def first_record(data: str | bytes, path: str) -> tuple[int, dict]:
    """The first non-blank JSON line: (line number, parsed record).

    A file without one is an error starting ``no requests:`` (:data:`NO_REQUESTS`)."""
    lineno = 0
    for lineno, line in enumerate(_lines(data), start=1):
        if lineno == 1 and line[:3] == BOM:
            line = line[3:]
        if line.strip():
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "not valid UTF-8"
                raise KvtraceError(f"malformed JSON ({msg})", path=path, line=lineno) from None
            except RecursionError:
                raise KvtraceError("malformed JSON (nested too deeply)", path=path, line=lineno) from None
            if not isinstance(rec, dict):
                raise KvtraceError("expected a JSON object per line", path=path, line=lineno)
            return lineno, rec
    what = "the file holds only blank lines" if lineno else "the file is empty"
    raise KvtraceError(f"{NO_REQUESTS}{what}", path=path)


def record_format(rec: dict) -> str | None:
    """``bailian`` or ``mooncake`` from a record's fields, or None."""
    if "chat_id" in rec or "parent_chat_id" in rec:
        return "bailian"
    if "hash_ids" in rec:
        return "mooncake"
    return None


def source_format(source: JsonlSource, expected: str | None = None) -> str:
    """The format of a source's records; every shard must agree.

    With ``expected`` (a format the user chose) only the first record of each shard is
    checked to be a JSON object: an empty file, or one that is not JSONL, fails here."""
    found = None
    for shard in source.shards:
        try:
            line, rec = first_record(shard.data, shard.path)
        except KvtraceError as exc:
            if len(source.shards) > 1 and exc.message.startswith(NO_REQUESTS):
                continue  # an empty shard among others
            raise
        fmt = expected or record_format(rec)
        if fmt is None:
            raise KvtraceError(
                "cannot tell the trace format: expected Mooncake fields (timestamp, input_length, output_length, "
                "hash_ids) or Qwen-Bailian fields (chat_id, parent_chat_id, ...); use --format",
                path=shard.path, line=line,
            )
        if found is not None and fmt != found:
            raise KvtraceError(f"a {fmt} record in a directory of {found} shards", path=shard.path, line=line)
        found = fmt
    if found is None:
        raise KvtraceError("no requests: every shard is empty", path=source.path)
    return found


def _check_value(kind: str, value) -> str | None:
    """None if ``value`` is of ``kind``, else what was expected."""
    if kind == "number or null":
        if value is None:
            return None
        kind = "number"
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return "expected a finite number"
        try:
            if not math.isfinite(float(value)):
                return "expected a finite number"
        except OverflowError:
            return "expected a finite number"
    elif kind in ("int", "count"):
        if isinstance(value, bool) or not isinstance(value, int):
            return "expected an integer"
        if kind == "count" and value < 0:
            return f"expected a non-negative integer, got {value}"
        if not -INT64_MAX - 1 <= value <= INT64_MAX:
            return f"expected an integer below 2^63, got {value}"
    elif kind == "string":
        if value is not None and not isinstance(value, str):
            return "expected a string"
    elif kind == "hashes":
        if not isinstance(value, list):
            return "expected a list of integer hashes"
        for v in value:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**64:
                return f"expected integer hashes in [0, 2^64), got {_short(v)}"
    return None


def _short(v, limit: int = 60) -> str:
    text = repr(v)
    return text if len(text) <= limit else text[:limit] + "..."


class _Record(dict):
    """A parsed JSON object that remembers the keys it holds more than once (Python's
    json keeps the last value of such a key, Polars' reader the first)."""

    __slots__ = ("twice",)

    @classmethod
    def from_pairs(cls, pairs: list) -> "_Record":  # json's object_pairs_hook
        rec = cls(pairs)
        rec.twice = None
        if len(rec) != len(pairs):
            seen: set = set()
            rec.twice = []
            for key, _ in pairs:
                if key in seen:
                    rec.twice.append(key)
                seen.add(key)
        return rec

    def duplicate(self, names) -> str | None:
        """The first of ``names`` this object holds twice, or None."""
        return next((k for k in self.twice if k in names), None) if self.twice else None


def scan_for_error(data: str | bytes, path: str, fmt: str) -> KvtraceError | None:
    """Line-by-line validation; the first problem found, or None."""
    required, optional = _REQUIRED[fmt], _OPTIONAL[fmt]
    for lineno, line in enumerate(_lines(data), start=1):
        if lineno == 1 and line[:3] == BOM:
            line = line[3:]
        if not line.strip():
            continue
        try:
            rec = json.loads(line, object_pairs_hook=_Record.from_pairs)
        except json.JSONDecodeError as exc:
            return KvtraceError(f"malformed JSON ({exc.msg})", path=path, line=lineno)
        except UnicodeDecodeError:
            return KvtraceError("not valid UTF-8", path=path, line=lineno)
        except RecursionError:
            return KvtraceError("malformed JSON (nested too deeply)", path=path, line=lineno)
        if not isinstance(rec, dict):
            return KvtraceError("expected a JSON object per line", path=path, line=lineno)
        twice = rec.duplicate(required.keys() | optional.keys())
        if twice is not None:
            return KvtraceError(DUPLICATE_KEY, path=path, line=lineno, field=twice)
        for name, kind in required.items():
            if name not in rec:
                return KvtraceError("missing (required)", path=path, line=lineno, field=name)
            problem = _check_value(kind, rec[name])
            if problem:
                return KvtraceError(problem, path=path, line=lineno, field=name)
        for name, kind in optional.items():
            if name in rec:
                problem = _check_value(kind, rec[name])
                if problem:
                    return KvtraceError(problem, path=path, line=lineno, field=name)
        if rec["input_length"] > 0 and not rec["hash_ids"]:
            return KvtraceError(
                f"empty hash list for a prompt of {rec['input_length']} tokens",
                path=path, line=lineno, field="hash_ids",
            )
    return None


def _fast_read(data: str | bytes, path: str, fmt: str) -> pl.DataFrame:
    schema = _MOONCAKE_SCHEMA if fmt == "mooncake" else _BAILIAN_SCHEMA
    try:
        df = pl.read_ndjson(io.BytesIO(data) if isinstance(data, bytes) else data, schema=schema,
                            ignore_errors=False)
    except Exception as exc:  # Polars raises several error types for bad input (a stack overflow among them)
        err = scan_for_error(data, path, fmt)
        if err is not None:
            raise err from None
        raise KvtraceError(f"cannot read as {fmt} JSONL: {third_party_text(exc)}", path=path) from None
    _refuse_duplicate_keys(df, data, path, fmt)
    return df


def _refuse_duplicate_keys(df: pl.DataFrame, data: str | bytes, path: str, fmt: str) -> None:
    """Refuse a record that holds a field it reads twice (``"input_length": 10,
    "input_length": 99999``): Polars read the first value, Python's json and most tools
    take the last.

    Whole-buffer counts at C speed first, each sound (no duplicate can pass it):

    1. every key of a JSON object is followed by its own colon, so the colons of the
       source bound the key occurrences from above. If they are no more than the
       non-null values Polars read (each needs its key), no read field occurs twice.
       A trace with only the fields kvtrace reads passes here (one pass over the bytes).
    2. otherwise (extra fields, colons in strings): per field, the occurrences of
       ``"name"`` against its non-null values.
    3. only for the fields that fail 2: the lines holding ``"name"`` twice are parsed
       (:class:`_Record`) and the first duplicate, in file order, is an error naming the
       line and the field.

    (A key spelled with escapes, ``"input\\u005flength"``, is not seen: Polars does not
    unescape keys.)
    """
    present = {name: df.height - df[name].null_count() for name in df.columns}
    (colons,) = _count(data, [b":"])
    if colons <= sum(present.values()):
        return
    names = list(present)
    counts = _count(data, [f'"{name}"'.encode() for name in names])
    suspects = [f'"{n}"'.encode() for n, c in zip(names, counts) if c > present[n]]
    if not suspects:
        return
    read = _REQUIRED[fmt].keys() | _OPTIONAL[fmt].keys()
    for lineno, line in enumerate(_lines(data), start=1):
        if any(line.count(s) > 1 for s in suspects):
            try:
                rec = json.loads(line, object_pairs_hook=_Record.from_pairs)
            except (ValueError, RecursionError):
                continue  # Polars read it: an escaped quote, not a second key
            twice = rec.duplicate(read) if isinstance(rec, _Record) else None
            if twice is not None:
                raise KvtraceError(DUPLICATE_KEY, path=path, line=lineno, field=twice)


_PIECE = 1 << 22


def _count(data: str | bytes, needles: list[bytes]) -> list[int]:
    """Occurrences of each needle in a source (bytes, or a file read in 4 MiB pieces
    into one buffer), including those that straddle two pieces."""
    counts = [0] * len(needles)
    if isinstance(data, bytes):
        for i, needle in enumerate(needles):
            if len(needle) == 1:  # numpy's compare-and-count is about twice bytes.count's speed
                for at in range(0, len(data), _PIECE):
                    piece = np.frombuffer(data, np.uint8, count=min(_PIECE, len(data) - at), offset=at)
                    counts[i] += int(np.count_nonzero(piece == needle[0]))
            else:
                counts[i] = data.count(needle)
        return counts
    keep = max(map(len, needles)) - 1
    buf = bytearray(_PIECE)
    tail = b""  # the last bytes of the previous piece
    with open(data, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            piece = np.frombuffer(buf, np.uint8, count=n)
            for i, needle in enumerate(needles):
                if len(needle) == 1:
                    counts[i] += int(np.count_nonzero(piece == needle[0]))
                    continue
                counts[i] += buf.count(needle, 0, n)
                k = len(needle) - 1
                if tail:  # an occurrence across the seam lies within k bytes either side of it
                    counts[i] += (tail[-k:] + bytes(buf[:min(k, n)])).count(needle)
            tail = (tail + bytes(buf[max(0, n - keep):n]))[-keep:] if keep else b""
    return counts


def _read_raw(source: JsonlSource, fmt: str) -> pl.DataFrame:
    frames = [_fast_read(s.data, s.path, fmt) for s in source.shards]
    return frames[0] if len(frames) == 1 else pl.concat(frames, how="vertical", rechunk=False)


def read_mooncake(data: str | bytes | JsonlSource, path: str,
                  block_tokens: int | None = None) -> tuple[pl.DataFrame, TraceMeta]:
    """Mooncake JSONL -> canonical request table (file order) and metadata.

    ``timestamp`` is in milliseconds, and so is the optional ``end_timestamp`` (when
    the request finished); block size 512 tokens unless overridden. ``request_id`` is
    the record's index (over all shards of a directory).
    """
    raw = _read_raw(_as_source(data, path), "mooncake")
    df = raw.select(
        pl.int_range(pl.len(), dtype=pl.Int64).alias("request_id"),
        # numpy's division is correctly rounded; Polars' multiplies by 1/1000 (71 ms -> 0.07100000000000001 s)
        pl.lit(pl.Series("timestamp", raw["timestamp"].to_numpy() / 1000.0)),
        pl.col("input_length").alias("input_tokens"),
        pl.col("output_length").alias("output_tokens"),
        pl.col("hash_ids").alias("block_ids"),
    )
    if _has_end_times(raw):
        df = df.with_columns(_milliseconds(raw["end_timestamp"]).alias("end_timestamp"))
    meta = TraceMeta(block_tokens=block_tokens or MOONCAKE_BLOCK_TOKENS, source_format="mooncake",
                     source=os.path.basename(os.path.normpath(path)))
    return df, meta


def read_bailian(data: str | bytes | JsonlSource, path: str,
                 block_tokens: int | None = None) -> tuple[pl.DataFrame, TraceMeta]:
    """Qwen-Bailian JSONL -> canonical request table (file order) and metadata.

    ``timestamp`` is in seconds, and so is the optional ``end_timestamp`` (when the
    request finished); block size 16 tokens unless overridden. The session of a request
    is the root of its ``parent_chat_id`` chain (-1 = root).
    """
    source = _as_source(data, path)
    raw = _read_raw(source, "bailian")
    # Polars reads a missing or null field as null; these two are required here.
    if raw["chat_id"].null_count() or raw["parent_chat_id"].null_count():
        field = "chat_id" if raw["chat_id"].null_count() else "parent_chat_id"
        raise source.scan_for_error("bailian") or KvtraceError("missing (required)", path=path, field=field)
    chat = raw["chat_id"].to_numpy()
    parent = raw["parent_chat_id"].to_numpy()
    df = raw.select(
        pl.col("chat_id").alias("request_id"),
        pl.col("timestamp"),
        pl.when(pl.col("parent_chat_id") >= 0).then(pl.col("parent_chat_id")).alias("parent_id"),
        pl.col("turn"),
        pl.col("type"),
        pl.col("input_length").alias("input_tokens"),
        pl.col("output_length").alias("output_tokens"),
        pl.col("hash_ids").alias("block_ids"),
    ).with_columns(pl.Series("session_id", session_roots(chat, parent, path, locate=source.locate), dtype=pl.Int64))
    if _has_end_times(raw):
        df = df.with_columns(raw["end_timestamp"])
    meta = TraceMeta(block_tokens=block_tokens or BAILIAN_BLOCK_TOKENS, source_format="bailian",
                     source=os.path.basename(os.path.normpath(path)))
    return df, meta


def _has_end_times(raw: pl.DataFrame) -> bool:
    """Whether some record gives the optional ``end_timestamp`` (else the column is left out)."""
    return raw["end_timestamp"].null_count() < raw.height


def _milliseconds(col: pl.Series) -> pl.Series:
    """Milliseconds -> seconds by numpy's correctly rounded division, nulls kept."""
    seconds = pl.Series(col.name, col.to_numpy() / 1000.0)
    return seconds if not col.null_count() else seconds.set(col.is_null(), None)


def _as_source(data: str | bytes | JsonlSource, path: str) -> JsonlSource:
    return data if isinstance(data, JsonlSource) else JsonlSource(path, [Shard(path, data)])


def describe(where: dict, relative_to: str | None = None) -> str:
    """``line 3``, ``other.jsonl:3`` or ``row 3``: a location inside a message."""
    if "line" in where:
        if relative_to is not None and where.get("path") not in (None, relative_to):
            return f"{where['path']}:{where['line']}"
        return f"line {where['line']}"
    return f"row {where['row']}"


def session_roots(chat: np.ndarray, parent: np.ndarray, path: str = "", *, locate=None) -> np.ndarray:
    """Root chat id of each request's parent chain, by pointer jumping (O(R log depth)).

    A parent that is not in the trace (the trace starts mid-conversation) ends the
    chain: the earliest ancestor present is the root. ``locate(row)`` gives the
    ``path``/``line`` of a row for the message naming a duplicated ``chat_id``.
    """
    n = chat.shape[0]
    order = np.argsort(chat, kind="stable")
    sorted_chat = chat[order]
    if n > 1 and np.any(sorted_chat[1:] == sorted_chat[:-1]):
        same = np.flatnonzero(sorted_chat[1:] == sorted_chat[:-1])
        k = same[np.argmin(order[same + 1])]  # the earliest repeat in file order
        first, again = int(order[k]), int(order[k + 1])
        if locate is None:
            raise KvtraceError(f"duplicate chat_id {chat[again]} (rows {first} and {again})", path=path,
                               field="chat_id")
        where = locate(again)
        raise KvtraceError(f"duplicate chat_id {chat[again]}: first at {describe(locate(first), where.get('path'))}",
                           field="chat_id", **where)
    idx = np.searchsorted(sorted_chat, parent)
    idx = np.clip(idx, 0, max(n - 1, 0))
    found = (parent >= 0) & (n > 0) & (sorted_chat[idx] == parent) if n else np.zeros(0, bool)
    up = np.arange(n)
    up[found] = order[idx[found]]
    for _ in range(64):
        nxt = up[up]
        if np.array_equal(nxt, up):
            break
        up = nxt
    else:
        raise KvtraceError("parent_chat_id chains form a cycle", path=path, field="parent_chat_id")
    # A cycle whose length is a power of two makes ``up`` a fixed point too (up^2 = id);
    # a true root has no parent in the trace.
    if np.any(found[up]):
        raise KvtraceError("parent_chat_id chains form a cycle", path=path, field="parent_chat_id")
    return chat[up]
