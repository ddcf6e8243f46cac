-- Top prefix families by future-reuse value.
--
-- Question: which prefixes (system prompts, documents, long conversations) are worth
-- keeping? The prefix families with the highest future-reuse value: the compute their
-- reuses avoid minus write, read and occupancy costs of keeping them for the horizon
-- (`kvtrace value` semantics; horizon and costs in trace_meta).
-- Parameters: SET VARIABLE top = 10;
-- Reads: the view prefixes (over blocks).
SELECT
    root_hash,
    tenant,
    blocks,
    bytes / 2^30 AS gib,
    accesses,
    never_reused_bytes / bytes AS never_reused_share,
    total_value_usd,
    value_usd_per_byte * 1e12 AS dollars_per_tb,
    clairvoyant_value_usd
FROM prefixes
ORDER BY total_value_usd DESC, root_block
LIMIT coalesce(getvariable('top'), 10);
