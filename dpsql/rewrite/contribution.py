"""The contribution model: how much one privacy unit may contribute to a bounded query.

This is the one place the caps are defined; every mechanism's sensitivity follows from them,
and ``dpsql.rewrite.bound`` enforces them with composable steps in SQL.

Neighbouring relation: add or remove one privacy unit (for example one user) together with
all of its rows. A *group* is one combination of GROUP BY key values (a scalar query has one).

``max_groups_per_unit`` (C_u)
    A unit contributes to at most C_u groups: per unit, C_u of its groups are kept, chosen
    uniformly at random (a keyed hash of (unit, group) under a per-query secret salt); its rows
    in the other groups are dropped. Removing a unit changes at most C_u groups (L0 <= C_u).
``max_rows_per_group`` (k)
    In each group, a unit contributes at most k rows: per (unit, group), k rows are kept, a
    uniform random subset (keyed hash of (unit, group, the row's number by value)). In one
    group, removing a unit changes a row count by <= k, a SUM of values clamped to [lo, hi] by
    <= k * max(|lo|, |hi|), an AVG's centred sum (values minus (lo + hi) / 2) by
    <= k * (hi - lo) / 2, a centred sum of squares (VARIANCE / STDDEV) by <= k * ((hi - lo) / 2)^2
    (the half-width r = (hi - lo) / 2 as the engine computes it: the largest |fl(lo or hi - midpoint)|,
    ``dpsql.rewrite.bound.released_columns``),
    the number of distinct values of a column among the kept rows (COUNT(DISTINCT col)) by <= k
    (its k kept rows hold at most k values; the others' values stay counted), and the
    distinct-unit count by <= 1.
``max_rows_per_unit`` (L)
    Over the whole query, a unit contributes at most L rows (a uniform random subset, keyed hash
    of (unit, the row's number by value)), whatever the groups. Removing a unit changes a
    histogram of row counts by <= L in L1 norm (the range-workload mechanism, DAWA, uses L
    alone); combined with the others, at most min(C_u, L) groups change, each by at most
    min(k, L) rows.

Each may be ``math.inf`` (that cap is not enforced). With every cap infinite the bounded query
returns exactly the original aggregates. Implied sensitivities of a row count (one unit):

* per group (L-inf): ``min(k, L)`` -- :attr:`ContributionModel.rows_per_group_bound`;
* groups changed (L0): ``min(C_u, L)`` -- :attr:`ContributionModel.groups_bound`;
* all groups together (L1): ``min(C_u * k, L)`` -- :attr:`ContributionModel.rows_bound`;
* L2: at most ``sqrt(min(C_u, L)) * min(k, L)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ContributionModel:
    """The caps on one unit's contribution (see the module docstring for what each means).

    Positional order ``(C_u, k)`` with L optional: ``ContributionModel(2, 3)`` is C_u = 2,
    k = 3, L = inf. Also known as ``Caps``.
    """

    max_groups_per_unit: float
    max_rows_per_group: float
    max_rows_per_unit: float = math.inf

    def __post_init__(self) -> None:
        for name in ("max_groups_per_unit", "max_rows_per_group", "max_rows_per_unit"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v >= 1:
                raise ValueError(f"{name} must be a number >= 1 or math.inf, got {v!r}")

    @property
    def groups_finite(self) -> bool:
        """Whether C_u is enforced."""
        return not math.isinf(self.max_groups_per_unit)

    @property
    def rows_finite(self) -> bool:
        """Whether k is enforced."""
        return not math.isinf(self.max_rows_per_group)

    @property
    def unit_rows_finite(self) -> bool:
        """Whether L is enforced."""
        return not math.isinf(self.max_rows_per_unit)

    @property
    def rows_per_group_bound(self) -> float:
        """Rows one unit can add to one group: min(k, L)."""
        return min(self.max_rows_per_group, self.max_rows_per_unit)

    @property
    def groups_bound(self) -> float:
        """Groups one unit can change: min(C_u, L)."""
        return min(self.max_groups_per_unit, self.max_rows_per_unit)

    @property
    def rows_bound(self) -> float:
        """Rows one unit can add over all groups: min(C_u * k, L)."""
        return min(self.max_groups_per_unit * self.max_rows_per_group, self.max_rows_per_unit)


#: the name mechanism code knows the contribution model by
Caps = ContributionModel
