"""Slow, obviously correct twin of vLLM v1's prefix-cache block management (the specification).

This is the specification of kvtrace's ``--cache-rules vllm``: a compiled simulator is compared
with :func:`replay` request by request. Everything is plain Python lists and dicts, O(pool) per
operation; nothing here uses kvtrace's kernels.

Upstream read (repository ``vllm-project/vllm``; several stored versions exist)
-------------------------------------------------------------------------------
- ``vllm/v1/core/block_pool.py`` at ``c59cb7941357443da7c5eef75cfa8697d683d228`` (newest stored:
  ``BlockHashToBlockMap``, ``popleft_n``/``prepend_n``/``append_n``, metrics collector). **This is the
  version followed.** Also read at ``002f34915134cfd1a7d6ed777edd67dcc2289466`` (older,
  ``KVCacheBlockBundle`` era) for the ``append`` free order.
- ``vllm/v1/core/kv_cache_utils.py`` at ``bbf906a88ba1a39104884c88c9811a4f968e4659`` (older
  ``FreeKVCacheBlockQueue`` with head/tail pointers and ``append`` only; ``hash_request_tokens``;
  ``check_enough_kv_cache_memory``).
- ``vllm/v1/core/single_type_kv_cache_manager.py`` at ``002f34915134cfd1a7d6ed777edd67dcc2289466``
  (``FullAttentionManager.find_longest_cache_hit``, ``get_num_blocks_to_allocate``,
  ``allocate_new_blocks``, ``cache_blocks``, ``free``).
- ``vllm/v1/core/kv_cache_manager.py`` at ``003df2961dd8830c317a61f9745ccd557da9fa06``
  (``get_computed_blocks``, ``allocate_slots``, ``free``).
- ``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule`` waiting loop), plus the PR/issue
  threads vllm-project/vllm#33710, #42656 (via #48017), #48017, #51482 (free order) and #35541,
  #39734, #35570, #39828 (requests larger than the pool).

Model
-----
- A request is ``{"blocks": [id, ...], "tokens": [t, ...], "arrival": s, "duration": s}``. Block j
  holds ``tokens[j]`` tokens: ``block_tokens`` (B) for every block but the last, 1..B for the last.
  ``input_tokens = sum(tokens)`` is vLLM's ``request.num_tokens`` (prompt only: decode tokens,
  chunked prefill, lookahead/spec tokens, the watermark, preemption, LoRA/multimodal extra keys
  and hybrid/sliding-window groups are not modelled; one full-attention KV cache group).
- Trace ids are chained block hashes: an equal id at position j means the same tokens
  0..(j+1)*B, so an id stands for vLLM's ``BlockHash`` (``hash_block_tokens`` chains the parent
  hash). Ids inside one request are distinct (asserted).
- ``pool_blocks`` is the number of usable blocks: vLLM's ``num_gpu_blocks`` minus the null block
  (``BlockPool.__init__``: ``self.null_block = self.free_block_queue.popleft()``; ``get_usage``:
  "Subtract 1 to account for null block"). Physical blocks are numbered 1..pool_blocks and the
  free queue starts in id order (``FreeKVCacheBlockQueue.__init__``: "ordered by block ID in the
  beginning"); 0 is the null block and never appears.

Data structures (BlockPool)
---------------------------
- ``free``: the free queue, head first (``FreeKVCacheBlockQueue``). It holds every block with
  ``ref_cnt == 0``: never-used/hashless ones and cached ones (eviction candidates).
- ``ref``: ``KVCacheBlock.ref_cnt``; ``hash_of``: ``KVCacheBlock.block_hash`` (a trace id or None).
- ``cached``: ``cached_block_hash_to_block`` (``BlockHashToBlockMap``): id -> the physical blocks
  carrying that hash, in insertion order. There is no de-duplication ("NOTE #1: We currently
  don't de-duplicate the blocks in the cache"): one id may have several copies.

Rules, one per upstream function
--------------------------------
R1 Hashes (``kv_cache_utils.hash_request_tokens``: "Do not hash the block if it is not full";
   newer versions compute ``request.block_hashes`` the same way). Only full blocks get a hash,
   so a partial last block is never looked up, cached or reused; its tokens still count in
   ``input_tokens`` and it still takes a block. [``Rules.full_blocks_only=False``: kvtrace's
   extension, the partial last block is hashed and cached like a full one.]
R2 Hit length cap (``KVCacheManager.get_computed_blocks``: ``max_cache_hit_length =
   request.num_tokens - 1`` -- "we must recompute the last token to obtain logits"). The hit
   may cover at most ``input_tokens - 1`` tokens; with block granularity
   (``FullAttentionManager.find_longest_cache_hit``: ``max_num_blocks = max_length //
   self.block_size``) a block-aligned prompt's last block never hits. Generalised here as "a
   block hits only if its cumulative token end <= the cap", which is the same for full blocks.
   [``Rules.last_token_cap=False``: cap = ``input_tokens``.]
R3 Lookup (``find_longest_cache_hit``): walk the request's hashes from block 0, stop at the
   first id that is not cached (chained hashes: nothing after a miss can be valid) or at the
   cap; each hit takes the *first* cached copy (``BlockPool.get_cached_block`` /
   ``BlockHashToBlockMap.get_one_block``: "If there are duplicated blocks, we return the first
   block in the cache"; the first is the oldest surviving insertion). ``hit_blocks`` is the
   number found; ``hit_tokens = sum(tokens[:hit_blocks])`` = vLLM's ``num_cached_tokens``
   (= ``hit_blocks * B`` under R1).
R4 Admission check (``SingleTypeKVCacheManager.get_num_blocks_to_allocate`` and
   ``KVCacheManager.allocate_slots``: ``if num_blocks_to_allocate > free: return None``):
   ``need = cdiv(input_tokens, B) - hit_blocks + #(hit blocks with ref_cnt == 0)`` -- a hit
   block that is an eviction candidate leaves the free queue when touched, so it is counted --
   and the request is admitted iff ``need <= len(free)``. Hit blocks held by running requests
   (ref_cnt > 0) cost nothing: they are shared.
R5 Allocation, in ``allocate_slots`` order: (a) ``BlockPool.touch(hit blocks)``: a block with
   ref_cnt 0 is removed from wherever it sits in the free queue, then ref_cnt += 1; (b)
   ``get_new_blocks(cdiv(input_tokens, B) - hit_blocks)`` (via ``allocate_new_blocks``): pop
   that many blocks from the queue *head* (``popleft_n``); each popped block that carries a
   hash is evicted (``_maybe_evict_cached_block``: removed from ``cached``, hash reset) and
   gets ref_cnt 1; (c) ``cache_blocks`` -> ``BlockPool.cache_full_blocks``: blocks
   ``hit_blocks .. input_tokens // B - 1`` get their hash and are appended to ``cached`` under
   it, even if that id already has a copy. So under R2 an aligned prompt whose every block was
   cached recomputes its last block into a *second copy* under the same hash; the copy holds a
   pool slot and changes later evictions. [Under ``full_blocks_only=False`` the partial last
   block is cached too.] The whole prompt is allocated and cached at admission
   (no chunked prefill), so a request admitted later may hit blocks of a running one.
R6 Free (``KVCacheManager.free`` -> ``SingleTypeKVCacheManager.free``: ``ordered_blocks =
   reversed(req_blocks)`` "so that the tail blocks are freed first"; ``BlockPool.free_blocks``):
   ref_cnt -= 1 for every block of the request, then the blocks that reached 0 return to the
   queue, in that tail-first order:
   - ``free_order="hashless-first"`` (**current upstream**: c59cb79; per #48017 "Since #42656
     it always partitions freed blocks", first proposed in #33710; #48017/#51482 only change
     the caching-disabled path):
     ``fresh_blocks = [b for b in freeable if b.block_hash is None]`` go to the queue *front*
     (``prepend_n``, keeping their order, so the first of them becomes the head: evicted/reused
     first) and the hashed ones to the *tail* (``append_n``).
   - ``free_order="append"`` (older upstream, e.g. 002f349 / bbf906a: ``for block in
     ordered_blocks: ... self.free_block_queue.append(block)``): every freed block goes to the
     tail in the given order, hashless ones included.
   Either way the request's block 0 ends nearest the tail (most recent), its last block nearest
   the head among its hashed blocks.
R7 Requests larger than the pool (``cdiv(input_tokens, B) > pool_blocks``). Upstream does NOT
   reject them in the scheduler: ``allocate_slots`` returns None, the waiting loop of
   ``Scheduler.schedule`` breaks ("The request cannot be scheduled") and retries forever,
   blocking every request behind it (issues #35541 and #39734, open; fixes #35570 and #39828
   closed). What upstream does have is a start-up guarantee that one ``max_model_len`` request
   fits (``kv_cache_utils.check_enough_kv_cache_memory``) and the input processor's rejection of
   prompts longer than ``max_model_len``; so a deployment whose ``max_model_len`` fits the pool
   rejects such a request before it reaches the scheduler. [``Rules.reject_oversize=True``
   models that: the request is rejected at arrival, all miss, the cache is unchanged and it
   does not block others. ``reject_oversize=False`` is kvtrace's semantics: the request keeps
   only its first ``pool_blocks`` blocks -- what a request-atomic LRU touching tail-first
   leaves -- i.e. R3-R6 run on ``blocks[:pool_blocks]``; the dropped tail is never cached.]

Modes
-----
- Sequential (``in_flight=False``): requests in list order; each is looked up, allocated,
  cached and freed before the next (arrivals and durations ignored). Every block is free when a
  request starts, so R4 always admits.
- In flight (``in_flight=True``): a request holds its blocks from admission until admission +
  duration. Requests are taken in arrival order (stable for ties) into one FCFS waiting queue;
  the head is admitted when R4 allows, else it waits and blocks everyone behind it (the
  ``break`` above; FCFS policy, no preemption). Events at the same time: first every completion
  at that time (freed in admission order, each by R6), then arrivals join the queue (oversize
  ones are rejected at arrival under R7), then admissions from the head while R4 allows. The hit
  (R3) is computed at admission against the cache as it is then. ``wait_s = admission -
  arrival``. A zero-duration request completes at its admission time and is freed (as a new
  event at that same time) before later admissions are tried.

kvtrace's semantics
-------------------
``Rules(last_token_cap=False, full_blocks_only=False, reject_oversize=False,
free_order="append")`` in sequential mode is exactly kvtrace's ideal prefix-aware LRU
(``tests/naive.py::lru_simulate(..., prefix_aware=True)`` with every block of size 1 and
``capacity = pool_blocks``): every block is hashed, so the free queue is the LRU list (head =
least recent, never-used blocks first) and tail-first freeing is the request-atomic tail-first
touch. Verified in ``tests/test_naive_vllm.py``.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

FREE_ORDERS = ("hashless-first", "append")


@dataclass(frozen=True)
class Rules:
    """Which vLLM behaviours apply; every field False/"append" gives kvtrace's ideal LRU."""

    #: R2: hit at most input_tokens - 1 tokens (a block-aligned prompt's last block never hits; the
    #: recomputed block is cached as a second copy under the same hash, no de-duplication).
    last_token_cap: bool = True
    #: R1: a partial last block is never hashed/cached/reused (its tokens still count).
    full_blocks_only: bool = True
    #: R7: a request needing more blocks than the pool is rejected: all miss, cache unchanged.
    reject_oversize: bool = True
    #: R6: "hashless-first" (current upstream) or "append" (older upstream).
    free_order: str = "hashless-first"

    def __post_init__(self):
        assert self.free_order in FREE_ORDERS, self.free_order


#: kvtrace's ideal prefix-aware LRU, expressed as Rules.
KVTRACE_RULES = Rules(last_token_cap=False, full_blocks_only=False, reject_oversize=False, free_order="append")


@dataclass
class Result:
    """Per request: leading blocks served from the cache, vLLM's num_cached_tokens, rejection, wait."""

    hit_blocks: int = 0
    hit_tokens: int = 0
    rejected: bool = False
    wait_s: float = 0.0


class BlockPool:
    """vLLM's BlockPool + FreeKVCacheBlockQueue with plain lists (see the module docstring)."""

    def __init__(self, pool_blocks: int):
        assert pool_blocks >= 0, pool_blocks  # 0 usable = num_gpu_blocks 1 (the null block only)
        self.pool_blocks = pool_blocks
        self.free: list[int] = list(range(1, pool_blocks + 1))  # head first
        self.ref: dict[int, int] = {b: 0 for b in self.free}
        self.hash_of: dict[int, int | None] = {b: None for b in self.free}
        self.cached: dict[int, list[int]] = {}  # id -> physical copies, oldest first

    # R3
    def get_cached_block(self, block_id: int) -> int | None:
        copies = self.cached.get(block_id)
        return copies[0] if copies else None

    # R5 (a)
    def touch(self, blocks: list[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1

    # R5 (b)
    def get_new_blocks(self, n: int) -> list[int]:
        assert 0 <= n <= len(self.free), (n, len(self.free))
        ret, self.free = self.free[:n], self.free[n:]
        for b in ret:
            self._maybe_evict_cached_block(b)
            assert self.ref[b] == 0
            self.ref[b] = 1
        return ret

    def _maybe_evict_cached_block(self, b: int) -> None:
        h = self.hash_of[b]
        if h is None:
            return
        self.cached[h].remove(b)
        if not self.cached[h]:
            del self.cached[h]
        self.hash_of[b] = None

    # R5 (c)
    def cache_block(self, b: int, block_id: int) -> None:
        assert self.hash_of[b] is None and self.ref[b] > 0
        self.hash_of[b] = block_id
        self.cached.setdefault(block_id, []).append(b)

    # R6
    def free_blocks(self, ordered: list[int], free_order: str) -> None:
        for b in ordered:
            self.ref[b] -= 1
            assert self.ref[b] >= 0
        freeable = [b for b in ordered if self.ref[b] == 0]
        if free_order == "append":
            self.free.extend(freeable)
        else:
            fresh = [b for b in freeable if self.hash_of[b] is None]
            hashed = [b for b in freeable if self.hash_of[b] is not None]
            self.free[:0] = fresh
            self.free.extend(hashed)

    def cached_ids(self) -> set[int]:
        """Ids that would hit now (have at least one physical copy)."""
        return set(self.cached)

    def check(self) -> None:
        """Invariants: ref_cnt == 0 <=> in the free queue; cached mirrors hash_of."""
        assert len(set(self.free)) == len(self.free)
        assert set(self.free) == {b for b, r in self.ref.items() if r == 0}
        assert all(r >= 0 for r in self.ref.values())
        pairs = sorted((h, b) for b, h in self.hash_of.items() if h is not None)
        assert pairs == sorted((h, b) for h, bs in self.cached.items() for b in bs)
        assert all(self.cached.values())


class Replayer:
    """Runs requests through one BlockPool; ``replay`` is the public entry point."""

    def __init__(self, pool_blocks: int, block_tokens: int, rules: Rules = Rules()):
        assert block_tokens >= 1
        self.pool = BlockPool(pool_blocks)
        self.B = block_tokens
        self.rules = rules

    def _validate(self, req) -> None:
        blocks, tokens = list(req["blocks"]), list(req["tokens"])
        assert len(blocks) == len(tokens), req
        assert len(set(blocks)) == len(blocks), f"chained ids repeat inside a request: {blocks}"
        assert all(t == self.B for t in tokens[:-1]), (tokens, self.B)
        assert not tokens or 1 <= tokens[-1] <= self.B, (tokens, self.B)

    def oversize(self, req) -> bool:
        return len(req["blocks"]) > self.pool.pool_blocks

    def plan(self, req):
        """R1-R4 (and R7's truncation): (blocks, tokens, hit physical blocks, need)."""
        self._validate(req)
        blocks, tokens = list(req["blocks"]), list(req["tokens"])
        if self.oversize(req):
            assert not self.rules.reject_oversize
            blocks, tokens = blocks[: self.pool.pool_blocks], tokens[: self.pool.pool_blocks]
        input_tokens = sum(req["tokens"])  # of the whole prompt (the cap is about the prompt)
        cap = input_tokens - 1 if self.rules.last_token_cap else input_tokens
        hits: list[int] = []
        end = 0
        for j, block_id in enumerate(blocks):
            end += tokens[j]
            if not self.hashable(tokens[j]) or end > cap:
                break
            b = self.pool.get_cached_block(block_id)
            if b is None:
                break
            hits.append(b)
        need = len(blocks) - len(hits) + sum(self.pool.ref[b] == 0 for b in hits)
        return blocks, tokens, hits, need

    def hashable(self, t: int) -> bool:
        return t == self.B or not self.rules.full_blocks_only

    def admit(self, blocks, tokens, hits) -> list[int]:
        """R5: touch hits, allocate the rest from the queue head, cache the hashable new blocks."""
        self.pool.touch(hits)
        new = self.pool.get_new_blocks(len(blocks) - len(hits))
        phys = hits + new
        for j in range(len(hits), len(blocks)):
            if self.hashable(tokens[j]):
                self.pool.cache_block(phys[j], blocks[j])
        return phys

    def release(self, phys: list[int]) -> None:
        """R6."""
        self.pool.free_blocks(list(reversed(phys)), self.rules.free_order)

    def sequential(self, req) -> Result:
        if not req["blocks"]:
            return Result()
        if self.oversize(req) and self.rules.reject_oversize:
            return Result(rejected=True)
        blocks, tokens, hits, need = self.plan(req)
        assert need <= len(self.pool.free)  # nothing is running
        phys = self.admit(blocks, tokens, hits)
        self.release(phys)
        self.pool.check()
        return Result(len(hits), sum(tokens[: len(hits)]))

    def in_flight(self, requests) -> list[Result]:
        results = [Result() for _ in requests]
        order = sorted(range(len(requests)), key=lambda i: float(requests[i]["arrival"]))
        pending = list(order)  # not yet arrived, in arrival order
        waiting: list[int] = []  # FCFS
        running: list[tuple[float, int, int, list[int]]] = []  # (end, admission seq, request, phys)
        seq = 0
        while pending or waiting or running:
            # Something must happen next: a waiting head that fits an empty pool is never left behind.
            assert pending or running, "a request that fits an empty pool must be admitted"
            t = min([float(requests[pending[0]]["arrival"])] if pending else [math.inf])
            if running:
                t = min(t, min(r[0] for r in running))
            # 1. completions at t, in admission order
            for r in sorted((r for r in running if r[0] <= t), key=lambda r: r[1]):
                running.remove(r)
                self.release(r[3])
            # 2. arrivals at t (oversize ones rejected at arrival under R7)
            while pending and float(requests[pending[0]]["arrival"]) <= t:
                i = pending.pop(0)
                self._validate(requests[i])
                if self.oversize(requests[i]) and self.rules.reject_oversize:
                    results[i] = Result(rejected=True)
                else:
                    waiting.append(i)
            # 3. admissions from the head while R4 allows
            while waiting:
                i = waiting[0]
                req = requests[i]
                wait_s = t - float(req["arrival"])
                if not req["blocks"]:
                    waiting.pop(0)
                    results[i] = Result(wait_s=wait_s)
                    continue
                blocks, tokens, hits, need = self.plan(req)
                if need > len(self.pool.free):
                    break  # FCFS: the head waits and blocks everyone behind it
                waiting.pop(0)
                phys = self.admit(blocks, tokens, hits)
                results[i] = Result(len(hits), sum(tokens[: len(hits)]), False, wait_s)
                running.append((t + float(req["duration"]), seq, i, phys))
                seq += 1
                if float(req["duration"]) <= 0:
                    break  # its completion is the next event, at this same time
            self.pool.check()
            held = {b for r in running for b in r[3]}  # shared hits counted once
            assert held.isdisjoint(self.pool.free) and len(held) + len(self.pool.free) == self.pool.pool_blocks
        return results


def replay(requests, pool_blocks: int, block_tokens: int, rules: Rules = Rules(), *,
           in_flight: bool = False) -> list[Result]:
    """Replay ``requests`` through vLLM v1's prefix-cache block management (module docstring)."""
    replayer = Replayer(pool_blocks, block_tokens, rules)
    if in_flight:
        return replayer.in_flight(requests)
    return [replayer.sequential(req) for req in requests]
