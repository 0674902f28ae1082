"""The audit log's wiring from configuration: who signs, which log, which witnesses.

- The signer: `[audit.signer]` (an HSM, Transit or AWS KMS key; a local key file on laptops;
  `audit_signer.py` opens it).
- The chain: every writer appends to its own chain of the shared log (`[audit] chain`, e.g.
  the replica's pod name; default: the deployment's one chain).  Its id is derived from the
  deployment's secret pepper and the chain's name, so a database swapped in from another
  deployment holds none of this gateway's chains, and a reset one is not a new log.
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
from ..audit._lease import ChainLease
from ..audit.devices import DeviceKey, EnrolmentError, device_keys
from ..audit.opening import check_opening
from ..audit.reconcile import interrupted, orphans
from ..audit.witness import Witness, open_witnesses
from ..config import ConfigError, Settings
from ..db import create_db_engine, database_url
from ..db.migrate import ensure_schema
from .audit_signer import open_audit_signer
from .auth import KeyStore
from .secrets import load_pepper

__all__ = [
    "audit_history",
    "audit_log_id",
    "audit_witnesses",
    "check_audit_log",
    "open_audit_writer",
    "trusted_audit_keys",
]


def trusted_audit_keys(settings: Settings, extra: Sequence[str] = ()) -> list[VerifyKey]:
    """The pinned keys: `[audit] trusted_keys` and `extra` (the command line's), and each
    enrolled device's key bound to its own chain (`[audit] devices`; `audit.devices`)."""
    pinned = verify_keys_from_texts_or_files([*settings.audit.trusted_keys, *extra])
    return [*pinned, *device_keys(settings.audit.devices)]


def audit_log_id(settings: Settings, keys: KeyStore) -> str:
    """This writer's chain id: the deployment's (pepper-keyed) id of `[audit] chain`."""
    name = settings.audit.chain
    return keys.derive(b"audit-log" + (b"\0" + name.encode("ascii") if name else b"")).hex()[:16]


def audit_witnesses(settings: Settings) -> Sequence[Witness]:
    return open_witnesses(settings.audit.witness_dir, settings.audit.witness_syslog)


def _marker(settings: Settings) -> Path:
    return Path(settings.data_dir) / "keys" / "audit-log"


def audit_history(settings: Settings) -> frozenset[str]:
    """The chains this data directory has written (the marker, one id per line, written at each
    chain's genesis): an empty chain among them is a lost log, not a first start."""
    try:
        text = _marker(settings).read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return frozenset()
    return frozenset(line.strip() for line in text.splitlines() if line.strip())


def _mark_genesis(settings: Settings, log_id: str) -> None:
    """Record in the data directory that it writes chain `log_id` (0600, appended only)."""
    if log_id in audit_history(settings):
        return
    path = _marker(settings)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="ascii") as f:
        f.write(log_id + "\n")


def _check_pinned(settings: Settings, signer: Signer) -> None:
    try:
        trusted = [k for k in trusted_audit_keys(settings) if not isinstance(k, DeviceKey)]
    except EnrolmentError as exc:  # checked here, before `serve` starts
        raise ConfigError(str(exc)) from None
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
    reconcile: bool = False,
    check: bool = True,
) -> AsyncIterator[AuditWriter]:
    """This configuration's audit writer on `engine` (a migrated database), holding its chain,
    checked against the witnesses and started; stopped on exit (a close checkpoint).  An empty
    chain this data directory has written before is refused (a lost log is not begun anew).
    `reconcile`: first give the chain's orphaned admissions from its last run their
    `inference.interrupted` events (the server).  `check=False` (only `airgate audit init
    --new-epoch`): no witness check, no open checkpoint."""
    signer = open_audit_signer(settings)
    try:
        _check_pinned(settings, signer)
        log_id = audit_log_id(settings, keys)
        writer = AuditWriter(
            engine,
            signer=signer,
            log_id=log_id,
            witnesses=audit_witnesses(settings),
            checkpoint_every=settings.audit.checkpoint_every,
            witness_interval_s=settings.audit.witness_interval_s,
        )
        await writer.start(genesis=log_id not in audit_history(settings), check=check)
        _mark_genesis(settings, log_id)
        try:
            # after start: the chain is this process's now, so its last run has ended
            for admitted in await orphans(engine, log_id) if reconcile else []:
                await writer.append(interrupted(admitted))
            yield writer
        finally:
            await writer.stop()
    finally:
        signer.close()


async def check_audit_log(settings: Settings) -> None:
    """Before `serve` writes anything: refuse (`AuditCorrupt`, a message for the operator) a
    chain that is not what its witnesses saw or that this data directory wrote and is now
    empty, and (`AuditChainBusy`) one another running process holds."""
    url = database_url(settings.data_dir, settings.audit.database_url)
    await ensure_schema(url, migrate=settings.audit.migrate)
    engine = create_db_engine(url)
    try:
        keys = KeyStore(engine, load_pepper(settings))
        log_id = audit_log_id(settings, keys)
        lease = ChainLease(engine, log_id)
        await lease.acquire()
        try:
            signing = Signing(log_id=log_id, alg="", key_id="")
            head = await read_head(engine, log_id)
            genesis = log_id not in audit_history(settings)
            await check_opening(engine, head, signing, audit_witnesses(settings), genesis=genesis)
        finally:
            await lease.release()
        signer = open_audit_signer(settings)
        try:
            _check_pinned(settings, signer)
        finally:
            signer.close()
    finally:
        await engine.dispose()
