"""mTLS: with `[auth.mtls]` the server requires a client certificate from its CA and maps the
certificate's subject to a principal; no certificate, or one from another CA, never connects."""

from __future__ import annotations

import datetime as dt
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from server_process import (
    MODEL,
    SERVER_ENV,
    Server,
    clean_env,
    free_port,
    seed_data_dir,
    serve_command,
    stop_and_check,
)

NOW = dt.datetime.now(dt.UTC)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(
    subject: str,
    issuer_key: ec.EllipticCurvePrivateKey | None = None,
    issuer: str | None = None,
    *,
    ca: bool = False,
    san_ip: bool = False,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer or subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - dt.timedelta(minutes=5))
        .not_valid_after(NOW + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if san_ip:
        import ipaddress

        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
    return key, builder.sign(issuer_key or key, hashes.SHA256())


def _write(
    directory: Path, name: str, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate
) -> tuple[Path, Path]:
    key_path, cert_path = directory / f"{name}.key", directory / f"{name}.pem"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


class Pki:
    def __init__(self, root: Path) -> None:
        ca_key, ca = _cert("airgate-test-ca", ca=True)
        _, self.ca = _write(root, "ca", ca_key, ca)
        server_key, server = _cert("127.0.0.1", ca_key, "airgate-test-ca", san_ip=True)
        self.server_key, self.server = _write(root, "server", server_key, server)
        client_key, client = _cert("billing-svc", ca_key, "airgate-test-ca")
        self.client_key, self.client = _write(root, "client", client_key, client)
        other_key, other = _cert("unmapped-svc", ca_key, "airgate-test-ca")
        self.other_key, self.other = _write(root, "other", other_key, other)
        rogue_ca_key, _ = _cert("rogue-ca", ca=True)
        rogue_key, rogue = _cert("billing-svc", rogue_ca_key, "rogue-ca")
        self.rogue_key, self.rogue = _write(root, "rogue", rogue_key, rogue)


@pytest.fixture(scope="module")
def mtls_server(
    tmp_path_factory: pytest.TempPathFactory, model_dir: Path
) -> Iterator[tuple[Server, Pki]]:
    root = tmp_path_factory.mktemp("mtls")
    pki = Pki(root)
    data = seed_data_dir(root / "data", model_dir)
    config = root / "airgate.toml"
    config.write_text(
        f"""
[auth.mtls]
ca_file = "{pki.ca}"
cert_file = "{pki.server}"
key_file = "{pki.server_key}"

[auth.mtls.subjects]
"CN=billing-svc" = {{ team = "billing", roles = ["app"] }}
"""
    )
    port = free_port()
    log = root / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*serve_command(port, data), "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=clean_env(SERVER_ENV),
        )
    server = Server(process, port, data, log)
    server.base_url = f"https://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            return (
                httpx.get(f"{server.base_url}/ready", verify=_ctx(pki), timeout=5).status_code
                == 200
            )
        except httpx.TransportError:
            return False

    try:
        server.wait_until(ready, "mTLS server ready", 180)
        yield server, pki
    finally:
        stop_and_check(server)


def _ctx(pki: Pki, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if cert is not None and key is not None:
        context.load_cert_chain(str(cert), str(key))
    else:  # /ready is public, but the handshake still wants a client certificate
        context.load_cert_chain(str(pki.client), str(pki.client_key))
    return context


def test_a_mapped_client_certificate_is_a_principal(mtls_server: tuple[Server, Pki]) -> None:
    server, pki = mtls_server
    with httpx.Client(verify=_ctx(pki, pki.client, pki.client_key), timeout=60) as client:
        reply = client.post(
            f"{server.base_url}/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
    assert reply.status_code == 200, reply.text
    records = [r for r in server.request_records() if r.get("path") == "/v1/chat/completions"]
    assert records and records[-1]["key_id"].startswith("mtls:")


def test_an_unmapped_certificate_from_the_ca_gets_401(mtls_server: tuple[Server, Pki]) -> None:
    server, pki = mtls_server
    with httpx.Client(verify=_ctx(pki, pki.other, pki.other_key), timeout=30) as client:
        reply = client.get(f"{server.base_url}/v1/models")
    assert reply.status_code == 401
    assert reply.json()["error"]["code"] == "invalid_api_key"


@pytest.mark.parametrize("who", ["none", "rogue"])
def test_no_or_foreign_certificate_never_connects(
    mtls_server: tuple[Server, Pki], who: str
) -> None:
    server, pki = mtls_server
    context = ssl.create_default_context(cafile=str(pki.ca))
    if who == "rogue":
        context.load_cert_chain(str(pki.rogue), str(pki.rogue_key))
    with pytest.raises((httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError)):
        httpx.get(f"{server.base_url}/v1/models", verify=context, timeout=10)
