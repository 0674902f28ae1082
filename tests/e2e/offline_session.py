"""Run inside a network namespace with only loopback (see test_offline_namespace.py): prove
there is no route out, then serve, chat, embed, stop and export the audit log; print what
happened as one JSON line (counts and ids only: no prompt or completion text)."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import openai
from server_process import ok, start_server, stop_and_check

CHAT = "gemma-3-270m"
EMBEDDER = "all-minilm-l6-v2"
OUTSIDE = ("192.0.2.1", 9)  # TEST-NET-1: never routable, and no route at all in here


def outside_errno() -> int | None:
    """None if a TCP connection outside could be made; otherwise the errno it failed with."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        try:
            sock.connect(OUTSIDE)
        except OSError as exc:
            return exc.errno
    return None


def main(data_dir: Path, log_path: Path, export_path: Path) -> None:
    unreachable = outside_errno()
    server = start_server(data_dir, log_path)
    try:
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key())
        chat = client.chat.completions.create(
            model=CHAT, messages=[{"role": "user", "content": "Name a colour."}]
        )
        vectors = client.embeddings.create(model=EMBEDDER, input="a sentence, offline")
    finally:
        stop_and_check(server)
    ok("audit", "export", "--data-dir", data_dir, "--output", export_path)
    assert chat.usage is not None
    print(
        json.dumps(
            {
                "outside_errno": unreachable,
                "chat_finish": chat.choices[0].finish_reason,
                "chat_prompt_tokens": chat.usage.prompt_tokens,
                "embedding_dims": len(vectors.data[0].embedding),
            }
        )
    )


if __name__ == "__main__":
    main(*(Path(arg) for arg in sys.argv[1:4]))
