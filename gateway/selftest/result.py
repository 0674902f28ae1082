"""What a check finds (`Finding`) and what the report shows of it (`CheckResult`), and the one
place a check is run: timed, and never allowed to stop the checks after it (`run_check`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal

import msgspec

__all__ = ["CheckResult", "Finding", "Status", "failed", "passed", "run_check", "skipped"]

Status = Literal["pass", "fail", "skip"]
_log = logging.getLogger("airgate.selftest")


class Finding(msgspec.Struct, frozen=True):
    """A check's verdict and one line (or a few, joined by "; ") for the operator: what was
    proved, or what is wrong and how to fix it.  Never a secret, a prompt or a completion."""

    status: Status
    detail: str


def passed(detail: str) -> Finding:
    return Finding("pass", detail)


def failed(detail: str) -> Finding:
    return Finding("fail", detail)


def skipped(detail: str) -> Finding:
    """Nothing to check (not configured, or skipped by request): never a failure."""
    return Finding("skip", detail)


class CheckResult(msgspec.Struct, frozen=True, kw_only=True):
    """One line of the report (and one object of `--json`)."""

    name: str
    status: Status
    detail: str
    duration_ms: float

    @property
    def ok(self) -> bool:
        return self.status != "fail"


def run_check(name: str, check: Callable[[], Finding]) -> CheckResult:
    """Run `check`, timed.  An exception it did not expect fails this check only, named by its
    class: its text is not shown (a foreign library's message may repeat a URL with a password
    in it)."""
    start = time.perf_counter()
    try:
        finding = check()
    except Exception as exc:
        _log.debug("selftest check %s raised", name, exc_info=True)
        finding = failed(f"the check could not run: an unexpected {type(exc).__name__}")
    elapsed = (time.perf_counter() - start) * 1000
    return CheckResult(
        name=name, status=finding.status, detail=finding.detail, duration_ms=round(elapsed, 1)
    )
