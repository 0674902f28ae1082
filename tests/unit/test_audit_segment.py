"""Audit segments on their own (no database): a laptop's chain built in memory by the writer's
own pure code (`_head.extend`), cut into segments as `segment_store.read_segment` cuts them,
checked as HQ checks them; and the binding of an enrolled device key to its chain."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from bundles.kms.signer import LocalSigner, VerifyKey
from gateway.audit import AuditEvent, AuditPrincipal
from gateway.audit._head import Head, Signing, extend, seal
from gateway.audit.chain import GENESIS
from gateway.audit.checkpoint import Checkpoint, CheckpointKind, signed
from gateway.audit.devices import (
    DeviceKey,
    EnrolmentError,
    chain_keys,
    device_keys,
    read_enrolments,
)
from gateway.audit.merkle import CompactTree
from gateway.audit.segment import (
    SEGMENT_FORMAT,
    Segment,
    SegmentRefused,
    SegmentRow,
    check_segment,
    decode_segment,
    encode_segment,
    sign_segment,
)

LOG_ID = "0123456789abcdef"
T0 = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)


class Chain:
    """A laptop's chain in memory: rows, and each checkpoint with the tree's edge at it."""

    def __init__(self, signer: LocalSigner, log_id: str = LOG_ID) -> None:
        key = signer.verify_key
        self.signer = signer
        self.signing = Signing(log_id=log_id, alg=key.alg, key_id=key.key_id)
        self.head = Head(seq=0, row_hash=GENESIS, checkpoint=None, tree=CompactTree())
        self.rows: list[SegmentRow] = []
        self.checkpoints: list[tuple[Checkpoint, tuple[bytes, ...]]] = []
        self.mark("open")

    def _sign(self, cp: Checkpoint) -> Checkpoint:
        return signed(cp, self.signer.sign(cp.message()))

    def mark(self, kind: CheckpointKind) -> None:
        cp = self._sign(seal(self.head, kind, ts_us=self._ts(), signing=self.signing))
        self.checkpoints.append((cp, self.head.tree.stack))
        self.head = msgspec.structs.replace(self.head, checkpoint=cp)

    def _ts(self) -> int:
        return int((T0 - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() * 1e6) + len(self.rows)

    def commit(self, n: int, *, model: str = "echo") -> None:
        """One group commit of `n` events (and its batch checkpoint)."""
        start = len(self.rows)
        events = [
            AuditEvent(
                event_id=f"ev-{model}-{start + i}",
                ts=T0 + timedelta(seconds=start + i),
                kind="inference.completed",
                outcome="success",
                request_id=f"req-{start + i}",
                principal=AuditPrincipal(key_id="k1", team="t1"),
                model=model,
                http_status=200,
            )
            for i in range(n)
        ]
        rows, cps, head = extend(
            self.head, events, every=1000, ts_us=self._ts(), signing=self.signing
        )
        self.rows += [
            SegmentRow(
                seq=r["seq"],
                ts_us=r["ts_us"],
                body=r["body"],
                prev_hash=r["prev_hash"],
                row_hash=r["row_hash"],
            )
            for r in rows
        ]
        done = [(self._sign(cp), stack) for cp, stack in cps]
        self.checkpoints += done
        self.head = msgspec.structs.replace(head, checkpoint=done[-1][0])

    def segment(self, from_seq: int, device_id: str = "laptop-1") -> Segment:
        """The signed segment from `from_seq` to the latest batch, as the laptop cuts it."""
        batches = [(cp, st) for cp, st in self.checkpoints if cp.count > 0]
        end = batches[-1][0]
        prev = next(((cp, st) for cp, st in batches if cp.size == from_seq - 1), None)
        after = prev[0].id if prev else 0
        unsigned = Segment(
            format=SEGMENT_FORMAT,
            device_id=device_id,
            log_id=self.signing.log_id,
            alg="",
            key_id="",
            created_us=1,
            first_seq=from_seq,
            last_seq=end.size,
            prev_row_hash=self.rows[from_seq - 2].row_hash if from_seq > 1 else GENESIS,
            prev_checkpoint=prev[0] if prev else None,
            frontier=[node.hex() for node in prev[1]] if prev else [],
            rows=self.rows[from_seq - 1 : end.size],
            checkpoints=[cp for cp, _ in self.checkpoints if after < cp.id <= end.id],
        )
        return sign_segment(unsigned, self.signer)


@pytest.fixture
def device() -> LocalSigner:
    return LocalSigner(Ed25519PrivateKey.generate())


@pytest.fixture
def chain(device: LocalSigner) -> Chain:
    c = Chain(device)
    c.commit(3)
    c.mark("close")
    c.mark("open")
    c.commit(2)
    c.commit(4)
    return c


def refused(segment: Segment, keys: list[VerifyKey]) -> SegmentRefused:
    with pytest.raises(SegmentRefused) as caught:
        check_segment(segment, keys)
    return caught.value


def resigned(segment: Segment, signer: LocalSigner, **changes: object) -> Segment:
    """`segment` changed, and signed again by the device (an attacker holding the key)."""
    return sign_segment(msgspec.structs.replace(segment, **changes), signer)


def test_segments_cut_at_checkpoints_verify_alone(chain: Chain, device: LocalSigner) -> None:
    first = chain.segment(1)
    checked = check_segment(decode_segment(encode_segment(first)), [device.verify_key])
    assert [r["seq"] for r in checked.rows] == list(range(1, 10))
    assert checked.rows[0]["model"] == "echo" and checked.rows[0]["log_id"] == LOG_ID
    # open, batch, close, open, batch, batch: every checkpoint, each with the tree's edge
    assert [c["kind"] for c in checked.checkpoint_rows] == [
        "open",
        "batch",
        "close",
        "open",
        "batch",
        "batch",
    ]
    later = chain.segment(4)  # after the first batch: the close/open ride with the next rows
    checked = check_segment(later, [device.verify_key])
    assert [r["seq"] for r in checked.rows] == list(range(4, 10))
    assert [c["id"] for c in checked.checkpoint_rows] == [3, 4, 5, 6]
    assert later.prev_checkpoint is not None and later.prev_checkpoint.size == 3


def test_an_edited_byte_names_its_row(chain: Chain, device: LocalSigner) -> None:
    segment = chain.segment(1)
    rows = list(segment.rows)
    rows[4] = msgspec.structs.replace(rows[4], body=rows[4].body.replace("req-4", "req-X"))
    problem = refused(msgspec.structs.replace(segment, rows=rows), [device.verify_key])
    assert problem.reason == "edited" and "row seq 5" in str(problem)
    # its hash recomputed too: the next row no longer links to it
    forged = msgspec.structs.replace(rows[4], row_hash="ab" * 32)
    rows[4] = forged
    problem = refused(msgspec.structs.replace(segment, rows=rows), [device.verify_key])
    assert "row seq 5" in str(problem)


def test_rows_out_of_order_are_reordered(chain: Chain, device: LocalSigner) -> None:
    segment = chain.segment(1)
    rows = list(segment.rows)
    rows[2], rows[3] = rows[3], rows[2]
    problem = refused(resigned(segment, device, rows=rows), [device.verify_key])
    assert problem.reason == "reordered" and "seq 4" in str(problem)


def test_a_missing_row_is_refused(chain: Chain, device: LocalSigner) -> None:
    segment = chain.segment(1)
    problem = refused(
        resigned(segment, device, rows=segment.rows[:5] + segment.rows[6:]), [device.verify_key]
    )
    assert problem.reason in ("edited", "malformed")


def test_an_edited_checkpoint_is_named(chain: Chain, device: LocalSigner) -> None:
    segment = chain.segment(1)
    cps = list(segment.checkpoints)
    cps[1] = msgspec.structs.replace(cps[1], ts_us=cps[1].ts_us + 1)
    problem = refused(msgspec.structs.replace(segment, checkpoints=cps), [device.verify_key])
    assert problem.reason == "edited" and "checkpoint 2" in str(problem)


def test_a_segment_must_end_on_a_checkpoint(chain: Chain, device: LocalSigner) -> None:
    segment = chain.segment(1)
    problem = refused(
        resigned(segment, device, checkpoints=segment.checkpoints[:-1]), [device.verify_key]
    )
    assert "seq 9" in str(problem)


def test_the_outer_signature_covers_the_rest(chain: Chain, device: LocalSigner) -> None:
    segment = chain.segment(4)
    problem = refused(msgspec.structs.replace(segment, device_id="laptop-2"), [device.verify_key])
    assert problem.reason == "edited" and "signature" in str(problem)
    problem = refused(
        msgspec.structs.replace(segment, prev_row_hash="00" * 32), [device.verify_key]
    )
    assert problem.reason == "edited"


def test_another_key_is_an_unknown_device(chain: Chain) -> None:
    other = LocalSigner(Ed25519PrivateKey.generate())
    problem = refused(chain.segment(1), [other.verify_key])
    assert problem.reason == "unknown_device"
    # the same rows re-signed by another key: its checkpoints still name the device's key
    problem = refused(resigned(chain.segment(1), other), [other.verify_key])
    assert problem.reason == "edited" and "checkpoint 1" in str(problem)


def test_malformed_segments_are_refused() -> None:
    for data in (b"", b"{}", b"[1]", b'{"format": "airgate-audit-segment/9"}'):
        with pytest.raises(SegmentRefused) as caught:
            decode_segment(data)
        assert caught.value.reason == "malformed"


def enrolment(signer: LocalSigner, device: str, log_id: str, **extra: str) -> str:
    key = signer.verify_key
    fields = {
        "format": "airgate-device-enrolment/1",
        "device_id": device,
        "log_id": log_id,
        "key_id": key.key_id,
        "public_key": key.text,
        "created": "2026-12-02T10:00:00Z",
        **extra,
    }
    return json.dumps(fields)


def test_a_device_key_vouches_for_its_own_chain_only(device: LocalSigner) -> None:
    hq = LocalSigner(Ed25519PrivateKey.generate()).verify_key
    keys = [hq, *device_keys([enrolment(device, "laptop-1", LOG_ID)])]
    mine, owner = chain_keys(keys, LOG_ID)
    assert owner == "laptop-1" and [k.key_id for k in mine] == [device.verify_key.key_id]
    others, owner = chain_keys(keys, "fedcba9876543210")
    assert owner is None and others == [hq]  # not the device's key: it is bound elsewhere
    assert isinstance(keys[1], DeviceKey) and keys[1] == device.verify_key


def test_enrolments_are_checked(device: LocalSigner) -> None:
    other = LocalSigner(Ed25519PrivateKey.generate())
    two_chains = [
        enrolment(device, "laptop-1", LOG_ID),
        enrolment(other, "laptop-1", "fedcba9876543210"),
    ]
    one_chain = [enrolment(device, "laptop-1", LOG_ID), enrolment(other, "laptop-2", LOG_ID)]
    rotated = [enrolment(device, "laptop-1", LOG_ID), enrolment(other, "laptop-1", LOG_ID)]
    for entries in (two_chains, one_chain):
        with pytest.raises(EnrolmentError):
            read_enrolments(entries)
    assert len(device_keys(rotated)) == 2
    bad = [
        enrolment(device, "laptop 1", LOG_ID),  # not a device id
        enrolment(device, "laptop-1", "XYZ"),  # not a chain id
        enrolment(device, "laptop-1", LOG_ID, key_id="0" * 16),  # not its key's id
        enrolment(device, "laptop-1", LOG_ID, secret="x"),  # unknown field
    ]
    for entry in bad:
        with pytest.raises(EnrolmentError) as caught:
            read_enrolments([entry])
        assert "entry 1" in str(caught.value) and "laptop" not in str(caught.value)
