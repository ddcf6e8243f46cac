"""The tier simulator's block table and its O(1) operations (:mod:`kvtrace.kernels.tiers`
states the semantics; this module is their data layout).

One int32 row per distinct block (:func:`new_state`) holds its state, its constants and
its entry in every tier list, so what an access or an eviction reads of a block is one
64-byte cache line; the sentinel row closes every list. Here: the codes and counter
layouts the kernel and its wrapper share, the doubly linked list operations, the
TinyLFU count-min sketch, the admission test and the residency bins.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtrace.config import NJIT, NJIT_INLINE
from kvtrace.kernels.bits import bit_length
from kvtrace.kernels.memory import table_zeros
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
I_PREFIX, I_FIRST_MEASURED, I_HAS_VALUES, I_TIME_SHIFT, I_BLOCK_TOKENS, I_RULES = range(8, 14)
N_IP = 14
# engine reuse rules (bits of ip[I_RULES]): the last block of a request is recomputed
# (hits capped at its prompt's length - 1 tokens); only full blocks are cached
RULE_LAST_TOKEN_CAP, RULE_FULL_BLOCKS_ONLY = 1, 2
# float parameters (fp)
F_PARAM = 0
N_FP = 1

# slots of a block's row: its state, its constants, then its entry in list L >= LIST0
STAT, INFO, LIST0 = 0, 1, 2
# fields of INFO: tokens the block occupies, oracle flag of its last access, its
# TinyLFU sketch group and offset bits
INFO_SIZE, INFO_ORACLE, _SK_GRP, _SK_OFF = 0, 1, 2, 3
# fields of a list entry / of the block state (request of the last access, accesses so
# far, first request, chunk-local index of its first occurrence in the current group)
PREV, NEXT, INS, TCH = 0, 1, 2, 3
RLAST, COUNT, FIRST_REQ, HEAD = 0, 1, 2, 3
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
#: blocks beyond the usable prefix (recomputed); then what the load model
#: (:mod:`kvtrace.analyses.load`) needs: tokens and q of all the request's accesses and
#: of its usable prefix, the usable-prefix accesses read from the local SSD and from the
#: shared flash (one read each), and the occupied tokens the request's touches wrote to
#: its node's local SSD and to the shared flash (every request, warm-up included).
REQUEST_COLUMNS = ("src_dram_size", "src_local_size", "src_flash_size", "flash_tokens", "flash_q",
                   "miss_tokens", "miss_q", "total_tokens", "total_q", "prefix_tokens", "prefix_q",
                   "local_reads", "flash_reads", "local_write_size", "flash_write_size")
R_SRC, R_FL_TOK, R_FL_Q, R_MISS_TOK, R_MISS_Q = 0, 3, 4, 5, 6
R_TOTAL_TOK, R_TOTAL_Q, R_PRE_TOK, R_PRE_Q, R_READS, R_WRITES = 7, 8, 9, 10, 11, 13
N_REQ_COLS = len(REQUEST_COLUMNS)
#: Request kinds (``req_kind``): a trace's request, a scenario's probe and fetch
#: (:func:`kvtrace.kernels.tier_replay._simulate` states what each does).
REQ_REAL, REQ_PROBE, REQ_FETCH = 0, 1, 2

HIST_TIERS = ("dram", "local", "flash")
HIST_METRICS = ("lifetime_s", "idle_before_eviction_s", "reuse_gap_s")
#: Residency histogram edges, seconds: 0, then one bin per octave from 2**-10 s
#: (~1 ms) to 2**26 s (~2 years, open last bin). Powers of two make the bin of a time
#: exact and cheap (its binary exponent).
HIST_MIN_EXP, HIST_MAX_EXP = -10, 26
HIST_EDGES = np.concatenate([[0.0], 2.0 ** np.arange(HIST_MIN_EXP, HIST_MAX_EXP + 1)])
HIST_LAST = HIST_EDGES.shape[0] - 1


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
def init_sketch_keys(st, sketch):
    """Store each block's sketch group and the 16 offset bits of its hash in its row
    (``INFO`` fields ``_SK_GRP``, ``_SK_OFF``), read with the row at every access."""
    for b in range(st.shape[0] - 1):
        grp, h2 = _sketch_slots(b, sketch)
        st[b, INFO, _SK_GRP] = grp
        st[b, INFO, _SK_OFF] = np.int64(h2 & np.uint64(0xFFFF))


@njit(**NJIT_INLINE)
def _counter(byte, j):
    """Counter j (its nibble) of a sketch byte."""
    return (np.int64(byte) >> ((j & 1) << 2)) & 15


@njit(**NJIT_INLINE)
def _sketch_estimate(sketch, st, b):
    grp = st[b, INFO, _SK_GRP]
    off = st[b, INFO, _SK_OFF]
    mask = 2 * sketch.shape[2] - 1
    est = SKETCH_MAX
    for i in range(4):
        j = (off >> (4 * i)) & mask
        c = _counter(sketch[grp, i, j >> 1], j)
        if c < est:
            est = c
    return est


@njit(**NJIT_INLINE)
def sketch_add(sketch, sk_ops, st, b):
    """Count an access of b (saturating); every ``10 x W`` accesses halve all counters.
    ``sk_ops``: [accesses since the last halving, cached victim, its estimate, its
    group]; the cached estimate is dropped when a block of the victim's group is
    counted (its counters can only change then) or the counters halve."""
    grp = st[b, INFO, _SK_GRP]
    off = st[b, INFO, _SK_OFF]
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
    :func:`sketch_add`)."""
    if sk_ops[_SK_VICTIM] != w:
        sk_ops[_SK_VICTIM] = w
        sk_ops[_SK_VGRP] = st[w, INFO, _SK_GRP]
        sk_ops[_SK_EST] = _sketch_estimate(sketch, st, w)
    return sk_ops[_SK_EST]


@njit(**NJIT_INLINE)
def time_bin(dq, shift):
    """Residency bin of a time difference of ``dq`` quanta of ``2**(HIST_MIN_EXP +
    shift)`` seconds: 0 if dq < 1, else its bit length + shift (the octave of the
    difference in seconds), the last bin open."""
    if dq < 1:
        return 0
    n = bit_length(dq) + shift
    return n if n < HIST_LAST else HIST_LAST


@njit(**NJIT_INLINE)
def link_before(st, L, b, nxt):
    """Link b into list L just before (on the least-recent side of) nxt."""
    p = st[nxt, L, PREV]
    st[p, L, NEXT] = b
    st[b, L, PREV] = p
    st[b, L, NEXT] = nxt
    st[nxt, L, PREV] = b


@njit(**NJIT_INLINE)
def link_mru(st, L, b, M):
    link_before(st, L, b, M)


@njit(**NJIT_INLINE)
def unlink_row(st, L, b):
    p = st[b, L, PREV]
    n = st[b, L, NEXT]
    st[p, L, NEXT] = n
    st[n, L, PREV] = p
    st[b, L, PREV] = ABSENT


@njit(**NJIT_INLINE)
def admit_offer(policy, v, X, now, ip, fp, st, used, cap, req_ts, req_group, gstat, last_val, sketch, sk_ops):
    if policy == P_ALL:
        return True
    if policy == P_NONE:
        return False
    if policy == P_FREQ:
        return st[v, STAT, COUNT] >= ip[I_PARAM]
    if policy == P_PROB:
        return _unit_hash(v) < fp[F_PARAM]
    if policy == P_IDLE:
        return now - req_ts[st[v, STAT, RLAST]] < fp[F_PARAM]
    if policy == P_VALUE:
        return last_val[v] >= fp[F_PARAM]
    if policy == P_ORACLE:
        return st[v, INFO, INFO_ORACLE] != 0
    if policy == P_TINYLFU:
        if used[X] + st[v, INFO, INFO_SIZE] <= cap[X]:
            return True
        M = st.shape[0] - 1
        return _sketch_estimate(sketch, st, v) > _victim_estimate(sketch, sk_ops, st, st[M, X, NEXT])
    g = req_group[st[v, STAT, RLAST]]
    return (gstat[g, 1] + 1.0) / (gstat[g, 0] + 2.0) >= fp[F_PARAM]


@njit(**NJIT_INLINE)
def evict_lru(X, tier, nq, shift, meas, st, used, cnt, hist, sketch, use_sketch):
    """Evict the least-recent block of list X; returns it."""
    M = st.shape[0] - 1
    w = st[M, X, NEXT]
    unlink_row(st, X, w)
    prefetch_row(st, st[st[M, X, NEXT], X, NEXT])  # the victim after next: its row is the next unlink's miss
    if use_sketch and tier == 0:  # the next DRAM victim is the next admission candidate: its sketch group
        prefetch_row(sketch, st[st[M, X, NEXT], INFO, _SK_GRP])
    s = st[w, INFO, INFO_SIZE]
    used[X] -= s
    if meas:
        cnt[C_EVICT + tier] += 1
        cnt[C_EVICT_TOK + tier] += s
        hist[tier, 0, time_bin(nq - st[w, X, INS], shift)] += 1
        hist[tier, 1, time_bin(nq - st[w, X, TCH], shift)] += 1
    return w


@njit(**NJIT_INLINE)
def prefetch_ahead(r, block, req_start, req_node, st, F, has_flash, sketch, use_sketch):
    """Prefetch the rows of request r + 2's blocks, and the list neighbours and sketch
    groups of request r + 1's blocks (rows prefetched one request ago), which its pins
    will unlink and its accesses count (r local to the chunk; ``req_node`` the
    chunk's). Hints only: neighbours may change before then, results never do."""
    n_req = req_start.shape[0] - 1
    if r + 2 < n_req:
        for t in range(req_start[r + 2], min(req_start[r + 3], req_start[r + 2] + _PREFETCH_MAX)):
            prefetch_row(st, block[t])
    if r + 1 < n_req:
        D = LIST0 + req_node[r + 1]
        for t in range(req_start[r + 1], min(req_start[r + 2], req_start[r + 1] + _PREFETCH_MAX)):
            b = block[t]
            if use_sketch:
                prefetch_row(sketch, st[b, INFO, _SK_GRP])
            if st[b, D, PREV] != ABSENT:
                prefetch_row(st, st[b, D, PREV])
                prefetch_row(st, st[b, D, NEXT])
            elif has_flash and st[b, F, PREV] != ABSENT:
                prefetch_row(st, st[b, F, PREV])
                prefetch_row(st, st[b, F, NEXT])


# --------------------------------------------------------------------------- the block table


def aligned_zeros(n: int) -> np.ndarray:
    """uint8[n] of zeros starting on a 64-byte boundary (a cache line)."""
    buf = table_zeros(n + 64, np.uint8)
    off = -buf.ctypes.data % 64
    return buf[off:off + n]


def new_state(size, n_lists: int, scratch=None) -> np.ndarray:
    """The simulator state, int32[M + 1, S, 4]: row b holds block b's state (slot
    ``STAT``: request of its last access, access count, first request, head of its
    touch group), its constants and admission inputs (slot ``INFO``: tokens it
    occupies, oracle flag of its last access, TinyLFU sketch group and offset bits)
    and its entry in each list (slot ``LIST0 + L``: prev, next, insert time,
    last-touch time; prev = ``ABSENT`` when not in the list). Row M is every list's
    sentinel. One row per block keeps what an access or an eviction reads of a block
    in one cache line (rows of 4 slots are 64 bytes, aligned), so S is the slot count
    rounded up to a multiple of 4. With
    ``scratch`` (:class:`kvtrace.kernels.memory.Scratch`) the table reuses its memory."""
    n_blocks = size.shape[0]
    slots = LIST0 + n_lists
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
        st[b, STAT, COUNT] = 0
        st[b, INFO, INFO_ORACLE] = 0
        if b < M:
            st[b, INFO, INFO_SIZE] = size[b]
    for k in range(LIST0, st.shape[1]):
        st[M, k, PREV] = M
        st[M, k, NEXT] = M
