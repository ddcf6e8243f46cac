"""Dense block ids in order of first appearance.

Two exact methods, chosen per trace:

- *direct*: when hashes are small non-negative integers (the public Mooncake and
  Qwen-Bailian traces number their blocks 0, 1, 2, ...) and there are no namespaces,
  an array indexed by the hash maps it to its dense id: one pass, no hashing.
- *hash table*: open addressing with linear probing over (64-bit hash, int32
  namespace) keys stored inline in the table, so a lookup touches one cache line.
  Keys are compared exactly (no fingerprinting): two distinct keys never share an id.

State is carried across chunks (streaming), so memory is O(distinct blocks).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT
from kvtrace.kernels.memory import table_full, table_zeros

_EMPTY = -1
#: Most entries of a direct table (64 Mi int32 = 256 MiB).
DIRECT_LIMIT = 1 << 26
_LOAD = 0.5
#: Most distinct blocks: ids are int32 in the lookup tables (a hash-table slot is 16
#: bytes, at most 2 slots per block), as in a streamed trace's spill file.
MAX_BLOCKS = int(np.iinfo(np.int32).max)


@njit(**NJIT)
def mix_hash(h, ns):
    # splitmix64 finaliser over the hash xor'ed with a spread namespace code
    x = h ^ (np.uint64(ns + 1) * np.uint64(0x9E3779B97F4A7C15))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class DensifyState:
    """Per-block arrays and the lookup structure (direct table or hash table),
    grown as needed between chunks."""

    def __init__(self, expected_blocks: int = 1 << 16, direct_size: int = 0, n_ns: int = 1) -> None:
        expected = max(int(expected_blocks), 1024)
        self.n_blocks = 0
        self.block_hash = np.empty(expected, dtype=np.uint64)
        self.block_ns = np.empty(expected, dtype=np.int32)
        self.block_size = np.zeros(expected, dtype=np.int64)
        self.n_ns = int(n_ns)
        #: direct table indexed by hash * n_ns + ns + 1 (None: hash-table mode)
        self.direct = table_full(direct_size, -1, np.int32) if direct_size else None
        if self.direct is None:
            cap = 1 << max(12, int(np.ceil(np.log2(expected / _LOAD))))
            self._new_table(cap)
        else:
            self.slot_id = None

    def _new_table(self, cap: int) -> None:
        # the hash table is read at random: huge pages (kvtrace.kernels.memory)
        self.slot_hash = table_zeros(cap, np.uint64)
        self.slot_ns = table_zeros(cap, np.int32)
        self.slot_id = table_full(cap, _EMPTY, np.int32)

    def fits_direct(self, top: int, ns_max: int) -> bool:
        return self.direct is not None and ns_max + 2 <= self.n_ns and (top + 1) * self.n_ns <= self.direct.shape[0]

    def reserve(self, more: int) -> None:
        """Make room for ``more`` new blocks without growing anything inside the kernel."""
        need = self.n_blocks + int(more)
        if need > self.block_hash.shape[0]:
            new_len = max(need, 2 * self.block_hash.shape[0])
            for name in ("block_hash", "block_ns", "block_size"):
                old = getattr(self, name)
                grown = np.zeros(new_len, dtype=old.dtype)
                grown[: self.n_blocks] = old[: self.n_blocks]
                setattr(self, name, grown)
        if self.direct is not None:
            return
        if self.slot_id is None or need > _LOAD * self.slot_id.shape[0]:
            cap = 1 << 12 if self.slot_id is None else self.slot_id.shape[0]
            while need > _LOAD * cap:
                cap *= 2
            self._new_table(cap)
            _rehash(self.block_hash, self.block_ns, self.n_blocks, self.slot_hash, self.slot_ns, self.slot_id)

    def to_hash_table(self) -> None:
        """Leave direct mode (a later key does not fit the table)."""
        self.direct = None
        self.slot_id = None

    def arrays(self):
        m = self.n_blocks
        return self.block_hash[:m], self.block_ns[:m], self.block_size[:m]


@njit(**NJIT)
def _rehash(block_hash, block_ns, n_blocks, slot_hash, slot_ns, slot_id):
    mask = np.uint64(slot_id.shape[0] - 1)
    for i in range(n_blocks):
        j = mix_hash(block_hash[i], block_ns[i]) & mask
        while slot_id[j] != _EMPTY:
            j = (j + np.uint64(1)) & mask
        slot_hash[j] = block_hash[i]
        slot_ns[j] = block_ns[i]
        slot_id[j] = i


@njit(**NJIT)
def densify_chunk(hashes, ns, tokens, slot_hash, slot_ns, slot_id, block_hash, block_ns, block_size,
                  n_blocks, out):
    """Assign dense ids to one chunk of accesses; returns the new block count.

    ``ns`` is the namespace (tenant code, or -1) per access. ``block_size[id]``
    becomes the max tokens seen for that block. The caller must have reserved room
    for ``len(hashes)`` new blocks.
    """
    mask = np.uint64(slot_id.shape[0] - 1)
    for t in range(hashes.shape[0]):
        h = hashes[t]
        k = ns[t]
        j = mix_hash(h, k) & mask
        while True:
            i = slot_id[j]
            if i == _EMPTY:
                i = n_blocks
                slot_hash[j] = h
                slot_ns[j] = k
                slot_id[j] = i
                block_hash[i] = h
                block_ns[i] = k
                block_size[i] = 0
                n_blocks += 1
                break
            if slot_hash[j] == h and slot_ns[j] == k:
                break
            j = (j + np.uint64(1)) & mask
        out[t] = i
        if tokens[t] > block_size[i]:
            block_size[i] = tokens[t]
    return n_blocks


@njit(**NJIT)
def densify_direct_chunk(hashes, ns, n_ns, tokens, table, block_hash, block_ns, block_size, n_blocks, out):
    """Like :func:`densify_chunk`, through a table indexed by ``hash * n_ns + ns + 1``."""
    for t in range(hashes.shape[0]):
        key = np.int64(hashes[t]) * n_ns + (ns[t] + 1)
        i = table[key]
        if i < 0:
            i = n_blocks
            table[key] = i
            block_hash[i] = hashes[t]
            block_ns[i] = ns[t]
            block_size[i] = 0
            n_blocks += 1
        out[t] = i
        if tokens[t] > block_size[i]:
            block_size[i] = tokens[t]
    return n_blocks


def densify(hashes, ns, tokens, state: DensifyState | None = None, chunk: int = 1 << 22,
            top: int | None = None, ns_max: int | None = None, total: int | None = None):
    """Dense ids for a stream of (hash, namespace) keys, in order of first appearance.

    Parameters
    ----------
    hashes : uint64[N]
    ns : int32[N]
        Namespace per access (tenant code; -1 when there is none or it is shared).
    tokens : int32[N]
        Tokens of each access; a block's size is the max over its accesses.
    state : DensifyState, optional
        Carry the lookup across calls (streaming); a new one is made otherwise.
    top, ns_max, total : int, optional
        Largest hash and namespace, and length, of the whole stream, when a caller
        streaming chunks knows them: they let the first call choose the direct method
        for all chunks.

    Returns
    -------
    ids : int64[N]
    state : DensifyState
        ``state.arrays()`` gives (hash, namespace, size) per dense id.

    Raises
    ------
    OverflowError
        More than :data:`MAX_BLOCKS` distinct blocks.
    """
    hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
    ns = np.ascontiguousarray(ns, dtype=np.int32)
    tokens = np.ascontiguousarray(tokens)
    n = hashes.shape[0]
    out = np.empty(n, dtype=np.int64)
    if n == 0:
        return out, state if state is not None else DensifyState()
    chunk_top = int(hashes.max())
    chunk_ns = int(ns.max())
    if int(ns.min()) < -1:
        raise ValueError("namespaces must be >= -1")
    if state is None:
        top = chunk_top if top is None else max(int(top), chunk_top)
        n_ns = (chunk_ns if ns_max is None else max(int(ns_max), chunk_ns)) + 2
        # a table of at most ~2 int32 entries per access, so memory stays O(input)
        if (top + 1) * n_ns <= min(DIRECT_LIMIT, 2 * max(n, total or 0) + 1024):
            state = DensifyState(min(n, 1 << 20), direct_size=(top + 1) * n_ns, n_ns=n_ns)
        else:
            state = DensifyState(min(n, 1 << 20))
    if state.direct is not None and not state.fits_direct(chunk_top, chunk_ns):
        state.to_hash_table()
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        state.reserve(hi - lo)
        if state.direct is not None:
            state.n_blocks = densify_direct_chunk(
                hashes[lo:hi], ns[lo:hi], state.n_ns, tokens[lo:hi], state.direct,
                state.block_hash, state.block_ns, state.block_size, state.n_blocks, out[lo:hi],
            )
        else:
            state.n_blocks = densify_chunk(
                hashes[lo:hi], ns[lo:hi], tokens[lo:hi], state.slot_hash, state.slot_ns, state.slot_id,
                state.block_hash, state.block_ns, state.block_size, state.n_blocks, out[lo:hi],
            )
        if state.n_blocks > MAX_BLOCKS:  # a table id wrapped: no id of this chunk on is certain
            raise OverflowError(f"more than {MAX_BLOCKS:,} distinct blocks")
    return out, state
