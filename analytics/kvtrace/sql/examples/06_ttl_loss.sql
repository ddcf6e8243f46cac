-- Share of accesses a time-to-live of T would lose.
--
-- Question: what would a time-to-live of T lose? A cache that drops a block T seconds
-- after its last use misses every reuse that comes later than that, however large
-- the cache. Per TTL: the accesses lost, as a share of all accesses, of the reuses an
-- infinite cache would hit, and of prompt tokens.
-- Parameters: SET VARIABLE ttls_s = [60, 300, 1800, 3600];   (seconds)
-- Reads: accesses. Measured (post-warm-up) accesses only.
WITH ttl AS (
    SELECT unnest(coalesce(getvariable('ttls_s'), [60, 300, 1800, 3600])) AS ttl_s
)
SELECT
    ttl.ttl_s,
    count(*) FILTER (WHERE isfinite(a.reuse_time_s) AND a.reuse_time_s > ttl.ttl_s) AS lost_accesses,
    count(*) FILTER (WHERE isfinite(a.reuse_time_s) AND a.reuse_time_s > ttl.ttl_s) / count(*)
        AS lost_share_of_accesses,
    count(*) FILTER (WHERE isfinite(a.reuse_time_s) AND a.reuse_time_s > ttl.ttl_s)
        / nullif(count(*) FILTER (WHERE isfinite(a.reuse_time_s)), 0) AS lost_share_of_reuses,
    coalesce(sum(a.tokens) FILTER (WHERE isfinite(a.reuse_time_s) AND a.reuse_time_s > ttl.ttl_s), 0)
        / sum(a.tokens) AS lost_token_share
FROM accesses AS a, ttl
WHERE a.measured
GROUP BY ttl.ttl_s
ORDER BY ttl.ttl_s;
