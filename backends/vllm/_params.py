"""GenerationRequest -> keyword arguments of vLLM's `SamplingParams` (pure: no vLLM import).

The engine adds `output_kind=RequestOutputKind.DELTA` and builds the object; everything that
decides *what* vLLM samples is here, so it is testable without a model.

Choices (`n > 1`) are vLLM's own: `n` child sequences of the one prompt, child i seeded with
`seed + i` when the request has a seed (`vllm.v1.engine.parallel_sampling`, checked in 0.32),
which is our documented rule: choices are distinct and reproducible.  The children share the
prompt's KV through the prefix cache: measured on the CPU build with a 600-token prompt and
n=4, children 1-3 found 512 tokens cached (whole 128-token blocks; the partial last block is
recomputed per child).  With `enable_prefix_caching=False` every child prefills on its own.
vLLM refuses `n > 1` with greedy sampling; greedy choices are identical by definition, so
one sequence is generated and the handle copies each delta to every choice (`sequences`).
"""

from __future__ import annotations

import json
from typing import Any

from ..budget import completion_budget
from ..structured import ANY_JSON_OBJECT
from ..types import GenerationRequest, OutputConstraint

__all__ = ["resolve_max_tokens", "sampling_kwargs", "sequences", "structured_outputs"]

# vLLM raises temperatures in (0, 0.01) to 0.01 and logs a warning for every such request;
# doing it here keeps the log quiet and the behaviour the same.
_MIN_TEMPERATURE = 0.01


def resolve_max_tokens(
    request: GenerationRequest, *, prompt_tokens: int, context_length: int
) -> int:
    """Tokens to generate at most (`backends.budget`); vLLM's own default is 16 tokens, so the
    value is always explicit."""
    return completion_budget(request, prompt_tokens=prompt_tokens, context_length=context_length)


def sequences(request: GenerationRequest) -> int:
    """The sequences vLLM generates for the request's `n` choices: one when greedy (copied to
    every choice), else `n`."""
    return 1 if request.sampling.greedy else request.n


def sampling_kwargs(
    request: GenerationRequest, *, prompt_tokens: int, context_length: int
) -> dict[str, Any]:
    """`SamplingParams(**kwargs)` for one request (`sequences(request)` of them, each with its
    text detokenised and its stop strings matched by vLLM)."""
    s = request.sampling
    temperature = 0.0 if s.greedy else max(s.temperature, _MIN_TEMPERATURE)
    stops = [stop for stop in request.stop if stop]
    prompt_logprobs = None
    if request.echo_prompt and request.logprobs is not None:
        # Our `logprobs: N` means the chosen token plus N alternatives, which is vLLM's meaning
        # too; prompt positions get the same N.
        prompt_logprobs = request.logprobs
    return {
        "n": sequences(request),
        "temperature": temperature,
        "top_p": s.top_p,
        "top_k": max(s.top_k, 0),  # 0 is "off" for both of us (vLLM also reads -1 as off)
        "min_p": s.min_p,
        "seed": s.seed,
        "repetition_penalty": s.repetition_penalty,
        "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty,
        "logit_bias": dict(s.logit_bias) or None,
        "stop": stops or None,  # vLLM removes a matched stop string from the output
        "include_stop_str_in_output": False,
        "max_tokens": resolve_max_tokens(
            request, prompt_tokens=prompt_tokens, context_length=context_length
        ),
        "logprobs": request.logprobs,
        "prompt_logprobs": prompt_logprobs,
        "detokenize": True,
        "skip_special_tokens": True,
    }


def structured_outputs(constraint: OutputConstraint | None) -> dict[str, Any] | None:
    """`StructuredOutputsParams(**kwargs)` for a constraint (xgrammar on vLLM's CPU build).

    With a trigger (tool_choice "auto"), a structural tag: free text until the trigger, then
    JSON valid against the schema."""
    if constraint is None:
        return None
    if constraint.trigger is None:
        if constraint.schema == ANY_JSON_OBJECT:
            return {"json_object": True}
        return {"json": constraint.schema}
    tag = {
        "type": "structural_tag",
        "structures": [
            {"begin": constraint.trigger, "schema": json.loads(constraint.schema), "end": ""}
        ],
        "triggers": [constraint.trigger],
    }
    return {"structural_tag": json.dumps(tag)}
