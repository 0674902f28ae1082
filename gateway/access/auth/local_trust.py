"""Local trust (`[auth] local_trust = true`): on a single-user laptop, a request without any
credential that comes over loopback TCP from the OS user the server runs as is that user's
own app, as `ollama` habits expect.

Who the peer is comes only from the transport (the ASGI scope's `client` and `server`
addresses, never a header), and on Linux from the kernel: the peer's own socket (its end is
the request's client address, its other end the server's) is looked up and its owner's uid
read, by one sock_diag netlink request for that exact socket (what `ss` uses: ~20 us, so no
cache is kept; uvicorn builds a new ASGI scope per request anyway), else in /proc/net/tcp and
/proc/net/tcp6 (their `uid` column; the kernel walks its whole connection hash to print them,
~10 ms on a large host).  Only the server's own uid is trusted; another user's socket, or one
that cannot be found, is refused (the request then needs a key: 401).  Where neither can be
read (macOS, a hardened container) every loopback peer is trusted: a single-user assumption,
warned about at start.

The caller is `Principal(key_id="local:<user>", method="local", team="local", roles={"app"})`:
audited as the OS user, limited per key id like any app key, judged by the policy rules that
match team `local` and role `app`.  Never an admin or an auditor.  A request that carries a
credential is never judged here: a wrong key stays a 401.  A web page runs as this user too:
a request with a browser's marks (`Origin`, `Sec-Fetch-*`) or a non-loopback `Host` (DNS
rebinding) is not trusted.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import os
import pwd
import re
import socket
import struct
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .errors import AuthenticationFailed
from .principal import Principal

__all__ = [
    "LOCAL_TEAM",
    "PROC_TABLES",
    "LocalPeerRefused",
    "LocalTrust",
    "is_loopback_host",
    "socket_owner",
]

_log = logging.getLogger("airgate.auth")

LOCAL_TEAM: Final = "local"
PROC_TABLES: Final = ("/proc/net/tcp", "/proc/net/tcp6")
_NOT_IDENT = re.compile(r"[^A-Za-z0-9_.@+-]")
_SKIPPED_STATES = frozenset({"06", "0A"})  # TIME_WAIT (owner gone, uid 0), LISTEN


class LocalPeerRefused(AuthenticationFailed):
    """A keyless loopback request whose socket is not the server user's (or is not found)."""

    default_reason = "local_peer_untrusted"


def is_loopback_host(host: str) -> bool:
    """Whether a bind address (`[server] host`) is loopback only."""
    if host == "localhost":
        return True
    address = _address(host)
    return address is not None and address.is_loopback


_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _address(host: str) -> _Address | None:
    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _proc_hex(address: _Address, *, v6: bool) -> str:
    """How /proc/net/tcp{,6} prints an address: each 32-bit word as the kernel holds it
    (network byte order) printed as a host-order integer, `%08X`."""
    packed = address.packed
    if v6 and isinstance(address, ipaddress.IPv4Address):
        packed = b"\0" * 10 + b"\xff\xff" + packed  # an IPv6 socket talking IPv4 (mapped)
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return "".join(f"{w:08X}" for w in words)


def socket_owner(
    local: tuple[str, int],
    remote: tuple[str, int],
    tables: Sequence[str] = PROC_TABLES,
    *,
    netlink: bool = True,
) -> int | None:
    """The uid owning the live TCP socket whose own end is `local` and whose other end is
    `remote` (both `(address, port)`); None when the kernel knows no such socket.  Asks the
    kernel for that one socket (sock_diag netlink: ~20 us); where netlink is unavailable, reads
    its tables (/proc/net/tcp*: it walks the whole connection hash, ~10 ms on a large host)."""
    here, there = _address(local[0]), _address(remote[0])
    if here is None or there is None:
        return None
    if netlink:
        try:
            return _diag_owner(here, local[1], there, remote[1])
        except OSError:
            pass  # no sock_diag here (a sandbox): the tables
    return _table_owner(here, local[1], there, remote[1], tables)


_NETLINK_SOCK_DIAG, _SOCK_DIAG_BY_FAMILY, _NLMSG_ERROR, _NLM_F_REQUEST = 4, 20, 2, 1
_NO_COOKIE = 0xFFFFFFFF
_TIME_WAIT, _LISTEN = 6, 10
_UID_AT = 16 + 4 + 48 + 12  # nlmsghdr, inet_diag_msg: family..retrans, sockid, expires..wqueue


def _diag_owner(here: _Address, port: int, there: _Address, peer_port: int) -> int | None:
    """One `SOCK_DIAG_BY_FAMILY` request for the exact socket (inet_diag_req_v2 with its
    inet_diag_sockid filled in and no dump flag: the kernel looks that one socket up).
    Raises OSError where sock_diag cannot be used."""
    family = socket.AF_INET6 if 6 in (here.version, there.version) else socket.AF_INET
    if family == socket.AF_INET6:
        here, there = _as_v6(here), _as_v6(there)
    sockid = (
        struct.pack("!HH", port, peer_port)
        + here.packed.ljust(16, b"\0")
        + there.packed.ljust(16, b"\0")
        + struct.pack("=III", 0, _NO_COOKIE, _NO_COOKIE)
    )
    body = struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, 0xFFFFFFFF) + sockid
    request = struct.pack("=IHHII", 16 + len(body), _SOCK_DIAG_BY_FAMILY, _NLM_F_REQUEST, 1, 0)
    with socket.socket(
        socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, _NETLINK_SOCK_DIAG
    ) as nl:
        nl.settimeout(1.0)  # the kernel answers within the send; this only bounds a surprise
        nl.sendto(request + body, (0, 0))
        reply = nl.recv(8192)
    if len(reply) < 20:
        raise OSError("short sock_diag reply")
    (kind,) = struct.unpack_from("=H", reply, 4)
    if kind == _NLMSG_ERROR:
        (error,) = struct.unpack_from("=i", reply, 16)
        if error == -errno.ENOENT:
            return None  # no such socket
        raise OSError(-error, "sock_diag refused the lookup")
    if kind != _SOCK_DIAG_BY_FAMILY or len(reply) < _UID_AT + 4:
        raise OSError("unexpected sock_diag reply")
    state = reply[17]
    if state in (_TIME_WAIT, _LISTEN):  # a closed connection's remnant (uid 0), a listener
        return None
    (uid,) = struct.unpack_from("=I", reply, _UID_AT)
    return int(uid)


def _as_v6(address: _Address) -> ipaddress.IPv6Address:
    if isinstance(address, ipaddress.IPv6Address):
        return address
    return ipaddress.IPv6Address(b"\0" * 10 + b"\xff\xff" + address.packed)


def _table_owner(
    here: _Address, port: int, there: _Address, peer_port: int, tables: Sequence[str]
) -> int | None:
    owners: set[int] = set()
    for path in tables:
        v6 = path.endswith("6")
        if not v6 and 6 in (here.version, there.version):
            continue
        needle = f" {_proc_hex(here, v6=v6)}:{port:04X} {_proc_hex(there, v6=v6)}:{peer_port:04X} "
        try:
            with open(path, encoding="ascii") as f:
                text = f.read()
        except OSError:
            continue
        at = text.find(needle)
        while at >= 0:
            end = text.find("\n", at)
            fields = text[at : end if end >= 0 else None].split()
            if len(fields) > 6 and fields[2] not in _SKIPPED_STATES and fields[6].isdigit():
                owners.add(int(fields[6]))  # after the addresses: st, queues, tr, retrnsmt, uid
            at = text.find(needle, at + 1)
    return owners.pop() if len(owners) == 1 else None


def _netlink_works() -> bool:
    """Whether sock_diag finds a connection of ours (a kernel without its TCP handler answers
    every lookup "not found", which would refuse every keyless request)."""
    try:
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            with socket.create_connection(listener.getsockname(), timeout=1.0) as probe:
                (host, port), (peer, peer_port) = probe.getsockname(), probe.getpeername()
                owner = _diag_owner(
                    ipaddress.IPv4Address(host), port, ipaddress.IPv4Address(peer), peer_port
                )
    except OSError:
        return False
    return owner == os.geteuid()


def _user_name(uid: int) -> str:
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry (a container)
        name = ""
    return _NOT_IDENT.sub("_", name)[:100] or f"uid{uid}"


@dataclass(frozen=True)
class LocalTrust:
    """The local-trust check of one server process.  `uid`: the socket owner to trust; None
    when neither sock_diag nor the kernel's socket tables can be read (then every loopback peer
    is trusted)."""

    principal: Principal
    uid: int | None
    tables: tuple[str, ...] = PROC_TABLES
    netlink: bool = True  # sock_diag answers here (else the tables are read)

    @classmethod
    def for_this_process(
        cls, tables: Sequence[str] = PROC_TABLES, *, netlink: bool = True
    ) -> LocalTrust:
        uid = os.geteuid()
        name = _user_name(uid)
        principal = Principal(
            key_id=f"local:{name}",
            method="local",
            team=LOCAL_TEAM,
            roles=frozenset({"app"}),
            subject=name,
        )
        linux = sys.platform.startswith("linux")
        netlink = linux and netlink and _netlink_works()
        readable = netlink or (linux and all(os.access(t, os.R_OK) for t in tables))
        if not readable:
            _log.warning(
                "[auth] local_trust: neither sock_diag nor the kernel's socket tables (%s) can "
                "be read here, so the owner of a connection is not checked: every keyless "
                "request over loopback is trusted as %s. Only use this on a single-user machine.",
                ", ".join(tables),
                principal.key_id,
            )
        return cls(principal, uid if readable else None, tuple(tables), netlink)

    def authenticate(
        self, client: Any, server: Any, headers: Iterable[tuple[bytes, bytes]] = ()
    ) -> Principal | None:
        """The local principal for a keyless request whose transport peer is `client` and own
        end `server` (the ASGI scope's).  None when the peer is not on loopback (local trust
        does not apply); raises `LocalPeerRefused` for a loopback peer that is not this user's,
        or for a request a web browser sent (see `_browser`).
        """
        if not client or not server or not _on_loopback(client[0]) or not _on_loopback(server[0]):
            return None
        if (why := _browser(headers)) is not None:
            raise LocalPeerRefused(why)
        if self.uid is None:
            return self.principal
        owner = socket_owner(
            (str(client[0]), int(client[1])),
            (str(server[0]), int(server[1])),
            self.tables,
            netlink=self.netlink,
        )
        if owner is None:
            raise LocalPeerRefused("local_peer_unknown")
        if owner != self.uid:
            raise LocalPeerRefused()
        return self.principal


def _browser(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """Why a request looks sent by a web page, which runs as this user too: an `Origin` or
    `Sec-Fetch-*` header (browsers add them; the `ollama` and OpenAI clients do not), or a
    `Host` that is not a loopback name (a DNS-rebinding page reaches 127.0.0.1 under its own
    name).  Headers only ever withdraw local trust, never grant it."""
    for name, value in headers:
        if name == b"origin" or name.startswith(b"sec-fetch-"):
            return "local_browser_request"
        if name == b"host" and not _loopback_authority(value):
            return "local_host_not_loopback"
    return None


def _loopback_authority(value: bytes) -> bool:
    host = value.decode("latin-1").strip().lower()
    if host.startswith("["):
        host = host[1:].partition("]")[0]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    return is_loopback_host(host)


def _on_loopback(host: Any) -> bool:
    address = _address(str(host))
    return address is not None and address.is_loopback
