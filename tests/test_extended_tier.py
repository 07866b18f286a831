"""The default run leaves out only the tests that ``tests/conftest.py``'s EXTENDED names (``--extended`` runs them):
every key names a test file, or a test of a file, that exists, so no entry silently stops matching (or matches
more than it says) when a test is renamed."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import EXTENDED

HERE = Path(__file__).resolve().parent


def test_every_extended_key_names_an_existing_file_or_test() -> None:
    for key in EXTENDED:
        file, _, test = key.partition("::")
        assert (HERE / file).is_file(), key
        if test:
            name = re.match(r"\w+", test)
            assert name is not None and f"def {name.group(0)}(" in (HERE / file).read_text(), key


def test_every_extended_entry_says_what_the_default_run_keeps_of_its_property() -> None:
    assert all(isinstance(v, str) and len(v) > 20 for v in EXTENDED.values())
    # the Spark core stays in the default run
    for kept in ("test_spark.py", "test_backend_ops.py", "test_spark_lowering.py", "test_spark_functions.py"):
        assert not any(k.startswith(kept) for k in EXTENDED), kept
