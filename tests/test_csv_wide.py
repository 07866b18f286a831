"""Registering a wide CSV file (thousands of columns) costs work linear in its width.

DuckDB's binder takes time that grows faster than linearly with the number of non-trivial
expressions in one SELECT list (``benchmarks/csv_wide.py``: the view of a 4000-column file
took seconds to bind), so a registration binds the wide view once (its CREATE), never a second
time to read its schema: a CSV view's schema is its header with the declared types, whose DuckDB
spelling is read from a one-column select per distinct declared type. Each column's expression
reads the field once in an inner select (unquoting, then the declared type's TRY_CAST) and the
outer select caps the text or range-checks the value over that one column, so the SQL per column is
bounded by a constant. Counted, not timed: statements executed, binds of the wide view, and the SQL
text per column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import dpsql

TYPES = ["BOOLEAN", "INTEGER", "BIGINT", "DOUBLE", "DECIMAL(10,2)", "DATE", "TIMESTAMP", "TIMESTAMPTZ", "TIME",
         "VARCHAR", "HUGEINT", "UTINYINT", "FLOAT", "SMALLINT"]


def write(path: Path, width: int) -> list[str]:
    names = ["uid"] + [f"c{i:05d}" for i in range(width)]
    with open(path, "w") as f:
        f.write(",".join(names) + "\n")
        for r in range(3):
            f.write(",".join([str(r)] + [f'"{i}"' if i % 2 else str(i) for i in range(width)]) + "\n")
    return names


class Counting:
    """The engine's connection, counting and keeping the SQL it is given."""

    def __init__(self, con: Any) -> None:
        self.con = con
        self.statements: list[str] = []

    def execute(self, sql: str, *a: Any, **k: Any) -> Any:
        self.statements.append(sql)
        return self.con.execute(sql, *a, **k)

    def sql(self, sql: str, *a: Any, **k: Any) -> Any:
        self.statements.append(sql)
        return self.con.sql(sql, *a, **k)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.con, name)


def register(tmp_path: Path, width: int, types: dict[str, str] | None = None) -> tuple[list[str], dict[str, str], Any]:
    path = tmp_path / f"w{width}.csv"
    write(path, width)
    s = dpsql.Session(budget=dpsql.Budget(1.0))
    counting = Counting(s._engine._con)
    s._engine._con = counting
    try:
        s.register("w", str(path), privacy_unit="uid", columns={c: {"type": t} for c, t in (types or {}).items()})
    finally:
        s._engine._con = counting.con
    return counting.statements, dict(s.tables["w"].schema), s


@pytest.mark.parametrize("width", [100, 200, 400])
def test_the_wide_view_is_bound_once(tmp_path: Path, width: int) -> None:
    statements, schema, s = register(tmp_path, width)
    view = next(iter(s._engine._csv))
    wide = [q for q in statements if view in q or f"c{width - 1:05d}" in q]  # what binds the wide view
    assert len(wide) == 1 and wide[0].lstrip().upper().startswith("CREATE"), [q[:80] for q in wide]
    assert len(statements) <= 2  # the CREATE, and nothing that grows with the width
    assert schema == {"uid": "VARCHAR", **{f"c{i:05d}": "VARCHAR" for i in range(width)}}
    s.close()


def test_the_sql_per_column_is_bounded(tmp_path: Path) -> None:
    sizes = {}
    for width in (100, 200, 400):
        statements, _, s = register(tmp_path, width)
        sizes[width] = len(next(q for q in statements if q.lstrip().upper().startswith("CREATE")))
        s.close()
    per_column = (sizes[400] - sizes[200]) / 200
    assert per_column == (sizes[200] - sizes[100]) / 100  # exactly linear (names of one width)
    assert per_column < 300, per_column  # 430 when the cap repeated the unquoting of the field


def test_declared_types_are_spelled_as_duckdb_describes_them(tmp_path: Path) -> None:
    """The schema comes from the header and the declared types without binding the view again: it is
    the one DESCRIBE of the view gives, and the values read are the same."""
    width = 2 * len(TYPES)
    types = {f"c{i:05d}": TYPES[i % len(TYPES)] for i in range(width)}
    statements, schema, s = register(tmp_path, width, types)
    view = next(iter(s._engine._csv))
    described = {str(r[0]).lower(): str(r[1]) for r in s._engine._con.execute(f'DESCRIBE SELECT * FROM "{view}"').fetchall()}
    assert schema == described
    assert len(statements) <= 2 + len(set(TYPES))
    s.close()


def test_rows_read_through_the_two_level_view(tmp_path: Path) -> None:
    import warnings

    path = tmp_path / "t.csv"
    path.write_text('uid,a,b,c\n1,"x""y",2024-01-02,"7"\n2,plain,9999-12-31,8\n3,"",bad,\n')
    with dpsql.Session(budget=dpsql.Budget(100.0, 1e-3)) as s:
        from dpsql.testing import use_noise, zero_noise

        use_noise(s, zero_noise(1))
        s.register("t", str(path), privacy_unit="uid", columns={"b": {"type": "DATE"}, "c": {"type": "INTEGER",
                                                                                            "bounds": (0, 10)}})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = s.query("SELECT COUNT(a) AS na, COUNT(b) AS nb, SUM(c) AS sc FROM t", epsilon=50.0).to_pylist()[0]
    assert got == {"na": 3, "nb": 2, "sc": 15.0}
