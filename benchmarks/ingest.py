"""Ingest throughput and peak memory on a large synthetic Mooncake JSONL.

Issue targets, on a ~10M-access synthetic chat trace on the 2-core benchmark machine:

- ingest throughput >= 1.5M block accesses/s;
- peak RSS of ``kvtrace ingest`` under 3x the in-memory access table (the bytes of
  ``Trace.accesses``: request, pos, block, tokens, req_start).

Measured:

- ``kvtrace ingest big.jsonl -o big.parquet`` as a child process, end to end
  (interpreter start, imports, parsing, building the trace, writing Parquet), run
  twice: the first with the JIT and page caches as found, the second with both warm;
  peak RSS is the child's ``ru_maxrss``;
- ``kvtrace.ingest.load_trace`` in this process after a warm-up on the bundled sample
  (start-up, imports and the Parquet write excluded), best of ``--repeat``.

Run from the repository root::

    python benchmarks/ingest.py [--accesses 10000000] [--keep] [--repeat 2]

The trace is generated once under ``$KVTRACE_BENCH_DIR`` (default
``benchmarks/.cache``); ``--keep`` reuses it.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from common import (ROOT, Report, best_of, bench_dir, command_text, fmt_bytes, fmt_rate, run_kvtrace, run_measured,
                    synth_trace)

RATE_TARGET = 1.5e6  # block accesses per second
RSS_RATIO_TARGET = 3.0  # peak RSS / access-table bytes, strictly below
# What `kvtrace ingest` loads before it reads a byte: its share of the end-to-end time.
IMPORTS = [sys.executable, "-c", "import kvtrace.cli, kvtrace.ingest"]


def access_table_bytes(trace) -> int:
    """Bytes of the canonical access table arrays of ``trace``."""
    a = trace.accesses
    return int(sum(x.nbytes for x in (a.request, a.pos, a.block, a.tokens, a.req_start)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accesses", type=int, default=10_000_000, help="block accesses of the trace (default 10M)")
    ap.add_argument("--keep", action="store_true", help="reuse the cached trace file when present")
    ap.add_argument("--repeat", type=int, default=2, help="in-process load_trace: best of this many (default 2)")
    args = ap.parse_args(argv)
    here = ["python", "benchmarks/ingest.py", "--accesses", str(args.accesses)]
    reproduce = shlex.join(here + ["--keep"])

    path, synth_args, gen_s = synth_trace("chat", args.accesses, "mooncake", keep=args.keep)
    out = bench_dir() / f"{path.stem}.ingested.parquet"
    ingest_args = ["ingest", str(path), "-o", str(out)]
    startup = run_measured(IMPORTS)
    first = run_kvtrace(ingest_args)
    second = run_kvtrace(ingest_args)  # JIT cache and page cache now warm

    from kvtrace.ingest import load_trace

    load_trace(ROOT / "sample_traces" / "chat.jsonl")  # JIT warm-up (or on-disk cache load)
    seconds, trace = best_of(args.repeat, lambda: load_trace(path))
    n = trace.n_accesses
    table = access_table_bytes(trace)
    ratio = second.peak_rss_bytes / table

    r = Report(f"ingest: {n / 1e6:.1f}M-access synthetic Mooncake JSONL", reproduce)
    r.add("trace", f"{trace.n_requests:,} requests, {n:,} block accesses, {trace.n_blocks:,} distinct blocks, "
          f"{fmt_bytes(path.stat().st_size)} JSONL" + ("" if gen_s is None else f" (generated in {gen_s:.1f} s)"),
          command=command_text(synth_args))
    r.add("kvtrace ingest, end to end (2nd run)", f"{second.seconds:.2f} s = {fmt_rate(n / second.seconds)}",
          f">= {fmt_rate(RATE_TARGET)}", n / second.seconds >= RATE_TARGET, command_text(ingest_args))
    r.add("kvtrace ingest, end to end (1st run, caches as found)",
          f"{first.seconds:.2f} s = {fmt_rate(n / first.seconds)}", command=command_text(ingest_args))
    r.add("of which interpreter start + imports", f"{startup.seconds:.2f} s, {fmt_bytes(startup.peak_rss_bytes)} RSS",
          command=shlex.join(["python", *IMPORTS[1:]]))
    r.add(f"load_trace in process (best of {args.repeat}; no start-up, no Parquet write)",
          f"{seconds:.2f} s = {fmt_rate(n / seconds)}", f">= {fmt_rate(RATE_TARGET)}", n / seconds >= RATE_TARGET)
    r.add("peak RSS of kvtrace ingest (2nd run)", fmt_bytes(second.peak_rss_bytes), command=command_text(ingest_args))
    r.add("access table in memory (request, pos, block, tokens, req_start)",
          f"{fmt_bytes(table)} ({table / n:.1f} B/access)")
    r.add("peak RSS / access table", f"{ratio:.2f}x", f"< {RSS_RATIO_TARGET:g}x", ratio < RSS_RATIO_TARGET,
          command_text(ingest_args))
    r.note("Throughput is block accesses (hash ids) per second of wall time. Peak RSS is the child's ru_maxrss "
           "(os.wait4); the table size is measured on the trace load_trace returns here.")
    if args.accesses < 10_000_000:
        r.note(f"This run uses {n / 1e6:.1f}M accesses; the issue's targets are set for 10M.")
    r.print()  # a missed target is reported, not an error: these machines are noisy
    return 0


if __name__ == "__main__":
    sys.exit(main())
