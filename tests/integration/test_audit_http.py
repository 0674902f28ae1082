"""The compliance API over HTTP (in process, Litestar's test client): search with filters and
cursor pagination, get by id, export (JSONL, CSV without formula injection, OCSF), verify before
and after tampering, and the audit of every one of these calls (`audit.access`).

The log is seeded through the app's own audit writer with events dated in 2020 (so time-range
filters select exactly them); the app's own events are dated now.  Seeding appends one event at a
time, so every seeded row is its own group commit with its own signed checkpoint.  The gateway
signs with a key file outside its data directory (`[audit.signer] key_ref`) whose public key is
pinned in `[audit] trusted_keys`: verification trusts that setting only, never the key the
gateway signs with.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import io
import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from litestar import Litestar
from litestar.testing import TestClient

from backends.echo import EchoEngine
from bundles.kms.signer import LocalSigner
from gateway.access.stack import Security
from gateway.app import create_app
from gateway.audit import AuditEvent, AuditPrincipal, AuditWriter, new_event_id
from gateway.audit.chain import row_hash
from gateway.audit.export import CSV_COLUMNS
from gateway.audit.merkle import verify_consistency
from gateway.config import load_settings
from gateway.engines.registry import ModelRegistry, ServedModel

T0 = datetime(2020, 1, 1, tzinfo=UTC)
SEEDED = 260
CHECKPOINT_EVERY = 50
KINDS = ("inference.completed", "inference.failed", "policy.denied", "auth.failure")
OUTCOMES = {
    "inference.completed": "success",
    "inference.failed": "failure",
    "policy.denied": "denied",
    "auth.failure": "denied",
}
STATUS = {"inference.completed": 200, "inference.failed": 500, "policy.denied": 403}
# subjects a spreadsheet would evaluate (the event's own pattern allows them)
FORMULAS = {7: '=HYPERLINK("http://x.example")', 8: "@SUM(A1:A9)", 9: "+1+1", 10: "-1+1"}
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def seed_event(i: int) -> AuditEvent:
    kind = KINDS[i % len(KINDS)]
    inference = kind.startswith("inference.")
    return AuditEvent(
        event_id=new_event_id(),
        ts=T0 + timedelta(seconds=i),
        kind=kind,  # type: ignore[arg-type]
        outcome=OUTCOMES[kind],  # type: ignore[arg-type]
        request_id=f"seed-{i}",
        principal=AuditPrincipal(
            key_id="seed-key-2" if i % 5 == 0 else "seed-key-1",
            team="seed-team",
            subject=FORMULAS.get(i, f"svc-{i}"),
            method="api_key",
        ),
        action="chat.completions" if kind != "auth.failure" else None,
        model=("m-a" if i % 2 == 0 else "m-b") if kind != "auth.failure" else None,
        route="/v1/chat/completions",
        http_status=STATUS.get(kind, 401),
        error_class="bad_signature" if kind == "auth.failure" else None,
        prompt_tokens=i if inference else None,
        completion_tokens=4 if inference else None,
        policy_version="0123456789abcdef",
        decision="allowed" if inference else None,
    )


async def _append_all(writer: AuditWriter, events: Sequence[AuditEvent]) -> None:
    for event in events:  # one at a time: seq order is list order
        await writer.append(event)


@dataclass
class Gateway:
    client: TestClient[Litestar]
    security: Security
    data_dir: Path
    auditor: str
    seeded: list[AuditEvent]
    key_id: str  # of the key that signs the gateway's checkpoints

    @property
    def log_id(self) -> str:
        """The gateway's chain."""
        return self.security.audit.signing.log_id

    def sql(self, query: str, *params: Any) -> list[Any]:
        with contextlib.closing(sqlite3.connect(self.data_dir / "airgate.db")) as conn:
            return conn.execute(query, params).fetchall()

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn` (sync or async) on the app's event loop."""
        return self.client.blocking_portal.call(functools.partial(fn, *args, **kwargs))

    def get(self, path: str, key: str | None = None, **params: Any) -> Any:
        headers = {"authorization": f"Bearer {key or self.auditor}"}
        return self.client.get(path, params=params, headers=headers)

    def access_event(self, resp: Any) -> dict[str, Any]:
        """The one `audit.access` event the answered call left behind."""
        request_id = resp.headers["x-request-id"]
        with contextlib.closing(sqlite3.connect(self.data_dir / "airgate.db")) as conn:
            rows = conn.execute(
                "SELECT body FROM audit_events WHERE kind = 'audit.access' ORDER BY seq"
            ).fetchall()
        found = [e for e in (json.loads(r[0]) for r in rows) if e.get("request_id") == request_id]
        assert len(found) == 1
        event: dict[str, Any] = found[0]
        return event

    def assert_accessed(self, resp: Any, action: str, outcome: str = "success") -> dict[str, Any]:
        event = self.access_event(resp)
        assert event["action"] == action
        assert event["outcome"] == outcome
        assert event["http_status"] == resp.status_code
        assert event["principal"]["key_id"] == self.auditor.split("_")[1]
        return event


@contextlib.contextmanager
def running_gateway(data_dir: Path, seed: int, *, pin_own_key: bool = True) -> Iterator[Gateway]:
    """The app on `data_dir`, its log seeded with `seed` events; its signing key is pinned in
    `[audit] trusted_keys` unless `pin_own_key` is false (then nothing is)."""
    key_file = data_dir.parent / f"{data_dir.name}-audit-signing.key"
    signer = LocalSigner.from_file(key_file, create=True)
    settings = load_settings(
        None,
        environ={},
        overrides={
            "data_dir": str(data_dir),
            "audit.checkpoint_every": CHECKPOINT_EVERY,
            "audit.signer.key_ref": str(key_file),
            "audit.trusted_keys": [signer.verify_key.text] if pin_own_key else [],
        },
    )
    registry = ModelRegistry([ServedModel("echo", EchoEngine(context_length=512))])
    app = create_app(settings, registry=registry)
    with TestClient(app) as client:
        while client.get("/ready").status_code != 200:  # engines start in the background
            pass
        security: Security = app.state["security_holder"].get()
        events = [seed_event(i) for i in range(seed)]
        client.blocking_portal.call(_append_all, security.audit, events)
        auditor, _ = client.blocking_portal.call(
            functools.partial(security.keys.create, "auditor", name="compliance-officer")
        )
        yield Gateway(client, security, data_dir, auditor, events, signer.verify_key.key_id)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with running_gateway(tmp_path_factory.mktemp("audit-http") / "data", SEEDED) as gateway:
        yield gateway


def ids(records: Sequence[dict[str, Any]]) -> set[str]:
    return {r["event"]["event_id"] for r in records}


def seeded_ids(gw: Gateway, keep: Callable[[AuditEvent], bool]) -> set[str]:
    return {e.event_id for e in gw.seeded if keep(e)}


def iso(ts: datetime) -> str:
    return ts.isoformat()


# ---- search ----------------------------------------------------------------------------------


def _key(e: AuditEvent) -> str | None:
    return e.principal.key_id if e.principal else None


FILTERS: list[tuple[str, dict[str, Any], Callable[[AuditEvent], bool]]] = [
    ("kind", {"kind": "policy.denied", "team": "seed-team"}, lambda e: e.kind == "policy.denied"),
    ("key_id", {"key_id": "seed-key-2"}, lambda e: _key(e) == "seed-key-2"),
    ("model", {"model": "m-a"}, lambda e: e.model == "m-a"),
    (
        "outcome",
        {"outcome": "failure", "key_id": "seed-key-1"},
        lambda e: e.outcome == "failure" and _key(e) == "seed-key-1",
    ),
    (
        "time-range",
        {"start": iso(T0 + timedelta(seconds=100)), "end": iso(T0 + timedelta(seconds=150))},
        lambda e: T0 + timedelta(seconds=100) <= e.ts < T0 + timedelta(seconds=150),
    ),
    (
        "combined",
        {
            "kind": "inference.completed",
            "model": "m-a",
            "key_id": "seed-key-1",
            "outcome": "success",
            "start": iso(T0),
            "end": iso(T0 + timedelta(seconds=200)),
        },
        lambda e: (
            e.kind == "inference.completed"
            and e.model == "m-a"
            and _key(e) == "seed-key-1"
            and e.ts < T0 + timedelta(seconds=200)
        ),
    ),
]


@pytest.mark.parametrize(
    ("params", "keep"), [(p, k) for _, p, k in FILTERS], ids=[f[0] for f in FILTERS]
)
def test_search_filters_select_exactly_the_matching_events(
    gw: Gateway, params: dict[str, Any], keep: Callable[[AuditEvent], bool]
) -> None:
    resp = gw.get("/audit/events", limit=1000, **params)
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["next_cursor"] is None
    expected = seeded_ids(gw, keep)
    assert expected and ids(body["data"]) == expected
    seqs = [r["seq"] for r in body["data"]]
    assert seqs == sorted(seqs)
    event = gw.assert_accessed(resp, "audit.search")
    assert event["detail"]["count"] == len(expected)


def test_search_by_kind_alone_returns_only_that_kind(gw: Gateway) -> None:
    resp = gw.get("/audit/events", kind="auth.failure", limit=1000)
    records = resp.json()["data"]
    assert {r["event"]["kind"] for r in records} == {"auth.failure"}
    assert ids(records) >= seeded_ids(gw, lambda e: e.kind == "auth.failure")


@pytest.mark.parametrize(
    "params",
    [{"kind": "no.such.kind"}, {"outcome": "maybe"}, {"start": "yesterday"}, {"cursor": "xyz"}],
    ids=["kind", "outcome", "start", "cursor"],
)
def test_bad_filters_are_400(gw: Gateway, params: dict[str, Any]) -> None:
    resp = gw.get("/audit/events", **params)
    assert resp.status_code == 400, resp.text
    assert set(resp.json()["error"]) == {"message", "type", "param", "code"}


def test_cursor_pagination_walks_every_event_once(gw: Gateway) -> None:
    window = {"start": iso(T0), "end": iso(T0 + timedelta(hours=1))}
    seen: list[dict[str, Any]] = []
    sizes: list[int] = []
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {**window, "limit": 100}
        if cursor is not None:
            params["cursor"] = cursor
        resp = gw.get("/audit/events", **params)
        assert resp.status_code == 200, resp.text
        gw.assert_accessed(resp, "audit.search")
        page = resp.json()
        sizes.append(len(page["data"]))
        seen.extend(page["data"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sizes == [100, 100, SEEDED - 200]
    seqs = [r["seq"] for r in seen]
    assert seqs == sorted(set(seqs))
    assert ids(seen) == {e.event_id for e in gw.seeded}


# ---- get by id -------------------------------------------------------------------------------


def test_get_by_id_and_404_for_unknown(gw: Gateway) -> None:
    wanted = gw.seeded[42]
    resp = gw.get(f"/audit/events/{wanted.event_id}")
    assert resp.status_code == 200, resp.text
    record = resp.json()
    assert record["event"]["event_id"] == wanted.event_id
    assert record["event"]["kind"] == wanted.kind
    assert record["event"]["request_id"] == "seed-42"
    assert len(record["row_hash"]) == 64 and len(record["prev_hash"]) == 64
    gw.assert_accessed(resp, "audit.get")
    for unknown in (new_event_id(), "x" * 100):
        missing = gw.get(f"/audit/events/{unknown}")
        assert missing.status_code == 404
        assert missing.json()["error"]["code"] == "not_found"
        assert unknown not in missing.text
        gw.assert_accessed(missing, "audit.get", outcome="failure")


# ---- export ----------------------------------------------------------------------------------


def test_export_jsonl(gw: Gateway) -> None:
    resp = gw.get("/audit/export", format="jsonl", key_id="seed-key-2")
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("application/x-ndjson")
    assert 'filename="airgate-audit.jsonl"' in resp.headers["content-disposition"]
    lines = [json.loads(line) for line in resp.text.splitlines()]
    assert {line["event"]["event_id"] for line in lines} == seeded_ids(
        gw, lambda e: _key(e) == "seed-key-2"
    )
    assert all(set(line) == {"chain", "seq", "prev_hash", "row_hash", "event"} for line in lines)
    assert {line["chain"] for line in lines} == {gw.log_id}
    event = gw.assert_accessed(resp, "audit.export")
    assert event["detail"]["format"] == "jsonl"


def _csv(text: str) -> list[list[str]]:
    return list(csv.reader(io.StringIO(text, newline="")))


def test_export_csv_has_the_header_every_row_and_no_formulas(gw: Gateway) -> None:
    resp = gw.get("/audit/export", format="csv", start=iso(T0), end=iso(T0 + timedelta(hours=1)))
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/csv")
    rows = _csv(resp.text)
    assert rows[0] == list(CSV_COLUMNS)
    assert len(rows) == 1 + SEEDED
    assert all(len(row) == len(CSV_COLUMNS) for row in rows)
    assert not [cell for row in rows for cell in row if cell.startswith(FORMULA_START)]
    subject = CSV_COLUMNS.index("subject")
    by_request = {row[CSV_COLUMNS.index("request_id")]: row for row in rows[1:]}
    for i, formula in FORMULAS.items():
        assert by_request[f"seed-{i}"][subject] == "'" + formula
    gw.assert_accessed(resp, "audit.export")


def test_export_csv_neutralises_a_key_name_chosen_by_an_admin(gw: Gateway) -> None:
    admin, _ = gw.call(gw.security.keys.create, "admin")
    created = gw.client.post(
        "/admin/keys",
        json={"role": "app", "name": "-2+3"},  # allowed by the name pattern
        headers={"authorization": f"Bearer {admin}"},
    )
    assert created.status_code == 201, created.text
    key, key_id = created.json()["key"], created.json()["record"]["key_id"]
    chat = {"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    served = gw.client.post(
        "/v1/chat/completions", json=chat, headers={"authorization": f"Bearer {key}"}
    )
    assert served.status_code == 200, served.text
    rows = _csv(gw.get("/audit/export", format="csv", key_id=key_id).text)
    assert len(rows) == 1 + 2  # admitted, completed
    assert {row[CSV_COLUMNS.index("subject")] for row in rows[1:]} == {"'-2+3"}


def test_export_ocsf(gw: Gateway) -> None:
    resp = gw.get("/audit/export", format="ocsf", key_id="seed-key-2")
    assert resp.status_code == 200, resp.text
    lines = [json.loads(line) for line in resp.text.splitlines()]
    by_id = {e.event_id: e for e in gw.seeded}
    assert {line["metadata"]["uid"] for line in lines} == seeded_ids(
        gw, lambda e: _key(e) == "seed-key-2"
    )
    for line in lines:
        event = by_id[line["metadata"]["uid"]]
        if event.kind == "auth.failure":
            assert (line["class_uid"], line["category_uid"]) == (3002, 3)
        else:
            assert (line["class_uid"], line["category_uid"]) == (6003, 6)
        assert line["type_uid"] == line["class_uid"] * 100 + line["activity_id"]
        assert line["status_id"] == (1 if event.outcome == "success" else 2)
        assert line["time"] == int(event.ts.timestamp() * 1000)
    gw.assert_accessed(resp, "audit.export")


# ---- verify ----------------------------------------------------------------------------------


def _tamper(db: Path, seq: int) -> None:
    """Rewrite one row's body behind the gateway's back, as someone holding the file could."""
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DROP TRIGGER IF EXISTS audit_events_no_update")
        (body,) = conn.execute("SELECT body FROM audit_events WHERE seq = ?", (seq,)).fetchone()
        event = json.loads(body)
        event["completion_tokens"] = 999
        forged = json.dumps(event, separators=(",", ":"), sort_keys=True)
        conn.execute("UPDATE audit_events SET body = ? WHERE seq = ?", (forged, seq))


def _rehash(db: Path, seq: int) -> None:
    """Recompute one row's hash over its (tampered) body, as a smarter attacker would."""
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("DROP TRIGGER IF EXISTS audit_events_no_update")
        prev, ts, body = conn.execute(
            "SELECT prev_hash, ts_us, body FROM audit_events WHERE seq = ?", (seq,)
        ).fetchone()
        fixed = row_hash(prev, seq, ts, body.encode())
        conn.execute("UPDATE audit_events SET row_hash = ? WHERE seq = ?", (fixed, seq))


def _chain(resp: Any) -> dict[str, Any]:
    """The report of the log's one chain (a single gateway writes one)."""
    whole = resp.json()
    assert len(whole["chains"]) == 1, whole
    chain = whole["chains"][0]
    assert whole["ok"] is chain["ok"] and whole["problem_count"] == chain["problem_count"]
    return dict(chain)


def test_verify_is_ok_until_a_row_is_tampered_with(tmp_path: Path) -> None:
    # rows 1-120 seeded one at a time: each committed with its own signed checkpoint
    with running_gateway(tmp_path / "data", 120) as gw:
        clean = gw.get("/audit/verify")
        assert clean.status_code == 200, clean.text
        report = _chain(clean)
        assert report["ok"] is True and report["chain_ok"] is True, report
        assert report["tree_checked"] is True
        assert report["first_bad_seq"] is None and report["problems"] == []
        assert report["trusted_keys"] == [gw.key_id]
        assert report["rows"] == 120
        # the open checkpoint and one per seeded row (the verify call's own event came after);
        # no row waits unsigned
        ((stored,),) = gw.sql("SELECT COUNT(*) FROM audit_checkpoints WHERE last_seq <= 120")
        assert report["checkpoints_checked"] == stored == 1 + 120
        assert report["checkpoints_failed"] == report["checkpoints_untrusted"] == 0
        assert report["chain_only_from"] is None and report["chain_only_rows"] == 0
        event = gw.assert_accessed(clean, "audit.verify")
        assert event["detail"] == {"ok": 1, "chains": 1, "rows": 120}

        db = tmp_path / "data" / "airgate.db"
        _tamper(db, 110)  # the body changes, its row hash no longer matches
        tail = _chain(gw.get("/audit/verify"))
        assert tail["ok"] is False and tail["chain_ok"] is False
        assert (tail["first_bad_seq"], tail["reason"]) == (110, "row_hash_mismatch")
        assert tail["checkpoints_failed"] == 0  # the tree covers row hashes, not bodies

        _tamper(db, 70)
        edited = _chain(gw.get("/audit/verify"))
        assert (edited["first_bad_seq"], edited["reason"]) == (70, "row_hash_mismatch")
        assert edited["checkpoints_failed"] == 0

        _rehash(db, 70)  # an attacker who also fixes the row's hash: only the checkpoints know
        rehashed = _chain(gw.get("/audit/verify"))
        # the checkpoint committed with row 70 names it exactly
        assert (rehashed["first_bad_seq"], rehashed["reason"]) == (70, "checkpoint_root_mismatch")
        found = {(p["seq"], p["reason"]) for p in rehashed["problems"]}
        assert {(71, "prev_hash_mismatch"), (110, "row_hash_mismatch")} <= found
        # every tree head from size 70 on covers the rewritten hash: all of them fail
        ((later,),) = gw.sql(
            "SELECT COUNT(*) FROM audit_checkpoints WHERE last_seq BETWEEN 70 AND ?",
            rehashed["last_seq"],
        )
        assert rehashed["checkpoints_failed"] == later > 50

        # reading the tampered row still works (the body decodes); verify is what flags it
        assert gw.get("/audit/events", limit=1000).status_code == 200


def test_verify_trusts_only_the_pinned_keys(tmp_path: Path) -> None:
    """A gateway with no `[audit] trusted_keys` signs as usual, but its own key is not trusted
    for that: verify reports every checkpoint untrusted, whatever key file the data dir has."""
    with running_gateway(tmp_path / "data", 5, pin_own_key=False) as gw:
        resp = gw.get("/audit/verify")
        assert resp.status_code == 200, resp.text
        report = _chain(resp)
        assert report["ok"] is False and report["chain_ok"] is True
        # the first row a checkpoint vouches for is not vouched for by a trusted key
        assert (report["first_bad_seq"], report["reason"]) == (1, "checkpoint_untrusted_key")
        assert {"seq": 0, "reason": "no_trusted_key"} in report["problems"]
        assert report["trusted_keys"] == []
        ((stored,),) = gw.sql("SELECT COUNT(*) FROM audit_checkpoints WHERE last_seq <= 5")
        assert report["checkpoints_checked"] == report["checkpoints_untrusted"] == stored == 6
        assert {p["reason"] for p in report["problems"]} == {
            "no_trusted_key",
            "checkpoint_untrusted_key",
        }
        detail = gw.assert_accessed(resp, "audit.verify")["detail"]
        assert detail == {"ok": 0, "chains": 1, "rows": 5}


def test_the_latest_checkpoint_comes_with_a_consistency_proof(gw: Gateway) -> None:
    """What a witness that keeps tree heads, not rows, asks for: the latest signed checkpoint,
    and the RFC 6962 proof that the tree it held before is a prefix of it."""
    first = gw.get("/audit/checkpoints/latest")
    assert first.status_code == 200, first.text
    before = first.json()
    assert before["from_size"] is None and before["proof"] == []
    old = before["checkpoint"]
    assert old["key_id"] == gw.key_id and old["size"] >= SEEDED
    gw.assert_accessed(first, "audit.checkpoint")
    for _ in range(3):  # the log grows (each call is audited)
        assert gw.get("/audit/verify").status_code == 200
    resp = gw.get("/audit/checkpoints/latest", from_size=old["size"])
    assert resp.status_code == 200, resp.text
    proved = resp.json()
    new = proved["checkpoint"]
    assert proved["from_size"] == old["size"] < new["size"]
    assert new["id"] > old["id"]
    proof = [bytes.fromhex(node) for node in proved["proof"]]
    old_root, new_root = bytes.fromhex(old["root"]), bytes.fromhex(new["root"])
    assert verify_consistency(old["size"], new["size"], old_root, new_root, proof)
    assert not verify_consistency(old["size"], new["size"], new_root, new_root, proof)
    ((stored_root,),) = gw.sql(
        "SELECT merkle_root FROM audit_checkpoints WHERE id = ?", int(new["id"])
    )
    assert stored_root == new["root"]
    beyond = gw.get("/audit/checkpoints/latest", from_size=new["size"] + 1000)
    assert beyond.status_code == 400
    assert beyond.json()["error"]["param"] == "from_size"


def test_the_compliance_routes_answer_admins_too_and_are_audited(gw: Gateway) -> None:
    admin, _ = gw.call(gw.security.keys.create, "admin")
    for path, action in (
        ("/audit/events", "audit.search"),
        (f"/audit/events/{gw.seeded[0].event_id}", "audit.get"),
        ("/audit/export", "audit.export"),
        ("/audit/verify", "audit.verify"),
    ):
        resp = gw.get(path, key=admin)
        assert resp.status_code == 200, resp.text
        event = gw.access_event(resp)
        assert event["action"] == action and event["outcome"] == "success"
        assert event["principal"]["key_id"] == admin.split("_")[1]
