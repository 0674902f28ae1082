"""Chat templates: a conversation -> prompt segments, with message content kept apart.

Templates are Jinja (the Hugging Face chat-template dialect) rendered in a sandbox.  The renderer
returns the prompt as segments so the engine can tokenise template text with special-token
parsing on and message content with it off: a user who writes `<end_of_turn>` in a message gets
those characters, never the control token (prompt-format injection).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from functools import lru_cache

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import InvalidGenerationRequest
from .tool_calls import prompt_messages
from .types import ChatMessage, ToolDefinition

__all__ = ["BUILTIN_TEMPLATES", "ChatTemplate", "PromptSegment"]

# Gemma's turn format.  Gemma has no system role: system/developer text opens the first user
# turn, as Google's reference template does.
_GEMMA = """{{ bos_token }}
{%- set ns = namespace(system="", first=true) %}
{%- for m in messages if m.role in ("system", "developer") %}
  {%- set ns.system = ns.system + m.content + "\n\n" %}
{%- endfor %}
{%- for m in messages if m.role not in ("system", "developer") %}
  {{- "<start_of_turn>" + ("model" if m.role == "assistant" else "user") + "\n" }}
  {%- if ns.first and m.role == "user" %}{{ ns.system }}{% set ns.first = false %}{% endif %}
  {{- m.content + "<end_of_turn>\n" }}
{%- endfor %}
{%- if ns.first and ns.system %}{{ raise_exception("a system message needs a user message") }}{% endif %}
{%- if add_generation_prompt %}{{ "<start_of_turn>model\n" }}{% endif %}"""

BUILTIN_TEMPLATES: dict[str, str] = {"gemma": _GEMMA}

PromptSegment = tuple[str, bool]  # (text, is_message_content)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False
    )
    env.globals["raise_exception"] = _raise
    return env.from_string(source)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


class ChatTemplate:
    """A compiled chat template.  `source` is a builtin name or Jinja text."""

    def __init__(self, source: str, *, bos_token: str = "<bos>", eos_token: str = "<eos>") -> None:
        text = BUILTIN_TEMPLATES.get(source, source)
        try:
            self._template = _compile(text)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat template does not compile: {exc.message}") from exc
        self._bos = bos_token
        self._eos = eos_token

    def render(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolDefinition] = ()
    ) -> list[PromptSegment]:
        """Render `messages` with a generation prompt; content segments are marked.  Tools and
        tool turns are written as the generic tool prompt (`backends.tool_calls`)."""
        if not messages:
            raise InvalidGenerationRequest("messages must not be empty", param="messages")
        if tools or any(m.role == "tool" or m.tool_calls for m in messages):
            messages = prompt_messages(messages, tools)
        # Content goes through the template as unguessable markers, then is put back as its own
        # segments.  A marker is private-use text plus a per-call random tag.
        tag = secrets.token_hex(8)
        marks = [f"\ue000{tag}:{i}\ue001" for i in range(len(messages))]
        proxies = [
            {"role": m.role, "content": mark} for m, mark in zip(messages, marks, strict=True)
        ]
        try:
            rendered = self._template.render(
                messages=proxies,
                add_generation_prompt=True,
                bos_token=self._bos,
                eos_token=self._eos,
            )
        except jinja2.TemplateError as exc:
            # Template errors are configuration mistakes or unsupported role orders; the message
            # names no content (content only exists as markers here).
            raise InvalidGenerationRequest(
                f"the model's chat template rejected this conversation: {exc}", param="messages"
            ) from exc
        segments: list[PromptSegment] = []
        rest = rendered
        lookup = {mark: m.content for mark, m in zip(marks, messages, strict=True)}
        prefix = f"\ue000{tag}:"
        while rest:
            start = rest.find(prefix)
            if start < 0:
                segments.append((rest, False))
                break
            end = rest.index("\ue001", start)
            if start:
                segments.append((rest[:start], False))
            segments.append((lookup[rest[start : end + 1]], True))
            rest = rest[end + 1 :]
        return segments
