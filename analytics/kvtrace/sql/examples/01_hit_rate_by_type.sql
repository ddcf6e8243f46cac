-- Hit rate by request type at 1 TiB (one cache shared by all types).
--
-- Question: what does a KV cache of 1 TiB, shared by every request type, give each
-- type? Share of requests that reuse at least one block, of prompt tokens served from
-- a usable cached prefix, and of prefill compute saved (as `kvtrace curve --by type`).
-- Parameters: SET VARIABLE capacity_bytes = tib(1);   (bytes; default 1 TiB)
-- Reads: requests, access_detail. Measured (post-warm-up) requests and accesses only.
WITH params AS (
    SELECT CAST(coalesce(getvariable('capacity_bytes'), tib(1)) AS BIGINT) AS c
),
req AS (
    SELECT coalesce(r.type, '(none)') AS type,
           count(*) AS requests,
           count(*) FILTER (WHERE r.hit_distance_bytes <= p.c) AS hit_requests
    FROM requests AS r, params AS p
    WHERE r.measured
    GROUP BY ALL
),
acc AS (
    SELECT coalesce(a.type, '(none)') AS type,
           sum(a.tokens) AS prompt_tokens,
           sum(a.tokens) FILTER (WHERE a.usable_distance_bytes <= p.c) AS hit_tokens,
           sum(a.prefill_flops) AS flops,
           sum(a.prefill_flops) FILTER (WHERE a.usable_distance_bytes <= p.c) AS hit_flops
    FROM access_detail AS a, params AS p
    WHERE a.measured
    GROUP BY ALL
)
SELECT req.type,
       req.requests,
       req.hit_requests / req.requests AS request_hit_rate,
       coalesce(acc.hit_tokens, 0) / acc.prompt_tokens AS prefix_token_hit_rate,
       coalesce(acc.hit_flops, 0) / acc.flops AS compute_saved_rate
FROM req LEFT JOIN acc USING (type)
ORDER BY req.type;
