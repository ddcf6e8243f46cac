-- kvtrace SQL macros (DuckDB).
--
-- Installed by `kvtrace export` in every database it writes, after the tables and
-- before views.sql. To use them over the Parquet files of `kvtrace export --parquet
-- DIR`, first create views named like the tables (README, "SQL for analysts"), then
-- read this file.
--
-- Units: capacities and sizes in bytes, distances in tokens of KV cache (x KV bytes
-- per token = bytes), times in seconds from the start of the trace, rates as shares
-- in [0, 1]. A first access is a cold miss with distance inf.
--
-- Metrics (the `metric` argument): a rate column of the curve table,
--   'prefix_token_hit_rate' (default, the headline), 'request_hit_rate', 'request_half_prefix_hit_rate',
--   'prefix_byte_hit_rate', 'prefix_block_hit_rate', 'block_hit_rate', 'token_hit_rate',
--   'byte_hit_rate', 'compute_saved_rate', or its short word ('prefix_token', 'request',
--   'request_half_prefix', 'prefix_byte', 'prefix_block', 'block', 'token', 'byte',
--   'compute').

-- The short word of a metric named by its curve column (a short word passes through).
CREATE OR REPLACE MACRO kv_metric(metric) AS
    CASE WHEN metric = 'compute_saved_rate' THEN 'compute'
         WHEN metric LIKE '%\_hit\_rate' ESCAPE '\' THEN left(metric, length(metric) - 9)
         ELSE metric END;

-- Bytes of KV cache for `tokens` tokens at `bytes_per_token` bytes each (BIGINT for
-- integer tokens, DOUBLE for distances, where inf stays inf).
CREATE OR REPLACE MACRO kv_bytes(tokens, bytes_per_token) AS
    tokens * CAST(bytes_per_token AS BIGINT);

-- Sizes in bytes: gib(64) = 64 x 2^30, tib(1.5) = 1.5 x 2^40, rounded down to whole bytes
-- (x 2^k is exact in DOUBLE).
CREATE OR REPLACE MACRO gib(n) AS CAST(floor(CAST(n AS DOUBLE) * 1073741824) AS BIGINT);
CREATE OR REPLACE MACRO tib(n) AS CAST(floor(CAST(n AS DOUBLE) * 1099511627776) AS BIGINT);

-- Hit rate of an LRU cache of `capacity_bytes` bytes, exactly as
-- `kvtrace curve --capacity` computes it for the model, eviction model and warm-up
-- the database was made with: an access (request) hits iff its distance in bytes is
-- <= the capacity; rates are shares of the measured (post-warm-up) accesses/requests.
-- Reads the exact per-distance hit data in curve_steps. NULL when nothing is measured.
CREATE OR REPLACE MACRO hit_rate_at(capacity_bytes, metric := 'prefix_token_hit_rate') AS (
    WITH m AS (
        SELECT prefill_flops_per_token AS fa, prefill_flops_per_token_position AS fb FROM trace_meta
    ),
    s AS (
        SELECT
            coalesce(sum(accesses) FILTER (WHERE kind = 'request' AND distance_bytes <= capacity_bytes), 0) AS req_hit,
            coalesce(sum(accesses) FILTER (WHERE kind = 'request'), 0) AS req_all,
            coalesce(sum(accesses) FILTER (WHERE kind = 'half_prefix' AND distance_bytes <= capacity_bytes), 0)
                AS half_hit,
            coalesce(sum(accesses) FILTER (WHERE kind = 'prefix' AND distance_bytes <= capacity_bytes), 0) AS pre_n_hit,
            coalesce(sum(tokens) FILTER (WHERE kind = 'prefix' AND distance_bytes <= capacity_bytes), 0) AS pre_tok_hit,
            coalesce(sum(cache_tokens) FILTER (WHERE kind = 'prefix' AND distance_bytes <= capacity_bytes), 0) AS pre_size_hit,
            coalesce(sum(position_token_sum) FILTER (WHERE kind = 'prefix' AND distance_bytes <= capacity_bytes), 0) AS pre_q_hit,
            coalesce(sum(accesses) FILTER (WHERE kind = 'prefix'), 0) AS n_all,
            coalesce(sum(tokens) FILTER (WHERE kind = 'prefix'), 0) AS tok_all,
            coalesce(sum(cache_tokens) FILTER (WHERE kind = 'prefix'), 0) AS size_all,
            coalesce(sum(position_token_sum) FILTER (WHERE kind = 'prefix'), 0) AS q_all,
            coalesce(sum(accesses) FILTER (WHERE kind = 'any' AND distance_bytes <= capacity_bytes), 0) AS any_n_hit,
            coalesce(sum(tokens) FILTER (WHERE kind = 'any' AND distance_bytes <= capacity_bytes), 0) AS any_tok_hit,
            coalesce(sum(cache_tokens) FILTER (WHERE kind = 'any' AND distance_bytes <= capacity_bytes), 0) AS any_size_hit
        FROM curve_steps
    )
    SELECT CASE kv_metric(metric)
        WHEN 'prefix_token' THEN CAST(pre_tok_hit AS DOUBLE) / nullif(CAST(tok_all AS DOUBLE), 0)
        WHEN 'request' THEN CAST(req_hit AS DOUBLE) / nullif(CAST(req_all AS DOUBLE), 0)
        WHEN 'request_half_prefix' THEN CAST(half_hit AS DOUBLE) / nullif(CAST(req_all AS DOUBLE), 0)
        WHEN 'prefix_byte' THEN CAST(pre_size_hit AS DOUBLE) / nullif(CAST(size_all AS DOUBLE), 0)
        WHEN 'prefix_block' THEN CAST(pre_n_hit AS DOUBLE) / nullif(CAST(n_all AS DOUBLE), 0)
        WHEN 'block' THEN CAST(any_n_hit AS DOUBLE) / nullif(CAST(n_all AS DOUBLE), 0)
        WHEN 'token' THEN CAST(any_tok_hit AS DOUBLE) / nullif(CAST(tok_all AS DOUBLE), 0)
        WHEN 'byte' THEN CAST(any_size_hit AS DOUBLE) / nullif(CAST(size_all AS DOUBLE), 0)
        WHEN 'compute' THEN (fa * CAST(pre_tok_hit AS DOUBLE) + fb * CAST(pre_q_hit AS DOUBLE))
                            / nullif(fa * CAST(tok_all AS DOUBLE) + fb * CAST(q_all AS DOUBLE), 0)
        ELSE error('hit_rate_at: unknown metric ''' || metric || ''': expected a rate column of the curve '
                   || '(prefix_token_hit_rate, request_hit_rate, ..., compute_saved_rate) or its short word')
    END
    FROM s, m
);

-- Smallest capacity (bytes) at which `metric` reaches `target_rate` (a share in
-- [0, 1]): the distance, in bytes, of the access that carries the hit rate to the
-- target. 0 for a target <= 0; NULL when even an infinite cache stays below it (see
-- the ceiling_* columns of trace_meta). Ties within 1e-12 of the target count as
-- reaching it, as for the knees of `kvtrace curve`.
CREATE OR REPLACE MACRO capacity_for(target_rate, metric := 'prefix_token_hit_rate') AS (
    WITH m AS (
        SELECT prefill_flops_per_token AS fa, prefill_flops_per_token_position AS fb FROM trace_meta
    ),
    w AS (
        SELECT distance_tokens, distance_bytes,
            CASE kv_metric(metric)
                WHEN 'prefix_token' THEN CAST(tokens AS DOUBLE)
                WHEN 'request' THEN CAST(accesses AS DOUBLE)
                WHEN 'request_half_prefix' THEN CAST(accesses AS DOUBLE)
                WHEN 'prefix_byte' THEN CAST(cache_tokens AS DOUBLE)
                WHEN 'prefix_block' THEN CAST(accesses AS DOUBLE)
                WHEN 'block' THEN CAST(accesses AS DOUBLE)
                WHEN 'token' THEN CAST(tokens AS DOUBLE)
                WHEN 'byte' THEN CAST(cache_tokens AS DOUBLE)
                WHEN 'compute' THEN fa * CAST(tokens AS DOUBLE) + fb * CAST(position_token_sum AS DOUBLE)
                ELSE error('capacity_for: unknown metric ''' || metric || ''': expected a rate column of the curve '
                           || '(prefix_token_hit_rate, request_hit_rate, ..., compute_saved_rate) or its short word')
            END AS weight
        FROM curve_steps, m
        WHERE kind = CASE WHEN kv_metric(metric) = 'request' THEN 'request'
                          WHEN kv_metric(metric) = 'request_half_prefix' THEN 'half_prefix'
                          WHEN kv_metric(metric) IN ('block', 'token', 'byte') THEN 'any'
                          ELSE 'prefix' END
    ),
    c AS (
        SELECT distance_tokens, distance_bytes,
            sum(weight) OVER (ORDER BY distance_tokens) AS cum,
            sum(weight) OVER () AS total
        FROM w
    )
    SELECT CASE WHEN target_rate <= 0 THEN CAST(0 AS BIGINT)
                ELSE CAST(min(distance_bytes) FILTER (
                         WHERE isfinite(distance_tokens) AND cum >= target_rate * total * (1 - 1e-12)) AS BIGINT)
           END
    FROM c
);

-- The p-th percentile (p in 0..100, linear interpolation as numpy.percentile and
-- `kvtrace stats`) of the reuse time, seconds: time since the block's previous touch,
-- over every access that re-references a block.
CREATE OR REPLACE MACRO reuse_time_pct(p) AS (
    SELECT quantile_cont(reuse_time_s, p / 100.0) FROM accesses WHERE isfinite(reuse_time_s)
);
