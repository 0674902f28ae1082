"""HAProxy in front of airgate replicas (``bench/replica_servers.py``): its configuration, its
process, and what it counts UP.

HAProxy (Debian's ``haproxy``, installed by ``scripts/test-services.sh``) runs in the foreground
(``-db``) with ``balance leastconn`` and health checks on ``GET /ready`` every 500 ms (2 to fall,
2 to rise). It retries a request (``retries 2``, each time on another replica: ``option
redispatch 1``) only where no answer was given: a connection that could not be made, and a 503,
which airgate answers before any work (not ready, draining, limits or the audit log unavailable)
or, in strict mode, instead of a finished answer the log could not record (a retry then repeats
that work, never an answer). Never ``empty-response``: a POST whose connection broke may have
run and been answered in part, and a crash would run every such request twice.

It adds ``x-served-by: <replica>`` to every response (HAProxy's own 502/503 included, empty when
no replica was chosen), and its stats socket says which replicas it counts UP.
"""

from __future__ import annotations

import contextlib
import csv
import socket
import subprocess
import uuid
from collections.abc import Sequence
from pathlib import Path

from bench._client import BenchError
from bench._serve import free_port, stop, tail
from bench.replica_servers import POLL_S, Replica, Watched, wait_for

__all__ = ["CHECK_INTER_MS", "HAProxy", "haproxy_config"]

CHECK_INTER_MS = 500  # the health-check interval; 2 failures mark DOWN, 2 successes UP

_HAPROXY = """\
global
    maxconn 4096
    stats socket {socket} mode 600 level admin
    log stdout format raw local0 info

defaults
    mode http
    log global
    option httplog
    timeout connect 1s
    timeout client 120s
    timeout server 120s
    timeout queue 10s
    timeout http-request 10s
    timeout http-keep-alive 10s
    timeout check 1s
    retries 2
    option redispatch 1
    # a connection never made, or airgate's 503 (no answer given; see the module docstring):
    # safe to send elsewhere.  Not empty-response: a POST whose connection broke may have run.
    retry-on conn-failure 503
    # a 503 can only be retried from a copy of the whole request: wait for the body first
    option http-buffer-request

frontend airgate
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance leastconn
    option httpchk GET /ready
    http-check expect status 200
    default-server inter {inter}ms fastinter {inter}ms downinter {inter}ms fall 2 rise 2
    http-after-response set-header x-served-by %[srv_name]
{servers}
"""


def haproxy_config(port: int, socket_path: Path, servers: Sequence[tuple[str, int]]) -> str:
    """HAProxy's configuration: the frontend on ``port``, one server line per replica."""
    lines = "\n".join(f"    server {name} 127.0.0.1:{p} check" for name, p in servers)
    return _HAPROXY.format(socket=socket_path, port=port, inter=CHECK_INTER_MS, servers=lines)


class HAProxy:
    """``haproxy -f <cfg> -db`` in front of ``replicas``; its log beside its config."""

    def __init__(self, work: Path, replicas: Sequence[Replica]) -> None:
        work.mkdir(parents=True, exist_ok=True)
        self.replicas = list(replicas)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # a Unix socket path must fit in 108 bytes: keep it short, outside deep tmp dirs
        self.socket_path = Path(f"/tmp/airgate-haproxy-{uuid.uuid4().hex[:12]}.sock")
        self.config = work / "haproxy.cfg"
        self.log_path = work / "haproxy.log"
        servers = [(r.name, r.port) for r in replicas]
        self.config.write_text(haproxy_config(self.port, self.socket_path, servers))
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return ["haproxy", "-f", str(self.config), "-db"]

    def check_config(self) -> None:
        """``haproxy -c``: the configuration parses (nothing is started)."""
        done = subprocess.run(
            ["haproxy", "-c", "-f", str(self.config)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise BenchError(f"haproxy refuses {self.config}: {done.stdout}{done.stderr}")

    def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def died(self) -> str | None:
        if self.process is None:
            return "haproxy was never started"
        code = self.process.poll()
        if code is None:
            return None
        return f"haproxy exited with {code}; log tail:\n{tail(self.log_path, 30)}"

    def pause(self) -> None:
        if self.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=POLL_S)

    def _stats(self) -> list[dict[str, str]]:
        """``show stat`` on the stats socket, one dict per row; [] when it does not answer."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(2.0)
                sock.connect(str(self.socket_path))
                sock.sendall(b"show stat\n")
                chunks = []
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
        except OSError:
            return []
        text = b"".join(chunks).decode().removeprefix("# ")
        return list(csv.DictReader(text.splitlines()))

    def states(self) -> dict[str, str]:
        """Each replica's status as HAProxy counts it (``UP``, ``DOWN``, ``UP 1/2`` (going
        down), ``DOWN 1/2`` (coming up), ...); {} when the stats socket does not answer yet."""
        return {
            row["svname"]: row["status"]
            for row in self._stats()
            if row.get("pxname") == "replicas" and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def wait_status(self, name: str, status: str, deadline_s: float = 30.0) -> None:
        """Poll until HAProxy counts replica ``name`` exactly ``status`` (``UP``/``DOWN``)."""
        watched: list[Watched] = [self]
        watched += [r for r in self.replicas if r.name == name and status == "UP"]
        wait_for(lambda: self.states().get(name) == status,
                 f"haproxy: {name} {status}", deadline_s, watched)  # fmt: skip

    def wait_serving(self, deadline_s: float = 30.0) -> None:
        """Until the frontend is open (bound: HAProxy binds before it serves its stats socket)
        and every running replica is UP."""

        def open_() -> bool:
            rows = self._stats()
            return any(r["pxname"] == "airgate" and r["status"] == "OPEN" for r in rows)

        wait_for(open_, "haproxy: frontend open", deadline_s, [self])
        for replica in self.replicas:
            if replica.running:
                self.wait_status(replica.name, "UP", deadline_s)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            stop(self.process)
        self.socket_path.unlink(missing_ok=True)
