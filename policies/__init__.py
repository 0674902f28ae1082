"""Policy-as-code: typed policy documents, loaded from TOML, and a pure `decide()`.

The gateway loads a `PolicySet` once (`load_policy_dir`, or `load_default_policy` for the
shipped `default.toml`), then asks `decide(policy, principal, request)` for every request: the
first rule whose teams and roles match the principal decides (default deny), and the `Decision`
carries the code, a client-safe message, the limits for the rate limiter, the effective
max_tokens, the audit level and the policy version.  `lint` is `airgate policy check`.

No I/O beyond reading policy files; nothing here imports the gateway, backends or bundles.

Errors (only loading raises; `decide` returns denials as decisions):

    PolicyError          a policy file or directory cannot be loaded; the message names the
                         file and the key (`team-a.toml: rules[2].max_tokens: Expected int >= 1`)
"""

from .decide import Judge, can_use_model, decide, matching_rule
from .errors import PolicyError
from .lint import lint
from .loader import load_default_policy, load_policy_dir, loads_policy, policy_set
from .types import (
    ACTIONS,
    ROLES,
    Action,
    AuditLevel,
    Decision,
    DecisionCode,
    EngineClass,
    Limits,
    PolicyDocument,
    PolicySet,
    Principal,
    RequestFacts,
    Role,
    Rule,
)

__all__ = [
    "ACTIONS",
    "ROLES",
    "Action",
    "AuditLevel",
    "Decision",
    "DecisionCode",
    "EngineClass",
    "Judge",
    "Limits",
    "PolicyDocument",
    "PolicyError",
    "PolicySet",
    "Principal",
    "RequestFacts",
    "Role",
    "Rule",
    "can_use_model",
    "decide",
    "lint",
    "load_default_policy",
    "load_policy_dir",
    "loads_policy",
    "matching_rule",
    "policy_set",
]
