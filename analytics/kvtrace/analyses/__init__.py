"""The analyses: each reads a trace (a :mod:`kvtrace.trace` source) through the kernels and
returns a typed result: reuse distances and curves, sampled curves, statistics, future-reuse
value, tier what-ifs, sizing, the back-of-the-envelope calculators and the response model."""
