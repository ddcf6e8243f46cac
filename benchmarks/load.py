"""Load-model benchmark: ``kvtrace load`` against ``kvtrace whatif``, and a sweep of load levels.

Issue #21 targets, on the ~30M-access (~2M-request) synthetic chat trace of whatif.py
and curve.py (canonical Parquet), one tier configuration (DRAM + shared flash):

1. ``kvtrace load TRACE --dram 256GiB --flash 8TiB --load 1x --out OUT`` end to end in
   <= 2x the time of ``kvtrace whatif TRACE --dram 256GiB --flash 8TiB --out OUT``;
2. the same load command with 8 load levels (``--load 0.25x,0.5x,1x,1.5x,2x,3x,4x,8x``)
   in <= 60 s end to end, with the default resources (the upper levels overload and stop
   early) and with resources ample enough that every level runs in full;
3. (context) the load command's peak RSS, and the cost of one more load level:
   (sweep - one level) / 7.

How each figure is taken:

- every command is a child process (``common.run_measured``: wall time from spawn to
  exit, interpreter start and the output file included; peak RSS is its ``ru_maxrss``),
  writing its table with ``--out`` to a temporary directory, as a user would run it;
- each command runs once untimed first (JIT and page caches as found: reported), then
  ``--repeat`` rounds run them in turn, the order rotated each round, so that a slow
  spell of the shared machine falls on all alike; the
  figures are medians over the rounds, the ratio is the ratio of the medians (the
  range of the per-round ratios beside it);
- the load tables are checked: the sweep's 1x row equals the one-level run's, and the
  configuration's usable-prefix token hit rate equals the what-if table's (one replay);
- breakdown (in this process, after the child runs; ``--skip-breakdown``): the replay
  alone (``simulate``, no per-request table), the replay with the load model's demand
  fold (``replay_demand``), one queue simulation per level (``run_level``) and the
  whole ``load_curve`` of the sweep; start-up, reading the trace and writing the
  output are the rest of the end-to-end time.

Run from the repository root::

    python benchmarks/load.py [--accesses 30000000] [--keep] [--repeat 3] [--skip-breakdown]

A quick check of the script: ``--accesses 2000000``. The trace is generated once under
``$KVTRACE_BENCH_DIR`` (default ``benchmarks/.cache``); ``--keep`` reuses it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Report, command_text, fmt_bytes, fmt_rate, run_kvtrace, run_measured, synth_trace  # noqa: E402

DRAM, FLASH = "256GiB", "8TiB"
LEVELS = ("0.25x", "0.5x", "1x", "1.5x", "2x", "3x", "4x", "8x")
#: Resources large enough that no level of the sweep overloads (an overloaded level stops
#: early, so the default resources' sweep runs only some levels in full).
AMPLE = ("--gpus-per-node", "64", "--host-link-gbps", "200", "--nic-gbps", "400")
RATIO_TARGET = 2.0  # load 1x / whatif, end to end
SWEEP_TARGET_S = 60.0
TARGET_ACCESSES = 30_000_000  # the targets are stated for this trace size
IMPORTS = [sys.executable, "-c", "import kvtrace.cli"]


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def spread(xs: list[float], unit: str = " s", digits: int = 2) -> str:
    """``median (min-max of N)``."""
    return f"{median(xs):.{digits}f}{unit} (median of {len(xs)}; {min(xs):.{digits}f}-{max(xs):.{digits}f})"


def check_tables(whatif_out: Path, one_out: Path, sweep_out: Path):
    """Problems found in the output tables (empty when consistent), the what-if table and
    the sweep table."""
    import polars as pl

    w, one, sw = pl.read_parquet(whatif_out), pl.read_parquet(one_out), pl.read_parquet(sweep_out)
    bad = []
    if one.height != 1 or sw.height != len(LEVELS):
        bad.append(f"rows: {one.height} one-level, {sw.height} sweep (expected 1 and {len(LEVELS)})")
        return bad, w, sw
    at1 = sw.filter(pl.col("load_factor") == 1.0)
    if not at1.equals(one, null_equal=True):
        bad.append("the sweep's 1x row differs from the one-level run")
    hw, hl = w["prefix_token_hit_rate"][0], one["prefix_token_hit_rate"][0]
    if hw != hl:
        bad.append(f"usable-prefix token hit rate: whatif {hw}, load {hl}")
    return bad, w, sw


def breakdown(path: Path, r: Report, e2e_one: float, e2e_sweep: float) -> None:
    """In-process times of the load command's parts (see the module docstring)."""
    from kvtrace.analyses.load import LoadModel, load_curve, parse_levels, replay_demand, run_level
    from kvtrace.analyses.response import ResponseModel
    from kvtrace.analyses.whatif import TierConfig, simulate
    from kvtrace.ingest import load_trace
    from kvtrace.model import resolve_gpu

    startup = run_measured(IMPORTS)
    t0 = time.perf_counter()
    trace = load_trace(path, workload="whatif")
    read_s = time.perf_counter() - t0
    n, R = trace.n_accesses, trace.n_requests
    config = TierConfig(DRAM, flash_bytes=FLASH)
    load = LoadModel()
    response = ResponseModel(recompute_flops_per_s=resolve_gpu(None).effective_flops)
    levels = parse_levels(",".join(LEVELS), None, None)

    simulate(trace, config, requests_table=False)  # kernels compiled (or loaded from the cache) before timing
    t0 = time.perf_counter()
    simulate(trace, config, requests_table=False)
    replay_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    demand, _ = replay_demand(trace, config, load, response=response)
    demand_s = time.perf_counter() - t0
    try:
        run_level(demand, levels[0], load, response)  # the queue kernel compiled (or loaded)
        per_level = []
        for lv in levels:
            t0 = time.perf_counter()
            row, _, _ = run_level(demand, lv, load, response)
            per_level.append((lv, time.perf_counter() - t0, row))
    finally:
        demand.close()
    t0 = time.perf_counter()
    load_curve(trace, [config], [levels[LEVELS.index("1x")]], load, response=response)
    curve_one_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    load_curve(trace, [config], levels, load, response=response)
    curve_sweep_s = time.perf_counter() - t0
    del trace

    r.add("`load` breakdown: interpreter start + import kvtrace.cli (child)",
          f"{startup.seconds:.2f} s", command=shlex.join(["python", *IMPORTS[1:]]))
    r.add("`load` breakdown: load_trace from Parquet", f"{read_s:.2f} s = {fmt_rate(n / read_s)}")
    r.add("`load` breakdown: simulate(), no per-request table (the replay alone, as kvtrace whatif runs it)",
          f"{replay_s:.2f} s = {fmt_rate(n / replay_s)}")
    r.add("`load` breakdown: replay_demand() (the replay + the demand fold)",
          f"{demand_s:.2f} s: fold +{demand_s - replay_s:.2f} s over the replay alone")
    cells = []
    for lv, s, row in per_level:
        mark = " overload" if row["overloaded"] else ""
        cells.append(f"{lv.factor:g}x {s:.2f}{mark}")
    sim_total = sum(s for _, s, _ in per_level)
    r.add(f"`load` breakdown: run_level() per level, s ({R:,} requests each unless overloaded)",
          "; ".join(cells) + f"; total {sim_total:.2f} s")
    r.add("`load` breakdown: load_curve(), one level / the 8-level sweep",
          f"{curve_one_s:.2f} s / {curve_sweep_s:.2f} s")
    r.add("`load` breakdown: end to end minus load_curve (start-up, read, render, write), one level / sweep",
          f"{e2e_one - curve_one_s:.2f} s / {e2e_sweep - curve_sweep_s:.2f} s")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accesses", type=int, default=TARGET_ACCESSES, help="block accesses of the trace (default 30M)")
    ap.add_argument("--keep", action="store_true", help="reuse the cached trace file when present")
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds of the commands (default 3)")
    ap.add_argument("--skip-breakdown", action="store_true", help="skip the in-process breakdown")
    args = ap.parse_args(argv)
    here = ["python", "benchmarks/load.py", "--accesses", str(args.accesses)]
    reproduce = shlex.join(here + ["--keep"] + (["--skip-breakdown"] if args.skip_breakdown else []))

    path, synth_args, gen_s = synth_trace("chat", args.accesses, "parquet", keep=args.keep)
    tmp = Path(tempfile.gettempdir()) / "kvtrace-load-bench"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tiers = ["--dram", DRAM, "--flash", FLASH]
    whatif_out, one_out, sweep_out = tmp / "whatif.parquet", tmp / "load-1x.parquet", tmp / "load-sweep.parquet"
    commands = {"whatif": ["whatif", str(path), *tiers, "--out", str(whatif_out)],
                "load 1x": ["load", str(path), *tiers, "--load", "1x", "--out", str(one_out)],
                "load sweep": ["load", str(path), *tiers, "--load", ",".join(LEVELS), "--out", str(sweep_out)],
                "load sweep, ample": ["load", str(path), *tiers, *AMPLE, "--load", ",".join(LEVELS), "--out",
                                      str(tmp / "load-sweep-ample.parquet")]}
    names = list(commands)
    load_before = os.getloadavg()
    try:
        first = {k: run_kvtrace(commands[k]) for k in names}  # JIT cache and page cache as found
        runs: dict[str, list] = {k: [] for k in names}
        for i in range(max(1, args.repeat)):
            for k in names[i % len(names):] + names[:i % len(names)]:
                runs[k].append(run_kvtrace(commands[k]))
        bad, whatif_table, sweep_table = check_tables(whatif_out, one_out, sweep_out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    secs = {k: [run.seconds for run in runs[k]] for k in names}
    rss = {k: max(run.peak_rss_bytes for run in runs[k]) for k in names}
    w, one, sweep, ample = (median(secs[k]) for k in names)
    ratio = one / w
    round_ratios = [a / b for a, b in zip(secs["load 1x"], secs["whatif"])]
    per_level = (sweep - one) / (len(LEVELS) - 1)

    wrow = whatif_table.row(0, named=True)
    r = Report(f"load: {wrow['measured_accesses'] / 1e6:.1f}M-access synthetic chat trace (canonical Parquet), "
               f"DRAM {DRAM} + flash {FLASH}", reproduce)
    r.add("`load` benchmark trace",
          f"{wrow['measured_requests']:,} requests, {wrow['measured_accesses']:,} block accesses, "
          f"{fmt_bytes(path.stat().st_size)} Parquet"
          + ("" if gen_s is None else f" (generated in {gen_s:.1f} s)"), command=command_text(synth_args))
    r.add("kvtrace whatif, one configuration, end to end", spread(secs["whatif"]),
          command=command_text(commands["whatif"]))
    r.add("kvtrace load, one level (1x), end to end", spread(secs["load 1x"]),
          command=command_text(commands["load 1x"]))
    r.add("load 1x / whatif, end to end (ratio of the medians)",
          f"{ratio:.2f}x (per round {min(round_ratios):.2f}-{max(round_ratios):.2f}x)", f"<= {RATIO_TARGET:g}x",
          ratio <= RATIO_TARGET)
    r.add(f"kvtrace load, {len(LEVELS)} levels, end to end", spread(secs["load sweep"]), f"<= {SWEEP_TARGET_S:g} s",
          sweep <= SWEEP_TARGET_S, command_text(commands["load sweep"]))
    r.add(f"kvtrace load, {len(LEVELS)} levels, none overloaded ({' '.join(AMPLE)}), end to end",
          spread(secs["load sweep, ample"]), f"<= {SWEEP_TARGET_S:g} s", ample <= SWEEP_TARGET_S,
          command_text(commands["load sweep, ample"]))
    r.add(f"`load` cost of one more level: (sweep - one level) / {len(LEVELS) - 1}", f"{per_level:.2f} s")
    r.add("`load` peak RSS: load 1x / load sweep / whatif (max over the timed runs)",
          f"{fmt_bytes(rss['load 1x'])} / {fmt_bytes(rss['load sweep'])} / {fmt_bytes(rss['whatif'])}",
          command=command_text(commands["load 1x"]))
    r.add("`load` untimed first runs (caches as found): whatif / load 1x / load sweep / ample sweep",
          " / ".join(f"{first[k].seconds:.2f} s" for k in names))
    r.add("`load` tables consistent (sweep's 1x row = one-level run; hit rate = whatif's)",
          "yes" if not bad else "NO: " + "; ".join(bad), "yes", not bad)
    if not args.skip_breakdown:
        breakdown(path, r, one, sweep)

    levels = []
    for row in sweep_table.iter_rows(named=True):
        state = f"overloaded ({row['overload_resource']})" if row["overloaded"] else row["bottleneck"]
        p99 = row["ttft_p99_ms"]
        levels.append(f"{row['load_factor']:g}x: p99 {'-' if p99 is None else f'{p99:,.0f}'} ms, {state}")
    r.note("The sweep's levels (TTFT p99, bottleneck): " + "; ".join(levels) + ". An overloaded level stops at the "
           "queue-wait bound, so it costs less than a full one.")
    r.note_rounds(args.repeat, load_before, args.accesses, TARGET_ACCESSES)
    r.print()  # a missed target is reported, not an error (noisy machines); inconsistent tables are
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
