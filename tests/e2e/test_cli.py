"""The `airgate` command and the process it runs: help, configuration errors, data-dir locking,
readiness, metrics, and a client that goes away mid-stream."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import pytest
from server_process import (
    MODEL,
    NO_END,
    Server,
    free_port,
    run_cli,
    serve_command,
    start_server,
    stop_and_check,
)

pytestmark = pytest.mark.e2e

AIRGATE = Path(sys.executable).with_name("airgate")


def metric_samples(text: str) -> dict[str, float]:
    """`name{labels}` -> value, from the Prometheus text exposition."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def metric(samples: dict[str, float], name: str) -> float:
    """The sum over every series of `name` (0 when it has none yet)."""
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def scrape(server: Server) -> dict[str, float]:
    response = httpx.get(f"{server.base_url}/metrics", headers=server.auth(), timeout=30)
    assert response.status_code == 200
    return metric_samples(response.text)


# ---- the command line ------------------------------------------------------------------------


def test_help_documents_serve() -> None:
    assert AIRGATE.exists(), f"console script missing: {AIRGATE}"
    top = run_cli([str(AIRGATE), "--help"])
    assert top.returncode == 0, top.stderr
    assert "serve" in top.stdout
    serve = run_cli([str(AIRGATE), "serve", "--help"])
    assert serve.returncode == 0, serve.stderr
    for option in ("--config", "--host", "--port", "--data-dir"):
        assert option in serve.stdout, option


@pytest.mark.parametrize(
    ("config", "env", "needle"),
    [
        ("[server]\nprot = 1\n", {}, "server.prot"),
        ("", {"AIRGATE_FOO": "1"}, "AIRGATE_FOO"),
        ("", {"AIRGATE_SERVER__PROT": "1"}, "server.prot"),
        ("[engine]\nslots = 0\n", {}, "engine.slots"),
    ],
    ids=["unknown_key_in_file", "unknown_env_var", "unknown_key_in_env", "bad_value_in_file"],
)
def test_bad_configuration_stops_serve(
    tmp_path: Path, config: str, env: dict[str, str], needle: str
) -> None:
    args = serve_command(free_port(), tmp_path / "data")
    if config:
        path = tmp_path / "airgate.toml"
        path.write_text(config)
        args += ["--config", str(path)]
    result = run_cli(args, env)
    assert result.returncode != 0
    assert needle in result.stderr
    assert "Uvicorn running" not in result.stderr + result.stdout


def test_second_server_on_the_same_data_dir_is_refused(server: Server) -> None:
    result = run_cli(serve_command(free_port(), server.data_dir))
    assert result.returncode != 0
    assert "in use" in result.stderr
    assert str(server.data_dir) in result.stderr
    assert server.ready_status() == 200  # the first one is untouched


def test_two_servers_side_by_side(server: Server, seeded_data_dir: Path, tmp_path: Path) -> None:
    other = start_server(seeded_data_dir, tmp_path / "other.log", {"AIRGATE_ENGINE__SLOTS": "2"})
    try:
        assert other.port != server.port
        request = {
            "model": MODEL,
            "prompt": "The tallest mountain is",
            "max_tokens": 6,
            "temperature": 0,
        }
        texts = []
        for srv in (server, other):
            models = httpx.get(f"{srv.base_url}/v1/models", headers=srv.auth(), timeout=30)
            assert models.status_code == 200
            assert MODEL in [m["id"] for m in models.json()["data"]]
            completion = httpx.post(
                f"{srv.base_url}/v1/completions", json=request, headers=srv.auth(), timeout=120
            )
            assert completion.status_code == 200
            texts.append(completion.json()["choices"][0]["text"])
        assert texts[0] == texts[1]
    finally:
        stop_and_check(other)


def is_ready_line(record: dict[str, object], status: int) -> bool:
    return record.get("path") == "/ready" and record.get("status") == status


def test_ready_only_after_the_model_is_loaded(seeded_data_dir: Path, tmp_path: Path) -> None:
    srv = Server.spawn(seeded_data_dir, tmp_path / "server.log")
    try:
        seen: list[int] = []

        def ready() -> bool:
            try:
                health = httpx.get(f"{srv.base_url}/health", timeout=30)
                response = httpx.get(f"{srv.base_url}/ready", timeout=30)
            except httpx.TransportError:
                return False  # not listening yet
            assert health.status_code == 200
            assert health.json() == {"status": "ok"}
            seen.append(response.status_code)
            if response.status_code == 503:
                assert response.headers["retry-after"]
                assert response.json()["error"]["code"] == "service_unavailable"
            return response.status_code == 200

        srv.wait_until(ready, "GET /ready == 200", deadline_s=180)
        assert set(seen) <= {200, 503}
        assert seen[-1] == 200 and seen.count(200) == 1

        # The log is written in order: the engine had loaded and the registry had said so
        # ("ready: serving ...", logged as it flips) before /ready first answered 200.
        def ready_logged() -> bool:
            return any(is_ready_line(r, 200) for r in srv.log_records())

        srv.wait_until(ready_logged, "GET /ready == 200 logged")
        records = srv.log_records()
        loaded = next(i for i, r in enumerate(records) if "engine ready" in r["msg"])
        serving = next(i for i, r in enumerate(records) if r["msg"].startswith("ready: serving"))
        first_ok = next(i for i, r in enumerate(records) if is_ready_line(r, 200))
        assert loaded < serving < first_ok
        assert sum(is_ready_line(r, 503) for r in records) == seen.count(503)
    finally:
        stop_and_check(srv)


# ---- the running server ------------------------------------------------------------------------


def test_metrics_expose_vllm_and_airgate_names(server: Server) -> None:
    before = scrape(server)
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Count to ten."}],
        "max_tokens": 5,
        "temperature": 0,
        "logit_bias": NO_END,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with httpx.stream(
        "POST",
        f"{server.base_url}/v1/chat/completions",
        json=body,
        headers=server.auth(),
        timeout=120,
    ) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    usage = json.loads(lines[-2].removeprefix("data: "))["usage"]
    assert usage["completion_tokens"] == 5

    key = 'airgate_requests_total{route="/v1/chat/completions",status="200"}'
    # The request is counted once its response is complete: maybe just after the client saw it.
    server.wait_until(lambda: scrape(server).get(key, 0) > before.get(key, 0), "request counted")
    anonymous = httpx.get(f"{server.base_url}/metrics", timeout=30)
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "invalid_api_key"
    response = httpx.get(f"{server.base_url}/metrics", headers=server.auth(), timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    after = metric_samples(response.text)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert any(k.startswith(name + "{") for k in after), name
    assert metric(after, "vllm:num_requests_running") == 0
    assert metric(after, "vllm:num_requests_waiting") == 0
    assert (
        metric(after, "vllm:time_to_first_token_seconds_count")
        == metric(before, "vllm:time_to_first_token_seconds_count") + 1
    )
    # five tokens: a first one, then up to four gaps (a delta may carry two tokens of one character)
    gaps = metric(after, "vllm:inter_token_latency_seconds_count") - metric(
        before, "vllm:inter_token_latency_seconds_count"
    )
    assert 1 <= gaps <= 4
    assert (
        metric(after, "vllm:prompt_tokens_total")
        == metric(before, "vllm:prompt_tokens_total") + usage["prompt_tokens"]
    )
    assert (
        metric(after, "vllm:generation_tokens_total")
        == metric(before, "vllm:generation_tokens_total") + 5
    )
    assert after.get(key, 0) == before.get(key, 0) + 1


def test_client_disconnect_mid_stream_frees_the_slot(server: Server) -> None:
    rid = "e2e-disconnect-mid-stream"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a very long story."}],
        "max_tokens": 1500,
        "temperature": 0,
        "logit_bias": NO_END,
        "stream": True,
    }
    before = scrape(server)
    with (
        httpx.Client(timeout=120) as http,
        http.stream(
            "POST",
            f"{server.base_url}/v1/chat/completions",
            json=body,
            headers={"X-Request-Id": rid, **server.auth()},
        ) as r,
    ):
        assert r.status_code == 200
        rid = r.headers["x-request-id"]  # the server's id names the log line
        # Hold the iterator: dropping a half-read one already closes the connection.
        lines = r.iter_lines()
        events = 0
        while events < 4:
            events += next(lines).startswith("data: ")
        assert metric(scrape(server), "vllm:num_requests_running") == 1  # still generating
        lines.close()
        # the connection is closed here, long before 1,500 tokens
    server.wait_until(
        lambda: metric(scrape(server), "vllm:num_requests_running") == 0,
        "the slot is freed",
        deadline_s=60,
    )

    def logged() -> list[dict[str, object]]:
        return [r for r in server.request_records() if r.get("request_id") == rid]

    server.wait_until(lambda: bool(logged()), "the request is logged")
    (line,) = logged()
    assert line["status"] == 200
    assert line["stream"] is True
    assert line["finish_reason"] != "length"  # it was cut off, not run to the end
    after = scrape(server)
    assert metric(after, "vllm:request_success_total") == metric(
        before, "vllm:request_success_total"
    )
    assert (
        metric(after, "vllm:generation_tokens_total")
        - metric(before, "vllm:generation_tokens_total")
        < 1500
    )
