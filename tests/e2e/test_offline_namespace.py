"""The whole path with no network at all: inside a network namespace that holds only loopback
(`unshare --net`, as root), `airgate serve` starts on the sealed default models, answers a chat
(the openai client's defaults: no max_tokens) and an embedding, and `airgate audit export`
writes their events.  The session itself runs in the namespace (tests/e2e/offline_session.py);
this test checks what it reports and what it exported."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

from server_process import clean_env, seed_data_dir

SESSION = Path(__file__).with_name("offline_session.py")


def test_serve_chat_embed_and_export_with_only_loopback(model_dir: Path, tmp_path: Path) -> None:
    data_dir = seed_data_dir(tmp_path / "data", model_dir)
    export = tmp_path / "events.jsonl"
    result = subprocess.run(
        [
            *("unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"),
            *(
                sys.executable,
                str(SESSION),
                str(data_dir),
                str(tmp_path / "serve.log"),
                str(export),
            ),
        ],
        env=clean_env(),
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["outside_errno"] == errno.ENETUNREACH  # really no network in there
    assert report["chat_finish"] in {"stop", "length"}
    assert report["chat_prompt_tokens"] > 0
    assert report["embedding_dims"] == 384

    events = [json.loads(line)["event"] for line in export.read_text().splitlines()]
    completed = {
        e["kind"]: e["model"]
        for e in events
        if e["kind"] in {"inference.completed", "embedding.completed"}
    }
    assert completed == {
        "inference.completed": "gemma-3-270m",
        "embedding.completed": "all-minilm-l6-v2",
    }
    assert all(e["outcome"] == "success" for e in events if e["kind"].endswith(".completed"))
