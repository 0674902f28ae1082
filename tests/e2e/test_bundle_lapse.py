"""A laptop that never checks in: a running `airgate serve` stops serving an imported bundle
the moment its offline window ends, with no restart.  The real Gemma GGUF is sealed "at HQ"
with a window that ends a minute after the test begins, imported (`airgate bundle import`) and
served; the OpenAI SDK's requests succeed until the window's end and are refused from then on
with 403 `model_expired` (audited as a policy denial), while the other models go on.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import openai
import pytest
from server_process import NO_END, ok, seed_data_dir, start_server, stop_and_check

from bundles import (
    LocalKeyProvider,
    ModelInfo,
    create_signing_key,
    load_signing_key,
    seal_bundle,
    sources_from_path,
)

pytestmark = pytest.mark.e2e

WINDOW_S = 60  # from sealing to the window's end: the server starts and answers well within it
HELLO = [{"role": "user", "content": "Reply with one word: hello."}]
BRIEF = ModelInfo(
    name="hq-brief",
    version="q4_k_m",
    architecture="gemma3",
    weight_format="gguf",
    quantisation="Q4_K_M",
    chat_template="gemma",
)


def audit_events(data_dir: Path) -> list[dict[str, Any]]:
    db = data_dir / "airgate.db"
    with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        rows = conn.execute("SELECT body FROM audit_events ORDER BY seq").fetchall()
    return [json.loads(row[0]) for row in rows]


def test_a_running_server_stops_serving_a_bundle_when_its_window_ends(
    tmp_path: Path, model_dir: Path, gguf_path: Path
) -> None:
    data = seed_data_dir(tmp_path / "data", model_dir)
    create_signing_key(tmp_path / "hq" / "signing.key")
    config = tmp_path / "airgate.toml"
    config.write_text(
        '[[models]]\nid = "echo"\nengine = "echo"\n\n'
        f"[bundles]\ntrusted_keys = {json.dumps([str(tmp_path / 'hq' / 'signing.key.pub')])}\n"
    )
    # sealed as if a day ago, for one offline day: the window ends WINDOW_S from now
    ends = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=WINDOW_S)
    bundle = tmp_path / "hq" / "brief.bundle"
    seal_bundle(
        sources_from_path(gguf_path),
        bundle,
        model=BRIEF,
        recipients=["local:default"],
        providers={"local": LocalKeyProvider(data / "keys" / "kms-local.json")},
        signing_key=load_signing_key(tmp_path / "hq" / "signing.key"),
        now=ends - timedelta(days=1),
        max_offline_days=1,
    )
    ok("bundle", "import", bundle, "--config", config, "--data-dir", data)

    server = start_server(data, tmp_path / "serve.log", {"AIRGATE_CONFIG": str(config)})
    try:
        with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key()) as client:
            served = 0
            while True:  # served up to the window's end, refused from it on
                asked = datetime.now(UTC)
                try:
                    reply = client.chat.completions.create(
                        model="hq-brief", messages=HELLO, max_tokens=2, logit_bias=NO_END
                    )
                except openai.PermissionDeniedError as exc:
                    refused = exc
                    break
                assert asked < ends, f"still served at {asked:%H:%M:%S}, after {ends:%H:%M:%S}"
                assert reply.usage and reply.usage.completion_tokens == 2
                served += 1
                time.sleep(0.5)  # a request every half second while the window is open
            assert datetime.now(UTC) >= ends, "refused before the window's end"
            assert served >= 1  # it was served before
            assert refused.status_code == 403 and refused.code == "model_expired"
            assert "airgate bundle renew" in refused.message
            assert "hq-brief" not in refused.message  # no client text echoed back
            again = client.chat.completions.create(model="echo", messages=HELLO, max_tokens=2)
            assert again.choices[0].message.content  # the other models go on
    finally:
        stop_and_check(server)
    denied = [
        e
        for e in audit_events(data)
        if e["kind"] == "policy.denied" and e.get("decision") == "model_expired"
    ]
    assert len(denied) == 1 and denied[0]["model"] == "hq-brief", denied
