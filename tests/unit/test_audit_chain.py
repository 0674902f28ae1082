"""The audit log's pure parts: the event type, canonical hashing, Merkle tree heads and
consistency proofs (RFC 6962), signed checkpoints, cursors and the export cell and OCSF
mappings."""

from __future__ import annotations

import base64
import calendar
import hashlib
import math
import re
import struct
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from bundles.kms.signer import LocalSigner
from gateway.audit import AuditEvent, AuditPrincipal, AuditRecord, InvalidAuditEvent
from gateway.audit._head import Head, Signing, extend, seal
from gateway.audit.chain import GENESIS, canonical, columns, link, row_hash
from gateway.audit.checkpoint import (
    Checkpoint,
    check_signature,
    checkpoint_hash,
    decode_checkpoint,
    encode_checkpoint,
    signed,
    trusted_by_id,
)
from gateway.audit.errors import InvalidCursor
from gateway.audit.event import decode_event, encode_event, ts_us
from gateway.audit.export import csv_safe, ocsf_event
from gateway.audit.merkle import (
    EMPTY_ROOT,
    CompactTree,
    consistency_proof,
    leaf_hash,
    merkle_root,
    node_hash,
    verify_consistency,
)
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
    "response_format", "tools_count", "tool_calls_count", "inputs_count", "client_address",
    "count",
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
    row = link(GENESIS, 1, e, log_id="c")
    assert row["seq"] == 1 and row["prev_hash"] == GENESIS
    assert row["body"].encode() == encode_event(e)
    assert row["row_hash"] == row_hash(GENESIS, 1, ts_us(TS), encode_event(e))
    assert {k: row[k] for k in columns(e)} == columns(e)
    assert (row["key_id"], row["team"], row["kind"]) == ("k1", "research", "inference.completed")
    second = link(row["row_hash"], 2, event(event_id="e2"), log_id="c")
    assert second["prev_hash"] == row["row_hash"]


def test_the_hash_covers_seq_time_body_and_predecessor() -> None:
    base = link(GENESIS, 1, event(), log_id="c")["row_hash"]
    assert link(GENESIS, 2, event(), log_id="c")["row_hash"] != base
    assert link("11" * 32, 1, event(), log_id="c")["row_hash"] != base
    assert (
        link(GENESIS, 1, event(ts=TS + timedelta(microseconds=1)), log_id="c")["row_hash"] != base
    )
    assert link(GENESIS, 1, event(prompt_tokens=11), log_id="c")["row_hash"] != base


@given(st.binary(max_size=64), st.integers(0, 2**63 - 1), st.integers(-(2**63), 2**63 - 1))
def test_canonical_is_injective_in_seq_and_time(body: bytes, seq: int, ts: int) -> None:
    assert canonical(seq, ts, body)[16:] == body
    assert struct.unpack(">Qq", canonical(seq, ts, body)[:16]) == (seq, ts)


# -- Merkle trees and consistency proofs (RFC 6962) ---------------------------------------------

# transparency-dev/merkle testonly: the inputs, the roots of their first n, and the consistency
# proofs published with them
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
RFC_CONSISTENCY = [
    (1, 1, []),
    (1, 8, [
        "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
    ]),
    (6, 8, [
        "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
        "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
        "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    ]),
    (2, 5, [
        "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
        "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
    ]),
]  # fmt: skip


@pytest.mark.parametrize("n", range(9))
def test_merkle_root_matches_the_rfc_6962_vectors(n: int) -> None:
    assert merkle_root(RFC_LEAVES[:n]).hex() == RFC_ROOTS[n]


@pytest.mark.parametrize(("m", "n", "proof"), RFC_CONSISTENCY)
def test_consistency_proofs_match_the_rfc_6962_vectors(m: int, n: int, proof: list[str]) -> None:
    expected = [bytes.fromhex(h) for h in proof]
    assert consistency_proof(RFC_LEAVES[:n], m) == expected
    old, new = bytes.fromhex(RFC_ROOTS[m]), bytes.fromhex(RFC_ROOTS[n])
    assert verify_consistency(m, n, old, new, expected)


def _reference_root(leaves: Sequence[bytes]) -> bytes:
    """RFC 6962 §2.1 as written: split at the largest power of two smaller than n."""
    if not leaves:
        return hashlib.sha256(b"").digest()
    if len(leaves) == 1:
        return leaf_hash(leaves[0])
    k = 1
    while k * 2 < len(leaves):
        k *= 2
    return node_hash(_reference_root(leaves[:k]), _reference_root(leaves[k:]))


def _reference_proof(leaves: Sequence[bytes], m: int) -> list[bytes]:
    """PROOF(m, D[n]) of RFC 6962 §2.1.2 as written: SUBPROOF, recursively."""

    def subproof(m: int, d: Sequence[bytes], complete: bool) -> list[bytes]:
        if m == len(d):
            return [] if complete else [_reference_root(d)]
        k = 1
        while k * 2 < len(d):
            k *= 2
        if m <= k:
            return [*subproof(m, d[:k], complete), _reference_root(d[k:])]
        return [*subproof(m - k, d[k:], False), _reference_root(d[:k])]

    return subproof(m, leaves, True)


LEAVES = [hashlib.sha256(b"row %d" % i).digest() for i in range(70)]  # row hashes, as stored
ROOTS = [_reference_root(LEAVES[:n]) for n in range(21)]
PAIRS = [(m, n) for n in range(1, 21) for m in range(1, n + 1)]  # every 1 <= m <= n <= 20


def test_merkle_root_equals_the_recursive_definition_for_odd_and_even_counts() -> None:
    for n in range(71):
        assert merkle_root(LEAVES[:n]) == _reference_root(LEAVES[:n]), n


def test_the_compact_tree_has_the_root_of_every_size_and_resumes_from_its_edge() -> None:
    tree = CompactTree()
    assert (tree.size, tree.stack, tree.root()) == (0, (), EMPTY_ROOT)
    for n, leaf in enumerate(LEAVES, 1):
        tree.append(leaf)
        assert tree.size == n and len(tree.stack) == n.bit_count(), n
        assert tree.root() == _reference_root(LEAVES[:n]), n
        # what a checkpoint row stores (its size and frontier) rebuilds a tree that goes on
        # exactly as the one that never stopped
        resumed = CompactTree(n, tree.stack)
        for later in LEAVES[n : n + 9]:
            resumed.append(later)
        assert resumed.root() == _reference_root(LEAVES[: n + 9]), n


def test_a_copy_of_a_compact_tree_grows_apart_from_it() -> None:
    tree = CompactTree()
    for leaf in LEAVES[:5]:
        tree.append(leaf)
    copy = tree.copy()
    copy.append(LEAVES[5])
    assert (tree.size, tree.root()) == (5, ROOTS[5])
    assert (copy.size, copy.root()) == (6, ROOTS[6])


@pytest.mark.parametrize(("size", "nodes"), [(0, 1), (1, 0), (3, 1), (4, 2), (7, 2), (8, 0)])
def test_a_compact_tree_holds_one_node_per_set_bit_of_its_size(size: int, nodes: int) -> None:
    with pytest.raises(ValueError):
        CompactTree(size, [bytes(32)] * nodes)


def test_every_consistency_proof_up_to_20_rows_is_rfc_6962s_and_verifies() -> None:
    for m, n in PAIRS:
        proof = consistency_proof(LEAVES[:n], m)
        assert proof == _reference_proof(LEAVES[:n], m), (m, n)
        assert verify_consistency(m, n, ROOTS[m], ROOTS[n], proof), (m, n)
        assert len(proof) <= 2 * (n - 1).bit_length(), (m, n)  # logarithmic, not linear


def _tampered(proof: list[bytes]) -> Iterator[tuple[str, list[bytes]]]:
    for i, node in enumerate(proof):
        flipped = bytearray(node)
        flipped[i % 32] ^= 0x01
        yield f"node {i} flipped", [*proof[:i], bytes(flipped), *proof[i + 1 :]]
        yield f"node {i} dropped", proof[:i] + proof[i + 1 :]
        yield f"node {i} doubled", [*proof[: i + 1], node, *proof[i + 1 :]]
    yield "a node appended", [*proof, ROOTS[1]]
    yield "a node prepended", [ROOTS[1], *proof]
    if len(proof) > 1:
        yield "reversed", proof[::-1]
        yield "first two swapped", [proof[1], proof[0], *proof[2:]]


def test_tampered_consistency_proofs_are_rejected() -> None:
    tried = 0
    for m, n in PAIRS:
        proof = consistency_proof(LEAVES[:n], m)
        for what, bad in _tampered(proof):
            assert not verify_consistency(m, n, ROOTS[m], ROOTS[n], bad), (m, n, what)
            tried += 1
    assert tried > 1000


def test_a_proof_vouches_only_for_its_own_sizes() -> None:
    """Claimed for other sizes (with the true roots of those sizes), a proof verifies exactly
    when it is also the proof of those sizes."""
    for m, n in PAIRS:
        proof = consistency_proof(LEAVES[:n], m)
        for n2 in (n - 1, n, n + 1):
            for m2 in range(1, min(n2, 20) + 1):
                if (m2, n2) == (m, n) or n2 > 20:
                    continue
                same = consistency_proof(LEAVES[:n2], m2) == proof
                assert verify_consistency(m2, n2, ROOTS[m2], ROOTS[n2], proof) == same, (m, n)


def test_a_rewritten_history_cannot_be_proved_consistent_with_a_witnessed_root() -> None:
    """A witness keeps the root of the first m rows; the log later shown has one of them
    rewritten (and every hash after it recomputed): no proof, its own or the true one, joins
    the witnessed root to the new log's root."""
    forged = hashlib.sha256(b"forged").digest()
    for m, n in PAIRS:
        true_proof = consistency_proof(LEAVES[:n], m)
        for j in range(m):
            rewritten = [*LEAVES[:j], forged, *LEAVES[j + 1 : n]]
            new_root = _reference_root(rewritten)
            own_proof = consistency_proof(rewritten, m)
            for proof in (own_proof, true_proof):
                assert not verify_consistency(m, n, ROOTS[m], new_root, proof), (m, n, j)
            # the other way round: the witnessed root is the forged one, the log the true one
            assert not verify_consistency(
                m, n, _reference_root(rewritten[:m]), ROOTS[n], true_proof
            )


def test_consistency_needs_0_lt_m_le_n() -> None:
    for m in (0, 4):
        with pytest.raises(ValueError):
            consistency_proof(LEAVES[:3], m)
    assert not verify_consistency(0, 3, EMPTY_ROOT, ROOTS[3], consistency_proof(LEAVES[:3], 1))
    assert not verify_consistency(4, 3, ROOTS[4], ROOTS[3], consistency_proof(LEAVES[:4], 3))
    assert consistency_proof(LEAVES[:5], 5) == []
    assert verify_consistency(5, 5, ROOTS[5], ROOTS[5], [])
    assert not verify_consistency(5, 5, ROOTS[5], ROOTS[4], [])
    assert not verify_consistency(5, 5, ROOTS[5], ROOTS[5], [ROOTS[5]])


def test_merkle_root_depends_on_order_and_never_duplicates_a_node() -> None:
    a, b, c = LEAVES[:3]
    assert merkle_root([a, b]) != merkle_root([b, a])
    assert merkle_root([a, b, c]) != merkle_root([a, b, c, c])
    assert merkle_root([a]) != a  # leaves are domain-separated from nodes
    assert merkle_root([a, b]) != node_hash(a, b)


# -- checkpoints: signed tree heads ---------------------------------------------------------------

SIGNER = LocalSigner(Ed25519PrivateKey.generate())
OTHER = LocalSigner(Ed25519PrivateKey.generate())
SIGNING = Signing(log_id="0123456789abcdef", alg="ed25519", key_id=SIGNER.verify_key.key_id)
EMPTY = Head(seq=0, row_hash=GENESIS, checkpoint=None, tree=CompactTree())


def _events(n: int, start: int = 0) -> list[AuditEvent]:
    return [event(event_id=f"e{start + i}", ts=TS + timedelta(seconds=i)) for i in range(n)]


def _sign(checkpoint: Checkpoint, signer: LocalSigner = SIGNER) -> Checkpoint:
    return signed(checkpoint, signer.sign(checkpoint.message()))


def test_a_batch_gets_a_tree_head_every_n_rows_and_at_its_end() -> None:
    rows, unsigned, head = extend(EMPTY, _events(12), every=5, ts_us=7, signing=SIGNING)
    assert [r["seq"] for r in rows] == list(range(1, 13))
    assert [r["prev_hash"] for r in rows] == [GENESIS] + [r["row_hash"] for r in rows[:-1]]
    hashes = [bytes.fromhex(r["row_hash"]) for r in rows]
    cps = [cp for cp, _ in unsigned]
    assert [(c.id, c.kind, c.first_seq, c.size, c.count) for c in cps] == [
        (1, "batch", 1, 5, 5),
        (2, "batch", 6, 10, 5),
        (3, "batch", 11, 12, 2),
    ]
    for cp, frontier in unsigned:
        assert cp.root == _reference_root(hashes[: cp.size]).hex()  # every row since seq 1
        assert CompactTree(cp.size, frontier).root().hex() == cp.root
        assert (cp.log_id, cp.epoch, cp.alg, cp.key_id) == ("0123456789abcdef", 1, "ed25519",
                                                             SIGNING.key_id)  # fmt: skip
        assert (cp.ts_us, cp.signature) == (7, "")
    assert [c.prev_hash for c in cps] == [GENESIS, checkpoint_hash(cps[0]), checkpoint_hash(cps[1])]
    assert (head.seq, head.row_hash, head.checkpoint) == (12, rows[-1]["row_hash"], cps[-1])
    assert (head.tree.size, head.tree.root().hex()) == (12, cps[-1].root)
    assert EMPTY.tree.size == 0  # the head it extended is untouched (kept when a commit fails)

    # the next batch goes on from the signed head
    head = msgspec.structs.replace(head, checkpoint=_sign(cps[-1]))
    more, (last,), after = extend(head, _events(3, 12), every=5, ts_us=8, signing=SIGNING)
    assert (more[0]["seq"], more[0]["prev_hash"]) == (13, rows[-1]["row_hash"])
    cp, _ = last
    assert (cp.id, cp.first_seq, cp.size, cp.count) == (4, 13, 15, 3)
    assert cp.prev_hash == checkpoint_hash(head.checkpoint) == checkpoint_hash(cps[-1])
    assert cp.root == _reference_root(hashes + [bytes.fromhex(r["row_hash"]) for r in more]).hex()
    assert after.seq == 15


def test_open_close_and_epoch_checkpoints_add_no_rows() -> None:
    opened = seal(EMPTY, "open", ts_us=1, signing=SIGNING)
    assert (opened.id, opened.size, opened.first_seq, opened.count) == (1, 0, 1, 0)
    assert (opened.root, opened.prev_hash) == (EMPTY_ROOT.hex(), GENESIS)
    _, unsigned, head = extend(EMPTY, _events(3), every=1000, ts_us=1, signing=SIGNING)
    for kind in ("open", "close"):
        cp = seal(head, kind, ts_us=2, signing=SIGNING)
        assert (cp.kind, cp.id, cp.size, cp.first_seq, cp.count, cp.epoch) == (kind, 2, 3, 4, 0, 1)
        assert cp.root == unsigned[-1][0].root and cp.prev_hash == checkpoint_hash(head.checkpoint)
    new_epoch = seal(head, "epoch", ts_us=2, signing=SIGNING, epoch=2)
    assert (new_epoch.kind, new_epoch.epoch, new_epoch.count) == ("epoch", 2, 0)


def test_checkpoint_signatures() -> None:
    _, ((unsigned, _),), _ = extend(EMPTY, _events(3), every=10, ts_us=1, signing=SIGNING)
    cp = _sign(unsigned)
    assert cp.message().startswith(b"airgate-audit-checkpoint/2\n")
    trusted = trusted_by_id([SIGNER.verify_key])
    assert check_signature(cp, trusted) == "ok"
    assert check_signature(cp, {}) == "untrusted_key"
    assert check_signature(cp, trusted_by_id([OTHER.verify_key])) == "untrusted_key"
    assert check_signature(cp, trusted_by_id([OTHER.verify_key, SIGNER.verify_key])) == "ok"
    for field, value in (
        ("root", ROOTS[4].hex()),
        ("size", 4),
        ("first_seq", 2),
        ("count", 4),
        ("id", 2),
        ("epoch", 2),
        ("kind", "close"),
        ("log_id", "fedcba9876543210"),
        ("ts_us", 2),
        ("prev_hash", "11" * 32),
        ("alg", "ecdsa-p256-sha256"),
        ("signature", "not base64!"),
        ("signature", base64.b64encode(base64.b64decode(cp.signature)[:-1]).decode()),
    ):
        forged = msgspec.structs.replace(cp, **{field: value})
        assert check_signature(forged, trusted) == "bad_signature", field
    # a valid signature by another key, relabelled as the trusted key's
    relabelled = _sign(unsigned, OTHER)
    assert check_signature(relabelled, trusted) == "bad_signature"
    # what a witness keeps reads back to the very checkpoint, still signed
    assert decode_checkpoint(encode_checkpoint(cp)) == cp
    assert check_signature(decode_checkpoint(encode_checkpoint(cp)), trusted) == "ok"


# -- cursors and exports -----------------------------------------------------------------------


def test_cursors_round_trip_and_reject_anything_else() -> None:
    chain = "0123456789abcdef"
    for at in ((0, chain, 1), (1_765_000_000_000_000, chain, 99), (2**63 - 1, "ab", 2**63 - 1)):
        assert decode_cursor(encode_cursor(at)) == at
    assert chain not in encode_cursor((5, chain, 99))
    # seqs start at 1; numbers the BIGINT columns cannot hold would overflow the driver; a chain
    # id is lowercase hex
    beyond = [
        encode_cursor((1, chain, 0)),
        encode_cursor((1, chain, 2**63)),
        encode_cursor((2**63, chain, 1)),
        encode_cursor((1, "ABC", 1)),
        encode_cursor((1, "a:b", 1)),
        encode_cursor((1, "a" * 33, 1)),
    ]
    old_style = "c2VxOjE"  # "seq:1", the single-chain cursor of earlier releases
    for bad in ("", "99", "seq:1", "%%%", "YXQ6MTox", "YXQ6MTphOjE=x", old_style, *beyond):
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
        chain="0123456789abcdef",
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
