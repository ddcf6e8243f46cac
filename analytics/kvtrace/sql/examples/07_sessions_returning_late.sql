-- Sessions that return after more than 30 minutes.
--
-- Question: which sessions come back after a long pause (more than 30 minutes by
-- default)? Their context must survive that long in some tier, or be recomputed.
-- Per such session: requests, how many times it came back after the pause, the
-- longest pause, and its first and last arrival.
-- Parameters: SET VARIABLE gap_s = 1800;   (seconds)
-- Reads: the view session_requests (needs session ids in the trace).
WITH params AS (
    SELECT CAST(coalesce(getvariable('gap_s'), 1800) AS DOUBLE) AS min_gap_s
)
SELECT
    s.session_id,
    any_value(s.tenant) AS tenant,
    count(*) AS requests,
    count(*) FILTER (WHERE s.gap_s > p.min_gap_s) AS returns,
    max(s.gap_s) AS longest_gap_s,
    min(s.timestamp) AS first_s,
    max(s.timestamp) AS last_s
FROM session_requests AS s, params AS p
GROUP BY s.session_id
HAVING count(*) FILTER (WHERE s.gap_s > p.min_gap_s) > 0
ORDER BY longest_gap_s DESC, s.session_id;
