"""Renewals of a bundle's offline window: signed at HQ, domain-separated from manifest
signatures, refused when edited, misdirected, unsigned by a pinned key or issued in the future;
the window they grant, capped by `not_after`; the per-request check of an imported model."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from backends.echo import EchoEngine
from bundles import (
    BundleError,
    BundleFormatError,
    BundlePolicyError,
    BundleSignatureError,
    Manifest,
    TrustedKeys,
    VerifiedBundle,
    VerifiedRenewal,
    create_renewal,
    offline_window,
    verify_renewal,
)
from bundles.loader import _check_policy
from bundles.manifest import decode_manifest, encode_manifest, timestamp
from bundles.renewal import CLOCK_SKEW
from bundles.signing import sign_manifest, verify_manifest
from gateway.config import Settings
from gateway.engines.imported import (
    Entry,
    ImportedModel,
    ImportedSource,
    lapsed_at,
    usable_until,
)
from gateway.engines.registry import Deployment, ServedModel
from gateway.errors import ModelExpired, error_body

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
DIGEST = "ab" * 32
HQ = Ed25519PrivateKey.generate()
OTHER = Ed25519PrivateKey.generate()
PINNED = TrustedKeys([HQ.public_key()])


def manifest(
    *,
    created: datetime = NOW - timedelta(days=3),
    days: int | None = 1,
    not_after: str | None = None,
) -> Manifest:
    raw = {
        "bundle_id": "0123456789abcdef0123456789abcdef",
        "created": timestamp(created),
        "not_after": not_after,
        "model": {"name": "hq-gemma", "version": "1", "weight_format": "gguf"},
        "crypto": {"segment_size": 1 << 20},
        "files": [
            {
                "path": "m.gguf",
                "plaintext_size": 1,
                "ciphertext_size": 61,
                "plaintext_sha256": "00" * 32,
                "ciphertext_sha256": "11" * 32,
            }
        ],
        "key_wraps": [
            {
                "provider": "local",
                "key_ref": "default",
                "key_version": "1",
                "algorithm": "AES256-GCM",
                "wrapped": "AAAA",
                "context": {"bundle_id": "0123456789abcdef0123456789abcdef"},
            }
        ],
        "policy": {"allowed_engines": ["llama.cpp"], "max_offline_days": days},
    }
    return msgspec.convert(raw, Manifest)


def test_a_renewal_verifies_against_the_pinned_key_and_restarts_the_window() -> None:
    m = manifest()
    with pytest.raises(BundlePolicyError, match="lapsed at 2026-11-30T12:00:00Z") as lapsed:
        _check_policy(m, NOW, None)
    assert "renewal signed at HQ" in str(lapsed.value)
    data = create_renewal(m, DIGEST, HQ, issued=NOW - timedelta(hours=1))
    renewal = verify_renewal(data, PINNED)
    renewal.check(m, DIGEST, now=NOW)
    _check_policy(m, NOW, None, renewal.renewal)  # no longer lapsed
    assert offline_window(m, renewal.renewal) == (
        NOW - timedelta(hours=1),
        1,
        NOW + timedelta(hours=23),
    )
    # HQ may grant another number of days; past it, the renewed window lapses too
    longer = verify_renewal(create_renewal(m, DIGEST, HQ, issued=NOW, days=7), PINNED)
    _check_policy(m, NOW + timedelta(days=6), None, longer.renewal)
    with pytest.raises(BundlePolicyError, match="after it was renewed"):
        _check_policy(m, NOW + timedelta(days=7, seconds=1), None, longer.renewal)


def test_a_renewal_never_reaches_past_not_after() -> None:
    m = manifest(not_after=timestamp(NOW + timedelta(hours=2)))
    renewal = verify_renewal(create_renewal(m, DIGEST, HQ, issued=NOW), PINNED)
    with pytest.raises(BundlePolicyError, match="expired at"):
        _check_policy(m, NOW + timedelta(hours=3), None, renewal.renewal)
    source = _source(m, renewal)
    assert source.usable_until == NOW + timedelta(hours=2)


def test_any_edited_byte_is_refused() -> None:
    data = create_renewal(manifest(), DIGEST, HQ, issued=NOW)
    verify_renewal(data, PINNED)
    for index in range(len(data)):
        for flip in (0x01, 0x20):
            edited = bytearray(data)
            edited[index] ^= flip
            with pytest.raises(BundleError):
                verify_renewal(bytes(edited), PINNED)
    spaced = json.dumps(json.loads(data), indent=1).encode()  # the same content, respelled
    with pytest.raises(BundleFormatError, match="canonical"):
        verify_renewal(spaced, PINNED)


def test_a_renewal_signed_by_an_unpinned_key_is_refused() -> None:
    data = create_renewal(manifest(), DIGEST, OTHER, issued=NOW)
    with pytest.raises(BundleSignatureError, match="not a trusted key"):
        verify_renewal(data, PINNED)


def test_signatures_are_domain_separated_both_ways() -> None:
    m = manifest()
    manifest_bytes = encode_manifest(m)
    manifest_sig = json.loads(sign_manifest(manifest_bytes, HQ))
    renewal = json.loads(create_renewal(m, DIGEST, HQ, issued=NOW))
    # a manifest signature put on a renewal: refused
    forged = msgspec.json.encode({**renewal, "signature": manifest_sig}, order="sorted")
    with pytest.raises(BundleSignatureError, match="invalid"):
        verify_renewal(forged, PINNED)
    # a renewal's signature put on its body as a manifest: refused, and no such body decodes
    body = msgspec.json.encode(renewal["renewal"], order="sorted")
    sig = msgspec.json.encode(renewal["signature"], order="sorted")
    with pytest.raises(BundleSignatureError, match="invalid"):
        verify_manifest(body, sig, PINNED)
    with pytest.raises(BundleFormatError):
        decode_manifest(b"airgate-bundle-renewal/1\n" + body)


def test_a_renewal_of_another_bundle_or_from_the_future_is_refused() -> None:
    m = manifest()
    other_digest = verify_renewal(create_renewal(m, "cd" * 32, HQ, issued=NOW), PINNED)
    with pytest.raises(BundlePolicyError, match="is for bundle"):
        other_digest.check(m, DIGEST, now=NOW)
    future = verify_renewal(create_renewal(m, DIGEST, HQ, issued=NOW + timedelta(days=1)), PINNED)
    with pytest.raises(BundlePolicyError, match="in the future"):
        future.check(m, DIGEST, now=NOW)
    # a clock a little behind HQ's is tolerated
    skewed = NOW + CLOCK_SKEW - timedelta(seconds=1)
    verify_renewal(create_renewal(m, DIGEST, HQ, issued=skewed), PINNED).check(m, DIGEST, now=NOW)


def test_a_bundle_without_an_offline_window_needs_no_renewal() -> None:
    with pytest.raises(BundlePolicyError, match="no offline window"):
        create_renewal(manifest(days=None), DIGEST, HQ, issued=NOW)


def _source(m: Manifest, renewal: VerifiedRenewal | None = None) -> ImportedSource:
    """The source `build_registry` makes for an imported bundle (nothing is read)."""
    imported = ImportedModel(
        entry=Entry(m.bundle_id, "hq-gemma", Path("imported") / m.bundle_id),
        verified=VerifiedBundle(store=None, manifest=m, digest=DIGEST, signer="k"),  # type: ignore[arg-type]
        renewal=renewal,
        engine="llama.cpp",
        until=usable_until(m, renewal),
    )
    return ImportedSource(imported, trusted=PINNED, providers={}, settings=Settings())


def test_a_lapsed_imported_model_is_refused_per_request_with_model_expired() -> None:
    m = manifest(created=NOW - timedelta(hours=12))  # one day: usable until NOW + 12 h
    deployment = Deployment("hq-gemma", EchoEngine(), source=_source(m))
    model = ServedModel("hq-gemma", deployment)
    assert lapsed_at(model, NOW) is None
    assert lapsed_at(model, NOW + timedelta(hours=12)) == NOW + timedelta(hours=12)
    # a configured bundle (no ImportedSource) is never refused by this check
    plain = ServedModel("other", Deployment("other", EchoEngine(), source=None))
    assert lapsed_at(plain, NOW + timedelta(days=365)) is None
    error = ModelExpired("expired", param="model")
    assert error.status_code == 403
    assert json.loads(error_body(error))["error"]["code"] == "model_expired"
