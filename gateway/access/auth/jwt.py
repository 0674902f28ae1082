"""JWT bearer tokens checked against a local JWKS file: offline, never a URL.

What is trusted comes from configuration only: the algorithm allow-list (asymmetric only), the
issuer, the audience and the keys in the JWKS file.  Nothing in a token's header chooses a key
or an algorithm beyond selecting a configured key by `kid`: `jku`, `x5u`, `jwk` and `x5c` are
never read, `alg` must be on the allow-list and equal to the selected key's algorithm (so `none`
and HS256-signed-with-the-public-key are refused), and the size is capped before any parsing.

PyJWT checks the signature, `iss`, `aud` and that `exp`, `iat`, `aud`, `iss`, `sub` are present.
The time claims are checked here, with the same rules and leeway as PyJWT's but against the
clock passed in, because PyJWT reads the wall clock itself.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import jwt
import msgspec
from jwt import exceptions as jwt_errors

from .errors import AuthConfigError, InvalidToken
from .principal import GRANTS, Principal, grant

__all__ = ["DEFAULT_ALGORITHMS", "JwtVerifier"]

_log = logging.getLogger("airgate.auth")

DEFAULT_ALGORITHMS: Final = ("RS256", "ES256", "EdDSA")
_ASYMMETRIC: Final = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)
_REQUIRED: Final = ["exp", "iat", "aud", "iss", "sub"]
_MAX_SUBJECT: Final = 256
_MAX_TEAM: Final = 128

# Most specific first: InvalidSignatureError is a DecodeError.
_REASONS: Final[tuple[tuple[type[Exception], str], ...]] = (
    (jwt.InvalidSignatureError, "bad_signature"),
    (jwt.InvalidAlgorithmError, "alg_not_allowed"),
    (jwt.InvalidAudienceError, "wrong_audience"),
    (jwt.InvalidIssuerError, "wrong_issuer"),
    (jwt.MissingRequiredClaimError, "missing_claim"),
    (jwt_errors.InvalidSubjectError, "bad_claim"),
    (jwt_errors.InvalidJTIError, "bad_claim"),
    (jwt.DecodeError, "malformed"),
)


def _number(payload: Mapping[str, Any], claim: str) -> float | None:
    value = payload.get(claim)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidToken("bad_claim")
    return float(value)


def _check_times(payload: Mapping[str, Any], now: float, leeway: float) -> None:
    exp = _number(payload, "exp")
    iat = _number(payload, "iat")
    nbf = _number(payload, "nbf")
    if exp is None or iat is None:
        raise InvalidToken("missing_claim")
    if exp <= now - leeway:
        raise InvalidToken("expired")
    if iat > now + leeway or (nbf is not None and nbf > now + leeway):
        raise InvalidToken("not_yet_valid")


def _text(value: object, limit: int) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= limit or not value.isprintable():
        raise InvalidToken("bad_claim")
    return value


class _Jwks:
    """The usable verification keys of a JWKS file, by `kid`, reloaded when the file changes."""

    def __init__(self, path: Path, algorithms: frozenset[str]) -> None:
        self._path = path
        self._algorithms = algorithms
        self._stamp: tuple[int, int, int] | None = None
        self._keys: dict[str, jwt.PyJWK] = {}
        try:
            self._stamp = self._stat()
            self._keys = self._load()
        except (OSError, ValueError, jwt.PyJWTError) as exc:
            raise AuthConfigError(f"JWKS file {path} is unusable: {type(exc).__name__}") from exc

    def _stat(self) -> tuple[int, int, int]:
        st = os.stat(self._path)
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _load(self) -> dict[str, jwt.PyJWK]:
        document = msgspec.json.decode(self._path.read_bytes())
        raw = document.get("keys") if isinstance(document, dict) else None
        if not isinstance(raw, list):
            raise AuthConfigError(f'JWKS file {self._path} has no "keys" list')
        candidates: list[dict[str, Any]] = []
        for data in raw:
            why = None
            if not isinstance(data, dict):
                why = "that is not an object"
            elif data.get("kty") == "oct":
                why = "that is symmetric"
            elif "d" in data:
                why = "that is private"
            elif data.get("use") not in (None, "sig"):
                why = "not meant for signatures"
            elif not isinstance(data.get("kid"), str) or not data["kid"]:
                why = "without a kid"
            if why is not None:
                _log.warning("JWKS file %s: ignoring a key %s", self._path, why)
            else:
                candidates.append(data)
        if not candidates:
            raise AuthConfigError(f"JWKS file {self._path} holds no usable verification key")
        keys: dict[str, jwt.PyJWK] = {}
        for key in jwt.PyJWKSet(candidates):  # skips keys it cannot use
            kid = str(key.key_id)
            if key.algorithm_name not in self._algorithms:
                _log.warning(
                    "JWKS file %s: ignoring key %r for %s (not allowed)",
                    self._path,
                    kid,
                    key.algorithm_name,
                )
            elif kid in keys:
                raise AuthConfigError(f"JWKS file {self._path} has two keys with kid {kid!r}")
            else:
                keys[kid] = key
        if not keys:
            raise AuthConfigError(f"JWKS file {self._path} holds no usable verification key")
        return keys

    def get(self, kid: str) -> jwt.PyJWK | None:
        try:
            stamp = self._stat()
        except OSError as exc:
            stamp = None
            _log.warning("JWKS file %s: %s; keeping the keys loaded", self._path, exc)
        if stamp is not None and stamp != self._stamp:
            # Remember the stamp even when the load fails, to warn once per change, not per token.
            self._stamp = stamp
            try:
                self._keys = self._load()
                _log.info("JWKS file %s reloaded: %d key(s)", self._path, len(self._keys))
            except (OSError, ValueError, jwt.PyJWTError, AuthConfigError) as exc:
                _log.warning(
                    "JWKS file %s changed but is unusable (%s); keeping the keys loaded",
                    self._path,
                    type(exc).__name__,
                )
        return self._keys.get(kid)


class JwtVerifier:
    """Turns a bearer JWT into a `Principal`, or raises `InvalidToken` with a reason code.

    The principal's key id is `jwt:<first 12 hex of SHA-256(issuer)>:<sub>`; its team is the
    `team_claim` string; its roles come from `roles_claim` (a list, or a space-separated string)
    through `role_map` (IdP role -> airgate role; unmapped values are dropped), or, without a
    map, are the claim values that already are airgate roles.  `global_auditor` (mapped to, or
    the claim value itself without a map) makes an auditor of every team; any other auditor
    reads only its team claim's audit events.  A token may authenticate with no role at all:
    authorisation then refuses it everything.
    """

    def __init__(
        self,
        jwks_path: str | Path,
        *,
        issuer: str,
        audience: str,
        algorithms: Sequence[str] = DEFAULT_ALGORITHMS,
        leeway_s: float = 30,
        max_token_bytes: int = 8192,
        team_claim: str = "team",
        roles_claim: str = "roles",
        role_map: Mapping[str, str] | None = None,
    ) -> None:
        allowed = frozenset(algorithms)
        if not allowed or not allowed <= _ASYMMETRIC:
            raise AuthConfigError(
                f"JWT algorithms must be a non-empty subset of {sorted(_ASYMMETRIC)}"
            )
        if role_map is not None and not set(role_map.values()) <= GRANTS:
            raise AuthConfigError(f"JWT role_map values must be among {sorted(GRANTS)}")
        if not issuer or not audience:
            raise AuthConfigError("JWT issuer and audience must be set")
        self._algorithms = sorted(allowed)
        self._allowed = allowed
        self._issuer = issuer
        self._audience = audience
        self._leeway = float(leeway_s)
        self._max_bytes = max_token_bytes
        self._team_claim = team_claim
        self._roles_claim = roles_claim
        self._role_map = dict(role_map) if role_map is not None else None
        self._issuer_hash = hashlib.sha256(issuer.encode("utf-8")).hexdigest()[:12]
        self._jwks = _Jwks(Path(jwks_path), allowed)

    def verify(self, token: str, now: datetime | None = None) -> Principal:
        """The principal of a valid token; `InvalidToken(reason)` otherwise."""
        if len(token) > self._max_bytes:
            raise InvalidToken("too_large")
        if not token.isascii():
            raise InvalidToken("malformed")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise InvalidToken("malformed") from None
        if header.get("alg") not in self._allowed:
            raise InvalidToken("alg_not_allowed")
        kid = header.get("kid")
        if not isinstance(kid, str):
            raise InvalidToken("missing_kid")
        key = self._jwks.get(kid)
        if key is None:
            raise InvalidToken("unknown_kid")
        try:
            payload = jwt.decode(
                token,
                key,
                algorithms=self._algorithms,
                audience=self._audience,
                issuer=self._issuer,
                options={
                    "require": _REQUIRED,
                    "verify_exp": False,  # checked below against `now`
                    "verify_nbf": False,
                    "verify_iat": False,
                },
            )
        except jwt.PyJWTError as exc:
            reason = next((r for cls, r in _REASONS if isinstance(exc, cls)), "invalid")
            raise InvalidToken(reason) from None
        if now is not None and now.tzinfo is None:
            raise ValueError("now must be timezone-aware")
        clock = (now or datetime.now(UTC)).timestamp()
        _check_times(payload, clock, self._leeway)
        return self._principal(payload)

    def _principal(self, payload: Mapping[str, Any]) -> Principal:
        subject = _text(payload.get("sub"), _MAX_SUBJECT)
        team_value = payload.get(self._team_claim)
        team = None if team_value is None else _text(team_value, _MAX_TEAM)
        raw = payload.get(self._roles_claim)
        if raw is None:
            values: list[str] = []
        elif isinstance(raw, str):
            values = raw.split()
        elif isinstance(raw, list) and all(isinstance(v, str) for v in raw):
            values = raw
        else:
            raise InvalidToken("bad_claim")
        if self._role_map is not None:
            values = [self._role_map[v] for v in values if v in self._role_map]
        roles, all_teams = grant(values)
        return Principal(
            key_id=f"jwt:{self._issuer_hash}:{subject}",
            method="jwt",
            team=team,
            roles=roles,
            subject=subject,
            all_teams=all_teams,
        )
