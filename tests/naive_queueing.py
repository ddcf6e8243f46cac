"""Slow, obviously correct twin of the queue simulator (``kvtrace.kernels.queueing``).

Plain Python, written from the kernel's module docstring (the event specification),
one object per resource and one per request, one ``heapq`` of events:

* a link may have a congestion window (from, to, share of its rate): work is served at
  that share inside it, at the full rate outside (``finish_at``, ``served``);
* a FCFS link keeps the time it is next free; a processor-sharing link keeps the
  *remaining* work of every job present and serves each at rate 1/n between events
  (brute force: every job's remainder decreases by ``dt / n``; the job with the least
  remainder leaves first, the earliest arrival among equals) -- the kernel's virtual
  time tags are not used here;
* a GPU pool is a FIFO list and a list of servers, each empty or holding a batch;
* a request walks arrival -> DRAM restore -> tier restore (fork-join) -> prefill
  (optionally split by the overlap fraction) -> first token -> background writes.

Station statistics cover the window ``[w0, w1]`` as the docstring says; queue waits
are kept as raw values per station type (the kernel bins them), so a comparison can
allow for the rounding of processor-sharing waits at a bin edge.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

HOST, NIC, LOCAL_SSD, FLASH, UPLINK, GPU = range(6)
B_NONE, B_RESTORE, B_RECOMPUTE = range(3)
DRAM_EV, TIER_EV, RESTORED_EV, GPU_A_EV, LINK_DONE_EV, CLIENT_EV, PS_EV, BATCH_END_EV, WRITE_EV = range(9)
ONLY, PART_A, PART_B = range(3)


class Overloaded(Exception):
    """Raised to stop the run; the event being processed completes first."""


def overlap(a: float, b: float, w0: float, w1: float) -> float:
    lo, hi = max(a, w0), min(b, w1)
    return hi - lo if hi > lo else 0.0


@dataclass
class Params:
    route: float = 0.0
    dram_fixed: float = 0.0
    flash_fixed: float = 0.0
    client: float = 0.0  # seconds per byte of a request's tier restore
    write: float = 0.0  # seconds per byte of the shared-flash write budget
    overlap: float = 0.0
    pass_s: float = 0.0
    decode: float = 0.0
    max_wait: float = math.inf
    w0: float = 0.0
    w1: float = math.inf
    batch_tokens: float = 0.0


@dataclass
class Station:
    """Window statistics shared by every kind of station."""

    kind: int
    present: float = 0.0
    last: float = 0.0
    area: float = 0.0
    busy: float = 0.0
    busy_start: float = 0.0
    jobs: float = 0.0
    sojourn: float = 0.0
    work: float = 0.0

    def count(self, now: float, delta: float, p: Params) -> None:
        self.area += self.present * overlap(self.last, now, p.w0, p.w1)
        self.last = now
        self.present += delta


@dataclass
class Job:
    work: float
    arrival: float
    request: "Request | None"  # None: a background write
    tokens: float = 0.0
    part: int = ONLY
    remaining: float = 0.0  # processor sharing


@dataclass
class Request:
    index: int  # measured index, -1 for warm-up
    arrival: float
    node: int
    bd: float
    bl: float
    bf: float
    bft: list
    rft: list
    wl: float
    wf: float
    s_rest: float = 0.0
    k_rest: float = 0.0
    s_fl: float = 0.0
    k_fl: float = 0.0
    t1: float = 0.0
    restore: bool = True
    gpu_work: float = 0.0
    gpu_tokens: float = 0.0
    part_a_work: float = 0.0
    join: int = 0
    gpu_join: int = 0
    stage: int = 0


@dataclass
class Result:
    ttft: list
    branches: list
    stations: list  # Station per station number
    waits: list  # per station type: raw waits of measured requests' jobs
    overloaded: bool = False
    over_station: int = -1
    over_from: float = 0.0
    over_at: float = 0.0
    bytes_dram: float = 0.0
    bytes_local: float = 0.0
    bytes_flash: float = 0.0
    last_event: float = 0.0


class Sim:
    def __init__(self, nodes, targets, gpus, inv_rate, inv_iops, p: Params, *, ps, uplink, n_measured):
        self.N, self.T, self.gpus, self.p, self.ps, self.uplink = nodes, targets, gpus, p, ps, uplink
        self.NL = 3 * nodes + targets + 1
        self.inv_b, self.inv_io = list(inv_rate), list(inv_iops)
        kinds = [HOST] * nodes + [NIC] * nodes + [LOCAL_SSD] * nodes + [FLASH] * targets + [UPLINK] + [GPU] * nodes
        self.st = [Station(k) for k in kinds]
        self.free = [0.0] * self.NL  # FCFS links
        self.cw = [(math.inf, math.inf, 1.0)] * self.NL  # congestion windows: (from, to, share of the rate)
        self.ps_jobs = [[] for _ in range(self.NL)]  # PS links: jobs present, in arrival order
        self.ps_last = [0.0] * self.NL
        self.ps_version = [0] * self.NL
        self.queue = [[] for _ in range(nodes)]  # GPU FIFO
        self.servers = [[None] * max(1, gpus) for _ in range(nodes)]
        self.heap = []
        self.seq = 0
        self.pacer = 0.0
        self.stop = False
        self.res = Result([math.nan] * n_measured, [0, 0, 0], self.st, [[] for _ in range(6)])

    # ------------------------------------------------------------------ helpers
    def push(self, t, kind, *args):
        heapq.heappush(self.heap, (t, self.seq, kind, args))
        self.seq += 1

    def overload(self, s, since, now):
        if not self.res.overloaded:
            self.res.overloaded, self.res.over_station = True, s
            self.res.over_from, self.res.over_at = since, now
        self.stop = True

    def in_window(self, t):
        return self.p.w0 <= t <= self.p.w1

    def finish_at(self, s, t, w):
        """When link s, from t, has served w seconds of full-rate work: through the three
        pieces of its rate (1 before its window, the window's share inside, 1 after)."""
        c0, c1, x = self.cw[s]
        if x == 1.0:
            return t + w
        for hi, rate in ((c0, 1.0), (c1, x), (math.inf, 1.0)):
            if t < hi:
                cap = (hi - t) * rate
                if w <= cap:
                    return t + (w / rate if rate > 0 else 0.0)
                w -= cap
                t = hi
        raise AssertionError("unreachable")

    def served(self, s, t0, t1):
        """Full-rate work link s serves over [t0, t1]: the rate integrated piece by piece."""
        c0, c1, x = self.cw[s]
        total = 0.0
        for lo, hi, rate in ((-math.inf, c0, 1.0), (c0, c1, x), (c1, math.inf, 1.0)):
            a, b = max(t0, lo), min(t1, hi)
            if b > a:
                total += (b - a) * rate
        return total

    def predicted(self, s, a, w):
        """From a until link s would finish a job of w arriving at a (the restore rule)."""
        if self.cw[s][2] == 1.0:
            return self.held(s, a) + w
        if self.ps:
            return self.finish_at(s, a, self.held(s, a) + w) - a
        return self.finish_at(s, max(a, self.free[s]), w) - a

    def ps_advance(self, s, now):
        jobs = self.ps_jobs[s]
        if jobs:
            dt = self.served(s, self.ps_last[s], now) / len(jobs)
            for j in jobs:
                j.remaining -= dt
        self.ps_last[s] = now

    def ps_next(self, s, now):
        self.ps_version[s] += 1
        jobs = self.ps_jobs[s]
        if jobs:
            best = min(jobs, key=lambda j: j.remaining)  # the first of equals: the earliest arrival
            self.push(self.finish_at(s, now, max(0.0, best.remaining) * len(jobs)), PS_EV, s, self.ps_version[s])

    def held(self, s, now):
        """Work (seconds) link s holds at ``now``."""
        if self.ps:
            jobs = self.ps_jobs[s]
            dt = self.served(s, self.ps_last[s], now) / len(jobs) if jobs else 0.0
            return sum(max(0.0, j.remaining - dt) for j in jobs)
        return max(0.0, self.free[s] - now)

    def wait(self, s, w, job):
        if job.request is not None and job.request.index >= 0:
            self.res.waits[self.st[s].kind].append(w)

    # ------------------------------------------------------------------ links
    def link_job(self, s, work, request, now):
        if not work < math.inf:
            self.overload(s, now, now)
            return
        st, p = self.st[s], self.p
        job = Job(work, now, request)
        if self.ps:
            self.ps_advance(s, now)
            if st.present == 0:
                st.busy_start = now
            st.count(now, 1.0, p)
            job.remaining = work
            self.ps_jobs[s].append(job)
            if self.held(s, now) > p.max_wait:
                self.overload(s, st.busy_start, now)
            self.ps_next(s, now)
            return
        if self.free[s] <= now:
            st.busy_start = now
            start = now
        else:
            start = self.free[s]
        finish = self.finish_at(s, start, work)
        self.free[s] = finish
        st.busy += overlap(start, finish, p.w0, p.w1)
        st.count(now, 1.0, p)
        if self.in_window(now):
            st.jobs += 1.0
            st.sojourn += finish - now
            st.work += work
        self.wait(s, start - now, job)
        if start - now > p.max_wait:
            self.overload(s, st.busy_start, now)
        self.push(finish, LINK_DONE_EV, request, s)

    def ps_departure(self, s, version, now):
        if version != self.ps_version[s]:
            return None
        st, p = self.st[s], self.p
        self.ps_advance(s, now)
        jobs = self.ps_jobs[s]
        best = min(range(len(jobs)), key=lambda i: jobs[i].remaining)
        job = jobs.pop(best)
        st.count(now, -1.0, p)
        if self.in_window(job.arrival):
            st.jobs += 1.0
            st.sojourn += now - job.arrival
            st.work += job.work
        self.wait(s, now - job.arrival - job.work, job)
        if st.present == 0:
            st.busy += overlap(st.busy_start, now, p.w0, p.w1)
        self.ps_next(s, now)
        return job.request

    # ------------------------------------------------------------------ GPUs
    def gpu_job(self, node, request, part, work, tokens, now):
        s = self.NL + node
        if self.gpus == 0 or not work < math.inf:
            self.overload(s, now, now)
            return
        st = self.st[s]
        st.count(now, 1.0, self.p)
        queue = self.queue[node]
        if not queue and all(b is not None for b in self.servers[node][:self.gpus]):
            st.busy_start = now  # a queue starts forming
        queue.append(Job(work, now, request, tokens, part))

    def start_batches(self, node, now):
        s, p, queue = self.NL + node, self.p, self.queue[node]
        st = self.st[s]
        for k in range(self.gpus):
            if not queue:
                return
            if self.servers[node][k] is not None:
                continue
            batch = [queue.pop(0)]
            tokens, work = batch[0].tokens, batch[0].work
            if p.batch_tokens > 0:
                while queue and tokens + queue[0].tokens <= p.batch_tokens:
                    tokens += queue[0].tokens
                    work += queue[0].work
                    batch.append(queue.pop(0))
            finish = now + (p.pass_s + work)
            self.servers[node][k] = batch
            st.busy += overlap(now, finish, p.w0, p.w1)
            for job in batch:
                if self.in_window(job.arrival):
                    st.jobs += 1.0
                    st.sojourn += finish - job.arrival
                    st.work += job.work
                self.wait(s, now - job.arrival, job)
                if now - job.arrival > p.max_wait:
                    self.overload(s, st.busy_start, now)
            self.push(finish, BATCH_END_EV, node, k)

    def batch_end(self, node, k, now):
        batch, self.servers[node][k] = self.servers[node][k], None
        phi = self.p.overlap
        for job in batch:
            self.st[self.NL + node].count(now, -1.0, self.p)
            r = job.request
            if job.part == PART_A:
                r.gpu_join -= 1
                if r.gpu_join == 0:
                    self.gpu_job(node, r, PART_B, r.gpu_work - r.part_a_work, r.gpu_tokens * (1.0 - phi), now)
            else:
                self.first_token(r, now)
        self.start_batches(node, now)

    # ------------------------------------------------------------------ a request
    def arrive(self, r: Request):
        N, T, p = self.N, self.T, self.p
        r.t1 = r.arrival + p.route
        B = r.bl + r.bf
        restore = True
        if B > 0:
            a, n = r.arrival, r.node
            m = [B * p.client, self.predicted(n, a, B * self.inv_b[n])]
            if r.bl > 0:
                m.append(self.predicted(2 * N + n, a, r.bl * self.inv_b[2 * N + n]))
            if r.bf > 0:
                for t in range(T):
                    if r.bft[t] > 0:
                        s = 3 * N + t
                        m.append(self.predicted(s, a, max(r.bft[t] * self.inv_b[s], r.rft[t] * self.inv_io[s])))
                m.append(self.predicted(N + n, a, r.bf * self.inv_b[N + n]))
                if self.uplink:
                    m.append(self.predicted(3 * N + T, a, r.bf * self.inv_b[3 * N + T]))
            restore = p.flash_fixed + max(m) <= r.s_fl
        r.restore = restore
        r.gpu_work = r.s_rest if restore else r.s_rest + r.s_fl
        r.gpu_tokens = r.k_rest if restore else r.k_rest + r.k_fl
        if r.index >= 0:
            self.res.branches[B_NONE if B == 0 else (B_RESTORE if restore else B_RECOMPUTE)] += 1
            self.res.bytes_dram += r.bd
            if restore:
                self.res.bytes_local += r.bl
                self.res.bytes_flash += r.bf
        has_restore = r.bd > 0 or (restore and B > 0)
        r.stage = 0
        if p.overlap > 0 and has_restore and r.gpu_work > 0:
            r.part_a_work = p.overlap * r.gpu_work
            r.gpu_join = 2
            self.push(r.t1, GPU_A_EV, r)
        else:
            r.part_a_work = 0.0
            r.gpu_join = 1
        if r.bd > 0:
            self.push(r.t1 + p.dram_fixed, DRAM_EV, r)
        elif restore and B > 0:
            r.stage = 1
            self.push(r.t1 + p.flash_fixed, TIER_EV, r)
        else:
            self.push(r.t1, RESTORED_EV, r)

    def tier_restore(self, r: Request, now):
        N, T, n = self.N, self.T, r.node
        r.stage = 2
        B = r.bl + r.bf
        jobs = [(n, B * self.inv_b[n])]
        if r.bl > 0:
            jobs.append((2 * N + n, r.bl * self.inv_b[2 * N + n]))
        for t in range(T):
            if r.bft[t] > 0:
                s = 3 * N + t
                jobs.append((s, max(r.bft[t] * self.inv_b[s], r.rft[t] * self.inv_io[s])))
        if r.bf > 0:
            jobs.append((N + n, r.bf * self.inv_b[N + n]))
            if self.uplink:
                jobs.append((3 * N + T, r.bf * self.inv_b[3 * N + T]))
        r.join = len(jobs) + 1
        for s, w in jobs:
            self.link_job(s, w, r, now)
        self.push(now + B * self.p.client, CLIENT_EV, r)

    def joined(self, r: Request, now):
        """One part of r's current restore stage ended."""
        r.join -= 1
        if r.join == 0:
            if r.stage == 1 and r.restore and r.bl + r.bf > 0:
                self.push(now + self.p.flash_fixed, TIER_EV, r)
            else:
                self.restored(r, now)

    def restored(self, r: Request, now):
        r.gpu_join -= 1
        if r.gpu_join == 0:
            if r.gpu_work > 0:
                if r.part_a_work > 0:
                    self.gpu_job(r.node, r, PART_B, r.gpu_work - r.part_a_work, r.gpu_tokens * (1.0 - self.p.overlap),
                                 now)
                else:
                    self.gpu_job(r.node, r, ONLY, r.gpu_work - r.part_a_work, r.gpu_tokens, now)
                self.start_batches(r.node, now)
            else:
                self.first_token(r, now)

    def first_token(self, r: Request, now):
        if r.index >= 0:
            self.res.ttft[r.index] = (now + self.p.decode) - r.arrival
        if r.wl > 0:
            s = 2 * self.N + r.node
            self.link_job(s, r.wl * self.inv_b[s], None, now)
        if r.wf > 0:
            issue = max(self.pacer, now)
            self.pacer = issue + r.wf * self.p.write
            self.push(issue, WRITE_EV, r.node, r.wf)

    def write(self, n, wf, now):
        N, T = self.N, self.T
        for t in range(T):
            s = 3 * N + t
            self.link_job(s, wf / T * self.inv_b[s], None, now)
        self.link_job(N + n, wf * self.inv_b[N + n], None, now)
        if self.uplink:
            self.link_job(3 * N + T, wf * self.inv_b[3 * N + T], None, now)

    def transfer(self, q: dict) -> None:
        """A background move into node q's DRAM: its jobs at its arrival, no request."""
        N, T, n, now = self.N, self.T, q["node"], q["arrival"]
        if q["bl"] > 0:
            self.link_job(2 * N + n, q["bl"] * self.inv_b[2 * N + n], None, now)
        for t in range(T):
            if q["bft"][t] > 0:
                s = 3 * N + t
                self.link_job(s, max(q["bft"][t] * self.inv_b[s], q["rft"][t] * self.inv_io[s]), None, now)
        if q["bf"] > 0:
            self.link_job(N + n, q["bf"] * self.inv_b[N + n], None, now)
            if self.uplink:
                self.link_job(3 * N + T, q["bf"] * self.inv_b[3 * N + T], None, now)

    # ------------------------------------------------------------------ the run
    def event(self, now, kind, args):
        if kind == LINK_DONE_EV:
            r, s = args
            self.st[s].count(now, -1.0, self.p)
            if r is not None:
                self.joined(r, now)
        elif kind == CLIENT_EV:
            self.joined(args[0], now)
        elif kind == PS_EV:
            r = self.ps_departure(args[0], args[1], now)
            if r is not None:
                self.joined(r, now)
        elif kind == DRAM_EV:
            r = args[0]
            r.stage, r.join = 1, 1
            self.link_job(r.node, r.bd * self.inv_b[r.node], r, now)
        elif kind == TIER_EV:
            self.tier_restore(args[0], now)
        elif kind == RESTORED_EV:
            self.restored(args[0], now)
        elif kind == GPU_A_EV:
            r = args[0]
            self.gpu_job(r.node, r, PART_A, r.part_a_work, r.gpu_tokens * self.p.overlap, now)
            self.start_batches(r.node, now)
        elif kind == BATCH_END_EV:
            self.batch_end(args[0], args[1], now)
        elif kind == WRITE_EV:
            self.write(args[0], args[1], now)

    def run_until(self, horizon):
        while self.heap and self.heap[0][0] <= horizon:
            now, _, kind, args = heapq.heappop(self.heap)
            self.res.last_event = now
            self.stop = False
            self.event(now, kind, args)
            if self.stop:
                raise Overloaded


def simulate(nodes, targets, gpus, inv_rate, inv_iops, p: Params, requests, *, ps=False, uplink=False,
             n_measured=None, congest=()) -> Result:
    """Run ``requests`` (dicts with ``arrival, node, index, bd, bl, bf, bft, rft, s_rest,
    k_rest, s_fl, k_fl, wl, wf``, and ``transfer`` True for a background transfer; in
    arrival order) and every event after the last;
    ``congest``: (link, from, to, share of its rate) windows."""
    n_measured = sum(1 for q in requests if q["index"] >= 0) if n_measured is None else n_measured
    sim = Sim(nodes, targets, gpus, inv_rate, inv_iops, p, ps=ps, uplink=uplink, n_measured=n_measured)
    for s, c0, c1, x in congest:
        sim.cw[s] = (c0, c1, x if c1 > c0 else 1.0)
    try:
        for q in requests:
            sim.run_until(q["arrival"])
            if q.get("transfer"):
                sim.transfer(q)
                if sim.stop:
                    raise Overloaded
                continue
            r = Request(q["index"], q["arrival"], q["node"], q["bd"], q["bl"], q["bf"], list(q["bft"]),
                        list(q["rft"]), q["wl"], q["wf"], q["s_rest"], q["k_rest"], q["s_fl"], q["k_fl"])
            sim.arrive(r)
        sim.run_until(math.inf)
    except Overloaded:
        pass
    return sim.res
