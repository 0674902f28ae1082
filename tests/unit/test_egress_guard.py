"""The egress guard: the allow-list a configuration implies, and the guard refusing what is not
on it.  Audit hooks are permanent, so everything that installs the guard runs in a child
Python (`_run`); the pytest process is never guarded."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gateway.config import ConfigError, Settings, load_settings
from gateway.egress import AllowList, Endpoint, allow_list_from, parse_entry
from gateway.egress.denials import Denials, _split
from gateway.egress.guard import _Rules

ROOT = Path(__file__).resolve().parents[2]
EXIT_DEADLINE_S = 120.0  # the child must exit by itself; past this it hangs

CONFIG = """
[limits]
redis_url = "redis://:secret@198.51.100.7:6380/2"
[audit]
database_url = "postgresql://u:p@db.example.internal/airgate?host=pg2.example.internal:5433"
witness_syslog = "udp://198.51.100.9:514"
[telemetry]
otlp_endpoint = "https://otel.example.internal/v1/traces"
[kms.vault_transit]
address = "https://[2001:db8::7]:8200"
[kms.aws_kms]
region = "eu-west-1"
endpoint_url = "https://vpce-1.kms.eu-west-1.vpce.amazonaws.com"
[egress]
allow = ["10.0.0.0/8:443", "[2001:db8::1]:80", "Example.ORG.", "198.51.100.20"]
"""


def _settings(tmp_path: Path, text: str = CONFIG) -> Settings:
    path = tmp_path / "airgate.toml"
    path.write_text(text)
    return load_settings(path, environ={})


def test_every_configured_endpoint_is_on_the_list(tmp_path: Path) -> None:
    allow = allow_list_from(_settings(tmp_path))
    assert [str(e) for e in allow.endpoints] == [
        "198.51.100.7:6380",  # Redis (never its password)
        "db.example.internal:5432",  # PostgreSQL, default port
        "pg2.example.internal:5433",  # ... and the second host of a multi-host URL
        "[2001:db8::7]:8200",  # Vault / OpenBao
        "vpce-1.kms.eu-west-1.vpce.amazonaws.com:443",  # AWS KMS endpoint_url
        "otel.example.internal:443",  # OTLP collector
        "198.51.100.9:514",  # syslog witness
        "10.0.0.0/8:443",
        "[2001:db8::1]:80",
        "example.org",
        "198.51.100.20",
    ]
    assert "secret" not in allow.encode()
    assert AllowList.decode(allow.encode()) == allow


def test_defaults_list_nothing_and_aws_without_endpoint_is_its_region(tmp_path: Path) -> None:
    assert allow_list_from(_settings(tmp_path, "")).endpoints == ()
    settings = _settings(tmp_path, '[kms.aws_kms]\nregion = "eu-west-1"\n[limits]\n'
                         'redis_url = "unix:///run/redis.sock"\n')  # fmt: skip
    assert [str(e) for e in allow_list_from(settings).endpoints] == [
        "kms.eu-west-1.amazonaws.com:443"
    ]


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ("host.example:8080", Endpoint("host.example", 8080)),
        ("HOST.example.", Endpoint("host.example", None)),
        ("10.1.0.0/16", Endpoint("10.1.0.0/16", None)),
        ("10.1.2.3/16:443", Endpoint("10.1.0.0/16", 443)),
        ("[2001:db8::/32]:443", Endpoint("2001:db8::/32", 443)),
        ("2001:db8::1", Endpoint("2001:db8::1", None)),
        ("198.51.100.1:*", Endpoint("198.51.100.1", None)),
    ],
)
def test_entries(entry: str, expected: Endpoint) -> None:
    assert parse_entry(entry) == expected


@pytest.mark.parametrize("entry", ["", ":80", "host:0", "host:99999", "host:http", "a b", "[::1"])
def test_bad_entries_stop_start_up_naming_the_entry(tmp_path: Path, entry: str) -> None:
    with pytest.raises(ConfigError, match="egress"):
        _settings(tmp_path, f"[egress]\nallow = [{json.dumps(entry)}]\n")


def test_rules_decide_by_address_port_network_and_name() -> None:
    rules = _Rules(
        AllowList(tuple(map(parse_entry, ["198.51.100.7:6379", "10.0.0.0/8:443", "db.internal"])))
    )
    allowed = [("127.0.0.1", 9), ("127.8.9.1", 1), ("::1", 9), ("::ffff:127.0.0.1", 9),
               ("0.0.0.0", 9), ("198.51.100.7", 6379), ("10.2.3.4", 443), ("localhost", 80),
               ("db.internal", 5432), ("DB.internal.", 1)]  # fmt: skip
    refused = [("192.0.2.1", 9), ("198.51.100.7", 6380), ("10.2.3.4", 80), ("8.8.8.8", 80),
               ("2001:4860:4860::8888", 80), ("other.internal", 5432)]  # fmt: skip
    assert [a for a in allowed if not rules.address_allowed(*a)] == []
    assert [r for r in refused if rules.address_allowed(*r)] == []
    assert rules.lookup_allowed("db.internal") and rules.lookup_allowed("localhost")
    assert rules.lookup_allowed("192.0.2.1")  # numeric: no DNS; the connect is checked
    assert not rules.lookup_allowed("evil.example.com")
    rules.learn("db.internal", [(2, 1, 6, "", ("192.0.2.44", 5432))])  # resolved: allowed too
    assert rules.address_allowed("192.0.2.44", 5432)
    rules.learn("evil.example.com", [(2, 1, 6, "", ("192.0.2.45", 80))])  # not an allowed name
    assert not rules.address_allowed("192.0.2.45", 80)


def test_destinations_become_audit_identifiers() -> None:
    assert _split("192.0.2.1:9") == ("192.0.2.1", 9)
    assert _split("[2001:db8::1]:443") == ("2001:db8::1", 443)
    assert _split("evil.example.com:80") == ("evil.example.com", 80)
    assert _split("family 17 address (1, 2)") == ("unprintable", None)


def test_denials_count_by_process_before_any_audit_log() -> None:
    denials = Denials()
    denials.denied("192.0.2.1:9")
    denials.denied("192.0.2.1:9", "child")
    assert denials.counts() == {"gateway": 1.0, "child": 1.0}


def _run(script: str, tmp_path: Path) -> dict[str, object]:
    """Run `script` in a fresh Python (from a file: a spawned child imports its main module);
    it prints one JSON object last."""
    path = tmp_path / "guarded.py"
    path.write_text(textwrap.dedent(script))
    done = subprocess.run(
        [sys.executable, str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=EXIT_DEADLINE_S,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return result


GUARDED = f"""
import asyncio, json, os, socket, sys
from gateway.config import load_settings
from gateway.egress import EgressDenied, allow_list_from, install, installed
from pathlib import Path
path = Path(__file__).with_name("airgate.toml")
path.write_text({CONFIG!r})
settings = load_settings(path, environ={{}})
denied = []
install(allow_list_from(settings), on_denied=denied.append)
out = {{"installed": str(installed())}}

def attempt(name, call):
    try:
        call()
        out[name] = "passed"
    except EgressDenied as exc:
        out[name] = "denied"
        assert exc.destination in str(exc)
    except OSError as exc:  # the guard let it through; the network said no
        out[name] = "passed"

def connect(addr, family=socket.AF_INET):
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setblocking(False)  # no waiting: the guard decides before the kernel is asked
        s.connect_ex(addr)
"""


def test_the_guard_refuses_outside_and_allows_loopback_and_configured_endpoints(
    tmp_path: Path,
) -> None:
    out = _run(
        GUARDED
        + """
attempt("test_net", lambda: connect(("192.0.2.1", 9)))
attempt("redis_wrong_port", lambda: connect(("198.51.100.7", 6379)))
attempt("redis", lambda: connect(("198.51.100.7", 6380)))
attempt("syslog_udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(
    b"x", ("198.51.100.9", 514)))
attempt("udp_elsewhere", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(
    b"x", ("192.0.2.1", 514)))
attempt("vault_v6", lambda: connect(("2001:db8::7", 8200), socket.AF_INET6))
attempt("network", lambda: connect(("10.20.30.40", 443)))
attempt("extra_address_any_port", lambda: connect(("198.51.100.20", 12345)))
attempt("lookup_unknown", lambda: socket.getaddrinfo("unconfigured.example.com", 443))
attempt("lookup_gethostbyname", lambda: socket.gethostbyname("unconfigured.example.com"))
attempt("lookup_localhost", lambda: socket.getaddrinfo("localhost", 80))

server = socket.create_server(("127.0.0.1", 0))
with socket.create_connection(server.getsockname()) as c:  # loopback, for real
    out["loopback"] = "passed"

import httpx
try:
    httpx.get("http://192.0.2.1/", timeout=30)
except httpx.ConnectError as exc:  # how a client library sees the refusal
    out["httpx"] = "denied" if "egress" in str(exc) else str(exc)

import uvloop  # the server's loop connects in libuv, outside the audit hook
async def main():
    for name, host in (("uvloop_test_net", "192.0.2.1"), ("uvloop_unknown", "x.example.com")):
        try:
            await asyncio.open_connection(host, 9)
            out[name] = "passed"
        except EgressDenied:
            out[name] = "denied"
    r, w = await asyncio.open_connection(*server.getsockname())
    w.close()
    out["uvloop_loopback"] = "passed"
uvloop.run(main())
out["reported"] = denied
print(json.dumps(out))
""",
        tmp_path,
    )
    assert str(out.pop("installed")).startswith("loopback, 198.51.100.7:6380")
    reported = out.pop("reported")
    assert out == {
        "test_net": "denied",
        "redis_wrong_port": "denied",
        "redis": "passed",
        "syslog_udp": "passed",
        "udp_elsewhere": "denied",
        "vault_v6": "passed",
        "network": "passed",
        "extra_address_any_port": "passed",
        "lookup_unknown": "denied",
        "lookup_gethostbyname": "denied",
        "lookup_localhost": "passed",
        "loopback": "passed",
        "httpx": "denied",
        "uvloop_test_net": "denied",
        "uvloop_unknown": "denied",
        "uvloop_loopback": "passed",
    }
    assert reported == [
        "192.0.2.1:9",
        "198.51.100.7:6379",
        "192.0.2.1:514",
        "unconfigured.example.com:443",
        "unconfigured.example.com",
        "192.0.2.1:80",
        "192.0.2.1:9",
        "x.example.com:9",
    ]


def test_children_are_guarded_whatever_their_start_method_and_report_to_the_parent(
    tmp_path: Path,
) -> None:
    """vLLM starts its engine core with multiprocessing ("spawn" on CPUs and once CUDA is up,
    else "fork"): a spawned child gets the guard from `_site/sitecustomize.py` before its first
    line, a forked one inherits the hook; both report refusals to the parent's socket."""
    out = _run(
        """
import json, multiprocessing, os, socket, threading
from gateway import env
from gateway.egress import AllowList, EgressDenied, install, parse_entry
from gateway.egress.denials import DENIALS

def probe(queue):
    import sys
    env_ok = all(os.environ.get(k) == "1" for k in env.OFFLINE)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
            queue.put(("connected", env_ok))
        except EgressDenied:
            queue.put(("denied", env_ok))

if __name__ == "__main__":
    os.environ[env.EGRESS_REPORT] = DENIALS.listen()
    install(AllowList((parse_entry("198.51.100.7:6379"),)), on_denied=DENIALS.denied)
    heard = threading.Event()
    original = DENIALS.denied
    def denied(destination, process="gateway"):
        original(destination, process)
        if DENIALS.counts()["child"] >= 3:
            heard.set()
    DENIALS.denied = denied
    out = {}
    for method in ("spawn", "fork", "forkserver"):
        ctx = multiprocessing.get_context(method)
        queue = ctx.Queue()
        child = ctx.Process(target=probe, args=(queue,))
        child.start()
        out[method] = queue.get(timeout=60)  # a bound for a broken child, not a pause
        child.join()
    heard.wait(60)  # the datagrams are in the socket's queue already; a bound, not a pause
    out["counts"] = DENIALS.counts()
    print(json.dumps(out))
""",
        tmp_path,
    )
    assert out == {
        "spawn": ["denied", True],
        "fork": ["denied", True],
        "forkserver": ["denied", True],
        "counts": {"gateway": 0.0, "child": 3.0},
    }
