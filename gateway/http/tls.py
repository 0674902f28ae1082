"""Serving TLS, and client certificates for mTLS.

uvicorn 0.54 does not implement the ASGI TLS extension, so a small subclass of its httptools
protocol adds it: `scope["extensions"]["tls"]["client_cert_chain"]` holds the verified client
certificate (PEM) when the connection presented one.  The handshake itself (CA, TLS 1.2+, client
certificate required) is the `ssl.SSLContext` built from `[auth.mtls]`.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["TlsHttpProtocol", "client_cert_pem"]


class TlsHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol plus the ASGI TLS extension (client certificate only)."""

    _client_cert_pem: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None:
            der = ssl_object.getpeercert(binary_form=True)
            if der:
                self._client_cert_pem = ssl.DER_cert_to_PEM_cert(der)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self.scheme == "https":
            chain = [self._client_cert_pem] if self._client_cert_pem else []
            self.scope["extensions"] = {"tls": {"client_cert_chain": chain}}


def client_cert_pem(scope: Any) -> str | None:
    """The verified client certificate of this request's connection, if any."""
    chain = scope.get("extensions", {}).get("tls", {}).get("client_cert_chain") or []
    return chain[0] if chain else None
