"""Privacy budgets: an (epsilon, delta) value type with exact comparison.

The one rounding rule (written down here and nowhere else)
---------------------------------------------------------
Budgets are entered as floats (``0.1``), and binary floats cannot represent most decimals,
so ten charges of 0.1 would not add up to 1.0 in float arithmetic. dpsql therefore reads
every float as the *shortest decimal that round-trips to it* (Python's ``repr``), i.e. as
the number the user typed, and does all sums and comparisons on those decimals with exact
rational arithmetic (``fractions.Fraction``). No tolerance is involved anywhere: two budgets
are equal iff their decimals are equal, and ``spent + request <= total`` is decided exactly.

Mechanisms work with binary floats: the epsilon and delta a mechanism calibrates its noise with are
the largest floats whose exact binary values are at most the recorded decimals
(:func:`calibration_value`), and a cost a mechanism composes of several parts is summed exactly and
rounded up, then recorded as a float whose decimal is at least that binary sum (:func:`recorded`).
Both conversions happen in one place, where a request's budget enters the mechanisms and where its
cost leaves them (``dpsql.mechanisms.base.Request.asking``, ``dpsql.mechanisms.registry``). So the
noise is never calibrated for more than the ledger records.

Composition here is basic (sequential) composition: epsilons add and deltas add. Every
charge keeps its mechanism parameters in the ledger, so a tighter accountant can be
added later without changing what was recorded.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Clamped, Context, Decimal, Inexact, Overflow, Rounded, Underflow
from fractions import Fraction
from typing import Any

from dpsql.errors import ConfigError

#: the one spelling of a number typed as text (CLI flags, config values, strings handed to the API):
#: ASCII digits, an optional sign, point and exponent, nothing around it. Python's float() reads far
#: more ('1_0' as 10, ' 1', full-width and other Unicode digits, 'infinity'): a slip for 1.0 must not
#: spend ten times the budget, so text is judged by this rule before float() sees it
_PLAIN_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: how the accepted form is named in every refusal
PLAIN_FORM = "plain decimal or scientific notation (e.g. 10, 0.5, 1e-6)"


def is_plain_number(text: str) -> bool:
    """Whether ``text`` is a number in plain decimal or scientific notation (see ``_PLAIN_NUMBER``)."""
    return _PLAIN_NUMBER.fullmatch(text) is not None


def plain_float(value: Any, what: str, hint: str | None = None) -> Any:
    """``value`` itself, except that a string in plain notation is its float, and a string that only
    float() reads as a number ('1_0', ' 1', '１', 'infinity') is a ConfigError naming ``what`` and the
    accepted form. Other text is returned as it is, for the caller's own refusal of a non-number."""
    if not isinstance(value, str):
        return value
    if is_plain_number(value):
        return float(value)
    try:
        float(value)
    except ValueError:
        return value
    raise ConfigError(f"{what} must be a number in {PLAIN_FORM}, got {value!r}", hint=hint)


def is_boolean(x: object) -> bool:
    """Whether ``x`` is a truth value rather than a number: Python's bool, or NumPy's (``np.True_``, a 0-d
    boolean array, a 0-d array of objects holding one), which is no ``bool`` and which float() reads as 1.0 or 0.0. A slip of a boolean for a
    budget must not spend a whole unit of epsilon (nor read as delta = 0), so every budget refuses both."""
    if isinstance(x, bool):
        return True
    dtype = getattr(x, "dtype", None)
    if getattr(dtype, "kind", None) == "O" and getattr(x, "ndim", None) == 0:  # a 0-d array of objects: its one object
        return is_boolean(x.item())  # type: ignore[attr-defined]
    return getattr(dtype, "kind", None) == "b"


def exact(x: float | int | str | Fraction) -> Fraction:
    """The exact rational value of a privacy parameter under the rounding rule above."""
    if isinstance(x, Fraction):
        return x
    if is_boolean(x):
        raise ConfigError(f"privacy parameter must be a number, got {x!r}")
    if isinstance(x, int):
        return Fraction(x)
    if isinstance(x, str):
        return Fraction(x)
    return Fraction(repr(float(x)))


def check_epsilon(epsilon: object, *, name: str = "epsilon", allow_zero: bool = False) -> float:
    """Validate an epsilon: finite, positive (or zero when allowed)."""
    epsilon = plain_float(epsilon, name, hint=f"pass {name}=1.0")
    try:
        e = float(epsilon)  # type: ignore[arg-type]
    except OverflowError:
        e = math.inf
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {epsilon!r}", hint=f"pass {name}=1.0") from None
    if is_boolean(epsilon) or math.isnan(e) or math.isinf(e) or e < 0 or (e == 0 and not allow_zero):
        raise ConfigError(
            f"{name} must be a finite number {'>=' if allow_zero else '>'} 0, got {epsilon!r}",
            hint=f"pass a positive {name}, e.g. {name}=1.0",
        )
    return e + 0.0  # -0.0 is zero: recorded and shown as 0.0


def check_delta(delta: object, *, name: str = "delta") -> float:
    """Validate a delta: finite, in [0, 1)."""
    delta = plain_float(delta, name, hint=f"pass {name}=1e-6")
    try:
        d = float(delta)  # type: ignore[arg-type]
    except OverflowError:
        d = math.inf
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {delta!r}", hint=f"pass {name}=1e-6") from None
    if is_boolean(delta) or math.isnan(d) or d < 0 or d >= 1:
        raise ConfigError(
            f"{name} must be a number in [0, 1), got {delta!r}",
            hint=f"use a small {name} such as 1e-6 (well below 1/number_of_people), or 0 for pure DP",
        )
    return d + 0.0  # -0.0 is zero: recorded and shown as 0.0


@dataclass(frozen=True)
class Budget:
    """An (epsilon, delta) privacy budget or cost. Immutable; compared exactly."""

    epsilon: float
    delta: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", check_epsilon(self.epsilon, allow_zero=True))
        object.__setattr__(self, "delta", check_delta(self.delta))

    # exact views -------------------------------------------------------------------
    @property
    def exact_epsilon(self) -> Fraction:
        return exact(self.epsilon)

    @property
    def exact_delta(self) -> Fraction:
        return exact(self.delta)

    @staticmethod
    def from_exact(epsilon: Fraction, delta: Fraction) -> Budget:
        """The Budget of an exact sum of costs: per coordinate the least float whose decimal is at least it,
        so a spent total is never shown below what was spent (:func:`float_at_least`)."""
        return Budget(float_at_least(epsilon), float_at_least(delta))

    # JSON ----------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, float]:
        """``{"epsilon": ..., "delta": ...}``, the JSON form (``json.dumps(cost.to_dict())``; a Release's
        ``meta()`` holds its cost so). JSON writes a float as its shortest round-trip decimal, which is the
        value the ledger records (the rounding rule above), so :meth:`from_dict` gives back an equal Budget."""
        return {"epsilon": self.epsilon, "delta": self.delta}

    @staticmethod
    def from_dict(data: Any) -> Budget:
        """The Budget of a :meth:`to_dict` mapping (e.g. ``json.loads`` of one); ``delta`` may be left out
        (pure DP). Other keys, a missing epsilon or a value that is not a budget are a ConfigError."""
        hint = 'pass {"epsilon": 1.0, "delta": 1e-6} (delta may be left out for pure DP)'
        if not isinstance(data, Mapping):
            raise ConfigError(f"a budget must be a mapping with an epsilon and a delta, got {data!r}", hint=hint)
        extra = sorted(str(k) for k in data if k not in ("epsilon", "delta"))
        if extra or "epsilon" not in data:
            what = f"unknown key(s) {', '.join(map(repr, extra))}" if extra else "no 'epsilon'"
            raise ConfigError(f"a budget mapping has {what}: {dict(data)!r}", hint=hint)
        return Budget(data["epsilon"], data.get("delta", 0.0))

    # arithmetic (basic composition) ---------------------------------------------------
    def __add__(self, other: Budget) -> Budget:
        if not isinstance(other, Budget):
            return NotImplemented  # Python's TypeError (it was an AttributeError from inside)
        return Budget.from_exact(self.exact_epsilon + other.exact_epsilon, self.exact_delta + other.exact_delta)

    def minus(self, other: Budget) -> Budget:
        """self - other, floored at zero in each coordinate (what is left). Each coordinate is the
        largest float whose decimal is at most the exact difference, so a request of exactly what
        ``minus`` reports always fits (rounding to nearest could report 1.0 left when
        1 - 1e-20 is, and then refuse a request of 1.0)."""
        e = max(Fraction(0), self.exact_epsilon - other.exact_epsilon)
        d = max(Fraction(0), self.exact_delta - other.exact_delta)
        return Budget(float_at_most(e), float_at_most(d))

    def fits_in(self, available: Budget) -> bool:
        """True iff this cost fits in ``available`` in both coordinates, decided exactly."""
        return self.exact_epsilon <= available.exact_epsilon and self.exact_delta <= available.exact_delta

    def __le__(self, other: Budget) -> bool:
        return self.fits_in(other)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Budget):
            return NotImplemented
        return self.exact_epsilon == other.exact_epsilon and self.exact_delta == other.exact_delta

    def __hash__(self) -> int:
        return hash((self.exact_epsilon, self.exact_delta))

    def __repr__(self) -> str:
        return f"Budget(epsilon={self.epsilon!r}, delta={self.delta!r})"

    def __str__(self) -> str:
        return f"(epsilon={self.epsilon:g}, delta={self.delta:g})"


def share_of(total: float, parts: float) -> float:
    """One of ``parts`` equal shares of ``total`` (an epsilon or a delta split for basic composition):
    the largest float x with parts * x <= total as exact binary numbers (``total`` a calibration value,
    :func:`calibration_value`, so the shares add up to at most the recorded decimal). ``total / parts`` rounded to nearest
    can exceed the exact share by half an ulp, so the shares would add up to more than ``total``."""
    n = Fraction(parts)
    t = Fraction(total)
    x = float(total) / float(parts)
    while x > 0 and n * Fraction(x) > t:
        x = math.nextafter(x, 0.0)
    return x


def float_at_most(q: Fraction) -> float:
    """The largest float whose decimal under the rounding rule is <= ``q`` (``q`` >= 0)."""
    f = float(q)
    while f > 0 and exact(f) > q:
        f = math.nextafter(f, 0.0)
    return f


def float_at_least(q: Fraction) -> float:
    """The smallest float whose decimal under the rounding rule is >= ``q``: what a charge made of
    several exact parts is recorded as (rounding to nearest could record less than was spent)."""
    f = float(q)
    while exact(f) < q:
        f = math.nextafter(f, math.inf)
    return f


def binary_at_most(q: Fraction) -> float:
    """The largest float whose exact binary value is <= ``q`` (``q`` >= 0): ``q`` rounded down."""
    f = float(q)
    while f > 0 and Fraction(f) > q:
        f = math.nextafter(f, 0.0)
    return f


def binary_at_least(q: Fraction) -> float:
    """The smallest float whose exact binary value is >= ``q``: ``q`` rounded up (a sum of costs that
    mechanisms compose before the ledger records it, :func:`recorded`)."""
    f = float(q)
    while Fraction(f) < q:
        f = math.nextafter(f, math.inf)
    return f


def calibration_value(x: float) -> float:
    """The number a mechanism calibrates with for a requested epsilon or delta ``x``: the largest float
    whose exact binary value is at most ``x``'s decimal (the rounding rule, what the ledger records).

    A float and its decimal differ: 0.1 is the binary 0.1000000000000000055..., above the 0.1 the
    ledger records, so noise calibrated with the float 0.1 is calibrated for up to half an ulp
    (2^-53 relative) more than is charged. Its calibration value is 0.09999999999999999 (the binary
    0.0999999999999999916...). For 0.3 (the binary 0.2999999999999999888...) it is 0.3 itself."""
    return binary_at_most(exact(x))


def recorded(cost: Budget, asked: Budget | None) -> Budget:
    """What the ledger records for a mechanism's ``cost``, whose floats are exact binary numbers (the
    values it calibrated with and composed exactly). Per coordinate, with c the :func:`calibration_value`
    of the analyst's ``asked`` value a:

    * a cost of c: a itself (the charge is what was asked for);
    * a cost x above c (a Gaussian release's delta plus its sampler's floating-point part): the smallest
      float whose decimal is at least a + (x - c), the decimal asked for plus the exact excess;
    * any other cost (below c, or without a request): the smallest float whose decimal is at least x.

    Each recorded decimal is at least the binary cost the mechanism spent (a >= c)."""
    def one(x: float, want: float | None) -> float:
        if want is None:
            return float_at_least(Fraction(x))
        c = calibration_value(want)
        if x == c:
            return want
        if x > c:
            return float_at_least(exact(want) + Fraction(x) - Fraction(c))
        return float_at_least(Fraction(x))

    return Budget(one(cost.epsilon, asked.epsilon if asked else None), one(cost.delta, asked.delta if asked else None))


def _exact_sums(costs: Iterable[Budget]) -> tuple[Fraction, Fraction]:
    """Exact sums of the epsilons and of the deltas. Equal floats have one decimal (the rounding
    rule), so each distinct value is converted once and multiplied by how often it occurs: the
    same exact result as adding one by one, in time linear in the number of costs with a small
    constant (a ledger holds many charges of few distinct sizes)."""
    counts = Counter((c.epsilon, c.delta) for c in costs)
    return _exact_counted_sums((Budget(eps, delta), n) for (eps, delta), n in counts.items())


#: Decimal arithmetic that is exact or raises: every rounding is trapped. The decimals of doubles
#: span from about 1e-343 to 2e308, times a count: well under the 4000 digits allowed.
_EXACT = Context(prec=4000, Emax=10**6, Emin=-(10**6), traps=[Inexact, Rounded, Overflow, Underflow, Clamped])


def _exact_counted_sums(counted: Iterable[tuple[Budget, int]]) -> tuple[Fraction, Fraction]:
    """The exact sums (rounding rule above). Added as decimals, which is what the rule makes of
    them: one ``Fraction`` addition per distinct cost normalised each partial sum with a gcd of
    ever larger numbers (about 75 us per distinct cost: 4 s at 50 000 distinct epsilons, inside
    the ledger's exclusive lock), a decimal addition takes about a microsecond. The counts are first
    merged per coordinate, so a value that recurs in one coordinate (the same delta under many
    epsilons) is converted once: equal floats have one decimal (0.0 and -0.0 both read as zero)."""
    eps: dict[float, int] = {}
    deltas: dict[float, int] = {}
    for cost, n in counted:
        eps[cost.epsilon] = eps.get(cost.epsilon, 0) + n
        deltas[cost.delta] = deltas.get(cost.delta, 0) + n
    e = Decimal(0)
    for x, n in eps.items():
        e = _EXACT.fma(Decimal(repr(x)), n, e)
    d = Decimal(0)
    for x, n in deltas.items():
        d = _EXACT.fma(Decimal(repr(x)), n, d)
    return Fraction(e), Fraction(d)


def compose(costs: Iterable[Budget]) -> Budget:
    """Basic sequential composition, exact."""
    return Budget.from_exact(*_exact_sums(costs))


def compose_counted(counted: Iterable[tuple[Budget, int]]) -> Budget:
    """:func:`compose` of costs given as (cost, how many times), e.g. grouped by the ledger's SQL."""
    return Budget.from_exact(*_exact_counted_sums(counted))


def exact_sum_fits(spent: Iterable[Budget], request: Budget, total: Budget) -> bool:
    """spent + request <= total, decided exactly under the rounding rule."""
    return _fits(_exact_sums(spent), request, total)


def exact_counted_sum_fits(counted: Iterable[tuple[Budget, int]], request: Budget, total: Budget) -> bool:
    """:func:`exact_sum_fits` of costs given as (cost, how many times)."""
    return _fits(_exact_counted_sums(counted), request, total)


def counted_remaining(counted: Iterable[tuple[Budget, int]], total: Budget) -> Budget:
    """``total`` minus the exact sum of costs given as (cost, how many times), floored at zero; each
    coordinate the largest float whose decimal is at most the exact remainder, so a request of
    exactly what it reports always fits (see :meth:`Budget.minus`)."""
    e, d = _exact_counted_sums(counted)
    return Budget(float_at_most(max(Fraction(0), total.exact_epsilon - e)),
                  float_at_most(max(Fraction(0), total.exact_delta - d)))


def _fits(sums: tuple[Fraction, Fraction], request: Budget, total: Budget) -> bool:
    e, d = sums
    e += request.exact_epsilon
    d += request.exact_delta
    return e <= total.exact_epsilon and d <= total.exact_delta
