"""Who is calling: the one value that auth hands to policy, limits and the audit log.

Audit scope (whose audit events a caller may read through the compliance API): an admin and a
*global auditor* read every team's; any other auditor reads only its own team's, and an auditor
without a team reads none.  Who is a global auditor depends on the credential:

    API key   role `auditor` stored without a team (created with `--all-teams` /
              `"all_teams": true`); an auditor key with a team is scoped to it
    JWT       a roles claim value mapped (or equal) to `global_auditor`; otherwise scoped to
              its team claim
    mTLS      a subject-map entry with the role `global_auditor`

`global_auditor` is a grant, not a role: it gives the role `auditor` plus `all_teams`, so the
policy documents keep their three roles.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, Literal

import msgspec

__all__ = [
    "GLOBAL_AUDITOR",
    "GRANTS",
    "METHODS",
    "ROLES",
    "Grant",
    "Method",
    "Principal",
    "Role",
    "audit_teams",
    "grant",
]

Role = Literal["app", "auditor", "admin"]
Grant = Literal["app", "auditor", "admin", "global_auditor"]  # what JWT and mTLS maps name
Method = Literal["api_key", "jwt", "mtls", "local"]  # local: `[auth] local_trust`

ROLES: Final[frozenset[str]] = frozenset({"app", "auditor", "admin"})
GLOBAL_AUDITOR: Final = "global_auditor"
GRANTS: Final[frozenset[str]] = ROLES | {GLOBAL_AUDITOR}
METHODS: Final[frozenset[str]] = frozenset({"api_key", "jwt", "mtls", "local"})


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """An authenticated caller.

    `key_id` is the stable identifier that limits and the audit log are keyed by: an API key id,
    `jwt:<issuer hash>:<sub>` or `mtls:<certificate SHA-256>`.  `roles` is a subset of `ROLES`
    (possibly empty: authenticated but allowed nothing).  `subject` is a display name for the
    audit log (key name, token `sub`, certificate subject), never a secret.  `all_teams`: a
    global auditor (see the module docstring; `audit_teams` is the rule).
    """

    key_id: str
    method: Method
    team: str | None = None
    roles: frozenset[str] = frozenset()
    subject: str | None = None
    all_teams: bool = False


def grant(names: Iterable[str]) -> tuple[frozenset[str], bool]:
    """`(roles, all_teams)` from grant names (unknown names dropped): `global_auditor` gives
    the role `auditor` and `all_teams`."""
    wanted = frozenset(names)
    roles = wanted & ROLES
    if GLOBAL_AUDITOR in wanted:
        return roles | {"auditor"}, True
    return roles, False


def audit_teams(p: Principal) -> frozenset[str] | None:
    """The teams whose audit events `p` may read: None for every team (an admin, a global
    auditor), else its own team, or no team at all (a teamless auditor that is not global)."""
    if "admin" in p.roles or (p.all_teams and "auditor" in p.roles):
        return None
    return frozenset({p.team}) if p.team is not None else frozenset()
