"""Usage and cost reports from the audit log, shared by `airgate report` and the console.

`usage.py` aggregates the log in SQL (requests, tokens and refusals per day, team and model;
tokens per deployment); `tco.py` prices each deployment from `[cost]` and finds its break-even
volume against an API; `svg.py` draws the charts as escaped, script-free SVG text.
"""

from .svg import bar_chart, line_chart, usage_charts
from .tco import TcoLine, TcoReport, break_even_tokens, cost_per_million, monthly_cost, tco_report
from .usage import (
    DailyUsage,
    DeploymentUsage,
    Period,
    PeriodError,
    UsageReport,
    deployment_usage,
    usage_report,
)

__all__ = [
    "DailyUsage",
    "DeploymentUsage",
    "Period",
    "PeriodError",
    "TcoLine",
    "TcoReport",
    "UsageReport",
    "bar_chart",
    "break_even_tokens",
    "cost_per_million",
    "deployment_usage",
    "line_chart",
    "monthly_cost",
    "tco_report",
    "usage_charts",
    "usage_report",
]
