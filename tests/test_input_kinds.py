"""What kind of file a trace path names (kvtrace.ingest.inputs): devices and sockets
are refused before any read, pipes (FIFOs, ``/dev/fd/N``, ``/dev/stdin``) are read
exactly once with a bound and Ctrl+C ends any wait on them; and the JSONL checks that
go with reading a buffer once: duplicate keys, deep nesting, blank files.

FIFO tests write from a thread. A reader that opened a FIFO a second time would wait
for a second writer forever: the writer thread then opens it once more after a
deadline (ending that wait) and the test fails on ``reopened``.
"""

from __future__ import annotations

import gzip
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from kvtrace.cli import app
from kvtrace.errors import KvtraceError, UsageError
from kvtrace.ingest import check_input_kind, detect_format, load_trace, read_requests
from kvtrace.ingest.inputs import third_party_text
from kvtrace.ingest.jsonl import _count, open_source, source_format

ROOT = Path(__file__).resolve().parent.parent
CHAT = ROOT / "sample_traces" / "chat.jsonl"
KVTRACE = Path(sys.executable).parent / "kvtrace"
RUNNER = CliRunner()
DEVICE = "is a character device: expected a regular file, a directory of JSONL shards or a pipe"

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo") or not os.path.exists("/dev/zero"), reason="POSIX")


def run(*args, env: dict | None = None):
    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": "200", **(env or {})})


def one_line_error(res, code: int = 1) -> str:
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr, res.exception)
    errors = [line for line in res.stderr.splitlines() if line.startswith("kvtrace: error: ")]
    assert len(errors) == 1 and "Traceback" not in res.stderr and "internal error" not in errors[0], res.stderr
    return errors[0][len("kvtrace: error: "):]


def summary(res) -> dict:
    assert res.exit_code == 0, (res.stdout, res.stderr, res.exception)
    return json.loads(res.stdout)["summary"]


class Writer:
    """Writes ``data`` into a FIFO from a thread, once; after ``deadline`` seconds it
    opens the FIFO again (setting ``reopened``) to free a reader stuck in a second open."""

    def __init__(self, fifo: Path, data: bytes, deadline: float = 20.0) -> None:
        self.fifo, self.data, self.deadline = fifo, data, deadline
        self.done = threading.Event()
        self.reopened = False
        self.thread = threading.Thread(target=self._write, daemon=True)
        self.thread.start()

    def _write(self) -> None:
        with open(self.fifo, "wb") as fh:
            try:
                fh.write(self.data)
            except BrokenPipeError:  # the reader stopped early (a bound): fine
                pass
        if not self.done.wait(self.deadline):
            self.reopened = True
            with open(self.fifo, "wb"):
                pass

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join(5)


def fifo(tmp_path: Path, name: str) -> Path:
    p = tmp_path / name
    os.mkfifo(p)
    return p


# ----------------------------------------------------------------- 1. devices, sockets
@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null", "/dev/urandom"])
def test_character_devices_are_refused_before_any_read(device):
    msg = one_line_error(run("stats", device, "--json", "-"))
    assert msg == f"{device}: {DEVICE}"
    with pytest.raises(KvtraceError, match="is a character device"):
        read_requests(device)
    with pytest.raises(KvtraceError, match="is a character device"):
        detect_format(device)
    with pytest.raises(KvtraceError, match="is a character device"):
        check_input_kind(device)


def test_a_socket_is_refused(tmp_path):
    path = tmp_path / "t.jsonl"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(path))
        msg = one_line_error(run("stats", path, "--json", "-"))
        assert msg == f"{path}: is a socket: expected a regular file, a directory of JSONL shards or a pipe"
    finally:
        s.close()


def test_input_kinds(tmp_path):
    (tmp_path / "f.jsonl").write_text("")
    assert check_input_kind(tmp_path / "f.jsonl") == "file"
    assert check_input_kind(tmp_path) == "directory"
    assert check_input_kind(fifo(tmp_path, "p.jsonl")) == "pipe"
    with pytest.raises(KvtraceError, match="is a pipe, and a Parquet trace is read with random access"):
        check_input_kind(tmp_path / "p.jsonl", random_access=True)
    with pytest.raises(KvtraceError, match="no such file"):
        check_input_kind(tmp_path / "missing.jsonl")


# ----------------------------------------------------------------- 2. pipes
def test_fifo_with_a_writer_is_read_once(tmp_path):
    expected = summary(run("stats", CHAT, "--json", "-"))
    p = fifo(tmp_path, "p.jsonl")
    with Writer(p, CHAT.read_bytes()) as w:
        res = run("stats", p, "--json", "-")
    assert not w.reopened, "the FIFO was opened twice"
    got = summary(res)
    assert got["requests"] == expected["requests"] == 4000
    assert {k: v for k, v in got.items() if k != "source"} == {k: v for k, v in expected.items() if k != "source"}


@pytest.mark.parametrize("pack", ["gzip", "zstd"])
def test_compressed_fifo(tmp_path, pack):
    raw = CHAT.read_bytes()
    data = gzip.compress(raw) if pack == "gzip" else pa.compress(raw, codec="zstd", asbytes=True)
    p = fifo(tmp_path, "p.jsonl.gz" if pack == "gzip" else "p.jsonl.zst")
    with Writer(p, data) as w:
        res = run("stats", p, "--json", "-")
    assert not w.reopened
    assert summary(res)["requests"] == 4000


def test_compressed_fifo_cut_short_reads_what_precedes_the_cut(tmp_path):
    data = gzip.compress(CHAT.read_bytes())[:-5000]
    p = fifo(tmp_path, "p.jsonl.gz")
    with Writer(p, data):
        res = run("stats", p, "--json", "-")
    assert 0 < summary(res)["requests"] < 4000
    assert "the compressed stream is cut short" in res.stderr


def test_dev_fd_pipe_is_read_once(tmp_path):
    r, w = os.pipe()

    def feed():
        with os.fdopen(w, "wb") as fh:
            fh.write(CHAT.read_bytes())

    t = threading.Thread(target=feed, daemon=True)
    t.start()
    try:
        res = run("stats", f"/dev/fd/{r}", "--json", "-")
    finally:
        t.join(5)
        os.close(r)
    assert summary(res)["requests"] == 4000


def test_process_substitution_and_stdin_in_a_real_shell(tmp_path):
    """``kvtrace stats <(cat t.jsonl)`` and ``cat t.jsonl | kvtrace stats /dev/stdin``."""
    script = (f'"{KVTRACE}" stats <(cat "{CHAT}") --json - && cat "{CHAT}" | "{KVTRACE}" stats /dev/stdin --json - '
              f'&& "{KVTRACE}" stats /dev/stdin --json - < "{CHAT}"')
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count('"requests": 4000') == 3


def test_csv_fifo(tmp_path):
    p = fifo(tmp_path, "p.csv")
    with Writer(p, b'timestamp,block_ids\n0,"[1, 2]"\n1,"[1, 3]"\n'):
        res = run("stats", p, "--block-tokens", "16", "--json", "-")
    assert summary(res)["requests"] == 2


def test_csv_fifo_error_names_the_line(tmp_path):
    p = fifo(tmp_path, "p.csv")
    with Writer(p, b'timestamp,block_ids\n0,"[1]"\n1,"[2]\n2,[3]\n'):
        msg = one_line_error(run("stats", p, "--block-tokens", "16", "--json", "-"))
    assert msg.startswith(f"{p}:3: cannot read as csv: a quoted field opens on this line and is not closed")


@pytest.mark.parametrize("how", ["name", "option", "magic"])
def test_parquet_from_a_pipe_is_refused_naming_the_file(tmp_path, how):
    name = "p.parquet" if how == "name" else "p.data"
    p = fifo(tmp_path, name)
    table = tmp_path / "t.parquet"
    pl.DataFrame({"timestamp": [0.0], "block_ids": [[1]]}).write_parquet(table)
    options = ["--format", "parquet"] if how == "option" else []
    with Writer(p, table.read_bytes(), deadline=5.0 if how == "magic" else 1.0):
        msg = one_line_error(run("stats", p, "--block-tokens", "16", *options, "--json", "-"))
    assert msg == (f"{p}: is a pipe, and a Parquet trace is read with random access (its metadata is at its end): "
                   "write it to a file first and give that file")


@pytest.mark.parametrize("command", [["stats"], ["curve"], ["value"], ["whatif", "--dram", "1GiB"]])
def test_streaming_a_pipe_is_refused_before_pyarrow_waits_on_it(tmp_path, command):
    """--stream opens the Parquet metadata in native code: a FIFO without a writer would
    wait there beyond Ctrl+C's reach. The pipe is refused first (no writer: the test
    would hang if anything opened it)."""
    p = fifo(tmp_path, "s.parquet")
    msg = one_line_error(run(command[0], p, *command[1:], "--stream"))
    assert msg.startswith(f"{p}: is a pipe, and a Parquet trace is read with random access")


def test_a_pipe_longer_than_the_memory_allows_stops_naming_it(tmp_path):
    p = fifo(tmp_path, "p.jsonl")
    with Writer(p, CHAT.read_bytes()):
        msg = one_line_error(run("stats", p, "--json", "-", env={"KVTRACE_MEMORY_BUDGET": "64KiB"}))
    assert msg.startswith(f"{p}: is a pipe longer than 32 KiB (stopped there): a piped trace is held in memory")
    assert "KVTRACE_MEMORY_BUDGET allows 64 KiB" in msg


def test_an_empty_pipe(tmp_path):
    p = fifo(tmp_path, "p.jsonl")
    with Writer(p, b""):
        msg = one_line_error(run("stats", p, "--json", "-"))
    assert msg == f"{p}: no requests: the file is empty"


def holds_open(proc: subprocess.Popen, path: Path, within: float) -> bool:
    """Whether ``proc`` opens ``path`` within ``within`` seconds (``/proc/PID/fd``)."""
    end = time.monotonic() + within
    while time.monotonic() < end and proc.poll() is None:
        try:
            if any(os.readlink(f"/proc/{proc.pid}/fd/{fd}") == str(path) for fd in os.listdir(f"/proc/{proc.pid}/fd")):
                return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # as a terminal's Ctrl+C meets it (see test_interrupt.py)


@pytest.mark.parametrize("name", ["p.jsonl", "p.csv"])
def test_ctrl_c_ends_the_wait_for_a_fifo_writer(tmp_path, name):
    p = fifo(tmp_path, name)
    proc = subprocess.Popen([str(KVTRACE), "stats", str(p), "--block-tokens", "16"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
    try:
        assert holds_open(proc, p, within=60.0), proc.stderr.read()  # imports done: waiting on the FIFO
        time.sleep(1.0)
        assert proc.poll() is None, proc.stderr.read()
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        code = proc.wait(timeout=10)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 130, proc.stderr.read()
    assert took < 3.0
    assert proc.stderr.read().strip() == "kvtrace: interrupted"


# ----------------------------------------------------------------- 3. duplicate keys
def rec(ts, n_in, hashes, **extra) -> dict:
    return {"timestamp": ts, "input_length": n_in, "output_length": 1, "hash_ids": hashes, **extra}


def test_duplicate_key_in_a_trace_with_extra_fields(tmp_path):
    """Extra fields defeat the colon count: the per-field count and the suspect-line scan decide."""
    good = [json.dumps(rec(t, 512, [t], note="a: b", meta={"timestamp": 1})) for t in range(50)]
    bad = good[:30] + ['{"timestamp": 30, "input_length": 512, "note": "x", "input_length": 7, "output_length": 1, '
                       '"hash_ids": [30]}'] + good[30:]
    (tmp_path / "ok.jsonl").write_text("\n".join(good) + "\n")
    (tmp_path / "bad.jsonl").write_text("\n".join(bad) + "\n")
    assert read_requests(tmp_path / "ok.jsonl")[0].height == 50
    with pytest.raises(KvtraceError) as exc:
        read_requests(tmp_path / "bad.jsonl")
    assert exc.value.one_line() == f"{tmp_path / 'bad.jsonl'}:31: field 'input_length': duplicate key in one record"


def test_key_names_inside_strings_are_not_duplicates(tmp_path):
    """A line holding ``"input_length"`` twice (escaped inside a string) is scanned and passes."""
    line = json.dumps(rec(0, 512, [1], note='"input_length" "input_length"'))
    (tmp_path / "t.jsonl").write_text(line + "\n" + json.dumps(rec(1, 512, [2])) + "\n")
    assert read_requests(tmp_path / "t.jsonl")[0].height == 2


def test_duplicate_unknown_fields_and_nested_keys_are_ignored(tmp_path):
    (tmp_path / "t.jsonl").write_text('{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1], '
                                      '"note": 1, "note": 2, "meta": {"hash_ids": 1, "hash_ids": 2}}\n')
    assert read_requests(tmp_path / "t.jsonl")[0].height == 1


def test_duplicate_key_in_a_compressed_shard_of_a_directory(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    (d / "a.jsonl").write_text(json.dumps(rec(0, 512, [1])) + "\n")
    (d / "b.jsonl.gz").write_bytes(gzip.compress(
        (json.dumps(rec(1, 512, [2])) + '\n{"timestamp": 2, "timestamp": 3, "input_length": 512, "output_length": 1, '
         '"hash_ids": [3]}\n').encode()))
    msg = one_line_error(run("stats", d, "--json", "-"))
    assert msg == f"{d / 'b.jsonl.gz'}:2: field 'timestamp': duplicate key in one record"


def test_counts_see_a_needle_across_the_seam_of_two_pieces(tmp_path):
    """The file is counted in 4 MiB pieces: a key cut by a piece boundary still counts."""
    needle = b'"input_length"'
    for cut in range(1, len(needle)):
        p = tmp_path / f"c{cut}.jsonl"
        body = b"x" * ((4 << 20) - cut) + needle + b"y" * 10 + needle
        p.write_bytes(body)
        assert _count(str(p), [needle, b":", b'"hash_ids"']) == [2, 0, 0]
        assert _count(body, [needle, b":"]) == [2, 0]


def test_the_duplicate_check_keeps_a_large_trace_fast(tmp_path):
    """The happy path adds one compare-and-count pass (~1 ms per 4 MiB); here no more
    than a third of the read itself even on a loaded machine."""
    import time as _time

    from kvtrace.ingest.jsonl import _refuse_duplicate_keys

    lines = [json.dumps(rec(t, 512 * 8, list(range(t, t + 8))), separators=(",", ":")) for t in range(200_000)]
    p = tmp_path / "big.jsonl"
    p.write_text("\n".join(lines) + "\n")
    df, _, source, _ = read_requests(p)
    raw = pl.read_ndjson(p)
    t0 = _time.perf_counter()
    _refuse_duplicate_keys(raw.select("timestamp", "input_length", "output_length", "hash_ids"), str(p), str(p),
                           "mooncake")
    check = _time.perf_counter() - t0
    t0 = _time.perf_counter()
    pl.read_ndjson(p)
    read = _time.perf_counter() - t0
    assert check < read / 3, (check, read)


# ----------------------------------------------------------------- 4-6. nesting, empty path, blank lines
def test_deep_nesting_in_the_library_names_file_and_line(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(KvtraceError) as exc:
        read_requests(p)
    assert exc.value.one_line() == f"{p}:1: malformed JSON (nested too deeply)"


@pytest.mark.parametrize("call", [read_requests, load_trace, detect_format])
def test_an_empty_path_is_a_usage_error(call):
    with pytest.raises(UsageError) as exc:
        call("")
    assert exc.value.one_line() == "expected a trace path, got an empty string"


def test_a_blank_shard_among_others_is_skipped(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    (d / "a.jsonl").write_text("\n\n")
    (d / "b.jsonl").write_text(json.dumps(rec(0, 512, [1])) + "\n")
    assert source_format(open_source(str(d))) == "mooncake"


# ----------------------------------------------------------------- 7. third-party text
def test_third_party_messages_quote_no_file_content():
    exc = pl.exceptions.ComputeError('could not parse `"[2]\n2,"[3]"` as dtype `str` at column \'b\'\n\nmore')
    assert third_party_text(exc) == "could not parse ... as dtype ... at column 'b'"
    assert len(third_party_text(ValueError("x" * 500))) == 160
