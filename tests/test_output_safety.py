"""Nothing lost (issue 17): an output never replaces an input, two outputs never share a
file, every output location is checked before the work, a command's outputs replace
their destinations together (validate all, then write all), a replaced file keeps its
mode, and the usage errors that used to run something else are one line, exit 2.

Every case runs the real command (typer's CliRunner on ``kvtrace.cli.app``) and checks
both the one-line error and that the input is byte for byte what it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtrace.cli import app
from kvtrace.outputs import atomic_path, check_outputs, output_transaction, write_table, write_text_atomic
from kvtrace.errors import UsageError

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RUNNER = CliRunner()


def run(*args, env: dict | None = None):
    return RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": "200", **(env or {})})


def one_line_error(res, code: int = 2) -> str:
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr, res.exception)
    errors = [line for line in res.stderr.splitlines() if line.startswith("kvtrace: error: ")]
    assert len(errors) == 1, res.stderr
    assert "Traceback" not in res.stdout + res.stderr and "internal error" not in errors[0]
    return errors[0][len("kvtrace: error: "):]


def rec(ts, n_in, hashes) -> dict:
    return {"timestamp": ts, "input_length": n_in, "output_length": 1, "hash_ids": hashes}


TRACE = "".join(json.dumps(r) + "\n" for r in (rec(0, 1024, [1, 2]), rec(1000, 512, [3]), rec(2000, 1024, [1, 2])))


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@pytest.fixture
def traces(tmp_path):
    """t.jsonl, its canonical t.parquet, a generic CSV table t.csv, and the JSONL as t.json and t.html."""
    jl = tmp_path / "t.jsonl"
    jl.write_text(TRACE)
    res = run("ingest", jl, "--out", tmp_path / "t.parquet")
    assert res.exit_code == 0, res.stderr
    (tmp_path / "t.csv").write_text("request_id,timestamp,input_length,hash_ids\n0,0,32,\"[1,2]\"\n1,1,16,\"[3]\"\n")
    (tmp_path / "t.json").write_text(TRACE)
    (tmp_path / "t.html").write_text(TRACE)
    return tmp_path


# the reproductions, and every other command with an output: (args, the input that must survive)
ONTO_INPUT = {
    "curve-out": (["curve", "{d}/t.parquet", "--block-tokens", 512, "--out", "{d}/t.parquet"], "t.parquet"),
    "curve-json": (["curve", "{d}/t.json", "--format", "mooncake", "--json", "{d}/t.json"], "t.json"),
    "curve-plot": (["curve", "{d}/t.html", "--format", "mooncake", "--plot", "{d}/t.html"], "t.html"),
    "curve-distances": (["curve", "{d}/t.parquet", "--distances-out", "{d}/t.parquet"], "t.parquet"),
    "whatif-out": (["whatif", "{d}/t.parquet", "--dram", "64GiB", "--out", "{d}/t.parquet"], "t.parquet"),
    "sql-out": (["sql", "{d}/t.csv", "--block-tokens", 16, "-c", "select 1 as x", "-o", "{d}/t.csv"], "t.csv"),
    "size-json": (["size", "{d}/t.json", "--format", "mooncake", "--json", "{d}/t.json"], "t.json"),
    "size-config": (["size", "{d}/t.jsonl", "--config", "{d}/t.json", "--json", "{d}/t.json"], "t.json"),
    "ingest-out": (["ingest", "{d}/t.parquet", "--block-tokens", 512, "-o", "{d}/t.parquet"], "t.parquet"),
    "value-out": (["value", "{d}/t.json", "--format", "mooncake", "--out", "{d}/t.json"], "t.json"),
    "value-accesses": (["value", "{d}/t.parquet", "--accesses-out", "{d}/t.parquet"], "t.parquet"),
    "stats-json": (["stats", "{d}/t.json", "--format", "mooncake", "--json", "{d}/t.json"], "t.json"),
    "export-whatif": (["export", "{d}/t.jsonl", "--db", "{d}/t.json", "--whatif", "{d}/t.json"], "t.json"),
    "sql-file": (["sql", "{d}/t.jsonl", "-f", "{d}/q.json", "-o", "{d}/q.json"], None),
}


@pytest.mark.parametrize("case", sorted(ONTO_INPUT))
def test_an_output_onto_an_input_is_refused_before_any_work(traces, case):
    args, keep = ONTO_INPUT[case]
    d = traces
    (d / "q.json").write_text("select 1 as x")
    before = {p.name: digest(p) for p in d.iterdir() if p.is_file()}
    res = run(*[str(a).format(d=d) for a in args])
    msg = one_line_error(res)
    assert "an output never replaces an input" in msg, msg
    after = {p.name: digest(p) for p in d.iterdir() if p.is_file()}
    assert after == before  # the input untouched, and nothing else written
    assert keep is None or (d / keep).exists()


def test_json_takes_only_a_json_suffix(traces):
    d = traces
    before = digest(d / "t.jsonl")
    msg = one_line_error(run("curve", d / "t.jsonl", "--json", d / "t.jsonl"))
    assert "field 'json': unsupported JSON file (suffix '.jsonl'): expected a .json file or -" in msg
    assert digest(d / "t.jsonl") == before
    msg = one_line_error(run("stats", d / "t.jsonl", "--json", d / "figures"))
    assert "unsupported JSON file (no suffix)" in msg


@pytest.mark.parametrize("how", ["symlink", "hardlink", "relative-dots"])
def test_the_same_file_under_another_name_is_refused(traces, how):
    d = traces
    if how == "symlink":
        (d / "alias.parquet").symlink_to(d / "t.parquet")
        other = d / "alias.parquet"
    elif how == "hardlink":
        os.link(d / "t.parquet", d / "alias.parquet")
        other = d / "alias.parquet"
    else:
        (d / "sub").mkdir()
        other = d / "sub" / ".." / "t.parquet"
    before = digest(d / "t.parquet")
    msg = one_line_error(run("curve", d / "t.parquet", "--out", other))
    assert "is the input TRACE: an output never replaces an input" in msg
    assert digest(d / "t.parquet") == before
    # and the other way round: the trace named by the alias, the output by its real name
    msg = one_line_error(run("whatif", other, "--dram", "64GiB", "--out", d / "t.parquet"))
    assert "an output never replaces an input" in msg
    assert digest(d / "t.parquet") == before


def test_an_output_inside_an_input_directory_of_shards_is_refused(traces):
    d = traces
    shards = d / "shards"
    shards.mkdir()
    (shards / "a.jsonl").write_text(TRACE)
    msg = one_line_error(run("value", shards, "--out", shards / "b.parquet"))
    assert "lies inside the input directory TRACE" in msg
    assert sorted(p.name for p in shards.iterdir()) == ["a.jsonl"]
    # a hard link to a shard from outside the directory is the shard
    os.link(shards / "a.jsonl", d / "elsewhere.json")
    msg = one_line_error(run("stats", shards, "--json", d / "elsewhere.json"))
    assert "an output never replaces an input" in msg


def test_export_parquet_directory_never_overwrites_the_trace(traces):
    d = traces
    pq_dir = d / "tables"
    pq_dir.mkdir()
    trace = pq_dir / "requests.parquet"  # the name export gives its requests table
    trace.write_bytes((d / "t.parquet").read_bytes())
    before = digest(trace)
    msg = one_line_error(run("export", trace, "--db", d / "t.duckdb", "--parquet", pq_dir))
    assert "field 'parquet'" in msg and "an output never replaces an input" in msg
    assert digest(trace) == before and not (d / "t.duckdb").exists()


def test_two_outputs_of_one_run_cannot_share_a_file(traces):
    d = traces
    msg = one_line_error(run("curve", d / "t.jsonl", "--out", d / "x.json", "--json", d / "x.json"))
    assert "x.json: field 'json': is also the --out output of this run" in msg
    (d / "y.json").write_text("{}")
    (d / "z.json").symlink_to(d / "y.json")
    msg = one_line_error(run("value", d / "t.jsonl", "--prefixes-out", d / "y.json", "--out", d / "z.json"))
    assert "y.json: field 'prefixes-out': is also the --out output of this run" in msg
    assert (d / "y.json").read_text() == "{}"
    assert not (d / "x.json").exists()


def test_output_locations_are_checked_before_the_work(traces):
    d = traces
    msg = one_line_error(run("curve", d / "t.jsonl", "--out", d / "nodir" / "c.parquet"))
    assert "c.parquet: field 'out': the output's directory does not exist" in msg
    (d / "afile").write_text("x")
    msg = one_line_error(run("curve", d / "t.jsonl", "--plot", d / "afile" / "c.html"))
    assert "field 'plot': the output's directory is not a directory" in msg
    os.mkfifo(d / "p.parquet")
    msg = one_line_error(run("whatif", d / "t.jsonl", "--dram", "1GiB", "--out", d / "p.parquet"))
    assert "is a pipe (FIFO): expected a regular file to write" in msg
    assert stat.S_ISFIFO(os.stat(d / "p.parquet").st_mode)  # not replaced by a regular file


def test_a_later_failing_output_leaves_an_earlier_one_unreplaced(traces, monkeypatch):
    """Validate all, then write all: --out is complete when --plot fails, and stays unreplaced."""
    import kvtrace.results.charts

    d = traces
    (d / "existing.parquet").write_bytes(b"previous content")
    (d / "c.html").write_text("old chart")

    def failing_save_chart(chart, path):
        with atomic_path(path) as tmp:
            tmp.write_text("half a chart")
            raise RuntimeError("the renderer crashed")

    monkeypatch.setattr(kvtrace.results.charts, "save_chart", failing_save_chart)
    res = run("curve", d / "t.jsonl", "--out", d / "existing.parquet", "--plot", d / "c.html")
    assert res.exit_code == 1 and "the renderer crashed" in res.stderr
    assert (d / "existing.parquet").read_bytes() == b"previous content"
    assert (d / "c.html").read_text() == "old chart"
    assert sorted(p.name for p in d.iterdir() if p.name.startswith(".")) == []  # no temporary file


@pytest.mark.parametrize("named", [False, True])
def test_outputs_of_a_transaction_appear_together(tmp_path, monkeypatch, named):
    if named:
        monkeypatch.setenv("KVTRACE_NAMED_TEMP", "1")
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("old a")
    with output_transaction():
        write_text_atomic(a, "new a")
        assert a.read_text() == "old a"  # complete, but waiting for the rest
        write_text_atomic(b, "new b")
        assert not b.exists()
    assert (a.read_text(), b.read_text()) == ("new a", "new b")
    with pytest.raises(KeyboardInterrupt):
        with output_transaction():
            write_text_atomic(a, "newer a")
            raise KeyboardInterrupt
    assert a.read_text() == "new a"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]


@pytest.mark.parametrize("mode", [0o444, 0o640, 0o600])
@pytest.mark.parametrize("named", [False, True])
def test_a_replaced_file_keeps_its_mode(tmp_path, monkeypatch, mode, named):
    import polars as pl

    if named:
        monkeypatch.setenv("KVTRACE_NAMED_TEMP", "1")
    out = tmp_path / "c.parquet"
    out.write_bytes(b"old")
    out.chmod(mode)
    write_table(pl.DataFrame({"x": [1]}), out)
    assert stat.S_IMODE(os.stat(out).st_mode) == mode
    assert pl.read_parquet(out)["x"].to_list() == [1]


def test_a_new_destination_is_linked_in_one_call(tmp_path, monkeypatch):
    """A new file gets its name from linkat alone: no rename, so no moment at which a
    kill could leave a hidden temporary copy (only replacing an existing file has one)."""
    if not hasattr(os, "O_TMPFILE"):
        pytest.skip("no O_TMPFILE on this platform")
    monkeypatch.delenv("KVTRACE_NAMED_TEMP", raising=False)
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda *a, **k: renames.append(a) or real_replace(*a, **k))
    write_text_atomic(tmp_path / "new.txt", "x")
    assert renames == [] and (tmp_path / "new.txt").read_text() == "x"
    write_text_atomic(tmp_path / "new.txt", "y")  # replacing: link to a hidden name, then one rename
    assert len(renames) == 1 and Path(renames[0][0]).name.startswith(".new.txt.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.txt"]


def test_check_outputs_in_the_library(tmp_path):
    (tmp_path / "in.jsonl").write_text(TRACE)
    with pytest.raises(UsageError) as info:
        check_outputs({"out": tmp_path / "in.jsonl"}, {"TRACE": tmp_path / "in.jsonl"})
    assert info.value.field == "out"
    check_outputs({"out": tmp_path / "new.parquet", "json": "-", "plot": None}, {"TRACE": tmp_path / "in.jsonl"})
    with pytest.raises(UsageError):
        check_outputs({"out": ""})


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory no write can enter: a read-only bind mount as root (who writes
    anywhere else), mode 0555 otherwise."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0:
        ro.chmod(0o555)
        yield ro
        ro.chmod(0o755)
        return
    ok = subprocess.run(["mount", "--bind", str(ro), str(ro)], capture_output=True).returncode == 0
    if ok and subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True).returncode != 0:
        subprocess.run(["umount", str(ro)], capture_output=True)
        ok = False
    if not ok:
        pytest.skip("root, and no read-only bind mount can be made here")
    try:
        yield ro
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


def test_a_read_only_output_directory_is_refused_before_the_work(tmp_path, read_only_dir):
    """The refusal comes before the trace is read: the trace here is not even valid,
    so a check made after the work would report the trace instead."""
    (tmp_path / "bad.jsonl").write_text("not json\n")
    msg = one_line_error(run("curve", tmp_path / "bad.jsonl", "--out", read_only_dir / "c.parquet"))
    assert msg == f"{read_only_dir / 'c.parquet'}: field 'out': the output's directory is not writable"


# ------------------------------------------------------------------ one-line usage errors
@pytest.mark.parametrize("args, needle", [
    (["stats", ""], "Invalid value for 'TRACE': expected a path, got an empty string"),
    (["curve", "{t}", "--out", ""], "Invalid value for '--out' / '-o': expected a path, got an empty string"),
    (["whatif", "{t}", "--dram", "1GiB", "--policy", ""], "field 'policy': expected one or more values"),
    (["whatif", "{t}", "--dram", "1GiB", "--policy", " , "], "field 'policy': expected one or more values"),
    (["whatif", "{t}", "--dram", ""], "field 'dram': expected one or more values"),
    (["whatif", "{t}", "--dram", "1GiB", "--flash", ""], "field 'flash': expected one or more values"),
    (["curve", "{t}", "--capacity", ""], "field 'capacity': expected sizes such as 64GiB,1TiB, got an empty list"),
    (["curve", "{t}", "--scheduler", "tcp://127.0.0.1:8786"], "--scheduler applies only with --engine dask"),
    (["curve", "{t}", "--partitions", "4"], "--partitions applies only with --engine dask"),
    (["curve", "{t}", "--workers", "4"], "--workers applies only with --engine dask"),
    (["whatif", "{t}", "--dram", "1GiB", "--scheduler", "tcp://127.0.0.1:8786"],
     "--scheduler applies only with --engine dask"),
    # a size without a unit (issue 18): it ran 64 bytes, not 64 GiB
    (["curve", "{t}", "--capacity", "64"], "field 'capacity': '64' has no unit: write 64GiB, 64GB or 64B"),
    (["whatif", "{t}", "--dram", "256"], "'256' has no unit: write 256GiB, 256GB or 256B"),
])
def test_options_that_used_to_run_something_else_are_usage_errors(tmp_path, args, needle):
    t = tmp_path / "t.jsonl"
    t.write_text(TRACE)
    msg = one_line_error(run(*[a.format(t=t) for a in args]))
    assert needle in msg, msg


def test_out_of_memory_names_the_trace_and_advice_that_fits(tmp_path, monkeypatch):
    import kvtrace.analyses.curves
    import kvtrace.analyses.stats

    t = tmp_path / "t.jsonl"
    t.write_text(TRACE)

    def oom(*a, **k):
        raise MemoryError

    monkeypatch.setattr(kvtrace.analyses.curves, "compute_curve", oom)
    msg = one_line_error(run("curve", t), code=1)
    assert msg == f"{t}: out of memory in kvtrace curve: try --stream (a Parquet trace; convert it once with " \
                  "kvtrace ingest) or --sample-rate 0.01"
    monkeypatch.setattr(kvtrace.analyses.stats, "trace_stats", oom)
    msg = one_line_error(run("stats", t), code=1)
    assert msg.startswith(f"{t}: out of memory in kvtrace stats: ") and "--sample-rate" not in msg


def test_readme_lists_every_output_rule():
    """The README's "Outputs" table is this file's view: every rule id has a test here."""
    text = README.read_text(encoding="utf-8")
    section = text.split("### Outputs: what is refused", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    ids = set(re.findall(r"<!-- (\S+) -->", section))
    here = Path(__file__).read_text(encoding="utf-8")
    tests = set(re.findall(r"^def (test_\w+)", here, flags=re.M))
    assert ids and ids <= tests, ids - tests
