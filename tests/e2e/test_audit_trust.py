"""The audit log's trust, as an operator and a compliance officer meet it: `airgate serve`
(echo engine) with a pinned checkpoint key and a witness directory on another path; the
officer's own witness (`airgate audit witness`, consistency proofs over HTTP); `airgate audit
verify` trusting only pinned keys; and the attacks a start must refuse: a reset database and a
replaced signing key, until `airgate audit init --new-epoch` declares the loss.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from server_process import (
    EXIT_DEADLINE_S,
    Server,
    add_test_keys,
    airgate,
    run_cli,
    start_server,
    stop_and_check,
)

from bundles import create_signing_key
from bundles.kms.signer import VerifyKey, parse_verify_key

pytestmark = pytest.mark.e2e

CONFIG = """
[audit]
witness_dir = "{witness}"
trusted_keys = ["{pinned}"]

[[models]]
id = "echo"
engine = "echo"
"""


def chat(server: Server, n: int) -> None:
    for _ in range(n):
        resp = httpx.post(
            f"{server.base_url}/v1/chat/completions",
            headers=server.auth(),
            json={"model": "echo", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert resp.status_code == 200, resp.text


def officer_witness(server: Server, state: Path, pinned: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        [
            *airgate_cmd(),
            "audit",
            "witness",
            "--state",
            str(state),
            "--trusted-key",
            pinned,
            "--url",
            server.base_url,
        ],
        env={"AIRGATE_API_KEY": server.key("auditor")},
    )


def airgate_cmd() -> list[str]:
    return [sys.executable, "-m", "gateway"]


def refused_start(data_dir: Path, log: Path, env: dict[str, str]) -> str:
    """`airgate serve` must exit by itself, with status 2; its log."""
    server = Server.spawn(data_dir, log, env)
    try:
        code = server.process.wait(timeout=EXIT_DEADLINE_S)
    except subprocess.TimeoutExpired:
        server.stop()
        raise AssertionError("serve started over a log it must refuse") from None
    text = server.log_text()
    assert code == 2, text[-3000:]
    return text


def test_a_pinned_and_witnessed_log_proves_itself_and_refuses_a_reset(tmp_path: Path) -> None:
    data, witness, state = tmp_path / "data", tmp_path / "witness-mount", tmp_path / "officer.jsonl"
    witness.mkdir()
    pinned = VerifyKey(create_signing_key(data / "keys" / "audit-signing.key")).text
    config = tmp_path / "airgate.toml"
    config.write_text(CONFIG.format(witness=witness, pinned=pinned))
    env = {"AIRGATE_CONFIG": str(config)}
    add_test_keys(data, ("app", "auditor"))

    server = start_server(data, tmp_path / "serve-1.log", env)
    try:
        chat(server, 3)
        first = officer_witness(server, state, pinned)
        assert first.returncode == 0, first.stderr
        assert "kept checkpoint" in first.stdout
        chat(server, 3)
        second = officer_witness(server, state, pinned)
        assert second.returncode == 0, second.stderr
        assert "consistent with size" in second.stdout
        whole = httpx.get(
            f"{server.base_url}/audit/verify", headers=server.auth("auditor"), timeout=60
        ).json()
        (report,) = whole["chains"]  # one gateway, one chain
        assert whole["ok"] and report["ok"], report["problems"]
        assert whole["trusted_keys"] == [parse_verify_key(pinned).key_id]
        assert report["witnesses"][0]["ok"] and report["witnesses"][0]["checkpoints"] >= 2
    finally:
        stop_and_check(server)

    # verify from the command line: only pinned keys; the officer's file is a witness too
    unpinned = airgate("audit", "verify", "--data-dir", data)
    assert unpinned.returncode == 2 and "no pinned key" in unpinned.stderr
    checked = airgate(
        "audit",
        "verify",
        "--data-dir",
        data,
        "--trusted-key",
        pinned,
        "--witness",
        state,
        "--witness",
        witness,
    )
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr
    assert json.loads(checked.stdout)["ok"]

    # reset: the database is gone, the keys remain -> no start, no new admin key
    (data / "airgate.db").rename(tmp_path / "stolen.db")
    log = refused_start(data, tmp_path / "serve-2.log", env)
    assert "the audit log cannot be continued" in log and "admin API key" not in log
    lost = airgate("audit", "verify", "--data-dir", data, "-c", config)
    assert lost.returncode == 1 and '"witness_truncated"' in lost.stdout

    # the loss declared: a new epoch, recorded in the witness; the server starts again
    init = run_cli([*airgate_cmd(), "audit", "init", "--new-epoch", "--data-dir", str(data)], env)
    assert init.returncode == 0, init.stderr
    assert "epoch 2 begins at size 0" in init.stdout
    add_test_keys(data, ("app", "auditor"))
    server = start_server(data, tmp_path / "serve-3.log", env)
    try:
        chat(server, 1)
        officer = officer_witness(server, state, pinned)
        assert officer.returncode == 1 and "epoch 2" in officer.stderr
    finally:
        stop_and_check(server)
    after = airgate("audit", "verify", "--data-dir", data, "-c", config)
    assert after.returncode == 0, after.stdout[-3000:]
    (declared,) = json.loads(after.stdout)["chains"]
    assert declared["epoch"] == 2 and declared["epoch_losses"][0]["epoch"] == 1

    # the signing key replaced by one the attacker holds: not pinned -> no start
    (data / "keys" / "audit-signing.key").unlink()
    create_signing_key(data / "keys" / "audit-signing.key")
    log = refused_start(data, tmp_path / "serve-4.log", env)
    assert "not among [audit] trusted_keys" in log
