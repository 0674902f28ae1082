"""Admission of one inference request: policy, then limits, then the audit of its admission.

    admit() -> policy decide() -> limiter admit() -> `inference.admitted` (durable in strict
               mode, before any token is generated) -> the request's `Admitted` obligations
               (gateway/pipeline/completion.py)

Every denial is audited (`policy.denied`, `rate.limited`) before it is answered.  Audit events
carry ids, counts and codes only (see gateway/audit/event.py): never messages or completions.
"""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from typing import Any, Literal

import policies
from policies import RequestFacts

from ..access.auth import Principal
from ..access.identity import audit_principal
from ..access.limits import LimiterUnavailable, TokensExceedLimit
from ..access.stack import Security
from ..audit import AuditEvent, new_event_id
from ..engines.imported import lapsed_at
from ..engines.registry import ServedModel
from ..errors import (
    GatewayError,
    InvalidRequest,
    ModelExpired,
    PolicyDenied,
    RateLimited,
    RequestTooLarge,
    ServiceUnavailable,
)
from .completion import Admitted
from .facts import InferenceRequest, Progress

__all__ = ["admit"]

_log = logging.getLogger("airgate.gate")
_STATUS: dict[str, tuple[type[GatewayError], str | None]] = {
    "max_tokens_exceeded": (InvalidRequest, "max_tokens"),
    "n_exceeded": (InvalidRequest, "n"),
    "prompt_too_large": (RequestTooLarge, None),
}
_DENIED_PARAM = {"tools_not_allowed": "tools", "structured_outputs_not_allowed": "response_format"}
# The fields as the Responses API names them (a refusal names the field the client sent).
_RESPONSES_PARAM = {"max_tokens": "max_output_tokens", "response_format": "text.format"}
_DEFAULT_MAX_TOKENS = 256  # reserved when neither the request nor the policy caps it


def _policy_principal(p: Principal) -> policies.Principal:
    return policies.Principal(key_id=p.key_id, team=p.team, roles=p.roles, subject=p.subject)


async def admit(
    security: Security,
    request: InferenceRequest,
    model: ServedModel,
    progress: Progress,
) -> Admitted:
    """Decide, limit and record the admission of one inference request (or raise the error
    its client gets, after auditing it)."""
    principal = request.principal
    generation = request.generation
    facts = RequestFacts(
        model=model.id,
        engine_classes=model.engine_classes,
        max_tokens=generation.max_tokens,
        n=request.n,
        prompt_bytes=request.prompt_bytes,
        stream=request.stream,
        tools=generation.tools_offered,
        response_format=generation.output,
        action=request.action,
    )
    judge = security.policy.judge
    decision = judge.decide(_policy_principal(principal), facts)
    base: dict[str, Any] = {
        "request_id": request.request_id,
        "principal": audit_principal(principal),
        "action": request.action,
        "model": model.id,
        "route": request.route,
        "policy_version": judge.policy.version,
        "decision": decision.code,
    }
    if decision.audit_level != "minimal":  # minimal: who, what and the outcome only
        base["sampling"] = request.sampling
        base["request_bytes"] = request.prompt_bytes
        if generation.output != "text":
            base["response_format"] = generation.output
        if generation.tools_offered:
            base["tools_count"] = generation.tools_offered
    if request.embedding is not None:
        base["inputs_count"] = len(request.embedding.inputs)
    now = datetime.now(UTC)
    if not decision.allowed:
        error: GatewayError
        if decision.code in _STATUS:
            error_type, param = _STATUS[decision.code]
            error = error_type(decision.message, param=_param(request, param))
        else:
            error = PolicyDenied(
                decision.message,
                decision_code=decision.code,
                param=_param(request, _DENIED_PARAM.get(decision.code)),
            )
        await _deny(security, base, now, "policy.denied", error)
        raise error
    if lapsed_at(model, now) is not None:  # an imported bundle past its end: not served
        expired = ModelExpired(
            "the model's bundle is past its offline window or expiry; the operator needs a "
            "renewal from HQ (`airgate bundle renew`)",
            param="model",
        )
        await _deny(
            security, {**base, "decision": ModelExpired.code}, now, "policy.denied", expired
        )
        raise expired
    limits = decision.limits
    # every choice may generate up to its max_tokens (an embedding generates nothing); a prompt
    # token is rarely under 4 bytes.  The refund settles on the tokens actually used.
    reserve = math.ceil(request.prompt_bytes / 4)
    if request.embedding is None:
        asked = decision.effective_max_tokens or generation.max_tokens or _DEFAULT_MAX_TOKENS
        reserve += asked * request.n * generation.sequences
    try:
        admission = await security.limiter.admit(
            principal.key_id,
            rpm=limits.requests_per_minute,
            tpm=limits.tokens_per_minute,
            streams=limits.concurrent_streams if request.stream else None,
            tokens=reserve,
        )
    except TokensExceedLimit as exc:
        too_large = RateLimited(str(exc))
        await _deny(security, base, now, "rate.limited", too_large)
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
        await _deny(security, base, now, "rate.limited", limited)
        raise limited
    admitted = Admitted(security, base, decision, admission, progress)
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
        admitted.settled()  # nothing ran: no failure event, only the refund
        await admitted.close()
        raise
    return admitted


def _param(request: InferenceRequest, param: str | None) -> str | None:
    if request.action == "responses" and param is not None:
        return _RESPONSES_PARAM.get(param, param)
    return param


async def _deny(
    security: Security,
    base: dict[str, Any],
    now: datetime,
    kind: Literal["policy.denied", "rate.limited"],
    error: GatewayError,
) -> None:
    await security.record(
        AuditEvent(
            event_id=new_event_id(),
            ts=now,
            kind=kind,
            outcome="denied",
            http_status=error.status_code,
            **base,
        ),
    )
