"""bundles: key files, trusted keys, the tar reader and the manifest codec, each on its own."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path

import msgspec
import pytest

from bundles import (
    BundleFormatError,
    BundleIntegrityError,
    KeyProviderError,
    KeyUnwrapError,
    LocalKeyProvider,
    SigningKeyError,
    TrustedKeys,
    create_signing_key,
    init_key_file,
    load_signing_key,
    public_key_text,
)
from bundles._store import BundleStore
from bundles.kms import parse_recipient, rotate_key
from bundles.manifest import (
    BundlePolicy,
    CryptoParams,
    FileEntry,
    Manifest,
    ModelInfo,
    decode_manifest,
    encode_manifest,
)

CONTEXT = {"bundle_id": "0" * 32, "purpose": "airgate-bundle-dek"}


# --- local key provider ----------------------------------------------------------------------


def test_key_file_is_private_and_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "kms.json"
    assert init_key_file(path)
    assert (path.stat().st_mode & 0o777) == 0o600
    before = path.read_bytes()
    assert not init_key_file(path)
    assert path.read_bytes() == before


def test_a_key_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "kms.json"
    init_key_file(path)
    provider = LocalKeyProvider(path)
    dek, wrap = provider.generate_data_key("default", CONTEXT)
    os.chmod(path, 0o644)
    with pytest.raises(KeyUnwrapError) as info:
        provider.unwrap(wrap, CONTEXT)
    assert str(info.value) == "the bundle's data key could not be unwrapped"
    os.chmod(path, 0o600)
    assert provider.unwrap(wrap, CONTEXT) == dek


def test_rotation_keeps_old_versions_and_wraps_with_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "kms.json"
    init_key_file(path)
    provider = LocalKeyProvider(path)
    dek, old = provider.generate_data_key("default", CONTEXT)
    assert rotate_key(path) == "2"
    new = provider.rewrap(old, CONTEXT)
    assert (old.key_version, new.key_version) == ("1", "2")
    assert provider.unwrap(old, CONTEXT) == provider.unwrap(new, CONTEXT) == dek
    assert rotate_key(path, "second") == "1"  # a new key name starts at version 1
    assert provider.wrap("second", dek, CONTEXT).key_ref == "second"


@pytest.mark.parametrize(
    ("text", "message"),
    [("local", "must look like"), (":ref", "must look like"), ("local:", "must look like")],
)
def test_recipients_are_provider_colon_ref(text: str, message: str) -> None:
    with pytest.raises(KeyProviderError, match=message):
        parse_recipient(text)
    assert parse_recipient("vault-transit:a:b") == ("vault-transit", "a:b")


def test_unknown_key_name_is_a_generic_wrap_error(tmp_path: Path) -> None:
    path = tmp_path / "kms.json"
    init_key_file(path)
    with pytest.raises(KeyProviderError, match="could not generate a data key"):
        LocalKeyProvider(path).generate_data_key("missing", CONTEXT)


# --- signing keys ----------------------------------------------------------------------------


def test_signing_key_round_trip_and_refusals(tmp_path: Path) -> None:
    path = tmp_path / "sign.key"
    public = create_signing_key(path)
    assert (path.stat().st_mode & 0o777) == 0o600
    assert path.with_name("sign.key.pub").read_text().strip() == public_key_text(public)
    assert public_key_text(load_signing_key(path).public_key()) == public_key_text(public)
    with pytest.raises(SigningKeyError, match="already exists"):
        create_signing_key(path)
    os.chmod(path, 0o640)
    with pytest.raises(SigningKeyError, match="readable by others"):
        load_signing_key(path)
    with pytest.raises(SigningKeyError, match="does not exist"):
        load_signing_key(tmp_path / "nope.key")


@pytest.mark.parametrize(
    "entry",
    ["ed25519:not-base64!", "ed25519:AAAA", "rsa:AAAA", "ed25519:" + "é" * 8],
    ids=["bad-base64", "short", "other-algorithm", "non-ascii"],
)
def test_malformed_trusted_keys_are_refused(entry: str) -> None:
    with pytest.raises(SigningKeyError):
        TrustedKeys([entry])


def test_trusted_keys_from_texts_and_files(tmp_path: Path) -> None:
    a = public_key_text(create_signing_key(tmp_path / "a.key"))
    b = public_key_text(create_signing_key(tmp_path / "b.key"))
    listing = tmp_path / "trusted.pub"
    listing.write_text(f"# release keys\n{b}\n\n")
    assert len(TrustedKeys.from_texts_or_files([a, str(listing)])) == 2
    with pytest.raises(SigningKeyError, match="cannot be read"):
        TrustedKeys.from_texts_or_files([str(tmp_path / "missing.pub")])


# --- the tar reader --------------------------------------------------------------------------


def _tar(path: Path, members: list[tarfile.TarInfo], mode: str = "w") -> Path:
    with tarfile.open(path, mode) as tar:  # type: ignore[call-overload]
        for info in members:
            data = b"x" * info.size if info.isreg() else None
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _member(name: str, size: int = 4, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size if kind == tarfile.REGTYPE else 0
    info.type = kind
    if kind == tarfile.SYMTYPE:
        info.linkname = "/etc/passwd"
    return info


@pytest.mark.parametrize(
    ("members", "error"),
    [
        ([_member("../escape")], BundleFormatError),
        ([_member("/abs")], BundleFormatError),
        ([_member("data/link", kind=tarfile.SYMTYPE)], BundleFormatError),
        ([_member("manifest.json"), _member("manifest.json")], BundleIntegrityError),
    ],
    ids=["dot-dot", "absolute", "symlink", "duplicate"],
)
def test_unsafe_tars_are_refused(
    tmp_path: Path, members: list[tarfile.TarInfo], error: type[Exception]
) -> None:
    with pytest.raises(error):
        BundleStore.open(_tar(tmp_path / "b.tar", members))


def test_compressed_and_truncated_tars_are_refused(tmp_path: Path) -> None:
    with pytest.raises(BundleFormatError, match="uncompressed"):
        BundleStore.open(_tar(tmp_path / "b.tar.gz", [_member("manifest.json")], "w:gz"))
    whole = _tar(tmp_path / "c.tar", [_member("manifest.json", size=100_000)])
    data = whole.read_bytes()
    whole.write_bytes(data[:60_000])
    with pytest.raises((BundleIntegrityError, BundleFormatError)):
        BundleStore.open(whole)


def test_tar_members_are_mapped_in_place(tmp_path: Path) -> None:
    store = BundleStore.open(_tar(tmp_path / "d.tar", [_member("data/a.enc", size=70_000)]))
    assert store.is_tar and store.names() == {"data/a.enc"}
    with store.map("data/a.enc") as view:
        assert bytes(view) == b"x" * 70_000


# --- manifest codec --------------------------------------------------------------------------


def _manifest(**changes: object) -> Manifest:
    base = Manifest(
        bundle_id="a" * 32,
        created="2026-11-29T00:00:00Z",
        model=ModelInfo(name="m", version="1", weight_format="gguf"),
        crypto=CryptoParams(segment_size=1 << 20),
        files=[
            FileEntry(
                path="m.gguf",
                plaintext_size=1,
                ciphertext_size=57,
                plaintext_sha256="0" * 64,
                ciphertext_sha256="1" * 64,
            )
        ],
        key_wraps=[],
        policy=BundlePolicy(allowed_engines=["llama.cpp"]),
    )
    return msgspec.structs.replace(base, **changes)


def test_manifest_is_canonical_json() -> None:
    from bundles.kms import WrappedKey

    wrap = WrappedKey(
        provider="local", key_ref="k", key_version="1", algorithm="A", wrapped="w", context={}
    )
    data = encode_manifest(_manifest(key_wraps=[wrap]))
    assert b" " not in data and b"\n" not in data
    keys = list(msgspec.json.decode(data))
    assert keys == sorted(keys)
    assert decode_manifest(data) == _manifest(key_wraps=[wrap])


@pytest.mark.parametrize(
    "path", ["../m.gguf", "/m.gguf", ".hidden", "a/../../b", "a//b", ""], ids=repr
)
def test_manifest_paths_cannot_escape(path: str) -> None:
    from bundles.kms import WrappedKey

    wrap = WrappedKey(
        provider="local", key_ref="k", key_version="1", algorithm="A", wrapped="w", context={}
    )
    raw = msgspec.to_builtins(_manifest(key_wraps=[wrap]))
    raw["files"][0]["path"] = path
    with pytest.raises(BundleFormatError):
        decode_manifest(msgspec.json.encode(raw, order="sorted"))
