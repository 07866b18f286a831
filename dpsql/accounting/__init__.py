"""dpsql.accounting — privacy accounting and calibration.

Modules (each docstring states its formulas, sources and numerics):

* :mod:`.gaussian` — exact Gaussian privacy profile δ_G(ε; μ) in log space and its inverses
  (``docs/mechanisms.md`` §1.2; section numbers below refer to that file).
* :mod:`.sparse_histogram` — exact δ(ε) of the Gaussian sparse histogram mechanism (Wilkins et al.
  Theorem 5.4, §1.5), the add-the-deltas bound (§1.3) and the least noisy threshold (§1.8).
* :mod:`.calibration` — choosing σ and τ* for a target (ε, δ), with extra aggregate columns.
* :mod:`.s4s` — DP-S4S accounting (Lemmas 3.1/3.2, 3.5, 4.1, 4.2, Algorithm 2 schedule) and R2T (§3).
* :mod:`.conversions` — pure/zCDP/RDP → (ε, δ) conversions, Laplace and Gaussian helpers (§4).
* :mod:`.discrete_gaussian` — discrete Gaussian pmf/moments and its exact 1-D profile (§5).

Every function validates its inputs and raises :class:`dpsql.errors.ConfigError` (naming the
parameter, with a hint) on NaN, infinities, out-of-range or non-integer values. ``Budget`` and
``compose`` (exact basic composition) are re-exported from :mod:`dpsql.budget`.
"""

from typing import TYPE_CHECKING, Any

from dpsql.budget import Budget, compose

if TYPE_CHECKING:
    from dpsql.accounting.calibration import (
        SparseHistogramCalibration,
        calibrate_sparse_histogram,
        calibrate_sparse_histogram_fixed,
    )
    from dpsql.accounting.conversions import (
        gaussian_rdp,
        gaussian_zcdp,
        laplace_scale,
        pure_to_rdp,
        pure_to_zcdp,
        rdp_delta,
        rdp_to_dp,
        zcdp_delta,
        zcdp_optimal_alpha,
        zcdp_to_dp,
    )
    from dpsql.accounting.discrete_gaussian import (
        discrete_gaussian_delta,
        discrete_gaussian_normaliser,
        discrete_gaussian_pmf,
        discrete_gaussian_variance,
        discrete_laplace_pmf,
    )
    from dpsql.accounting.gaussian import (
        DELTA_EVAL_MARGIN,
        gaussian_delta,
        gaussian_epsilon,
        gaussian_mu,
        gaussian_sigma,
        log_gaussian_delta,
    )
    from dpsql.accounting.s4s import (
        R2TStep,
        S4SBudgetStep,
        S4SVectorEpsilon,
        r2t_schedule,
        s4s_budget_schedule,
        s4s_epsilon_prime,
        s4s_eta,
        s4s_find_alpha,
        s4s_gamma,
        s4s_gamma_eta,
        s4s_joint_epsilon,
        s4s_joint_rdp,
        s4s_rdp_prime,
        s4s_rdp_ss_roots,
        s4s_smooth_sensitivity,
        s4s_smooth_sensitivity_bound,
        s4s_tau_grid,
        s4s_variance_divergence_term,
        s4s_vector_epsilon,
        s4s_vector_epsilon_parts,
        s4s_vector_joint_epsilon,
    )
    from dpsql.accounting.sparse_histogram import (
        SparseHistogramDelta,
        add_the_deltas_delta,
        round_tau_star_up,
        sparse_histogram_delta,
        sparse_histogram_delta_detail,
        sparse_histogram_min_tau_star,
        sparse_histogram_tau_star_lower_bound,
    )

#: the submodule of each public name: loaded on first use, so that a query imports only the
#: accounting it needs (the Gaussian mechanism's calibration loads neither DP-S4S's nor the sparse
#: histogram's)
_SUBMODULE = {name: module for module, names in {
    "calibration": (
        "SparseHistogramCalibration", "calibrate_sparse_histogram",
        "calibrate_sparse_histogram_fixed",
    ),
    "conversions": (
        "gaussian_rdp", "gaussian_zcdp", "laplace_scale", "pure_to_rdp", "pure_to_zcdp",
        "rdp_delta", "rdp_to_dp", "zcdp_delta", "zcdp_optimal_alpha", "zcdp_to_dp",
    ),
    "discrete_gaussian": (
        "discrete_gaussian_delta", "discrete_gaussian_normaliser", "discrete_gaussian_pmf",
        "discrete_gaussian_variance", "discrete_laplace_pmf",
    ),
    "gaussian": (
        "DELTA_EVAL_MARGIN", "gaussian_delta", "gaussian_epsilon", "gaussian_mu", "gaussian_sigma",
        "log_gaussian_delta",
    ),
    "s4s": (
        "R2TStep", "S4SBudgetStep", "S4SVectorEpsilon", "r2t_schedule", "s4s_budget_schedule",
        "s4s_epsilon_prime", "s4s_eta", "s4s_find_alpha", "s4s_gamma", "s4s_gamma_eta",
        "s4s_joint_epsilon", "s4s_joint_rdp", "s4s_rdp_prime", "s4s_rdp_ss_roots",
        "s4s_smooth_sensitivity", "s4s_smooth_sensitivity_bound", "s4s_tau_grid",
        "s4s_variance_divergence_term", "s4s_vector_epsilon", "s4s_vector_epsilon_parts",
        "s4s_vector_joint_epsilon",
    ),
    "sparse_histogram": (
        "SparseHistogramDelta", "add_the_deltas_delta", "round_tau_star_up",
        "sparse_histogram_delta", "sparse_histogram_delta_detail", "sparse_histogram_min_tau_star",
        "sparse_histogram_tau_star_lower_bound",
    ),
}.items() for name in names}

__all__ = [
    # budgets
    "Budget",
    "compose",
    # Gaussian mechanism
    "DELTA_EVAL_MARGIN",
    "gaussian_delta",
    "log_gaussian_delta",
    "gaussian_epsilon",
    "gaussian_mu",
    "gaussian_sigma",
    # sparse histogram
    "SparseHistogramDelta",
    "sparse_histogram_delta",
    "sparse_histogram_delta_detail",
    "add_the_deltas_delta",
    "sparse_histogram_min_tau_star",
    "sparse_histogram_tau_star_lower_bound",
    "round_tau_star_up",
    "SparseHistogramCalibration",
    "calibrate_sparse_histogram",
    "calibrate_sparse_histogram_fixed",
    # DP-S4S / R2T
    "s4s_epsilon_prime",
    "s4s_joint_epsilon",
    "s4s_joint_rdp",
    "s4s_rdp_prime",
    "S4SBudgetStep",
    "s4s_budget_schedule",
    "s4s_tau_grid",
    "s4s_rdp_ss_roots",
    "s4s_gamma",
    "s4s_gamma_eta",
    "s4s_eta",
    "s4s_smooth_sensitivity",
    "s4s_smooth_sensitivity_bound",
    "s4s_variance_divergence_term",
    "S4SVectorEpsilon",
    "s4s_vector_epsilon",
    "s4s_vector_epsilon_parts",
    "s4s_vector_joint_epsilon",
    "s4s_find_alpha",
    "R2TStep",
    "r2t_schedule",
    # conversions
    "pure_to_zcdp",
    "pure_to_rdp",
    "gaussian_zcdp",
    "gaussian_rdp",
    "laplace_scale",
    "rdp_to_dp",
    "rdp_delta",
    "zcdp_to_dp",
    "zcdp_delta",
    "zcdp_optimal_alpha",
    # discrete Gaussian
    "discrete_gaussian_normaliser",
    "discrete_gaussian_variance",
    "discrete_gaussian_pmf",
    "discrete_gaussian_delta",
    "discrete_laplace_pmf",
]


def __getattr__(name: str) -> Any:
    module = _SUBMODULE.get(name)
    if module is None:
        raise AttributeError(f"module 'dpsql.accounting' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"dpsql.accounting.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
