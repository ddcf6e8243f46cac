-- Hit rates at round cache sizes (the curve, exactly).
--
-- Question: what does each round cache size save? The curve at 16 GiB .. 4 TiB:
-- request hit rate, usable-prefix token hit rate and compute saved, exactly as
-- `kvtrace curve --capacity 16GiB,64GiB,256GiB,1TiB,4TiB` prints them.
-- Parameters: SET VARIABLE capacities = [gib(16), gib(64), gib(256), tib(1), tib(4)];   (bytes)
-- Reads: the macro hit_rate_at (exact, over curve_steps).
SELECT
    c AS capacity_bytes,
    c / 2^30 AS gib,
    hit_rate_at(c, metric := 'request') AS request_hit_rate,
    hit_rate_at(c) AS prefix_token_hit_rate,
    hit_rate_at(c, metric := 'compute') AS compute_saved_rate
FROM (SELECT unnest(coalesce(getvariable('capacities'), [gib(16), gib(64), gib(256), tib(1), tib(4)])) AS c)
ORDER BY c;
