"""How many tokens a request may generate, given its prompt and the context: one rule for every
engine.

An explicit `max_tokens` is a demand: prompt + max_tokens must fit the context, else the
request is refused.  Without one (`max_tokens` None, or `fit_to_context` with the policy's cap
as `max_tokens`), the completion may use what remains of the context, up to the cap: only a
prompt that leaves no room at all is refused.  This is vLLM's own behaviour, and what clients
that leave `max_tokens` out (most SDKs, by default) expect.
"""

from __future__ import annotations

from .errors import ContextLengthExceeded
from .types import GenerationRequest

__all__ = ["completion_budget"]


def completion_budget(
    request: GenerationRequest,
    *,
    prompt_tokens: int,
    context_length: int,
    default: int | None = None,
) -> int:
    """Tokens to generate at most (>= 1), or ContextLengthExceeded.  `default`: what an engine
    generates when nothing bounds the request (None: the rest of the context)."""
    room = context_length - prompt_tokens
    wanted = request.max_tokens
    if wanted is None:
        wanted = room if default is None else default
    elif request.fit_to_context:
        wanted = min(wanted, room)
    max_tokens = max(1, wanted)
    if prompt_tokens + max_tokens > context_length:
        raise ContextLengthExceeded(
            prompt_tokens=prompt_tokens, max_tokens=max_tokens, context_length=context_length
        )
    return max_tokens
