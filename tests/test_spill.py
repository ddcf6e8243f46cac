"""Spill directories (kvtrace.trace.spill): a killed streamed run's directory is removed by the next run, nothing else is.

The owner of a directory is a real process: a child that opens a stream and waits,
then is killed with SIGKILL (no chance to clean up), as the OOM killer would.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from kvtrace.trace import spill

from kvtrace.ingest import synth
from kvtrace.ingest.stream import open_stream

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs /proc (Linux)")

HOLD = """
import sys, time
from kvtrace.ingest.stream import open_stream
st = open_stream(sys.argv[1], spill_dir=sys.argv[2])
print(st.spill, flush=True)
time.sleep(600)
"""


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("spill") / "t.parquet"
    synth.write_chunked("chat", 200, 3, path, "parquet", chunk_requests=50)
    return path


@pytest.fixture
def holder(trace, tmp_path):
    """Start a process that holds a streamed trace in ``tmp_path``: (process, its spill dir)."""
    procs = []

    def start(parent=tmp_path):
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(trace), str(parent)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        line = proc.stdout.readline().strip()
        assert line, proc.stderr.read() if proc.poll() is not None else "no spill dir printed"
        return proc, line

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def kill(proc):
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def spill_dirs(parent):
    return sorted(p.name for p in parent.glob(spill.PREFIX + "*"))


def test_a_killed_runs_dir_is_removed_and_a_live_ones_kept(trace, tmp_path, holder, caplog):
    alive, alive_dir = holder()
    killed, killed_dir = holder()
    owner = json.loads((tmp_path / os.path.basename(killed_dir) / spill.OWNER_FILE).read_text())
    assert owner["pid"] == killed.pid and owner["start"] and owner["host"]
    kill(killed)
    assert os.path.isdir(killed_dir)  # SIGKILL: left behind
    with caplog.at_level(logging.WARNING, logger="kvtrace.trace.spill"):
        with open_stream(trace, spill_dir=tmp_path) as st:
            assert spill_dirs(tmp_path) == sorted([os.path.basename(alive_dir), st.spill.name])
            with open_stream(trace, spill_dir=tmp_path) as st2:  # this process's own open stream is kept
                assert st.spill.is_dir() and st2.spill.is_dir()
    assert not os.path.exists(killed_dir) and os.path.isdir(alive_dir)
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and killed_dir in msgs[0] and msgs[0].startswith("kvtrace: removed")
    kill(alive)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kvtrace.trace.spill"):
        with open_stream(trace, spill_dir=tmp_path):
            pass
    assert spill_dirs(tmp_path) == [] and len(caplog.records) == 1
    with caplog.at_level(logging.WARNING, logger="kvtrace.trace.spill"):
        with open_stream(trace, spill_dir=tmp_path):
            pass
    assert len(caplog.records) == 1  # nothing removed: nothing said


def test_cli_says_one_line_when_it_removed_something(trace, tmp_path, holder):
    killed, killed_dir = holder()
    kill(killed)
    run = [sys.executable, "-c", "from kvtrace.cli import app; app()", "stats", str(trace), "--stream", "--json", "-"]
    env = dict(os.environ, TMPDIR=str(tmp_path))
    res = subprocess.run(run, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert res.returncode == 0, res.stderr
    said = [ln for ln in res.stderr.splitlines() if "removed" in ln]
    assert len(said) == 1
    assert re.fullmatch(rf"kvtrace: removed the spill directory of a streamed run that was killed: "
                        rf"{re.escape(killed_dir)} \(\d[\d.]* [KM]iB\)", said[0]), said
    assert json.loads(res.stdout)["summary"]["requests"] == 200
    assert spill_dirs(tmp_path) == []
    res = subprocess.run(run, capture_output=True, text=True, env=env, timeout=600, check=False)
    assert res.returncode == 0 and "removed" not in res.stderr


def make_dir(parent, name, owner=None, age_s=0.0):
    d = parent / (spill.PREFIX + name)
    d.mkdir()
    (d / "blocks").write_bytes(b"\0" * 4096)
    if owner is not None:
        (d / spill.OWNER_FILE).write_text(owner if isinstance(owner, str) else json.dumps(owner))
    t = time.time() - age_s
    for p in (*d.iterdir(), d):
        os.utime(p, (t, t))
    return d


def test_only_certainly_stale_dirs_are_removed(tmp_path):
    me = spill.owner_record()
    day = 24 * 3600
    keep = [
        make_dir(tmp_path, "alive", me),
        make_dir(tmp_path, "other-host", {**me, "pid": 2**22 + 1, "host": me["host"] + "-elsewhere"}),
        make_dir(tmp_path, "unmarked-young"),
        make_dir(tmp_path, "garbage-young", "{not json"),
        make_dir(tmp_path, "no-pid", {**me, "pid": None}, age_s=2 * day),
    ]
    gone = [
        make_dir(tmp_path, "reused-pid", {**me, "start": "1"}),  # this pid, another start time
        make_dir(tmp_path, "rebooted", {**me, "boot": "another-boot"}),
        make_dir(tmp_path, "unmarked-old", age_s=2 * day),
        make_dir(tmp_path, "garbage-old", "[]", age_s=2 * day),
    ]
    # a symbolic link to a dead run's directory elsewhere: neither followed nor removed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = make_dir(elsewhere, "dead", {**me, "start": "1"})
    link = tmp_path / (spill.PREFIX + "link")
    link.symlink_to(target)
    not_ours = tmp_path / "kvtrace-other-dead"
    not_ours.mkdir()
    removed = spill.remove_stale(tmp_path)
    assert sorted(p.name for p, _ in removed) == sorted(d.name for d in gone)
    assert all(size >= 4096 for _, size in removed)  # the files' bytes
    assert all(d.is_dir() for d in keep) and not any(d.exists() for d in gone)
    assert link.is_symlink() and target.is_dir() and not_ours.is_dir()


def test_owner_gone_is_sure_or_says_no():
    me = spill.owner_record()
    assert not spill.owner_gone(me)
    assert spill.owner_gone({**me, "start": "1"})
    assert not spill.owner_gone({**me, "start": None})  # alive, start unknown: kept
    assert not spill.owner_gone({**me, "pid": "12"}) and not spill.owner_gone({**me, "pid": True})
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: its id is free
    assert spill.owner_gone({**me, "pid": proc.pid, "start": None})
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(200):  # not reaped yet: a zombie
            with open(f"/proc/{zombie.pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
            time.sleep(0.05)
        assert spill.owner_gone({**me, "pid": zombie.pid, "start": None})
    finally:
        zombie.wait()
