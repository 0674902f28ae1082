"""The ollama_api benchmark's pure parts: the NDJSON and SSE tallies on streams recorded from a
real `airgate serve` (Gemma, `num_predict` / `max_tokens` 4), the request bodies as the gateway
decodes them, the section rendered from a made-up record, and its set-up (`--check`) run as a
user runs it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from bench._client import LoadError
from bench.ollama_api_report import Results, Round, render, same_counts, tokens_per_s
from bench.ollama_api_stream import ApiRequest, Batch, NdjsonTally, SseTally, Tally, body
from gateway.ollama.options import mapped
from gateway.ollama.types import ChatRequest
from gateway.openai.types import ChatCompletionRequest

ROOT = Path(__file__).resolve().parents[2]

# /api/chat, options {"num_predict": 4, "temperature": 0, "seed": 1}, "Write one sentence about
# the sea.": the lines as `airgate serve` sent them
NDJSON = [
    '{"model":"gemma-3-270m","created_at":"2026-12-02T17:41:55.986708Z","done":false,'
    '"message":{"role":"assistant","content":"Write"}}',
    '{"model":"gemma-3-270m","created_at":"2026-12-02T17:41:56.242464Z","done":false,'
    '"message":{"role":"assistant","content":" one"}}',
    '{"model":"gemma-3-270m","created_at":"2026-12-02T17:41:56.306284Z","done":false,'
    '"message":{"role":"assistant","content":" sentence"}}',
    '{"model":"gemma-3-270m","created_at":"2026-12-02T17:41:56.431411Z","done":false,'
    '"message":{"role":"assistant","content":" about"}}',
    '{"model":"gemma-3-270m","created_at":"2026-12-02T17:41:56.439941Z","done":true,'
    '"done_reason":"length","total_duration":2258122091,"load_duration":0,'
    '"prompt_eval_count":16,"prompt_eval_duration":1786910668,"eval_count":4,'
    '"eval_duration":460252152,"message":{"role":"assistant","content":""}}',
]

# /v1/chat/completions, the same request (max_tokens 4, stream_options.include_usage)
_HEAD = (
    'data: {"object":"chat.completion.chunk","id":"chatcmpl-7865ccc5abac08e355663b32",'
    '"created":1796233316,"model":"gemma-3-270m","choices":'
)
SSE = [
    _HEAD + '[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null,'
    '"logprobs":null}]}',
    "",
    *(
        line
        for text in ("Write", " one", " sentence", " about")
        for line in (
            _HEAD + f'[{{"index":0,"delta":{{"content":"{text}"}},"finish_reason":null,'
            '"logprobs":null}]}',
            "",
        )
    ),
    _HEAD + '[{"index":0,"delta":{},"finish_reason":"length","logprobs":null}]}',
    "",
    _HEAD + '[],"usage":{"prompt_tokens":16,"completion_tokens":4,"total_tokens":20}}',
    "",
    "data: [DONE]",
    "",
]


def _fed(tally: NdjsonTally | SseTally, lines: list[str]) -> NdjsonTally | SseTally:
    for i, line in enumerate(lines):
        tally.feed(0.1 * (i + 1), line)
    return tally


def test_ndjson_tally_counts_the_final_line_and_times_the_first_content() -> None:
    tally = _fed(NdjsonTally(), NDJSON).result()
    assert tally == Tally(ttft_s=0.1, tokens=4, chunks=4, prompt_tokens=16, finish="length")


def test_sse_tally_counts_the_usage_and_skips_the_empty_opening_chunk() -> None:
    tally = _fed(SseTally(), SSE).result()
    # the role chunk (empty content, line 1) is not the first token: line 3 is
    assert tally.ttft_s == pytest.approx(0.3)
    assert (tally.tokens, tally.chunks, tally.prompt_tokens, tally.finish) == (4, 4, 16, "length")


def test_a_held_back_token_makes_fewer_chunks_than_tokens() -> None:
    # a token that is half a UTF-8 character sends no line: 3 chunks for 4 tokens is fine
    lines = [NDJSON[0], NDJSON[1], NDJSON[3], NDJSON[4]]
    assert _fed(NdjsonTally(), lines).result().chunks == 3


@pytest.mark.parametrize(
    ("lines", "error"),
    [
        (NDJSON[:-1], "without its final line"),
        ([NDJSON[-1]], "without any content"),
        ([*NDJSON[:2], '{"error":"the engine stopped"}'], "error line in stream"),
        ([NDJSON[0], "not json"], "malformed NDJSON line"),
        ([*NDJSON, NDJSON[0]], "a line after the final done line"),
        # more content lines than the server counted tokens: the count is wrong
        ([*NDJSON[:4], NDJSON[0], NDJSON[4]], "5 content chunks for 4 counted tokens"),
    ],
)
def test_ndjson_tally_refuses_a_broken_stream(lines: list[str], error: str) -> None:
    with pytest.raises(LoadError, match=error):
        _fed(NdjsonTally(), lines).result()


@pytest.mark.parametrize(
    ("lines", "error"),
    [
        (SSE[:-2], r"without data: \[DONE\]"),
        ([*SSE[:-4], *SSE[-2:]], "without a usage chunk"),
        ([SSE[0], *SSE[-4:]], "without any content"),
        ([SSE[0], 'data: {"error":{"message":"overloaded"}}'], "error event in stream"),
        ([*SSE, SSE[2]], r"an event after \[DONE\]"),
    ],
)
def test_sse_tally_refuses_a_broken_stream(lines: list[str], error: str) -> None:
    with pytest.raises(LoadError, match=error):
        _fed(SseTally(), lines).result()


def test_both_bodies_ask_the_gateway_for_the_same_generation() -> None:
    ollama = msgspec.convert(body("ollama", "gemma-3-270m", "Hi", 64, 7), ChatRequest)
    openai = msgspec.convert(body("openai", "gemma-3-270m", "Hi", 64, 7), ChatCompletionRequest)
    assert ollama.stream is None  # left out: Ollama streams by default
    assert openai.stream and openai.stream_options and openai.stream_options.include_usage
    options = mapped(ollama.options, stream=True)
    assert options.max_tokens == openai.max_tokens == 64
    assert options.sampling.greedy and openai.temperature == 0
    assert options.sampling.seed == openai.seed == 7


def _request(tokens: int, ttft: float) -> ApiRequest:
    return ApiRequest(tally=Tally(ttft_s=ttft, tokens=tokens, chunks=tokens, prompt_tokens=80,
                                  finish="length"), duration_s=1.0)  # fmt: skip


def _batch(api: str, level: int, wall_s: float, tokens: list[int]) -> Batch:
    requests = [_request(n, 0.1 * level * (i + 1)) for i, n in enumerate(tokens)]
    return Batch(api=api, concurrency=level, wall_s=wall_s, requests=requests)  # type: ignore[arg-type]


def test_tokens_per_s_and_same_counts_over_a_round() -> None:
    batches = [
        _batch("ollama", 8, 4.0, [64] * 8),
        _batch("openai", 8, 5.0, [64] * 7 + [60]),
        _batch("openai", 8, 3.0, [64] * 8),
        _batch("ollama", 8, 4.0, [64] * 8),
    ]
    one = Round(ready_s=1.0, warmup_tokens=64, batches=batches, foreign_share=0.0)
    assert tokens_per_s(batches[:1]) == 128.0
    assert tokens_per_s(batches[1:3]) == (64 * 15 + 60) / 8.0
    assert same_counts(one, 8) == (15, 16)


def test_section_renders_the_ratios_per_run() -> None:
    def round_(ollama_wall: float) -> Round:
        batches = [
            _batch("ollama", 1, ollama_wall, [64, 64]),
            _batch("openai", 1, 2.0, [64, 64]),
            _batch("openai", 8, 4.0, [64] * 8),
            _batch("ollama", 8, 4.0, [64] * 8),
        ]
        return Round(ready_s=3.0, warmup_tokens=64, batches=batches, foreign_share=0.02)

    results = Results(max_tokens=64, levels=[1, 8], pairs=1, requests={1: 2, 8: 8},
                      rounds=[round_(2.0), round_(2.5), round_(1.6)])  # fmt: skip
    args = argparse.Namespace(command="python -m bench --scenario ollama_api", quick=False,
                              threads=2, slots=8, no_engine_env=False, server_env=[],
                              max_foreign_load=0.05)  # fmt: skip
    out = render(args, results)
    assert out.startswith("## Ollama API vs OpenAI API on the same server")
    # per run 1.0, 0.8 and 1.25 at concurrency 1: the median and its spread
    assert "| Ollama / OpenAI | 1 |  | 1.000 (0.800–1.250) |" in out
    assert "| concurrency 8: tokens/s, Ollama API / OpenAI API | 1.000 | >= 0.97 | PASS |" in out
    assert "| OpenAI API | 8 | 8 | 128.0 |" in out
    assert "for 30 of 30 prompts" in out and "Target missed" not in out
    assert "Reading: " in out


def test_check_sets_up_without_starting_anything(tmp_path: Path) -> None:
    """`python -m bench --check --scenario ollama_api` as a user runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRGATE_")}
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--check", "--scenario", "ollama_api",
         "--cache-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("## ollama_api: set-up checked, nothing started\n")
    for text in (" serve --port ", "an app key created", "decoded as airgate's ChatRequest"):
        assert text in done.stdout
    assert not any(tmp_path.iterdir()), "--check wrote into the cache dir"


def test_check_refuses_too_few_slots(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRGATE_")}
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--check", "--scenario", "ollama_api", "--slots", "4",
         "--cache-dir", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "--slots must be at least 8" in done.stderr
