"""What a query returns (Release) and what explain returns (Plan)."""

from __future__ import annotations

import decimal
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from dpsql.budget import Budget


@dataclass
class Release:
    """A differentially private answer.

    ``table``: the released rows (noisy values only). ``cost``: the budget charged.
    ``mechanism``: which mechanism produced it. ``accuracy``: per released column, the noise
    standard deviation and a 95% interval half-width around the *bounded* true value (the value
    after per-user contribution bounding). ``ledger_id``: the ledger entry of the charge.
    ``reused``: True when answered for free from an earlier release (post-processing).
    ``details``: the mechanism's public parameters (as in explain and the ledger row);
    ``notes``: what the release means (thresholds, bounding), in words. ``warnings``: what the
    released values themselves show that a reader could misread (e.g. a MIN above its MAX), from
    the released values and public settings only, about the rows returned (after HAVING, ORDER BY
    and LIMIT).
    """

    table: pa.Table
    cost: Budget
    mechanism: str
    accuracy: dict[str, dict[str, Any]]
    ledger_id: int | None
    reused: bool = False
    details: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.mechanism = str(self.mechanism)  # a plain str for every mechanism (not an enum member)

    def to_pylist(self) -> list[dict[str, Any]]:
        return python_rows(self.table)

    def meta(self, remaining: Budget | None = None) -> dict[str, Any]:
        """Everything about this release except its rows, JSON-ready (what ETL jobs record)."""
        out: dict[str, Any] = {
            "mechanism": self.mechanism,
            "cost": self.cost.to_dict(),
            "ledger_id": self.ledger_id,
            "reused": self.reused,
            "columns": self.table.column_names,
            # each column's Arrow type (a JSON or CSV value alone does not say it: "NaN", "2024-01-02", "1.50")
            "column_types": [str(f.type) for f in self.table.schema],
            "accuracy": _json_safe(self.accuracy),
            "parameters": _json_safe(self.details),
            "notes": list(self.notes),
            "warnings": list(self.warnings),
        }
        if remaining is not None:
            if not isinstance(remaining, Budget):
                from dpsql.errors import ConfigError

                raise ConfigError(f"remaining must be a Budget (what Session.remaining() returns) or None, got {remaining!r}",
                                  hint="e.g. r.meta(session.remaining()), or r.meta() without it")
            out["remaining"] = remaining.to_dict()
        return out

    def to_dict(self, remaining: Budget | None = None) -> dict[str, Any]:
        """``{"rows": [...], "meta": {...}}``: the JSON form the CLI prints with ``--format json``."""
        return {"rows": _json_safe(python_rows(temporal_columns_as_text(self.table)), nonfinite_as_text=True),
                "meta": self.meta(remaining)}

    def to_arrow(self, remaining: Budget | None = None) -> pa.Table:
        """The released rows with the meta in the schema metadata (key ``dpsql``), e.g. for Parquet."""
        meta = dict(self.table.schema.metadata or {})
        meta[b"dpsql"] = json.dumps(self.meta(remaining)).encode()
        return self.table.replace_schema_metadata(meta)

    def __repr__(self) -> str:
        return (
            f"Release(mechanism={self.mechanism!r}, rows={self.table.num_rows}, cost={self.cost}, "
            f"ledger_id={self.ledger_id}, reused={self.reused})"
        )


@dataclass
class Plan:
    """The outcome of ``Session.explain``: computed from public metadata only, costs nothing."""

    sql: str
    mechanism: str
    reason: str
    cost: Budget
    parameters: dict[str, Any]
    bounded_sql: str
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.mechanism = str(self.mechanism)

    def __getattr__(self, name: str) -> Any:
        # plan.sigma, plan.tau_star, plan.exact_delta, ... read the parameters
        params = self.__dict__.get("parameters", {})
        if name in params:
            return params[name]
        raise AttributeError(f"Plan has no attribute {name!r} (parameters: {sorted(params)})")

    def to_dict(self) -> dict[str, Any]:
        return {
            "sql": self.sql,
            "mechanism": self.mechanism,
            "reason": self.reason,
            "cost": self.cost.to_dict(),
            "parameters": self.parameters,
            "bounded_sql": self.bounded_sql,
            "notes": self.notes,
        }

    def __str__(self) -> str:
        lines = [
            f"mechanism: {self.mechanism}",
            f"why:       {self.reason}",
            f"cost:      epsilon={self.cost.epsilon:g} delta={self.cost.delta:g}",
            "parameters:",
        ]
        for k, v in self.parameters.items():
            if k in ("scales", "expected_accuracy", "estimates", "release_probability"):
                continue  # internal column names / shown below in words
            lines.append(f"  {k}: {json.dumps(_readable(v), default=str) if isinstance(v, (dict, list)) else _readable(v)}")
        if self.parameters.get("estimates"):
            lines.append(f"estimates: {self.parameters['estimates']}")
        if self.parameters.get("release_probability"):
            probs = ", ".join(f"{n} people: {p:.0%}" for n, p in self.parameters["release_probability"].items())
            lines.append(f"chance that a group is released: {probs}")
        for col, acc in (self.parameters.get("expected_accuracy") or {}).items():
            col = name_text(col)
            if acc.get("noise_std") is not None:
                lines.append(f"expected accuracy of {col}: noise std {acc['noise_std']:.4g}, "
                             f"95% interval +/- {acc['ci95_half_width']:.4g}")
            elif acc.get("note"):
                lines.append(f"expected accuracy of {col}: {acc['note']}")
        for n in self.notes:
            lines.append(f"note: {n}")
        lines.append("bounded SQL:")
        lines.extend("  " + ln for ln in self.bounded_sql.splitlines())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


@dataclass
class WorkloadRelease(Release):
    """The answers to a range workload (``Session.query_many``): one charge for all queries.

    ``table`` has one row per query (``query``, ``count``); indexing or iterating gives a
    one-row Release per query, all pointing at the same ledger entry and the same cost.
    """

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, i: int) -> Release:
        row = self.table.slice(i if i >= 0 else self.table.num_rows + i, 1).select(["count"])
        return Release(
            table=row,
            cost=self.cost,
            mechanism=self.mechanism,
            accuracy=self.accuracy,
            ledger_id=self.ledger_id,
            reused=self.reused,
            details={**self.details, "shared_charge": True, "index": i},
            notes=self.notes,
        )

    def __iter__(self) -> Iterator[Release]:
        for i in range(len(self)):
            yield self[i]

    @property
    def counts(self) -> list[int]:
        return [int(v) for v in self.table.column("count").to_pylist()]


def interval_text(months: int, days: int, nanoseconds: int) -> str:
    """DuckDB's spelling of an interval (its microseconds; a DuckDB interval holds no finer part)."""
    years = int(months / 12)  # toward zero, as DuckDB
    parts = [f"{n} {unit}{'' if abs(n) == 1 else 's'}"
             for n, unit in ((years, "year"), (months - 12 * years, "month"), (days, "day")) if n]
    micros = int(nanoseconds / 1000)
    if micros or not parts:
        h, rest = divmod(abs(micros), 3_600_000_000)
        m, rest = divmod(rest, 60_000_000)
        sec, us = divmod(rest, 1_000_000)
        frac = f".{us:06d}".rstrip("0") if us else ""
        parts.append(f"{'-' if micros < 0 else ''}{h:02d}:{m:02d}:{sec:02d}{frac}")
    return " ".join(parts)


def _json_safe(v: Any, *, nonfinite_as_text: bool = False) -> Any:
    """Plain JSON values: dates and other objects become their ISO text, non-finite floats null (in
    meta and parameters, where null is an unlimited cap) or, with ``nonfinite_as_text`` (released
    rows, where null is SQL NULL), the strings "NaN", "Infinity" and "-Infinity"."""
    if isinstance(v, Budget):  # its exact values (its str shows 6 digits)
        return v.to_dict()
    if isinstance(v, dict):
        return {str(k): _json_safe(x, nonfinite_as_text=nonfinite_as_text) for k, x in v.items()}
    if isinstance(v, pa.MonthDayNano):  # an INTERVAL output: DuckDB's text, not a bare triple
        return interval_text(*v)
    if isinstance(v, (list, tuple)):
        return [_json_safe(x, nonfinite_as_text=nonfinite_as_text) for x in v]
    if isinstance(v, float):
        if math.isfinite(v):
            return v
        return ("NaN" if math.isnan(v) else "Infinity" if v > 0 else "-Infinity") if nonfinite_as_text else None
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, decimal.Decimal):
        return decimal_text(v)
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return str(v)


def name_text(name: str, also: str = "") -> str:
    """A column name as the summaries print it (stderr, explain, tables): as it is when nothing in it could be
    misread, else as a JSON string literal with every unprintable character escaped: ``"a\\nb"``, ``"c: d"``,
    ``" e"`` (and a name holding a character of ``also``, e.g. a space where one ends the name)."""
    if name and name == name.strip(" ") and all(c.isprintable() for c in name) and not any(c in name for c in ':"\\' + also):
        return name
    return "".join(c if c.isprintable() else _escaped(ord(c)) for c in json.dumps(name, ensure_ascii=False))


def _escaped(code: int) -> str:
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # a JSON surrogate pair
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def float_text(v: float) -> str:
    """A double's text in every text output: the shortest that reads back to the same double (``repr``), and
    ``NaN``, ``Infinity``, ``-Infinity`` (which Java, Spark, PostgreSQL, DuckDB and Python all read as doubles)."""
    if math.isfinite(v):
        return repr(v)
    return "NaN" if math.isnan(v) else "Infinity" if v > 0 else "-Infinity"


def temporal_columns_as_text(table: pa.Table) -> pa.Table:
    """``table`` with every DATE, TIME and TIMESTAMP column as its canonical ISO 8601 text, the one spelling of
    the text outputs (CSV, JSON, table): ``2024-01-02``, ``12:30:15.123456`` and ``2024-01-02T00:00:00.000000``,
    with as many fraction digits as the column's unit holds (none for seconds, 3, 6 or 9), and a TIMESTAMPTZ in UTC
    with ``Z``. A year beyond 1..9999 (DuckDB's reach to 294247) is written with all its digits
    (``148108-07-06T14:00:27.387904``, ``-144169-06-28T...``), where Python has no date and Arrow's writers no text."""
    import numpy as np

    for i, f in enumerate(table.schema):
        typ = f.type
        if pa.types.is_time(typ):
            per = {"s": 1, "ms": 10**3, "us": 10**6, "ns": 10**9}[typ.unit]
            raw = table.column(i).cast(pa.int64() if pa.types.is_time64(typ) else pa.int32()).to_pylist()
            width = len(str(per)) - 1
            text = [None if v is None else
                    f"{v // per // 3600:02d}:{v // per // 60 % 60:02d}:{v // per % 60:02d}" + (f".{v % per:0{width}d}" if width else "")
                    for v in raw]
        elif pa.types.is_timestamp(typ) or pa.types.is_date(typ):
            import pyarrow.compute as pc

            unit = "D" if pa.types.is_date32(typ) else "ms" if pa.types.is_date64(typ) else typ.unit
            ints = table.column(i).cast(pa.int32() if unit == "D" else pa.int64())
            valid = ints.is_valid().to_numpy(zero_copy_only=False)
            stamps = pc.fill_null(ints, 0).to_numpy().astype(f"datetime64[{unit}]")  # every value exact, any year
            shown = "D" if pa.types.is_date(typ) else unit
            zone = "Z" if getattr(typ, "tz", None) else ""
            spelled = np.datetime_as_string(stamps, unit=shown)  # type: ignore[arg-type,unused-ignore]
            text = list((np.char.add(spelled, zone) if zone else spelled).tolist())
            for k in np.flatnonzero(~valid):
                text[k] = None
        else:
            continue
        table = table.set_column(i, pa.field(f.name, pa.string()), pa.array(text, pa.string()))
    return table


def decimal_text(v: decimal.Decimal) -> str:
    """A DECIMAL's text in fixed point with its scale, as DuckDB spells it: ``0.0000000000`` and
    ``-0.0000000001`` for a DECIMAL(38, 10), where ``str`` writes ``0E-10`` and ``-1E-10``."""
    return format(v, "f") if v.is_finite() else str(v)


def _readable(v: Any) -> Any:
    """Floats to 6 significant digits for people (the JSON forms keep every digit)."""
    if isinstance(v, float):
        return float(f"{v:.6g}")
    if isinstance(v, dict):
        return {k: _readable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_readable(x) for x in v]
    return v


def python_rows(table: pa.Table) -> list[dict[str, Any]]:
    """``table.to_pylist()``, except that a date or timestamp outside Python's years 1..9999 (a
    released key may be one: DuckDB's DATE and TIMESTAMP reach far beyond) is its ISO text in the
    proleptic Gregorian calendar instead of an OverflowError that would lose a paid release."""
    try:
        return table.to_pylist()
    except (OverflowError, ValueError):
        pass
    columns = [_column_values(table.column(i), f.type) for i, f in enumerate(table.schema)]
    return [dict(zip(table.column_names, row)) for row in zip(*columns)]


def _column_values(col: Any, typ: pa.DataType) -> list[Any]:
    if not (pa.types.is_date(typ) or pa.types.is_timestamp(typ)):
        return col.to_pylist()  # type: ignore[no-any-return]
    import numpy as np

    unit = "D" if pa.types.is_date32(typ) else "ms" if pa.types.is_date64(typ) else typ.unit
    out: list[Any] = []
    for v in col:
        try:
            out.append(v.as_py())
        except (OverflowError, ValueError):
            out.append(str(np.datetime_as_string(np.datetime64(int(v.value), unit))))  # type: ignore[call-overload,arg-type,unused-ignore]
    return out

