"""Every key provider wired from airgate.toml, through the CLI: one bundle, four recipients.

Runs the `airgate` commands in-process against the real SoftHSM2 token, OpenBao dev server and
moto stand-in of the session fixtures, then opens the bundle through each provider on its own.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from typer.testing import CliRunner

from bundles import BundlePolicyError, open_bundle
from gateway.cli.main import app
from gateway.config import load_settings
from gateway.engines.key_providers import KeyProviders
from gateway.engines.sources import trusted_keys

if TYPE_CHECKING:  # the fixtures' value types; pytest imports conftest itself
    from conftest import FakeAwsKms, OpenBaoServer, SoftHsmToken

runner = CliRunner()


@pytest.fixture
def configured(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    softhsm_token: SoftHsmToken,
    openbao_server: OpenBaoServer,
    fake_aws_kms_moto: FakeAwsKms,
) -> Path:
    """airgate.toml naming all four providers; secrets only in the environment."""
    monkeypatch.setenv("TEST_HSM_PIN", softhsm_token.pin)
    monkeypatch.setenv("TEST_BAO_TOKEN", openbao_server.token)
    config = tmp_path / "airgate.toml"
    config.write_text(
        f"""
data_dir = "{tmp_path / "data"}"

[bundles]
trusted_keys = ["{tmp_path / "release.key.pub"}"]

[kms.pkcs11]
module = "{softhsm_token.module}"
token_label = "{softhsm_token.label}"
pin_env = "TEST_HSM_PIN"

[kms.vault_transit]
address = "{openbao_server.address}"
token_env = "TEST_BAO_TOKEN"

[kms.aws_kms]
region = "{fake_aws_kms_moto.region}"
endpoint_url = "{fake_aws_kms_moto.endpoint_url}"
"""
    )
    return config


def _run(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def _inspect(bundle: Path) -> dict[str, object]:
    manifest: dict[str, object] = json.loads(_run("bundle", "inspect", str(bundle), "--json"))
    return manifest


def test_one_bundle_opens_through_each_provider_alone(
    tmp_path: Path,
    configured: Path,
    softhsm_token: SoftHsmToken,
    openbao_server: OpenBaoServer,
    fake_aws_kms_moto: FakeAwsKms,
) -> None:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + os.urandom(300_000))
    bundle = tmp_path / "tiny.tar"
    _run("kms", "init", "--config", str(configured))
    _run("signing-key", "create", str(tmp_path / "release.key"))
    recipients = [
        "local:default",
        f"pkcs11:{softhsm_token.key_ref}",
        f"vault-transit:{openbao_server.key_ref}",
        f"aws-kms:{fake_aws_kms_moto.key_id}",
    ]
    _run(
        "bundle", "create", str(model), "--name", "tiny", "--version", "1",
        *(arg for r in recipients for arg in ("--recipient", r)),
        "--signing-key", str(tmp_path / "release.key"), "--out", str(bundle),
        "--segment-size", "65536", "--config", str(configured),
    )  # fmt: skip
    wraps = _inspect(bundle)["key_wraps"]
    assert isinstance(wraps, list)
    assert [w["provider"] for w in wraps] == ["local", "pkcs11", "vault-transit", "aws-kms"]
    assert "ok" in _run("bundle", "verify", str(bundle), "--decrypt", "--config", str(configured))

    settings = load_settings(configured, environ={})
    providers = KeyProviders(settings)
    try:
        for provider in ("local", "pkcs11", "vault-transit", "aws-kms"):
            with open_bundle(
                bundle,
                trusted_keys(settings),
                providers,
                now=datetime.now(UTC),
                allowed_providers=[provider],
            ) as opened:
                assert Path(opened.path).read_bytes() == model.read_bytes(), provider
    finally:
        providers.close()


def test_rotate_rewrap_and_remove_through_the_cli(
    tmp_path: Path, configured: Path, softhsm_token: SoftHsmToken, openbao_server: OpenBaoServer
) -> None:
    model = tmp_path / "tiny.gguf"
    model.write_bytes(b"GGUF" + os.urandom(100_000))
    bundle = tmp_path / "tiny.bundle"
    _run("signing-key", "create", str(tmp_path / "release.key"))
    key = str(tmp_path / "release.key")
    vault = f"vault-transit:{openbao_server.key_ref}"
    hsm = f"pkcs11:{softhsm_token.key_ref}"
    _run(
        "bundle", "create", str(model), "--name", "tiny", "--version", "1",
        "--recipient", vault, "--recipient", hsm, "--signing-key", key,
        "--out", str(bundle), "--config", str(configured),
    )  # fmt: skip
    before = {w["provider"]: w["key_version"] for w in _inspect(bundle)["key_wraps"]}  # type: ignore[attr-defined]
    for provider, ref in (
        ("vault-transit", openbao_server.key_ref),
        ("pkcs11", softhsm_token.key_ref),
    ):
        _run("kms", "rotate", "--provider", provider, "--key", ref, "--config", str(configured))
    _run(
        "bundle",
        "rekey",
        str(bundle),
        "--rewrap",
        "--signing-key",
        key,
        "--config",
        str(configured),
    )
    after = {w["provider"]: w["key_version"] for w in _inspect(bundle)["key_wraps"]}  # type: ignore[attr-defined]
    for provider in ("vault-transit", "pkcs11"):
        assert after[provider] != before[provider], provider
    _run(
        "bundle",
        "rekey",
        str(bundle),
        "--remove",
        hsm,
        "--signing-key",
        key,
        "--config",
        str(configured),
    )
    assert "ok" in _run("bundle", "verify", str(bundle), "--decrypt", "--config", str(configured))

    settings = load_settings(configured, environ={})
    providers = KeyProviders(settings)
    try:
        with pytest.raises(BundlePolicyError, match="no key wrap"):
            open_bundle(
                bundle,
                trusted_keys(settings),
                providers,
                now=datetime.now(UTC),
                allowed_providers=["pkcs11"],
            )
    finally:
        providers.close()
    # AWS rotates its own key material: the CLI says how to move instead
    result = runner.invoke(
        app, ["kms", "rotate", "--provider", "aws-kms", "--config", str(configured)]
    )
    assert result.exit_code == 1 and "rekey" in result.output
