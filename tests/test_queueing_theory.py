"""The queue simulator (``kvtrace.kernels.queueing``) against queueing theory.

The simulator is configured as textbook queues and its estimates are compared with
closed-form results (the golden values are formulas, never simulated numbers):

- a pure GPU queue (one node, one target, no bytes, ``s_rest`` = the service time, no
  batch budget): M/D/1, M/M/1 and M/G/1 mean waits against Pollaczek-Khinchine, the
  probability of waiting of M/G/1 (= rho), M/M/c waits and probability of waiting
  against Erlang C;
- a link queue (DRAM restores through the host link, no GPU job): FCFS is M/G/1
  (Pollaczek-Khinchine), processor sharing is M/G/1-PS (Kleinrock: ``E[T | x] = x / (1 -
  rho)``, insensitive to the service law);
- utilisation = lambda x E[S] (GPU pool in server-seconds, FCFS and PS links), over
  independent replications;
- Little's law per resource from the station figures, with the window's edge terms
  computed from the requests;
- exact deterministic cases: D/D/1 and D/D/c never wait and their utilisation is
  exact; a saturated batch server completes ``b`` jobs per ``pass + b x s``.

Statistical tolerances are honest: the standard error of a mean over one run comes from
batch means (consecutive requests after a warm-up prefix, batches much longer than the
queue's relaxation time), of a figure over independent replications from their spread;
each check asserts ``|estimate - theory| <= 4 SE`` and that the SE is small enough
(relative SE < 3 %) for the check to be able to fail. Seeds are fixed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvtrace.kernels import queueing as Q

#: One node, one flash target: links 0..4 (host link 0), the GPU pool is station NL = 5.
NODES, TARGETS = 1, 1
NL = 3 * NODES + TARGETS + 1
HOST_LINK, GPU_POOL = 0, NL
#: Seconds per byte of the host link: a power of two, so ``bytes = work / LINK_S_PER_B``
#: gives back ``work`` exactly.
LINK_S_PER_B = 2.0 ** -30
#: Mean service time (seconds) of the GPU and link queues.
ES = 0.05
N_BATCHES = 30
Z = 4.0  # standard errors allowed
MAX_REL_SE = 0.03


# --------------------------------------------------------------------------- theory
def pollaczek_khinchine_wait(lam: float, es: float, es2: float) -> float:
    """Mean wait in queue of M/G/1 FCFS, the Pollaczek-Khinchine formula:
    ``W_q = lambda E[S^2] / (2 (1 - rho))`` with ``rho = lambda E[S]`` (Kleinrock, Queueing
    Systems I, eq. 5.72). M/D/1: ``rho S / (2 (1 - rho))``; M/M/1: ``rho E[S] / (1 - rho)``."""
    rho = lam * es
    assert rho < 1
    return lam * es2 / (2.0 * (1.0 - rho))


def erlang_c(c: int, a: float) -> float:
    """Probability of waiting in M/M/c with offered load ``a = lambda / mu < c``
    (Erlang's C formula): ``(a^c / c!) (c / (c - a)) / (sum_{k<c} a^k / k! + (a^c / c!) (c / (c - a)))``."""
    assert a < c
    top = a ** c / math.factorial(c) * c / (c - a)
    return top / (sum(a ** k / math.factorial(k) for k in range(c)) + top)


def mmc_wait(c: int, lam: float, mu: float) -> float:
    """Mean wait in queue of M/M/c FCFS: ``W_q = C(c, a) / (c mu - lambda)``, ``a = lambda / mu``
    (Erlang C; Kleinrock, Queueing Systems I, eq. 3.43)."""
    return erlang_c(c, lam / mu) / (c * mu - lam)


def ps_sojourn(rho: float, x: float) -> float:
    """Mean sojourn of a job of work ``x`` in M/G/1 processor sharing: ``x / (1 - rho)``,
    whatever the service law (Kleinrock 1967, "Time-shared systems: a theoretical
    treatment"; Queueing Systems II, eq. 4.17). The mean over jobs: ``E[S] / (1 - rho)``."""
    assert rho < 1
    return x / (1.0 - rho)


# --------------------------------------------------------------------------- service laws
#: name -> (sampler(rng, n) with mean ES, E[S^2])
LAWS = {
    "deterministic": (lambda rng, n: np.full(n, ES), ES ** 2),
    "exponential": (lambda rng, n: rng.exponential(ES, n), 2.0 * ES ** 2),
    "uniform": (lambda rng, n: rng.uniform(0.0, 2.0 * ES, n), 4.0 * ES ** 2 / 3.0),
    # 0.5 ES w.p. 0.8, 3 ES w.p. 0.2: mean ES, E[S^2] = (0.8 x 0.25 + 0.2 x 9) ES^2 = 2 ES^2
    "two_point": (lambda rng, n: np.where(rng.random(n) < 0.8, 0.5 * ES, 3.0 * ES), 2.0 * ES ** 2),
}


# --------------------------------------------------------------------------- simulation
def poisson_arrivals(rng, lam: float, m: int) -> np.ndarray:
    return np.cumsum(rng.exponential(1.0 / lam, m))


def simulate(arrival, *, service=None, link_work=None, gpus: int = 1, ps: bool = False, warm: int = 0,
             all_measured: bool = False, batch_tokens: float = 0.0, pass_s: float = 0.0, tokens=None,
             feeds: int = 3) -> Q.QueueSim:
    """One node, one target: request i arrives at ``arrival[i]`` with GPU work ``service[i]``
    (seconds; tokens ``tokens[i]``, default 1) or, with ``link_work``, a DRAM restore of
    ``link_work[i]`` seconds on the host link and no GPU job. The first ``warm`` requests
    are a warm-up (unmeasured unless ``all_measured``); the window runs from the arrival
    of request ``warm`` to the last one. Fed in ``feeds`` batches."""
    arrival = np.asarray(arrival, dtype=np.float64)
    m = arrival.shape[0]
    zeros = np.zeros(m)
    s_rest = zeros if service is None else np.asarray(service, dtype=np.float64)
    bd = zeros if link_work is None else np.asarray(link_work, dtype=np.float64) / LINK_S_PER_B
    k_rest = np.ones(m) if tokens is None else np.asarray(tokens, dtype=np.float64)
    idx = np.arange(m, dtype=np.int64)
    index = idx if all_measured else np.where(idx < warm, -1, idx - warm)
    fp = np.zeros(Q.N_FP)
    fp[Q.FP_MAX_WAIT] = math.inf
    fp[Q.FP_W0], fp[Q.FP_W1] = arrival[warm], arrival[-1]
    fp[Q.FP_BATCH_TOKENS], fp[Q.FP_PASS] = batch_tokens, pass_s
    inv_rate = np.zeros(NL)
    inv_rate[HOST_LINK] = LINK_S_PER_B
    sim = Q.QueueSim(NODES, TARGETS, gpus, inv_rate, np.zeros(NL), fp, ps=ps, uplink=False,
                     n_measured=int((index >= 0).sum()))
    node = np.zeros(m, dtype=np.int64)
    per_target = np.zeros((m, TARGETS))
    cuts = np.linspace(0, m, feeds + 1).astype(int)
    for k, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:])):
        sl = slice(lo, hi)
        sim.feed(arrival[sl], node[sl], index[sl], bd[sl], zeros[sl], zeros[sl], per_target[sl], per_target[sl],
                 s_rest[sl], k_rest[sl], zeros[sl], zeros[sl], zeros[sl], zeros[sl], final=k == feeds - 1)
    assert not sim.overloaded
    assert not np.isnan(sim.ttft).any()
    return sim


def window(sim: Q.QueueSim) -> float:
    return float(sim.fp[Q.FP_W1] - sim.fp[Q.FP_W0])


# --------------------------------------------------------------------------- estimates
def batch_means(x, n_batches: int = N_BATCHES) -> tuple[float, float]:
    """Mean of ``x`` (consecutive observations) and its standard error by batch means."""
    x = np.asarray(x, dtype=np.float64)
    size = x.shape[0] // n_batches
    means = x[:size * n_batches].reshape(n_batches, size).mean(axis=1)
    return float(means.mean()), float(means.std(ddof=1) / math.sqrt(n_batches))


def replications(values) -> tuple[float, float]:
    """Mean of independent replications' values and its standard error."""
    v = np.asarray(values, dtype=np.float64)
    return float(v.mean()), float(v.std(ddof=1) / math.sqrt(v.shape[0]))


def check(name: str, estimate: float, se: float, theory: float, *, max_rel_se: float = MAX_REL_SE,
          abs_tol: float = 0.0) -> None:
    """``|estimate - theory| <= Z SE + abs_tol`` with a relative SE small enough to matter."""
    print(f"{name}: estimate {estimate:.6g} +- {se:.3g} (SE), theory {theory:.6g}, "
          f"{(estimate - theory) / se if se > 0 else 0.0:+.2f} SE")
    assert se <= max_rel_se * abs(theory), f"{name}: SE {se:.3g} too large to test {theory:.6g}"
    assert abs(estimate - theory) <= Z * se + abs_tol, f"{name}: {estimate:.6g} vs {theory:.6g} (SE {se:.3g})"


# --------------------------------------------------------------------------- 1, 2: M/G/1 FCFS on a GPU
@pytest.mark.parametrize("law,rho,m", [
    ("deterministic", 0.5, 100_000), ("deterministic", 0.8, 200_000),
    ("exponential", 0.5, 100_000), ("exponential", 0.8, 300_000),
    ("uniform", 0.7, 200_000), ("two_point", 0.7, 200_000),
])
def test_mg1_gpu_mean_wait_is_pollaczek_khinchine(law, rho, m):
    """M/D/1, M/M/1, M/G/1 (uniform, two-point) on one GPU: the mean wait in queue."""
    rng = np.random.default_rng(11)
    draw, es2 = LAWS[law]
    lam = rho / ES
    warm = 5_000
    arrival = poisson_arrivals(rng, lam, m)
    service = draw(rng, m)
    sim = simulate(arrival, service=service, warm=warm)
    wait = sim.ttft - service[warm:]
    assert wait.min() >= -1e-9
    est, se = batch_means(wait)
    check(f"M/G/1 {law} rho={rho} Wq", est, se, pollaczek_khinchine_wait(lam, ES, es2))


@pytest.mark.parametrize("law", ["deterministic", "exponential", "two_point"])
def test_mg1_gpu_probability_of_waiting_is_rho(law):
    """M/G/1: P(wait > 0) = rho (an arrival waits iff the server is busy; PASTA). The zero
    waits in the GPU wait histogram (bin 0) are the requests whose TTFT is their service."""
    rng = np.random.default_rng(12)
    draw, _ = LAWS[law]
    rho, m, warm = 0.6, 100_000, 2_000
    arrival = poisson_arrivals(rng, rho / ES, m)
    service = draw(rng, m)
    sim = simulate(arrival, service=service, warm=warm)
    waited = (sim.ttft - service[warm:]) > 1e-9
    hist = sim.whist[Q.GPU]
    assert hist.sum() == m - warm
    assert hist[1:].sum() == waited.sum()
    est, se = batch_means(waited)
    check(f"M/G/1 {law} P(wait>0)", est, se, rho)


# --------------------------------------------------------------------------- 3: M/M/c
@pytest.mark.parametrize("a", [1.5, 2.4])
def test_mmc_gpu_pool_wait_and_probability_of_waiting_are_erlang_c(a):
    """M/M/3: three GPUs, exponential service; offered load ``a = lambda E[S]``."""
    c, m, warm = 3, 300_000, 5_000
    rng = np.random.default_rng(13)
    lam, mu = a / ES, 1.0 / ES
    arrival = poisson_arrivals(rng, lam, m)
    service = rng.exponential(ES, m)
    sim = simulate(arrival, service=service, gpus=c, warm=warm)
    wait = sim.ttft - service[warm:]
    est, se = batch_means(wait)
    check(f"M/M/{c} a={a} Wq", est, se, mmc_wait(c, lam, mu))
    waited = wait > 1e-9
    assert sim.whist[Q.GPU, 1:].sum() == waited.sum()
    est, se = batch_means(waited)
    check(f"M/M/{c} a={a} P(wait>0)", est, se, erlang_c(c, a))


# --------------------------------------------------------------------------- FCFS link = M/G/1
@pytest.mark.parametrize("law,rho", [("exponential", 0.7), ("uniform", 0.8)])
def test_fcfs_host_link_mean_wait_is_pollaczek_khinchine(law, rho):
    """DRAM restores through a FCFS host link: an M/G/1 queue of ``bytes x s/byte`` work."""
    rng = np.random.default_rng(14)
    draw, es2 = LAWS[law]
    lam, m, warm = rho / ES, 200_000, 5_000
    arrival = poisson_arrivals(rng, lam, m)
    work = draw(rng, m)
    sim = simulate(arrival, link_work=work, warm=warm)
    wait = sim.ttft - work[warm:]
    assert wait.min() >= -1e-9
    assert sim.whist[Q.HOST].sum() == m - warm and sim.whist[Q.GPU].sum() == 0
    est, se = batch_means(wait)
    check(f"FCFS link {law} rho={rho} Wq", est, se, pollaczek_khinchine_wait(lam, ES, es2))


# --------------------------------------------------------------------------- 4: utilisation
@pytest.mark.parametrize("where,gpus,ps", [("gpu", 1, False), ("gpu", 3, False), ("link", 1, False),
                                           ("link", 1, True)])
def test_utilisation_is_lambda_times_mean_work(where, gpus, ps):
    """Busy time over the window / (servers x window) = lambda E[S] / c, over 20
    independent replications (GPU pool: server-seconds of its batches; a link: FCFS job
    intervals or PS busy periods; bytes x s/byte with exponential bytes)."""
    rho, m, warm, reps = 0.7, 12_000, 1_000, 20
    lam = rho * gpus / ES
    station = GPU_POOL if where == "gpu" else HOST_LINK
    values = []
    for r in range(reps):
        rng = np.random.default_rng([15, where == "gpu", gpus, int(ps), r])
        arrival = poisson_arrivals(rng, lam, m)
        work = rng.exponential(ES, m)
        sim = (simulate(arrival, service=work, gpus=gpus, warm=warm, feeds=1) if where == "gpu" else
               simulate(arrival, link_work=work, ps=ps, warm=warm, feeds=1))
        values.append(sim.sf[station, Q.SF_BUSY] / (gpus * window(sim)))
        other = HOST_LINK if where == "gpu" else GPU_POOL
        assert sim.sf[other, Q.SF_BUSY] == 0.0
    est, se = replications(values)
    check(f"utilisation {where} c={gpus} ps={ps}", est, se, lam * ES / gpus)


# --------------------------------------------------------------------------- 5: Little's law
@pytest.mark.parametrize("where,gpus,ps", [("gpu", 1, False), ("gpu", 3, False), ("link", 1, False),
                                           ("link", 1, True)])
def test_littles_law_per_station(where, gpus, ps):
    """L = lambda W per station from its figures: time-average jobs present (SF_AREA / window)
    = jobs arrived in the window / window x their mean sojourn. On a finite window the two
    sides differ by edge terms (jobs present at its start, sojourns past its end), computed
    here from the requests (every request measured, so every sojourn = its TTFT is known);
    the station's sums are checked against the requests' too."""
    rho, m, warm = 0.8, 100_000, 1_000
    rng = np.random.default_rng([16, where == "gpu", gpus, int(ps)])
    lam = rho * gpus / ES
    arrival = poisson_arrivals(rng, lam, m)
    work = rng.exponential(ES, m)
    sim = (simulate(arrival, service=work, gpus=gpus, warm=warm, all_measured=True) if where == "gpu" else
           simulate(arrival, link_work=work, ps=ps, warm=warm, all_measured=True))
    station = GPU_POOL if where == "gpu" else HOST_LINK
    sf = sim.sf[station]
    w0, w1 = sim.fp[Q.FP_W0], sim.fp[Q.FP_W1]
    length = w1 - w0
    sojourn = sim.ttft  # route, fixed latencies and decode are 0: TTFT = the sojourn at the station
    leave = arrival + sojourn
    inside = (arrival >= w0) & (arrival <= w1)
    # the station's sums = the requests' (exact accounting)
    assert sf[Q.SF_JOBS] == inside.sum()
    assert sf[Q.SF_SOJOURN] == pytest.approx(sojourn[inside].sum(), rel=1e-9)
    assert sf[Q.SF_WORK] == pytest.approx(work[inside].sum(), rel=1e-9)
    present = np.clip(np.minimum(leave, w1) - np.maximum(arrival, w0), 0.0, None)
    assert sf[Q.SF_AREA] == pytest.approx(present.sum(), rel=1e-9)
    # Little's law, up to the window's edge terms
    big_l = sf[Q.SF_AREA] / length
    lam_w = (sf[Q.SF_JOBS] / length) * (sf[Q.SF_SOJOURN] / sf[Q.SF_JOBS])
    edge = (present[arrival < w0].sum() + np.clip(leave[inside] - w1, 0.0, None).sum()) / length
    print(f"Little {where} c={gpus} ps={ps}: L {big_l:.6g}, lambda W {lam_w:.6g}, edge bound {edge:.3g}")
    assert abs(big_l - lam_w) <= edge + 1e-9 * big_l
    assert edge <= 0.01 * big_l  # the window is long enough for the identity to be tight


# --------------------------------------------------------------------------- 6: M/G/1-PS
@pytest.mark.parametrize("law,rho", [("exponential", 0.5), ("exponential", 0.8), ("deterministic", 0.8),
                                     ("two_point", 0.7)])
def test_ps_link_mean_sojourn_is_insensitive(law, rho):
    """M/G/1-PS on a processor-sharing host link: the mean sojourn is ``E[S] / (1 - rho)``
    for every service law (Kleinrock)."""
    rng = np.random.default_rng(17)
    draw, _ = LAWS[law]
    lam, m, warm = rho / ES, 200_000, 5_000
    arrival = poisson_arrivals(rng, lam, m)
    work = draw(rng, m)
    sim = simulate(arrival, link_work=work, ps=True, warm=warm)
    assert (sim.ttft >= work[warm:] - 1e-9).all()  # a job's sojourn is at least its work (up to rounding)
    est, se = batch_means(sim.ttft)
    check(f"M/G/1-PS {law} rho={rho} E[T]", est, se, ps_sojourn(rho, ES))


def test_ps_link_sojourn_is_proportional_to_work():
    """M/G/1-PS: ``E[T | x] = x / (1 - rho)`` for each job size (Kleinrock), here the two
    sizes of a two-point law; FCFS would give both the same wait instead."""
    rng = np.random.default_rng(18)
    draw, _ = LAWS["two_point"]
    rho, m, warm = 0.7, 200_000, 5_000
    arrival = poisson_arrivals(rng, rho / ES, m)
    work = draw(rng, m)
    sim = simulate(arrival, link_work=work, ps=True, warm=warm)
    measured = work[warm:]
    for x in (0.5 * ES, 3.0 * ES):
        pick = measured == x
        # the slowdown T / x of each job of size x, in arrival order (batch means over them)
        est, se = batch_means(sim.ttft[pick] / x)
        check(f"M/G/1-PS T/x for x={x / ES:g} E[S]", est, se, ps_sojourn(rho, 1.0))


# --------------------------------------------------------------------------- 7: exact cases
@pytest.mark.parametrize("gpus,gap,service", [(1, 1.0, 0.75), (2, 0.5, 0.875), (3, 0.25, 0.625)])
def test_dd_c_never_waits_and_its_utilisation_is_exact(gpus, gap, service):
    """D/D/c with ``service < c x gap``: every TTFT is its service time, every wait is zero (bin
    0 of the histogram), and the busy server-seconds over the window [first, last arrival]
    are exactly those of the jobs clipped to it, ``sum min(service, w1 - a_i)`` (binary
    fractions: exact arithmetic), so the utilisation is ``service / (c x gap)`` up to the
    jobs cut by the window's end."""
    m = 4_001
    arrival = np.arange(m) * gap
    sim = simulate(arrival, service=np.full(m, service), gpus=gpus)
    np.testing.assert_array_equal(sim.ttft, np.full(m, service))
    assert sim.whist[Q.GPU, 0] == m and sim.whist.sum() == m
    busy = sim.sf[GPU_POOL, Q.SF_BUSY]
    assert busy == np.minimum(service, arrival[-1] - arrival).sum()
    cut = math.ceil(service / gap) * service  # at most the jobs that started within ``service`` of the end
    assert abs(busy / (gpus * window(sim)) - service / (gpus * gap)) <= cut / (gpus * window(sim))


def test_dd1_link_never_waits_fcfs_and_ps():
    """D/D/1 on a link: no job ever shares or waits, FCFS and PS alike."""
    m, gap, work = 2_001, 0.5, 0.375
    for ps in (False, True):
        sim = simulate(np.arange(m) * gap, link_work=np.full(m, work), ps=ps)
        np.testing.assert_allclose(sim.ttft, work, rtol=0, atol=1e-12)
        assert sim.whist[Q.HOST, 0] == m
        assert sim.sf[HOST_LINK, Q.SF_BUSY] == pytest.approx((m - 1) * work, rel=1e-12)


@pytest.mark.parametrize("gpus", [1, 2])
def test_saturated_batch_server_throughput(gpus):
    """A batch server with a token budget ``K``, jobs of ``k`` tokens and ``s`` s each and a
    pass time ``p``: saturated (arrivals above capacity), every batch holds ``b = floor(K /
    k)`` jobs and lasts ``p + b s``, so the pool completes ``c b / (p + b s)`` jobs per second
    (minus at most one batch per server at the ends of the interval)."""
    K, k, s, p = 4096.0, 1000.0, 0.005, 0.01
    b = int(K // k)
    capacity = gpus * b / (p + b * s)
    rng = np.random.default_rng([19, gpus])
    m, warm = 20_000, 2_000
    arrival = poisson_arrivals(rng, 1.5 * capacity, m)
    sim = simulate(arrival, service=np.full(m, s), tokens=np.full(m, k), gpus=gpus, warm=warm,
                   batch_tokens=K, pass_s=p)
    leave = np.sort(arrival[warm:] + sim.ttft)
    ends, per_batch = np.unique(np.round(leave, 9), return_counts=True)
    # after the warm-up the queue never empties: every batch is full and back to back
    inner = per_batch[gpus:-gpus]
    assert (inner % b == 0).all() and (inner > 0).all()
    if gpus == 1:
        assert (per_batch[1:-1] == b).all()
        np.testing.assert_allclose(np.diff(ends[1:-1]), p + b * s, rtol=0, atol=1e-8)
    span = leave[-1] - leave[0]
    throughput = (leave.shape[0] - 1) / span
    slack = gpus * b / span
    print(f"batch c={gpus}: throughput {throughput:.6g}, theory {capacity:.6g}, slack {slack:.3g}")
    assert abs(throughput - capacity) <= slack
    # the busy server-seconds over the window: all servers all the time, once the queue formed
    # (it forms within the first warm-up requests, long before the window starts)
    assert sim.sf[GPU_POOL, Q.SF_BUSY] == pytest.approx(gpus * window(sim), rel=1e-9)
