"""What the dashboard's pages offer and start from: the curve metrics, the admission
policies, the default tier sizes, the groupings a trace has values for. No Streamlit here.
"""

from __future__ import annotations

from kvtrace.analyses.curves import GROUPINGS
from kvtrace.names import label
from kvtrace.trace import Trace
from kvtrace.units import parse_size

#: Metric choices of the Curves page: label (:data:`kvtrace.names.LABELS`) -> curve-table column.
CURVE_METRICS = {label(m): m for m in ("prefix_token_hit_rate", "request_hit_rate", "request_half_prefix_hit_rate",
                                       "prefix_byte_hit_rate", "compute_saved_rate")}
#: Above this many block accesses the Curves page proposes SHARDS sampling.
LARGE_TRACE_ACCESSES = 5_000_000


def groupings(trace: Trace) -> list[str]:
    """The ``--by`` groupings this trace has values for (type, tenant, turn, session-length)."""
    req = trace.requests
    col = {"type": "type", "tenant": "tenant", "turn": "turn", "session-length": "session_id"}
    return [g for g in GROUPINGS if req[col[g]].null_count() < req.height]


#: The tier sizes every page starts from (Curves draws them, What-ifs simulates them), as
#: the text of their inputs: a size always carries its unit (:func:`kvtrace.units.parse_size`).
#: DRAM is the sizing config's "today" (``[deployment] current_dram``).
DEFAULT_TIERS = {"dram": "64GiB", "flash": "1TiB"}
DEFAULT_TIERS_BYTES = tuple(parse_size(v, field=k) for k, v in DEFAULT_TIERS.items())  # (DRAM, flash) bytes


#: Admission policies offered by the What-ifs page (any ``--policy`` spelling works).
WHATIF_POLICIES = ("all", "second-hit", "tinylfu", "reuse-oracle", "prob:0.3", "idle<60s", "value>=0", "none")
