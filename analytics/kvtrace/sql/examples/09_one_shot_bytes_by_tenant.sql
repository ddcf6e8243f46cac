-- Bytes never reused (one-shot context), by tenant.
--
-- Question: how much of each tenant's context is never used again? Blocks accessed
-- once (one-shot prompts) fill capacity and never pay it back; per tenant of the
-- request in which a block first appears: distinct blocks and bytes, the bytes and
-- share that are never reused, and the net future-reuse value of its blocks.
-- Reads: blocks.
SELECT
    coalesce(tenant, '(none)') AS tenant,
    count(*) AS blocks,
    CAST(sum(bytes) AS BIGINT) AS bytes,
    CAST(coalesce(sum(bytes) FILTER (WHERE NOT reused), 0) AS BIGINT) AS one_shot_bytes,
    coalesce(sum(bytes) FILTER (WHERE NOT reused), 0) / sum(bytes) AS one_shot_share,
    sum(total_value_usd) AS total_value_usd
FROM blocks
GROUP BY ALL
ORDER BY bytes DESC, tenant;
