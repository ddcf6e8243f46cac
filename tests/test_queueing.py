"""The queue simulator (``kvtrace.kernels.queueing``) against its brute-force twin.

- random small systems (nodes, flash targets, GPUs, FCFS or processor-sharing links, an
  uplink, overlap, batching, write budget, warm-up requests, ties in arrival times)
  run through the compiled kernel and through ``tests/naive_queueing.py`` (a heap of
  events in plain Python; processor sharing by brute force): FCFS results equal
  exactly, processor-sharing ones within 1e-9 (the twin serves remainders, the kernel
  uses virtual-time tags, so the sums round differently);
- edge cases: no requests, nothing to restore or compute, no GPU, a zero-rate link,
  a wait past ``max_wait`` on a link, a PS link and a GPU pool (the overload and its
  date), everything arriving at once;
- feeding the requests in several batches equals one batch; tables grow (thousands of
  requests in flight) without changing a result.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import naive_queueing as twin

from kvtrace.kernels import queueing as Q

STATION_FIELDS = {"busy": Q.SF_BUSY, "area": Q.SF_AREA, "jobs": Q.SF_JOBS, "sojourn": Q.SF_SOJOURN,
                  "work": Q.SF_WORK}


# --------------------------------------------------------------------------- cases
def random_case(seed: int, **force):
    """A random system and requests; ``force`` overrides any drawn setting."""
    rng = np.random.default_rng(seed)
    N = int(rng.integers(1, 4))
    T = int(rng.integers(1, 4))
    case = dict(nodes=N, targets=T, gpus=int(rng.integers(1, 4)), ps=bool(rng.random() < 0.5),
                uplink=bool(rng.random() < 0.5))
    case.update({k: v for k, v in force.items() if k in case})
    N, T = case["nodes"], case["targets"]
    NL = 3 * N + T + 1
    inv_rate = np.where(rng.random(NL) < 0.15, 0.0, rng.uniform(0.002, 0.02, NL))
    inv_iops = rng.uniform(0.0, 0.05, NL)
    p = twin.Params(route=float(rng.choice([0.0, 0.01])), dram_fixed=float(rng.uniform(0, 0.05)),
                    flash_fixed=float(rng.uniform(0, 0.05)), client=float(rng.choice([0.0, rng.uniform(0, 0.005)])),
                    write=float(rng.choice([0.0, rng.uniform(0, 0.01)])), overlap=float(rng.choice([0.0, 0.3])),
                    decode=float(rng.choice([0.0, 0.01])))
    if rng.random() < 0.5:
        p.batch_tokens, p.pass_s = 300.0, float(rng.choice([0.0, 0.02]))
    m = int(force.get("m", rng.integers(1, 160)))
    gaps = rng.exponential(float(force.get("gap", 0.25)), m)
    gaps[rng.random(m) < 0.1] = 0.0  # ties
    arrival = np.cumsum(gaps)
    warm = int(rng.integers(0, max(1, m // 4)))
    reqs = []
    for i in range(m):
        bft = np.where(rng.random(T) < 0.5, 0.0, rng.uniform(0, 50, T))
        rft = np.where(bft > 0, rng.integers(1, 6, T), 0).astype(float)
        reqs.append(dict(
            arrival=float(arrival[i]), node=int(rng.integers(0, N)), index=i - warm if i >= warm else -1,
            bd=0.0 if rng.random() < 0.4 else float(rng.uniform(0, 100)),
            bl=0.0 if rng.random() < 0.5 else float(rng.uniform(0, 60)),
            bf=float(bft.sum()), bft=bft.tolist(), rft=rft.tolist(),
            s_rest=0.0 if rng.random() < 0.1 else float(rng.uniform(0, 1)), k_rest=float(rng.integers(0, 200)),
            s_fl=float(rng.uniform(0, 2)), k_fl=float(rng.integers(0, 200)),
            wl=0.0 if rng.random() < 0.6 else float(rng.uniform(0, 50)),
            wf=0.0 if rng.random() < 0.6 else float(rng.uniform(0, 50))))
    meas = [r["arrival"] for r in reqs if r["index"] >= 0]
    p.w0, p.w1 = (meas[0], meas[-1]) if meas else (0.0, 0.0)
    for k, v in force.items():
        if hasattr(p, k):
            setattr(p, k, v)
    case.update(inv_rate=inv_rate, inv_iops=inv_iops, p=p, requests=reqs)
    if "inv_rate_at" in force:
        s, v = force["inv_rate_at"]
        inv_rate[s] = v
    return case


def fp_of(p: twin.Params) -> np.ndarray:
    fp = np.zeros(Q.N_FP)
    fp[Q.FP_ROUTE], fp[Q.FP_DRAM_FIXED], fp[Q.FP_FLASH_FIXED] = p.route, p.dram_fixed, p.flash_fixed
    fp[Q.FP_CLIENT_S_PER_B], fp[Q.FP_WRITE_S_PER_B], fp[Q.FP_OVERLAP] = p.client, p.write, p.overlap
    fp[Q.FP_PASS], fp[Q.FP_DECODE], fp[Q.FP_MAX_WAIT] = p.pass_s, p.decode, p.max_wait
    fp[Q.FP_W0], fp[Q.FP_W1], fp[Q.FP_BATCH_TOKENS] = p.w0, p.w1, p.batch_tokens
    return fp


def columns(reqs, T):
    col = {k: np.array([r[k] for r in reqs], dtype=np.float64) for k in
           ("arrival", "bd", "bl", "bf", "s_rest", "k_rest", "s_fl", "k_fl", "wl", "wf")}
    col["node"] = np.array([r["node"] for r in reqs], dtype=np.int64)
    col["index"] = np.array([r["index"] for r in reqs], dtype=np.int64)
    col["bft"] = np.array([r["bft"] for r in reqs], dtype=np.float64).reshape(-1, T)
    col["rft"] = np.array([r["rft"] for r in reqs], dtype=np.float64).reshape(-1, T)
    col["transfer"] = np.array([bool(r.get("transfer")) for r in reqs], dtype=bool)
    return col


def run_kernel(case, cuts=()):
    """The compiled simulator over ``case``, fed in batches split at ``cuts``."""
    reqs, T = case["requests"], case["targets"]
    n_meas = sum(1 for r in reqs if r["index"] >= 0)
    sim = Q.QueueSim(case["nodes"], T, case["gpus"], case["inv_rate"], case["inv_iops"], fp_of(case["p"]),
                     ps=case["ps"], uplink=case["uplink"], n_measured=n_meas)
    for station, c0, c1, x in case.get("congest", ()):
        sim.congest(station, c0, c1, x)
    c = columns(reqs, T)
    bounds = [0, *cuts, len(reqs)]
    for k, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        sim.feed(c["arrival"][lo:hi], c["node"][lo:hi], c["index"][lo:hi], c["bd"][lo:hi], c["bl"][lo:hi],
                 c["bf"][lo:hi], c["bft"][lo:hi], c["rft"][lo:hi], c["s_rest"][lo:hi], c["k_rest"][lo:hi],
                 c["s_fl"][lo:hi], c["k_fl"][lo:hi], c["wl"][lo:hi], c["wf"][lo:hi], final=k == len(bounds) - 2,
                 transfer=c["transfer"][lo:hi] if c["transfer"].any() else None)
    return sim


def run_twin(case):
    return twin.simulate(case["nodes"], case["targets"], case["gpus"], case["inv_rate"], case["inv_iops"],
                         case["p"], case["requests"], ps=case["ps"], uplink=case["uplink"],
                         congest=case.get("congest", ()))


# --------------------------------------------------------------------------- comparison
def wait_bin(w: float) -> int:
    """The kernel docstring's histogram bin of a wait (bin 0: none)."""
    if w <= 0:
        return 0
    i = math.ceil(Q.WAIT_BINS_PER_OCTAVE * math.log2(w / Q.WAIT_BIN0_S))
    return min(max(i, 1), Q.N_WAIT_BINS - 1)


def check_hist(hist: np.ndarray, waits: list, tol: float) -> None:
    """``hist`` (the kernel's) is a binning of ``waits`` each moved by at most ``tol``
    (relative, plus 1e-12 s): per bin, the cumulative count lies between the counts of
    the waits that must and that may fall at or below it (exact when ``tol`` = 0)."""
    assert hist.sum() == len(waits)
    if tol == 0:
        want = np.zeros_like(hist)
        for w in waits:
            want[wait_bin(w)] += 1
        np.testing.assert_array_equal(hist, want)
        return
    lo = np.zeros_like(hist)
    hi = np.zeros_like(hist)
    for w in waits:
        e = tol * abs(w) + 1e-12
        lo[wait_bin(w - e)] += 1
        hi[wait_bin(w + e)] += 1
    cum = np.cumsum(hist)
    assert np.all(np.cumsum(hi) <= cum) and np.all(cum <= np.cumsum(lo))


def compare(sim: Q.QueueSim, ref: twin.Result, exact: bool) -> None:
    rtol = 0.0 if exact else 1e-9
    atol = 0.0 if exact else 1e-9
    assert sim.overloaded == ref.overloaded
    if ref.overloaded:
        assert sim.cnt[Q.C_OVER_STATION] == ref.over_station
        np.testing.assert_allclose([sim.out[Q.O_OVER_FROM], sim.out[Q.O_OVER_AT]], [ref.over_from, ref.over_at],
                                   rtol=rtol, atol=atol)
    np.testing.assert_allclose(sim.ttft, np.array(ref.ttft), rtol=rtol, atol=atol, equal_nan=True)
    np.testing.assert_array_equal(sim.branches, ref.branches)
    np.testing.assert_allclose(sim.out[[Q.O_BYTES_D, Q.O_BYTES_L, Q.O_BYTES_F]],
                               [ref.bytes_dram, ref.bytes_local, ref.bytes_flash], rtol=rtol, atol=atol)
    np.testing.assert_allclose(sim.out[Q.O_LAST_T], ref.last_event, rtol=rtol, atol=atol)
    for name, f in STATION_FIELDS.items():
        got = sim.sf[:, f]
        want = np.array([getattr(s, name) for s in ref.stations])
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)
    for kind in range(len(Q.STATION_TYPES)):
        check_hist(sim.whist[kind], ref.waits[kind], 0.0 if exact else 1e-9)


# --------------------------------------------------------------------------- tests
@pytest.mark.parametrize("seed", range(60))
def test_kernel_equals_twin_on_random_systems(seed):
    case = random_case(seed)
    ref = run_twin(case)
    assert not ref.overloaded
    assert sum(1 for t in ref.ttft if not math.isnan(t)) == len(ref.ttft)  # every measured request finished
    compare(run_kernel(case), ref, exact=not case["ps"])


@pytest.mark.parametrize("ps", [False, True])
@pytest.mark.parametrize("seed", range(8))
def test_busy_systems_queue_and_choose_both_branches(seed, ps):
    """Arrivals faster than service: long queues, and restore-or-recompute sees them."""
    case = random_case(1000 + seed, ps=ps, gap=0.02, m=300)
    ref = run_twin(case)
    waits = sum(len([w for w in ws if w > 0]) for ws in ref.waits)
    assert waits > 100
    compare(run_kernel(case), ref, exact=not ps)


@pytest.mark.parametrize("seed", range(10))
def test_batches_of_any_size_equal_one_feed(seed):
    case = random_case(2000 + seed, m=150)
    rng = np.random.default_rng(seed)
    cuts = sorted(set(rng.integers(0, 151, int(rng.integers(1, 8))).tolist()))
    one, many = run_kernel(case), run_kernel(case, cuts)
    for a, b in ((one.ttft, many.ttft), (one.sf, many.sf), (one.whist, many.whist), (one.branches, many.branches),
                 (one.out, many.out), (one.cnt[[Q.C_STATUS, Q.C_DONE]], many.cnt[[Q.C_STATUS, Q.C_DONE]])):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("ps", [False, True])
def test_tables_grow_with_thousands_in_flight(ps):
    """3,000 requests within a second on one slow GPU: the slot, job and event tables
    (256, 1024, 1024 rows at first) grow several times; results equal the twin's."""
    case = random_case(7, ps=ps, m=3000, gap=0.0003, nodes=1, gpus=1)
    sim = run_kernel(case, cuts=(1000, 2500))
    assert sim.qf.shape[0] >= 2048 and sim.jf.shape[0] > 1024 and sim.heap[0].shape[0] > 1024
    compare(sim, run_twin(case), exact=not ps)


def test_no_requests():
    case = random_case(3, m=1)
    case["requests"] = []
    sim = run_kernel(case)
    assert not sim.overloaded and sim.ttft.shape == (0,) and sim.sf[:, :Q.SF_CW0].sum() == 0 and sim.whist.sum() == 0


def test_nothing_to_restore_or_compute_is_route_plus_decode():
    case = random_case(4, m=50, route=0.01, decode=0.003, overlap=0.3)
    for r in case["requests"]:
        r.update(bd=0.0, bl=0.0, bf=0.0, bft=[0.0] * case["targets"], rft=[0.0] * case["targets"], s_rest=0.0)
    sim = run_kernel(case)
    want = np.full(sim.ttft.shape, 0.0)
    for r in case["requests"]:
        if r["index"] >= 0:
            want[r["index"]] = (r["arrival"] + 0.01 + 0.003) - r["arrival"]
    np.testing.assert_array_equal(sim.ttft, want)
    assert sim.whist[Q.GPU].sum() == 0 and sim.branches[Q.B_NONE] == len(want)
    compare(sim, run_twin(case), exact=not case["ps"])


def test_everything_arriving_at_once():
    case = random_case(5, m=80)
    for r in case["requests"]:
        r["arrival"] = 0.0
    case["p"].w0 = case["p"].w1 = 0.0
    compare(run_kernel(case), run_twin(case), exact=not case["ps"])


def test_no_gpu_is_an_overload_at_the_first_prefill():
    case = random_case(6, gpus=0, m=40)
    sim, ref = run_kernel(case), run_twin(case)
    assert ref.overloaded and ref.over_station >= 3 * case["nodes"] + case["targets"] + 1
    assert ref.over_from == ref.over_at
    compare(sim, ref, exact=not case["ps"])


@pytest.mark.parametrize("ps", [False, True])
def test_zero_rate_link_is_an_overload(ps):
    case = random_case(8, ps=ps, m=60, inv_rate_at=(0, math.inf))
    for r in case["requests"]:
        r["bd"], r["node"] = 10.0, 0
    sim, ref = run_kernel(case), run_twin(case)
    assert ref.overloaded and ref.over_station == 0
    compare(sim, ref, exact=not ps)


@pytest.mark.parametrize("ps", [False, True])
@pytest.mark.parametrize("where", ["link", "gpu"])
def test_wait_past_max_wait_stops_the_run_dated_from_the_busy_period(where, ps):
    case = random_case(9, ps=ps, m=400, gap=0.01, nodes=1, gpus=1, max_wait=0.5)
    case["p"].w0 = case["requests"][0]["arrival"]
    zero = [0.0] * case["targets"]
    for i, r in enumerate(case["requests"]):  # every request measured; the link or the GPU alone at rho ~1.2
        r.update(index=i, wl=0.0, wf=0.0, bl=0.0, bf=0.0, bft=zero, rft=zero)
        if where == "link":
            r.update(bd=1.2, s_rest=0.0)
        else:
            r.update(bd=0.0, s_rest=0.012)
    case["inv_rate"][0] = 0.01
    sim, ref = run_kernel(case), run_twin(case)
    assert ref.overloaded
    assert ref.over_station == (0 if where == "link" else 3 + case["targets"] + 1)
    assert ref.over_from < ref.over_at
    assert any(math.isnan(t) for t in ref.ttft) and any(not math.isnan(t) for t in ref.ttft)
    compare(sim, ref, exact=not ps)


def test_warm_up_only():
    case = random_case(10, m=30)
    for r in case["requests"]:
        r["index"] = -1
    sim, ref = run_kernel(case), run_twin(case)
    assert sim.ttft.shape == (0,) and sim.whist.sum() == 0 and sum(ref.branches) == 0
    compare(sim, ref, exact=not case["ps"])


# --------------------------------------------------------------------------- congestion windows
def with_congestion(case, seed: int, n: int = 3):
    """The case with ``n`` links congested: a window over the busy part of the run at a
    random share of their rate (0: the link stops in the window)."""
    rng = np.random.default_rng(seed)
    NL = 3 * case["nodes"] + case["targets"] + 1
    end = case["requests"][-1]["arrival"] if case["requests"] else 1.0
    congest = []
    for s in rng.choice(NL, size=min(n, NL), replace=False):
        c0 = float(rng.uniform(0, end))
        congest.append((int(s), c0, c0 + float(rng.uniform(0.1, end)), float(rng.choice([0.0, 0.1, 0.5, 0.9]))))
    return {**case, "congest": congest}


@pytest.mark.parametrize("seed", range(40))
def test_congested_links_kernel_equals_twin(seed):
    case = with_congestion(random_case(5000 + seed, gap=float(np.random.default_rng(seed).choice([0.05, 0.25]))),
                           seed)
    ref = run_twin(case)
    compare(run_kernel(case), ref, exact=not case["ps"])


@pytest.mark.parametrize("ps", [False, True])
def test_congestion_changes_the_run_and_a_window_outside_it_does_not(ps):
    case = random_case(77, ps=ps, gap=0.05, m=200)
    plain = run_kernel(case)
    end = case["requests"][-1]["arrival"]
    NL = 3 * case["nodes"] + case["targets"] + 1
    late = {**case, "congest": [(s, end + 1e6, end + 2e6, 0.1) for s in range(NL)]}
    for a, b in ((plain.ttft, run_kernel(late).ttft), (plain.sf[:, :Q.SF_CW0], run_kernel(late).sf[:, :Q.SF_CW0])):
        np.testing.assert_array_equal(a, b)
    full_share = {**case, "congest": [(s, 0.0, end + 1e6, 1.0) for s in range(NL)]}
    np.testing.assert_array_equal(plain.ttft, run_kernel(full_share).ttft)
    slow = {**case, "congest": [(0, 0.0, end, 0.05)]}
    assert np.nansum(run_kernel(slow).ttft) > np.nansum(plain.ttft)


@pytest.mark.parametrize("ps", [False, True])
def test_a_window_over_the_whole_run_is_the_slower_link(ps):
    """Theory: a link at x of its rate for the whole run is a link with 1/x its inverse rate."""
    case = random_case(78, ps=ps, gap=0.1, m=120)
    x = 0.25
    NL = 3 * case["nodes"] + case["targets"] + 1
    slow_rate = case["inv_rate"].copy()
    slow_rate[:NL] = slow_rate[:NL] / x
    slow_io = case["inv_iops"].copy()
    slow_io[:NL] = slow_io[:NL] / x
    windowed = run_kernel({**case, "congest": [(s, 0.0, math.inf, x) for s in range(NL)]})
    slower = run_kernel({**case, "inv_rate": slow_rate, "inv_iops": slow_io})
    np.testing.assert_allclose(windowed.ttft, slower.ttft, rtol=1e-9, atol=1e-12, equal_nan=True)
    np.testing.assert_array_equal(windowed.branches, slower.branches)


def test_one_job_through_a_window_by_hand():
    """A FCFS job of 10 s of work from t = 0 on a link at half rate over [4, 8): 4 s, then
    4 s giving 2 s of work, then 4 s: it ends at 12."""
    sim = Q.QueueSim(1, 1, 1, np.zeros(5), np.zeros(5), np.zeros(Q.N_FP), ps=False, uplink=False, n_measured=0)
    sim.congest(0, 4.0, 8.0, 0.5)
    assert Q.finish_at(sim.sf, 0, 0.0, 10.0) == 12.0
    assert Q.finish_at(sim.sf, 0, 5.0, 1.0) == 7.0
    assert Q.finish_at(sim.sf, 0, 9.0, 1.0) == 10.0
    assert Q.served(sim.sf, 0, 0.0, 12.0) == 10.0
    sim.congest(0, 4.0, 8.0, 0.0)  # stopped in the window
    assert Q.finish_at(sim.sf, 0, 3.0, 2.0) == 9.0


# --------------------------------------------------------------------------- transfers
def with_transfers(case, seed: int, n: int = 40):
    """The case with ``n`` background transfers (local SSD and per-target bytes, some
    at a request's arrival time) merged in arrival order."""
    rng = np.random.default_rng(seed)
    T, N = case["targets"], case["nodes"]
    reqs = case["requests"]
    end = reqs[-1]["arrival"] if reqs else 1.0
    times = np.sort(np.concatenate([rng.uniform(0, end, n - n // 4),
                                    rng.choice([r["arrival"] for r in reqs], n // 4)]))
    rows = []
    for t in times:
        bft = np.where(rng.random(T) < 0.4, 0.0, rng.uniform(0, 80, T))
        rows.append(dict(arrival=float(t), node=int(rng.integers(0, N)), index=-1, transfer=True, bd=0.0,
                         bl=0.0 if rng.random() < 0.5 else float(rng.uniform(0, 80)), bf=float(bft.sum()),
                         bft=bft.tolist(), rft=np.where(bft > 0, rng.integers(1, 6, T), 0).astype(float).tolist(),
                         s_rest=0.0, k_rest=0.0, s_fl=0.0, k_fl=0.0, wl=0.0, wf=0.0))
    merged = sorted(reqs + rows, key=lambda r: (r["arrival"], not r.get("transfer")))  # a transfer first at a tie
    return {**case, "requests": merged}


@pytest.mark.parametrize("seed", range(40))
def test_transfers_kernel_equals_twin(seed):
    case = with_transfers(random_case(7000 + seed, gap=float(np.random.default_rng(seed).choice([0.05, 0.25]))),
                          seed)
    if seed % 4 == 0:
        case = with_congestion(case, seed)
    compare(run_kernel(case, cuts=(17, 60)), run_twin(case), exact=not case["ps"])


@pytest.mark.parametrize("ps", [False, True])
def test_transfers_load_the_links_and_only_the_links(ps):
    """Transfers of no bytes change nothing; transfers of bytes add exactly their work to
    the stations' busy time (FCFS, nothing overlapping the window's ends) and slow the
    requests down, and are no request: same branches counted, same TTFT count."""
    case = random_case(91, ps=ps, gap=0.05, m=150, route=0.0)
    plain = run_kernel(case)
    empty = with_transfers(case, 3)
    for r in empty["requests"]:
        if r.get("transfer"):
            r.update(bl=0.0, bf=0.0, bft=[0.0] * case["targets"], rft=[0.0] * case["targets"])
    got = run_kernel(empty)
    np.testing.assert_array_equal(plain.ttft, got.ttft)
    np.testing.assert_array_equal(plain.sf, got.sf)
    loaded = run_kernel(with_transfers(case, 3, n=300))
    assert np.nansum(loaded.ttft) > np.nansum(plain.ttft)
    assert int(loaded.cnt[Q.C_DONE]) == int(plain.cnt[Q.C_DONE])
    assert loaded.branches.sum() == plain.branches.sum()
    assert loaded.sf[:, Q.SF_JOBS].sum() > plain.sf[:, Q.SF_JOBS].sum()


def test_one_transfer_ahead_of_a_request_by_hand():
    """FCFS, one node, one target, links of 0.01 s/byte: a transfer of 100 bytes from the
    flash at t = 0 holds the target, the NIC for 1 s; a request at 0.5 s restoring 10
    flash bytes (host link, target, NIC each 0.1 s) starts on the target and the NIC at
    1 s: restore ends at 1.1 s, no GPU work, TTFT 0.6 s (0.1 s without the transfer)."""
    inv = np.array([0.01, 0.01, 0.01, 0.01, 0.0])  # host, NIC, local SSD, target, uplink
    fp = np.zeros(Q.N_FP)
    fp[Q.FP_MAX_WAIT], fp[Q.FP_W1] = 1e9, 10.0
    def run(with_transfer):
        sim = Q.QueueSim(1, 1, 1, inv, np.zeros(5), fp, ps=False, uplink=False, n_measured=1)
        a = [0.0, 0.5] if with_transfer else [0.5]
        k = len(a)
        bf = [100.0, 10.0] if with_transfer else [10.0]
        sim.feed(np.array(a), np.zeros(k, np.int64), np.array([-1, 0] if with_transfer else [0]), np.zeros(k),
                 np.zeros(k), np.array(bf), np.array(bf).reshape(k, 1), np.ones((k, 1)), np.zeros(k), np.zeros(k),
                 np.full(k, 10.0), np.zeros(k), np.zeros(k), np.zeros(k), final=True,
                 transfer=np.array([True, False]) if with_transfer else None)
        return sim
    assert run(False).ttft[0] == pytest.approx(0.1, abs=1e-12)
    assert run(True).ttft[0] == pytest.approx(0.6, abs=1e-12)
    assert run(True).branches[Q.B_RESTORE] == 1
