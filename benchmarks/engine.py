"""Engine-rules curve benchmark: vLLM v1's prefix cache replayed per capacity, against libCacheSim.

Issue targets, on the ~30M-access (~2M-request) synthetic chat trace of curve.py
(canonical Parquet):

1. the per-capacity simulation runs >= 10M accesses/s per capacity, one thread:
   ``engine_vllm.replay_chunk`` (one pool per replay) at every pool size measured
   (small, about the knee, large), and ``engine_vllm_multi`` (the pools of the curve's
   grid that hold the longest request, in one pass: pools x accesses / time);
2. ``kvtrace curve TRACE --cache-rules vllm --points 20 --out OUT`` end to end (the
   trace prepared by an earlier command, :mod:`kvtrace.ingest.prepared`, as a user's
   second command finds it; the same command with ``KVTRACE_CACHE_DIR=off`` beside it) in <= 2x
   the time libCacheSim's LRU takes at *one* capacity of the same block stream (the
   small capacity curve.py starts its list with: 128 full blocks);
3. (context) the same curve with ``--in-flight``, and the ideal curve
   ``kvtrace curve TRACE --points 20 --out OUT``, end to end.

How each figure is taken:

- every command is a child process (``common.run_measured``: wall time from spawn to
  exit, interpreter start, reading the trace and writing the output included), writing
  its table with ``--out`` to a temporary directory, as a user would run it;
- libCacheSim runs in a child process of this script (``--lcs-child``), which loads the
  trace and calls ``lcs_compare.time_libcachesim`` at one capacity, as curve.py does:
  the oracleGeneral file is written first and not counted; the figure is the
  ``process_trace`` time the child reports (its wall time is shown beside it);
- each command runs once untimed first (JIT and page caches as found: reported), then
  ``--repeat`` rounds run them in turn, the order rotated each round, so that a slow
  spell of the shared machine falls on all alike; figures are medians over the rounds,
  the ratio is the ratio of the medians (the range of the per-round ratios beside it);
- replay throughput (in this process, after the child runs): one ``replay_chunk`` call
  over the whole stream (fresh ``new_state``, allocation not counted) after a warm-up on
  a small slice, best of ``--repeat``, at 128 blocks, the 50 % and 90 % knees of the
  vLLM curve's usable-prefix token hit rate, and every distinct block;
- breakdown (in this process; ``--skip-breakdown``): ``load_trace`` from Parquet, then
  ``engine_curve(trace, "vllm", points=20)`` on one thread with its parts timed by
  wrapping them (plan, pool-state allocation, the shared pass ``multi_chunk``,
  ``replay_chunk`` of the smaller pools, the unbounded ceiling replay, the per-request
  weights per chunk, ``_accumulate_many`` per chunk, ``_result``'s evaluation; the rest
  is chunk layout and per-step arrays), and on the default threads (one per core)
  untimed in parts; the curve table is checked against the command's ``--out``.

Run from the repository root::

    python benchmarks/engine.py [--accesses 30000000] [--keep] [--repeat 3] [--skip-breakdown]

A quick check of the script: ``--accesses 2000000``. The trace is generated once under
``$KVTRACE_BENCH_DIR`` (default ``benchmarks/.cache``); ``--keep`` reuses it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (Report, command_text, fmt_bytes, fmt_rate, run_kvtrace, run_measured, show_path,  # noqa: E402
                    synth_trace)

KERNEL_TARGET = 10e6  # accesses per second per capacity, one thread
RATIO_TARGET = 2.0  # curve --cache-rules vllm at 20 capacities / libCacheSim at one capacity
POINTS = 20
LCS_BLOCKS = 128  # libCacheSim's capacity: this many full blocks (curve.py's smallest)
SMALL_POOL = 128  # blocks, the small pool of the replay-throughput figures
MODEL = "Llama-3.1-70B"
TARGET_ACCESSES = 30_000_000  # the targets are stated for this trace size
IMPORTS = [sys.executable, "-c", "import kvtrace.cli"]
HERE = ["python", "benchmarks/engine.py"]


def median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def spread(xs: list[float], unit: str = " s", digits: int = 2) -> str:
    """``median (median of N; min-max)``."""
    return f"{median(xs):.{digits}f}{unit} (median of {len(xs)}; {min(xs):.{digits}f}-{max(xs):.{digits}f})"


# --------------------------------------------------------------------------- libCacheSim child
def lcs_child(path: str, blocks: int, capacity_bytes: int | None = None) -> int:
    """Load the trace, time libCacheSim's LRU at ``blocks`` full blocks (bytes of
    ``MODEL``), or at ``capacity_bytes`` when given, over its block stream, print the
    figures as one JSON line."""
    from lcs_compare import time_libcachesim

    from kvtrace.ingest import load_trace
    from kvtrace.model import resolve_model

    t0 = time.perf_counter()
    trace = load_trace(path)
    load_s = time.perf_counter() - t0
    bpt = int(resolve_model(MODEL).kv_bytes_per_token)
    cap = int(blocks) * int(trace.meta.block_tokens) * bpt if capacity_bytes is None else int(capacity_bytes)
    block = np.ascontiguousarray(trace.accesses.block, dtype=np.int64)
    size_bytes = trace.block_size[block] * bpt
    n, n_blocks, n_requests = int(block.shape[0]), int(trace.n_blocks), int(trace.n_requests)
    del trace
    t = time_libcachesim(block, size_bytes, [cap])
    c = t.counts[0]
    print(json.dumps({"seconds": t.seconds, "write_seconds": t.write_seconds, "load_seconds": load_s,
                      "capacity_bytes": cap, "accesses": n, "distinct_blocks": n_blocks, "requests": n_requests,
                      "n_hits": int(c.n_hits), "bytes_hit": int(c.bytes_hit)}))
    return 0


def _lcs_args(capacity_bytes: int | None) -> list[str]:
    return ["--lcs-blocks", str(LCS_BLOCKS)] if capacity_bytes is None else ["--lcs-bytes", str(capacity_bytes)]


def lcs_argv(path: Path, capacity_bytes: int | None = None) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--lcs-child", str(path), *_lcs_args(capacity_bytes)]


def lcs_text(path: Path, capacity_bytes: int | None = None) -> str:
    return shlex.join(HERE + ["--lcs-child", show_path(path), *_lcs_args(capacity_bytes)])


def run_lcs(path: Path, capacity_bytes: int | None = None) -> tuple[object, dict]:
    """libCacheSim's child (:func:`lcs_child`) at :data:`LCS_BLOCKS` blocks, or at
    ``capacity_bytes``: (the measured child, its figures)."""
    run = run_measured(lcs_argv(path, capacity_bytes))
    if run.returncode != 0:
        raise RuntimeError(f"{lcs_text(path, capacity_bytes)} exited {run.returncode}:\n{run.stderr[-4000:]}")
    return run, json.loads(run.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- in process
def whole_stream(trace):
    """The whole trace as the engine's replay reads it: int64 block ids, int64 tokens
    per access, int64 request offsets."""
    parts = list(trace.chunks())
    block = np.concatenate([c.block for c in parts]).astype(np.int64)
    tokens = np.concatenate([c.tokens for c in parts]).astype(np.int64)
    return block, tokens, np.ascontiguousarray(trace.req_start, dtype=np.int64)


def replay_seconds(block, tokens, lrs, n_ids: int, pool: int, B: int, repeat: int):
    """Best wall time of one ``replay_chunk`` call over the whole stream at ``pool``
    blocks, and the share of accesses that hit (of the last call)."""
    from kvtrace.kernels import engine_vllm as V

    R = lrs.shape[0] - 1
    hit = np.zeros(R, dtype=np.int32)
    rej = np.zeros(R, dtype=np.bool_)
    slots = np.empty(max(pool, 1), dtype=np.int64)
    k = min(1_000, R)  # warm-up slice: the first requests
    V.replay_chunk(block, tokens, lrs[: k + 1], pool, B, V.ALL_RULES, *V.new_state(pool, n_ids), slots, hit[:k],
                   rej[:k])
    best = math.inf
    for _ in range(max(1, repeat)):
        state = V.new_state(pool, n_ids)  # allocation is not the replay's work
        t0 = time.perf_counter()
        V.replay_chunk(block, tokens, lrs, pool, B, V.ALL_RULES, *state, slots, hit, rej)
        best = min(best, time.perf_counter() - t0)
        del state
    return best, float(hit.sum()) / max(int(block.shape[0]), 1), float(rej.mean()) if R else 0.0


class Timers:
    """Wrap module functions so each call's wall time adds to a named total (one thread)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._undo: list[tuple[object, str, object]] = []

    def wrap(self, module, attr: str, name: str) -> None:
        fn = getattr(module, attr)
        self.seconds[name], self.calls[name] = 0.0, 0

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1

        setattr(module, attr, timed)
        self._undo.append((module, attr, fn))

    def restore(self) -> None:
        for module, attr, fn in reversed(self._undo):
            setattr(module, attr, fn)
        self._undo.clear()


def multi_seconds(block, tokens, lrs, n_ids: int, pools, B: int, repeat: int) -> float:
    """Best wall time of one shared pass (``engine_vllm_multi.replay_multi``) over the
    whole stream at ``pools`` (each holding the longest request)."""
    from kvtrace.kernels import engine_vllm as V
    from kvtrace.kernels import engine_vllm_multi as M

    M.replay_multi(block[: int(lrs[64])], tokens[: int(lrs[64])], lrs[:65], n_ids, pools, B, V.ALL_RULES)
    best = math.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        M.replay_multi(block, tokens, lrs, n_ids, pools, B, V.ALL_RULES)
        best = min(best, time.perf_counter() - t0)
    return best


def warm_up_engine() -> float:
    """Compile (or load from the on-disk cache) the engine kernels on a small trace."""
    from kvtrace.analyses.engine import engine_curve
    from kvtrace.ingest import requests_to_trace, synth

    t0 = time.perf_counter()
    df, meta = synth.generate("chat", 3_000, 1)
    small = requests_to_trace(df, meta)
    engine_curve(small, "vllm", points=4, threads=1)
    engine_curve(small, "vllm", points=4, threads=1, in_flight=True)
    return time.perf_counter() - t0


def in_process(path: Path, r: Report, args, e2e: dict[str, float], vllm_out: Path) -> list[str]:
    """Breakdown and replay throughput (module docstring); returns problems found."""
    import polars as pl

    from kvtrace.analyses import engine as E
    from kvtrace.ingest import load_trace
    from kvtrace.kernels import engine_vllm as V
    from kvtrace.kernels import engine_vllm_multi as M
    from kvtrace.model import resolve_model

    bad: list[str] = []
    jit_s = warm_up_engine()
    startup = run_measured(IMPORTS)
    t0 = time.perf_counter()
    trace = load_trace(path, workload="curve")
    load_s = time.perf_counter() - t0
    n, B, n_ids = trace.n_accesses, int(trace.meta.block_tokens), trace.n_blocks

    # the engine curve, one thread, parts timed
    timers = Timers()
    timers.wrap(E, "plan_curve", "plan")
    timers.wrap(V, "new_state", "state")
    timers.wrap(V, "replay_chunk", "replay")
    timers.wrap(M.MultiState, "__init__", "multi_state")
    timers.wrap(M, "multi_chunk", "multi")
    timers.wrap(E, "_unbounded_chunk", "unbounded")
    timers.wrap(E, "request_sums", "sums")
    timers.wrap(E, "_accumulate_many", "accumulate")
    timers.wrap(E, "_result", "evaluate")
    try:
        t0 = time.perf_counter()
        res1 = E.engine_curve(trace, "vllm", model=MODEL, points=POINTS, threads=1)
        one_s = time.perf_counter() - t0
    finally:
        timers.restore()
    t0 = time.perf_counter()
    res = E.engine_curve(trace, "vllm", model=MODEL, points=POINTS)
    default_s = time.perf_counter() - t0
    threads = os.cpu_count() or 1
    K = int(res.info["capacities_replayed"])
    S, C = timers.seconds, timers.calls
    rest = one_s - sum(S.values())
    if not res1.curve.equals(res.curve, null_equal=True):
        bad.append("engine_curve on one thread and on the default threads give different tables")
    out = pl.read_parquet(vllm_out)
    col = "prefix_token_hit_rate"
    if col not in out.columns or col not in res.curve.columns:
        bad.append(f"no {col} column in the command's table or engine_curve's")
    else:
        a, b = out[col].to_numpy().astype(np.float64), res.curve[col].to_numpy().astype(np.float64)
        if a.shape != b.shape or not np.allclose(a, b, equal_nan=True, rtol=0, atol=1e-12):
            bad.append(f"the command's {col} differs from engine_curve's in this process")

    curve_cmd = command_text(["curve", show_path(path), "--cache-rules", "vllm", "--points", str(POINTS)])
    r.add("`engine` breakdown: interpreter start + import kvtrace.cli (child)", f"{startup.seconds:.2f} s",
          command=shlex.join(["python", *IMPORTS[1:]]))
    r.add("`engine` breakdown: load_trace, the prepared trace mapped", f"{load_s:.2f} s = {fmt_rate(n / load_s)}")
    r.add(f"`engine` breakdown: engine_curve(vllm, {POINTS} points), one thread, total",
          f"{one_s:.2f} s ({K} pool sizes + the unbounded ceiling, {(K + 1) * n / one_s / 1e6:.2f}M replayed "
          f"accesses/s overall)")
    shared = sum(1 for p in res1.curve["capacity_blocks"].to_numpy() if p >= int(np.diff(trace.req_start).max()))
    parts = [("plan_curve", S["plan"]), (f"new_state x{C['state']} (pool-state allocation)", S["state"]),
             ("MultiState (the shared pass's stack)", S["multi_state"]),
             (f"multi_chunk x{C['multi']} (the pools holding the longest request, one pass)", S["multi"]),
             (f"replay_chunk x{C['replay']} (the smaller pools, one replay each)", S["replay"]),
             (f"unbounded ceiling x{C['unbounded']}", S["unbounded"]),
             (f"request_sums x{C['sums']} (per-request weights, once per chunk)", S["sums"]),
             (f"_accumulate_many x{C['accumulate']} (hits into histograms)", S["accumulate"]),
             ("_result (evaluation, tables, knees)", S["evaluate"]),
             ("the rest (chunk layout, per-step arrays, pool arrays)", rest)]
    r.add("`engine` breakdown: its parts, one thread",
          "; ".join(f"{k} {s:.2f} s ({100 * s / one_s:.0f} %)" for k, s in parts)
          + f"; {shared} of the {K} pool sizes in the shared pass")
    r.add(f"`engine` breakdown: engine_curve(vllm, {POINTS} points), default threads ({threads})",
          f"{default_s:.2f} s = {one_s / default_s:.2f}x the one-thread time")
    if "vllm" in e2e:
        r.add("`engine` breakdown: curve --cache-rules vllm end to end minus load_trace and engine_curve "
              "(default threads): start-up, render, write", f"{e2e['vllm'] - load_s - default_s:.2f} s",
              command=curve_cmd)
    grid_pools = res.curve["capacity_blocks"].to_numpy()
    rate_col = "prefix_token_hit_rate"
    knee_tokens = {float(f): tok for f, tok in res.knees.filter(pl.col("metric") == rate_col)
                   .select("fraction", "capacity_tokens").iter_rows()}
    del res1, res

    # replay throughput per pool size
    block, tokens, lrs = whole_stream(trace)
    pools = [("small", SMALL_POOL)]
    for f in (0.5, 0.9):
        tok = knee_tokens.get(f)
        if tok is not None:
            pools.append((f"{f:.0%} knee of the vLLM {rate_col}", max(1, int(tok) // B)))
    pools.append(("every distinct block", n_ids))
    seen, chosen = set(), []
    for label, p in pools:
        if p not in seen:
            seen.add(p)
            chosen.append((label, p))
    del trace
    bpt = int(resolve_model(MODEL).kv_bytes_per_token)
    for label, p in chosen:
        s, share, rej = replay_seconds(block, tokens, lrs, n_ids, p, B, args.repeat)
        r.add(f"replay_chunk, {label}: {p:,} blocks ({fmt_bytes(p * B * bpt)} of {MODEL}), one thread, "
              f"best of {args.repeat}",
              f"{s:.2f} s = {fmt_rate(n / s)} ({share:.1%} of accesses hit, {rej:.2%} of requests rejected)",
              f">= {fmt_rate(KERNEL_TARGET)}", n / s >= KERNEL_TARGET)
    big = [int(p) for p in grid_pools if p >= int(np.diff(lrs).max())]
    if len(big) > 1:
        s = multi_seconds(block, tokens, lrs, n_ids, big, B, args.repeat)
        r.add(f"engine_vllm_multi: the {len(big)} pool sizes of the {POINTS}-point grid from "
              f"{big[0]:,} to {big[-1]:,} blocks in one pass, one thread, best of {args.repeat}",
              f"{s:.2f} s = {fmt_rate(len(big) * n / s)} per capacity", f">= {fmt_rate(KERNEL_TARGET)}",
              len(big) * n / s >= KERNEL_TARGET)
    r.note(f"Kernel warm-up (small synthetic trace, JIT or on-disk cache) before the in-process timings took "
           f"{jit_s:.1f} s.")
    return bad


# --------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--accesses", type=int, default=TARGET_ACCESSES, help="block accesses of the trace (default 30M)")
    ap.add_argument("--keep", action="store_true", help="reuse the cached trace file when present")
    ap.add_argument("--repeat", type=int, default=3, help="timed rounds of the commands, best-of for the replay "
                                                          "(default 3)")
    ap.add_argument("--skip-breakdown", action="store_true", help="skip the in-process breakdown and replay figures")
    ap.add_argument("--lcs-child", metavar="TRACE", help=argparse.SUPPRESS)
    ap.add_argument("--lcs-blocks", type=int, default=LCS_BLOCKS, help=argparse.SUPPRESS)
    ap.add_argument("--lcs-bytes", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.lcs_child:
        return lcs_child(args.lcs_child, args.lcs_blocks, args.lcs_bytes)
    here = HERE + ["--accesses", str(args.accesses)]
    reproduce = shlex.join(here + ["--keep"] + (["--skip-breakdown"] if args.skip_breakdown else []))

    path, synth_args, gen_s = synth_trace("chat", args.accesses, "parquet", keep=args.keep)
    tmp = Path(tempfile.gettempdir()) / "kvtrace-engine-bench"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    pts = ["--points", str(POINTS)]
    vllm_out = tmp / "vllm.parquet"
    commands = {"vllm": ["curve", str(path), "--cache-rules", "vllm", *pts, "--out", str(vllm_out)],
                "lcs": None,
                "in-flight": ["curve", str(path), "--cache-rules", "vllm", "--in-flight", *pts, "--out",
                              str(tmp / "in-flight.parquet")],
                "ideal": ["curve", str(path), *pts, "--out", str(tmp / "ideal.parquet")]}
    commands["vllm-unprepared"] = commands["vllm"]  # the same command, the trace decoded and densified again
    names = list(commands)
    texts = {k: (lcs_text(path) if k == "lcs" else command_text(commands[k])) for k in names}
    texts["vllm-unprepared"] = "KVTRACE_CACHE_DIR=off " + texts["vllm"]
    load_before = os.getloadavg()
    lcs_info: list[dict] = []
    # prepared traces (kvtrace.ingest.prepared) in a store of this run's own, empty at the start: the
    # first vllm run below prepares the trace, the timed runs map it (as a user's second command does)
    store = tmp / "prepared-store"
    os.environ["KVTRACE_CACHE_DIR"] = str(store)

    def run(k: str):
        if k == "lcs":
            child, info = run_lcs(path)
            lcs_info.append(info)
            return info["seconds"], child
        os.environ["KVTRACE_CACHE_DIR"] = "off" if k == "vllm-unprepared" else str(store)
        try:
            child = run_kvtrace(commands[k])
        finally:
            os.environ["KVTRACE_CACHE_DIR"] = str(store)
        return child.seconds, child

    bad: list[str] = []
    try:
        first = {k: run(k) for k in names}  # JIT cache and page cache as found
        secs: dict[str, list[float]] = {k: [] for k in names}
        children: dict[str, list] = {k: [] for k in names}
        for i in range(max(1, args.repeat)):
            for k in names[i % len(names):] + names[:i % len(names)]:
                s, child = run(k)
                secs[k].append(s)
                children[k].append(child)
        med = {k: median(secs[k]) for k in names}
        info = lcs_info[-1]
        n = info["accesses"]
        if len({(d["n_hits"], d["bytes_hit"]) for d in lcs_info}) != 1:
            bad.append("libCacheSim's hit counts differ between runs")
        round_ratios = [a / b for a, b in zip(secs["vllm"], secs["lcs"])]
        ratio = med["vllm"] / med["lcs"]

        r = Report(f"engine: {n / 1e6:.1f}M-access synthetic chat trace (canonical Parquet), vLLM v1 prefix-cache "
                   f"rules at {POINTS} capacities", reproduce)
        r.add("`engine` benchmark trace", f"{n:,} block accesses, {fmt_bytes(path.stat().st_size)} Parquet"
              + ("" if gen_s is None else f" (generated in {gen_s:.1f} s)"), command=command_text(synth_args))
        r.add(f"kvtrace curve --cache-rules vllm, {POINTS} capacities, end to end", spread(secs["vllm"]),
              command=texts["vllm"])
        r.add(f"libCacheSim LRU, one capacity ({LCS_BLOCKS} full blocks = {fmt_bytes(info['capacity_bytes'])}), "
              "process_trace only", spread(secs["lcs"]) + f" = {fmt_rate(n / med['lcs'])}; "
              f"{info['n_hits'] / n:.1%} of accesses hit; oracleGeneral file {info['write_seconds']:.2f} s and "
              f"trace load {info['load_seconds']:.2f} s not counted (child wall "
              f"{median([c.seconds for c in children['lcs']]):.2f} s)", command=texts["lcs"])
        r.add(f"curve --cache-rules vllm at {POINTS} capacities / libCacheSim at one (ratio of the medians)",
              f"{ratio:.2f}x (per round {min(round_ratios):.2f}-{max(round_ratios):.2f}x)", f"<= {RATIO_TARGET:g}x",
              ratio <= RATIO_TARGET, texts["vllm"])
        r.add(f"kvtrace curve --cache-rules vllm, {POINTS} capacities, end to end, the trace not prepared "
              "(KVTRACE_CACHE_DIR=off: decoded and densified by the command)",
              spread(secs["vllm-unprepared"]) + f" = {med['vllm-unprepared'] / med['lcs']:.2f}x libCacheSim's one "
              f"capacity; preparing saves {med['vllm-unprepared'] - med['vllm']:.2f} s", command=texts["vllm-unprepared"])
        r.add(f"kvtrace curve --cache-rules vllm --in-flight, {POINTS} capacities, end to end",
              spread(secs["in-flight"]) + f" = {med['in-flight'] / med['lcs']:.2f}x libCacheSim's one capacity",
              command=texts["in-flight"])
        r.add(f"kvtrace curve (ideal, one pass), {POINTS} capacities, end to end (reference)",
              spread(secs["ideal"]) + f"; vllm / ideal = {med['vllm'] / med['ideal']:.2f}x", command=texts["ideal"])
        r.add("`engine` peak RSS: vllm / in-flight / ideal (max over the timed runs)",
              " / ".join(fmt_bytes(max(c.peak_rss_bytes for c in children[k])) for k in ("vllm", "in-flight",
                                                                                          "ideal")),
              command=texts["vllm"])
        r.add("`engine` untimed first runs (JIT cache as found; the first vllm run prepares the trace): vllm / "
              "libCacheSim / in-flight / ideal / vllm unprepared", " / ".join(f"{first[k][0]:.2f} s" for k in names))
        if not args.skip_breakdown:
            bad += in_process(path, r, args, med, vllm_out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    r.add("`engine` checks (libCacheSim counts stable; tables equal across threads and to the command's)",
          "yes" if not bad else "NO: " + "; ".join(bad), "yes", not bad)
    r.note(f"Model {MODEL} for bytes; libCacheSim is single-threaded, `kvtrace curve --cache-rules vllm` replays "
           f"its capacities on {os.cpu_count()} threads (one per core).")
    r.note_rounds(args.repeat, load_before, args.accesses, TARGET_ACCESSES)
    r.print()  # a missed target is reported, not an error (noisy machines); failed checks are
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
