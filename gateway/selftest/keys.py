"""The keys check: every key this configuration signs, unwraps or authenticates with opens.

- the audit signer (`[audit.signer]`) opens, and its key is among `[audit] trusted_keys` when
  any are pinned (`serve` refuses to start otherwise);
- the API key store: the pepper loads (never created here) and the database's key table reads;
- the data directory's bundle signing key loads and matches its `.pub`;
- the local KMS key file parses.

Only key ids and counts are shown, never key material.
"""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import msgspec

from bundles import (
    KeyProviderError,
    SigningKeyError,
    key_id,
    load_signing_key,
    parse_public_key,
)

from ..access.audit_log import trusted_audit_keys
from ..access.audit_signer import open_audit_signer
from ..access.auth import KeyStore
from ..access.secrets import load_pepper
from ..audit import DeviceKey, EnrolmentError
from ..config import ConfigError, Settings
from ..db import create_db_engine, database_url
from ..db.migrate import MigrationError, ensure_schema
from ..engines.key_providers import local_key_file
from ..engines.sources import signing_key_file
from .result import Finding, failed, passed

__all__ = ["check_keys", "database_missing"]

_KEY_ERRORS = (ConfigError, KeyProviderError, SigningKeyError, EnrolmentError, ValueError)


def database_missing(settings: Settings) -> Path | None:
    """The SQLite file the configuration names, when it does not exist (nothing started yet)."""
    url = database_url(settings.data_dir, settings.audit.database_url)
    if not url.startswith("sqlite"):
        return None
    path = Path(url.split(":///", 1)[1])
    return None if path.exists() else path


def _audit_signer(settings: Settings) -> tuple[str | None, str]:
    """(problem, note) about the audit signer."""
    provider = settings.audit.signer.provider
    try:
        signer = open_audit_signer(settings, create_default=False)
    except _KEY_ERRORS as exc:
        return f"the audit signer ({provider}) does not open: {exc}", ""
    try:
        verify_key = signer.verify_key
    finally:
        signer.close()
    try:
        pinned = [k for k in trusted_audit_keys(settings) if not isinstance(k, DeviceKey)]
    except _KEY_ERRORS as exc:
        return f"[audit] trusted_keys or devices cannot be read: {exc}", ""
    if pinned and verify_key not in pinned:
        return (
            f"the audit signing key {verify_key.key_id} ({provider}) is not among [audit] "
            "trusted_keys: the key was replaced, or the pins are out of date "
            "(`airgate audit-signer public` prints the key to pin)",
            "",
        )
    pin = "pinned" if pinned else "not pinned: add it to [audit] trusted_keys"
    return None, f"audit signer {provider} key {verify_key.key_id} ({pin})"


async def _key_counts(settings: Settings, pepper: bytes) -> tuple[int, int]:
    url = database_url(settings.data_dir, settings.audit.database_url)
    await ensure_schema(url, migrate=settings.audit.migrate)
    engine = create_db_engine(url)
    store = KeyStore(engine, pepper)
    try:
        records = await store.list()
    finally:
        await store.aclose()
        await engine.dispose()
    active = [r for r in records if r.revoked_at is None]
    return len(active), sum(r.role == "admin" for r in active)


def _key_store(settings: Settings) -> tuple[str | None, str]:
    """(problem, note) about the API key store."""
    try:
        pepper = load_pepper(settings, create=False)
    except ConfigError as exc:
        return f"the API key pepper does not load: {exc}", ""
    missing = database_missing(settings)
    if missing is not None:
        return f"the key database {missing} does not exist: start `airgate serve` once", ""
    try:
        active, admins = asyncio.run(_key_counts(settings, pepper))
    except MigrationError as exc:
        return f"the key database cannot be read: {exc}", ""
    except (OSError, ConnectionError) as exc:
        return f"the key database cannot be reached ({type(exc).__name__})", ""
    admin = f"{admins} admin" if admins else "no admin key: the next start makes one"
    return None, f"{active} active API keys ({admin})"


def _bundle_signing_key(settings: Settings) -> tuple[str | None, str]:
    path = signing_key_file(settings)
    if not path.exists():
        return None, "no bundle signing key in the data dir"
    try:
        public = load_signing_key(path).public_key()
    except SigningKeyError as exc:
        return f"the bundle signing key does not load: {exc}", ""
    kid = key_id(public)
    pub = path.with_name(path.name + ".pub")
    try:
        if key_id(parse_public_key(pub.read_text())) != kid:
            return (
                f"{pub} is not the public half of {path} (key {kid}): the key or its .pub was "
                "replaced; restore both from your backup",
                "",
            )
    except (OSError, SigningKeyError):
        return f"{pub} is missing or unreadable: restore it from your backup", ""
    return None, f"bundle signing key {kid}"


def _local_kms(settings: Settings) -> tuple[str | None, str]:
    path = local_key_file(settings)
    if not path.exists():
        return None, "no local KMS key file"
    try:
        if stat.S_IMODE(path.stat().st_mode) & 0o077:
            return f"the local KMS key file {path} is open to others: chmod 600 it", ""
        keyring = msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError) as exc:
        return f"the local KMS key file {path} cannot be read ({type(exc).__name__})", ""
    keys = keyring.get("keys") if isinstance(keyring, dict) else None
    if not isinstance(keys, dict) or not keys:
        return f"the local KMS key file {path} holds no key: restore it from your backup", ""
    return None, f"local KMS keys: {', '.join(sorted(map(str, keys)))}"


def check_keys(settings: Settings) -> Finding:
    """Each key opens (see the module); every problem is named, not only the first."""
    problems: list[str] = []
    notes: list[str] = []
    for part in (_audit_signer, _key_store, _bundle_signing_key, _local_kms):
        problem, note = part(settings)
        if problem:
            problems.append(problem)
        elif note:
            notes.append(note)
    return failed("; ".join(problems)) if problems else passed("; ".join(notes))
