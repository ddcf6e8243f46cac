"""Exact event simulation of a DRAM tier over flash tiers (DESIGN §2 "Tier simulator").

Everything here is in **tokens** (bytes = tokens x kv_bytes_per_token) and indexed by
dense block id; no hashing on the hot path. The public wrapper is
:func:`kvtrace.analyses.whatif.simulate`; this module is arrays in, arrays out. The slow twin
``tests/naive_tiers.py`` is the executable specification of everything below.
Here: :class:`TierSimulator` (the state carried between chunks) and its one-call
form :func:`simulate_tiers`; the replay kernel is :mod:`kvtrace.kernels.tier_replay`,
the block table and its O(1) operations :mod:`kvtrace.kernels.tier_table`.

Tiers and lists
---------------
Each node ``n`` has a DRAM tier (list ``n``) and optionally a local SSD (list
``N + n``); all nodes share one flash pool (the last list). A tier is a doubly
linked list over block ids (entry ``st[b, LIST0 + L] = prev, next, insert time,
last-touch time``, int32; sentinel row ``M``: ``next`` = least recent, ``prev`` = most recent)
plus a token counter, so every event is O(1). ``prev = -1`` means "not in this tier".
Row ``b`` also holds the block's state and size, so what an access reads shares one
64-byte cache line (``tier_table.new_state``). Memory: ``16 x S x (M + 1)`` bytes with S =
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

Engine reuse rules (``rules``, bits of ``ip[I_RULES]``; 0 = none)
----------------------------------------------------------------
What the serving engines allow any tier to reuse (``--cache-rules vllm|sglang``):

- ``RULE_FULL_BLOCKS_ONLY``: an access not of ``block_tokens`` tokens (a partial last
  block) is never cached: it is not decided, touched or counted for any policy
  (the tiers never see it); it is accounted a cold miss (its tokens recomputed).
- ``RULE_LAST_TOKEN_CAP``: the request's last access is recomputed (the engines cap a
  hit at the prompt's length - 1 tokens): it is decided and touched as any access (the
  tiers see the block the engine stores again, so their state is the ideal model's),
  but its decision is ``MISS`` and it is accounted a miss (not read, ending the usable
  prefix); it stays cold or not as decided.

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
from typing import NamedTuple

import numpy as np

from kvtrace.kernels.memory import Scratch
from kvtrace.kernels.tier_replay import SIMULATE, oracle_flags_chunk
from kvtrace.kernels.tier_table import (
    COLD_FLAG, COPY, COUNT_NAMES, DRAM, FLASH, F_PARAM, HIST_EDGES, HIST_MAX_EXP, HIST_METRICS, HIST_MIN_EXP,
    HIST_TIERS, I_BLOCK_TOKENS, I_FIRST_MEASURED, I_FLASH_LRU, I_HAS_FLASH, I_HAS_LOCAL, I_HAS_VALUES, I_NODES,
    I_PARAM, I_POLICY, I_PREFIX, I_PROMOTION, I_RULES, I_TIME_SHIFT, I_WRITE_THROUGH, LOCAL, MISS, NO_PROMOTION,
    N_COUNTS, N_FP, N_IP, N_REQ_COLS, N_SUMS, PROB_SEED, PROMOTE, P_ALL, P_FREQ, P_GROUP, P_IDLE, P_NONE, P_ORACLE,
    P_PROB, P_TINYLFU, P_VALUE, REQUEST_COLUMNS, RULE_FULL_BLOCKS_ONLY, RULE_LAST_TOKEN_CAP, SKETCH_MAX,
    SKETCH_RESET_FACTOR, SKETCH_SEED, SUM_NAMES, LIST0, aligned_zeros, init_sketch_keys, new_state,
)


def reuse_oracle_flags(block, n_blocks, decision_all):
    """The ``reuse-oracle`` admission input: int8[N], 1 at access t iff the block's
    next access exists and was served from a flash tier (LOCAL or FLASH) in the
    admit-all run whose decisions are ``decision_all``. One backward pass carrying a
    byte per block (:func:`oracle_flags_chunk`)."""
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
    req_out : float64[R, N_REQ_COLS] — :data:`REQUEST_COLUMNS` per request (warm-up included;
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


class TierSimulator:
    """The tier simulation, fed whole requests in order, one chunk or many.

    All state (tiers, block rows, sketch, counters, per-request outputs) lives here
    between :meth:`feed` calls, so feeding a trace in chunks gives the results of one
    call over the whole trace, bit for bit (module docstring, "Chunks"). Memory:
    the block rows (``tier_table.new_state``), 8 bytes per block with ``has_values``, and the
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
                 scratch=None, chunk_columns=False, rules=0) -> None:
        size = np.ascontiguousarray(size, dtype=np.int64)
        M = size.shape[0]
        N = int(n_nodes)
        req_ts = np.ascontiguousarray(req_ts, dtype=np.float64)
        n_req = req_ts.shape[0]
        has_local = int(local) > 0
        has_flash = int(flash) > 0
        n_lists = N * (1 + int(has_local)) + int(has_flash)
        # capacity of each list (from LIST0: DRAM per node, local SSD per node, shared flash)
        cap = np.zeros(LIST0 + n_lists, dtype=np.int64)
        cap[LIST0:LIST0 + N] = int(dram)
        if has_local:
            cap[LIST0 + N:LIST0 + 2 * N] = int(local)
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
        self.st = new_state(size, n_lists, scratch)
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
        ip[I_RULES] = int(rules)
        self.fp = np.zeros(N_FP, dtype=np.float64)
        self.fp[F_PARAM] = float(param)
        use_sketch = int(policy) == P_TINYLFU
        width = int(sketch_width) if use_sketch else 2
        if width < 2 or width & (width - 1):
            raise ValueError("the sketch width must be a power of two >= 2")
        g = min(16, width)
        self.sketch = aligned_zeros(2 * width).reshape(width // g, 4, g // 2)  # 4-bit counters
        if use_sketch:
            init_sketch_keys(self.st, self.sketch)
        self.sk_ops = np.array([0, -1, 0, -1], dtype=np.int64)
        self.gstat = np.zeros((max(1, int(n_groups)), 2), dtype=np.int64)
        self.req_group = (np.zeros(n_req, dtype=np.int32) if req_group is None
                          else np.ascontiguousarray(req_group, dtype=np.int32))
        self.last_val = np.zeros(M if has_values else 0, dtype=np.float64)
        self.req_first = np.full(n_req, MISS, dtype=np.int8)
        self.req_level = np.full(n_req, MISS, dtype=np.int8)
        # per-request outputs by column (each column contiguous); TierRun gets the (R, N_REQ_COLS) view
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
        self.used = np.zeros(LIST0 + n_lists, dtype=np.int64)
        self.req_node = np.ascontiguousarray(req_node, dtype=np.int32)
        # the kind of each request (REQ_REAL; a scenario's probes and fetches: tier_replay._simulate)
        self.req_kind = np.zeros(n_req, dtype=np.int8)
        self.next_request = 0  # the next chunk starts here

    def add_requests(self, n: int) -> None:
        """Room for ``n`` more requests after the last (a scenario's fetches decided during
        the replay; their time, quantum, node and kind are set before each is fed)."""
        if n <= 0:
            return
        if self.req_cols is not None:
            raise ValueError("requests are added only with chunk_columns")

        def grown(a: np.ndarray, fill) -> np.ndarray:
            return np.concatenate([a, np.full(n, fill, dtype=a.dtype)])

        self.req_ts = grown(self.req_ts, self.req_ts[-1] if self.req_ts.shape[0] else 0.0)
        self.req_tq = grown(self.req_tq, self.req_tq[-1] if self.req_tq.shape[0] else 0)
        self.req_node, self.req_kind = grown(self.req_node, 0), grown(self.req_kind, 0)
        self.req_group = grown(self.req_group, 0)
        self.req_first, self.req_level = grown(self.req_first, MISS), grown(self.req_level, MISS)

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
            SIMULATE[int(self.ip[I_POLICY])](
                      block, _ints(tokens), _ints(pos), req_start, r0, self.req_ts, self.req_tq, self.req_node,
                      self.req_group, self.req_kind, values, oracle_ok, self.ip, self.fp, self.cap, self.st, self.used,
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
                   oracle_ok=None, sketch_width=16, rules=0) -> TierRun:
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
    rules : int
        Engine reuse rules, bits ``RULE_LAST_TOKEN_CAP`` | ``RULE_FULL_BLOCKS_ONLY``
        (module docstring, "Engine reuse rules"); 0 = kvtrace's ideal model.
    """
    req_start = np.ascontiguousarray(req_start, dtype=np.int64)
    sim = TierSimulator(size, req_ts, req_node, block_tokens=block_tokens, prefix_aware=prefix_aware, dram=dram,
                        local=local, flash=flash, n_nodes=n_nodes, policy=policy, param=param, flash_lru=flash_lru,
                        promotion=promotion, write_through=write_through, first_measured=first_measured,
                        req_group=req_group, n_groups=n_groups, has_values=values is not None,
                        sketch_width=sketch_width, rules=rules)
    if req_start.shape[0] - 1 != sim.req_first.shape[0]:
        raise ValueError("req_start and req_ts disagree on the number of requests")
    decision = sim.feed(block, tokens, pos, req_start, values, oracle_ok)
    cold = (decision & COLD_FLAG) != 0
    decision &= 3
    return sim.finish(decision, cold)


__all__ = ["COLD_FLAG", "COPY", "COUNT_NAMES", "DRAM", "FLASH", "HIST_EDGES", "HIST_MAX_EXP", "HIST_METRICS",
           "HIST_MIN_EXP", "HIST_TIERS", "LOCAL", "MISS", "NO_PROMOTION", "PROB_SEED", "PROMOTE", "P_ALL", "P_FREQ",
           "P_GROUP", "P_IDLE", "P_NONE", "P_ORACLE", "P_PROB", "P_TINYLFU", "P_VALUE", "REQUEST_COLUMNS",
           "RULE_FULL_BLOCKS_ONLY", "RULE_LAST_TOKEN_CAP",
           "SKETCH_MAX", "SKETCH_RESET_FACTOR", "SKETCH_SEED", "SUM_NAMES", "TierRun", "TierSimulator",
           "oracle_flags_chunk", "quantise_times", "reuse_oracle_flags", "simulate_tiers", "sketch_width"]
