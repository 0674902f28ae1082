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

    action_not_allowed         the request's action is not in the rule's `actions`
    model_not_allowed          a `deny_models` glob matches (deny beats allow), or no
                               `models` glob does (`action_models[action]` in its place
                               where the rule has one for the request's action)
    engine_class_not_allowed   no deployment of the model has a class in `engine_classes`
    max_tokens_exceeded        the request's max_tokens is above the rule's `max_tokens`
    n_exceeded                 n is above `max_n`
    tools_not_allowed          the request offers tools and the rule says `tools = false`
    structured_outputs_not_allowed
                               json_object / json_schema asked, `structured_outputs = false`
    prompt_too_large           prompt_bytes is above `max_prompt_bytes`

Suggested HTTP mapping for the gateway: 403 for no_matching_rule, action_not_allowed,
model_not_allowed,
engine_class_not_allowed, tools_not_allowed and structured_outputs_not_allowed, 400 for
max_tokens_exceeded and n_exceeded, 413 for prompt_too_large.

Pure: no clock, no I/O, no randomness; it never raises for any facts it is given.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from fnmatch import fnmatchcase

import msgspec

from .types import (
    Action,
    Decision,
    DecisionCode,
    EngineClass,
    Limits,
    PolicySet,
    Principal,
    RequestFacts,
    Rule,
)

__all__ = ["Judge", "can_use_model", "decide", "matching_rule", "rule_matches"]

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


def _model_allowed(rule: Rule, model: str, action: Action | None = None) -> bool:
    """Whether `rule` lets `model` be used for `action` (None: for any action it allows)."""
    if _any_glob(model, rule.deny_models):
        return False
    if action is None:
        return any(_model_allowed(rule, model, a) for a in rule.actions)
    if action not in rule.actions:
        return False
    return _any_glob(model, rule.action_models.get(action, rule.models))


def can_use_model(policy: PolicySet, principal: Principal, model: str) -> bool:
    """Whether some request of `principal` for `model` can be allowed (to filter /v1/models)."""
    found = matching_rule(policy, principal)
    return found is not None and _model_allowed(found[1], model)


class _Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """What `decide` concludes from (principal, model, engine classes) alone: the rule scan and
    the model globs.  The per-request caps (max_tokens, n, prompt size) are checked after."""

    rule_name: str | None
    rule: Rule | None
    refusal: tuple[DecisionCode, str] | None  # model or engine class refused
    limits: Limits
    engine_classes: frozenset[EngineClass]


def _verdict(
    policy: PolicySet,
    principal: Principal,
    model: str,
    engine_classes: frozenset[EngineClass],
    action: Action,
) -> _Verdict:
    found = matching_rule(policy, principal)
    if found is None:
        return _Verdict(
            rule_name=None,
            rule=None,
            refusal=("no_matching_rule", "no policy rule grants this API key access"),
            limits=_NO_LIMITS,
            engine_classes=frozenset(),
        )
    name, rule = found
    refusal: tuple[DecisionCode, str] | None = None
    if action not in rule.actions:
        refusal = "action_not_allowed", "this API key may not use this endpoint"
    elif not _model_allowed(rule, model, action):
        refusal = "model_not_allowed", "this API key may not use the requested model"
    elif engine_classes.isdisjoint(rule.engine_classes):
        refusal = (
            "engine_class_not_allowed",
            "this API key may not be served by the engines that serve this model",
        )
    return _Verdict(
        rule_name=name,
        rule=rule,
        refusal=refusal,
        limits=Limits(
            requests_per_minute=rule.requests_per_minute,
            tokens_per_minute=rule.tokens_per_minute,
            concurrent_streams=rule.concurrent_streams,
            max_tokens=rule.max_tokens,
        ),
        engine_classes=frozenset(rule.engine_classes),
    )


def _cap_refusal(rule: Rule, request: RequestFacts) -> tuple[DecisionCode, str] | None:
    """(code, message) of the first per-request cap `request` exceeds under `rule`."""
    cap = rule.max_tokens
    if cap is not None and request.max_tokens is not None and request.max_tokens > cap:
        return "max_tokens_exceeded", f"max_tokens may be at most {cap} for this API key"
    if rule.max_n is not None and request.n > rule.max_n:
        return "n_exceeded", f"n may be at most {rule.max_n} for this API key"
    if request.tools and not rule.tools:
        return "tools_not_allowed", "this API key may not offer tools to the model"
    if request.response_format != "text" and not rule.structured_outputs:
        return (
            "structured_outputs_not_allowed",
            "this API key may not ask for structured outputs",
        )
    if rule.max_prompt_bytes is not None and request.prompt_bytes > rule.max_prompt_bytes:
        return (
            "prompt_too_large",
            f"the prompt may be at most {rule.max_prompt_bytes} bytes for this API key",
        )
    return None


def _decision(version: str, verdict: _Verdict, request: RequestFacts) -> Decision:
    rule = verdict.rule
    if rule is None:
        assert verdict.refusal is not None
        code, message = verdict.refusal
        return Decision(
            allowed=False,
            code=code,
            message=message,
            rule=None,
            limits=_NO_LIMITS,
            effective_max_tokens=None,
            audit_level="metadata",
            policy_version=version,
        )
    refusal = verdict.refusal or _cap_refusal(rule, request)
    code, message = refusal if refusal is not None else ("allowed", "allowed")
    return Decision(
        allowed=refusal is None,
        code=code,
        message=message,
        rule=verdict.rule_name,
        limits=verdict.limits,
        effective_max_tokens=(
            request.max_tokens if request.max_tokens is not None else rule.max_tokens
        ),
        audit_level=rule.audit_level,
        policy_version=version,
        engine_classes=verdict.engine_classes,
        priority=rule.priority,
        raw_prompt_special_tokens=rule.raw_prompt_special_tokens,
    )


def decide(policy: PolicySet, principal: Principal, request: RequestFacts) -> Decision:
    """Allow or deny one request, with the limits and audit level that apply to it."""
    verdict = _verdict(policy, principal, request.model, request.engine_classes, request.action)
    return _decision(policy.version, verdict, request)


class Judge:
    """`decide()` for one policy set, remembering the rule scan and the model globs per
    (principal, model, engine classes): a gateway asks for the same few combinations at every
    request.  A new policy gets a new Judge, so nothing outlives the version it was computed
    for.  At most `size` combinations are kept (then the memory starts over)."""

    __slots__ = ("_size", "_verdicts", "policy")

    def __init__(self, policy: PolicySet, size: int = 4096) -> None:
        self.policy = policy
        self._size = size
        self._verdicts: dict[tuple[Principal, str, frozenset[EngineClass], Action], _Verdict] = {}

    def decide(self, principal: Principal, request: RequestFacts) -> Decision:
        """The same Decision `decide(self.policy, principal, request)` returns."""
        key = (principal, request.model, request.engine_classes, request.action)
        verdict = self._verdicts.get(key)
        if verdict is None:
            if len(self._verdicts) >= self._size:
                self._verdicts.clear()
            verdict = _verdict(self.policy, principal, *key[1:])
            self._verdicts[key] = verdict
        return _decision(self.policy.version, verdict, request)
