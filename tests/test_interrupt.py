"""Interrupted and killed runs (issue 9): a ``kvtrace curve --out`` run stopped midway
by SIGINT, SIGTERM or SIGKILL leaves every previous output intact or replaced by a
complete new one, and no temporary file behind.

The runs are real processes on a 1.8M-access trace (about 5 s each when not stopped).
A kill lands either during loading and computing (after a delay) or while an output is
being written: the test watches ``/proc/PID/fd`` for the unnamed temporary file
(``O_TMPFILE``) the writer holds in the output directory and signals at that moment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAT = ROOT / "sample_traces" / "chat.jsonl"
OUTPUTS = ("curve.parquet", "curve.html", "distances.parquet")

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="watches /proc/PID/fd (Linux)")


def _default_sigint() -> None:
    # a child started from a background job inherits SIGINT ignored, and Python then
    # installs no handler: give it the disposition a terminal's Ctrl+C meets
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kvtrace(*args, env=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kvtrace.cli", *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
                            preexec_fn=_default_sigint)


def curve_args(trace: Path, out: Path, block_tokens: int = 16) -> list:
    return ["curve", trace, "--block-tokens", block_tokens, "--out", out / "curve.parquet", "--plot",
            out / "curve.html", "--distances-out", out / "distances.parquet"]


def big_trace(path: Path, requests: int = 120_000) -> None:
    """Chained prompts: half of each request continues one of 2,000 conversations."""
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 30, requests)
    offs = np.zeros(requests + 1, np.int64)
    np.cumsum(lens, out=offs[1:])
    n = int(offs[-1])
    pos = np.arange(n) - np.repeat(offs[:-1], lens)
    shared = pos < np.repeat(lens // 2, lens)
    fresh = rng.integers(2**62, 2**63 - 1, n)
    hashes = np.where(shared, np.repeat(rng.integers(0, 2000, requests), lens) * 1000 + pos, fresh).astype(np.uint64)
    table = pa.table({"timestamp": np.sort(rng.random(requests)) * 3600,
                      "block_ids": pa.ListArray.from_arrays(pa.array(offs.astype(np.int32)), pa.array(hashes))})
    pq.write_table(table, path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The big trace, the outputs of a small run (the "previous" outputs a stopped run
    must not destroy) and those of a complete big run (what a finished write holds)."""
    d = tmp_path_factory.mktemp("interrupt")
    trace = d / "big.parquet"
    big_trace(trace)
    previous, complete = d / "previous", d / "complete"
    previous.mkdir()
    complete.mkdir()
    small = kvtrace(*curve_args(CHAT, previous, block_tokens=512))
    full = kvtrace(*curve_args(trace, complete))
    assert small.wait() == 0 and full.wait() == 0, small.stderr.read() + full.stderr.read()
    read = lambda where: {name: (where / name).read_bytes() for name in OUTPUTS}  # noqa: E731
    return trace, read(previous), read(complete)


def temp_fds(pid: int, directory: Path) -> int:
    """How many unnamed temporary files in ``directory`` the process holds open."""
    n = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            n += target.startswith(str(directory) + "/#") and target.endswith("(deleted)")
    except FileNotFoundError:
        pass
    return n


def stop(proc: subprocess.Popen, sig: int, out: Path, when: str) -> str:
    """Signal ``proc`` after a delay (``after-1.5s``) or at the n-th output write
    (``write-n``); return what it was doing."""
    if when.startswith("after-"):
        stamps = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
        time.sleep(float(when[6:-1]))
        # on a fast machine the run may already be writing: say which it is, with the
        # process frozen so that it cannot start a write between the look and the signal
        if proc.poll() is not None:
            return "finished"
        proc.send_signal(signal.SIGSTOP)
        untouched = {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == stamps
        doing = "computing" if untouched and temp_fds(proc.pid, out) == 0 else "writing"
        proc.send_signal(sig)
        proc.send_signal(signal.SIGCONT)
        return doing
    else:
        wanted, seen, held = int(when[6:]), 0, False
        while proc.poll() is None:
            now = temp_fds(proc.pid, out) > 0
            if now and not held:
                seen += 1
                if seen == wanted:
                    break
            held = now
            time.sleep(0.001)
        doing = "writing"
    if proc.poll() is not None:
        return "finished"
    proc.send_signal(sig)
    return doing


@pytest.mark.parametrize("sig, when", [
    (signal.SIGINT, "after-1.5s"), (signal.SIGKILL, "after-1.5s"),
    (signal.SIGINT, "write-1"), (signal.SIGKILL, "write-1"),
    (signal.SIGINT, "write-3"), (signal.SIGKILL, "write-3"), (signal.SIGTERM, "write-3"),
], ids=lambda v: v.name if isinstance(v, signal.Signals) else v)
def test_stopped_curve_run_keeps_previous_outputs(tmp_path, runs, sig, when):
    trace, previous, complete = runs
    out = tmp_path / "out"
    out.mkdir()
    for name, data in previous.items():
        (out / name).write_bytes(data)
    proc = kvtrace(*curve_args(trace, out))
    doing = stop(proc, sig, out, when)
    code = proc.wait(timeout=120)
    err = proc.stderr.read()
    assert sorted(os.listdir(out)) == sorted(OUTPUTS), (doing, os.listdir(out))  # no temporary file
    for name in OUTPUTS:
        data = (out / name).read_bytes()
        assert data in (previous[name], complete[name]), (doing, name)  # old, or complete and new
    if doing == "finished":  # the run beat the signal: then it wrote everything
        assert code == 0 and all((out / n).read_bytes() == complete[n] for n in OUTPUTS)
        return
    if doing == "computing":
        changed = [n for n in OUTPUTS if (out / n).read_bytes() != previous[n]]
        assert not changed, (changed, code, err)
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
    elif sig == signal.SIGINT:
        assert code == 130 and err.strip().splitlines()[-1] == "kvtrace: interrupted", err
    else:
        assert code == 128 + signal.SIGTERM, err
    assert "Traceback" not in err


def test_killed_writer_with_named_temporary_files(tmp_path, runs):
    """Where the file system has no unnamed files (``KVTRACE_NAMED_TEMP=1`` forces that
    path), a SIGKILL during a write can leave a hidden temporary file; the previous
    output is intact, and the next write to that destination removes the leftover."""
    trace, previous, complete = runs
    out = tmp_path / "out"
    out.mkdir()
    for name, data in previous.items():
        (out / name).write_bytes(data)
    env = {"KVTRACE_NAMED_TEMP": "1"}
    proc = kvtrace(*curve_args(trace, out), env=env)
    while proc.poll() is None and not list(out.glob(".distances.parquet.*.tmp")):
        time.sleep(0.001)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=120)
    left = sorted(p.name for p in out.glob(".*.tmp"))
    for name in OUTPUTS:
        assert (out / name).read_bytes() in (previous[name], complete[name])
    again = kvtrace(*curve_args(CHAT, out, block_tokens=512), env=env)
    assert again.wait(timeout=120) == 0
    assert sorted(os.listdir(out)) == sorted(OUTPUTS), (left, os.listdir(out))
    assert all((out / n).read_bytes() == previous[n] for n in OUTPUTS)


@pytest.mark.parametrize("named", [False, True], ids=["unnamed", "named"])
def test_atomic_path_killed_mid_write(tmp_path, named):
    """The unit version: a process killed with half a file written."""
    dest = tmp_path / "out.parquet"
    dest.write_bytes(b"the previous output")
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from kvtrace.outputs import atomic_path
        with atomic_path({str(dest)!r}, named={named}) as tmp:
            with open(tmp, "wb") as fh:
                fh.write(b"PAR1 half of it")
                fh.flush()
                print("ready", flush=True)
                time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "ready"
    child.kill()
    child.wait()
    assert dest.read_bytes() == b"the previous output"
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "out.parquet")
    if not named:
        assert left == []  # an unnamed file dies with its process
        return
    assert len(left) == 1 and left[0].startswith(".out.parquet.") and left[0].endswith(".parquet.tmp")
    from kvtrace.outputs import write_bytes_atomic

    write_bytes_atomic(dest, b"new")  # the next write to the destination cleans up
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.parquet"]
