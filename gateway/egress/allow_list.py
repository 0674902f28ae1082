"""The egress allow-list: where this process and its children may connect.

    Endpoint             one allowed destination: a DNS name, an IP address or a CIDR network,
                         with one port or every port
    AllowList            immutable; loopback (and AF_UNIX) is always allowed on top of it
    parse_entry(text)    one `[egress] allow` entry: "host:port", "host", "10.0.0.0/8:443",
                         "[2001:db8::1]:443", "[2001:db8::/32]"
    allow_list_from(s)   every endpoint a Settings names (Redis, PostgreSQL, KMS, OTLP, syslog
                         witness) plus `[egress] allow`

Standard library only at import: the engine-core child imports this before anything else.
"""

from __future__ import annotations

import ipaddress
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    from ..config import Settings

__all__ = ["AllowList", "Endpoint", "allow_list_from", "parse_entry"]

_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_NAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")
_DEFAULT_PORTS = {
    "http": 80,
    "https": 443,
    "redis": 6379,
    "rediss": 6379,
    "postgresql": 5432,
    "postgres": 5432,
}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One allowed destination.  `host` is a lower-case DNS name, an IP address or a CIDR
    network (normalised); `port` None allows every port."""

    host: str
    port: int | None = None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"

    @property
    def kind(self) -> str:
        """ "name", "address" or "network"."""
        if "/" in self.host:
            return "network"
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            return "name"
        return "address"


@dataclass(frozen=True, slots=True)
class AllowList:
    """Where connections may go besides loopback: an immutable, ordered set of endpoints."""

    endpoints: tuple[Endpoint, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "endpoints", tuple(dict.fromkeys(self.endpoints)))

    def __str__(self) -> str:
        return ", ".join(["loopback", *map(str, self.endpoints)])

    def encode(self) -> str:
        """The list as one line of text (the child processes' environment variable)."""
        return json.dumps([str(e) for e in self.endpoints], separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> AllowList:
        """The list `encode` wrote; ValueError when it is not one."""
        entries = json.loads(text)
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            raise ValueError("an encoded allow-list is a JSON list of strings")
        return cls(tuple(parse_entry(e) for e in entries))


def _port(text: str, entry: str) -> int | None:
    if text in ("", "*"):
        return None
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise ValueError(f"egress entry {entry!r}: the port must be 1-65535 or *")
    return int(text)


def _host(text: str, entry: str) -> str:
    try:
        if "/" in text:
            return str(ipaddress.ip_network(text, strict=False))
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    name = text.lower().rstrip(".")
    if not _NAME.match(name):
        raise ValueError(
            f"egress entry {entry!r}: not a host name, an IP address or a CIDR network"
        )
    return name


def parse_entry(text: str) -> Endpoint:
    """One allow-list entry; ValueError naming the entry when it is not one."""
    entry = text.strip()
    if entry.startswith("["):  # [IPv6] or [IPv6]:port or [IPv6/len]:port
        host, bracket, rest = entry[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"egress entry {text!r}: expected [IPv6 address]:port")
        return Endpoint(_host(host, text), _port(rest[1:], text))
    if entry.count(":") > 1:  # a bare IPv6 address or network: every port
        return Endpoint(_host(entry, text))
    host, _, port = entry.partition(":")
    if not host:
        raise ValueError(f"egress entry {text!r}: no host")
    return Endpoint(_host(host, text), _port(port, text))


def _url(url: str, default_port: int | None = None) -> list[Endpoint]:
    """The endpoint a URL connects to (none for a unix socket or a URL without a host)."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+")[0].lower()
    if not parts.hostname:
        return []
    port = parts.port or _DEFAULT_PORTS.get(scheme, default_port)
    return [parse_entry(str(Endpoint(parts.hostname.lower(), port)))]


def _database(url: str) -> list[Endpoint]:
    """PostgreSQL's host (and every `?host=` a multi-host URL names); SQLite connects nowhere."""
    if not url or url.startswith("sqlite"):
        return []
    out = _url(url, 5432)
    for value in parse_qs(urlsplit(url).query).get("host", []):
        for item in value.split(","):
            if item and not item.startswith("/"):  # a directory: the unix socket
                host, _, port = item.partition(":")
                out.append(parse_entry(f"{host}:{port or 5432}"))
    return out


def allow_list_from(settings: Settings) -> AllowList:
    """Every endpoint `settings` configures, then `[egress] allow`.  Loopback is always allowed
    by the guard and not listed."""
    found: list[Endpoint] = []
    if settings.limits.redis_url:
        found += _url(settings.limits.redis_url, 6379)
    found += _database(settings.audit.database_url)
    kms = settings.kms
    if kms.vault_transit is not None:
        found += _url(kms.vault_transit.address, 8200)
    if kms.aws_kms is not None:
        aws = kms.aws_kms
        found += (
            _url(aws.endpoint_url, 443)
            if aws.endpoint_url
            else [parse_entry(f"kms.{aws.region}.amazonaws.com:443")]
        )
    if settings.telemetry.otlp_endpoint:
        found += _url(settings.telemetry.otlp_endpoint, 4318)
    if settings.audit.witness_syslog.startswith(("udp://", "tcp://")):
        found += _url(settings.audit.witness_syslog)
    found += [parse_entry(e) for e in settings.egress.allow]
    return AllowList(tuple(found))
