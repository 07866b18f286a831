"""Pure query analysis: SQL text -> QueryPlan. Reads only the catalog; no DuckDB, no numpy."""
