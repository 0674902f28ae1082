"""Total cost of ownership per deployment, against the price of a hosted API.

For each deployment: the tokens it served in the period (the audit log), that volume per month,
its monthly cost (hardware per hour x 730, or per month, plus operations per month: `[cost]`),
the cost per 1M tokens at that volume, and the break-even volume

    V = monthly cost / API price per token = monthly cost x 1,000,000 / API price per 1M tokens

above which self-hosting is cheaper than the API.  The published example: $2,182 hardware +
$150 + $500 operations a month against $4.37 per 1M tokens breaks even at 2,832 / 0.00000437 =
648.05M tokens a month (a widely read comparison prints 16.2M).

Arithmetic is in `Decimal` from the configured numbers as written (a TOML `4.37` is exactly
4.37, not the nearest binary float), at 28 significant digits, and rounded once at the end,
half to even: money to the cent, prices per 1M tokens to 1/10,000, token volumes to the whole
token.  A month is 730 hours (8,760 / 12), for hourly hardware and for scaling the measured
volume of a period of any length to a month.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Literal

import msgspec

from ..config import CostSettings, DeploymentCost, ModelSettings
from .usage import DeploymentUsage, Period

__all__ = [
    "HOURS_PER_MONTH",
    "TcoLine",
    "TcoReport",
    "break_even_tokens",
    "cost_per_million",
    "decimal",
    "monthly_cost",
    "tco_report",
]

HOURS_PER_MONTH = Decimal(730)
MILLION = Decimal(1_000_000)
_CENT = Decimal("0.01")
_PRICE = Decimal("0.0001")
_TOKEN = Decimal(1)
_HOUR_US = Decimal(3_600_000_000)


def decimal(value: float) -> Decimal:
    """A configured number as written: the shortest decimal that reads back as `value`."""
    return Decimal(repr(value))


def monthly_cost(entry: DeploymentCost) -> Decimal:
    """Hardware (per hour x 730, or per month) plus operations, per month, unrounded."""
    if entry.hardware_per_hour is not None:
        hardware = decimal(entry.hardware_per_hour) * HOURS_PER_MONTH
    else:
        hardware = decimal(entry.hardware_per_month or 0.0)
    return hardware + decimal(entry.operations_per_month)


def break_even_tokens(cost_per_month: Decimal, api_price_per_million: Decimal) -> Decimal:
    """V: the monthly token volume at which the API would cost as much as self-hosting."""
    if api_price_per_million <= 0:
        raise ValueError("the API price must be positive")
    return cost_per_month / (api_price_per_million / MILLION)


def cost_per_million(cost_per_month: Decimal, tokens_per_month: Decimal) -> Decimal | None:
    """Self-hosting's cost per 1M tokens at a monthly volume (None: no volume)."""
    if tokens_per_month <= 0:
        return None
    return cost_per_month / (tokens_per_month / MILLION)


class TcoLine(msgspec.Struct, frozen=True, kw_only=True):
    """One deployment's row.  Cost fields are None when no `[[cost.deployments]]` entry
    prices it; `priced_by` says which entry did."""

    deployment: str
    engine_class: str | None
    priced_by: Literal["deployment", "class"] | None
    requests: int
    tokens: int  # measured in the period
    tokens_per_month: int  # that volume scaled to 730 hours
    hardware_per_month: Decimal | None
    operations_per_month: Decimal | None
    monthly_cost: Decimal | None
    cost_per_million: Decimal | None  # at the measured volume; None without traffic
    api_price_per_million: Decimal | None
    api_cost_per_month: Decimal | None  # the measured volume at the API's price
    break_even_tokens_per_month: int | None


class TcoReport(msgspec.Struct, frozen=True, kw_only=True):
    start: datetime
    end: datetime
    currency: str
    lines: list[TcoLine]


def _round(value: Decimal, step: Decimal) -> Decimal:
    return value.quantize(step, rounding=ROUND_HALF_EVEN)


def _months(period: Period) -> Decimal:
    micros = (period.end - period.start) // timedelta(microseconds=1)
    return Decimal(micros) / _HOUR_US / HOURS_PER_MONTH


def _entry(
    cost: CostSettings, deployment: str, engine_class: str | None
) -> tuple[DeploymentCost | None, Literal["deployment", "class"] | None]:
    for entry in cost.deployments:
        if entry.deployment == deployment:
            return entry, "deployment"
    for entry in cost.deployments:
        if engine_class is not None and entry.engine_class == engine_class:
            return entry, "class"
    return None, None


def _line(
    cost: CostSettings,
    deployment: str,
    engine_class: str | None,
    used: DeploymentUsage | None,
    months: Decimal,
) -> TcoLine:
    tokens = used.tokens if used else 0
    per_month = Decimal(tokens) / months
    entry, priced_by = _entry(cost, deployment, engine_class)
    monthly = hardware = operations = per_million = price = api_cost = None
    break_even = None
    if entry is not None:
        total = monthly_cost(entry)
        operations = decimal(entry.operations_per_month)
        hardware, monthly = _round(total - operations, _CENT), _round(total, _CENT)
        operations = _round(operations, _CENT)
        unit = cost_per_million(total, per_month)
        per_million = None if unit is None else _round(unit, _PRICE)
        configured = entry.api_price_per_million or cost.api_price_per_million
        if configured is not None:
            price = decimal(configured)
            api_cost = _round(per_month * price / MILLION, _CENT)
            break_even = int(_round(break_even_tokens(total, price), _TOKEN))
    return TcoLine(
        deployment=deployment,
        engine_class=engine_class,
        priced_by=priced_by,
        requests=used.requests if used else 0,
        tokens=tokens,
        tokens_per_month=int(_round(per_month, _TOKEN)),
        hardware_per_month=hardware,
        operations_per_month=operations,
        monthly_cost=monthly,
        cost_per_million=per_million,
        api_price_per_million=price,
        api_cost_per_month=api_cost,
        break_even_tokens_per_month=break_even,
    )


def tco_report(
    cost: CostSettings,
    models: Sequence[ModelSettings],
    usage: Sequence[DeploymentUsage],
    period: Period,
) -> TcoReport:
    """One line per deployment that is configured (`[[models]]`), priced by name, or seen in
    the log in `period`; requests that reached no deployment are not anyone's cost."""
    classes: dict[str, str | None] = {m.deployment: m.resolved_class for m in models}
    for entry in cost.deployments:
        if entry.deployment is not None:
            classes.setdefault(entry.deployment, None)
    by_name = {u.deployment: u for u in usage if u.deployment is not None}
    for name in by_name:
        classes.setdefault(name, None)
    months = _months(period)
    lines = [
        _line(cost, name, classes[name], by_name.get(name), months) for name in sorted(classes)
    ]
    return TcoReport(start=period.start, end=period.end, currency=cost.currency, lines=lines)
