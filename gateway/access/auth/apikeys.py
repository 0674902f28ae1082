"""API key text: `ag_<key id>_<secret>_<checksum>`, recognisable offline by secret scanners.

    ag_ 4fT9kQ2xB7mZ _ <32 base62 chars of secret> _ <6 base62 chars of CRC32>

The key id (12 base62 characters, ~71 bits) is public: it names the key in the store, the audit
log and rate-limit counters.  The secret (32 base62 characters, ~190 bits) is only ever shown
once, at creation; the store keeps HMAC-SHA256(pepper, secret).  The checksum is the CRC32 of
`ag_<key id>_<secret>` written as 6 base62 digits (most significant first, zero-padded): it lets
a scanner tell a real key from a look-alike without a database, as GitHub's tokens do, and lets
the gateway reject typos before any lookup.  A CRC32 catches every single-character change.

Scanner rule (PCRE / Hyperscan / Python `re`), then verify the checksum:

    \\bag_[0-9A-Za-z]{12}_[0-9A-Za-z]{32}_[0-9A-Za-z]{6}\\b
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import string
import zlib
from typing import Final

from .errors import MalformedKey

__all__ = [
    "KEY_ID_LENGTH",
    "SCANNER_PATTERN",
    "api_key_checksum",
    "generate_api_key",
    "is_key_id",
    "parse_api_key",
    "secret_digest",
]

ALPHABET: Final = string.digits + string.ascii_uppercase + string.ascii_lowercase
PREFIX: Final = "ag_"
KEY_ID_LENGTH: Final = 12
SECRET_LENGTH: Final = 32
CHECKSUM_LENGTH: Final = 6
KEY_LENGTH: Final = len(PREFIX) + KEY_ID_LENGTH + 1 + SECRET_LENGTH + 1 + CHECKSUM_LENGTH

SCANNER_PATTERN: Final = (
    rf"\bag_[0-9A-Za-z]{{{KEY_ID_LENGTH}}}_[0-9A-Za-z]{{{SECRET_LENGTH}}}"
    rf"_[0-9A-Za-z]{{{CHECKSUM_LENGTH}}}\b"
)
_SHAPE = re.compile(
    rf"ag_([0-9A-Za-z]{{{KEY_ID_LENGTH}}})_([0-9A-Za-z]{{{SECRET_LENGTH}}})"
    rf"_([0-9A-Za-z]{{{CHECKSUM_LENGTH}}})",
    re.ASCII,
)
_KEY_ID = re.compile(rf"[0-9A-Za-z]{{{KEY_ID_LENGTH}}}", re.ASCII)


def _random(n: int) -> str:
    return "".join(secrets.choice(ALPHABET) for _ in range(n))


def api_key_checksum(body: str) -> str:
    """The 6-character checksum of `ag_<key id>_<secret>`."""
    value = zlib.crc32(body.encode("ascii"))
    digits = []
    for _ in range(CHECKSUM_LENGTH):  # 62**6 > 2**32: six digits always suffice
        value, digit = divmod(value, 62)
        digits.append(ALPHABET[digit])
    return "".join(reversed(digits))


def generate_api_key() -> str:
    """A new random API key text (id and secret from `secrets`)."""
    body = f"{PREFIX}{_random(KEY_ID_LENGTH)}_{_random(SECRET_LENGTH)}"
    return f"{body}_{api_key_checksum(body)}"


def parse_api_key(text: str) -> tuple[str, str]:
    """`(key_id, secret)` of a well-formed key; `MalformedKey` for a bad shape or checksum.

    Needs no database, so garbage and typos are turned away before any lookup.
    """
    if len(text) != KEY_LENGTH:
        raise MalformedKey()
    match = _SHAPE.fullmatch(text)
    if match is None:
        raise MalformedKey()
    key_id, secret, checksum = match.groups()
    body = text[: -CHECKSUM_LENGTH - 1]
    if not hmac.compare_digest(checksum, api_key_checksum(body)):
        raise MalformedKey()
    return key_id, secret


def is_key_id(text: str) -> bool:
    """Whether `text` has the shape of a key id (for admin routes taking an id)."""
    return _KEY_ID.fullmatch(text) is not None


def secret_digest(pepper: bytes, secret: str) -> str:
    """HMAC-SHA256(pepper, secret) in hex: what the store keeps instead of the secret.

    A stolen database without the pepper file does not let anyone test guessed secrets.
    """
    return hmac.new(pepper, secret.encode("ascii"), hashlib.sha256).hexdigest()
