"""What the engine would report: capacity-hit curves under vLLM's or SGLang's own
prefix-cache rules (``--cache-rules vllm|sglang``) instead of kvtrace's ideal
request-atomic LRU (``ideal``, :func:`kvtrace.analyses.curves.compute_curve`).

The engines' rules break the stack property (a recomputed last block cached twice,
requests larger than the pool rejected, whole radix leaves evicted), so a curve is
replayed exactly at each capacity of a thinned grid: about :data:`ENGINE_POINTS`
log-spaced pool sizes from one block to every distinct block (or the capacities asked
for), each a whole number of blocks (a pool holds full blocks). SGLang's pools are one
replay each (:mod:`kvtrace.kernels.engine_sglang`); vLLM's pools that hold the longest
request share one pass (:mod:`kvtrace.kernels.engine_vllm_multi`: the cached ids are
always the most recently accessed ones, so one stack serves every pool and only the
older copies a pool still holds are per pool), the smaller ones, which reject requests,
are one replay each (:mod:`kvtrace.kernels.engine_vllm`); both are the same replay,
request for request (tested).
The tables are the ideal curve's, metric for metric, computed from each replay's hits
by the same evaluation (:func:`kvtrace.analyses.curves.evaluate_pass` on a one-capacity
histogram), with these differences, stated in ``info``:

- an engine reuses only a request's leading cached blocks, so the any-block rates equal
  the usable-prefix ones;
- ``prefix_token_hit_rate`` is the sum of the hits the engine reports (vLLM's
  ``num_cached_tokens``) over every prompt token, a rejected request's counted as
  missed; ``engine_prefix_token_hit_rate`` the same over the prompt tokens of the
  requests the engine admitted (what its own counter reports: a rejected request never
  reaches the prefix cache); ``rejected_request_share`` is the share of measured
  requests the engine rejects as larger than its pool;
- the ceiling is the rules' own at an unbounded pool (no eviction, no rejection: a
  block hits once an earlier request cached it, within the rules' cap), reached at the
  capacity of every distinct block or above; knees are the smallest *evaluated*
  capacity reaching each fraction of it (grid resolution, not an exact search).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
import polars as pl
from numba import njit

from kvtrace.analyses.curve_pass import CurvePass
from kvtrace.analyses.curves import (KNEE_FRACTIONS, KNEE_METRICS, RATE_COLUMNS, CurveResult, evaluate_pass, nan_none,
                                     default_grid, plan_curve)
from kvtrace.config import NJIT, plain_numpy_pages
from kvtrace.errors import UsageError
from kvtrace.kernels import engine_sglang as S
from kvtrace.kernels import engine_vllm as V
from kvtrace.kernels import engine_vllm_multi as M
from kvtrace.kernels.engine_vllm import FULL_BLOCKS_ONLY, LAST_TOKEN_CAP
from kvtrace.kernels.stackdist import COLD
from kvtrace.trace import Trace
from kvtrace.trace.budget import memory_budget
from kvtrace.units import format_bytes

CACHE_RULES = ("ideal", "vllm", "sglang")
#: Pool sizes of an engine curve's default grid.
ENGINE_POINTS = 24
#: Bytes of replay state an engine curve may hold at once (capacities are replayed in
#: groups that fit; each group is one pass over the trace).
STATE_BUDGET_BYTES = 1 << 30

RULE_TEXT = {
    "sglang": ("SGLang radix cache: the match capped at the prompt's length - 1 tokens and cut to whole pages (a "
               "recomputed duplicate page freed on insert), only full pages inserted, a prompt of >= pool - 6 tokens "
               "rejected, admission needing the new tokens + one page < free + evictable, evict(need) tokens when "
               "the free pages fall short, whole least-recently-used leaves evicted, the unmatched remainder of a "
               "split node refreshed"),
    "vllm": ("vLLM v1 prefix caching: hits capped at the prompt's length - 1 tokens (a block-aligned prompt's last "
             "block is recomputed and cached again as a second copy), only full blocks hashed, a request larger "
             "than the pool rejected, blocks freed tail-first to the free queue's tail (a block without a hash to "
             "its head)"),
}


#: How requests in flight are admitted and cached, per engine (``info["in_flight"]["admission"]``).
ADMISSION_TEXT = {
    "vllm": "first come, first served; a request holds its blocks from admission for its service time; hits "
            "decided and prompt blocks cached at admission",
    "sglang": "first come, first served; the queue's head re-matches at every try; a request holds its new pages "
              "and its path's lock from admission for its service time; hits decided at admission, prompt pages "
              "inserted into the tree when it finishes",
}


@dataclass(frozen=True)
class EngineRules:
    """The rules of one engine (``name``) and which of them apply (``bits``: the
    kernel's flags; default all)."""

    name: str
    bits: int

    @classmethod
    def of(cls, name: str) -> "EngineRules":
        if name == "vllm":
            return cls("vllm", V.ALL_RULES)
        if name == "sglang":
            return cls("sglang", S.ALL_RULES)
        raise UsageError(f"expected one of {', '.join(CACHE_RULES)}, got '{name}'", field="cache-rules")

    @property
    def text(self) -> str:
        off = [name for bit, name in self.rule_names.items() if not self.bits & bit]
        return RULE_TEXT[self.name] + ("; rules off: " + ", ".join(off) if off else "")

    @property
    def rule_names(self) -> dict:
        return (V if self.name == "vllm" else S).RULE_NAMES


#: ``--service-time`` default: a request's time in flight, seconds, from its token counts.
DEFAULT_SERVICE_TIME = "input/5000 + output/50"
#: ``--service-time trace``: each request's own ``end_timestamp - timestamp`` (the trace's end times).
TRACE_SERVICE_TIME = "trace"
_ALLOWED = {"input", "output"}


def trace_service_times(requests: pl.DataFrame) -> np.ndarray:
    """float64[R]: each request's ``end_timestamp - timestamp``, seconds (the optional
    request column :data:`kvtrace.trace.OPTIONAL_REQUEST_SCHEMA`); a one-line usage error
    naming the field when the trace has no end times, a request has none, or one ends
    before it starts."""
    n = requests.height
    ends = requests["end_timestamp"] if "end_timestamp" in requests.columns else None
    if n and (ends is None or ends.null_count() == n):
        raise UsageError("--service-time trace reads each request's end_timestamp (when it finished, in the unit "
                         "of its timestamp): this trace has none", field="service-time")
    if not n:
        return np.zeros(0, dtype=np.float64)
    missing = ends.is_null().to_numpy()
    d = ends.to_numpy().astype(np.float64) - requests["timestamp"].to_numpy().astype(np.float64)

    def first(bad) -> str:  # a streamed trace may not keep request ids: then the row in trace order
        row = int(np.argmax(bad))
        return (f"request_id {requests['request_id'][row]}" if "request_id" in requests.columns
                else f"request {row} in trace order")

    if missing.any():
        raise UsageError(f"{int(missing.sum()):,} of {n:,} requests have no end_timestamp (first: {first(missing)}): "
                         "--service-time trace needs one for every request", field="service-time")
    if (d < 0).any():
        raise UsageError(f"end_timestamp precedes timestamp for {int((d < 0).sum()):,} of {n:,} requests (first: "
                         f"{first(d < 0)})", field="service-time")
    return d


def service_times(expr: str, input_tokens, output_tokens) -> np.ndarray:
    """float64[R]: ``expr`` (``input/5000 + output/50``: numbers, ``input`` and ``output``
    tokens, ``+ - * /``, parentheses, ``min``/``max``) evaluated per request; a one-line
    usage error for anything else or a negative time."""
    import ast

    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError:
        raise UsageError(f"expected an expression such as '{DEFAULT_SERVICE_TIME}', got '{expr}'",
                         field="service-time") from None
    env = {"input": np.asarray(input_tokens, dtype=np.float64), "output": np.asarray(output_tokens, np.float64)}

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value,
                                                                                                    bool):
            return float(node.value)
        if isinstance(node, ast.Name) and node.id in _ALLOWED:
            return env[node.id]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            a, b = ev(node.left), ev(node.right)
            with np.errstate(divide="ignore", invalid="ignore"):
                return {ast.Add: np.add, ast.Sub: np.subtract, ast.Mult: np.multiply,
                        ast.Div: np.divide}[type(node.op)](a, b)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("min", "max")
                and len(node.args) >= 2 and not node.keywords):
            f = np.minimum if node.func.id == "min" else np.maximum
            out = ev(node.args[0])
            for a in node.args[1:]:
                out = f(out, ev(a))
            return out
        raise UsageError(f"expected numbers, input, output, + - * /, min or max in '{expr}'", field="service-time")

    d = np.broadcast_to(np.asarray(ev(tree), dtype=np.float64), env["input"].shape).copy()
    if d.size and not (np.all(np.isfinite(d)) and d.min() >= 0):
        raise UsageError(f"'{expr}' gives a negative or undefined time for some request", field="service-time")
    return d


@njit(**NJIT)
def request_sums(tokens, pos, block, size, lrs, block_tokens, cum, tot):
    """Per access, the running sums within its request of the histogram weights of
    :func:`kvtrace.kernels.hitcurve.binned_hits_into` (``cum[t, w]`` = weight ``w`` of
    the request's accesses up to and including ``t``: count, tokens, block tokens,
    prefill q; one access's four weights share a cache line), and per request their
    totals (``tot[i, w]``); either may be empty (not wanted). Computed once per chunk
    for every capacity; each is a sum of integers below 2**53 (a request's q is at most
    its tokens squared), so exact."""
    bt = np.float64(block_tokens)
    running = cum.shape[0] > 0
    totals = tot.shape[0] > 0
    for i in range(lrs.shape[0] - 1):
        c0 = c1 = c2 = c3 = 0.0
        for t in range(lrs[i], lrs[i + 1]):
            k = np.float64(tokens[t])
            c0 += 1.0
            c1 += k
            c2 += np.float64(size[block[t]])
            c3 += k * (np.float64(pos[t]) * bt) + k * (k - 1.0) * 0.5
            if running:
                cum[t, 0] = c0
                cum[t, 1] = c1
                cum[t, 2] = c2
                cum[t, 3] = c3
        if totals:
            tot[i, 0] = c0
            tot[i, 1] = c1
            tot[i, 2] = c2
            tot[i, 3] = c3


@njit(**NJIT)
def _accumulate_many(hit_blocks, rejected, cum, tot, block_tokens, lrs, r0, first_req, req_group, hists, req_hists,
                     n_rejected):
    """Add one chunk's hits at several capacities (``hit_blocks[k, i]``, ``rejected[k, i]``
    or an empty second axis when none rejects) to each capacity's one-capacity histogram
    ``hists[k]`` (``[2, n_groups, 3, 4]``: bin 0 hit, bin 2 miss; the weights of
    :func:`kvtrace.kernels.hitcurve.binned_hits_into`) of measured accesses, its measured
    requests per group ``req_hists[k]`` (``[2, n_groups, 3]``: ``[0]`` whether the request
    hit, ``[1]`` whether its hit covers half its prompt tokens; bin 0 yes, bin 2 no: the
    bins :func:`kvtrace.analyses.curves.evaluate_pass` takes) and ``n_rejected[k]``
    (requests rejected, their prompt tokens), in one sweep over the requests.

    A request's hit weights are its running sums (``cum``, :func:`request_sums`) at its
    last hit block; when only full blocks can hit (the last-token cap or full blocks
    only: ``cum`` empty) they are a function of the hit count ``h`` alone (``h`` blocks,
    ``h x B`` tokens and block tokens, prefill ``B^2 h(h-1)/2 + h B(B-1)/2``: the same
    integers :func:`request_sums` adds). Only hits are added per capacity; the misses
    are the requests' totals (``tot``, per group, added once) minus the hits, and the
    requests that miss are the group's requests minus those that hit (sums of integers:
    exact in any order below 2**53)."""
    grouped = req_group.shape[0] > 0
    rejects = rejected.shape[1] > 0
    closed = cum.shape[0] == 0
    bt = np.float64(block_tokens)
    K = hit_blocks.shape[0]
    G = hists.shape[2]
    hits = np.zeros((K, G, 4), dtype=np.float64)
    won = np.zeros((K, G, 2), dtype=np.float64)  # requests that hit; whose hit covers half their prompt
    whole = np.zeros((G, 4), dtype=np.float64)
    count = np.zeros(G, dtype=np.float64)
    for i in range(lrs.shape[0] - 1):
        r = r0 + i
        if r < first_req:
            continue
        lo, hi = lrs[i], lrs[i + 1]
        g = req_group[r] if grouped else 0
        count[g] += 1.0
        if hi == lo:
            continue
        for w in range(4):
            whole[g, w] += tot[i, w]
        half = np.floor((tot[i, 1] + 1.0) / 2.0)
        for k in range(K):
            h = hit_blocks[k, i]
            if rejects and rejected[k, i]:
                n_rejected[k, 0] += 1
                n_rejected[k, 1] += np.int64(tot[i, 1])
            if h == 0:
                continue
            if closed:
                fh = np.float64(h)
                t1 = fh * bt
                hits[k, g, 0] += fh
                hits[k, g, 1] += t1
                hits[k, g, 2] += t1
                hits[k, g, 3] += bt * bt * (fh * (fh - 1.0) * 0.5) + fh * (bt * (bt - 1.0) * 0.5)
            else:
                t1 = cum[lo + h - 1, 1]
                for w in range(4):
                    hits[k, g, w] += cum[lo + h - 1, w]
            won[k, g, 0] += 1.0
            if t1 >= half:
                won[k, g, 1] += 1.0
    for k in range(K):
        for g in range(G):
            for w in range(4):
                for x in range(2):
                    hists[k, x, g, 0, w] += hits[k, g, w]
                    hists[k, x, g, 2, w] += whole[g, w] - hits[k, g, w]
            for x in range(2):
                req_hists[k, x, g, 0] += won[k, g, x]
                req_hists[k, x, g, 2] += count[g] - won[k, g, x]


@njit(**NJIT)
def _unbounded_chunk(block, tokens, lrs, block_tokens, rules, cached, hit_blocks):
    """The rules at an unbounded pool: a block hits once an earlier request cached it
    (its leading run, within the cap), every hashable block is cached."""
    cap = (rules & LAST_TOKEN_CAP) != 0
    full_only = (rules & FULL_BLOCKS_ONLY) != 0
    for r in range(lrs.shape[0] - 1):
        lo, hi = lrs[r], lrs[r + 1]
        m = V.hit_limit(tokens, lo, hi, block_tokens, cap, full_only)
        h = 0
        while h < m and cached[block[lo + h]]:
            h += 1
        hit_blocks[r] = h
        for t in range(lo, hi):
            if not full_only or tokens[t] == block_tokens:
                cached[block[t]] = True


class _Pool:
    """One capacity's replay state and its sums."""

    def __init__(self, pages: int, n_ids: int, R: int, n_groups: int):
        self.pages, self.n_ids = pages, n_ids
        self.state = self.slots = self.cached = None  # replay state: allocated by open(), dropped by close()
        self.hist = np.zeros((2, n_groups, 3, 4), dtype=np.float64)
        self.req_hist = np.zeros((2, n_groups, 3), dtype=np.float64)  # measured requests: hit, half-prefix hit
        self.rejected = np.zeros(2, dtype=np.int64)  # measured requests rejected, their prompt tokens

    def open(self, vllm_state: bool) -> None:
        """Allocate the replay state (the unbounded ceiling's cached flags; with
        ``vllm_state`` a vLLM pool's free queue and hash map)."""
        if self.pages < 0:
            self.cached = np.zeros(self.n_ids, dtype=np.bool_)
        elif vllm_state:
            self.state = V.new_state(self.pages, self.n_ids)
            self.slots = np.empty(max(self.pages, 1), dtype=np.int64)

    def close(self) -> None:
        self.state = self.slots = self.cached = None

    def replay(self, ch, block, tokens, B, rules, hit, rej) -> None:
        """Replay chunk ``ch`` (``block`` int64, ``tokens`` as the chunk has them): each
        request's hit blocks into ``hit``, whether it was rejected into ``rej``."""
        if self.state is None:
            _unbounded_chunk(block, tokens, ch.lrs, B, rules, self.cached, hit)
        else:
            V.replay_chunk(block, tokens, ch.lrs, self.pages, B, rules, *self.state, self.slots, hit, rej)



def _state_bytes(pages: int, n_ids: int) -> int:
    """Bytes of one pool's replay state (:func:`kvtrace.kernels.engine_vllm.new_state`,
    int32 indices, and its int64 slot scratch)."""
    return 4 * (5 * max(pages, 0) + n_ids) + 8 * max(pages, 1)


@plain_numpy_pages
def engine_curve(trace, cache_rules: "str | EngineRules", *, model=None, gpu=None, capacities=None,
                 display_capacities=None, points: int = ENGINE_POINTS, warmup=None, by=None,
                 in_flight: bool = False, service_time: str = DEFAULT_SERVICE_TIME, cache_decode: bool = False,
                 threads: int | None = None, progress=None) -> CurveResult:
    """The capacity-hit curve of ``trace`` under an engine's rules (module docstring).

    Parameters are :func:`kvtrace.analyses.curves.compute_curve`'s (``capacities`` in
    bytes, each rounded down to whole blocks); ``cache_rules`` is ``vllm`` or
    ``sglang``, or an :class:`EngineRules` with some rules off. Capacities replay
    ``threads`` at a time (default one per core).

    With ``in_flight`` each request holds its blocks from admission for its service
    time (``service_time``, an expression of its ``input`` and ``output`` tokens,
    seconds, or ``trace``: its own ``end_timestamp - timestamp``,
    :func:`trace_service_times`; with ``cache_decode`` also the blocks its output
    fills), first come first
    served (:func:`kvtrace.kernels.engine_vllm.replay_vllm_inflight`,
    :func:`kvtrace.kernels.engine_sglang.replay_sglang_inflight`); the table adds
    ``wait_mean_s``, ``wait_p99_s`` and ``pool_full_share``.
    """
    rules = cache_rules if isinstance(cache_rules, EngineRules) else EngineRules.of(cache_rules)
    plan = plan_curve(trace, model=model, gpu=gpu, capacities=capacities, display_capacities=display_capacities,
                      points=points, warmup=warmup, by=by)
    model, gpu, B, names = plan.model, plan.gpu, plan.block_tokens, plan.names
    bpt = int(model.kv_bytes_per_token)
    n_ids = int(trace.n_blocks)
    if plan.user_tokens is not None:
        pages = plan.user_tokens // B
    else:
        pages = default_grid(n_ids * B, B, points) // B
    shown = pages if plan.disp_tokens is None else np.concatenate([pages, plan.disp_tokens // B])
    order_pages = np.unique(np.maximum(shown, 0))
    R = trace.n_requests
    n_groups = len(names)
    size = np.ascontiguousarray(trace.block_size, dtype=np.int64)
    req_group = np.empty(0, dtype=np.int32) if plan.req_group is None else plan.req_group.astype(np.int32)
    pools = [_Pool(int(p), n_ids, R, n_groups) for p in order_pages] + [_Pool(-1, n_ids, R, n_groups)]
    threads = max(1, threads or os.cpu_count() or 1)
    if in_flight:
        _in_flight(trace, pools, rules, B, size, plan, req_group, service_time, cache_decode, threads, progress)
        return _result(trace, plan, rules, pools, order_pages, np.unique(np.maximum(pages, 0)), bpt,
                       in_flight=(service_time, cache_decode))
    if rules.name == "sglang":
        _whole_trace(trace, pools, rules, B, size, plan, req_group, threads, progress)
        return _result(trace, plan, rules, pools, order_pages, np.unique(np.maximum(pages, 0)), bpt)
    longest = int(np.diff(np.asarray(trace.req_start)).max(initial=0))
    try:
        _vllm_passes(trace, pools, rules, B, size, plan, req_group, threads, progress,
                     multi=M.multi_capable(rules.bits), longest=longest)
    except _RepeatedId:  # a request holding one id twice: every pool on its own
        pools = [_Pool(int(p), n_ids, R, n_groups) for p in order_pages] + [_Pool(-1, n_ids, R, n_groups)]
        _vllm_passes(trace, pools, rules, B, size, plan, req_group, threads, progress, multi=False, longest=longest)
    return _result(trace, plan, rules, pools, order_pages, np.unique(np.maximum(pages, 0)), bpt)


class _RepeatedId(Exception):
    """A request holds one block id twice (the multi-pool pass does not model it)."""


class _MultiPools:
    """The pools holding at least the longest request, replayed together in one pass
    (:mod:`kvtrace.kernels.engine_vllm_multi`)."""

    def __init__(self, pools, n_ids: int, ceiling=None):
        self.pools, self.n_ids, self.ceiling = pools, n_ids, ceiling
        self.members = pools + ([ceiling] if ceiling is not None else [])  # the hits it fills, in order
        self.state = None

    def open(self) -> None:
        self.state = M.MultiState(self.n_ids, [p.pages for p in self.pools])

    def close(self) -> None:
        self.state = None

    def replay(self, ch, block, tokens, B, rules, hit) -> None:
        """Every member's hits of chunk ``ch`` into ``hit[k]`` (none rejects; the
        unbounded ceiling's, when it is a member, in the last row)."""
        pools = hit[:len(self.pools)]
        unbounded = hit[len(self.pools)] if self.ceiling is not None else M.NO_HITS
        r = 0
        while True:
            status, r = M.multi_chunk(block, tokens, ch.lrs, B, rules, *self.state.arrays(), r, pools, unbounded)
            if status == M.DONE:
                return
            if status == M.REPEATED_ID:
                raise _RepeatedId()
            self.state.grow(int(ch.lrs[r + 1] - ch.lrs[r]))


class _InPlace:
    """An executor that runs each task at once in the calling thread (``threads=1``)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, fn, *args):
        from concurrent.futures import Future

        f = Future()
        try:
            f.set_result(fn(*args))
        except BaseException as e:  # noqa: BLE001 - re-raised by result(), as a pool's future would
            f.set_exception(e)
        return f


def _accumulate_pools(pools, hit, rej, lrs, r0, cum, tot, B, first_req, req_group) -> None:
    """Add the hits ``hit[k]`` (rejections ``rej[k]``) of requests ``r0..`` (local offsets
    ``lrs``) at each of ``pools`` (:func:`_accumulate_many`)."""
    if not pools:
        return
    if not rej.any():
        rej = np.zeros((len(pools), 0), dtype=np.bool_)
    hists = np.stack([p.hist for p in pools])
    req_hists = np.stack([p.req_hist for p in pools])
    n_rej = np.stack([p.rejected for p in pools])
    _accumulate_many(hit, rej, cum, tot, B, lrs, r0, first_req, req_group, hists, req_hists, n_rej)
    for k, p in enumerate(pools):
        p.hist[...] = hists[k]
        p.req_hist[...] = req_hists[k]
        p.rejected[...] = n_rej[k]


def _vllm_passes(trace, pools, rules, B, size, plan, req_group, threads, progress, multi: bool, longest: int):
    """vLLM's sequential replays of every pool (:mod:`kvtrace.kernels.engine_vllm`), in
    passes over the trace's chunks; with ``multi`` the pools holding the longest request
    share one pass of :mod:`kvtrace.kernels.engine_vllm_multi`.

    With a shared pass, it runs on one worker, taking the chunks in order as they are
    queued (it never waits for the rest), while the calling thread replays the other
    pools, computes the chunk's per-request weights and adds up the previous chunk's
    hits: two runnable threads for two cores. Without one, the pools replay in two lanes
    on two workers. Hits are added up in chunk order (the sums are the one-thread
    order's)."""
    n_ids = int(trace.n_blocks)
    full_hits = bool(rules.bits & (LAST_TOKEN_CAP | FULL_BLOCKS_ONLY))  # no partial block ever hits
    together = [p for p in pools if multi and p.pages >= max(longest, 1)]
    if len(together) < 2:
        together = []
    ceiling = next((p for p in pools if p.pages < 0), None) if together else None  # the shared pass serves it too
    alone = [p for p in pools if p not in together and p is not ceiling]
    groups, cur, used = [], [], 0
    for item in ([_MultiPools(together, n_ids, ceiling)] if together else []) + alone:
        # capacities replayed together while their state fits the budget
        need = M.state_bytes(n_ids) if isinstance(item, _MultiPools) else _state_bytes(item.pages, n_ids)
        if cur and used + need > STATE_BUDGET_BYTES:
            groups.append(cur)
            cur, used = [], 0
        cur.append(item)
        used += need
    groups.append(cur)
    done, total = 0, len(groups) * trace.n_accesses
    for group in groups:  # a group's state exists only while its pass runs
        shared = [item for item in group if isinstance(item, _MultiPools)]
        single = [item for item in group if not isinstance(item, _MultiPools)]
        members = [p for item in shared for p in item.members] + single
        row = {id(p): k for k, p in enumerate(members)}  # each pool's row of a chunk's hits
        K = len(members)
        # with a shared pass: it on one worker, taking the chunks in order as they are queued, and the other
        # pools on the calling thread (two runnable threads for two cores); without: the pools in two lanes
        lanes = [single] if shared else [single[0::2], single[1::2]]
        workers = 1 if shared else 2
        with (ThreadPoolExecutor(workers) if threads > 1 else _InPlace()) as ex:
            for item in shared:
                item.open()
            for p in single:
                p.open(vllm_state=True)
            running = []  # futures of the chunk replaying on the workers
            prev = None  # the previous chunk's hits and weights, added up once its replays are done
            try:
                for ch in trace.chunks(local_req=False):
                    block = np.ascontiguousarray(ch.block, dtype=np.int64)  # once per chunk, for every pool
                    tokens = ch.tokens
                    n = ch.lrs.shape[0] - 1
                    hit = np.zeros((K, n), dtype=np.int32)
                    rej = np.zeros((K, n), dtype=np.bool_)
                    at = 0
                    if not shared:  # each lane sees its chunks in order
                        for f in running:
                            f.result()
                    running = []
                    for item in shared:
                        running.append(ex.submit(item.replay, ch, block, tokens, B, rules.bits,
                                                 hit[at:at + len(item.members)]))
                        at += len(item.members)
                    for lane in lanes:
                        def run(lane=lane, ch=ch, block=block, tokens=tokens, hit=hit, rej=rej):
                            for p in lane:
                                k = row[id(p)]
                                p.replay(ch, block, tokens, B, rules.bits, hit[k], rej[k])
                        if shared:
                            run()
                        else:
                            running.append(ex.submit(run))
                    tot = np.empty((n, 4), dtype=np.float64)
                    # with whole-block hits the weights follow from the hit counts: only the totals
                    cum = np.empty((0 if full_hits else block.shape[0], 4), dtype=np.float64)
                    request_sums(tokens, ch.pos, block, size, ch.lrs, B, cum, tot)
                    if prev is not None:
                        for f in prev[-1]:
                            f.result()
                        _accumulate_pools(members, *prev[:-1], B, plan.first_req, req_group)
                    prev = (hit, rej, ch.lrs, ch.r, cum, tot, running)
                    if progress is not None and done:
                        progress(done, total)
                    done += ch.hi - ch.lo
                if prev is not None:
                    for f in prev[-1]:
                        f.result()
                    _accumulate_pools(members, *prev[:-1], B, plan.first_req, req_group)
                if progress is not None:
                    progress(done, total)
            finally:
                pending = running + (prev[-1] if prev is not None else [])
                for f in pending:
                    f.cancel()
                wait(pending)  # a task still replaying holds its pool's state
                for item in group:
                    item.close()


#: Bytes per access of the whole-trace replays' arrays (block and tokens int64, pos int32).
WHOLE_BYTES_PER_ACCESS = 20
#: Accesses per slice when a whole-trace replay's hits are added up (:meth:`_Whole.accumulate`).
SLICE_ACCESSES = 1 << 20


class _Whole:
    """The whole trace as one chunk (requests in flight need every request at once; the
    SGLang kernel keeps its tree inside one call). Refused with a one-line error when its
    arrays would not fit the memory budget (:func:`kvtrace.trace.budget.memory_budget`)."""

    def __init__(self, trace):
        need = WHOLE_BYTES_PER_ACCESS * int(trace.n_accesses)
        room, where = memory_budget()
        if room is not None and need > room:
            raise UsageError(f"these rules replay the whole trace at once: its {trace.n_accesses:,} block accesses "
                             f"need {format_bytes(need)}, only {format_bytes(room)} is {where} (--cache-rules vllm "
                             "without --in-flight streams in chunks)", field="cache-rules")
        self.lrs = np.ascontiguousarray(trace.req_start, dtype=np.int64)
        if isinstance(trace, Trace):  # in memory: the trace's own arrays (block ids not copied)
            a = trace.accesses
            self.block = np.ascontiguousarray(a.block, dtype=np.int64)
            self.tokens = a.tokens.astype(np.int64)
            self.pos = np.ascontiguousarray(a.pos, dtype=np.int32)
            return
        parts = list(trace.chunks())
        self.block = np.concatenate([c.block for c in parts]).astype(np.int64) if parts else np.empty(0, np.int64)
        self.tokens = np.concatenate([c.tokens for c in parts]).astype(np.int64) if parts else np.empty(0, np.int64)
        self.pos = np.concatenate([c.pos for c in parts]) if parts else np.empty(0, np.int32)

    def accumulate(self, hit, rej, size, B, first_req, req_group, pool) -> None:
        """Add one pool's hits over the whole trace (:func:`_accumulate_pools`), in slices
        of whole requests of about ``SLICE_ACCESSES`` accesses (their running sums are
        recomputed per slice, so memory stays bounded)."""
        lrs = self.lrs
        R = lrs.shape[0] - 1
        cum = np.empty((min(max(int(lrs[-1]), 1), SLICE_ACCESSES), 4), dtype=np.float64)
        r = 0
        while r < R:
            e = max(r + 1, int(np.searchsorted(lrs, lrs[r] + SLICE_ACCESSES, side="right")) - 1)
            lo, hi = int(lrs[r]), int(lrs[e])
            if cum.shape[0] < hi - lo:  # one request longer than a slice
                cum = np.empty((hi - lo, 4), dtype=np.float64)
            sl = lrs[r:e + 1] - lo
            tot = np.empty((e - r, 4), dtype=np.float64)
            request_sums(self.tokens[lo:hi], self.pos[lo:hi], self.block[lo:hi], size, sl, B, cum, tot)
            _accumulate_pools([pool], hit[None, r:e], rej[None, r:e], sl, r, cum, tot, B, first_req, req_group)
            r = e


def _each_pool(trace, pools, run, threads, progress) -> None:
    """``run(pool)`` for every pool over the whole trace, ``threads`` at a time; each
    pool's state exists only while its replay runs."""

    def one(pool):
        pool.open(vllm_state=False)
        try:
            run(pool)
        finally:
            pool.close()

    done = 0
    with ThreadPoolExecutor(max(1, threads)) as ex:
        for _ in ex.map(one, pools):
            done += 1
            if progress is not None:
                progress(done * trace.n_accesses, len(pools) * trace.n_accesses)


def _unbounded_hits(whole, B, rules, pool) -> np.ndarray:
    hit = np.zeros(whole.lrs.shape[0] - 1, dtype=np.int32)
    _unbounded_chunk(whole.block, whole.tokens, whole.lrs, B, rules.bits, pool.cached, hit)
    return hit


def _whole_trace(trace, pools, rules, B, size, plan, req_group, threads, progress):
    """SGLang's sequential replay of the whole trace per pool (:mod:`kvtrace.kernels.engine_sglang`)."""
    whole = _Whole(trace)

    def run(pool):
        if pool.pages < 0:
            hit, rej = _unbounded_hits(whole, B, rules, pool), np.zeros(trace.n_requests, dtype=np.bool_)
        else:
            h, r = S.replay_sglang(whole.block, whole.tokens, whole.lrs, trace.n_blocks, [pool.pages], B, rules.bits)
            hit, rej = h[0], r[0]
        whole.accumulate(hit, rej, size, B, plan.first_req, req_group, pool)

    _each_pool(trace, pools, run, threads, progress)


def _in_flight(trace, pools, rules, B, size, plan, req_group, service_time, cache_decode, threads, progress):
    req = trace.requests
    inp, out = req["input_tokens"].to_numpy(), req["output_tokens"].fill_null(0).to_numpy()
    if service_time.strip() == TRACE_SERVICE_TIME:
        duration = trace_service_times(req)
    else:
        duration = service_times(service_time, inp, out)
    whole = _Whole(trace)
    n_blocks = np.diff(whole.lrs)
    decode = np.maximum(0, -(-(inp + out) // B) - n_blocks) if cache_decode else np.zeros_like(n_blocks)
    arrival = np.ascontiguousarray(trace.request_timestamp, dtype=np.float64)

    def run(pool):
        if pool.pages < 0:  # the unbounded ceiling: nothing waits, nothing is evicted
            hit = _unbounded_hits(whole, B, rules, pool)
            rej, wait, blocked, span = np.zeros(trace.n_requests, np.bool_), np.zeros(trace.n_requests), 0.0, 0.0
        else:
            replay = S.replay_sglang_inflight if rules.name == "sglang" else V.replay_vllm_inflight
            hit, rej, wait, blocked, span = replay(whole.block, whole.tokens, whole.lrs, trace.n_blocks, pool.pages, B,
                                                   arrival, duration, decode, rules.bits)
        whole.accumulate(hit, rej, size, B, plan.first_req, req_group, pool)
        measured = wait[plan.first_req:][~rej[plan.first_req:]]
        pool.wait = (float(measured.mean()) if measured.size else None,
                     float(np.quantile(measured, 0.99, method="inverted_cdf")) if measured.size else None,
                     blocked / span if span > 0 else 0.0)

    _each_pool(trace, pools, run, threads, progress)


_NO_KEYS = np.empty(0, dtype=np.int64)
_NO_MEMBERS = np.empty(0, dtype=np.bool_)


def _result(trace, plan, rules, pools, pages, main_pages, bpt, in_flight=None) -> CurveResult:
    model, gpu, B, names, by, first_req = plan.model, plan.gpu, plan.block_tokens, plan.names, plan.by, \
        plan.first_req
    a, b = model.flops_coefficients()
    n_groups = len(names)
    members = np.arange(trace.n_requests) >= first_req
    group = plan.req_group

    def evaluation(pool, cap_tokens):
        passed = CurvePass(pool.hist, _NO_KEYS, _NO_MEMBERS, 0, None, request_group=group)
        return evaluate_pass(passed, n_groups, np.array([max(cap_tokens, 1)], dtype=np.int64), a, b,
                             request_hists=(pool.req_hist[0], pool.req_hist[1]))

    evs = [evaluation(p, int(p.pages) * B) for p in pools[:-1]]
    top = evaluation(pools[-1], 1 << 62)
    seconds = float(trace.request_timestamp[-1] - trace.request_timestamp[first_req]) if trace.n_requests else 0.0
    hours = seconds / 3600.0
    measured = int(members.sum())
    cap_tokens = pages * B

    def table(gi: int) -> pl.DataFrame:
        out = {"capacity_bytes": cap_tokens * bpt, "capacity_tokens": cap_tokens,
               "capacity_blocks": pages.astype(np.float64)}
        for k in RATE_COLUMNS:
            out[k] = np.array([e.rates[k][gi, 0] for e in evs])
        flops = np.array([e.flops_hit[gi, 0] for e in evs])
        nan = np.full(len(evs), np.nan)
        out["gpu_seconds_saved_per_hour"] = gpu.gpu_seconds(flops) / hours if hours > 0 else nan
        out["usd_saved_per_hour"] = gpu.dollars(flops) / hours if hours > 0 else nan
        pre = np.array([e.prefix_bytes_hit[gi, 0] for e in evs])
        out["read_mean_bytes_per_s"] = pre * bpt / seconds if seconds > 0 else nan
        if gi == (n_groups if by is not None else 0):
            out["rejected_request_share"] = np.array([p.rejected[0] / measured if measured else np.nan
                                                      for p in pools[:-1]])
            # the engine's own metric: hit tokens over the prompt tokens of the requests it admitted
            admitted = [p.hist[0, :, :, 1].sum() - p.rejected[1] for p in pools[:-1]]
            out["engine_prefix_token_hit_rate"] = np.array([p.hist[0, :, 0, 1].sum() / n if n > 0 else np.nan
                                                            for p, n in zip(pools[:-1], admitted)])
            if in_flight is not None:
                for i, name in enumerate(("wait_mean_s", "wait_p99_s", "pool_full_share")):
                    out[name] = np.array([np.nan if p.wait[i] is None else p.wait[i] for p in pools[:-1]])
        return pl.DataFrame(out).with_columns(pl.col(pl.Float64).fill_nan(None))

    def select(df: pl.DataFrame, wanted_pages, wanted_bytes) -> pl.DataFrame:
        df = df[np.searchsorted(pages, np.maximum(wanted_pages, 0))]
        if wanted_bytes is not None:
            df = df.with_columns(pl.Series("capacity_bytes", np.asarray(wanted_bytes, dtype=np.int64)))
        return df

    overall_row = n_groups if by is not None else 0
    overall = table(overall_row)
    if plan.user_tokens is not None:
        curve = select(overall, np.asarray(plan.user_tokens, dtype=np.int64) // B, plan.capacities)
    else:
        curve = select(overall, main_pages, None)
    display = None if plan.disp_tokens is None else select(overall, np.asarray(plan.disp_tokens) // B,
                                                           plan.display_capacities)
    ceiling = {k: nan_none(top.ceiling[k]) for k in RATE_COLUMNS}
    ceiling["capacity_bytes"] = int(trace.n_blocks) * B * bpt
    rows = []
    for metric in KNEE_METRICS:
        c = ceiling[metric]
        for f in KNEE_FRACTIONS:
            if c is None or c <= 0:
                rows.append((metric, f, 0.0, None, None))
                continue
            rate = np.array([e.rates[metric][overall_row, 0] for e in evs], dtype=np.float64)
            ok = np.flatnonzero(np.nan_to_num(rate, nan=-1.0) >= f * c * (1 - 1e-12))
            tok = int(cap_tokens[ok[0]]) if ok.size else None
            rows.append((metric, f, float(f * c), None if tok is None else tok * bpt, tok))
    knees = pl.DataFrame(rows, schema={"metric": pl.String, "fraction": pl.Float64, "target_rate": pl.Float64,
                                       "capacity_bytes": pl.Int64, "capacity_tokens": pl.Int64}, orient="row")
    info = {
        "model": model.name, "kv_bytes_per_token": bpt, "gpu": gpu.name, "mfu": gpu.mfu,
        "dollars_per_gpu_hour": gpu.dollars_per_hour, "eviction": "prefix-aware", "cache_rules": rules.name,
        "cache_rules_text": rules.text, "block_tokens": B,
        "warmup": None if plan.warmup is None else {"kind": plan.warmup[0], "value": plan.warmup[1]},
        "first_measured_request": first_req, "measured_requests": measured,
        "measured_accesses": int(trace.n_accesses - trace.req_start[first_req]), "measured_duration_s": seconds,
        "distinct_blocks": trace.n_blocks, "distinct_bytes": plan.total_tokens * bpt, "sample_rate": 1.0,
        "approximate": False, "capacities_replayed": int(len(pages)),
        "grid": (f"{len(pages)} pool sizes, each replayed exactly" + ("" if plan.user_tokens is not None else
                 " (log-spaced from one block to every distinct block)")),
        "knees": "the smallest evaluated capacity reaching each fraction (grid resolution)",
        "ceiling": "the rules at an unbounded pool; its capacity is that of every distinct block",
        "in_flight": None if in_flight is None else {
            "service_time": in_flight[0], "cache_decode": in_flight[1], "admission": ADMISSION_TEXT[rules.name]},
    }
    by_group = None
    if by is not None:
        main = (np.asarray(plan.user_tokens, dtype=np.int64) // B) if plan.user_tokens is not None else main_pages
        parts = [select(table(gi), main, plan.capacities if plan.user_tokens is not None else None)
                 .insert_column(0, pl.lit(name).alias("group_name")) for gi, name in enumerate(names)]
        by_group = pl.concat(parts, how="diagonal")
        info["by"] = by
        info["groups"] = names
    result = CurveResult(curve=curve, by_group=by_group, ceiling=ceiling, knees=knees, info=info)
    result.display = display
    return result
