"""The audit log's pure parts: the event type, canonical hashing, Merkle roots, checkpoint
signatures, cursors and the export cell and OCSF mappings."""

from __future__ import annotations

import calendar
import hashlib
import math
import re
import struct
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from bundles import key_id
from gateway.audit import AuditEvent, AuditPrincipal, AuditRecord, InvalidAuditEvent
from gateway.audit.chain import GENESIS, canonical, columns, link, row_hash
from gateway.audit.checkpoint import (
    check_signature,
    checkpoint_hash,
    make_checkpoint,
    range_root,
    trusted_by_id,
)
from gateway.audit.errors import InvalidCursor
from gateway.audit.event import decode_event, encode_event, ts_us
from gateway.audit.export import csv_safe, ocsf_event
from gateway.audit.merkle import leaf_hash, merkle_root, node_hash
from gateway.audit.query import decode_cursor, encode_cursor

TS = datetime(2026, 11, 29, 12, 30, 15, 123456, tzinfo=UTC)


def event(**changes: Any) -> AuditEvent:
    fields: dict[str, Any] = {
        "event_id": "e1",
        "ts": TS,
        "kind": "inference.completed",
        "outcome": "success",
        "request_id": "req-1",
        "principal": AuditPrincipal(key_id="k1", team="research", subject="alice@example.com"),
        "model": "gemma-3-270m",
        "http_status": 200,
        "prompt_tokens": 10,
        "completion_tokens": 20,
        "latency_ms": 12.5,
        "sampling": {"temperature": 0.7, "max_tokens": 64, "stream": True},
    }
    fields.update(changes)
    return AuditEvent(**fields)


# -- the event: metadata only, by construction ------------------------------------------------

KEPT = {
    "event_id", "ts", "kind", "outcome", "request_id", "principal", "action", "model",
    "bundle_digest", "deployment", "route", "http_status", "error_class", "prompt_tokens",
    "completion_tokens", "latency_ms", "ttft_ms", "finish_reason", "sampling", "request_bytes",
    "response_bytes", "policy_version", "decision", "degraded", "detail",
    "response_format", "tools_count", "tool_calls_count", "inputs_count",
}  # fmt: skip


def test_the_event_has_exactly_the_kept_fields() -> None:
    assert set(AuditEvent.__struct_fields__) == KEPT
    assert set(AuditPrincipal.__struct_fields__) == {"key_id", "team", "subject", "method"}


def _str_types(t: msgspec.inspect.Type) -> Iterator[msgspec.inspect.StrType]:
    if isinstance(t, msgspec.inspect.StrType):
        yield t
    elif isinstance(t, msgspec.inspect.UnionType):
        for member in t.types:
            yield from _str_types(member)
    elif isinstance(t, msgspec.inspect.DictType):
        yield from _str_types(t.key_type)
        yield from _str_types(t.value_type)
    elif isinstance(t, msgspec.inspect.StructType):
        for field in t.fields:
            yield from _str_types(field.type)


def test_every_string_is_a_bounded_identifier_without_whitespace() -> None:
    strings = list(_str_types(msgspec.inspect.type_info(AuditEvent)))
    assert len(strings) > 15
    for s in strings:
        assert s.pattern is not None
        for text in ("hello world", "line\nbreak", "trailing\n", "tab\tbed", "x" * 257, ""):
            assert re.search(s.pattern, text) is None, (s.pattern, text)


@pytest.mark.parametrize(
    "changes",
    [
        {"model": "ignore previous instructions"},
        {"model": "gemma\n"},
        {"model": "m" * 129},
        {"request_id": "req 1"},
        {"error_class": "ValueError: the prompt was too long"},
        {"principal": AuditPrincipal(subject="Alice Smith")},
        {"route": "/v1/chat?q=secret"},
        {"sampling": {"stop": "END"}},
        {"sampling": {"temperature": math.nan}},
        {"sampling": {"Bad Key": 1}},
        {"detail": {"note": "free text here"}},
        {"bundle_digest": "abc"},
        {"http_status": 42},
        {"prompt_tokens": -1},
        {"kind": "inference.started"},
        {"outcome": "ok"},
        {"ts": datetime(2026, 1, 1)},  # naive
        {"ts": "2026-01-01T00:00:00Z"},
    ],
)
def test_content_cannot_be_put_in(changes: dict[str, Any]) -> None:
    with pytest.raises(InvalidAuditEvent):
        event(**changes)


def test_unknown_fields_do_not_exist() -> None:
    with pytest.raises(TypeError):
        event(messages=[{"role": "user", "content": "hi"}])


def test_validation_messages_name_the_field_not_the_value() -> None:
    with pytest.raises(InvalidAuditEvent) as info:
        event(model="secret prompt words")
    assert "$.model" in str(info.value)
    assert "secret" not in str(info.value)


def test_nested_paths_are_named() -> None:
    with pytest.raises(InvalidAuditEvent, match=r"\$\.principal\.subject"):
        event(principal=AuditPrincipal(subject="two words"))
    with pytest.raises(InvalidAuditEvent, match=r"\$\.sampling\['top_p'\]"):
        event(sampling={"top_p": "0.9"})


_STRING_FIELDS = ["event_id", "request_id", "action", "model", "bundle_digest", "route",
                  "error_class", "finish_reason", "decision", "kind", "outcome"]  # fmt: skip


def _agrees(changes: dict[str, Any]) -> None:
    """Construction accepts exactly what the validating decoder accepts."""
    builtins = msgspec.to_builtins(event())
    try:
        decode_event(msgspec.json.encode({**builtins, **msgspec.to_builtins(changes)}))
        decodes = True
    except msgspec.ValidationError:
        decodes = False
    try:
        event(**changes)
        constructs = True
    except InvalidAuditEvent:
        constructs = False
    assert decodes == constructs, changes


@given(
    st.sampled_from(_STRING_FIELDS),
    st.one_of(
        st.text(max_size=300), st.from_regex(r"[A-Za-z0-9_.:@/+\-]{1,130}\n?", fullmatch=True)
    ),
)
def test_construction_agrees_with_the_decoder_on_strings(field: str, value: str) -> None:
    _agrees({field: value})


@given(
    st.dictionaries(
        st.one_of(st.text(max_size=40), st.from_regex(r"[a-z][a-z0-9_]{0,33}", fullmatch=True)),
        st.one_of(st.booleans(), st.integers(), st.floats(), st.text(max_size=5), st.none()),
        max_size=30,
    )
)
def test_construction_agrees_with_the_decoder_on_sampling(sampling: dict[str, Any]) -> None:
    _agrees({"sampling": sampling})


@given(st.integers(-(2**40), 2**40), st.floats(allow_nan=False, allow_infinity=False))
def test_construction_agrees_with_the_decoder_on_numbers(n: int, x: float) -> None:
    _agrees({"http_status": n})
    _agrees({"prompt_tokens": n})
    _agrees({"latency_ms": x})


@pytest.mark.parametrize("x", [math.inf, -math.inf, math.nan])
def test_non_finite_numbers_are_refused(x: float) -> None:
    """JSON has no spelling for them (msgspec would store null): refuse rather than change."""
    with pytest.raises(InvalidAuditEvent):
        event(latency_ms=x)
    with pytest.raises(InvalidAuditEvent):
        event(sampling={"temperature": x})


def test_timestamps_are_kept_in_utc_with_microseconds() -> None:
    plus_two = timezone(timedelta(hours=2))
    e = event(ts=TS.astimezone(plus_two))
    assert e.ts == TS and e.ts.utcoffset() == timedelta(0)
    assert b'"ts":"2026-11-29T12:30:15.123456Z"' in encode_event(e)
    assert ts_us(TS) == calendar.timegm(TS.utctimetuple()) * 1_000_000 + 123_456


def test_the_body_is_canonical() -> None:
    e = event()
    body = encode_event(e)
    keys = list(msgspec.json.decode(body).keys())
    assert keys == sorted(keys)
    assert b"degraded" not in body and b"detail" not in body and b"null" not in body
    assert decode_event(body) == e
    assert encode_event(decode_event(body)) == body


# -- the chain ---------------------------------------------------------------------------------


def test_canonical_row_layout() -> None:
    body = b'{"a":1}'
    assert canonical(7, -3, body) == struct.pack(">Qq", 7, -3) + body
    prev = "ab" * 32
    expected = hashlib.sha256(bytes.fromhex(prev) + struct.pack(">Qq", 7, -3) + body).hexdigest()
    assert row_hash(prev, 7, -3, body) == expected


def test_link_builds_the_row() -> None:
    e = event()
    row = link(GENESIS, 1, e)
    assert row["seq"] == 1 and row["prev_hash"] == GENESIS
    assert row["body"].encode() == encode_event(e)
    assert row["row_hash"] == row_hash(GENESIS, 1, ts_us(TS), encode_event(e))
    assert {k: row[k] for k in columns(e)} == columns(e)
    assert (row["key_id"], row["team"], row["kind"]) == ("k1", "research", "inference.completed")
    second = link(row["row_hash"], 2, event(event_id="e2"))
    assert second["prev_hash"] == row["row_hash"]


def test_the_hash_covers_seq_time_body_and_predecessor() -> None:
    base = link(GENESIS, 1, event())["row_hash"]
    assert link(GENESIS, 2, event())["row_hash"] != base
    assert link("11" * 32, 1, event())["row_hash"] != base
    assert link(GENESIS, 1, event(ts=TS + timedelta(microseconds=1)))["row_hash"] != base
    assert link(GENESIS, 1, event(prompt_tokens=11))["row_hash"] != base


@given(st.binary(max_size=64), st.integers(0, 2**63 - 1), st.integers(-(2**63), 2**63 - 1))
def test_canonical_is_injective_in_seq_and_time(body: bytes, seq: int, ts: int) -> None:
    assert canonical(seq, ts, body)[16:] == body
    assert struct.unpack(">Qq", canonical(seq, ts, body)[:16]) == (seq, ts)


# -- Merkle roots (RFC 6962) -------------------------------------------------------------------

# transparency-dev/merkle testonly: the inputs and the roots of their first n
RFC_LEAVES = [bytes.fromhex(h) for h in (
    "", "00", "10", "2021", "3031", "40414243", "5051525354555657",
    "606162636465666768696a6b6c6d6e6f",
)]  # fmt: skip
RFC_ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]


@pytest.mark.parametrize("n", range(9))
def test_merkle_root_matches_the_rfc_6962_vectors(n: int) -> None:
    assert merkle_root(RFC_LEAVES[:n]).hex() == RFC_ROOTS[n]


def _reference_root(leaves: list[bytes]) -> bytes:
    """RFC 6962 §2.1 as written: split at the largest power of two smaller than n."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaf_hash(leaves[0])
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return node_hash(_reference_root(leaves[:k]), _reference_root(leaves[k:]))


def test_merkle_root_equals_the_recursive_definition_for_odd_and_even_counts() -> None:
    leaves = [hashlib.sha256(bytes([i])).digest() for i in range(70)]
    for n in range(71):
        assert merkle_root(leaves[:n]) == _reference_root(leaves[:n]), n


def test_merkle_root_depends_on_order_and_never_duplicates_a_node() -> None:
    a, b, c = (hashlib.sha256(bytes([i])).digest() for i in range(3))
    assert merkle_root([a, b]) != merkle_root([b, a])
    assert merkle_root([a, b, c]) != merkle_root([a, b, c, c])
    assert merkle_root([a]) != a  # leaves are domain-separated from nodes
    assert range_root([a.hex(), b.hex()]) == merkle_root([a, b]).hex()


# -- checkpoints --------------------------------------------------------------------------------

KEY = Ed25519PrivateKey.generate()
OTHER = Ed25519PrivateKey.generate()
HASHES = [hashlib.sha256(bytes([i])).hexdigest() for i in range(12)]


def test_checkpoints_cover_consecutive_ranges_and_link() -> None:
    first = make_checkpoint(None, HASHES[:5], ts_us=1, signing_key=KEY)
    assert (first.id, first.first_seq, first.last_seq, first.count) == (1, 1, 5, 5)
    assert first.prev_hash == GENESIS and first.key_id == key_id(KEY.public_key())
    assert first.merkle_root == range_root(HASHES[:5])
    second = make_checkpoint(first, HASHES[5:12], ts_us=2, signing_key=KEY)
    assert (second.id, second.first_seq, second.last_seq, second.count) == (2, 6, 12, 7)
    assert second.prev_hash == checkpoint_hash(first) != GENESIS
    assert first.message().startswith(b"airgate-audit-checkpoint/1\n")


def test_checkpoint_signatures() -> None:
    cp = make_checkpoint(None, HASHES[:3], ts_us=1, signing_key=KEY)
    trusted = trusted_by_id([KEY.public_key()])
    assert check_signature(cp, trusted) == "ok"
    assert check_signature(cp, trusted_by_id([OTHER.public_key()])) == "untrusted_key"
    assert check_signature(cp, trusted_by_id([OTHER.public_key(), KEY.public_key()])) == "ok"
    for field, value in (
        ("merkle_root", range_root(HASHES[:4])),
        ("last_seq", 4),
        ("count", 4),
        ("ts_us", 2),
        ("prev_hash", "11" * 32),
        ("signature", "not base64!"),
    ):
        forged = msgspec.structs.replace(cp, **{field: value})
        assert check_signature(forged, trusted) == "bad_signature", field
    # a valid signature by another key, relabelled as the trusted key's
    other = make_checkpoint(None, HASHES[:3], ts_us=1, signing_key=OTHER)
    relabelled = msgspec.structs.replace(other, key_id=cp.key_id)
    assert check_signature(relabelled, trusted) == "bad_signature"


# -- cursors and exports -----------------------------------------------------------------------


def test_cursors_round_trip_and_reject_anything_else() -> None:
    for seq in (0, 1, 99, 2**62):
        assert decode_cursor(encode_cursor(seq)) == seq
    assert "99" not in encode_cursor(99)
    for bad in ("", "99", "seq:1", "c2VxOi0x", "%%%", "c2VxOjFh", "c2VxOg", "c2VxOjE=x"):
        with pytest.raises(InvalidCursor):
            decode_cursor(bad)


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        ("=HYPERLINK(x)", "'=HYPERLINK(x)"),
        ("+1", "'+1"),
        ("-1", "'-1"),
        ("@SUM(A1)", "'@SUM(A1)"),
        ("\tx", "'\tx"),
        ("\rx", "'\rx"),
        ("a=b", "a=b"),
        (None, ""),
        (True, "true"),
        (12, "12"),
        ({"temperature": 0.5}, '{"temperature":0.5}'),
        ({}, ""),
    ],
)
def test_csv_cells_cannot_be_formulas(value: object, cell: str) -> None:
    assert csv_safe(value) == cell


@pytest.mark.parametrize(
    ("kind", "outcome", "detail", "class_uid", "activity", "status"),
    [
        ("inference.completed", "success", {}, 6003, 1, 1),
        ("inference.failed", "failure", {}, 6003, 1, 2),
        ("inference.cancelled", "cancelled", {}, 6003, 1, 99),
        ("policy.denied", "denied", {}, 6003, 1, 2),
        ("audit.access", "success", {"format": "csv"}, 6003, 2, 1),
        ("admin.action", "success", {"op": "delete"}, 6003, 4, 1),
        ("admin.action", "success", {"op": "rotate"}, 6003, 99, 1),
        ("bundle.loaded", "success", {}, 6003, 99, 1),
        ("auth.failure", "denied", {}, 3002, 1, 2),
    ],
)
def test_ocsf_mapping(
    kind: str, outcome: str, detail: dict[str, str], class_uid: int, activity: int, status: int
) -> None:
    rec = AuditRecord(
        seq=5,
        event=event(kind=kind, outcome=outcome, detail=detail),
        prev_hash=GENESIS,
        row_hash="ab" * 32,
    )
    out = ocsf_event(rec)
    assert (out["class_uid"], out["activity_id"], out["status_id"]) == (class_uid, activity, status)
    assert out["category_uid"] == class_uid // 1000
    assert out["type_uid"] == class_uid * 100 + activity
    assert out["time"] == ts_us(TS) // 1000
    assert out["metadata"]["uid"] == "e1" and out["metadata"]["sequence"] == 5
    user = out["user"] if class_uid == 3002 else out["actor"]["user"]
    assert user == {"uid": "k1", "name": "alice@example.com", "groups": [{"name": "research"}]}
    assert out["unmapped"]["prompt_tokens"] == 10
    assert "null" not in msgspec.json.encode(out).decode()
