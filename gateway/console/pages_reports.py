"""Usage and cost: the `airgate report usage | tco` numbers as console pages, with the charts
drawn on the server as SVG (`gateway/reports/svg.py`: every label escaped, no script), inlined
into the page so nothing else is fetched.

`/console/usage` takes a period (`since`, `until`: dates or times, UTC unless a zone is given;
default the last 30 days), a team and a model; a team-scoped auditor sees only its own team.
`/console/tco` prices each deployment from `[cost]`; it sums every team's traffic, so it is for
auditors of every team and admins (a team-scoped auditor gets 403).  Both views are audited.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from litestar import Request, Response, get
from litestar.di import NamedDependency
from markupsafe import Markup

from ..access.auth import audit_teams
from ..access.stack import Security
from ..reports import Period, PeriodError, deployment_usage, tco_report, usage_charts, usage_report
from ..reports.tables import Cell, shown, tco_table, usage_table
from .web import ConsoleError, Viewer, render_page, viewed

__all__ = ["tco_page", "usage_page"]

DEFAULT_DAYS = 30
MAX_DAYS = 400


def _period(request: Request[Any, Any, Any], errors: list[str]) -> tuple[Period, dict[str, str]]:
    """The period of the form (default the last 30 days; at most MAX_DAYS, one bar a day)."""
    q = request.query_params
    values = {name: str(q.get(name) or "").strip()[:64] for name in ("since", "until")}
    now = datetime.now(UTC)
    try:
        period = Period.parse(
            values["since"], values["until"], now=now, days=DEFAULT_DAYS, names=("From", "Until")
        )
    except PeriodError as exc:
        errors.append(f"{exc}.")
        return Period.parse(None, None, now=now, days=DEFAULT_DAYS), values
    if period.days > MAX_DAYS:
        errors.append(f"Choose at most {MAX_DAYS} days.")
        return Period(period.end - timedelta(days=MAX_DAYS), period.end), values
    return period, values


def _cells(rows: list[tuple[Cell, ...]]) -> list[list[tuple[str, bool]]]:
    """Each cell as shown, and whether it is a number (right-aligned)."""
    return [[(shown(v), not isinstance(v, str | None)) for v in row] for row in rows]


@get("/usage", name="console.usage")
async def usage_page(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    viewer: NamedDependency[Viewer],
) -> Response[str]:
    """Requests, tokens and refusals per day, team and model, as charts and a table."""
    errors: list[str] = []
    period, values = _period(request, errors)
    q = request.query_params
    for name in ("team", "model"):
        value = str(q.get(name) or "").strip()
        if len(value) > 128:
            errors.append(f"{name}: at most 128 characters.")
            value = ""
        values[name] = value
    teams = audit_teams(viewer.principal)
    if teams is not None:
        if not values["team"] and len(teams) == 1:
            (values["team"],) = teams
        if values["team"] not in teams:
            await viewed(
                request,
                security,
                viewer,
                "console.usage",
                outcome="denied",
                status=403,
                error_class="permission_denied",
            )
            raise ConsoleError(403, "This auditor key may read only its own team's usage.")
    report = await usage_report(
        security.engine, period, team=values["team"] or None, model=values["model"] or None
    )
    status = 400 if errors else 200
    await viewed(
        request,
        security,
        viewer,
        "console.usage",
        status=status,
        outcome="failure" if errors else "success",
        detail={"count": len(report.rows)},
    )
    requests_svg, tokens_svg = usage_charts(report)
    header, rows = usage_table(report)
    context = {
        "form": values,
        "errors": errors,
        "period": period,
        "scoped": teams is not None,
        # SVG text built by gateway/reports/svg.py, which escapes every label itself
        "charts": [Markup(requests_svg), Markup(tokens_svg)],
        "header": header,
        "rows": _cells(rows),
    }
    return render_page(request, "usage.html", context, viewer=viewer, status=status)


@get("/tco", name="console.tco")
async def tco_page(
    request: Request[Any, Any, Any],
    security: NamedDependency[Security],
    viewer: NamedDependency[Viewer],
) -> Response[str]:
    """Per deployment: measured tokens, monthly cost, cost per 1M tokens, break-even volume."""
    if audit_teams(viewer.principal) is not None:
        await viewed(
            request,
            security,
            viewer,
            "console.tco",
            outcome="denied",
            status=403,
            error_class="permission_denied",
        )
        raise ConsoleError(
            403, "The cost report sums every team's traffic: it needs an all-teams auditor key."
        )
    errors: list[str] = []
    period, values = _period(request, errors)
    used = await deployment_usage(security.engine, period)
    settings = security.settings
    report = tco_report(settings.cost, settings.models, used, period)
    status = 400 if errors else 200
    await viewed(
        request,
        security,
        viewer,
        "console.tco",
        status=status,
        outcome="failure" if errors else "success",
        detail={"count": len(report.lines)},
    )
    header, rows = tco_table(report)
    context = {
        "form": values,
        "errors": errors,
        "period": period,
        "currency": report.currency,
        "header": header,
        "rows": _cells(rows),
        "priced": bool(settings.cost.deployments),
    }
    return render_page(request, "tco.html", context, viewer=viewer, status=status)
