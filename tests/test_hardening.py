"""The user-facing error contract (issue 9): bad input, shards and compression, the
memory guard, one-line usage errors and byte-identical outputs.

Every bad input of the README's table "Bad input: what each gets" is a case of
:data:`CASES`, run through the real command (``kvtrace stats``): the test checks the
exact behaviour the table promises: an error naming file, line or row, field and
what was expected (exit 1), or a result with the warning it lists.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from kvtrace.cli import app
from kvtrace.errors import KvtraceError
from kvtrace.ingest import load_trace, write_canonical

ROOT = Path(__file__).resolve().parent.parent
CHAT = ROOT / "sample_traces" / "chat.jsonl"
TIERS = ROOT / "sample_traces" / "tiers.example.toml"
README = ROOT / "README.md"
RUNNER = CliRunner()


def run(*args, env: dict | None = None):
    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": "200", **(env or {})})


def one_line_error(res, code: int = 1) -> str:
    """Exit ``code`` and one ``kvtrace: error:`` line on stderr, no traceback."""
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr, res.exception)
    errors = [line for line in res.stderr.splitlines() if line.startswith("kvtrace: error: ")]
    assert len(errors) == 1, res.stderr
    assert all(line.startswith("kvtrace: ") for line in res.stderr.splitlines()), res.stderr
    assert "Traceback" not in res.stdout + res.stderr and "internal error" not in errors[0]
    return errors[0][len("kvtrace: error: "):]


def rec(ts, n_in, hashes, n_out=1) -> dict:
    return {"timestamp": ts, "input_length": n_in, "output_length": n_out, "hash_ids": hashes}


def bail(chat, parent, ts, hashes, **extra) -> dict:
    return {"chat_id": chat, "parent_chat_id": parent, "timestamp": ts, "input_length": 16 * len(hashes),
            "output_length": 1, "type": "text", "turn": 1, "hash_ids": hashes, **extra}


GOOD = [rec(0, 1024, [1, 2]), rec(1000, 512, [3]), rec(2000, 1024, [1, 2])]


def lines(*records) -> str:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)


def write(d: Path, name: str, content) -> Path:
    p = d / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    elif isinstance(content, str):
        p.write_text(content, encoding="utf-8")
    elif isinstance(content, pl.DataFrame):
        content.write_parquet(p) if name.endswith(".parquet") else content.write_csv(p)
    else:
        pq.write_table(content, p)
    return p


def zstd(data: bytes) -> bytes:
    return pa.compress(data, codec="zstd", asbytes=True)


def corrupt(data: bytes) -> bytes:
    """Flip bytes a third of the way in (the frame header stays valid)."""
    b = bytearray(data)
    k = len(b) // 3
    b[k] ^= 0xFF
    b[k + 1] ^= 0x55
    return bytes(b)


# ------------------------------------------------------------------ the README table
# id -> (file name, content, extra options, expected). expected is ("error", [substrings of
# the one-line message]) or ("ok", requests read, [substrings of warnings]).
# "{f}" stands for the file's path.
CASES = {
    "truncated-last-line": ("t.jsonl", lines(*GOOD) + '{"timestamp": 3000, "input_le', [],
                            ("ok", 3, ["line 4: the last line is cut off"])),
    "complete-last-line-without-newline": ("t.jsonl", lines(*GOOD) + json.dumps(rec(3000, 10, [7])), [],
                                           ("ok", 4, [])),
    "malformed-line-mid-file": ("t.jsonl", lines(GOOD[0], '{"timestamp": 5,', GOOD[1]), [],
                                ("error", ["{f}:2: malformed JSON"])),
    "malformed-last-line-with-newline": ("t.jsonl", lines(*GOOD, '{"timestamp": 3000, "input_le'), [],
                                         ("error", ["{f}:4: malformed JSON"])),
    "string-for-integer": ("t.jsonl", lines(GOOD[0], rec(5, "10", [4])), [],
                           ("error", ["{f}:2: field 'input_length': expected an integer"])),
    "float-for-integer": ("t.jsonl", lines(GOOD[0], rec(5, 10.0, [4])), [],
                          ("error", ["{f}:2: field 'input_length': expected an integer"])),
    "bool-for-integer": ("t.jsonl", lines(GOOD[0], rec(5, True, [4])), [],
                         ("error", ["{f}:2: field 'input_length': expected an integer"])),
    "object-for-number": ("t.jsonl", lines(GOOD[0], rec({"ms": 5}, 10, [4])), [],
                          ("error", ["{f}:2: field 'timestamp': expected a finite number"])),
    "hashes-not-a-list": ("t.jsonl", lines(GOOD[0], rec(5, 10, "1 2")), [],
                          ("error", ["{f}:2: field 'hash_ids': expected a list of integer hashes"])),
    "hash-2^63-to-2^64-1": ("t.jsonl", lines(rec(0, 1024, [2**63, 2**64 - 1]), rec(5, 512, [2**64 - 1])), [],
                            ("ok", 2, [])),
    "hash-2^64": ("t.jsonl", lines(GOOD[0], rec(5, 10, [2**64])), [],
                  ("error", ["{f}:2: field 'hash_ids': expected integer hashes in [0, 2^64), got "
                             "18446744073709551616"])),
    "hash-negative": ("t.jsonl", lines(GOOD[0], rec(5, 10, [-1])), [],
                      ("error", ["{f}:2: field 'hash_ids': expected integer hashes in [0, 2^64), got -1"])),
    "hash-float": ("t.jsonl", lines(GOOD[0], rec(5, 10, [2.0])), [],
                   ("error", ["{f}:2: field 'hash_ids': expected integer hashes in [0, 2^64), got 2.0"])),
    "hash-null": ("t.jsonl", lines(GOOD[0], rec(5, 10, [4, None])), [],
                  ("error", ["{f}:2: field 'hash_ids': expected integer hashes in [0, 2^64), got None"])),
    "negative-length": ("t.jsonl", lines(GOOD[0], rec(5, -1, [4])), [],
                        ("error", ["{f}:2: field 'input_length': expected a non-negative integer, got -1"])),
    "negative-output-length": ("t.jsonl", lines(GOOD[0], rec(5, 10, [4], n_out=-3)), [],
                               ("error", ["{f}:2: field 'output_length': expected a non-negative integer, got -3"])),
    "length-beyond-int64": ("t.jsonl", lines(GOOD[0], rec(5, 10**30, [4])), [],
                            ("error", ["{f}:2: field 'input_length': expected an integer below 2^63"])),
    "length-beyond-2^40": ("t.jsonl", lines(GOOD[0], rec(5, 2**41, [4])), [],
                           ("error", ["{f}:2: field 'input_length': expected at most 2^40 tokens"])),
    "zero-length-empty-list": ("t.jsonl", lines(GOOD[0], rec(5, 0, [])), [], ("ok", 2, [])),
    "zero-length-with-hashes": ("t.jsonl", lines(GOOD[0], rec(5, 0, [4])), [],
                                ("ok", 2, ["1 of 2 requests have len(hash_ids) != ceil(input_length/512)"])),
    "empty-list-nonzero-length": ("t.jsonl", lines(GOOD[0], rec(5, 10, [])), [],
                                  ("error", ["{f}:2: field 'hash_ids': empty hash list for a prompt of 10 tokens"])),
    "nan-timestamp": ("t.jsonl", lines(GOOD[0], '{"timestamp": NaN, "input_length": 5, "output_length": 1, '
                                                '"hash_ids": [4]}'), [],
                      ("error", ["{f}:2: field 'timestamp': expected a finite number"])),
    "infinity-timestamp": ("t.jsonl", lines(GOOD[0], '{"timestamp": -Infinity, "input_length": 5, '
                                                     '"output_length": 1, "hash_ids": [4]}'), [],
                           ("error", ["{f}:2: field 'timestamp': expected a finite number"])),
    "overflowing-timestamp": ("t.jsonl", lines(GOOD[0], '{"timestamp": 1e400, "input_length": 5, '
                                                        '"output_length": 1, "hash_ids": [4]}'), [],
                              ("error", ["{f}:2: field 'timestamp': expected a finite number"])),
    "null-timestamp": ("t.jsonl", lines(GOOD[0], rec(None, 5, [4])), [],
                       ("error", ["{f}:2: field 'timestamp': expected a finite number"])),
    "timestamp-span-over-317-years": ("t.jsonl", lines(*GOOD, rec(1e300, 5, [4])), [],
                                      ("error", ["{f}:4: field 'timestamp': this timestamp makes the trace span",
                                                 "expected at most 1e+10 s"])),
    "unsorted-timestamps": ("t.jsonl", lines(GOOD[2], GOOD[0], GOOD[1]), [],
                            ("ok", 3, ["timestamps are not monotonic (1 decreases)"])),
    "duplicate-chat-id": ("b.jsonl", lines(bail(1, -1, 0, [1]), bail(2, 1, 1, [1, 2]), bail(1, -1, 2, [5])), [],
                          ("error", ["{f}:3: field 'chat_id': duplicate chat_id 1: first at line 1"])),
    "duplicate-request-id-csv": ("d.csv", 'request_id,timestamp,block_ids\n7,0,"[1]"\n8,1,"[2]"\n7,2,"[3]"\n',
                                 ["--block-tokens", "16"],
                                 ("error", ["{f}:4: field 'request_id': duplicate request id 7: first at line 2"])),
    "duplicate-request-id-parquet": ("d.parquet", pl.DataFrame({"request_id": [5, 6, 5], "timestamp": [0., 1., 2.],
                                                                "block_ids": [[1], [2], [3]]}),
                                     ["--block-tokens", "16"],
                                     ("error", ["{f}: row 2: field 'request_id': duplicate request id 5: first at "
                                                "row 0"])),
    "duplicate-access-position": ("a.parquet", pl.DataFrame({"request_id": [0, 0, 1], "pos": [0, 0, 0],
                                                             "hash_id": [1, 2, 3], "timestamp": [0., 0., 1.]}),
                                  ["--block-tokens", "16"],
                                  ("error", ["{f}: row 1: field 'pos': request 0 has two hashes at position 0: "
                                             "first at row 0"])),
    "missing-access-position": ("a.parquet", pl.DataFrame({"request_id": [0, 0, 1], "pos": [0, 5, 0],
                                                           "hash_id": [1, 2, 3], "timestamp": [0., 0., 1.]}),
                                ["--block-tokens", "16"],
                                ("ok", 2, ["1 of 2 requests have missing block positions"])),
    "empty-file": ("e.jsonl", "", [], ("error", ["{f}: no requests: the file is empty"])),
    "blank-lines-only": ("e.jsonl", "\n  \n\t\n", [], ("error", ["{f}: no requests: the file holds only blank lines"])),
    "duplicate-key": ("t.jsonl", lines(GOOD[0], '{"timestamp": 5, "input_length": 10, "input_length": 99999, '
                                                '"output_length": 1, "hash_ids": [4]}', GOOD[1]), [],
                      ("error", ["{f}:2: field 'input_length': duplicate key in one record"])),
    "duplicate-key-bailian": ("b.jsonl", lines(bail(1, -1, 0, [1]), json.dumps(bail(2, 1, 1, [1, 2]))[:-1]
                                               + ', "turn": 7}'), [],
                              ("error", ["{f}:2: field 'turn': duplicate key in one record"])),
    "nested-too-deeply": ("t.jsonl", lines(GOOD[0], "[" * 100_000 + "]" * 100_000), [],
                          ("error", ["{f}:2: malformed JSON (nested too deeply)"])),
    "nested-too-deeply-first-line": ("t.jsonl", lines("[" * 100_000 + "]" * 100_000, GOOD[0]), [],
                                     ("error", ["{f}:1: malformed JSON (nested too deeply)"])),
    "nested-too-deeply-last-line": ("t.jsonl", lines(GOOD[0]) + "[" * 100_000 + "]" * 100_000, [],
                                    ("error", ["{f}:2: malformed JSON (nested too deeply)"])),
    "csv-unterminated-quote": ("q.csv", 'timestamp,block_ids\n0,"[1]"\n1,"[2]\n2,"[3]"\n3,"[4]"\n',
                               ["--block-tokens", "16"],
                               ("error", ["{f}:3: cannot read as csv: a quoted field opens on this line and is not "
                                          "closed properly: expected its closing quote to be followed by a comma or "
                                          "the end of the line (a quote inside a quoted field is written twice)"])),
    "csv-quote-never-closed": ("q.csv", 'timestamp,block_ids\n0,"[1]"\n1,"[2]\n2,[3]\n', ["--block-tokens", "16"],
                               ("error", ["{f}:3: cannot read as csv: a quoted field opens on this line and is not "
                                          "closed: expected its closing quote before the end of the file"])),
    "empty-table": ("e.parquet", pl.DataFrame({"timestamp": [], "block_ids": []},
                                              schema={"timestamp": pl.Float64, "block_ids": pl.List(pl.UInt64)}),
                    ["--block-tokens", "16"], ("error", ["{f}: no requests: the table is empty"])),
    "unicode-strings": ("u.jsonl", lines(bail(1, -1, 0, [1], type="图片 ✓"),
                                         bail(2, 1, 1, [1, 2], note="naïve 😀")), [], ("ok", 2, [])),
    "invalid-utf8": ("u.jsonl", lines(GOOD[0]).encode() + b'{"timestamp": 1, "input_length": 5, "output_length": 1, '
                                                          b'"hash_ids": [4], "x": "\xff"}\n', [],
                     ("error", ["{f}:2: not valid UTF-8"])),
    "byte-order-mark": ("m.jsonl", "\ufeff" + lines(*GOOD), [], ("ok", 3, ["a UTF-8 byte-order mark"])),
    "gzip": ("g.jsonl.gz", gzip.compress(lines(*GOOD).encode()), [], ("ok", 3, [])),
    "zstd": ("z.jsonl.zst", zstd(lines(*GOOD).encode()), [], ("ok", 3, [])),
    "compressed-without-suffix": ("z.jsonl", zstd(lines(*GOOD).encode()), [], ("ok", 3, [])),
    "gzip-cut-short": ("g.jsonl.gz", gzip.compress(lines(*(rec(t, 512, [t % 7]) for t in range(600))).encode())[:-40],
                       [],
                       ("ok", None, ["the compressed stream is cut short", "the last line is cut off"])),
    "zstd-corrupt": ("z.jsonl.zst", corrupt(zstd(lines(*(rec(t, 512, [t % 7]) for t in range(200000))).encode())),
                     [], ("error", ["{f}: corrupt zstd stream"])),
    "zstd-garbage": ("z.jsonl.zst", zstd(lines(*(rec(t, 1, [1]) for t in range(6000))).encode())[:40] + b"\xff" * 64,
                     [],
                     ("error", ["{f}: corrupt or cut-short zstd stream: nothing could be decompressed"])),
    "float-hash-column": ("f.parquet", pl.DataFrame({"timestamp": [0.0], "block_ids": [[1.5]]}),
                          ["--block-tokens", "16"],
                          ("error", ["{f}: field 'block_ids': expected lists of integer hashes in [0, 2^64), found "
                                     "lists of Float64"])),
    "null-hash-column": ("f.parquet", pl.DataFrame({"timestamp": [0.0, 1.0], "block_ids": [[1], [2, None]]}),
                         ["--block-tokens", "16"],
                         ("error", ["{f}: row 1: field 'block_ids': expected integer hashes in [0, 2^64), got null"])),
    "text-in-number-column": ("s.parquet", pl.DataFrame({"timestamp": ["0", "soon"], "block_ids": [[1], [2]]}),
                              ["--block-tokens", "16"],
                              ("error", ["{f}: row 1: field 'timestamp': expected numbers, got 'soon'"])),
    "datetime-timestamps": ("t.parquet", pl.DataFrame({
        "timestamp": pl.Series(["2025-01-01 00:00:00", "2025-01-01 00:00:02.5"]).str.to_datetime(),
        "block_ids": [[1], [1]]}),
                            ["--block-tokens", "16"], ("ok", 2, [])),
    "csv-ragged-row": ("r.csv", 'timestamp,block_ids\n0,"[1]"\n1,"[2]",7\n', ["--block-tokens", "16"],
                       ("error", ["{f}:3: cannot read as csv: expected 2 fields (as in the header), got 3"])),
    "not-parquet": ("n.parquet", b"PAR1 but not really", [], ("error", ["{f}: cannot read as parquet"])),
    "canonical-bad-metadata": ("c.parquet", None, [], ("error", ["{f}: field 'kvtrace': kvtrace metadata: expected "
                                                                 "a positive integer block_tokens, got 'big'"])),
}


def canonical_with_bad_metadata(path: Path) -> None:
    trace = load_trace(CHAT)
    write_canonical(trace, None, path)
    table = pq.read_table(path)
    md = dict(table.schema.metadata or {})
    md[b"kvtrace"] = json.dumps({"version": 1, "block_tokens": "big"}).encode()
    pq.write_table(table.replace_schema_metadata(md), path)


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_table(tmp_path, case):
    name, content, options, expected = CASES[case]
    if case == "canonical-bad-metadata":
        path = tmp_path / name
        canonical_with_bad_metadata(path)
    else:
        path = write(tmp_path, name, content)
    res = run("stats", path, "--json", "-", *options)
    if expected[0] == "error":
        msg = one_line_error(res, 1)
        for needle in expected[1]:
            assert needle.replace("{f}", str(path)) in msg, (needle, msg)
        return
    assert res.exit_code == 0, (res.stdout, res.stderr, res.exception)
    _, n_requests, warns = expected
    summary = json.loads(res.stdout)["summary"]
    if n_requests is not None:
        assert summary["requests"] == n_requests
    warnings = [line for line in res.stderr.splitlines() if line.startswith("kvtrace: warning: ")]
    assert len(warnings) == len(warns), res.stderr
    for needle in warns:
        assert any(needle in w and str(path) in w for w in warnings), (needle, res.stderr)


def test_readme_table_lists_every_case():
    """The README's table is the user's view of CASES: every case id has its row."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### Bad input: what each gets"):]
    section = re.split(r"\n##+ ", section[4:], maxsplit=1)[0]  # up to the next heading
    ids = set(re.findall(r"<!-- (\S+) -->", section))
    expected = set(CASES) | {"shards", "memory-guard", "options", "interrupt"}
    assert ids == expected, sorted(ids ^ expected)


def test_truncated_last_line_keeps_the_complete_records_exactly(tmp_path):
    full = write(tmp_path, "full.jsonl", lines(*GOOD))
    cut = write(tmp_path, "cut.jsonl", lines(*GOOD) + '{"timestamp": 3000, "input_length": 512, "output_len')
    a, b = load_trace(full), load_trace(cut)
    assert b.warnings == ["line 4: the last line is cut off (no final newline, not valid JSON): ignored"]
    assert a.requests.equals(b.requests)
    assert np.array_equal(a.accesses.block, b.accesses.block)


def test_high_hashes_are_exact_in_every_format(tmp_path):
    hashes = [[2**63, 2**64 - 1, 2**63 + 1], [2**64 - 1]]
    j = write(tmp_path, "h.jsonl", lines(rec(0, 1536, hashes[0]), rec(1, 512, hashes[1])))
    c = write(tmp_path, "h.csv", f'timestamp,block_ids\n0,"{hashes[0]}"\n0.001,"{hashes[1]}"\n')
    p = write(tmp_path, "h.parquet", pl.DataFrame({"timestamp": [0.0, 0.001], "block_ids": hashes},
                                                   schema={"timestamp": pl.Float64, "block_ids": pl.List(pl.UInt64)}))
    a = write(tmp_path, "a.csv", "request_id,pos,hash_id,timestamp\n" + "".join(
        f"{r},{i},{h},{r / 1000}\n" for r, hs in enumerate(hashes) for i, h in enumerate(hs)))
    for path in (j, c, p, a):
        t = load_trace(path, block_tokens=512)
        assert t.requests["block_ids"].to_list() == hashes, path
        assert [int(h) for h in t.block_hash] == [2**63, 2**64 - 1, 2**63 + 1], path


# ------------------------------------------------------------------ shards, compression


def make_shards(d: Path) -> Path:
    d.mkdir()
    write(d, "part-1.jsonl", lines(GOOD[0]))
    write(d, "part-2.jsonl.gz", gzip.compress(lines(GOOD[1]).encode()))
    write(d, "part-10.jsonl.zst", zstd(lines(GOOD[2]).encode()))
    write(d, "README.md", "not a shard")
    write(d, ".part-3.jsonl.host-1.ab.tmp", "a temporary file: skipped")
    return d


def test_directory_of_shards_reads_like_one_file(tmp_path):
    shards = make_shards(tmp_path / "shards")
    whole = load_trace(write(tmp_path, "whole.jsonl", lines(*GOOD)))
    t = load_trace(shards)
    assert t.requests.drop("request_id").equals(whole.requests.drop("request_id"))
    assert t.requests["request_id"].to_list() == [0, 1, 2]  # natural order: part-1, part-2, part-10
    assert np.array_equal(t.accesses.block, whole.accesses.block)
    assert t.warnings == ["ignored 1 entry that is not a JSONL shard: README.md"]
    assert t.meta.source == "shards"
    res = run("curve", shards, "--capacity", "1GiB", "--json", "-")
    assert res.exit_code == 0 and json.loads(res.stdout)["info"]["measured_requests"] == 3


def test_shard_errors_name_the_shard_and_line(tmp_path):
    d = tmp_path / "s"
    d.mkdir()
    write(d, "a.jsonl", lines(*GOOD))
    bad = write(d, "b.jsonl", lines(GOOD[0], rec(5, "x", [1])))
    assert one_line_error(run("stats", d)).startswith(f"{bad}:2: field 'input_length': expected an integer")
    (d / "b.jsonl").unlink()
    write(d, "b.jsonl", lines(bail(1, -1, 0, [1])))
    assert "a bailian record in a directory of mooncake shards" in one_line_error(run("stats", d))
    empty = tmp_path / "empty"
    empty.mkdir()
    write(empty, "notes.txt", "x")
    assert "no JSONL shards in this directory" in one_line_error(run("stats", empty))
    assert "a directory is read as JSONL shards, not csv" in one_line_error(run("stats", d, "--format", "csv"))


def test_bailian_duplicates_across_shards_name_both(tmp_path):
    d = tmp_path / "b"
    d.mkdir()
    first = write(d, "a.jsonl", lines(bail(1, -1, 0, [1]), bail(2, 1, 1, [1, 2])))
    second = write(d, "b.jsonl", lines(bail(3, -1, 2, [5]), bail(2, 3, 3, [5, 6])))
    msg = one_line_error(run("stats", d))
    assert msg == f"{second}:2: field 'chat_id': duplicate chat_id 2: first at {first}:2"


@pytest.mark.parametrize("compress", [gzip.compress, zstd], ids=["gzip", "zstd"])
def test_compressed_traces_equal_the_plain_one(tmp_path, compress):
    plain = load_trace(CHAT)
    packed = load_trace(write(tmp_path, "chat.jsonl.x", compress(CHAT.read_bytes())))
    assert packed.requests.equals(plain.requests)
    assert np.array_equal(packed.accesses.block, plain.accesses.block)


def test_gzip_with_several_members(tmp_path):
    data = gzip.compress(lines(GOOD[0]).encode()) + gzip.compress(lines(*GOOD[1:]).encode())
    assert load_trace(write(tmp_path, "m.jsonl.gz", data)).n_requests == 3


# ------------------------------------------------------------------ the memory guard


def test_memory_guard_refuses_before_the_run(tmp_path):
    out = tmp_path / "c.parquet"
    msg = one_line_error(run("curve", CHAT, "--out", out, env={"KVTRACE_MEMORY_BUDGET": "1MiB"}))
    assert msg.startswith(f"{CHAT}: an exact kvtrace curve of this trace needs about ")
    # clearly over: refused before the read (kvtrace.ingest.guard.check_before_read), from a
    # first read that covers this small file, so the counts are exact
    assert "estimated before reading it" in msg and "32,158 block accesses and 4,000 requests" in msg
    assert "KVTRACE_MEMORY_BUDGET allows 1 MiB" in msg and "--stream" in msg
    assert not out.exists()
    # room for a sampled run but not an exact one: the message says so, with its estimate
    msg = one_line_error(run("curve", CHAT, env={"KVTRACE_MEMORY_BUDGET": "2.5MiB"}))
    assert "or --sample-rate 0.01 (about 2.2" in msg
    msg = one_line_error(run("whatif", CHAT, "--dram", "1GiB", "--policy", "all,tinylfu",
                             env={"KVTRACE_MEMORY_BUDGET": "5MiB"}))
    assert "kvtrace whatif (2 worker processes)" in msg and "try --workers 1 (about" in msg
    for args in (["export", CHAT, "--db", tmp_path / "x.duckdb"], ["value", CHAT], ["stats", CHAT],
                 ["sql", CHAT, "-c", "select 1"], ["size", CHAT, "--config", TIERS]):
        msg = one_line_error(run(*args, env={"KVTRACE_MEMORY_BUDGET": "1MiB"}))
        assert "holds the whole trace in memory" in msg, msg
    assert list(tmp_path.iterdir()) == []
    ok = run("curve", CHAT, "--capacity", "1GiB", env={"KVTRACE_MEMORY_BUDGET": "64MiB"})
    assert ok.exit_code == 0, ok.stderr


def test_memory_estimate_matches_the_measured_curve():
    from kvtrace.ingest.guard import estimate_bytes

    # README performance table: 2.34 GB peak for 30.0M accesses, 5.3M distinct blocks
    # (the ~0.27 GB of the interpreter and compiled kernels come on top of the estimate)
    est = estimate_bytes("curve", 30_000_000, 5_300_000, 2_000_000)
    assert 0.85 * (2.34e9 - 0.27e9) < est < 1.15 * (2.34e9 - 0.27e9)


def test_memory_guard_counts_distinct_blocks_only_when_needed(monkeypatch):
    import kvtrace.ingest.canonical as canonical
    from kvtrace.ingest import load_requests

    calls = []
    real = canonical.distinct_blocks
    monkeypatch.setattr(canonical, "distinct_blocks", lambda *a: calls.append(1) or real(*a))
    load_requests(CHAT, workload="curve")
    assert calls == []  # N x (per access + per block) fits: no counting pass
    monkeypatch.setenv("KVTRACE_MEMORY_BUDGET", "2.5MiB")
    load_requests(CHAT, workload="curve-sampled")  # fits only with the real count
    assert calls == [1]


# ------------------------------------------------------------------ usage errors


@pytest.mark.parametrize("args, needle", [
    (["curve", "x.jsonl", "--points", "abc"], "Invalid value for '--points'"),
    (["curve"], "Missing argument 'TRACE'"),
    (["curve", "x.jsonl", "--bogus"], "No such option: --bogus"),
    (["nosuch"], "No such command 'nosuch'"),
    (["curve", "x.jsonl", "--eviction", "lol"], "Invalid value for '--eviction'"),
    (["whatif", "x.jsonl"], "Missing option '--dram'"),
    (["estimate", "latency", "--h-dram", "x"], "Invalid value for '--h-dram'"),
    (["curve", "x.jsonl", "--block-tokens", "0"], "Invalid value for '--block-tokens'"),
    (["curve", "x.jsonl", "--block-tokens", "2000000"], "Invalid value for '--block-tokens'"),
    (["value", "x.jsonl", "--kv-bytes-per-token", "99999999999999999999"], "Invalid value for '--kv-bytes-per-token'"),
])
def test_usage_errors_are_one_line_exit_2(args, needle):
    msg = one_line_error(run(*args), 2)
    assert needle in msg, msg


def test_block_size_range_in_the_library(tmp_path):
    path = write(tmp_path, "x.jsonl", lines(*GOOD))
    with pytest.raises(KvtraceError, match=r"expected a block size in \[1, 1,048,576\] tokens, got 2000000"):
        load_trace(path, block_tokens=2_000_000)


def test_no_arguments_and_help_still_print_help():
    res = run()
    assert "Usage" in res.stdout + res.stderr and "curve" in res.stdout + res.stderr
    assert run("curve", "--help").exit_code == 0


def test_file_names_with_newlines_stay_on_one_line(tmp_path):
    path = tmp_path / "a\nb.jsonl"
    shown = str(path).replace("\n", "\\n")
    assert one_line_error(run("stats", path)) == f"{shown}: no such file"


def test_internal_errors_are_one_line_and_debug_shows_them(monkeypatch, tmp_path):
    import kvtrace.analyses.stats

    def boom(*a, **k):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(kvtrace.analyses.stats, "trace_stats", boom)
    path = write(tmp_path, "g.jsonl", lines(*GOOD))
    res = run("stats", path)
    assert res.exit_code == 1 and "Traceback" not in res.stderr
    assert res.stderr.splitlines() == ["kvtrace: error: internal error (ZeroDivisionError: a bug); rerun with "
                                       "--debug for the traceback and please report it"]
    res = run("--debug", "stats", path)
    assert isinstance(res.exception, ZeroDivisionError)


# ------------------------------------------------------------------ determinism


def outputs(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def all_commands(d: Path, trace: Path) -> None:
    """Every command that writes files, every output format."""
    (d / "pq").mkdir(parents=True)
    steps = [
        ["curve", trace, "--out", d / "c.parquet", "--json", d / "c.json", "--distances-out", d / "d.parquet",
         "--plot", d / "c.html"],
        ["curve", trace, "--sample-rate", "0.2", "--out", d / "s.csv", "--plot", d / "s.svg"],
        ["curve", trace, "--capacity", "8GiB,64GiB", "--by", "type", "--out", d / "g.json", "--plot", d / "g.png"],
        ["stats", trace, "--json", d / "st.json"],
        ["value", trace, "--out", d / "v.parquet", "--prefixes-out", d / "vp.csv", "--accesses-out",
         d / "va.json", "--json", d / "v.json"],
        ["whatif", trace, "--dram", "8GiB", "--flash", "64GiB", "--policy", "all,second-hit", "--workers", "1",
         "--out", d / "w.parquet", "--plot", d / "w.html", "--json", d / "w.json"],
        ["ingest", trace, "-o", d / "i.parquet"],
        ["synth", "--kind", "mixed", "-n", "200", "--seed", "7", "-o", d / "syn.parquet", "--format", "parquet"],
        ["synth", "--kind", "agent", "-n", "200", "--seed", "7", "-o", d / "syn.jsonl", "--format", "bailian"],
        ["size", trace, "--config", TIERS, "--out", d / "z.parquet", "--report", d / "z.html", "--json", d / "z.json"],
        ["size", trace, "--config", TIERS, "--report", d / "z.md"],
        ["export", trace, "--db", d / "e.duckdb", "--parquet", d / "pq"],
        ["sql", d / "e.duckdb", "-c", "SELECT * FROM curve ORDER BY capacity_bytes", "-o", d / "q.parquet"],
        ["sql", d / "e.duckdb", "-c", "SELECT * FROM knees", "-o", d / "q.csv"],
        ["estimate", "cost", "--hardware", "52000", "--support", "200", "--kw", "1.2", "--months", "36",
         "--kwh-price", "0.12", "--json", d / "ec.json"],
    ]
    for args in steps:
        res = run(*args, env={"SOURCE_DATE_EPOCH": "1700000000"})
        assert res.exit_code == 0, (args, res.stderr, res.exception)


def test_same_input_same_bytes(tmp_path):
    """Two runs of every command with the same input, options and seed write
    byte-identical files (Parquet, CSV, JSON, HTML, SVG, PNG, Markdown); the DuckDB
    database, whose file format is not byte-stable, holds identical tables."""
    import duckdb

    trace = tmp_path / "trace.parquet"
    res = run("synth", "--kind", "mixed", "-n", "300", "--seed", "3", "-o", trace, "--format", "parquet")
    assert res.exit_code == 0, res.stderr
    all_commands(tmp_path / "a", trace)
    all_commands(tmp_path / "b", trace)
    a, b = outputs(tmp_path / "a"), outputs(tmp_path / "b")
    assert a.keys() == b.keys() and len(a) >= 25
    differ = sorted(k for k in a if a[k] != b[k])
    assert differ == ["e.duckdb"], differ
    tables = {}
    for side in ("a", "b"):
        con = duckdb.connect(str(tmp_path / side / "e.duckdb"), read_only=True)
        names = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall()]
        tables[side] = {n: con.execute(f"SELECT * FROM {n}").fetchall() for n in names}
        con.close()
    assert tables["a"] == tables["b"] and "accesses" in tables["a"]
    md = pq.read_table(tmp_path / "a" / "pq" / "trace_meta.parquet").to_pylist()[0]
    assert md["exported_at"].year == 2023  # SOURCE_DATE_EPOCH, not the clock


def test_size_outputs_carry_no_run_time(tmp_path):
    out = tmp_path / "z.json"
    assert run("size", CHAT, "--config", TIERS, "--json", out).exit_code == 0
    assert "elapsed_s" not in out.read_text()


def test_bad_source_date_epoch_is_one_line(tmp_path):
    msg = one_line_error(run("export", CHAT, "--db", tmp_path / "e.duckdb", env={"SOURCE_DATE_EPOCH": "yesterday"}))
    assert "field 'SOURCE_DATE_EPOCH': expected whole seconds since 1970, got 'yesterday'" in msg
    assert list(tmp_path.iterdir()) == []


def test_library_errors_are_kvtrace_errors(tmp_path):
    with pytest.raises(KvtraceError):
        load_trace(write(tmp_path, "x.jsonl", lines(rec(0, 10, [1]), rec(1, 10, [-5]))))
