"""What `airgate serve` will and will not load: plain files only when told it is insecure, bundles
only when signed by a trusted key, unexpired and intact; the default model sealed on first run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from server_process import (
    MODEL,
    NO_END,
    SERVER_ENV,
    Server,
    add_test_keys,
    airgate,
    clean_env,
    free_port,
    ok,
    serve_command,
    start_server,
    stop_and_check,
)

from gateway.access.auth import SCANNER_PATTERN

pytestmark = pytest.mark.e2e

PAYLOAD = "data/gemma-3-270m-q4_k_m.gguf.enc"
# the loader's steps from the data key on: none may be logged when a bundle is refused
DECRYPT_STEPS = ("data key unwrapped", "decrypted and verified")


def serve_exits(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`airgate serve ARGS`, which must refuse and exit by itself."""
    return airgate(*serve_command(free_port(), data_dir, *args)[3:])


def spawn(data_dir: Path, log_path: Path, *args: str) -> Server:
    """`airgate serve ARGS` on a free port: stderr (the log) to `log_path`, stdout beside it."""
    port = free_port()
    with log_path.open("wb") as log, log_path.with_suffix(".stdout").open("wb") as out:
        process = subprocess.Popen(
            serve_command(port, data_dir, *args),
            stdout=out,
            stderr=log,
            stdin=subprocess.DEVNULL,
            env=clean_env(SERVER_ENV),
        )
    return Server(process, port, data_dir, log_path)


def write_config(
    path: Path, model: str, *, trusted: Sequence[Path] = (), key_file: Path | None = None
) -> Path:
    """An airgate.toml with one model (`bundle = ...` or `path = ...` line given as `model`)."""
    text = f'[[models]]\nid = "custom"\n{model}\n'
    if trusted:
        text += f"\n[bundles]\ntrusted_keys = {json.dumps([str(p) for p in trusted])}\n"
    if key_file is not None:
        text += f"\n[kms.local]\nkey_file = {json.dumps(str(key_file))}\n"
    path.write_text(text)
    return path


def toml_path(key: str, path: Path) -> str:
    return f"{key} = {json.dumps(str(path))}"


def chat(server: Server, model: str, key: str | None = None) -> dict[str, object]:
    """One chat completion with `key` (default: the data dir's app key)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 4,
        "temperature": 0,
        "logit_bias": NO_END,
    }
    headers = {"Authorization": f"Bearer {key}"} if key else server.auth()
    response = httpx.post(
        f"{server.base_url}/v1/chat/completions", json=body, headers=headers, timeout=120
    )
    assert response.status_code == 200, response.text
    usage: dict[str, object] = response.json()["usage"]
    assert usage["completion_tokens"] == 4
    return usage


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def plaintext_files(root: Path) -> list[Path]:
    """Files under `root` named *.gguf or starting with the GGUF magic."""
    found = []
    for file in root.rglob("*"):
        if file.is_file() and not file.is_symlink():
            with file.open("rb") as f:
                magic = f.read(4)
            if file.suffix == ".gguf" or magic == b"GGUF":
                found.append(file)
    return found


@dataclass(frozen=True)
class Sealed:
    """Bundles of the real model, sealed by the CLI with one signing key and one KMS key file."""

    root: Path
    signer_pub: Path
    signer_id: str
    other_pub: Path  # a second signing key, which signed nothing
    key_file: Path
    good: Path
    expired: Path


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory, gguf_path: Path) -> Sealed:
    root = tmp_path_factory.mktemp("serve-bundles")
    signer = root / "keys" / "signer.key"
    created = ok("signing-key", "create", signer)
    ok("signing-key", "create", root / "keys" / "other.key")
    kms_dir = root / "kms"
    ok("kms", "init", "--data-dir", kms_dir)
    common = (
        "--name", "gemma-3-270m", "--version", "q4_k_m",
        "--recipient", "local:default",
        "--signing-key", signer,
        "--data-dir", kms_dir,
    )  # fmt: skip
    ok("bundle", "create", gguf_path, *common, "--out", root / "good.bundle")
    ok(
        "bundle", "create", gguf_path, *common,
        "--not-before", "2020-01-01T00:00:00Z", "--not-after", "2020-01-02T00:00:00Z",
        "--out", root / "expired.bundle",
    )  # fmt: skip
    return Sealed(
        root=root,
        signer_pub=signer.with_name("signer.key.pub"),
        signer_id=created.stdout.split("key id ")[1].split(")")[0],
        other_pub=root / "keys" / "other.key.pub",
        key_file=kms_dir / "keys" / "kms-local.json",
        good=root / "good.bundle",
        expired=root / "expired.bundle",
    )


def check_refused(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit 1 with the reason, no traceback, nothing decrypted, no server left running."""
    log = result.stderr + result.stdout
    assert result.returncode == 1, f"exit {result.returncode}:\n{log[-4000:]}"
    for needle in needles:
        assert needle in log, f"{needle!r} not in:\n{log[-4000:]}"
    assert "Traceback" not in log, log[-4000:]
    for step in DECRYPT_STEPS:
        assert step not in log, log[-4000:]


# ---- plain files -----------------------------------------------------------------------------


def test_plaintext_model_is_refused_without_the_flag(tmp_path: Path, gguf_path: Path) -> None:
    config = write_config(tmp_path / "airgate.toml", toml_path("path", gguf_path))
    result = serve_exits(tmp_path / "data", "--config", str(config))
    assert result.returncode == 2, result.stderr
    assert "configuration error" in result.stderr
    assert "--insecure-plaintext-model" in result.stderr
    assert "Traceback" not in result.stderr
    assert "Uvicorn running" not in result.stderr + result.stdout


def test_plaintext_model_is_served_with_the_flag_and_a_warning(
    tmp_path: Path, gguf_path: Path
) -> None:
    config = write_config(tmp_path / "airgate.toml", toml_path("path", gguf_path))
    data_dir = tmp_path / "data"
    add_test_keys(data_dir)
    server = spawn(
        data_dir, tmp_path / "server.log", "--config", str(config), "--insecure-plaintext-model"
    )
    try:
        server.wait_ready()
        chat(server, "custom")
    finally:
        stop_and_check(server)
    stderr = server.log_text()
    assert "WARNING: --insecure-plaintext-model" in stderr
    assert any(
        r["level"] == "warning" and "INSECURE" in r["msg"] and str(gguf_path) in r["msg"]
        for r in server.log_records()
    )
    # the configured model only: the default was not sealed into this data dir
    assert not (data_dir / "bundles").exists()


# ---- bundles that must not load ----------------------------------------------------------------


def test_bundle_signed_by_an_untrusted_key_is_refused(tmp_path: Path, sealed: Sealed) -> None:
    config = write_config(
        tmp_path / "airgate.toml",
        toml_path("bundle", sealed.good),
        trusted=[sealed.other_pub],
        key_file=sealed.key_file,
    )
    result = serve_exits(tmp_path / "data", "--config", str(config))
    check_refused(result, sealed.signer_id, "not a trusted key")
    assert "Uvicorn running" not in result.stderr + result.stdout  # refused before binding


def test_expired_bundle_is_refused(tmp_path: Path, sealed: Sealed) -> None:
    config = write_config(
        tmp_path / "airgate.toml",
        toml_path("bundle", sealed.expired),
        trusted=[sealed.signer_pub],
        key_file=sealed.key_file,
    )
    result = serve_exits(tmp_path / "data", "--config", str(config))
    check_refused(result, "expired at 2020-01-02T00:00:00Z")


def test_tampered_bundle_is_refused_naming_the_check(tmp_path: Path, sealed: Sealed) -> None:
    tampered = tmp_path / "tampered.bundle"
    shutil.copytree(sealed.good, tampered)
    with (tampered / PAYLOAD).open("r+b") as f:
        f.seek(12345678)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x80]))
    config = write_config(
        tmp_path / "airgate.toml",
        toml_path("bundle", tampered),
        trusted=[sealed.signer_pub],
        key_file=sealed.key_file,
    )
    result = serve_exits(tmp_path / "data", "--config", str(config))
    check_refused(result, "integrity check failed", "failed the ciphertext digest check")


def test_the_untampered_bundle_loads(tmp_path: Path, sealed: Sealed) -> None:
    """The control for the refusals above: the same configuration with the good bundle serves."""
    config = write_config(
        tmp_path / "airgate.toml",
        toml_path("bundle", sealed.good),
        trusted=[sealed.signer_pub],
        key_file=sealed.key_file,
    )
    data_dir = tmp_path / "data"
    add_test_keys(data_dir)
    server = spawn(data_dir, tmp_path / "server.log", "--config", str(config))
    try:
        server.wait_ready()
        chat(server, "custom")
    finally:
        stop_and_check(server)
    assert "decrypted and verified" in server.log_text()


# ---- the embedded default ----------------------------------------------------------------------


def test_default_model_is_sealed_on_first_run_and_reused(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    bundle = data_dir / "bundles" / f"{MODEL}.bundle"
    first = start_server(data_dir, tmp_path / "first.log")
    try:
        # a fresh data dir has no key but the admin key the first start mints: as a service
        # (no terminal) it is written to a 0600 file, never to the log
        admin_key = (data_dir / "initial-admin-key").read_text().strip()
        assert mode(data_dir / "initial-admin-key") == 0o600
        assert re.findall(SCANNER_PATTERN, first.log_text()) == []
        chat(first, MODEL, admin_key)
    finally:
        stop_and_check(first)
    assert any("sealing the default model" in r["msg"] for r in first.log_records())
    for key in ("kms-local.json", "signing.key"):
        assert mode(data_dir / "keys" / key) == 0o600, key
    assert (bundle / "manifest.json").is_file()
    assert (bundle / PAYLOAD).is_file()
    assert plaintext_files(data_dir) == []
    sealed_at = (bundle / "manifest.json").stat().st_mtime_ns

    second = start_server(data_dir, tmp_path / "second.log")
    try:
        chat(second, MODEL, admin_key)
    finally:
        stop_and_check(second)
    assert not any("sealing" in r["msg"] for r in second.log_records())
    assert re.findall(SCANNER_PATTERN, second.log_text()) == []
    assert (bundle / "manifest.json").stat().st_mtime_ns == sealed_at
    assert plaintext_files(data_dir) == []


def test_legacy_plaintext_model_is_deleted_at_start(tmp_path: Path, seeded_data_dir: Path) -> None:
    legacy = seeded_data_dir / "models"
    legacy.mkdir()
    gguf = legacy / "gemma-3-270m-q4_k_m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(4096))
    (legacy / "gemma-3-270m-q4_k_m.gguf.sha256").write_text("0" * 64 + "\n")
    server = start_server(seeded_data_dir, tmp_path / "server.log")
    stop_and_check(server)
    assert not gguf.exists()
    assert not legacy.exists()
    warnings = [r["msg"] for r in server.log_records() if r["level"] == "warning"]
    assert any("removed plaintext model file" in m and str(gguf) in m for m in warnings), warnings
    assert plaintext_files(seeded_data_dir) == []
