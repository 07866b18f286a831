"""dpsql: differentially private SQL over DuckDB."""
