"""The audit log's wiring from configuration: who signs, which log, which witnesses.

- The signer: `[audit.signer]` (an HSM, Transit or AWS KMS key; a local key file on laptops;
  `audit_signer.py` opens it).
- The log id: derived from the deployment's secret pepper, so a database swapped in from
  another deployment is recognised as a stranger, and a reset one is not a new log.
- Trusted keys: `[audit] trusted_keys` only.  When they are set, a signer whose key is not
  among them does not start (someone replaced the key the data directory points at).
- Witnesses: `[audit] witness_dir` and `witness_syslog`.

`check_audit_log` runs before anything at start writes (before the first admin key is minted):
a data directory that has its keys but an empty database, or a log that is not what the
witnesses saw, refuses to start (`gateway.audit.opening`).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

from sqlalchemy.ext.asyncio import AsyncEngine

from bundles.kms.signer import Signer, VerifyKey, verify_keys_from_texts_or_files

from ..audit import AuditCorrupt, AuditWriter
from ..audit._head import Signing, read_head
from ..audit.opening import check_opening
from ..audit.reconcile import interrupted, orphans
from ..audit.witness import Witness, open_witnesses
from ..config import Settings
from ..db import create_db_engine, database_url
from ..db.migrate import ensure_schema
from .audit_signer import open_audit_signer
from .auth import KeyStore, default_pepper_path, load_or_create_pepper

__all__ = [
    "audit_log_id",
    "audit_witnesses",
    "check_audit_log",
    "has_history",
    "open_audit_writer",
    "pepper_file",
    "trusted_audit_keys",
]


def pepper_file(settings: Settings) -> Path:
    """The deployment's secret pepper: `[auth] pepper_file`, else the data dir's."""
    return Path(settings.auth.pepper_file or default_pepper_path(settings.data_dir))


def trusted_audit_keys(settings: Settings, extra: Sequence[str] = ()) -> list[VerifyKey]:
    """The pinned keys: `[audit] trusted_keys` and `extra` (the command line's)."""
    return verify_keys_from_texts_or_files([*settings.audit.trusted_keys, *extra])


def audit_log_id(keys: KeyStore) -> str:
    return keys.derive(b"audit-log").hex()[:16]


def audit_witnesses(settings: Settings) -> Sequence[Witness]:
    return open_witnesses(settings.audit.witness_dir, settings.audit.witness_syslog)


def _marker(settings: Settings) -> Path:
    return Path(settings.data_dir) / "keys" / "audit-log"


def has_history(settings: Settings) -> bool:
    """Whether this data directory has had an audit log (the marker written at the log's
    genesis): then an empty audit database is a lost log, not a first start."""
    return _marker(settings).exists()


def _mark_genesis(settings: Settings, log_id: str) -> None:
    """Record in the data directory that it has a log (0600, never rewritten)."""
    path = _marker(settings)
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(log_id + "\n")


def _check_pinned(settings: Settings, signer: Signer) -> None:
    trusted = trusted_audit_keys(settings)
    if trusted and signer.verify_key not in trusted:
        raise AuditCorrupt(
            f"the audit signer's key {signer.verify_key.key_id} is not among [audit] "
            "trusted_keys: the signing key was replaced, or the pinned keys are out of date"
        )


@asynccontextmanager
async def open_audit_writer(
    settings: Settings,
    engine: AsyncEngine,
    keys: KeyStore,
    *,
    genesis: bool = True,
    reconcile: bool = False,
    check: bool = True,
) -> AsyncIterator[AuditWriter]:
    """This configuration's audit writer on `engine` (a migrated database), checked against
    the witnesses and started; stopped on exit (a close checkpoint).  `reconcile`: first give
    the last run's orphaned admissions their `inference.interrupted` events (the server).
    `check=False` (only `airgate audit init --new-epoch`): no witness check, no open checkpoint."""
    signer = open_audit_signer(settings)
    try:
        _check_pinned(settings, signer)
        writer = AuditWriter(
            engine,
            signer=signer,
            log_id=audit_log_id(keys),
            witnesses=audit_witnesses(settings),
            checkpoint_every=settings.audit.checkpoint_every,
            witness_interval_s=settings.audit.witness_interval_s,
        )
        lost = await orphans(engine) if reconcile else []
        await writer.start(genesis=genesis, check=check)
        _mark_genesis(settings, writer.signing.log_id)
        try:
            for admitted in lost:
                await writer.append(interrupted(admitted))
            yield writer
        finally:
            await writer.stop()
    finally:
        signer.close()


async def check_audit_log(settings: Settings, *, history: bool) -> None:
    """Before `serve` writes anything: refuse (`AuditCorrupt`, a message for the operator) a
    log that is not this data directory's, or not what its witnesses saw, and an empty one
    when `history` says the data directory has started before."""
    url = database_url(settings.data_dir, settings.audit.database_url)
    await ensure_schema(url, migrate=settings.audit.migrate)
    engine = create_db_engine(url)
    try:
        keys = KeyStore(engine, load_or_create_pepper(pepper_file(settings)))
        signing = Signing(log_id=audit_log_id(keys), alg="", key_id="")
        head = await read_head(engine)
        await check_opening(engine, head, signing, audit_witnesses(settings), genesis=not history)
        signer = open_audit_signer(settings)
        try:
            _check_pinned(settings, signer)
        finally:
            signer.close()
    finally:
        await engine.dispose()
