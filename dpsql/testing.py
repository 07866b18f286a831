"""Test helpers. Never used by releases: the public API has no seed.

``seeded_noise(seed)`` gives a reproducible noise source (fixed-seed statistical tests);
``zero_noise()`` gives a source whose Gaussian and Laplace samples are exactly 0 (goldens); its
snapping mechanism only clamps (no noise, no grid), so goldens pin the bounded true values (an exact
sum: its correctly rounded double). It is
not a private mechanism.
"""

from __future__ import annotations

import hashlib
import sys

import numpy as np

from dpsql.engine.duckdb_ops import DuckDBOps, SaltedDuckDBOps
from dpsql.noise import NoiseSource


class SeededNoise(NoiseSource):
    """Reproducible noise for statistical tests (bits from numpy's PCG64)."""

    def __init__(self, seed: int | str) -> None:
        if isinstance(seed, str):
            seed = int.from_bytes(hashlib.sha256(seed.encode()).digest()[:8], "little")
        self._gen = np.random.Generator(np.random.PCG64(seed))
        self._salt_counter = 0
        self._seed = seed

    def _random_bytes(self, n: int) -> bytes:
        return self._gen.bytes(n)

    def _words(self, n: int) -> np.ndarray:
        # the same words as from _random_bytes(8 * n) (PCG64's 64-bit outputs, little-endian), without
        # the detour through 32-bit draws and bytes
        if sys.byteorder != "little":  # pragma: no cover
            return super()._words(n)
        return self._gen.bit_generator.random_raw(n) if n else np.zeros(0, np.uint64)

    def salt(self) -> str:
        self._salt_counter += 1
        return hashlib.sha256(f"{self._seed}:{self._salt_counter}".encode()).hexdigest()[:32]


class ZeroNoise(SeededNoise):
    """Noise that is exactly zero: goldens pin bounded true aggregates and thresholds."""

    zero_noise = True

    def __init__(self, seed: int | str = 0) -> None:
        super().__init__(seed)

    def normal(self, scale, size):  # type: ignore[no-untyped-def]
        shape = (size,) if isinstance(size, int) else tuple(size)
        return np.zeros(shape)

    def laplace(self, scale, size):  # type: ignore[no-untyped-def]
        shape = (size,) if isinstance(size, int) else tuple(size)
        return np.zeros(shape)

    def snap_laplace(self, values, lam, grid, bound):  # type: ignore[no-untyped-def]
        return np.clip(np.asarray(values, dtype=np.float64), -np.asarray(bound), np.asarray(bound))


def seeded_noise(seed: int | str) -> SeededNoise:
    return SeededNoise(seed)


def zero_noise(seed: int | str = 0) -> ZeroNoise:
    return ZeroNoise(seed)


def use_noise(session: object, source: NoiseSource) -> None:
    """Make ``session`` draw its noise (and salts) from ``source``. Tests only.

    Reproducible noise makes every bounding choice reproducible too: a DuckDB engine's row
    choices (k = 1: the salted race over counted values; k > 1 and L: the salted numbering) are
    then made from the salt instead of a fresh ``RANDOM()`` per row (``SaltedDuckDBOps``), so a
    seed fixes the whole release."""
    if not isinstance(source, NoiseSource):
        raise TypeError("source must be a NoiseSource")
    session._noise = source  # type: ignore[attr-defined]
    engine = getattr(session, "_engine", None)
    if isinstance(getattr(engine, "ops", None), DuckDBOps) and engine.ops.row_clock() is not None:  # type: ignore[union-attr]
        engine.ops = SaltedDuckDBOps()  # type: ignore[union-attr]
