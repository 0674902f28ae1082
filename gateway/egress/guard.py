"""The guard: a Python audit hook that refuses every connection the allow-list does not name.

CPython raises an audit event before each socket operation that can leave the machine:
`socket.connect` (also `connect_ex`), `socket.sendto`, `socket.sendmsg`, and the name lookups
`socket.getaddrinfo`, `socket.gethostbyname`, `socket.gethostbyname_ex`, `socket.gethostbyaddr`.
The hook raises `EgressDenied` there, before anything is sent:

- AF_UNIX and AF_NETLINK (the kernel) always pass; loopback and unspecified addresses
  (127.0.0.0/8, ::1, 0.0.0.0, ::) always pass; other families are refused.
- An address passes when the allow-list names it (or a network holding it) with its port, or
  when an allowed name resolved to it in this process (`socket.getaddrinfo` is wrapped to learn
  what allowed names resolve to; names are not resolved at install, so a DNS outage never
  delays start).
- A name lookup passes only for an allowed name or a loopback name: nothing else even reaches
  DNS.

uvloop (the server's event loop) connects and resolves inside libuv, without audit events: its
`create_connection`, `create_datagram_endpoint` and `getaddrinfo` are wrapped with the same
checks.  Connections made in C by other libraries (libpq, libzmq, NCCL/gloo) are not seen.

The hook runs on every audit event of the process (file opens, imports, ...): anything that is
not one of the socket events above costs one dict lookup.  Audit hooks cannot be removed:
`install` swaps the rules (idempotent), and only the first call adds the hook.
"""

from __future__ import annotations

import errno
import functools
import ipaddress
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from .. import env
from .allow_list import AllowList

__all__ = ["EgressDenied", "install", "installed", "report_to_parent"]

_log = logging.getLogger("airgate.egress")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Ports = frozenset[int] | None  # None: every port

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_LOCAL_FAMILIES = frozenset({socket.AF_UNIX, getattr(socket, "AF_NETLINK", socket.AF_UNIX)})
_INET_FAMILIES = frozenset({socket.AF_INET, socket.AF_INET6})
_MAX_CACHED = 4096
_MAX_LEARNED = 4096


class EgressDenied(ConnectionRefusedError):
    """A connection or name lookup the egress allow-list does not allow.  A
    `ConnectionRefusedError` (an `OSError`), so clients treat it as a connection failure."""

    def __init__(self, destination: str) -> None:
        super().__init__(
            errno.ECONNREFUSED,
            f"egress to {destination} refused: not loopback and not in the egress allow-list "
            "(allow it with [egress] allow)",
        )
        self.destination = destination


def _merge(a: Ports, b: Ports) -> Ports:
    return None if a is None or b is None else a | b


def _port_ok(ports: Ports, port: int | None) -> bool:
    return ports is None or port is None or port in ports


def _as_port(port: Any) -> int | None:
    if isinstance(port, int):
        return port
    if isinstance(port, (str, bytes)) and port.isdigit():
        return int(port)
    return None  # a service name, or none: the name alone decides


def _destination(host: str, port: int | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return shown if port is None else f"{shown}:{port}"


class _Rules:
    """An AllowList compiled for the hook: dicts keyed the way the checks ask."""

    def __init__(self, allow: AllowList) -> None:
        self.allow = allow
        self.names: dict[str, Ports] = {}
        self.addresses: dict[IPAddress, Ports] = {}
        networks: dict[ipaddress.IPv4Network | ipaddress.IPv6Network, Ports] = {}
        for e in allow.endpoints:
            ports: Ports = None if e.port is None else frozenset({e.port})
            kind = e.kind
            if kind == "name":
                self.names[e.host] = _merge(self.names.get(e.host, frozenset()), ports)
            elif kind == "address":
                ip = ipaddress.ip_address(e.host)
                self.addresses[ip] = _merge(self.addresses.get(ip, frozenset()), ports)
            else:
                net = ipaddress.ip_network(e.host)
                networks[net] = _merge(networks.get(net, frozenset()), ports)
        self.networks = tuple(networks.items())
        self.learned: dict[IPAddress, Ports] = {}  # what allowed names resolved to
        self._passed: set[tuple[str, int | None]] = set()  # decisions that allowed

    def name_allowed(self, host: str, port: int | None) -> bool:
        name = host.lower().rstrip(".")
        if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
            return True
        return name in self.names and _port_ok(self.names[name], port)

    def address_allowed(self, host: str, port: int | None) -> bool:
        """`host` is an address (or a name: `socket.connect` resolves one itself)."""
        key = (host, port)
        if key in self._passed:
            return True
        allowed = self._decide(host, port)
        if allowed and len(self._passed) < _MAX_CACHED:
            self._passed.add(key)
        return allowed

    def _decide(self, host: str, port: int | None) -> bool:
        if host in ("", "localhost"):
            return True  # "": INADDR_ANY, which connects to this host
        try:
            ip = ipaddress.ip_address(host.partition("%")[0])  # fe80::1%eth0
        except ValueError:
            return self.name_allowed(host, port)
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if ip.is_loopback or ip.is_unspecified:
            return True
        for table in (self.addresses, self.learned):
            if ip in table and _port_ok(table[ip], port):
                return True
        return any(ip in net and _port_ok(ports, port) for net, ports in self.networks)

    def lookup_allowed(self, host: Any) -> bool:
        if host is None:
            return True
        if isinstance(host, bytes):
            host = host.decode("ascii", "replace")
        if not isinstance(host, str):
            return False
        try:
            ipaddress.ip_address(host.partition("%")[0])
        except ValueError:
            return self.name_allowed(host, None)  # the port is checked at connect
        return True  # a numeric address queries no DNS; connecting to it is checked

    def learn(self, host: Any, results: Any) -> None:
        """Remember the addresses an allowed name resolved to (with the name's ports)."""
        if isinstance(host, bytes):
            host = host.decode("ascii", "replace")
        if not isinstance(host, str):
            return
        name = host.lower().rstrip(".")
        if name not in self.names or len(self.learned) >= _MAX_LEARNED:
            return
        for *_, sockaddr in results:
            try:
                ip = ipaddress.ip_address(str(sockaddr[0]).partition("%")[0])
            except (ValueError, IndexError, TypeError):
                continue
            self.learned[ip] = _merge(self.learned.get(ip, frozenset()), self.names[name])


_rules: _Rules | None = None
_on_denied: Callable[[str], None] | None = None
_owner_pid = 0
_hooked = False
_install_lock = threading.Lock()
_reporting = threading.local()
_real_getaddrinfo = socket.getaddrinfo
_told: set[str] = set()  # destinations a child has logged already


def _deny(destination: str) -> NoReturn:
    """Report (never recursively, never raising) and refuse."""
    if not getattr(_reporting, "active", False):
        _reporting.active = True
        try:
            # a forked child shares the hook, but not the serving process's event loop
            report = _on_denied if os.getpid() == _owner_pid else report_to_parent
            if report is not None:
                report(destination)
        except Exception:  # a report must never turn a refusal into another error
            pass
        finally:
            _reporting.active = False
    raise EgressDenied(destination)


def _check_address(rules: _Rules, address: Any) -> None:
    host, port = address[0], address[1]
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str) or not rules.address_allowed(host, _as_port(port)):
        _deny(_destination(str(host), _as_port(port)))


def _on_connect(rules: _Rules, args: tuple[Any, ...]) -> None:
    sock, address = args[0], args[1]
    if address is None:
        return  # sendmsg on a connected socket: its connect was checked
    family = getattr(sock, "family", None)
    if family in _LOCAL_FAMILIES:
        return
    if family not in _INET_FAMILIES or not isinstance(address, tuple) or len(address) < 2:
        _deny(f"family {family} address {address!r}")
    _check_address(rules, address)


def _on_lookup(rules: _Rules, args: tuple[Any, ...]) -> None:
    host = args[0]
    port = _as_port(args[1]) if len(args) > 1 else None
    if not rules.lookup_allowed(host):
        _deny(_destination(str(host), port))


def _on_reverse(rules: _Rules, args: tuple[Any, ...]) -> None:
    host = args[0]
    if isinstance(host, str) and not rules.address_allowed(host, None):
        _deny(_destination(host, None))


_CHECKS: dict[str, Callable[[_Rules, tuple[Any, ...]], None]] = {
    "socket.connect": _on_connect,
    "socket.sendto": _on_connect,
    "socket.sendmsg": _on_connect,
    "socket.getaddrinfo": _on_lookup,
    "socket.gethostbyname": _on_lookup,
    "socket.gethostbyname_ex": _on_lookup,
    "socket.gethostbyaddr": _on_reverse,
}


def _hook(event: str, args: tuple[Any, ...]) -> None:
    check = _CHECKS.get(event)
    if check is None:
        return
    rules = _rules
    if rules is not None:
        check(rules, args)


def _getaddrinfo(
    host: Any, port: Any, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
) -> Any:
    """`socket.getaddrinfo` (its audit event refuses what is not allowed), learning what an
    allowed name resolves to."""
    results = _real_getaddrinfo(host, port, family, type, proto, flags)
    rules = _rules
    if rules is not None:
        rules.learn(host, results)
    return results


def _check_remote(host: Any, port: Any) -> None:
    rules = _rules
    if rules is None or host is None:
        return
    if isinstance(host, bytes):
        host = host.decode("ascii", "replace")
    if not isinstance(host, str) or not rules.address_allowed(host, _as_port(port)):
        _deny(_destination(str(host), _as_port(port)))


def _patch_uvloop() -> None:
    """uvloop's connects and lookups, through the same checks (libuv raises no audit event)."""
    try:
        import uvloop
    except ImportError:
        return
    loop_class: Any = uvloop.Loop
    create_connection = loop_class.create_connection
    create_datagram_endpoint = loop_class.create_datagram_endpoint
    getaddrinfo = loop_class.getaddrinfo

    @functools.wraps(create_connection)
    async def guarded_connection(
        self: Any, protocol_factory: Any, host: Any = None, port: Any = None, **kwargs: Any
    ) -> Any:
        _check_remote(host, port)
        return await create_connection(self, protocol_factory, host, port, **kwargs)

    @functools.wraps(create_datagram_endpoint)
    async def guarded_datagram(
        self: Any, protocol_factory: Any, local_addr: Any = None, remote_addr: Any = None,
        **kwargs: Any,
    ) -> Any:  # fmt: skip
        if isinstance(remote_addr, tuple) and kwargs.get("family") != socket.AF_UNIX:
            _check_remote(remote_addr[0], remote_addr[1])
        return await create_datagram_endpoint(
            self, protocol_factory, local_addr, remote_addr, **kwargs
        )

    @functools.wraps(getaddrinfo)
    async def guarded_getaddrinfo(self: Any, host: Any, port: Any, **kwargs: Any) -> Any:
        rules = _rules
        if rules is not None and not rules.lookup_allowed(host):
            _deny(_destination(str(host), _as_port(port)))
        results = await getaddrinfo(self, host, port, **kwargs)
        if rules is not None:
            rules.learn(host, results)
        return results

    loop_class.create_connection = guarded_connection
    loop_class.create_datagram_endpoint = guarded_datagram
    loop_class.getaddrinfo = guarded_getaddrinfo


def _export(allow: AllowList) -> None:
    """Every child started from now on: the phone-home switches off, and the guard (the
    `_site` directory on PYTHONPATH installs it at interpreter start from `EGRESS_ALLOW`)."""
    for name, value in env.OFFLINE.items():
        os.environ[name] = value
    os.environ[env.EGRESS_ALLOW] = allow.encode()
    site = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_site")
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if site not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([site, *paths])


def install(allow_list: AllowList, on_denied: Callable[[str], None] | None = None) -> None:
    """Guard this process, and every child it starts from now on, with `allow_list` (plus
    loopback).  `on_denied(destination)` hears of each refusal in this process ("host:port"; on
    any thread, inside the refused call: it must not block).  Calling again swaps the list."""
    global _rules, _on_denied, _owner_pid, _hooked
    with _install_lock:
        _on_denied = on_denied
        _owner_pid = os.getpid()
        _rules = _Rules(allow_list)
        if not _hooked:
            _patch_uvloop()
            socket.getaddrinfo = _getaddrinfo
            sys.addaudithook(_hook)
            _hooked = True
        _export(allow_list)


def installed() -> AllowList | None:
    """The allow-list guarding this process, or None when there is no guard."""
    rules = _rules
    return None if rules is None else rules.allow


def report_to_parent(destination: str) -> None:
    """A child's refusal: logged once per destination, and sent to the serving process (one
    datagram to its `EGRESS_REPORT` socket; it counts and audits it)."""
    if destination not in _told and len(_told) < 256:
        _told.add(destination)
        _log.warning("egress refused in child process %d: %s", os.getpid(), destination)
    address = os.environ.get(env.EGRESS_REPORT)
    if address:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(destination.encode("utf-8", "replace")[:512], "\0" + address)
