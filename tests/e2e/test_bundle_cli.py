"""`airgate signing-key | kms | bundle` on the real Gemma GGUF, then `airgate serve` of the result.

One module-scoped workspace holds a signing key, a local KMS key file and two bundles of the
real model (a directory and a .tar); the tests read them, and `test_rekey_*` re-keys the tar,
which the last test then serves.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from server_process import (
    NO_END,
    SERVER_ENV,
    Server,
    add_test_keys,
    airgate,
    clean_env,
    free_port,
    ok,
    serve_command,
    stop_and_check,
)

from bundles import LocalKeyProvider, WrappedKey

pytestmark = pytest.mark.e2e

PLAIN_PROBE = 64 << 10  # this many leading GGUF bytes must occur in no bundle file
SCAN_CHUNK = 16 << 20
MODEL_ID = "sealed-gemma"
PAYLOAD = "data/gemma-3-270m-q4_k_m.gguf.enc"
LOAD_STEPS = (
    "signature verified",
    "ciphertext digests verified",
    "data key unwrapped",
    "decrypted and verified",
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def occurs_in(needle: bytes, path: Path) -> bool:
    """Whether `needle` occurs in the file (read in chunks that overlap by len(needle) - 1)."""
    tail = b""
    with path.open("rb") as f:
        while chunk := f.read(SCAN_CHUNK):
            if needle in tail + chunk:
                return True
            tail = chunk[-(len(needle) - 1) :]
    return False


def files_under(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())


def inspect_json(bundle: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads(ok("bundle", "inspect", bundle, "--json").stdout)
    return manifest


def recipients(manifest: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    return [(w["provider"], w["key_ref"], w["key_version"]) for w in manifest["key_wraps"]]


def manifest_digest(bundle: Path) -> str:
    """SHA-256 of manifest.json, read here independently of airgate."""
    if bundle.is_dir():
        return hashlib.sha256((bundle / "manifest.json").read_bytes()).hexdigest()
    with tarfile.open(bundle) as tar:
        member = tar.extractfile("manifest.json")
        assert member is not None
        return hashlib.sha256(member.read()).hexdigest()


@dataclass(frozen=True)
class Workspace:
    root: Path
    data_dir: Path  # --data-dir of every command: holds only the local KMS key file
    signing_key: Path
    public_key: str  # as `signing-key create` printed it
    key_id: str
    key_file: Path
    bundle_dir: Path
    bundle_tar: Path
    create_outputs: tuple[str, str]


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory, gguf_path: Path) -> Workspace:
    root = tmp_path_factory.mktemp("bundle-cli")
    data_dir = root / "data"
    signing_key = root / "signer" / "release.key"
    created = ok("signing-key", "create", signing_key)
    public_key = created.stdout.strip().splitlines()[-1]
    key_id = created.stdout.split("key id ")[1].split(")")[0]
    ok("kms", "init", "--data-dir", data_dir)
    outputs = []
    for out in (root / "gemma.bundle", root / "gemma.tar"):
        result = ok(
            "bundle", "create", gguf_path,
            "--name", "gemma-3-270m", "--version", "q4_k_m",
            "--recipient", "local:default",
            "--signing-key", signing_key,
            "--chat-template", "gemma",
            "--out", out,
            "--data-dir", data_dir,
        )  # fmt: skip
        outputs.append(result.stdout)
    return Workspace(
        root=root,
        data_dir=data_dir,
        signing_key=signing_key,
        public_key=public_key,
        key_id=key_id,
        key_file=data_dir / "keys" / "kms-local.json",
        bundle_dir=root / "gemma.bundle",
        bundle_tar=root / "gemma.tar",
        create_outputs=(outputs[0], outputs[1]),
    )


# ---- keys ----------------------------------------------------------------------------------------


def test_signing_key_create_and_public(ws: Workspace) -> None:
    assert mode(ws.signing_key) == 0o600
    pub = ws.signing_key.with_name("release.key.pub")
    assert pub.is_file()
    assert ws.public_key.startswith("ed25519:")
    assert pub.read_text().strip() == ws.public_key
    assert len(ws.key_id) == 16
    assert ok("signing-key", "public", ws.signing_key).stdout.strip() == ws.public_key
    assert ws.public_key not in ws.signing_key.read_text()  # a PEM private key, not the public

    before = ws.signing_key.read_bytes(), pub.read_bytes()
    again = airgate("signing-key", "create", ws.signing_key)
    assert again.returncode == 1
    assert "already exists" in again.stderr
    assert (ws.signing_key.read_bytes(), pub.read_bytes()) == before


def test_kms_init_refuses_a_second_init_and_rotate_adds_versions(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    key_file = data_dir / "keys" / "kms-local.json"
    first = ok("kms", "init", "--data-dir", data_dir)
    assert "local:default" in first.stdout
    assert mode(key_file) == 0o600
    before = key_file.read_bytes()

    second = airgate("kms", "init", "--data-dir", data_dir)
    assert second.returncode == 1
    assert "already exists" in second.stderr
    assert "kms rotate" in second.stderr
    assert key_file.read_bytes() == before

    assert "version 2" in ok("kms", "rotate", "--data-dir", data_dir).stdout
    assert (
        "local:other is now at version 1"
        in ok("kms", "rotate", "--key", "other", "--data-dir", data_dir).stdout
    )
    assert mode(key_file) == 0o600
    keys = json.loads(key_file.read_text())["keys"]
    assert keys["default"]["current"] == "2"
    assert sorted(keys["default"]["versions"]) == ["1", "2"]
    assert keys["other"]["current"] == "1"


# ---- create and inspect --------------------------------------------------------------------------


def test_bundle_create_writes_only_ciphertext(ws: Workspace, gguf_path: Path) -> None:
    for out, text in zip((ws.bundle_dir, ws.bundle_tar), ws.create_outputs, strict=True):
        assert f"sealed {out}" in text
        assert "recipients local:default" in text
        assert f"signed by {ws.key_id}" in text
    assert sorted(p.relative_to(ws.bundle_dir).as_posix() for p in files_under(ws.bundle_dir)) == [
        PAYLOAD,
        "manifest.json",
        "manifest.sig",
    ]
    with tarfile.open(ws.bundle_tar) as tar:
        assert sorted(tar.getnames()) == [PAYLOAD, "manifest.json", "manifest.sig"]
    assert not list(ws.root.glob(".*")), "a sealing leftover beside the bundles"

    with gguf_path.open("rb") as f:
        probe = f.read(PLAIN_PROBE)
    assert probe.startswith(b"GGUF")
    for file in [*files_under(ws.bundle_dir), ws.bundle_tar]:
        assert not occurs_in(probe, file), f"plaintext model bytes in {file}"


def test_inspect_json_shows_the_manifest_and_no_key_material(ws: Workspace) -> None:
    result = ok("bundle", "inspect", ws.bundle_dir, "--json")
    manifest = json.loads(result.stdout)
    assert manifest["format"] == "airgate-bundle/1"
    assert manifest["model"]["name"] == "gemma-3-270m"
    assert manifest["model"]["weight_format"] == "gguf"
    assert manifest["model"]["chat_template"] == "gemma"
    (file,) = manifest["files"]
    assert file["path"] == "gemma-3-270m-q4_k_m.gguf"
    assert file["plaintext_size"] == 253_113_024
    assert file["ciphertext_size"] == (ws.bundle_dir / PAYLOAD).stat().st_size
    (wrap,) = manifest["key_wraps"]
    assert set(wrap) == {"provider", "key_ref", "key_version", "algorithm", "wrapped", "context"}
    assert (wrap["provider"], wrap["key_ref"], wrap["key_version"]) == ("local", "default", "1")
    assert wrap["context"] == {
        "bundle_id": manifest["bundle_id"],
        "purpose": "airgate-bundle-dek",
    }
    check_no_key_material(ws, result.stdout, wrap)


def test_inspect_human_readable(ws: Workspace) -> None:
    manifest = inspect_json(ws.bundle_tar)
    text = ok("bundle", "inspect", ws.bundle_tar).stdout
    assert manifest["bundle_id"] in text
    assert manifest_digest(ws.bundle_tar) in text
    assert ws.key_id in text
    assert "gemma-3-270m q4_k_m (gguf)" in text
    assert "253,113,024 bytes" in text
    assert "local:default v1 (AES-256-GCM)" in text
    check_no_key_material(ws, text, manifest["key_wraps"][0])


def check_no_key_material(ws: Workspace, output: str, wrap: Mapping[str, Any]) -> None:
    """Neither the data key, nor the KMS key, nor the signing key: only the wrapped blob."""
    provider = LocalKeyProvider(ws.key_file)
    wrapped = WrappedKey(**wrap)
    dek = bytes(provider.unwrap(wrapped, wrapped.context))
    secrets = [base64.b64encode(dek).decode(), dek.hex()]
    for key in json.loads(ws.key_file.read_text())["keys"].values():
        secrets += key["versions"].values()
    pem = ws.signing_key.read_text().splitlines()
    secrets += [line for line in pem if not line.startswith("-----")]
    for secret in secrets:
        assert secret not in output
    assert output.count(wrap["wrapped"]) <= 1


# ---- verify --------------------------------------------------------------------------------------


def pub_file(ws: Workspace) -> Path:
    return ws.signing_key.with_name("release.key.pub")


def test_verify_with_the_trusted_public_key_file(ws: Workspace) -> None:
    for bundle in (ws.bundle_dir, ws.bundle_tar):
        result = ok(
            "bundle", "verify", bundle, "--trusted-key", pub_file(ws), "--data-dir", ws.data_dir
        )
        assert f"ok: {bundle}" in result.stdout
        assert "signature, validity, ciphertext verified" in result.stdout
        assert f"signed by {ws.key_id}" in result.stdout


def test_verify_decrypt(ws: Workspace) -> None:
    result = ok(
        "bundle", "verify", ws.bundle_dir,
        "--trusted-key", ws.public_key,
        "--decrypt", "--engine", "llama.cpp",
        "--data-dir", ws.data_dir,
    )  # fmt: skip
    assert "ciphertext and plaintext verified" in result.stdout


def test_verify_refuses_a_bundle_signed_by_another_key(ws: Workspace) -> None:
    other = ws.root / "other" / "other.key"
    ok("signing-key", "create", other)
    result = airgate(
        "bundle", "verify", ws.bundle_dir,
        "--trusted-key", other.with_name("other.key.pub"),
        "--data-dir", ws.data_dir,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert ws.key_id in result.stderr
    assert "not a trusted key" in result.stderr
    assert "ok:" not in result.stdout


def test_verify_without_any_trusted_key_is_a_usage_error(ws: Workspace) -> None:
    # The data dir holds no signing.key.pub and no config pins a key: nothing to check against.
    result = airgate("bundle", "verify", ws.bundle_dir, "--data-dir", ws.data_dir)
    assert result.returncode == 2, result.stderr
    assert "no trusted keys" in result.stderr
    assert "--trusted-key" in result.stderr
    # the hint names the config table to set (printed through rich: `[...]` must be escaped)
    assert "[bundles] trusted_keys" in result.stderr


def test_verify_names_the_failed_check_after_one_ciphertext_byte_flips(ws: Workspace) -> None:
    tampered = ws.root / "tampered.bundle"
    shutil.copytree(ws.bundle_dir, tampered)
    payload = tampered / PAYLOAD
    with payload.open("r+b") as f:
        f.seek(payload.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    result = airgate(
        "bundle", "verify", tampered, "--trusted-key", pub_file(ws), "--data-dir", ws.data_dir
    )
    assert result.returncode == 1, result.stdout
    assert "integrity check failed" in result.stderr
    assert "ciphertext digest" in result.stderr, result.stderr
    assert "ok:" not in result.stdout


# ---- rekey ---------------------------------------------------------------------------------------


def test_rekey_rewrap_add_remove_and_never_the_last_recipient(ws: Workspace) -> None:
    bundle, dd = ws.bundle_tar, ("--data-dir", ws.data_dir)
    sign = ("--signing-key", ws.signing_key)
    before = inspect_json(bundle)

    assert "now at version 2" in ok("kms", "rotate", *dd).stdout
    rewrapped = ok("bundle", "rekey", bundle, *sign, "--rewrap", *dd)
    assert "recipients now local:default v2" in rewrapped.stdout
    assert recipients(inspect_json(bundle)) == [("local", "default", "2")]

    ok("kms", "rotate", "--key", "second", *dd)  # creates local:second at version 1
    added = ok("bundle", "rekey", bundle, *sign, "--add", "local:second", *dd)
    assert "local:default v2, local:second v1" in added.stdout
    ok("bundle", "rekey", bundle, *sign, "--remove", "local:default", *dd)
    after = inspect_json(bundle)
    assert recipients(after) == [("local", "second", "1")]
    # the payload was not touched: same bundle, same ciphertext
    assert after["bundle_id"] == before["bundle_id"]
    assert after["files"] == before["files"]
    ok("bundle", "verify", bundle, "--trusted-key", pub_file(ws), "--decrypt", *dd)

    last = airgate("bundle", "rekey", bundle, *sign, "--remove", "local:second", *dd)
    assert last.returncode == 1
    assert "last recipient" in last.stderr
    assert recipients(inspect_json(bundle)) == [("local", "second", "1")]


# ---- serve ---------------------------------------------------------------------------------------


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


@pytest.fixture(scope="module")
def served(ws: Workspace) -> Iterator[Server]:
    config = ws.root / "airgate.toml"
    config.write_text(
        "[[models]]\n"
        f'id = "{MODEL_ID}"\n'
        f"bundle = {json.dumps(str(ws.bundle_tar))}\n\n"
        "[bundles]\n"
        f"trusted_keys = [{json.dumps(str(pub_file(ws)))}]\n\n"
        "[kms.local]\n"
        f"key_file = {json.dumps(str(ws.key_file))}\n"
    )
    data_dir = ws.root / "serve-data"
    add_test_keys(data_dir)
    server = spawn(data_dir, ws.root / "serve.log", "--config", str(config))
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    yield server
    stop_and_check(server)


def test_serve_the_bundle_and_chat(served: Server) -> None:
    with OpenAI(base_url=f"{served.base_url}/v1", api_key=served.key(), max_retries=0) as client:
        assert [m.id for m in client.models.list().data] == [MODEL_ID]
        result = client.chat.completions.create(
            model=MODEL_ID,
            messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=5,
            temperature=0,
            logit_bias=NO_END,
        )
    assert result.model == MODEL_ID
    assert result.choices[0].message.content
    assert result.usage is not None
    assert result.usage.completion_tokens == 5


def test_serve_logs_each_load_step_with_bundle_id_and_digest(ws: Workspace, served: Server) -> None:
    bundle_id = inspect_json(ws.bundle_tar)["bundle_id"]
    digest = manifest_digest(ws.bundle_tar)
    messages = [r["msg"] for r in served.log_records() if r.get("logger") == "airgate.bundles"]
    for step in LOAD_STEPS:
        lines = [m for m in messages if step in m]
        assert lines, f"no {step!r} line in {messages}"
        assert all(bundle_id in m and digest in m for m in lines), lines
    assert any(f"signer={ws.key_id}" in m for m in messages)
    ((provider, key_ref, _),) = recipients(inspect_json(ws.bundle_tar))  # local:second if re-keyed
    assert any(f"provider={provider}:{key_ref}" in m for m in messages)
    assert any("into=memfd" in m for m in messages)
    assert served.data_dir.is_dir()
    assert not list(served.data_dir.rglob("*.gguf"))
