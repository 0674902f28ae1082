"""An ASGI app served by uvicorn on a free loopback port, in a thread of the test process.

For integration tests that need real HTTP (streams the client can abandon, concurrent clients)
while keeping in-process access to the app's engines.  Start-up and shutdown are waited for as
conditions (uvicorn's own `started` flag, the thread's end), never by sleeping.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import uvicorn

__all__ = ["serve_in_thread"]

_DEADLINE_S = 300.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@contextlib.contextmanager
def serve_in_thread(app: Any, *, ready_path: str = "/ready") -> Iterator[str]:
    """Serve `app`; yields its base URL once `ready_path` answers 200."""
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, lifespan="on", log_config=None, access_log=False
        )
    )
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    try:
        with httpx.Client(base_url=base, timeout=5.0) as client:
            done = threading.Event()
            for _ in range(int(_DEADLINE_S / 0.05)):
                if not thread.is_alive():
                    raise RuntimeError("the server stopped during start-up")
                if server.started:
                    with contextlib.suppress(httpx.HTTPError):
                        if client.get(ready_path).status_code == 200:
                            done.set()
                            break
                thread.join(0.05)  # a bounded wait on the server thread itself
            if not done.is_set():
                raise RuntimeError("the server did not become ready")
        yield base
    finally:
        server.should_exit = True
        thread.join(60)
