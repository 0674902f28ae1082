"""The audit log's way home, as a laptop user and HQ's operator meet it: a laptop runs `airgate
serve` (echo engine, SQLite in its data dir) and answers real OpenAI SDK requests; it enrolls
(`airgate device enroll`) and exports its chain in signed segments (`airgate audit export
--segment`); HQ (a data dir on a throwaway PostgreSQL database) pins the enrolment in
`[audit] devices` and imports them (`airgate audit import`).  After each import HQ's `airgate
audit verify` passes and `airgate audit search` finds the requests the client made.  Every
forgery is refused with one line naming the problem, and leaves HQ's tables as they were: an
edited byte, reordered rows, a gap, a replay, a fork (a copy of the laptop that went on with
another history, with the same key), a device HQ never enrolled.  And a device key cannot
vouch for a chain of HQ's own, and an edit at HQ of a device's chain fails verification naming
the device.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
from integration.databases import postgres_database
from openai import OpenAI
from server_process import (
    TEST_KEYS,
    Server,
    add_test_keys,
    airgate,
    ok,
    start_server,
    stop_and_check,
)
from unit.test_audit_segment import Chain  # the writer's own code, in memory

from bundles import create_signing_key
from bundles.kms.signer import LocalSigner, VerifyKey
from gateway.audit.segment import encode_segment

pytestmark = pytest.mark.e2e

ECHO = """
[[models]]
id = "echo"
engine = "echo"
"""

HQ = (
    """
[audit]
database_url = "{url}"
migrate = true
trusted_keys = ["{pinned}"]
devices = [{devices}]
{extra}
"""
    + ECHO
)


@pytest.fixture(scope="module")
async def hq_url() -> AsyncIterator[str]:
    async with postgres_database("airgate_segments") as url:
        yield url


def tables(url: str) -> dict[str, list[tuple[str, int, int]]]:
    """Each audit table's rows per chain: (chain, count, top seq or id)."""

    async def read() -> dict[str, list[tuple[str, int, int]]]:
        conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
        try:
            found = {}
            for table, top in (("audit_events", "seq"), ("audit_checkpoints", "id")):
                rows = await conn.fetch(
                    f"SELECT log_id, count(*), max({top}) FROM {table} GROUP BY log_id "
                    "ORDER BY log_id"
                )
                found[table] = [(r[0], r[1], r[2]) for r in rows]
            return found
        finally:
            await conn.close()

    return asyncio.run(read())


def chat(server: Server, n: int) -> list[str]:
    """`n` chat completions through the OpenAI SDK; the request ids the client saw."""
    ids = []
    with OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key(), max_retries=0) as client:
        for i in range(n):
            raw = client.chat.completions.with_raw_response.create(
                model="echo", messages=[{"role": "user", "content": f"to HQ {i}"}]
            )
            assert raw.parse().choices[0].message.content is not None
            ids.append(raw.headers["x-request-id"])
    return ids


class Hq:
    def __init__(self, root: Path, url: str, enrolment: Path) -> None:
        self.data = root / "hq"
        self.url = url
        pinned = VerifyKey(create_signing_key(self.data / "keys" / "audit-signing.key")).text
        self.pinned = pinned
        self.config = self.write("hq.toml", devices=[enrolment])

    def write(self, name: str, devices: list[Path], extra: str = "", pinned: str = "") -> Path:
        path = self.data.parent / name
        listed = ", ".join(json.dumps(str(d)) for d in devices)
        text = HQ.format(url=self.url, pinned=pinned or self.pinned, devices=listed, extra=extra)
        path.write_text(text)
        return path

    def cli(self, *args: str | Path, config: Path | None = None) -> Any:
        return airgate(*args, "-c", config or self.config, "--data-dir", self.data)

    def imported(self, segment: Path) -> str:
        result = self.cli("audit", "import", segment)
        assert result.returncode == 0, result.stderr
        return str(result.stdout)

    def refused(self, segment: Path, *expected: str) -> str:
        """The import must fail with one line naming the problem, and store nothing."""
        before = tables(self.url)
        result = self.cli("audit", "import", segment)
        message = " ".join(result.stderr.split())
        assert result.returncode == 1, (result.stdout, result.stderr)
        for words in expected:
            assert words in message, message
        assert tables(self.url) == before
        return message

    def verified(self) -> dict[str, Any]:
        result = self.cli("audit", "verify")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr
        report: dict[str, Any] = json.loads(result.stdout)
        return report

    def found(self, request_ids: list[str], chain: str) -> None:
        lines = self.cli("audit", "search", "--model", "echo", "--limit", "10000").stdout
        records = [json.loads(line) for line in lines.splitlines()]
        seen = {r["event"].get("request_id") for r in records if r["chain"] == chain}
        assert set(request_ids) <= seen, sorted(set(request_ids) - seen)


def export(laptop: Path, config: Path, segment: Path, *more: str) -> str:
    result = ok("audit", "export", "--segment", segment, *more, "-c", config, "--data-dir", laptop)
    assert segment.exists(), result.stdout + result.stderr
    return str(result.stderr)


def copy_data_dir(source: Path, target: Path) -> None:
    """A consistent copy of a (running) laptop's data dir: files, and the database through
    SQLite's online backup."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("airgate.db*", "airgate.lock"))
    with (
        sqlite3.connect(source / "airgate.db") as src,
        sqlite3.connect(target / "airgate.db") as dst,
    ):
        src.backup(dst)


def edited(segment: Path, target: Path, change: Any) -> Path:
    doc = json.loads(segment.read_bytes())
    change(doc)
    target.write_text(json.dumps(doc))
    return target


def test_a_laptops_chain_travels_home_in_signed_segments(tmp_path: Path, hq_url: str) -> None:
    laptop, laptop_config = tmp_path / "laptop", tmp_path / "laptop.toml"
    laptop_config.write_text(ECHO)
    enrolment = tmp_path / "laptop-7.json"
    ok(
        "device",
        "enroll",
        "--device-id",
        "laptop-7",
        "--out",
        enrolment,
        "-c",
        laptop_config,
        "--data-dir",
        laptop,
    )
    request = json.loads(enrolment.read_text())
    assert request["device_id"] == "laptop-7" and "private" not in enrolment.read_text().lower()
    chain = request["log_id"]
    hq = Hq(tmp_path, hq_url, enrolment)
    add_test_keys(laptop, ("app",))
    seg = [tmp_path / f"segment-{i}.json" for i in (1, 2, 3)]

    server = start_server(laptop, tmp_path / "laptop.log", {"AIRGATE_CONFIG": str(laptop_config)})
    try:
        first_ids = chat(server, 3)
        export(laptop, laptop_config, seg[0])
        nothing = ok(
            "audit",
            "export",
            "--segment",
            tmp_path / "empty.json",
            "-c",
            laptop_config,
            "--data-dir",
            laptop,
        )
        assert "nothing new" in nothing.stdout and not (tmp_path / "empty.json").exists()
        assert "imported seq 1.." in hq.imported(seg[0])
        report = hq.verified()
        (device_chain,) = [c for c in report["chains"] if c["log_id"] == chain]
        assert device_chain["device"] == "laptop-7" and device_chain["ok"]
        assert device_chain["trusted_keys"] == [request["key_id"]]
        hq.found(first_ids, chain)

        fork_dir = tmp_path / "laptop-copy"
        copy_data_dir(laptop, fork_dir)  # the same key and chain, from here another history

        second_ids = chat(server, 2)
        export(laptop, laptop_config, seg[1])
        third_ids = chat(server, 2)
        export(laptop, laptop_config, seg[2])
    finally:
        stop_and_check(server)

    # refusals before segment 2 arrives: each names the problem and stores nothing
    two = json.loads(seg[1].read_bytes())
    hq.refused(
        seg[2], f"gap: expected seq {two['first_seq']}, segment starts at {two['last_seq'] + 1}"
    )

    def flip_byte(doc: dict[str, Any]) -> None:  # one hex digit of the second row's event id
        body = doc["rows"][1]["body"]
        at = body.index('"event_id":"') + len('"event_id":"')
        doc["rows"][1]["body"] = body[:at] + ("0" if body[at] != "0" else "1") + body[at + 1 :]

    message = hq.refused(edited(seg[1], tmp_path / "edited.json", flip_byte), "edited")
    assert f"row seq {two['first_seq'] + 1}" in message

    def swap(doc: dict[str, Any]) -> None:
        doc["rows"][0], doc["rows"][1] = doc["rows"][1], doc["rows"][0]

    hq.refused(edited(seg[1], tmp_path / "swapped.json", swap), "reordered")

    stranger, stranger_config = tmp_path / "stranger", tmp_path / "stranger.toml"
    stranger_config.write_text(ECHO)
    ok("device", "enroll", "--device-id", "laptop-9", "-c", stranger_config, "--data-dir", stranger)
    ok("keys", "create", "--role", "app", "-c", stranger_config, "--data-dir", stranger)
    export(stranger, stranger_config, tmp_path / "stranger.seg")
    hq.refused(tmp_path / "stranger.seg", "unknown device: laptop-9 is not enrolled")

    # segments 2 and 3 in order; then a replay, and the copy's other history
    hq.imported(seg[1])
    hq.verified()
    hq.found(second_ids, chain)
    hq.refused(
        seg[1],
        f"replay: seq {two['first_seq']}..{two['last_seq']} already imported",
        f"expected seq {two['last_seq'] + 1}",
    )
    hq.imported(seg[2])
    report = hq.verified()
    hq.found(first_ids + second_ids + third_ids, chain)
    imports = [
        json.loads(line)
        for line in hq.cli("audit", "search", "--kind", "admin.action").stdout.splitlines()
    ]
    assert [
        r["event"]["detail"]["device"] for r in imports if r["event"]["action"] == "audit.import"
    ] == ["laptop-7"] * 3

    ok("keys", "create", "--role", "app", "-c", laptop_config, "--data-dir", fork_dir)
    export(fork_dir, laptop_config, tmp_path / "fork.seg")
    hq.refused(tmp_path / "fork.seg", "fork: seq", "differs from the row HQ imported")

    # the device's key signing another history that ends where HQ's copy ends: a fork too
    held = tables(hq.url)["audit_events"]
    (top,) = [seq for log_id, _, seq in held if log_id == chain]
    other = Chain(LocalSigner.from_file(laptop / "keys" / "audit-signing.key"), log_id=chain)
    other.commit(top)
    other.commit(2)
    forged = tmp_path / "other-history.seg"
    forged.write_bytes(encode_segment(other.segment(top + 1, device_id="laptop-7")))
    hq.refused(forged, "fork: the segment continues another history", f"up to seq {top}")

    # the exporter's memory lost: the next export overlaps, HQ names the seq it expects
    (laptop / "audit-export.json").unlink()
    export(laptop, laptop_config, tmp_path / "again.seg")
    hq.refused(tmp_path / "again.seg", "replay: seq 1..")

    # the compliance API at HQ verifies the device's chain with the rest, named by device
    auditor = hq.cli("keys", "create", "--role", "auditor", "--all-teams").stdout.strip()
    (hq.data / TEST_KEYS).write_text(json.dumps({"auditor": auditor}))
    server = start_server(hq.data, tmp_path / "hq.log", {"AIRGATE_CONFIG": str(hq.config)})
    try:
        answer = httpx.get(
            f"{server.base_url}/audit/verify", headers=server.auth("auditor"), timeout=60
        )
    finally:
        stop_and_check(server)
    assert answer.status_code == 200 and answer.json()["ok"], answer.text[-3000:]
    by_chain = {c["log_id"]: c for c in answer.json()["chains"]}
    assert by_chain[chain]["device"] == "laptop-7" and by_chain[chain]["rows"] >= 7

    # a device key cannot vouch for HQ's chains: a chain of HQ's signed with the laptop's key
    laptop_key = laptop / "keys" / "audit-signing.key"
    rogue = hq.write(
        "rogue.toml",
        devices=[enrolment],
        extra=f'chain = "rogue"\n\n[audit.signer]\nkey_ref = "{laptop_key}"',
        pinned=request["public_key"],
    )
    ok("keys", "create", "--role", "app", "-c", rogue, "--data-dir", hq.data)
    result = hq.cli("audit", "verify")
    assert result.returncode == 1
    chains = {c["log_id"]: c for c in json.loads(result.stdout)["chains"]}
    assert chains[chain]["ok"] and chains[chain]["device"] == "laptop-7"
    (bad,) = [c for c in chains.values() if not c["ok"]]
    assert bad["device"] is None and bad["reason"] == "checkpoint_untrusted_key"
    assert request["key_id"] not in bad["trusted_keys"]

    # an insider at HQ edits a row of the device's chain: verify names the device
    asyncio.run(edit_row(hq.url, chain, seq=2))
    result = hq.cli("audit", "verify")
    assert result.returncode == 1
    assert f"chain {chain} (device laptop-7) FAILED verification at seq 2" in result.stderr


async def edit_row(url: str, chain: str, seq: int) -> None:
    """The attacker of the design: it writes the database (its triggers off)."""
    conn = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
    try:
        await conn.execute("ALTER TABLE audit_events DISABLE TRIGGER USER")
        await conn.execute(
            "UPDATE audit_events SET body = body || ' ' WHERE log_id = $1 AND seq = $2", chain, seq
        )
    finally:
        await conn.close()
