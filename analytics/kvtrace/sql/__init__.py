"""kvtrace in SQL: the DuckDB views, macros and example queries of a trace database (the
``.sql`` files of this directory) and the ``kvtrace sql`` shell (:mod:`kvtrace.sql.shell`)."""
