"""Signed checkpoints: tree heads over the whole log, chained to each other, signed by a key the
database does not hold.

A row hash chain detects an edited, removed, inserted or reordered row, but not an attacker who
rewrites a row and recomputes every hash after it.  A checkpoint does: it commits, with a key
pinned by every verifier, to the Merkle tree head of the log (RFC 6962) at `size` rows, and to
the hash of the previous checkpoint (like CloudTrail's digest files), so a verifier who holds
any one checkpoint can prove the log it is shown later still begins with the same rows.

Each one is a row of `audit_checkpoints`, and the writer also publishes them to witnesses
outside the database (`witness.py`).  Kinds: `batch` (after each group commit: the rows and
their checkpoint commit in one transaction, so no row is ever unsigned), `open` (at start,
"opened at size N"), `close` (clean shutdown) and `epoch` (an explicit new epoch after a loss,
`airgate audit init --new-epoch`).

Signed message (domain-separated from bundle manifests):

    b"airgate-audit-checkpoint/2\\n" || canonical JSON {alg, count, epoch, first_seq, id, kind,
        log_id, prev_hash, root, size, ts_us}

`first_seq`/`count` name the rows this checkpoint added (count 0 for open/close/epoch).
`frontier` is not signed: it is the writer's cache of the tree's right edge, so a restart does
not re-read every row; a wrong one only makes later roots wrong, which verification finds.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import msgspec

from bundles.kms.signer import VerifyKey

from .chain import GENESIS

__all__ = [
    "Checkpoint",
    "CheckpointCheck",
    "CheckpointKind",
    "check_signature",
    "checkpoint_from_row",
    "checkpoint_hash",
    "decode_checkpoint",
    "encode_checkpoint",
    "signed",
    "trusted_by_id",
    "unsigned_checkpoint",
]

_DOMAIN = b"airgate-audit-checkpoint/2\n"
_encoder = msgspec.json.Encoder(order="sorted")

CheckpointCheck = Literal["ok", "untrusted_key", "bad_signature"]
CheckpointKind = Literal["batch", "open", "close", "epoch"]


class Checkpoint(msgspec.Struct, frozen=True, kw_only=True):
    """One signed tree head (a row of `audit_checkpoints`, and what witnesses keep)."""

    id: int
    log_id: str
    epoch: int
    kind: CheckpointKind
    size: int  # rows 1..size are in the tree (stored as last_seq)
    root: str  # hex RFC 6962 root over the row hashes 1..size (stored as merkle_root)
    first_seq: int
    count: int
    prev_hash: str  # SHA-256 (hex) of the previous checkpoint's message
    ts_us: int
    alg: str
    key_id: str
    signature: str  # base64

    def message(self) -> bytes:
        """The exact bytes the signature covers."""
        signed = {
            "alg": self.alg,
            "count": self.count,
            "epoch": self.epoch,
            "first_seq": self.first_seq,
            "id": self.id,
            "kind": self.kind,
            "log_id": self.log_id,
            "prev_hash": self.prev_hash,
            "root": self.root,
            "size": self.size,
            "ts_us": self.ts_us,
        }
        return _DOMAIN + _encoder.encode(signed)

    def row(self, frontier: Iterable[bytes] = ()) -> dict[str, Any]:
        """The `audit_checkpoints` row."""
        return {
            "id": self.id,
            "log_id": self.log_id,
            "epoch": self.epoch,
            "kind": self.kind,
            "last_seq": self.size,
            "merkle_root": self.root,
            "first_seq": self.first_seq,
            "count": self.count,
            "prev_hash": self.prev_hash,
            "ts_us": self.ts_us,
            "alg": self.alg,
            "key_id": self.key_id,
            "signature": self.signature,
            "frontier": "".join(node.hex() for node in frontier),
        }


def checkpoint_from_row(row: Any) -> Checkpoint:
    """A row of `audit_checkpoints` (any object with its column attributes)."""
    return Checkpoint(
        id=int(row.id),
        log_id=str(row.log_id),
        epoch=int(row.epoch),
        kind=row.kind,
        size=int(row.last_seq),
        root=str(row.merkle_root),
        first_seq=int(row.first_seq),
        count=int(row.count),
        prev_hash=str(row.prev_hash),
        ts_us=int(row.ts_us),
        alg=str(row.alg),
        key_id=str(row.key_id),
        signature=str(row.signature),
    )


def encode_checkpoint(checkpoint: Checkpoint) -> bytes:
    """The canonical JSON witnesses store (one line)."""
    return _encoder.encode(checkpoint)


def decode_checkpoint(data: bytes | str) -> Checkpoint:
    """Raises `msgspec.DecodeError`/`ValidationError` on anything else."""
    return msgspec.json.decode(data, type=Checkpoint)


def checkpoint_hash(checkpoint: Checkpoint | None) -> str:
    """What the next checkpoint's `prev_hash` must be (zeros before the first)."""
    if checkpoint is None:
        return GENESIS
    return hashlib.sha256(checkpoint.message()).hexdigest()


def unsigned_checkpoint(
    prev: Checkpoint | None,
    *,
    log_id: str,
    epoch: int,
    kind: CheckpointKind,
    size: int,
    root: bytes,
    ts_us: int,
    alg: str,
    key_id: str,
) -> Checkpoint:
    """The checkpoint after `prev` at `size` rows, to be signed (`signature` empty)."""
    first = prev.size + 1 if prev else 1
    return Checkpoint(
        id=prev.id + 1 if prev else 1,
        log_id=log_id,
        epoch=epoch,
        kind=kind,
        size=size,
        root=root.hex(),
        first_seq=first,
        count=size - first + 1,
        prev_hash=checkpoint_hash(prev),
        ts_us=ts_us,
        alg=alg,
        key_id=key_id,
        signature="",
    )


def signed(checkpoint: Checkpoint, signature: bytes) -> Checkpoint:
    return msgspec.structs.replace(
        checkpoint, signature=base64.b64encode(signature).decode("ascii")
    )


def trusted_by_id(keys: Iterable[VerifyKey]) -> dict[str, VerifyKey]:
    return {k.key_id: k for k in keys}


def check_signature(checkpoint: Checkpoint, trusted: Mapping[str, VerifyKey]) -> CheckpointCheck:
    """Whether a trusted key signed exactly this checkpoint."""
    public = trusted.get(checkpoint.key_id)
    if public is None:
        return "untrusted_key"
    if public.alg != checkpoint.alg:
        return "bad_signature"
    try:
        raw = base64.b64decode(checkpoint.signature, validate=True)
    except (binascii.Error, ValueError):
        return "bad_signature"
    return "ok" if public.verify(raw, checkpoint.message()) else "bad_signature"
