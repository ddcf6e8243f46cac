"""Output files (kvtrace.outputs), charts (kvtrace.results.charts) and units (kvtrace.units).

Every file kvtrace writes goes through ``atomic_path``: a failure or an interrupt
in the middle of writing must leave the previous file byte for byte, and no
temporary file behind.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import altair as alt
import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from polars.testing import assert_frame_equal

from kvtrace.results.charts import curve_chart, save_chart
from kvtrace.analyses.curves import compute_curve
from kvtrace.errors import KvtraceError, UsageError
from kvtrace.ingest.canonical import requests_to_trace
from kvtrace.outputs import atomic_path, table_format, write_json_atomic, write_table, write_text_atomic
from kvtrace.trace import TraceMeta
from kvtrace.units import format_bytes, format_seconds, parse_duration, parse_size, parse_sizes, size_text

OLD = b"the previous output\n"


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def temp_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.glob(".*.tmp"))


@pytest.fixture
def umask():
    """Set a process umask for one test, then restore the old one."""
    saved = os.umask(0o022)
    os.umask(saved)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(saved)


# ------------------------------------------------------------------- atomic_path


@pytest.fixture(params=["unnamed", "named"])
def temp_mode(request, monkeypatch):
    """Both kinds of temporary file: unnamed (Linux O_TMPFILE) and named (elsewhere)."""
    if request.param == "named":
        monkeypatch.setenv("KVTRACE_NAMED_TEMP", "1")
    else:
        monkeypatch.delenv("KVTRACE_NAMED_TEMP", raising=False)
        if not hasattr(os, "O_TMPFILE"):
            pytest.skip("no O_TMPFILE on this platform")
    return request.param


def test_atomic_path_writes_the_destination_on_success(tmp_path, temp_mode):
    dest = tmp_path / "out.csv"
    dest.write_bytes(OLD)
    with atomic_path(dest) as tmp:
        assert tmp != dest
        if temp_mode == "named":
            assert tmp.parent == tmp_path
            assert tmp.name.startswith(".out.csv.") and tmp.name.endswith(".csv.tmp")
        else:
            assert str(tmp).startswith("/proc/self/fd/")  # no name in the directory at all
            assert listing(tmp_path) == ["out.csv"]
        tmp.write_bytes(b"new\n")
        assert dest.read_bytes() == OLD  # nothing visible until the body finishes
    assert dest.read_bytes() == b"new\n"
    assert listing(tmp_path) == ["out.csv"]


def test_atomic_path_named_on_request(tmp_path):
    dest = tmp_path / "db.duckdb"
    with atomic_path(dest, suffix=".duckdb", named=True) as tmp:
        assert tmp.parent == tmp_path and tmp.name.endswith(".duckdb.tmp")
        tmp.write_bytes(b"x")
    assert dest.read_bytes() == b"x" and listing(tmp_path) == ["db.duckdb"]


@pytest.mark.parametrize("exc", [RuntimeError("disk on fire"), KeyboardInterrupt()], ids=["error", "interrupt"])
def test_atomic_path_keeps_the_old_file_when_the_body_raises(tmp_path, exc, temp_mode):
    dest = tmp_path / "curve.parquet"
    dest.write_bytes(OLD)
    with pytest.raises(type(exc)):
        with atomic_path(dest) as tmp:
            tmp.write_bytes(b"half a parq")
            raise exc
    assert dest.read_bytes() == OLD
    assert temp_files(tmp_path) == []
    assert listing(tmp_path) == ["curve.parquet"]


def test_atomic_path_interrupted_before_any_write_leaves_nothing(tmp_path, temp_mode):
    dest = tmp_path / "new.json"
    with pytest.raises(KeyboardInterrupt):
        with atomic_path(dest):
            raise KeyboardInterrupt
    assert listing(tmp_path) == []


def test_atomic_path_body_that_deletes_its_temp_file_still_raises_cleanly(tmp_path):
    dest = tmp_path / "x.csv"
    with pytest.raises(FileNotFoundError):
        with atomic_path(dest, named=True) as tmp:
            tmp.unlink()
    assert listing(tmp_path) == []


def test_stale_temporary_files_of_dead_processes_are_removed(tmp_path):
    import socket
    import subprocess
    import sys

    host = "".join(c for c in socket.gethostname() if c.isalnum())[:16] or "host"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()  # a pid that has exited
    stale = [f".out.csv.{host}-{dead}.abcd1234.csv.tmp", f".out.csv.{host}-{dead}.ab.duckdb.tmp.wal"]
    kept = [f".out.csv.{host}-{os.getpid()}.live.csv.tmp",  # a running process: still writing
            f".out.csv.otherhost-{dead}.x.csv.tmp",  # another machine's (shared file system)
            f".other.csv.{host}-{dead}.x.csv.tmp", "out.csv.tmp"]
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"partial")
    write_text_atomic(tmp_path / "out.csv", "a\n")
    assert listing(tmp_path) == sorted(kept + ["out.csv"])


def test_atomic_path_in_a_read_only_directory_is_a_user_error(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        with pytest.raises(KvtraceError) as info:
            write_text_atomic(ro / "x.csv", "a")
        assert "cannot write here" in str(info.value)
    finally:
        ro.chmod(0o755)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600), (0o002, 0o664)])
def test_new_file_mode_follows_the_umask(tmp_path, umask, mask, mode, temp_mode):
    umask(mask)
    dest = tmp_path / "out.json"
    write_json_atomic(dest, {"a": 1})
    assert dest.stat().st_mode & 0o777 == mode == 0o666 & ~mask


def test_atomic_path_missing_directory_is_a_user_error(tmp_path):
    dest = tmp_path / "missing" / "out.csv"
    with pytest.raises(KvtraceError) as info:
        with atomic_path(dest):
            pass  # pragma: no cover
    assert info.value.path == str(tmp_path / "missing")
    assert "directory does not exist" in str(info.value)
    assert listing(tmp_path) == []


def test_atomic_path_onto_a_directory_names_the_directory(tmp_path):
    target = tmp_path / "adir"
    target.mkdir()
    with pytest.raises(KvtraceError) as info:
        with atomic_path(target) as tmp:
            tmp.write_text("x")  # pragma: no cover
    assert info.value.path == str(target)  # not the temporary file
    assert listing(tmp_path) == ["adir"]
    assert listing(target) == []


def test_atomic_path_relative_destination(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_text_atomic("rel.txt", "héllo")
    assert (tmp_path / "rel.txt").read_text(encoding="utf-8") == "héllo"
    assert listing(tmp_path) == ["rel.txt"]


def test_write_json_atomic_nonfinite_floats_and_numpy_scalars(tmp_path):
    dest = tmp_path / "x.json"
    write_json_atomic(dest, {"inf": math.inf, "ninf": -math.inf, "nan": math.nan, "i": np.int64(7),
                             "f": np.float64(0.25), "nested": [1.5, (np.float32(2.0), math.inf)], 3: "k"})
    assert json.loads(dest.read_text()) == {"inf": None, "ninf": None, "nan": None, "i": 7, "f": 0.25,
                                            "nested": [1.5, [2.0, None]], "3": "k"}


# ------------------------------------------------------------------ write_table

TABLE = pl.DataFrame({
    "capacity_bytes": pl.Series([1 << 30, 64 << 30, 1 << 40], dtype=pl.Int64),
    "rate": [0.1, 1 / 3, 0.9999999999999999],
    "label": ["a", "b", "c"],
})
META = {"info": {"model": "Llama-3.1-8B", "kv_bytes_per_token": 131072}, "ceiling": {"x": math.inf}, "k": [1, 2]}
META_JSON = {"info": {"model": "Llama-3.1-8B", "kv_bytes_per_token": 131072}, "ceiling": {"x": None}, "k": [1, 2]}


@pytest.mark.parametrize("name", ["t.parquet", "t.pq", "T.PARQUET"])
def test_write_table_parquet_round_trip_with_metadata(tmp_path, name):
    dest = tmp_path / name
    write_table(TABLE, dest, metadata=META)
    assert_frame_equal(pl.read_parquet(dest), TABLE, check_exact=True)
    md = pq.read_schema(dest).metadata
    assert json.loads(md[b"kvtrace"]) == META_JSON
    assert temp_files(tmp_path) == []


def test_write_table_parquet_without_metadata_has_no_kvtrace_key(tmp_path):
    dest = tmp_path / "t.parquet"
    write_table(TABLE, dest)
    assert b"kvtrace" not in (pq.read_schema(dest).metadata or {})


def test_write_table_csv_round_trip(tmp_path):
    dest = tmp_path / "t.csv"
    write_table(TABLE, dest, metadata=META)  # CSV has no place for metadata
    assert_frame_equal(pl.read_csv(dest), TABLE, check_exact=True)
    assert dest.read_text().splitlines()[0] == "capacity_bytes,rate,label"


def test_write_table_json_round_trip_with_metadata(tmp_path):
    dest = tmp_path / "t.json"
    df = TABLE.with_columns(pl.Series("d", [1.0, math.inf, math.nan]))
    write_table(df, dest, metadata=META)
    payload = json.loads(dest.read_text())
    assert set(payload) == {"metadata", "rows"}
    assert payload["metadata"] == META_JSON
    assert payload["rows"] == [
        {"capacity_bytes": 1 << 30, "rate": 0.1, "label": "a", "d": 1.0},
        {"capacity_bytes": 64 << 30, "rate": 1 / 3, "label": "b", "d": None},
        {"capacity_bytes": 1 << 40, "rate": 0.9999999999999999, "label": "c", "d": None},
    ]
    write_table(TABLE, dest)
    assert json.loads(dest.read_text())["metadata"] == {}


def test_write_table_replaces_an_existing_file(tmp_path):
    dest = tmp_path / "t.csv"
    dest.write_bytes(OLD)
    write_table(TABLE.head(1), dest)
    assert pl.read_csv(dest).height == 1
    assert listing(tmp_path) == ["t.csv"]


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()],
                         ids=["disk-full", "interrupt"])
def test_write_table_failure_mid_write_keeps_the_old_file(tmp_path, monkeypatch, exc, temp_mode):
    dest = tmp_path / "t.parquet"
    dest.write_bytes(OLD)

    def partial_write(table, where, **kwargs):
        Path(where).write_bytes(b"PAR1 and then")
        raise exc

    monkeypatch.setattr(pq, "write_table", partial_write)
    with pytest.raises(type(exc)):
        write_table(TABLE, dest, metadata=META)
    assert dest.read_bytes() == OLD
    assert temp_files(tmp_path) == []
    assert listing(tmp_path) == ["t.parquet"]


@pytest.mark.parametrize("name, fmt", [("a.parquet", "parquet"), ("a.pq", "parquet"), ("A.Parquet", "parquet"),
                                       ("a.csv", "csv"), ("dir.v2/a.CSV", "csv"), ("a.json", "json")])
def test_table_format(name, fmt):
    assert table_format(name) == fmt
    assert table_format(Path(name)) == fmt


@pytest.mark.parametrize("name, suffix", [("a.txt", ".txt"), ("a.csv.gz", ".gz"), ("noext", ""),
                                          ("a.jsonl", ".jsonl"), ("a.xlsx", ".xlsx")])
def test_table_format_errors(tmp_path, name, suffix):
    with pytest.raises(UsageError) as info:  # a bad option value: exit status 2
        table_format(name)
    assert info.value.path == name
    found = f"suffix '{suffix}'" if suffix else "no suffix"
    assert str(info.value).startswith(f"{name}: unsupported output file ({found})")
    assert str(info.value).endswith("expected .parquet, .csv or .json")
    with pytest.raises(KvtraceError):
        write_table(TABLE, tmp_path / name)
    assert listing(tmp_path) == []  # refused before creating anything


# ------------------------------------------------------------------------ units


def test_parse_size_units_are_case_insensitive_and_may_follow_a_space():
    """The README's decision (Conventions: sizes): one size, however the unit is cased or spaced."""
    assert {parse_size(t) for t in ("64GiB", "64 GiB", "64gib", "64 gib", "64GIB", " 64 Gi ")} == {64 * 2**30}
    assert {parse_size(t) for t in ("500GB", "500 gb", "500Gb")} == {500 * 10**9}


@pytest.mark.parametrize("text, value", [
    ("64GiB", 64 * 2**30),
    ("1.5TiB", 3 * 2**39),
    ("500GB", 500 * 10**9),
    ("4096B", 4096),
    ("  2 gib ", 2 * 2**30),
    ("1KiB", 1024),
    ("1k", 1024),
    ("3M", 3 * 2**20),
    ("1Ti", 2**40),
    ("2PiB", 2 * 2**50),
    ("1KB", 1000),
    ("8.2GB", 8_200_000_000),  # float 8.2 * 1e9 = 8199999999.999999
    ("1.005KB", 1005),
    ("0.5KiB", 512),
    ("1.1GiB", 1181116006),  # 1.1 x 2**30 = 1181116006.4, rounded down
    (".5MB", 500_000),
    ("1e3B", 1000),
    ("2E1KB", 20_000),
])
def test_parse_size(text, value):
    got = parse_size(text)
    assert got == value
    assert type(got) is int


@pytest.mark.parametrize("text", ["", "  ", "GiB", "12XB", "-1GiB", "0", "0GB", "1,5GiB", "1e400", "inf", "nan",
                                  "64 GiB extra", "1.2.3", "0x10",
                                  "8192PiB", "999999999999999999999999999999PiB"])  # >= 2**63 bytes
def test_parse_size_rejects(text):
    with pytest.raises(UsageError) as info:
        parse_size(text, field="dram")
    assert info.value.field == "dram"
    assert str(info.value).startswith("field 'dram': ")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("text", ["64", "4096", " 1e3 ", "0.5"])
def test_a_size_without_a_unit_is_refused(text):
    with pytest.raises(UsageError) as info:
        parse_size(text, field="capacity")
    n = text.strip()
    assert str(info.value) == f"field 'capacity': '{n}' has no unit: write {n}GiB, {n}GB or {n}B"


@pytest.mark.parametrize("n", [1, 4097, 2**30, 448 * 2**30, 3840 * 10**9, 2**50, 3 * 2**39, 10**12 + 1])
def test_size_text_reads_back_exactly(n):
    assert parse_size(size_text(n)) == n


def test_size_text_is_the_short_form():
    assert [size_text(n) for n in (481036337152, 3840 * 10**9, 4097, 0)] == ["448GiB", "3840GB", "4097B", "0"]


def test_parse_size_default_field_is_capacity():
    with pytest.raises(UsageError) as info:
        parse_size("12XB")
    assert str(info.value) == "field 'capacity': unknown size unit 'XB' in '12XB' (use KiB..PiB or KB..PB)"


def test_parse_sizes():
    assert parse_sizes("1GiB,64GiB, 500GB,") == [2**30, 64 * 2**30, 500 * 10**9]
    for bad in ("", ",", " , "):
        with pytest.raises(UsageError):
            parse_sizes(bad)
    with pytest.raises(UsageError):
        parse_sizes("1GiB,12XB")


@pytest.mark.parametrize("text, seconds", [
    ("90", 90.0), ("90s", 90.0), ("90sec", 90.0), ("250ms", 0.25), ("10min", 600.0), ("10m", 600.0),
    ("2h", 7200.0), ("1d", 86400.0), ("1.5h", 5400.0), (" 3 S ", 3.0), ("0", 0.0),
])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "10 parsecs", "-5s", "5 min ago", "1w", "ms"])
def test_parse_duration_rejects(text):
    with pytest.raises(UsageError) as info:
        parse_duration(text, field="warmup")
    assert info.value.field == "warmup"


@pytest.mark.parametrize("n, text", [
    (0, "0 B"), (1, "1 B"), (1023, "1023 B"), (1024, "1 KiB"), (1536, "1.5 KiB"), (2**20, "1 MiB"),
    (64 * 2**30, "64 GiB"), (100 * 2**30, "100 GiB"), (3 * 2**39, "1.5 TiB"), (1.25 * 2**50, "1.25 PiB"),
    (1953 * 2**20, "1.91 GiB"), (500 * 10**9, "466 GiB"), (-2048, "-2 KiB"), (math.inf, "inf"),
    (0.0, "0 B"), (512.0, "512 B"), (100.7, "101 B"), (np.int64(4096), "4 KiB"), (np.float64(1.5 * 2**30), "1.5 GiB"),
])
def test_format_bytes(n, text):
    assert format_bytes(n) == text


@pytest.mark.parametrize("s, text", [
    (0.042, "42 ms"), (3.2, "3.2 s"), (119, "119 s"), (306, "5.1 min"), (7200, "2 h"), (math.nan, "-"),
])
def test_format_seconds(s, text):
    assert format_seconds(s) == text


# ----------------------------------------------------------------------- charts


def tiny_chart() -> alt.Chart:
    return alt.Chart(pl.DataFrame({"x": [1, 2, 3], "y": [0.1, 0.5, 0.7]})).mark_line().encode(x="x:Q", y="y:Q")


@pytest.fixture(scope="module")
def curve_result():
    rows = pl.DataFrame({
        "request_id": [0, 1, 2, 3], "timestamp": [0.0, 10.0, 20.0, 30.0],
        "input_tokens": [8, 8, 12, 8], "output_tokens": [1, 1, 1, 1],
        "block_ids": [[1, 2], [1, 2], [1, 2, 3], [4, 5]],
    })
    trace = requests_to_trace(rows, TraceMeta(block_tokens=4, source_format="parquet"))
    return compute_curve(trace, model="Llama-3.1-8B", points=8)


MAGIC = {
    "png": lambda b: b.startswith(b"\x89PNG\r\n\x1a\n"),
    "svg": lambda b: b.lstrip().startswith(b"<svg") and b.rstrip().endswith(b"</svg>"),
    "html": lambda b: b"<html" in b[:200] and b"</html>" in b[-200:],
}


@pytest.mark.parametrize("fmt", ["png", "svg", "html"])
def test_save_chart_formats(tmp_path, fmt, curve_result):
    dest = tmp_path / f"chart.{fmt}"
    save_chart(curve_chart(curve_result, marks={"DRAM": 2**30}), dest)
    data = dest.read_bytes()
    assert MAGIC[fmt](data), data[:80]
    assert listing(tmp_path) == [dest.name]


def test_save_chart_html_is_self_contained(tmp_path):
    dest = tmp_path / "c.html"
    save_chart(tiny_chart(), dest)
    html = dest.read_text(encoding="utf-8")
    assert "<script src=\"http" not in html and "cdn.jsdelivr" not in html  # opens offline


def test_save_chart_replaces_and_keeps_on_failure(tmp_path, monkeypatch):
    import vl_convert

    dest = tmp_path / "c.svg"
    dest.write_bytes(OLD)

    def boom(*a, **k):
        raise RuntimeError("renderer crashed")

    monkeypatch.setattr(vl_convert, "vegalite_to_svg", boom)
    with pytest.raises(RuntimeError):
        save_chart(tiny_chart(), dest)
    assert dest.read_bytes() == OLD
    assert temp_files(tmp_path) == []


@pytest.mark.parametrize("name", ["c.gif", "c.pdf", "c", "c.svg.txt"])
def test_save_chart_bad_suffix(tmp_path, name):
    with pytest.raises(UsageError) as info:
        save_chart(tiny_chart(), tmp_path / name)
    suffix = Path(name).suffix
    assert f"unsupported plot file ({f'suffix {suffix!r}' if suffix else 'no suffix'})" in str(info.value)
    assert "expected .html, .png or .svg" in str(info.value)
    assert info.value.path == str(tmp_path / name)
    assert listing(tmp_path) == []


def test_curve_chart_marks_an_approximate_curve(curve_result):
    spec = curve_chart(curve_result).to_dict()
    assert "approximate" not in json.dumps(spec["title"])
    assert "Llama-3.1-8B (131,072 B/token), prefix-aware LRU" in json.dumps(spec["title"])
    curve_result.info["sample_rate"] = 0.5
    try:
        spec = curve_chart(curve_result).to_dict()
    finally:
        curve_result.info["sample_rate"] = 1.0
    assert "SHARDS sample rate 0.5 (approximate)" in json.dumps(spec["title"])
