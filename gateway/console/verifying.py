"""Verification as a streamed page: the Integrity page's head at once, a progress line per
chain as verification reads its rows, then the findings and the rest of the page.

No script is involved (the CSP allows none inline): the browser renders the page as it arrives
and the stylesheet shows only the latest line and each finished chain's last one.  A million rows
take about a minute (BENCHMARKS.md, "console"), so the officer sees where it is.  Verification
runs in a task owned by the response: a browser that goes away cancels it.  The result is shown
only once its `audit.verify` event is recorded, as for every console view; if that fails the
page says so instead.

    prefix | <p data-progress>…</p> … | the progress section's end | the report and the rest
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import traceback
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, Final

from litestar import Request
from markupsafe import escape

from ..access.stack import Security
from ..audit import LogReport, verify_log
from ..audit.checkpoint import Checkpoint
from ..errors import GatewayError
from .web import Viewer, page_text, viewed

__all__ = ["PROGRESS_MARK", "REPORT_MARK", "TICK_S", "progress_line", "verification"]

_log = logging.getLogger("airgate.console")

PROGRESS_MARK: Final = "<!-- airgate:progress -->"
REPORT_MARK: Final = "<!-- airgate:report -->"
TICK_S: Final = 0.5  # at most one line a chain per tick (and always its last)


def progress_line(chain: str, done: int, total: int) -> str:
    """One progress line (escaped: a chain id is hex, but it comes from the database)."""
    percent = 100 if total == 0 else min(100, done * 100 // total)
    finished = " data-done" if done >= total else ""
    return (
        f'<p data-progress{finished}>Chain <span class="mono">'
        f"{escape(chain)}</span>: {done:,} of {total:,} rows checked "
        f'<progress value="{done}" max="{max(total, 1)}">{percent}%</progress> {percent}%</p>\n'
    )


def _split(text: str, mark: str) -> tuple[str, str]:
    before, found, after = text.partition(mark)
    if not found:
        raise RuntimeError(f"the integrity template lost its {mark} marker")
    return before, after


async def verification(
    request: Request[Any, Any, Any],
    security: Security,
    viewer: Viewer,
    witnessed: list[tuple[str, list[Checkpoint]]],
    context: Callable[[LogReport | None], Mapping[str, Any]],
) -> AsyncIterator[str]:
    """The streamed Integrity page of one verification (`context(report)`: the template's)."""
    started = time.perf_counter()
    first = page_text(request, "integrity.html", context(None), viewer=viewer)
    prefix, rest = _split(first, PROGRESS_MARK)
    section_end, _ = _split(rest, REPORT_MARK)
    updates: list[tuple[str, int, int]] = []
    task = asyncio.ensure_future(
        verify_log(
            security.engine,
            security.trusted_audit_keys,
            witnesses=witnessed,
            progress=lambda *update: updates.append(update),
        )
    )
    try:
        yield prefix
        while True:
            finished, _ = await asyncio.wait({task}, timeout=TICK_S)
            latest = {chain: (chain, done, total) for chain, done, total in updates}
            updates.clear()
            if latest:
                yield "".join(progress_line(*update) for update in latest.values())
            if finished:
                break
        yield section_end
        yield await _outcome(request, security, viewer, task, context, started)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _outcome(
    request: Request[Any, Any, Any],
    security: Security,
    viewer: Viewer,
    task: asyncio.Future[LogReport],
    context: Callable[[LogReport | None], Mapping[str, Any]],
    started: float,
) -> str:
    """The rest of the page once verification ended: its findings, or why there are none."""
    failed = task.exception()
    if failed is not None:
        frames = "".join(traceback.format_tb(failed.__traceback__))  # never the message
        _log.error("verification failed on the console: %s\n%s", type(failed).__name__, frames)
        await _audit(request, security, viewer, None, type(failed).__name__)
        return _failure("Verification stopped: the audit database could not be read. "
                        "Check the database and run verification again.")  # fmt: skip
    report = task.result()
    if not await _audit(request, security, viewer, report, None):
        return _failure("Verification finished, but it could not be recorded in the audit log, "
                        "so its result is not shown. Run it again once the audit log is "
                        "available.")  # fmt: skip
    took = {"took_s": f"{time.perf_counter() - started:.2f}"}
    page = page_text(request, "integrity.html", {**context(report), **took}, viewer=viewer)
    return _split(page, REPORT_MARK)[1]


async def _audit(
    request: Request[Any, Any, Any],
    security: Security,
    viewer: Viewer,
    report: LogReport | None,
    error: str | None,
) -> bool:
    """Record the verification (`audit.verify`, as before streaming); whether it was."""
    detail: dict[str, str | int] = {}
    if report is not None:
        rows = sum(c.rows for c in report.chains)
        detail = {"ok": int(report.ok), "chains": len(report.chains), "rows": rows}
    try:
        await viewed(
            request,
            security,
            viewer,
            "audit.verify",
            outcome="success" if error is None else "failure",
            status=200 if error is None else 503,
            detail=detail,
            error_class=error,
        )
    except GatewayError:
        return False
    return True


def _failure(message: str) -> str:
    alert = f'<p class="bad" role="alert" id="result">{escape(message)}</p>\n'
    return alert + "</main>\n</body>\n</html>\n"  # base.html's ends
