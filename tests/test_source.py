"""The TraceSource contract (kvtrace.trace.source), the same for every source: chunks tile
the accesses in whole requests, forward or backward, with the layout of the canonical
access table; columns read back what was written; first_blocks is the first access of
each request. Checked for an in-memory trace and the same trace streamed from Parquet,
against the in-memory arrays themselves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvtrace.errors import KvtraceError
from kvtrace.ingest import load_trace
from kvtrace.ingest.stream import open_stream
from kvtrace.trace.source import Column

MIXED = Path(__file__).resolve().parents[1] / "sample_traces" / "mixed.parquet"


@pytest.fixture(scope="module")
def trace():
    return load_trace(MIXED)


@pytest.fixture()
def sources(trace):
    with open_stream(MIXED) as streamed:
        yield [trace, streamed]


@pytest.mark.parametrize("size", [1, 7, 1000, 1 << 30])
@pytest.mark.parametrize("reverse", [False, True])
def test_chunks_tile_the_accesses_in_whole_requests(trace, sources, size, reverse):
    a = trace.accesses
    for src in sources:
        chunks = list(src.chunks(size=size, reverse=reverse))
        spans = [(c.lo, c.hi) for c in chunks]
        assert spans == sorted(spans, reverse=reverse)
        ordered = sorted(chunks, key=lambda c: c.lo)
        assert ordered[0].lo == 0 and ordered[-1].hi == trace.n_accesses
        assert all(p.hi == q.lo and p.r_end == q.r for p, q in zip(ordered, ordered[1:]))
        for c in chunks:
            assert a.req_start[c.r] == c.lo and a.req_start[c.r_end] == c.hi  # whole requests
            assert c.hi - c.lo <= size or c.r_end == c.r + 1  # about size, or one longer request
            np.testing.assert_array_equal(c.block, a.block[c.lo:c.hi])
            np.testing.assert_array_equal(c.tokens, a.tokens[c.lo:c.hi])
            np.testing.assert_array_equal(c.pos, a.pos[c.lo:c.hi])
            np.testing.assert_array_equal(c.lrs, a.req_start[c.r:c.r_end + 1] - c.lo)
            np.testing.assert_array_equal(c.local_req, a.request[c.lo:c.hi] - c.r)


def test_columns_read_back_what_was_written_in_any_order(trace, sources):
    want = np.random.default_rng(0).integers(-10**12, 10**12, trace.n_accesses)
    for src in sources:
        with src.column("x", np.int64) as col:
            for c in src.chunks(size=500, reverse=True, blocks=False, layout=False):
                col.write(c.lo, want[c.lo:c.hi])
        got = np.concatenate([c.extra[0] for c in src.chunks(size=333, blocks=False, columns=[col])])
        np.testing.assert_array_equal(got, want)
        col.drop()
        if col.path is not None:
            assert not col.path.exists()


def test_an_existing_column_is_read_and_never_removed(trace, sources, tmp_path):
    values = np.arange(trace.n_accesses, dtype=np.float64) / 3
    path = tmp_path / "v.f64"
    values.tofile(path)
    for src in sources:
        for col in (Column.existing(values, np.float64), Column.existing(path, np.float64)):
            got = np.concatenate([c.extra[0] for c in src.chunks(size=999, blocks=False, columns=[col])])
            np.testing.assert_array_equal(got, values)
            col.drop()
    assert path.exists()


def test_a_column_file_cut_short_names_it(trace, tmp_path):
    path = tmp_path / "short.i64"
    np.zeros(trace.n_accesses - 1, dtype=np.int64).tofile(path)
    col = Column.existing(path, np.int64)
    with pytest.raises(KvtraceError, match="cut short") as e:
        for _ in trace.chunks(columns=[col]):
            pass
    assert str(path) in e.value.one_line()


def test_first_blocks(trace, sources):
    rs, block = trace.accesses.req_start, trace.accesses.block
    want = np.array([block[rs[r]] if rs[r + 1] > rs[r] else -1 for r in range(trace.n_requests)])
    for src in sources:
        np.testing.assert_array_equal(src.first_blocks(), want)
