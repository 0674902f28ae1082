"""The TCO arithmetic (gateway/reports/tco.py) and its `[cost]` configuration, checked against
the published example and against exact fractions computed here independently."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from gateway.config import ConfigError, CostSettings, DeploymentCost, ModelSettings, load_settings
from gateway.reports import (
    DeploymentUsage,
    Period,
    PeriodError,
    break_even_tokens,
    monthly_cost,
    tco_report,
)
from gateway.reports.tco import cost_per_million, decimal

T0 = datetime(2026, 11, 1, tzinfo=UTC)
MONTH = Period(T0, T0 + timedelta(hours=730))  # exactly one 730-hour month


def test_published_example_breaks_even_at_648m_tokens_not_16_2m() -> None:
    # $2,182 hardware + $150 + $500 operations a month against $4.37 per 1M tokens
    entry = DeploymentCost(
        deployment="gpu-a", hardware_per_month=2182.0, operations_per_month=150.0 + 500.0
    )
    cost = monthly_cost(entry)
    assert cost == Decimal("2832")
    volume = break_even_tokens(cost, Decimal("4.37"))
    assert volume == Decimal(2832) / Decimal("0.00000437")
    assert Fraction(volume).limit_denominator(10**6) == Fraction(2832 * 10**6, 437) * 100
    assert round(volume / 1_000_000, 2) == Decimal("648.05")
    assert abs(volume - Decimal("16.2e6")) > Decimal("600e6")  # not the misprinted 16.2M


def test_the_report_line_for_the_published_example() -> None:
    cost = CostSettings(
        api_price_per_million=4.37,
        deployments=[
            DeploymentCost(
                deployment="gpu-a", hardware_per_month=2182.0, operations_per_month=650.0
            )
        ],
    )
    used = [DeploymentUsage(deployment="gpu-a", requests=10, prompt_tokens=0, completion_tokens=0)]
    (line,) = tco_report(cost, [], used, MONTH).lines
    assert line.monthly_cost == Decimal("2832.00")
    assert line.hardware_per_month == Decimal("2182.00")
    assert line.operations_per_month == Decimal("650.00")
    assert line.break_even_tokens_per_month == 648_054_920  # 648,054,919.908... rounded
    assert line.cost_per_million is None  # no tokens: no cost per token
    assert line.api_cost_per_month == Decimal("0.00")


def test_hourly_hardware_is_730_hours_a_month() -> None:
    entry = DeploymentCost(engine_class="gpu", hardware_per_hour=2.99, operations_per_month=650.0)
    assert monthly_cost(entry) == Decimal("2.99") * 730 + 650 == Decimal("2832.70")


def test_measured_volume_is_scaled_to_a_month_and_priced() -> None:
    # 30 days (720 h) of 100M tokens; exact fractions as the reference
    period = Period(T0, T0 + timedelta(days=30))
    cost = CostSettings(
        api_price_per_million=4.37,
        deployments=[
            DeploymentCost(engine_class="gpu", hardware_per_hour=3.0, operations_per_month=0.5)
        ],
    )
    models = [ModelSettings(id="m", name="gpu-a", engine="echo", engine_class="gpu")]
    used = [
        DeploymentUsage(
            deployment="gpu-a", requests=7, prompt_tokens=60_000_000, completion_tokens=40_000_000
        )
    ]
    (line,) = tco_report(cost, models, used, period).lines
    per_month = Fraction(100_000_000) * 730 / 720
    monthly = Fraction(3) * 730 + Fraction(1, 2)
    assert line.priced_by == "class" and line.engine_class == "gpu"
    assert (line.requests, line.tokens) == (7, 100_000_000)
    assert line.tokens_per_month == round(per_month) == 101_388_889
    assert line.monthly_cost == Decimal("2190.50")
    unit = monthly / (per_month / 10**6)
    expected = (Decimal(unit.numerator) / Decimal(unit.denominator)).quantize(Decimal("0.0001"))
    assert line.cost_per_million == expected == Decimal("21.6049")
    assert line.api_cost_per_month == Decimal("443.07")  # 101.39M x $4.37 / 1M = 443.069...
    assert line.break_even_tokens_per_month == round(monthly * 10**6 / Fraction("4.37"))


def test_a_deployment_entry_wins_over_its_class_and_may_name_its_own_api_price() -> None:
    cost = CostSettings(
        api_price_per_million=4.37,
        deployments=[
            DeploymentCost(engine_class="edge", hardware_per_month=100.0),
            DeploymentCost(deployment="laptop", hardware_per_month=10.0, api_price_per_million=0.5),
        ],
    )
    models = [
        ModelSettings(id="a", name="laptop", engine="echo"),
        ModelSettings(id="b", name="edge-2", engine="echo"),
        ModelSettings(id="c", name="gpu-1", engine="echo", engine_class="gpu"),
    ]
    lines = {line.deployment: line for line in tco_report(cost, models, [], MONTH).lines}
    assert lines["laptop"].priced_by == "deployment"
    assert lines["laptop"].break_even_tokens_per_month == 20_000_000  # $10 / $0.5 per 1M
    assert lines["edge-2"].priced_by == "class"
    assert lines["edge-2"].break_even_tokens_per_month == round(100 * 10**6 / Fraction("4.37"))
    unpriced = lines["gpu-1"]
    assert unpriced.priced_by is None
    assert (unpriced.monthly_cost, unpriced.break_even_tokens_per_month) == (None, None)


def test_deployments_seen_only_in_the_log_are_listed_and_unrouted_requests_are_not() -> None:
    used = [
        DeploymentUsage(deployment="gone", requests=2, prompt_tokens=5, completion_tokens=6),
        DeploymentUsage(deployment=None, requests=9, prompt_tokens=0, completion_tokens=0),
    ]
    report = tco_report(CostSettings(), [], used, MONTH)
    assert [(line.deployment, line.tokens) for line in report.lines] == [("gone", 11)]


def test_no_api_price_means_no_break_even() -> None:
    cost = CostSettings(deployments=[DeploymentCost(deployment="d", hardware_per_month=5.0)])
    (line,) = tco_report(cost, [], [], MONTH).lines
    assert line.monthly_cost == Decimal("5.00") and line.break_even_tokens_per_month is None


def test_helpers_refuse_what_has_no_answer() -> None:
    assert cost_per_million(Decimal(100), Decimal(0)) is None
    with pytest.raises(ValueError):
        break_even_tokens(Decimal(100), Decimal(0))
    assert decimal(4.37) == Decimal("4.37")  # as written, not the binary float's expansion
    assert decimal(0.1) + decimal(0.2) == Decimal("0.3")


# -- [cost] configuration ---------------------------------------------------------------


def load(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "airgate.toml"
    path.write_text(text)
    return load_settings(path, environ={}, overrides={"data_dir": str(tmp_path)})


def test_cost_configuration_as_documented(tmp_path: Path) -> None:
    settings = load(
        tmp_path,
        """
[cost]
currency = "EUR"
api_price_per_million = 4.37

[[cost.deployments]]
deployment = "gemma-gpu"
hardware_per_hour = 2.99
operations_per_month = 650

[[cost.deployments]]
class = "edge"
hardware_per_month = 40
""",
    )
    assert settings.cost.currency == "EUR"
    first, second = settings.cost.deployments
    assert (first.deployment, first.hardware_per_hour, first.operations_per_month) == (
        "gemma-gpu",
        2.99,
        650.0,
    )
    assert (second.engine_class, second.hardware_per_month) == ("edge", 40.0)
    assert load(tmp_path, "").cost == CostSettings()


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ('deployment = "d"\nhardware_per_hour = -1', "hardware_per_hour"),
        ('deployment = "d"\nhardware_per_hour = nan', "hardware_per_hour"),
        ('deployment = "d"\nhardware_per_month = inf', "hardware_per_month"),
        ('deployment = "d"\nhardware_per_month = 1\noperations_per_month = -0.5', "operations"),
        ('deployment = "d"\nhardware_per_month = 1\napi_price_per_million = 0', "api_price"),
        ('deployment = "d"\nhardware_per_month = 1\nhardware_per_hour = 1', "hardware_per_hour"),
        ('deployment = "d"', "hardware_per_month"),
        ('deployment = "d"\nclass = "gpu"\nhardware_per_month = 1', "class"),
        ("hardware_per_month = 1", "deployment"),
        ('deployment = "d"\nhardware_per_month = 1\nprice = 3', "price"),
        ('class = "tpu"\nhardware_per_month = 1', "class"),
    ],
)
def test_bad_cost_entries_are_refused_naming_the_key(tmp_path: Path, text: str, names: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, f"[[cost.deployments]]\n{text}\n")
    assert "cost" in str(caught.value) and names in str(caught.value)


def test_a_deployment_priced_twice_is_refused(tmp_path: Path) -> None:
    entry = '[[cost.deployments]]\ndeployment = "d"\nhardware_per_month = 1\n'
    with pytest.raises(ConfigError, match="priced twice"):
        load(tmp_path, entry + entry)
    with pytest.raises(ConfigError, match="api_price_per_million"):
        load(tmp_path, "[cost]\napi_price_per_million = -4.37\n")


# -- the report period ----------------------------------------------------------------------


def test_the_period_as_typed() -> None:
    now = datetime(2026, 12, 2, 17, 0, tzinfo=UTC)
    default = Period.parse(None, None, now=now, days=30)
    assert (default.start, default.end, default.days) == (now - timedelta(days=30), now, 30)
    typed = Period.parse("2026-11-01", "2026-11-02T06:00:00+02:00", now=now, days=30)
    assert typed.start == datetime(2026, 11, 1, tzinfo=UTC)  # no zone: UTC
    assert typed.end == datetime(2026, 11, 2, 4, tzinfo=UTC)
    assert Period.parse(None, "2026-11-02", now=now, days=1).start == datetime(
        2026, 11, 1, tzinfo=UTC
    )


@pytest.mark.parametrize(
    ("since", "until", "message"),
    [
        ("yesterday", None, "--since is not an ISO 8601 date"),
        (None, "0001-01-01", "--until must be between 1970 and 9000"),  # no overflow, no 500
        ("9999-12-31", None, "--since must be between"),
        ("2026-12-02", "2026-12-01", "--since must be before --until"),
        ("2026-12-01", "2026-12-01", "--since must be before --until"),
    ],
)
def test_periods_that_cannot_be_are_refused_in_our_words(
    since: str | None, until: str | None, message: str
) -> None:
    now = datetime(2026, 12, 2, tzinfo=UTC)
    with pytest.raises(PeriodError) as caught:
        Period.parse(since, until, now=now, days=30, names=("--since", "--until"))
    assert str(caught.value).startswith(message)
