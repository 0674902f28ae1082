"""The runtime egress guard: outbound connections only to loopback and configured endpoints.

    allow_list.py   AllowList, Endpoint, parse_entry, allow_list_from(settings)
    guard.py        the audit hook (and uvloop's wrappers): install(), installed(), EgressDenied
    denials.py      the serving process's refusals: counted, logged, audited (`egress.denied`),
                    children's received over a unix socket
    startup.py      protect(settings): what `serve` calls before any engine starts
    _site/          the `sitecustomize` that guards every Python child from its first line

Exception tree:

    ConnectionRefusedError (OSError)
     └── EgressDenied        a destination outside the allow-list (`.destination`)

Only the standard library is imported here: a child process imports this package first.
"""

from .allow_list import AllowList, Endpoint, allow_list_from, parse_entry
from .guard import EgressDenied, install, installed

__all__ = [
    "AllowList",
    "EgressDenied",
    "Endpoint",
    "allow_list_from",
    "install",
    "installed",
    "parse_entry",
]
