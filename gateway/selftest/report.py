"""The selftest's report: one line per check for a person, or one JSON document.

JSON (stable): `{"ok": bool, "checks": [{"name", "status", "detail", "duration_ms"}]}`, with
`status` one of "pass", "fail", "skip"; `ok` is false when any check failed.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from .result import CheckResult

__all__ = ["NAME_WIDTH", "encode_json", "line", "summary"]

NAME_WIDTH = 12
_LABELS = {"pass": "PASS", "fail": "FAIL", "skip": "SKIP"}


class _Report(msgspec.Struct, kw_only=True):
    ok: bool
    checks: Sequence[CheckResult]


def line(result: CheckResult) -> str:
    """`PASS  keys          12 ms  detail`."""
    took = f"{result.duration_ms:.0f} ms"
    return f"{_LABELS[result.status]}  {result.name:<{NAME_WIDTH}}  {took:>9}  {result.detail}"


def summary(results: Sequence[CheckResult]) -> str:
    counts = {status: sum(r.status == status for r in results) for status in _LABELS}
    verdict = "FAILED" if counts["fail"] else "passed"
    return (
        f"selftest {verdict}: {counts['pass']} passed, {counts['fail']} failed, "
        f"{counts['skip']} skipped"
    )


def encode_json(results: Sequence[CheckResult]) -> bytes:
    return msgspec.json.format(
        msgspec.json.encode(_Report(ok=all(r.ok for r in results), checks=results)), indent=2
    )
