"""`protect(settings)`: the egress guard for a serving process, before any engine starts."""

from __future__ import annotations

import logging
import os

from .. import env
from ..config import Settings
from .allow_list import AllowList, allow_list_from
from .denials import DENIALS
from .guard import install

__all__ = ["protect"]

_log = logging.getLogger("airgate.egress")


def protect(settings: Settings) -> AllowList | None:
    """Third-party phone-home off for this process and every child (always); then, unless
    `[egress] enabled = false`, the guard with the configured endpoints, its refusals counted
    and audited here, a child's reported to this process.  Returns the allow-list in force."""
    for name, value in env.OFFLINE.items():
        os.environ[name] = value
    if not settings.egress.enabled:
        _log.warning("egress guard off ([egress] enabled = false)")
        return None
    allow = allow_list_from(settings)
    os.environ[env.EGRESS_REPORT] = DENIALS.listen()
    install(allow, on_denied=DENIALS.denied)
    _log.info("egress guard on: connections only to %s", allow)
    return allow
