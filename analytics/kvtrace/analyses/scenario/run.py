"""One scenario: its events resolved against the trace (:func:`plan_events`), the tier
replay with the events applied between requests (:func:`replay`), the load model over
that replay, and the timeline and summary row (:func:`run_scenarios`).

How each event acts (the package docstring states the semantics):

- *trace transforms*, decided before the replay from the trace alone: ``migration``
  (the node of the moved sessions' later requests) and ``rollout`` (the moved
  requests' blocks renumbered into a second namespace, ids ``M..2M-1``: the same
  sizes, nothing shared with the first);
- *state edits* at the first request at or after the event's time, before it is
  served (:mod:`kvtrace.kernels.scenario_ops`): ``cold-start``, ``restored``,
  ``target-loss``, ``ttl`` sweeps, ``rollout`` retirement steps, and ``catalog-outage``
  (the shared flash list set aside with its capacity at 0, then put back as it was).

An event whose time is after the last request never acts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from kvtrace.analyses.curves import parse_warmup, warmup_first_request
from kvtrace.analyses.load import LoadLevel, run_level
from kvtrace.analyses.load.demand import D_BD, D_BF, D_BL, D_SREST, D_WF, D_WL, Demand
from kvtrace.analyses.response import ResponseModel
from kvtrace.analyses.scenario.config import (CatalogOutage, ColdStart, Migration, Restored, Rollout, ScenarioFile,
                                              TargetLoss, Ttl)
from kvtrace.analyses.whatif.config import PROMOTIONS, route
from kvtrace.analyses.whatif.simulate import tier_rules
from kvtrace.errors import UsageError
from kvtrace.kernels import scenario_ops as ops
from kvtrace.kernels import tiers as K
from kvtrace.kernels.tier_table import LIST0, R_MISS_Q, R_MISS_TOK, R_PRE_TOK, R_TOTAL_TOK
from kvtrace.model import GpuSpec, ModelSpec
from kvtrace.trace.source import AccessChunk

#: Seeds of the per-session coin of each transform (independent of the routing hash).
MIGRATION_SEED = 0x8CB92BA72F3D8DD7
ROLLOUT_SEED = 0x4F1BBCDCBFA53E0B
BASELINE = "plain"


def session_coin(trace, seed: int) -> np.ndarray:
    """float64[R] in [0, 1): a fixed coin per session (per request without a session
    id): ``mix64(key ^ seed) / 2**64``, the session id's key as routing's."""
    from kvtrace.analyses.whatif.config import mix64

    req = trace.requests
    rid = req["request_id"].to_numpy().astype(np.int64)
    if "session_id" in req.columns:
        sess = req["session_id"]
        key = np.where(sess.is_null().to_numpy(), rid, sess.fill_null(0).to_numpy().astype(np.int64))
    else:
        key = rid
    h = mix64(key.astype(np.int64).view(np.uint64) ^ np.uint64(seed))
    return (h >> np.uint64(11)).astype(np.float64) * 2.0**-53


@dataclass
class Action:
    """A state edit before request ``request`` (``time_s``: when the event asked for it,
    seconds after the first request)."""

    request: int
    time_s: float
    order: int
    kind: str
    args: tuple = ()
    event: int = 0  # index of the event in its scenario


@dataclass
class EventPlan:
    """A scenario's events resolved against a trace."""

    node: np.ndarray  # int32[R]: the serving node of every request (migrations applied)
    moved: np.ndarray | None  # bool[R]: requests of the new model version (rollouts), or None
    actions: list[Action]
    event_times: list[float]  # each event's time, seconds after the first request (inf: never)
    event_first: list[int | None]  # each event's first request at or after its time (None: after the last)


def plan_events(trace, cfg: ScenarioFile, events, node: np.ndarray, targets: int) -> EventPlan:
    """Resolve ``events`` (of one scenario) against ``trace``: the transforms, and the
    state edits with the request each applies before."""
    ts = np.asarray(trace.request_timestamp, dtype=np.float64)
    R = ts.shape[0]
    t0 = float(ts[0]) if R else 0.0
    span = float(ts[-1] - t0) if R else 0.0
    rel = ts - t0
    sysc = cfg.system
    has_flash = sysc.flash > 0
    node = node.copy()
    moved = None
    actions: list[Action] = []
    times = []
    seq = 0

    def at_request(t: float) -> int:
        return int(np.searchsorted(rel, t, side="left")) if t < math.inf else R

    def add(t: float, kind: str, args: tuple, i: int) -> None:
        nonlocal seq
        r = at_request(t)
        if r < R:
            actions.append(Action(r, t, seq, kind, args, i))
            seq += 1

    for i, ev in enumerate(events):
        t = ev.at.resolve(span)
        times.append(t)
        if isinstance(ev, (TargetLoss, CatalogOutage)) and not has_flash:
            raise UsageError(f"a {ev.kind} event needs a shared flash tier ([system] flash > 0)", field="system.flash")
        if isinstance(ev, ColdStart):
            add(t, "wipe", ("all",), i)
        elif isinstance(ev, Restored):
            add(t, "wipe", ("dram",), i)
        elif isinstance(ev, TargetLoss):
            if ev.target >= targets:
                raise UsageError(f"target {ev.target} of {targets} flash targets ([load] flash_targets): expected "
                                 f"0..{targets - 1}", field="scenario.event.target")
            add(t, "target", (targets, ev.target), i)
        elif isinstance(ev, CatalogOutage):
            if np.asarray(trace.block_size).size and int(np.min(trace.block_size)) < 1:
                raise UsageError("a catalog-outage event needs every block to occupy at least one token",
                                 field="scenario.event.kind")
            add(t, "hide", (), i)
            add(t + ev.duration, "show", (), i)
        elif isinstance(ev, Ttl):
            ttls = (ev.dram, ev.local_ssd, ev.shared_flash)
            if all(x == math.inf for x in ttls):
                continue
            if not ev.sweep > 0:
                raise UsageError("expected a sweep interval > 0", field="scenario.event.sweep")
            k_last = math.floor((span - t) / ev.sweep) if span >= t else -1
            for k in range(k_last + 1):
                add(t + k * ev.sweep, "expire", ttls, i)
        elif isinstance(ev, Migration):
            if sysc.nodes < 2:
                raise UsageError("a migration event needs at least two nodes ([system] nodes)", field="system.nodes")
            coin = session_coin(trace, MIGRATION_SEED + i)
            r = at_request(t)
            sel = np.zeros(R, dtype=bool)
            sel[r:] = coin[r:] < ev.share
            node[sel] = (node[sel] + 1) % sysc.nodes
        elif isinstance(ev, Rollout):
            coin = session_coin(trace, ROLLOUT_SEED)
            if ev.ramp > 0:
                share = ev.share * np.clip((rel - t) / ev.ramp, 0.0, 1.0)
            else:
                share = np.where(rel >= t, ev.share, 0.0)
            now = coin < share
            # a session stays on the new version once moved (the share only grows)
            moved = now if moved is None else (moved | now)
            if ev.retire_gbps > 0 and ev.step > 0:
                end = t + ev.ramp
                k_last = math.floor((span - end) / ev.step) if span >= end else -1
                for k in range(k_last + 1):
                    add(end + (k + 1) * ev.step, "retire", (ev.retire_gbps * 1e9 * ev.step,), i)
        else:  # pragma: no cover - the schema admits no other kind
            raise AssertionError(ev)
    actions.sort(key=lambda a: (a.request, a.time_s, a.order))
    first = [at_request(t) for t in times]
    return EventPlan(node, moved, actions, times, [r if r < R else None for r in first])


class _Editor:
    """Applies a plan's actions to a :class:`~kvtrace.kernels.tiers.TierSimulator`."""

    def __init__(self, sim: K.TierSimulator, nodes: int, has_local: bool, has_flash: bool, bpt: int, n_old: int,
                 quantum_s: float, flash_cap: int, flash_lru: bool):
        self.sim = sim
        self._flash_cap = flash_cap
        self._flash_lru = flash_lru
        self.dram = [LIST0 + n for n in range(nodes)]
        self.local = [LIST0 + nodes + n for n in range(nodes)] if has_local else []
        self.flash = [LIST0 + nodes * (1 + int(has_local))] if has_flash else []
        self.bpt = bpt
        self.n_old = n_old
        self.quantum = quantum_s
        self.hidden = None
        self.dropped = {}  # event index -> [blocks, tokens]

    def _count(self, ev: int, n: int, tok: int) -> None:
        d = self.dropped.setdefault(ev, [0, 0])
        d[0] += int(n)
        d[1] += int(tok)

    def apply(self, a: Action) -> None:
        st, used = self.sim.st, self.sim.used
        if a.kind == "wipe":
            lists = self.dram if a.args[0] == "dram" else self.dram + self.local + self.flash
            for X in lists:
                if self.hidden is not None and X in self.flash:
                    continue  # the catalog is down: its blocks are set aside, lost when it is back
                self._count(a.event, *ops.drop_all(st, used, X))
            if self.hidden is not None and a.args[0] != "dram":
                self.hidden = ("lost",)
        elif a.kind == "target":
            T, k = a.args
            if self.hidden is None:
                self._count(a.event, *ops.drop_target(st, used, self.flash[0], T, k))
            else:
                self._hidden_target(a.event, T, k)
        elif a.kind == "hide":
            if self.hidden is not None:
                raise UsageError("two catalog outages overlap", field="scenario.event.duration")
            X = self.flash[0]
            self.hidden = (st[:, X, :].copy(), int(used[X]), int(self.sim.cap[X]))
            ops.drop_all(st, used, X)
            self.sim.cap[X] = 0
        elif a.kind == "show":
            X = self.flash[0]
            saved = self.hidden
            self.hidden = None
            if saved is None:
                return
            if len(saved) == 1:  # wiped while down: nothing comes back
                self.sim.cap[X] = self._flash_cap
                return
            col, u, cap = saved
            st[:, X, :] = col
            used[X] = u
            self.sim.cap[X] = cap
        elif a.kind == "expire":
            ttls = a.args
            for lists, ttl, fifo in ((self.dram, ttls[0], False), (self.local, ttls[1], not self._flash_lru),
                                     (self.flash, ttls[2], not self._flash_lru)):
                if ttl == math.inf:
                    continue
                cutoff = math.ceil((a.time_s - ttl) / self.quantum)
                for X in lists:
                    if self.hidden is not None and X in self.flash:
                        continue
                    self._count(a.event, *ops.drop_idle(st, used, X, fifo, cutoff))
        elif a.kind == "retire":
            budget = int(a.args[0] // self.bpt)
            for X in self.dram + self.local + self.flash:
                if self.hidden is not None and X in self.flash:
                    continue
                self._count(a.event, *ops.drop_namespace(st, used, X, self.n_old, budget))
        else:  # pragma: no cover
            raise AssertionError(a.kind)

    def _hidden_target(self, ev: int, T: int, k: int) -> None:
        """A target lost while the catalog is down: its blocks leave the set-aside list."""
        if len(self.hidden) == 1:
            return
        col, u, cap = self.hidden
        X = self.flash[0]
        st = self.sim.st
        saved = st[:, X, :].copy()
        st[:, X, :] = col
        used = np.zeros_like(self.sim.used)
        used[X] = u
        n, tok = ops.drop_target(st, used, X, T, k)
        self._count(ev, n, tok)
        self.hidden = (st[:, X, :].copy(), int(used[X]), cap)
        st[:, X, :] = saved


@dataclass
class ReplayOut:
    """What one scenario's replay yields for the load model and the timeline."""

    demand: Demand
    prefix_tokens: np.ndarray  # float64[R]
    total_tokens: np.ndarray
    recompute_s: np.ndarray  # GPU-seconds of reusable tokens recomputed
    counts: dict
    dropped: dict = field(default_factory=dict)


def replay(trace, cfg: ScenarioFile, plan: EventPlan, *, model: ModelSpec, response: ResponseModel, load,
           first: int, progress=None, decisions: np.ndarray | None = None) -> ReplayOut:
    """The tier replay of ``trace`` through ``cfg``'s system with ``plan`` applied
    (``decisions``, if given, int8[N]: every access's decision, ``COLD_FLAG`` added to a
    cold one's)."""
    sysc = cfg.system
    config = cfg.tier_config()
    bpt = int(model.kv_bytes_per_token)
    a_coef, b_coef = model.flops_coefficients()
    rules = tier_rules(sysc.cache_rules)
    M = int(trace.n_blocks)
    size = np.asarray(trace.block_size, dtype=np.int64)
    moved = plan.moved
    if moved is not None:
        size = np.concatenate([size, size])
    caps = (config.dram_bytes // bpt, config.local_ssd_bytes // bpt, config.flash_bytes // bpt)
    width = K.sketch_width(caps[2] + config.nodes * caps[1], trace.meta.block_tokens, size.shape[0])
    policy = config.parsed_policy
    if policy.kind in ("value", "reuse-oracle", "group"):
        raise UsageError(f"kvtrace scenario does not run the {policy.kind} admission policy yet; use all, none, "
                         "second-hit, freq>=k, prob:p, idle<T or tinylfu", field="system.policy")
    sim = K.TierSimulator(size, trace.request_timestamp, plan.node, block_tokens=trace.meta.block_tokens,
                          prefix_aware=sysc.eviction == "prefix-aware", dram=caps[0], local=caps[1], flash=caps[2],
                          n_nodes=config.nodes, policy=policy.code, param=policy.param,
                          flash_lru=sysc.flash_order == "lru", promotion=PROMOTIONS[sysc.promotion],
                          write_through=sysc.write_mode == "write-through", first_measured=first,
                          sketch_width=width, chunk_columns=True, rules=rules)
    quantum = 2.0 ** (K.HIST_MIN_EXP + sim.shift)
    editor = _Editor(sim, config.nodes, caps[1] > 0, caps[2] > 0, bpt, M, quantum, caps[2],
                     sysc.flash_order == "lru")
    R = trace.n_requests
    demand = Demand(trace, config, first, load.flash_targets, bpt, a_coef, b_coef, response,
                    load.prefill_tokens_per_s, block_size=size)
    pre = np.zeros(R, dtype=np.float64)
    tot = np.zeros(R, dtype=np.float64)
    rec = np.zeros(R, dtype=np.float64)
    tps = load.prefill_tokens_per_s
    acts = plan.actions
    ai = 0
    try:
        for ch in trace.chunks():
            cuts = sorted({a.request for a in acts[ai:] if ch.r <= a.request < ch.r_end} | {ch.r, ch.r_end})
            for r_lo, r_hi in zip(cuts[:-1], cuts[1:]):
                while ai < len(acts) and acts[ai].request == r_lo:
                    editor.apply(acts[ai])
                    ai += 1
                if r_hi <= r_lo:
                    continue
                i0, i1 = r_lo - ch.r, r_hi - ch.r
                lo, hi = int(ch.lrs[i0]), int(ch.lrs[i1])
                block = ch.block[lo:hi]
                if moved is not None:
                    mv = np.repeat(moved[r_lo:r_hi], np.diff(ch.lrs[i0:i1 + 1]))
                    block = np.where(mv, block + M, block)
                lrs = ch.lrs[i0:i1 + 1] - lo
                piece = AccessChunk(r_lo, r_hi, ch.lo + lo, ch.lo + hi, block, ch.tokens[lo:hi], ch.pos[lo:hi], lrs)
                decision = sim.feed(block, piece.tokens, piece.pos, lrs)
                if decisions is not None:
                    decisions[piece.lo:piece.hi] = decision
                q = sim.chunk_out
                demand.add(piece, decision, q, plan.node)
                pre[r_lo:r_hi] = q[:, R_PRE_TOK]
                tot[r_lo:r_hi] = q[:, R_TOTAL_TOK]
                if tps is None:
                    rec[r_lo:r_hi] = (a_coef * q[:, R_MISS_TOK] + b_coef * q[:, R_MISS_Q]) / response.recompute_flops_per_s
                else:
                    rec[r_lo:r_hi] = q[:, R_MISS_TOK] / tps if tps > 0 else np.inf
            if progress is not None:
                progress(ch.hi, trace.n_accesses)
        while ai < len(acts):  # a trace without requests
            editor.apply(acts[ai])
            ai += 1
        run = sim.finish()
    except BaseException:
        demand.close()
        raise
    return ReplayOut(demand, pre, tot, rec, run.counts, editor.dropped)


def _bins(rel: np.ndarray, first: int, bin_s: float) -> np.ndarray:
    """int64[R]: the timeline bin of every request (-1 before the measured window),
    bins counted from the first measured request's time."""
    out = np.full(rel.shape[0], -1, dtype=np.int64)
    if first < rel.shape[0]:
        out[first:] = np.floor((rel[first:] - rel[first]) / bin_s).astype(np.int64)
    return out


def timeline(name: str, rel: np.ndarray, first: int, bin_s: float, out: ReplayOut, ttft: np.ndarray | None,
             load, slo_s: float, nodes: int) -> pl.DataFrame:
    """Per bin of ``bin_s`` seconds of the measured window (``bin_start_s``: seconds
    after the trace's first request, as the events' times): requests, the prefix-token
    hit rate, bytes read per tier and their shares, recompute and prefill GPU-seconds,
    TTFT percentiles and SLO attainment, and the offered utilisation of the flash pool
    and the GPUs (work arriving in the bin over what the bin can serve)."""
    R = rel.shape[0]
    b = _bins(rel, first, bin_s)
    nb = int(b.max()) + 1 if R and b.max() >= 0 else 0
    m = b >= 0
    idx = b[m]
    rows = np.asarray(out.demand.rows)[m] if R else np.zeros((0, 16))

    def s(x):
        return np.bincount(idx, weights=x, minlength=nb)

    n = np.bincount(idx, minlength=nb).astype(np.int64)
    pre, tot = s(out.prefix_tokens[m]), s(out.total_tokens[m])
    bd, bl, bf = s(rows[:, D_BD]), s(rows[:, D_BL]), s(rows[:, D_BF])
    read = bd + bl + bf
    wf, wl = s(rows[:, D_WF]), s(rows[:, D_WL])
    gpu = s(rows[:, D_SREST])
    with np.errstate(invalid="ignore", divide="ignore"):
        cols = {
            "scenario": [name] * nb,
            "bin_start_s": (rel[first] if first < R else 0.0) + np.arange(nb, dtype=np.float64) * bin_s,
            "requests": n,
            "prefix_token_hit_rate": np.where(tot > 0, pre / np.where(tot > 0, tot, 1), np.nan),
            "dram_read_bytes": bd, "local_read_bytes": bl, "flash_read_bytes": bf,
            "dram_read_share": np.where(read > 0, bd / np.where(read > 0, read, 1), np.nan),
            "local_read_share": np.where(read > 0, bl / np.where(read > 0, read, 1), np.nan),
            "flash_read_share": np.where(read > 0, bf / np.where(read > 0, read, 1), np.nan),
            "flash_write_bytes": wf, "local_write_bytes": wl,
            "recompute_gpu_seconds": s(out.recompute_s[m]),
            "prefill_gpu_seconds": gpu,
            "util_flash_offered": (bf + wf) / (load.flash_bytes_per_s * bin_s) if load.flash_bytes_per_s
            else np.full(nb, np.nan),
            "util_gpu_offered": gpu / (max(1, load.gpus_per_node) * nodes * bin_s),
        }
    p50 = np.full(nb, np.nan)
    p99 = np.full(nb, np.nan)
    att = np.full(nb, np.nan)
    if ttft is not None and nb:
        tb = idx
        order = np.argsort(tb, kind="stable")
        edges = np.searchsorted(tb[order], np.arange(nb + 1))
        tt = ttft[order]
        for k in range(nb):
            x = tt[edges[k]:edges[k + 1]]
            done = x[~np.isnan(x)]
            if x.shape[0]:
                att[k] = np.count_nonzero(done <= slo_s) / x.shape[0]
            if done.shape[0]:
                p50[k], p99[k] = np.quantile(done, [0.5, 0.99], method="inverted_cdf")
    cols["ttft_p50_ms"] = p50 * 1e3
    cols["ttft_p99_ms"] = p99 * 1e3
    cols["slo_attainment"] = att
    return pl.DataFrame(cols).with_columns(pl.col(pl.Float64).fill_nan(None))


def recovery(tl: pl.DataFrame, base: pl.DataFrame, event_s: float, first_rel: float, bin_s: float,
             tol: float) -> tuple[float | None, float | None, bool]:
    """``(recovered_after_s, hit_rate_shortfall, recovered)``: the first bin at or after the
    event's from which the per-bin prefix-token hit rate stays within ``tol`` of the
    baseline's to the end (its start minus the event's time; 0 if never apart), and the
    largest drop below the baseline from the event's bin on (>= 0)."""
    h = tl["prefix_token_hit_rate"].to_numpy().astype(np.float64)
    g = base["prefix_token_hit_rate"].to_numpy().astype(np.float64)
    nb = min(h.shape[0], g.shape[0])
    if not nb or event_s == math.inf:
        return None, None, True
    e = max(0, int(math.floor((event_s - first_rel) / bin_s)))
    if e >= nb:
        return None, None, True
    d = np.nan_to_num(h[e:nb] - g[e:nb], nan=0.0)
    short = float(max(0.0, -d.min()))
    apart = np.nonzero(np.abs(d) > tol)[0]
    if apart.shape[0] == 0:
        return 0.0, short, True
    last = int(apart[-1])
    if last == d.shape[0] - 1:
        return None, short, False
    start = first_rel + (e + last + 1) * bin_s
    return max(0.0, start - event_s), short, True


@dataclass
class ScenarioResult:
    """Output of :func:`run_scenarios`.

    table : one row per scenario (the baseline ``plain`` first).
    timeline : one row per scenario and bin.
    events : one row per scenario event (its time, the request it acted before, what
        it dropped).
    info : model, system, load model, bin width, assumptions.
    """

    table: pl.DataFrame
    timeline: pl.DataFrame
    events: pl.DataFrame
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"scenarios": self.table.to_dicts(), "timeline": self.timeline.to_dicts(),
                "events": self.events.to_dicts(), "info": self.info}


def run_scenarios(trace, cfg: ScenarioFile, *, model: ModelSpec, gpu: GpuSpec, response: ResponseModel,
                  progress=None) -> ScenarioResult:
    """Every scenario of ``cfg`` (and the baseline without events) over ``trace``."""
    load = cfg.load_model()
    R = trace.n_requests
    if R == 0:
        raise UsageError("the trace has no requests", field="trace")
    first = min(warmup_first_request(trace, parse_warmup(cfg.run.warmup)), R)
    if first >= R:
        raise UsageError("the warm-up covers the whole trace: nothing left to measure", field="run.warmup")
    ts = np.asarray(trace.request_timestamp, dtype=np.float64)
    rel = ts - ts[0]
    config = cfg.tier_config()
    node0 = route(trace, config.nodes, config.routing)
    bin_s = cfg.run.bin
    level = LoadLevel(cfg.load.scale)
    runs = [(BASELINE, [])] + [(s.name, list(s.event)) for s in cfg.scenario]
    rows, tls, ev_rows = [], [], []
    base_tl = None
    total = len(runs) * trace.n_accesses
    for k, (name, events) in enumerate(runs):
        plan = plan_events(trace, cfg, events, node0, load.flash_targets)

        def prog(done, _n, k=k):
            if progress is not None:
                progress(k * trace.n_accesses + done, total)

        out = replay(trace, cfg, plan, model=model, response=response, load=load, first=first, progress=prog)
        try:
            row, _, ttft_m = run_level(out.demand, level, load, response, keep_ttft=True)
        finally:
            out.demand.close()
        ttft = np.full(R, np.nan)
        ttft[first:first + ttft_m.shape[0]] = ttft_m
        tl = timeline(name, rel, first, bin_s, out, ttft[first:], load, load.slo_ttft_s,
                      config.nodes)
        if base_tl is None:
            base_tl = tl
        ev_t = min(plan.event_times) if plan.event_times else math.inf
        rec_s, short, recovered = recovery(tl, base_tl, ev_t, float(rel[first]), bin_s, cfg.run.recovery_tolerance)
        pre = float(out.prefix_tokens[first:].sum())
        totv = float(out.total_tokens[first:].sum())
        s = {"scenario": name, "events": "; ".join(_event_text(e) for e in events) or "none"}
        for key in ("ttft_p50_ms", "ttft_p99_ms", "ttft_p999_ms", "goodput_rps", "slo_attainment", "restore_share",
                    "recompute_share"):
            s[key] = row.get(key)
        s["prefix_token_hit_rate"] = pre / totv if totv > 0 else None
        t_read = sum(float(tl[c].sum()) for c in ("dram_read_bytes", "local_read_bytes", "flash_read_bytes"))
        for tier in ("dram", "local", "flash"):
            v = float(tl[f"{tier}_read_bytes"].sum())
            s[f"{tier}_read_bytes"] = v
            s[f"{tier}_read_share"] = v / t_read if t_read > 0 else None
        s["flash_write_bytes"] = float(tl["flash_write_bytes"].sum())
        s["local_write_bytes"] = float(tl["local_write_bytes"].sum())
        s["recompute_gpu_seconds"] = float(out.recompute_s[first:].sum())
        s["prefill_gpu_seconds"] = float(tl["prefill_gpu_seconds"].sum())
        s["extra_prefill_gpu_seconds"] = (s["prefill_gpu_seconds"] - rows[0]["prefill_gpu_seconds"]) if rows else 0.0
        s["hit_rate_shortfall"] = short
        s["recovered_after_s"] = rec_s
        s["recovered"] = recovered
        for res in ("host_link", "nic", "local_ssd", "flash", "uplink", "gpu"):
            s[f"wait_p99_{res}_ms"] = row.get(f"wait_p99_{res}_ms")
        s["overloaded"] = bool(row.get("overloaded"))
        s["dropped_blocks"] = int(sum(v[0] for v in out.dropped.values()))
        s["dropped_bytes"] = float(sum(v[1] for v in out.dropped.values()) * model.kv_bytes_per_token)
        rows.append(s)
        tls.append(tl)
        for i, e in enumerate(events):
            acts = [a for a in plan.actions if a.event == i]
            d = out.dropped.get(i, [0, 0])
            ev_rows.append({"scenario": name, "event": i, "kind": e.kind, "text": _event_text(e),
                            "at_s": plan.event_times[i] if plan.event_times[i] < math.inf else None,
                            "first_request": plan.event_first[i],
                            "actions": len(acts), "dropped_blocks": int(d[0]),
                            "dropped_bytes": float(d[1]) * model.kv_bytes_per_token})
    table = pl.DataFrame(rows, infer_schema_length=None)
    events_df = pl.DataFrame(ev_rows, infer_schema_length=None) if ev_rows else pl.DataFrame(
        schema={"scenario": pl.String, "event": pl.Int64, "kind": pl.String})
    info = {"model": model.name, "kv_bytes_per_token": int(model.kv_bytes_per_token), "gpu": gpu.name,
            "system": cfg.system.model_dump(), "load": load.to_dict(), "load_factor": cfg.load.scale,
            "bin_s": bin_s, "warmup": cfg.run.warmup, "first_measured_request": first,
            "first_measured_s": float(rel[first]),
            "recovery_tolerance": cfg.run.recovery_tolerance,
            "assumptions": (f"{load.assumptions(response)}; load factor {cfg.load.scale:g}x; cache rules "
                            f"{cfg.system.cache_rules}; measured from request {first:,} of {R:,} "
                            f"({rel[-1] - rel[first]:.0f} s); recovery = the per-bin prefix-token hit rate within "
                            f"{cfg.run.recovery_tolerance:g} of the baseline's to the trace's end")}
    return ScenarioResult(table, pl.concat(tls, how="vertical_relaxed"), events_df, info)


def _event_text(e) -> str:
    at = f"{e.at.seconds:g}s" if e.at.seconds is not None else f"{e.at.share:.0%}"
    if isinstance(e, ColdStart):
        return f"cold start at {at}"
    if isinstance(e, Restored):
        return f"DRAM lost, flash kept, at {at}"
    if isinstance(e, Migration):
        return f"{e.share:.0%} of sessions to the next node at {at}"
    if isinstance(e, TargetLoss):
        return f"flash target {e.target} lost at {at}"
    if isinstance(e, CatalogOutage):
        return f"catalog down {e.duration:g}s from {at}"
    if isinstance(e, Rollout):
        ret = f", old version retired at {e.retire_gbps:g} GB/s per tier" if e.retire_gbps else ""
        return f"rollout to {e.share:.0%} over {e.ramp:g}s from {at}{ret}"
    if isinstance(e, Ttl):
        parts = [f"{t} {v:g}s" for t, v in (("DRAM", e.dram), ("local SSD", e.local_ssd),
                                             ("flash", e.shared_flash)) if v != math.inf]
        return f"TTL {', '.join(parts) or 'none'} from {at} (sweep {e.sweep:g}s)"
    return e.kind  # pragma: no cover


__all__ = ["Action", "BASELINE", "EventPlan", "ReplayOut", "ScenarioResult", "plan_events", "recovery", "replay",
           "run_scenarios", "session_coin", "timeline"]
