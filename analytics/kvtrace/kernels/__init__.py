"""Numba kernels: plain numpy arrays in, plain numpy arrays out.

Kernels import nothing of kvtrace but :mod:`kvtrace.config`; they never see Polars,
DuckDB or file paths. Public wrappers live in :mod:`kvtrace.distances`,
:mod:`kvtrace.curves` and :mod:`kvtrace.ingest`.
"""
