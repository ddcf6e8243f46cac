"""Slow, obviously correct twin of a scenario's replay (``kvtrace.analyses.scenario``).

Plain Python on top of ``naive_tiers``: the events are resolved here from the trace's
arrays alone (a linear scan for the first request at or after each time, the session
coins from ``naive_tiers.mix64``), and applied to the twin's ``OrderedDict`` tiers
before that request:

* cold-start: every tier emptied; restored: every DRAM emptied;
* target-loss: the shared flash's blocks whose ``mix_hash(b) % T == k`` removed;
* catalog-outage: the shared flash's blocks and count set aside and its capacity 0
  (nothing fits, nothing is found), then put back as they were;
* ttl: every ``sweep`` seconds from ``at``, from the old end of each tier (first item
  of its ``OrderedDict``), blocks whose touch time (insert time in a FIFO flash) is
  below ``ceil((t - ttl) / quantum)`` removed, stopping at the first that is not;
* rollout: the moved requests' blocks renumbered ``b + M``; retirement every ``step``
  after the ramp removes, from each tier's old end, blocks ``< M`` while their sizes fit
  the step's budget;
* migration: the moved sessions' requests from ``at`` on served by the next node;
* prewarm: at its start the twin stops, reads the tiers (every node's DRAM, local SSD,
  the shared flash unless set aside), picks and orders the candidates from the trace
  (last use before, FLOPs after: plain loops), schedules their landings and replays
  again from the beginning with each group fed as a ``naive_tiers`` prewarm request
  (kind 3) before its request, among the edits by (time, push order).

A removed block is not written anywhere nor counted; the twin's per-block state
(accesses so far, first request) is untouched, as the kernel's.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import naive_tiers as twin

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIGRATION_SEED = 0x8CB92BA72F3D8DD7
ROLLOUT_SEED = 0x4F1BBCDCBFA53E0B


def mix_hash(h: int, ns: int = 0) -> int:
    """kvtrace.kernels.densify.mix_hash: splitmix64's finaliser of h xor (ns + 1) x golden."""
    x = h ^ (((ns + 1) * GOLDEN) & MASK)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def routing_mix(x: int) -> int:
    """kvtrace.analyses.whatif.config.mix64 (the routing hash): splitmix64's finaliser
    of x + golden, as naive_tiers.mix64."""
    return twin.mix64(x)


def coin(key: int, seed: int) -> float:
    return (routing_mix((key & MASK) ^ seed) >> 11) * 2.0**-53


def first_at(rel: list[float], t: float) -> int:
    for r, x in enumerate(rel):
        if x >= t:
            return r
    return len(rel)


def plan(events: list[dict], ts: list[float], keys: list[int], node: list[int], nodes: int, targets: int,
         n_blocks: int):
    """``(node, moved, actions)``: ``actions[r]`` = the edits before request r, in order,
    each ``(time, push order, edit, event index)``."""
    R = len(ts)
    rel = [t - ts[0] for t in ts] if R else []
    span = rel[-1] if R else 0.0
    node = list(node)
    moved = None
    todo = []  # (request, time, order, action, event)
    cur = [0]

    def add(t, action):
        r = first_at(rel, t) if t < math.inf else R
        if r < R:
            todo.append((r, t, len(todo), action, cur[0]))

    times = []
    for i, ev in enumerate(events):
        cur[0] = i
        kind = ev["kind"]
        t = ev["at"]
        times.append(t)
        if kind == "cold-start":
            add(t, ("wipe", "all"))
        elif kind == "restored":
            add(t, ("wipe", "dram"))
        elif kind == "target-loss":
            add(t, ("target", targets, ev.get("target", 0)))
        elif kind == "prewarm":
            add(t, ("pw_start", i, t))
        elif kind == "catalog-outage":
            add(t, ("hide",))
            add(t + ev["duration"], ("show",))
        elif kind == "ttl":
            ttls = (ev.get("dram", math.inf), ev.get("local_ssd", math.inf), ev.get("shared_flash", math.inf))
            if ev.get("by"):  # per class: a tier's TTL a number or {class: ttl, "*": the others}
                if all(x == math.inf or (isinstance(x, dict) and all(v == math.inf for v in x.values()))
                       for x in ttls):
                    continue
                k = 0
                while t + k * ev["sweep"] <= span:
                    add(t + k * ev["sweep"], ("expire_by", t + k * ev["sweep"], ttls))
                    k += 1
                continue
            if all(x == math.inf for x in ttls):
                continue
            k = 0
            while t + k * ev["sweep"] <= span:
                add(t + k * ev["sweep"], ("expire", t + k * ev["sweep"], ttls))
                k += 1
        elif kind == "migration":
            share = ev.get("share", 1.0)
            r0 = first_at(rel, t)
            for r in range(r0, R):
                if coin(keys[r], MIGRATION_SEED + i) < share:
                    node[r] = (node[r] + 1) % nodes
        elif kind == "rollout":
            share, ramp = ev.get("share", 1.0), ev.get("ramp", 0.0)
            moved = moved or [False] * R
            for r in range(R):
                if ramp > 0:
                    s = share * min(1.0, max(0.0, (rel[r] - t) / ramp))
                else:
                    s = share if rel[r] >= t else 0.0
                moved[r] = moved[r] or coin(keys[r], ROLLOUT_SEED) < s
            rate, step = ev.get("retire_gbps", 0.0), ev.get("step", 60.0)
            if rate > 0:
                end = t + ramp
                k = 1
                while end + k * step <= span:
                    add(end + k * step, ("retire", rate * 1e9 * step))
                    k += 1
        else:
            raise AssertionError(kind)
    todo.sort(key=lambda x: (x[0], x[1], x[2]))
    actions: dict[int, list] = {}
    for r, t, o, a, i in todo:
        actions.setdefault(r, []).append((t, o, a, i))
    return node, moved, actions


class _Capture(Exception):
    """A prewarm's start reached: the tiers as they are then."""

    def __init__(self, event: int, t0: float, request: int, tiers: list):
        super().__init__()
        self.event, self.t0, self.request, self.tiers = event, t0, request, tiers


def run(block, size, req_start, tokens, pos, ts, keys, node, events, *, nodes, targets, bpt, flash_lru=True,
        flops=(0.0, 0.0), req_class=None, **kw):
    """The twin's replay of a scenario: ``naive_tiers.simulate_tiers``'s dict (the real
    requests' entries) plus ``dropped`` (blocks, tokens removed by the events) and, with
    a prewarm, ``prewarm`` (its figures, tokens). ``flops``: the model's ``(a, b)``;
    ``req_class``: each request's class (a TTL ``by`` type or tenant)."""
    M = len(size)
    node, moved, actions = plan(events, list(ts), keys, node, nodes, targets, M)
    block = [int(b) for b in block]
    size = [int(s) for s in size]
    if moved is not None:
        for r in range(len(req_start) - 1):
            if moved[r]:
                for t in range(req_start[r], req_start[r + 1]):
                    block[t] += M
        size = size + size
    rel = [t - ts[0] for t in ts]
    bclass = {}  # a block id's class: its first request's
    if req_class is not None:
        for r in range(len(req_start) - 1):
            for t in range(req_start[r], req_start[r + 1]):
                bclass.setdefault(block[t], req_class[r])
    kw["bclass"] = (bclass, sorted(set(req_class or [])))
    n_static = sum(len(v) for v in actions.values())
    groups: list = []  # (request, time, order, node, blocks, tokens, pos, start)
    captured: set = set()
    while True:
        try:
            out = _attempt(block, size, req_start, tokens, pos, ts, node, actions, groups, captured, M=M, nodes=nodes,
                           bpt=bpt, flash_lru=flash_lru, **kw)
            break
        except _Capture as c:
            captured.add(c.event)
            ev = events[c.event]
            groups += prewarm_groups(ev, c, block, size, req_start, tokens, pos, rel, node, nodes=nodes, bpt=bpt,
                                     flops=flops, block_tokens=kw["block_tokens"], dram=kw["dram"],
                                     first_order=n_static + 1 + len(groups))
    out["node"] = node
    return out


def prewarm_groups(ev, c, block, size, req_start, tokens, pos, rel, node, *, nodes, bpt, flops, block_tokens, dram,
                   first_order):
    """A prewarm's groups (``kvtrace.analyses.scenario.prewarm`` states the rules)."""
    R = len(req_start) - 1
    last_req, last_pos = {}, {}
    for r in range(c.request):
        for t in range(req_start[r], req_start[r + 1]):
            last_req[block[t]] = r
            last_pos[block[t]] = int(pos[t])
    order = ev.get("order", "value")
    if order == "value":
        horizon = ev.get("horizon", math.inf)
        r1 = first_at(rel, c.t0 + horizon) if horizon < math.inf else R
        gain: dict = {}
        a, bc = flops
        for r in range(c.request, max(c.request, r1)):
            for t in range(req_start[r], req_start[r + 1]):
                k = float(tokens[t])
                start = float(pos[t]) * float(block_tokens)
                gain[block[t]] = gain.get(block[t], 0.0) + (a * k + bc * (k * start + k * (k - 1.0) / 2.0))
        key = lambda b: (-(gain.get(b, 0.0) / max(size[b], 1)), b)  # noqa: E731
    elif order == "recency":
        key = lambda b: (-last_req[b], last_pos[b], b)  # noqa: E731
    else:
        key = lambda b: (mix_hash(b), b)  # noqa: E731
    cands = sorted(last_req, key=key)
    rate = ev["gbps"] * 1e9
    budget = ev.get("limit", 1.0) * dram
    out = []
    for n in range(nodes):
        dram_n, local_n, shared = c.tiers[n]
        mine = [b for b in cands if node[last_req[b]] == n and b not in dram_n and (b in local_n or b in shared)]
        cum = 0
        rows = []
        for b in mine:
            if cum + size[b] > budget:
                break
            start = c.t0 + float(cum) * bpt / rate
            cum += size[b]
            land = c.t0 + float(cum) * bpt / rate
            r = first_at(rel, land)
            if r >= R:
                break
            rows.append((r, land, start, b))
        i = 0
        while i < len(rows):
            j = i
            while j < len(rows) and rows[j][0] == rows[i][0]:
                j += 1
            bs = [x[3] for x in rows[i:j]]
            out.append((rows[i][0], rows[i][1], first_order + len(out), n, bs, [size[b] for b in bs],
                        [last_pos[b] for b in bs], rows[i][2]))
            i = j
    return out


def _attempt(block, size, req_start, tokens, pos, ts, node, actions, groups, captured, *, M, nodes, bpt, flash_lru,
             bclass, **kw):
    """One replay with ``groups`` fed; raises :class:`_Capture` at a prewarm's start not
    yet in ``captured``."""
    R = len(req_start) - 1
    seq, pre = [], []  # per fed request: ("real", r) or ("grp", group); the edits before it
    for r in range(R):
        items = [(t, o, "act", (a, i)) for t, o, a, i in actions.get(r, [])] + \
                [(g[1], g[2], "grp", g) for g in groups if g[0] == r]
        items.sort(key=lambda x: (x[0], x[1]))
        pending = []
        for _, _, what, x in items:
            if what == "act":
                pending.append(x)
            else:
                seq.append(("grp", x))
                pre.append(pending)
                pending = []
        seq.append(("real", r))
        pre.append(pending)
    a_block, a_tokens, a_pos, a_start, a_ts, a_node, kinds = [], [], [], [0], [], [], []
    for what, x in seq:
        if what == "real":
            lo, hi = req_start[x], req_start[x + 1]
            a_block += block[lo:hi]
            a_tokens += [int(v) for v in tokens[lo:hi]]
            a_pos += [int(v) for v in pos[lo:hi]]
            a_ts.append(float(ts[x]))
            a_node.append(int(node[x]))
            kinds.append(0)
        else:
            a_block += list(x[4])
            a_tokens += [int(v) for v in x[5]]
            a_pos += [int(v) for v in x[6]]
            a_ts.append(float(ts[0]) + x[1])
            a_node.append(x[3])
            kinds.append(3)
        a_start.append(len(a_block))
    hidden = []
    dropped = [0, 0]
    lost_log = []  # (fed request, block, event): a block no tier (nor a set-aside flash) holds after an event's drop
    hidden_at = {}  # fed request -> (the set-aside flash blocks, the outage's event) while a catalog is down
    ctx = {}

    def held(b):
        return any(b in tier.blocks for tier in ctx["tiers"]) or bool(hidden and hidden[0] is not None and
                                                                         b in hidden[0][0])

    def remove(tier, b):
        tier.take(b, size[b])
        dropped[0] += 1
        dropped[1] += size[b]
        if not held(b):
            lost_log.append((ctx["i"], b, ctx["ev"]))

    def before(i, drams, locals_, shared, shift):
        quantum = 2.0 ** (twin.HIST_MIN_EXP + shift)
        ctx["i"] = i
        ctx["tiers"] = drams + (locals_ or []) + ([shared] if shared is not None else [])
        _edits(i, drams, locals_, shared, quantum)
        if hidden and hidden[0] is not None:
            hidden_at[i] = (set(hidden[0][0]), ctx["hide_ev"])

    def _edits(i, drams, locals_, shared, quantum):
        for a, ev in pre[i]:
            ctx["ev"] = ev
            flash = [shared] if shared is not None and not hidden else []
            if a[0] == "pw_start":
                if a[1] not in captured:
                    raise _Capture(a[1], a[2], seq[i][1] if seq[i][0] == "real" else seq[i][1][0],
                                   [(set(drams[n].blocks), set(locals_[n].blocks) if locals_ else set(),
                                     set(flash[0].blocks) if flash else set()) for n in range(nodes)])
            elif a[0] == "wipe":
                tiers = drams if a[1] == "dram" else drams + (locals_ or []) + flash
                for tier in tiers:
                    for b in list(tier.blocks):
                        remove(tier, b)
                if a[1] != "dram" and hidden:
                    aside = list(hidden[0][0]) if hidden[0] is not None else []
                    hidden[0] = None  # lost while set aside
                    lost_log.extend((i, b, ev) for b in aside if not held(b))
            elif a[0] == "target":
                T, k = a[1], a[2]
                if hidden:
                    if hidden[0] is not None:
                        blocks, used = hidden[0]
                        for b in list(blocks):
                            if mix_hash(b) % T == k:
                                del blocks[b]
                                used -= size[b]
                                dropped[0] += 1
                                dropped[1] += size[b]
                                if not any(b in tier.blocks for tier in ctx["tiers"]):
                                    lost_log.append((i, b, ev))
                        hidden[0] = (blocks, used)
                else:
                    for b in list(shared.blocks):
                        if mix_hash(b) % T == k:
                            remove(shared, b)
            elif a[0] == "hide":
                ctx["hide_ev"] = ev
                hidden.append((shared.blocks, shared.used))
                hidden.append(shared.capacity)
                shared.blocks, shared.used, shared.capacity = OrderedDict(), 0, 0
            elif a[0] == "show":
                if hidden:
                    saved, cap = hidden
                    hidden.clear()
                    shared.capacity = cap
                    if saved is not None:
                        shared.blocks, shared.used = saved
            elif a[0] == "expire":
                _, t, ttls = a
                for tiers, ttl, fifo in ((drams, ttls[0], False), (locals_ or [], ttls[1], not flash_lru),
                                         (flash, ttls[2], not flash_lru)):
                    if ttl == math.inf:
                        continue
                    cutoff = math.ceil((t - ttl) / quantum)
                    for tier in tiers:
                        while tier.blocks:
                            b = tier.least_recent()
                            ins, tch = tier.blocks[b]
                            if (ins if fifo else tch) >= cutoff:
                                break
                            remove(tier, b)
            elif a[0] == "expire_by":
                _, t, ttls = a
                classes, names = bclass

                def cutoff(spec, c):
                    ttl = spec.get(c, spec.get("*", math.inf)) if isinstance(spec, dict) else spec
                    return None if ttl == math.inf else math.ceil((t - ttl) / quantum)

                for tiers, spec, fifo in ((drams, ttls[0], False), (locals_ or [], ttls[1], not flash_lru),
                                          (flash, ttls[2], not flash_lru)):
                    finite = [x for x in (cutoff(spec, c) for c in names) if x is not None]
                    if not finite:
                        continue
                    for tier in tiers:
                        for b in list(tier.blocks):  # from the old end, until no class could have expired
                            ins, tch = tier.blocks[b]
                            if (ins if fifo else tch) >= max(finite):
                                break
                            c = cutoff(spec, classes[b])
                            if c is not None and (ins if fifo else tch) < c:
                                remove(tier, b)
            elif a[0] == "retire":
                budget = int(a[1] // bpt)
                for tier in drams + (locals_ or []) + flash:
                    tok = 0
                    for b in list(tier.blocks):
                        if b < M:
                            if tok + size[b] > budget:
                                break
                            tok += size[b]
                            remove(tier, b)
            else:
                raise AssertionError(a)

    first = kw.pop("first_measured", 0)
    first_slot = next((i for i, x in enumerate(seq) if x == ("real", first)), len(seq))
    out = twin.simulate_tiers(a_block, size, a_start, a_tokens, a_pos, a_ts, a_node, n_nodes=nodes,
                              flash_lru=flash_lru, before=before, req_kind=kinds, first_measured=first_slot, **kw)
    out["dropped"] = dropped
    dec = out["decision"]
    real = [i for i, x in enumerate(seq) if x[0] == "real"]
    fig = dict.fromkeys(("prewarm_groups", "moved_tokens", "useful_tokens", "displaced_tokens"), 0.0)
    moved_at: dict = {}
    for i, (what, x) in enumerate(seq):
        lo, hi = a_start[i], a_start[i + 1]
        meas = i >= first_slot
        if what == "grp":
            if meas and any(dec[t] in (LOCAL, FLASH) for t in range(lo, hi)):  # a group that moved something
                fig["prewarm_groups"] += 1
                fig["displaced_tokens"] += out["req_out"][i][0]
                for t in range(lo, hi):
                    if dec[t] in (LOCAL, FLASH):
                        moved_at[a_block[t]] = x[1]
                        fig["moved_tokens"] += size[a_block[t]]
            continue
        for t in range(lo, hi):
            if moved_at.pop(a_block[t], None) is not None and dec[t] == DRAM and meas:
                fig["useful_tokens"] += size[a_block[t]]
    # reusable tokens recomputed, by cause: the event that last dropped the block (it was
    # nowhere since), the catalog outage that holds it set aside, else capacity (None)
    lost: dict = {}
    log = {}
    for i, b, ev in lost_log:
        log.setdefault(i, []).append((b, ev))
    recomputed: dict = {}
    cold = out["cold"]
    for i, (what, x) in enumerate(seq):
        for b, ev in log.get(i, []):
            lost[b] = ev
        if what != "real":
            continue
        for t in range(a_start[i], a_start[i + 1]):
            b = a_block[t]
            if i >= first_slot and dec[t] == MISS and not cold[t]:
                cause = lost.get(b)
                if cause is None and i in hidden_at and b in hidden_at[i][0]:
                    cause = hidden_at[i][1]
                recomputed[cause] = recomputed.get(cause, 0) + int(a_tokens[t])
            lost.pop(b, None)
    out["recomputed_by_cause"] = recomputed
    keep = [t for i in real for t in range(a_start[i], a_start[i + 1])]
    out["decision"] = [dec[t] for t in keep]
    out["cold"] = [out["cold"][t] for t in keep]
    out["req_out"] = [out["req_out"][i] for i in real]
    out["prewarm"] = fig if groups or captured else None
    return out


# --------------------------------------------------------------------------- prestaging
def predecessors(session_id: list, parent_id: list, request_id: list) -> list[int]:
    """Each request's previous turn: its parent's index, else the previous request of its session."""
    out = [-1] * len(request_id)
    last: dict = {}
    for r, s in enumerate(session_id):
        if s is not None:
            if s in last:
                out[r] = last[s]
            last[s] = r
    index = {rid: r for r, rid in enumerate(request_id)}
    for r, p in enumerate(parent_id):
        if p is not None and index.get(p, -1) >= 0 and index[p] < r:
            out[r] = index[p]
    return out


def turn_times(expr: str, inp: list, out: list) -> list[float]:
    """A turn's duration from ``input`` and ``output`` tokens (the scenario's expression)."""
    return [float(eval(expr, {"__builtins__": {}, "min": min, "max": max}, {"input": float(i), "output": float(o)}))
            for i, o in zip(inp, out)]


def run_prestage(block, size, req_start, tokens, pos, ts, node, pred, dur, *, nodes, at, predictor, lead,
                 flash_lru=True, first_measured=0, **kw):
    """The twin of a scenario with one ``prestage`` event (no bandwidth limit): it plans
    the prefetches itself (predecessors, turn times, issue times, the request each is
    fed before), feeds before that request, in issue order, a probe of the turn's blocks
    and a fetch of the predicted ones (``naive_tiers``' request kinds 1 and 2: the fetch
    touches the leading run some tier of the node holds), and recomputes the figures
    from the decisions. Returns the real accesses' decisions, the counters and the
    figures (tokens)."""
    R = len(req_start) - 1
    rel = [t - ts[0] for t in ts]
    plan = []
    for j in range(R):
        p = pred[j]
        if p < 0:
            continue
        issue = max(rel[p] + dur[p], rel[j] - lead)
        if at <= issue < rel[j]:
            plan.append((issue, j, p))
    plan.sort(key=lambda x: x[0])  # stable: ties keep request order
    by_req: dict[int, list] = {}
    for issue, j, p in plan:
        by_req.setdefault(first_at(rel, issue), []).append((issue, j, p))
    seq = []  # (kind, source request, turn, time, measured)
    for r in range(R):
        for issue, j, p in by_req.get(r, []):
            m = r > first_measured
            seq.append((1, j, j, issue, m))
            seq.append((2, j if predictor == "oracle" else p, j, issue, m))
        seq.append((0, r, r, rel[r], r >= first_measured))
    a_block, a_tokens, a_pos, a_start, a_ts, a_node, kinds = [], [], [], [0], [], [], []
    for kind, src, j, t, _ in seq:
        lo, hi = req_start[src], req_start[src + 1]
        a_block += [int(b) for b in block[lo:hi]]
        a_tokens += [int(x) for x in tokens[lo:hi]]
        a_pos += [int(x) for x in pos[lo:hi]]
        a_start.append(len(a_block))
        a_ts.append(float(ts[j]) if kind == 0 else float(ts[0]) + t)
        a_node.append(int(node[j]))
        kinds.append(kind)
    first_slot = next(i for i, x in enumerate(seq) if x[0] == 0 and x[1] == first_measured) if R else 0
    out = twin.simulate_tiers(a_block, list(size), a_start, a_tokens, a_pos, a_ts, a_node, n_nodes=nodes,
                              flash_lru=flash_lru, req_kind=kinds, first_measured=first_slot, **kw)
    dec = out["decision"]
    moved: dict[int, float] = {}
    absent: dict[int, set] = {}
    fig = dict.fromkeys(("prefetch_requests", "moved_tokens", "useful_tokens", "needed_tokens", "covered_tokens",
                         "held_token_seconds", "displaced_tokens"), 0.0)
    real_dec = []
    for i, (kind, src, j, t, meas) in enumerate(seq):
        lo, hi = a_start[i], a_start[i + 1]
        if kind == 1:
            if meas:
                absent[j] = {x - lo for x in range(lo, hi) if dec[x] != DRAM}
            continue
        if kind == 2:
            if meas:
                fig["prefetch_requests"] += 1
                fig["displaced_tokens"] += out["req_out"][i][0]
                for x in range(lo, hi):
                    if dec[x] in (LOCAL, FLASH):
                        moved[a_block[x]] = t
                        fig["moved_tokens"] += size[a_block[x]]
            continue
        usable = True
        for x in range(lo, hi):
            b = a_block[x]
            real_dec.append(dec[x])
            if dec[x] == MISS:
                usable = False
            was = b in moved
            if was:
                landed = moved.pop(b)
                if dec[x] == DRAM and meas:
                    fig["useful_tokens"] += size[b]
                    fig["held_token_seconds"] += size[b] * (t - landed)
            if usable and meas and (x - lo) in absent.get(j, ()):
                fig["needed_tokens"] += size[b]
                if was and dec[x] == DRAM:
                    fig["covered_tokens"] += size[b]
    out["real_decision"] = real_dec
    out["figures"] = fig
    return out


DRAM, LOCAL, FLASH, MISS = twin.DRAM, twin.LOCAL, twin.FLASH, twin.MISS
