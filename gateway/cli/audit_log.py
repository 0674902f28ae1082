"""`airgate audit verify | witness | init`: the log's integrity, from the command line.

- `verify` trusts only the keys pinned in `[audit] trusted_keys` or named with `--trusted-key`
  (never a key in the data directory), and holds the log against every witness: the
  configured ones and any directory or file named with `--witness`.
- `witness` is a compliance officer's own witness: it keeps the latest checkpoint in a file
  the officer holds (offline, on removable media), and each run checks the server's new tree
  head against it with an RFC 6962 consistency proof before keeping the new one.
- `init --new-epoch` starts a new epoch after a loss: the only way a gateway whose log no
  longer matches its witnesses starts again, and itself signed, stored and witnessed.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import httpx
import msgspec
import typer

from bundles import SigningKeyError
from bundles.kms.signer import parse_verify_key

from .. import env
from ..access.audit_log import (
    audit_log_id,
    audit_witnesses,
    open_audit_writer,
    trusted_audit_keys,
)
from ..access.auth import KeyStore
from ..access.secrets import load_pepper
from ..audit import AuditChainBusy, AuditCorrupt, AuditEvent, new_event_id, verify_log
from ..audit._head import read_head
from ..audit.checkpoint import Checkpoint, check_signature, encode_checkpoint, trusted_by_id
from ..audit.merkle import verify_consistency
from ..audit.opening import witnessed
from ..audit.proofs import ProvedCheckpoint
from ..audit.verify import chains
from ..audit.witness import WitnessError, collect, read_witness_path
from ..config import ConfigError, Settings
from ..db import create_db_engine
from ..db.migrate import ensure_schema
from .admin import DatabaseOpt, _run, _url, audit_app
from .common import ConfigOpt, DataDirOpt, fail, load_cli_settings, out

__all__: list[str] = []

TrustedOpt = Annotated[
    list[str] | None,
    typer.Option(help="A pinned checkpoint key (ed25519:..., ecdsa-p256:..., or a file; repeat)."),
]


def _pepper(settings: Settings) -> bytes:
    try:
        return load_pepper(settings, create=False)
    except ConfigError as exc:
        raise fail(str(exc), 2) from None


@audit_app.command("verify")
def audit_verify(
    first_seq: Annotated[int | None, typer.Option(help="From this sequence number.")] = None,
    last_seq: Annotated[int | None, typer.Option(help="Up to this sequence number.")] = None,
    trusted_key: TrustedOpt = None,
    witness: Annotated[
        list[Path] | None,
        typer.Option(help="A witness directory or checkpoint file to hold the log against."),
    ] = None,
    chain: Annotated[
        str | None, typer.Option(help="Only this chain (default: every chain).")
    ] = None,
    database: DatabaseOpt = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Verify every chain, the signed tree heads and every witness; exit 1 on any problem."""
    settings = load_cli_settings(config, data_dir)
    try:
        keys = trusted_audit_keys(settings, trusted_key or [])
    except (ValueError, SigningKeyError) as exc:  # a key that is not one: its text, not ours
        raise fail(str(exc), 2) from None
    if not keys:
        raise fail(
            "no pinned key to trust: set [audit] trusted_keys or pass --trusted-key "
            "(a key found next to the data is never trusted)",
            2,
        )
    try:
        witnessed_ = collect(audit_witnesses(settings), chain, witness or [])
    except WitnessError as exc:
        raise fail(str(exc), 2) from None

    async def run() -> Any:
        engine = create_db_engine(_url(settings, database))
        try:
            return await verify_log(
                engine,
                keys,
                witnesses=witnessed_,
                chain=chain,
                first_seq=first_seq,
                last_seq=last_seq,
            )
        finally:
            await engine.dispose()

    report = _run(run)
    typer.echo(json.dumps(msgspec.to_builtins(report), indent=2))
    if not report.chains:
        raise fail("the audit log FAILED verification: it has no chain (nothing was signed)")
    for failed in (c for c in report.chains if not c.ok):
        owner = f" (device {failed.device})" if failed.device else ""
        typer.echo(
            f"chain {failed.log_id}{owner} FAILED verification at seq {failed.first_bad_seq} "
            f"({failed.reason})",
            err=True,
        )
    if not report.ok:
        raise fail(f"the audit log FAILED verification ({len(report.chains)} chains)")


@audit_app.command("witness")
def audit_witness(
    state: Annotated[Path, typer.Option(help="Your checkpoint file (JSONL; kept offline).")],
    trusted_key: Annotated[
        str, typer.Option(help="The pinned key the gateway signs checkpoints with.")
    ],
    url: Annotated[str | None, typer.Option(help="The gateway, e.g. https://gw:8000.")] = None,
    api_key_env: Annotated[
        str, typer.Option(help="The variable holding an auditor API key.")
    ] = env.API_KEY,
    accept_new_epoch: Annotated[
        bool, typer.Option(help="Keep a checkpoint of a new epoch (after a declared loss).")
    ] = False,
    chain: Annotated[
        str | None,
        typer.Option(
            help="The chain to witness (default: the one your file keeps; else the gateway's "
            "own, or the database's only one). One file per chain."
        ),
    ] = None,
    database: DatabaseOpt = None,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Check a chain's latest checkpoint against the one you kept, and keep it."""
    try:
        key = parse_verify_key(trusted_key)
        kept = read_witness_path(state) if state.exists() else []
    except (ValueError, WitnessError) as exc:
        raise fail(str(exc), 2) from None
    previous = max(kept, key=lambda c: (c.epoch, c.id), default=None)
    chain = chain or (previous.log_id if previous else None)
    settings = None if url else load_cli_settings(config, data_dir)

    def fetch(from_size: int | None) -> ProvedCheckpoint:
        if url:
            return _fetch(url, os.environ.get(api_key_env, ""), chain, from_size)
        assert settings is not None
        return _run(lambda: _local_proof(_url(settings, database), chain, from_size))

    def fetch_signed(from_size: int | None) -> ProvedCheckpoint:
        proved = fetch(from_size)
        if check_signature(proved.checkpoint, trusted_by_id([key])) != "ok":
            raise fail("the latest checkpoint is NOT signed by the pinned key", 1)
        return proved

    proved = fetch_signed(None)
    latest = proved.checkpoint
    if previous is not None:
        if latest.log_id != previous.log_id:
            raise fail(f"this is log {latest.log_id}; your file keeps log {previous.log_id}", 1)
        if latest.epoch != previous.epoch:
            if latest.epoch < previous.epoch or not accept_new_epoch:
                raise fail(
                    f"the log is in epoch {latest.epoch}; you kept epoch {previous.epoch} at "
                    f"size {previous.size}: a loss was declared (or the log rolled back). "
                    "Investigate; --accept-new-epoch keeps the new one.",
                    1,
                )
        elif previous.size and latest.size >= previous.size:
            proved = fetch_signed(previous.size)  # the proof from your size to the latest
            latest = proved.checkpoint
        if latest.epoch == previous.epoch and not _consistent(previous, latest, proved):
            raise fail(
                f"INCONSISTENT: the log's tree at size {latest.size} does not extend the "
                f"checkpoint you kept at size {previous.size}: it was truncated or rewritten",
                1,
            )
    state.parent.mkdir(parents=True, exist_ok=True)
    with state.open("ab") as f:
        f.write(encode_checkpoint(latest) + b"\n")
        f.flush()
        os.fsync(f.fileno())
    since = f" (consistent with size {previous.size})" if previous else ""
    out.print(f"kept checkpoint {latest.id} of log {latest.log_id} at size {latest.size}{since}")


def _consistent(previous: Checkpoint, latest: Checkpoint, proved: ProvedCheckpoint) -> bool:
    if previous.size == 0:
        return True
    if latest.size < previous.size or proved.from_size != previous.size:
        return False
    try:
        nodes = [bytes.fromhex(node) for node in proved.proof]
        old, new = bytes.fromhex(previous.root), bytes.fromhex(latest.root)
    except ValueError:
        return False
    return verify_consistency(previous.size, latest.size, old, new, nodes)


def _fetch(url: str, api_key: str, chain: str | None, from_size: int | None) -> ProvedCheckpoint:
    params = {"from_size": str(from_size)} if from_size else {}
    if chain:
        params["chain"] = chain
    try:
        response = httpx.get(
            url.rstrip("/") + "/audit/checkpoints/latest",
            params=params,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=60.0,
        )
    except httpx.HTTPError as exc:
        raise fail(f"the gateway cannot be reached ({type(exc).__name__})", 2) from None
    if response.status_code != 200:
        raise fail(f"the gateway answered {response.status_code}", 2)
    try:
        return msgspec.json.decode(response.content, type=ProvedCheckpoint)
    except msgspec.DecodeError:
        raise fail("the gateway's answer is not a checkpoint", 2) from None


async def _local_proof(url: str, chain: str | None, from_size: int | None) -> ProvedCheckpoint:
    from ..audit.proofs import latest_with_proof

    engine = create_db_engine(url)
    try:
        if chain is None:
            found = await chains(engine)
            if len(found) > 1:
                raise fail(f"the log has {len(found)} chains: name one with --chain", 2)
            chain = found[0] if found else ""
        proved = await latest_with_proof(engine, chain, from_size)
    finally:
        await engine.dispose()
    if proved is None:
        raise fail("the audit log has no checkpoint yet", 2)
    return proved


@audit_app.command("init")
def audit_init(
    new_epoch: Annotated[
        bool, typer.Option("--new-epoch", help="Start a new epoch over a lost or reset log.")
    ] = False,
    config: ConfigOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Begin a new epoch of the audit log after a loss, recorded in the log and the witnesses.

    Run it only after investigating why the log no longer matches its witnesses (or why the
    database is empty): the new epoch is signed, and every verifier will report what the
    previous epoch's witnessed checkpoints held that the database does not."""
    if not new_epoch:
        raise fail("say --new-epoch: there is nothing else to initialise", 2)
    settings = load_cli_settings(config, data_dir)
    pepper = _pepper(settings)
    log_id, epoch, size = _run(lambda: _begin_epoch(settings, pepper))
    out.print(f"audit log {log_id}: epoch {epoch} begins at size {size}")


async def _begin_epoch(settings: Settings, pepper: bytes) -> tuple[str, int, int]:
    url = _url(settings)
    await ensure_schema(url, migrate=settings.audit.migrate)
    engine = create_db_engine(url)
    keys = KeyStore(engine, pepper)
    try:
        log_id = audit_log_id(settings, keys)
        head = await read_head(engine, log_id)
        seen = await witnessed(audit_witnesses(settings), log_id)
        last = max([head.epoch, *(cp.epoch for _, cp in seen)])
        lost = max((cp.size for _, cp in seen if cp.epoch == last), default=0)
        epoch = last + 1
        async with open_audit_writer(settings, engine, keys, check=False) as writer:
            # no open checkpoint first: the epoch checkpoint is this run's opening
            await writer.mark("epoch", epoch=epoch)
            await writer.append(
                AuditEvent(
                    event_id=new_event_id(),
                    ts=datetime.now(UTC),
                    kind="audit.epoch",
                    outcome="success",
                    action="audit.init",
                    detail={
                        "epoch": epoch,
                        "previous_epoch": last,
                        "witnessed_size": lost,
                        "resumed_at": head.seq,
                    },
                )
            )
        return log_id, epoch, head.seq
    except (AuditCorrupt, AuditChainBusy) as exc:
        raise fail(str(exc), 2) from None
    finally:
        await engine.dispose()
        await keys.aclose()
