"""One contract for every key provider, run against the real service behind each.

The same tests hold for `local` (a key file), `pkcs11` (SoftHSM2), `vault-transit` (an OpenBao
dev server) and `aws-kms` (moto's server as a fake stand-in): round trips, context binding,
tamper detection, rotation and rewrap, generic errors when the service is unreachable, and no
key material, wrapped key, PIN or token in any log record or error message.
"""

from __future__ import annotations

import base64
import itertools
import logging
import secrets
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import pytest

from bundles.errors import KeyProviderError, KeyUnwrapError
from bundles.kms import (
    KeyProvider,
    LocalKeyProvider,
    WrappedKey,
    init_key_file,
    load_provider_class,
    rotate_key,
)
from bundles.kms import pkcs11 as kms_pkcs11
from bundles.kms import vault as kms_vault
from bundles.kms.aws import AwsKmsProvider

if TYPE_CHECKING:  # the fixtures' value types; pytest imports conftest itself
    from conftest import FakeAwsKms, OpenBaoServer, SoftHsmToken

PROVIDERS = ["local", "pkcs11", "vault-transit", "aws-kms"]
PURPOSE = "airgate-bundle-dek"
_names = itertools.count(1)


@dataclass
class Case:
    """How to reach one provider's real service, and the service-side operations tests need."""

    name: str
    make: Callable[[], KeyProvider]
    key_ref: str
    rotate: Callable[[], str | None]  # new key version; the key_ref to rewrap to (None: same)
    new_key: Callable[[], str]  # a second, distinct key; its key_ref
    unreachable: list[Callable[[], KeyProvider]]  # providers that must fail
    secrets: list[str] = field(default_factory=list)  # strings that must never be shown


def _context(bundle_id: str | None = None) -> dict[str, str]:
    return {"bundle_id": bundle_id or f"bundle-{secrets.token_hex(8)}", "purpose": PURPOSE}


def _local_case(tmp_path: Path) -> Case:
    key_file = tmp_path / "kms.json"
    assert init_key_file(key_file, "airgate-test")

    def new_key() -> str:
        ref = f"second-{next(_names)}"
        rotate_key(key_file, ref)
        return ref

    return Case(
        name="local",
        make=lambda: LocalKeyProvider(key_file),
        key_ref="airgate-test",
        rotate=lambda: (rotate_key(key_file, "airgate-test"), None)[1],
        new_key=new_key,
        unreachable=[lambda: LocalKeyProvider(tmp_path / "missing.json")],
    )


def _pkcs11_case(token: SoftHsmToken) -> Case:
    cls = load_provider_class("pkcs11")
    assert cls is kms_pkcs11.Pkcs11KeyProvider

    def new_key() -> str:
        ref = f"second-{next(_names)}"
        kms_pkcs11.create_key(token.module, token.label, token.pin, ref)
        return ref

    def rotate() -> None:
        kms_pkcs11.create_key(token.module, token.label, token.pin, token.key_ref)

    bad_pin = "0" * len(token.pin)
    return Case(
        name="pkcs11",
        make=lambda: kms_pkcs11.Pkcs11KeyProvider(token.module, token.label, token.pin),
        key_ref=token.key_ref,
        rotate=rotate,
        new_key=new_key,
        unreachable=[
            lambda: kms_pkcs11.Pkcs11KeyProvider(token.module, "no-such-token", token.pin),
            lambda: kms_pkcs11.Pkcs11KeyProvider(token.module, token.label, bad_pin),
            lambda: kms_pkcs11.Pkcs11KeyProvider(
                "/nonexistent/libpkcs11.so", token.label, token.pin
            ),
        ],
        secrets=[token.pin],
    )


def _vault_case(server: OpenBaoServer, closed_port: int) -> Case:
    def new_key() -> str:
        ref = f"second-{next(_names)}"
        kms_vault.create_key(server.address, server.token, ref)
        return ref

    def rotate() -> None:
        kms_vault.rotate_key(server.address, server.token, server.key_ref)

    wrong_token = secrets.token_hex(12)
    return Case(
        name="vault-transit",
        make=lambda: kms_vault.VaultTransitProvider(server.address, server.token),
        key_ref=server.key_ref,
        rotate=rotate,
        new_key=new_key,
        unreachable=[
            lambda: kms_vault.VaultTransitProvider(
                f"http://127.0.0.1:{closed_port}", server.token, timeout_s=2.0
            ),
            lambda: kms_vault.VaultTransitProvider(server.address, wrong_token),
        ],
        secrets=[server.token, wrong_token],
    )


def _aws_case(fake: FakeAwsKms, closed_port: int) -> Case:
    def make() -> KeyProvider:
        return AwsKmsProvider(region=fake.region, endpoint_url=fake.endpoint_url)

    return Case(
        name="aws-kms",
        make=make,
        key_ref=fake.key_id,
        rotate=fake.create_key,  # KMS rotates behind one ARN: rotating is rewrapping elsewhere
        new_key=fake.create_key,
        unreachable=[
            lambda: AwsKmsProvider(
                region=fake.region,
                endpoint_url=f"http://127.0.0.1:{closed_port}",
                connect_timeout_s=1,
                read_timeout_s=1,
                max_attempts=1,
            )
        ],
        secrets=["fake-moto-secret-key"],
    )


@pytest.fixture(params=PROVIDERS)
def case(request: pytest.FixtureRequest, tmp_path: Path, closed_port: int) -> Case:
    name = request.param
    if name == "local":
        return _local_case(tmp_path)
    if name == "pkcs11":
        return _pkcs11_case(request.getfixturevalue("softhsm_token"))
    if name == "vault-transit":
        return _vault_case(request.getfixturevalue("openbao_server"), closed_port)
    return _aws_case(request.getfixturevalue("fake_aws_kms_moto"), closed_port)


@pytest.fixture
def provider(case: Case) -> Iterator[KeyProvider]:
    p = case.make()
    assert isinstance(p, KeyProvider)
    assert p.name == case.name
    yield p
    p.close()


def _flip_byte(wrapped: WrappedKey, index: int) -> WrappedKey:
    """The wrap with one byte of its ciphertext flipped (after Transit's `vault:vN:` prefix)."""
    prefix, _, body = wrapped.wrapped.rpartition(":")
    raw = bytearray(base64.b64decode(body))
    raw[index] ^= 0x01
    text = base64.b64encode(bytes(raw)).decode()
    return msgspec.structs.replace(wrapped, wrapped=f"{prefix}:{text}" if prefix else text)


def _other_version(version: str) -> str:
    if version.isdigit():
        return "999"
    return version[:-1] + ("1" if version[-1] == "0" else "0")


def test_generate_data_key_round_trips_through_the_manifest(
    provider: KeyProvider, case: Case
) -> None:
    context = _context()
    dek, wrapped = provider.generate_data_key(case.key_ref, context)
    assert isinstance(dek, bytearray) and len(dek) == 32
    assert (wrapped.provider, wrapped.key_ref, wrapped.context) == (
        case.name,
        case.key_ref,
        context,
    )
    stored = msgspec.json.decode(msgspec.json.encode(wrapped), type=WrappedKey)
    assert provider.unwrap(stored, context) == dek
    other = case.make()  # another instance, as a loader process would have
    try:
        assert other.unwrap(stored, dict(reversed(context.items()))) == dek  # order-free
    finally:
        other.close()


def test_wrap_of_an_existing_dek_unwraps_to_it(provider: KeyProvider, case: Case) -> None:
    context = _context()
    dek = secrets.token_bytes(32)
    wrapped = provider.wrap(case.key_ref, dek, context)
    assert provider.unwrap(wrapped, context) == dek
    with pytest.raises(KeyProviderError):
        provider.wrap(case.key_ref, dek[:16], context)


def test_a_wrap_for_another_bundle_does_not_unwrap(provider: KeyProvider, case: Case) -> None:
    _, wrapped = provider.generate_data_key(case.key_ref, _context("bundle-a"))
    other = _context("bundle-b")
    with pytest.raises(KeyUnwrapError):
        provider.unwrap(wrapped, other)
    # The manifest's copy of the context is not trusted: relabelling it changes nothing.
    with pytest.raises(KeyUnwrapError):
        provider.unwrap(msgspec.structs.replace(wrapped, context=other), other)
    with pytest.raises(KeyUnwrapError):
        provider.unwrap(wrapped, {**_context("bundle-a"), "purpose": "something-else"})


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_tampered_wrap_does_not_unwrap(provider: KeyProvider, case: Case, where: str) -> None:
    context = _context()
    _, wrapped = provider.generate_data_key(case.key_ref, context)
    length = len(base64.b64decode(wrapped.wrapped.rpartition(":")[2]))
    index = {"first": 0, "middle": length // 2, "last": length - 1}[where]
    with pytest.raises(KeyUnwrapError):
        provider.unwrap(_flip_byte(wrapped, index), context)


def test_a_changed_key_version_or_algorithm_does_not_unwrap(
    provider: KeyProvider, case: Case
) -> None:
    context = _context()
    _, wrapped = provider.generate_data_key(case.key_ref, context)
    with pytest.raises(KeyUnwrapError):
        changed = msgspec.structs.replace(wrapped, key_version=_other_version(wrapped.key_version))
        provider.unwrap(changed, context)
    with pytest.raises(KeyUnwrapError):
        provider.unwrap(msgspec.structs.replace(wrapped, algorithm="AES-256-GCM-other"), context)
    with pytest.raises(KeyUnwrapError):
        provider.unwrap(msgspec.structs.replace(wrapped, wrapped="not base64!"), context)


def test_rotation_then_rewrap_moves_to_the_new_version(provider: KeyProvider, case: Case) -> None:
    context = _context()
    dek, old = provider.generate_data_key(case.key_ref, context)
    target = case.rotate()
    new = provider.rewrap(old, context, key_ref=target)
    assert new.key_version != old.key_version
    assert new.key_ref == (target or case.key_ref)
    assert new.context == context
    assert provider.unwrap(new, context) == dek
    assert provider.unwrap(old, context) == dek  # old versions still open existing bundles
    # Wraps made after the rotation use the new version too.
    assert provider.wrap(new.key_ref, dek, context).key_version == new.key_version
    # The old wrap relabelled as the new version is still refused.
    with pytest.raises(KeyUnwrapError):
        provider.unwrap(msgspec.structs.replace(old, key_version=new.key_version), context)
    with pytest.raises(KeyProviderError):
        provider.rewrap(old, _context("bundle-other"), key_ref=target)


def test_rewrap_to_another_key(provider: KeyProvider, case: Case) -> None:
    context = _context()
    dek, old = provider.generate_data_key(case.key_ref, context)
    second = case.new_key()
    new = provider.rewrap(old, context, key_ref=second)
    assert new.key_ref == second
    assert provider.unwrap(new, context) == dek
    assert provider.unwrap(old, context) == dek


def test_one_provider_serves_many_threads(provider: KeyProvider, case: Case) -> None:
    context = _context()
    dek, wrapped = provider.generate_data_key(case.key_ref, context)

    def work(_: int) -> bool:
        own = _context()
        mine, mine_wrapped = provider.generate_data_key(case.key_ref, own)
        return (
            provider.unwrap(wrapped, context) == dek and provider.unwrap(mine_wrapped, own) == mine
        )

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(work, range(32)))


def test_an_unreachable_provider_fails_with_the_generic_error(
    provider: KeyProvider, case: Case
) -> None:
    context = _context()
    _, wrapped = provider.generate_data_key(case.key_ref, context)
    for phase in ("while the working provider is open", "after it closed"):
        if phase == "after it closed":
            provider.close()
        for make in case.unreachable:
            down = make()
            with pytest.raises(KeyUnwrapError) as unwrap_error:
                down.unwrap(wrapped, context)
            assert str(unwrap_error.value) == str(KeyUnwrapError()), phase
            assert unwrap_error.value.__cause__ is None
            with pytest.raises(KeyProviderError) as generate_error:
                down.generate_data_key(case.key_ref, context)
            message = f"key provider {case.name!r} could not generate a data key"
            assert str(generate_error.value) == message, phase
            down.close()
            down.close()  # closing twice is harmless


def test_no_secret_reaches_a_log_record_or_an_error_message(
    provider: KeyProvider, case: Case, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    context = _context()
    dek, wrapped = provider.generate_data_key(case.key_ref, context)
    wrapped2 = provider.wrap(case.key_ref, dek, context)
    assert provider.unwrap(wrapped, context) == dek
    errors: list[BaseException] = []
    attempts: list[Callable[[], object]] = [
        lambda: provider.unwrap(wrapped, _context()),
        lambda: provider.unwrap(_flip_byte(wrapped, 0), context),
        lambda: provider.rewrap(wrapped2, _context()),
    ]
    for make in case.unreachable:
        attempts.append(lambda make=make: make().unwrap(wrapped, context))
        attempts.append(lambda make=make: make().wrap(case.key_ref, dek, context))
    for attempt in attempts:
        with pytest.raises(KeyProviderError) as caught:
            attempt()
        errors.append(caught.value)

    forbidden = [
        dek.hex(),
        dek.hex().upper(),
        base64.b64encode(dek).decode(),
        base64.urlsafe_b64encode(dek).decode(),
        wrapped.wrapped.rpartition(":")[2],
        wrapped2.wrapped.rpartition(":")[2],
        *case.secrets,
    ]
    shown = [str(e) for e in errors] + [repr(e) for e in errors] + [repr(provider)]
    for record in caplog.records:
        shown.append(record.getMessage())
        if record.exc_info:
            shown.append(logging.Formatter().formatException(record.exc_info))
    assert any("kms" in text for text in shown)  # the failures were logged
    for text in shown:
        for secret in forbidden:
            assert secret not in text
