"""Results as users meet them: the DuckDB export, charts, and the presentation the
dashboard shares with the CLI (tables, labels, formats)."""
