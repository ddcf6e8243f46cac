"""Future-reuse value of keeping KV blocks (``kvtrace value``; DESIGN §2, seed §9).

Seed §9: a cached block is worth *expected future reuses x the compute each reuse
avoids - write, read and occupancy costs*; one-shot long prompts can fill capacity and
never come back, while a medium prefix reused often can be worth more per byte.

Two per-access quantities, both clairvoyant (they read the future of the trace):

**Window value** (``FutureReuse.value_usd``): the value of storing the block right
after access ``t`` for the horizon ``H``. Its reuses are the later accesses of the block
whose gap ``ts[u] - ts[t]`` is at most ``H`` (ties count, see
:mod:`kvtrace.kernels.future`)::

    gain  = GPU $ of the prefill FLOPs of those reuses (a*k + b*q of each reuse's own
            tokens at its own position; with chained hashes this is reuses x the
            compute of the block at t)
    hold  = time from t to the last of those reuses; with no reuse, H if H is finite
            (a block nothing reuses is dropped when its time-to-live runs out) else 0
            (an infinite horizon only keeps a block as long as it is needed)
    value = gain - bytes x (write + read x reuses + occupancy x hold)

Every window value pays one write: it prices the decision "store the block now" on
its own. It is the score for a clairvoyant ``value >= v`` admission policy. Windows of
successive accesses overlap (a reuse lies in the window of every earlier access within
``H``), so window values must not be summed.

**Interval value** (``FutureReuse.interval_value_usd``): the decomposition of one
schedule, *keep every block for H after its latest access* (a time-to-live cache of
unbounded capacity; with ``H = inf``, keep each block until its last access), into
disjoint per-access parts that sum to the block's net value under that schedule::

    interval value of t = [next access within H] x (gain of the next access
                                                    - bytes x (read + occupancy x gap))
                        + [no next access within H] x (- bytes x occupancy x H')
                        + [t starts a stay in the store] x (- bytes x write)

where ``H' = H`` if finite else 0 and an access *starts a stay* when its previous
access is not within ``H`` (or it is the block's first). The per-block and per-prefix
``total_value_usd`` are sums of interval values.

**Clairvoyant bound** (``clairvoyant_value_usd``): the best net value any
keep/drop schedule can reach with unbounded capacity, when a block may only be kept
across gaps of at most ``H`` (so that bound and schedule see the same reuses): per
block, the best subset of its keepable intervals, each maximal run of kept intervals
paying one write (:func:`kvtrace.kernels.future.best_keep_value`). With free writes it
is the sum over keepable intervals of max(0, gain of the next access - bytes x (read +
occupancy x gap)); it is always >= max(0, total value). (A sum of positive *window*
values is no bound: it counts a reuse once for every earlier access whose window holds
it.)

Units: bytes = tokens a block occupies in a cache (its largest size in the trace) x
KV bytes per token; seconds from trace start; $ at the GPU's $/GPU-hour. Costs are
per byte (write, read) and per byte-second (occupancy); see :class:`StorageCosts`.
Not modelled: expiry or model-switch probability, compression, replicas.

**Prefix families below the shared root.** When (almost) every request starts with
the same blocks (a system prompt; on the Mooncake traces every request starts with
hash 0), grouping blocks by their request's position-0 block gives one family. So
families are rooted below the *shared root* (:func:`shared_root`): the longest run of
leading positions p = 0, 1, ... at each of which one block is the position-p block
of at least :data:`kvtrace.analyses.curves.SHARED_FIRST_BLOCK_SHARE` (99 %) of the non-empty
requests that have a position p (are longer than p blocks). Its depth k may be 0 (no
shared root: the families are those of position 0, as before). A block's family
root is the block at position k of the request in which the block first appears; the
*shared family*, labelled with the shared root's first block, holds the shared-root
blocks themselves, the blocks whose request (where they first appear) is no longer
than k blocks, and the blocks whose position-k block is itself a shared-root block
(only with repeated hashes). The summary names the skipped root
(``shared_root_hashes``, ``shared_root_blocks``, ``shared_root_request_share``).
With k = 1 at p = 0 the test is the one behind ``kvtrace curve``'s shared-first-block
note (:func:`kvtrace.analyses.curves.shared_first_block`).

Per-block table (``ValueResult.per_block``, one row per dense block id, ascending):

==========================  ========  ===================================================
block                       int64     dense block id
hash                        uint64    source hash of the block
root_block                  int64     its prefix family: the block at position k (the
                                      shared root's depth, 0 without one) of the
                                      request in which the block first appears; the
                                      shared root's first block for the shared family
first_seen_s                float64   arrival of its first access, seconds
last_seen_s                 float64   arrival of its last access, seconds
accesses                    int64     accesses in the trace
reused                      bool      accessed more than once (at any distance)
horizon_hits                int64     accesses whose previous access is within H (hits
                                      of the time-to-live schedule)
bytes                       int64     bytes the block occupies
gain_gpu_seconds            float64   GPU-seconds of prefill the schedule avoids
cost_usd                float64   write + read + occupancy cost of the schedule, $
total_value_usd         float64   sum of its interval values, $ (gain $ - cost)
value_usd_per_byte              float64   total_value_usd / bytes, $ per byte
clairvoyant_value_usd   float64   best keep/drop schedule value, $ (>= 0)
==========================  ========  ===================================================

Per-prefix table (``ValueResult.per_prefix``, one row per root block, sorted by
``total_value_usd`` descending, then ``root_block``): ``root_block`` int64 ·
``root_hash`` uint64 · ``blocks`` int64 (blocks of the family) · ``bytes`` int64 ·
``accesses`` int64 · ``never_reused_bytes`` int64 (bytes of its blocks accessed once) ·
``gain_gpu_seconds`` float64 · ``total_value_usd`` float64 ($) · ``value_usd_per_byte``
float64 ($/byte) · ``clairvoyant_value_usd`` float64 ($). With a shared root, the
shared family's row is the one whose ``root_hash`` is ``shared_root_hashes[0]``.

Summary (``ValueResult.summary``; units in the key names): see :func:`value_report`.

Code
----
- :mod:`~kvtrace.analyses.value.pricing`: storage costs, the horizon, the per-access
  value formulas (elementwise);
- :mod:`~kvtrace.analyses.value.access`: the per-access future reuse, a fold over the
  chunks of any trace source (next-access and windows passes);
- :mod:`~kvtrace.analyses.value.families`: the shared root and the prefix families;
- :mod:`~kvtrace.analyses.value.report`: the reduce pass and the tables.

One implementation for every source: an in-memory trace and a streamed one go
through the same passes over chunks of the same size, so their results are equal by
construction; the order of every float sum is stated once
(:mod:`kvtrace.analyses.value.report`).
"""

from kvtrace.analyses.value.access import (
    CHUNK_SHARE,
    FutureReuse,
    FutureReuseChunks,
    access_values,
    chunk_accesses,
    future_reuse,
    streamed_values,
)
from kvtrace.analyses.value.families import family_roots, shared_root
from kvtrace.analyses.value.pricing import (
    DEFAULT_COSTS,
    DEFAULT_HORIZON,
    DEFAULT_HORIZON_S,
    StorageCosts,
    parse_horizon,
)
from kvtrace.analyses.value.report import QUANTILES, ValueResult, weighted_quantiles, value_report

#: The former name of :class:`FutureReuseChunks` (a streamed trace's ``ValueResult.future``).
StreamedFutureReuse = FutureReuseChunks

__all__ = [
    "CHUNK_SHARE",
    "DEFAULT_COSTS",
    "DEFAULT_HORIZON",
    "DEFAULT_HORIZON_S",
    "FutureReuse",
    "FutureReuseChunks",
    "QUANTILES",
    "StorageCosts",
    "StreamedFutureReuse",
    "ValueResult",
    "access_values",
    "chunk_accesses",
    "family_roots",
    "future_reuse",
    "parse_horizon",
    "shared_root",
    "streamed_values",
    "value_report",
]
