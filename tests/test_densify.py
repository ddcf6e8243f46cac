"""Dense block ids (kernels/densify.py) vs a dict twin (DESIGN §1: ids 0..M-1 in order
of first appearance; a block's size is the max tokens over its accesses).

The twin lives here rather than in tests/naive.py (owned elsewhere); it has the
kernel's name, as STYLE asks of every twin.
"""

from __future__ import annotations

import numpy as np
import numpy.testing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvtrace.kernels.densify as kd

U64_MAX = 2**64 - 1
BIG = 2**63


def densify(hashes, ns, tokens):
    """Slow twin: a dict from (hash, namespace) to the next free id.

    Returns (ids, block_hash, block_ns, block_size) as Python lists.
    """
    ids: dict[tuple[int, int], int] = {}
    out, block_hash, block_ns, block_size = [], [], [], []
    for h, k, t in zip(hashes, ns, tokens):
        key = (int(h), int(k))
        if key not in ids:
            ids[key] = len(block_hash)
            block_hash.append(int(h))
            block_ns.append(int(k))
            block_size.append(int(t))
        i = ids[key]
        block_size[i] = max(block_size[i], int(t))
        out.append(i)
    return out, block_hash, block_ns, block_size


def arrays(hashes, ns, tokens):
    return (np.array(hashes, dtype=np.uint64), np.array(ns, dtype=np.int32), np.array(tokens, dtype=np.int32))


def assert_matches_twin(h, ns, tok, ids, state) -> None:
    e_ids, e_hash, e_ns, e_size = densify(h.tolist(), ns.tolist(), tok.tolist())
    assert ids.dtype == np.int64
    npt.assert_array_equal(ids, np.array(e_ids, dtype=np.int64))
    bh, bn, bs = state.arrays()
    assert state.n_blocks == len(e_hash)
    assert bh.dtype == np.uint64 and bn.dtype == np.int32 and bs.dtype == np.int64
    assert [int(x) for x in bh] == e_hash  # exact, also for hashes >= 2^63
    assert bn.tolist() == e_ns
    assert bs.tolist() == e_size


def test_twin_on_a_hand_case():
    h = [5, 7, 5, U64_MAX, 7, 5, BIG + 5]
    ns = [-1, -1, 0, -1, -1, -1, -1]
    tok = [3, 4, 9, 1, 2, 8, 6]
    ids, bh, bn, bs = densify(h, ns, tok)
    assert ids == [0, 1, 2, 3, 1, 0, 4]
    assert bh == [5, 7, 5, U64_MAX, BIG + 5]
    assert bn == [-1, -1, 0, -1, -1]
    assert bs == [8, 4, 9, 1, 6]
    k_ids, state = kd.densify(*arrays(h, ns, tok))
    assert k_ids.tolist() == ids
    assert_matches_twin(*arrays(h, ns, tok), k_ids, state)


@pytest.mark.parametrize(
    "h, ns, tok",
    [
        ([], [], []),  # empty
        ([42], [-1], [7]),  # one block
        ([U64_MAX] * 5, [-1] * 5, [1, 512, 3, 512, 2]),  # all hot, one giant block
        (list(range(50)), [-1] * 50, [16] * 50),  # all cold
        ([0, 0, 0, 0], [-1, 0, 1, 2**31 - 1], [1, 2, 3, 4]),  # one hash, four namespaces
        ([1, 1 + BIG, 1, 1 + BIG], [-1, -1, 0, 0], [5, 6, 7, 8]),  # differ only in the top bit
    ],
)
def test_degenerate(h, ns, tok):
    a = arrays(h, ns, tok)
    ids, state = kd.densify(*a)
    assert_matches_twin(*a, ids, state)


hash_values = st.one_of(
    st.integers(0, 30),
    st.integers(BIG, BIG + 30),
    st.integers(U64_MAX - 30, U64_MAX),
    st.integers(0, U64_MAX),
)
namespaces = st.sampled_from([-1, 0, 1, 7, 2**31 - 1])


@st.composite
def streams(draw, max_size=300):
    n = draw(st.integers(0, max_size))
    h = draw(st.lists(hash_values, min_size=n, max_size=n))
    ns = draw(st.lists(namespaces, min_size=n, max_size=n))
    tok = draw(st.lists(st.integers(1, 512), min_size=n, max_size=n))
    return arrays(h, ns, tok)


@settings(max_examples=150, deadline=None)
@given(stream=streams(), chunk=st.sampled_from([1, 2, 3, 7, 64, 1 << 21]))
def test_random_vs_twin(stream, chunk):
    ids, state = kd.densify(*stream, chunk=chunk)
    assert_matches_twin(*stream, ids, state)


@settings(max_examples=100, deadline=None)
@given(stream=streams(), data=st.data(), chunk=st.sampled_from([1, 5, 1 << 21]))
def test_streaming_equals_one_call(stream, data, chunk):
    h, ns, tok = stream
    n = h.shape[0]
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
    bounds = [0, *cuts, n]
    state = None
    parts = []
    for lo, hi in zip(bounds, bounds[1:]):
        ids, state = kd.densify(h[lo:hi], ns[lo:hi], tok[lo:hi], state=state, chunk=chunk)
        parts.append(ids)
    streamed = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    whole, whole_state = kd.densify(h, ns, tok)
    npt.assert_array_equal(streamed, whole)
    for x, y in zip(state.arrays(), whole_state.arrays()):
        npt.assert_array_equal(x, y)
    assert_matches_twin(h, ns, tok, streamed, state)


def test_growth_and_rehash_across_chunks():
    rng = np.random.default_rng(7)
    m = 60_000  # > 0.6 x 2^16 keys: the table must rehash at least once
    keys = rng.integers(0, 2**64, size=m, dtype=np.uint64, endpoint=False)
    keys[: m // 4] |= np.uint64(BIG)  # plenty of hashes >= 2^63
    key_ns = rng.choice(np.array([-1, 0, 3], dtype=np.int32), size=m)
    pick = np.concatenate([np.arange(m), rng.integers(0, m, size=40_000)])  # every key, then repeats
    rng.shuffle(pick)
    h, ns = keys[pick], key_ns[pick]
    tok = rng.integers(1, 513, size=pick.size).astype(np.int32)

    state = kd.DensifyState(1)
    initial = state.slot_id.shape[0]
    assert initial < m and state.block_hash.shape[0] == 1024
    ids, state = kd.densify(h, ns, tok, state=state, chunk=4096)
    assert state.slot_id.shape[0] > initial  # rehashed
    assert state.block_hash.shape[0] >= state.n_blocks > 1024  # grew
    assert_matches_twin(h, ns, tok, ids, state)
    one, _ = kd.densify(h, ns, tok)  # one chunk, table sized up front
    npt.assert_array_equal(ids, one)


def _mix_np(h: np.ndarray, ns: int) -> np.ndarray:
    """The kernel's slot hash, vectorised, only to build colliding keys."""
    with np.errstate(over="ignore"):
        x = h ^ (np.uint64(ns + 1) * np.uint64(0x9E3779B97F4A7C15))
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


TABLE = kd.DensifyState(1).slot_id.shape[0]  # initial table size the crowding below targets


def test_long_probe_chains_stay_exact():
    # Many keys on the same home slot (and its neighbours): linear probing must
    # still compare keys exactly and never merge two of them.
    rng = np.random.default_rng(3)
    cand = rng.integers(0, 2**64, size=2_000_000, dtype=np.uint64, endpoint=False)
    slot = _mix_np(cand, -1) & np.uint64(TABLE - 1)
    counts = np.bincount(slot.astype(np.int64), minlength=TABLE)
    hot = np.argsort(counts)[-3:]  # the three most crowded slots
    keys = cand[np.isin(slot, hot.astype(np.uint64))][: TABLE // 16]  # stay below the load limit
    assert keys.size >= 60
    seq = np.concatenate([keys, keys[::-1], keys[::3]])
    h = np.concatenate([seq, seq])
    ns = np.concatenate([np.full(seq.size, -1, np.int32), np.full(seq.size, 5, np.int32)])
    tok = rng.integers(1, 513, size=h.size).astype(np.int32)
    state = kd.DensifyState(1)
    ids, state = kd.densify(h, ns, tok, state=state)
    assert state.slot_id.shape[0] == TABLE  # the crowding above was computed for this size
    assert state.n_blocks == 2 * keys.size
    assert_matches_twin(h, ns, tok, ids, state)


def test_same_hash_other_namespace_on_the_same_slot():
    # (h, -1) and (h, 0) whose home slots coincide: only the namespace tells them apart.
    rng = np.random.default_rng(11)
    cand = rng.integers(0, 2**64, size=2_000_000, dtype=np.uint64, endpoint=False)
    mask = np.uint64(TABLE - 1)
    same = cand[(_mix_np(cand, -1) & mask) == (_mix_np(cand, 0) & mask)]
    assert same.size >= 5
    h = np.repeat(same, 3)
    ns = np.tile(np.array([-1, 0, -1], dtype=np.int32), same.size)
    tok = np.tile(np.array([4, 9, 2], dtype=np.int32), same.size)
    ids, state = kd.densify(h, ns, tok, state=kd.DensifyState(1))
    assert state.slot_id.shape[0] == TABLE
    assert ids.tolist() == [i for k in range(same.size) for i in (2 * k, 2 * k + 1, 2 * k)]
    assert_matches_twin(h, ns, tok, ids, state)


def test_direct_path_for_small_counters_and_streaming_after_it():
    """Small non-negative hashes take the direct-indexed path; a later chunk continues
    through the hash table built from its state. Both equal the dict twin."""
    rng = np.random.default_rng(11)
    h = rng.integers(0, 5_000, size=20_000).astype(np.uint64)
    ns = np.full(h.size, -1, dtype=np.int32)
    tok = rng.integers(1, 513, size=h.size).astype(np.int32)
    ids, state = kd.densify(h, ns, tok)
    assert state.slot_id is None  # direct path: no table built
    assert_matches_twin(h, ns, tok, ids, state)
    h2 = np.concatenate([h[:3000], rng.integers(0, 2**64, size=3000, dtype=np.uint64)])
    ns2 = np.full(h2.size, -1, dtype=np.int32)
    tok2 = rng.integers(1, 513, size=h2.size).astype(np.int32)
    ids2, state = kd.densify(h2, ns2, tok2, state=state)
    all_h, all_ns, all_tok = np.concatenate([h, h2]), np.concatenate([ns, ns2]), np.concatenate([tok, tok2])
    assert_matches_twin(all_h, all_ns, all_tok, np.concatenate([ids, ids2]), state)
    big = h.copy()
    big[0] = np.uint64(2**63)  # too large to index directly: the hash-table path
    ids3, state3 = kd.densify(big, ns, tok)
    assert state3.slot_id is not None
    assert_matches_twin(big, ns, tok, ids3, state3)
