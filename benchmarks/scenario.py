"""Scenario benchmark: each ``kvtrace scenario`` event kind against the ``kvtrace load`` run
of the same system.

Issue #23's target, on the ~30M-access (~2M-request) synthetic chat trace of load.py
(canonical Parquet), two nodes with 256 GiB of DRAM each and an 8 TiB shared flash pool on
four targets: each scenario runs end to end in <= 2x the time of
``kvtrace load TRACE --dram 256GiB --flash 8TiB --nodes 2 --flash-targets 4 --load 1x``.

How each figure is taken:

- a scenario is a scenario file with that one scenario and ``[run] baseline = false``
  (one replay with its events and one queue simulation, as the load run: the baseline's
  replay is the load run's own work), run as ``kvtrace scenario TRACE --config F --out
  OUT``; every command is a child process (``common.run_measured``: wall time from spawn
  to exit, interpreter start and the output file included);
- each command runs once untimed first (caches as found), then ``--repeat`` rounds run
  them all in turn, the order rotated each round; figures are medians over the rounds,
  each ratio the ratio of the medians (the range of the per-round ratios beside it);
- event times are shares of the trace's span (the trace covers several days), TTL sweeps
  and retirement steps every minute.

Run from the repository root::

    python benchmarks/scenario.py [--accesses 30000000] [--keep] [--repeat 3] [--only "KIND;..."]

A quick check of the script: ``--accesses 2000000 --repeat 1``.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import Report, command_text, fmt_bytes, run_kvtrace, synth_trace  # noqa: E402

DRAM, FLASH, NODES, TARGETS = "256GiB", "8TiB", 2, 4
RATIO_TARGET = 2.0
TARGET_ACCESSES = 30_000_000

#: kind -> the event's TOML lines (besides ``kind``).
EVENTS = {
    "cold-start": 'at = "50%"',
    "restored": 'at = "50%"',
    "migration": 'at = "50%"\nshare = 0.5',
    "target-loss": 'at = "50%"\ntarget = 1',
    "catalog-outage": 'at = "50%"\nduration = "1h"',
    "rollout": 'at = "50%"\nramp = "1h"\nretire_gbps = 2.0\nstep = "1min"',
    "ttl": 'at = 0\ndram = "1h"\nshared_flash = "6h"\nsweep = "1min"',
    "prestage": 'predictor = "oracle"\nlead = "1s"',
    "prestage, budget": 'predictor = "last-context"\ngbps = 10.0',
    "restored + prewarm": 'at = "50%"\n[[scenario.event]]\nkind = "prewarm"\nat = "50%"\norder = "value"\ngbps = 10.0',
}


def scenario_file(kind: str) -> str:
    event = kind.split(",")[0].split(" + ")[0]
    return f"""[system]
dram = "{DRAM}"
flash = "{FLASH}"
nodes = {NODES}

[load]
flash_targets = {TARGETS}

[run]
baseline = false
bin = "10min"

[[scenario]]
name = "{kind}"
[[scenario.event]]
kind = "{event}"
{EVENTS[kind]}
"""


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accesses", type=int, default=TARGET_ACCESSES, help="block accesses of the trace (default 30M)")
    ap.add_argument("--keep", action="store_true", help="reuse the cached trace file when present")
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds of the commands (default 3)")
    ap.add_argument("--only", help="event kinds, separated by semicolons (default: all)")
    args = ap.parse_args(argv)
    kinds = list(EVENTS) if not args.only else [k.strip() for k in args.only.split(";") if k.strip()]
    here = ["python", "benchmarks/scenario.py", "--accesses", str(args.accesses)]
    reproduce = shlex.join(here + ["--keep"])

    path, synth_args, gen_s = synth_trace("chat", args.accesses, "parquet", keep=args.keep)
    tmp = Path(tempfile.gettempdir()) / "kvtrace-scenario-bench"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    commands = {"load": ["load", str(path), "--dram", DRAM, "--flash", FLASH, "--nodes", str(NODES),
                         "--flash-targets", str(TARGETS), "--load", "1x", "--out", str(tmp / "load.parquet")]}
    for k in kinds:
        f = tmp / f"{k.replace(',', '').replace(' + ', '-').replace(' ', '-')}.toml"
        f.write_text(scenario_file(k))
        commands[k] = ["scenario", str(path), "--config", str(f), "--out", str(tmp / f"{f.stem}.parquet")]
    names = list(commands)
    load_before = os.getloadavg()
    try:
        first = {k: run_kvtrace(commands[k]) for k in names}
        bad = [k for k in names if first[k].returncode != 0]
        if bad:
            for k in bad:
                print(f"{k}: exit {first[k].returncode}\n{first[k].stderr[-2000:]}", file=sys.stderr)
            return 1
        runs: dict[str, list] = {k: [] for k in names}
        for i in range(max(1, args.repeat)):
            for k in names[i % len(names):] + names[:i % len(names)]:
                runs[k].append(run_kvtrace(commands[k]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    secs = {k: [run.seconds for run in runs[k]] for k in names}
    load = median(secs["load"])
    r = Report(f"scenario: {args.accesses / 1e6:.0f}M-access synthetic chat trace (canonical Parquet), {NODES} nodes x "
               f"DRAM {DRAM} + flash {FLASH} on {TARGETS} targets", reproduce)
    r.add("`scenario` benchmark trace", f"{fmt_bytes(path.stat().st_size)} Parquet"
          + ("" if gen_s is None else f" (generated in {gen_s:.1f} s)"), command=command_text(synth_args))
    r.add("kvtrace load, one level (1x), end to end",
          f"{load:.2f} s (median of {len(secs['load'])}; {min(secs['load']):.2f}-{max(secs['load']):.2f})",
          command=command_text(commands["load"]))
    for k in kinds:
        med = median(secs[k])
        ratios = [a / b for a, b in zip(secs[k], secs["load"])]
        what = EVENTS[k].replace("\n[[scenario.event]]\n", "; ").replace(chr(10), ", ")
        r.add(f"kvtrace scenario, {k} ({what}), end to end / load 1x",
              f"{med:.2f} s = {med / load:.2f}x (per round {min(ratios):.2f}-{max(ratios):.2f}x)",
              f"<= {RATIO_TARGET:g}x", med / load <= RATIO_TARGET)
    r.add("`scenario` untimed first runs (caches as found)", " / ".join(f"{k} {first[k].seconds:.1f} s" for k in names))
    r.note(f"Medians over {max(1, args.repeat)} rounds, the commands' order rotated each round; the machine is shared "
           "(2 cores), so compare the ratios measured in one run. Load average before the child runs: "
           + ", ".join(f"{x:.1f}" for x in load_before) + ".")
    if args.accesses != TARGET_ACCESSES:
        r.note(f"This run uses {args.accesses / 1e6:.1f}M accesses; the issue's target is set for 30M.")
    r.print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
