-- Capacity needed to reach a target hit rate.
--
-- Question: how much KV cache does it take to reach a target hit rate? The smallest
-- capacity at which the usable-prefix token hit rate, the compute saved and the
-- request hit rate reach each target (NULL: not even an infinite cache gets there;
-- the ceiling column says how far an infinite cache goes).
-- Parameters: SET VARIABLE targets = [0.25, 0.5, 0.75, 0.9];   (shares in [0, 1])
-- Reads: the macro capacity_for (exact, over curve_steps) and trace_meta.
SELECT
    CAST(target AS DOUBLE) AS target,
    capacity_for(target) / 2^30 AS prefix_token_gib,
    capacity_for(target, metric := 'compute') / 2^30 AS compute_gib,
    capacity_for(target, metric := 'request') / 2^30 AS request_gib,
    (SELECT ceiling_prefix_token_hit_rate FROM trace_meta) AS prefix_token_ceiling
FROM (SELECT unnest(coalesce(getvariable('targets'), [0.25, 0.5, 0.75, 0.9])) AS target)
ORDER BY target;
