"""The reports as header + rows of plain values: one source for the CLI's table and CSV and
the console's HTML tables, so every format shows the same numbers.  JSON is the report Structs
themselves (`encode_json`), with decimals written as exact JSON numbers."""

from __future__ import annotations

from decimal import Decimal

import msgspec

from .tco import TcoReport
from .usage import UsageReport

__all__ = ["Cell", "encode_json", "shown", "tco_table", "usage_table"]

Cell = str | int | Decimal | None
_json = msgspec.json.Encoder(decimal_format="number")

USAGE_HEADER = (
    "day",
    "team",
    "model",
    "requests",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "policy_denied",
    "rate_limited",
    "auth_failures",
)
TCO_HEADER = (
    "deployment",
    "class",
    "priced_by",
    "requests",
    "tokens",
    "tokens_per_month",
    "hardware_per_month",
    "operations_per_month",
    "monthly_cost",
    "cost_per_million",
    "api_price_per_million",
    "api_cost_per_month",
    "break_even_tokens_per_month",
)


def usage_table(report: UsageReport) -> tuple[tuple[str, ...], list[tuple[Cell, ...]]]:
    rows: list[tuple[Cell, ...]] = [
        (
            r.day,
            r.team,
            r.model,
            r.requests,
            r.prompt_tokens,
            r.completion_tokens,
            r.tokens,
            r.policy_denied,
            r.rate_limited,
            r.auth_failures,
        )
        for r in report.rows
    ]
    return USAGE_HEADER, rows


def tco_table(report: TcoReport) -> tuple[tuple[str, ...], list[tuple[Cell, ...]]]:
    rows: list[tuple[Cell, ...]] = [
        (
            line.deployment,
            line.engine_class,
            line.priced_by,
            line.requests,
            line.tokens,
            line.tokens_per_month,
            line.hardware_per_month,
            line.operations_per_month,
            line.monthly_cost,
            line.cost_per_million,
            line.api_price_per_million,
            line.api_cost_per_month,
            line.break_even_tokens_per_month,
        )
        for line in report.lines
    ]
    return TCO_HEADER, rows


def encode_json(report: UsageReport | TcoReport) -> bytes:
    """The report as one JSON document (decimals as exact numbers, times in ISO 8601)."""
    return _json.encode(report)


def shown(value: Cell) -> str:
    """A cell as a table shows it: numbers with thousands separators, nothing as "-"."""
    if value is None:
        return "-"
    if isinstance(value, int | Decimal):
        return f"{value:,}"
    return value
