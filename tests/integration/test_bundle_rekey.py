"""bundles.rekey_bundle: recipients change, the payload does not (directory and tar bundles)."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bundles import (
    BundleError,
    BundleSignatureError,
    LocalKeyProvider,
    ModelInfo,
    TrustedKeys,
    create_signing_key,
    init_key_file,
    load_signing_key,
    open_bundle,
    read_manifest,
    rekey_bundle,
    seal_bundle,
    sources_from_path,
)
from bundles._store import BundleStore, payload_name
from bundles.kms import rotate_key

NOW = datetime(2026, 11, 29, tzinfo=UTC)


@pytest.fixture(params=["bundle", "tar"])
def sealed(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path, Path, bytes]:
    model = tmp_path / "m.gguf"
    plain = b"GGUF" + os.urandom(200_000)
    model.write_bytes(plain)
    key_file, signing = tmp_path / "kms.json", tmp_path / "sign.key"
    init_key_file(key_file)
    rotate_key(key_file, "second")
    create_signing_key(signing)
    out = tmp_path / f"m.{request.param}"
    seal_bundle(
        sources_from_path(model),
        out,
        model=ModelInfo(name="m", version="1", weight_format="gguf"),
        recipients=["local:default"],
        providers={"local": LocalKeyProvider(key_file)},
        signing_key=load_signing_key(signing),
        now=NOW,
        segment_size=65536,
    )
    return out, key_file, signing, plain


def _payload_digest(bundle: Path) -> str:
    store = BundleStore.open(bundle)
    with store.map(payload_name("m.gguf")) as view:
        return hashlib.sha256(view).hexdigest()


def test_add_rewrap_remove_keep_the_payload(sealed: tuple[Path, Path, Path, bytes]) -> None:
    bundle, key_file, signing, plain = sealed
    providers = {"local": LocalKeyProvider(key_file)}
    key = load_signing_key(signing)
    trusted = TrustedKeys([key.public_key()])
    payload = _payload_digest(bundle)
    before = read_manifest(bundle, trusted).manifest

    rekey_bundle(
        bundle, trusted=trusted, providers=providers, signing_key=key, add=["local:second"]
    )
    rotate_key(key_file)
    rekey_bundle(bundle, trusted=trusted, providers=providers, signing_key=key, rewrap=True)
    after = rekey_bundle(
        bundle, trusted=trusted, providers=providers, signing_key=key, remove=["local:default"]
    )

    assert [(w.key_ref, w.key_version) for w in after.key_wraps] == [("second", "1")]
    assert after.bundle_id == before.bundle_id and after.files == before.files
    assert _payload_digest(bundle) == payload
    with open_bundle(bundle, trusted, providers, now=NOW) as opened:
        assert Path(opened.path).read_bytes() == plain


def test_rewrap_moves_to_the_current_key_version(sealed: tuple[Path, Path, Path, bytes]) -> None:
    bundle, key_file, signing, _ = sealed
    providers = {"local": LocalKeyProvider(key_file)}
    key = load_signing_key(signing)
    trusted = TrustedKeys([key.public_key()])
    assert rotate_key(key_file) == "2"
    updated = rekey_bundle(
        bundle, trusted=trusted, providers=providers, signing_key=key, rewrap=True
    )
    assert [w.key_version for w in updated.key_wraps] == ["2"]
    assert read_manifest(bundle, trusted).manifest == updated  # re-signed: it still verifies


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"remove": ["local:default"]}, "last recipient"),
        ({"remove": ["local:nobody"]}, "no recipient local:nobody"),
        ({"add": ["local:default"]}, "already has recipient"),
        ({"add": ["pkcs11:hsm-key"]}, "not configured"),
    ],
    ids=["remove-last", "remove-unknown", "add-twice", "add-unconfigured"],
)
def test_refused_changes_leave_the_bundle_as_it_was(
    sealed: tuple[Path, Path, Path, bytes], change: dict[str, list[str]], message: str
) -> None:
    bundle, key_file, signing, _ = sealed
    key = load_signing_key(signing)
    trusted = TrustedKeys([key.public_key()])
    manifest = read_manifest(bundle, trusted).manifest
    providers = {"local": LocalKeyProvider(key_file)}
    with pytest.raises(BundleError, match=message):
        rekey_bundle(
            bundle,
            trusted=trusted,
            providers=providers,
            signing_key=key,
            **change,  # type: ignore[arg-type]
        )
    assert read_manifest(bundle, trusted).manifest == manifest
    assert sorted(p.name for p in bundle.parent.iterdir() if p.name.startswith(".")) == []


def test_a_bundle_from_an_untrusted_signer_is_not_rekeyed(
    sealed: tuple[Path, Path, Path, bytes], tmp_path: Path
) -> None:
    bundle, key_file, _, _ = sealed
    create_signing_key(tmp_path / "other.key")
    other = load_signing_key(tmp_path / "other.key")
    with pytest.raises(BundleSignatureError):
        rekey_bundle(
            bundle,
            trusted=TrustedKeys([other.public_key()]),
            providers={"local": LocalKeyProvider(key_file)},
            signing_key=other,
            rewrap=True,
        )
