"""Exact event simulation of a DRAM tier over flash tiers (DESIGN §2 "Tier simulator").

Everything here is in **tokens** (bytes = tokens x kv_bytes_per_token) and indexed by
dense block id; no hashing on the hot path. The public wrapper is
:func:`kvtrace.analyses.whatif.simulate`; this module is arrays in, arrays out. The slow twin
``tests/naive_tiers.py`` is the executable specification of everything below.

Tiers and lists
---------------
Each node ``n`` has a DRAM tier (list ``n``) and optionally a local SSD (list
``N + n``); all nodes share one flash pool (the last list). A tier is a doubly
linked list over block ids (entry ``st[b, _LIST0 + L] = prev, next, insert time,
last-touch time``, int32; sentinel row ``M``: ``next`` = least recent, ``prev`` = most recent)
plus a token counter, so every event is O(1). ``prev = -1`` means "not in this tier".
Row ``b`` also holds the block's state and size, so what an access reads shares one
64-byte cache line (:func:`_state`). Memory: ``16 x S x (M + 1)`` bytes with S =
``2 + N x (1 + has_local) + has_flash`` rounded up to a multiple of 4: 64 bytes per
distinct block for one node (N <= 64 nodes: at most ~2 KB per distinct block).
Block and request indices are int32 (< 2**31); access indices are local to a chunk.

Chunks
------
:class:`TierSimulator` carries all of this state between calls, so a trace can be fed
in chunks of whole requests (:mod:`kvtrace.ingest.stream`: the accesses never all in memory)
with the results of one call over the whole trace, bit for bit: what a later access
needs of an earlier one (the request and the admission inputs of the block's last
access) is kept per block, and the per-chunk float sums are sums of integers.

Decisions
---------
Each access is decided against the tiers of its request's node: ``DRAM`` (0) if the
block is in the node's DRAM, else ``LOCAL`` (1) if in its local SSD, else ``FLASH`` (2)
if in the shared flash, else ``MISS`` (3). *Prefix-aware* (request-atomic, as
:mod:`kvtrace.kernels.stackdist`): all accesses of a request are decided against the
state at its arrival, then its blocks are touched; *flat*: each access is decided, then
touched.

Touches
-------
A touch group is a request (prefix-aware) or one access (flat). Each distinct block of
the group is touched once, at its first position (in the stack model the last touch,
tail-first, wins: same final order), in two passes, both tail-first:

1. *pin*: a block in DRAM is unlinked (it is in use: it cannot be a victim while the
   group's blocks are inserted); a flash hit (LOCAL/FLASH) is, with ``promote``,
   removed from its flash tier (a move), with ``copy``/``none`` read in place (its last
   touch updated; moved to most recent when that tier is LRU).
2. *insert*: DRAM and MISS blocks, and flash hits unless promotion is ``none``, are
   linked at DRAM's most-recent end (a pinned block keeps its insert time). A flash
   hit larger than DRAM is never promoted (pass 1 reads it in place). Under
   write-through a MISS is written to the first flash tier below DRAM (the local SSD
   if any, else the shared flash). After each insert the least-recent DRAM blocks are
   evicted until DRAM fits; under write-on-evict each victim is written to the first
   flash tier. A local-SSD victim is written to the shared flash; a shared-flash victim
   is dropped. A MISS larger than DRAM passes through it (counted as inserted and
   evicted at once: write-on-evict still offers it to flash).

Pinned blocks become victims only when the group alone overflows DRAM (its tail blocks
first, as in the stack model). Hence with one block size, admit-all, ``promote`` and
write-on-evict, DRAM + local + flash is exactly one LRU of ``C_d + C_l + C_f`` (for
``C_d >=`` one block): DRAM is an LRU of ``C_d`` (it sees every touch) and its victims
cascade down at each tier's most-recent end in LRU order.

Writes and admission
--------------------
A write of block ``v`` into flash tier ``X`` is attempted iff ``v`` is not already in
``X`` and fits in it (``size <= capacity``); every attempt is a write *opportunity*,
written iff the admission policy admits it (``policy`` code; parameter ``fp[F_PARAM]``,
or ``ip[I_PARAM]`` for k). Policies read the block's state at the attempt; its "last
access" is its latest access so far (the current one when it belongs to the group
being touched):

- ``ALL`` / ``NONE``;
- ``FREQ``: accesses of the block so far >= k;
- ``PROB``: ``mix64(b ^ PROB_SEED) / 2**64 < p`` (a fixed coin per block id);
- ``IDLE``: now - arrival of the last access's request < T seconds;
- ``VALUE``: ``values[last access] >= v`` (kept per block);
- ``ORACLE``: ``oracle_ok[last access]`` (:func:`reuse_oracle_flags`; kept per block);
- ``TINYLFU``: admit if the tier has room, else iff the sketch estimate of the block is
  strictly greater than that of the tier's next victim (its least-recent / oldest
  block). Count-min sketch of 4 rows of width W (a power of two), blocked like
  Caffeine's: from the 32-bit halves h1, h2 of one mix64 hash, a block's counters sit
  in group ``(h1 mod W) // g`` (g = min(16, W)) at offset ``(h2 >> 4i) mod g`` of row
  i, and a group's 4 x g counters share half a 64-byte cache line; 4-bit counters,
  two to a byte as in Caffeine (saturating at 15), incremented on every access; all
  counters halved every ``10 x W`` accesses; no doorkeeper and no admission window (W-TinyLFU's window LRU
  is not modelled);
- ``GROUP``: the request group of the last access has an online re-reference
  probability ``(re-referenced + 1) / (accesses + 2)`` >= threshold: every access
  counts one access of its request's group and, when the block had been accessed
  before, one re-reference of the group of that previous access (the past only;
  Laplace prior 1/2).

Accounting (per request, in request order)
------------------------------------------
The *usable prefix* is the accesses before the first MISS; the *level* of a usable
block is the running max of the decisions (a DRAM block after a flash block counts at
the flash level: DRAM alone would not have served it); the *reusable prefix* is the
accesses before the first cold one (the block's first access; prefix-aware: not
touched by an earlier request); the request's *branch* is the level of its last usable
block (MISS if none). Counters, sums and histograms cover the measured requests
(``>= first_measured``) only.

Residency: per tier (0 DRAM, 1 local SSD, 2 shared flash), ``hist[tier, 0]`` lifetime
= exit time - insert time (exit by eviction or by a promotion out of the tier),
``hist[tier, 1]`` idle before eviction = eviction time - last touch, ``hist[tier, 2]``
reuse gap = time of a hit in the tier - last touch there. Times are request arrivals
quantised to ``2**(HIST_MIN_EXP + shift)`` s (:func:`quantise_times`), so bins are
integer octaves: bin i holds ``HIST_EDGES[i] <= x < HIST_EDGES[i + 1]``, the last bin
is open. Blocks still resident at the end are not counted.
"""

from __future__ import annotations

import math
import types
from typing import NamedTuple

import numpy as np
from numba import njit

from kvtrace.config import NJIT, NJIT_INLINE
from kvtrace.kernels.bits import bit_length
from kvtrace.kernels.memory import Scratch, table_zeros
from kvtrace.kernels.prefetch import prefetch_row

# decisions (the kernel adds COLD_FLAG to the code of a cold access)
DRAM, LOCAL, FLASH, MISS = 0, 1, 2, 3
COLD_FLAG = 4
# admission policies
P_ALL, P_NONE, P_FREQ, P_PROB, P_IDLE, P_VALUE, P_ORACLE, P_TINYLFU, P_GROUP = range(9)
# promotion on a flash hit
PROMOTE, COPY, NO_PROMOTION = 0, 1, 2

# integer parameters (ip)
I_POLICY, I_PARAM, I_NODES, I_HAS_LOCAL, I_HAS_FLASH, I_FLASH_LRU, I_PROMOTION, I_WRITE_THROUGH = range(8)
I_PREFIX, I_FIRST_MEASURED, I_HAS_VALUES, I_TIME_SHIFT, I_BLOCK_TOKENS = range(8, 13)
N_IP = 13
# float parameters (fp)
F_PARAM = 0
N_FP = 1

# slots of a block's row: its state, its constants, then its entry in list L >= _LIST0
_STAT, _INFO, _LIST0 = 0, 1, 2
# fields of _INFO: tokens the block occupies, oracle flag of its last access, its
# TinyLFU sketch group and offset bits
_SIZE, _ORACLE, _SK_GRP, _SK_OFF = 0, 1, 2, 3
# fields of a list entry / of the block state (request of the last access, accesses so
# far, first request, chunk-local index of its first occurrence in the current group)
_PREV, _NEXT, _INS, _TCH = 0, 1, 2, 3
_RLAST, _COUNT, _FIRST_REQ, _HEAD = 0, 1, 2, 3
ABSENT = -1

PROB_SEED = 0x5851F42D4C957F2D
SKETCH_SEED = 0x2545F4914F6CDD1D
SKETCH_MAX = 15
SKETCH_RESET_FACTOR = 10
_SK_OPS, _SK_VICTIM, _SK_EST, _SK_VGRP = 0, 1, 2, 3  # slots of the sketch bookkeeping array
_PREFETCH_MAX = 64  # blocks of a request prefetched ahead

#: Integer counters (measured period), in order: decisions per tier (block accesses),
#: request branches (deepest tier of the usable prefix; miss = empty usable prefix),
#: evictions, write opportunities, writes and promotions (counts and tokens).
COUNT_NAMES = (
    "acc_dram", "acc_local", "acc_flash", "acc_miss",
    "req_dram", "req_local", "req_flash", "req_miss",
    "evict_dram", "evict_local", "evict_flash",
    "evict_dram_tokens", "evict_local_tokens", "evict_flash_tokens",
    "offer_local", "offer_flash", "offer_local_tokens", "offer_flash_tokens",
    "write_local", "write_flash", "write_local_tokens", "write_flash_tokens",
    "promote_local", "promote_flash", "promote_local_tokens", "promote_flash_tokens",
)
_C = {name: i for i, name in enumerate(COUNT_NAMES)}
C_ACC, C_REQ = _C["acc_dram"], _C["req_dram"]
C_EVICT, C_EVICT_TOK = _C["evict_dram"], _C["evict_dram_tokens"]
C_OFFER, C_OFFER_TOK = _C["offer_local"] - 1, _C["offer_local_tokens"] - 1  # indexed by tier 1, 2
C_WRITE, C_WRITE_TOK = _C["write_local"] - 1, _C["write_local_tokens"] - 1
C_PROMO, C_PROMO_TOK = _C["promote_local"] - 1, _C["promote_local_tokens"] - 1
N_COUNTS = len(COUNT_NAMES)

#: Float sums (measured period): usable-prefix weights per level (blocks, tokens,
#: tokens the blocks occupy, position-token sum q), totals of all accesses, any-block
#: tokens and occupied tokens per decision, and the value sums ($).
_LEVELS = ("dram", "local", "flash")
_WEIGHTS = ("blocks", "tokens", "size", "q")
SUM_NAMES = (
    tuple(f"prefix_{lv}_{w}" for lv in _LEVELS for w in _WEIGHTS)
    + tuple(f"total_{w}" for w in _WEIGHTS)
    + tuple(f"acc_{d}_{w}" for d in (*_LEVELS, "miss") for w in ("tokens", "size"))
    + ("value_captured", "value_bound")
)
S_PREFIX = 0
S_TOTAL = 12
S_ACC = 16
S_VALUE_CAPTURED, S_VALUE_BOUND = 24, 25
N_SUMS = len(SUM_NAMES)

#: Per-request columns: occupied tokens of the usable prefix by source tier, access
#: tokens and q of its flash-sourced (local + shared) blocks, and of the reusable
#: blocks beyond the usable prefix (recomputed).
REQUEST_COLUMNS = ("src_dram_size", "src_local_size", "src_flash_size", "flash_tokens", "flash_q",
                   "miss_tokens", "miss_q")
R_SRC, R_FL_TOK, R_FL_Q, R_MISS_TOK, R_MISS_Q = 0, 3, 4, 5, 6
N_REQ_COLS = len(REQUEST_COLUMNS)

HIST_TIERS = ("dram", "local", "flash")
HIST_METRICS = ("lifetime_s", "idle_before_eviction_s", "reuse_gap_s")
#: Residency histogram edges, seconds: 0, then one bin per octave from 2**-10 s
#: (~1 ms) to 2**26 s (~2 years, open last bin). Powers of two make the bin of a time
#: exact and cheap (its binary exponent).
HIST_MIN_EXP, HIST_MAX_EXP = -10, 26
HIST_EDGES = np.concatenate([[0.0], 2.0 ** np.arange(HIST_MIN_EXP, HIST_MAX_EXP + 1)])
_HIST_LAST = HIST_EDGES.shape[0] - 1


# --------------------------------------------------------------------------- helpers


@njit(**NJIT_INLINE)
def _mix64(x):
    """splitmix64 finaliser of ``x + golden`` (uint64 -> uint64)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(**NJIT_INLINE)
def _unit_hash(b):
    """Deterministic uniform [0, 1) of a block id (the ``prob:p`` policy)."""
    h = _mix64(np.uint64(b) ^ np.uint64(PROB_SEED))
    return np.float64(h >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(**NJIT_INLINE)
def _sketch_slots(b, sketch):
    """Block b's group of the sketch and its hash: row i counts b at offset
    ``(h2 >> 4i) mod g`` of group ``(h1 mod W) / g`` (h1, h2: the 32-bit halves of one
    mix64 hash). The sketch is uint8 ``[W / g, 4, g / 2]`` (g = min(16, W) >= 2): counter
    j of a row is the low (j even) or high nibble of byte j / 2, so a group is 32 bytes,
    half a cache line (:func:`_counter`)."""
    h = _mix64(np.uint64(b) ^ np.uint64(SKETCH_SEED))
    g = 2 * sketch.shape[2]
    grp = np.int64((h & np.uint64(0xFFFFFFFF)) % np.uint64(sketch.shape[0] * g)) // g
    return grp, h >> np.uint64(32)


@njit(**NJIT)
def _init_sketch_keys(st, sketch):
    """Store each block's sketch group and the 16 offset bits of its hash in its row
    (``_INFO`` fields ``_SK_GRP``, ``_SK_OFF``), read with the row at every access."""
    for b in range(st.shape[0] - 1):
        grp, h2 = _sketch_slots(b, sketch)
        st[b, _INFO, _SK_GRP] = grp
        st[b, _INFO, _SK_OFF] = np.int64(h2 & np.uint64(0xFFFF))


@njit(**NJIT_INLINE)
def _counter(byte, j):
    """Counter j (its nibble) of a sketch byte."""
    return (np.int64(byte) >> ((j & 1) << 2)) & 15


@njit(**NJIT_INLINE)
def _sketch_estimate(sketch, st, b):
    grp = st[b, _INFO, _SK_GRP]
    off = st[b, _INFO, _SK_OFF]
    mask = 2 * sketch.shape[2] - 1
    est = SKETCH_MAX
    for i in range(4):
        j = (off >> (4 * i)) & mask
        c = _counter(sketch[grp, i, j >> 1], j)
        if c < est:
            est = c
    return est


@njit(**NJIT_INLINE)
def _sketch_add(sketch, sk_ops, st, b):
    """Count an access of b (saturating); every ``10 x W`` accesses halve all counters.
    ``sk_ops``: [accesses since the last halving, cached victim, its estimate, its
    group]; the cached estimate is dropped when a block of the victim's group is
    counted (its counters can only change then) or the counters halve."""
    grp = st[b, _INFO, _SK_GRP]
    off = st[b, _INFO, _SK_OFF]
    mask = 2 * sketch.shape[2] - 1
    for i in range(4):
        j = (off >> (4 * i)) & mask
        byte = np.int64(sketch[grp, i, j >> 1])
        c = _counter(byte, j)
        sketch[grp, i, j >> 1] = np.uint8(byte + (np.int64(c < SKETCH_MAX) << ((j & 1) << 2)))
    if grp == sk_ops[_SK_VGRP]:
        sk_ops[_SK_VICTIM] = -1
    sk_ops[_SK_OPS] += 1
    if sk_ops[_SK_OPS] >= SKETCH_RESET_FACTOR * sketch.shape[0] * 2 * sketch.shape[2]:
        flat = sketch.reshape(-1)
        for j in range(flat.shape[0]):
            flat[j] = (flat[j] >> 1) & 0x77  # both nibbles halved
        sk_ops[_SK_OPS] = 0
        sk_ops[_SK_VICTIM] = -1


@njit(**NJIT_INLINE)
def _victim_estimate(sketch, sk_ops, st, w):
    """Sketch estimate of flash victim w: it stays the victim across many admissions,
    so its estimate is cached until a count in its group or a halving (see
    :func:`_sketch_add`)."""
    if sk_ops[_SK_VICTIM] != w:
        sk_ops[_SK_VICTIM] = w
        sk_ops[_SK_VGRP] = st[w, _INFO, _SK_GRP]
        sk_ops[_SK_EST] = _sketch_estimate(sketch, st, w)
    return sk_ops[_SK_EST]


@njit(**NJIT_INLINE)
def _bin(dq, shift):
    """Residency bin of a time difference of ``dq`` quanta of ``2**(HIST_MIN_EXP +
    shift)`` seconds: 0 if dq < 1, else its bit length + shift (the octave of the
    difference in seconds), the last bin open."""
    if dq < 1:
        return 0
    n = bit_length(dq) + shift
    return n if n < _HIST_LAST else _HIST_LAST


@njit(**NJIT_INLINE)
def _link_before(st, L, b, nxt):
    """Link b into list L just before (on the least-recent side of) nxt."""
    p = st[nxt, L, _PREV]
    st[p, L, _NEXT] = b
    st[b, L, _PREV] = p
    st[b, L, _NEXT] = nxt
    st[nxt, L, _PREV] = b


@njit(**NJIT_INLINE)
def _link_mru(st, L, b, M):
    _link_before(st, L, b, M)


@njit(**NJIT_INLINE)
def _unlink(st, L, b):
    p = st[b, L, _PREV]
    n = st[b, L, _NEXT]
    st[p, L, _NEXT] = n
    st[n, L, _PREV] = p
    st[b, L, _PREV] = ABSENT


@njit(**NJIT_INLINE)
def _admit(policy, v, X, now, ip, fp, st, used, cap, req_ts, req_group, gstat, last_val, sketch, sk_ops):
    if policy == P_ALL:
        return True
    if policy == P_NONE:
        return False
    if policy == P_FREQ:
        return st[v, _STAT, _COUNT] >= ip[I_PARAM]
    if policy == P_PROB:
        return _unit_hash(v) < fp[F_PARAM]
    if policy == P_IDLE:
        return now - req_ts[st[v, _STAT, _RLAST]] < fp[F_PARAM]
    if policy == P_VALUE:
        return last_val[v] >= fp[F_PARAM]
    if policy == P_ORACLE:
        return st[v, _INFO, _ORACLE] != 0
    if policy == P_TINYLFU:
        if used[X] + st[v, _INFO, _SIZE] <= cap[X]:
            return True
        M = st.shape[0] - 1
        return _sketch_estimate(sketch, st, v) > _victim_estimate(sketch, sk_ops, st, st[M, X, _NEXT])
    g = req_group[st[v, _STAT, _RLAST]]
    return (gstat[g, 1] + 1.0) / (gstat[g, 0] + 2.0) >= fp[F_PARAM]


@njit(**NJIT_INLINE)
def _evict_lru(X, tier, nq, shift, meas, st, used, cnt, hist, sketch, use_sketch):
    """Evict the least-recent block of list X; returns it."""
    M = st.shape[0] - 1
    w = st[M, X, _NEXT]
    _unlink(st, X, w)
    prefetch_row(st, st[st[M, X, _NEXT], X, _NEXT])  # the victim after next: its row is the next unlink's miss
    if use_sketch and tier == 0:  # the next DRAM victim is the next admission candidate: its sketch group
        prefetch_row(sketch, st[st[M, X, _NEXT], _INFO, _SK_GRP])
    s = st[w, _INFO, _SIZE]
    used[X] -= s
    if meas:
        cnt[C_EVICT + tier] += 1
        cnt[C_EVICT_TOK + tier] += s
        hist[tier, 0, _bin(nq - st[w, X, _INS], shift)] += 1
        hist[tier, 1, _bin(nq - st[w, X, _TCH], shift)] += 1
    return w


@njit(**NJIT_INLINE)
def _prefetch_ahead(r, block, req_start, req_node, st, F, has_flash, sketch, use_sketch):
    """Prefetch the rows of request r + 2's blocks, and the list neighbours and sketch
    groups of request r + 1's blocks (rows prefetched one request ago), which its pins
    will unlink and its accesses count (r local to the chunk; ``req_node`` the
    chunk's). Hints only: neighbours may change before then, results never do."""
    n_req = req_start.shape[0] - 1
    if r + 2 < n_req:
        for t in range(req_start[r + 2], min(req_start[r + 3], req_start[r + 2] + _PREFETCH_MAX)):
            prefetch_row(st, block[t])
    if r + 1 < n_req:
        D = _LIST0 + req_node[r + 1]
        for t in range(req_start[r + 1], min(req_start[r + 2], req_start[r + 1] + _PREFETCH_MAX)):
            b = block[t]
            if use_sketch:
                prefetch_row(sketch, st[b, _INFO, _SK_GRP])
            if st[b, D, _PREV] != ABSENT:
                prefetch_row(st, st[b, D, _PREV])
                prefetch_row(st, st[b, D, _NEXT])
            elif has_flash and st[b, F, _PREV] != ABSENT:
                prefetch_row(st, st[b, F, _PREV])
                prefetch_row(st, st[b, F, _NEXT])


# --------------------------------------------------------------------------- kernel
#: The admission policy a compiled :func:`_simulate` serves, bound per kernel by
#: :func:`_specialise` (the template below is never called as it is).
_KERNEL_POLICY = -1


def _simulate(block, tokens, pos, req_start, r0, req_ts, req_tq, req_node, req_group, values,
              oracle_ok, ip, fp, cap, st, used, gstat, last_val, sketch, sk_ops,
              decision, req_level, req_out, out_base, cnt, sums, hist):
    """Replay a chunk of whole requests: a forward pass over each touch group decides,
    pins and accounts its accesses, a backward pass inserts them into DRAM (module
    docstring). Access arrays (``block`` .. ``pos``, ``values``, ``oracle_ok``,
    ``decision``) and ``req_start`` are the chunk's; per-request arrays are the whole
    trace's, the chunk's request r being trace request ``r0 + r`` (``req_out`` is
    [column, request - out_base]: the whole trace's with ``out_base`` 0, or the chunk's
    with ``out_base`` = r0).

    The pins of pass 1 run forward here, at each block's first occurrence, after its
    decision: a pin changes only the pinned block's own entries, and a repeat copies
    the decision of its first occurrence, so every decision still sees the tiers as
    the group found them. In-place flash reads (LRU) are linked, in forward order, just
    behind the group's previous read in that list: the order tail-first linking at the
    most-recent end gives."""
    n_req = req_start.shape[0] - 1
    N = ip[I_NODES]
    has_local = ip[I_HAS_LOCAL] != 0
    has_flash = ip[I_HAS_FLASH] != 0
    local0 = _LIST0 + N
    F = _LIST0 + N * (1 + ip[I_HAS_LOCAL])
    flash_lru = ip[I_FLASH_LRU] != 0
    promotion = ip[I_PROMOTION]
    write_through = ip[I_WRITE_THROUGH] != 0
    prefix_aware = ip[I_PREFIX] != 0
    first_measured = ip[I_FIRST_MEASURED]
    policy = _KERNEL_POLICY  # a compile-time constant: one kernel per policy (see _specialise)
    shift = ip[I_TIME_SHIFT]
    B = np.float64(ip[I_BLOCK_TOKENS])
    use_sketch = policy == P_TINYLFU
    use_groups = policy == P_GROUP
    M = st.shape[0] - 1
    # the first flash tier below DRAM: the node's local SSD, else the shared flash
    first_tier = 1 if has_local else (2 if has_flash else 0)
    # accumulators of the measured period: acc[d] = accesses, tokens, occupied tokens
    # per decision; acc[4] = accesses, tokens, occupied tokens, q of all accesses;
    # acc[5, d] = request branches; pre[level] = usable-prefix blocks, tokens, occupied
    # tokens, q; lgap = reuse gaps per tier. Sums of integer-valued floats: exact.
    acc = np.zeros((6, 4), dtype=np.float64)
    pre = np.zeros((3, 4), dtype=np.float64)
    lgap = np.zeros((3, _HIST_LAST + 1), dtype=np.int64)
    longest = 0
    for r in range(n_req):
        longest = max(longest, req_start[r + 1] - req_start[r])
    since_buf = np.empty(longest, dtype=np.int32)  # per first occurrence: last touch in the serving tier
    has_values = ip[I_HAS_VALUES] != 0
    has_oracle = policy == P_ORACLE
    chunk_node = req_node[r0:r0 + n_req]
    for r in range(n_req):
        lo = req_start[r]
        hi = req_start[r + 1]
        _prefetch_ahead(r, block, req_start, chunk_node, st, F, has_flash, sketch, use_sketch)
        rg = r0 + r  # the trace's request index
        n = req_node[rg]
        D = _LIST0 + n
        Lc = local0 + n
        first_flash = Lc if has_local else (F if has_flash else -1)
        now = req_ts[rg]
        nq = req_tq[rg]
        meas = rg >= first_measured
        # the request's usable / reusable prefix (accounting)
        usable = True
        reusable = True
        level = 0
        src_d = 0.0
        src_l = 0.0
        src_f = 0.0
        fl_tok = 0.0
        fl_q = 0.0
        miss_tok = 0.0
        miss_q = 0.0
        p_n = 0.0  # the current level's usable-prefix sums, flushed when the level changes
        p_tok = 0.0
        p_size = 0.0
        p_q = 0.0
        n_touch_groups = 1 if prefix_aware else hi - lo
        for k in range(n_touch_groups):
            if prefix_aware:
                a, z = lo, hi
            else:
                a, z = lo + k, lo + k + 1
            behind_local = M  # the group's latest in-place read per flash list
            behind_flash = M
            # ---- forward: decide, pin (pass 1), account
            for t in range(a, z):
                b = block[t]
                s = st[b, _INFO, _SIZE]
                tl = st[b, _STAT, _RLAST]
                if use_groups:
                    if tl >= 0:
                        gstat[req_group[tl], 1] += 1
                    gstat[req_group[rg], 0] += 1
                first_req = st[b, _STAT, _FIRST_REQ]
                if prefix_aware:
                    cold = first_req < 0 or first_req == rg
                else:
                    cold = st[b, _STAT, _COUNT] == 0
                st[b, _STAT, _COUNT] += 1
                st[b, _STAT, _RLAST] = rg
                if has_values:
                    last_val[b] = values[t]
                if has_oracle:
                    st[b, _INFO, _ORACLE] = oracle_ok[t]
                if first_req < 0:
                    st[b, _STAT, _FIRST_REQ] = rg
                if use_sketch:
                    _sketch_add(sketch, sk_ops, st, b)
                if prefix_aware and tl == rg:  # a repeat in this group: decided (and pinned) at its first occurrence
                    head = st[b, _STAT, _HEAD]
                    d = decision[head] & 3
                    since = since_buf[head - lo]
                else:
                    st[b, _STAT, _HEAD] = t
                    if st[b, D, _PREV] != ABSENT:
                        d = DRAM
                        X = D
                    elif has_local and st[b, Lc, _PREV] != ABSENT:
                        d = LOCAL
                        X = Lc
                    elif has_flash and st[b, F, _PREV] != ABSENT:
                        d = FLASH
                        X = F
                    else:
                        d = MISS
                        X = -1
                    since = st[b, X, _TCH] if X >= 0 else -1
                    since_buf[t - lo] = since
                    # pin
                    if d == DRAM:
                        _unlink(st, D, b)
                        used[D] -= s
                    elif d != MISS:
                        fits = s <= cap[D]  # a block larger than DRAM is never promoted
                        if promotion == PROMOTE and fits:
                            _unlink(st, X, b)
                            used[X] -= s
                            if meas:
                                cnt[C_PROMO + d] += 1
                                cnt[C_PROMO_TOK + d] += s
                                hist[d, 0, _bin(nq - st[b, X, _INS], shift)] += 1
                        else:
                            if flash_lru:
                                _unlink(st, X, b)
                                if d == LOCAL:
                                    _link_before(st, X, b, behind_local)
                                    behind_local = b
                                else:
                                    _link_before(st, X, b, behind_flash)
                                    behind_flash = b
                            st[b, X, _TCH] = nq
                            if meas and promotion == COPY and fits:
                                cnt[C_PROMO + d] += 1
                                cnt[C_PROMO_TOK + d] += s
                decision[t] = d + COLD_FLAG if cold else d
                # account (forward over the request)
                kt = np.float64(tokens[t])
                fs = np.float64(s)
                q = kt * (np.float64(pos[t]) * B) + kt * (kt - 1.0) * 0.5
                if meas:
                    if d != MISS:
                        lgap[d, _bin(nq - since, shift)] += 1
                    acc[d, 0] += 1.0
                    acc[d, 1] += kt
                    acc[d, 2] += fs
                    acc[4, 0] += 1.0
                    acc[4, 1] += kt
                    acc[4, 2] += fs
                    acc[4, 3] += q
                if cold:
                    reusable = False
                if usable and d == MISS:
                    usable = False
                if usable:
                    if d > level:
                        if meas:
                            pre[level, 0] += p_n
                            pre[level, 1] += p_tok
                            pre[level, 2] += p_size
                            pre[level, 3] += p_q
                        p_n = p_tok = p_size = p_q = 0.0
                        level = d
                    p_n += 1.0
                    p_tok += kt
                    p_size += fs
                    p_q += q
                    if d == DRAM:
                        src_d += fs
                    else:
                        if d == LOCAL:
                            src_l += fs
                        else:
                            src_f += fs
                        fl_tok += kt
                        fl_q += q
                elif reusable:
                    miss_tok += kt
                    miss_q += q
            # ---- touch, pass 2 (tail-first): insert into DRAM, evict, write below.
            # Every write goes through the one loop below (write-through candidate
            # first, then each DRAM victim in eviction order; a local-SSD victim is
            # written to the shared flash before the next one is evicted), so the
            # write path is compiled once.
            for t in range(z - 1, a - 1, -1):
                b = block[t]
                if st[b, _STAT, _HEAD] != t:
                    continue
                d = decision[t] & 3
                s = st[b, _INFO, _SIZE]
                if (d == LOCAL or d == FLASH) and (promotion == NO_PROMOTION or s > cap[D]):
                    continue  # served in place
                cand = -1
                if s > cap[D]:  # never fits: passes through DRAM (inserted and evicted at once)
                    if meas:
                        cnt[C_EVICT] += 1
                        cnt[C_EVICT_TOK] += s
                        hist[0, 0, 0] += 1
                        hist[0, 1, 0] += 1
                    if d == MISS or not write_through:
                        cand = b
                else:
                    _link_mru(st, D, b, M)
                    used[D] += s
                    if d != DRAM:  # a DRAM block was pinned in pass 1: it keeps its insert time
                        st[b, D, _INS] = nq
                    st[b, D, _TCH] = nq
                    if write_through and d == MISS:
                        cand = b
                while True:
                    if cand >= 0 and first_flash >= 0:
                        X = first_flash
                        tier = first_tier
                        while True:
                            if cand >= 0:
                                # offer cand to flash list X: an opportunity iff it is not there
                                # and fits; written iff admitted (at its most-recent end). Written
                                # out here, not as an inlined helper: Numba kept a reference-count
                                # increment and decrement per array argument of the helper (14) on
                                # every offer, 0.6 s of a 30M-access run that admits nothing
                                wrote = False
                                sv = st[cand, _INFO, _SIZE]
                                if st[cand, X, _PREV] == ABSENT and sv <= cap[X]:
                                    val = last_val[cand] if has_values else 0.0
                                    if meas:
                                        cnt[C_OFFER + tier] += 1
                                        cnt[C_OFFER_TOK + tier] += sv
                                        if val > 0:
                                            sums[S_VALUE_BOUND] += val
                                    if _admit(policy, cand, X, now, ip, fp, st, used, cap, req_ts, req_group, gstat,
                                              last_val, sketch, sk_ops):
                                        _link_mru(st, X, cand, M)
                                        st[cand, X, _INS] = nq
                                        st[cand, X, _TCH] = nq
                                        used[X] += sv
                                        if meas:
                                            cnt[C_WRITE + tier] += 1
                                            cnt[C_WRITE_TOK + tier] += sv
                                            sums[S_VALUE_CAPTURED] += val
                                        wrote = True
                                cand = -1
                                if wrote and tier == 2:
                                    while used[F] > cap[F]:
                                        _evict_lru(F, 2, nq, shift, meas, st, used, cnt, hist, sketch, use_sketch)
                            if has_local and used[Lc] > cap[Lc]:
                                w = _evict_lru(Lc, 1, nq, shift, meas, st, used, cnt, hist, sketch, use_sketch)
                                if has_flash:
                                    cand = w
                                    X = F
                                    tier = 2
                                continue
                            break
                    cand = -1
                    if used[D] <= cap[D]:
                        break
                    w = _evict_lru(D, 0, nq, shift, meas, st, used, cnt, hist, sketch, use_sketch)
                    if not write_through:
                        cand = w
        # ---- the request's totals
        if meas:
            pre[level, 0] += p_n
            pre[level, 1] += p_tok
            pre[level, 2] += p_size
            pre[level, 3] += p_q
        req_out[R_SRC, rg - out_base] = src_d
        req_out[R_SRC + 1, rg - out_base] = src_l
        req_out[R_SRC + 2, rg - out_base] = src_f
        req_out[R_FL_TOK, rg - out_base] = fl_tok
        req_out[R_FL_Q, rg - out_base] = fl_q
        req_out[R_MISS_TOK, rg - out_base] = miss_tok
        req_out[R_MISS_Q, rg - out_base] = miss_q
        # request branch: deepest tier of the usable prefix, miss if it is empty
        branch = MISS
        if hi > lo and (decision[lo] & 3) != MISS:
            branch = level
        req_level[rg] = branch
        if meas:
            acc[5, branch] += 1.0
    for lv in range(3):
        for w in range(4):
            sums[S_PREFIX + 4 * lv + w] += pre[lv, w]
    for w in range(4):
        sums[S_TOTAL + w] += acc[4, w]
    for d in range(4):
        sums[S_ACC + 2 * d] += acc[d, 1]
        sums[S_ACC + 2 * d + 1] += acc[d, 2]
        cnt[C_ACC + d] += np.int64(acc[d, 0])
        cnt[C_REQ + d] += np.int64(acc[5, d])
    for tier in range(3):
        for i in range(_HIST_LAST + 1):
            hist[tier, 2, i] += lgap[tier, i]


@njit(**NJIT)
def oracle_flags_chunk(block, decision, next_flash, out):
    """Backward over one run of accesses (a trace's chunks taken last to first):
    ``out[t]`` = 1 iff the block's next access was served from a flash tier (LOCAL or
    FLASH) in the admit-all run whose decisions are ``decision``; ``next_flash``
    (int8 per block, 0 at the start) carries that per block from one chunk to the
    previous one."""
    for t in range(block.shape[0] - 1, -1, -1):
        b = block[t]
        out[t] = next_flash[b]
        d = decision[t] & 3
        next_flash[b] = 1 if d == LOCAL or d == FLASH else 0


def reuse_oracle_flags(block, n_blocks, decision_all):
    """The ``reuse-oracle`` admission input: int8[N], 1 at access t iff the block's
    next access exists and was served from a flash tier (LOCAL or FLASH) in the
    admit-all run whose decisions are ``decision_all``. One backward pass carrying a
    byte per block (the 30M-access benchmark: 1.25 s through a next-access index and
    numpy gathers before)."""
    out = np.empty(len(block), dtype=np.int8)
    oracle_flags_chunk(_ints(block), decision_all, np.zeros(int(n_blocks), dtype=np.int8), out)
    return out


def sketch_width(flash_tokens: int, block_tokens: int, n_blocks: int) -> int:
    """Width of the TinyLFU sketch: the power of two >= 4 x the flash capacity in full
    blocks (at most 4 x the trace's distinct blocks, at least 16)."""
    cap_blocks = -(-int(flash_tokens) // max(1, int(block_tokens)))
    want = 4 * max(1, min(cap_blocks, max(1, int(n_blocks))))
    return max(16, 1 << (want - 1).bit_length())


def _ints(a):
    """A contiguous integer array as it is (the kernels compile per dtype), else int64."""
    a = np.asarray(a)
    if a.dtype.kind in "iu" and a.flags.c_contiguous:
        return a
    return np.ascontiguousarray(a, dtype=np.int64)


def quantise_times(req_ts):
    """Request times as int32 quanta for the residency histograms.

    The quantum is ``2**(HIST_MIN_EXP + shift)`` seconds (``2**-10`` s, the width of
    the first histogram bin) with the smallest ``shift >= 0`` that keeps the trace's
    span below 2**31 quanta (24 days at shift 0). Returns ``(tq, shift)`` with
    ``tq = floor((ts - min(ts)) / quantum)``.
    """
    ts = np.asarray(req_ts, dtype=np.float64)
    if ts.size == 0:
        return np.zeros(0, dtype=np.int32), 0
    rel = ts - ts.min()
    span = float(rel.max())
    shift = 0
    while math.ldexp(span, -(HIST_MIN_EXP + shift)) >= 2.0**31 - 1:
        shift += 1
    np.ldexp(rel, -(HIST_MIN_EXP + shift), out=rel)  # in place: one temporary per request, not three
    np.floor(rel, out=rel)
    return rel.astype(np.int32), shift


class TierRun(NamedTuple):
    """Raw outputs of :func:`simulate_tiers` / :meth:`TierSimulator.finish`.

    decision : int8[N] — DRAM/LOCAL/FLASH/MISS of every access (warm-up included);
        None for a run fed in chunks (each chunk's decisions were returned by
        :meth:`TierSimulator.feed`).
    cold : bool[N] — first access of the block (prefix-aware: not touched by an
        earlier request); the reusable prefix ends at the first cold access. None for
        a run fed in chunks.
    req_first : int8[R] — decision of each request's first access (MISS if empty).
    req_level : int8[R] — request branch (deepest tier of the usable prefix; MISS when
        the usable prefix is empty).
    req_out : float64[R, 7] — :data:`REQUEST_COLUMNS` per request (warm-up included;
        a column-major view: each column is contiguous); None when the simulator kept
        only each chunk's (``chunk_columns``).
    counts : dict name -> int (:data:`COUNT_NAMES`, measured period).
    sums : dict name -> float (:data:`SUM_NAMES`, measured period).
    hist : int64[3, 3, len(HIST_EDGES)] — residency counts [tier, metric, bin].
    time_shift : int — the time quantum is 2**(HIST_MIN_EXP + time_shift) s
        (:func:`quantise_times`).
    """

    decision: np.ndarray | None
    cold: np.ndarray | None
    req_first: np.ndarray
    req_level: np.ndarray
    req_out: np.ndarray
    counts: dict
    sums: dict
    hist: np.ndarray
    time_shift: int = 0


def _aligned_zeros(n: int) -> np.ndarray:
    """uint8[n] of zeros starting on a 64-byte boundary (a cache line)."""
    buf = table_zeros(n + 64, np.uint8)
    off = -buf.ctypes.data % 64
    return buf[off:off + n]


def _state(size, n_lists: int, scratch=None) -> np.ndarray:
    """The simulator state, int32[M + 1, S, 4]: row b holds block b's state (slot
    ``_STAT``: request of its last access, access count, first request, head of its
    touch group), its constants and admission inputs (slot ``_INFO``: tokens it
    occupies, oracle flag of its last access, TinyLFU sketch group and offset bits)
    and its entry in each list (slot ``_LIST0 + L``: prev, next, insert time,
    last-touch time; prev = ``ABSENT`` when not in the list). Row M is every list's sentinel. One row per block keeps what an
    access or an eviction reads of a block in one cache line (rows of 4 slots are 64
    bytes, aligned), so S is the slot count rounded up to a multiple of 4. With
    ``scratch`` (:class:`kvtrace.kernels.memory.Scratch`) the table reuses its memory."""
    n_blocks = size.shape[0]
    slots = _LIST0 + n_lists
    slots += -slots % 4
    row = slots * 16
    n = (n_blocks + 1) * row + 64
    # huge pages (kvtrace.kernels.memory); every byte is written below
    buf = table_zeros(n, np.uint8, populate=True) if scratch is None else scratch.get(n)
    off = -buf.ctypes.data % 64
    st = buf[off:off + (n_blocks + 1) * row].view(np.int32).reshape(n_blocks + 1, slots, 4)
    _init_rows(st, size)
    return st


@njit(**NJIT)
def _init_rows(st, size):
    """Every row in one sequential pass (the table is the run's largest allocation):
    ABSENT everywhere (list times are written before they are read), but the access
    count and oracle flag 0, the size, and the sentinel row's links to itself."""
    M = size.shape[0]
    for b in range(M + 1):
        for k in range(st.shape[1]):
            for f in range(4):
                st[b, k, f] = ABSENT
        st[b, _STAT, _COUNT] = 0
        st[b, _INFO, _ORACLE] = 0
        if b < M:
            st[b, _INFO, _SIZE] = size[b]
    for k in range(_LIST0, st.shape[1]):
        st[M, k, _PREV] = M
        st[M, k, _NEXT] = M


class TierSimulator:
    """The tier simulation, fed whole requests in order, one chunk or many.

    All state (tiers, block rows, sketch, counters, per-request outputs) lives here
    between :meth:`feed` calls, so feeding a trace in chunks gives the results of one
    call over the whole trace, bit for bit (module docstring, "Chunks"). Memory:
    the block rows (:func:`_state`), 8 bytes per block with ``has_values``, and the
    per-request arrays (about 70 bytes per request, 14 with ``chunk_columns``);
    nothing per access beyond the chunk being fed.

    Parameters
    ----------
    size : int64[M]
        Tokens each block occupies in a cache.
    req_ts : float64[R]
        Request arrival, seconds (the whole trace's).
    req_node : int[R]
        Node serving each request, 0..n_nodes-1.
    block_tokens, prefix_aware, dram, local, flash, n_nodes, policy, param, flash_lru,
    promotion, write_through, first_measured, req_group, n_groups, sketch_width :
        As for :func:`simulate_tiers`.
    has_values : bool
        Chunks come with per-access values (the ``VALUE`` policy and the value sums).
    scratch : kvtrace.kernels.memory.Scratch, optional
        Memory for the block rows and the per-request outputs, reused from an earlier
        simulator that is done with them (a sweep's configurations: no fresh pages to
        fault in; :meth:`finish`'s ``req_out`` is then valid until the scratch's next use).
    chunk_columns : bool
        Keep the per-request output columns of the last chunk fed only
        (:attr:`chunk_out`, valid until the next :meth:`feed`; ``finish().req_out`` is
        then None): a streamed replay folds them chunk by chunk instead of holding 56
        bytes per request of the whole trace.
    """

    def __init__(self, size, req_ts, req_node, *, block_tokens, prefix_aware, dram, local, flash, n_nodes,
                 policy=P_ALL, param=0.0, flash_lru=True, promotion=PROMOTE, write_through=False,
                 first_measured=0, req_group=None, n_groups=1, has_values=False, sketch_width=16,
                 scratch=None, chunk_columns=False) -> None:
        size = np.ascontiguousarray(size, dtype=np.int64)
        M = size.shape[0]
        N = int(n_nodes)
        req_ts = np.ascontiguousarray(req_ts, dtype=np.float64)
        n_req = req_ts.shape[0]
        has_local = int(local) > 0
        has_flash = int(flash) > 0
        n_lists = N * (1 + int(has_local)) + int(has_flash)
        # capacity of each list (from _LIST0: DRAM per node, local SSD per node, shared flash)
        cap = np.zeros(_LIST0 + n_lists, dtype=np.int64)
        cap[_LIST0:_LIST0 + N] = int(dram)
        if has_local:
            cap[_LIST0 + N:_LIST0 + 2 * N] = int(local)
        if has_flash:
            cap[-1] = int(flash)
        if M + 1 >= 2**31:
            raise ValueError("the tier simulator indexes blocks with int32: at most 2**31 - 2 distinct blocks")
        if n_req >= 2**31 - 1:
            raise ValueError("the tier simulator indexes requests with int32: at most 2**31 - 2")
        if M and (int(size.max()) >= 2**31 or int(size.min()) < 0):
            raise ValueError("block sizes must be 0..2**31 - 1 tokens")
        self.req_ts = req_ts
        self.req_tq, self.shift = quantise_times(req_ts)  # its temporaries go before the block table comes
        self.st = _state(size, n_lists, scratch)
        ip = np.zeros(N_IP, dtype=np.int64)
        ip[I_POLICY] = int(policy)
        ip[I_PARAM] = int(param) if int(policy) == P_FREQ else 0
        ip[I_NODES] = N
        ip[I_HAS_LOCAL] = int(has_local)
        ip[I_HAS_FLASH] = int(has_flash)
        ip[I_FLASH_LRU] = int(bool(flash_lru))
        ip[I_PROMOTION] = int(promotion)
        ip[I_WRITE_THROUGH] = int(bool(write_through))
        ip[I_PREFIX] = int(bool(prefix_aware))
        ip[I_FIRST_MEASURED] = int(first_measured)
        ip[I_HAS_VALUES] = int(bool(has_values))
        ip[I_BLOCK_TOKENS] = int(block_tokens)
        self.fp = np.zeros(N_FP, dtype=np.float64)
        self.fp[F_PARAM] = float(param)
        use_sketch = int(policy) == P_TINYLFU
        width = int(sketch_width) if use_sketch else 2
        if width < 2 or width & (width - 1):
            raise ValueError("the sketch width must be a power of two >= 2")
        g = min(16, width)
        self.sketch = _aligned_zeros(2 * width).reshape(width // g, 4, g // 2)  # 4-bit counters
        if use_sketch:
            _init_sketch_keys(self.st, self.sketch)
        self.sk_ops = np.array([0, -1, 0, -1], dtype=np.int64)
        self.gstat = np.zeros((max(1, int(n_groups)), 2), dtype=np.int64)
        self.req_group = (np.zeros(n_req, dtype=np.int32) if req_group is None
                          else np.ascontiguousarray(req_group, dtype=np.int32))
        self.last_val = np.zeros(M if has_values else 0, dtype=np.float64)
        self.req_first = np.full(n_req, MISS, dtype=np.int8)
        self.req_level = np.full(n_req, MISS, dtype=np.int8)
        # per-request outputs by column (each column contiguous); TierRun gets the (R, 7) view
        self.chunk_columns = bool(chunk_columns)
        # chunk rows: one buffer for every chunk, grown when a chunk needs more
        self.scratch = Scratch() if scratch is None and self.chunk_columns else scratch
        self.chunk_out = None
        self.req_cols = None if self.chunk_columns else self._columns(n_req)
        self.cnt = np.zeros(N_COUNTS, dtype=np.int64)
        self.sums = np.zeros(N_SUMS, dtype=np.float64)
        self.hist = np.zeros((3, 3, HIST_EDGES.shape[0]), dtype=np.int64)
        ip[I_TIME_SHIFT] = self.shift
        self.ip = ip
        self.cap = cap
        self.used = np.zeros(_LIST0 + n_lists, dtype=np.int64)
        self.req_node = np.ascontiguousarray(req_node, dtype=np.int32)
        self.next_request = 0  # the next chunk starts here

    def _columns(self, n: int) -> np.ndarray:
        """float64[N_REQ_COLS, n] for the per-request outputs (every column of a request
        is written when it is fed)."""
        if self.scratch is not None:
            return self.scratch.get(8 * N_REQ_COLS * n, "requests").view(np.float64).reshape(N_REQ_COLS, n)
        return np.zeros((N_REQ_COLS, n), dtype=np.float64)

    def feed(self, block, tokens, pos, req_start, values=None, oracle_ok=None) -> np.ndarray:
        """Simulate the next requests: returns their accesses' decisions, int8 with
        :data:`COLD_FLAG` added to a cold access's.

        Parameters
        ----------
        block, tokens, pos : int[n]
            The chunk's accesses (dense block id, access tokens, position in request).
        req_start : int64[k + 1]
            Offsets of the chunk's k requests in those arrays (from 0); they are the
            trace's requests ``next_request`` .. ``next_request + k - 1``.
        values : float64[n], optional
            Per-access values (required iff ``has_values``).
        oracle_ok : int8[n], optional
            :func:`reuse_oracle_flags` of the chunk's accesses (required by ``ORACLE``).
        """
        block = np.ascontiguousarray(block, dtype=np.int64)
        req_start = np.ascontiguousarray(req_start, dtype=np.int64)
        n_acc = block.shape[0]
        k = req_start.shape[0] - 1
        r0 = self.next_request
        if r0 + k > self.req_first.shape[0]:
            raise ValueError("more requests fed than the simulator was built for")
        if n_acc >= 2**31 - 1:
            raise ValueError("the tier simulator indexes a chunk's accesses with int32: at most 2**31 - 2")
        if self.ip[I_HAS_VALUES]:
            if values is None or np.shape(values) != (n_acc,):
                raise ValueError("the value policy needs one value per access")
            values = np.ascontiguousarray(values, dtype=np.float64)
        else:
            values = np.zeros(0, dtype=np.float64)
        if self.ip[I_POLICY] == P_ORACLE:
            if oracle_ok is None or np.shape(oracle_ok) != (n_acc,):
                raise ValueError("the reuse-oracle policy needs one flag per access")
            oracle_ok = np.ascontiguousarray(oracle_ok, dtype=np.int8)
        else:
            oracle_ok = np.zeros(0, dtype=np.int8)
        decision = np.full(n_acc, MISS, dtype=np.int8)
        if self.chunk_columns:
            out, out_base = self._columns(k), r0
            self.chunk_out = out.T
        else:
            out, out_base = self.req_cols, 0
        if k > 0:
            _SIMULATE[int(self.ip[I_POLICY])](
                      block, _ints(tokens), _ints(pos), req_start, r0, self.req_ts, self.req_tq, self.req_node,
                      self.req_group, values, oracle_ok, self.ip, self.fp, self.cap, self.st, self.used,
                      self.gstat, self.last_val, self.sketch, self.sk_ops, decision, self.req_level, out, out_base,
                      self.cnt, self.sums, self.hist)
            nonempty = req_start[1:] > req_start[:-1]
            self.req_first[r0:r0 + k][nonempty] = decision[req_start[:-1][nonempty]] & 3
        self.next_request = r0 + k
        return decision

    def finish(self, decision=None, cold=None) -> TierRun:
        """The run's outputs (per-access ``decision`` and ``cold`` as given, if any)."""
        if self.next_request != self.req_first.shape[0]:
            raise ValueError(f"{self.req_first.shape[0] - self.next_request} requests were never fed")
        return TierRun(decision, cold, self.req_first, self.req_level,
                       None if self.req_cols is None else self.req_cols.T,
                       dict(zip(COUNT_NAMES, self.cnt.tolist())), dict(zip(SUM_NAMES, self.sums.tolist())),
                       self.hist, int(self.shift))


def simulate_tiers(block, size, req_start, tokens, pos, req_ts, req_node, *, block_tokens, prefix_aware,
                   dram, local, flash, n_nodes, policy=P_ALL, param=0.0, flash_lru=True, promotion=PROMOTE,
                   write_through=False, first_measured=0, req_group=None, n_groups=1, values=None,
                   oracle_ok=None, sketch_width=16) -> TierRun:
    """Run the tier simulation over a whole trace in memory (see the module docstring).

    Parameters
    ----------
    block, tokens, pos : int[N]
        Canonical access table columns (dense block id, access tokens, block position
        in its request).
    size : int64[M]
        Tokens each block occupies in a cache.
    req_start : int64[R+1]
        Request offsets.
    req_ts : float64[R]
        Request arrival, seconds.
    req_node : int[R]
        Node serving each request, 0..n_nodes-1.
    block_tokens : int
        Tokens of a full block (for positions: a block at position j starts at j x B).
    prefix_aware : bool
        Request-atomic model (True) or flat (False).
    dram, local, flash : int
        Capacities in tokens: DRAM and local SSD per node, shared flash (0 = no tier;
        a DRAM of 0 holds nothing).
    policy : int
        Admission policy code (``P_*``); ``param`` its parameter (k for ``P_FREQ``).
    flash_lru : bool
        Flash tiers evict least-recently used (True) or first-in first-out (False).
    promotion : int
        ``PROMOTE``, ``COPY`` or ``NO_PROMOTION``.
    write_through : bool
        Write misses to flash at insert (True) or DRAM victims at eviction (False).
    first_measured : int
        Requests before it only warm the tiers (counters, sums and histograms skip them).
    req_group : int32[R], optional
        Group of each request (``P_GROUP``), 0..n_groups-1.
    values : float64[N], optional
        Value ($) of keeping the block after each access (``P_VALUE``; value sums).
    oracle_ok : int8[N], optional
        :func:`reuse_oracle_flags` of the admit-all run (``P_ORACLE``).
    sketch_width : int
        TinyLFU sketch width (a power of two >= 2).
    """
    req_start = np.ascontiguousarray(req_start, dtype=np.int64)
    sim = TierSimulator(size, req_ts, req_node, block_tokens=block_tokens, prefix_aware=prefix_aware, dram=dram,
                        local=local, flash=flash, n_nodes=n_nodes, policy=policy, param=param, flash_lru=flash_lru,
                        promotion=promotion, write_through=write_through, first_measured=first_measured,
                        req_group=req_group, n_groups=n_groups, has_values=values is not None,
                        sketch_width=sketch_width)
    if req_start.shape[0] - 1 != sim.req_first.shape[0]:
        raise ValueError("req_start and req_ts disagree on the number of requests")
    decision = sim.feed(block, tokens, pos, req_start, values, oracle_ok)
    cold = (decision & COLD_FLAG) != 0
    decision &= 3
    return sim.finish(decision, cold)


# --------------------------------------------------------------------------- one kernel per policy
def _specialise(policy: int):
    """:func:`_simulate` compiled for one admission policy: the same code with the
    global ``_KERNEL_POLICY`` bound to a constant, so the compiler drops the other policies'
    branches from the hot loop (three side-by-side runs against one kernel that reads
    the policy at run time: median 1.15x admit-all, 1.19x TinyLFU, 1.02x second-hit).
    Each is compiled on its first use (about 10 s) and cached on disk under its own
    name."""
    name = f"_simulate_{_POLICY_NAMES[policy]}"
    fn = types.FunctionType(_simulate.__code__, {**globals(), "_KERNEL_POLICY": policy}, name)
    fn.__qualname__ = name
    fn.__module__ = __name__
    fn.__doc__ = _simulate.__doc__
    return njit(**NJIT)(fn)


_POLICY_NAMES = ("all", "none", "freq", "prob", "idle", "value", "oracle", "tinylfu", "group")
#: The kernel of each policy code (``P_*``).
_SIMULATE = tuple(_specialise(p) for p in range(len(_POLICY_NAMES)))
