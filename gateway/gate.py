"""Admission of one inference request: policy, limits and the audit trail around generation.

    admit()  -> policy decide() -> limiter admit() -> `inference.admitted` (durable in strict
                mode, before any token is generated)
    Admitted.complete() -> `inference.completed`, durable before the response's final bytes
    Admitted.close()    -> `inference.failed` / `inference.cancelled` when it did not complete,
                           and the limiter refund (always, exactly once)

Every denial is audited (`policy.denied`, `rate.limited`) before it is answered.  Audit events
carry ids, counts and codes only (see gateway/audit/event.py): never messages or completions.
"""

from __future__ import annotations

import logging
import math
import time
from datetime import UTC, datetime
from typing import Any, Literal

import policies
from policies import Decision, RequestFacts

from .audit import AuditEvent, AuditPrincipal, new_event_id
from .auth import Principal
from .errors import (
    GatewayError,
    InvalidRequest,
    PolicyDenied,
    RateLimited,
    RequestTooLarge,
    ServiceUnavailable,
)
from .limits import Admission, LimiterUnavailable, TokensExceedLimit
from .reqlog import RequestInfo, route_of
from .security import Security

__all__ = ["Admitted", "admit"]

_log = logging.getLogger("airgate.gate")
_STATUS: dict[str, tuple[type[GatewayError], str | None]] = {
    "max_tokens_exceeded": (InvalidRequest, "max_tokens"),
    "n_exceeded": (InvalidRequest, "n"),
    "prompt_too_large": (RequestTooLarge, None),
}
_DEFAULT_MAX_TOKENS = 256  # reserved when neither the request nor the policy caps it


def audit_principal(p: Principal) -> AuditPrincipal:
    return AuditPrincipal(key_id=p.key_id, team=p.team, subject=p.subject, method=p.method)


def _policy_principal(p: Principal) -> policies.Principal:
    return policies.Principal(key_id=p.key_id, team=p.team, roles=p.roles, subject=p.subject)


class Admitted:
    """One admitted request's obligations: its completion event and its limiter refund."""

    def __init__(
        self,
        security: Security,
        base: dict[str, Any],
        decision: Decision,
        admission: Admission,
    ) -> None:
        self._security = security
        self._base = base
        self.decision = decision
        self._admission = admission
        self.headers = dict(admission.headers)
        self.effective_max_tokens = decision.effective_max_tokens
        self.routed_to: str | None = None
        self._done = False
        self._closed = False
        self._start = time.perf_counter()

    def _event(self, kind: Any, outcome: Any, info: RequestInfo, **fields: Any) -> AuditEvent:
        ttft = None if info.ttft_s is None else round(info.ttft_s * 1000, 3)
        if self.decision.audit_level == "minimal":
            fields.pop("response_bytes", None)
        return AuditEvent(
            event_id=new_event_id(),
            ts=datetime.now(UTC),
            kind=kind,
            outcome=outcome,
            prompt_tokens=info.prompt_tokens,
            completion_tokens=info.completion_tokens,
            finish_reason=_code(info.finish_reason),
            ttft_ms=ttft,
            latency_ms=round((time.perf_counter() - self._start) * 1000, 3),
            **self._base,
            **fields,
        )

    def routed(self, deployment: str, engine_class: str, reason: str, attempt: int) -> None:
        """Where the router sent the request: in every later event of it."""
        self.routed_to = deployment
        self._base["deployment"] = deployment
        self._base["detail"] = {
            "route_reason": reason,
            "engine_class": engine_class,
            "attempts": attempt,
        }
        self.headers["x-airgate-deployment"] = deployment

    async def complete(self, info: RequestInfo, *, response_bytes: int | None = None) -> None:
        """Record the completion; in strict mode it is durable when this returns.
        Raises ServiceUnavailable when the audit log cannot take it (strict mode)."""
        event = self._event(
            "inference.completed", "success", info, http_status=200, response_bytes=response_bytes
        )
        self._done = True
        await self._security.record(event)

    async def close(self, info: RequestInfo, *, error: BaseException | None = None) -> None:
        """Always called once the request is over: a failure or cancellation event if it did
        not complete, then the token refund and the stream slot."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self._done:
                if error is None:
                    event = self._event("inference.cancelled", "cancelled", info)
                else:
                    status = error.status_code if isinstance(error, GatewayError) else 500
                    code = error.code if isinstance(error, GatewayError) else None
                    event = self._event(
                        "inference.failed",
                        "failure",
                        info,
                        http_status=status,
                        error_class=code or type(error).__name__,
                    )
                self._security.audit.append_nowait(event)
        finally:
            used = (info.prompt_tokens or 0) + (info.completion_tokens or 0)
            await self._security.limiter.finish(self._admission, used_tokens=used)


def _code(text: str | None) -> str | None:
    return text if text and text.replace("_", "").isalnum() and text.islower() else None


async def admit(
    security: Security,
    principal: Principal,
    info: RequestInfo,
    *,
    action: Literal["chat.completions", "completions"],
    route: str,
    model: str,
    engine_classes: frozenset[policies.EngineClass],
    max_tokens: int | None,
    n: int,
    prompt_bytes: int,
    stream: bool,
    sampling: dict[str, bool | int | float],
    sequences: int = 1,
) -> Admitted:
    """Decide, limit and record the admission of one inference request (or raise the error
    its client gets, after auditing it)."""
    facts = RequestFacts(
        model=model,
        engine_classes=engine_classes,
        max_tokens=max_tokens,
        n=n,
        prompt_bytes=prompt_bytes,
        stream=stream,
    )
    judge = security.policy.judge
    policy = judge.policy
    decision = judge.decide(_policy_principal(principal), facts)
    base: dict[str, Any] = {
        "request_id": info.request_id,
        "principal": audit_principal(principal),
        "action": action,
        "model": model,
        "route": route_of(route),
        "sampling": sampling,
        "request_bytes": prompt_bytes,
        "policy_version": policy.version,
        "decision": decision.code,
    }
    if decision.audit_level == "minimal":  # the policy asks for who, what and the outcome only
        for detail in ("sampling", "request_bytes"):
            base.pop(detail)
    now = datetime.now(UTC)
    if not decision.allowed:
        error: GatewayError
        if decision.code in _STATUS:
            error_type, param = _STATUS[decision.code]
            error = error_type(decision.message, param=param)
        else:
            error = PolicyDenied(decision.message, decision_code=decision.code)
        await security.record(
            AuditEvent(
                event_id=new_event_id(),
                ts=now,
                kind="policy.denied",
                outcome="denied",
                http_status=error.status_code,
                **base,
            ),
        )
        raise error
    limits = decision.limits
    # every sequence (a prompt of a list, times n) may generate up to max_tokens
    reserve = (decision.effective_max_tokens or max_tokens or _DEFAULT_MAX_TOKENS) * n * sequences
    reserve += math.ceil(prompt_bytes / 4)  # a prompt token is rarely under 4 bytes
    try:
        admission = await security.limiter.admit(
            principal.key_id,
            rpm=limits.requests_per_minute,
            tpm=limits.tokens_per_minute,
            streams=limits.concurrent_streams if stream else None,
            tokens=reserve,
        )
    except TokensExceedLimit as exc:
        admission = Admission(allowed=False, reason="tokens")
        too_large: GatewayError = RateLimited(str(exc))
        await _deny_rate(security, base, now, too_large)
        raise too_large from None
    except LimiterUnavailable:
        raise ServiceUnavailable(
            "rate limits cannot be checked right now", headers={"Retry-After": "1"}
        ) from None
    base["degraded"] = admission.degraded
    if not admission.allowed:
        limited = RateLimited(
            f"rate limit exceeded ({admission.reason}); retry later", headers=admission.headers
        )
        await _deny_rate(security, base, now, limited)
        raise limited
    admitted = Admitted(security, base, decision, admission)
    try:
        await security.record(
            AuditEvent(
                event_id=new_event_id(),
                ts=now,
                kind="inference.admitted",
                outcome="success",
                **base,
            ),
        )
    except BaseException:
        admitted._done = True  # nothing ran: no failure event, only the refund
        await admitted.close(info)
        raise
    return admitted


async def _deny_rate(
    security: Security, base: dict[str, Any], now: datetime, error: GatewayError
) -> None:
    await security.record(AuditEvent(
            event_id=new_event_id(),
            ts=now,
            kind="rate.limited",
            outcome="denied",
            http_status=error.status_code,
            **base,
        ),
    )
