"""The RDP schedule of DP-S4S delivers at most the ε it is charged, in exact arithmetic.

The schedule is (α, ρ)-RDP and converted to (ε, δ − δ_fp)-DP by ε = ρ + ln(1 − 1/α) − (ln δ′ + ln α)/(α − 1)
(CKS / Balle et al.). Here that ε is recomputed to 80 digits (``decimal``) from what the releases actually
use: for q = 1 the noise scales σ_i themselves (run i is (α, α(min(τ_i, Δ) + G_i)²/(2σ_i²))-RDP), for
q < 1 the schedule's own joint bound ``rho_joint``; and δ′ = δ − δ_fp exactly. A conversion evaluated in
floating point and compared with ε by ``<=`` lets the delivered ε exceed the charged one by an ulp.
"""

from __future__ import annotations

from decimal import Context, Decimal
from fractions import Fraction

import pytest

from dpsql.mechanisms import _s4s_truncation as trunc
from dpsql.mechanisms.s4s import s4s_rdp_schedule

CTX = Context(prec=80)


def _dec(x: Fraction) -> Decimal:
    return CTX.divide(Decimal(x.numerator), Decimal(x.denominator))


def _delivered_epsilon(sch: object, delta: float, max_tuples: int, q: float) -> Decimal:
    a = Fraction(sch.alpha)  # type: ignore[attr-defined]
    if q == 1.0:
        rho = sum(
            (a * (Fraction(min(s.tau, max_tuples)) + Fraction(trunc.gap_bound(s.tau))) ** 2 / (2 * Fraction(s.sigma) ** 2)
             for s in sch.steps),  # type: ignore[attr-defined]
            Fraction(0),
        )
    else:
        rho = Fraction(sch.rho_joint)  # type: ignore[attr-defined]
    d_rdp = Fraction(delta) - Fraction(sch.fp_delta)  # type: ignore[attr-defined]
    ad = _dec(a)
    return (_dec(rho) + CTX.ln(_dec(1 - 1 / a))
            - CTX.divide(CTX.ln(_dec(d_rdp)) + CTX.ln(ad), _dec(a - 1)))


# cases where a floating-point conversion put the delivered ε 1e-16 (relative) above the ε asked for
@pytest.mark.parametrize(
    ("epsilon", "delta", "max_tuples", "q"),
    [
        (4.0, 1e-7, 64, 1.0),
        (4.0, 1e-7, 1, 1.0),
        (8.0, 1e-5, 1024, 1.0),
        (0.1, 1e-9, 5000, 0.1),
        (0.1, 1e-5, 1024, 0.1),
    ],
)
def test_rdp_schedule_never_delivers_more_than_the_epsilon_charged(
    epsilon: float, delta: float, max_tuples: int, q: float
) -> None:
    sch = s4s_rdp_schedule(epsilon, delta, max_tuples, q, 0.1)
    delivered = _delivered_epsilon(sch, delta, max_tuples, q)
    assert delivered <= Decimal(epsilon), f"delivered epsilon {delivered} > charged {epsilon}"
    assert Decimal(sch.epsilon_spent) >= delivered  # the reported epsilon_spent bounds it too
    # and the margin costs nothing visible: the delivered epsilon is within 1e-9 of the budget's use
    assert delivered > Decimal(epsilon) * Decimal("0.5")


def test_negative_control_float_conversion_is_caught() -> None:
    """The recomputation notices one ulp: the same check on ε one ulp smaller than charged fails."""
    import math

    sch = s4s_rdp_schedule(4.0, 1e-7, 64, 1.0, 0.1)
    delivered = _delivered_epsilon(sch, 1e-7, 64, 1.0)
    assert delivered > Decimal(math.nextafter(4.0, 0.0)) - Decimal("1e-12")


def _exact_joint_epsilon(epsilon: float, q: float, max_tuples: int) -> Decimal:
    """ε* = ln(1 + q′(e^ε − 1)), q′ = 1 − (1 − q)^Δ, to 80 digits from the float inputs."""
    qp = 1 - (1 - Fraction(q)) ** max_tuples
    em1 = CTX.exp(Decimal(epsilon)) - 1
    return CTX.ln(1 + _dec(qp) * em1)


# the charge of the sampled vector path (Algorithm 5, "Joint accounting"); its float evaluation
# ln((1 − q′) + q′e^ε) lost ~1e-13 of ε* to cancellation when q′(e^ε − 1) is small
@pytest.mark.parametrize(
    ("epsilon", "q", "max_tuples"),
    [(0.01, 0.015625, 1), (0.01, 0.0009765625, 2), (0.01, 0.0625, 1), (0.1, 0.25, 64), (4.0, 0.0625, 1), (1.0, 0.5, 1024)],
)
def test_vector_joint_epsilon_charged_is_at_least_the_proven_one(epsilon: float, q: float, max_tuples: int) -> None:
    from dpsql.accounting import s4s_vector_joint_epsilon

    charged = s4s_vector_joint_epsilon(epsilon, q, max_tuples)
    exact = min(_exact_joint_epsilon(epsilon, q, max_tuples), Decimal(epsilon))
    assert Decimal(charged) >= exact
    assert Decimal(charged) <= exact * (1 + Decimal("1e-12"))  # and no more than a rounding above it


# Algorithm 5 on a fixed sample composes the SVT (ε₁) and the release ((α, ρ)-RDP ⇒ (ε₂, δ_A), Mironov's
# conversion ε₂ = ρ + ln(1/δ_A)/(α − 1)); at q = 1 the charge is ε itself, so ε₁ + ε₂ must not exceed ε.
# 0.1ε + 0.9ε rounds above ε for about 60% of ε (e.g. 0.3, 1.1, 4.7).
@pytest.mark.parametrize("epsilon", [0.3, 1.1, 4.7, 1.0, 4.0, 7.3])
@pytest.mark.parametrize("q", [1.0, 0.0625])
def test_vector_fixed_sample_split_stays_within_epsilon(epsilon: float, q: float) -> None:
    from dpsql.mechanisms.s4s_vector import vector_params

    vp = vector_params(epsilon, 1e-6, 3, q, 16)
    assert Fraction(vp.eps1) + Fraction(vp.eps2) <= Fraction(epsilon)
    a = Fraction(vp.alpha)
    eps2_delivered = _dec(Fraction(vp.rho)) + CTX.divide(-CTX.ln(_dec(Fraction(vp.delta_alg))), _dec(a - 1))
    assert eps2_delivered <= _dec(Fraction(vp.eps2))
