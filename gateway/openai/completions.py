"""POST /v1/completions (the legacy text-completion API: raw prompts, echo, logprobs): the wire
format <-> the pipeline's facts and events."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.response import Stream

from backends.types import GenerationDelta, TokenLogprob, Usage

from ..errors import GatewayError, InvalidRequest, UnsupportedParameter
from ..http.decode import decode
from ..http.disconnect import disconnected
from ..http.request_log import RequestInfo, request_info
from ..pipeline import Generation, InferenceRequest, Pipeline, RawPrompt
from . import types as t
from .sampling import finish_reason, inference_request, sampling_params, stop_strings
from .sse import SSE_DONE, SSE_HEADERS, TextFrame, sse, sse_error

__all__ = ["completions"]

_decoder = msgspec.json.Decoder(t.CompletionRequest)
_encode = msgspec.json.Encoder().encode
MAX_PROMPTS = 16


def _prompts(prompt: t.Prompt) -> list[RawPrompt]:
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise InvalidRequest("prompt must not be an empty list.", param="prompt")
    if all(isinstance(p, int) for p in prompt):
        return [tuple(p for p in prompt if isinstance(p, int))]
    if all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise InvalidRequest(f"at most {MAX_PROMPTS} prompts per request.", param="prompt")
        return [p if isinstance(p, str) else tuple(p) for p in prompt if not isinstance(p, int)]
    raise InvalidRequest(
        "prompt must be a string, a list of strings, or token ids.", param="prompt"
    )


def _facts(
    request: Request[Any, Any, Any], body: t.CompletionRequest, raw: bytes, log: RequestInfo
) -> InferenceRequest:
    if body.echo and (body.n or 1) > 1:
        raise UnsupportedParameter(
            "echo is not supported with n > 1: send n = 1 to have the prompt echoed.", param="echo"
        )
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest(
            "stream_options is only allowed when stream is true.", param="stream_options"
        )
    generation = Generation(
        prompts=tuple(_prompts(body.prompt)),
        max_tokens=body.max_tokens,
        stop=stop_strings(body.stop),
        sampling=sampling_params(body),
        logprobs=body.logprobs,
        echo_prompt=bool(body.echo),
    )
    return inference_request(
        request, log, body, raw, generation, action="completions", prompt_param="prompt"
    )


class _Logprobs:
    """Accumulates the legacy logprobs object (parallel lists) for one choice."""

    def __init__(self, offset: int = 0) -> None:
        self.value = t.CompletionLogprobs([], [], [], [])
        self.offset = offset

    def add(self, items: Sequence[TokenLogprob]) -> None:
        v = self.value
        for lp in items:
            text = lp.text.decode("utf-8", "replace")
            v.tokens.append(text)
            v.token_logprobs.append(lp.logprob)
            v.top_logprobs.append(
                None
                if lp.logprob is None
                else {x.decode("utf-8", "replace"): p for _, x, p in lp.top}
            )
            v.text_offset.append(self.offset)
            self.offset += len(text)


@post("/v1/completions", status_code=200)
async def completions(
    request: Request[Any, Any, Any], inference: NamedDependency[Pipeline]
) -> Response[Any]:
    """Create a text completion (OpenAI-compatible legacy API)."""
    log = request_info(request.scope)
    raw = await request.body()
    body = decode(_decoder, raw)
    run = await inference.start(_facts(request, body, raw, log), log)
    response_id = f"cmpl-{log.request_id}"
    created = int(time.time())
    model = run.model.id
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        encoder = _CompletionStream(
            response_id, created, model, run.sequences, usage, body.logprobs is not None
        )
        return Stream(
            run.stream(encoder),
            media_type="text/event-stream",
            headers={**SSE_HEADERS, **run.headers},
        )

    def render(per_choice: list[list[GenerationDelta]]) -> bytes:
        choices = []
        prompt_tokens = completion_tokens = 0
        for index, deltas in enumerate(per_choice):
            final = deltas[-1]
            assert final.usage is not None
            prompt_tokens += final.usage.prompt_tokens
            completion_tokens += final.usage.completion_tokens
            head = deltas[0]
            text = (head.prompt_text or "") + "".join(d.text for d in deltas)
            logprobs = None
            if body.logprobs is not None:
                acc = _Logprobs()
                acc.add(head.prompt_logprobs)
                for d in deltas:
                    acc.add(d.logprobs)
                logprobs = acc.value
            choices.append(t.CompletionChoice(index, text, finish_reason(final), logprobs))
        usage = t.UsageInfo(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)
        return _encode(
            t.Completion(id=response_id, created=created, model=model, choices=choices, usage=usage)
        )

    payload = await run.result(render, disconnected(request))
    return Response(payload, media_type="application/json", headers=run.headers)


class _CompletionStream:
    """text_completion events, one choice per prompt; usage (when asked) and [DONE] once the
    completion is audited."""

    def __init__(
        self,
        response_id: str,
        created: int,
        model: str,
        choices: int,
        include_usage: bool,
        logprobs: bool,
    ) -> None:
        self._id, self._created, self._model = response_id, created, model
        self._include_usage = include_usage
        self._logprobs = logprobs
        self._offsets = [_Logprobs() for _ in range(choices)]

        def text_chunk(index: int) -> Callable[[str], t.Completion]:
            return lambda text: t.Completion(
                response_id, created, model, [t.CompletionChoice(index, text, None)]
            )

        self._text = [TextFrame(text_chunk(i)) for i in range(choices)]

    def opening(self) -> bytes:
        return b""

    def delta(self, index: int, delta: GenerationDelta) -> bytes:
        text = (delta.prompt_text or "") + delta.text
        if text and not self._logprobs and delta.finish_reason is None:
            return self._text[index](text)  # the common case: a token's text, no more
        logprobs = None
        if self._logprobs:
            acc = self._offsets[index]
            acc.value = t.CompletionLogprobs([], [], [], [])
            acc.add(delta.prompt_logprobs)
            acc.add(delta.logprobs)
            logprobs = acc.value if acc.value.tokens else None
        finish = finish_reason(delta) if delta.finish_reason is not None else None
        if text or logprobs is not None or finish is not None:
            choice = t.CompletionChoice(index, text, finish, logprobs)
            return sse(t.Completion(self._id, self._created, self._model, [choice]))
        return b""

    def closing(self, usage: Usage) -> bytes:
        if not self._include_usage:
            return SSE_DONE
        p, c = usage.prompt_tokens, usage.completion_tokens
        summary = t.Completion(self._id, self._created, self._model, [], t.UsageInfo(p, c, p + c))
        return sse(summary) + SSE_DONE

    def failure(self, error: GatewayError) -> bytes:
        return sse_error(error)
