"""Fuzzing the error contract (issue 9): malformed JSONL, Parquet and CSV inputs, and
random command lines for every command. Every case must end in a result or in one
``KvtraceError`` (one line naming the file), never another exception, a Python
warning, a traceback or a partial output file.

Bounded for CI (two cores): each test runs 30 to 150 examples, no deadline
(``KVTRACE_FUZZ_SCALE=N`` multiplies them for a deeper search).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from kvtrace.cli import app
from kvtrace.errors import KvtraceError
from kvtrace.ingest import load_trace

ROOT = Path(__file__).resolve().parent.parent
TIERS = ROOT / "sample_traces" / "tiers.example.toml"
#: KVTRACE_FUZZ_SCALE=20 runs twenty times more examples (a deeper local search, with
#: fresh random examples every run); by default the examples are derandomised, so a CI
#: run is repeatable and a new finding comes from a deliberate deeper search.
SCALE = int(os.environ.get("KVTRACE_FUZZ_SCALE", "1"))
FUZZ = settings(max_examples=150 * SCALE, deadline=None, derandomize=SCALE == 1,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
CLI_FUZZ = settings(max_examples=30 * SCALE, deadline=None, derandomize=SCALE == 1,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def check_outcome(path: Path, **kwargs) -> None:
    """Load ``path``: a consistent trace, or a one-line KvtraceError naming the file.
    Python warnings (numpy casts, overflows) count as failures."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            trace = load_trace(path, **kwargs)
        except KvtraceError as exc:
            msg = str(exc)
            assert "\n" not in msg and "\r" not in msg, msg
            assert str(path).replace("\n", "\\n") in msg, msg
            event("error: " + exc.message[:30])
            return
    event("read")
    a = trace.accesses
    assert a.req_start[0] == 0 and np.all(np.diff(a.req_start) >= 0)
    assert len(a) == a.req_start[-1] == int(trace.requests["block_ids"].list.len().sum())
    assert trace.n_blocks == 0 or (a.block.min() >= 0 and a.block.max() < trace.n_blocks)
    assert np.all((a.tokens >= 1) & (a.tokens <= trace.meta.block_tokens))
    ts = trace.request_timestamp
    assert np.all(np.isfinite(ts)) and np.all(np.diff(ts) >= 0)
    assert ts[0] == 0.0 or trace.meta.source_format == "canonical"  # a canonical table's times are kept
    assert len(set(trace.requests["request_id"].to_list())) == trace.n_requests


# --------------------------------------------------------------------------- JSONL

ANY_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True, allow_infinity=True),
              st.text(max_size=6), st.sampled_from([0, -1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 1e300, -0.0])),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=3), inner, max_size=2)),
    max_leaves=6,
)
HASH = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from([0, 2**63 - 1, 2**63, 2**64 - 1]))
MOONCAKE = st.fixed_dictionaries({
    "timestamp": st.one_of(st.integers(0, 10**7), st.floats(0, 1e7)),
    "input_length": st.integers(0, 3000),
    "output_length": st.integers(0, 100),
    "hash_ids": st.lists(st.one_of(HASH, st.integers(0, 20)), max_size=6),
})
BAILIAN = st.fixed_dictionaries({
    "chat_id": st.integers(0, 30),
    "parent_chat_id": st.one_of(st.just(-1), st.integers(0, 30)),
    "timestamp": st.floats(0, 1e4),
    "input_length": st.integers(0, 100),
    "output_length": st.integers(0, 10),
    "type": st.one_of(st.none(), st.text(max_size=5)),
    "turn": st.integers(0, 5),
    "hash_ids": st.lists(st.integers(0, 20), max_size=6),
})


@st.composite
def mutated(draw, base) -> dict:
    """A record, perhaps with a field dropped, retyped, or unicode extras."""
    rec = dict(draw(base))
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(sorted(rec)))
        action = draw(st.sampled_from(["drop", "retype", "extra"]))
        if action == "drop":
            rec.pop(key)
        elif action == "retype":
            rec[key] = draw(ANY_VALUE)
        else:
            rec[draw(st.text(min_size=1, max_size=4))] = draw(st.text(max_size=8))
        if not rec:
            break
    return rec


@st.composite
def jsonl_bytes(draw) -> bytes:
    base = draw(st.sampled_from([MOONCAKE, BAILIAN]))
    garbage = st.one_of(
        st.binary(max_size=12).map(lambda b: ("raw", b)),
        st.text(max_size=12).map(lambda t: ("raw", t.encode("utf-8", "surrogatepass"))),
        st.just(("raw", b"")),
        st.just(("raw", b"[1, 2]")),
    )
    clean = base.map(lambda r: ("rec", r))
    record = st.one_of(mutated(base).map(lambda r: ("rec", r)), clean, clean)
    kind = draw(st.integers(0, 3))
    items = draw(st.lists(st.one_of(record, record, record, garbage) if kind == 0 else record if kind == 1
                          else clean, min_size=1 if kind else 0, max_size=8))
    out = []
    for kind, value in items:
        if kind == "rec":
            out.append(json.dumps(value, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass"))
        else:
            out.append(value.replace(b"\n", b" "))
    data = draw(st.sampled_from([b"\n", b"\r\n"])).join(out) + draw(st.sampled_from([b"\n", b""]))
    if data and draw(st.integers(0, 3)) == 0:
        data = data[:draw(st.integers(0, len(data)))]  # cut anywhere
    if draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data
    return data


def compress(data: bytes, how: str, cut: float | None) -> bytes:
    if how == "gzip":
        data = gzip.compress(data)
    elif how == "zstd":
        data = pa.compress(data, codec="zstd", asbytes=True)
    if cut is not None and how != "none":
        data = data[:max(2, int(len(data) * cut))]
    return data


@FUZZ
@given(data=jsonl_bytes(), how=st.sampled_from(["none", "none", "gzip", "zstd"]),
       cut=st.one_of(st.none(), st.floats(0, 1)), fmt=st.sampled_from(["auto", "auto", "mooncake", "bailian"]),
       shards=st.integers(0, 3))
def test_fuzz_jsonl(data, how, cut, fmt, shards):
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        if shards == 0:
            path = d / "t.jsonl"
            path.write_bytes(compress(data, how, cut))
        else:  # the same bytes split into shards, one of them compressed
            path = d / "shards"
            path.mkdir()
            parts = np.array_split(np.frombuffer(data, dtype=np.uint8), shards) if data else [np.zeros(0, np.uint8)]
            for i, part in enumerate(parts):
                (path / f"p{i}.jsonl{'.gz' if how == 'gzip' and i == 0 else ''}").write_bytes(
                    compress(part.tobytes(), how if i == 0 else "none", None))
        check_outcome(path, fmt=fmt)


# --------------------------------------------------------------------------- Parquet

NAMES = ["block_ids", "hash_ids", "hashes", "timestamp", "ts", "timestamp_ms", "request_id", "input_tokens",
         "input_length", "output_tokens", "tenant", "type", "turn", "session_id", "parent_id", "pos", "hash_id",
         "x", "ünï"]
INT_TYPES = [pa.int8(), pa.int32(), pa.int64(), pa.uint8(), pa.uint64()]


def int_values(t: pa.DataType):
    info = np.iinfo(t.to_pandas_dtype())
    lo, hi = int(info.min), int(info.max)
    return st.one_of(st.integers(lo, hi), st.integers(max(lo, -3), min(hi, 40)))


@st.composite
def column(draw, n: int) -> pa.Array:
    kind = draw(st.sampled_from(["int", "float", "bool", "string", "timestamp", "duration", "null", "list_int",
                                 "list_float", "list_string", "list_null", "struct", "binary"]))
    maybe_null = lambda s: st.one_of(s, st.none()) if draw(st.booleans()) else s  # noqa: E731
    if kind == "int":
        t = draw(st.sampled_from(INT_TYPES))
        return pa.array(draw(st.lists(maybe_null(int_values(t)), min_size=n, max_size=n)), type=t)
    if kind == "float":
        return pa.array(draw(st.lists(maybe_null(st.floats(allow_nan=True, allow_infinity=True)), min_size=n,
                                      max_size=n)), type=pa.float64())
    if kind == "bool":
        return pa.array(draw(st.lists(maybe_null(st.booleans()), min_size=n, max_size=n)), type=pa.bool_())
    if kind == "string":
        return pa.array(draw(st.lists(maybe_null(st.one_of(st.text(max_size=6), st.integers(0, 99).map(str))),
                                      min_size=n, max_size=n)), type=pa.string())
    if kind == "binary":
        return pa.array(draw(st.lists(st.binary(max_size=4), min_size=n, max_size=n)), type=pa.binary())
    if kind == "timestamp":
        return pa.array(draw(st.lists(maybe_null(st.integers(-2**40, 2**40)), min_size=n, max_size=n)),
                        type=pa.timestamp("ms"))
    if kind == "duration":
        return pa.array(draw(st.lists(st.integers(0, 2**40), min_size=n, max_size=n)), type=pa.duration("s"))
    if kind == "null":
        return pa.nulls(n)
    if kind == "struct":
        return pa.array([{"a": v} for v in draw(st.lists(st.integers(0, 5), min_size=n, max_size=n))])
    if kind == "list_null":
        return pa.array([[None] * k for k in draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))],
                        type=pa.list_(pa.null()))
    inner = {"list_int": draw(st.sampled_from(INT_TYPES)), "list_float": pa.float64(), "list_string": pa.string()}[kind]
    elem = {"list_int": int_values(inner) if kind == "list_int" else None,
            "list_float": st.floats(allow_nan=True, allow_infinity=True),
            "list_string": st.integers(0, 2**64).map(str)}[kind]
    lists = draw(st.lists(maybe_null(st.lists(maybe_null(elem), max_size=4)), min_size=n, max_size=n))
    return pa.array(lists, type=pa.list_(inner))


@st.composite
def good_column(draw, name: str, n: int) -> pa.Array:
    """A column of the type its name calls for (values may still be bad)."""
    if name in ("block_ids", "hash_ids", "hashes"):
        t = draw(st.sampled_from([pa.uint64(), pa.int64(), pa.int32()]))
        values = int_values(t) if draw(st.integers(0, 3)) == 0 else st.integers(0, 50)
        return pa.array(draw(st.lists(st.lists(values, max_size=4), min_size=n, max_size=n)), type=pa.list_(t))
    if name in ("timestamp", "ts", "timestamp_ms"):
        values = st.floats(allow_nan=True, allow_infinity=True) if draw(st.integers(0, 3)) == 0 else st.floats(0, 1e4)
        return pa.array(draw(st.lists(values, min_size=n, max_size=n)), type=pa.float64())
    if name in ("tenant", "type"):
        return pa.array(draw(st.lists(st.one_of(st.none(), st.text(max_size=4)), min_size=n, max_size=n)),
                        type=pa.string())
    values = int_values(pa.int64()) if draw(st.integers(0, 3)) == 0 else st.integers(0, 40)
    return pa.array(draw(st.lists(values, min_size=n, max_size=n)), type=pa.int64())


@st.composite
def parquet_table(draw) -> pa.Table:
    n = draw(st.integers(0, 6))
    if draw(st.booleans()):
        names = [draw(st.sampled_from(["block_ids", "hash_ids"])), draw(st.sampled_from(["timestamp", "ts_ms"]))]
    elif draw(st.booleans()):
        names = ["request_id", "pos", "hash_id", draw(st.sampled_from(["timestamp", "timestamp_ms"]))]
    else:
        names = []
    names += draw(st.lists(st.sampled_from([x for x in NAMES if x not in names]), max_size=4, unique=True))
    if not names:
        names = ["x"]
    well_typed = draw(st.integers(0, len(names)))  # the first columns have sensible types
    table = pa.table({name: draw(good_column(name, n)) if i < well_typed else draw(column(n))
                      for i, name in enumerate(names)})
    if draw(st.booleans()):  # claims to be kvtrace's canonical table
        md = draw(st.one_of(
            st.fixed_dictionaries({"version": st.just(1), "block_tokens": st.one_of(st.integers(-5, 2**40),
                                                                                     st.text(max_size=3), st.none()),
                                   "share_tenants": ANY_VALUE, "source_format": ANY_VALUE}).map(json.dumps),
            st.text(max_size=10)))
        table = table.replace_schema_metadata({b"kvtrace": md.encode("utf-8", "surrogatepass")})
    return table


@FUZZ
@given(table=parquet_table(), block_tokens=st.sampled_from([None, 1, 16, 16, 16, 512, 2**20]))
def test_fuzz_parquet(table, block_tokens):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.parquet"
        pq.write_table(table, path)
        check_outcome(path, block_tokens=block_tokens)


@st.composite
def canonical_like(draw) -> pl.DataFrame:
    """A canonical request table with a value or a column type broken."""
    from kvtrace.trace import REQUEST_SCHEMA

    n = draw(st.integers(1, 5))
    df = pl.DataFrame({
        "request_id": draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)),
        "timestamp": draw(st.lists(st.floats(0, 100), min_size=n, max_size=n)),
        "session_id": draw(st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=n, max_size=n)),
        "parent_id": [None] * n,
        "turn": draw(st.lists(st.one_of(st.none(), st.integers(-3, 3)), min_size=n, max_size=n)),
        "type": draw(st.lists(st.one_of(st.none(), st.text(max_size=3)), min_size=n, max_size=n)),
        "tenant": draw(st.lists(st.one_of(st.none(), st.sampled_from(["a", "b", "ü"])), min_size=n, max_size=n)),
        "input_tokens": draw(st.lists(st.integers(0, 64), min_size=n, max_size=n)),
        "output_tokens": [1] * n,
        "block_ids": draw(st.lists(st.lists(st.integers(0, 2**64 - 1), max_size=4), min_size=n, max_size=n)),
    }, schema=REQUEST_SCHEMA)
    if draw(st.integers(0, 4)) == 0:
        df = df.drop(draw(st.sampled_from(df.columns)))
    col = draw(st.sampled_from(df.columns))
    how = draw(st.sampled_from(["string", "float", "null", "none"]))
    if how == "string":
        df = df.with_columns(pl.col(col).cast(pl.List(pl.String) if col == "block_ids" else pl.String))
    elif how == "float" and df.schema[col].is_numeric():
        df = df.with_columns(pl.col(col).cast(pl.Float64) + 0.5)
    elif how == "null":
        df = df.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(None).otherwise(pl.col(col)).alias(col))
    return df


@FUZZ
@given(df=canonical_like())
def test_fuzz_canonical_parquet(df):
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "c.parquet"
        df.write_parquet(path, metadata={"kvtrace": json.dumps({"version": 1, "block_tokens": 16})})
        check_outcome(path)


# --------------------------------------------------------------------------- CSV

CELL = st.one_of(st.integers(-5, 2**65).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                 st.text(alphabet='0123456789[]; ,"x-.\n', max_size=10), st.just(""))


@st.composite
def csv_table(draw) -> tuple[list[str], list[list[str]]]:
    header = draw(st.sampled_from([["timestamp", "block_ids"], ["request_id", "pos", "hash_id", "timestamp"], []]))
    header = header + draw(st.lists(st.sampled_from([x for x in NAMES if x not in header]), max_size=3,
                                    unique=True))
    header = header or ["x"]
    good = {"timestamp": st.floats(0, 1e4).map(repr), "block_ids": st.lists(HASH, max_size=3).map(str),
            "request_id": st.integers(0, 3).map(str), "pos": st.integers(0, 3).map(str),
            "hash_id": HASH.map(str)}
    rows = []
    for _ in range(draw(st.integers(0, 5))):
        width = len(header) if draw(st.integers(0, 5)) else draw(st.integers(0, 6))
        rows.append([draw(good[header[i]]) if i < len(header) and header[i] in good and draw(st.booleans())
                     else draw(CELL) for i in range(width)])
    return header, rows


@FUZZ
@given(table=csv_table(), quote=st.booleans(), block_tokens=st.sampled_from([None, 16, 16]))
def test_fuzz_csv(table, quote, block_tokens):
    header, rows = table
    q = lambda c: '"' + c.replace('"', '""') + '"' if quote or "," in c else c  # noqa: E731
    text = ",".join(header) + "\n" + "".join(",".join(q(c) for c in r) + "\n" for r in rows)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "t.csv"
        path.write_text(text, encoding="utf-8")
        check_outcome(path, block_tokens=block_tokens)


# --------------------------------------------------------------------------- the CLI

RUNNER = CliRunner()
SIZES = st.one_of(st.sampled_from(["0", "1", "500GB", "12XB", "-5GiB", "nan", "1e999", "", "∞", "64GiB,1TiB",
                                   "1KiB,,2KiB", "9" * 30 + "PiB"]), st.text(max_size=6))
NUMBERS = st.one_of(st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e999", "abc", "", "1e308"]),
                    st.floats(allow_nan=True, allow_infinity=True).map(repr), st.integers(-10**20, 10**20).map(str))
INTS = st.one_of(st.sampled_from(["0", "-1", "abc", "", "99999999999999999999", "1.5"]), st.integers(-5, 300).map(str))
DURATIONS = st.one_of(st.sampled_from(["1.0", "-1", "10 parsecs", "0", "nan", "1e999s"]), st.text(max_size=5))
TEXT = st.text(max_size=8)
OUT_BAD = st.sampled_from(["o.txt", "o", "missing/o.parquet", "adir", "ünï.csv", "old.parquet", "-", ""])


def opt(name: str, *good: str, bad: st.SearchStrategy = TEXT) -> st.SearchStrategy:
    """``[name, value]``: a valid value three times in four, else a fuzzed one."""
    value = st.one_of(st.sampled_from(good), st.sampled_from(good), st.sampled_from(good), bad) if good else bad
    return value.map(lambda v: [name, v])


def flag(name: str) -> st.SearchStrategy:
    return st.just([name])


TABLE_OUT = ("o.parquet", "o.csv", "o.json", "old.parquet")
PLOT_OUT = ("o.html", "o.svg", "o.png")
COMMON_TRACE = [opt("--model", "Llama-3.1-70B", "Llama-3.1-8B", "DeepSeek-V3", bad=st.sampled_from(["NoSuch", ""])),
                opt("--kv-bytes-per-token", "131072", "1", bad=INTS), opt("--dtype", "fp16", "fp8", bad=TEXT),
                opt("--block-tokens", "16", "512", bad=INTS), flag("--share-tenants"),
                opt("--format", "auto", bad=st.sampled_from(["mooncake", "bailian", "parquet", "csv", "xml"]))]
GPU = [opt("--gpu", "H100", "A100", "B200", bad=TEXT), opt("--mfu", "0.5", "1", bad=NUMBERS),
       opt("--gpu-price", "2.5", "0", bad=NUMBERS)]
VOCAB = {
    "stats": COMMON_TRACE + [opt("--json", "o.json", "-", bad=OUT_BAD)],
    "curve": COMMON_TRACE + GPU + [
        opt("--eviction", "prefix-aware", "flat", bad=TEXT), opt("--capacity", "64GiB", "1KiB,1TiB", bad=SIZES),
        opt("--points", "2", "50", bad=INTS), opt("--warmup", "10%", "0.1", "1s", bad=DURATIONS),
        opt("--by", "type", "tenant", "turn", "session-length", bad=TEXT),
        opt("--sample-rate", "0.5", "1", bad=NUMBERS), opt("--out", *TABLE_OUT, bad=OUT_BAD),
        opt("--plot", *PLOT_OUT, bad=OUT_BAD), opt("--distances-out", *TABLE_OUT, bad=OUT_BAD),
        opt("--json", "o.json", "-", bad=OUT_BAD), flag("--stream"), flag("--no-stream"),
        opt("--engine", "local", bad=TEXT)],
    "value": COMMON_TRACE + GPU + [
        opt("--horizon", "1h", "inf", "90s", bad=DURATIONS), opt("--write-cost", "0.2", bad=NUMBERS),
        opt("--read-cost", "0", bad=NUMBERS), opt("--occupancy-cost", "20", bad=NUMBERS),
        opt("--top", "3", bad=INTS), opt("--out", *TABLE_OUT, bad=OUT_BAD),
        opt("--prefixes-out", *TABLE_OUT, bad=OUT_BAD), opt("--accesses-out", *TABLE_OUT, bad=OUT_BAD),
        opt("--json", "o.json", "-", bad=OUT_BAD)],
    "whatif": COMMON_TRACE + GPU + [
        opt("--flash", "64GiB", "0", bad=SIZES), opt("--local-ssd", "0", "8GiB", bad=SIZES),
        opt("--policy", "all", "none", "second-hit", "freq>=3", "prob:0.3", "idle<10s", "value>=0", "reuse-oracle",
            "tinylfu", "group:type>=0.5", "all,tinylfu", bad=st.sampled_from(["prob:7", "bogus", "", "freq>=x"])),
        flag("--grid"), flag("--compare-local"), opt("--nodes", "1", "2", bad=INTS),
        opt("--routing", "session", "round-robin", "prefix", bad=TEXT),
        opt("--promotion", "promote", "copy", "none", bad=TEXT),
        opt("--write-mode", "write-on-evict", "write-through", bad=TEXT), flag("--inclusive"),
        opt("--flash-order", "lru", "fifo", bad=TEXT), opt("--warmup", "10%", bad=DURATIONS),
        opt("--dram-gbps", "25", bad=NUMBERS), opt("--flash-gbps", "6", bad=NUMBERS),
        opt("--overhead-ms", "1", bad=NUMBERS), opt("--dram-latency-ms", "0.2", bad=NUMBERS),
        opt("--flash-latency-ms", "1", bad=NUMBERS), opt("--horizon", "1h", bad=DURATIONS),
        opt("--out", *TABLE_OUT, bad=OUT_BAD), opt("--plot", *PLOT_OUT, bad=OUT_BAD),
        opt("--json", "o.json", "-", bad=OUT_BAD)],
    "size": COMMON_TRACE + [opt("--config", str(TIERS), bad=st.sampled_from(["bad.toml", "missing.toml", "o.csv"])),
                            opt("--report", "o.html", "o.md", bad=OUT_BAD), opt("--out", *TABLE_OUT, bad=OUT_BAD),
                            opt("--json", "o.json", "-", bad=OUT_BAD)],
    "export": COMMON_TRACE + GPU + [
        opt("--db", "e.duckdb", bad=OUT_BAD), opt("--eviction", "prefix-aware", "flat", bad=TEXT),
        opt("--warmup", "10%", bad=DURATIONS), opt("--points", "20", bad=INTS), opt("--horizon", "1h", bad=DURATIONS),
        opt("--write-cost", "0.2", bad=NUMBERS),
        opt("--whatif", "w.parquet", bad=st.sampled_from(["missing.parquet", "trace.jsonl"])),
        opt("--parquet", "pq", bad=st.sampled_from(["missing", "trace.jsonl"]))],
    "sql": [opt("--model", "Llama-3.1-8B", bad=TEXT), opt("--block-tokens", "16", bad=INTS),
            opt("--warmup", "10%", bad=DURATIONS), opt("--horizon", "1h", bad=DURATIONS),
            opt("--eviction", "flat", bad=TEXT),
            opt("-c", "SELECT 1", "SELECT * FROM curve", "SELECT hit_rate_at(gib(64))", "SELECT * FROM knees",
                bad=st.sampled_from(["SELEKT", "SELECT 1/0", "", ";", "SELECT * FROM nosuch",
                                     "CREATE TABLE t AS SELECT 1", "SELECT 'ü' || chr(10)"])),
            opt("--example", "01", "05", "top_prefixes_by_value", bad=st.sampled_from(["99", "nope"])),
            opt("--set", "window_s=600", bad=st.sampled_from(["x", "=1", "a=", "1a=2"])),
            opt("--format", "table", "csv", "json", "parquet", bad=TEXT), opt("-o", *TABLE_OUT, bad=OUT_BAD),
            opt("--max-rows", "5", bad=INTS), flag("--write"), opt("--trace-format", "auto", bad=TEXT)],
    "ingest": COMMON_TRACE + [opt("-o", "o.parquet", "old.parquet", bad=OUT_BAD)],
    "synth": [opt("--kind", "chat", "agent", "rag", "mixed", bad=TEXT), opt("--seed", "0", "7", bad=INTS),
              opt("-o", "s.jsonl", "s.parquet", bad=OUT_BAD),
              opt("--format", "mooncake", "bailian", "parquet", bad=TEXT),
              opt("--block-tokens", "16", bad=INTS), opt("--rate", "2", bad=NUMBERS),
              opt("--chunk-requests", "7", bad=INTS)],
    "models": [opt("--block-tokens", "16", "512", bad=INTS), opt("--json", "o.json", "-", bad=OUT_BAD)],
    "estimate latency": [opt("--h-flash", "0.15", bad=NUMBERS), opt("--overhead-ms", "20", bad=NUMBERS),
                         opt("--h-dram", "0.8", bad=NUMBERS), opt("--flash-ms", "2200", bad=NUMBERS),
                         opt("--json", "o.json", "-", bad=OUT_BAD)],
    "estimate cost": [opt(o, v, bad=NUMBERS) for o, v in (
        ("--hardware", "52000"), ("--support", "200"), ("--kw", "1.2"), ("--months", "36"), ("--kwh-price", "0.12"),
        ("--incremental", "872.56"), ("--requests", "10000000"), ("--share", "0.15"), ("--gpu-seconds", "1.6"),
        ("--restore-gpu-seconds", "0.1"), ("--gpu-price", "2"), ("--realisation", "0.6"), ("--gpu-hours", "625"),
        ("--reserve", "10"))] + [opt("--json", "o.json", "-", bad=OUT_BAD)],
    "estimate bandwidth": [opt("--peak-rate", "150", bad=NUMBERS), opt("--restore-bandwidth", "32GiB/s", bad=SIZES),
                           opt("--bytes", "8GiB", bad=SIZES), opt("--share", "0.2", bad=NUMBERS),
                           opt("--json", "o.json", "-", bad=OUT_BAD)],
    "app": [opt("--port", "8501", bad=INTS), flag("--headless"), opt("--block-tokens", "16", bad=INTS),
            opt("--format", "auto", bad=TEXT)],
}
#: the positional argument of each command that takes a trace
TRACES = st.one_of(st.sampled_from(["trace.jsonl", "trace.parquet", "shards"]),
                   st.sampled_from(["trace.jsonl", "trace.parquet", "trace.csv", "shards", "bad.jsonl", "missing.jsonl",
                                    "adir", "db.duckdb", "w.parquet", "chat.jsonl.zst"]))
#: options a command needs, given most of the time
BASE = {"whatif": ["--dram", "1GiB", "--workers", "1"], "export": ["--db", "e.duckdb"],
        "estimate latency": ["--h-dram", "0.8", "--dram-ms", "20", "--flash-ms", "300", "--recompute-ms", "2000"],
        "estimate bandwidth": ["--rate", "100", "--share", "0.2", "--bytes", "8GiB", "--tier-bandwidth", "200GiB/s"],
        "estimate cost": ["--hardware", "52000", "--support", "200", "--kw", "1.2", "--months", "36", "--kwh-price",
                          "0.12"],
        "synth": ["-n", "30", "-o", "s.jsonl"], "ingest": ["-o", "i.parquet"], "size": ["--config", str(TIERS)],
        "sql": ["-c", "SELECT count(*) FROM accesses"]}


def workdir(d: Path) -> None:
    """Inputs every command line may name (all small)."""
    recs = [{"timestamp": t * 500, "input_length": 16 * (1 + t % 3), "output_length": 1,
             "hash_ids": list(range(t % 4, t % 4 + 1 + t % 3))} for t in range(12)]
    (d / "trace.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    from kvtrace.ingest import write_canonical

    write_canonical(load_trace(d / "trace.jsonl", block_tokens=16), None, d / "trace.parquet")
    (d / "chat.jsonl.zst").write_bytes(pa.compress((d / "trace.jsonl").read_bytes(), codec="zstd", asbytes=True))
    pl.read_parquet(d / "trace.parquet").select(
        "timestamp", pl.col("block_ids").cast(pl.List(pl.String)).list.join(" ")).write_csv(d / "trace.csv")
    (d / "shards").mkdir()
    (d / "shards" / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[:6]))
    (d / "shards" / "b.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in recs[6:]).encode()))
    (d / "bad.jsonl").write_text(json.dumps(recs[0]) + "\n{\"timestamp\": 1, \"input_length\": \"x\"}\n")
    (d / "adir").mkdir()
    (d / "pq").mkdir()
    (d / "bad.toml").write_text("[dram]\nprice = 'cheap'\nnot toml at all = = =\n")
    pl.DataFrame({"config": ["x"], "dram_prefix_token_hit_rate": [0.25]}).write_parquet(d / "w.parquet")
    res = RUNNER.invoke(app, ["export", str(d / "trace.jsonl"), "--db", str(d / "db.duckdb")])
    assert res.exit_code == 0, res.stderr
    (d / "old.parquet").write_bytes((d / "trace.parquet").read_bytes())  # a previous output


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in d.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli-fuzz")
    workdir(d)
    return d


@pytest.fixture(autouse=True)
def no_streamlit(monkeypatch):
    """`kvtrace app` with good options would serve until Ctrl+C: the server process is
    a stub that exits at once (its command line is what the app command computes)."""
    import subprocess

    class Done:
        def __init__(self, argv, env=None, **kwargs):
            assert "streamlit" in " ".join(argv)

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Done)


@pytest.mark.parametrize("command", sorted(VOCAB))
def test_fuzz_command_line(base_dir, tmp_path_factory, command):
    @CLI_FUZZ
    @given(data=st.data())
    def one(data):
        d = tmp_path_factory.mktemp("run")
        shutil.copytree(base_dir, d, dirs_exist_ok=True)  # a fresh copy: runs do not see each other's outputs
        old = snapshot(d)["old.parquet"]
        args = command.split()
        if command not in ("synth", "models") and not command.startswith("estimate"):
            args.append(data.draw(TRACES) if command != "app" or data.draw(st.booleans()) else None)
            args = [a for a in args if a is not None]
        if data.draw(st.integers(0, 4)):
            args += BASE.get(command, [])
        for o in data.draw(st.lists(st.one_of(*VOCAB[command]), max_size=5)):
            args += o
        before = snapshot(d)
        cwd = os.getcwd()
        os.chdir(d)
        try:
            res = RUNNER.invoke(app, args, env={"COLUMNS": "200", "KVTRACE_NUMBA_CACHE": os.environ.get(
                "KVTRACE_NUMBA_CACHE", "1")})
        finally:
            os.chdir(cwd)
        out = res.stdout + res.stderr
        assert "Traceback" not in out, (args, out)
        assert res.exit_code in (0, 1, 2), (args, res.exit_code, out, res.exception)
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, repr(res.exception))
        errors = [line for line in res.stderr.splitlines() if line.startswith("kvtrace: error: ")]
        OUTCOMES.append(f"exit {res.exit_code}" + (": " + errors[0][16:50] if errors else ""))
        # kvtrace's own lines only: no Python warning, no stray output
        assert all(line.startswith(("kvtrace: ", "kvtrace app: ", "wrote ")) for line in res.stderr.splitlines()), (
            args, res.stderr)
        if res.exit_code:
            assert len(errors) == 1, (args, res.stderr)
            assert "internal error" not in errors[0], (args, errors[0])
            after = snapshot(d)
            # inputs untouched; an existing output is either kept or a complete new file
            for name, blob in before.items():
                if name == "old.parquet" and after.get(name) != blob:
                    pq.read_metadata(d / name)  # complete: it has a footer
                elif name != "db.duckdb" or "--write" not in args:
                    assert after.get(name) == blob, (args, name)
        else:
            assert not errors
        assert not [p for p in d.rglob(".*.tmp")], args  # no temporary file left

    OUTCOMES = []
    one()
    # the fuzz must reach the commands' work, not only option parsing
    assert sum(o == "exit 0" for o in OUTCOMES) >= 2, OUTCOMES
