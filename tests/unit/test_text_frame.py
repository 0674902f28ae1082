"""A pre-encoded SSE text frame is byte for byte the frame of the chunk struct it stands for."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.openai import types as t
from gateway.openai.sse import TextFrame, sse


def _chat(text: str) -> t.ChatCompletionChunk:
    return t.ChatCompletionChunk("chatcmpl-1", 1, "m", [t.ChunkChoice(0, t.Delta(content=text))])


def _completion(text: str) -> t.Completion:
    return t.Completion("cmpl-1", 1, "m", [t.CompletionChoice(3, text, None)])


@given(st.text())
def test_frames_equal_the_encoded_chunks(text: str) -> None:
    # any text: quotes, backslashes, control characters (the placeholder's own), emoji
    assert TextFrame(_chat)(text) == sse(_chat(text))
    assert TextFrame(_completion)(text) == sse(_completion(text))


def test_a_chunk_must_carry_the_text_once() -> None:
    with pytest.raises(ValueError, match="exactly once"):
        TextFrame(lambda text: t.Completion("c", 1, "m", [t.CompletionChoice(0, "x", None)]))
    with pytest.raises(ValueError, match="exactly once"):
        TextFrame(
            lambda text: t.Completion(
                "c", 1, "m", [t.CompletionChoice(0, text, None), t.CompletionChoice(1, text, None)]
            )
        )
