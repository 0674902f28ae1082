"""Renewals: HQ extends a bundle's offline window without re-sealing it.

A bundle with `policy.max_offline_days` may be used for that many days after it was sealed.  A
renewal, signed at HQ with a bundle signing key, restarts the window at its `issued` time; it
never reaches past the manifest's `not_after`.  The file is canonical JSON

    {"renewal": {"format": "airgate-bundle-renewal/1", "bundle_id", "manifest_sha256",
                 "issued", "max_offline_days"},
     "signature": {"algorithm": "ed25519", "key_id", "signature"}}

and the signature covers `airgate-bundle-renewal/1\\n` followed by the canonical `renewal`
object.  A manifest signature covers bare manifest bytes (JSON: they start with `{`), so neither
signature ever verifies as the other.  Any other spelling of the file is refused, so an edit of
any byte fails.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Literal

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from msgspec import Meta

from .errors import BundleFormatError, BundlePolicyError, BundleSignatureError
from .manifest import Manifest, Sha256, Timestamp, parse_timestamp, timestamp
from .signing import Signature, TrustedKeys, key_id

__all__ = [
    "CLOCK_SKEW",
    "RENEWAL_FORMAT",
    "Renewal",
    "VerifiedRenewal",
    "create_renewal",
    "offline_window",
    "verify_renewal",
]

RENEWAL_FORMAT = "airgate-bundle-renewal/1"
_DOMAIN = RENEWAL_FORMAT.encode() + b"\n"
# a renewal issued this far in the future is still taken (HQ's and the laptop's clocks differ)
CLOCK_SKEW = timedelta(minutes=5)
_MAX_FILE = 64 << 10


class Renewal(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    format: Literal["airgate-bundle-renewal/1"] = "airgate-bundle-renewal/1"
    bundle_id: Annotated[str, Meta(pattern=r"^[0-9a-f]{32}$")]
    manifest_sha256: Sha256
    issued: Timestamp
    # the window this renewal grants (default at HQ: the manifest's max_offline_days)
    max_offline_days: Annotated[int, Meta(ge=1, le=3650)]


class _File(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    renewal: Renewal
    signature: Signature


_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(_File)


@dataclass(frozen=True)
class VerifiedRenewal:
    """A renewal whose signature a pinned key verified (`verify_renewal` makes them)."""

    renewal: Renewal
    signer: str  # key id
    data: bytes  # the file's exact bytes (what is stored)

    @property
    def issued(self) -> datetime:
        return parse_timestamp(self.renewal.issued)

    def check(self, manifest: Manifest, digest: str, *, now: datetime) -> None:
        """Refuse a renewal of another bundle, or one issued in the future."""
        r = self.renewal
        if r.bundle_id != manifest.bundle_id or r.manifest_sha256 != digest:
            raise BundlePolicyError(
                f"the renewal is for bundle {r.bundle_id} (manifest sha256 "
                f"{r.manifest_sha256[:16]}...), not for bundle {manifest.bundle_id} "
                f"(manifest sha256 {digest[:16]}...)"
            )
        if self.issued > now + CLOCK_SKEW:
            raise BundlePolicyError(
                f"the renewal is issued at {r.issued}, in the future: check this machine's "
                "clock, or ask HQ for a renewal issued now"
            )


def create_renewal(
    manifest: Manifest,
    digest: str,
    signing_key: Ed25519PrivateKey,
    *,
    issued: datetime,
    days: int | None = None,
) -> bytes:
    """The bytes of a renewal of the bundle `manifest` (whose manifest.json has SHA-256
    `digest`), issued at `issued`, granting `days` (default: the bundle's max_offline_days)."""
    if manifest.policy.max_offline_days is None:
        raise BundlePolicyError(
            "the bundle has no offline window (max_offline_days); it needs no renewal"
        )
    days = days if days is not None else manifest.policy.max_offline_days
    renewal = Renewal(
        bundle_id=manifest.bundle_id,
        manifest_sha256=digest,
        issued=timestamp(issued),
        max_offline_days=days,
    )
    try:
        msgspec.convert(msgspec.to_builtins(renewal), Renewal)  # the limits a reader enforces
    except msgspec.ValidationError as exc:
        raise BundlePolicyError(f"not a valid renewal: {exc}") from None
    body = _encoder.encode(renewal)
    signature = Signature(
        key_id=key_id(signing_key.public_key()),
        signature=base64.b64encode(signing_key.sign(_DOMAIN + body)).decode("ascii"),
    )
    return _encoder.encode(_File(renewal=renewal, signature=signature))


def verify_renewal(data: bytes, trusted: TrustedKeys) -> VerifiedRenewal:
    """The renewal in `data` if it is canonical and signed by a trusted key; else raises."""
    if len(data) > _MAX_FILE:
        raise BundleFormatError("the renewal file is too large to be a renewal")
    try:
        parsed = _decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise BundleFormatError(f"not a valid {RENEWAL_FORMAT} file: {exc}") from None
    except msgspec.DecodeError:
        raise BundleFormatError("the renewal file is not JSON") from None
    if _encoder.encode(parsed) != data:
        raise BundleFormatError("the renewal file is not in canonical form (was it edited?)")
    public = trusted.get(parsed.signature.key_id)
    if public is None:
        raise BundleSignatureError(
            f"the renewal is signed by key {parsed.signature.key_id}, which is not a trusted "
            "key here ([bundles] trusted_keys)"
        )
    try:
        raw = base64.b64decode(parsed.signature.signature, validate=True)
        public.verify(raw, _DOMAIN + _encoder.encode(parsed.renewal))
    except (ValueError, InvalidSignature):  # binascii.Error is a ValueError
        raise BundleSignatureError("the renewal's signature is invalid") from None
    return VerifiedRenewal(parsed.renewal, parsed.signature.key_id, data)


def offline_window(
    manifest: Manifest, renewal: Renewal | None = None
) -> tuple[datetime, int, datetime] | None:
    """(window start, days, end) of the bundle's offline window; None when it has none.

    The window starts at the later of `created` and the renewal's `issued`; the renewal's days
    replace the manifest's.  `not_after` is checked on its own (it always applies).
    """
    days = manifest.policy.max_offline_days
    if days is None:
        return None
    start = parse_timestamp(manifest.created)
    if renewal is not None:
        days = renewal.max_offline_days
        start = max(start, parse_timestamp(renewal.issued))
    return start, days, start + timedelta(days=days)
