"""POST /v1/embeddings: the embeddings wire format <-> the pipeline's facts and result."""

from __future__ import annotations

import base64
from typing import Any

import msgspec
import numpy as np
from litestar import Request, Response, post
from litestar.di import NamedDependency

from ..errors import InvalidRequest
from ..http.authn import caller
from ..http.decode import decode
from ..http.request_log import request_info
from ..pipeline import EmbeddingInputs, Generation, InferenceRequest, Pipeline, RawPrompt
from . import embedding_types as t

__all__ = ["MAX_INPUTS", "embeddings"]

MAX_INPUTS = 2048  # inputs per request, as OpenAI allows
_decoder = msgspec.json.Decoder(t.EmbeddingsRequest)
_encode = msgspec.json.Encoder().encode
_NO_GENERATION = Generation()


def inputs(value: t.Input) -> tuple[RawPrompt, ...]:
    """The inputs as texts or token-id tuples; a 400 naming the first bad one."""
    if isinstance(value, str):
        items: list[str | int | list[int]] = [value]
    elif not value:
        raise InvalidRequest("input must not be an empty list.", param="input")
    elif all(isinstance(v, int) for v in value):
        items = [[v for v in value if isinstance(v, int)]]  # one input of token ids
    else:
        items = value
    if len(items) > MAX_INPUTS:
        raise InvalidRequest(
            f"input may hold at most {MAX_INPUTS} items per request.", param="input"
        )
    out: list[RawPrompt] = []
    for index, item in enumerate(items):
        where = "input" if isinstance(value, str) else f"input[{index}]"
        if isinstance(item, int):
            raise InvalidRequest(
                "input must be a string, a list of strings, a list of token ids, or a list of "
                "lists of token ids (not a mix).",
                param=where,
            )
        if not item:
            raise InvalidRequest(f"{where} must not be empty.", param=where)
        if isinstance(item, list) and any(token < 0 for token in item):
            raise InvalidRequest(f"{where} holds a negative token id.", param=where)
        out.append(item if isinstance(item, str) else tuple(item))
    return tuple(out)


def _facts(
    request: Request[Any, Any, Any], body: t.EmbeddingsRequest, raw: bytes
) -> InferenceRequest:
    log = request_info(request.scope)
    sampling: dict[str, bool | int | float] = {}
    if body.dimensions is not None:
        sampling["dimensions"] = body.dimensions
    return InferenceRequest(
        request_id=log.request_id,
        principal=caller(request),
        action="embeddings",
        route=log.route,
        model=body.model,
        prompt_bytes=len(raw),
        stream=False,
        generation=_NO_GENERATION,
        sampling=sampling,
        prompt_param="input",
        traceparent=request.headers.get("traceparent"),
        embedding=EmbeddingInputs(inputs=inputs(body.input), dimensions=body.dimensions),
    )


@post("/v1/embeddings", status_code=200)
async def embeddings(
    request: Request[Any, Any, Any], inference: NamedDependency[Pipeline]
) -> Response[Any]:
    """Create embeddings (OpenAI-compatible): one L2-normalised vector per input."""
    raw = await request.body()
    body = decode(_decoder, raw)
    done = await inference.embed(_facts(request, body, raw), request_info(request.scope))
    result = done.result
    vectors = result.vectors
    data: list[t.Embedding]
    if body.encoding_format == "base64":
        little = vectors.astype("<f4", copy=False)
        data = [
            t.Embedding(i, base64.b64encode(row.tobytes()).decode("ascii"))
            for i, row in enumerate(little)
        ]
    else:
        data = [t.Embedding(i, row) for i, row in enumerate(np.asarray(vectors).tolist())]
    used = sum(result.prompt_tokens)
    payload = _encode(t.EmbeddingList(data, done.model.id, t.EmbeddingUsage(used, used)))
    return Response(payload, media_type="application/json", headers=done.headers)
