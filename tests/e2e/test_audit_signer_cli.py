"""`airgate audit-signer create|public` with the local provider, and the configuration mistakes
it names.  (The same commands with a remote provider, against a real OpenBao:
tests/integration/kms/test_audit_signers.py.)"""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
from server_process import run_cli

from bundles.kms.signer import LocalSigner, verify_keys_from_texts_or_files

pytestmark = pytest.mark.e2e

MESSAGE = b"airgate checkpoint v1|" + bytes(178)


def audit_signer(*args: str | Path) -> tuple[int, str, str]:
    done = run_cli([sys.executable, "-m", "gateway", "audit-signer", *map(str, args)])
    return done.returncode, done.stdout, done.stderr


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "airgate.toml"
    path.write_text(f'data_dir = "{tmp_path / "data"}"\n\n{text}')
    return path


def test_create_makes_the_default_key_and_public_prints_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    key_file = data / "keys" / "audit-signing.key"
    code, out, err = audit_signer("public", "--data-dir", data)
    assert code == 1 and out == ""
    assert f"signing key {key_file} does not exist" in err
    assert not key_file.exists(), "`public` created a key"

    code, created, err = audit_signer("create", "--data-dir", data)
    assert code == 0, err
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    comment, text = created.splitlines()
    signer = LocalSigner.from_file(key_file)
    key = signer.verify_key
    assert text == key.text == key_file.with_name("audit-signing.key.pub").read_text().strip()
    assert comment == f"# audit checkpoint key {key.key_id} (ed25519), held by local:{key_file}"
    assert f"created the audit signing key {key.key_id}" in err

    assert audit_signer("public", "--data-dir", data) == (0, created, "")
    # the output is a trusted-keys file as it stands
    trusted = tmp_path / "audit-trusted.keys"
    trusted.write_text(created)
    [pinned] = verify_keys_from_texts_or_files([str(trusted)])
    assert pinned == key and pinned.verify(signer.sign(MESSAGE), MESSAGE)

    code, out, err = audit_signer("create", "--data-dir", data)
    assert (code, out) == (1, "")
    assert "already exists; refusing to overwrite a key" in err
    assert LocalSigner.from_file(key_file).verify_key == key


def test_a_configured_key_file_is_used_and_never_made_by_public(tmp_path: Path) -> None:
    key_file = tmp_path / "elsewhere" / "audit.key"
    cfg = config(tmp_path, f'[audit.signer]\nprovider = "local"\nkey_ref = "{key_file}"\n')
    code, _, err = audit_signer("public", "--config", cfg)
    assert code == 1 and f"signing key {key_file} does not exist" in err
    assert not key_file.exists()
    code, created, err = audit_signer("create", "--config", cfg)
    assert code == 0, err
    assert created.splitlines()[0].endswith(f"held by local:{key_file}")
    assert created.splitlines()[1] == LocalSigner.from_file(key_file).verify_key.text
    assert audit_signer("public", "--config", cfg) == (0, created, "")
    assert not (tmp_path / "data" / "keys" / "audit-signing.key").exists()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            '[audit.signer]\nprovider = "pkcs11"\nkey_ref = "audit"\n',
            '[audit.signer] provider = "pkcs11" needs a [kms.pkcs11] section',
        ),
        (
            '[audit.signer]\nprovider = "vault-transit"\nkey_ref = "audit"\n',
            '[audit.signer] provider = "vault-transit" needs a [kms.vault_transit] section',
        ),
        (
            '[audit.signer]\nprovider = "aws-kms"\nkey_ref = "alias/audit"\n',
            '[audit.signer] provider = "aws-kms" needs a [kms.aws_kms] section',
        ),
        (
            '[audit.signer]\nprovider = "vault-transit"\n\n'
            '[kms.vault_transit]\naddress = "http://127.0.0.1:1"\n',
            "[audit.signer] key_ref must name the signing key in vault-transit",
        ),
    ],
    ids=["pkcs11-section", "transit-section", "aws-section", "no-key-ref"],
)
def test_a_provider_the_configuration_cannot_reach_is_a_configuration_error(
    tmp_path: Path, settings: str, message: str
) -> None:
    cfg = config(tmp_path, settings)
    for command in ("create", "public"):
        code, out, err = audit_signer(command, "--config", cfg)
        assert (code, out) == (2, ""), err
        assert "configuration error: " + message in " ".join(err.split())


def test_a_new_kms_key_must_be_named_by_an_alias(tmp_path: Path) -> None:
    cfg = config(
        tmp_path,
        '[audit.signer]\nprovider = "aws-kms"\nkey_ref = "1234abcd-12ab-34cd-56ef-1234567890ab"\n\n'
        '[kms.aws_kms]\nregion = "us-east-1"\nendpoint_url = "http://127.0.0.1:1"\n',
    )
    code, out, err = audit_signer("create", "--config", cfg)
    assert (code, out) == (2, "")
    assert "key_ref must be an alias (alias/<name>)" in " ".join(err.split())
