"""Who is calling: the one value that auth hands to policy, limits and the audit log."""

from __future__ import annotations

from typing import Final, Literal

import msgspec

__all__ = ["METHODS", "ROLES", "Method", "Principal", "Role"]

Role = Literal["app", "auditor", "admin"]
Method = Literal["api_key", "jwt", "mtls"]

ROLES: Final[frozenset[str]] = frozenset({"app", "auditor", "admin"})
METHODS: Final[frozenset[str]] = frozenset({"api_key", "jwt", "mtls"})


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    """An authenticated caller.

    `key_id` is the stable identifier that limits and the audit log are keyed by: an API key id,
    `jwt:<issuer hash>:<sub>` or `mtls:<certificate SHA-256>`.  `roles` is a subset of `ROLES`
    (possibly empty: authenticated but allowed nothing).  `subject` is a display name for the
    audit log (key name, token `sub`, certificate subject), never a secret.
    """

    key_id: str
    method: Method
    team: str | None = None
    roles: frozenset[str] = frozenset()
    subject: str | None = None
