"""The Spark form of bounded queries, checked without Spark: the portable keyed hash's definition
(pinned against a pure-Python SHA-256 of the canonical text), the lowering's rewrites and its
refusals (free: they happen while binding). The same queries run on Spark in tests/test_spark.py."""

from __future__ import annotations

import datetime as dt
import hashlib
from decimal import Decimal

import duckdb
import pytest
import sqlglot
from sqlglot import exp

from dpsql.catalog import ColumnSpec, TableSpec
from dpsql.engine.portable import PortableDuckDBOps, portable_hash, salt_text
from dpsql.engine.spark_ops import SparkOps, lower_for_spark
from dpsql.errors import UnsupportedQueryError
from dpsql.plan.analyze import analyze
from dpsql.rewrite.bound import Caps, bounded_query
from dpsql.rewrite.render import render


def reference_hash(values: list[object], salt: str) -> int:
    """The portable hash in Python: SHA-256 of the length-prefixed salt and values, first 8 bytes
    as an unsigned integer, minus 2^63."""
    text = salt_text(salt)
    for v in values:
        if v is None:
            text += "n"
        else:
            t = str(v)
            text += f"v{len(t.encode())}:{t}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") - 2**63


def test_portable_hash_is_pinned_on_duckdb() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT * FROM (VALUES (1, 'x'), (2, NULL), (-7, 'ünï:v3'), (NULL, '')) v(a, b)")
    q = exp.select("a", "b", exp.alias_(portable_hash(["a", "b"], "s", "duckdb"), "h")).from_("t")
    for a, b, h in con.sql(render(q)).fetchall():
        assert h == reference_hash([a, b], "s"), (a, b)
    # negative control: the pieces are length-prefixed, so moving a character between columns changes it
    assert reference_hash(["ab", "c"], "s") != reference_hash(["a", "bc"], "s")
    assert reference_hash(["1"], "s") != reference_hash(["1"], "t")
    assert isinstance(PortableDuckDBOps().keyed_hash(["a"], "s"), exp.Cast)


SCHEMA = {"user_id": "BIGINT", "url": "VARCHAR", "amount": "DOUBLE", "day": "DATE", "age": "BIGINT"}


def plan(sql: str):  # type: ignore[no-untyped-def]
    spec = TableSpec(name="events", source="<arrow>", source_kind="arrow", privacy_unit="user_id", schema=SCHEMA,
                     columns={"amount": ColumnSpec("amount", bounds=(0.0, 100.0))})
    return analyze(sql, {"events": spec})


def spark_sql(sql: str, caps: Caps = Caps(2, 2, 5)) -> str:
    ast = bounded_query(plan(sql), caps, salt="s", unit_column="user_id", ops=SparkOps())
    return render(lower_for_spark(ast), dialect="spark")


def test_division_is_guarded_and_row_numbers_are_ordered() -> None:
    text = spark_sql("SELECT url, COUNT(*) FROM events WHERE amount / age > 2 GROUP BY url")
    assert "TRY_DIVIDE(" in text.upper() and "CAST('inf' AS DOUBLE)" in text
    assert "NULLS LAST" in text and "SHA2(" in text
    assert "ARG_MIN" not in text and "HASH(" not in text.replace("SHA2(", "")
    sqlglot.parse_one(text, read="spark")  # valid Spark SQL


def test_floor_of_a_double_stays_a_double() -> None:
    text = spark_sql("SELECT floor(amount) AS f, COUNT(*) FROM events GROUP BY f")
    assert "ISNAN(" in text.upper() and "CAST(FLOOR(" in text.upper()


def test_shadowed_row_number_is_renamed() -> None:
    # L and k both number rows as __idx: DuckDB reads the first, Spark would call it ambiguous
    text = spark_sql("SELECT url, SUM(amount) FROM events GROUP BY url", Caps(2, 2, 5))
    assert "__idx__shadowed" in text


def test_date_functions_are_lowered_to_spark_functions() -> None:
    text = spark_sql("SELECT date_trunc('week', day) AS w, COUNT(*) FROM events "
                     "WHERE year(day) = 2024 AND extract(isodow FROM day) < 6 GROUP BY w")
    up = text.upper()
    assert "UNIX_MICROS(" in up and "PMOD(" in up and "DAYOFWEEK(" in up and "YEAR(" in up
    assert "DATE_PART('ISODOW'" not in up and "'(BC)" not in up
    sqlglot.parse_one(text, read="spark")  # valid Spark SQL


@pytest.mark.parametrize("where", [
    "date_part('decade', day) = 202",
    "strftime(day, '%Y') = '2024'",
    "url LIKE 'a\\%'",
    "age // 3 = 1",
    "sign(amount) = 1",
    "ln(amount) > 1",
    "round(amount) = 3",
    "left(url, age) = 'a'",
])
def test_constructs_spark_cannot_reproduce_are_refused(where: str) -> None:
    with pytest.raises(UnsupportedQueryError, match="Spark"):
        spark_sql(f"SELECT COUNT(*) FROM events WHERE {where}")


def test_duckdb_output_is_unchanged_by_the_spark_path() -> None:
    p = plan("SELECT url, COUNT(*) FROM events WHERE amount / age > 2 GROUP BY url")
    a = render(bounded_query(p, Caps(2, 2), salt="s", unit_column="user_id"))
    lower_for_spark(bounded_query(p, Caps(2, 2), salt="s", unit_column="user_id", ops=SparkOps()))
    assert a == render(bounded_query(p, Caps(2, 2), salt="s", unit_column="user_id"))
    assert "TRY_CAST" in a and "HASH(" in a


@pytest.mark.parametrize("where,spelled", [
    ("age % 7 = 1", "% CAST(7 AS BIGINT)"),
    ("age % -3 = 1", "% CAST(-3 AS BIGINT)"),
    ("left(url, 2) = 'ab'", "LEFT(url, 2)"),
    ("right(url, 3) = 'abc'", "RIGHT(LEFT(url, 1024), 3)"),
])
def test_literal_counts_and_divisors_are_kept(where: str, spelled: str) -> None:
    """The typer spells a literal divisor as ``CAST(7 AS BIGINT)`` and a literal count as a clamped
    ``LEAST(GREATEST(CAST(2 AS BIGINT), ..), ..)``: both are constants the lowering reads (they were
    refused as "% on DOUBLE or FLOAT" and "a count that is not a positive literal")."""
    sql = spark_sql(f"SELECT COUNT(*) FROM events WHERE {where}")
    assert spelled.replace(" ", "").lower() in sql.replace(" ", "").replace("`", "").lower(), sql


@pytest.mark.parametrize("where", ["amount % 7 = 1", "left(url, 0) = ''", "left(url, -2) = 'a'",
                                   "right(url, age) = 'a'"])
def test_other_divisors_and_counts_are_still_refused(where: str) -> None:
    with pytest.raises(UnsupportedQueryError, match="Spark"):
        spark_sql(f"SELECT COUNT(*) FROM events WHERE {where}")


def test_text_of_a_value_that_is_no_date_or_timestamp_is_spark_own() -> None:
    """A conversion to text whose operand is known to be no DATE or TIMESTAMP (the typer's source type, or
    dpsql's own sums, counts and lengths) is Spark's plain CAST: DuckDB's spelling of dates
    (``spark_text_as_duckdb``) repeats its operand about 20 times, which only made the plan larger."""
    total = spark_sql("SELECT SUM(amount) AS s FROM events")  # the exact fixed-point total, as text
    assert "TYPEOF(" not in total.upper() and "AS STRING)" in total.upper()
    from dpsql.plan.typer import CAST_FROM

    def text_of(source: str | None, operand: exp.Expression | None = None) -> str:
        cast = exp.Cast(this=operand or exp.column("x"), to=exp.DataType.build("VARCHAR"))
        if source is not None:
            cast.meta[CAST_FROM] = source
        return render(lower_for_spark(exp.select(cast).from_("t")), dialect="spark").upper()

    for source in ("BIGINT", "DECIMAL(9,2)", "VARCHAR", "BOOLEAN"):
        assert text_of(source) == "SELECT CAST(X AS STRING) FROM T", source
    assert "TYPEOF(" not in text_of(None, exp.func("length", exp.column("x")))
    # negative controls: a DATE's or TIMESTAMP's text, or one of unknown type, keeps DuckDB's spelling of dates
    for source in ("DATE", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", None):
        assert "TYPEOF(" in text_of(source) and "(BC)" in text_of(source), source
    day = spark_sql("SELECT CAST(day AS VARCHAR) AS d, COUNT(*) FROM events GROUP BY d")
    assert "TYPEOF(" in day.upper() and "(BC)" in day


def test_a_key_converted_to_text_holds_its_spelling_once_per_read() -> None:
    """A released key ``CAST(x AS VARCHAR)`` is made text again as a canonical key (under ``COLLATE``, which
    only text takes): that outer conversion is Spark's plain CAST, so DuckDB's spelling of a DATE (``TYPEOF``,
    operand repeated about 20 times) or of a DOUBLE (about 3 kB of SQL) is in the query once per read of the key,
    not about 20 times over (a DOUBLE key was 320 kB of Spark SQL, which Spark took over 40 s to parse)."""
    day = spark_sql("SELECT CAST(day AS VARCHAR) AS d, COUNT(*) FROM events GROUP BY d").upper()
    assert 0 < day.count("TYPEOF(") <= 16 and "(BC)" in day, day.count("TYPEOF(")
    amount = spark_sql("SELECT CAST(amount AS VARCHAR) AS d, COUNT(*) FROM events GROUP BY d").upper()
    assert "TYPEOF(" not in amount and 0 < amount.count("__T IS NULL") <= 8, amount.count("__T IS NULL")
    assert len(day) < 20_000 and len(amount) < 30_000, (len(day), len(amount))


def test_a_text_key_is_salted_as_spark_text_without_the_date_spelling() -> None:
    """The spread of a text key (``dpsql.rewrite.bound.spread_input``: the salt followed by the key's text) knows
    the key's type, so its Spark form is the plain conversion: no DuckDB spelling of dates (``TYPEOF``)."""
    assert "TYPEOF(" not in spark_sql("SELECT url, COUNT(*) FROM events GROUP BY url").upper()
    assert "TYPEOF(" not in spark_sql("SELECT url, COUNT(DISTINCT url) AS d FROM events GROUP BY url").upper()
    # negative control: a DATE key converted to text by the query keeps DuckDB's spelling
    assert "TYPEOF(" in spark_sql("SELECT CAST(day AS VARCHAR) AS d, COUNT(*) FROM events GROUP BY d").upper()


def test_a_join_tuple_identity_converts_columns_of_known_type_plainly() -> None:
    """The identity of a join's tuple (``dpsql.rewrite.joins._with_tid``) writes each projected column as text
    and the tuple's number among equal tuples: where the column's type is known and has one plain text (integers,
    text, decimals; the number is a BIGINT), its Spark form is the plain conversion, not DuckDB's spelling of dates
    (``TYPEOF``, operand repeated about 20 times). The DuckDB SQL is the same either way."""
    from dpsql.rewrite.joins import _with_tid

    q = exp.select("a", "b", "c").from_("t")

    def tid(types: dict[str, str] | None, dialect: str = "spark") -> str:
        ast = _with_tid(q.copy(), types=types)
        return render(lower_for_spark(ast) if dialect == "spark" else ast, dialect=dialect).upper()

    plain = tid({"a": "BIGINT", "b": "VARCHAR", "c": "DECIMAL(9,2)"})
    assert "TYPEOF(" not in plain and "(BC)" not in plain
    assert tid({"a": "BIGINT", "b": "VARCHAR", "c": "DECIMAL(9,2)"}, "duckdb") == tid(None, "duckdb")
    # negative controls: a DATE or TIMESTAMP column, one of unknown type, and a DOUBLE (whose text is written as
    # before) keep the spelling for that column only
    for typ in ("DATE", "TIMESTAMP", "DOUBLE", None):
        mixed = tid({"a": "BIGINT", "b": "VARCHAR"} | ({"c": typ} if typ else {}))
        assert "TYPEOF(__T.C)" in mixed.replace("`", "") and "TYPEOF(__T.A)" not in mixed.replace("`", ""), typ


def _domain_sql(n: int, sql: str, column: str, values: list[object], caps: Caps) -> str:
    spec = TableSpec(name="events", source="<arrow>", source_kind="arrow", privacy_unit="user_id",
                     schema={**SCHEMA, "ts": "TIMESTAMP", "dec": "DECIMAL(9,2)"},
                     columns={"amount": ColumnSpec("amount", bounds=(0.0, 100.0)),
                              column: ColumnSpec(column, domain=tuple(values[:n]))})
    ast = bounded_query(analyze(sql, {"events": spec}), caps, salt="s", unit_column="user_id", ops=SparkOps())
    return render(lower_for_spark(ast), dialect="spark")


@pytest.mark.parametrize("sql, column, values, caps", [
    ("SELECT url, COUNT(*) FROM events GROUP BY url", "url", [f"https://x/{i}" for i in range(20_000)],
     Caps(2, 2, 5)),                                                   # the domain on the (unit, group) pairs
    ("SELECT age, SUM(amount) FROM events GROUP BY age", "age", list(range(20_000)), Caps(2, 2, 5)),
    ("SELECT url, MEDIAN(amount) FROM events GROUP BY url", "url", [f"u{i}" for i in range(20_000)],
     Caps(2, 2)),                                                      # the domain on the rows (quantiles)
    # dates, timestamps and DECIMALs: a view too (their values as text, cast by Spark to the column's type)
    ("SELECT day, COUNT(*) FROM events GROUP BY day", "day",
     [dt.date(1970, 1, 1) + dt.timedelta(days=i) for i in range(20_000)], Caps(2, 2, 5)),
    ("SELECT ts, SUM(amount) FROM events GROUP BY ts", "ts",
     [dt.datetime(2024, 3, 1, 12, 30, 0, 7) + dt.timedelta(hours=i) for i in range(20_000)], Caps(2, 2, 5)),
    ("SELECT dec, MEDIAN(amount) FROM events GROUP BY dec", "dec",
     [Decimal(i).scaleb(-2) - 100 for i in range(20_000)], Caps(2, 2)),
])
def test_a_long_declared_domain_is_no_part_of_the_spark_sql(sql, column, values, caps) -> None:
    """A GROUP BY over a long public domain: Spark's SQL names one relation of the domain (registered by the
    backend for the query) instead of one literal per value, so its text does not grow with the domain (100 000
    inlined keys were about 1.3 MB of SQL, analysed and planned by Spark on every bind and run)."""
    short, long = _domain_sql(1000, sql, column, values, caps), _domain_sql(20_000, sql, column, values, caps)
    assert len(long) == len(short) < 6000
    assert str(values[999]) not in long and "__dpsql_domain" in long
    # control: below the threshold (from the domain's length only) the literals are inlined as before
    inlined = _domain_sql(999, sql, column, values, caps)
    assert str(values[998]) in inlined and "__dpsql_domain" not in inlined
