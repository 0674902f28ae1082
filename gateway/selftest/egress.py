"""The egress check: the guard `serve` installs refuses what the allow-list does not name.

It installs the guard with the configured allow-list (as `serve` does; it stays installed for
the checks after it, which then reach their services through it), then:
- connects to 192.0.2.1:9 (TEST-NET-1, RFC 5737: never routed), which must be refused by the
  guard (`EgressDenied`) before any packet leaves;
- checks the offline variables (`env.OFFLINE`: no Hugging Face downloads, no usage reports)
  are set as `serve` sets them for its engines;
- starts a child Python, as vLLM's engine core is started, which must be guarded too.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from .. import env
from ..config import Settings
from ..egress import EgressDenied, allow_list_from, install, installed
from .result import Finding, failed, passed

__all__ = ["PROBE", "check_egress"]

PROBE = ("192.0.2.1", 9)  # TEST-NET-1: documentation only, never routed
_CONNECT_TIMEOUT_S = 2.0
_CHILD_TIMEOUT_S = 60.0
# the child: 0 when the guard refused, 1 when the connect went through, 2 when the network
# (not the guard) failed it
_CHILD = f"""
import socket, sys
try:
    socket.create_connection({PROBE!r}, timeout={_CONNECT_TIMEOUT_S})
except ConnectionRefusedError as exc:
    sys.exit(0 if type(exc).__name__ == "EgressDenied" else 2)
except OSError:
    sys.exit(2)
sys.exit(1)
"""


def _probe_here() -> str | None:
    try:
        with socket.create_connection(PROBE, timeout=_CONNECT_TIMEOUT_S):
            pass
    except EgressDenied:
        return None
    except OSError as exc:
        return (
            f"the guard let a connection to {PROBE[0]}:{PROBE[1]} reach the network (where it "
            f"failed: {type(exc).__name__})"
        )
    return f"a connection to {PROBE[0]}:{PROBE[1]} went through: nothing guards this process"


def _probe_child() -> str | None:
    try:
        child = subprocess.run(
            [sys.executable, "-c", _CHILD],
            env=dict(os.environ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=_CHILD_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"a child process could not be started to check its guard ({type(exc).__name__})"
    if child.returncode == 0:
        return None
    return (
        f"a child process (as vLLM's engine core) is not guarded: its connection to "
        f"{PROBE[0]}:{PROBE[1]} was not refused by the guard (exit {child.returncode})"
    )


def check_egress(settings: Settings) -> Finding:
    if not settings.egress.enabled:
        return failed(
            "the egress guard is off ([egress] enabled = false): nothing stops a connection "
            "out of the air gap; remove that setting"
        )
    allow = installed()
    if allow is None:
        allow = allow_list_from(settings)
        install(allow)
    problems = [p for p in (_probe_here(),) if p]
    for name, value in env.OFFLINE.items():
        if os.environ.get(name) != value:
            problems.append(f"${name} is {os.environ.get(name)!r}, not {value!r}: unset it")
    if child := _probe_child():
        problems.append(child)
    if problems:
        return failed("; ".join(problems))
    return passed(
        f"{PROBE[0]}:{PROBE[1]} refused here and in a child process; offline variables set; "
        f"allowed: {allow}"
    )
