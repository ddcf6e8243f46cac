"""Distributed runs (kvtrace.analyses.distributed): partitioned curves and what-if sweeps.

Without Dask, the same tasks run in this process (``SerialClient``): one partition is
the exact curve, P partitions stay within the documented error bound of it. With
``dask[distributed]`` installed (the ``dask`` extra; ``dev`` includes it), a
``LocalCluster`` of 2 worker processes must give the serial results exactly, and a
what-if sweep with one configuration per task must equal a one-process sweep.
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from numpy.testing import assert_array_equal
from polars.testing import assert_frame_equal
from typer.testing import CliRunner

from kvtrace.ingest import synth
from kvtrace.cli import app
from kvtrace.analyses.curves import HEADLINE, RATE_COLUMNS, compute_curve
from kvtrace.analyses.distributed import SerialClient, error_band, partitioned_curve
from kvtrace.analyses.distributed import sweep as dask_sweep
from kvtrace.errors import UsageError
from kvtrace.ingest import load_trace
from kvtrace.kernels.densify import mix_hash
from kvtrace.kernels.partition import partition_of
from kvtrace.analyses.whatif import TierConfig, sweep

try:
    import distributed  # noqa: F401

    HAVE_DASK = True
except ImportError:  # the dask extra is optional; `pip install -e '.[dev]'` brings it
    HAVE_DASK = False
needs_dask = pytest.mark.skipif(not HAVE_DASK, reason="dask[distributed] is not installed (pip install 'kvtrace[dask]')")
BOUND = f"{HEADLINE}_bound"


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    path = tmp_path_factory.mktemp("dist") / "chat.parquet"
    synth.write_chunked("chat", 3_000, 11, path, "parquet", chunk_requests=500)
    return path


@pytest.fixture(scope="module")
def exact(chat):
    return compute_curve(load_trace(chat), points=120)


@pytest.fixture(scope="module")
def cluster():
    if not HAVE_DASK:
        pytest.skip("dask[distributed] is not installed")
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cl:
        with Client(cl) as client:
            yield client


def test_partition_zero_is_the_shards_sample():
    rng = np.random.default_rng(0)
    h = rng.integers(0, 2**63, size=20_000, dtype=np.int64).astype(np.uint64)
    ns = rng.integers(-1, 3, size=h.shape[0]).astype(np.int32)
    for P in (1, 2, 3, 8):
        part = partition_of(h, ns, P)
        assert part.min() >= 0 and part.max() < P
        u = np.array([int(mix_hash(a, b)) >> 40 for a, b in zip(h[:2000], ns[:2000])])
        assert_array_equal(part[:2000], (u * P) >> 24)
        assert_array_equal(part[:2000] == 0, u < (1 << 24) / P)  # SHARDS keeps u < R 2^24
        shares = np.bincount(part, minlength=P) / part.shape[0]
        assert np.all(np.abs(shares - 1 / P) < 0.02)


def test_one_partition_is_the_exact_curve(chat, exact):
    r = partitioned_curve(chat, client=SerialClient(), partitions=1, points=120)
    half = "request_half_prefix_hit_rate"  # needs each request's blocks together: exact runs only
    assert r.curve[half].is_null().all() and r.ceiling[half] is None
    assert_frame_equal(r.curve.drop(BOUND, half), exact.curve.drop(half), check_exact=True)
    assert_frame_equal(r.knees, exact.knees, check_exact=True)
    assert {k: v for k, v in r.ceiling.items() if k != half} == {k: v for k, v in exact.ceiling.items() if k != half}
    assert np.all(r.curve[BOUND].to_numpy() == 0)


@pytest.mark.parametrize("partitions", [2, 4])
def test_partitioned_curve_within_its_bound(chat, exact, partitions):
    r = partitioned_curve(chat, client=SerialClient(), partitions=partitions, points=120)
    info = r.info["partitioned"]
    assert r.info["approximate"] and info["partitions"] == partitions
    assert sum(info["partition_accesses"]) == exact.info["measured_accesses"]
    # exact parts: counts, distinct blocks and bytes, every rate at infinite capacity
    for k in ("measured_accesses", "measured_requests", "distinct_blocks", "distinct_bytes"):
        assert r.info[k] == exact.info[k], k
    for k in RATE_COLUMNS:
        if k == "request_half_prefix_hit_rate":  # needs each request's blocks together: exact runs only
            assert r.ceiling[k] is None and r.curve[k].is_null().all()
            continue
        assert r.ceiling[k] == pytest.approx(exact.ceiling[k], rel=1e-12, abs=1e-15), k
    assert_array_equal(r.curve["capacity_bytes"].to_numpy(), exact.curve["capacity_bytes"].to_numpy())
    err = np.abs(r.curve[HEADLINE].to_numpy() - exact.curve[HEADLINE].to_numpy())
    bound = r.curve[BOUND].to_numpy()
    assert np.all(err <= bound + 1e-12), (err.max(), bound[np.argmax(err - bound)])
    assert info["max_error_bound"] == pytest.approx(bound.max())
    assert err.max() > 0  # an estimate, not a copy of the exact curve


def test_error_band_reads_the_grid_conservatively():
    grid = np.array([10, 20, 40, 80], dtype=np.int64)
    hist = np.zeros((2, 1, 6, 4))
    hist[1, 0, :, 1] = [1, 1, 1, 1, 4, 2]  # bins 0..3, above the grid, cold
    band = error_band(grid, hist, np.array([20, 1000]), n_parts=2, block_tokens=1, sigmas=1.0)
    # C=20, sigma=sqrt(20)=4.47: H(24.5) <= H(40) = 3/10, H(15.5) >= H(10) = 1/10
    assert band[0] == pytest.approx(0.2)
    # C=1000: above the grid the upper end is the ceiling (8/10), the lower one H(80) = 4/10
    assert band[1] == pytest.approx(0.4)
    assert np.all(error_band(grid, hist, np.array([20, 1000]), 1, 1) == 0)


def test_unavailable_options_are_usage_errors(chat):
    for opt in ({"by": "type"}, {"sample_rate": 0.1}):
        with pytest.raises(UsageError):
            partitioned_curve(chat, client=SerialClient(), partitions=2, **opt)


@needs_dask
def test_dask_curve_equals_the_serial_run(chat, cluster):
    serial = partitioned_curve(chat, client=SerialClient(), partitions=2, points=120, warmup="10%")
    got = partitioned_curve(chat, client=cluster, partitions=2, points=120, warmup="10%")
    assert_frame_equal(got.curve, serial.curve, check_exact=True)
    assert_frame_equal(got.knees, serial.knees, check_exact=True)
    assert got.ceiling == serial.ceiling
    assert got.info == serial.info
    default = partitioned_curve(chat, client=cluster, points=120)
    assert default.info["partitioned"]["partitions"] == 2  # one per worker


@needs_dask
def test_dask_sweep_equals_one_process(chat, cluster):
    trace = load_trace(chat)
    configs = [TierConfig(d, flash_bytes=f, policy=p) for d in ("16GiB", "64GiB") for f in ("0", "256GiB")
               for p in ("all", "second-hit", "tinylfu")]
    one = sweep(trace, configs, workers=1, warmup="5%")
    got = dask_sweep(trace, configs, client=cluster, warmup="5%")
    assert_frame_equal(got, one, check_exact=True)


@needs_dask
def test_cli_engine_dask(chat, tmp_path):
    runner = CliRunner()
    js = tmp_path / "c.json"
    res = runner.invoke(app, ["curve", str(chat), "--engine", "dask", "--workers", "2", "--json", str(js),
                              "--capacity", "16GiB,256GiB"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, (res.stdout, res.stderr, res.exception)
    assert "PARTITIONED ESTIMATE" in res.stdout
    info = json.loads(js.read_text())["info"]
    assert info["partitioned"]["partitions"] == 2 and info["approximate"]
    res = runner.invoke(app, ["curve", str(chat), "--engine", "dask", "--by", "type"])
    assert res.exit_code == 2 and "--by" in res.stderr
    out = {}
    for engine in ("local", "dask"):
        o = tmp_path / f"w-{engine}.parquet"
        res = runner.invoke(app, ["whatif", str(chat), "--dram", "16GiB,64GiB", "--flash", "256GiB", "--grid",
                                  "--policy", "all,second-hit", "--engine", engine, "--workers", "2",
                                  "--out", str(o)])
        assert res.exit_code == 0, (res.stdout, res.stderr, res.exception)
        out[engine] = pl.read_parquet(o)
    assert_frame_equal(out["dask"], out["local"], check_exact=True)


NOJIT_SCRIPT = r"""
import json, sys
from kvtrace.analyses.distributed import SerialClient, partitioned_curve
out = {}
for ev in ("prefix-aware", "flat"):
    r = partitioned_curve(sys.argv[1], client=SerialClient(), partitions=3, eviction=ev, points=30)
    out[ev] = [r.curve.to_dicts(), r.knees.to_dicts(), r.info["partitioned"]["partition_accesses"]]
print(json.dumps(out))
"""


def test_partition_kernels_agree_with_and_without_jit(tmp_path):
    import os
    import subprocess
    import sys

    path = tmp_path / "small.parquet"
    synth.write_chunked("mixed", 150, 2, path, "parquet", chunk_requests=50)
    outs = []
    for disable in ("0", "1"):
        env = dict(os.environ, NUMBA_DISABLE_JIT=disable, KVTRACE_NUMBA_CACHE="0")
        res = subprocess.run([sys.executable, "-c", NOJIT_SCRIPT, str(path)], capture_output=True, text=True,
                             env=env, timeout=600, check=False)
        assert res.returncode == 0, res.stderr[-2000:]
        outs.append(json.loads(res.stdout))
    assert outs[0] == outs[1]
