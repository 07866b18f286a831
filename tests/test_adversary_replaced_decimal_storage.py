"""A Parquet source whose file is replaced after registration by one storing a DECIMAL in a way no reader reads
totally (variable-length BINARY, as parquet-avro writes it) keeps the same Arrow schema: the check before every
charge must refuse it as registration does, whatever the rows (one person's 17-byte value made pyarrow's reader
raise after the charge). The files are written through parquet-mr (``tests/_parquet_forge.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _parquet_forge import forge, stored
from _spark import require_spark

import dpsql
from dpsql.errors import ConfigError
from dpsql.testing import use_noise, zero_noise

require_spark()

N = 6


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    s = dpsql.Session(budget=dpsql.Budget(1e6, 0.5), engine={"kind": "spark"})
    yield s._engine.spark
    s.close()


def _schema(storage: str) -> str:
    return f"message m {{ required int32 uid; optional {storage} a (DECIMAL(38,0)); }}"


@pytest.mark.parametrize("engine", [{}, {"invalid_text": "replace"}])
@pytest.mark.parametrize("hostile", [False, True])
def test_a_file_replaced_by_one_storing_a_decimal_as_binary_is_refused_before_the_charge(
        spark: Any, tmp_path: Path, hostile: bool, engine: dict[str, str]) -> None:
    path = tmp_path / "t.parquet"
    forge(spark, str(path), _schema("fixed_len_byte_array(16)"), [{"uid": i, "a": stored(i, 16)} for i in range(N)])
    s = dpsql.Session(budget=dpsql.Budget(100.0, 0.5), engine=engine)
    use_noise(s, zero_noise(1))
    s.register("t", str(path), privacy_unit="uid")
    sql = "SELECT COUNT(*) AS n FROM t WHERE a IS NOT NULL"
    assert s.query(sql, epsilon=0.1).table.to_pylist() == [{"n": N}]
    # the same declared column, now variable-length BINARY; the hostile person's value holds 17 bytes
    rows = [{"uid": i, "a": stored(i, 1)} for i in range(N)] + ([{"uid": N, "a": stored(2**130, 17)}] if hostile else [])
    new = tmp_path / "new.parquet"
    forge(spark, str(new), _schema("binary"), rows)
    new.replace(path)
    left = s.remaining()
    with pytest.raises(ConfigError, match=r"(?s)table 't'.*nothing was charged"):
        s.query(sql, epsilon=1.0)
    assert s.remaining() == left
    # registration refuses it too
    with pytest.raises(ConfigError, match="variable-length BINARY"):
        s.register("t2", str(path), privacy_unit="uid")
    s.close()
