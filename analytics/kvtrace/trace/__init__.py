"""The canonical trace: request table + access table (DESIGN §1).

A :class:`Trace` holds

- ``requests``: the canonical request table (Polars, one row per request, in trace
  order: sorted by timestamp, stable on file order). Row index = request index.
- ``accesses``: the canonical access table as plain numpy arrays (the kernels'
  input), one entry per block access in trace order.
- per dense block id: its source hash, its tenant code and its size in tokens.

Bytes are never stored: bytes = tokens x kv_bytes_per_token, so one trace serves every
model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from kvtrace.trace.source import ChunkedSource, Column, request_chunks  # noqa: F401 (request_chunks: re-exported)

#: Columns of the canonical request table, in order, with their Polars types.
REQUEST_SCHEMA: dict[str, pl.DataType] = {
    "request_id": pl.Int64,
    "timestamp": pl.Float64,  # seconds from trace start
    "session_id": pl.Int64,  # nullable
    "parent_id": pl.Int64,  # nullable
    "turn": pl.Int64,  # nullable
    "type": pl.String,  # nullable
    "tenant": pl.String,  # nullable; a namespace for block hashes
    "input_tokens": pl.Int64,
    "output_tokens": pl.Int64,
    "block_ids": pl.List(pl.UInt64),  # chained prefix hashes
}
#: Optional request columns: kept after ``REQUEST_SCHEMA``'s, in this order, only when the
#: source gives them (a table without them is a complete canonical table).
OPTIONAL_REQUEST_SCHEMA: dict[str, pl.DataType] = {
    "end_timestamp": pl.Float64,  # when the request finished, seconds on the timestamp's clock; null: unknown
}


def index_dtype(n: int):
    """The narrower of int32 / int64 that holds every index and count below ``n``."""
    return np.int32 if n <= np.iinfo(np.int32).max else np.int64


@dataclass(frozen=True)
class TraceMeta:
    """Trace-level metadata, stored in the canonical Parquet key-value metadata.

    Attributes
    ----------
    block_tokens : int
        Tokens per full block (512 for Mooncake, 16 for Qwen-Bailian).
    source_format : str
        ``mooncake``, ``bailian``, ``parquet``, ``csv`` or ``canonical``.
    source : str
        File name the trace was read from.
    model : str or None
        Model the trace was recorded with, when known.
    share_tenants : bool
        Whether equal hashes in different tenants are the same block.
    """

    block_tokens: int
    source_format: str
    source: str = ""
    model: str | None = None
    share_tenants: bool = False

    def to_dict(self) -> dict:
        return {
            "block_tokens": self.block_tokens,
            "source_format": self.source_format,
            "source": self.source,
            "model": self.model,
            "share_tenants": self.share_tenants,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "TraceMeta":
        return cls(
            block_tokens=int(d["block_tokens"]),
            source_format=str(d.get("source_format", "canonical")),
            source=str(d.get("source", "")),
            model=d.get("model"),
            share_tenants=bool(d.get("share_tenants", False)),
        )


@dataclass
class Accesses:
    """The canonical access table (DESIGN §1) as numpy arrays, in trace order.

    Attributes
    ----------
    request : int64[N]
        Row index of the request in ``Trace.requests``.
    pos : int32[N]
        Block index inside the request (0 = first block of the prompt).
    block : int64[N]
        Dense block id, 0..M-1, assigned in order of first appearance.
    tokens : int32[N]
        Tokens of this block in this request (the last block may be partial:
        ``input_tokens - B*(n-1)`` clamped to [1, B]).
    req_start : int64[R+1]
        Offsets: the accesses of request r are ``req_start[r]:req_start[r+1]``.
    """

    request: np.ndarray
    pos: np.ndarray
    block: np.ndarray
    tokens: np.ndarray
    req_start: np.ndarray

    def __len__(self) -> int:
        return int(self.block.shape[0])


@dataclass
class Trace(ChunkedSource):
    """A trace in canonical form, held in memory: a :class:`kvtrace.trace.source.TraceSource`
    whose chunks are views of its arrays. See the module docstring."""

    requests: pl.DataFrame
    accesses: Accesses
    block_hash: np.ndarray  # uint64[M]: source hash of each dense block id
    block_tenant: np.ndarray  # int32[M]: tenant code of each block (-1: none/shared)
    block_size: np.ndarray  # int64[M]: tokens a block occupies in a cache (max over its accesses)
    meta: TraceMeta
    warnings: list[str] = field(default_factory=list)

    @property
    def n_requests(self) -> int:
        return self.requests.height

    @property
    def req_start(self) -> np.ndarray:
        """int64[R+1]: the accesses of request r are ``req_start[r]:req_start[r+1]``."""
        return self.accesses.req_start

    @property
    def n_accesses(self) -> int:
        return len(self.accesses)

    @property
    def n_blocks(self) -> int:
        return int(self.block_hash.shape[0])

    @property
    def request_timestamp(self) -> np.ndarray:
        """float64[R]: request arrival, seconds from trace start."""
        return self.requests["timestamp"].to_numpy()

    @property
    def access_timestamp(self) -> np.ndarray:
        """float64[N]: arrival of the request each access belongs to (seconds)."""
        return self.request_timestamp[self.accesses.request]

    @property
    def duration(self) -> float:
        """Seconds from the first to the last arrival."""
        ts = self.request_timestamp
        return float(ts[-1] - ts[0]) if ts.size else 0.0

    # the TraceSource protocol (kvtrace.trace.source)
    spill = None  # held in memory: nothing spills

    def _block_reader(self):
        block = self.accesses.block
        return lambda lo, hi: block[lo:hi]

    def first_blocks(self) -> np.ndarray:
        """int64[R]: the first block of each request (-1 for a request without blocks)."""
        rs = self.accesses.req_start
        first = np.full(rs.shape[0] - 1, -1, dtype=np.int64)
        has = rs[1:] > rs[:-1]
        first[has] = self.accesses.block[rs[:-1][has]]
        return first

    def _layout(self, r: int, r_end: int, lo: int, local_req: bool = True):
        a = self.accesses
        hi = int(a.req_start[r_end])
        return (a.req_start[r:r_end + 1] - lo, a.tokens[lo:hi], a.pos[lo:hi],
                a.request[lo:hi] - r if local_req else None)

    def column(self, name: str, dtype) -> Column:
        """A per-access column for a later pass (a numpy array)."""
        return Column(self.n_accesses, dtype)

    def close(self) -> None:
        """Nothing to release (a streamed source removes its spill files)."""

    def access_table(self) -> pl.DataFrame:
        """The canonical access table as a Polars DataFrame.

        Columns: ``t`` (access index), ``request``, ``pos``, ``block``, ``tokens``,
        ``timestamp`` (seconds).
        """
        a = self.accesses
        return pl.DataFrame(
            {
                "t": np.arange(len(a), dtype=np.int64),
                "request": a.request,
                "pos": a.pos,
                "block": a.block,
                "tokens": a.tokens,
                "timestamp": self.access_timestamp,
            }
        )
