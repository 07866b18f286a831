"""Key sets over declared public domains: ``SELECT educ FROM t GROUP BY educ`` (or ``SELECT
DISTINCT educ FROM t``) where every key column has a domain declared by the data owner.

Privacy claim
-------------
The answer is the product of the declared domains, whatever the data: it is a function of
public metadata only (the catalog), so it reads no private row, is 0-differentially private
for any neighbouring relation, and is charged nothing. Sensitivity: 0. Calibration: none.

The analyst may be surprised that values absent from the data are listed; that is the point:
which values occur is private, the declared domain is not. ``explain`` and the ledger row say
so (mechanism ``public_domain``, cost (0, 0)). The conditions of the WHERE (its AND-ed parts) that
read key columns only filter the domain: they are evaluated on the declared values, which are
public (``dpsql.plan.analyze``: ``WHERE country = 'US'`` lists 'US' alone). A condition reading any
other column cannot filter it without reading rows, so every declared value it might admit is
listed (stated in the notes). HAVING, ORDER BY and LIMIT run over it as post-processing.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pyarrow as pa
from sqlglot import exp

from dpsql.budget import Budget
from dpsql.engine.base import SqlOps
from dpsql.mechanisms.base import Description, MechanismName, Released, Request
from dpsql.mechanisms.basic import _column_arrow_type, _exact_integers
from dpsql.plan import ir
from dpsql.rewrite.bound import Caps


@dataclass
class DomainCalibration:
    plan: ir.QueryPlan

    @property
    def size(self) -> int:
        n = 1
        for k in self.plan.keys:
            n *= len(k.domain or ())
        return n


def domain_table(plan: ir.QueryPlan) -> pa.Table:
    """Every combination of the declared key domains, in the order of the declarations, typed as
    the key columns (a DECIMAL(4,1) domain is DECIMAL(4,1), not the narrowest type of its values)."""
    combos = list(itertools.product(*[k.domain or () for k in plan.keys]))
    cols: dict[str, pa.Array] = {}
    for i, k in enumerate(plan.keys):
        vals = [c[i] for c in combos]
        try:
            arr = pa.array(vals)
        except OverflowError:  # integers beyond BIGINT (a UBIGINT or HUGEINT domain): exact decimals, cast below
            arr = pa.array(_exact_integers(vals))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            arr = pa.array([str(v) for v in vals])
        target = _column_arrow_type(plan, k)
        if target is not None and arr.type != target:
            try:
                arr = arr.cast(target)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                pass
        cols[k.name] = arr
    return pa.table(cols)


class PublicDomain:
    """GROUP BY with no aggregate over keys whose domains are all declared: free."""

    name = MechanismName.PUBLIC_DOMAIN
    options: frozenset[str] = frozenset()

    def calibrate(self, request: Request, contribution: Caps) -> DomainCalibration:
        assert request.plan is not None and request.plan.public_keys and not request.plan.aggregates
        return DomainCalibration(request.plan)

    def describe(self, cal: DomainCalibration) -> Description:
        notes = [
            "every key column has a domain declared public by the data owner: the answer is that domain ("
            f"{cal.size} combination(s) declared), read from the catalog, not from the data; nothing is charged",
        ]
        if cal.plan.where is not None:
            notes.append("the WHERE's conditions on the key columns alone filter the declared values (public); a "
                         "condition reading any other column cannot filter them without reading private rows, so every "
                         "declared value it might admit is listed")
        return Description(label=MechanismName.PUBLIC_DOMAIN.value, cost=Budget(0.0, 0.0),
                           parameters={"sensitivity": 0, "domain_size": cal.size, "reads_rows": False,
                                       "keys": [k.sql for k in cal.plan.keys]},
                           notes=tuple(notes))

    def bounded(self, cal: DomainCalibration, salt: str, ops: SqlOps) -> exp.Expression | None:
        return None  # no private row is read

    def released_types(self, cal: DomainCalibration) -> dict[str, str]:
        return {}

    def key_domain(self, cal: DomainCalibration) -> pa.Table | None:
        return domain_table(cal.plan)

    def release(self, cal: DomainCalibration, bounded: pa.Table | None, rng: object) -> Released:
        return Released(table=domain_table(cal.plan), accuracy={})
