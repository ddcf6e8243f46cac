"""One what-if run: a trace source replayed through one tier configuration.

:func:`simulate` is one fold over :meth:`kvtrace.trace.source.TraceSource.chunks`,
whatever the source: each chunk of whole requests is fed to a
:class:`kvtrace.kernels.tiers.TierSimulator`, which carries the tiers between chunks,
and its per-request outputs go to a :class:`~kvtrace.analyses.whatif.metrics.RequestFold`
as each chunk finishes. Per-access inputs of the admission policy are columns of the
source read alongside the blocks: the values of ``value>=v``, and for ``reuse-oracle``
the admit-all run's decisions (written by a first replay) and the oracle flags derived
from them by a backward pass (:func:`oracle_flags`). An in-memory trace keeps them as
arrays, a streamed one as spill files; the code is the same.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from kvtrace.analyses.curves import group_labels, parse_warmup, warmup_first_request
from kvtrace.analyses.distances import normalise_eviction
from kvtrace.analyses.response import ResponseModel
from kvtrace.analyses.whatif.config import PROMOTIONS, TierConfig, route
from kvtrace.analyses.whatif.metrics import RequestFold, residency_table, summarise, summary_table
from kvtrace.analyses.whatif.policy import Policy
from kvtrace.config import plain_numpy_pages
from kvtrace.errors import UsageError
from kvtrace.kernels import tiers as K
from kvtrace.kernels.memory import Scratch
from kvtrace.model import GpuSpec, ModelSpec, resolve_gpu, resolve_model
from kvtrace.trace.source import Column, TraceSource


@dataclass
class WhatIfResult:
    """Output of :func:`simulate` (schemas in the package docstring).

    Attributes
    ----------
    config : TierConfig
    summary : dict
        Every metric of the configuration (one row of :func:`sweep`'s table).
    residency : polars.DataFrame
        Residency histograms per tier.
    requests : polars.DataFrame or None
        Per measured request: bytes by tier, recompute FLOPs, service time (None
        when :func:`simulate` was asked not to build it).
    info : dict
        Model, capacities in tokens, warm-up, counters of the run.
    """

    config: TierConfig
    summary: dict
    residency: pl.DataFrame
    requests: pl.DataFrame | None
    info: dict = field(default_factory=dict)

    @property
    def table(self) -> pl.DataFrame:
        """The summary as a one-row table."""
        return summary_table([self.summary])

    def to_dict(self) -> dict:
        """Summary, non-empty residency bins and run information (JSON-ready)."""
        return {
            "summary": self.summary,
            "residency": self.residency.filter(pl.col("count") > 0).to_dicts(),
            "info": self.info,
        }


def values_array(values, n: int) -> np.ndarray | Path | None:
    """The per-access values of ``value>=v`` checked against a trace of ``n`` accesses:
    float64[n] (from an array or a :class:`kvtrace.analyses.value.FutureReuse`), or the
    path of a float64 file of ``n`` values (:func:`kvtrace.analyses.value.streamed_values`)."""
    if values is None:
        return None
    if isinstance(values, (str, Path)):
        path = Path(values)
        if path.stat().st_size != 8 * n:
            raise UsageError(f"{path.name}: expected {n} float64 values, one per block access", field="values")
        return path
    arr = getattr(values, "value_usd", values)
    arr = np.ascontiguousarray(arr, dtype=np.float64)
    if arr.shape != (n,):
        raise UsageError(f"expected one value per block access ({n}), got shape {arr.shape}", field="values")
    return arr


#: The engine reuse rules a tier replay applies under each ``--cache-rules`` (the
#: kernel's ``RULE_*`` bits, :mod:`kvtrace.kernels.tiers` "Engine reuse rules").
#: vLLM and SGLang share both: a hit capped at the prompt's length - 1 tokens, only
#: full blocks (pages) cached. Their pool rules (free order, second copies, oversize
#: rejection, SGLang's eviction amount) belong to the GPU pool, which the tiers are not.
TIER_RULES = {"ideal": 0, "vllm": K.RULE_LAST_TOKEN_CAP | K.RULE_FULL_BLOCKS_ONLY,
              "sglang": K.RULE_LAST_TOKEN_CAP | K.RULE_FULL_BLOCKS_ONLY}
#: What each ``--cache-rules`` means for the tiers (``info["cache_rules_text"]``).
TIER_RULE_TEXT = {
    "ideal": "kvtrace's ideal model: every block of a prompt, partial ones included, can be stored and reused",
    **{name: (f"{label}: a request's last block is recomputed (hits capped at the prompt's length - 1 tokens) and "
              "stored again; only full blocks are stored or reused (a partial last block is recomputed and never "
              "reaches a tier). The engine's GPU-pool rules (free order, second copies, oversize rejection"
              + (", eviction amount" if name == "sglang" else "") + ") apply to its HBM, not to these tiers: "
              f"kvtrace curve --cache-rules {name} replays them")
       for name, label in (("vllm", "vLLM v1 with a KV offload connector"),
                           ("sglang", "SGLang with hierarchical cache"))},
}


def tier_rules(cache_rules: str) -> int:
    """The kernel's rule bits of ``cache_rules`` (``ideal``, ``vllm`` or ``sglang``)."""
    if cache_rules not in TIER_RULES:
        raise UsageError(f"expected ideal, vllm or sglang, got '{cache_rules}'", field="cache-rules")
    return TIER_RULES[cache_rules]


_column_ids = itertools.count()


def _scratch_column(trace: TraceSource, what: str) -> Column:
    """An int8 column of ``trace`` for this run alone (sweep workers replay one
    streamed trace side by side: the name is unique to the process and the run)."""
    return trace.column(f"whatif-{what}-{os.getpid()}-{next(_column_ids)}", np.int8)


def oracle_flags(trace: TraceSource, decisions: Column) -> Column:
    """The ``reuse-oracle`` admission input of each access
    (:func:`kvtrace.kernels.tiers.reuse_oracle_flags`): 1 iff the block's next access
    was served from a flash tier in the admit-all run whose decisions are
    ``decisions``. One backward pass over the chunks, last to first, carrying a byte
    per block (:func:`kvtrace.kernels.tiers.oracle_flags_chunk`)."""
    flags = _scratch_column(trace, "oracle")
    next_flash = np.zeros(trace.n_blocks, dtype=np.int8)
    out = None
    for ch in trace.chunks(layout=False, columns=[decisions], reverse=True, block_dtype=None):
        m = ch.hi - ch.lo
        out = np.empty(m, dtype=np.int8) if out is None or out.shape[0] < m else out
        K.oracle_flags_chunk(ch.block, ch.extra[0], next_flash, out[:m])
        flags.write(ch.lo, out[:m])
    flags.close()
    return flags


def _replay(trace: TraceSource, config: TierConfig, caps, prefix_aware: bool, first_req: int, node,
            policy: Policy, values: Column | None = None, oracle: Column | None = None, group=None, n_groups=1,
            decisions: Column | None = None, fold: RequestFold | None = None, progress=None,
            scratch=None, on_chunk=None, rules: int = 0) -> K.TierRun:
    """One replay, chunk by chunk: ``values`` and ``oracle`` are read alongside the
    blocks; ``decisions``, if given, receives each access's decision; ``fold``, if
    given, each chunk's per-request outputs (the simulator keeps only the last chunk's)."""
    d, loc, fl = caps
    width = K.sketch_width(fl + config.nodes * loc, trace.meta.block_tokens, trace.n_blocks)
    sim = K.TierSimulator(
        trace.block_size, trace.request_timestamp, node, block_tokens=trace.meta.block_tokens,
        prefix_aware=prefix_aware, dram=d, local=loc, flash=fl, n_nodes=config.nodes, policy=policy.code,
        param=policy.param, flash_lru=config.flash_order == "lru", promotion=PROMOTIONS[config.promotion],
        write_through=config.write_mode == "write-through", first_measured=first_req, req_group=group,
        n_groups=n_groups, has_values=values is not None, sketch_width=width, scratch=scratch, chunk_columns=True,
        rules=rules,
    )
    columns = [c for c in (values, oracle) if c is not None]
    for ch in trace.chunks(columns=columns, local_req=False):  # no per-access request ids: not read
        extra = list(ch.extra)
        v = extra.pop(0) if values is not None else None
        o = extra.pop(0) if oracle is not None else None
        decision = sim.feed(ch.block, ch.tokens, ch.pos, ch.lrs, v, o)
        if fold is not None:
            fold.add(sim.chunk_out, ch.r, sim.req_first)
        if on_chunk is not None:
            on_chunk(ch, decision, sim.chunk_out, node)
        if decisions is not None:
            decisions.write(ch.lo, decision)
        if progress is not None:
            progress(ch.hi, trace.n_accesses)
    if decisions is not None:
        decisions.close()
    return sim.finish()


@plain_numpy_pages
def simulate(
    trace: TraceSource,
    config: TierConfig,
    *,
    model: ModelSpec | str | None = None,
    gpu: GpuSpec | str | None = None,
    response: ResponseModel | None = None,
    eviction: str = "prefix-aware",
    cache_rules: str = "ideal",
    values=None,
    warmup: str | float | None = None,
    progress=None,
    requests_table: bool = True,
    scratch: Scratch | None = None,
    on_chunk=None,
) -> WhatIfResult:
    """Replay ``trace`` through one tier configuration.

    Parameters
    ----------
    trace : TraceSource
        In memory (:class:`kvtrace.trace.Trace`) or scanned once by
        :func:`kvtrace.ingest.stream.open_stream` (memory then bounded by distinct
        blocks and requests); the same fold over its chunks either way, so the results
        are the same bit for bit.
    config : TierConfig
    model : ModelSpec or str, optional
        Bytes per token and prefill FLOPs (default Llama-3.1-70B).
    gpu : GpuSpec or str, optional
        GPU-seconds and $ of the compute saved (default H100).
    response : ResponseModel, optional
        Branch times for the per-request service time; default
        ``ResponseModel(recompute_flops_per_s=gpu.effective_flops)``.
    eviction : str
        ``prefix-aware`` (default) or ``flat`` LRU model, as for the curve.
    cache_rules : str
        ``ideal`` (default), ``vllm`` or ``sglang``: the engine's reuse rules applied
        to the tiers (:data:`TIER_RULES`, :data:`TIER_RULE_TEXT`).
    values : float64[N], FutureReuse or path, optional
        Value ($) of keeping the block after each access (``value>=v`` policy and the
        value columns), or the path of a float64 file of them
        (:func:`kvtrace.analyses.value.streamed_values`).
    warmup : str or float, optional
        Fraction of requests or duration that only fills the tiers.
    progress : callable, optional
        ``progress(accesses_done, accesses_total)`` per chunk replayed.
    requests_table : bool
        Build the per-request table (``requests``; None without it: a sweep needs
        only the summary, and the table is ~60 bytes per request).
    scratch : kvtrace.kernels.memory.Scratch, optional
        Memory for the simulator's block table and per-request outputs, kept between
        calls that run one after another (:func:`sweep` passes one to all its
        configurations); results do not depend on it.
    on_chunk : callable, optional
        ``on_chunk(chunk, decisions, requests, node)`` after each chunk of the measured
        replay: the :class:`~kvtrace.trace.source.AccessChunk` (blocks, tokens, pos,
        local request offsets), its accesses' decisions, the simulator's per-request
        rows of it (``kvtrace.kernels.tiers.REQUEST_COLUMNS``, warm-up requests
        included) and the node of every request of the trace (how
        :mod:`kvtrace.analyses.load` reads a replay).

    Returns
    -------
    WhatIfResult
    """
    model = model if isinstance(model, ModelSpec) else resolve_model(model)
    gpu = gpu if isinstance(gpu, GpuSpec) else resolve_gpu(gpu)
    response = response if response is not None else ResponseModel(recompute_flops_per_s=gpu.effective_flops)
    ev = normalise_eviction(eviction)
    rules = tier_rules(cache_rules)
    prefix_aware = ev == "prefix-aware"
    bpt = int(model.kv_bytes_per_token)
    a_coef, b_coef = model.flops_coefficients()
    policy = config.parsed_policy
    wu = parse_warmup(warmup)
    first_req = warmup_first_request(trace, wu)
    if first_req >= trace.n_requests and trace.n_requests:
        raise UsageError("the warm-up covers the whole trace: nothing left to measure", field="warmup")
    caps = (config.dram_bytes // bpt, config.local_ssd_bytes // bpt, config.flash_bytes // bpt)
    node = route(trace, config.nodes, config.routing)
    vals = values_array(values, trace.n_accesses)
    if policy.kind == "value" and vals is None:
        raise UsageError("the value>=v policy needs per-access values (kvtrace.analyses.value.future_reuse(...))",
                         field="values")
    vals = None if vals is None else Column.existing(vals, np.float64)
    group, n_groups = None, 1
    if policy.kind == "group":
        group, labels = group_labels(trace, policy.by)
        n_groups = len(labels)
    oracle = None
    if policy.kind == "reuse-oracle":
        scratch = scratch if scratch is not None else Scratch()  # the two runs share it
        decisions = _scratch_column(trace, "decisions")
        try:
            _replay(trace, config, caps, prefix_aware, first_req, node, Policy("all"), decisions=decisions,
                    progress=progress, scratch=scratch, rules=rules)
            oracle = oracle_flags(trace, decisions)
        finally:
            decisions.drop()
    try:
        fold = RequestFold(trace, first_req, config, bpt, a_coef, b_coef, response, requests_table)
        run = _replay(trace, config, caps, prefix_aware, first_req, node, policy, vals, oracle, group, n_groups,
                      fold=fold, progress=progress, scratch=scratch, on_chunk=on_chunk, rules=rules)
    finally:
        if oracle is not None:
            oracle.drop()

    summary, requests = summarise(trace, config, run, fold, node, first_req, bpt, a_coef, b_coef, gpu, vals,
                                  requests_table)
    summary = {
        "config": config.label, "dram_bytes": config.dram_bytes, "local_ssd_bytes": config.local_ssd_bytes,
        "flash_bytes": config.flash_bytes, "nodes": config.nodes, "routing": config.routing,
        "policy": config.policy, "flash_order": config.flash_order, "promotion": config.promotion,
        "write_mode": config.write_mode, "inclusive": config.inclusive, "eviction": ev, "cache_rules": cache_rules,
        "model": model.name, "kv_bytes_per_token": bpt, **summary,
    }
    shift = run.time_shift
    info = {
        "model": model.name, "kv_bytes_per_token": bpt, "gpu": gpu.name, "eviction": ev,
        "cache_rules": cache_rules, "cache_rules_text": TIER_RULE_TEXT[cache_rules],
        "capacity_tokens": {"dram": caps[0], "local_ssd": caps[1], "flash": caps[2]},
        "warmup": None if wu is None else {"kind": wu[0], "value": wu[1]},
        "first_measured_request": first_req, "response": dataclasses.asdict(response),
        "counts": run.counts, "time_quantum_s": 2.0 ** (K.HIST_MIN_EXP + shift),
    }
    return WhatIfResult(config, summary, residency_table(run.hist, config, shift), requests, info)


__all__ = ["TIER_RULES", "TIER_RULE_TEXT", "WhatIfResult", "oracle_flags", "simulate", "tier_rules", "values_array"]
