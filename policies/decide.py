"""`decide()`: one pure function from (policy, principal, request facts) to a `Decision`.

How rules combine: **the first matching rule wins**, like a firewall.  Rules are read in document
order, documents in the order the loader gives (files sorted by name, so prefix them `10-`,
`20-`, ...).  A rule matches a principal when one of its `teams` globs matches the principal's
team and its `roles` share at least one role with the principal.  The request's model is *not*
a matcher: it is checked against the deciding rule's effects, and a model that rule does not
allow is denied even when a later rule would allow it.  So every request of one API key is
judged by the same rule, and the limits the rate limiter receives do not change from one request
to the next.  No matching rule: denied (`no_matching_rule`), default deny.

The deciding rule's checks run in this order; the first that fails is the code:

    model_not_allowed          a `deny_models` glob matches (deny beats allow), or no
                               `models` glob does
    engine_class_not_allowed   no deployment of the model has a class in `engine_classes`
    max_tokens_exceeded        the request's max_tokens is above the rule's `max_tokens`
    n_exceeded                 n is above `max_n`
    prompt_too_large           prompt_bytes is above `max_prompt_bytes`

Suggested HTTP mapping for the gateway: 403 for no_matching_rule, model_not_allowed and
engine_class_not_allowed, 400 for max_tokens_exceeded and n_exceeded, 413 for prompt_too_large.

Pure: no clock, no I/O, no randomness; it never raises for any facts it is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from fnmatch import fnmatchcase

from .types import Decision, DecisionCode, Limits, PolicySet, Principal, RequestFacts, Rule

__all__ = ["can_use_model", "decide", "matching_rule", "rule_matches"]

_NO_LIMITS = Limits()


def _any_glob(name: str, globs: Iterable[str]) -> bool:
    return any(fnmatchcase(name, glob) for glob in globs)


def rule_matches(rule: Rule, principal: Principal) -> bool:
    """Whether `rule`'s matchers select `principal` (a team of None is the empty name, which
    only globs such as `*` match)."""
    if principal.roles.isdisjoint(rule.roles):
        return False
    return _any_glob(principal.team or "", rule.teams)


def _rules(policy: PolicySet) -> Iterator[tuple[str, Rule]]:
    for document in policy.documents:
        for rule in document.rules:
            yield f"{document.name}/{rule.name}", rule


def matching_rule(policy: PolicySet, principal: Principal) -> tuple[str, Rule] | None:
    """The rule that decides every request of `principal`, with its `document/rule` name."""
    for name, rule in _rules(policy):
        if rule_matches(rule, principal):
            return name, rule
    return None


def _model_allowed(rule: Rule, model: str) -> bool:
    return not _any_glob(model, rule.deny_models) and _any_glob(model, rule.models)


def can_use_model(policy: PolicySet, principal: Principal, model: str) -> bool:
    """Whether some request of `principal` for `model` can be allowed (to filter /v1/models)."""
    found = matching_rule(policy, principal)
    return found is not None and _model_allowed(found[1], model)


def _refusal(rule: Rule, request: RequestFacts) -> tuple[DecisionCode, str] | None:
    """(code, message) of the first check `request` fails under `rule`, None if it passes."""
    if not _model_allowed(rule, request.model):
        return "model_not_allowed", "this API key may not use the requested model"
    if request.engine_classes.isdisjoint(rule.engine_classes):
        return (
            "engine_class_not_allowed",
            "this API key may not be served by the engines that serve this model",
        )
    cap = rule.max_tokens
    if cap is not None and request.max_tokens is not None and request.max_tokens > cap:
        return "max_tokens_exceeded", f"max_tokens may be at most {cap} for this API key"
    if rule.max_n is not None and request.n > rule.max_n:
        return "n_exceeded", f"n may be at most {rule.max_n} for this API key"
    if rule.max_prompt_bytes is not None and request.prompt_bytes > rule.max_prompt_bytes:
        return (
            "prompt_too_large",
            f"the prompt may be at most {rule.max_prompt_bytes} bytes for this API key",
        )
    return None


def decide(policy: PolicySet, principal: Principal, request: RequestFacts) -> Decision:
    """Allow or deny one request, with the limits and audit level that apply to it."""
    found = matching_rule(policy, principal)
    if found is None:
        return Decision(
            allowed=False,
            code="no_matching_rule",
            message="no policy rule grants this API key access",
            rule=None,
            limits=_NO_LIMITS,
            effective_max_tokens=None,
            audit_level="metadata",
            policy_version=policy.version,
        )
    name, rule = found
    refusal = _refusal(rule, request)
    code, message = refusal if refusal is not None else ("allowed", "allowed")
    return Decision(
        allowed=refusal is None,
        code=code,
        message=message,
        rule=name,
        limits=Limits(
            requests_per_minute=rule.requests_per_minute,
            tokens_per_minute=rule.tokens_per_minute,
            concurrent_streams=rule.concurrent_streams,
            max_tokens=rule.max_tokens,
        ),
        effective_max_tokens=(
            request.max_tokens if request.max_tokens is not None else rule.max_tokens
        ),
        audit_level=rule.audit_level,
        policy_version=policy.version,
        engine_classes=frozenset(rule.engine_classes),
        priority=rule.priority,
    )
