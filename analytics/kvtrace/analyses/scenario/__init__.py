"""Scenarios (``kvtrace scenario``): the same trace replayed through one tier system
under dynamic conditions — a cold start, a restart that keeps the flash, sessions
migrating between nodes, a lost flash target, a catalog outage, a model-version
rollout, TTL expiry, prestaging during a session's pauses, prewarming after a loss —
each beside the baseline without events, with the load model's TTFT, a per-bin
timeline and the time to recover.

Semantics (exact: an event simulation; ``tests/naive_scenario.py`` is the slow twin):

- the tier replay is :mod:`kvtrace.kernels.tiers`'; an event edits its state between
  two requests, before the first request at or after the event's time
  (:mod:`kvtrace.kernels.scenario_ops`: a dropped block leaves its tier without being
  written below or counted as an eviction, and stays known: its next access is a miss,
  not a first access);
- ``cold-start`` drops every tier's blocks; ``restored`` drops DRAM's (the local SSDs
  and the shared flash keep theirs, their catalog restored); ``target-loss`` drops the
  shared-flash blocks placed on one of ``[load] flash_targets`` targets (by the hash
  the load model places reads with); ``catalog-outage`` makes the shared flash
  unreachable for a duration (no hit, no write there; its blocks come back as they
  were); ``ttl`` sweeps expire blocks idle longer than a tier's TTL, to the simulator's
  time quantum (2**-10 s for traces shorter than 24 days);
- ``migration`` moves a share of sessions (a fixed coin per session) to the next node
  from the event on; ``rollout`` moves a share of sessions (ramping) to a new model
  version whose blocks are a second namespace, and optionally retires the old
  version's blocks at a rate after the ramp;
- ``prestage``: at a session's pause, a prefetch of the predicted next-turn blocks is
  fed to the tier simulator as a request of its own between the real ones (its flash
  hits promoted into DRAM as a request's are), up to the first block no tier of the node
  holds; prefetches share a bandwidth first come first served. A moved block is useful
  iff its next access reads it from DRAM; a prestaged turn's coverage counts the
  usable-prefix bytes it did not have in DRAM at the prefetch's issue and read from DRAM
  thanks to a prefetch;
- ``prewarm``: each node's DRAM refilled from the tiers below under a bandwidth budget,
  in value, recency or storage order (:mod:`kvtrace.analyses.scenario.prewarm`), each
  group of landings fed as a fetch;
- prefetches and prewarms are the load model's *transfers*: their reads join the
  requests' restores on the same link queues from the transfer's start
  (:class:`kvtrace.analyses.load.demand.Transfers`); when one lands follows its budget;
- each run's per-request replay outputs feed the load model (:mod:`kvtrace.analyses.load`)
  at ``[load] scale``; the timeline bins the measured requests by arrival.

Outputs (:class:`ScenarioResult`): ``table`` (one row per scenario, the baseline
``plain`` first: TTFT p50/p99/p99.9, goodput, SLO attainment, prefix-token hit rate,
bytes read per tier and their shares, flash and local-SSD write bytes, recompute
GPU-seconds and the extra over the baseline, the largest per-bin hit-rate drop below
the baseline, the time to recover to within the tolerance of it, p99 queue waits per
resource, blocks and bytes the events dropped), ``timeline`` (per scenario and bin)
and ``events``.
"""

from kvtrace.analyses.scenario.config import EVENT_KINDS, ScenarioFile, load_scenario, scenario_from_dict
from kvtrace.analyses.scenario.events import BASELINE, plan_events
from kvtrace.analyses.scenario.run import ScenarioResult, replay, run_scenarios

__all__ = ["BASELINE", "EVENT_KINDS", "ScenarioFile", "ScenarioResult", "load_scenario", "plan_events", "replay",
           "run_scenarios", "scenario_from_dict"]
