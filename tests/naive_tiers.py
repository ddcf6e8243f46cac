"""Slow, obviously correct twin of the tier simulator (``kvtrace.kernels.tiers``).

Plain Python: one ``OrderedDict`` per tier (first item = least recent), plain dicts for
the per-block state, lists for the count-min sketch. It is the specification of the
simulator's semantics (the kernel's module docstring states them in prose):

* decisions against the request's node: DRAM, else local SSD, else shared flash, else
  miss; prefix-aware = every access of a request decided first, then touched; flat =
  decide then touch, access by access;
* touch (each distinct block of the request once, at its first position) = (1)
  tail-first, pin the blocks in DRAM (take them out, keep their insert
  time) and promote / read the flash hits; (2) tail-first, insert into DRAM, write a
  miss through (write-through), evict least-recent DRAM blocks and write each victim
  below DRAM (write-on-evict); a local-SSD victim is written to the shared flash;
* a write happens iff the block is not in the tier already, fits in it and the
  admission policy admits it (every such attempt is an *opportunity*);
* the per-request accounting (usable prefix, its level = running max of the
  decisions, reusable prefix = before the first cold access);
* engine reuse rules (``rules``: 1 = last-token cap, 2 = full blocks only): with 2, an
  access whose tokens are not ``block_tokens`` does not exist for the tiers (not
  decided, touched or counted by any policy) and is a cold miss; with 1, a request's
  last access is decided and touched like the others but reported and accounted as a
  miss (the engine recomputes it and stores it again).

Times for the residency histograms are quantised exactly as the kernel does
(:func:`quantise_times`), and binned by octave (:func:`hist_bin`).
"""

from __future__ import annotations

import math
from collections import OrderedDict

DRAM, LOCAL, FLASH, MISS = 0, 1, 2, 3
POLICIES = ("all", "none", "freq", "prob", "idle", "value", "oracle", "tinylfu", "group")
PROMOTIONS = ("promote", "copy", "none")

MASK = (1 << 64) - 1
PROB_SEED = 0x5851F42D4C957F2D
SKETCH_SEED = 0x2545F4914F6CDD1D
HIST_MIN_EXP, N_BINS = -10, 38  # bins: [0, 2**-10), then octaves up to an open [2**26, inf)

COUNT_NAMES = (
    "acc_dram", "acc_local", "acc_flash", "acc_miss",
    "req_dram", "req_local", "req_flash", "req_miss",
    "evict_dram", "evict_local", "evict_flash",
    "evict_dram_tokens", "evict_local_tokens", "evict_flash_tokens",
    "offer_local", "offer_flash", "offer_local_tokens", "offer_flash_tokens",
    "write_local", "write_flash", "write_local_tokens", "write_flash_tokens",
    "promote_local", "promote_flash", "promote_local_tokens", "promote_flash_tokens",
)
TIER_NAMES = ("dram", "local", "flash")


def mix64(x: int) -> int:
    """splitmix64's finaliser of x + golden ratio, on 64-bit unsigned integers."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def unit_hash(b: int) -> float:
    """The ``prob:p`` coin of block b: uniform in [0, 1), fixed per block id."""
    return (mix64(b ^ PROB_SEED) >> 11) / 2.0**53


def sketch_slots(b: int, width: int) -> list[int]:
    """Columns of block b in the sketch's 4 rows, from the 32-bit halves h1, h2 of one
    hash: in row i, offset (h2 >> 4i) mod g of the group of g = min(16, width)
    columns that holds column h1 mod width."""
    h = mix64(b ^ SKETCH_SEED)
    h1, h2 = h & 0xFFFFFFFF, h >> 32
    g = min(16, width)
    return [(h1 % width) // g * g + ((h2 >> (4 * i)) % g) for i in range(4)]


def quantise_times(ts: list[float]) -> tuple[list[int], int]:
    """Request times in quanta of 2**(HIST_MIN_EXP + shift) s (span < 2**31 quanta)."""
    if not ts:
        return [], 0
    t0 = min(ts)
    rel = [t - t0 for t in ts]
    shift = 0
    while math.ldexp(max(rel), -(HIST_MIN_EXP + shift)) >= 2.0**31 - 1:
        shift += 1
    return [math.floor(math.ldexp(x, -(HIST_MIN_EXP + shift))) for x in rel], shift


def hist_bin(dq: int, shift: int) -> int:
    """Octave bin of a difference of dq quanta (0 below one quantum)."""
    return 0 if dq < 1 else min(int(dq).bit_length() + shift, N_BINS - 1)


class Tier:
    """An LRU/FIFO list of blocks with a token budget; values are [insert, touch] times."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.blocks: OrderedDict[int, list[int]] = OrderedDict()
        self.used = 0

    def __contains__(self, b: int) -> bool:
        return b in self.blocks

    def add(self, b: int, size: int, ins: int, tch: int) -> None:
        assert b not in self.blocks
        self.blocks[b] = [ins, tch]
        self.used += size

    def take(self, b: int, size: int) -> list[int]:
        self.used -= size
        return self.blocks.pop(b)

    def least_recent(self) -> int:
        return next(iter(self.blocks))


def simulate_tiers(block, size, req_start, tokens, pos, req_ts, req_node, *, block_tokens, prefix_aware,
                   dram, local, flash, n_nodes, policy="all", param=0.0, flash_lru=True, promotion="promote",
                   write_through=False, first_measured=0, req_group=None, n_groups=1, values=None,
                   oracle_ok=None, sketch_width=16, rules=0, before=None, req_kind=None):
    """Replay the trace through DRAM / local SSD / shared flash tiers.

    Same arguments as :func:`kvtrace.kernels.tiers.simulate_tiers`, except that
    ``policy`` and ``promotion`` are names (:data:`POLICIES`, :data:`PROMOTIONS`), and
    ``before(r, drams, locals, shared, shift)``, if given, is called before each request
    r with the tiers (``locals``/``shared`` None when absent) and the time shift.
    ``req_kind`` (per request, 0 by default): 1 = a probe (each access's decision
    recorded against the tiers as they are; nothing else happens), 2 = a fetch (only its
    leading accesses that a tier of its node holds exist: touched as a request's, never
    measured; its row holds the DRAM tokens it evicted), 3 = a prewarm (a fetch of only
    those of its accesses that, when it comes, a tier below its node's DRAM holds and
    the DRAM does not; the others do not exist).

    Returns
    -------
    dict
        ``decision``, ``cold`` (per access), ``req_level``, ``req_out`` (per request,
        7-tuples in the kernel's column order), ``counts`` and ``sums`` (dicts by the
        kernel's names) and ``hist`` ([tier][metric][bin] counts).
    """
    block = [int(x) for x in block]
    size = [int(x) for x in size]
    starts = [int(x) for x in req_start]
    request = [r for r in range(len(starts) - 1) for _ in range(starts[r], starts[r + 1])]
    tokens = [int(x) for x in tokens]
    pos = [int(x) for x in pos]
    ts = [float(x) for x in req_ts]
    node = [int(x) for x in req_node]
    group = [0] * (len(starts) - 1) if req_group is None else [int(g) for g in req_group]
    assert policy in POLICIES and promotion in PROMOTIONS
    tq, shift = quantise_times(ts)

    drams = [Tier(dram) for _ in range(n_nodes)]
    locals_ = [Tier(local) for _ in range(n_nodes)] if local > 0 else None
    shared = Tier(flash) if flash > 0 else None

    count: dict[int, int] = {}  # accesses so far
    last: dict[int, int] = {}  # latest access index
    first_req: dict[int, int] = {}  # request of the first access
    pinned: dict[int, tuple[int, int]] = {}  # block -> (touch group, insert time) while pinned
    sketch = [[0] * sketch_width for _ in range(4)]
    sketch_ops = 0
    group_accesses = [0] * max(1, n_groups)
    group_rereferenced = [0] * max(1, n_groups)

    counts = dict.fromkeys(COUNT_NAMES, 0)
    value_captured = 0.0
    value_bound = 0.0
    hist = [[[0] * N_BINS for _ in range(3)] for _ in range(3)]
    decision = [MISS] * len(block)
    since = [-1] * len(block)
    unseen = [bool(rules & 2) and tokens[t] != block_tokens for t in range(len(block))]
    kinds = [0] * (len(starts) - 1) if req_kind is None else [int(k) for k in req_kind]
    capped = [False] * len(block)
    if rules & 1:
        for r in range(len(starts) - 1):
            if starts[r + 1] > starts[r] and kinds[r] == 0:
                capped[starts[r + 1] - 1] = True
    evicted_dram = [0] * (len(starts) - 1)  # a fetch's row: the DRAM tokens its inserts evicted
    ends = list(starts[1:])  # a fetch's end: its leading blocks some tier of its node holds
    cold = [False] * len(block)

    def estimate(b: int) -> int:
        return min(sketch[i][j] for i, j in enumerate(sketch_slots(b, sketch_width)))

    def admit(v: int, tier: Tier, now: float) -> bool:
        t = last[v]
        if policy == "all":
            return True
        if policy == "none":
            return False
        if policy == "freq":
            return count[v] >= int(param)
        if policy == "prob":
            return unit_hash(v) < param
        if policy == "idle":
            return now - ts[request[t]] < param
        if policy == "value":
            return values[t] >= param
        if policy == "oracle":
            return bool(oracle_ok[t])
        if policy == "tinylfu":
            if tier.used + size[v] <= tier.capacity:
                return True
            return estimate(v) > estimate(tier.least_recent())
        g = group[request[t]]
        return (group_rereferenced[g] + 1.0) / (group_accesses[g] + 2.0) >= param

    def evict(tier: Tier, which: int, now_q: int, meas: bool) -> int:
        v = tier.least_recent()
        ins, tch = tier.take(v, size[v])
        if meas:
            counts[f"evict_{TIER_NAMES[which]}"] += 1
            counts[f"evict_{TIER_NAMES[which]}_tokens"] += size[v]
            hist[which][0][hist_bin(now_q - ins, shift)] += 1
            hist[which][1][hist_bin(now_q - tch, shift)] += 1
        return v

    def try_write(v: int, tier: Tier, which: int, now: float, now_q: int, meas: bool) -> bool:
        nonlocal value_captured, value_bound
        if v in tier or size[v] > tier.capacity:
            return False
        val = values[last[v]] if values is not None else 0.0
        name = TIER_NAMES[which]
        if meas:
            counts[f"offer_{name}"] += 1
            counts[f"offer_{name}_tokens"] += size[v]
            if val > 0:
                value_bound += val
        if not admit(v, tier, now):
            return False
        tier.add(v, size[v], now_q, now_q)
        written[current][which - 1] += size[v]
        if meas:
            counts[f"write_{name}"] += 1
            counts[f"write_{name}_tokens"] += size[v]
            value_captured += val
        return True

    def write_flash(v, now, now_q, meas):
        if try_write(v, shared, 2, now, now_q, meas):
            while shared.used > shared.capacity:
                evict(shared, 2, now_q, meas)

    def write_below_dram(n, v, now, now_q, meas):
        if locals_ is not None:
            if try_write(v, locals_[n], 1, now, now_q, meas):
                while locals_[n].used > locals_[n].capacity:
                    w = evict(locals_[n], 1, now_q, meas)
                    if shared is not None:
                        write_flash(w, now, now_q, meas)
        elif shared is not None:
            write_flash(v, now, now_q, meas)

    written = [[0, 0] for _ in range(len(starts) - 1)]  # per request: tokens written to local SSD, shared flash
    for r in range(len(starts) - 1):
        if before is not None:  # a scenario's events before request r (tests/naive_scenario.py)
            before(r, drams, locals_, shared, shift)
        current = r
        lo, hi = starts[r], starts[r + 1]
        n, now, now_q = node[r], ts[r], tq[r]
        meas = r >= first_measured and kinds[r] == 0
        if kinds[r]:
            tiers_n = [drams[n]] + ([locals_[n]] if locals_ is not None else []) + \
                ([shared] if shared is not None else [])

            def where(t):
                if unseen[t]:
                    return MISS
                for d, tier in zip((DRAM, LOCAL if locals_ is not None else FLASH, FLASH), tiers_n):
                    if block[t] in tier:
                        return d
                return MISS

            if kinds[r] == 1:  # a probe
                for t in range(lo, hi):
                    decision[t] = where(t)
                continue
            if kinds[r] == 3:  # a prewarm: the accesses not held below DRAM (or held in it) do not exist
                kept = [t for t in range(lo, hi) if where(t) in (LOCAL, FLASH)]
                for t in range(lo, hi):
                    if t not in kept:
                        unseen[t] = True
                if rules & 1 and kept:
                    capped[kept[-1]] = True
            else:
                k = lo
                while k < hi and where(k) != MISS:
                    k += 1
                hi = ends[r] = k
                if rules & 1 and hi > lo:
                    capped[hi - 1] = True
        touch_groups = [(lo, hi)] if prefix_aware else [(t, t + 1) for t in range(lo, hi)]
        for a, z in touch_groups:
            stamp = a
            # decide
            for t in range(a, z):
                b = block[t]
                if unseen[t]:
                    cold[t] = True
                    continue
                if policy == "group":
                    if b in last:
                        group_rereferenced[group[request[last[b]]]] += 1
                    group_accesses[group[r]] += 1
                if prefix_aware:
                    cold[t] = b not in first_req or first_req[b] == r
                else:
                    cold[t] = b not in count
                count[b] = count.get(b, 0) + 1
                last[b] = t
                first_req.setdefault(b, r)
                if policy == "tinylfu":
                    for i, j in enumerate(sketch_slots(b, sketch_width)):
                        sketch[i][j] = min(sketch[i][j] + 1, 15)
                    sketch_ops += 1
                    if sketch_ops >= 10 * sketch_width:
                        sketch = [[c >> 1 for c in row] for row in sketch]
                        sketch_ops = 0
                if b in drams[n]:
                    decision[t], since[t] = DRAM, drams[n].blocks[b][1]
                elif locals_ is not None and b in locals_[n]:
                    decision[t], since[t] = LOCAL, locals_[n].blocks[b][1]
                elif shared is not None and b in shared:
                    decision[t], since[t] = FLASH, shared.blocks[b][1]
                else:
                    decision[t] = MISS
            # a block repeated in the group is touched once, at its first position
            head = {}
            for t in range(a, z):
                if not unseen[t]:
                    head.setdefault(block[t], t)
            # touch, pass 1 (tail-first): pin DRAM blocks, promote or read flash hits
            for t in reversed(range(a, z)):
                b = block[t]
                if head.get(b) != t:
                    continue
                if b in drams[n]:
                    ins, _ = drams[n].take(b, size[b])
                    pinned[b] = (stamp, ins)
                    continue
                d = decision[t]
                if d not in (LOCAL, FLASH):
                    continue
                tier = locals_[n] if d == LOCAL else shared
                if b not in tier:
                    continue
                name = TIER_NAMES[d]
                fits = size[b] <= drams[n].capacity  # a block larger than DRAM is read in place
                if promotion == "promote" and fits:
                    ins, _ = tier.take(b, size[b])
                    if meas:
                        counts[f"promote_{name}"] += 1
                        counts[f"promote_{name}_tokens"] += size[b]
                        hist[d][0][hist_bin(now_q - ins, shift)] += 1
                else:
                    if flash_lru:
                        tier.blocks.move_to_end(b)
                    tier.blocks[b][1] = now_q
                    if meas and promotion == "copy" and fits:
                        counts[f"promote_{name}"] += 1
                        counts[f"promote_{name}_tokens"] += size[b]
            # touch, pass 2 (tail-first): insert into DRAM, evict, write below
            for t in reversed(range(a, z)):
                d = decision[t]
                b = block[t]
                if head.get(b) != t:
                    continue
                D = drams[n]
                if d in (LOCAL, FLASH) and (promotion == "none" or size[b] > D.capacity):
                    continue  # served in place
                if size[b] > D.capacity:  # passes through DRAM
                    if meas:
                        counts["evict_dram"] += 1
                        counts["evict_dram_tokens"] += size[b]
                        hist[0][0][0] += 1
                        hist[0][1][0] += 1
                    if d == MISS or not write_through:
                        write_below_dram(n, b, now, now_q, meas)
                    continue
                ins = now_q
                if b in pinned and pinned[b][0] == stamp:
                    ins = pinned.pop(b)[1]
                D.add(b, size[b], ins, now_q)
                if write_through and d == MISS:
                    write_below_dram(n, b, now, now_q, meas)
                while D.used > D.capacity:
                    v = evict(D, 0, now_q, meas)
                    evicted_dram[r] += size[v]
                    if not write_through:
                        write_below_dram(n, v, now, now_q, meas)

    # the engine recomputes a capped access: reported and accounted as a miss
    for t in range(len(block)):
        if capped[t]:
            decision[t] = MISS
    # accounting, request by request
    req_level, req_out = [], []
    sums: dict[str, float] = {}
    for lv in TIER_NAMES:
        for w in ("blocks", "tokens", "size", "q"):
            sums[f"prefix_{lv}_{w}"] = 0.0
    for w in ("blocks", "tokens", "size", "q"):
        sums[f"total_{w}"] = 0.0
    for d in (*TIER_NAMES, "miss"):
        sums[f"acc_{d}_tokens"] = 0.0
        sums[f"acc_{d}_size"] = 0.0
    dnames = (*TIER_NAMES, "miss")
    for r in range(len(starts) - 1):
        lo, hi = starts[r], starts[r + 1]
        meas = r >= first_measured
        if kinds[r]:  # a probe or a fetch: not accounted
            req_level.append(MISS)
            req_out.append((evicted_dram[r],) + (0,) * 14)
            continue
        usable, reusable, level = True, True, 0
        src = [0, 0, 0]
        fl_tok = fl_q = miss_tok = miss_q = 0
        all_tok = all_q = pre_tok = pre_q = 0
        reads = [0, 0, 0]
        for t in range(lo, hi):
            d = decision[t]
            k, s = tokens[t], size[block[t]]
            q = sum(range(pos[t] * block_tokens, pos[t] * block_tokens + k))  # positions of its tokens
            all_tok += k
            all_q += q
            if meas:
                if d != MISS:
                    hist[d][2][hist_bin(tq[r] - since[t], shift)] += 1
                counts[f"acc_{dnames[d]}"] += 1
                for w, x in (("blocks", 1), ("tokens", k), ("size", s), ("q", q)):
                    sums[f"total_{w}"] += x
                sums[f"acc_{dnames[d]}_tokens"] += k
                sums[f"acc_{dnames[d]}_size"] += s
            if cold[t]:
                reusable = False
            if d == MISS:
                usable = False
            if usable:
                level = max(level, d)
                if meas:
                    for w, x in (("blocks", 1), ("tokens", k), ("size", s), ("q", q)):
                        sums[f"prefix_{TIER_NAMES[level]}_{w}"] += x
                src[d] += s
                reads[d] += 1
                pre_tok += k
                pre_q += q
                if d != DRAM:
                    fl_tok += k
                    fl_q += q
            elif reusable:
                miss_tok += k
                miss_q += q
        branch = level if hi > lo and decision[lo] != MISS else MISS
        req_level.append(branch)
        req_out.append((src[0], src[1], src[2], fl_tok, fl_q, miss_tok, miss_q, all_tok, all_q, pre_tok, pre_q,
                        reads[1], reads[2], *written[r]))
        if meas:
            counts[f"req_{dnames[branch]}"] += 1
    sums["value_captured"] = value_captured
    sums["value_bound"] = value_bound
    return {"decision": decision, "cold": cold, "req_level": req_level, "req_out": req_out, "counts": counts,
            "sums": sums, "hist": hist}


def reuse_oracle_flags(block, decision_all):
    """1 at access t iff the block's next access exists and was a flash hit (LOCAL or
    FLASH) in the admit-all run."""
    block = [int(x) for x in block]
    flags = []
    for t, b in enumerate(block):
        later = [u for u in range(t + 1, len(block)) if block[u] == b]
        flags.append(int(bool(later) and decision_all[later[0]] in (LOCAL, FLASH)))
    return flags


def route(n_nodes, routing, session_id, request_id, first_block_hash):
    """Node of each request (the routing twin).

    ``session_id`` (None -> the request id), ``request_id`` and ``first_block_hash``
    (None for an empty request -> the request id) per request.
    """
    seed = 0xD6E8FEB86659FD93
    out = []
    for r, (sess, rid, h) in enumerate(zip(session_id, request_id, first_block_hash)):
        if routing == "round-robin":
            out.append(r % n_nodes)
            continue
        key = (sess if sess is not None else rid) if routing == "session" else (h if h is not None else rid)
        out.append(mix64((int(key) & MASK) ^ seed) % n_nodes)
    return out
