"""Under load (``kvtrace load``): time to first token as traffic grows, with the links,
flash and GPUs as queues, and which resource saturates first.

The model is an exact discrete-event simulation (:mod:`kvtrace.kernels.queueing`
states its event rules) on top of the tier simulator. Every choice:

- **Load.** Requests arrive at the trace's timestamps divided by the load factor k
  (``--load 0.5x,2x``; ``--rps R`` is k = R / the trace's measured rate): the same
  request sequence, so the cache's behaviour is the trace's own. The tier replay runs
  once per configuration, in the trace's own time (an ``idle<T`` policy and the
  residency figures keep trace seconds), and every load level runs over what it found
  (:class:`~kvtrace.analyses.load.demand.Demand`). The restore-or-recompute choice
  below changes only timing: the cache state follows the replay (a recomputed
  prefix lands in DRAM as a restored one would).
- **A request** (node from the configuration's routing): routing overhead (``route_s``,
  plus the response model's per-request overhead O with a flash tier); its DRAM
  prefix restored over the node's host-to-GPU link (fixed latency + bytes); its
  local-SSD and shared-flash prefix restored after it (fixed latency, then the host
  link, the local SSD, the block's flash target, the NIC and the uplink at once: a
  pipelined transfer ends when its slowest resource has served it, and never faster
  than the response model's per-request flash rate); the prefill of everything not
  restored (the usable prefix's misses and the prompt's new tokens: FLOPs / (peak x
  MFU), or tokens / a measured tokens/s) on the node's GPU pool; then a fixed first
  decode step. Bytes and reads are the tier simulator's (usable prefix, occupied
  size; one read per block).
- **Restore or recompute, with the queue state**: at arrival a request reads its
  tier prefix only if the restore predicted from the work the resources hold then
  ends no later than recomputing those tokens would take on the GPU (the response
  model's deadline, ``min(F, R)``, when nothing queues); otherwise the GPU recomputes
  them. The shares of both branches are reported.
- **Resources are queues**: per node a GPU pool (``gpus_per_node`` servers, FIFO,
  optional batching up to a token budget with a fixed time per pass), a host link, a
  NIC and a local SSD; one shared flash pool (aggregate bandwidth and reads/s, split
  over ``flash_targets`` targets; a block's target is a hash of its id); an optional
  rack uplink. Links are FCFS, or processor sharing. Background writes (what the
  replay admitted to flash, issued when the request has its first token) load the
  local SSD, or the pool (spread over its targets), the NIC and the uplink, paced by
  a write budget, and delay the reads queued behind them.
- **Overlap**: a fraction of the prefill may run while the restore is in flight
  (layer-wise load); the rest waits for the restore. Default none.
- **Zero-load limit**: with the default host link (the response model's DRAM
  bandwidth), resources no slower than the response model's flash rate, no routing
  or decode time and no overlap, a request's TTFT at load -> 0 is its what-if service
  time (:func:`kvtrace.analyses.response.request_times`) plus the prefill of the
  prompt's tokens after its reusable prefix.
- **Overload**: a queue wait past ``max_wait_s`` (or a resource that cannot serve: a
  zero rate, no GPU) stops the run: the level reports the resource, when its busy
  period began and the figures up to then (requests not finished miss the SLO).

Table (:attr:`LoadResult.table`, one row per configuration and level): ``config``,
``load_factor``, ``target_rps``, ``arrival_rate_rps`` (measured requests over the
measured span at that load), ``ttft_mean_ms`` .. ``ttft_p999_ms`` (exact, over the
requests that finished), ``goodput_rps`` (requests within ``slo_ttft_ms`` per second),
``slo_attainment``, ``util_<resource>`` for ``host_link``, ``nic``, ``local_ssd``,
``flash``, ``uplink``, ``gpu`` (busy share of the measured span; the busiest instance:
node or target; null when the configuration does not use it), ``wait_p99_<resource>_ms``
(p99 queue wait of request jobs, from a histogram: at most 1.1 % above the exact
value), ``bottleneck`` (the overloaded resource, else the most utilised),
``restore_share`` / ``recompute_share`` (of the requests with a tier prefix),
``tier_reading_request_share``, bytes read by tier, ``completed_requests``,
``overloaded``, ``overload_resource``, ``overload_from_s``, ``overload_at_s`` (seconds
after the first measured arrival), and the configuration's sizes, policy, usable-prefix
token hit rate and unloaded P99 service time.

Resources (:attr:`LoadResult.resources`): per configuration, level and station
(``resource``, ``instance``): ``util``, ``jobs``, ``job_rate_per_s``,
``mean_jobs_present`` (time average), ``mean_sojourn_ms``, ``mean_work_ms``
(Little's law: ``mean_jobs_present = job_rate_per_s x mean_sojourn`` up to the window's
edges: the sojourns of jobs that arrive in the window are counted to their end, the jobs
present only inside it, so near saturation, where sojourns are long against the window,
the two sides part).
"""

from __future__ import annotations

from kvtrace.analyses.load.demand import COLUMNS, Demand
from kvtrace.analyses.load.model import LINK_DISCIPLINES, LoadLevel, LoadModel, parse_levels
from kvtrace.analyses.load.run import (RESOURCES, SATURATED, LoadResult, headroom, load_curve, replay_demand,
                                       run_level, station_names, table_of)

__all__ = ["COLUMNS", "Demand", "LINK_DISCIPLINES", "LoadLevel", "LoadModel", "LoadResult", "RESOURCES",
           "SATURATED", "headroom", "load_curve", "parse_levels", "replay_demand", "run_level", "station_names",
           "table_of"]
