"""Audit checkpoint signers, each against the real service behind its provider.

`local` (a key file), `pkcs11` (a SoftHSM2 token), `vault-transit` (an OpenBao dev server) and
`aws-kms` (moto's server, a FAKE stand-in for AWS KMS): a key made by the provider's
`create_signing_key` signs, and its signature verifies under the public key text a verifier
pins, and under no other; the key id survives reopening; a wrong PIN or token, an unknown key or
an unreachable service is the one generic error, with no secret in it or in the log.  Then what
each remote provider adds (a sensitive HSM key, a pinned Transit version, a pinned KMS key
behind a moved alias), `open_audit_signer` from configuration, and `airgate audit-signer` with a
remote provider.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import msgspec
import pkcs11
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from e2e.server_process import run_cli
from sqlalchemy import delete, insert, select, text

from bundles.errors import BundleError, KeyProviderError
from bundles.kms import vault as kms_vault
from bundles.kms.aws_signer import AwsKmsSigner
from bundles.kms.aws_signer import create_signing_key as create_aws_key
from bundles.kms.pkcs11_signer import Pkcs11Signer
from bundles.kms.pkcs11_signer import create_signing_key as create_pkcs11_key
from bundles.kms.signer import LocalSigner, Signer, parse_verify_key
from bundles.kms.vault_signer import VaultTransitSigner
from bundles.kms.vault_signer import create_signing_key as create_vault_key
from bundles.signing import create_signing_key, public_key_text
from gateway.access.audit_signer import open_audit_signer
from gateway.audit import AuditEvent, AuditWriter, new_event_id, verify
from gateway.audit.chain import GENESIS, link
from gateway.audit.checkpoint import signed, unsigned_checkpoint
from gateway.audit.merkle import CompactTree
from gateway.audit.schema import audit_checkpoints, audit_events
from gateway.audit.witness import DirectoryWitness, collect
from gateway.config import load_settings
from gateway.db import create_db_engine
from gateway.db.migrate import upgrade

if TYPE_CHECKING:  # the fixtures' value types; pytest imports conftest itself
    from conftest import FakeAwsKms, OpenBaoServer, SoftHsmToken

PROVIDERS = ["local", "pkcs11", "vault-transit", "aws-kms"]
MESSAGE = b"airgate checkpoint v1|" + bytes(range(178))  # 200 bytes, as a checkpoint
_serial = itertools.count(1)


@dataclass
class Case:
    """How to make and open signing keys in one provider's real service."""

    name: str
    alg: str
    new_ref: Callable[[], str]  # a key ref nobody has used
    create: Callable[[str], str]  # key ref -> the new key's public key text
    open: Callable[[str], Signer]
    failing: list[Callable[[str], Signer]]  # open a made key, wrongly: each must fail
    secrets: list[str] = field(default_factory=list)  # never in a message or a log record


def _local_case(tmp_path: Path) -> Case:
    return Case(
        name="local",
        alg="ed25519",
        new_ref=lambda: str(tmp_path / f"audit-{next(_serial)}.key"),
        create=lambda ref: public_key_text(create_signing_key(Path(ref))),
        open=lambda ref: LocalSigner.from_file(Path(ref)),
        failing=[],
    )


def _pkcs11_case(token: SoftHsmToken) -> Case:
    wrong_pin = "0" * len(token.pin)
    return Case(
        name="pkcs11",
        alg="ed25519",
        new_ref=lambda: f"audit-{next(_serial)}",
        create=lambda ref: create_pkcs11_key(token.module, token.label, token.pin, ref),
        open=lambda ref: Pkcs11Signer(token.module, token.label, token.pin, ref),
        failing=[
            lambda ref: Pkcs11Signer(token.module, token.label, wrong_pin, ref),
            lambda ref: Pkcs11Signer(token.module, "no-such-token", token.pin, ref),
            lambda ref: Pkcs11Signer(token.module, token.label, token.pin, ref + "-missing"),
        ],
        secrets=[token.pin, wrong_pin],
    )


def _vault_case(server: OpenBaoServer, closed_port: int) -> Case:
    wrong_token = secrets.token_hex(12)
    return Case(
        name="vault-transit",
        alg="ed25519",
        new_ref=lambda: f"audit-{next(_serial)}",
        create=lambda ref: create_vault_key(server.address, server.token, ref),
        open=lambda ref: VaultTransitSigner(server.address, server.token, ref),
        failing=[
            lambda ref: VaultTransitSigner(server.address, wrong_token, ref),
            lambda ref: VaultTransitSigner(server.address, server.token, ref + "-missing"),
            lambda ref: VaultTransitSigner(
                f"http://127.0.0.1:{closed_port}", server.token, ref, timeout_s=2.0
            ),
        ],
        secrets=[server.token, wrong_token],
    )


def _aws_case(fake: FakeAwsKms, closed_port: int) -> Case:
    # moto takes any credentials, so a wrong secret cannot fail here: an unknown key and an
    # unreachable endpoint stand for the failures AWS itself would give
    return Case(
        name="aws-kms",
        alg="ecdsa-p256-sha256",
        new_ref=lambda: f"alias/audit-{next(_serial)}",
        create=lambda ref: create_aws_key(ref, region=fake.region, endpoint_url=fake.endpoint_url),
        open=lambda ref: AwsKmsSigner(ref, region=fake.region, endpoint_url=fake.endpoint_url),
        failing=[
            lambda ref: AwsKmsSigner(
                ref + "-missing", region=fake.region, endpoint_url=fake.endpoint_url
            ),
            lambda ref: AwsKmsSigner(  # a symmetric key: no signing key
                fake.key_id, region=fake.region, endpoint_url=fake.endpoint_url
            ),
            lambda ref: AwsKmsSigner(
                ref,
                region=fake.region,
                endpoint_url=f"http://127.0.0.1:{closed_port}",
                connect_timeout_s=1,
                read_timeout_s=1,
                max_attempts=1,
            ),
        ],
        secrets=["fake-moto-secret-key"],
    )


def _case(name: str, request: pytest.FixtureRequest, tmp_path: Path, closed_port: int) -> Case:
    if name == "local":
        return _local_case(tmp_path)
    if name == "pkcs11":
        return _pkcs11_case(request.getfixturevalue("softhsm_token"))
    if name == "vault-transit":
        return _vault_case(request.getfixturevalue("openbao_server"), closed_port)
    return _aws_case(request.getfixturevalue("fake_aws_kms_moto"), closed_port)


@pytest.fixture(params=PROVIDERS)
def case(request: pytest.FixtureRequest, tmp_path: Path, closed_port: int) -> Case:
    return _case(request.param, request, tmp_path, closed_port)


@pytest.fixture(params=PROVIDERS[1:])
def remote(request: pytest.FixtureRequest, tmp_path: Path, closed_port: int) -> Case:
    """The providers with a service and a secret (a key file's errors: test_audit_signer_cli)."""
    return _case(request.param, request, tmp_path, closed_port)


@pytest.fixture
def made(case: Case) -> tuple[str, str]:
    """(key ref, public key text) of a new key in the case's provider."""
    ref = case.new_ref()
    return ref, case.create(ref)


@pytest.fixture
def signer(case: Case, made: tuple[str, str]) -> Iterator[Signer]:
    s = case.open(made[0])
    yield s
    s.close()


def test_a_signature_verifies_under_the_published_key(
    case: Case, made: tuple[str, str], signer: Signer
) -> None:
    _, text = made
    assert isinstance(signer, Signer)
    assert signer.verify_key.text == text
    assert signer.alg == case.alg == parse_verify_key(text).alg
    assert signer.local is (case.name == "local")
    signature = signer.sign(MESSAGE)
    assert parse_verify_key(text).verify(signature, MESSAGE)
    assert parse_verify_key(text).verify(signer.sign(b"x"), b"x")


def test_a_changed_message_or_another_keys_signature_does_not_verify(
    case: Case, made: tuple[str, str], signer: Signer
) -> None:
    pinned = parse_verify_key(made[1])
    signature = signer.sign(MESSAGE)
    flipped = bytearray(signature)
    flipped[len(flipped) // 2] ^= 0x01
    assert not pinned.verify(signature, MESSAGE[:-1] + b"\x00")
    assert not pinned.verify(signature, MESSAGE + b"\x00")
    assert not pinned.verify(bytes(flipped), MESSAGE)
    assert not pinned.verify(b"", MESSAGE)

    other_ref = case.new_ref()
    other_text = case.create(other_ref)
    other = case.open(other_ref)
    try:
        assert other.verify_key.key_id != signer.verify_key.key_id
        theirs = other.sign(MESSAGE)
    finally:
        other.close()
    assert parse_verify_key(other_text).verify(theirs, MESSAGE)
    assert not pinned.verify(theirs, MESSAGE)


def test_the_key_id_is_stable_across_reopening(case: Case, made: tuple[str, str]) -> None:
    first = case.open(made[0])
    key_id, signature = first.verify_key.key_id, first.sign(MESSAGE)
    first.close()
    second = case.open(made[0])
    try:
        assert second.verify_key.key_id == key_id == parse_verify_key(made[1]).key_id
        assert second.verify_key.verify(signature, MESSAGE)
        assert parse_verify_key(made[1]).verify(second.sign(MESSAGE), MESSAGE)
    finally:
        second.close()


def test_creating_never_replaces_a_key(case: Case, made: tuple[str, str]) -> None:
    ref, text = made
    with pytest.raises(BundleError) as caught:
        case.create(ref)
    assert "already" in str(caught.value)
    again = case.open(ref)
    try:
        assert again.verify_key.text == text
    finally:
        again.close()


def test_signers_sign_from_many_threads(case: Case, signer: Signer) -> None:
    pinned = signer.verify_key
    messages = [MESSAGE + i.to_bytes(2, "big") for i in range(32)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        signatures = list(pool.map(signer.sign, messages))
    assert all(pinned.verify(s, m) for s, m in zip(signatures, messages, strict=True))


def test_a_wrong_secret_unknown_key_or_unreachable_service_is_the_generic_error(
    remote: Case, caplog: pytest.LogCaptureFixture
) -> None:
    case, ref = remote, remote.new_ref()
    text = case.create(ref)
    signer = case.open(ref)
    assert signer.verify_key.text == text
    caplog.set_level(logging.DEBUG)
    shown: list[str] = []
    for phase in ("while a good signer is open", "after it closed"):
        if phase == "after it closed":
            assert signer.sign(MESSAGE)
            signer.close()
        for open_wrongly in case.failing:
            with pytest.raises(KeyProviderError) as caught:
                open_wrongly(ref)
            assert str(caught.value) == f"key provider {case.name!r} could not open a signing key"
            assert caught.value.__cause__ is None, phase
            shown += [str(caught.value), repr(caught.value)]
    with pytest.raises(KeyProviderError) as closed:
        signer.sign(MESSAGE)
    assert str(closed.value) == f"key provider {case.name!r} could not sign"
    signer.close()  # closing twice is harmless
    shown += [repr(signer), *(record.getMessage() for record in caplog.records)]
    assert any("open a signing key failed" in line for line in shown)
    for secret in case.secrets:
        assert not any(secret in line for line in shown), secret


# --- what each remote provider adds ------------------------------------------------------


def test_the_hsm_key_is_sensitive_and_never_extractable(
    softhsm_token: SoftHsmToken,
) -> None:
    ref = f"audit-{next(_serial)}"
    create_pkcs11_key(softhsm_token.module, softhsm_token.label, softhsm_token.pin, ref)
    signer = Pkcs11Signer(softhsm_token.module, softhsm_token.label, softhsm_token.pin, ref)
    try:
        token = pkcs11.lib(softhsm_token.module).get_token(token_label=softhsm_token.label)
        # the signer's session logged the process in: a public session sees the private key
        with token.open() as session:
            key = session.get_key(pkcs11.ObjectClass.PRIVATE_KEY, label=ref)
            attribute = pkcs11.Attribute
            assert key.key_type == pkcs11.KeyType.EC_EDWARDS
            assert key[attribute.SENSITIVE] and key[attribute.ALWAYS_SENSITIVE]
            assert not key[attribute.EXTRACTABLE] and key[attribute.NEVER_EXTRACTABLE]
            assert key[attribute.TOKEN] and key[attribute.PRIVATE]
            with pytest.raises(pkcs11.AttributeSensitive):
                key[attribute.VALUE]
    finally:
        signer.close()


def test_transit_signs_with_the_version_pinned_at_open(openbao_server: OpenBaoServer) -> None:
    ref = f"audit-{next(_serial)}"
    text = create_vault_key(openbao_server.address, openbao_server.token, ref)
    before = VaultTransitSigner(openbao_server.address, openbao_server.token, ref)
    kms_vault.rotate_key(openbao_server.address, openbao_server.token, ref)
    after = VaultTransitSigner(openbao_server.address, openbao_server.token, ref)
    try:
        assert (before.version, after.version) == (1, 2)
        assert parse_verify_key(text).verify(before.sign(MESSAGE), MESSAGE)
        assert after.verify_key.key_id != before.verify_key.key_id
        assert not parse_verify_key(text).verify(after.sign(MESSAGE), MESSAGE)
        assert after.verify_key.verify(after.sign(MESSAGE), MESSAGE)
    finally:
        before.close()
        after.close()


def test_kms_signs_with_the_key_its_alias_named_at_open(fake_aws_kms_moto: FakeAwsKms) -> None:
    fake = fake_aws_kms_moto
    alias = f"alias/audit-{next(_serial)}"
    text = create_aws_key(alias, region=fake.region, endpoint_url=fake.endpoint_url)
    signer = AwsKmsSigner(alias, region=fake.region, endpoint_url=fake.endpoint_url)
    kms = boto3.client("kms", region_name=fake.region, endpoint_url=fake.endpoint_url)
    try:
        other = kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")
        kms.update_alias(AliasName=alias, TargetKeyId=other["KeyMetadata"]["KeyId"])
        assert parse_verify_key(text).verify(signer.sign(MESSAGE), MESSAGE)
        moved = AwsKmsSigner(alias, region=fake.region, endpoint_url=fake.endpoint_url)
        assert moved.verify_key.key_id != signer.verify_key.key_id
        moved.close()
    finally:
        kms.close()
        signer.close()


# --- from configuration -------------------------------------------------------------------


def _config(path: Path, provider: str, key_ref: str, kms: str) -> Path:
    path.write_text(
        f'data_dir = "{path.parent / "data"}"\n\n'
        f'[audit.signer]\nprovider = "{provider}"\nkey_ref = "{key_ref}"\n\n{kms}'
    )
    return path


def test_open_audit_signer_reaches_the_hsm_named_in_kms(
    softhsm_token: SoftHsmToken, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = f"audit-{next(_serial)}"
    text = create_pkcs11_key(softhsm_token.module, softhsm_token.label, softhsm_token.pin, ref)
    kms = (
        f'[kms.pkcs11]\nmodule = "{softhsm_token.module}"\n'
        f'token_label = "{softhsm_token.label}"\npin_env = "AUDIT_TEST_PIN"\n'
    )
    settings = load_settings(_config(tmp_path / "airgate.toml", "pkcs11", ref, kms), environ={})
    monkeypatch.delenv("AUDIT_TEST_PIN", raising=False)
    with pytest.raises(KeyProviderError, match=r"\$AUDIT_TEST_PIN, which is not set"):
        open_audit_signer(settings)
    monkeypatch.setenv("AUDIT_TEST_PIN", softhsm_token.pin)
    signer = open_audit_signer(settings)
    try:
        assert isinstance(signer, Pkcs11Signer)
        assert parse_verify_key(text).verify(signer.sign(MESSAGE), MESSAGE)
    finally:
        signer.close()


def test_the_cli_creates_and_prints_a_transit_key(
    openbao_server: OpenBaoServer, tmp_path: Path
) -> None:
    ref = f"audit-cli-{next(_serial)}"
    kms = f'[kms.vault_transit]\naddress = "{openbao_server.address}"\n'
    config = _config(tmp_path / "airgate.toml", "vault-transit", ref, kms)

    def cli(command: str, token: str) -> tuple[int, str, str]:
        done = run_cli(
            [sys.executable, "-m", "gateway", "audit-signer", command, "--config", str(config)],
            env={"VAULT_TOKEN": token},
        )
        return done.returncode, done.stdout, done.stderr

    code, created, _ = cli("create", openbao_server.token)
    assert code == 0
    comment, text = created.splitlines()
    key = parse_verify_key(text)
    assert comment == f"# audit checkpoint key {key.key_id} (ed25519), held by vault-transit:{ref}"
    signer = VaultTransitSigner(openbao_server.address, openbao_server.token, ref)
    try:
        assert signer.verify_key == key
    finally:
        signer.close()
    assert cli("public", openbao_server.token) == (0, created, "")
    code, out, err = cli("create", openbao_server.token)
    assert (code, out) == (1, "")
    assert f"a transit key named {ref!r} already exists" in err
    wrong = secrets.token_hex(12)
    code, out, err = cli("public", wrong)
    assert (code, out) == (1, "")
    assert "key provider 'vault-transit' could not open a signing key" in err
    assert wrong not in err and openbao_server.token not in err


async def test_a_log_signed_in_the_provider_cannot_be_rewritten_from_the_data_directory(
    remote: Case, tmp_path: Path
) -> None:
    """The attacker writes the database and the data directory, but holds neither the
    provider's key nor the witness: an edit with the chain and every checkpoint recomputed and
    re-signed with a key of their own does not verify against the pinned key and the witness;
    nor does the edit under the provider's own (now stale) checkpoints."""
    ref = remote.new_ref()
    pinned = parse_verify_key(remote.create(ref))
    (tmp_path / "witness").mkdir()
    witness = DirectoryWitness(tmp_path / "witness")
    url = f"sqlite+aiosqlite:///{tmp_path / 'audit.db'}"
    await upgrade(url)
    engine = create_db_engine(url)
    signer = remote.open(ref)
    try:
        async with AuditWriter(engine, signer=signer, log_id="hsm", witnesses=[witness]) as w:
            for i in range(12):
                await w.append(_event(i))
        assert (await verify(engine, [pinned], witnesses=collect([witness], "hsm"))).ok

        async with engine.begin() as conn:  # the attacker's session
            for (name,) in (
                await conn.execute(text("SELECT name FROM sqlite_master WHERE type='trigger'"))
            ).all():
                await conn.execute(text(f"DROP TRIGGER {name}"))
            stored = (await conn.execute(select(audit_events).order_by("seq"))).all()
            events = [msgspec.json.decode(r.body, type=AuditEvent) for r in stored]
            events[5] = msgspec.structs.replace(events[5], model="rewritten")
            rows, prev = [], GENESIS
            for seq, event in enumerate(events, start=1):
                rows.append(link(prev, seq, event, log_id="hsm"))
                prev = rows[-1]["row_hash"]
            await conn.execute(delete(audit_events))
            await conn.execute(insert(audit_events), rows)
        edited = await verify(engine, [pinned], witnesses=collect([witness], "hsm"))
        assert (edited.first_bad_seq, edited.reason) == (6, "checkpoint_root_mismatch")

        attacker = LocalSigner(Ed25519PrivateKey.generate())
        tree, last, forged = CompactTree(), None, []
        for r in [None, *rows]:
            if r is not None:
                tree.append(bytes.fromhex(r["row_hash"]))
            unsigned = unsigned_checkpoint(
                last, log_id="hsm", epoch=1, kind="batch" if r else "open", size=tree.size,
                root=tree.root(), ts_us=1, alg=attacker.alg, key_id=attacker.verify_key.key_id,
            )  # fmt: skip
            last = signed(unsigned, attacker.sign(unsigned.message()))
            forged.append(last.row(tree.stack))
        async with engine.begin() as conn:
            await conn.execute(delete(audit_checkpoints))
            await conn.execute(insert(audit_checkpoints), forged)
        resigned = await verify(engine, [pinned], witnesses=collect([witness], "hsm"))
        assert not resigned.ok and resigned.checkpoints_untrusted == len(forged)
        assert "witness_diverged" in {p.reason for p in resigned.problems}
        assert resigned.trusted_keys == [pinned.key_id]
    finally:
        signer.close()
        await engine.dispose()


def _event(i: int) -> AuditEvent:
    return AuditEvent(
        event_id=new_event_id(),
        ts=datetime.now(UTC),
        kind="inference.completed",
        outcome="success",
        model="m",
        completion_tokens=i,
    )
