"""Helpers shared by the benchmark scripts (not part of the kvtrace package).

- :func:`synth_trace`: generate a synthetic trace of about N block accesses with
  ``kvtrace synth`` and cache it under :func:`bench_dir` (``$KVTRACE_BENCH_DIR``, else
  ``benchmarks/.cache``; keep it out of git).
- :func:`run_measured`: run a command as a child process and return its wall time and
  peak resident set size (``ru_maxrss`` of that command, from ``os.wait4``).
  Before the first, kvtrace's modules are byte-compiled (:func:`byte_compile`).
- :func:`best_of`: best wall time of a few in-process calls.
- :class:`Report`: figures with their targets, printed as one Markdown table and
  recorded (:func:`record`) in :data:`RESULTS`, from which ``benchmarks/table.py``
  prints the README's performance table.

Every figure is printed with the command that reproduces it; the machines are noisy,
so compare ratios measured in one run rather than absolute seconds across runs.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR_ENV = "KVTRACE_BENCH_DIR"
#: The latest figures of each benchmark script (committed): ``{script: {"command": ...,
#: "rows": [[figure, measured, target], ...]}}``, one script's rows replaced by its next run.
RESULTS = ROOT / "benchmarks" / "results.json"


# --------------------------------------------------------------------------- files
def bench_dir() -> Path:
    """Directory for generated traces and outputs (created if missing)."""
    d = Path(os.environ.get(BENCH_DIR_ENV) or ROOT / "benchmarks" / ".cache")
    d.mkdir(parents=True, exist_ok=True)
    return d


def show_path(p: str | os.PathLike) -> str:
    """``p`` relative to the repository root when inside it (commands run from there)."""
    p = Path(p).resolve()
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


def kvtrace_argv() -> list[str]:
    """How to start the ``kvtrace`` command of this interpreter's environment."""
    script = Path(sys.executable).parent / "kvtrace"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "kvtrace.cli"]


def command_text(args: list[str]) -> str:
    """The command a reader types (``kvtrace ...``, repository-relative paths)."""
    return shlex.join(["kvtrace", *[show_path(a) if os.sep in a else a for a in args]])


# --------------------------------------------------------------------------- traces
def requests_for_accesses(kind: str, accesses: int, seed: int = 0) -> int:
    """Requests whose synthetic trace has about ``accesses`` block accesses (within 1 %).

    Accesses per request grow with the trace (sessions span more of it), so a fixed
    ratio is off by up to 2x for small traces. The generator's per-request skeleton
    gives the exact count (``ceil(input_tokens / B)`` per request) in O(requests)
    without expanding block lists; a few secant steps on it find the request count.
    It is a private helper of ``kvtrace.ingest.synth``: only this sizing depends on it.
    """
    from kvtrace.ingest import synth

    def count(n: int) -> int:
        plan = synth._plan(kind, n, seed, None, None)
        return int((-(-plan.input_tokens // plan.block_tokens)).sum())

    target = int(accesses)
    n0 = max(1, target // 15)
    a0 = count(n0)
    n1 = max(1, int(n0 * target / max(a0, 1)))
    for _ in range(6):
        a1 = count(n1)
        if abs(a1 - target) <= 0.01 * target or a1 == a0:
            break
        step = (n1 - n0) * (target - a1) / (a1 - a0)
        n0, a0 = n1, a1
        n1 = max(1, int(round(n1 + step)))
    return n1


def synth_trace(kind: str, accesses: int, fmt: str, *, keep: bool, seed: int = 0,
                chunk_requests: int = 200_000) -> tuple[Path, list[str], float | None]:
    """A cached synthetic trace of about ``accesses`` block accesses.

    Parameters
    ----------
    kind : str
        ``kvtrace synth --kind`` (chat, agent, rag, mixed).
    accesses : int
        Wanted block accesses (the file has this within about 1 %).
    fmt : str
        ``mooncake`` (JSONL) or ``parquet`` (canonical).
    keep : bool
        Reuse the cached file (and the cached request count) when present; otherwise
        generate afresh (deterministic: same seed, same file).

    Returns
    -------
    (path, synth arguments, seconds spent generating or None when reused)
    """
    d = bench_dir()
    sizes_file = d / "requests.json"
    sizes = json.loads(sizes_file.read_text()) if sizes_file.is_file() else {}
    key = f"{kind}:{int(accesses)}:{seed}"
    if keep and key in sizes:
        n_req = int(sizes[key])
    else:
        n_req = requests_for_accesses(kind, accesses, seed)
        sizes[key] = n_req
        sizes_file.write_text(json.dumps(sizes, indent=1, sort_keys=True))
    suffix = ".jsonl" if fmt in ("mooncake", "bailian") else ".parquet"
    path = d / f"{kind}-{n_req}req-seed{seed}-{fmt}{suffix}"
    args = ["synth", "--kind", kind, "--requests", str(n_req), "--seed", str(seed), "--format", fmt,
            "--chunk-requests", str(chunk_requests), "--out", str(path)]
    if keep and path.is_file():
        return path, args, None
    t0 = time.perf_counter()
    subprocess.run(kvtrace_argv() + args, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return path, args, time.perf_counter() - t0


def warm_up_jit() -> float:
    """Compile (or load from the on-disk cache) every kernel ingest and curves use.

    Runs ingest and both eviction models, exact and sampled, on a small synthetic trace.
    Returns the seconds it took.
    """
    from kvtrace.ingest import synth
    from kvtrace.analyses.curves import compute_curve
    from kvtrace.ingest import requests_to_trace

    t0 = time.perf_counter()
    df, meta = synth.generate("chat", 3_000, 1)
    small = requests_to_trace(df, meta)
    for ev in ("prefix-aware", "flat"):
        compute_curve(small, eviction=ev)
        compute_curve(small, eviction=ev, sample_rate=0.5)
    return time.perf_counter() - t0


# --------------------------------------------------------------------------- measuring
@dataclass
class ChildRun:
    """One measured child process."""

    argv: list[str]
    seconds: float  # wall clock, from spawn to exit (interpreter start included)
    peak_rss_bytes: int  # ru_maxrss of the child
    returncode: int
    stdout: str
    stderr: str


# Runs the measured command for run_measured: spawned from this small interpreter, the
# command's ru_maxrss starts from the launcher's few MB, not from the benchmark's RSS.
# (At exec the kernel carries the spawning process's high-water mark into the child's
# ru_maxrss, so a command spawned straight from a benchmark holding a trace would
# report at least the benchmark's own peak.)
_LAUNCHER = """
import json, os, sys, time
t0 = time.perf_counter()
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
seconds = time.perf_counter() - t0
with open(sys.argv[1], "w") as fh:
    json.dump({"seconds": seconds, "maxrss": usage.ru_maxrss, "status": os.waitstatus_to_exitcode(status)}, fh)
"""


_compiled = False


def byte_compile() -> None:
    """Byte-compile the kvtrace package once (``compileall``), as pip does when it
    installs the wheel: a command then reads its modules' ``.pyc`` files, as a user's
    installed kvtrace does, even in an editable install whose environment sets
    ``PYTHONDONTWRITEBYTECODE`` (there every command would compile every module)."""
    global _compiled
    if not _compiled:
        import compileall

        compileall.compile_dir(str(ROOT / "analytics" / "kvtrace"), quiet=1)
        _compiled = True


def run_measured(argv: list[str], *, cwd: str | os.PathLike = ROOT) -> ChildRun:
    """Run ``argv`` and measure its wall time and peak RSS (kvtrace's modules
    byte-compiled first: :func:`byte_compile`).

    A small launcher process spawns the command and waits for it with ``os.wait4``:
    the peak is the command's ``ru_maxrss`` (the kernel's high-water mark of its
    resident set), so nothing is sampled and no other process counts; the time runs
    from spawn to exit (the command's interpreter start included, the launcher's
    not). Output goes to temporary files, so a chatty command cannot block.
    """
    byte_compile()
    with tempfile.TemporaryDirectory(prefix="kvtrace-bench-") as tmp:
        result = os.path.join(tmp, "run.json")
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            subprocess.run([sys.executable, "-c", _LAUNCHER, result, *argv], cwd=cwd, stdout=out, stderr=err,
                           check=True)
        with open(result) as fh:
            m = json.load(fh)
        with open(out_path, "rb") as fh:
            stdout = fh.read().decode(errors="replace")
        with open(err_path, "rb") as fh:
            stderr = fh.read().decode(errors="replace")
    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes, Linux KiB
    return ChildRun(list(argv), float(m["seconds"]), int(m["maxrss"]) * scale, int(m["status"]), stdout, stderr)


def run_kvtrace(args: list[str]) -> ChildRun:
    """Run ``kvtrace ARGS`` measured; raise with its stderr when it fails."""
    run = run_measured(kvtrace_argv() + list(args))
    if run.returncode != 0:
        raise RuntimeError(f"{command_text(args)} exited {run.returncode}:\n{run.stderr[-4000:]}")
    return run


def best_of(repeat: int, fn: Callable[[], object]) -> tuple[float, object]:
    """Fastest wall time (seconds) of ``repeat`` calls of ``fn``, and the last result."""
    best, result = math.inf, None
    for _ in range(max(1, int(repeat))):
        t0 = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - t0)
    return best, result


# --------------------------------------------------------------------------- reporting
def fmt_rate(per_s: float) -> str:
    """Accesses per second as ``12.3 M/s``."""
    return f"{per_s / 1e6:,.2f} M/s"


def fmt_bytes(n: float) -> str:
    """Bytes in decimal GB / MB (targets are stated in GB)."""
    return f"{n / 1e9:,.2f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB"


def verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("PASS" if ok else "FAIL")


@dataclass
class Report:
    """Figures of one benchmark run, printed as a Markdown table.

    A row with a target carries a PASS/FAIL status; a row without one is context.
    """

    title: str
    reproduce: str
    rows: list[tuple[str, str, str, str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, figure: str, value: str, target: str = "-", ok: bool | None = None,
            command: str | None = None) -> None:
        cmd = command or self.reproduce
        self.rows.append((figure, value, target, verdict(ok), f"`{cmd}`"))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def note_rounds(self, rounds: int, load_before, accesses: int, target_accesses: int, what: str = "commands"
                    ) -> None:
        """The notes every alternating benchmark ends with: rounds and order, how to read
        noisy figures and peak RSS, the load before the runs, and a trace size other than
        the one the targets are set for."""
        self.note(f"Medians over {max(1, rounds)} rounds, the {what}' order rotated each round; the machine is "
                  "shared, so compare ratios measured in one run rather than absolute seconds. Peak RSS is the "
                  "child's ru_maxrss (os.wait4); GB = 1e9 bytes. Load average before the child runs: "
                  + ", ".join(f"{x:.1f}" for x in load_before) + ".")
        if accesses != target_accesses:
            self.note(f"This run uses {accesses / 1e6:.1f}M accesses; the issue's targets are set for "
                      f"{target_accesses / 1e6:.0f}M.")

    def print(self) -> bool:
        """Print the table, then one PASS/FAIL line per target; True when all pass. The
        figures are recorded in :data:`RESULTS` (:func:`record`)."""
        print_table(self.title, ("figure", "value", "target", "status", "command"),
                    ("---", "--:", "--:", ":-:", "---"), self.rows, self.notes)
        record(self.reproduce, [(figure, value, target) for figure, value, target, _, _ in self.rows])
        all_ok = True
        for figure, value, target, status, _ in self.rows:
            if status != "-":
                print(f"{status}: {figure} = {value} (target {target})")
                all_ok &= status == "PASS"
        print(f"\nreproduce: {self.reproduce}")
        return all_ok


def record(command: str, rows: list[tuple[str, str, str]], script: str | None = None) -> None:
    """Replace the figures of this benchmark script (``sys.argv[0]``'s file name) in
    :data:`RESULTS` by ``rows`` of (figure, measured, target), reproduced by ``command``."""
    script = script or Path(sys.argv[0]).name
    results = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    results[script] = {"command": command, "rows": [list(r) for r in rows]}
    RESULTS.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def print_table(title: str, head, align, rows, notes) -> None:
    """A benchmark's Markdown section: its title, :func:`environment_line`, the table
    (``head`` and ``align`` cells, ``|`` in a cell escaped) and the notes as a list."""
    print(f"\n### {title}\n")
    print(environment_line())
    print()
    print("| " + " | ".join(head) + " |")
    print("|" + "|".join(align) + "|")
    for r in rows:
        print("| " + " | ".join(c.replace("|", "\\|") for c in r) + " |")
    print()
    for n in notes:
        print(f"- {n}")
    if notes:
        print()


def environment_line() -> str:
    """Machine, load and versions, so a reader can judge how noisy the figures are."""
    import numba
    import numpy
    import polars

    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                                capture_output=True, text=True, check=False).stdout.strip() or "?"
    except OSError:
        commit = "?"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (f"_{platform.node()}: {os.cpu_count()} CPUs, load average {load}; Python {platform.python_version()}, "
            f"numba {numba.__version__}, numpy {numpy.__version__}, polars {polars.__version__}; "
            f"kvtrace {commit}_")
