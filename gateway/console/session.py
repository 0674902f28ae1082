"""Console sessions: a signed-in browser's server-side state, and its CSRF token.

A session id is 256 random bits, sent to the browser once as an HttpOnly, SameSite=Strict
cookie (`Secure` when the request came over TLS); the store keeps only its SHA-256, so a dump
of the process's memory or a log line never holds a usable id.  A session ends on sign-out,
after `[console] idle_timeout_s` without a request, or `absolute_timeout_s` after sign-in,
whichever comes first.  The CSRF token is per session and compared in constant time.

Sessions live in the serving process: a session is per replica (another replica does not know
it, and a restart signs everyone out).  A load balancer in front of several replicas must keep
a browser on one of them (sticky sessions), or the officer signs in again.

The clock is passed in (monotonic seconds) so the timeouts are tested without sleeping.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from ..access.auth import Principal
from ..config import ConsoleSettings

__all__ = ["COOKIE", "MAX_SESSIONS", "PRE_COOKIE", "Session", "SessionStore", "same_token"]

COOKIE = "airgate_console"  # the session id
PRE_COOKIE = "airgate_console_pre"  # the sign-in form's CSRF token (before any session)
MAX_SESSIONS = 10_000  # bounded: a flood of sign-ins evicts the least recently used


def _digest(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode("ascii", "replace")).digest()


def same_token(given: str | None, expected: str) -> bool:
    """Whether a submitted token is the expected one (constant time; a missing one is not)."""
    if not given:
        return False
    return hmac.compare_digest(given.encode("utf-8", "replace"), expected.encode())


@dataclass
class Session:
    """One signed-in browser: who, its CSRF token, and its clock readings."""

    principal: Principal
    csrf: str
    started: float
    seen: float


class SessionStore:
    """The sessions of this process (see the module docstring)."""

    def __init__(
        self,
        settings: ConsoleSettings,
        clock: Callable[[], float] = time.monotonic,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:
        self.idle_s = settings.idle_timeout_s
        self.absolute_s = settings.absolute_timeout_s
        self.clock = clock
        self._max = max_sessions
        self._sessions: OrderedDict[bytes, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def start(self, principal: Principal) -> tuple[str, Session]:
        """A new session for `principal`: `(id for the cookie, session)`."""
        session_id = secrets.token_urlsafe(32)  # 256 bits
        now = self.clock()
        session = Session(principal, secrets.token_urlsafe(32), now, now)
        while len(self._sessions) >= self._max:
            self._sessions.popitem(last=False)
        self._sessions[_digest(session_id)] = session
        return session_id, session

    def get(self, session_id: str | None) -> Session | None:
        """The live session of a cookie value (its idle clock restarted), or None: unknown,
        ended, idle too long or too old (an expired one is dropped)."""
        if not session_id or len(session_id) > 128:
            return None
        key = _digest(session_id)
        session = self._sessions.get(key)
        if session is None:
            return None
        now = self.clock()
        if now - session.seen > self.idle_s or now - session.started > self.absolute_s:
            del self._sessions[key]
            return None
        session.seen = now
        self._sessions.move_to_end(key)
        return session

    def end(self, session_id: str | None) -> None:
        """Sign out: the id is worthless from now on."""
        if session_id:
            self._sessions.pop(_digest(session_id), None)

    def end_key(self, key_id: str) -> int:
        """End every session of a key (it was revoked); how many ended."""
        gone = [k for k, s in self._sessions.items() if s.principal.key_id == key_id]
        for key in gone:
            del self._sessions[key]
        return len(gone)
