"""Ollama's `options` -> the pipeline's sampling, the same `SamplingParams` the OpenAI adapter
builds.  Every option of Ollama's `Options` is known here and falls in one of three groups:

- mapped: temperature, top_p, top_k, min_p, seed (negative: a random seed), num_predict (-> the
  completion's length; -1, -2 or absent: up to the end of the context, airgate's default),
  stop, repeat_penalty (-> repetition_penalty), presence_penalty, frequency_penalty, and
  num_ctx (accepted up to the model's context length, which stays what it is; above: a 400);
- refused when they would change the answer and airgate cannot do it: mirostat (unless 0),
  tfs_z and typical_p (unless 1.0), repeat_last_n while a penalty applies (airgate's penalties
  cover the whole completion, not a window);
- accepted and ignored, because they change how a server runs a model, never what it answers
  (`IGNORED`): numa, num_batch, num_gpu, main_gpu, low_vram, f16_kv, logits_all, vocab_only,
  use_mmap, use_mlock, embedding_only, num_thread, num_keep, penalize_newline, and
  mirostat_tau / mirostat_eta (which only act with mirostat).

An option left out takes airgate's default (plain sampling at temperature 1.0, no top-k or
top-p), as an OpenAI request without it does; not Ollama's (0.8, 40, 0.9, repeat_penalty 1.1).
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

from backends.types import SamplingParams

from ..errors import InvalidRequest, UnsupportedParameter

__all__ = ["IGNORED", "Mapped", "Options", "check_context", "mapped"]

IGNORED = (
    "numa",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "use_mmap",
    "use_mlock",
    "embedding_only",
    "num_thread",
    "num_keep",
    "penalize_newline",
    "mirostat_tau",
    "mirostat_eta",
)

Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
StopList = Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(max_length=16)]


class Options(Struct, forbid_unknown_fields=True, kw_only=True):
    # mapped (the ranges are the OpenAI adapter's)
    temperature: Annotated[float, Meta(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Meta(ge=0, le=1_000_000)] | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    seed: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    num_predict: Annotated[int, Meta(ge=-2, le=1_048_576)] | None = None
    stop: StopList | None = None
    repeat_penalty: Annotated[float, Meta(gt=0.0, le=2.0)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    num_ctx: Annotated[int, Meta(ge=1)] | None = None
    # refused unless neutral
    mirostat: int | None = None
    tfs_z: float | None = None
    typical_p: float | None = None
    repeat_last_n: int | None = None
    # accepted and ignored (IGNORED)
    numa: bool | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None
    num_thread: int | None = None
    num_keep: int | None = None
    penalize_newline: bool | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None


_NONE = Options()


class Mapped(Struct, frozen=True, kw_only=True):
    """The options as the pipeline takes them: sampling, the completion's length (None: up to
    the context's end, within the policy's cap), stop strings, and the audit's numbers."""

    sampling: SamplingParams
    max_tokens: int | None
    stop: tuple[str, ...]
    audit: dict[str, bool | int | float]


def check_context(options: Options | None, context_length: int) -> None:
    """num_ctx may ask for less context than the model has (it changes nothing), never more."""
    if options is not None and options.num_ctx is not None and options.num_ctx > context_length:
        raise InvalidRequest(
            f"options.num_ctx must be at most {context_length}, this model's context length.",
            param="options.num_ctx",
        )


def mapped(options: Options | None, *, stream: bool) -> Mapped:
    """The pipeline's sampling from `options` (a 400 naming an option airgate cannot honour)."""
    o = options or _NONE
    if o.mirostat not in (None, 0):
        raise _refused(
            "mirostat", "is not supported (no mirostat sampling): send 0 or leave it out"
        )
    for name in ("tfs_z", "typical_p"):
        if getattr(o, name) not in (None, 1.0):
            raise _refused(name, "is not supported: send 1.0 or leave it out")
    penalised = o.repeat_penalty not in (None, 1.0) or bool(
        o.presence_penalty or o.frequency_penalty
    )
    if o.repeat_last_n is not None and penalised:
        raise _refused(
            "repeat_last_n",
            "is not supported: penalties cover the whole completion here",
        )
    if o.num_predict == 0:
        raise InvalidRequest(
            "options.num_predict must be at least 1, or -1 for no limit.",
            param="options.num_predict",
        )
    sampling = SamplingParams(
        temperature=1.0 if o.temperature is None else o.temperature,
        top_p=1.0 if o.top_p is None else o.top_p,
        top_k=o.top_k or 0,
        min_p=o.min_p or 0.0,
        seed=None if o.seed is None or o.seed < 0 else o.seed & 0xFFFFFFFF,
        repetition_penalty=o.repeat_penalty or 1.0,
        presence_penalty=o.presence_penalty or 0.0,
        frequency_penalty=o.frequency_penalty or 0.0,
    )
    max_tokens = o.num_predict if o.num_predict is not None and o.num_predict > 0 else None
    audit: dict[str, bool | int | float] = {"stream": stream}
    for name, value in (
        ("temperature", o.temperature),
        ("top_p", o.top_p),
        ("top_k", o.top_k),
        ("min_p", o.min_p),
        ("presence_penalty", o.presence_penalty),
        ("frequency_penalty", o.frequency_penalty),
        ("repetition_penalty", o.repeat_penalty),
        ("seed", o.seed),
        ("max_tokens", max_tokens),
    ):
        if value is not None:
            audit[name] = value
    return Mapped(sampling=sampling, max_tokens=max_tokens, stop=tuple(o.stop or ()), audit=audit)


def _refused(name: str, why: str) -> UnsupportedParameter:
    return UnsupportedParameter(f"options.{name} {why}.", param=f"options.{name}")
