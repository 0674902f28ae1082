"""The selftest's order: each check runs on its own (one failing never stops the next), then
the selftest is recorded in the audit log."""

from __future__ import annotations

import functools
from collections.abc import Callable

from ..config import Settings
from .audit import check_audit_chain, record_selftest
from .bundles import check_bundles
from .egress import check_egress
from .files import check_data_dir
from .inference import Serve, check_inference
from .keys import check_keys
from .result import CheckResult, Finding, run_check, skipped
from .services import check_kms, check_otlp, check_postgresql, check_redis

__all__ = ["CHECKS", "run_selftest"]

# name -> check, in the order they run.  The egress guard is installed by its check and stays
# (as in `serve`): the services and the inference after it run behind it.
CHECKS: tuple[tuple[str, Callable[[Settings], Finding]], ...] = (
    ("data_dir", check_data_dir),
    ("keys", check_keys),
    ("bundles", check_bundles),
    ("audit_chain", check_audit_chain),
    ("egress", check_egress),
    ("redis", check_redis),
    ("postgresql", check_postgresql),
    ("kms", check_kms),
    ("otlp", check_otlp),
)


def run_selftest(
    settings: Settings,
    *,
    actor: str,
    serve: Serve | None,
    on_result: Callable[[CheckResult], None] = lambda _: None,
) -> list[CheckResult]:
    """Every check, then one real inference (unless `serve` is None: skipped by request),
    then the record of it all in the audit log by `actor`; `on_result` sees each result as
    it comes."""
    results: list[CheckResult] = []

    def add(result: CheckResult) -> None:
        results.append(result)
        on_result(result)

    for name, check in CHECKS:
        add(run_check(name, functools.partial(check, settings)))
    if serve is None:
        add(run_check("inference", lambda: skipped("skipped by request (--no-inference)")))
    else:
        add(run_check("inference", lambda: check_inference(settings, serve)))
    done = list(results)
    add(run_check("audit_record", lambda: record_selftest(settings, actor, done)))
    return results
