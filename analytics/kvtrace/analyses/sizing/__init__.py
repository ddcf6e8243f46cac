"""Tier-sizing recommendation (``kvtrace size``; DESIGN §4-5, seed §1, §6-8, §15).

The question: *keep today's DRAM, expand it, add a local SSD, add a shared flash pool,
tier both, or just recompute — and why, in dollars and milliseconds?*

:func:`recommend` answers it for one trace and one :class:`SizingConfig` (a TOML file,
documented in ``sample_traces/tiers.example.toml``):

1. **Curves.** One pass of the stack-distance kernel gives every access's reuse
   distance (per node too when ``nodes > 1``): the capacity-hit curve, its knee, and
   the raw material of the search.
2. **Search on the curves.** Under the DESIGN §2 invariant (admit-all, exclusive tiers,
   promote on hit: DRAM ``C_d`` over flash ``C_f`` is one LRU of ``C_d + C_f``), an
   access is a DRAM hit iff its distance is ``<= C_d`` and a flash hit iff it is ``<=
   C_d + C_f``. That gives, for any capacities and without replaying, every request's
   bytes from each tier and recompute FLOPs, hence the per-request reusable-prefix time
   (:func:`kvtrace.analyses.response.request_times`), its mean and P99, the read bandwidth (mean
   and peak window), the flash writes of admit-all (DRAM evictions) and the compute
   saved. Capacities are searched on each tier's purchase grid (multiples of its
   ``step`` up to ``max``). With ``nodes > 1`` DRAM and local SSD use per-node
   distances (exact); a shared pool is approximated by the pooled distance ``<= N C_d +
   C_f``. Traces with more than 2M measured accesses are searched on a systematic
   1-in-k request sample (the finalists are then replayed in full).
3. **Lenses** (seed §8). Six candidates — ``keep-dram``, ``expand-dram``,
   ``add-local-ssd``, ``add-shared-flash``, ``dram+flash`` (more DRAM *and* a shared
   pool) and ``recompute-only`` (no host KV tier) — each under three lenses:

   - ``same-slo``: per candidate the *cheapest* configuration meeting the SLO (mean
     and/or P99 reusable-prefix time), the bandwidth and the endurance limits. The
     closest lens to a production decision: the recommendation comes from it.
   - ``same-capacity``: every candidate holds the same total capacity (``economics.
     same_capacity``, default the curve's 95 %-of-ceiling knee, rounded up to the DRAM
     step); ``dram+flash`` picks its best split.
   - ``same-budget``: every candidate spends at most the same monthly budget
     (``economics.budget_monthly_usd``, default the monthly cost of the same-SLO
     winner): the most capacity that money buys (``dram+flash``: its best split).

   ``keep-dram`` and ``recompute-only`` are fixed configurations: they appear, with
   the same figures, under every lens as references.
4. **Confirmation.** Every finalist is replayed with the exact tier simulator
   (:func:`kvtrace.analyses.whatif.simulate`) under each admission policy of
   ``search.policies``; a row keeps the policy that meets every constraint with the
   best net benefit. A same-SLO finalist the simulator shows missing a constraint is
   stepped up its purchase grid (at most 3 times). Every figure in the table comes from
   the simulator, not from the search.

Money (:mod:`kvtrace.analyses.estimate`): a configuration's monthly cost is the sum over its
tiers of ``hardware / amortisation + support + kW x hours x $/kWh + reserve``, with
hardware = ``$/TiB x TiB + $/unit x units`` (units = servers, enclosures or drives:
``ceil(capacity / unit_capacity)``, per node for DRAM and local SSD). Existing DRAM is
priced like new DRAM in every option (replacement cost, seed §8). GPU-hours freed =
(compute saved by the candidate - by today's deployment) per month, at ``$/GPU-hour``;
realised value = realisation x value when positive, the full value when negative (a
candidate that needs more GPU time pays for it); net = realised - incremental monthly
cost; break-even realisation = incremental / value. The trace is taken as
representative of every hour of the month, replayed at ``load.scale`` x its arrival
rate (timestamps divided by the scale: hit shares and service times do not change;
bandwidth, writes per day and $ per month scale with it).

Not modelled: queueing (service times are unloaded; the bandwidth check is the guard),
the GPU time a restore itself costs, HBM prefix caching (common to every option),
replicas and failure domains.

Candidates table (:attr:`SizingResult.candidates`, one row per candidate x lens): the
columns of ``kvtrace.names.TABLES["size"]``, each with its unit. ``rank`` 1 is the best
of its lens: feasible rows first (net benefit, then cost), then infeasible ones by
shortfall (closest first). ``shortfall`` is the normalised shortfall: the largest excess
of a failed constraint over its limit as a share of the limit (0.25: 25 % over; 0 when
feasible): mean / target - 1, P99 / target - 1, DRAM reads / DRAM bandwidth - 1, peak
flash reads / flash bandwidth - 1, DWPD / rating - 1. The ``ssd_`` columns are the
candidate's flash level (its local SSDs or the shared pool).

Search table (:attr:`SizingResult.search`, every evaluated point): ``candidate``,
``dram_bytes``, ``local_ssd_bytes``, ``flash_bytes``, ``total_bytes``, ``dram_prefix_token_hit_rate``,
``ssd_prefix_token_hit_rate``, ``service_time_mean_ms``, ``service_time_p99_ms``, ``ssd_read_mean_bytes_per_s``,
``ssd_read_peak_bytes_per_s``, ``dram_read_mean_bytes_per_s``, ``ssd_dwpd`` (admit-all),
``gpu_seconds_saved_per_hour``, ``cost_usd_per_month``, ``net_usd_per_month``,
``meets_slo``, ``within_limits`` (bandwidth and endurance), ``feasible`` (all three); all
estimates.

Modules: :mod:`~kvtrace.analyses.sizing.config` (the TOML schema, validation, reading and
writing, :func:`default_config`), :mod:`~kvtrace.analyses.sizing.search` (the estimates,
:func:`recommend`, the verdict), :mod:`~kvtrace.analyses.sizing.lenses` (money, replayed
rows, the three lenses), :mod:`~kvtrace.analyses.sizing.replay` (the ``kvtrace whatif``
reproduction as data and as a command). The report (Markdown and HTML, with charts) is
presentation: :mod:`kvtrace.results.sizing_report`.
"""

from kvtrace.analyses.sizing.config import (CANDIDATE_TEXT, CANDIDATES, GIB, LENSES, SECTIONS, TIB, TIER_KEYS, TIERS,
                                            SizingConfig, TierSpec, config_from_toml, default_config,
                                            load_config)
from kvtrace.analyses.sizing.lenses import FLASH_TIER, SHORTFALL_TEXT
from kvtrace.analyses.sizing.replay import WhatifReplay, whatif_args, whatif_command
from kvtrace.analyses.sizing.search import Recommendation, SizingResult, recommend

__all__ = ["CANDIDATES", "CANDIDATE_TEXT", "FLASH_TIER", "GIB", "LENSES", "Recommendation", "SECTIONS",
           "SHORTFALL_TEXT", "SizingConfig", "SizingResult", "TIB", "TIERS", "TIER_KEYS", "TierSpec", "WhatifReplay",
           "config_from_toml", "default_config", "load_config", "recommend", "whatif_args", "whatif_command"]
