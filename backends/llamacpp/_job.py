"""A request inside the llama.cpp scheduler: one prompt, prefilled once, and its choices.

A `Job` holds what a request's choices share: the prompt and how far it is prefilled, the
sequence slots the job holds, the output queue.  A `Choice` is one completion of that prompt
(`GenerationRequest.n` of them): its own sampler chain (own seed, own grammar clone), its own
sequence in the KV cache, its own stop matcher and UTF-8 buffer.  Only the scheduler thread
touches either, except `cancelled` (set from the event loop) and `finished` (read there).
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

import msgspec

from .._text import StopMatcher, Utf8Stream
from ..types import FinishReason, GenerationDelta, SamplingParams, TokenLogprob, Usage
from ._sampler import Sampler, free_sampler

__all__ = ["Choice", "Job", "Outbox"]

Outbox = list[
    tuple[asyncio.Queue[GenerationDelta | BaseException], GenerationDelta | BaseException]
]


class Choice:
    """One completion of a job's prompt: a sampler and, while it decodes, a sequence slot."""

    __slots__ = (
        "finished",
        "generated",
        "index",
        "job",
        "last_token",
        "logprobs",
        "max_tokens",
        "n_past",
        "out",
        "prompt_tokens",
        "sampler",
        "slot",
        "stop",
        "utf8",
    )

    def __init__(self, job: Job, index: int, sampler: Sampler) -> None:
        self.job = job
        self.index = index
        self.sampler: Sampler | None = sampler
        self.out = job.out
        self.max_tokens = job.max_tokens
        self.logprobs = job.logprobs
        # the prompt is counted once, on choice 0's usage
        self.prompt_tokens = len(job.prompt) if index == 0 else 0
        self.stop = StopMatcher(job.stop)
        self.utf8 = Utf8Stream()
        self.slot = -1  # no sequence yet: sampled its first token, waits for a slot
        self.n_past = len(job.prompt)
        self.generated = 0
        self.last_token = -1
        self.finished = False

    def final(
        self,
        reason: FinishReason,
        text: str,
        logprobs: tuple[TokenLogprob, ...] = (),
        prompt_text: str | None = None,
        prompt_logprobs: tuple[TokenLogprob, ...] | None = None,
    ) -> GenerationDelta:
        return GenerationDelta(
            text=text,
            n_tokens=1 if reason != "abort" else 0,
            logprobs=logprobs,
            finish_reason=reason,
            usage=Usage(self.prompt_tokens, self.generated),
            prompt_text=prompt_text,
            prompt_logprobs=prompt_logprobs or (),
            index=self.index,
        )

    def close(self) -> None:
        self.finished = True
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None


class Job:
    """A submitted request: its prompt, prefill progress, the slots it holds and its choices.

    `slots` are the sequence ids the job holds: at admission min(n, slots) of them; the
    prompt is prefilled into `holder` (the first).  Once prefilled, every choice samples its
    first token from the prompt's last logits, then choices take the job's slots, each a copy
    of the holder's cells, until one choice is left without a slot: it takes the holder itself.
    Choices beyond the job's slots wait (`waiting`) while the holder keeps the prompt, and take
    the slot of the next choice of the job that finishes.
    """

    __slots__ = (
        "cancelled",
        "choices",
        "echo_prompt",
        "finished",
        "grammars",
        "holder",
        "live",
        "logprobs",
        "max_tokens",
        "n",
        "n_past",
        "out",
        "params",
        "prompt",
        "prompt_logprobs",
        "prompt_text",
        "slots",
        "stop",
        "submitted",
        "waiting",
    )

    def __init__(
        self,
        *,
        prompt: list[int],
        n: int,
        max_tokens: int,
        stop: tuple[str, ...],
        params: SamplingParams,
        logprobs: int | None,
        echo_prompt: bool,
        prompt_text: str | None,
        out: asyncio.Queue[GenerationDelta | BaseException],
        grammars: list[Any] | None = None,
    ) -> None:
        self.prompt = prompt
        self.n = n
        # one parsed grammar sampler per choice, until the choices' chains take them
        self.grammars = grammars or []
        self.max_tokens = max_tokens
        self.stop = stop
        self.params = params
        self.logprobs = logprobs
        self.echo_prompt = echo_prompt
        self.prompt_text = prompt_text
        self.prompt_logprobs: list[TokenLogprob] = []
        self.out = out
        self.slots: list[int] = []
        self.holder = -1
        self.n_past = 0  # prompt tokens prefilled
        self.choices: list[Choice] = []  # empty until the prompt is prefilled
        self.waiting: collections.deque[Choice] = collections.deque()
        self.live = n  # choices not finished
        self.cancelled = False
        self.finished = False
        self.submitted = time.monotonic()

    @property
    def want_prompt_logprobs(self) -> bool:
        return self.echo_prompt and self.logprobs is not None

    def choice_params(self, index: int) -> SamplingParams:
        """Choice i samples with seed + i: choices differ, and a seeded request repeats."""
        seed = self.params.seed
        if index == 0 or seed is None:
            return self.params
        return msgspec.structs.replace(self.params, seed=seed + index)

    def take_grammar(self, index: int) -> Any:
        return self.grammars[index] if index < len(self.grammars) else None

    def drop_grammars(self) -> None:
        """Free grammars no choice took (a job dropped before its prompt was prefilled)."""
        for grammar in self.grammars:
            free_sampler(grammar)
        self.grammars = []

    def abort_finals(self) -> list[GenerationDelta]:
        """The final delta of every choice not finished yet (cancel, shutdown)."""
        if not self.choices:  # never prefilled: no choice generated anything
            return [
                GenerationDelta(
                    finish_reason="abort",
                    usage=Usage(len(self.prompt) if i == 0 else 0, 0),
                    index=i,
                )
                for i in range(self.n)
            ]
        return [c.final("abort", "") for c in self.choices if not c.finished]
