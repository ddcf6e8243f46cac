-- kvtrace SQL views (DuckDB).
--
-- Installed by `kvtrace export` in every database it writes, after the tables and
-- macros.sql. Over the Parquet files of `kvtrace export --parquet DIR`: create views
-- named like the tables, read macros.sql, then this file (README, "SQL for analysts").
--
-- Base tables (schemas in the README and as column comments: `FROM duckdb_columns()`):
-- trace_meta (one row), requests, accesses, blocks, curve, curve_by_group, curve_steps,
-- knees. Units: bytes, tokens, seconds from the start of the trace, $; a first access
-- has distance and reuse time inf.

-- Every access with its request's attributes and its block's cache size: the table
-- most questions start from. Hit at capacity C (bytes): usable_distance_bytes <= C
-- (usable prefix, the headline) or reuse_distance_bytes <= C (any block).
CREATE OR REPLACE VIEW access_detail AS
SELECT
    a.*,
    r.request_id,
    r.session_id,
    r.turn,
    r.type,
    r.tenant,
    b.size_tokens AS block_size_tokens,
    b.bytes AS block_bytes
FROM accesses AS a
JOIN requests AS r USING (request)
JOIN blocks AS b USING (block);

-- Requests of sessions in arrival order, with the pause since the session's previous
-- request (gap_s, seconds; NULL for the first request of a session).
CREATE OR REPLACE VIEW session_requests AS
SELECT
    session_id,
    request,
    request_id,
    timestamp,
    turn,
    type,
    tenant,
    input_tokens,
    timestamp - lag(timestamp) OVER (PARTITION BY session_id ORDER BY timestamp, request) AS gap_s,
    row_number() OVER (PARTITION BY session_id ORDER BY timestamp, request) AS nth
FROM requests
WHERE session_id IS NOT NULL;

-- Prefix families: blocks grouped by root_block, the block of the request in which
-- they first appear just below the shared root (the leading blocks that >= 99 % of
-- requests carry, such as a system prompt every request starts with; with none, the
-- position-0 block: the prompt / document a chain grew from), with their future-reuse
-- value ($, `kvtrace value` semantics), most valuable first.
CREATE OR REPLACE VIEW prefixes AS
SELECT
    f.root_block,
    r.hash AS root_hash,
    r.tenant,
    f.blocks,
    f.bytes,
    f.accesses,
    f.never_reused_bytes,
    f.gain_gpu_seconds,
    f.total_value_usd,
    f.total_value_usd / f.bytes AS value_usd_per_byte,
    f.clairvoyant_value_usd
FROM (
    SELECT
        root_block,
        count(*) AS blocks,
        CAST(sum(bytes) AS BIGINT) AS bytes,
        CAST(sum(accesses) AS BIGINT) AS accesses,
        CAST(coalesce(sum(bytes) FILTER (WHERE NOT reused), 0) AS BIGINT) AS never_reused_bytes,
        sum(gain_gpu_seconds) AS gain_gpu_seconds,
        sum(total_value_usd) AS total_value_usd,
        sum(clairvoyant_value_usd) AS clairvoyant_value_usd
    FROM blocks
    GROUP BY root_block
) AS f
JOIN blocks AS r ON r.block = f.root_block
ORDER BY f.total_value_usd DESC, f.root_block;

-- The curve with readable units: capacity in GiB, rates in percent (2 decimals).
CREATE OR REPLACE VIEW curve_pct AS
SELECT
    round(capacity_bytes / 1073741824, 3) AS capacity_gib,
    round(100 * request_hit_rate, 2) AS request_hit_rate_pct,
    round(100 * prefix_token_hit_rate, 2) AS prefix_token_hit_rate_pct,
    round(100 * token_hit_rate, 2) AS token_hit_rate_pct,
    round(100 * compute_saved_rate, 2) AS compute_saved_rate_pct,
    round(gpu_seconds_saved_per_hour, 1) AS gpu_seconds_saved_per_hour,
    round(usd_saved_per_hour, 2) AS usd_saved_per_hour,
    round(read_mean_bytes_per_s / 1073741824, 3) AS read_mean_gib_per_s
FROM curve
ORDER BY capacity_bytes;
