"""Trace ingest: source files -> canonical request table -> :class:`~kvtrace.trace.Trace`.

Formats (DESIGN §1): Mooncake JSONL (FAST'25), Qwen-Bailian JSONL (ATC'25), either one
gzip- or zstd-compressed or as a directory of shards, generic
Parquet/CSV (a list column of block hashes, or an exploded access table), and kvtrace's
own canonical Parquet (written by :func:`write_canonical` / ``kvtrace ingest``).
Every command reads any of them directly: ingest is implicit.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kvtrace.config import plain_numpy_pages
from kvtrace.errors import KvtraceError, UsageError
from kvtrace.ingest.guard import check_before_read, check_memory, check_sizes, reading
from kvtrace.trace import Trace, TraceMeta
from kvtrace.ingest.canonical import (MAX_BLOCK_TOKENS, build_trace, distinct_blocks, prepare_requests, read_metadata,
                        requests_to_trace, write_canonical)
from kvtrace.ingest.inputs import check_input_kind, pipe_refused, read_pipe
from kvtrace.ingest.jsonl import JSONL_NAMES, open_source, read_bailian, read_mooncake, source_format
from kvtrace.ingest.tabular import from_generic, read_canonical, read_table, source_names
from kvtrace.ingest.tokens import TokenFields, read_token_log
from kvtrace.ingest.vllm_hash import DEFAULT_HASH

FORMATS = ("auto", "mooncake", "bailian", "parquet", "csv", "tokens", "openai")
#: request logs whose block ids kvtrace derives itself (vLLM's prefix-cache hashes): token ids, chat bodies
LOG_FORMATS = ("tokens", "openai")


@dataclass(frozen=True)
class LogOptions:
    """How a request log (``--format tokens`` or ``openai``) becomes block ids, and how
    the block ids of any trace are re-chained or re-blocked.

    Attributes
    ----------
    fields : TokenFields
        Field names of a token log (:class:`kvtrace.ingest.tokens.TokenFields`).
    time_unit : str
        ``auto`` (detected and stated), ``s``, ``ms``, ``us``, ``ns`` or ``iso``.
    hash_fn : str
        vLLM's prefix-cache hash, ``sha256`` or ``sha256_cbor``
        (:mod:`kvtrace.ingest.vllm_hash`).
    hash_seed : str
        The ``PYTHONHASHSEED`` vLLM ran with.
    tokenizer, chat_template : str or None
        A chat log's local Hugging Face tokenizer and an optional template override.
    rechain : bool
        The trace hashes each block on its own: turn its ids into prefix-chained ids
        (:func:`kvtrace.ingest.rechain.rechain`) before anything else.
    reblock : int or None
        Coarsen the (chained) trace to this many tokens per block, a whole multiple of
        its own (:func:`kvtrace.ingest.rechain.reblock`).
    """

    fields: TokenFields = TokenFields()
    time_unit: str = "auto"
    hash_fn: str = DEFAULT_HASH
    hash_seed: str = "0"
    tokenizer: str | None = None
    chat_template: str | None = None
    rechain: bool = False
    reblock: int | None = None

    #: command-line option (its parameter name) -> the TokenFields attribute it sets
    FIELD_OPTIONS = {"tokens_field": "tokens", "time_field": "timestamp", "salt_field": "cache_salt",
                     "lora_field": "lora_name"}

    def hash_spec(self, block_tokens: int | None = None):
        """The vLLM hash of these options at ``block_tokens`` tokens per block (None:
        vLLM's 16): a :class:`kvtrace.ingest.vllm_hash.HashSpec`."""
        from kvtrace.ingest.vllm_hash import DEFAULT_BLOCK_TOKENS, HashSpec

        return HashSpec(hash_fn=self.hash_fn, seed=self.hash_seed, block_tokens=block_tokens or DEFAULT_BLOCK_TOKENS)

    @classmethod
    def from_options(cls, **given) -> "LogOptions":
        """From the command's request-log options (``tokens_field=...``, ``hash_fn=...``);
        an option not given (None) keeps its default."""
        given = {k: v for k, v in given.items() if v is not None}
        fields = TokenFields(**{cls.FIELD_OPTIONS[k]: given.pop(k) for k in list(given) if k in cls.FIELD_OPTIONS})
        return cls(fields=fields, **given)


def _read_log(p: str, fmt: str, block_tokens: int | None, log: LogOptions | None):
    """A token or chat log read into the canonical table (:mod:`kvtrace.ingest.tokens`,
    :mod:`kvtrace.ingest.chat`): (table, meta, the TokenLog)."""
    log = log or LogOptions()
    spec = log.hash_spec(block_tokens)
    if fmt == "tokens":
        got = read_token_log(p, fields=log.fields, spec=spec, time_unit=log.time_unit)
    else:
        from kvtrace.ingest.chat import read_chat_log

        got = read_chat_log(p, log.tokenizer, chat_template=log.chat_template, spec=spec, time_unit=log.time_unit)
    return got.requests, got.meta, got


__all__ = ["FORMATS", "LOG_FORMATS", "LogOptions", "build_trace", "check_input_kind", "detect_format", "distinct_blocks", "load_requests",
           "load_trace", "prepare_requests", "read_metadata", "read_requests", "requests_to_trace", "write_canonical"]


def detect_format(path: str | os.PathLike, data: bytes | None = None) -> str:
    """``mooncake``, ``bailian``, ``parquet`` or ``csv``, from the suffix and the fields
    (a directory is read as JSONL shards; a pipe is read once, see
    :func:`check_input_kind`: pass its bytes as ``data``)."""
    p = str(path)
    kind = check_input_kind(p)
    if kind != "directory":
        by_suffix = _suffix_format(p)
        if by_suffix is not None:
            return by_suffix
    if kind == "pipe" and data is None:
        data = read_pipe(p)
    return source_format(open_source(p, data))


def _suffix_format(path: str) -> str | None:
    """``parquet`` or ``csv`` from a file name, else None (JSONL is told by its fields)."""
    suffix = "".join(Path(path).suffixes[-2:]).lower()
    if suffix.endswith((".parquet", ".pq")):
        return "parquet"
    if suffix.endswith((".csv", ".csv.gz")):
        return "csv"
    return None


def _read_pipe_as(path: str, fmt: str) -> tuple[bytes, str]:
    """A pipe's bytes, read once, and the format to read them as: Parquet (by its name,
    the option or its magic bytes) needs random access and is refused."""
    named = _suffix_format(path)
    if fmt == "parquet" or (fmt == "auto" and named == "parquet"):
        raise pipe_refused(path)
    data = read_pipe(path)
    if data[:4] == b"PAR1":
        raise pipe_refused(path)
    if fmt == "auto" and named == "csv":
        fmt = "csv"
    return data, fmt


def _block_ids(df, meta: TraceMeta, warnings: list[str], log: LogOptions, wanted: int | None, path: str,
               kind: str):
    """A validated request table with its block ids re-chained and re-blocked as ``log``
    asks (or to ``wanted`` tokens: a canonical trace's larger ``--block-tokens``), and a
    warning appended when they look unchained (:func:`unchained_warning`)."""
    if log.rechain:
        from kvtrace.ingest.rechain import rechain

        df = rechain(df)
    elif kind not in LOG_FORMATS:
        note = unchained_warning(df, meta)
        if note:
            warnings.append(note)
    target = log.reblock or wanted
    if target is not None and target != meta.block_tokens:
        from kvtrace.ingest.rechain import reblock

        try:
            df, meta = reblock(df, meta, int(target))
        except KvtraceError as exc:
            raise KvtraceError(exc.message, path=path, field="reblock" if log.reblock else "block_tokens") from None
    return df, meta


#: The bounded look at the start of a trace that :func:`unchained_warning` takes: at most
#: this many requests and block ids (:func:`probe_rows`).
CHAIN_CHECK_REQUESTS = 100_000
CHAIN_CHECK_ACCESSES = 1_000_000
#: Share of blocks after more than one parent above which ids look unchained (chained
#: ids have none; a hash collision or two do not reach it), and the fewest distinct
#: blocks that tell (a hand-made trace of a few ids proves nothing either way).
UNCHAINED_SHARE = 0.01
UNCHAINED_MIN_BLOCKS = 64


def probe_rows(lengths, rows: int = 0, accesses: int = 0) -> int:
    """How many of the next requests (their block counts ``lengths``) the unchained check
    reads after ``rows`` requests and ``accesses`` block ids: the start of the trace up to
    :data:`CHAIN_CHECK_REQUESTS` requests and :data:`CHAIN_CHECK_ACCESSES` ids."""
    import numpy as np

    cum = np.cumsum(np.asarray(lengths, dtype=np.int64)[: max(CHAIN_CHECK_REQUESTS - rows, 0)])
    return int(np.searchsorted(cum, CHAIN_CHECK_ACCESSES - accesses, side="right"))


def unchained_warning(df, meta: TraceMeta) -> str | None:
    """One line when the block ids of the start of ``df`` (:func:`probe_rows`) look
    per-block (not prefix-chained; :func:`kvtrace.ingest.rechain.chain_report`), else None."""
    from kvtrace.ingest.rechain import chain_report

    head = df.head(probe_rows(df["block_ids"].list.len().fill_null(0).to_numpy()))
    rep = chain_report(head, meta)
    if rep.share < UNCHAINED_SHARE or rep.blocks < UNCHAINED_MIN_BLOCKS:
        return None
    return (f"block ids look unchained: {rep.share:.1%} of the blocks of the first {head.height:,} requests "
            "follow more than one parent block (chained ids have none), so a block would be reused after a "
            "different prefix; pass --rechain if the trace hashes each block on its own")


def _canonical_block_tokens(path: str) -> int | None:
    """The block size in a canonical Parquet trace's metadata, else None (not one, or not a file)."""
    if not os.path.isfile(path) or _suffix_format(path) != "parquet":
        return None
    try:
        meta = read_metadata(path)
        return int(meta["block_tokens"]) if isinstance(meta, dict) and meta.get("block_tokens") else None
    except (KvtraceError, OSError, ValueError, TypeError):  # the read itself names what is wrong
        return None


def read_requests(path: str | os.PathLike, *, fmt: str = "auto", block_tokens: int | None = None,
                  warnings: list[str] | None = None, names: dict | None = None, log: LogOptions | None = None):
    """Read any supported file into (canonical request table in file order, meta, JSONL
    source or None, kind), as the file holds it (:func:`load_requests` validates it and
    applies ``log``'s re-chaining and re-blocking). A request log (``fmt`` in
    :data:`LOG_FORMATS`, read with ``log``) gives its
    :class:`~kvtrace.ingest.tokens.TokenLog` as the source.

    ``warnings`` collects what was tolerated while reading (a cut-off last line, a
    byte-order mark, ignored files in a directory of shards); ``names`` receives the
    source's name of each canonical column (``input_tokens`` -> ``input_length``), for
    messages.
    """
    p = str(path)
    kind = check_input_kind(p)  # before any open: an empty path, a device or a socket is refused
    if fmt not in FORMATS:
        raise KvtraceError(f"unknown format '{fmt}': expected one of {', '.join(FORMATS)}", field="format")
    if block_tokens is not None and not 1 <= block_tokens <= MAX_BLOCK_TOKENS:
        raise UsageError(f"expected a block size in [1, {MAX_BLOCK_TOKENS:,}] tokens, got {block_tokens}",
                         field="block-tokens")
    is_dir = kind == "directory"
    if is_dir and fmt in ("parquet", "csv"):
        raise KvtraceError(f"is a directory: a directory is read as JSONL shards, not {fmt}", path=p)
    if fmt in LOG_FORMATS:
        if kind != "file":
            raise KvtraceError(f"a {fmt} log is read from a file (not a {kind})", path=p)
        df, meta, got = _read_log(p, fmt, block_tokens, log)
        if warnings is not None:
            warnings.extend(got.notes)
        return df, meta, got, fmt
    data = None  # a pipe's bytes: it is read exactly once, here
    if kind == "pipe":
        data, fmt = _read_pipe_as(p, fmt)
    source = None
    if fmt == "auto":  # as detect_format, with the JSONL source opened (decompressed) once
        fmt = (None if is_dir else _suffix_format(p)) or "jsonl"
    if fmt in ("mooncake", "bailian", "jsonl"):
        source = open_source(p, data)
        fmt = source_format(source, None if fmt == "jsonl" else fmt)  # an empty file or a non-JSON first line fails
        if warnings is not None:
            warnings.extend(source.warnings)
        reader = read_mooncake if fmt == "mooncake" else read_bailian
        df, meta = reader(source, p, block_tokens)
        if names is not None:
            names.update(JSONL_NAMES[fmt])
        return df, meta, source, fmt
    if fmt == "parquet":
        canon = read_canonical(p)
        if canon is not None:
            df, meta = canon
            if block_tokens is not None and block_tokens != meta.block_tokens:
                raise KvtraceError(
                    f"--block-tokens {block_tokens} contradicts the trace's block size {meta.block_tokens}",
                    path=p, field="block_tokens",
                )
            return df, meta, None, "canonical"
    df = read_table(p, fmt, data)
    if df.height == 0:
        raise KvtraceError("no requests: the table is empty", path=p)
    if names is not None:
        names.update(source_names(df.columns))
    df, meta = from_generic(df, p, fmt, block_tokens, warnings=warnings)
    return df, meta, None, fmt


def load_requests(
    path: str | os.PathLike,
    *,
    fmt: str = "auto",
    block_tokens: int | None = None,
    share_tenants: bool = False,
    workload: str | None = None,
    log: LogOptions | None = None,
) -> tuple:
    """Read and validate a trace's request table, in trace order, without building
    the access table: (request table, meta, warnings). See :func:`load_trace`."""
    p = str(path)
    warn: list[str] = []
    names: dict = {}
    log = log or LogOptions()
    wanted = None
    if fmt in ("auto", "parquet") and block_tokens is not None:  # a canonical trace's size is known: re-block
        stored = _canonical_block_tokens(p)
        if stored is not None and block_tokens != stored:
            wanted, block_tokens = block_tokens, None
    if workload is not None and fmt not in LOG_FORMATS:  # from metadata and a bounded first read, before the parse
        check_before_read(p, fmt, workload)
    with reading(workload):  # a decompression stops at what memory allows
        df, meta, source, kind = read_requests(p, fmt=fmt, block_tokens=block_tokens, warnings=warn, names=names,
                                               log=log)
    if share_tenants != meta.share_tenants:
        meta = TraceMeta(**{**meta.to_dict(), "share_tenants": share_tenants})
    try:
        df, more = prepare_requests(df, meta, source=p, already_relative=kind == "canonical",
                                    locate=row_locator(p, kind, source, df))
    except KvtraceError as exc:
        if kind not in LOG_FORMATS and source is not None:  # the first bad record in file order, with its own message
            err = source.scan_for_error(kind)
            if err is not None:
                raise err from None
        if exc.field in names:  # the column as the file calls it
            exc = KvtraceError(exc.message, path=exc.path, line=exc.line, row=exc.row, field=names[exc.field])
            raise exc from None
        raise
    warn += more
    df, meta = _block_ids(df, meta, warn, log, wanted, p, kind)
    if workload is not None:
        check_memory(df, meta, workload, source=p)
    return df, meta, warn


def row_locator(path: str, kind: str, source, df) -> Callable[[int], dict]:
    """row -> the location kwargs of a message: the file and line of a JSONL record (or
    a CSV row: line = row + 2 under the header), else the row of the table."""
    if source is not None:
        return source.locate
    origin = df["__source_row"] if "__source_row" in df.columns else None
    if kind == "csv":
        return lambda row: {"path": path, "line": int(origin[row] if origin is not None else row) + 2}
    return lambda row: {"path": path, "row": int(origin[row] if origin is not None else row)}


@plain_numpy_pages
def load_trace(
    path: str | os.PathLike,
    *,
    fmt: str = "auto",
    block_tokens: int | None = None,
    share_tenants: bool = False,
    workload: str | None = None,
    log: LogOptions | None = None,
) -> Trace:
    """Read a trace file of any supported format into canonical form.

    Parameters
    ----------
    path : path-like
        JSONL (optionally gzip- or zstd-compressed), a directory of JSONL shards,
        Parquet or CSV.
    fmt : str
        ``auto`` (detect from suffix and fields), ``mooncake``, ``bailian``, ``parquet``
        or ``csv``; ``tokens`` (a token-id request log) or ``openai`` (chat /
        completions request bodies), whose block ids are vLLM's prefix-cache hashes
        (read with ``log``), are never detected: name them.
    block_tokens : int, optional
        Tokens per block; defaults to the format's (512 Mooncake, 16 Bailian and vLLM's
        16 for request logs); required for generic tables.
    share_tenants : bool
        Treat equal hashes in different tenants as the same block.
    workload : str, optional
        The analysis that follows (``curve``, ``whatif``, ... see
        :mod:`kvtrace.ingest.guard`): refuse a trace whose run would not fit in the memory
        available, before the read when the metadata or a bounded first read show it
        clearly (:func:`kvtrace.ingest.guard.check_before_read`; decompression is bounded
        too), else before building the access table. None: no check.

    log : LogOptions, optional
        Field names, hash function and seed, tokenizer of a request log.

    Returns
    -------
    Trace
    """
    from kvtrace.ingest import prepared

    key = prepared.trace_key(path, _prepared_options(fmt, block_tokens, share_tenants, log))
    hit = prepared.fetch(key)
    if hit is not None:
        trace, counts = hit
        if workload is not None:  # the refusals of a build, in its order (the estimate, then the sizes)
            check_before_read(path, fmt, workload)
            check_sizes(workload, counts.accesses, counts.blocks, counts.requests, source=str(path))
        return trace
    df, meta, warn = load_requests(path, fmt=fmt, block_tokens=block_tokens, share_tenants=share_tenants,
                                   workload=workload, log=log)
    trace = build_trace(df, meta, warn)
    prepared.store_in_background(key, trace)
    return trace


def _prepared_options(fmt: str, block_tokens: int | None, share_tenants: bool, log: LogOptions | None) -> dict | None:
    """What of a load's options shapes the trace, as the key of a prepared trace
    (:mod:`kvtrace.ingest.prepared`); None: not prepared (a chat log, whose ids also
    depend on a tokenizer's files)."""
    log = log or LogOptions()
    if fmt == "openai" or log.tokenizer is not None or log.chat_template is not None:
        return None
    return {"fmt": fmt, "block_tokens": block_tokens, "share_tenants": bool(share_tenants),
            "log": dataclasses.asdict(log)}
