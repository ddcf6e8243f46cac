"""Slow, obviously correct twin of SGLang's radix prefix cache as the scheduler drives it (the specification).

This is the specification of kvtrace's ``--cache-rules sglang``: a compiled simulator is compared with
:func:`replay` request by request. Plain Python objects and lists, O(tree) per operation; nothing here
uses kvtrace's kernels.

Upstream read (repository ``sgl-project/sglang``; the index stores many versions of each file)
------------------------------------------------------------------------------------------------
- ``python/sglang/srt/mem_cache/radix_cache.py`` at ``006b0e3d317f1cd4a7300e919a4eaa878b1947e7``
  (``EvictParams``/``evictable_leaves`` era). **The version followed**: ``TreeNode``, ``match_prefix``,
  ``_match_prefix_helper``, ``_split_node``, ``insert``/``_insert_helper``, ``evict``,
  ``_delete_leaf``/``_update_leaf_status`` (which replace ``_collect_leaves`` in this version),
  ``inc_lock_ref``/``dec_lock_ref``, ``cache_finished_req``, ``page_align_keys``. Also glanced at
  ``95769b280eaaf946a45dd3b50f7e864df09ac893`` (an old 18 kB version).
- ``python/sglang/srt/mem_cache/evict_policy.py`` at ``008b79d2358b08adf9b6c879625030f890c8c4e2``
  (``LRUStrategy.get_priority``: ``return node.last_access_time``; the default ``--radix-eviction-policy lru``).
- ``python/sglang/srt/mem_cache/common.py``: two generations. (a) The one matching radix_cache 006b0e3d
  (``req.req_pool_idx``, ``tree_cache.evict``; index id 59348681949, its commit is not shown by the index):
  ``alloc_token_slots``, ``evict_from_tree_cache`` (``if allocator.available_size() < num_tokens:
  tree_cache.evict(EvictParams(num_tokens=num_tokens))``), ``alloc_paged_token_slots_extend`` (``# Over
  estimate the number of tokens: assume each request needs a new page.`` ``num_tokens = extend_num_tokens +
  len(seq_lens_cpu) * allocator.page_size``). (b) The newer ``0057abea41fceae867b023fc2962c340e11990de``
  (``req.kv.*``, ``evict_for_alloc``): ``# Standard allocator: evict only the shortfall (mirrors the SWA arm)``
  ``EvictParams(num_tokens=num_tokens - available_size)``. ``Rules.evict_amount`` picks one.
- ``python/sglang/srt/managers/schedule_policy.py`` at ``00550cd11b35def9d584bf761a1e32729c20a21d`` and other
  stored versions of ``PrefillAdder.add_one_req``: ``total_tokens = req.extend_input_len + max_new +
  self.page_size`` / ``if total_tokens >= self.rem_total_tokens: return AddReqResult.NO_TOKEN``, checked again
  under ``with self._lock_node(req.last_node)``; ``rem_total_tokens`` = available + evictable - reserved.
- ``python/sglang/srt/managers/schedule_batch.py`` (``Req.init_next_round_input``, ``adjust_max_prefix_ids`` /
  ``_compute_max_prefix_len``: ``max_prefix_len = input_len - 1``) and the scheduler's
  ``validate_input_length``: ``if len(req.origin_input_ids) >= max_req_input_len:`` (abort, or truncate with
  ``allow_auto_truncate``), with (tp_worker) ``self.max_req_len = min(self.model_config.context_len - 1,
  self.max_total_num_tokens - 1)`` and ``self.max_req_input_len = self.max_req_len - 5`` (older versions had
  no ``- 5`` and truncated instead of rejecting).

Model
-----
- A request is ``{"blocks": [id, ...], "tokens": [t, ...], "arrival": s, "duration": s, "decode_pages": d}``
  (``duration`` and ``decode_pages`` default to 0; ``arrival`` is read in flight only); block j holds
  ``tokens[j]`` tokens (``B = page_size`` for all but the last, 1..B for the last); ``input_len = sum(tokens)``
  is ``len(req.origin_input_ids)``. Ids are chained block hashes: an equal id at position j means the same
  tokens 0..(j+1)*B, so a page's tokens can be replaced by its id everywhere upstream compares pages
  (``_key_match_paged`` compares ``page_size``-token slices; ``get_child_key`` is the first page).
- The pool has ``pool_pages`` pages (``max_total_num_tokens = pool_pages * B``), counted, not numbered.
  Pages are either free, in the tree, or held by a running request (its newly allocated pages and its
  decode pages, until it finishes). Invariant (checked after every operation): free + tree + held = pool_pages.
- Decode pages (``decode_pages``, kvtrace's ``--cache-decode``: the pages the output fills beyond the prompt's
  pages) follow kvtrace's vLLM convention: counted in the admission check as ``max_new = decode_pages * B``
  tokens (``total_tokens = req.extend_input_len + max_new + self.page_size``), taken with the prompt's new pages
  at admission (S5/S6: ``need`` includes them), held until the request finishes, then freed, never inserted.
  Upstream differs in two ways the trace cannot express: decode pages are allocated step by step
  (``common.py::alloc_for_decode``; the adder reserves for each running request
  ``_get_running_request_total_token_offset`` = ``min(max_new_tokens - len(output_ids), CLIP_MAX_NEW_TOKENS) *
  new_token_ratio`` tokens, ``rem_total_token_offset``), and ``cache_finished_req`` inserts ``(origin_input_ids +
  output_ids)[:kv_committed_len]``, i.e. the output pages too, under keys made of output tokens the trace does
  not give (no later trace request can be matched against them; caching them would only take room).
- Not modelled: the output tokens' keys (above), chunked prefill, batching several requests into one
  ``alloc_paged_token_slots_extend`` call (here each admission allocates alone), the running batch's
  ``rem_total_token_offset``, retraction, hierarchical cache, LoRA/extra keys, EAGLE bigram keys,
  ``context_len`` (assumed larger than the pool).

Data structure (``TreeNode``)
-----------------------------
A node holds a run of consecutive pages (``key`` = their ids), ``children`` keyed by the first id of the
child, ``parent``, ``lock_ref`` and ``last_access_time``. The root has ``lock_ref = 1`` (``reset``) and no
pages. Evictable leaves: nodes with ``lock_ref == 0`` and no children (``_update_leaf_status``).

Clock
-----
``last_access_time`` is ``time.monotonic()`` upstream; here a logical clock ``tick()`` strictly increasing by
one per reading. Readings happen where upstream calls ``time.monotonic()``: once at the start of a
``_match_prefix_helper`` / ``_insert_helper`` walk (``access_time``, given to the root and to every node
the walk visits) and once per ``TreeNode()`` constructed (a node made by ``_split_node`` or a new leaf made
by the insert), in creation order, so nodes created in a walk are newer than the nodes it visits.

Rules, one per upstream function
--------------------------------
S1 Validation (``validate_input_length``): with ``reject_oversize`` a request with
   ``input_len >= pool_pages * B - 6`` (``>= max_req_input_len``) is rejected: all miss, cache unchanged,
   it takes no slot and blocks nobody. [``reject_oversize=False``: kvtrace's semantics, see S4.]
S2 Match key (``init_next_round_input``/``_compute_max_prefix_len`` then ``match_prefix``): the key is the
   first ``input_len - 1`` tokens (``last_token_cap``; else ``input_len``), truncated to whole pages
   (``page_aligned_len = len(key) // self.page_size * self.page_size``). Generalised for kvtrace's partial
   pages: the key is the longest run of leading *keyable* pages whose cumulative token end <= the cap
   (keyable = full pages under ``full_pages_only``, every page otherwise). An empty key returns the root
   without touching anything (``if len(key) == 0: return empty_match_result()``).
S3 Match walk (``_match_prefix_helper``): ``t = tick()``; root gets t; while the next key page is a child:
   the child gets t (``child.last_access_time = access_time``, before the split test); if the key diverges
   inside it (or ends inside it) the child is split at that page boundary (``_split_node``: a new node with
   the matched pages, ``lock_ref`` copied, a fresh tick, becomes the parent of the old node, which keeps
   the unmatched remainder -- and the time t just given, i.e. the remainder is refreshed) and the walk
   stops there; else descend. Returns the matched pages (``hit_blocks``) and ``last_node``.
   [``split_refresh=False``: the remainder keeps its old time; needed for kvtrace's LRU, whose untouched
   blocks keep their recency. The same refresh happens in S7's insert walk and the flag governs both.]
   ``hit_tokens`` = ``len(req.prefix_indices)`` = tokens of the hit pages (``hit_blocks * B`` upstream).
S4 Admission (``PrefillAdder.add_one_req``): lock ``last_node`` (``_lock_node``: ``inc_lock_ref`` adds 1 to
   every node on the path to the root), then admitted iff ``extend + reserve < (free + evictable) * B``
   (``extend + decode_pages * B + reserve`` with decode pages, see Model; they are also part of S5's ``need``)
   (strict: ``if total_tokens >= self.rem_total_tokens: return AddReqResult.NO_TOKEN``; so even a request
   needing no new page waits while nothing is free or evictable), with
   ``extend = input_len - hit_tokens``, ``reserve = B`` if ``reserve_page`` (``+ self.page_size``) else 0,
   ``evictable`` = pages of nodes with ``lock_ref == 0``. Not admitted: unlock and wait (in flight) -- but
   if nothing is running the request can never be admitted: upstream would then block the FCFS queue for
   ever (e.g. B > 6 and ``pool*B - B <= input_len < pool*B - 6`` passes S1 and never fits); the twin
   rejects it instead (``reason="never fits"``) under ``reject_oversize``, and under
   ``reject_oversize=False`` (kvtrace) admits it *truncated*: it keeps only its first
   ``hit + free + evictable`` pages (what an LRU touching tail-first keeps), the rest is dropped.
S5 Eviction before allocation (``alloc_paged_token_slots_extend`` -> ``evict_from_tree_cache``):
   ``need = extend + reserve`` tokens (``reserve = B`` if ``reserve_page`` and B > 1: with page_size 1
   ``alloc_token_slots`` is used, without the over-estimate; a truncated request needs exactly its new
   pages); if ``free * B < need``: ``evict(need)`` (``evict_amount="need"``, common.py generation (a)) or
   ``evict(need - free * B)`` (``"shortfall"``, generation (b)). ``evict(n)`` (``RadixCache.evict``):
   heap of the evictable leaves keyed by ``last_access_time`` (LRU strategy); pop the least recent, free
   all its pages (``num_evicted += len(x.value)``), delete it, push its parent if that became an
   evictable leaf; repeat while ``evicted < n`` tokens and the heap is not empty. So a whole node goes even
   if one page was needed. [``whole_leaf_eviction=False``: kvtrace's page LRU: pop the least recent leaf,
   free only its *last* (deepest) page, push it back if pages remain; ties (impossible here: two leaves
   never share a time, as nodes sharing a time lie on one root path) broken deepest first.]
S6 Allocation (``allocator.alloc_extend``): the request takes ``pages - hit`` (possibly truncated) free
   pages; upstream raises OOM if they are not there -- asserted never to happen.
S7 Finish (``cache_finished_req``): the insert key is the request's keyable pages
   (``page_align_keys``; a truncated request's kept pages only); ``_insert_helper``: ``t = tick()``,
   root gets t; walk while the next page is a child: the child gets t, split it if the key diverges inside
   (the new upper node gets a fresh tick; remainder refreshed as in S3), descend; a non-empty rest becomes
   one new leaf (fresh tick) made of the request's pages. It returns ``prefix`` = pages already in the
   tree. Then ``free(kv_indices[req.cache_protected_len : new_prefix_len])``: the request's pages at
   positions ``hit .. prefix-1`` are duplicates of tree pages and are freed (under ``last_token_cap`` the
   recomputed last page of a fully cached prompt; in flight, pages another request inserted meanwhile);
   ``free(kv_indices[len(keys):])`` frees the unaligned tail (the partial last page under
   ``full_pages_only``); finally ``dec_lock_ref(req.last_node)``.

Modes
-----
- Sequential (``in_flight=False``): list order; each request is matched, admitted (nothing else runs),
  allocated, inserted and released before the next; arrivals and durations are ignored.
- In flight (``in_flight=True``): requests in arrival order (stable) join one FCFS queue; the head is tried
  (S2-S4: every try re-matches, as ``init_next_round_input`` runs again each scheduling round, which may
  split and refresh) when it reaches the head and after every event; if not admitted it waits and blocks
  everyone behind it (``AddReqResult.NO_TOKEN`` stops the adder loop). An admitted request holds its
  path lock and new pages until ``admission + duration``, then S7. Events at equal times: completions
  first (by end time, then admission order), then arrivals join the queue, then admissions from the head;
  after each admission, completions due at that same time (zero durations) run before the next
  admission. So zero durations give the sequential mode. ``wait_s = admission - arrival``.

kvtrace's semantics
-------------------
``KVTRACE_RULES`` (cap off, partial pages cached, no rejection/truncation to the pool, page LRU, evict the
shortfall, no reserve, no split refresh) in sequential mode is exactly ``tests/naive.py::lru_simulate(...,
prefix_aware=True)`` with every block of size 1 and ``capacity = pool_pages`` (hits and cache contents after
every request), verified in ``tests/test_naive_sglang.py``. Why it holds: with tail-first touches a parent
is always more recent than its child, so the LRU victim is always a leaf of the cached trie; a tree node's
pages share one touch history (a node is split whenever a walk touches part of it), and node times order
requests; at most one leaf per request path, so leaf times never tie.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import dataclass

EVICT_AMOUNTS = ("need", "shortfall")


@dataclass(frozen=True)
class Rules:
    last_token_cap: bool = True  # S2: match at most input_len - 1 tokens; the recomputed duplicate is freed (S7)
    full_pages_only: bool = True  # S2/S7: a partial last page is never inserted or reused (its tokens count)
    reject_oversize: bool = True  # S1/S4: input_len >= pool*B - 6 rejected; False: truncated to the pool
    whole_leaf_eviction: bool = True  # S5: False = page by page (LRU leaf, its deepest page)
    evict_amount: str = "need"  # S5: "need" = evict(need) (common.py gen. a), "shortfall" = evict(need - avail)
    reserve_page: bool = True  # S4/S5: one extra page per request in the admission check and the eviction
    split_refresh: bool = True  # S3/S7: the unmatched remainder of a split node gets the walk's time

    def __post_init__(self):
        assert self.evict_amount in EVICT_AMOUNTS, self.evict_amount


KVTRACE_RULES = Rules(last_token_cap=False, full_pages_only=False, reject_oversize=False,
                      whole_leaf_eviction=False, evict_amount="shortfall", reserve_page=False,
                      split_refresh=False)


@dataclass
class Result:
    hit_blocks: int = 0  # leading pages served from the cache
    hit_tokens: int = 0  # len(req.prefix_indices): the cached tokens SGLang reports
    rejected: bool = False
    reason: str = ""  # "validation" (S1) or "never fits" (S4) when rejected; "truncated" when cut to the pool
    wait_s: float = 0.0  # in flight: admission - arrival


class Node:
    _ids = itertools.count()

    def __init__(self, key, parent, time):
        self.key: list[int] = list(key)  # page ids
        self.parent: Node | None = parent
        self.children: dict[int, Node] = {}
        self.lock_ref = 0
        self.time = time  # last_access_time
        self.uid = next(Node._ids)

    def depth(self) -> int:
        d, n = 0, self
        while n.parent is not None:
            d, n = d + 1, n.parent
        return d


@dataclass
class Running:
    index: int
    last_node: Node
    hit: int
    new_pages: int
    decode: int  # decode pages held (freed at finish, never inserted)
    insert_key: list
    end: float
    seq: int


class Replayer:
    """One SGLang radix cache over a pool of ``pool_pages`` pages of ``page_size`` tokens."""

    def __init__(self, pool_pages: int, page_size: int, rules: Rules = Rules()):
        assert pool_pages >= 0 and page_size >= 1
        self.P, self.B, self.rules = int(pool_pages), int(page_size), rules
        self.clock = 0
        self.root = Node([], None, self.tick())
        self.root.lock_ref = 1
        self.free = self.P
        self.held = 0  # pages held by running requests (not in the tree)

    # ----------------------------------------------------------------- helpers
    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def nodes(self):
        stack = [self.root]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def tree_pages(self) -> int:
        return sum(len(n.key) for n in self.nodes())

    def cached_ids(self) -> set:
        return {b for n in self.nodes() for b in n.key}

    def evictable_pages(self) -> int:
        return sum(len(n.key) for n in self.nodes() if n is not self.root and n.lock_ref == 0)

    def check(self) -> None:
        assert self.free >= 0 and self.held >= 0
        assert self.free + self.tree_pages() + self.held == self.P, (self.free, self.tree_pages(), self.held)
        for n in self.nodes():
            for first, c in n.children.items():
                assert c.parent is n and c.key and c.key[0] == first
                assert c.lock_ref <= n.lock_ref or n is self.root

    def inc_lock_ref(self, node: Node) -> None:
        while node is not self.root:
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: Node) -> None:
        while node is not self.root:
            assert node.lock_ref > 0
            node.lock_ref -= 1
            node = node.parent

    # ----------------------------------------------------------------- tree (radix_cache.py)
    def _split(self, child: Node, k: int) -> Node:
        """``_split_node``: new node with child's first k pages above child (fresh tick, lock_ref copied)."""
        parent = child.parent
        new = Node(child.key[:k], parent, self.tick())
        new.lock_ref = child.lock_ref
        child.key = child.key[k:]
        child.parent = new
        new.children = {child.key[0]: child}
        parent.children[new.key[0]] = new
        return new

    @staticmethod
    def _common(a: list, b: list) -> int:
        i = 0
        while i < len(a) and i < len(b) and a[i] == b[i]:
            i += 1
        return i

    def match(self, key: list) -> tuple[int, Node]:
        """``match_prefix`` / ``_match_prefix_helper`` (S3)."""
        if not key:
            return 0, self.root
        t = self.tick()
        node = self.root
        node.time = t
        n = 0
        while n < len(key) and key[n] in node.children:
            child = node.children[key[n]]
            plen = self._common(child.key, key[n:])
            if plen < len(child.key):
                if self.rules.split_refresh:
                    child.time = t
                node = self._split(child, plen)
                n += plen
                break
            child.time = t
            node = child
            n += plen
        return n, node

    def insert(self, key: list) -> int:
        """``insert`` / ``_insert_helper`` (S7): returns the pages already in the tree."""
        t = self.tick()
        node = self.root
        node.time = t
        if not key:
            return 0
        n = 0
        while n < len(key) and key[n] in node.children:
            node = node.children[key[n]]
            plen = self._common(node.key, key[n:])
            n += plen
            if plen < len(node.key):
                if self.rules.split_refresh:
                    node.time = t
                node = self._split(node, plen)
            else:
                node.time = t
        if n < len(key):
            leaf = Node(key[n:], node, self.tick())
            node.children[key[n]] = leaf
        return n

    def evict(self, num_tokens: int) -> int:
        """``RadixCache.evict`` (S5); returns the tokens evicted."""
        def entry(x: Node):
            return (x.time, -x.depth(), x.uid, x)

        heap = [entry(n) for n in self.nodes()
                if n is not self.root and n.lock_ref == 0 and not n.children]
        heapq.heapify(heap)
        assert len({e[0] for e in heap}) == len(heap), "two evictable leaves share a last_access_time"
        evicted = 0
        while evicted < num_tokens and heap:
            x = heapq.heappop(heap)[3]
            k = len(x.key) if self.rules.whole_leaf_eviction else 1
            del x.key[len(x.key) - k:]
            self.free += k
            evicted += k * self.B
            if x.key:
                heapq.heappush(heap, entry(x))
                continue
            parent = x.parent
            for first, c in list(parent.children.items()):
                if c is x:
                    del parent.children[first]
            if parent is not self.root and parent.lock_ref == 0 and not parent.children:
                assert all(e[0] != parent.time for e in heap)
                heapq.heappush(heap, entry(parent))
        return evicted

    # ----------------------------------------------------------------- scheduler
    def _keyable(self, tokens: list) -> int:
        if not self.rules.full_pages_only:
            return len(tokens)
        n = 0
        while n < len(tokens) and tokens[n] == self.B:
            n += 1
        return n

    def _match_key(self, blocks: list, tokens: list) -> list:
        cap = sum(tokens) - 1 if self.rules.last_token_cap else sum(tokens)
        end, n = 0, 0
        for j in range(self._keyable(tokens)):
            end += tokens[j]
            if end > cap:
                break
            n = j + 1
        return blocks[:n]

    def try_admit(self, index: int, req: dict, idle: bool, now: float = 0.0, seq: int = 0):
        """S1-S6. Returns (Result, Running or None), or None if the request must wait."""
        blocks, tokens = [int(b) for b in req["blocks"]], [int(t) for t in req["tokens"]]
        assert len(blocks) == len(tokens) and len(set(blocks)) == len(blocks), req
        assert all(1 <= t <= self.B for t in tokens) and all(t == self.B for t in tokens[:-1]), req
        B, rules = self.B, self.rules
        input_len = sum(tokens)
        if not blocks:
            return Result(), None
        if rules.reject_oversize and input_len >= self.P * B - 6:
            return Result(rejected=True, reason="validation"), None
        hit, last = self.match(self._match_key(blocks, tokens))
        hit_tokens = sum(tokens[:hit])
        extend = input_len - hit_tokens
        new_pages = len(blocks) - hit
        decode = int(req.get("decode_pages", 0))
        self.inc_lock_ref(last)
        room = self.free + self.evictable_pages()
        reserve = B if rules.reserve_page else 0
        result = Result(hit, hit_tokens)
        if extend + decode * B + reserve < room * B:
            need = extend + decode * B + (B if rules.reserve_page and B > 1 else 0)
        elif not idle:
            self.dec_lock_ref(last)
            return None
        elif rules.reject_oversize:
            self.dec_lock_ref(last)
            return Result(rejected=True, reason="never fits"), None
        else:  # truncated: the prompt's pages first, then what room is left for decode pages
            wanted = (new_pages, decode)
            new_pages = min(new_pages, room)
            decode = min(decode, room - new_pages)
            need = (new_pages + decode) * B
            result.reason = "truncated" if (new_pages, decode) != wanted else ""
        if self.free * B < need:
            self.evict(need if rules.evict_amount == "need" else need - self.free * B)
        assert self.free >= new_pages + decode, "upstream: Prefill out of memory"
        self.free -= new_pages + decode
        self.held += new_pages + decode
        kept = hit + new_pages
        insert_key = blocks[: min(kept, self._keyable(tokens))]
        run = Running(index, last, hit, new_pages, decode, insert_key, now + float(req.get("duration", 0.0)), seq)
        self.check()
        return result, run

    def finish(self, run: Running) -> None:
        """``cache_finished_req`` (S7)."""
        prefix = self.insert(run.insert_key)
        assert prefix >= run.hit
        dup = prefix - run.hit
        tail = run.hit + run.new_pages - len(run.insert_key)
        assert dup >= 0 and tail >= 0 and dup + tail + len(run.insert_key) - prefix == run.new_pages
        self.held -= run.new_pages + run.decode
        self.free += dup + tail + run.decode
        self.dec_lock_ref(run.last_node)
        self.check()

    def sequential(self, req: dict, index: int = 0) -> Result:
        result, run = self.try_admit(index, req, idle=True)
        if run is not None:
            self.finish(run)
        return result

    def in_flight(self, requests: list) -> list:
        n = len(requests)
        pending = deque(sorted(range(n), key=lambda i: (float(requests[i]["arrival"]), i)))
        waiting: deque = deque()
        running: list = []
        results: list = [None] * n
        seq = itertools.count()
        t = float("-inf")

        def complete_due():
            running.sort(key=lambda r: (r.end, r.seq))
            while running and running[0].end <= t:
                self.finish(running.pop(0))

        while pending or waiting or running:
            nexts = [r.end for r in running] + ([float(requests[pending[0]]["arrival"])] if pending else [])
            t = max(t, min(nexts))
            complete_due()
            while pending and float(requests[pending[0]]["arrival"]) <= t:
                waiting.append(pending.popleft())
            while waiting:
                i = waiting[0]
                out = self.try_admit(i, requests[i], idle=not running, now=t, seq=next(seq))
                if out is None:
                    break
                waiting.popleft()
                result, run = out
                result.wait_s = t - float(requests[i]["arrival"])
                results[i] = result
                if run is not None:
                    running.append(run)
                complete_due()
        return results


def replay(requests, pool_pages: int, page_size: int, rules: Rules = Rules(), *, in_flight: bool = False):
    """Replay ``requests`` through one SGLang radix cache; one :class:`Result` per request, in input order."""
    rp = Replayer(pool_pages, page_size, rules)
    if in_flight:
        return rp.in_flight(list(requests))
    return [rp.sequential(r, i) for i, r in enumerate(requests)]
