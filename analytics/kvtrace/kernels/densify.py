"""Dense block ids in order of first appearance, with an open-addressing hash table.

The table maps a block key (64-bit hash, int32 namespace) to a dense id 0..M-1. Keys
are compared exactly (no fingerprinting), so two distinct keys never share an id.
State is carried across chunks, so memory is O(distinct blocks).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..config import NJIT

_EMPTY = -1


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
        cap = 1 << max(16, int(np.ceil(np.log2(max(expected_blocks, 1) / 0.6))))
        self.slot_id = np.full(cap, _EMPTY, dtype=np.int64)
        self.n_blocks = 0
        self.block_hash = np.empty(max(expected_blocks, 1024), dtype=np.uint64)
        self.block_ns = np.empty(max(expected_blocks, 1024), dtype=np.int32)
        self.block_size = np.zeros(max(expected_blocks, 1024), dtype=np.int64)

    def reserve(self, more: int) -> None:
        """Make room for ``more`` new blocks without a rehash inside the kernel."""
        need = self.n_blocks + int(more)
        if need > self.block_hash.shape[0]:
            new_len = max(need, 2 * self.block_hash.shape[0])
            for name in ("block_hash", "block_ns", "block_size"):
                old = getattr(self, name)
                grown = np.zeros(new_len, dtype=old.dtype)
                grown[: self.n_blocks] = old[: self.n_blocks]
                setattr(self, name, grown)
        if need > 0.6 * self.slot_id.shape[0]:
            cap = self.slot_id.shape[0]
            while need > 0.6 * cap:
                cap *= 2
            self.slot_id = _rehash(self.block_hash, self.block_ns, self.n_blocks, cap)

    def arrays(self):
        m = self.n_blocks
        return self.block_hash[:m], self.block_ns[:m], self.block_size[:m]


@njit(**NJIT)
def _rehash(block_hash, block_ns, n_blocks, cap):
    slot_id = np.full(cap, _EMPTY, dtype=np.int64)
    mask = np.uint64(cap - 1)
    for i in range(n_blocks):
        j = _mix(block_hash[i], block_ns[i]) & mask
        while slot_id[j] != _EMPTY:
            j = (j + np.uint64(1)) & mask
        slot_id[j] = i
    return slot_id


@njit(**NJIT)
def densify_chunk(hashes, ns, tokens, slot_id, block_hash, block_ns, block_size, n_blocks, out):
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
                slot_id[j] = i
                block_hash[i] = h
                block_ns[i] = k
                block_size[i] = 0
                n_blocks += 1
                break
            if block_hash[i] == h and block_ns[i] == k:
                break
            j = (j + np.uint64(1)) & mask
        out[t] = i
        if tokens[t] > block_size[i]:
            block_size[i] = tokens[t]
    return n_blocks


def densify(hashes, ns, tokens, state: DensifyState | None = None, chunk: int = 1 << 21):
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
    """
    hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
    ns = np.ascontiguousarray(ns, dtype=np.int32)
    tokens = np.ascontiguousarray(tokens, dtype=np.int64)
    if state is None:
        state = DensifyState(min(hashes.shape[0], 1 << 20))
    out = np.empty(hashes.shape[0], dtype=np.int64)
    for lo in range(0, hashes.shape[0], chunk):
        hi = min(lo + chunk, hashes.shape[0])
        state.reserve(hi - lo)
        state.n_blocks = densify_chunk(
            hashes[lo:hi], ns[lo:hi], tokens[lo:hi], state.slot_id,
            state.block_hash, state.block_ns, state.block_size, state.n_blocks, out[lo:hi],
        )
    return out, state
