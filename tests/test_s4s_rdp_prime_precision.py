"""Lemma 3.5's amplified RDP ρ′ (:func:`dpsql.accounting.s4s_rdp_prime`) is an upper bound to the last digits.

ρ′ = ln(Σ_k p_k e^{x_k})/(α − 1) with Σ_k p_k = 1: where the x_k are small the sum is 1 + (something tiny),
and a log-sum-exp of the terms loses that tiny part to the rounding of 1 (ρ′ = 2.4413839e-11 for 2.4414063e-11
at α = 1.5, ρ = 1e-4, τ = 64, Δ = 1, q = 0.001: 9.2e-6 too small). The reference is the lemma's sum in
60-digit arithmetic.
"""

from __future__ import annotations

import itertools

import mpmath as mp
import pytest

from dpsql.accounting.s4s import s4s_rdp_prime


def _reference(alpha: float, rho: float, tau: float, n: int, q: float, gap: float = 0.0) -> mp.mpf:
    with mp.workdps(60):
        a, r, t, qq, g = (mp.mpf(x) for x in (alpha, rho, tau, q, gap))
        top = int(mp.floor(t))
        pk = [mp.binomial(n, k) * qq**k * (1 - qq) ** (n - k) for k in range(n + 1)]
        s = sum(pk[k] * mp.exp((a - 1) * r * ((k + g) / (t + g)) ** 2) for k in range(min(top, n) + 1))
        s += sum(pk[top + 1:], mp.mpf(0)) * mp.exp((a - 1) * r)
        return mp.log(s) / (a - 1)


CASES = list(itertools.product([1.0625, 1.5, 4.0, 200.0], [1e-6, 1e-4, 0.05, 1.0, 10.0], [1.0, 4.0, 64.0],
                               [1, 7, 256], [0.001, 0.1, 0.7]))


@pytest.mark.parametrize("alpha, rho, tau, n, q", CASES)
def test_rdp_prime_is_an_upper_bound_to_the_last_digits(alpha: float, rho: float, tau: float, n: int, q: float) -> None:
    got = s4s_rdp_prime(alpha, rho, tau, n, q)
    ref = _reference(alpha, rho, tau, n, q)
    assert got >= ref * (1 - mp.mpf("1e-14")), (got, mp.nstr(ref, 20))
    assert got <= ref * (1 + mp.mpf("1e-12")) + mp.mpf("1e-300")  # and still tight


def test_rdp_prime_with_a_gap_and_q_one() -> None:
    for args in [(1.5, 1e-4, 64.0, 7, 0.001, 0.25), (3.0, 0.01, 4.0, 256, 0.01, 1.0), (2.0, 1e-5, 16.0, 64, 1.0, 0.0)]:
        got = s4s_rdp_prime(*args[:5], gap=args[5])
        ref = _reference(*args)
        assert ref * (1 - mp.mpf("1e-14")) <= got <= ref * (1 + mp.mpf("1e-12")), (args, got, mp.nstr(ref, 20))


def _joint_reference(alpha: float, rhos: list[float], taus: list[float], n: int, q: float) -> mp.mpf:
    with mp.workdps(60):
        a, qq = mp.mpf(alpha), mp.mpf(q)

        def h(k: int) -> mp.mpf:
            return sum(((a - 1) * mp.mpf(r) * (mp.mpf(min(t, k)) / mp.mpf(t)) ** 2 for r, t in zip(rhos, taus, strict=True)),
                       mp.mpf(0))

        s = sum(mp.binomial(n, k) * qq**k * (1 - qq) ** (n - k) * mp.exp(h(k)) for k in range(n + 1))
        return mp.log(s) / (a - 1)


@pytest.mark.parametrize("alpha, rho, n, q", list(itertools.product([1.0625, 2.0, 30.0], [1e-6, 1e-3, 0.5],
                                                                    [1, 9, 300], [0.001, 0.2])))
def test_joint_rdp_is_an_upper_bound_to_the_last_digits(alpha: float, rho: float, n: int, q: float) -> None:
    from dpsql.accounting.s4s import s4s_joint_rdp

    rhos, taus = [rho, rho / 2, rho / 3], [64.0, 8.0, 1.0]
    got = s4s_joint_rdp(alpha, rhos, taus, n, q)
    ref = _joint_reference(alpha, rhos, taus, n, q)
    assert ref * (1 - mp.mpf("1e-14")) <= got <= ref * (1 + mp.mpf("1e-12")) + mp.mpf("1e-300"), (got, mp.nstr(ref, 20))
