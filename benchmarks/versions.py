"""Two builds of kvtrace side by side: the same commands end to end, alternating, with ratios.

    python benchmarks/versions.py OLD_KVTRACE NEW_KVTRACE [--requests 200000] [--repeats 3]

``OLD_KVTRACE`` and ``NEW_KVTRACE`` are ``kvtrace`` executables of two checkouts (each in its
own virtualenv), e.g. the last release and a refactoring of it. Every command runs on one
synthetic trace (``kvtrace synth --kind mixed``, canonical Parquet, written once by the new
build) in memory and streamed; the two builds alternate run by run so a slower minute of a
shared machine costs both, and each build's first run is a warm-up (Numba caches) that is
not timed. Printed: the median wall time of each build and new / old; a ratio within the
spread of the runs is noise.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

COMMANDS = [
    ("stats", "stats {t}"),
    ("stats --stream", "stats {t} --stream"),
    ("curve", "curve {t} --out {o}/c.parquet"),
    ("curve --stream", "curve {t} --stream --out {o}/c.parquet"),
    ("curve --sample-rate 0.1", "curve {t} --sample-rate 0.1"),
    ("value", "value {t} --out {o}/v.parquet"),
    ("value --stream", "value {t} --stream --out {o}/v.parquet"),
    ("whatif, 3 configs", "whatif {t} --dram 8GiB --flash 64GiB --policy all,second-hit,tinylfu --grid"),
    ("whatif --stream, 3 configs", "whatif {t} --stream --dram 8GiB --flash 64GiB --policy all,second-hit,tinylfu "
                                   "--grid"),
]


def timed(exe: str, args: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([exe, *args.split()], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        trace = Path(d) / "trace.parquet"
        subprocess.run([a.new, "synth", "--kind", "mixed", "--requests", str(a.requests), "--seed", "1",
                        "--format", "parquet", "--out", str(trace)], check=True, stderr=subprocess.DEVNULL)
        print(f"| command ({a.requests:,} synthetic requests) | old s | new s | new / old |")
        print("|---|--:|--:|--:|")
        for name, cmd in COMMANDS:
            args = cmd.format(t=trace, o=d)
            timed(a.old, args), timed(a.new, args)  # warm-up: Numba caches, page cache
            old, new = [], []
            for _ in range(a.repeats):
                old.append(timed(a.old, args))
                new.append(timed(a.new, args))
            mo, mn = statistics.median(old), statistics.median(new)
            spread = f"{min(old):.2f}-{max(old):.2f} / {min(new):.2f}-{max(new):.2f}"
            print(f"| {name} | {mo:.2f} | {mn:.2f} | {mn / mo:.2f} ({spread}) |", flush=True)


if __name__ == "__main__":
    main()
