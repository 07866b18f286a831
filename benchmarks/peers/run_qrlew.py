"""Qrlew side of benchmarks/peers.py; runs in benchmarks/peers/.venv-qrlew.

python run_qrlew.py DATA.parquet ROWS REPEAT  ->  JSON on stdout: per query, the wall seconds of
each run (Qrlew's rewrite into DP SQL, then DuckDB running it over the Parquet file) and the
released rows of the last one as [key..., value] (value: the count, or for Q3 the sum).

Qrlew reads the schema and the table size from a SQLAlchemy engine: an SQLite table with the
events' columns and as many (dummy) rows as the data set, built once before timing; the
public facts are declared on it (likes in [0, 10], the 50 countries). Privacy unit
``user_id``, epsilon 1, delta 1e-5, at most 1 row per unit (max_multiplicity) and 5 groups per
unit (max_privacy_unit_groups).
"""

import json
import sys
import time

import duckdb
import pyqrlew as qrl
import sqlalchemy

path, n_rows, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
engine = sqlalchemy.create_engine("sqlite://")
with engine.begin() as c:
    c.exec_driver_sql("CREATE TABLE events (user_id INTEGER NOT NULL, url TEXT NOT NULL, country TEXT NOT NULL, "
                      "likes INTEGER NOT NULL)")
    c.exec_driver_sql("INSERT INTO events WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s "
                      f"WHERE i < {n_rows}) SELECT 0, '', '', 0 FROM s")
ds = qrl.Dataset.from_database("ds", engine)
ds = ds.with_range(None, "events", "likes", 0, 10).with_possible_values(
    None, "events", "country", [f"C{i}" for i in range(50)])
con = duckdb.connect()
con.execute("SET enable_progress_bar = false")
con.execute(f"CREATE VIEW events AS SELECT user_id, url, country, likes FROM read_parquet('{path}')")
QUERIES = {
    "Q1": ("SELECT country, COUNT(*) AS n FROM events GROUP BY country", 1),
    "Q2": ("SELECT url, country, COUNT(*) AS n FROM events GROUP BY url, country", 2),
    "Q3": ("SELECT country, SUM(likes) AS s, AVG(likes) AS a FROM events GROUP BY country", 1),
}
out = {}
for name, (sql, n_keys) in QUERIES.items():
    secs = []
    rows = []
    for _ in range(repeat):
        t = time.perf_counter()
        rel = ds.relation(sql).rewrite_with_differential_privacy(
            ds, [("events", [], "user_id")], {"epsilon": 1.0, "delta": 1e-5},
            max_multiplicity=1, max_privacy_unit_groups=5)
        rows = con.execute(rel.relation().to_query()).fetchall()
        secs.append(time.perf_counter() - t)
    out[name] = {"seconds": secs, "rows": [[*r[:n_keys], float(r[n_keys])] for r in rows]}
import resource  # noqa: E402

out["peak_rss_kb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps(out))
