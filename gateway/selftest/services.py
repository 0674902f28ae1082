"""The configured services, each asked one cheap question with a short timeout.

    check       configuration               question
    redis       [limits] redis_url          PING (after AUTH and SELECT, as the limiter does)
    postgresql  [audit] database_url        the schema revision (a connection and a read)
    kms         [kms.pkcs11]                the module loads and the token is present (the PIN
                                            is not tried: a wrong one can lock the token)
                [kms.vault_transit]         sys/health answers active or standby; the token's
                                            variable is set
                [kms.aws_kms]               the endpoint accepts a TCP connection
    otlp        [telemetry] otlp_endpoint   an empty export request is accepted (2xx)

Unconfigured services are skipped (a skip is not a failure).  Addresses are shown without
credentials: a URL's password never reaches the report.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
from urllib.parse import urlsplit

import httpx
from redis import exceptions as redis_errors

from ..access.limits.resp import PipelinedRedis, parse_redis_url
from ..config import Settings
from ..db import database_url
from ..db.migrate import MigrationError, current_revision, head_revision
from .result import Finding, failed, passed, skipped

__all__ = ["check_kms", "check_otlp", "check_postgresql", "check_redis"]

TIMEOUT_S = 5.0


def _where(url: str) -> str:
    """host:port/path of a URL, never its user, password or query."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.hostname or ''}{port}{parts.path}"


def check_redis(settings: Settings) -> Finding:
    url = settings.limits.redis_url
    if not url:
        return skipped("not configured ([limits] redis_url): rate limits are kept in process")
    target = parse_redis_url(url)
    where = target.path or f"{target.host}:{target.port}"

    async def ping() -> bool:
        client = PipelinedRedis(url, timeout_s=TIMEOUT_S, connect_timeout_s=TIMEOUT_S)
        try:
            return await client.ping()
        finally:
            await client.aclose()

    then = (
        "the gateway falls back to limits in process"
        if settings.limits.fail_mode == "open"
        else "the gateway answers 503 ([limits] fail_mode = closed)"
    )
    try:
        answered = asyncio.run(ping())
    except redis_errors.RedisError as exc:
        return failed(
            f"Redis at {where} does not answer ({exc}); until it does, {then}: start it, or "
            "fix [limits] redis_url"
        )
    if not answered:
        return failed(f"Redis at {where} answered PING with something else than PONG")
    return passed(f"Redis at {where} answered PING")


def check_postgresql(settings: Settings) -> Finding:
    configured = settings.audit.database_url
    if not configured.startswith(("postgresql://", "postgresql+")):
        return skipped("not configured ([audit] database_url): the database is SQLite")
    where = _where(configured)

    async def revision() -> str | None:
        async with asyncio.timeout(TIMEOUT_S):
            return await current_revision(database_url(settings.data_dir, configured))

    try:
        current = asyncio.run(revision())
    except TimeoutError:
        return failed(f"PostgreSQL at {where} did not answer within {TIMEOUT_S:.0f} s")
    except MigrationError as exc:
        return failed(f"PostgreSQL at {where}: {exc}; check [audit] database_url and the server")
    head = head_revision()
    if current != head:
        fix = "the next start migrates it" if settings.audit.migrate else "`airgate db upgrade`"
        return failed(
            f"PostgreSQL at {where} is at schema revision {current or '(empty)'}, this airgate "
            f"needs {head}: {fix}"
        )
    return passed(f"PostgreSQL at {where} answers (schema {head})")


def _pkcs11(settings: Settings) -> str | None:
    p11 = settings.kms.pkcs11
    assert p11 is not None
    if not os.environ.get(p11.pin_env):
        return f"pkcs11: the PIN is read from ${p11.pin_env}, which is not set"
    try:
        import pkcs11

        pkcs11.lib(p11.module).get_token(token_label=p11.token_label)
    except ImportError:
        return "pkcs11: the package python-pkcs11 is not installed"
    except Exception as exc:  # the module's own exceptions: say which, not its text
        return (
            f"pkcs11: module {p11.module} with token {p11.token_label!r} is unusable "
            f"({type(exc).__name__}): check [kms.pkcs11] module and token_label"
        )
    return None


def _vault(settings: Settings) -> str | None:
    vault = settings.kms.vault_transit
    assert vault is not None
    if not os.environ.get(vault.token_env):
        return f"vault-transit: the token is read from ${vault.token_env}, which is not set"
    verify = ssl.create_default_context(cafile=vault.ca_cert)
    try:
        response = httpx.get(
            vault.address.rstrip("/") + "/v1/sys/health",
            verify=verify,
            timeout=min(TIMEOUT_S, vault.timeout_s),
        )
    except (httpx.HTTPError, OSError) as exc:
        return f"vault-transit at {_where(vault.address)} does not answer ({type(exc).__name__})"
    states = {501: "not initialised", 503: "sealed"}
    if response.status_code not in (200, 429, 472, 473):
        state = states.get(response.status_code, f"HTTP {response.status_code}")
        return f"vault-transit at {_where(vault.address)} is {state}"
    return None


def _aws(settings: Settings) -> str | None:
    aws = settings.kms.aws_kms
    assert aws is not None
    url = aws.endpoint_url or f"https://kms.{aws.region}.amazonaws.com"
    parts = urlsplit(url)
    host, port = parts.hostname or "", parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=TIMEOUT_S):
            pass
    except Exception as exc:  # OSError, or the egress guard's refusal
        return (
            f"aws-kms endpoint {host}:{port} cannot be reached ({type(exc).__name__}): set "
            "[kms.aws_kms] endpoint_url to your VPC endpoint"
        )
    return None


def check_kms(settings: Settings) -> Finding:
    kms = settings.kms
    probes = [
        (name, probe)
        for name, probe, section in (
            ("pkcs11", _pkcs11, kms.pkcs11),
            ("vault-transit", _vault, kms.vault_transit),
            ("aws-kms", _aws, kms.aws_kms),
        )
        if section is not None
    ]
    if not probes:
        return skipped("no remote provider configured ([kms.*]); the local key file: see keys")
    problems = [p for p in (probe(settings) for _, probe in probes) if p]
    if problems:
        return failed("; ".join(problems))
    return passed(f"{', '.join(name for name, _ in probes)} reachable")


def check_otlp(settings: Settings) -> Finding:
    telemetry = settings.telemetry
    if not telemetry.otlp_endpoint:
        return skipped("not configured ([telemetry] otlp_endpoint): no tracing")
    where = _where(telemetry.otlp_endpoint)
    verify = ssl.create_default_context(cafile=telemetry.ca_file)
    try:
        # an empty ExportTraceServiceRequest: a collector accepts it and records nothing
        response = httpx.post(
            telemetry.otlp_endpoint,
            content=b"",
            headers={"Content-Type": "application/x-protobuf"},
            verify=verify,
            timeout=min(TIMEOUT_S, telemetry.timeout_s),
        )
    except (httpx.HTTPError, OSError) as exc:
        return failed(f"the OTLP collector at {where} does not answer ({type(exc).__name__})")
    if not response.is_success:
        return failed(
            f"the OTLP collector at {where} answered HTTP {response.status_code} to an empty "
            "export: check [telemetry] otlp_endpoint (usually ending in /v1/traces)"
        )
    return passed(f"the OTLP collector at {where} accepted an empty export")
