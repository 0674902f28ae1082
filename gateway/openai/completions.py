"""POST /v1/completions (the legacy text-completion API: raw prompts, echo, logprobs)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.di import NamedDependency
from litestar.response import Stream

from backends.types import GenerationRequest, TokenLogprob

from ..errors import InvalidRequest
from ..reqlog import request_info
from . import types as t
from ._decode import decode
from ._pipeline import (
    SSE_DONE,
    SSE_HEADERS,
    Run,
    Services,
    TextFrame,
    finish_reason,
    sampling_params,
    sse,
    stop_strings,
)

__all__ = ["completions"]

_decoder = msgspec.json.Decoder(t.CompletionRequest)
_encode = msgspec.json.Encoder().encode
MAX_PROMPTS = 16


def _prompts(prompt: t.Prompt) -> list[str | tuple[int, ...]]:
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


def _to_engine(
    body: t.CompletionRequest, request_id: str, max_tokens: int | None
) -> list[GenerationRequest]:
    if body.stream_options is not None and not body.stream:
        raise InvalidRequest(
            "stream_options is only allowed when stream is true.", param="stream_options"
        )
    sampling = sampling_params(body)
    out = []
    for i, prompt in enumerate(_prompts(body.prompt)):
        text, tokens = (prompt, None) if isinstance(prompt, str) else (None, prompt)
        out.append(
            GenerationRequest(
                request_id=f"{request_id}-{i}",
                prompt=text,
                prompt_tokens=tokens,
                max_tokens=max_tokens,
                stop=stop_strings(body.stop),
                sampling=sampling,
                logprobs=body.logprobs,
                echo_prompt=body.echo,
            )
        )
    return out


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
    request: Request[Any, Any, Any], inference: NamedDependency[Services]
) -> Response[Any]:
    """Create a text completion (OpenAI-compatible legacy API)."""
    info = request_info(request.scope)
    raw = await request.body()
    body = decode(_decoder, raw)
    model = inference.models.resolve(body.model)
    run = await Run.begin(
        request,
        body,
        raw,
        _to_engine(body, info.request_id, body.max_tokens),
        model=model,
        info=info,
        services=inference,
        action="completions",
        prompt_param="prompt",
    )
    admitted = run.admitted
    response_id = f"cmpl-{info.request_id}"
    created = int(time.time())
    if body.stream:
        usage = bool(body.stream_options and body.stream_options.include_usage)
        return Stream(
            _stream(run, response_id, created, model.id, usage, body.logprobs is not None),
            media_type="text/event-stream",
            headers={**SSE_HEADERS, **admitted.headers},
        )
    choices = []
    prompt_tokens = completion_tokens = 0
    for index, deltas in enumerate(await run.collect(request)):
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
    result = t.Completion(
        id=response_id,
        created=created,
        model=model.id,
        choices=choices,
        usage=t.UsageInfo(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens),
    )
    payload = _encode(result)
    await run.complete(response_bytes=len(payload))
    return Response(payload, media_type="application/json", headers=admitted.headers)


async def _stream(
    run: Run, response_id: str, created: int, model: str, include_usage: bool, want_logprobs: bool
) -> AsyncIterator[bytes]:
    prompt_tokens = completion_tokens = 0
    offsets = [_Logprobs() for _ in run.handles]
    pending = len(run.handles)

    def text_chunk(index: int) -> Callable[[str], t.Completion]:
        return lambda text: t.Completion(
            response_id, created, model, [t.CompletionChoice(index, text, None)]
        )

    text_frames = [TextFrame(text_chunk(i)) for i in range(len(run.handles))]
    try:
        async for index, delta in run.deltas():
            text = (delta.prompt_text or "") + delta.text
            if text and not want_logprobs and delta.finish_reason is None:
                yield text_frames[index](text)  # the common case: a token's text, no more
                continue
            logprobs = None
            if want_logprobs:
                acc = offsets[index]
                acc.value = t.CompletionLogprobs([], [], [], [])
                acc.add(delta.prompt_logprobs)
                acc.add(delta.logprobs)
                logprobs = acc.value if acc.value.tokens else None
            finish = finish_reason(delta) if delta.finish_reason is not None else None
            if text or logprobs is not None or finish is not None:
                choice = t.CompletionChoice(index, text, finish, logprobs)
                yield sse(t.Completion(response_id, created, model, [choice]))
            if delta.usage is not None and finish is not None:
                prompt_tokens += delta.usage.prompt_tokens
                completion_tokens += delta.usage.completion_tokens
                pending -= 1
                if pending == 0:
                    await run.complete()  # audited before the usage chunk and [DONE]
                if pending == 0 and include_usage:
                    usage = t.UsageInfo(
                        prompt_tokens, completion_tokens, prompt_tokens + completion_tokens
                    )
                    yield sse(t.Completion(response_id, created, model, [], usage))
    except Exception as exc:
        yield run.stream_error(exc)
        return
    yield SSE_DONE
