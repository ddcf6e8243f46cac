"""Numba kernels of :mod:`kvtrace.ingest.vllm_hash`: the serialised bytes of blocks.

They write, for every block of a chunk, the exact bytes that vLLM's hash function feeds
to SHA-256 (pickle protocol 5 or canonical CBOR of ``(parent, tuple(tokens),
extra_keys)``), leaving the parent digest of non-first blocks to the sequential hashing
loop. Plain arrays in and out; the slow twin is ``pickle.dumps`` / ``cbor2.dumps`` of the
real tuple (tests/test_tokens_twin.py).

Pickle, per block (C pickler, protocol 5, one frame)::

    80 05 | 95 <frame length: u64 LE> | 43 20 <parent: 32 bytes> 94 |
    [28 if > 3 tokens] <token opcodes> <74, or 85/86/87 for 1-3 tokens> | <tail>

with a token ``v`` as ``4b v`` (v < 256), ``4d <u16 LE>`` (v < 65536) or ``4a <i32 LE>``.
CBOR, per block::

    83 | 58 20 <parent> | <array head of n tokens> <unsigned ints> | <tail>

The tail (memo opcode, extra keys, closing opcodes) is given per block as bytes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT, NJIT_INLINE

#: Bytes before the token tuple: pickle header + parent + MEMOIZE; CBOR header + parent.
PICKLE_AFTER_PARENT = 46
CBOR_AFTER_PARENT = 35
PICKLE_PARENT_AT = 13
CBOR_PARENT_AT = 3


@njit(**NJIT_INLINE)
def _cbor_len(v):
    if v < 24:
        return 1
    if v < 256:
        return 2
    if v < 65536:
        return 3
    return 5


@njit(**NJIT_INLINE)
def _cbor_head(buf, q, major, v):
    if v < 24:
        buf[q] = np.uint8(major | v)
        return q + 1
    if v < 256:
        buf[q] = np.uint8(major | 24)
        buf[q + 1] = np.uint8(v)
        return q + 2
    if v < 65536:
        buf[q] = np.uint8(major | 25)
        buf[q + 1] = np.uint8(v >> 8)
        buf[q + 2] = np.uint8(v & 0xFF)
        return q + 3
    buf[q] = np.uint8(major | 26)
    buf[q + 1] = np.uint8((v >> 24) & 0xFF)
    buf[q + 2] = np.uint8((v >> 16) & 0xFF)
    buf[q + 3] = np.uint8((v >> 8) & 0xFF)
    buf[q + 4] = np.uint8(v & 0xFF)
    return q + 5


@njit(**NJIT)
def block_lengths(tokens, bstart, bcount, tail_len, pickle_mode):
    """int64 [n]: serialised length in bytes of each block (tokens in [0, 2^31))."""
    n = bstart.shape[0]
    out = np.empty(n, dtype=np.int64)
    for k in range(n):
        c = bcount[k]
        size = 0
        for t in range(bstart[k], bstart[k] + c):
            v = tokens[t]
            if pickle_mode:
                size += 2 if v < 256 else (3 if v < 65536 else 5)
            else:
                size += _cbor_len(v)
        if pickle_mode:
            size += PICKLE_AFTER_PARENT + (1 if c > 3 else 0) + 1
        else:
            size += CBOR_AFTER_PARENT + _cbor_len(c)
        out[k] = size + tail_len[k]
    return out


@njit(**NJIT)
def fill_blocks(buf, boff, tokens, bstart, bcount, first, tails, toff, btail, root, pickle_mode):
    """Write each block's serialisation at ``buf[boff[k]:boff[k+1]]``; the parent slot
    holds ``root`` (NONE_HASH) for first blocks and is left for the caller otherwise."""
    n = bstart.shape[0]
    for k in range(n):
        o = boff[k]
        c = bcount[k]
        if pickle_mode:
            buf[o] = 0x80
            buf[o + 1] = 5
            buf[o + 2] = 0x95
            frame = boff[k + 1] - o - 11
            for i in range(8):
                buf[o + 3 + i] = np.uint8((frame >> (8 * i)) & 0xFF)
            buf[o + 11] = 0x43
            buf[o + 12] = 0x20
            p = o + PICKLE_PARENT_AT
            buf[o + 45] = 0x94
            q = o + PICKLE_AFTER_PARENT
            if c > 3:
                buf[q] = 0x28
                q += 1
        else:
            buf[o] = 0x83
            buf[o + 1] = 0x58
            buf[o + 2] = 0x20
            p = o + CBOR_PARENT_AT
            q = _cbor_head(buf, o + CBOR_AFTER_PARENT, 0x80, c)
        if first[k]:
            for i in range(32):
                buf[p + i] = root[i]
        for t in range(bstart[k], bstart[k] + c):
            v = tokens[t]
            if pickle_mode:
                if v < 256:
                    buf[q] = 0x4B
                    buf[q + 1] = np.uint8(v)
                    q += 2
                elif v < 65536:
                    buf[q] = 0x4D
                    buf[q + 1] = np.uint8(v & 0xFF)
                    buf[q + 2] = np.uint8(v >> 8)
                    q += 3
                else:
                    buf[q] = 0x4A
                    buf[q + 1] = np.uint8(v & 0xFF)
                    buf[q + 2] = np.uint8((v >> 8) & 0xFF)
                    buf[q + 3] = np.uint8((v >> 16) & 0xFF)
                    buf[q + 4] = np.uint8((v >> 24) & 0xFF)
                    q += 5
            else:
                q = _cbor_head(buf, q, 0, v)
        if pickle_mode:
            buf[q] = np.uint8(0x74 if c > 3 else 0x84 + c)
            q += 1
        tid = btail[k]
        for i in range(toff[tid], toff[tid + 1]):
            buf[q] = tails[i]
            q += 1
