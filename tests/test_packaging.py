"""Packaging: the package list in pyproject.toml is the tree; the wheel holds the app, the
SQL files and the samples and runs from a fresh virtual environment; an optional
dependency that is missing is a one-line error naming the extra that installs it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "analytics" / "kvtrace"
CHAT = ROOT / "sample_traces" / "chat.jsonl"


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_package_list_is_every_package_of_the_tree():
    listed = _pyproject()["tool"]["setuptools"]["packages"]
    in_tree = sorted(".".join(p.parent.relative_to(PKG.parent).parts) for p in PKG.rglob("__init__.py"))
    assert sorted(listed) == sorted(in_tree + ["kvtrace.samples"])
    assert _pyproject()["tool"]["setuptools"]["package-dir"]["kvtrace.samples"] == "sample_traces"
    assert (ROOT / "sample_traces" / "__init__.py").is_file()


def test_dev_has_every_extra():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert {"app", "png", "dask", "dev"} <= set(extras)
    assert any(d.replace(" ", "").startswith("kvtrace[") and set(d.split("[")[1].rstrip("]").split(","))
               >= {"app", "png", "dask"} for d in extras["dev"])
    required = " ".join(_pyproject()["project"]["dependencies"])
    assert "streamlit" not in required and "vl-convert" not in required


# A missing optional dependency, simulated: a None entry in sys.modules makes its import fail.
_WITHOUT = ("import sys\nsys.modules[{module!r}] = None\nfrom kvtrace.cli import main\n"
            "sys.argv = ['kvtrace', *{args!r}]\nmain()\n")


def _run_without(module: str, *args: str) -> subprocess.CompletedProcess:
    code = _WITHOUT.format(module=module, args=list(args))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.mark.parametrize("module", ["streamlit", "vl_convert"])
def test_app_without_its_extra_is_one_line_naming_it(module):
    res = _run_without(module, "app", "--headless", "--port", "1")
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith("kvtrace: error: kvtrace app needs ") and "pip install 'kvtrace[app]'" in lines[0]


@pytest.mark.parametrize("suffix", ["png", "html"])
def test_a_chart_file_without_vl_convert_is_one_line_naming_png(tmp_path, suffix):
    out = tmp_path / f"curve.{suffix}"
    res = _run_without("vl_convert", "curve", str(CHAT), "--plot", str(out))
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "vl-convert-python" in lines[0] and "pip install 'kvtrace[png]'" in lines[0]
    assert not out.exists()


# --------------------------------------------------------------------------- the wheel, installed
@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
                   check=True, timeout=600, cwd=out)
    (path,) = out.glob("kvtrace-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel and its ``[app]`` extra (pip's cache reused)."""
    env = tmp_path_factory.mktemp("venv") / "v"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, timeout=300)
    subprocess.run([str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[app]"],
                   check=True, timeout=1800)
    return env


@pytest.mark.slow
def test_the_wheel_holds_the_app_the_sql_and_the_samples(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = ["kvtrace/app/kvtrace_app.py", "kvtrace/app/views/__init__.py", "kvtrace/sql/views.sql",
                "kvtrace/sql/macros.sql", "kvtrace/samples/chat.jsonl", "kvtrace/samples/mixed.parquet",
                "kvtrace/samples/tiers.example.toml"]
    expected += [f"kvtrace/app/views/{p.name}" for p in (PKG / "app" / "views").glob("*.py")]
    expected += [f"kvtrace/sql/examples/{p.name}" for p in (PKG / "sql" / "examples").glob("*.sql")]
    assert not [n for n in expected if n not in names]
    for p in PKG.rglob("*.py"):  # every module of the tree
        assert p.relative_to(PKG.parent).as_posix() in names, p


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode("utf-8", "replace")


@pytest.mark.slow
def test_the_installed_wheel_runs_the_commands_and_serves_the_app(venv, tmp_path):
    py, kvtrace = venv / "bin" / "python", venv / "bin" / "kvtrace"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    sample = subprocess.run([str(py), "-c", "from importlib.resources import files; "
                             "print(files('kvtrace.samples') / 'chat.jsonl')"],
                            capture_output=True, text=True, check=True, cwd=tmp_path, env=env).stdout.strip()
    assert Path(sample).is_file() and not Path(sample).is_relative_to(ROOT)
    curve = subprocess.run([str(kvtrace), "curve", sample, "--out", str(tmp_path / "c.parquet")],
                           capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
    assert curve.returncode == 0, curve.stderr
    assert (tmp_path / "c.parquet").stat().st_size > 0
    helped = subprocess.run([str(kvtrace), "app", "--help"], capture_output=True, text=True, cwd=tmp_path, env=env,
                            timeout=120)
    assert helped.returncode == 0 and "--headless" in helped.stdout, helped.stderr

    port = _free_port()
    log = (tmp_path / "app.log").open("w")
    proc = subprocess.Popen([str(kvtrace), "app", "--headless", "--port", str(port)], cwd=tmp_path, env=env,
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        health, deadline = "", time.monotonic() + 180
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                health = _get(f"http://127.0.0.1:{port}/_stcore/health")
                break
            except OSError:
                time.sleep(0.5)
        assert health == "ok", (proc.poll(), (tmp_path / "app.log").read_text())
        page = _get(f"http://127.0.0.1:{port}/")
        assert 'id="root"' in page and "<script" in page, page[:500]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_the_readme_performance_table_is_what_the_benchmarks_recorded():
    import importlib.util
    import json

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        spec = importlib.util.spec_from_file_location("bench_table", ROOT / "benchmarks" / "table.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    generated = mod.table(json.loads((ROOT / "benchmarks" / "results.json").read_text(encoding="utf-8")))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Performance\n", 1)[1].split("\n## ", 1)[0]
    assert generated in section
    assert section.count("| figure |") == 1
