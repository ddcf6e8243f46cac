"""kvtrace: where KV-cache context should live, and how much memory and flash to buy.

Data flows one way: source file -> canonical tables (:mod:`kvtrace.ingest`) ->
kernels (:mod:`kvtrace.kernels`) -> result tables (:mod:`kvtrace.analyses.curves`, ...) ->
CLI / app / SQL.
"""

__version__ = "0.1.0"
