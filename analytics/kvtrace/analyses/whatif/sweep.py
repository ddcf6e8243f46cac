"""Many what-ifs in one table: :func:`sweep` runs configurations serially or in a pool of
worker processes (each a deterministic single-thread replay, so the table equals the
serial one), and :func:`plan_workers` decides how many processes pay for their start."""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import polars as pl

from kvtrace.analyses.response import ResponseModel
from kvtrace.analyses.whatif.config import TierConfig
from kvtrace.analyses.whatif.metrics import summary_table
from kvtrace.analyses.whatif.simulate import simulate, values_array
from kvtrace.config import plain_numpy_pages
from kvtrace.kernels.memory import Scratch
from kvtrace.model import GpuSpec, ModelSpec, resolve_gpu, resolve_model
from kvtrace.trace import Accesses, Trace
from kvtrace.trace.source import TraceSource

_WORKER: dict = {}


class _MappedTrace:
    """An in-memory trace handed to the sweep's worker processes through files: its
    arrays as ``.npy`` files and its request table as uncompressed Arrow IPC in a
    temporary directory, which each worker maps (copy-on-write) instead of receiving a
    pickled copy: the pages are the OS's page cache, shared by every worker, and a
    worker starts at once (pickled, each worker would receive and unpickle a copy of
    every array). The per-access values of
    ``value>=v`` go the same way."""

    _ARRAYS = ("request", "pos", "block", "tokens", "req_start")
    _BLOCK_ARRAYS = ("block_hash", "block_tenant", "block_size")

    def __init__(self, trace: Trace, values: np.ndarray | None, directory: Path) -> None:
        self.directory = Path(directory)
        for name in self._ARRAYS:
            np.save(self.directory / f"{name}.npy", getattr(trace.accesses, name))
        for name in self._BLOCK_ARRAYS:
            np.save(self.directory / f"{name}.npy", getattr(trace, name))
        if values is not None:
            np.save(self.directory / "values.npy", values)
        trace.requests.write_ipc(self.directory / "requests.arrow", compression="uncompressed")
        self.has_values = values is not None
        self.meta = trace.meta
        self.warnings = list(trace.warnings)

    def _array(self, name: str) -> np.ndarray:
        # copy-on-write: writable arrays (what the kernels were compiled for), the file unchanged
        return np.load(self.directory / f"{name}.npy", mmap_mode="c").view(np.ndarray)

    def open(self) -> tuple[Trace, np.ndarray | None]:
        """The trace (and values) backed by the files."""
        trace = Trace(requests=pl.read_ipc(self.directory / "requests.arrow"),
                      accesses=Accesses(**{name: self._array(name) for name in self._ARRAYS}),
                      **{name: self._array(name) for name in self._BLOCK_ARRAYS}, meta=self.meta,
                      warnings=self.warnings)
        return trace, self._array("values") if self.has_values else None


def _shared_tmp(trace: Trace) -> str | None:
    """Where the sweep writes the trace for its workers: ``/dev/shm`` (memory: written
    at memory speed, no disk writeback) when it has room for it twice over and
    ``TMPDIR`` does not say otherwise; else the usual temporary directory."""
    if os.environ.get("TMPDIR") or not os.path.isdir("/dev/shm"):
        return None
    need = (sum(getattr(trace.accesses, name).nbytes for name in _MappedTrace._ARRAYS)
            + trace.requests.estimated_size())
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        return None
    return "/dev/shm" if free > 2 * need and os.access("/dev/shm", os.W_OK) else None


def _init_worker(trace, kwargs) -> None:
    if isinstance(trace, _MappedTrace):
        trace, values = trace.open()
        if values is not None:
            kwargs = {**kwargs, "values": values}
    _WORKER["trace"] = trace
    _WORKER["kwargs"] = kwargs
    _WORKER["scratch"] = Scratch()  # one block table for the worker's configurations


def _summary_in_worker(config: TierConfig) -> dict:
    return simulate(_WORKER["trace"], config, **_WORKER["kwargs"], requests_table=False,
                    scratch=_WORKER["scratch"]).summary


#: Seconds to start a parallel sweep's worker processes (spawn, imports, mapping the
#: trace, loading the cached kernels) in :func:`plan_workers`' estimate.
WORKER_START_S = 2.5
#: one configuration's replay on one core, block accesses per second (simulate with its
#: per-request metrics; the README's performance table has the kernels alone)
REPLAY_ACCESSES_PER_S = 9e6


def plan_workers(n_configs: int, n_accesses: int, workers: int | None = None) -> tuple[int, str]:
    """How many processes a sweep should use, and why, in words for the output.

    ``workers`` given: that many (at most one per configuration). ``None``: by the
    estimated work: serial replay takes ``n_configs x n_accesses /
    REPLAY_ACCESSES_PER_S`` seconds; ``w`` workers (at most the CPUs this process may
    use) take :data:`WORKER_START_S` more plus ``ceil(n_configs / w)`` replays each;
    the smaller estimate wins.
    """
    if workers is not None:
        w = max(1, min(workers, n_configs))
        return w, ("serially (--workers 1)" if w == 1 else f"on {w} worker processes (--workers {workers})")
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    w = max(1, min(cpus, n_configs))
    one = n_accesses / REPLAY_ACCESSES_PER_S
    serial = n_configs * one
    if w == 1:
        return 1, "serially (one configuration)" if n_configs <= 1 else f"serially ({cpus} CPU)"
    parallel = WORKER_START_S + math.ceil(n_configs / w) * one
    if parallel < serial:
        return w, f"on {w} worker processes (estimated {parallel:,.1f} s against {serial:,.1f} s serially)"
    return 1, (f"serially (estimated {serial:,.1f} s of replay; {w} worker processes would take {parallel:,.1f} s "
               f"with the ~{WORKER_START_S:g} s they need to start)")


@plain_numpy_pages
def sweep(
    trace: TraceSource,
    configs: list[TierConfig],
    *,
    model: ModelSpec | str | None = None,
    gpu: GpuSpec | str | None = None,
    response: ResponseModel | None = None,
    eviction: str = "prefix-aware",
    cache_rules: str = "ideal",
    values=None,
    warmup: str | float | None = None,
    workers: int = 2,
    progress=None,
) -> pl.DataFrame:
    """Simulate every configuration and compare them in one table.

    Configurations run in ``workers`` processes (``spawn``: each worker maps the trace
    from files written once, :class:`_MappedTrace`, then runs one configuration at a
    time); each one is a deterministic single
    thread replay, so the table equals the serial one. ``workers <= 1`` runs serially
    in this process. As with any ``spawn`` pool, a script calling this must do so under
    ``if __name__ == "__main__":`` (the workers re-import the main module).

    ``progress(done, total)`` is called as configurations finish (in order). A
    streamed trace (:class:`kvtrace.ingest.stream.StreamedTrace`) reaches the workers
    without its accesses: each replays from the same spill file.

    Returns
    -------
    polars.DataFrame
        One row per configuration, in the given order (:meth:`WhatIfResult.summary`).
    """
    kwargs = {"model": model if isinstance(model, ModelSpec) else resolve_model(model),
              "gpu": gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu), "response": response,
              "eviction": eviction, "cache_rules": cache_rules,
              "values": None if values is None else values_array(values, trace.n_accesses),
              "warmup": warmup}
    configs = list(configs)
    rows = []

    def done(row) -> None:
        rows.append(row)
        if progress is not None:
            progress(len(rows), len(configs))

    if workers <= 1 or len(configs) <= 1:
        scratch = Scratch()  # one block table for every configuration, in turn
        for c in configs:
            done(simulate(trace, c, **kwargs, requests_table=False, scratch=scratch).summary)
        return summary_table(rows)
    ctx = multiprocessing.get_context("spawn")  # fork is unsafe with Polars' and Numba's threads
    # how the source reaches the workers, not how it is replayed: an in-memory trace's
    # arrays through mapped files; any other source (a streamed trace, whose accesses
    # are in its spill file already) pickled as it is
    to_map = isinstance(trace, Trace)
    with (tempfile.TemporaryDirectory(prefix="kvtrace-sweep-", dir=_shared_tmp(trace)) if to_map
          else contextlib.nullcontext()) as tmp:
        handle = trace
        if to_map:
            values = kwargs["values"]
            mapped = isinstance(values, np.ndarray)
            handle = _MappedTrace(trace, values if mapped else None, Path(tmp))
            if mapped:
                kwargs = {**kwargs, "values": None}
        with ProcessPoolExecutor(max_workers=min(workers, len(configs)), mp_context=ctx,
                                 initializer=_init_worker, initargs=(handle, kwargs)) as pool:
            for row in pool.map(_summary_in_worker, configs):
                done(row)
    return summary_table(rows)


__all__ = ["REPLAY_ACCESSES_PER_S", "WORKER_START_S", "plan_workers", "sweep"]
