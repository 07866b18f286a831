"""Every building-block class declares how its hashes read a key's salted text (``docs/threat_model.md``):
``keyed_hash_is_digest`` and ``text_digest`` have no default (``dpsql.engine.base.check_declarations``), so
a backend that forgets them is refused when its class is created, never silently taken to hash the salted
text as it is (DuckDB's own string hash keeps crafted keys to 8 values under any salt prefix)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from sqlglot import exp

from dpsql.engine.base import DeclaredOps, SqlOps, text_digest_of
from dpsql.engine.duckdb_ops import DuckDBOps, SaltedDuckDBOps
from dpsql.engine.portable import PortableDuckDBOps
from dpsql.engine.spark_ops import SparkOps
from dpsql.rewrite.bound import keyed_digest


def _md5(text: exp.Expression) -> exp.Expression:
    return exp.func("md5_number", text)


def test_a_class_without_the_declarations_is_refused_at_creation() -> None:
    with pytest.raises(TypeError, match="do not declare keyed_hash_is_digest, text_digest"):
        class Bare(DeclaredOps):
            dialect = "duckdb"

    with pytest.raises(TypeError, match="do not declare text_digest"):
        class OnlyDigestFlag(DeclaredOps):
            dialect = "duckdb"
            keyed_hash_is_digest = True


def test_the_engines_own_hash_needs_a_digest() -> None:
    with pytest.raises(TypeError, match="needs a text_digest"):
        class NoDigest(DeclaredOps):
            dialect = "duckdb"
            keyed_hash_is_digest = False
            text_digest = None

    with pytest.raises(TypeError, match="must be True or False"):
        class Truthy(DeclaredOps):
            dialect = "duckdb"
            keyed_hash_is_digest = 1
            text_digest = None


def test_a_subclass_that_changes_the_hash_restates_the_declarations() -> None:
    with pytest.raises(TypeError, match="define keyed_hash but do not declare keyed_hash_is_digest"):
        class OtherHash(DuckDBOps):
            def keyed_hash(self, columns: Sequence[str], salt: str) -> exp.Expression:
                return exp.func("hash", *[exp.column(c) for c in columns])

    with pytest.raises(TypeError, match="define spread_hash but do not declare text_digest"):
        class OtherSpread(DuckDBOps):
            def spread_hash(self, values: Sequence[exp.Expression], salt: str) -> exp.Expression:
                return exp.func("hash", *values)

    class Restated(DuckDBOps):  # a subclass that restates them is accepted
        keyed_hash_is_digest = False
        text_digest = staticmethod(_md5)

        def keyed_hash(self, columns: Sequence[str], salt: str) -> exp.Expression:
            return exp.func("hash", *[exp.column(c) for c in columns])

    assert keyed_digest(Restated()) is not None  # type: ignore[arg-type]


def test_a_subclass_that_changes_the_keyed_draws_restates_the_declaration() -> None:
    """The exponential race reads a key's salted text through ``exponential_clock`` (``keyed_uniform``), digested
    or not as ``keyed_hash_is_digest`` says: a subclass of the SHA-256 building blocks that draws them from the
    engine's own hash instead cannot inherit its parent's True."""
    for method in ("keyed_uniform", "exponential_clock"):
        with pytest.raises(TypeError, match=f"define {method} but do not declare keyed_hash_is_digest"):
            type("EngineDraws", (PortableDuckDBOps,), {method: getattr(DuckDBOps, method)})


def test_undeclared_duck_typed_ops_are_refused_not_taken_as_digests() -> None:
    class Duck:  # not a DeclaredOps: read strictly, never defaulted to "no digest"
        dialect = "duckdb"

    with pytest.raises(TypeError, match="do not declare keyed_hash_is_digest"):
        keyed_digest(Duck())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="do not declare"):
        text_digest_of(Duck())


def test_the_backends_declarations() -> None:
    for cls in (DuckDBOps, SaltedDuckDBOps, PortableDuckDBOps, SparkOps):
        assert isinstance(cls(), SqlOps)
    text = exp.Literal.string("salted")
    # DuckDB's own hash reads salted text through MD5_NUMBER, in the keyed hash and in its hash tables
    for ops in (DuckDBOps(), SaltedDuckDBOps()):
        assert keyed_digest(ops) is not None and "MD5_NUMBER" in keyed_digest(ops)(text).sql("duckdb").upper()  # type: ignore[misc]
    # the portable keyed hash is SHA-256 (reads the text as it is); its hash tables are DuckDB's (MD5_NUMBER)
    assert keyed_digest(PortableDuckDBOps()) is None
    assert text_digest_of(PortableDuckDBOps()) is not None
    # Spark's keyed hash is SHA-256 too; its own hashes (hash sets, xxhash64 spreads) read md5 of the salted text
    spark_digest = text_digest_of(SparkOps())
    assert keyed_digest(SparkOps()) is None and spark_digest is not None
    assert spark_digest(text).sql("spark").upper() == "MD5('SALTED')"
