"""The end of an admitted request: its completion event, or its failure or cancellation, and
the limiter's refund.

    Admitted.complete() -> `inference.completed`, durable before the response's final bytes
    Admitted.close()    -> `inference.failed` / `inference.cancelled` when it did not complete,
                           and the limiter refund (always, exactly once)

Events carry the request's `Progress` (tokens, TTFT, finish reason, deployment): counts and
codes only, never text.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any, Literal

from policies import Decision

from ..access.limits import Admission
from ..access.stack import Security
from ..audit import AuditEvent, new_event_id
from ..errors import GatewayError
from .facts import Progress

__all__ = ["Admitted"]


class Admitted:
    """One admitted request's obligations: its completion event and its limiter refund."""

    def __init__(
        self,
        security: Security,
        base: dict[str, Any],
        decision: Decision,
        admission: Admission,
        progress: Progress,
    ) -> None:
        self._security = security
        self._base = base
        self.decision = decision
        self._admission = admission
        self._progress = progress
        self.headers = dict(admission.headers)
        self._done = False
        self._closed = False
        self._start = time.perf_counter()
        security.open_requests.add(self)  # ended at shutdown if nothing else ends it

    def _event(self, kind: Any, outcome: Any, **fields: Any) -> AuditEvent:
        p = self._progress
        ttft = None if p.ttft_s is None else round(p.ttft_s * 1000, 3)
        if self.decision.audit_level == "minimal":
            fields.pop("response_bytes", None)
        return AuditEvent(
            event_id=new_event_id(),
            ts=datetime.now(UTC),
            kind=kind,
            outcome=outcome,
            prompt_tokens=p.prompt_tokens,
            completion_tokens=p.completion_tokens,
            finish_reason=_code(p.finish_reason),
            tool_calls_count=p.tool_calls,
            ttft_ms=ttft,
            latency_ms=round((time.perf_counter() - self._start) * 1000, 3),
            **self._base,
            **fields,
        )

    def routed(self, deployment: str, engine_class: str, reason: str, attempt: int) -> None:
        """Where the router sent the request: in every later event of it."""
        self._base["deployment"] = deployment
        self._base["detail"] = {
            "route_reason": reason,
            "engine_class": engine_class,
            "attempts": attempt,
        }
        self.headers["x-airgate-deployment"] = deployment

    def settled(self) -> None:
        """Nothing more to record but the refund (the request never ran)."""
        self._done = True

    async def complete(
        self,
        *,
        response_bytes: int | None = None,
        kind: Literal["inference.completed", "embedding.completed"] = "inference.completed",
    ) -> None:
        """Record the completion; in strict mode it is durable when this returns.
        Raises ServiceUnavailable when the audit log cannot take it (strict mode)."""
        event = self._event(kind, "success", http_status=200, response_bytes=response_bytes)
        self._done = True
        await self._security.record(event)

    async def close(self, error: BaseException | None = None) -> None:
        """Always called once the request is over: a failure or cancellation event if it did
        not complete, then the token refund and the stream slot (exactly once)."""
        if self._closed:
            return
        self._closed = True
        self._security.open_requests.discard(self)
        p = self._progress
        try:
            if not self._done:
                if error is None:
                    event = self._event("inference.cancelled", "cancelled")
                else:
                    status = error.status_code if isinstance(error, GatewayError) else 500
                    code = error.code if isinstance(error, GatewayError) else None
                    event = self._event(
                        "inference.failed",
                        "failure",
                        http_status=status,
                        error_class=code or type(error).__name__,
                    )
                self._security.audit.append_nowait(event)
        finally:
            used = (p.prompt_tokens or 0) + (p.completion_tokens or 0)
            await self._security.limiter.finish(self._admission, used_tokens=used)


def _code(text: str | None) -> str | None:
    return text if text and text.replace("_", "").isalnum() and text.islower() else None
