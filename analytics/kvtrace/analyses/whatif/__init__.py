"""Tier what-ifs (``kvtrace whatif``): DRAM over local SSD / shared flash, exactly.

:func:`simulate` replays a trace through one tier configuration (:class:`TierConfig`)
with the event simulator of :mod:`kvtrace.kernels.tiers` (its docstring states the
semantics in full); :func:`sweep` runs many configurations in parallel processes and
returns one comparison table. Capacities are given in bytes and simulated in tokens
(``bytes // kv_bytes_per_token``); a block occupies its cache size (its largest token
count in the trace).

Modules: :mod:`~kvtrace.analyses.whatif.policy` (the admission-policy grammar),
:mod:`~kvtrace.analyses.whatif.config` (:class:`TierConfig`, grids of them, routing),
:mod:`~kvtrace.analyses.whatif.simulate` (one run: a fold over the source's chunks),
:mod:`~kvtrace.analyses.whatif.metrics` (per-request fold, summary and tables),
:mod:`~kvtrace.analyses.whatif.sweep` (many configurations, a process pool).

Semantics decided here (beyond DESIGN §2)
-----------------------------------------
- **Same LRU model as the curve.** DRAM is an LRU of ``C_d`` under the prefix-aware
  (default) or flat model; with ``promote`` or ``copy`` it sees every touch, so on one
  node its hits equal the curve's ``H(C_d)`` whatever the admission policy, whenever
  ``C_d >= the largest block`` (below that the curve's stack model lets a too-large
  block flush the cache, while here it passes through DRAM, as in a real cache; a
  flash hit too large for DRAM is read in place, never promoted).
- **Request-atomic touches pin the request's blocks** (they are in use): they are not
  victims of the request's own inserts unless the request alone overflows DRAM; a
  block repeated in a request is touched once. With one block size and ``C_d >=`` one
  block, ``all`` + exclusive + ``promote`` + write-on-evict (LRU or FIFO flash: flash
  blocks are never touched in place) is exactly one LRU of ``C_d + C_f`` (of
  ``C_d + C_l + C_f`` with a local SSD). With mixed sizes and every tier holding the
  largest block, it hits every access the curve hits at ``C_d + C_f - (largest block
  - 1)`` tokens and none that it misses at ``C_d + C_f`` (DRAM's unused slack is under
  one block).
- **inclusive / exclusive** only restricts the options: exclusive allows ``promote``
  or ``none`` with write-on-evict (a block is then never in two tiers of a node's
  path); ``copy`` and write-through keep copies and need ``inclusive=True``.
  Across nodes a shared-flash block may also sit in another node's DRAM.
- **write-through** writes a miss to flash when it enters DRAM (if admitted); nothing
  is written at eviction. Under write-through, ``promote`` moves a flash hit out of
  flash for good.
- **Local SSD** (``local_ssd_bytes`` per node) is a tier between the node's DRAM and
  the shared flash: DRAM victims go to it, its victims to the shared flash, both
  through the admission policy. ``nodes=N, local_ssd_bytes=X`` vs ``nodes=N,
  flash_bytes=N*X`` compares the same flash bought as local SSDs or as one pool
  (:func:`local_vs_shared`).
- **Routing**: ``session`` (hash of ``session_id``, the request id when null),
  ``round-robin`` (trace order), ``prefix`` (hash of the first block's source hash;
  the request id for an empty request). Hash: splitmix64 of the key xor a fixed
  seed, modulo N.
- **reuse-oracle** (clairvoyant): a first pass runs the same configuration with
  ``all``; the policy then admits a write iff the block's next access was served from
  flash in that pass. With one block size, exclusive ``promote`` and write-on-evict it
  reproduces the admit-all hits exactly while writing only blocks that are read back
  (one write per block read back): the write floor at the admit-all hit rate. It
  costs two replays.
- **value>=v** reads a per-access value ($ of keeping the block after that access,
  :attr:`kvtrace.analyses.value.FutureReuse.value_usd`) at the block's latest access.
  ``value_captured`` sums the values of the writes made, ``value_bound`` the positive
  values over all write opportunities (what a perfect value filter would keep).
- **tinylfu**: count-min sketch, width = the power of two >= 4 x the flash capacity
  (shared + all local SSDs) in full blocks, capped at 4 x the trace's distinct blocks;
  strict ``>`` against the victim, no admission window (see the kernel docstring).
- **group>=p** (``group:type>=p``, ``group:tenant>=p``, ``group:turn>=p``): online
  re-reference probability of the group of the block's latest access, from the past
  only (Laplace prior 1/2).
- **Request shares.** A request counts in ``dram_request_hit_rate`` if its first block is
  served from DRAM (so it equals the curve's request hit rate at ``C_d``),
  ``local_request_hit_rate`` / ``flash_request_hit_rate`` if it is served from that tier, else
  ``request_miss_rate``. Token/byte/compute shares weight each usable-prefix block at the
  *deepest tier so far in its request* (DRAM alone would not have served a DRAM block
  that follows a flash block): ``h_dram = H(C_d)`` in every unit.
- **Response time** of a request's reusable prefix (the blocks before its first cold
  one): :func:`kvtrace.analyses.response.request_times` with the usable prefix's bytes read
  from DRAM and from flash (local SSD reads use the flash parameters), the prefill
  FLOPs of those flash blocks (restore-or-recompute deadline) and of the reusable
  blocks beyond the usable prefix (recomputed). Every request of a configuration with
  a flash tier pays the overhead O.

Summary (:attr:`WhatIfResult.summary`, one row per configuration in :func:`sweep`): the
columns of ``kvtrace.names.TABLES["whatif"]``, each with its unit. Per unit (``request``,
``token``, ``byte``, ``compute``) the DRAM, local SSD, flash and miss shares are
unconditional and sum to 1 (``names.tier_rate``, ``names.MISS_OF_UNIT``); DWPD divides a
tier's daily writes by its capacity (all nodes' SSDs for local); peaks are over windows
of ``window_s``.

Residency table (:attr:`WhatIfResult.residency`): ``tier`` (dram/local/flash) ·
``metric`` (``lifetime_s``: insert to exit by eviction or promotion;
``idle_before_eviction_s``: last touch to eviction; ``reuse_gap_s``: last touch to a
hit in the tier) · ``bin_lo_s``, ``bin_hi_s`` (octaves; last bin open, ``inf``) ·
``count``. Times are quantised to 2**-10 s (coarser for traces over 24 days);
blocks still resident at the end are not counted.

Request table (:attr:`WhatIfResult.requests`, measured requests): ``request`` (row of
the request table) · ``node`` · ``branch`` (deepest tier of its usable prefix, or
``miss``) · ``dram_bytes``, ``local_bytes``, ``flash_bytes`` (usable-prefix bytes
read) · ``flash_recompute_flops`` · ``miss_recompute_flops`` · ``service_time_ms``.
"""

from __future__ import annotations

from kvtrace.analyses.whatif.config import (
    FLASH_ORDERS,
    MAX_NODES,
    PROMOTIONS,
    ROUTINGS,
    WRITE_MODES,
    TierConfig,
    config_grid,
    has_session_ids,
    local_vs_shared,
    route,
    trace_needs,
)
from kvtrace.analyses.whatif.metrics import summary_table, tier_share
from kvtrace.analyses.whatif.policy import Policy, parse_policy
from kvtrace.analyses.whatif.simulate import (
    TIER_RULE_TEXT, TIER_RULES, WhatIfResult, oracle_flags, simulate, tier_rules, values_array,
)
from kvtrace.analyses.whatif.sweep import REPLAY_ACCESSES_PER_S, WORKER_START_S, plan_workers, sweep

__all__ = ["FLASH_ORDERS", "MAX_NODES", "PROMOTIONS", "Policy", "REPLAY_ACCESSES_PER_S", "ROUTINGS", "TIER_RULES",
           "TIER_RULE_TEXT", "TierConfig", "WORKER_START_S", "WRITE_MODES", "WhatIfResult", "config_grid",
           "has_session_ids", "local_vs_shared",
           "oracle_flags", "parse_policy", "plan_workers", "route", "simulate", "summary_table", "sweep",
           "tier_rules", "tier_share", "trace_needs", "values_array"]
