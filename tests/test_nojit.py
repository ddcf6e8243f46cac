"""Every kernel once without the JIT (NUMBA_DISABLE_JIT=1), compared with the JIT run.

Coverage tools only see a kernel's body when it runs as Python, and a difference
between the two modes (an integer overflow that Python would not have, a typing
surprise) shows up here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys
import numpy as np
from kvtrace.ingest import load_trace
from kvtrace.analyses.curves import compute_curve
from kvtrace.analyses.distances import reuse_distances
from kvtrace.analyses.stats import trace_stats
tr = load_trace(sys.argv[1])
out = {}
for ev in ("prefix-aware", "flat"):
    d = reuse_distances(tr, ev, details=True)
    r = compute_curve(tr, eviction=ev, points=40, distances=d)
    out[ev] = {
        "dist": d.dist.tolist(), "usable": d.usable.tolist(), "blocks": d.dist_blocks.tolist(),
        "prev": d.prev_request.tolist(), "curve": r.curve.to_dicts(), "knees": r.knees.to_dicts(),
    }
out["sampled"] = compute_curve(tr, sample_rate=0.5, points=20).curve.to_dicts()
from kvtrace.analyses.value import future_reuse
from kvtrace.analyses.whatif import TierConfig, simulate
fr = future_reuse(tr)
out["value"] = fr.value_usd.tolist()
for policy in ("all", "tinylfu", "value>=0"):
    cfg = TierConfig("2GiB", flash_bytes="8GiB", policy=policy, promotion="copy", inclusive=True)
    w = simulate(tr, cfg, values=fr)
    out["whatif " + policy] = [w.summary, w.residency.to_dicts(), w.requests.to_dicts()]
out["block"] = tr.accesses.block.tolist()
out["stats"] = trace_stats(tr).summary
print(json.dumps(out))
"""


def _run(trace: Path, disable_jit: bool) -> dict:
    env = dict(os.environ, NUMBA_DISABLE_JIT="1" if disable_jit else "0", KVTRACE_NUMBA_CACHE="0")
    res = subprocess.run([sys.executable, "-c", SCRIPT, str(trace)], capture_output=True, text=True, env=env,
                         timeout=600, check=False)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def test_kernels_agree_with_and_without_jit(tmp_path):
    # a small trace with tenants, partial blocks and repeats (first 200 requests of a sample)
    import polars as pl

    from kvtrace.ingest import write_canonical
    from kvtrace.ingest.tabular import read_canonical

    df, meta = read_canonical(str(ROOT / "sample_traces" / "mixed.parquet"))
    small = tmp_path / "small.parquet"
    write_canonical(df.head(200).with_columns(pl.col("timestamp")), meta, small)
    jit = _run(small, disable_jit=False)
    nojit = _run(small, disable_jit=True)
    assert len(jit["block"]) > 1000  # the case is big enough to exercise the kernels
    assert nojit == jit
