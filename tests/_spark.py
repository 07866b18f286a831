"""The Spark engine's tests need the 'spark' extra and Java 17: ``require_spark()`` at a test module's top
skips the module without them, or fails it under ``DPSQL_REQUIRE_EXTRAS=1`` (CI, where they must run)."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest


def require_spark() -> None:
    why = ("the Spark engine needs the 'spark' extra: pip install 'dpsql[spark]'"
           if importlib.util.find_spec("pyspark") is None else
           "the Spark engine needs Java 17 on the PATH" if shutil.which("java") is None else None)
    if why is not None:
        if os.environ.get("DPSQL_REQUIRE_EXTRAS") == "1":
            raise RuntimeError(why + " (DPSQL_REQUIRE_EXTRAS=1: these tests must run here)")
        pytest.skip(why, allow_module_level=True)
