"""Audit segments: a laptop's chain, carried home in signed pieces that verify on their own.

A segment holds rows `first_seq..last_seq` of one device's chain exactly as stored (seq, ts_us,
body, prev_hash, row_hash), every checkpoint signed since the segment's start up to the batch
checkpoint of `last_seq` (so a segment always ends on a checkpoint boundary), and what its
start needs to be checked alone: the hash of row `first_seq - 1` (`prev_row_hash`), the
checkpoint at `first_seq - 1` (`prev_checkpoint`, the batch checkpoint that signed that row;
None at seq 1) and the tree's right edge there (`frontier`).  The device's audit signer signs
the whole:

    b"airgate-audit-segment/1\\n" || canonical JSON of every field but `signature`

`check_segment` checks a segment against its device's enrolled keys, naming what is wrong:
the rows' order and links, each row hash, each checkpoint's link, range, signature and root,
then the segment's signature.  Rows and checkpoints come first, so an edited byte names the
row or checkpoint it is in rather than only breaking the outer signature.  Continuity with
what HQ already holds is `segment_store.import_segment`'s.  Only metadata travels: rows are
audit events, which hold no content (`event.py`).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from typing import Any, Final, Literal

import msgspec

from bundles.kms.signer import Signer, VerifyKey

from .chain import GENESIS, columns, row_hash
from .checkpoint import Checkpoint, check_signature, checkpoint_hash, trusted_by_id
from .devices import DeviceId, LogId
from .errors import AuditError
from .event import decode_event
from .merkle import CompactTree

__all__ = [
    "SEGMENT_FORMAT",
    "CheckedSegment",
    "Segment",
    "SegmentRefused",
    "SegmentRow",
    "check_segment",
    "decode_segment",
    "encode_segment",
    "sign_segment",
]

SEGMENT_FORMAT: Final = "airgate-audit-segment/1"
_DOMAIN = b"airgate-audit-segment/1\n"
_encoder = msgspec.json.Encoder(order="sorted")

RefusalReason = Literal[
    "malformed", "unknown_device", "edited", "reordered", "gap", "replay", "fork", "conflict"
]


class SegmentRefused(AuditError):
    """A segment HQ does not take; the message names the problem (never row content)."""

    def __init__(self, reason: RefusalReason, message: str) -> None:
        super().__init__(f"{reason.replace('_', ' ')}: {message}")
        self.reason = reason


class SegmentRow(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One stored row of the chain (`chain.py` says what its hash covers)."""

    seq: int
    ts_us: int
    body: str  # the event's canonical JSON, byte for byte as hashed
    prev_hash: str
    row_hash: str


class Segment(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    format: Literal["airgate-audit-segment/1"]
    device_id: DeviceId
    log_id: LogId
    alg: str
    key_id: str  # the device key that signed the segment
    created_us: int
    first_seq: int
    last_seq: int
    prev_row_hash: str  # row first_seq - 1 (zeros at seq 1)
    prev_checkpoint: Checkpoint | None  # the checkpoint at size first_seq - 1
    frontier: list[str]  # the tree's right edge at size first_seq - 1 (hex nodes)
    rows: list[SegmentRow]
    checkpoints: list[Checkpoint]  # after prev_checkpoint, the last at last_seq
    signature: str = ""  # base64, over `message()`

    def message(self) -> bytes:
        """The exact bytes the signature covers."""
        fields = msgspec.to_builtins(self)
        del fields["signature"]
        return _DOMAIN + _encoder.encode(fields)


def encode_segment(segment: Segment) -> bytes:
    return _encoder.encode(segment)


def decode_segment(data: bytes) -> Segment:
    """Raises `SegmentRefused("malformed", ...)`."""
    try:
        return msgspec.json.decode(data, type=Segment)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise SegmentRefused("malformed", f"not an audit segment ({exc})") from None


def sign_segment(segment: Segment, signer: Signer) -> Segment:
    """`segment` signed by `signer` (blocking for a remote signer)."""
    key = signer.verify_key
    unsigned = msgspec.structs.replace(segment, alg=key.alg, key_id=key.key_id, signature="")
    signature = base64.b64encode(signer.sign(unsigned.message())).decode("ascii")
    return msgspec.structs.replace(unsigned, signature=signature)


class CheckedSegment(msgspec.Struct, frozen=True, kw_only=True):
    """A segment that verified on its own: the rows and checkpoint rows to store."""

    segment: Segment
    rows: list[dict[str, Any]]  # audit_events rows
    checkpoint_rows: list[dict[str, Any]]  # audit_checkpoints rows (with frontiers)


def _signature_ok(key: VerifyKey, signature: str, message: bytes) -> bool:
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return False
    return key.verify(raw, message)


def _start_tree(segment: Segment) -> CompactTree:
    start = segment.first_seq - 1
    prev = segment.prev_checkpoint
    try:
        tree = CompactTree(start, [bytes.fromhex(node) for node in segment.frontier])
    except ValueError:
        tree = None
    expected = prev.root if prev is not None else None
    if (
        tree is None
        or (prev is None and start != 0)
        or (prev is not None and (prev.size != start or tree.root().hex() != expected))
        or (start == 0 and segment.prev_row_hash != GENESIS)
    ):
        raise SegmentRefused(
            "edited", "its start (prev_checkpoint, frontier, prev_row_hash) is inconsistent"
        )
    return tree


def _check_rows(
    segment: Segment, tree: CompactTree, sizes: set[int]
) -> tuple[list[dict[str, Any]], dict[int, tuple[str, tuple[bytes, ...]]]]:
    """The rows to store, and the tree's (root, frontier) at each size in `sizes`."""
    seqs = [row.seq for row in segment.rows]
    expected = list(range(segment.first_seq, segment.first_seq + len(seqs)))
    if seqs != expected:
        if sorted(seqs) == expected:
            at = next(i for i, (s, e) in enumerate(zip(seqs, expected, strict=True)) if s != e)
            raise SegmentRefused(
                "reordered", f"row seq {seqs[at]} stands where seq {expected[at]} belongs"
            )
        missing = sorted(set(expected) - set(seqs))
        where = f"seq {missing[0]} is missing" if missing else "a seq is out of its range"
        raise SegmentRefused(
            "edited", f"its rows are not seq {segment.first_seq}.. in order: {where}"
        )
    states = {tree.size: (tree.root().hex(), tree.stack)}
    prev = segment.prev_row_hash
    stored: list[dict[str, Any]] = []
    for row in segment.rows:
        seq = row.seq
        body = row.body.encode("utf-8")
        if row.prev_hash != prev:
            raise SegmentRefused(
                "edited", f"row seq {seq}: its prev_hash does not link to row {seq - 1}"
            )
        if row_hash(prev, seq, row.ts_us, body) != row.row_hash:
            raise SegmentRefused("edited", f"row seq {seq}: its hash does not match its content")
        try:
            event = decode_event(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            raise SegmentRefused(
                "edited", f"row seq {seq}: its body is not an audit event"
            ) from None
        values = columns(event)
        if values["ts_us"] != row.ts_us:
            raise SegmentRefused("edited", f"row seq {seq}: its ts_us is not its body's time")
        values.update(
            log_id=segment.log_id,
            seq=seq,
            body=row.body,
            prev_hash=row.prev_hash,
            row_hash=row.row_hash,
        )
        stored.append(values)
        prev = row.row_hash
        tree.append(bytes.fromhex(prev))
        if seq in sizes:
            states[seq] = (tree.root().hex(), tree.stack)
    return stored, states


def _check_checkpoints(
    segment: Segment,
    trusted: dict[str, VerifyKey],
    states: dict[int, tuple[str, tuple[bytes, ...]]],
) -> list[dict[str, Any]]:
    prev = segment.prev_checkpoint
    if prev is not None and (
        prev.log_id != segment.log_id or check_signature(prev, trusted) != "ok"
    ):
        raise SegmentRefused(
            "edited", f"its prev_checkpoint {prev.id} is not signed by the device for its chain"
        )
    stored: list[dict[str, Any]] = []
    for cp in segment.checkpoints:
        name = f"checkpoint {cp.id} (seq {cp.first_seq}..{cp.size})"
        first = prev.size + 1 if prev else 1
        if cp.id != (prev.id + 1 if prev else 1) or cp.prev_hash != checkpoint_hash(prev):
            raise SegmentRefused("edited", f"{name}: it does not link to the checkpoint before")
        epoch_ok = prev is None or (
            cp.epoch > prev.epoch if cp.kind == "epoch" else cp.epoch == prev.epoch
        )
        if (
            cp.log_id != segment.log_id
            or cp.first_seq != first
            or cp.count != cp.size - cp.first_seq + 1
            or cp.count < 0
            or cp.size > segment.last_seq
            or not epoch_ok
        ):
            raise SegmentRefused("edited", f"{name}: its chain, range or epoch is wrong")
        if check_signature(cp, trusted) != "ok":
            raise SegmentRefused("edited", f"{name}: its signature is not the device's")
        root, frontier = states[cp.size]
        if root != cp.root:
            raise SegmentRefused("edited", f"{name}: the rows do not hash to its signed root")
        stored.append(cp.row(frontier))
        prev = cp
    if prev is None or prev.size != segment.last_seq or not segment.checkpoints:
        raise SegmentRefused("edited", f"no checkpoint signs its last row (seq {segment.last_seq})")
    return stored


def check_segment(segment: Segment, keys: Sequence[VerifyKey]) -> CheckedSegment:
    """Verify `segment` on its own against its device's enrolled `keys`: rows, checkpoints,
    then its signature.  Raises `SegmentRefused` naming the first problem."""
    trusted = trusted_by_id(keys)
    if segment.key_id not in trusted:
        raise SegmentRefused(
            "unknown_device",
            f"the segment is signed by key {segment.key_id}, which is not device "
            f"{segment.device_id}'s enrolled key",
        )
    if not segment.rows or segment.last_seq != segment.first_seq + len(segment.rows) - 1:
        raise SegmentRefused("malformed", "its rows do not span first_seq..last_seq")
    tree = _start_tree(segment)
    sizes = {cp.size for cp in segment.checkpoints}
    rows, states = _check_rows(segment, tree, sizes)
    if not sizes <= states.keys():
        raise SegmentRefused("edited", "a checkpoint's size lies outside the segment")
    checkpoint_rows = _check_checkpoints(segment, trusted, states)
    key = trusted[segment.key_id]
    if key.alg != segment.alg or not _signature_ok(key, segment.signature, segment.message()):
        raise SegmentRefused(
            "edited", "the segment's signature does not verify (it was changed after signing)"
        )
    return CheckedSegment(segment=segment, rows=rows, checkpoint_rows=checkpoint_rows)
