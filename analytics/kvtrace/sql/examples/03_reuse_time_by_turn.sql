-- Reuse-time distribution by conversation turn.
--
-- Question: how long after its previous use is a block used again, by conversation
-- turn? Per turn bucket of the request that reuses it: accesses, the share that
-- re-reference a block, and percentiles of the reuse time (seconds since the block's
-- previous touch; linear interpolation, as `kvtrace stats`).
-- Reads: access_detail (every access, warm-up included).
SELECT
    CASE WHEN turn IS NULL THEN '(none)'
         WHEN turn <= 3 THEN CAST(turn AS VARCHAR)
         WHEN turn <= 7 THEN '4-7'
         WHEN turn <= 15 THEN '8-15'
         ELSE '16+' END AS turns,
    count(*) AS accesses,
    count(*) FILTER (WHERE isfinite(reuse_time_s)) / count(*) AS reuse_share,
    quantile_cont(reuse_time_s, 0.5) FILTER (WHERE isfinite(reuse_time_s)) AS p50_s,
    quantile_cont(reuse_time_s, 0.9) FILTER (WHERE isfinite(reuse_time_s)) AS p90_s,
    quantile_cont(reuse_time_s, 0.99) FILTER (WHERE isfinite(reuse_time_s)) AS p99_s
FROM access_detail
GROUP BY ALL
ORDER BY min(coalesce(turn, 9223372036854775807)), turns;
