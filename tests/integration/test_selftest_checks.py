"""The selftest's checks one by one, on small real fixtures (the whole command, on the real
model, is in tests/e2e/test_selftest.py): who may read a secret in the data directory, the
services when nobody answers, a check that raises, and the report's shapes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.config import Settings, load_settings
from gateway.selftest import CheckResult, encode_json, line, summary
from gateway.selftest.files import check_data_dir
from gateway.selftest.result import run_check
from gateway.selftest.services import check_kms, check_otlp, check_postgresql, check_redis

NOBODY = "127.0.0.1:1"  # nothing listens on port 1


def settings(data_dir: Path, **overrides: Any) -> Settings:
    return load_settings(environ={}, overrides={"data_dir": str(data_dir), **overrides})


def data_dir(root: Path, mode: int) -> Path:
    """A data dir of `mode` holding a 0600 key, a 0644 public key and a 0644 database."""
    data = root / "data"
    (data / "keys").mkdir(parents=True)
    (data / "keys").chmod(0o700)
    for name, file_mode in (("keys/api-key-pepper", 0o600), ("keys/signing.key.pub", 0o644)):
        (data / name).write_bytes(b"x")
        (data / name).chmod(file_mode)
    (data / "airgate.db").write_bytes(b"")
    (data / "airgate.db").chmod(0o644)
    data.chmod(mode)
    return data


def test_a_0644_database_in_a_0700_data_dir_is_private(tmp_path: Path) -> None:
    found = check_data_dir(settings(data_dir(tmp_path, 0o700)))
    assert found.status == "pass", found.detail
    assert "2 secret files private" in found.detail  # the pepper and the database; not the .pub


def test_a_0755_data_dir_exposes_the_database_to_others(tmp_path: Path) -> None:
    data = data_dir(tmp_path, 0o755)
    found = check_data_dir(settings(data))
    assert found.status == "fail"
    assert found.detail == (
        f"airgate.db can be read or written by group and others: chmod 600 it (or chmod 700 "
        f"{data.resolve()})"
    )


def test_a_secret_open_to_its_group_and_a_writable_keys_dir_both_fail(tmp_path: Path) -> None:
    data = data_dir(tmp_path, 0o710)  # the group may enter, not list or write
    (data / "keys").chmod(0o770)
    (data / "keys" / "api-key-pepper").chmod(0o640)
    found = check_data_dir(settings(data))
    assert found.status == "fail"
    problems = found.detail.split("; ")
    assert "keys is writable by group (mode 0770): chmod 700 it" in problems
    assert any(
        p.startswith("keys/api-key-pepper can be read or written by group:") for p in problems
    )
    assert not any("signing.key.pub" in p for p in problems)


def test_a_missing_data_dir_says_to_start_once(tmp_path: Path) -> None:
    found = check_data_dir(settings(tmp_path / "none"))
    assert found.status == "fail"
    assert "does not exist: start `airgate serve` once" in found.detail


def test_unconfigured_services_are_skipped(tmp_path: Path) -> None:
    s = settings(tmp_path)
    for check in (check_redis, check_postgresql, check_kms, check_otlp):
        found = check(s)
        assert found.status == "skip", (check.__name__, found.detail)
        assert "configured" in found.detail


def test_services_nobody_answers_fail_without_showing_a_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VAULT_TOKEN", raising=False)
    s = settings(
        tmp_path,
        **{
            "limits.redis_url": f"redis://:hunter2@{NOBODY}/0",
            "audit.database_url": f"postgresql://airgate:hunter2@{NOBODY}/airgate",
            "telemetry.otlp_endpoint": f"http://{NOBODY}/v1/traces",
        },
    )
    redis, postgresql, otlp = check_redis(s), check_postgresql(s), check_otlp(s)
    assert redis.status == postgresql.status == otlp.status == "fail"
    assert redis.detail.startswith(f"Redis at {NOBODY} does not answer")
    assert "falls back to limits in process" in redis.detail
    assert postgresql.detail.startswith(f"PostgreSQL at {NOBODY}")
    assert otlp.detail == f"the OTLP collector at {NOBODY}/v1/traces does not answer (ConnectError)"
    for found in (redis, postgresql, otlp):
        assert "hunter2" not in found.detail


def test_a_vault_without_its_token_variable_fails_the_kms_check(tmp_path: Path) -> None:
    config = tmp_path / "airgate.toml"
    config.write_text(
        f'[kms.vault_transit]\naddress = "http://{NOBODY}"\ntoken_env = "SELFTEST_NO_TOKEN"\n'
    )
    s = load_settings(config, environ={}, overrides={"data_dir": str(tmp_path)})
    found = check_kms(s)
    assert found.status == "fail"
    assert found.detail == (
        "vault-transit: the token is read from $SELFTEST_NO_TOKEN, which is not set"
    )


def test_a_check_that_raises_fails_alone_and_its_message_is_not_shown() -> None:
    def broken() -> Any:
        raise RuntimeError("postgresql://user:hunter2@db/airgate")

    result = run_check("broken", broken)
    assert result.status == "fail" and not result.ok
    assert result.detail == "the check could not run: an unexpected RuntimeError"


def test_the_report_shapes() -> None:
    results = [
        CheckResult(name="keys", status="pass", detail="3 keys", duration_ms=12.34),
        CheckResult(name="redis", status="fail", detail="down", duration_ms=5000.0),
        CheckResult(name="otlp", status="skip", detail="not configured", duration_ms=0.0),
    ]
    assert line(results[0]) == "PASS  keys              12 ms  3 keys"
    assert line(results[1]) == "FAIL  redis           5000 ms  down"
    assert summary(results) == "selftest FAILED: 1 passed, 1 failed, 1 skipped"
    assert summary([results[0], results[2]]) == "selftest passed: 1 passed, 0 failed, 1 skipped"
    report = json.loads(encode_json(results))
    assert report == {
        "ok": False,
        "checks": [
            {"name": "keys", "status": "pass", "detail": "3 keys", "duration_ms": 12.34},
            {"name": "redis", "status": "fail", "detail": "down", "duration_ms": 5000.0},
            {"name": "otlp", "status": "skip", "detail": "not configured", "duration_ms": 0.0},
        ],
    }
