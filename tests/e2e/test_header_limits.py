"""The request head over raw sockets, against a real `airgate serve` (echo engine): an oversized
header, too many headers and a head that never ends are refused; the server stays small; a
normal request still works.

Before the limits, the red team had an 8 MB header and 100,000 headers parsed (both answered
200), and a socket that never finished its headers held for more than 70 s (10 of them grew the
server by 186 MiB).  Here `[server] header_timeout_s` is 1 s; every wait is for a condition
(the server's answer, its close of the socket) under a generous deadline, never a sleep.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_process import Server, add_test_keys, start_server, stop_and_check

pytestmark = pytest.mark.e2e

MAX_HEADER_BYTES = 16 * 1024
MAX_HEADERS = 50
HEADER_TIMEOUT_S = 1.0
DEADLINE_S = 60.0  # for the server to answer or close; far beyond the 1 s it is given
CHUNK = 64 * 1024
HUGE = 8 * 1024 * 1024
RSS_GROWTH_BOUND_KIB = 48 * 1024  # 10 unbounded sockets grew it by 186 MiB
CONFIG = f"""
[server]
max_header_bytes = {MAX_HEADER_BYTES}
max_headers = {MAX_HEADERS}
header_timeout_s = {HEADER_TIMEOUT_S}

[[models]]
id = "echo"
engine = "echo"
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("header-limits")
    (root / "airgate.toml").write_text(CONFIG)
    data_dir = root / "data"
    srv = start_server(
        data_dir, root / "server.log", {"AIRGATE_CONFIG": str(root / "airgate.toml")}
    )
    add_test_keys(data_dir)  # an app key, in the database the server has created
    yield srv
    stop_and_check(srv)


@contextlib.contextmanager
def connect(server: Server) -> Iterator[socket.socket]:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=DEADLINE_S)
    try:
        yield sock
    finally:
        sock.close()


def read_until_closed(sock: socket.socket, deadline: float | None = None) -> bytes:
    """Everything the server sends until it closes the connection (b"" from recv); a reset
    counts as closed.  Fails if the server has not closed it by the deadline."""
    deadline = time.monotonic() + DEADLINE_S if deadline is None else deadline
    received = b""
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return received
        except TimeoutError:
            raise AssertionError(
                f"the server kept the connection open ({received[:200]!r})"
            ) from None
        if not chunk:
            return received
        received += chunk


def read_response(sock: socket.socket) -> bytes:
    """One whole response (head and a content-length body) off a connection kept alive."""
    sock.settimeout(DEADLINE_S)
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, received
        received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, received
        body += chunk
    return head + b"\r\n\r\n" + body


def send_until_answered(sock: socket.socket, data: bytes) -> bytes:
    """Send `data` a chunk at a time, stopping as soon as the server has something to say
    (or has closed); then read until the server closes."""
    for start in range(0, len(data), CHUNK):
        readable, _, _ = select.select([sock], [], [], 0)
        if readable:
            break
        try:
            sock.sendall(data[start : start + CHUNK])
        except (BrokenPipeError, ConnectionResetError):
            break
    return read_until_closed(sock)


def status_of(response: bytes) -> int:
    assert response.startswith(b"HTTP/1.1 "), response[:200]
    return int(response.split(b" ", 2)[1])


def error_of(response: bytes) -> dict[str, object]:
    head, _, body = response.partition(b"\r\n\r\n")
    assert b"content-type: application/json" in head.lower(), head
    assert b"connection: close" in head.lower(), head
    error: dict[str, object] = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def request(path: str = "/health", headers: bytes = b"") -> bytes:
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: airgate\r\n" + headers + b"\r\n"


def rss_kib(server: Server) -> int:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_normal_request_still_works(server: Server) -> None:
    with connect(server) as sock:
        sock.sendall(request(headers=b"X-Fine: " + b"a" * 4000 + b"\r\nConnection: close\r\n"))
        assert status_of(read_until_closed(sock)) == 200
    resp = httpx.post(
        f"{server.base_url}/v1/chat/completions",
        headers=server.auth(),
        json={"model": "echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        timeout=DEADLINE_S,
    )
    assert resp.status_code == 200, resp.text


def test_an_8mb_header_is_refused_with_431(server: Server) -> None:
    secret = b"canary-header-value-"
    with connect(server) as sock:
        big = request(headers=b"X-Big: " + secret + b"v" * HUGE + b"\r\n")
        response = send_until_answered(sock, big)
    assert status_of(response) == 431
    error = error_of(response)
    assert error["code"] == "request_header_fields_too_large"
    assert secret not in response


def test_a_long_target_counts_toward_the_limit(server: Server) -> None:
    with connect(server) as sock:
        response = send_until_answered(sock, request("/health?" + "q" * (2 * MAX_HEADER_BYTES)))
    assert status_of(response) == 431


@pytest.mark.parametrize("count", [MAX_HEADERS + 1, 100_000])
def test_too_many_headers_are_refused_with_431(server: Server, count: int) -> None:
    many = b"".join(b"X-%d: v\r\n" % i for i in range(count))
    assert len(many) < MAX_HEADER_BYTES or count == 100_000
    with connect(server) as sock:
        response = send_until_answered(sock, request(headers=many))
    assert status_of(response) == 431
    assert error_of(response)["code"] == "request_header_fields_too_large"


def test_as_many_headers_as_allowed_are_served(server: Server) -> None:
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(MAX_HEADERS - 2))  # + Host, Connection
    with connect(server) as sock:
        sock.sendall(request(headers=fields + b"Connection: close\r\n"))
        assert status_of(read_until_closed(sock)) == 200


def test_an_unfinished_head_is_answered_408_and_closed(server: Server) -> None:
    with connect(server) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: airgate\r\nX-Slow: abc")
        response = read_until_closed(sock)
    assert status_of(response) == 408
    assert error_of(response)["code"] == "request_timeout"


def test_a_silent_connection_is_closed(server: Server) -> None:
    with connect(server) as sock:
        assert read_until_closed(sock) == b""


def test_a_keep_alive_connection_times_out_on_its_next_unfinished_head(server: Server) -> None:
    with connect(server) as sock:
        sock.sendall(request())
        assert status_of(read_response(sock)) == 200
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: air")
        assert status_of(read_until_closed(sock)) == 408


def test_ten_slow_sockets_leave_the_server_small(server: Server) -> None:
    """Ten sockets each try to send an 8 MB header and stay; ten more send part of a head and
    stall.  The server cuts them all off; its resident memory barely moves."""
    before = rss_kib(server)
    socks = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]
    try:
        for sock in socks[:10]:
            sock.setblocking(False)
            head = request(headers=b"X-Big: " + b"v" * HUGE)  # never ends
            sent = 0
            while sent < len(head):  # until the server stops reading (or closes)
                _, writable, _ = select.select([], [sock], [], 5.0)
                if not writable:
                    break
                try:
                    sent += sock.send(head[sent : sent + CHUNK])
                except (BrokenPipeError, ConnectionResetError):
                    break
            sock.setblocking(True)
        for sock in socks[10:]:
            sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: airgate\r\nX-Slow: " + b"v" * 8000)
        peak = rss_kib(server)
        print(f"server RSS: before {before} KiB, with the sockets open {peak} KiB")
        assert peak - before < RSS_GROWTH_BOUND_KIB, (before, peak)
        deadline = time.monotonic() + DEADLINE_S
        for sock in socks:
            read_until_closed(sock, deadline)  # the server closes every one of them
        after = rss_kib(server)
    finally:
        for sock in socks:
            sock.close()
    print(f"server RSS once the server has closed them: {after} KiB")
    assert after - before < RSS_GROWTH_BOUND_KIB, (before, peak, after)
    assert httpx.get(f"{server.base_url}/health", timeout=DEADLINE_S).status_code == 200


def test_refusals_never_reach_the_app(server: Server) -> None:
    """A refused head is answered by the server alone: the app logs no request for it."""
    with connect(server) as sock:
        send_until_answered(sock, request("/refused-marker", b"X-Big: " + b"v" * HUGE + b"\r\n"))
    resp = httpx.get(f"{server.base_url}/ready")
    assert resp.status_code == 200
    after = resp.headers["x-request-id"]  # the server's own id, the one its log names
    server.wait_until(lambda: after in server.log_text(), "the next request logged")
    assert "refused-marker" not in server.log_text()
