"""kvtrace's flat model against libCacheSim's LRU: integer hit counts must be equal.

kvtrace's ``flat`` eviction model is a sequential byte-LRU over the chain-order block
stream (DESIGN §2): access t hits at capacity C iff ``dist[t] <= C``. libCacheSim's
``LRU`` fed the same stream, with each block's bytes as its object size, is an
independent implementation of the same cache, so at every capacity the number of hits
and the bytes hit must match exactly — through ``dist <= C`` directly and through
:func:`kvtrace.analyses.curves.compute_curve`'s ``block_hit_rate`` / ``byte_hit_rate``.

Every capacity tested is at least the largest object: libCacheSim bypasses an object
larger than the cache (not admitted, nothing evicted) while kvtrace's stack model
passes it through the recency stack, pushing the others down. Both are exact LRUs
for C >= max size; below it they model different caches
(:func:`test_documented_divergence_below_max_size` pins the difference).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

lcs = pytest.importorskip("libcachesim")

from libcachesim_ref import HitCounts, lru_hit_counts, lru_hit_counts_many  # noqa: E402

from kvtrace.analyses.curves import compute_curve  # noqa: E402
from kvtrace.analyses.distances import reuse_distances  # noqa: E402
from kvtrace.ingest import load_trace  # noqa: E402
from kvtrace.kernels.stackdist import COLD  # noqa: E402
from kvtrace.model import resolve_model  # noqa: E402
from kvtrace.trace import REQUEST_SCHEMA, Accesses, Trace, TraceMeta  # noqa: E402

TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
MOONCAKE = TRACES / "mooncake_conversation.jsonl"
MODELS = ["Llama-3.1-70B", "DeepSeek-V3"]  # 327,680 and 70,272 (not a power of two) B/token
ROUND_BLOCKS = [128, 512, 2048, 8192, 32768, 65536, 131072, 182790]
ODD_BYTES = [777_777_777_777, 100_000_012_345]  # multiples of neither the token nor the block bytes


# --------------------------------------------------------------------------- helpers


def make_trace(requests: list[list[int]], size_tokens: list[int], block_tokens: int = 512) -> Trace:
    """A kvtrace Trace from requests (lists of dense block ids) and block sizes (tokens)."""
    size = np.asarray(size_tokens, dtype=np.int64)
    lengths = np.array([len(r) for r in requests], dtype=np.int64)
    req_start = np.zeros(len(requests) + 1, dtype=np.int64)
    np.cumsum(lengths, out=req_start[1:])
    block = np.array([b for r in requests for b in r], dtype=np.int64).reshape(-1)
    pos = np.concatenate([np.arange(n) for n in lengths]).astype(np.int32) if block.size else np.zeros(0, np.int32)
    tokens = size[block].astype(np.int32)
    token_count = np.zeros(len(requests), dtype=np.int64)
    np.add.at(token_count, np.repeat(np.arange(len(requests)), lengths), tokens)
    n = len(requests)
    table = pl.DataFrame(
        {
            "request_id": np.arange(n, dtype=np.int64),
            "timestamp": np.arange(n, dtype=np.float64),
            "session_id": [None] * n,
            "parent_id": [None] * n,
            "turn": [None] * n,
            "type": [None] * n,
            "tenant": [None] * n,
            "input_tokens": token_count,
            "output_tokens": np.zeros(n, dtype=np.int64),
            "block_ids": [[int(b) for b in r] for r in requests],
        },
        schema=REQUEST_SCHEMA,
    )
    accesses = Accesses(np.repeat(np.arange(n, dtype=np.int64), lengths), pos, block, tokens, req_start)
    return Trace(table, accesses, np.arange(size.shape[0], dtype=np.uint64),
                 np.full(size.shape[0], -1, dtype=np.int32), size, TraceMeta(block_tokens, "canonical"))


def stream_of(trace: Trace, kv_bytes_per_token: int) -> tuple[np.ndarray, np.ndarray]:
    """The chain-order block stream libCacheSim sees: object ids and sizes in bytes."""
    block = trace.accesses.block
    return block, trace.block_size[block] * kv_bytes_per_token


def kvtrace_counts(dist: np.ndarray, size_bytes: np.ndarray, capacity_bytes: int, bpt: int) -> HitCounts:
    """Hit counts from kvtrace's distances: hit iff dist (tokens) x bytes/token <= C."""
    hit = dist <= capacity_bytes // bpt  # dist*bpt <= C  <=>  dist <= floor(C / bpt)
    assert not np.any(hit & (dist == COLD))
    return HitCounts(int(hit.sum()), int(size_bytes[hit].sum()), int(dist.shape[0]), int(size_bytes.sum()))


def boundary_capacities(dist: np.ndarray, bpt: int, floor_bytes: int, quantiles=(0.25, 0.5, 0.9)) -> list[int]:
    """C = d*bpt and C = d*bpt - 1 for observed warm distances d: the `<=` edge."""
    warm = np.sort(dist[dist != COLD])
    caps = []
    for q in quantiles:
        d = int(warm[int(q * (warm.shape[0] - 1))])
        assert np.count_nonzero(dist == d) > 0
        if d * bpt - 1 >= floor_bytes:
            caps += [d * bpt, d * bpt - 1]
    return caps


def assert_curve_matches(trace: Trace, model: str, capacities: list[int], want: list[HitCounts], dist) -> None:
    """compute_curve's any-block rates equal libCacheSim's ratios exactly (float ==)."""
    res = compute_curve(trace, model=model, eviction="flat", capacities=capacities, distances=dist)
    curve = res.curve
    assert curve["capacity_bytes"].to_list() == list(capacities)
    assert res.info["measured_accesses"] == want[0].n_req
    for row, w, c in zip(curve.iter_rows(named=True), want, capacities):
        # Integer sums below 2**53 are exact in float64 and both sides are one correctly
        # rounded division of the same rational, so equality is bit for bit.
        assert row["block_hit_rate"] == w.n_hits / w.n_req, (c, row["block_hit_rate"], w)
        assert row["byte_hit_rate"] == w.bytes_hit / w.bytes_req, (c, row["byte_hit_rate"], w)


# --------------------------------------------------------------------------- real trace


@pytest.fixture(scope="module")
def mooncake():
    if not MOONCAKE.is_file():
        pytest.skip(f"shared trace not present: {MOONCAKE}")
    trace = load_trace(MOONCAKE)
    return trace, reuse_distances(trace, "flat")


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_mooncake_flat_equals_libcachesim(mooncake, model):
    trace, d = mooncake
    bpt = int(resolve_model(model).kv_bytes_per_token)
    B = int(trace.meta.block_tokens)
    block, size_bytes = stream_of(trace, bpt)
    max_size = int(size_bytes.max())
    assert max_size == B * bpt  # the trace has full 512-token blocks (and partial last ones)
    assert np.unique(size_bytes).shape[0] > 100  # ... so object sizes really vary

    capacities = [n * B * bpt for n in ROUND_BLOCKS] + ODD_BYTES
    capacities += boundary_capacities(d.dist, bpt, max_size)
    capacities += [max_size]  # the smallest capacity where both models are the same cache
    assert len(capacities) >= 14 and min(capacities) >= max_size

    got = [kvtrace_counts(d.dist, size_bytes, c, bpt) for c in capacities]
    want = lru_hit_counts_many(block, size_bytes, capacities)
    for c, g, w in zip(capacities, got, want):
        assert g == w, f"capacity {c} B: kvtrace {g} vs libCacheSim {w}"
    assert_curve_matches(trace, model, capacities, want, d)

    # The boundary pairs (C = d*bpt, C - 1) straddle real distances: hits must differ.
    pairs = capacities[len(ROUND_BLOCKS) + len(ODD_BYTES):-1]
    for hi, lo in zip(pairs[::2], pairs[1::2]):
        assert want[capacities.index(hi)].n_hits > want[capacities.index(lo)].n_hits
    # Sanity: hit ratios grow with capacity and the largest cache holds everything.
    full = kvtrace_counts(d.dist, size_bytes, 182790 * B * bpt, bpt)
    assert full.n_hits == int(np.count_nonzero(d.dist != COLD))


@pytest.mark.slow
def test_mooncake_ratio_recovery_matches_python_loop(mooncake):
    """process_trace returns doubles; the recovered integers equal a cache.get loop's."""
    trace, _ = mooncake
    bpt = int(resolve_model("Llama-3.1-70B").kv_bytes_per_token)
    block, size_bytes = stream_of(trace, bpt)
    c = 1000 * 512 * bpt + 4242
    assert lru_hit_counts(block, size_bytes, c, method="trace") == lru_hit_counts(block, size_bytes, c, method="loop")


# --------------------------------------------------------------------------- random traces


def random_trace(seed: int, n_blocks: int = 300, n_requests: int = 600) -> Trace:
    """Skewed reuse, requests of 1-12 blocks, object sizes 1-512 tokens."""
    rng = np.random.default_rng(seed)
    popularity = rng.zipf(1.3, size=n_blocks).astype(np.float64)
    popularity /= popularity.sum()
    raw = [list(rng.choice(n_blocks, size=int(rng.integers(1, 13)), p=popularity)) for _ in range(n_requests)]
    ids: dict[int, int] = {}
    requests = [[ids.setdefault(int(b), len(ids)) for b in r] for r in raw]
    size = rng.integers(1, 513, size=len(ids))
    return make_trace(requests, size.tolist())


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("model", MODELS)
def test_random_variable_sizes_equal_libcachesim(seed, model):
    trace = random_trace(seed)
    bpt = int(resolve_model(model).kv_bytes_per_token)
    d = reuse_distances(trace, "flat")
    block, size_bytes = stream_of(trace, bpt)
    max_size = int(size_bytes.max())
    total = int(trace.block_size.sum()) * bpt
    # Every capacity >= the largest object (see the module docstring).
    capacities = sorted({max_size, max_size + 1, max_size + bpt - 1, total, total - 1, total + 12345,
                         *[int(x) for x in np.geomspace(max_size, total, 12)]})
    capacities += boundary_capacities(d.dist, bpt, max_size, quantiles=(0.1, 0.3, 0.5, 0.7, 0.9))
    got = [kvtrace_counts(d.dist, size_bytes, c, bpt) for c in capacities]
    want = lru_hit_counts_many(block, size_bytes, capacities)
    for c, g, w in zip(capacities, got, want):
        assert g == w, f"seed {seed}, capacity {c} B: kvtrace {g} vs libCacheSim {w}"
    assert_curve_matches(trace, model, capacities, want, d)


def test_random_trace_and_loop_agree():
    """The file + process_trace path and a plain cache.get loop give the same counts."""
    trace = random_trace(7)
    block, size_bytes = stream_of(trace, 131072)
    caps = [int(size_bytes.max()), 3 * int(size_bytes.max()) + 7, int(size_bytes.sum())]
    assert lru_hit_counts_many(block, size_bytes, caps) == lru_hit_counts_many(block, size_bytes, caps, method="loop")


def test_exact_fill_hits():
    """Objects filling the cache to exactly C bytes all stay: the `<=` in `dist <= C`."""
    trace = make_trace([[0, 1, 2], [0, 1, 2]], [3, 5, 2])  # 10 tokens in all
    d = reuse_distances(trace, "flat").dist
    block, size_bytes = stream_of(trace, 1)
    assert d.tolist() == [COLD, COLD, COLD, 10, 10, 10]
    assert lru_hit_counts(block, size_bytes, 10) == (3, 10, 6, 20) == kvtrace_counts(d, size_bytes, 10, 1).as_tuple()
    assert lru_hit_counts(block, size_bytes, 9)[0] == 0 == kvtrace_counts(d, size_bytes, 9, 1).n_hits


def test_documented_divergence_below_max_size():
    """Below the largest object size the two models differ, as documented.

    Stream A(1) B(3) A(1) at C = 2: libCacheSim never admits B (3 > 2) and keeps A,
    so the second A hits; kvtrace pushes B through the stack (A's distance 1 + 3 = 4
    > 2), so it misses. From C = 3 (every object fits) they agree again.
    """
    trace = make_trace([[0, 1, 0]], [1, 3])
    d = reuse_distances(trace, "flat").dist
    block, size_bytes = stream_of(trace, 1)
    assert d.tolist() == [COLD, COLD, 4]
    assert lru_hit_counts(block, size_bytes, 2)[0] == 1
    assert kvtrace_counts(d, size_bytes, 2, 1).n_hits == 0
    for c in (3, 4, 5):
        assert lru_hit_counts(block, size_bytes, c) == kvtrace_counts(d, size_bytes, c, 1).as_tuple()


def test_reference_rejects_unfaithful_streams(tmp_path):
    from libcachesim_ref import write_oracle_general

    with pytest.raises(ValueError, match="one size"):
        write_oracle_general(tmp_path / "x", np.array([0, 0]), np.array([1, 2]))
    with pytest.raises(ValueError, match="2\\*\\*32"):
        write_oracle_general(tmp_path / "x", np.array([0]), np.array([2**32]))
    with pytest.raises(ValueError, match="2\\*\\*32"):
        write_oracle_general(tmp_path / "x", np.array([0]), np.array([0]))
    n = write_oracle_general(tmp_path / "ok", np.array([5, 6, 5]), np.array([7, 8, 7]))
    raw = np.fromfile(tmp_path / "ok", dtype=np.uint8)
    assert n == 3 and raw.shape[0] == 3 * 24
    reader = lcs.TraceReader(str(tmp_path / "ok"), lcs.TraceType.ORACLE_GENERAL_TRACE)
    reqs = [reader.read_one_req() for _ in range(3)]
    assert [(r.obj_id, r.obj_size, r.clock_time) for r in reqs] == [(5, 7, 0), (6, 8, 0), (5, 7, 0)]
    assert reqs[0].next_access_vtime == 2
