"""Hypothesis strategies for access traces (kernel inputs: plain int64 arrays)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from hypothesis import strategies as st


class Trace(NamedTuple):
    """Kernel input: ``block`` int64[N], ``size`` int64[M] tokens, ``req_start`` int64[R+1]."""

    block: np.ndarray
    size: np.ndarray
    req_start: np.ndarray


class ChainedTrace(NamedTuple):
    """A trace whose requests are root-to-node paths in a trie (block id = trie node).

    ``parent[b]`` is the trie parent of block b (-1 for a root); inside a request,
    block j's parent is block j-1.
    """

    block: np.ndarray
    size: np.ndarray
    req_start: np.ndarray
    parent: np.ndarray


def make_trace(requests: list[list[int]], size: list[int]) -> Trace:
    """Trace from a list of requests (lists of block ids) and block sizes (tokens)."""
    starts = np.cumsum([0] + [len(r) for r in requests]).astype(np.int64)
    block = np.array([b for r in requests for b in r], dtype=np.int64).reshape(-1)
    return Trace(block, np.array(size, dtype=np.int64).reshape(-1), starts)


#: Block sizes in tokens: mostly small (many ties and exact fits), sometimes up to a
#: 512-token block.
block_sizes = st.one_of(st.integers(1, 4), st.integers(1, 512), st.sampled_from([16, 512]))


@st.composite
def _split(draw, n: int, max_requests: int) -> list[int]:
    """Request lengths summing to n (empty requests allowed)."""
    n_req = draw(st.integers(1 if n else 0, max_requests))
    if n_req == 0:
        return []
    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=n_req - 1, max_size=n_req - 1)))
    bounds = [0, *cuts, n]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def _relabel(raw: list[int]) -> list[int]:
    """Dense ids 0..M-1 in order of first appearance (the canonical access table)."""
    ids: dict[int, int] = {}
    return [ids.setdefault(b, len(ids)) for b in raw]


@st.composite
def _assemble(draw, raw: list[int], max_requests: int, sizes) -> Trace:
    block = _relabel(raw)
    m = len(set(block))
    if m and draw(st.booleans()):
        # Ids only need to be dense, not in first-appearance order.
        perm = draw(st.permutations(range(m)))
        block = [perm[b] for b in block]
    lengths = draw(_split(len(block), max_requests))
    size = draw(st.lists(sizes, min_size=m, max_size=m))
    starts = np.cumsum([0, *lengths]).astype(np.int64)
    return Trace(np.array(block, dtype=np.int64).reshape(-1), np.array(size, dtype=np.int64).reshape(-1), starts)


@st.composite
def random_traces(draw, max_blocks: int = 10, max_accesses: int = 40, max_requests: int = 10, sizes=block_sizes):
    """Random traces: repeats across and inside requests, empty requests."""
    n = draw(st.integers(1, max_accesses))
    m = draw(st.integers(1, min(n, max_blocks)))
    raw = draw(st.lists(st.integers(0, m - 1), min_size=n, max_size=n))
    return draw(_assemble(raw, max_requests, sizes))


@st.composite
def all_cold_traces(draw, max_accesses: int = 30):
    """Every access touches a new block."""
    n = draw(st.integers(1, max_accesses))
    return draw(_assemble(list(range(n)), 8, block_sizes))


@st.composite
def all_hot_traces(draw, max_accesses: int = 30):
    """One block, accessed over and over."""
    n = draw(st.integers(1, max_accesses))
    return draw(_assemble([0] * n, 8, block_sizes))


@st.composite
def one_access_traces(draw):
    """A single access, possibly surrounded by empty requests."""
    return draw(_assemble([0], 4, block_sizes))


@st.composite
def giant_block_traces(draw):
    """A random trace in which one block dwarfs all the others together."""
    trace = draw(random_traces(sizes=st.integers(1, 8)))
    size = trace.size.copy()
    size[draw(st.integers(0, len(size) - 1))] = 10**9
    return trace._replace(size=size)


@st.composite
def long_traces(draw):
    """Many accesses over few blocks (N > 2M + 64): forces the kernel to compact its
    time axis, several times. Skewed popularity mixes short and long reuses."""
    m = draw(st.integers(1, 30))
    n = draw(st.integers(150, 400))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    weights = 1.0 / np.arange(1, m + 1) ** draw(st.sampled_from([0.0, 1.0]))
    raw = rng.choice(m, size=n, p=weights / weights.sum()).tolist()
    return draw(_assemble(raw, 60, block_sizes))


#: Any kernel input of the shapes above (mostly random ones).
any_traces = st.one_of(
    random_traces(),
    random_traces(),
    random_traces(),
    all_cold_traces(),
    all_hot_traces(),
    one_access_traces(),
    giant_block_traces(),
)


@st.composite
def chained_traces(draw, max_requests: int = 12, max_new: int = 4, sizes=block_sizes):
    """Requests as root-to-node paths in a random trie (chained prefix hashes).

    Each request extends the path to a random existing node (or starts a new root)
    by 0..max_new new nodes; an empty path with no extension is an empty request.
    """
    parent: list[int] = []
    path_to: list[list[int]] = []  # node -> root-to-node path
    requests: list[list[int]] = []
    for _ in range(draw(st.integers(1, max_requests))):
        if parent and draw(st.booleans()):
            path = list(path_to[draw(st.integers(0, len(parent) - 1))])
        else:
            path = []
        for _ in range(draw(st.integers(0, max_new))):
            node = len(parent)
            parent.append(path[-1] if path else -1)
            path.append(node)
            path_to.append(list(path))
        requests.append(path)
    size = draw(st.lists(sizes, min_size=len(parent), max_size=len(parent)))
    trace = make_trace(requests, size)
    return ChainedTrace(*trace, np.array(parent, dtype=np.int64).reshape(-1))
