"""One name and one unit per quantity, in every output (CLI tables, JSON, Parquet, SQL, app).

The scheme
----------
- ``snake_case``; the **unit is the last part** of the name: ``_bytes``, ``_tokens``,
  ``_blocks``, ``_s`` (seconds), ``_ms`` (milliseconds: service times and latencies
  only), ``_usd`` (US dollars computed by kvtrace), ``_flops``, ``_dwpd`` (drive writes
  per day); a rate over time appends ``_per_s``, ``_per_hour``, ``_per_day`` or
  ``_per_month``. Prices you give keep their configuration names (``dollars_per_*``).
- **Shares** in [0, 1] end in ``_rate`` when they are hit, miss or saved shares of
  requests, tokens, bytes, blocks or compute (``prefix_token_hit_rate``), in
  ``_share`` for any other fraction, in ``_ratio`` for a ratio of two like amounts.
  Tables and the app show shares as percentages.
- **What is counted** comes before ``hit_rate``: ``request`` (a request hits when its
  usable prefix is at least one block), ``request_half_prefix`` (its usable prefix
  covers at least half its prompt tokens), ``prefix_token`` / ``prefix_byte`` /
  ``prefix_block`` (usable-prefix hits, the headline family), ``token`` / ``byte`` /
  ``block`` (any-block hits); ``compute_saved_rate`` weights usable-prefix tokens by
  their prefill FLOPs.
- **A tier prefix** names the tier that served or holds it: ``dram_``, ``local_``
  (a node's local SSD), ``flash_`` (the shared flash pool), ``ssd_`` (local SSD and
  shared flash together: the flash level of a configuration). No prefix: the whole
  cache, all tiers together.
- **Under load** (``kvtrace load``): a resource's busy share of time is
  ``util_<resource>`` (``util_gpu``, ``util_host_link`` ...), request rates end in
  ``_rps``, the share of requests meeting the TTFT SLO is ``slo_attainment``, and a
  load level is its ``load_factor`` (arrival times divided by it).

:data:`TABLES` lists every column of every result table with its unit; the README's
"Metric names" section is generated from it (:func:`markdown`) and a test keeps the
two equal and checks that every output column is listed. :data:`ALIASES` maps the
names earlier releases wrote onto these (with the factor that converts the old unit):
:func:`canonical_table` applies them to a table read back from an older file, and
:func:`canonical_metric` to a metric named by a user.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import polars as pl

#: Unit words used in :data:`TABLES`.
UNITS = ("share", "utilisation", "requests/s", "1/s", "bytes", "bytes/token", "tokens", "blocks", "s", "ms", "USD",
         "USD/h", "USD/month", "USD/byte",
         "bytes/s",
         "bytes/day", "byte-s", "GPU-s", "GPU-s/h", "GPU-h/month", "FLOPs", "DWPD", "count", "ratio", "text", "bool", "id",
         "price")

#: The share of each kind of weight (the summary's ``unit``) under the scheme.
RATE_OF_UNIT = {"request": "request_hit_rate", "token": "prefix_token_hit_rate", "byte": "prefix_byte_hit_rate",
                "compute": "compute_saved_rate"}
MISS_OF_UNIT = {"request": "request_miss_rate", "token": "prefix_token_miss_rate", "byte": "prefix_byte_miss_rate",
                "compute": "compute_miss_rate"}


def tier_rate(tier: str, unit: str) -> str:
    """Name of the share of ``unit`` (request, token, byte, compute) served by ``tier``."""
    return f"{tier}_{RATE_OF_UNIT[unit]}"


#: Display label of each metric: the one header that CLI tables, chart legends and the
#: app print for it (with the value in the column's unit; shares as %).
LABELS = {
    "request_hit_rate": "requests",
    "request_half_prefix_hit_rate": "half-prefix requests",
    "prefix_token_hit_rate": "prefix tokens",
    "prefix_byte_hit_rate": "prefix bytes",
    "prefix_block_hit_rate": "prefix blocks",
    "block_hit_rate": "any-block blocks",
    "token_hit_rate": "any-block tokens",
    "byte_hit_rate": "any-block bytes",
    "compute_saved_rate": "compute saved",
    "gpu_seconds_saved_per_hour": "GPU-s saved /h",
    "usd_saved_per_hour": "$ saved /h",
    "read_mean_bytes_per_s": "read mean",
    "engine_prefix_token_hit_rate": "engine's own rate",
    "dram_prefix_token_hit_rate": "DRAM",
    "ssd_prefix_token_hit_rate": "SSD/flash",
    "prefix_token_miss_rate": "miss",
    "service_time_mean_ms": "mean",
    "service_time_p50_ms": "p50",
    "service_time_p90_ms": "p90",
    "service_time_p99_ms": "P99",
    "service_time_p999_ms": "P99.9",
    "cost_usd_per_month": "$/month",
    "net_usd_per_month": "net/month",
}


def label(name: str) -> str:
    """The display label of metric ``name`` (the name itself when it has none)."""
    return LABELS.get(name, name)


_RATE_COLUMNS = {
    "request_hit_rate": ("share", "share of measured requests whose usable prefix is >= 1 block"),
    "request_half_prefix_hit_rate": ("share", "share of measured requests whose usable prefix covers >= half "
                                              "their prompt tokens"),
    "prefix_token_hit_rate": ("share", "usable-prefix tokens / prompt tokens (the headline)"),
    "prefix_byte_hit_rate": ("share", "usable-prefix block bytes / block bytes accessed"),
    "prefix_block_hit_rate": ("share", "usable-prefix blocks / block accesses"),
    "block_hit_rate": ("share", "any-block hits / block accesses"),
    "token_hit_rate": ("share", "tokens of any-block hits / prompt tokens"),
    "byte_hit_rate": ("share", "block bytes of any-block hits / block bytes accessed"),
    "compute_saved_rate": ("share", "prefill FLOPs of usable-prefix tokens / all prefill FLOPs"),
}

_CURVE = {
    "capacity_bytes": ("bytes", "cache capacity"),
    "capacity_tokens": ("tokens", "capacity in tokens of KV cache (capacity_bytes // kv_bytes_per_token)"),
    "capacity_blocks": ("blocks", "capacity in full blocks (capacity_tokens / block_tokens)"),
    **_RATE_COLUMNS,
    "gpu_seconds_saved_per_hour": ("GPU-s/h", "GPU-seconds of prefill avoided per hour of trace"),
    "usd_saved_per_hour": ("USD/h", "the same in $ per hour of trace"),
    "read_mean_bytes_per_s": ("bytes/s", "mean bytes/s read from the cache to serve the hits"),
}

_TIERS = {"dram": "DRAM", "local": "the local SSDs", "flash": "the shared flash pool"}
_UNIT_WORDS = {"request": "requests (first block's tier)", "token": "usable-prefix tokens / prompt tokens",
               "byte": "usable-prefix block bytes / block bytes", "compute": "usable-prefix prefill FLOPs / all"}


def _tier_shares() -> dict:
    out = {}
    for unit, words in _UNIT_WORDS.items():
        for t, where in _TIERS.items():
            out[tier_rate(t, unit)] = ("share", f"{words}, served from {where}")
        out[RATE_OF_UNIT[unit]] = ("share", f"{words}, all tiers")
        out[MISS_OF_UNIT[unit]] = ("share", f"{words}, missed (recomputed); the shares of a unit sum to 1")
    for t, where in _TIERS.items():
        out[f"{t}_block_hit_rate"] = ("share", f"any-block decisions served from {where} / block accesses")
    out["block_miss_rate"] = ("share", "any-block misses / block accesses")
    return out


_SERVICE = {f"service_time_{k}_ms": ("ms", f"reusable-prefix service time per request, {w}")
            for k, w in (("mean", "mean"), ("p50", "median"), ("p90", "90th percentile"),
                         ("p99", "99th percentile"), ("p999", "99.9th percentile"))}

_WHATIF = {
    "config": ("text", "label of the configuration"),
    "dram_bytes": ("bytes", "DRAM per node"),
    "local_ssd_bytes": ("bytes", "local SSD per node"),
    "flash_bytes": ("bytes", "shared flash pool"),
    "nodes": ("count", "nodes sharing the flash pool"),
    "routing": ("text", "session, round-robin or prefix"),
    "policy": ("text", "flash admission policy"),
    "flash_order": ("text", "lru or fifo"),
    "promotion": ("text", "promote, copy or none"),
    "write_mode": ("text", "write-on-evict or write-through"),
    "inclusive": ("bool", "tiers may hold copies of one block"),
    "eviction": ("text", "LRU model: prefix-aware or flat"),
    "cache_rules": ("text", "engine reuse rules applied to the tiers: ideal, vllm or sglang"),
    "model": ("text", "model preset"),
    "kv_bytes_per_token": ("bytes/token", "KV-cache bytes per token"),
    **_tier_shares(),
    "ssd_reading_request_share": ("share", "requests reading the local SSD or shared flash"),
    **{k: v for t in ("flash", "local") for k, v in {
        f"{t}_write_bytes": ("bytes", f"host writes into {_TIERS[t]}"),
        f"{t}_write_bytes_per_day": ("bytes/day", "the same per day of the measured span"),
        f"{t}_dwpd": ("DWPD", f"drive writes per day of {_TIERS[t]} (all nodes' SSDs for local)"),
        f"{t}_write_opportunities": ("count", f"blocks offered to {_TIERS[t]} (admitted or not)"),
        f"{t}_admitted_share": ("share", "writes / opportunities"),
    }.items()},
    **{f"{t}_eviction_bytes": ("bytes", f"bytes evicted from {w}") for t, w in _TIERS.items()},
    **{k: v for t, w in _TIERS.items() for k, v in {
        f"{t}_read_bytes": ("bytes", f"usable-prefix bytes served by {w}"),
        f"{t}_read_mean_bytes_per_s": ("bytes/s", f"mean read bandwidth of {w}"),
        **({f"{t}_read_peak_bytes_per_s": ("bytes/s", f"peak read bandwidth of {w} over windows of window_s")}
           if t != "dram" else {}),
    }.items()},
    "promotions": ("count", "flash hits moved or copied into DRAM"),
    "promotion_bytes": ("bytes", "bytes of those promotions"),
    "value_captured_usd": ("USD", "future-reuse value of the writes made (value>=v; null without values)"),
    "value_bound_usd": ("USD", "positive value over every write opportunity (a perfect value filter)"),
    "value_capture_ratio": ("ratio", "value_captured_usd / value_bound_usd"),
    "gpu_seconds_saved_per_hour": ("GPU-s/h", "GPU-seconds of prefill avoided per hour, all tiers"),
    "ssd_gpu_seconds_saved_per_hour": ("GPU-s/h", "the part served by the local SSD and shared flash"),
    "usd_saved_per_hour": ("USD/h", "GPU $ of prefill avoided per hour, all tiers"),
    **_SERVICE,
    "measured_requests": ("count", "requests after the warm-up"),
    "measured_accesses": ("count", "block accesses after the warm-up"),
    "measured_duration_s": ("s", "seconds from the first measured arrival to the last"),
}

_SIZE = {
    "candidate": ("text", "keep-dram, expand-dram, add-local-ssd, add-shared-flash, dram+flash or recompute-only"),
    "lens": ("text", "same-slo, same-capacity or same-budget"),
    "rank": ("count", "1 = best in its lens: feasible rows first (net benefit, then cost), then the rest by "
                      "shortfall"),
    "config": ("text", "label of the tier configuration (null: not applicable)"),
    "policy": ("text", "flash admission policy chosen (null without flash)"),
    "nodes": ("count", "nodes of the deployment"),
    "dram_bytes": ("bytes", "DRAM per node"),
    "local_ssd_bytes": ("bytes", "local SSD per node"),
    "flash_bytes": ("bytes", "shared flash pool"),
    "total_bytes": ("bytes", "all tiers, all nodes"),
    "dram_prefix_token_hit_rate": ("share", "usable-prefix tokens / prompt tokens served from DRAM"),
    "ssd_prefix_token_hit_rate": ("share", "the same served from the local SSD or shared flash"),
    "prefix_token_miss_rate": ("share", "the same missed; the three sum to 1"),
    "dram_request_hit_rate": ("share", "requests whose first block is served from DRAM"),
    "ssd_request_hit_rate": ("share", "requests whose first block is served from the local SSD or flash"),
    "service_time_mean_ms": _SERVICE["service_time_mean_ms"],
    "service_time_p50_ms": _SERVICE["service_time_p50_ms"],
    "service_time_p99_ms": _SERVICE["service_time_p99_ms"],
    "gpu_seconds_saved_per_hour": ("GPU-s/h", "GPU-seconds of prefill avoided per hour (the search table)"),
    "cost_usd_per_month": ("USD/month", "monthly cost of the whole configuration (DESIGN §5)"),
    "incremental_cost_usd_per_month": ("USD/month", "cost vs keep-dram"),
    "gpu_hours_saved_per_month": ("GPU-h/month", "GPU-hours of prefill avoided per month vs keep-dram "
                                                 "(negative: needs more)"),
    "value_usd_per_month": ("USD/month", "gpu_hours_saved_per_month x $/GPU-hour"),
    "realised_value_usd_per_month": ("USD/month", "value x realisation ratio (in full when negative)"),
    "net_usd_per_month": ("USD/month", "realised value - incremental cost"),
    "break_even_realisation": ("ratio", "incremental cost / value (0: costs nothing more; null: frees nothing "
                                        "or baseline)"),
    "break_even_restore_ms": ("ms", "flash pays off on average while a restore takes less than this "
                                    "(R - O / h_F of the flash-reading requests)"),
    "restore_mean_ms": ("ms", "mean restore time of the flash-reading requests"),
    "ssd_read_mean_bytes_per_s": ("bytes/s", "local SSD or shared flash reads, mean"),
    "ssd_read_peak_bytes_per_s": ("bytes/s", "the same, peak window"),
    "ssd_bandwidth_bytes_per_s": ("bytes/s", "what the local SSD or shared flash delivers"),
    "dram_read_mean_bytes_per_s": ("bytes/s", "DRAM reads, mean"),
    "dram_bandwidth_bytes_per_s": ("bytes/s", "what DRAM delivers"),
    "bandwidth_headroom": ("ratio", "min over tiers of deliverable / need (peak window for flash)"),
    "ssd_dwpd": ("DWPD", "drive writes per day of the local SSD or shared flash (simulated)"),
    "endurance_dwpd": ("DWPD", "the tier's rating, from tiers.toml"),
    "dwpd_headroom": ("ratio", "endurance_dwpd / ssd_dwpd"),
    "meets_slo": ("bool", "mean and P99 within the SLO targets"),
    "within_limits": ("bool", "within the bandwidth and endurance limits (the search table)"),
    "feasible": ("bool", "meets the SLO, bandwidth and endurance (all hard constraints)"),
    "shortfall": ("share", "largest excess of a failed constraint over its limit, as a share of the limit "
                           "(0 when feasible)"),
    "shortfalls": ("text", "each failed constraint with its excess, e.g. \"P99 +146.0 %\""),
    "reasons": ("text", "why not feasible or not applicable, and notes (\"; \"-separated)"),
    "estimated_service_time_mean_ms": ("ms", "the search's estimate of the mean (admit-all)"),
    "estimated_service_time_p99_ms": ("ms", "the search's estimate of P99 (admit-all)"),
    "loaded_ttft_mean_ms": ("ms", "mean TTFT with queues at the replayed load (with [slo] ttft targets)"),
    "loaded_ttft_p99_ms": ("ms", "P99 TTFT with queues at the replayed load"),
    "loaded_bottleneck": ("text", "the resource most utilised (or overloaded) at that load"),
    "load_headroom_factor": ("ratio", "highest multiple of the replayed load still meeting the TTFT targets (2 %)"),
    "headroom_bottleneck": ("text", "the resource that saturates first at that multiple"),
    "before_config": ("text", "the recommendation's figures: today's configuration (keep-dram)"),
    "before_service_time_mean_ms": ("ms", "the recommendation's figures: today's mean service time"),
    "before_service_time_p99_ms": ("ms", "the recommendation's figures: today's P99 service time"),
    "knee_95_bytes": ("bytes", "the recommendation's figures: capacity reaching 95 % of the reuse ceiling"),
}

_VALUE_BLOCKS = {
    "block": ("id", "dense block id"),
    "hash": ("id", "source hash of the block"),
    "root_block": ("id", "its prefix family (the block below the shared root in its first request)"),
    "first_seen_s": ("s", "arrival of its first access"),
    "last_seen_s": ("s", "arrival of its last access"),
    "accesses": ("count", "accesses in the trace"),
    "reused": ("bool", "accessed more than once"),
    "horizon_hits": ("count", "accesses whose previous access is within the horizon"),
    "bytes": ("bytes", "bytes the block occupies"),
    "gain_gpu_seconds": ("GPU-s", "prefill a keep-for-the-horizon store avoids"),
    "cost_usd": ("USD", "write + read + occupancy cost of that store"),
    "total_value_usd": ("USD", "net value of that store"),
    "value_usd_per_byte": ("USD/byte", "total_value_usd / bytes"),
    "clairvoyant_value_usd": ("USD", "best keep/drop schedule value (>= 0)"),
}

_VALUE_PREFIXES = {
    "root_block": ("id", "the family's root block"),
    "root_hash": ("id", "source hash of the root block"),
    "tenant": ("text", "tenant of the root block (null: none)"),
    "blocks": ("count", "distinct blocks of the family"),
    "bytes": ("bytes", "bytes of those blocks"),
    "accesses": ("count", "accesses of those blocks"),
    "never_reused_bytes": ("bytes", "bytes of its blocks accessed once"),
    "gain_gpu_seconds": _VALUE_BLOCKS["gain_gpu_seconds"],
    "total_value_usd": _VALUE_BLOCKS["total_value_usd"],
    "value_usd_per_byte": _VALUE_BLOCKS["value_usd_per_byte"],
    "clairvoyant_value_usd": _VALUE_BLOCKS["clairvoyant_value_usd"],
}

_VALUE_ACCESSES = {
    "t": ("id", "access index in trace order"),
    "block": ("id", "dense block id"),
    "timestamp": ("s", "arrival of the request, seconds from the start of the trace"),
    "next_t": ("id", "next access of the same block (null: none)"),
    "next_gap_s": ("s", "time to that access (inf: none)"),
    "reuses": ("count", "later accesses within the horizon"),
    "last_reuse_t": ("id", "the last of those (null: none)"),
    "hold_s": ("s", "how long the window's store holds the block"),
    "reuse_tokens": ("tokens", "tokens of those reuses"),
    "bytes": ("bytes", "bytes the block occupies"),
    "gain_gpu_seconds": ("GPU-s", "prefill the window's reuses avoid"),
    "gain_usd": ("USD", "the same in GPU $"),
    "cost_usd": ("USD", "write + read + occupancy cost of the window's store"),
    "value_usd": ("USD", "window value: gain - cost (windows overlap: do not sum)"),
    "interval_gain_gpu_seconds": ("GPU-s", "this access's part of the block's keep-for-the-horizon gain"),
    "interval_value_usd": ("USD", "this access's part of its value (sums to the block's total_value_usd)"),
    "starts_stay": ("bool", "the access starts a stay in the store (pays a write)"),
}

_DISTANCES = {
    "t": ("id", "access index in trace order"),
    "request": ("id", "request index in trace order"),
    "pos": ("count", "block index inside the request"),
    "block": ("id", "dense block id"),
    "tokens": ("tokens", "tokens of the block in this request"),
    "timestamp": ("s", "arrival of the request, seconds from the start of the trace"),
    "reuse_distance_tokens": ("tokens", "byte-LRU stack distance (inf: cold)"),
    "usable_distance_tokens": ("tokens", "usable-prefix distance: running max along the request"),
    "reuse_distance_bytes": ("bytes", "reuse distance in bytes"),
    "usable_distance_bytes": ("bytes", "usable-prefix distance in bytes"),
    "reuse_distance_blocks": ("blocks", "distinct blocks touched since the previous access, this one included"),
    "reuse_time_s": ("s", "time since the block's previous touch (inf: first access)"),
}

_VALUE_SUMMARY = {
    "model": ("text", "model preset"),
    "kv_bytes_per_token": ("bytes/token", "KV-cache bytes per token"),
    "gpu": ("text", "GPU preset that prices compute"),
    "gpu_dollars_per_hour": ("price", "$ per GPU-hour, as given"),
    "horizon_s": ("s", "horizon of the future-reuse value (inf: unbounded)"),
    "write_dollars_per_byte": ("price", "cost of writing a byte, $"),
    "read_dollars_per_byte": ("price", "cost of reading a byte back, $"),
    "occupancy_dollars_per_byte_second": ("price", "cost of storing a byte for a second, $"),
    "write_dollars_per_tb": ("price", "the write price as given, $ per TB"),
    "read_dollars_per_tb": ("price", "the read price as given, $ per TB"),
    "occupancy_dollars_per_tb_month": ("price", "the occupancy price as given, $ per TB-month"),
    "accesses": ("count", "block accesses"),
    "blocks": ("count", "distinct blocks"),
    "prefixes": ("count", "prefix families"),
    "shared_root_blocks": ("count", "depth of the shared root the families are grouped below (0: none)"),
    "shared_root_hashes": ("id", "source hashes of the shared root's blocks, position 0 first"),
    "shared_root_request_share": ("share", "requests whose first blocks are the shared root"),
    "distinct_bytes": ("bytes", "bytes of all distinct blocks"),
    "never_reused_blocks": ("count", "blocks accessed once"),
    "never_reused_bytes": ("bytes", "bytes of those blocks"),
    "never_reused_bytes_share": ("share", "their share of the distinct bytes (one-shot prompts)"),
    "never_reused_access_share": ("share", "accesses that touch such blocks"),
    "no_reuse_in_horizon_access_share": ("share", "accesses with no reuse within the horizon"),
    "gain_gpu_seconds": ("GPU-s", "prefill the time-to-live schedule avoids"),
    "gain_usd": ("USD", "the same in GPU $"),
    "write_cost_usd": ("USD", "its write cost"),
    "read_cost_usd": ("USD", "its read cost"),
    "occupancy_cost_usd": ("USD", "its occupancy cost"),
    "total_value_usd": ("USD", "gain - the three costs"),
    "clairvoyant_bound_usd": ("USD", "sum of the per-block best keep/drop schedules"),
    "negative_value_bytes_share": ("share", "distinct bytes in blocks of negative total value"),
    "positive_window_value_access_share": ("share", "accesses with a window value > 0"),
    "value_usd_per_byte_quantiles": ("USD/byte", "p10..p99 of the blocks' value_usd_per_byte, weighted by bytes"),
}

_KNEES = {
    "metric": ("text", "curve column"),
    "fraction": ("share", "share of the ceiling"),
    "target_rate": ("share", "fraction x the ceiling rate"),
    "capacity_bytes": ("bytes", "smallest capacity reaching it"),
    "capacity_tokens": ("tokens", "the same in tokens"),
}

_RESIDENCY = {
    "tier": ("text", "dram, local or flash"),
    "metric": ("text", "lifetime_s (insert to exit), idle_before_eviction_s (last touch to eviction) or "
                       "reuse_gap_s (last touch to a hit in the tier)"),
    "bin_lo_s": ("s", "lower edge of the octave bin"),
    "bin_hi_s": ("s", "upper edge (inf: the last, open bin)"),
    "count": ("count", "blocks in the bin"),
}

_TTFT = {f"ttft_{k}_ms": ("ms", f"time to first token of the requests that finished, {w}")
         for k, w in (("mean", "mean"), ("p50", "p50"), ("p90", "p90"), ("p99", "P99"), ("p999", "P99.9"))}

_LOAD = {
    "config": ("text", "configuration label"),
    "load_factor": ("ratio", "arrival times divided by this (2 = twice the trace's rate)"),
    "target_rps": ("requests/s", "the rate asked for with --rps (null with --load)"),
    "arrival_rate_rps": ("requests/s", "measured requests over the measured span at this load"),
    **_TTFT,
    "goodput_rps": ("requests/s", "requests that met the TTFT SLO, per second of the measured span"),
    "slo_ttft_ms": ("ms", "the TTFT SLO (--slo-ttft)"),
    "slo_attainment": ("share", "measured requests that met the SLO (unfinished ones did not)"),
    **{f"util_{r}": ("utilisation", f"busy share of the busiest {w} over the measured span (null: not used)")
       for r, w in (("host_link", "host-to-GPU link"), ("nic", "NIC"), ("local_ssd", "local SSD"),
                    ("flash", "flash target"), ("uplink", "rack uplink"), ("gpu", "node's GPU pool"))},
    **{f"wait_p99_{r}_ms": ("ms", f"P99 queue wait of request jobs at the {w} (histogram: <= 1.1 % above "
                                  "the exact value)")
       for r, w in (("host_link", "host links"), ("nic", "NICs"), ("local_ssd", "local SSDs"),
                    ("flash", "flash targets"), ("uplink", "uplink"), ("gpu", "GPUs"))},
    "bottleneck": ("text", "the overloaded resource, else the most utilised"),
    "restore_share": ("share", "requests with a local-SSD/flash prefix that restored it"),
    "recompute_share": ("share", "requests with a local-SSD/flash prefix that recomputed it (deadline rule)"),
    "tier_reading_request_share": ("share", "measured requests with a local-SSD/flash prefix"),
    "dram_read_bytes": ("bytes", "usable-prefix bytes restored from DRAM"),
    "local_read_bytes": ("bytes", "usable-prefix bytes restored from local SSDs"),
    "flash_read_bytes": ("bytes", "usable-prefix bytes restored from the shared flash"),
    "completed_requests": ("count", "measured requests that got their first token"),
    "measured_requests": ("count", "requests after the warm-up"),
    "overloaded": ("bool", "a queue wait passed --max-wait (or a resource cannot serve): the run stopped"),
    "overload_resource": ("text", "the resource that overloaded"),
    "overload_from_s": ("s", "start of its busy period, after the first measured arrival"),
    "overload_at_s": ("s", "when the run stopped, after the first measured arrival"),
    "dram_bytes": ("bytes", "DRAM per node"),
    "local_ssd_bytes": ("bytes", "local SSD per node"),
    "flash_bytes": ("bytes", "shared flash pool"),
    "nodes": ("count", "nodes"),
    "policy": ("text", "flash admission policy"),
    "prefix_token_hit_rate": ("share", "usable-prefix token hit rate of the replay (all tiers)"),
    "service_time_p99_ms": ("ms", "unloaded reusable-prefix service time, P99 (kvtrace whatif)"),
}

_LOAD_RESOURCES = {
    "config": ("text", "configuration label"),
    "load_factor": ("ratio", "the level"),
    "resource": ("text", "host_link, nic, local_ssd, flash, uplink or gpu"),
    "instance": ("id", "node (target for flash)"),
    "util": ("utilisation", "busy share over the measured span (a GPU pool: per GPU)"),
    "jobs": ("count", "jobs that arrived in the measured span"),
    "job_rate_per_s": ("1/s", "their arrival rate"),
    "mean_jobs_present": ("count", "time-average jobs queued or in service"),
    "mean_sojourn_ms": ("ms", "mean time from arrival to departure"),
    "mean_work_ms": ("ms", "mean service work"),
}

_SCENARIO = {
    "scenario": ("text", "scenario name (`plain`: the baseline without events)"),
    "events": ("text", "its events, as the scenario file states them"),
    "ttft_p50_ms": _TTFT["ttft_p50_ms"], "ttft_p99_ms": _TTFT["ttft_p99_ms"], "ttft_p999_ms": _TTFT["ttft_p999_ms"],
    "goodput_rps": _LOAD["goodput_rps"], "slo_attainment": _LOAD["slo_attainment"],
    "restore_share": _LOAD["restore_share"], "recompute_share": _LOAD["recompute_share"],
    "prefix_token_hit_rate": ("share", "usable-prefix tokens / prompt tokens of the measured requests"),
    "dram_read_bytes": _LOAD["dram_read_bytes"], "local_read_bytes": _LOAD["local_read_bytes"],
    "flash_read_bytes": _LOAD["flash_read_bytes"],
    **{f"{t}_read_share": ("share", f"share of the restored usable-prefix bytes read from {w}")
       for t, w in (("dram", "DRAM"), ("local", "local SSDs"), ("flash", "the shared flash"))},
    "flash_write_bytes": ("bytes", "bytes written to the shared flash by the measured requests' touches"),
    "local_write_bytes": ("bytes", "bytes written to local SSDs by the measured requests' touches"),
    "flash_write_amplification_ratio": ("ratio", "flash_write_bytes / the KV bytes the measured requests' prefill "
                                           "computed (1: each computed byte written to the flash once; more: "
                                           "blocks rewritten after a promotion or a loss)"),
    "recompute_gpu_seconds": ("GPU-s", "prefill GPU-seconds of reusable tokens recomputed (cached before, "
                                       "missing now)"),
    "prefill_gpu_seconds": ("GPU-s", "prefill GPU-seconds of every token no tier served (new and recomputed)"),
    "extra_prefill_gpu_seconds": ("GPU-s", "prefill_gpu_seconds minus the baseline's (the prefill storm)"),
    "hit_rate_shortfall": ("share", "largest per-bin prefix_token_hit_rate below the baseline's, from the first "
                                    "event's bin on"),
    "recovered_after_s": ("s", "from the first event to the first bin after which the per-bin hit rate stays "
                               "within the tolerance of the baseline's (null: not within the trace)"),
    "recovered": ("bool", "whether it did within the trace (null without a baseline: [run] baseline = false)"),
    **{f"wait_p99_{r}_ms": _LOAD[f"wait_p99_{r}_ms"] for r in ("host_link", "nic", "local_ssd", "flash", "uplink",
                                                              "gpu")},
    "overloaded": _LOAD["overloaded"],
    "prefetch_requests": ("count", "prefetches replayed (prestage): one per paused turn with blocks to touch"),
    "prefetch_bytes": ("bytes", "bytes the prefetches moved from a flash tier into DRAM"),
    "prefetch_useful_share": ("share", "of those, the bytes whose next access read them from DRAM"),
    "prefetch_extra_bytes": ("bytes", "bytes moved and never read from DRAM (evicted first, or not accessed)"),
    "prefetch_coverage_share": ("share", "prestaged turns' usable-prefix bytes not in DRAM when the prefetch was "
                                         "issued that were read from DRAM thanks to a prefetch"),
    "prefetch_dram_byte_seconds": ("byte-s", "DRAM held by useful prefetched blocks from landing to their read"),
    "prefetch_displaced_bytes": ("bytes", "DRAM bytes the prefetches evicted"),
    "prewarm_bytes": ("bytes", "bytes the prewarms moved from a tier below into DRAM (measured window)"),
    "prewarm_useful_share": ("share", "of those, the bytes whose next access read them from DRAM"),
    "prewarm_displaced_bytes": ("bytes", "DRAM bytes the prewarms evicted"),
    "background_read_bytes": ("bytes", "bytes the prefetches and prewarms read from the local SSDs and the shared "
                                       "flash (queued on the load model's links with the requests' reads)"),
    "ttft_p99_recovery_ms": ("ms", "p99 TTFT of the measured requests from the first event until recovered (to the "
                                   "trace's end if not; null if unfinished requests reach the p99)"),
    "lost_to_capacity_bytes": ("bytes", "bytes of blocks seen before that the measured requests missed and no event "
                                        "had dropped: evicted for room (or never admitted)"),
    "lost_to_events_bytes": ("bytes", "bytes of blocks seen before that the measured requests missed because an "
                                      "event dropped them from every tier (or a catalog outage held them)"),
    "dropped_blocks": ("blocks", "blocks the events deleted from the tiers (a block once per tier)"),
    "dropped_bytes": ("bytes", "their bytes"),
}

_SCENARIO_TIMELINE = {
    "scenario": _SCENARIO["scenario"],
    "bin_start_s": ("s", "start of the bin, after the trace's first request"),
    "requests": ("count", "measured requests arriving in the bin"),
    "prefix_token_hit_rate": _SCENARIO["prefix_token_hit_rate"],
    "dram_read_bytes": _LOAD["dram_read_bytes"], "local_read_bytes": _LOAD["local_read_bytes"],
    "flash_read_bytes": _LOAD["flash_read_bytes"],
    **{f"{t}_read_share": _SCENARIO[f"{t}_read_share"] for t in ("dram", "local", "flash")},
    "flash_write_bytes": _SCENARIO["flash_write_bytes"], "local_write_bytes": _SCENARIO["local_write_bytes"],
    "background_read_bytes": ("bytes", "bytes the prefetches and prewarms starting in the bin read from the tiers "
                                       "below DRAM"),
    "recompute_gpu_seconds": _SCENARIO["recompute_gpu_seconds"],
    "prefill_gpu_seconds": _SCENARIO["prefill_gpu_seconds"],
    "util_flash_offered": ("utilisation", "flash bytes read (by requests and by background moves) and written in "
                                          "the bin / what the pool moves in a bin"),
    "util_gpu_offered": ("utilisation", "prefill GPU-seconds arriving in the bin / GPU-seconds of every node's "
                                        "GPUs in a bin"),
    "ttft_p50_ms": _TTFT["ttft_p50_ms"], "ttft_p99_ms": _TTFT["ttft_p99_ms"],
    "slo_attainment": ("share", "requests arriving in the bin that met the SLO"),
}

_SCENARIO_EVENTS = {
    "scenario": _SCENARIO["scenario"],
    "event": ("id", "the event's index in its scenario"),
    "kind": ("text", "cold-start, restored, migration, target-loss, catalog-outage, rollout, ttl, prestage, "
                     "congestion or prewarm"),
    "text": ("text", "the event in words"),
    "at_s": ("s", "its time, after the trace's first request"),
    "first_request": ("id", "the first request at or after it (null: after the last)"),
    "actions": ("count", "state edits it made (sweeps and steps count one each)"),
    "dropped_blocks": _SCENARIO["dropped_blocks"],
    "dropped_bytes": _SCENARIO["dropped_bytes"],
    "lost_bytes": ("bytes", "of lost_to_events_bytes, those this event caused (a TTL's: hits lost to expiry)"),
}

#: Every result table: (where it is written, {column: (unit, meaning)}).
TABLES: dict[str, tuple[str, dict[str, tuple[str, str]]]] = {
    "curve": ("`kvtrace curve --out` and `--json` rows, SQL `curve` and `curve_by_group`, the Curves page", {
        "group_by": ("text", "grouping (--by): type, tenant, turn or session-length"),
        "group_name": ("text", "group (--by; `all` = the whole trace)"),
        **_CURVE,
        "prefix_token_hit_rate_se": ("share", "estimated standard error of prefix_token_hit_rate (--sample-rate)"),
        "rejected_request_share": ("share", "share of measured requests the engine rejects as larger than its pool "
                                            "(--cache-rules vllm, sglang)"),
        "engine_prefix_token_hit_rate": ("share", "the engine's own prefix-cache hit rate: prefix tokens hit over the "
                                                  "prompt tokens of the requests it admitted (vLLM's num_cached_tokens"
                                                  " sum; --cache-rules vllm, sglang)"),
        "wait_mean_s": ("s", "mean time a measured request waited for blocks before admission (--in-flight)"),
        "wait_p99_s": ("s", "p99 of that wait (--in-flight)"),
        "pool_full_share": ("share", "share of the replayed span during which a request waited for blocks "
                                     "(--in-flight)"),
    }),
    "knees": ("`kvtrace curve --json` and `size --json` knees, SQL `knees`", _KNEES),
    "distances": ("`kvtrace curve --distances-out`, SQL `accesses`", _DISTANCES),
    "whatif": ("`kvtrace whatif --out` and `--json`, SQL `whatif` (`export --whatif`), the What-ifs page", _WHATIF),
    "residency": ("`kvtrace whatif --json` residency", _RESIDENCY),
    "load": ("`kvtrace load --out` and `--json` levels", _LOAD),
    "load_resources": ("`kvtrace load --resources-out` and `--json` resources", _LOAD_RESOURCES),
    "size": ("`kvtrace size --out` and `--json` candidates, the Sizing page", _SIZE),
    "scenario": ("`kvtrace scenario --out` and `--json` scenarios", _SCENARIO),
    "scenario_timeline": ("`kvtrace scenario --timeline-out` and `--json` timeline", _SCENARIO_TIMELINE),
    "scenario_events": ("`kvtrace scenario --json` events", _SCENARIO_EVENTS),
    "value_blocks": ("`kvtrace value --out`, SQL `blocks`", _VALUE_BLOCKS),
    "value_prefixes": ("`kvtrace value --prefixes-out`, SQL view `prefixes`", _VALUE_PREFIXES),
    "value_accesses": ("`kvtrace value --accesses-out`, SQL `accesses`", _VALUE_ACCESSES),
    "value_summary": ("`kvtrace value --json` summary", _VALUE_SUMMARY),
}

#: The metric columns of the curve (for the export's schema and the app).
CURVE_COLUMNS = _CURVE


class Alias(NamedTuple):
    """An earlier name: the current ``name`` and the factor from the old unit to its unit."""

    name: str
    scale: float = 1.0


def _whatif_aliases() -> dict[str, Alias]:
    out = {}
    for unit in RATE_OF_UNIT:
        for t in _TIERS:
            out[f"h_{t}_{unit}"] = Alias(tier_rate(t, unit))
        out[f"hit_rate_{unit}"] = Alias(RATE_OF_UNIT[unit])
        out[f"miss_{unit}"] = Alias(MISS_OF_UNIT[unit])
    for t in _TIERS:
        out[f"block_share_{t}"] = Alias(f"{t}_block_hit_rate")
        out[f"{t}_read_bytes_per_s_mean"] = Alias(f"{t}_read_mean_bytes_per_s")
        if t != "dram":
            out[f"{t}_read_bytes_per_s_peak"] = Alias(f"{t}_read_peak_bytes_per_s")
    out["block_share_miss"] = Alias("block_miss_rate")
    for k in ("mean", "p50", "p90", "p99", "p999"):
        out[f"service_time_{k}_s"] = Alias(f"service_time_{k}_ms", 1e3)
    return out


#: Names of earlier releases -> current names. Shared by every table: an old name
#: means one quantity wherever it appeared.
ALIASES: dict[str, Alias] = {
    **_whatif_aliases(),
    "flash_request_share": Alias("ssd_reading_request_share"),
    "gpu_seconds_saved_per_hour_flash": Alias("ssd_gpu_seconds_saved_per_hour"),
    "value_captured_dollars": Alias("value_captured_usd"),
    "value_bound_dollars": Alias("value_bound_usd"),
    "dollars_saved_per_hour": Alias("usd_saved_per_hour"),
    "read_bandwidth_bytes_per_s": Alias("read_mean_bytes_per_s"),
    "gain_dollars": Alias("gain_usd"),
    "cost_dollars": Alias("cost_usd"),
    "value_dollars": Alias("value_usd"),
    "interval_value_dollars": Alias("interval_value_usd"),
    "total_value_dollars": Alias("total_value_usd"),
    "clairvoyant_value_dollars": Alias("clairvoyant_value_usd"),
    "value_per_byte": Alias("value_usd_per_byte"),
    "value_per_byte_quantiles": Alias("value_usd_per_byte_quantiles"),
    "write_cost_dollars": Alias("write_cost_usd"),
    "read_cost_dollars": Alias("read_cost_usd"),
    "occupancy_cost_dollars": Alias("occupancy_cost_usd"),
    "clairvoyant_bound_dollars": Alias("clairvoyant_bound_usd"),
    "timestamp_s": Alias("timestamp"),
    "measured_seconds": Alias("measured_duration_s"),
    "group": Alias("group_name"),
    # kvtrace size
    "h_dram": Alias("dram_prefix_token_hit_rate"),
    "h_flash": Alias("ssd_prefix_token_hit_rate"),
    "h_miss": Alias("prefix_token_miss_rate"),
    "mean_ms": Alias("service_time_mean_ms"),
    "p50_ms": Alias("service_time_p50_ms"),
    "p99_ms": Alias("service_time_p99_ms"),
    "est_mean_ms": Alias("estimated_service_time_mean_ms"),
    "est_p99_ms": Alias("estimated_service_time_p99_ms"),
    "monthly_cost_usd": Alias("cost_usd_per_month"),
    "incremental_monthly_usd": Alias("incremental_cost_usd_per_month"),
    "value_monthly_usd": Alias("value_usd_per_month"),
    "realised_monthly_usd": Alias("realised_value_usd_per_month"),
    "net_monthly_usd": Alias("net_usd_per_month"),
    "gpu_hours_freed": Alias("gpu_hours_saved_per_month"),
    "break_even_flash_ms": Alias("break_even_restore_ms"),
    "flash_restore_ms": Alias("restore_mean_ms"),
    "dwpd": Alias("ssd_dwpd"),
}

#: Earlier names of ``kvtrace size`` tables (those with ``h_dram`` or ``h_flash``) that
#: mean another quantity elsewhere: there "flash" was the flash level (local SSD or pool).
SIZE_ALIASES: dict[str, Alias] = {
    "h_flash_request": Alias("ssd_request_hit_rate"),
    "flash_read_mean_bytes_per_s": Alias("ssd_read_mean_bytes_per_s"),
    "flash_read_peak_bytes_per_s": Alias("ssd_read_peak_bytes_per_s"),
    "flash_bandwidth_bytes_per_s": Alias("ssd_bandwidth_bytes_per_s"),
}

#: ``hit_rate_at`` / ``capacity_for`` metric words (SQL) -> curve columns.
SQL_METRICS = {"prefix_token": "prefix_token_hit_rate", "request": "request_hit_rate",
               "request_half_prefix": "request_half_prefix_hit_rate", "prefix_byte": "prefix_byte_hit_rate",
               "prefix_block": "prefix_block_hit_rate", "block": "block_hit_rate", "token": "token_hit_rate",
               "byte": "byte_hit_rate", "compute": "compute_saved_rate"}


def canonical_metric(name: str) -> str:
    """The current name of a metric named the current way, by an alias or by a SQL word."""
    if name in ALIASES:
        return ALIASES[name].name
    return SQL_METRICS.get(name, name)


def canonical_table(table: "pl.DataFrame") -> "pl.DataFrame":
    """``table`` with every column of an earlier name renamed (and rescaled) to the
    current one; a column whose current name is also present is kept as it is and the
    old one dropped. A table of ``kvtrace size`` (it has ``h_dram`` or ``h_flash``) reads
    its names by :data:`SIZE_ALIASES` first."""
    import polars as pl

    aliases = ALIASES
    if "h_dram" in table.columns or "h_flash" in table.columns:
        aliases = {**ALIASES, **SIZE_ALIASES}
    exprs = []
    present = set(table.columns)
    for col in table.columns:
        alias = aliases.get(col)
        if alias is None:
            exprs.append(pl.col(col))
        elif alias.name in present:
            continue
        elif alias.scale != 1.0:
            exprs.append((pl.col(col) * alias.scale).alias(alias.name))
        else:
            exprs.append(pl.col(col).alias(alias.name))
    return table.select(exprs)


def all_columns() -> dict[str, tuple[str, str]]:
    """Every column name of :data:`TABLES` -> (unit, meaning) of its first listing."""
    out: dict[str, tuple[str, str]] = {}
    for _, columns in TABLES.values():
        for name, spec in columns.items():
            out.setdefault(name, spec)
    return out


def markdown() -> str:
    """The README's "Metric names" tables: every result table's columns with unit, then
    the aliases."""
    lines = []
    for table, (where, columns) in TABLES.items():
        lines += [f"#### {table}", "", f"Written by {where}.", "", "| column | unit | label | meaning |",
                  "|---|---|---|---|"]
        for name, (unit, meaning) in columns.items():
            lab = LABELS.get(name, "")
            lines.append(f"| `{name}` | {unit} | {lab} | {meaning} |")
        lines.append("")
    lines += ["#### Earlier names", "",
              "Accepted where kvtrace reads its own older outputs (`export --whatif`) and where a metric is named "
              "(the SQL macros); a factor converts the old unit.", "",
              "| earlier name | current name | factor |", "|---|---|---|"]
    for old, alias in sorted(ALIASES.items()):
        if old not in SIZE_ALIASES:
            lines.append(f"| `{old}` | `{alias.name}` | {alias.scale:g} |")
    for old, alias in sorted(SIZE_ALIASES.items()):
        lines.append(f"| `{old}` (a `size` table) | `{alias.name}` | {alias.scale:g} |")
    return "\n".join(lines) + "\n"
