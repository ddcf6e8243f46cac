"""Numba kernels: plain numpy arrays in, plain numpy arrays out.

Kernels import nothing of kvtrace but :mod:`kvtrace.config`; they never see Polars,
DuckDB or file paths. Public wrappers live in :mod:`kvtrace.analyses.distances`,
:mod:`kvtrace.analyses.curves` and :mod:`kvtrace.ingest`.
"""
