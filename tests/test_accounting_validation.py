"""Every accounting function rejects bad inputs with a ConfigError that names the parameter."""

from __future__ import annotations

import math

import numpy as np
import pytest

import dpsql.accounting as acc
from dpsql.errors import ConfigError

NAN, INF = math.nan, math.inf
NOT_A_NUMBER = ["x", None, True]
BAD_DELTA = [0.0, 1.0, 1.5, -1e-6, NAN, INF, *NOT_A_NUMBER]
BAD_EPS_TARGET = [-0.1, NAN, INF, -INF, *NOT_A_NUMBER]
BAD_POSITIVE = [0.0, -1.0, NAN, INF, *NOT_A_NUMBER]
BAD_COUNT = [0, -3, 2.5, NAN, INF, *NOT_A_NUMBER]
BAD_Q = [0.0, -0.1, 1.0001, NAN, INF, *NOT_A_NUMBER]
BAD_ALPHA = [1.0, 0.5, -2.0, NAN, INF, *NOT_A_NUMBER]

SH = dict(sigma=5.0, tau=1, tau_star=30.0, max_groups=10, mu_other=0.0)
MT = dict(sigma=50.0, tau=1, max_groups=10, mu_other=0.0, method="exact")

# (callable, valid positional args, valid keyword args, {parameter: bad values})
CASES = [
    (
        acc.gaussian_delta,
        (1.0, 0.5),
        {},
        {"epsilon": [NAN, INF, -INF, "x", None], "mu": [-0.1, NAN, INF, "x"]},
    ),
    (acc.log_gaussian_delta, (1.0, 0.5), {}, {"epsilon": [NAN, INF], "mu": [-1.0, NAN]}),
    (acc.gaussian_epsilon, (1e-5, 0.5), {}, {"delta": BAD_DELTA, "mu": [-0.1, NAN, INF, "x", True]}),
    (acc.gaussian_mu, (1.0, 1e-5), {}, {"epsilon": BAD_EPS_TARGET, "delta": BAD_DELTA}),
    (
        acc.gaussian_sigma,
        (1.0, 1e-5),
        {"sensitivity": 1.0},
        {"epsilon": BAD_EPS_TARGET, "delta": BAD_DELTA, "sensitivity": BAD_POSITIVE},
    ),
    (
        acc.sparse_histogram_delta,
        (1.0,),
        SH,
        {
            "epsilon": BAD_EPS_TARGET,
            "sigma": BAD_POSITIVE,
            "tau": [0, 1.5, -1, NAN, INF, "x", True],
            "tau_star": [NAN, INF, -INF, "x", None],
            "max_groups": BAD_COUNT,
            "mu_other": [-0.1, NAN, INF, "x"],
        },
    ),
    (
        acc.add_the_deltas_delta,
        (1.0,),
        SH,
        {"epsilon": BAD_EPS_TARGET, "sigma": BAD_POSITIVE, "max_groups": BAD_COUNT, "tau_star": [NAN]},
    ),
    (acc.sparse_histogram_delta_detail, (1.0,), SH, {"tau": [0, 2.5], "max_groups": [0, 1.5]}),
    (
        acc.sparse_histogram_min_tau_star,
        (1.0, 1e-6),
        MT,
        {
            "epsilon": BAD_EPS_TARGET,
            "delta": BAD_DELTA,
            "sigma": BAD_POSITIVE,
            "tau": [0, 1.5, NAN],
            "max_groups": BAD_COUNT,
            "mu_other": [-1.0, NAN],
            "method": ["fast", None, 3],
        },
    ),
    (
        acc.sparse_histogram_tau_star_lower_bound,
        (1e-6,),
        dict(sigma=5.0, tau=1, max_groups=10),
        {"delta": BAD_DELTA, "sigma": BAD_POSITIVE, "max_groups": BAD_COUNT},
    ),
    (
        acc.round_tau_star_up,
        (3.2,),
        {"granularity": 1.0},
        {"tau_star": [NAN, INF], "granularity": BAD_POSITIVE},
    ),
    (
        acc.calibrate_sparse_histogram,
        (1.0, 1e-6),
        dict(tau=1, max_groups=10),
        {
            "epsilon": BAD_EPS_TARGET,
            "delta": BAD_DELTA,
            "tau": [0, 2.5],
            "max_groups": BAD_COUNT,
            "extra_sensitivities": [(1.0, 0.0), (-1.0,), (NAN,), "ab", 5.0],
            "method": ["bogus"],
            "release_probability": [0.4, 1.0, NAN, "x"],
            "extra_noise_multiplier": BAD_POSITIVE,
        },
    ),
    (
        acc.calibrate_sparse_histogram_fixed,
        (1.0, 1e-6),
        dict(tau=1, max_groups=10, sigma=50.0),
        {
            "sigma": [0.0, -1.0, NAN, INF, "x", True],
            "delta": BAD_DELTA,
            "max_groups": BAD_COUNT,
        },  # None = "free"
    ),
    (
        acc.calibrate_sparse_histogram_fixed,
        (1.0, 1e-6),
        dict(tau=1, max_groups=10, tau_star=400.0),
        {"tau_star": [NAN, INF, "x"]},
    ),
    (
        acc.s4s_epsilon_prime,
        (1.0, 4, 100, 0.1),
        {},
        {"epsilon": BAD_EPS_TARGET, "tau": BAD_POSITIVE, "max_tuples": BAD_COUNT, "q": BAD_Q},
    ),
    (
        acc.s4s_rdp_prime,
        (8.0, 0.5, 4, 100, 0.1),
        {},
        {
            "alpha": BAD_ALPHA,
            "rho": [-0.1, NAN, INF],
            "tau": BAD_POSITIVE,
            "max_tuples": BAD_COUNT,
            "q": BAD_Q,
        },
    ),
    (
        acc.s4s_joint_epsilon,
        ([0.1, 0.05], [1.0, 2.0], 100, 0.1),
        {},
        {"laplace_rates": [[-0.1, 0.1], [NAN, 0.1], "x"], "taus": [[0.0, 1.0], [NAN, 1.0], "x"],
         "max_tuples": BAD_COUNT, "q": BAD_Q},
    ),
    (
        acc.s4s_joint_rdp,
        (8.0, [0.1, 0.05], [1.0, 2.0], 100, 0.1),
        {},
        {"alpha": BAD_ALPHA, "rhos": [[-0.1, 0.1], "x"], "taus": [[0.0, 1.0], "x"], "max_tuples": BAD_COUNT,
         "q": BAD_Q},
    ),
    (
        acc.s4s_budget_schedule,
        (1.0, 1024, 0.1),
        {"beta": 0.1},
        {"epsilon": BAD_POSITIVE, "max_tuples": BAD_COUNT, "q": BAD_Q, "beta": [0.0, 1.0, NAN]},
    ),
    (acc.s4s_rdp_ss_roots, (20.0, 0.4, 10), {}, {"alpha": BAD_ALPHA, "rho": BAD_POSITIVE, "d": BAD_COUNT}),
    (acc.s4s_gamma, (20.0, 0.4, 10), {}, {"alpha": BAD_ALPHA, "rho": BAD_POSITIVE, "d": BAD_COUNT}),
    (acc.s4s_eta, (20.0, 0.4, 10), {"form": "paper"}, {"alpha": BAD_ALPHA, "form": ["sqrt", None]}),
    (acc.s4s_smooth_sensitivity, (1.0, 0.02), {}, {"bound": [-1.0, NAN, INF], "gamma": BAD_POSITIVE}),
    (acc.s4s_smooth_sensitivity_bound, (1.0, 0.02), {}, {"bound": [-1.0, NAN], "gamma": BAD_POSITIVE}),
    (
        acc.s4s_variance_divergence_term,
        (20.0, 1.01, 10),
        {},
        {"alpha": BAD_ALPHA, "variance_ratio": [*BAD_POSITIVE, 0.5], "d": BAD_COUNT},
    ),
    (
        acc.s4s_vector_epsilon,
        (4.0, 1e-7, 20.0, 0.25, 100),
        {},
        {
            "epsilon": BAD_POSITIVE,
            "delta": BAD_DELTA,
            "alpha": [*BAD_ALPHA, 2.0],  # 2 is a valid order but too small for Algorithm 5 at this (ε, δ)
            "q": BAD_Q,
            "max_tuples": BAD_COUNT,
        },
    ),
    (acc.s4s_vector_epsilon_parts, (4.0, 1e-7, 20.0, 0.25, 100), {}, {"alpha": [1.0, 5.0]}),
    (acc.s4s_find_alpha, (3.2, 1e-7, 10), {}, {"epsilon2": BAD_POSITIVE, "delta": BAD_DELTA, "d": BAD_COUNT}),
    (
        acc.r2t_schedule,
        (1.0, 1024),
        {"beta": 0.1},
        {"epsilon": BAD_POSITIVE, "global_sensitivity": [1.0, 0.0, NAN, INF, "x"], "beta": [0.0, 1.0]},
    ),
    (acc.pure_to_zcdp, (1.0,), {}, {"epsilon": BAD_EPS_TARGET}),
    (acc.pure_to_rdp, (2.0, 1.0), {}, {"alpha": BAD_ALPHA, "epsilon": BAD_EPS_TARGET}),
    (acc.gaussian_zcdp, (2.0,), {"sensitivity": 1.0}, {"sigma": BAD_POSITIVE, "sensitivity": BAD_POSITIVE}),
    (acc.gaussian_rdp, (2.0, 2.0), {}, {"alpha": BAD_ALPHA, "sigma": BAD_POSITIVE}),
    (acc.laplace_scale, (1.0,), {"sensitivity": 1.0}, {"epsilon": BAD_POSITIVE, "sensitivity": BAD_POSITIVE}),
    (
        acc.rdp_to_dp,
        (8.0, 0.5, 1e-6),
        {"method": "cks"},
        {"alpha": BAD_ALPHA, "rho": [-0.5, NAN, INF], "delta": BAD_DELTA, "method": ["classic", "x"]},
    ),
    (acc.rdp_delta, (8.0, 0.5, 1.0), {}, {"alpha": BAD_ALPHA, "rho": [-0.5, NAN], "epsilon": BAD_EPS_TARGET}),
    (
        acc.zcdp_to_dp,
        (0.5, 1e-6),
        {"method": "cks"},
        {"rho": [-0.5, NAN, INF, "x"], "delta": BAD_DELTA, "method": ["mironov2", None]},
    ),
    (acc.zcdp_delta, (0.5, 1.0), {}, {"rho": [-0.5, NAN], "epsilon": BAD_EPS_TARGET}),
    (
        acc.zcdp_optimal_alpha,
        (0.5, 1e-6),
        {"method": "cks"},
        {"rho": BAD_POSITIVE, "delta": BAD_DELTA, "method": ["x"]},
    ),
    (acc.discrete_gaussian_normaliser, (1.0,), {}, {"sigma": [*BAD_POSITIVE, 1e7]}),
    (acc.discrete_gaussian_variance, (1.0,), {}, {"sigma": BAD_POSITIVE}),
    (acc.discrete_gaussian_pmf, (1, 1.0), {}, {"x": [0.5, NAN, "x"], "sigma": BAD_POSITIVE}),
    (
        acc.discrete_gaussian_delta,
        (1.0, 2.0),
        {"sensitivity": 1},
        {"epsilon": BAD_EPS_TARGET, "sigma": BAD_POSITIVE, "sensitivity": [0, 1.5, -1, NAN]},
    ),
    (acc.discrete_laplace_pmf, (1, 2.0), {}, {"x": [0.5, INF], "t": BAD_POSITIVE}),
]


def _param_names(fn) -> list[str]:
    import inspect

    return list(inspect.signature(fn).parameters)


def _expand():
    for fn, args, kwargs, bad in CASES:
        for param, values in bad.items():
            yield pytest.param(fn, args, kwargs, param, values, id=f"{fn.__name__}-{param}")


@pytest.mark.parametrize("fn,args,kwargs,param,values", list(_expand()))
def test_bad_input_raises_config_error_naming_the_parameter(fn, args, kwargs, param, values):
    names = _param_names(fn)
    idx = names.index(param)
    for value in values:
        call_args = list(args)
        call_kwargs = dict(kwargs)
        if idx < len(call_args):
            call_args[idx] = value
        else:
            call_kwargs[param] = value
        with pytest.raises(ConfigError) as ei:
            fn(*call_args, **call_kwargs)
        msg = str(ei.value)
        assert param in msg, (value, msg)
        assert ei.value.hint, f"every accounting ConfigError carries a hint ({param}={value!r})"


@pytest.mark.parametrize("fn,args,kwargs", [(fn, a, k) for fn, a, k, _ in CASES])
def test_valid_baseline_calls_succeed(fn, args, kwargs):
    # guards the table above: the baseline arguments are valid, so each failure is due to the bad value
    fn(*args, **kwargs)


def test_array_inputs_are_validated_elementwise():
    with pytest.raises(ConfigError, match="epsilon"):
        acc.gaussian_delta(np.array([0.1, np.nan]), 1.0)
    with pytest.raises(ConfigError, match="mu"):
        acc.gaussian_delta(0.1, np.array([1.0, -1.0]))


def test_infeasible_requests_raise_config_error():
    # delta too small for any σ to help at this ε is impossible (σ → ∞ always works), but a fixed σ can be
    with pytest.raises(ConfigError, match="too small"):
        acc.calibrate_sparse_histogram_fixed(1.0, 1e-6, sigma=1.0, max_groups=10)
    with pytest.raises(ConfigError, match="tau_star"):
        acc.calibrate_sparse_histogram_fixed(1.0, 1e-6, tau_star=2.0, max_groups=10)


def test_config_error_is_a_value_error():
    with pytest.raises(ValueError):
        acc.gaussian_sigma(1.0, 0.0)
