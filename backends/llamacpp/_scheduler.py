"""The continuous-batching loop: one thread owns the llama.cpp context.

Each step runs one `llama_decode`: the next token of every decoding choice, or one prompt chunk
(up to `n_batch` tokens) of one job, alternating while both exist.  Requests join between
steps; a long prompt is prefilled a chunk per step so running streams keep flowing; a cancelled
job is dropped and its caches freed at the next step.

Choices (`n > 1`, see `_job`): a job holds min(n, slots) sequence slots, taken together and in
arrival order: the head of the queue waits until enough slots are free and nothing overtakes
it, so a large `n` is never starved by a stream of small requests, and no job ever needs more
slots than the engine has, so none waits forever.  The prompt is prefilled once, into one
slot; every choice samples its first token from its last logits; the other slots receive a
copy of the prompt's cells (`copy_seq`).  With more choices than slots (n = 8 on the default 4
slots) the extra choices wait while the first slot keeps the prompt, each taking the slot of a
sibling that finishes (another copy), and the last one takes the prompt's slot itself.  This
keeps the KV cache at `slots` sequences (a context with n sequences would cost n full streams
of memory for every deployment), at the price of running such choices in waves.

Results leave the thread once per step: a single `call_soon_threadsafe` hands every delta to
its request's asyncio queue.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
import time
from collections.abc import Callable

import numpy as np

from ..errors import EngineFailure, EngineNotReady, EngineOverloaded
from ..types import GenerationDelta, TokenLogprob
from ._job import Choice, Job, Outbox
from ._native import Batch, Context, copy_seq
from ._sampler import Sampler

__all__ = ["Scheduler"]

_log = logging.getLogger("airgate.llamacpp")

# At 8 or more rows llama.cpp (0.3.36, CPU) computes some rows differently from how it computes
# them in smaller batches; up to 7 rows every sequence gets bit-identical logits.
INVARIANT_DECODE_ROWS = 7


class Scheduler:
    """Owns the context, the batch and the thread; `submit` and `cancel` are thread-safe."""

    def __init__(
        self,
        ctx: Context,
        *,
        n_slots: int,
        max_waiting: int,
        loop: asyncio.AbstractEventLoop,
        batch_invariant: bool = False,
    ) -> None:
        self._ctx = ctx
        self._model = ctx.model
        self._n_slots = n_slots
        self._max_waiting = max_waiting
        self._loop = loop
        self._batch = Batch(ctx.n_batch, n_slots)
        self._cv = threading.Condition()
        self._pending: collections.deque[Job] = collections.deque()
        self._waiting_choices = 0  # choices of the pending jobs
        self._jobs: list[Job] = []  # admitted: prefilling or decoding
        self._slots: list[Choice | None] = [None] * n_slots  # the decoding choice per slot
        self._free = list(range(n_slots - 1, -1, -1))  # free slots; pop() takes the lowest
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="airgate-llamacpp", daemon=True)
        self._mean_duration_s = 2.0  # EMA of request time, for Retry-After
        self._prefill_turn = False
        # batch_invariant: cut decode steps so no llama_decode sees more than 7 rows (results
        # never depend on the load, at a throughput cost when more than 7 sequences run)
        self._max_decode_rows = INVARIANT_DECODE_ROWS if batch_invariant else n_slots
        self.kv_tokens = 0
        self.decoded_tokens = 0  # every token through llama_decode, prompts included

    # ---- called from the event loop -------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cv:
            if self._stopping:
                raise EngineNotReady("the engine is shutting down")
            free = len(self._free)
            if len(self._pending) >= self._max_waiting + free:
                waiting = len(self._pending)
                raise EngineOverloaded(
                    f"the engine is at capacity ({self._n_slots} running, {waiting} waiting)",
                    retry_after_s=max(1.0, self._mean_duration_s * (waiting + 1) / self._n_slots),
                )
            self._pending.append(job)
            self._waiting_choices += job.n
            self._cv.notify()

    def cancel(self, job: Job) -> None:
        job.cancelled = True  # read by the scheduler thread at its next step
        with self._cv:
            self._cv.notify()

    def counts(self) -> tuple[int, int]:
        """Slots in use and choices waiting for one."""
        return self._n_slots - len(self._free), self._waiting_choices

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join()
        self._batch.close()

    # ---- the scheduler thread -------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not self._stopping and not self._pending and not self._jobs:
                        self._cv.wait()
                    if self._stopping:
                        break
                    dropped = self._admit_locked()
                outbox: Outbox = [(job.out, d) for job in dropped for d in job.abort_finals()]
                self._reap(outbox)
                if self._jobs:
                    self._step(outbox)
                if outbox:
                    self._loop.call_soon_threadsafe(_deliver, outbox)
        except BaseException as exc:  # the loop must never die silently
            _log.exception("llama.cpp scheduler crashed")
            self._fail_all(EngineFailure(f"engine failure: {type(exc).__name__}"))
            raise
        self._fail_all(EngineNotReady("the engine stopped"))

    def _admit_locked(self) -> list[Job]:
        """Give waiting jobs their slots, in order; returns those cancelled while waiting."""
        dropped = [j for j in self._pending if j.cancelled]
        if dropped:
            self._pending = collections.deque(j for j in self._pending if not j.cancelled)
            for job in dropped:
                self._waiting_choices -= job.n
                job.finished = True
                job.drop_grammars()
        while self._pending and len(self._free) >= min(self._pending[0].n, self._n_slots):
            job = self._pending.popleft()
            self._waiting_choices -= job.n
            job.slots = [self._free.pop() for _ in range(min(job.n, self._n_slots))]
            job.holder = job.slots[0]
            self._jobs.append(job)
        return dropped

    def _reap(self, outbox: Outbox) -> None:
        for job in [j for j in self._jobs if j.cancelled]:
            outbox.extend((job.out, d) for d in job.abort_finals())
            self._end(job)

    def _step(self, outbox: Outbox) -> None:
        """One llama_decode: either the next token of every decoding choice, or one prompt
        chunk of one job.  The two alternate while both kinds of work exist, so a long
        prompt stalls running streams for at most one chunk per token they receive.

        Keeping prompt chunks out of decode batches (and cutting every prompt at the same
        offsets whatever else is running) is what makes results batch-invariant: a sequence's
        tokens always meet the same kernels with the same shapes, alone or under load.
        """
        decoding = [c for c in self._slots if c is not None]
        prefilling = [j for j in self._jobs if j.n_past < len(j.prompt)]
        if prefilling and (not decoding or self._prefill_turn):
            self._prefill_turn = False
            # oldest first: the request that has waited longest gets its first token first
            self._prefill_chunk(min(prefilling, key=lambda j: j.submitted), outbox)
        elif decoding:
            self._prefill_turn = True
            self._decode(decoding, outbox)
        self._count_kv()

    def _count_kv(self) -> None:
        held = sum(j.n_past for j in self._jobs if j.holder >= 0)  # prompts held or prefilling
        self.kv_tokens = held + sum(c.n_past for c in self._slots if c is not None)

    def _prefill_chunk(self, job: Job, outbox: Outbox) -> None:
        batch = self._batch
        batch.clear()
        take = min(batch.capacity, len(job.prompt) - job.n_past)
        completes = job.n_past + take == len(job.prompt)
        all_logits = job.want_prompt_logprobs
        idx = batch.add(
            job.prompt[job.n_past : job.n_past + take], job.n_past, job.holder, all_logits
        )
        if completes:
            batch.set_last_logits()
        job.n_past += take
        if not self._run_batch([job], outbox):
            return
        if all_logits:
            self._collect_prompt_logprobs(job, idx, take)
        if completes:
            self._start_choices(job, idx + take - 1, outbox)

    def _start_choices(self, job: Job, idx: int, outbox: Outbox) -> None:
        """The prompt is in the holder's cache and its last logits at `idx`: every choice
        samples its first token there, then the choices take the job's slots."""
        n_vocab = self._model.n_vocab
        job.choices = [
            Choice(job, i, Sampler(job.choice_params(i), n_vocab, job.max_tokens, g))
            for i, g in ((i, job.take_grammar(i)) for i in range(job.n))
        ]
        job.grammars = []  # each choice's sampler owns its grammar now
        for choice in job.choices:
            self._sample(choice, idx, outbox)
        job.waiting.extend(c for c in job.choices if not c.finished)
        for slot in job.slots[1:]:
            self._hand_over(job, slot)
        self._settle_holder(job)

    def _hand_over(self, job: Job, slot: int) -> None:
        """A slot of `job` is idle: the next waiting choice gets a copy of the prompt there,
        unless at most one waits (that one takes the holder itself, with no copy)."""
        if len(job.waiting) >= 2:
            choice = job.waiting.popleft()
            copy_seq(self._ctx, job.holder, slot)
            choice.slot = slot
            self._slots[slot] = choice
        else:
            job.slots.remove(slot)
            self._free.append(slot)

    def _settle_holder(self, job: Job) -> None:
        if job.holder < 0 or len(job.waiting) >= 2:
            return
        if job.waiting:  # the last choice decodes on the prompt's own cells
            choice = job.waiting.popleft()
            choice.slot = job.holder
            self._slots[job.holder] = choice
        else:
            self._ctx.clear_seq(job.holder)
            job.slots.remove(job.holder)
            self._free.append(job.holder)
        job.holder = -1

    def _finish(self, choice: Choice) -> None:
        """A choice ended (stop, length, end token): its slot goes to a waiting sibling."""
        choice.close()
        job = choice.job
        job.live -= 1
        slot = choice.slot
        if slot >= 0:
            self._slots[slot] = None
            self._ctx.clear_seq(slot)
            if job.waiting:
                self._hand_over(job, slot)
                self._settle_holder(job)
            else:
                job.slots.remove(slot)
                self._free.append(slot)
        if job.live == 0:
            self._end(job)

    def _end(self, job: Job) -> None:
        """Free everything the job holds (its choices may still be running: cancel, errors)."""
        for choice in job.choices:
            if not choice.finished:
                choice.close()
        job.drop_grammars()
        job.waiting.clear()
        for slot in job.slots:
            self._ctx.clear_seq(slot)
            self._slots[slot] = None
            self._free.append(slot)
        job.slots = []
        job.holder = -1
        job.finished = True
        self._jobs.remove(job)
        self._count_kv()
        duration = time.monotonic() - job.submitted
        self._mean_duration_s = 0.9 * self._mean_duration_s + 0.1 * duration

    def _decode(self, choices: list[Choice], outbox: Outbox) -> None:
        rows = self._max_decode_rows
        for start in range(0, len(choices), rows):
            group = choices[start : start + rows]
            batch = self._batch
            batch.clear()
            outputs = []
            for choice in group:
                outputs.append(
                    (choice, batch.add((choice.last_token,), choice.n_past, choice.slot, True))
                )
                choice.n_past += 1
            if self._run_batch(group, outbox):
                for choice, idx in outputs:
                    self._sample(choice, idx, outbox)

    def _run_batch(self, work: list[Choice] | list[Job], outbox: Outbox) -> bool:
        rc = self._ctx.decode(self._batch)
        if rc == 0:
            self.decoded_tokens += self._batch.n
            return True
        _log.error("llama_decode returned %d for a batch of %d tokens", rc, self._batch.n)
        jobs = dict.fromkeys(w.job if isinstance(w, Choice) else w for w in work)
        for job in jobs:  # once per job
            self._end(job)
            outbox.append((job.out, EngineFailure(f"llama_decode failed ({rc})")))
        return False

    def _collect_prompt_logprobs(self, job: Job, first: int, n: int) -> None:
        model = self._model
        start = job.n_past - n  # position of batch index `first`
        if start == 0:
            tok = job.prompt[0]
            job.prompt_logprobs.append(TokenLogprob(tok, model.piece(tok), None))
        top_n = job.logprobs or 0
        for j in range(n):
            pos = start + j
            if pos + 1 >= len(job.prompt):
                break
            nxt = job.prompt[pos + 1]
            lp, top = _logprobs(self._ctx.logits(first + j), nxt, top_n, model.piece)
            job.prompt_logprobs.append(TokenLogprob(nxt, model.piece(nxt), lp, top))

    def _sample(self, choice: Choice, idx: int, outbox: Outbox) -> None:
        assert choice.sampler is not None
        model = self._model
        token = choice.sampler.sample(self._ctx, idx)
        choice.last_token = token
        choice.generated += 1
        logprobs: tuple[TokenLogprob, ...] = ()
        if choice.logprobs is not None:
            lp, top = _logprobs(self._ctx.logits(idx), token, choice.logprobs, model.piece)
            logprobs = (TokenLogprob(token, model.piece(token), lp, top),)
        prompt_text = prompt_lp = None
        if choice.generated == 1 and choice.job.echo_prompt:
            prompt_text = choice.job.prompt_text
            prompt_lp = tuple(choice.job.prompt_logprobs)
        if model.is_eog(token):
            outbox.append((choice.out, choice.final("stop", "", logprobs, prompt_text, prompt_lp)))
            self._finish(choice)
            return
        text, stopped = choice.stop.feed(choice.utf8.feed(model.piece(token)))
        if stopped:
            outbox.append(
                (choice.out, choice.final("stop", text, logprobs, prompt_text, prompt_lp))
            )
            self._finish(choice)
        elif choice.generated >= choice.max_tokens:
            tail = text + choice.stop.feed(choice.utf8.flush())[0] + choice.stop.flush()
            outbox.append(
                (choice.out, choice.final("length", tail, logprobs, prompt_text, prompt_lp))
            )
            self._finish(choice)
        else:
            delta = GenerationDelta(
                text=text,
                n_tokens=1,
                logprobs=logprobs,
                prompt_text=prompt_text,
                prompt_logprobs=prompt_lp or (),
                index=choice.index,
            )
            outbox.append((choice.out, delta))

    def _fail_all(self, exc: BaseException) -> None:
        outbox: Outbox = []
        with self._cv:
            self._stopping = True
            waiting = list(self._pending)
            self._pending.clear()
            self._waiting_choices = 0
        for job in waiting:
            job.drop_grammars()
            job.finished = True
            outbox.append((job.out, exc))
        for job in list(self._jobs):
            self._end(job)
            outbox.append((job.out, exc))
        if outbox and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(_deliver, outbox)


def _deliver(outbox: Outbox) -> None:
    for queue, item in outbox:
        queue.put_nowait(item)


def _logprobs(
    logits: np.ndarray, token: int, top_n: int, piece: Callable[[int], bytes]
) -> tuple[float, tuple[tuple[int, bytes, float], ...]]:
    """log-softmax of the raw logits: the chosen token's value and the top `top_n`."""
    x = logits.astype(np.float64, copy=False)
    m = float(x.max())
    lse = m + float(np.log(np.exp(x - m).sum()))
    chosen = float(x[token]) - lse
    if top_n <= 0:
        return chosen, ()
    idx = np.argpartition(x, -top_n)[-top_n:]
    idx = idx[np.argsort(-x[idx])]
    return chosen, tuple((int(i), piece(int(i)), float(x[i]) - lse) for i in idx)
