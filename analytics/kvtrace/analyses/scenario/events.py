"""A scenario's events resolved against a trace (:func:`plan_events`) and the state
edits they make between requests (:class:`Editor`); :mod:`kvtrace.analyses.scenario`
states the semantics.

- *trace transforms*, decided before the replay from the trace alone: ``migration``
  (the node of the moved sessions' later requests) and ``rollout`` (the moved
  requests' blocks renumbered into a second namespace, ids ``M..2M-1``: the same
  sizes, nothing shared with the first);
- *state edits* at the first request at or after the event's time, before it is
  served (:mod:`kvtrace.kernels.scenario_ops`): ``cold-start``, ``restored``,
  ``target-loss``, ``ttl`` sweeps, ``rollout`` retirement steps, and ``catalog-outage``
  (the shared flash list set aside with its capacity at 0, then put back as it was);
- ``prestage``: the turns to prefetch for and when (:class:`PrestagePlan`); the replay
  (:mod:`kvtrace.analyses.scenario.run`) feeds the prefetches;
- ``prewarm``: its start (the replay, :mod:`kvtrace.analyses.scenario.prewarm`, picks
  the blocks from the state then and schedules their landings);
- ``congestion``: windows of the load model's links (:attr:`EventPlan.congestion`), the
  replay unchanged.

An event whose time is after the last request never acts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kvtrace.analyses.engine import service_times, trace_service_times
from kvtrace.analyses.scenario.config import (CatalogOutage, ColdStart, Congestion, Migration, Prestage, Prewarm,
                                              Restored, Rollout, ScenarioFile, TargetLoss, Ttl)
from kvtrace.errors import UsageError
from kvtrace.kernels import scenario_ops as ops
from kvtrace.kernels.tier_table import ABSENT, LIST0, PREV
from kvtrace.kernels.tiers import TierSimulator

#: Seeds of the per-session coin of each transform (independent of the routing hash).
MIGRATION_SEED = 0x8CB92BA72F3D8DD7
ROLLOUT_SEED = 0x4F1BBCDCBFA53E0B
BASELINE = "plain"


def session_coin(trace, seed: int) -> np.ndarray:
    """float64[R] in [0, 1): a fixed coin per session (per request without a session
    id): ``mix64(key ^ seed) / 2**64``, the session id's key as routing's."""
    from kvtrace.analyses.whatif.config import mix64, session_keys

    h = mix64(session_keys(trace.requests) ^ np.uint64(seed))
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
    prestage: "PrestagePlan | None" = None
    congestion: list = field(default_factory=list)  # (resource, instance or None, from, to, share): queue windows
    prewarms: list = field(default_factory=list)  # the prewarm events (a ``pw_start`` action's args[0] indexes them)


@dataclass
class PrestagePlan:
    """The turns a ``prestage`` event prefetches for: ``targets[k]`` (a request), the
    turn before it in its session ``preds[k]``, when its prefetch is issued and the
    request it comes before (``at[k]``: the first at or after the issue; after the
    edits before that request), in issue order."""

    targets: np.ndarray
    preds: np.ndarray
    issue_s: np.ndarray
    predictor: str
    gbps: float
    at: np.ndarray
    event: int = 0


def predecessors(trace) -> np.ndarray:
    """int64[R]: each request's previous turn (its ``parent_id`` when the trace names
    one, else the previous request of its session; -1: none). A usage error when the
    trace has neither sessions nor parents (Mooncake traces carry neither)."""
    req = trace.requests
    R = req.height
    out = np.full(R, -1, dtype=np.int64)
    has_sess = "session_id" in req.columns and req["session_id"].null_count() < R
    has_parent = "parent_id" in req.columns and req["parent_id"].null_count() < R
    if R and not has_sess and not has_parent:
        raise UsageError("prestaging follows sessions: this trace has no session_id or parent_id (Mooncake traces "
                         "carry neither; Bailian traces and kvtrace synth's do)", field="scenario.event.kind")
    if has_sess:
        sess = req["session_id"].to_numpy()
        ok = ~req["session_id"].is_null().to_numpy()
        idx = np.nonzero(ok)[0]
        order = idx[np.argsort(sess[idx], kind="stable")]
        same = sess[order[1:]] == sess[order[:-1]]
        out[order[1:][same]] = order[:-1][same]
    if has_parent:  # a parent named by id (the last request of that id), earlier in the trace
        rid = req["request_id"].to_numpy().astype(np.int64)
        i = np.nonzero(~req["parent_id"].is_null().to_numpy())[0]
        v = req["parent_id"].drop_nulls().to_numpy().astype(np.int64)
        order = np.argsort(rid, kind="stable")
        srt = rid[order]
        at = np.searchsorted(srt, v, side="right") - 1
        found = at >= 0
        found[found] = srt[at[found]] == v[found]
        j = np.where(found, order[np.maximum(at, 0)], -1)
        ok = found & (j < i)
        out[i[ok]] = j[ok]
    return out


def _moves_into_dram(trace, sysc, what: str, reads: str) -> None:
    """A usage error unless ``what`` (an event that moves blocks into DRAM and reads the
    trace around it) can run: a promotion that moves blocks, the trace in memory."""
    if sysc.promotion == "none":
        raise UsageError(f"{what} moves blocks into DRAM: it needs promotion promote or copy",
                         field="system.promotion")
    if not hasattr(trace, "accesses"):
        raise UsageError(f"{what} {reads}: it needs the trace in memory", field="scenario.event.kind")


def class_names(trace, by: str) -> list[str]:
    """The classes of the requests (``by``: their ``type`` or ``tenant``), sorted."""
    req = trace.requests
    if by not in req.columns:
        raise UsageError(f"a TTL by {by} needs the trace's {by} column", field="scenario.event.by")
    return [str(x) for x in np.unique(req[by].cast(str).fill_null("").to_numpy())]


def block_classes(trace, by: str, moved) -> tuple[np.ndarray, list[str]]:
    """int32 per block id (both namespaces with a rollout's ``moved``): the index in
    :func:`class_names` of the class of the request that first used the id (0 for an id
    no request uses); and the class names."""
    if not hasattr(trace, "accesses"):
        raise UsageError("a TTL by class reads each block's first request: it needs the trace in memory",
                         field="scenario.event.by")
    names = class_names(trace, by)
    _, req_class = np.unique(trace.requests[by].cast(str).fill_null("").to_numpy(), return_inverse=True)
    M = int(trace.n_blocks)
    lens = np.diff(np.asarray(trace.req_start, dtype=np.int64))
    ids = np.asarray(trace.accesses.block, dtype=np.int64)
    if moved is not None:
        ids = ids + np.repeat(np.where(moved, M, 0).astype(np.int64), lens)
    first = np.full(2 * M if moved is not None else M, -1, dtype=np.int64)
    uniq, at = np.unique(ids, return_index=True)
    first[uniq] = np.repeat(np.arange(lens.shape[0]), lens)[at]
    out = np.where(first >= 0, req_class[np.maximum(first, 0)], 0).astype(np.int32)
    return out, names


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
    prestage = None
    congestion: list = []
    prewarms: list = []
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
            tiers = ("dram", "local_ssd", "shared_flash")
            klass = None
            if ev.by is None:
                ttls = tuple(getattr(ev, x) for x in tiers)
                if all(x == math.inf for x in ttls):
                    continue
            else:  # the blocks' classes once every event is planned (a rollout's namespace may come later)
                klass, names = ev.by, class_names(trace, ev.by)
                ttls = tuple(np.array([ev.of_class(x, c) for c in names], dtype=np.float64) for x in tiers)
                if all(np.isinf(x).all() for x in ttls):
                    continue
            if not ev.sweep > 0:
                raise UsageError("expected a sweep interval > 0", field="scenario.event.sweep")
            k_last = math.floor((span - t) / ev.sweep) if span >= t else -1
            for k in range(k_last + 1):
                add(t + k * ev.sweep, "expire", (ttls, klass), i)
        elif isinstance(ev, Migration):
            if sysc.nodes < 2:
                raise UsageError("a migration event needs at least two nodes ([system] nodes)", field="system.nodes")
            coin = session_coin(trace, MIGRATION_SEED + i)
            r = at_request(t)
            sel = np.zeros(R, dtype=bool)
            sel[r:] = coin[r:] < ev.share
            node[sel] = (node[sel] + 1) % sysc.nodes
        elif isinstance(ev, Congestion):
            if ev.resource == "local_ssd" and sysc.local_ssd == 0 or ev.resource == "flash" and not has_flash:
                raise UsageError(f"a congestion of {ev.resource} needs that tier in [system]",
                                 field="scenario.event.resource")
            limit = targets if ev.resource == "flash" else (1 if ev.resource == "uplink" else sysc.nodes)
            if ev.instance is not None and ev.instance >= limit:
                raise UsageError(f"instance {ev.instance} of {limit} {ev.resource} link(s): expected 0..{limit - 1}",
                                 field="scenario.event.instance")
            congestion.append((ev.resource, ev.instance, t, t + ev.duration, ev.share))
        elif isinstance(ev, Prestage):
            if prestage is not None:
                raise UsageError("one prestage event per scenario", field="scenario.event.kind")
            if ev.predictor == "none":
                continue
            _moves_into_dram(trace, sysc, "prestaging", "reads the next turns ahead")
            req = trace.requests
            if ev.turn_time.strip() == "trace":
                dur = trace_service_times(req)
            else:
                dur = service_times(ev.turn_time, req["input_tokens"].to_numpy(), req["output_tokens"].to_numpy())
            pred = predecessors(trace)
            j = np.nonzero(pred >= 0)[0]
            p = pred[j]
            end = rel[p] + dur[p]
            issue = np.maximum(end, rel[j] - ev.lead)
            keep = (issue < rel[j]) & (issue >= t)  # a pause before the turn, from the event on
            j, p, issue = j[keep], p[keep], issue[keep]
            order_k = np.argsort(issue, kind="stable")
            j, p, issue = j[order_k], p[order_k], issue[order_k]
            prestage = PrestagePlan(j, p, issue, ev.predictor, ev.gbps,
                                    np.searchsorted(rel, issue, side="left").astype(np.int64), i)
        elif isinstance(ev, Prewarm):
            _moves_into_dram(trace, sysc, "prewarming", "picks blocks by their past and future use")
            add(t, "pw_start", (len(prewarms),), i)
            prewarms.append(ev)
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
    classes: dict = {}
    for a in actions:
        if a.kind == "expire" and isinstance(a.args[1], str):
            if a.args[1] not in classes:
                classes[a.args[1]] = block_classes(trace, a.args[1], moved)[0]
            a.args = (a.args[0], classes[a.args[1]])
    actions.sort(key=lambda a: (a.request, a.time_s, a.order))
    first = [at_request(t) for t in times]
    return EventPlan(node, moved, actions, times, [r if r < R else None for r in first], prestage, congestion,
                     prewarms)


class Editor:
    """Applies a plan's actions to a :class:`~kvtrace.kernels.tiers.TierSimulator`."""

    def __init__(self, sim: TierSimulator, nodes: int, has_local: bool, has_flash: bool, bpt: int, n_old: int,
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
        self.hide_event = -1
        self.dropped = {}  # event index -> [blocks, tokens]
        n_ids = sim.st.shape[0] - 1
        self.gone = np.empty(n_ids, dtype=np.int64)  # the ids one drop removed
        #: per block: event index + 1 of the event that dropped it from everywhere, until its next access (0: none)
        self.lost = np.zeros(n_ids, dtype=np.int32)
        self.lists = np.array(self.dram + self.local + self.flash, dtype=np.int64)

    def aside(self) -> np.ndarray:
        """The set-aside flash list's ``PREV`` column during a catalog outage (else empty)."""
        if self.hidden is None or len(self.hidden) == 1:
            return np.zeros(0, dtype=self.sim.st.dtype)
        return self.hidden[0][:-1, PREV]

    def _count(self, ev: int, n: int, tok: int) -> None:
        d = self.dropped.setdefault(ev, [0, 0])
        d[0] += int(n)
        d[1] += int(tok)
        if n:
            ops.mark_lost(self.sim.st, self.gone[:n], self.lists, self.aside(), ev + 1, self.lost)

    def apply(self, a: Action) -> None:
        st, used = self.sim.st, self.sim.used
        if a.kind == "wipe":
            lists = self.dram if a.args[0] == "dram" else self.dram + self.local + self.flash
            for X in lists:
                if self.hidden is not None and X in self.flash:
                    continue  # the catalog is down: its blocks are set aside, lost when it is back
                self._count(a.event, *ops.drop_all(st, used, X, self.gone))
            if self.hidden is not None and a.args[0] != "dram":
                aside = self.aside()
                self.hidden = ("lost",)
                if aside.shape[0]:  # the set-aside blocks are gone too
                    ids = np.nonzero(aside != ABSENT)[0].astype(np.int64)
                    ops.mark_lost(st, ids, self.lists, np.zeros(0, dtype=st.dtype), a.event + 1, self.lost)
        elif a.kind == "target":
            T, k = a.args
            if self.hidden is None:
                self._count(a.event, *ops.drop_target(st, used, self.flash[0], T, k, self.gone))
            else:
                self._hidden_target(a.event, T, k)
        elif a.kind == "hide":
            if self.hidden is not None:
                raise UsageError("two catalog outages overlap", field="scenario.event.duration")
            X = self.flash[0]
            self.hidden = (st[:, X, :].copy(), int(used[X]), int(self.sim.cap[X]))
            self.hide_event = a.event
            ops.drop_all(st, used, X, np.zeros(0, dtype=np.int64))
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
            ttls, klass = a.args
            for lists, ttl, fifo in ((self.dram, ttls[0], False), (self.local, ttls[1], not self._flash_lru),
                                     (self.flash, ttls[2], not self._flash_lru)):
                if np.isinf(ttl).all():
                    continue
                if klass is None:
                    cutoff = math.ceil((a.time_s - ttl) / self.quantum)
                else:  # a cutoff per class; none (the smallest quantum) where the TTL is infinite
                    with np.errstate(invalid="ignore"):
                        c = np.ceil((a.time_s - ttl) / self.quantum)
                    cutoff = np.where(np.isinf(ttl), np.iinfo(np.int64).min, c).astype(np.int64)
                for X in lists:
                    if self.hidden is not None and X in self.flash:
                        continue
                    if klass is None:
                        self._count(a.event, *ops.drop_idle(st, used, X, fifo, cutoff, self.gone))
                    else:
                        self._count(a.event, *ops.drop_idle_classes(st, used, X, fifo, cutoff, klass, self.gone))
        elif a.kind == "retire":
            budget = int(a.args[0] // self.bpt)
            for X in self.dram + self.local + self.flash:
                if self.hidden is not None and X in self.flash:
                    continue
                self._count(a.event, *ops.drop_namespace(st, used, X, self.n_old, budget, self.gone))
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
        n, tok = ops.drop_target(st, used, X, T, k, self.gone)
        self.hidden = (st[:, X, :].copy(), int(used[X]), cap)
        st[:, X, :] = saved
        self._count(ev, n, tok)


__all__ = ["Action", "BASELINE", "Editor", "EventPlan", "MIGRATION_SEED", "PrestagePlan", "ROLLOUT_SEED",
           "block_classes", "plan_events", "predecessors", "session_coin"]
