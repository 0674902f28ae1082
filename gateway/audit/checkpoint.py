"""Signed checkpoints: an Ed25519 signature over the Merkle root of the rows since the last one.

A row hash chain detects an edited, removed, inserted or reordered row, but not an attacker who
rewrites a row and recomputes every hash after it.  A checkpoint does: it commits, with a key the
database does not hold, to the exact list of row hashes `first_seq..last_seq`.  Checkpoints
cover consecutive ranges from seq 1 and link to each other (`prev_hash` is the SHA-256 of the
previous checkpoint's signed message), so one cannot be dropped from the middle unnoticed.

Signed message (domain-separated from bundle manifests signed with the same kind of key):

    b"airgate-audit-checkpoint/1\\n" || canonical JSON {count, first_seq, id, last_seq,
                                                       merkle_root, prev_hash, ts_us}

`key_id` is the first 16 hex digits of SHA-256 of the raw public key (as for bundle keys), so a
verifier picks the trusted key without trying each one.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from bundles.signing import key_id

from .chain import GENESIS
from .merkle import merkle_root

__all__ = [
    "Checkpoint",
    "CheckpointCheck",
    "check_signature",
    "checkpoint_from_row",
    "checkpoint_hash",
    "make_checkpoint",
    "range_root",
    "trusted_by_id",
]

_DOMAIN = b"airgate-audit-checkpoint/1\n"
_encoder = msgspec.json.Encoder(order="sorted")

CheckpointCheck = Literal["ok", "untrusted_key", "bad_signature"]


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """One row of `audit_checkpoints`."""

    id: int
    first_seq: int
    last_seq: int
    count: int
    merkle_root: str
    prev_hash: str
    ts_us: int
    key_id: str
    signature: str  # base64 of the 64-byte Ed25519 signature

    def message(self) -> bytes:
        """The exact bytes the signature covers."""
        signed = {
            "count": self.count,
            "first_seq": self.first_seq,
            "id": self.id,
            "last_seq": self.last_seq,
            "merkle_root": self.merkle_root,
            "prev_hash": self.prev_hash,
            "ts_us": self.ts_us,
        }
        return _DOMAIN + _encoder.encode(signed)


def checkpoint_from_row(row: Any) -> Checkpoint:
    """A row of `audit_checkpoints` (any object with its column attributes)."""
    return Checkpoint(
        id=int(row.id),
        first_seq=int(row.first_seq),
        last_seq=int(row.last_seq),
        count=int(row.count),
        merkle_root=str(row.merkle_root),
        prev_hash=str(row.prev_hash),
        ts_us=int(row.ts_us),
        key_id=str(row.key_id),
        signature=str(row.signature),
    )


def range_root(row_hashes: Sequence[str]) -> str:
    """The Merkle root (hex) over hex row hashes, each leaf being the 32 raw bytes."""
    return merkle_root([bytes.fromhex(h) for h in row_hashes]).hex()


def checkpoint_hash(checkpoint: Checkpoint | None) -> str:
    """What the next checkpoint's `prev_hash` must be (zeros before the first)."""
    if checkpoint is None:
        return GENESIS
    return hashlib.sha256(checkpoint.message()).hexdigest()


def make_checkpoint(
    prev: Checkpoint | None,
    row_hashes: Sequence[str],
    *,
    ts_us: int,
    signing_key: Ed25519PrivateKey,
) -> Checkpoint:
    """The checkpoint after `prev` over the next `len(row_hashes)` rows, signed."""
    first = prev.last_seq + 1 if prev else 1
    unsigned = Checkpoint(
        id=prev.id + 1 if prev else 1,
        first_seq=first,
        last_seq=first + len(row_hashes) - 1,
        count=len(row_hashes),
        merkle_root=range_root(row_hashes),
        prev_hash=checkpoint_hash(prev),
        ts_us=ts_us,
        key_id=key_id(signing_key.public_key()),
        signature="",
    )
    signature = base64.b64encode(signing_key.sign(unsigned.message())).decode("ascii")
    return msgspec.structs.replace(unsigned, signature=signature)


def trusted_by_id(keys: Iterable[Ed25519PublicKey]) -> dict[str, Ed25519PublicKey]:
    return {key_id(k): k for k in keys}


def check_signature(
    checkpoint: Checkpoint, trusted: Mapping[str, Ed25519PublicKey]
) -> CheckpointCheck:
    """Whether a trusted key signed exactly this checkpoint."""
    public = trusted.get(checkpoint.key_id)
    if public is None:
        return "untrusted_key"
    try:
        raw = base64.b64decode(checkpoint.signature, validate=True)
        public.verify(raw, checkpoint.message())
    except (InvalidSignature, binascii.Error, ValueError):
        return "bad_signature"
    return "ok"
