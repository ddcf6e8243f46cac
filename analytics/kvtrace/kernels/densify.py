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

from ..config import NJIT

_EMPTY = -1
#: Largest hash value (exclusive) the direct method indexes (64 Mi entries of int64).
DIRECT_LIMIT = 1 << 26
_LOAD = 0.5


@njit(**NJIT)
def _mix(h, ns):
    # splitmix64 finaliser over the hash xor'ed with a spread namespace code
    x = h ^ (np.uint64(ns + 1) * np.uint64(0x9E3779B97F4A7C15))
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class DensifyState:
    """Hash table + per-block arrays, grown as needed between chunks."""

    def __init__(self, expected_blocks: int = 1 << 16) -> None:
        expected = max(int(expected_blocks), 1024)
        cap = 1 << max(12, int(np.ceil(np.log2(expected / _LOAD))))
        self.slot_hash = np.zeros(cap, dtype=np.uint64)
        self.slot_ns = np.zeros(cap, dtype=np.int32)
        self.slot_id = np.full(cap, _EMPTY, dtype=np.int64)
        self.n_blocks = 0
        self.block_hash = np.empty(expected, dtype=np.uint64)
        self.block_ns = np.empty(expected, dtype=np.int32)
        self.block_size = np.zeros(expected, dtype=np.int64)

    def reserve(self, more: int) -> None:
        """Make room for ``more`` new blocks without a rehash inside the kernel."""
        need = self.n_blocks + int(more)
        if self.slot_id is None:
            self.slot_id = np.zeros(1, dtype=np.int64)  # forces a rebuild below
        if need > self.block_hash.shape[0]:
            new_len = max(need, 2 * self.block_hash.shape[0])
            for name in ("block_hash", "block_ns", "block_size"):
                old = getattr(self, name)
                grown = np.zeros(new_len, dtype=old.dtype)
                grown[: self.n_blocks] = old[: self.n_blocks]
                setattr(self, name, grown)
        if need > _LOAD * self.slot_id.shape[0] or self.slot_id.shape[0] == 1:
            cap = max(self.slot_id.shape[0], 1 << 12)
            while need > _LOAD * cap:
                cap *= 2
            self.slot_hash = np.zeros(cap, dtype=np.uint64)
            self.slot_ns = np.zeros(cap, dtype=np.int32)
            self.slot_id = np.full(cap, _EMPTY, dtype=np.int64)
            _rehash(self.block_hash, self.block_ns, self.n_blocks, self.slot_hash, self.slot_ns, self.slot_id)

    def arrays(self):
        m = self.n_blocks
        return self.block_hash[:m], self.block_ns[:m], self.block_size[:m]


@njit(**NJIT)
def _rehash(block_hash, block_ns, n_blocks, slot_hash, slot_ns, slot_id):
    mask = np.uint64(slot_id.shape[0] - 1)
    for i in range(n_blocks):
        j = _mix(block_hash[i], block_ns[i]) & mask
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
        j = _mix(h, k) & mask
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
def _direct(hashes, ns, n_ns, tokens, table, out):
    """Dense ids through a table indexed by (hash, namespace); returns per-id arrays."""
    n_blocks = 0
    for t in range(hashes.shape[0]):
        key = np.int64(hashes[t]) * n_ns + (ns[t] + 1)
        i = table[key]
        if i < 0:
            i = n_blocks
            table[key] = i
            n_blocks += 1
        out[t] = i
    block_hash = np.empty(n_blocks, dtype=np.uint64)
    block_ns = np.empty(n_blocks, dtype=np.int32)
    block_size = np.zeros(n_blocks, dtype=np.int64)
    for t in range(hashes.shape[0]):
        i = out[t]
        block_hash[i] = hashes[t]
        block_ns[i] = ns[t]
        if tokens[t] > block_size[i]:
            block_size[i] = tokens[t]
    return block_hash, block_ns, block_size


def densify(hashes, ns, tokens, state: DensifyState | None = None, chunk: int = 1 << 22):
    """Dense ids for a stream of (hash, namespace) keys, in order of first appearance.

    Parameters
    ----------
    hashes : uint64[N]
    ns : int32[N]
        Namespace per access (tenant code; -1 when there is none or it is shared).
    tokens : int32[N]
        Tokens of each access; a block's size is the max over its accesses.
    state : DensifyState, optional
        Carry a table across calls (streaming); a new one is made otherwise.

    Returns
    -------
    ids : int64[N]
    state : DensifyState
        ``state.arrays()`` gives (hash, namespace, size) per dense id.
    """
    hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
    ns = np.ascontiguousarray(ns, dtype=np.int32)
    tokens = np.ascontiguousarray(tokens)
    n = hashes.shape[0]
    out = np.empty(n, dtype=np.int64)
    if state is None and n:
        top = int(hashes.max())
        n_ns = int(ns.max()) + 2  # namespaces -1..max
        if int(ns.min()) >= -1 and top < 4 * n + 1024 and (top + 1) * n_ns <= DIRECT_LIMIT:
            table = np.full((top + 1) * n_ns, -1, dtype=np.int32 if n < 2**31 else np.int64)
            block_hash, block_ns, block_size = _direct(hashes, ns, n_ns, tokens, table, out)
            del table
            state = DensifyState.__new__(DensifyState)
            state.block_hash, state.block_ns, state.block_size = block_hash, block_ns, block_size
            state.n_blocks = block_hash.shape[0]
            state.slot_id = None  # the hash table is built if a later chunk needs it
            return out, state
    if state is None:
        state = DensifyState(min(n, 1 << 20))
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        state.reserve(hi - lo)
        state.n_blocks = densify_chunk(
            hashes[lo:hi], ns[lo:hi], tokens[lo:hi], state.slot_hash, state.slot_ns, state.slot_id,
            state.block_hash, state.block_ns, state.block_size, state.n_blocks, out[lo:hi],
        )
    return out, state
