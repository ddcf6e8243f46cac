"""Synthetic KV-cache traces with realistic reuse structure (``kvtrace synth``).

Every cache result depends on how prompts share prefixes, so the generator models the
*content* of each prompt and derives chained block hashes from it, exactly as a
serving engine would:

- **chat**: multi-turn sessions. Turn k+1's prompt is turn k's prompt, then turn k's
  output, then new user text, after a tenant's system prompt. Tenants (several, Zipf
  popular) have different system prompts. Turns per session and the gaps between
  them are heavy-tailed (think time of seconds to minutes; some sessions are
  revisited hours later).
- **agent**: tool-agent loops: many calls seconds apart, each extending a long
  context (system prompt with tool schemas) by the model's call and the tool's output.
- **rag**: a tenant's system prompt, then 1-4 documents drawn from the tenant's
  Zipf-popular corpus, then the question; a few follow-up turns.
- **mixed**: a blend of the three; ``type`` and ``tenant`` name the source.

Session starts are a Poisson process whose rate is modulated by a diurnal cycle and
per-minute bursts; later turns follow after the previous turn's service time plus a
think/tool time. Timestamps are whole milliseconds (the Mooncake release's
resolution), so every output format carries the same times.

Block ids (chained-hash semantics, DESIGN §1)
---------------------------------------------
Equal id at position j means equal tokens ``0..(j+1)*B``. Ids are dense counters
``0, 1, 2, ...`` assigned in order of first appearance in the trace (like the
Mooncake release), so they fit every JSONL consumer. A block is

- owned by a shared prefix node (a tenant's system prompt, or that prompt followed
  by a given document sequence) when it lies entirely inside the shared prefix;
- otherwise owned by its session, where it is the same block in every later turn
  once it is full. A partial last block gets a new id, and when the next turn fills
  it, the filled block gets another new id (its tokens changed).

Large traces
------------
The per-request skeleton (sessions, turns, lengths, times, id offsets) costs
O(requests) memory; block lists are expanded per chunk of requests from it, so
:func:`iter_chunks` / :func:`write_chunked` need memory proportional to the chunk
only, and :func:`generate` is the one-chunk case (the same rows, the same ids).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from kvtrace.errors import KvtraceError, UsageError
from kvtrace.outputs import atomic_path
from kvtrace.trace import REQUEST_SCHEMA, TraceMeta

KINDS = ("chat", "agent", "rag", "mixed")
FORMATS = ("mooncake", "bailian", "parquet")
#: Tokens per block when not given (the Mooncake release's block size).
DEFAULT_BLOCK_TOKENS = 512
#: Long-run mean request arrival rate (requests/s) per kind when not given.
DEFAULT_RATE_PER_S = {"chat": 4.0, "agent": 2.0, "rag": 6.0, "mixed": 8.0}
#: Rows per chunk in :func:`write_chunked` when not given.
DEFAULT_CHUNK_REQUESTS = 200_000

_BIN_S = 60.0  # width of a burst-rate bin, seconds
_DAY_S = 86_400.0
_PREFILL_S_PER_TOKEN = 2e-5  # service-time model for the gap between turns
_SERVICE_BASE_S = 0.15
_MAX_DOCS = 4  # documents per rag prompt, at most
_DOCS_PER_TENANT = 2_000  # rag corpus size per tenant (< 2**12, see _node_keys)
_DOC_ZIPF = 1.05


@dataclass(frozen=True)
class _App:
    """Workload parameters of one application type. Token lengths are lognormal
    ``(median tokens, sigma, min, max)``; turns are ``min + floor(scale * Lomax(shape))``
    capped at ``max``."""

    name: str
    n_tenants: int
    tenant_zipf: float
    sys_tokens: tuple[float, float, int, int]
    turns: tuple[int, float, float, int]  # min, lomax shape, scale, max
    first_tokens: tuple[float, float, int, int]  # first user message / task
    next_tokens: tuple[float, float, int, int]  # later user text / tool output
    output_tokens: tuple[float, float, int, int]
    think_s: tuple[float, float]  # median seconds, sigma: think or tool time
    revisit: tuple[float, float, float]  # probability, median seconds, sigma
    decode_s_per_token: float
    max_context: int  # tokens; a session ends before its prompt + output exceeds it
    docs: bool = False


_APPS = (
    _App("chat", n_tenants=6, tenant_zipf=1.2,
         sys_tokens=(1_200, 0.7, 64, 8_000),
         turns=(1, 1.4, 1.5, 60),
         first_tokens=(600, 1.3, 1, 32_000),
         next_tokens=(100, 1.2, 1, 16_000),
         output_tokens=(300, 0.9, 1, 4_096),
         think_s=(40.0, 1.0), revisit=(0.12, 2_400.0, 1.2),
         decode_s_per_token=0.03, max_context=131_072),
    _App("agent", n_tenants=4, tenant_zipf=1.0,
         sys_tokens=(3_000, 0.5, 512, 16_000),
         turns=(2, 1.2, 6.0, 300),
         first_tokens=(600, 1.0, 1, 16_000),
         next_tokens=(350, 1.3, 1, 32_000),
         output_tokens=(120, 0.9, 1, 4_096),
         think_s=(0.6, 1.1), revisit=(0.02, 120.0, 1.0),
         decode_s_per_token=0.012, max_context=131_072),
    _App("rag", n_tenants=4, tenant_zipf=1.0,
         sys_tokens=(400, 0.5, 32, 4_000),
         turns=(1, 2.0, 1.0, 10),
         first_tokens=(50, 0.8, 1, 2_000),
         next_tokens=(40, 0.8, 1, 2_000),
         output_tokens=(200, 0.8, 1, 4_096),
         think_s=(20.0, 1.0), revisit=(0.05, 1_800.0, 1.0),
         decode_s_per_token=0.03, max_context=131_072, docs=True),
)
_APP_CODE = {a.name: i for i, a in enumerate(_APPS)}
#: Share of *sessions* of each app type in a mixed trace (chat, agent, rag).
_MIX = (0.55, 0.10, 0.35)
#: Expected requests per session, only to size the first attempt.
_TURNS_GUESS = {"chat": 4.0, "agent": 15.0, "rag": 1.6, "mixed": 5.0}
_DOC_LEN = (1_200, 0.5, 100, 8_000)
_DOC_COUNT_P = 0.45  # docs per rag prompt = 1 + Binomial(3, p)


# --------------------------------------------------------------------------- helpers
def _excl_cumsum(x: np.ndarray) -> np.ndarray:
    out = np.zeros(x.shape[0] + 1, dtype=np.int64)
    np.cumsum(x, out=out[1:])
    return out[:-1]


def _expand(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenate the integer ranges ``starts[i] + arange(lens[i])`` (vectorised)."""
    lens = lens.astype(np.int64, copy=False)
    total = int(lens.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    out = np.arange(total, dtype=np.int64)
    out += np.repeat(starts.astype(np.int64, copy=False) - _excl_cumsum(lens), lens)
    return out


def _param(field: str, app: int | np.ndarray, i: int | None = None) -> float | np.ndarray:
    """Field ``field`` (item ``i`` of a tuple field) of each app in ``app``: a scalar
    for one app code, an array for an array of codes."""
    vals = [getattr(a, field) if i is None else getattr(a, field)[i] for a in _APPS]
    return np.array(vals, dtype=np.float64)[app]


def _lognormal(rng: np.random.Generator, field: str, app: int | np.ndarray, n: int) -> np.ndarray:
    """``n`` integer lognormal draws of the (median, sigma, lo, hi) field ``field``."""
    z = rng.standard_normal(n)
    med, sigma, lo, hi = (_param(field, app, i) for i in range(4))
    z *= sigma
    z += np.log(med)
    np.exp(z, out=z)
    np.rint(z, out=z)
    return np.clip(z, lo, hi).astype(np.int64)


def _zipf_p(n: int, s: float) -> np.ndarray:
    w = 1.0 / np.arange(1, n + 1, dtype=np.float64) ** s
    return w / w.sum()


def _session_starts(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    """Arrival times (seconds) of ``n`` session starts: a Poisson process of mean
    rate ``rate`` per second modulated by a diurnal cycle (+-50 %) and per-minute
    bursts (lognormal jitter, and 3 % of minutes at 2-5x). Exact inversion of the
    piecewise-constant cumulative intensity."""
    unit = np.cumsum(rng.exponential(1.0, n))
    phase = rng.uniform(0.0, 2 * math.pi)
    lam_parts, lam_end, n_bins = [np.zeros(1)], 0.0, 0
    need = float(unit[-1]) if n else 0.0
    while lam_end < need:
        nb = int((need - lam_end) / (rate * _BIN_S) * 1.3) + 16
        sigma = 0.4
        burst = rng.lognormal(-0.5 * sigma * sigma, sigma, nb)
        burst *= np.where(rng.random(nb) < 0.03, rng.uniform(2.0, 5.0, nb), 1.0)
        mids = (n_bins + np.arange(nb) + 0.5) * _BIN_S
        diurnal = 1.0 + 0.5 * np.sin(2 * math.pi * mids / _DAY_S + phase)
        lam = lam_end + np.cumsum(rate * burst * diurnal * _BIN_S)
        lam_parts.append(lam)
        lam_end = float(lam[-1])
        n_bins += nb
    lam_edges = np.concatenate(lam_parts)
    t_edges = np.arange(n_bins + 1, dtype=np.float64) * _BIN_S
    return np.interp(unit, lam_edges, t_edges)


def _node_keys(tenant: np.ndarray, docs: np.ndarray, level: int) -> np.ndarray:
    """int64 key of the shared-prefix node "tenant's system prompt + first ``level``
    documents": 14 bits of tenant, 12 bits per document (+1, 0 = none)."""
    key = tenant.astype(np.int64) << 48
    for i in range(level):
        key |= (docs[:, i].astype(np.int64) + 1) << (36 - 12 * i)
    return key


# --------------------------------------------------------------------------- the plan
@dataclass
class _Plan:
    """The O(requests) skeleton of a trace; :meth:`chunk` expands block lists."""

    kind: str
    block_tokens: int
    n: int
    # per request, trace order
    ms: np.ndarray  # int64 arrival, ms from the first request
    app: np.ndarray  # int64 app code (index into _APPS)
    tenant: np.ndarray  # int64 tenant code (index into tenant_names)
    sess: np.ndarray  # int64 dense session index (order of session start)
    turn: np.ndarray  # int64, 1-based
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    parent: np.ndarray  # int64 trace index of the previous turn, -1 for a first turn
    root: np.ndarray  # int64 trace index of the session's first turn
    first_id: np.ndarray  # int64: first block id this request creates
    node_new: np.ndarray  # int64: shared-prefix blocks this request creates
    new_full: np.ndarray  # int64: session full blocks this request creates
    partial: np.ndarray  # bool: last block partial
    cnt: np.ndarray  # int64: non-empty session ranges among turns 1..this one
    # per session
    path_node: np.ndarray  # int64 (S, 1+_MAX_DOCS), -1 = none
    path_c: np.ndarray  # int64 (S, 1+_MAX_DOCS): full blocks each node owns
    rt_off: np.ndarray  # int64 (S,): first entry of the session in rt_*
    # per shared-prefix node
    node_first: np.ndarray  # int64 first block id of the node's blocks
    # session ranges, ordered by (session, turn)
    rt_start: np.ndarray
    rt_len: np.ndarray
    tenant_names: list[str]
    # kept for tests and descriptions (per request, trace order; per session)
    user_tokens: np.ndarray  # new user text / tool output tokens of each turn
    sys_tokens: np.ndarray  # per tenant code
    docs: np.ndarray  # int64 (S, _MAX_DOCS) document ids, -1 = none
    doc_tokens: np.ndarray  # (tenants, _DOCS_PER_TENANT)

    def chunk(self, a: int, b: int) -> pl.DataFrame:
        """Requests ``a..b-1`` (trace order) as a canonical request table."""
        r = np.arange(a, b, dtype=np.int64)
        B = self.block_tokens
        s = self.sess[r]
        pn = self.path_node[s]
        pc = self.path_c[s]
        has = pc > 0
        n_path = has.sum(axis=1)
        cnt = self.cnt[r]
        part = self.partial[r]
        n_rng = n_path + cnt + part
        off = _excl_cumsum(n_rng)
        total = int(n_rng.sum())
        rs = np.empty(total, dtype=np.int64)
        rl = np.empty(total, dtype=np.int64)
        # shared-prefix ranges, in path order
        slot = np.cumsum(has, axis=1) - has
        dest = (off[:, None] + slot)[has]
        rs[dest] = self.node_first[pn[has]]
        rl[dest] = pc[has]
        # session ranges: a prefix of the session's range table
        idx = _expand(self.rt_off[s], cnt)
        dest = _expand(off + n_path, cnt)
        rs[dest] = self.rt_start[idx]
        rl[dest] = self.rt_len[idx]
        # the partial last block
        dest = (off + n_path + cnt)[part]
        rs[dest] = (self.first_id[r] + self.node_new[r] + self.new_full[r])[part]
        rl[dest] = 1
        values = _expand(rs, rl)
        L = self.input_tokens[r]
        n_blocks = -(-L // B)
        offsets = np.zeros(r.shape[0] + 1, dtype=np.int64)
        np.cumsum(n_blocks, out=offsets[1:])
        if offsets[-1] != values.shape[0]:  # pragma: no cover - internal invariant
            raise AssertionError("block list lengths do not match ceil(input_tokens/B)")
        block_ids = pa.LargeListArray.from_arrays(
            pa.array(offsets), pa.array(values.view(np.uint64))
        )
        parent = self.parent[r]
        names = pl.Series([a.name for a in _APPS], dtype=pl.String)
        tenants = pl.Series(self.tenant_names, dtype=pl.String)
        df = pl.DataFrame(
            {
                "request_id": r,
                "timestamp": self.ms[r] / 1000.0,
                "session_id": self.root[r],
                "parent_id": pa.array(parent, mask=parent < 0),
                "turn": self.turn[r],
                "type": names.gather(self.app[r]),
                "tenant": tenants.gather(self.tenant[r]),
                "input_tokens": L,
                "output_tokens": self.output_tokens[r],
                "block_ids": pl.from_arrow(block_ids),
            }
        )
        return df.cast(REQUEST_SCHEMA)  # type: ignore[arg-type]


def _check_args(kind: str, n_requests: int, block_tokens: int | None,
                rate_per_s: float | None) -> tuple[int, float]:
    if kind not in KINDS:
        raise UsageError(f"unknown kind '{kind}': expected one of {', '.join(KINDS)}", field="kind")
    if int(n_requests) < 1:
        raise UsageError(f"expected at least 1 request, got {n_requests}", field="requests")
    B = DEFAULT_BLOCK_TOKENS if block_tokens is None else int(block_tokens)
    if B < 1:
        raise UsageError(f"expected a positive block size in tokens, got {block_tokens}",
                         field="block_tokens")
    rate = DEFAULT_RATE_PER_S[kind] if rate_per_s is None else float(rate_per_s)
    if not (rate > 0 and math.isfinite(rate)):
        raise UsageError(f"expected a positive finite rate (requests/s), got {rate_per_s}",
                         field="rate_per_s")
    return B, rate


def _plan(kind: str, n_requests: int, seed: int, block_tokens: int | None,
          rate_per_s: float | None) -> _Plan:
    B, rate = _check_args(kind, n_requests, block_tokens, rate_per_s)
    n = int(n_requests)
    n_sessions = int(n / _TURNS_GUESS[kind] * 1.5) + 16
    while True:
        plan = _attempt(kind, n, seed, B, rate, n_sessions)
        if plan is not None:
            return plan
        n_sessions = int(n_sessions * 1.6) + 16


def _attempt(kind: str, n: int, seed: int, B: int, rate: float, S: int) -> _Plan | None:
    """Build the skeleton from ``S`` sessions; None when they do not cover ``n``
    requests (the n-th request must come before the last session start, so that no
    session that would have started inside the window is missing)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    n_apps = len(_APPS)
    tenant_base = np.concatenate([[0], np.cumsum([a.n_tenants for a in _APPS])])
    tenant_names = [f"{a.name}-{i:02d}" for a in _APPS for i in range(a.n_tenants)]
    n_tenants = int(tenant_base[-1])

    # --- tenants' system prompts and rag corpora (fixed per seed, not per S)
    t_app = np.repeat(np.arange(n_apps), [a.n_tenants for a in _APPS])
    sys_tokens = _lognormal(rng, "sys_tokens", t_app, n_tenants)
    z = rng.standard_normal(n_tenants * _DOCS_PER_TENANT)
    doc_tokens = np.clip(np.rint(np.exp(math.log(_DOC_LEN[0]) + _DOC_LEN[1] * z)),
                         _DOC_LEN[2], _DOC_LEN[3]).astype(np.int64)
    doc_tokens = doc_tokens.reshape(n_tenants, _DOCS_PER_TENANT)

    # --- sessions: app type, tenant, documents, turns
    if kind == "mixed":
        app = rng.choice(n_apps, size=S, p=np.array(_MIX))
    else:
        app = np.full(S, _APP_CODE[kind], dtype=np.int64)
    tenant = np.empty(S, dtype=np.int64)
    u = rng.random(S)
    for i, a in enumerate(_APPS):
        m = app == i
        cdf = np.cumsum(_zipf_p(a.n_tenants, a.tenant_zipf))
        tenant[m] = tenant_base[i] + np.minimum(np.searchsorted(cdf, u[m], side="right"),
                                                a.n_tenants - 1)
    doc_cdf = np.cumsum(_zipf_p(_DOCS_PER_TENANT, _DOC_ZIPF))
    draws = np.minimum(np.searchsorted(doc_cdf, rng.random((S, _MAX_DOCS)), side="right"),
                       _DOCS_PER_TENANT - 1)
    n_docs = 1 + rng.binomial(_MAX_DOCS - 1, _DOC_COUNT_P, S)
    is_rag = np.array([a.docs for a in _APPS])[app]
    valid = (np.arange(_MAX_DOCS)[None, :] < n_docs[:, None]) & is_rag[:, None]
    for j in range(1, _MAX_DOCS):  # a retriever returns distinct documents
        valid[:, j] &= ~(draws[:, :j] == draws[:, j : j + 1]).any(axis=1)
    order = np.argsort(~valid, axis=1, kind="stable")  # valid first, in draw order
    docs = np.where(np.take_along_axis(valid, order, axis=1),
                    np.take_along_axis(draws, order, axis=1), -1).astype(np.int64)
    # one app code (a scalar: cheaper) unless the trace is mixed
    s_app: int | np.ndarray = app if kind == "mixed" else _APP_CODE[kind]
    turns = _param("turns", s_app, 0) + np.floor(
        _param("turns", s_app, 2) * rng.pareto(_param("turns", s_app, 1), S))
    turns = np.minimum(turns, _param("turns", s_app, 3)).astype(np.int64)

    # --- shared-prefix nodes: tenant system prompt, then each document prefix
    D1 = 1 + _MAX_DOCS
    keys = np.stack([_node_keys(tenant, docs, lvl) for lvl in range(D1)], axis=1)
    exists = np.concatenate([np.ones((S, 1), dtype=bool), docs >= 0], axis=1)
    seg = np.concatenate(
        [sys_tokens[tenant][:, None],
         np.where(docs >= 0, doc_tokens[tenant[:, None], np.maximum(docs, 0)], 0)], axis=1)
    end = np.cumsum(seg, axis=1)
    path_c = np.where(exists, end // B - np.concatenate(
        [np.zeros((S, 1), dtype=np.int64), end[:, :-1] // B], axis=1), 0)
    uniq, inv = np.unique(keys[exists], return_inverse=True)
    path_node = np.full((S, D1), -1, dtype=np.int64)
    path_node[exists] = inv.reshape(-1)
    shared_end = np.where(exists, end, 0).max(axis=1)

    # --- requests (generation order: session, then turn)
    R0 = int(turns.sum())
    g_sess = np.repeat(np.arange(S), turns)
    g_start = _excl_cumsum(turns)
    g_turn = np.arange(R0) - np.repeat(g_start, turns) + 1
    g_app = app[g_sess]
    r_app: int | np.ndarray = g_app if kind == "mixed" else _APP_CODE[kind]
    first = g_turn == 1
    user = _lognormal(rng, "next_tokens", r_app, R0)
    user[g_start] = _lognormal(rng, "first_tokens", s_app, S)
    out = _lognormal(rng, "output_tokens", r_app, R0)
    prev_out = np.concatenate([[0], out[:-1]])
    delta = user + np.where(first, 0, prev_out)
    csum = np.cumsum(delta)
    L = shared_end[g_sess] + csum - np.repeat(csum[g_start] - delta[g_start], turns)
    # a session ends before its context exceeds the model's window (monotone in turn)
    fits = (L + out <= _param("max_context", r_app)) | first
    # gap to the next turn: service (prefill + decode) + think/tool time, or a revisit
    gap = np.exp(np.log(_param("think_s", r_app, 0))
                 + _param("think_s", r_app, 1) * rng.standard_normal(R0))
    revisit = rng.random(R0) < _param("revisit", r_app, 0)
    n_rev = int(revisit.sum())
    rev_app = r_app[revisit] if isinstance(r_app, np.ndarray) else r_app
    gap[revisit] = np.exp(np.log(_param("revisit", rev_app, 1))
                          + _param("revisit", rev_app, 2) * rng.standard_normal(n_rev))
    gap += _SERVICE_BASE_S + L * _PREFILL_S_PER_TOKEN + out * _param("decode_s_per_token", r_app)
    gap *= 1000.0
    step_ms = np.maximum(1, np.rint(gap)).astype(np.int64)
    del gap, revisit

    keep = fits
    g_sess, g_turn, g_app, user, out, L, step_ms = (
        x[keep] for x in (g_sess, g_turn, g_app, user, out, L, step_ms))
    turns = np.bincount(g_sess, minlength=S)
    g_start = _excl_cumsum(turns)
    # session starts: Poisson with diurnal + burst modulation; rate is per request
    starts = _session_starts(rng, S, rate / max(float(turns.mean()), 1e-9))
    start_ms = np.rint(starts * 1000.0).astype(np.int64)
    prev_step = np.concatenate([[0], step_ms[:-1]])
    prev_step[g_start] = 0
    cs = np.cumsum(prev_step)
    ms = start_ms[g_sess] + cs - np.repeat(cs[g_start], turns)

    # --- the window: the first n requests in time order
    if R0 == 0 or ms.shape[0] < n:
        return None
    order = np.argsort(ms, kind="stable")
    cut_ms = ms[order[n - 1]]
    if cut_ms > start_ms[-1]:
        return None
    kept = np.zeros(ms.shape[0], dtype=bool)
    kept[order[:n]] = True
    g_sess, g_turn, g_app, user, out, L, ms = (
        x[kept] for x in (g_sess, g_turn, g_app, user, out, L, ms))
    # dense session index over the sessions that have requests (in start order)
    sess_ids, g_sess = np.unique(g_sess, return_inverse=True)
    g_sess = g_sess.astype(np.int64)
    tenant, path_node, path_c, shared_end, docs = (
        x[sess_ids] for x in (tenant, path_node, path_c, shared_end, docs))
    turns = np.bincount(g_sess)
    g_start = _excl_cumsum(turns)
    order = np.argsort(ms, kind="stable")  # trace position -> generation row
    tpos = np.empty(n, dtype=np.int64)
    tpos[order] = np.arange(n)

    # --- block counts: session full blocks new in each turn, partial last block
    full = L // B
    prev_full = np.concatenate([[0], full[:-1]])
    prev_full[g_start] = shared_end // B
    g_new_full = full - prev_full
    partial = (L % B) > 0
    t_sess = g_sess[order]
    t_turn = g_turn[order]
    # shared-prefix node blocks are created by the first request that uses the node;
    # only first turns introduce nodes (later turns reuse their session's)
    r1 = np.flatnonzero(t_turn == 1)
    pn1 = path_node[t_sess[r1]]
    pc1 = path_c[t_sess[r1]]
    flat = pn1.reshape(-1)
    flat_r = np.repeat(r1, D1)
    ok = flat >= 0
    first_use = np.full(uniq.shape[0], -1, dtype=np.int64)
    nodes_seen, first_idx = np.unique(flat[ok], return_index=True)
    first_use[nodes_seen] = flat_r[ok][first_idx]
    is_new = (pn1 >= 0) & (first_use[np.maximum(pn1, 0)] == r1[:, None])
    c_new = np.where(is_new, pc1, 0)
    node_new = np.zeros(n, dtype=np.int64)
    node_new[r1] = c_new.sum(axis=1)
    new_full = g_new_full[order]
    t_partial = partial[order]
    first_id = _excl_cumsum(node_new + new_full + t_partial)
    node_first = np.full(uniq.shape[0], -1, dtype=np.int64)
    slot_off = np.cumsum(c_new, axis=1) - c_new
    node_first[pn1[is_new]] = (first_id[r1][:, None] + slot_off)[is_new]

    # --- session range table: per (session, turn) with new full blocks
    nz = g_new_full > 0
    rt_start = (first_id + node_new)[tpos[nz]]
    rt_len = g_new_full[nz]
    cnz = np.cumsum(nz)
    base = cnz[g_start] - nz[g_start]
    g_cnt = cnz - np.repeat(base, turns)
    rt_off = base.astype(np.int64)

    g_parent = np.where(g_turn > 1, tpos[np.maximum(np.arange(n) - 1, 0)], -1)
    g_root = tpos[g_start][g_sess]
    t_ms = ms[order]
    return _Plan(
        kind=kind, block_tokens=B, n=n,
        ms=t_ms - t_ms[0], app=g_app[order].astype(np.int64),
        tenant=tenant[t_sess].astype(np.int64), sess=t_sess, turn=t_turn,
        input_tokens=L[order], output_tokens=out[order],
        parent=g_parent[order], root=g_root[order],
        first_id=first_id, node_new=node_new, new_full=new_full, partial=t_partial,
        cnt=g_cnt[order].astype(np.int64),
        path_node=path_node, path_c=path_c, rt_off=rt_off, node_first=node_first,
        rt_start=rt_start, rt_len=rt_len, tenant_names=tenant_names,
        user_tokens=user[order], sys_tokens=sys_tokens, docs=docs, doc_tokens=doc_tokens,
    )


def _meta(kind: str, n: int, seed: int, B: int, rate: float) -> TraceMeta:
    return TraceMeta(
        block_tokens=B,
        source_format="canonical",
        source=f"kvtrace synth kind={kind} requests={n} seed={seed} block_tokens={B} "
               f"rate_per_s={rate:g}",
    )


# --------------------------------------------------------------------------- public API
def generate(
    kind: str,
    n_requests: int,
    seed: int,
    *,
    block_tokens: int | None = None,
    rate_per_s: float | None = None,
) -> tuple[pl.DataFrame, TraceMeta]:
    """Generate a synthetic trace as a canonical request table.

    Parameters
    ----------
    kind : {"chat", "agent", "rag", "mixed"}
        Workload (see the module docstring).
    n_requests : int
        Number of requests (rows): the first ``n_requests`` arrivals of the workload.
    seed : int
        Seed of the ``numpy.random.Generator(PCG64(seed))``; equal arguments give an
        identical table.
    block_tokens : int, optional
        Tokens per block B (default 512, as in the Mooncake release; the Qwen-Bailian
        release uses 16).
    rate_per_s : float, optional
        Long-run mean request arrival rate, requests per second (default per kind,
        :data:`DEFAULT_RATE_PER_S`). Session starts are modulated by a diurnal cycle
        and bursts, so the rate seen in a short window varies.

    Returns
    -------
    (polars.DataFrame, TraceMeta)
        The table has exactly the columns and types of
        :data:`kvtrace.trace.REQUEST_SCHEMA`, in timestamp order (seconds from the first
        request, whole milliseconds). ``request_id`` is the row index,
        ``session_id`` the ``request_id`` of the session's first turn, ``parent_id``
        the previous turn's (null for a first turn), ``turn`` 1-based,
        ``ceil(input_tokens / B) == len(block_ids)``. Block ids are dense counters in
        order of first appearance with chained-hash semantics.
    """
    B, rate = _check_args(kind, n_requests, block_tokens, rate_per_s)
    plan = _plan(kind, n_requests, seed, B, rate)
    return plan.chunk(0, plan.n), _meta(kind, plan.n, seed, B, rate)


def iter_chunks(
    kind: str,
    n_requests: int,
    seed: int,
    *,
    block_tokens: int | None = None,
    rate_per_s: float | None = None,
    chunk_requests: int = DEFAULT_CHUNK_REQUESTS,
) -> tuple[Iterator[pl.DataFrame], TraceMeta]:
    """The trace of :func:`generate` as successive time windows of
    ``chunk_requests`` rows each (their concatenation equals :func:`generate`'s
    table). Memory is O(n_requests) for the skeleton plus O(chunk) for block lists.
    """
    B, rate = _check_args(kind, n_requests, block_tokens, rate_per_s)
    if int(chunk_requests) < 1:
        raise UsageError(f"expected a positive chunk size, got {chunk_requests}",
                         field="chunk_requests")
    plan = _plan(kind, n_requests, seed, B, rate)
    step = int(chunk_requests)

    def chunks() -> Iterator[pl.DataFrame]:
        for a in range(0, plan.n, step):
            yield plan.chunk(a, min(a + step, plan.n))

    return chunks(), _meta(kind, plan.n, seed, B, rate)


def _check_fmt(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UsageError(f"unknown format '{fmt}': expected one of {', '.join(FORMATS)}",
                         field="format")


def _jsonl_frame(df: pl.DataFrame, fmt: str) -> pl.DataFrame:
    """The rows of ``df`` as the fields of a Mooncake or Qwen-Bailian JSONL line."""
    if df.height and int(df["block_ids"].explode().max() or 0) >= 2**63:
        raise KvtraceError("block ids >= 2**63 cannot be written as JSONL integers "
                           "(consumers parse signed 64-bit ints)", field="block_ids")
    hash_ids = pl.col("block_ids").cast(pl.List(pl.Int64)).alias("hash_ids")
    if fmt == "mooncake":
        return df.select(
            (pl.col("timestamp") * 1000.0).round(0).cast(pl.Int64).alias("timestamp"),
            pl.col("input_tokens").alias("input_length"),
            pl.col("output_tokens").alias("output_length"),
            hash_ids,
        )
    return df.select(
        pl.col("request_id").alias("chat_id"),
        pl.col("parent_id").fill_null(-1).alias("parent_chat_id"),
        pl.col("timestamp"),
        pl.col("input_tokens").alias("input_length"),
        pl.col("output_tokens").alias("output_length"),
        pl.col("type"),
        pl.col("turn"),
        hash_ids,
    )


def _arrow_table(df: pl.DataFrame, meta: TraceMeta) -> pa.Table:
    table = df.select(list(REQUEST_SCHEMA)).cast(REQUEST_SCHEMA).to_arrow()  # type: ignore[arg-type]
    md = dict(table.schema.metadata or {})
    md[b"kvtrace"] = json.dumps(meta.to_dict()).encode()
    return table.replace_schema_metadata(md)


def write(df: pl.DataFrame, meta: TraceMeta, path: str | os.PathLike, fmt: str) -> None:
    """Write a request table atomically (via :func:`kvtrace.outputs.atomic_path`).

    Parameters
    ----------
    df : polars.DataFrame
        A canonical request table (:data:`kvtrace.trace.REQUEST_SCHEMA`).
    meta : TraceMeta
        Trace metadata; stored in Parquet only (JSONL formats imply their block
        size: 512 tokens for Mooncake, 16 for Qwen-Bailian, so pass that
        ``block_tokens`` to whoever reads a JSONL file made with another).
    path : path-like
        Destination file.
    fmt : {"mooncake", "bailian", "parquet"}
        ``mooncake``: JSONL ``{"timestamp": ms (int), "input_length",
        "output_length", "hash_ids"}``. ``bailian``: JSONL ``{"chat_id",
        "parent_chat_id" (-1 for a first turn), "timestamp" (float seconds),
        "input_length", "output_length", "type", "turn", "hash_ids"}``.
        ``parquet``: the canonical table, zstd, with ``json.dumps(meta.to_dict())``
        under the key-value metadata key ``kvtrace``.
    """
    _check_fmt(fmt)
    with atomic_path(path) as tmp:
        if fmt == "parquet":
            pq.write_table(_arrow_table(df, meta), tmp, compression="zstd")
        else:
            _jsonl_frame(df, fmt).write_ndjson(tmp)


def write_chunked(
    kind: str,
    n_requests: int,
    seed: int,
    path: str | os.PathLike,
    fmt: str,
    *,
    block_tokens: int | None = None,
    rate_per_s: float | None = None,
    chunk_requests: int = DEFAULT_CHUNK_REQUESTS,
) -> TraceMeta:
    """Generate and write a trace chunk by chunk (for traces too large to hold).

    Same arguments as :func:`generate` and :func:`write`; ``chunk_requests`` rows are
    expanded and written at a time (one Parquet row group per chunk). The JSONL
    output is byte-identical to ``write(*generate(...), path, fmt)``; the Parquet
    output holds the same table and metadata. Returns the trace metadata.
    """
    _check_fmt(fmt)
    chunks, meta = iter_chunks(kind, n_requests, seed, block_tokens=block_tokens,
                               rate_per_s=rate_per_s, chunk_requests=chunk_requests)
    with atomic_path(path) as tmp:
        if fmt == "parquet":
            writer = None
            try:
                for df in chunks:
                    table = _arrow_table(df, meta)
                    if writer is None:
                        writer = pq.ParquetWriter(tmp, table.schema, compression="zstd")
                    writer.write_table(table)
            finally:
                if writer is not None:
                    writer.close()
        else:
            with open(tmp, "wb") as fh:
                for df in chunks:
                    _jsonl_frame(df, fmt).write_ndjson(fh)
    return meta
