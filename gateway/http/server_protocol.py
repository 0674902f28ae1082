"""The HTTP/1.1 server protocol: uvicorn's httptools protocol with limits on the request head.

uvicorn 0.54 with httptools bounds neither the size nor the number of request headers, nor the
time a client may take to send them: a red team had an 8 MB header and 100,000 headers parsed,
and a connection that never finished its headers held open for more than 70 s (10 such sockets
grew the server by 186 MiB).  uvicorn's h11 protocol has `h11_max_incomplete_event_size`, but
no header count and no head timeout, and is pure Python (slower on every request); the mTLS
protocol already subclasses the httptools one.  So this subclass adds, from `[server]`:

    max_header_bytes   request line + headers; counted on the raw bytes while the head is
                       incomplete (so the parser never buffers more than this plus one read)
                       and on the parsed fields           -> 431, connection closed
    max_headers        header fields                      -> 431, connection closed
    header_timeout_s   from the connection, or from the first byte of a request, to the end
                       of its headers; an idle keep-alive connection is uvicorn's
                       (`timeout_keep_alive`, 5 s)        -> 408 (nothing if no byte came), closed

A refusal is the OpenAI error envelope, written before the request reaches the app (no request
id, no log line of the app).  Then the server half-closes and discards what the client is still
sending for up to `LINGER_S` before closing: closing a socket with unread input sends a reset,
which can destroy the answer in flight (the "lingering close" of Apache and nginx).
"""

from __future__ import annotations

import asyncio
import http
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from ..config import ServerSettings
from ..errors import InvalidRequest, error_body
from .tls import TlsHttpProtocol

__all__ = ["LINGER_S", "HeadLimits", "LimitedHttpProtocol", "http_protocol"]

LINGER_S: Final = 2.0


@dataclass(frozen=True)
class HeadLimits:
    max_bytes: int = 32 * 1024
    max_headers: int = 100
    timeout_s: float = 10.0


class _HeadRefused(Exception):
    """Raised in a parser callback to stop parsing a head over a limit."""


class LimitedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, refusing request heads over `limits`."""

    limits: ClassVar[HeadLimits] = HeadLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # between requests or inside a head (not in a body or a response)
        self._begun = False  # a request's first byte has been parsed, its head not yet complete
        self._head_bytes = 0  # raw bytes received while in the head
        self._fields_bytes = 0  # parsed: the target and every header name and value
        self._fields = 0
        self._head_timer: asyncio.TimerHandle | None = None
        self._linger: asyncio.TimerHandle | None = None
        self._over = False  # a parser callback found the head over a limit
        self._refused = False

    # -- the connection --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()  # a connection that never sends a byte is closed too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        # uvicorn 0.54's `data_received`, with the head counted and our refusals answered
        if self._refused:
            return  # lingering: read and dropped
        if self._in_head:
            self._head_bytes += len(data)
            self._arm()  # bytes after a keep-alive pause (even blank lines) start the clock
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._over:
                self._refuse_too_large()
                return
            msg = "Invalid HTTP request received."
            self.logger.warning(msg)
            self.send_400_response(msg)
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        if self._in_head and self._head_bytes > self.limits.max_bytes:
            self._refuse_too_large()  # an incomplete head that is already too long

    # -- parser callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = self._begun = True
        self._fields_bytes = self._fields = 0
        self._arm()

    def on_url(self, url: bytes) -> None:
        self._count(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4, 1)  # "name: value\r\n"
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._disarm()
        self._in_head = self._begun = False
        self._head_bytes = 0
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True  # the next request's first byte arms the timer again
        self._head_bytes = 0

    def _count(self, size: int, fields: int) -> None:
        self._fields_bytes += size
        self._fields += fields
        if self._fields_bytes > self.limits.max_bytes or self._fields > self.limits.max_headers:
            self._over = True
            raise _HeadRefused  # stops the parser; feed_data raises HttpParserCallbackError

    # -- the head timer and refusals -------------------------------------------------------

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.limits.timeout_s, self._head_timeout)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        self._head_timer = None
        if self._refused or not self._in_head or self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm()  # a pipelined head waits while the previous response goes out
            return
        if not (self._begun or self._head_bytes):
            self.transport.close()  # not a byte: nothing to answer
            return
        self._refuse(408, "the request headers were not received in time", "request_timeout")

    def _refuse_too_large(self) -> None:
        self._refuse(
            431,
            "the request headers are too large or too many",
            "request_header_fields_too_large",
        )

    def _refuse(self, status: int, message: str, code: str) -> None:
        self._refused = True
        self._disarm()
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()  # a response is going out: no room for another
            return
        err = InvalidRequest(message)
        err.code = code
        body = error_body(err)
        phrase = http.HTTPStatus(status).phrase
        head = [f"HTTP/1.1 {status} {phrase}\r\n".encode()]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
        self.transport.write(b"".join(head))
        if self.transport.can_write_eof():
            self.transport.write_eof()
            self._linger = self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


class _LimitedTlsHttpProtocol(LimitedHttpProtocol, TlsHttpProtocol):
    """The same limits over TLS, with the client certificate passed on (mTLS)."""


def http_protocol(server: ServerSettings, *, tls: bool = False) -> type[asyncio.Protocol]:
    """The protocol class for `uvicorn.Config(http=...)`, carrying `[server]`'s head limits."""
    limits = HeadLimits(server.max_header_bytes, server.max_headers, server.header_timeout_s)
    base = _LimitedTlsHttpProtocol if tls else LimitedHttpProtocol
    return type(base.__name__.lstrip("_"), (base,), {"limits": limits})
