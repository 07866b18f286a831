"""The one source of randomness for releases.

``NoiseSource`` draws its uniform bits straight from the operating system's entropy pool
(``os.urandom``), 8 bytes per variate, and turns them into Gaussian and Laplace samples by
vectorised inverse-CDF transforms (numpy/scipy), so there is no seedable PRNG state in a
release at all. The continuous accounting of ``dpsql.accounting`` applies to these samples;
every released noisy value is afterwards rounded to a declared granularity
(:func:`round_to_granularity`), which is post-processing and keeps float sample bits out of
the output.

Tests obtain a seeded or a zero-noise source only through ``dpsql.testing``; the public API
has no ``seed=``.
"""

from __future__ import annotations

import math
import os
import secrets

import numpy as np
from scipy import special

_TWO_POW_M53 = 2.0**-53


class NoiseSource:
    """Vectorised noise drawn from OS entropy."""

    #: True only for test sources whose noise is identically zero.
    zero_noise = False

    def _random_bytes(self, n: int) -> bytes:
        return os.urandom(n)

    def uniform_open(self, size: int | tuple[int, ...]) -> np.ndarray:
        """Uniform variates on the open interval (0, 1), 53 random bits each."""
        shape = (size,) if isinstance(size, int) else tuple(size)
        n = int(np.prod(shape)) if shape else 1
        raw = np.frombuffer(self._random_bytes(8 * n), dtype=np.uint64)
        # top 53 bits -> k in [0, 2^53); (k + 0.5) / 2^53 is in (0, 1) strictly
        k = (raw >> np.uint64(11)).astype(np.float64)
        return ((k + 0.5) * _TWO_POW_M53).reshape(shape)

    def normal(self, scale: float | np.ndarray, size: int | tuple[int, ...]) -> np.ndarray:
        """N(0, scale^2) samples."""
        u = self.uniform_open(size)
        return np.asarray(scale, dtype=np.float64) * special.ndtri(u)

    def laplace(self, scale: float | np.ndarray, size: int | tuple[int, ...]) -> np.ndarray:
        """Laplace(0, scale) samples (density exp(-|z|/scale) / (2 scale))."""
        u = self.uniform_open(size) - 0.5
        # inverse CDF: -b * sign(u) * log(1 - 2|u|), with log1p for accuracy
        return -np.asarray(scale, dtype=np.float64) * np.sign(u) * np.log1p(-2.0 * np.abs(u))

    def salt(self) -> str:
        """A per-query secret salt (hex) for hash-based random choices inside DuckDB."""
        return secrets.token_hex(16)



def round_to_granularity(values: np.ndarray, granularity: float) -> np.ndarray:
    """Round released noisy values to a multiple of ``granularity`` (1 for counts)."""
    if granularity <= 0:
        raise ValueError("granularity must be > 0")
    v = np.asarray(values, dtype=np.float64)
    if granularity == 1:
        return np.rint(v)
    out = np.rint(v / granularity) * granularity
    k = math.log10(granularity)
    if k < 0 and abs(k - round(k)) < 1e-9:
        # a decimal grid: also drop binary representation noise (0.30000000000000004 -> 0.3)
        out = np.round(out, int(-round(k)))
    return out


def default_noise_source() -> NoiseSource:
    return NoiseSource()
