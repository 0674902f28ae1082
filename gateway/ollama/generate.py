"""POST /api/generate: Ollama's completion <-> the pipeline's facts (action "completions", so a
policy applies to it as to /v1/completions) and its events as NDJSON lines.

The prompt is formatted with the model's chat template (a user turn, after `system` if given),
as Ollama does; with `raw: true` it goes to the model as it is, like a /v1/completions prompt
(control tokens in it parsed as the policy's `raw_prompt_special_tokens` says).  What needs
state or features airgate does not have is refused with a 400 naming the field: `context` (no
conversation is kept: send it to /api/chat), `suffix` (no fill-in-the-middle), `template` (the
template comes with the signed bundle), `images`.  `context` is never returned.
"""

from __future__ import annotations

from typing import Any

import msgspec
from litestar import Request, Response, post
from litestar.di import NamedDependency

from backends.types import ChatMessage

from ..errors import UnsupportedParameter
from ..http.decode import decode
from ..http.request_log import request_info
from ..pipeline import Generation, Pipeline
from . import types as t
from .options import mapped
from .outputs import outputs, refuse_unsupported
from .reply import Make, answer, check_num_ctx, facts, loaded

__all__ = ["generate"]

_decoder = msgspec.json.Decoder(t.GenerateRequest)


def _line(model: str) -> Make:
    def make(when: str, text: str, calls: list[t.OutToolCall] | None) -> t.GenerateReply:
        return t.GenerateReply(model=model, created_at=when, done=False, response=text)

    return make


def _refuse_unsupported(body: t.GenerateRequest) -> None:
    refuse_unsupported(body.think, body.logprobs, body.top_logprobs)
    for name, value, why in (
        ("context", body.context, "no conversation state is kept: send it to /api/chat"),
        ("suffix", body.suffix, "fill-in-the-middle is not supported"),
        ("template", body.template, "the prompt template comes with the model's bundle"),
        ("images", body.images, "the models served here do not take images"),
    ):
        if value:
            raise UnsupportedParameter(f"{name} is not supported: {why}.", param=name)


@post("/api/generate", status_code=200)
async def generate(
    request: Request[Any, Any, Any], inference: NamedDependency[Pipeline]
) -> Response[Any]:
    """Generate a completion (Ollama-compatible): NDJSON lines unless `stream` is false."""
    log = request_info(request.scope)
    raw = await request.body()
    body = decode(_decoder, raw)
    _refuse_unsupported(body)
    make = _line(body.model)
    if not body.prompt and not body.system and body.format in (None, ""):
        return loaded(request, inference, log, body.model, make)
    check_num_ctx(request, inference, body.model, body.options)
    stream = body.stream is not False
    options = mapped(body.options, stream=stream)
    shape = outputs(body.format, None)
    if body.raw:
        inputs: dict[str, Any] = {"prompts": (body.prompt,)}
    else:
        turns = [ChatMessage("system", body.system)] if body.system else []
        inputs = {"messages": (*turns, ChatMessage("user", body.prompt))}
    generation = Generation(
        **inputs,
        constraint=shape.constraint,
        output=shape.kind,
        max_tokens=options.max_tokens,
        stop=options.stop,
        sampling=options.sampling,
    )
    inference_request = facts(
        request,
        log,
        model=body.model,
        action="completions",
        raw=raw,
        stream=stream,
        generation=generation,
        options=options,
        prompt_param="prompt",
    )
    return await answer(request, inference, inference_request, log, make)
