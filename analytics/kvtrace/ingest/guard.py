"""Resource guard: refuse, before the work starts, a run that would not fit in memory.

After the request table is read and validated, and before the access table is built,
:func:`check_memory` estimates the peak memory of the analysis that follows from the
trace's block accesses N, distinct blocks M and requests R::

    bytes ~ a x N + b x M + c x R

with per-command coefficients (:data:`PROFILES`): the slope of the command's peak
resident set size between two synthetic chat traces of different sizes. M is first
bounded by N; only when that bound does not fit are the
distinct blocks counted (one pass over the hashes, O(M) memory).

The run is refused, with a one-line error giving the estimate, the memory available
and what to do instead, when the estimate exceeds the memory budget
(:func:`kvtrace.trace.budget.memory_budget`: ``$KVTRACE_MEMORY_BUDGET``, else the memory
available counting the cgroup's limit), the same budget past which ``kvtrace curve``
streams a Parquet trace instead.

Before the read
---------------
Parsing costs memory too (the request table, and for a compressed trace its
decompressed bytes), so the check above comes too late for a trace that does not fit:
it would run out of memory parsing. :func:`check_before_read` runs first, from what is
known without the bulk read (:func:`estimate_read`):

- **Parquet**: the file metadata. Per row group, the hash list's leaf column chunk
  (``hash_ids.list.element``, ``block_ids...``) has ``num_values`` = its list elements
  = block accesses (exact, plus one per empty list); ``num_rows`` = requests.
- **JSONL**: the file size x the accesses and requests per byte measured on its first
  :data:`SAMPLE_BYTES` (complete lines only).
- **gzip / zstd JSONL**: the same, on the decompressed size estimated as the compressed
  size x the ratio measured on the first :data:`SAMPLE_BYTES` of output (a bomb shows
  its ratio at once).
- **a directory of shards**: the sum over its shards. CSV: no estimate (the
  post-parse check alone).

The estimate is the larger of the parse's peak (:data:`PARSE`: per access and request,
plus the source bytes held: a plain file's bytes, twice a compressed file's
decompressed bytes, which are joined) and the parsed table (:data:`TABLE`) plus the
analysis (:func:`estimate_bytes`, distinct blocks counted as 0: unknown before the
read, so the estimate is a lower bound there). **The rule**: refuse before the read
only when the estimate exceeds the memory available by :data:`PRE_READ_MARGIN`; the
post-parse check, which counts exactly, decides the rest.

And a hard bound, whatever the estimate said: while a command reads under the guard
(:func:`reading`), decompression stops with a one-line error naming the file once its
output exceeds half the memory available (:func:`decompressed_limit`; the output is
held twice while its pieces are joined).
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import json
import os
import zlib
from dataclasses import dataclass
from typing import Iterator

from kvtrace.errors import KvtraceError
from kvtrace.trace.budget import MEMORY_BUDGET_ENV, memory_budget
from kvtrace.units import format_bytes


@dataclass(frozen=True)
class Profile:
    """Peak bytes of a command per block access, per distinct block and per request
    (beyond the request table, which is in memory when the check runs)."""

    per_access: float
    per_block: float = 64.0
    per_request: float = 100.0
    what: str = ""


#: Per-command profiles (see the module docstring), by workload name.
PROFILES: dict[str, Profile] = {
    "ingest": Profile(18, 48, 0, "kvtrace ingest"),
    "stats": Profile(134, what="kvtrace stats"),
    "curve": Profile(56, what="an exact kvtrace curve"),
    "curve-sampled": Profile(36, what="a sampled kvtrace curve"),
    "curve-distances": Profile(150, what="kvtrace curve --distances-out"),
    "value": Profile(254, what="kvtrace value"),
    "whatif": Profile(48, 96, what="kvtrace whatif"),
    # every worker process receives the trace (2 workers: the default)
    "whatif-parallel": Profile(48 + 2 * 40, 96 + 2 * 64, what="kvtrace whatif (2 worker processes)"),
    "size": Profile(120, 96, what="kvtrace size"),
    "export": Profile(445, what="kvtrace export"),
    "sql": Profile(750, what="kvtrace sql on a trace (an in-memory database)"),
}
#: Peak of reading and validating a request table, beyond the source bytes held: the
#: peak resident set size after ``prepare_requests`` minus that after the imports, per
#: access (Parquet and JSONL, plain and gzip), rounded up.
PARSE = Profile(12, 0, 200, "reading the trace")
#: The parsed request table, held through the analysis: 8 bytes per hash; offsets and
#: ten columns per request.
TABLE = Profile(8, 0, 100, "the request table")
#: Refuse before the read only when the estimate exceeds the memory available by this
#: factor (the estimate samples, and counts distinct blocks as 0).
PRE_READ_MARGIN = 1.25
#: Bytes of a JSONL trace (of its decompressed output, when compressed) read to measure
#: its accesses and requests per byte and its compression ratio.
SAMPLE_BYTES = 4 << 20


def estimate_bytes(workload: str, accesses: int, blocks: int, requests: int) -> int:
    """Estimated peak bytes of ``workload`` on a trace of that size (beyond the request
    table); an unknown workload is costed like ``sql``, the heaviest."""
    p = PROFILES.get(workload, PROFILES["sql"])
    return int(p.per_access * accesses + p.per_block * blocks + p.per_request * requests)


def available_bytes() -> tuple[int | None, str]:
    """(bytes this run may use, where that figure comes from); (None, ...) when unknown:
    the one memory budget, :func:`kvtrace.trace.budget.memory_budget`."""
    return memory_budget()


def check_memory(df, meta, workload: str, *, source: str) -> None:
    """Refuse (:class:`~kvtrace.errors.KvtraceError`) a ``workload`` on a prepared
    request table whose estimated peak exceeds the memory available.

    Parameters
    ----------
    df : polars.DataFrame
        The validated request table (:func:`kvtrace.ingest.prepare_requests`).
    meta : TraceMeta
    workload : str
        A key of :data:`PROFILES`.
    source : str
        The trace's file, for the message.
    """
    room, where = available_bytes()
    if room is None:
        return
    n = int(df["block_ids"].list.len().sum() or 0)
    r = df.height
    need = estimate_bytes(workload, n, n, r)  # distinct blocks <= accesses
    if need <= room:
        return
    from kvtrace.ingest.canonical import distinct_blocks

    check_sizes(workload, n, distinct_blocks(df, meta), r, source=source)


def check_sizes(workload: str, n: int, m: int, r: int, *, source: str) -> None:
    """As :func:`check_memory`, for a trace whose sizes are known: ``n`` block accesses,
    ``m`` distinct blocks, ``r`` requests (a prepared trace's, :mod:`kvtrace.ingest.prepared`)."""
    room, where = available_bytes()
    if room is None:
        return
    need = estimate_bytes(workload, n, m, r)
    if need <= room:
        return
    what = PROFILES.get(workload, PROFILES["sql"]).what or f"kvtrace {workload}"
    raise KvtraceError(
        f"{what} of this trace needs about {format_bytes(need)} of memory ({n:,} block accesses, {m:,} distinct "
        f"blocks, {r:,} requests) but "
        + _room_text(room, where) + ": "
        + _advice(workload, n, m, r, room)
        + f"; or set {MEMORY_BUDGET_ENV}=SIZE to run it anyway",
        path=source,
    )


def _room_text(room: int, where: str) -> str:
    return (f"{MEMORY_BUDGET_ENV} allows {format_bytes(room)}" if where.startswith("$")
            else f"only {format_bytes(room)} is {where}")


# --------------------------------------------------------------------------- before the read
@dataclass(frozen=True)
class ReadEstimate:
    """What reading a trace will hold, estimated before the bulk read (:func:`estimate_read`).

    Attributes
    ----------
    accesses, requests : int
        Block accesses and requests (exact from Parquet metadata, else extrapolated).
    held_bytes : int
        Source bytes held while parsing: a plain JSONL file's size, twice the
        decompressed size of a compressed one, a Parquet file's decoded columns when
        they are not a request table.
    how : str
        Where the figures come from, for the message.
    """

    accesses: int
    requests: int
    held_bytes: int
    how: str

    def __add__(self, other: "ReadEstimate") -> "ReadEstimate":
        return ReadEstimate(self.accesses + other.accesses, self.requests + other.requests,
                            self.held_bytes + other.held_bytes, other.how)


def estimate_read(path: str | os.PathLike, fmt: str = "auto") -> ReadEstimate | None:
    """Accesses, requests and source bytes of a trace from its metadata and a bounded
    first read (see the module docstring), or None when there is no estimate (CSV; a
    file that is not what it says: its reader reports it)."""
    p = str(path)
    if os.path.isdir(p):
        if fmt in ("parquet", "csv"):
            return None
        from kvtrace.ingest.inputs import shard_files

        total = None
        for shard in shard_files(p)[0]:
            est = _jsonl_estimate(shard)
            if est is not None:
                total = est if total is None else total + est
        return None if total is None else ReadEstimate(total.accesses, total.requests, total.held_bytes,
                                                       "summed over its shards")
    if not os.path.isfile(p):  # a device, a FIFO: the readers decide
        return None
    lower = p.lower()
    if fmt == "parquet" or (fmt == "auto" and lower.endswith((".parquet", ".pq"))):
        return _parquet_estimate(p)
    if fmt == "csv" or (fmt == "auto" and lower.endswith((".csv", ".csv.gz"))):
        return None
    return _jsonl_estimate(p)


def parquet_list_values(md) -> tuple[int, bool]:
    """(values in the hash-list columns, whether the file has one) from a Parquet
    file's metadata (``pyarrow.parquet.FileMetaData``), reading no data: the values of
    a list column are its elements, so a request table's count is its block accesses."""
    from kvtrace.ingest.tabular import LIST_COLUMNS

    n, lists = 0, False
    for i in range(md.num_row_groups):
        rg = md.row_group(i)
        for j in range(rg.num_columns):
            c = rg.column(j)
            if c.path_in_schema.split(".")[0].lower() in LIST_COLUMNS:
                n += int(c.num_values)
                lists = True
    return n, lists


def _parquet_estimate(path: str) -> ReadEstimate | None:
    import pyarrow.parquet as pq

    try:
        md = pq.ParquetFile(path).metadata
    except Exception:  # pyarrow raises several types for a file that is not Parquet: its reader says so
        return None
    n, lists = parquet_list_values(md)
    if lists:
        return ReadEstimate(n, md.num_rows, 0, "from the Parquet metadata")
    # an exploded access table (one row per block): every column is decoded, 8 bytes a value
    return ReadEstimate(md.num_rows, 0, 8 * md.num_rows * md.num_columns, "from the Parquet metadata")


def _jsonl_estimate(path: str) -> ReadEstimate | None:
    from kvtrace.ingest.inputs import BOM, GZIP_MAGIC, ZSTD_MAGIC

    size = os.path.getsize(path)
    with open(path, "rb") as fh:
        head = fh.read(4)
    if head[:2] == GZIP_MAGIC or head == ZSTD_MAGIC:
        got = _decompressed_sample(path, head == ZSTD_MAGIC)
        if got is None:
            return None  # a corrupt stream: the reader names it
        sample, consumed, whole = got
        total = len(sample) if whole else int(len(sample) * size / max(consumed, 1))
        held, how = 2 * total, (f"{format_bytes(total)} decompressed: {format_bytes(size)} x the ratio "
                                f"{total / max(size, 1):,.0f} measured on its first {format_bytes(len(sample))}")
    else:
        with open(path, "rb") as fh:
            sample = fh.read(SAMPLE_BYTES)
        whole = len(sample) >= size
        total, held = size, size
        how = f"from its first {format_bytes(len(sample))}"
    if sample[:3] == BOM:
        sample = sample[3:]
    accesses, requests, sampled = _count_lines(sample, whole)
    scale = total / sampled if sampled else 0.0
    return ReadEstimate(int(accesses * scale), int(requests * scale), held, how)


def _count_lines(sample: bytes, whole: bool) -> tuple[int, int, int]:
    """(block accesses, requests, bytes) of the complete lines of a sample; a line that
    is not a record counts as a request without accesses (its reader reports it)."""
    end = len(sample) if whole else sample.rfind(b"\n") + 1
    accesses = requests = 0
    for line in sample[:end].splitlines():
        if not line.strip():
            continue
        requests += 1
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("hash_ids"), list):
            accesses += len(rec["hash_ids"])
    return accesses, requests, end


def _decompressed_sample(path: str, zstd: bool) -> tuple[bytes, int, bool] | None:
    """(the first :data:`SAMPLE_BYTES` of output, compressed bytes consumed for them,
    whether that is the whole stream), or None for a stream that cannot be read."""
    if zstd:
        import pyarrow as pa

        try:
            with open(path, "rb") as fh:
                raw = _SmallReads(fh)  # the decoder reads ahead otherwise: 64 KiB of a bomb is GBs
                with pa.CompressedInputStream(pa.PythonFile(raw, mode="r"), "zstd") as stream:
                    out = stream.read(SAMPLE_BYTES)
                    consumed = raw.consumed
                    whole = len(out) < SAMPLE_BYTES or not stream.read(1)
                return out, max(consumed, 1), whole
        except (OSError, ValueError):
            return None
    parts: list[bytes] = []
    got = fed = 0
    d = None
    try:
        with open(path, "rb") as fh:
            while got < SAMPLE_BYTES and (block := fh.read(1 << 16)):
                fed += len(block)
                while block and got < SAMPLE_BYTES:
                    if d is None:
                        if block[:2] != b"\x1f\x8b":
                            block = b""
                            break
                        d = zlib.decompressobj(wbits=31)
                    out = d.decompress(block, SAMPLE_BYTES - got)
                    parts.append(out)
                    got += len(out)
                    if d.eof:
                        block, d = d.unused_data, None
                    else:
                        block = d.unconsumed_tail
                fed -= len(block)  # input not yet decompressed
            whole = not fh.read(1) and d is None
    except (OSError, zlib.error):
        return None
    return b"".join(parts), max(fed, 1), whole


class _SmallReads(io.RawIOBase):
    """A file read 4 KiB at a time, counting the bytes handed out."""

    def __init__(self, fh) -> None:
        self._fh = fh
        self.consumed = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        data = self._fh.read(min(len(buf), 4096))
        buf[:len(data)] = data
        self.consumed += len(data)
        return len(data)


def check_before_read(path: str | os.PathLike, fmt: str, workload: str) -> None:
    """Refuse (:class:`~kvtrace.errors.KvtraceError` naming the file) a ``workload`` on
    a trace whose reading or analysis clearly would not fit in the memory available,
    before anything is parsed: the estimate (:func:`estimate_read`) exceeds it by
    :data:`PRE_READ_MARGIN`.

    Parameters
    ----------
    path : path-like
        The trace: a file or a directory of shards.
    fmt : str
        As given to :func:`kvtrace.ingest.load_requests`.
    workload : str
        A key of :data:`PROFILES`.
    """
    room, where = available_bytes()
    if room is None:
        return
    est = estimate_read(path, fmt)
    if est is None:
        return
    n, r = est.accesses, est.requests
    parse = _cost(PARSE, n, r) + est.held_bytes
    run = _cost(TABLE, n, r) + estimate_bytes(workload, n, 0, r)
    need = max(parse, run)
    if need <= room * PRE_READ_MARGIN:
        return
    what = PROFILES.get(workload, PROFILES["sql"]).what or f"kvtrace {workload}"
    fits = int(n * room / need) if n else 0
    raise KvtraceError(
        f"{what} of this trace needs about {format_bytes(need)} of memory, estimated before reading it "
        f"(about {n:,} block accesses and {r:,} requests; {est.how}) but {_room_text(room, where)}"
        + (f" (about {fits:,} block accesses would fit)" if fits else "") + ": "
        + _advice(workload, n, 0, r, room)
        + f"; or set {MEMORY_BUDGET_ENV}=SIZE to run it anyway",
        path=str(path),
    )


def _cost(p: Profile, accesses: int, requests: int) -> int:
    return int(p.per_access * accesses + p.per_request * requests)


# --------------------------------------------------------------------------- while reading
_READING: contextvars.ContextVar[str | None] = contextvars.ContextVar("kvtrace_guard_reading", default=None)


@contextlib.contextmanager
def reading(workload: str | None) -> Iterator[None]:
    """Read a trace for ``workload`` under the hard bound on decompressed bytes
    (:func:`decompressed_limit`); None: no bound (a library call without a check)."""
    token = _READING.set(workload)
    try:
        yield
    finally:
        _READING.reset(token)


def decompressed_limit() -> int | None:
    """Bytes a decompression may produce now: half the memory available while reading
    under :func:`reading` (the output is held twice while joined), else None."""
    if _READING.get() is None:
        return None
    room, _ = available_bytes()
    return None if room is None else room // 2


def decompression_refused(path: str, produced: int) -> KvtraceError:
    """The one-line error when a decompression passes :func:`decompressed_limit`."""
    workload = _READING.get() or "sql"
    room, where = available_bytes()
    what = PROFILES.get(workload, PROFILES["sql"]).what or f"kvtrace {workload}"
    return KvtraceError(
        f"decompresses to more than {format_bytes(produced)} (stopped there): {what} holds the decompressed trace "
        f"in memory, twice while reading it, but {_room_text(room or 0, where)}: "
        + _advice(workload, 0, 0, 0, 0)
        + f"; or set {MEMORY_BUDGET_ENV}=SIZE to run it anyway",
        path=path,
    )


def _advice(workload: str, n: int, m: int, r: int, room: int) -> str:
    """What to do instead, as a clause: only what would help."""
    tips = []
    if workload.startswith("curve"):
        if workload == "curve-distances":
            tips.append("drop --distances-out (it holds every access)")
        tips.append("try --stream (memory bounded by the distinct blocks; it reads Parquet: convert the trace "
                    "once with kvtrace ingest)")
        sampled = estimate_bytes("curve-sampled", n, m, r)
        if workload == "curve" and sampled <= room:
            tips.append(f"or --sample-rate 0.01 (about {format_bytes(sampled)})")
        return "; ".join(tips)
    if workload == "whatif-parallel" and estimate_bytes("whatif", n, m, r) <= room:
        tips.append(f"try --workers 1 (about {format_bytes(estimate_bytes('whatif', n, m, r))})")
    tips.append("this command holds the whole trace in memory: analyse a part of it (a time window, or fewer "
                "shards)")
    return "; ".join(tips)
