"""Policy documents (decoded from TOML, unknown keys forbidden), the facts `decide()` reads and the
`Decision` it returns.

A document is a name, an optional description and an ordered list of `[[rules]]`:

    name = "team-a"

    [[rules]]
    name = "research-large"
    teams = ["research-*"]          # globs over the principal's team (default ["*"])
    roles = ["app"]                 # any of "app", "auditor", "admin" (default: all three)
    models = ["llama-70b*"]         # model id globs this rule allows (default: none)
    deny_models = ["*-preview"]     # globs denied even when `models` matches
    max_tokens = 8192               # cap; also the default for a request without max_tokens
    max_n = 1
    max_prompt_bytes = 1048576
    requests_per_minute = 600       # limits handed to the rate limiter, not enforced here
    tokens_per_minute = 200000
    concurrent_streams = 16
    engine_classes = ["gpu"]        # any of "gpu", "edge" (default: both)
    actions = ["chat.completions", "embeddings"]  # what it may ask (default: every action)
    action_models = { embeddings = ["all-minilm-*"] }  # per action, in place of `models`
    audit_level = "metadata"        # or "minimal"
    priority = 0                    # engine scheduling priority: lower runs first (vLLM)
    raw_prompt_special_tokens = true  # false: /v1/completions prompts are plain text

How rules combine is defined once, in `policies.decide`: the first rule whose `teams` and
`roles` match the principal decides, like a firewall.  A cap left out means "no cap".
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

__all__ = [
    "ACTIONS",
    "ROLES",
    "Action",
    "AuditLevel",
    "Decision",
    "DecisionCode",
    "EngineClass",
    "Limits",
    "PolicyDocument",
    "PolicySet",
    "Principal",
    "RequestFacts",
    "Role",
    "Rule",
]

Role = Literal["app", "auditor", "admin"]
EngineClass = Literal["gpu", "edge"]
# What a request asks for, in its protocol's words (Ollama's routes map onto these).
Action = Literal["chat.completions", "completions", "responses", "embeddings"]
ACTIONS: tuple[Action, ...] = Action.__args__  # type: ignore[attr-defined]
AuditLevel = Literal["metadata", "minimal"]
DecisionCode = Literal[
    "allowed",
    "model_not_allowed",
    "action_not_allowed",
    "engine_class_not_allowed",
    "max_tokens_exceeded",
    "n_exceeded",
    "prompt_too_large",
    "tools_not_allowed",
    "structured_outputs_not_allowed",
    "no_matching_rule",
]
ROLES: tuple[Role, ...] = ("app", "auditor", "admin")

# Names end up in audit rows and decisions: keep them short and printable.
Name = Annotated[str, Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
# fnmatch globs (`*`, `?`, `[seq]`), case-sensitive, `*` also crosses `/` and `:`
Glob = Annotated[str, Meta(min_length=1, max_length=256, pattern=r"^\S+$")]
Positive = Annotated[int, Meta(ge=1)]


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class Rule(_Strict, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One `[[rules]]` entry: matchers (`teams`, `roles`) then effects (everything else)."""

    name: Name
    teams: Annotated[tuple[Glob, ...], Meta(min_length=1)] = ("*",)
    roles: Annotated[tuple[Role, ...], Meta(min_length=1)] = ROLES
    models: tuple[Glob, ...] = ()
    deny_models: tuple[Glob, ...] = ()
    max_tokens: Positive | None = None
    max_n: Positive | None = None
    max_prompt_bytes: Positive | None = None
    requests_per_minute: Positive | None = None
    tokens_per_minute: Positive | None = None
    concurrent_streams: Positive | None = None
    engine_classes: Annotated[tuple[EngineClass, ...], Meta(min_length=1)] = ("gpu", "edge")
    actions: Annotated[tuple[Action, ...], Meta(min_length=1)] = ACTIONS
    # per action, the model globs that replace `models` (deny_models still applies)
    action_models: dict[Action, tuple[Glob, ...]] = {}
    tools: bool = True  # may requests offer the model tools to call
    structured_outputs: bool = True  # may requests ask for json_object / json_schema output
    # Whether a raw prompt (/v1/completions) may spell control tokens (`<start_of_turn>` as one
    # token, as OpenAI-compatible servers do); false tokenises it as plain text.  Chat message
    # content is always plain text.
    raw_prompt_special_tokens: bool = True
    audit_level: AuditLevel = "metadata"
    # engine scheduling priority (vLLM: lower runs first; engines without priorities ignore it)
    priority: Annotated[int, Meta(ge=-1000, le=1000)] = 0


class PolicyDocument(_Strict, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One policy file."""

    name: Name
    description: Annotated[str, Meta(max_length=4096)] | None = None
    rules: tuple[Rule, ...] = ()


class PolicySet(msgspec.Struct, frozen=True, kw_only=True):
    """Every loaded document, in evaluation order, and the version that identifies them.

    `sources[i]` is the file `documents[i]` came from (for messages).  `version` is the first 16
    hex digits of SHA-256 over the canonical JSON of `documents`: comments, whitespace and the
    spelling of defaults do not change it, any change to a value or to the order does.  Build one
    with `policies.loader.policy_set` (or a `load_*` function), which computes `version`.
    """

    documents: tuple[PolicyDocument, ...]
    sources: tuple[str, ...]
    version: str


class Principal(msgspec.Struct, frozen=True):
    """Who is asking, as auth resolved it.  `team` None matches only the glob `*`."""

    key_id: str
    team: str | None
    roles: frozenset[str]
    subject: str | None


class RequestFacts(msgspec.Struct, frozen=True):
    """What the policy needs to know about one request; never its content.

    `engine_classes` are the classes of the deployments that could serve it (the router picks
    one among those the policy allows); `prompt_bytes` the size
    of the prompt as received.  `stream` is carried for the limiter (`concurrent_streams` counts
    streams only) and for the audit; no rule depends on it yet.
    """

    model: str
    engine_classes: frozenset[EngineClass]
    max_tokens: int | None
    n: int
    prompt_bytes: int
    stream: bool
    tools: int = 0  # tools offered (0: none)
    response_format: str = "text"  # "text", "json_object" or "json_schema"
    action: Action = "chat.completions"


class Limits(msgspec.Struct, frozen=True):
    """The deciding rule's limits for the rate limiter; None means unlimited."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    concurrent_streams: int | None = None
    max_tokens: int | None = None


class Decision(msgspec.Struct, frozen=True, kw_only=True):
    """The answer for one request.

    `message` is safe to show the client: it names the limit that was hit, never request content
    (not even the model id).  `rule` is `"<document>/<rule>"`, None when no rule matched.
    `effective_max_tokens` is the request's max_tokens, or the rule's cap when the request gave
    none (None: no cap and none requested).  `limits` and `audit_level` are the deciding rule's
    even when the request is denied; `engine_classes` are the classes the rule lets serve this
    principal (for the router), empty when no rule matched.  `raw_prompt_special_tokens` is the
    rule's: whether the engine parses control tokens spelled in a raw prompt.
    """

    allowed: bool
    code: DecisionCode
    message: str
    rule: str | None
    limits: Limits
    effective_max_tokens: int | None
    audit_level: AuditLevel
    policy_version: str
    engine_classes: frozenset[EngineClass] = frozenset()
    priority: int = 0
    raw_prompt_special_tokens: bool = True
