"""Fixture traces and independent expectations for the SQL tests (test_export, test_sql).

The fixture is a small synthetic mixed workload (chat, agent, RAG; types, tenants,
sessions and turns on every request) stretched over about 1.6 hours, so that it has
two hours of traffic and a session that pauses for more than 30 minutes.

Expected values come from the canonical access table (tested by the ingest suite)
and the slow twin of the stack-distance kernel (``tests/naive.py``), never from the
database under test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import naive
from kvtrace.ingest import synth
from kvtrace.ingest import load_trace
from kvtrace.trace import Trace

SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
MOONCAKE = SHARED_TRACES / "mooncake_conversation.jsonl"
GiB = 2**30
TiB = 2**40


def write_fixture(path: Path, requests: int = 400, seed: int = 3) -> Path:
    """A canonical Parquet trace: ``kvtrace synth --kind mixed`` at 0.05 requests/s."""
    df, meta = synth.generate("mixed", requests, seed, rate_per_s=0.05)
    synth.write(df, meta, path, "parquet")
    return path


@dataclass
class Expect:
    """Plain per-access and per-request lists of a trace, with twin distances."""

    request: list
    pos: list
    block: list
    tokens: list
    ts: list  # per access: arrival of its request, s
    dist: list  # tokens, math.inf for cold
    usable: list
    dist_blocks: list
    reuse_time: list  # s, math.inf for a first touch
    req_start: list
    req_ts: list
    req_type: list
    req_tenant: list
    req_session: list
    req_turn: list
    size: list  # per block, tokens
    block_tokens: int

    def accesses_of(self, r: int) -> range:
        return range(self.req_start[r], self.req_start[r + 1])


def expect(trace: Trace, prefix_aware: bool = True) -> Expect:
    a = trace.accesses
    d, db, prev = naive.stack_distances(a.block, trace.block_size, a.req_start, prefix_aware)
    u = naive.usable_distances(d, a.req_start)

    def inf(x):
        return [math.inf if v == naive.COLD else int(v) for v in x]

    req = trace.requests
    req_ts = [float(x) for x in req["timestamp"]]
    request = [int(x) for x in a.request]
    ts = [req_ts[r] for r in request]
    reuse_time = [math.inf if p < 0 else req_ts[r] - req_ts[p] for r, p in zip(request, prev)]
    return Expect(
        request=request, pos=[int(x) for x in a.pos], block=[int(x) for x in a.block],
        tokens=[int(x) for x in a.tokens], ts=ts, dist=inf(d), usable=inf(u), dist_blocks=inf(db),
        reuse_time=reuse_time, req_start=[int(x) for x in a.req_start], req_ts=req_ts,
        req_type=req["type"].to_list(), req_tenant=req["tenant"].to_list(), req_session=req["session_id"].to_list(),
        req_turn=req["turn"].to_list(), size=[int(x) for x in trace.block_size], block_tokens=int(trace.meta.block_tokens),
    )


def percentile(values, p: float):
    """numpy's default (linear) percentile, None for no values."""
    return float(np.percentile(np.array(values, dtype=np.float64), p)) if values else None


def approx_rows(actual, expected, rel: float = 1e-9) -> None:
    """Rows equal, floats within ``rel`` (inf and None compared exactly)."""
    assert len(actual) == len(expected), (len(actual), len(expected), actual[:3], expected[:3])
    for i, (ra, re_) in enumerate(zip(actual, expected)):
        assert len(ra) == len(re_), (i, ra, re_)
        for j, (x, y) in enumerate(zip(ra, re_)):
            if isinstance(y, float) and y is not None and math.isfinite(y) and x is not None:
                assert math.isclose(float(x), y, rel_tol=rel, abs_tol=1e-15), (i, j, x, y, ra, re_)
            else:
                assert x == y, (i, j, x, y, ra, re_)


# Module-scoped fixtures shared by test_export.py and test_sql.py (imported there by name).
@pytest.fixture(scope="module")
def fixture_path(tmp_path_factory) -> Path:
    """The fixture trace on disk (canonical Parquet)."""
    return write_fixture(tmp_path_factory.mktemp("trace") / "mixed.parquet")


@pytest.fixture(scope="module")
def trace(fixture_path):
    return load_trace(fixture_path)


@pytest.fixture(scope="module")
def ex(trace):
    """The expected values, computed independently of kvtrace's SQL."""
    return expect(trace)
