-- Working set per hour.
--
-- Question: how big is the working set, hour by hour? Per window of the trace:
-- requests, block accesses, distinct blocks and their bytes (what a cache holding
-- that window's context would need), bytes seen for the first time, and the share of
-- accesses that re-reference a block.
-- Parameters: SET VARIABLE window_s = 3600;   (seconds; default one hour)
-- Reads: access_detail.
WITH params AS (
    SELECT CAST(coalesce(getvariable('window_s'), 3600) AS DOUBLE) AS window_s
),
acc AS (
    SELECT CAST(floor(a.timestamp / p.window_s) AS BIGINT) AS bucket, p.window_s, a.request, a.block,
           a.block_bytes, isfinite(a.reuse_distance_tokens) AS reuse
    FROM access_detail AS a, params AS p
),
distinct_blocks AS (
    SELECT bucket, count(*) AS blocks, sum(bytes) AS bytes
    FROM (SELECT bucket, block, any_value(block_bytes) AS bytes FROM acc GROUP BY bucket, block)
    GROUP BY bucket
)
SELECT
    acc.bucket AS window,
    any_value(acc.window_s) * acc.bucket AS start_s,
    count(DISTINCT acc.request) AS requests,
    count(*) AS accesses,
    any_value(d.blocks) AS distinct_blocks,
    CAST(any_value(d.bytes) AS BIGINT) AS distinct_bytes,
    CAST(coalesce(sum(acc.block_bytes) FILTER (WHERE NOT acc.reuse), 0) AS BIGINT) AS new_bytes,
    count(*) FILTER (WHERE acc.reuse) / count(*) AS reuse_share
FROM acc JOIN distinct_blocks AS d USING (bucket)
GROUP BY acc.bucket
ORDER BY acc.bucket;
