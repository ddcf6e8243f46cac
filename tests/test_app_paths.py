"""What a browser can make the dashboard's server read, and for how long.

Anyone who can open the page chooses a trace: a server path is read only under the
data directory (``kvtrace app --data-dir``), resolved first (``..``, symlinks), as a
regular file or a directory of JSONL shards (no FIFO, device or socket), up to the
size limit (``--max-trace-bytes``; uploads too), and a page's error line never shows
what the file holds. A script run that Streamlit asks to stop (a closed tab) stops its
work at the next progress callback.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from kvtrace.app import launcher, sources

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest

ROOT = Path(__file__).resolve().parent.parent
ENTRY = ROOT / "analytics" / "kvtrace" / "app" / "kvtrace_app.py"
CHAT = ROOT / "sample_traces" / "chat.jsonl"
SECRET = "AKIAIOSFODNN7EXAMPLE"
SECRET_LINE = f"aws_secret_access_key={SECRET}"
TIMEOUT = 120  # seconds per script run: the first one compiles the kernels when the Numba cache is cold


@pytest.fixture(autouse=True)
def data(monkeypatch, tmp_path) -> Path:
    """The data directory ``tmp_path/data``; a planted secret next to it, outside."""
    monkeypatch.syspath_prepend(str(ENTRY.parent))
    for k in (launcher.ENV_TRACE, launcher.ENV_FORMAT, launcher.ENV_BLOCK_TOKENS, launcher.ENV_SHARE_TENANTS,
              launcher.ENV_SAMPLES, launcher.ENV_DATA_DIR, launcher.ENV_MAX_TRACE_BYTES,
              launcher.ENV_LOG_OPTIONS):
        monkeypatch.delenv(k, raising=False)
    root = tmp_path / "data"
    root.mkdir()
    monkeypatch.setenv(launcher.ENV_DATA_DIR, str(root))
    (tmp_path / "secret.csv").write_text(SECRET_LINE + "\n")
    return root


@pytest.fixture
def reads(monkeypatch) -> list[str]:
    """Paths the app hashed or parsed (each read of a trace goes through one of them)."""
    seen: list[str] = []
    real_hash, real_load = sources.file_sha256, sources._load

    def file_sha256(path, **kw):
        seen.append(str(path))
        return real_hash(path, **kw)

    def load(path, options):
        seen.append(str(path))
        return real_load(path, options)

    monkeypatch.setattr(sources, "file_sha256", file_sha256)
    monkeypatch.setattr(sources, "_load", load)
    return seen


def everything(at: AppTest) -> str:
    """Every element the page drew, as text (errors, captions, widgets, charts' data)."""
    out, todo = [], [at._tree]
    while todo:
        node = todo.pop()
        if getattr(node, "proto", None) is not None:
            out.append(str(node.proto))
        todo.extend(getattr(node, "children", {}).values())
    return "\n".join(out)


def server_path(text: str, fmt: str = "auto", timeout: float = TIMEOUT) -> AppTest:
    """The Overview page on the server path ``text`` (read as ``fmt``)."""
    at = AppTest.from_file(str(ENTRY), default_timeout=timeout)
    at.session_state["kv_source"] = "server path"
    at.session_state["kv_path"] = text
    at.session_state["kv_fmt"] = fmt
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def refusal(at: AppTest) -> str:
    assert len(at.error) == 1, [e.value for e in at.error]
    assert not at.metric  # nothing was shown as if read
    return at.error[0].value


def upload(name: str, data: bytes) -> AppTest:
    at = AppTest.from_file(str(ENTRY), default_timeout=TIMEOUT)
    at.session_state["kv_source"] = "upload"
    at.run()
    at.sidebar.file_uploader[0].set_value((name, data, "application/octet-stream"))
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


# --------------------------------------------------------------------------- confinement


@pytest.mark.parametrize("fmt", ["csv", "auto"])
def test_a_secret_outside_the_root_is_refused_unread(tmp_path, data, reads, fmt):
    for text in (str(tmp_path / "secret.csv"), "../secret.csv", f"{data}/../secret.csv"):
        at = server_path(text, fmt)
        msg = refusal(at)
        assert msg == f"{text}: outside the data directory {data}: the dashboard reads traces under it only " \
                      "(kvtrace app --data-dir)"
        assert SECRET not in everything(at)
    assert reads == []


@pytest.mark.parametrize("text", ["/etc/passwd", "/etc/shadow", "../../../../etc/hostname", "/dev/zero",
                                  "/proc/self/environ"])
def test_system_files_are_outside_the_root(reads, text):
    msg = refusal(server_path(text, "csv", timeout=30))
    assert "outside the data directory" in msg and "root:" not in msg
    assert reads == []


def test_a_symlink_escaping_the_root_is_refused(tmp_path, data, reads):
    (data / "link.csv").symlink_to(tmp_path / "secret.csv")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(CHAT, outside / "chat.jsonl")
    (data / "sub").symlink_to(outside, target_is_directory=True)
    for text in ("link.csv", "sub/chat.jsonl", "sub"):
        at = server_path(text, "csv" if text.endswith(".csv") else "auto")
        assert "outside the data directory" in refusal(at)
        assert SECRET not in everything(at)
    assert reads == []


def test_a_shard_escaping_the_root_refuses_its_directory(tmp_path, data, reads):
    shards = data / "shards"
    shards.mkdir()
    shutil.copy(CHAT, shards / "part-1.jsonl")
    (shards / "part-2.jsonl").symlink_to(tmp_path / "secret.csv")
    assert refusal(server_path("shards")) == f"shards: shard part-2.jsonl is outside the data directory {data}"
    assert reads == []


def test_a_directory_of_shards_inside_the_root_is_read(data):
    shards = data / "shards"
    shards.mkdir()
    lines = CHAT.read_bytes().splitlines(keepends=True)
    (shards / "part-1.jsonl").write_bytes(b"".join(lines[:1000]))
    (shards / "part-2.jsonl").write_bytes(b"".join(lines[1000:]))
    at = server_path("shards")
    assert not at.error
    assert {m.label: m.value for m in at.metric}["requests"] == "4,000"


def test_fifos_and_devices_are_refused_unopened(data, reads, monkeypatch):
    os.mkfifo(data / "trace.jsonl")  # opening it would block until a writer came
    msg = refusal(server_path("trace.jsonl", timeout=30))
    assert msg == "trace.jsonl: not a regular file (a device, FIFO or socket): expected a trace file or a " \
                  "directory of JSONL shards"
    monkeypatch.setenv(launcher.ENV_DATA_DIR, "/dev")  # a device inside the root: /dev/zero never ends
    assert "not a regular file" in refusal(server_path("zero", "csv", timeout=30))
    assert reads == []


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(data, reads, monkeypatch):
    monkeypatch.setenv(launcher.ENV_MAX_TRACE_BYTES, "1000")
    shutil.copy(CHAT, data / "chat.jsonl")
    at = server_path("chat.jsonl")
    size = (data / "chat.jsonl").stat().st_size
    from kvtrace.units import format_bytes

    assert refusal(at) == (f"chat.jsonl: {format_bytes(size)}, above the dashboard's limit of 1000 B per trace "
                           "(kvtrace app --max-trace-bytes)")
    assert any("at most 1000 B per trace" in c.value for c in at.sidebar.caption)  # the sidebar states it
    assert reads == []


def test_an_upload_over_the_size_limit_is_refused_before_it_is_read(reads, monkeypatch):
    monkeypatch.setenv(launcher.ENV_MAX_TRACE_BYTES, "1000")
    at = upload("chat.jsonl", CHAT.read_bytes())
    assert "above the dashboard's limit of 1000 B per trace" in refusal(at)
    assert reads == []


def test_hashing_is_bounded_and_stoppable(tmp_path):
    from kvtrace.errors import KvtraceError

    with pytest.raises(KvtraceError, match="above the dashboard's limit"):  # an endless file
        sources.file_sha256("/dev/zero", max_bytes=10 * 2**20)
    big = tmp_path / "big.bin"
    big.write_bytes(b"\0" * (3 * sources._HASH_CHUNK))
    calls = []

    def stop(done, total):
        calls.append((done, total))
        raise KeyboardInterrupt  # as StopException would: out of the hash loop

    with pytest.raises(KeyboardInterrupt):
        sources.file_sha256(big, progress=stop)
    assert calls == [(sources._HASH_CHUNK, 3 * sources._HASH_CHUNK)]


# --------------------------------------------------------------------------- error lines

BAD_CSVS = {
    "a header that is a secret": f"{SECRET_LINE}\nfoo\n",
    "a value that is not a number": f"timestamp,input_length,output_length,hash_ids\n{SECRET},1,1,\"[1]\"\n",
    "a hash that is not an integer": f"timestamp,input_length,output_length,hash_ids\n0,1,1,{SECRET}\n",
    "a quote left open (Polars quotes the line)": f"a,b\n{SECRET},\"x\n",
}


@pytest.mark.parametrize("content", list(BAD_CSVS.values()), ids=list(BAD_CSVS))
@pytest.mark.parametrize("source", ["server path", "upload"])
def test_error_lines_never_quote_the_file(data, source, content):
    if source == "server path":
        (data / "creds.csv").write_text(content)
        at = server_path("creds.csv", "csv")
    else:
        at = upload("creds.csv", content.encode())
    msg = refusal(at)
    assert msg.startswith("creds.csv") and "\n" not in msg
    assert SECRET not in everything(at), msg


def test_error_line_keeps_the_expected_structure():
    from kvtrace.errors import KvtraceError

    try:
        try:
            raise ValueError(f"could not parse `{SECRET}` as dtype i64")
        except ValueError as exc:
            raise KvtraceError(f"cannot read as csv: {exc}", path="t.csv", line=2) from None
    except KvtraceError as exc:
        assert sources.error_line(exc, "t.csv") == "t.csv:2: cannot read as csv"
    exc = KvtraceError(f"expected numbers, got '{SECRET}'", path="t.csv", line=2, field="timestamp")
    assert sources.error_line(exc, "t.csv") == "t.csv:2: field 'timestamp': expected numbers"
    exc = KvtraceError(f"expected a list column of block hashes (block_ids/hash_ids); found columns: {SECRET}",
                       path="t.csv")
    assert sources.error_line(exc, "t.csv") == "t.csv: expected a list column of block hashes (block_ids/hash_ids)"


# --------------------------------------------------------------------------- a stopped run


def test_a_stopped_run_stops_its_work_at_the_next_progress_callback(data, monkeypatch):
    """AppTest's timeout asks the script runner to stop (``ScriptRunner.request_stop``),
    the call Streamlit makes when a browser session disconnects
    (``WebsocketSessionManager.disconnect_session`` -> ``AppSession.request_script_stop``),
    then waits for the run to end. The work here reports progress every millisecond
    and would take 1000 s; the progress bar redraws only every 2%, i.e. every 20 s."""
    import kvtrace.app.cached

    shutil.copy(CHAT, data / "chat.jsonl")
    steps = []
    total = 1_000_000

    def endless(trace, eviction, progress=None, **kw):
        for i in range(total):
            time.sleep(0.001)
            steps.append(i)
            progress(i, total)
        raise AssertionError("the work ran to completion after its run was stopped")

    monkeypatch.setattr(kvtrace.app.cached, "reuse_distances", endless)
    kvtrace.app.cached.distances.clear()
    at = server_path("chat.jsonl")
    assert not at.error, at.error[0].value
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="timed out"):
        at.switch_page("views/curves.py").run(timeout=3)
    waited = time.monotonic() - t0
    done = len(steps)
    time.sleep(0.5)
    assert len(steps) == done, "the work went on after the run ended"
    assert 0 < done < total and waited < 3 + 5, (done, waited)
