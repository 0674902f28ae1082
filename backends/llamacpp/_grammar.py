"""Output constraints -> llama.cpp grammar samplers, compiled off the scheduler thread.

A JSON schema becomes GBNF through llama-cpp-python's converter (`json_schema_to_gbnf`), and
the GBNF a grammar sampler (`llama_sampler_init_grammar`: llama.cpp parses it).  Both steps run
in one worker thread of their own, under a time budget, and the parsed sampler is cached by the
constraint's hash: each request clones it (a copy of the parsed rules) and adds the clone to its
sampler chain.  A pathological schema therefore costs at most one worker for its budget, once;
it never stalls the decode loop, and a repeat is refused from the cache at once.

With a trigger (tool_choice "auto") the grammar is lazy: free text until the trigger appears,
then the trigger and the JSON that must follow it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import llama_cpp as ll
from llama_cpp.llama_grammar import json_schema_to_gbnf

from ..errors import InvalidGenerationRequest
from ..structured import schema_key
from ..types import OutputConstraint
from ._native import Model

__all__ = ["MAX_GROUP_DEPTH", "GrammarCache", "gbnf_for", "group_depth"]

_ROOT = re.compile(r"^root ::= ", re.M)
# llama.cpp parses GBNF recursively: a repetition bound the converter writes as nested groups
# (`maxLength: 20000`, `pattern: "^a{0,20000}$"`) overflows its stack and kills the process.
# Grammars nested deeper than this are refused before llama.cpp sees them.
MAX_GROUP_DEPTH = 1024


# The converter lets a JSON string hold raw control characters, which JSON forbids (a strict
# parser refuses the output): they must be escaped, as in llama.cpp's own converter.
_LOOSE_CHAR = 'char ::= [^"\\\\] |'
_JSON_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


# Inside a GBNF literal llama.cpp knows only these escapes; the converter copies a pattern's
# `\.` (every e-mail pattern has one) into a literal as is, and llama.cpp rejects the grammar.
_KNOWN_ESCAPE = frozenset('xuUtrn\\"[]')


def plain_escapes(gbnf: str) -> str:
    """`\\.` and its like, inside literals only, as the plain character they stand for."""
    out: list[str] = []
    i, n = 0, len(gbnf)
    closing: str | None = None  # '"' inside a literal, "]" inside a character class
    while i < n:
        ch = gbnf[i]
        if closing is None:
            if ch in '"[':
                closing = '"' if ch == '"' else "]"
        elif ch == "\\" and i + 1 < n:
            nxt = gbnf[i + 1]
            if closing == '"' and nxt not in _KNOWN_ESCAPE:
                out.append(nxt)
            else:
                out.append(gbnf[i : i + 2])
            i += 2
            continue
        elif ch == closing:
            closing = None
        out.append(ch)
        i += 1
    return "".join(out)


def gbnf_for(constraint: OutputConstraint) -> str:
    """The GBNF text of a constraint (the converter raises on what it cannot express)."""
    gbnf: str = json_schema_to_gbnf(constraint.schema).replace(_LOOSE_CHAR, _JSON_CHAR)
    gbnf = plain_escapes(gbnf)
    if group_depth(gbnf) > MAX_GROUP_DEPTH:
        raise InvalidGenerationRequest(
            "the output schema is too complex: a length or repetition bound is too large to "
            "compile (keep minLength/maxLength/minItems/maxItems and pattern bounds small)",
            param=constraint.param,
        )
    if constraint.trigger is None:
        return gbnf
    body = _ROOT.sub("airgate-json ::= ", gbnf, count=1)
    trigger = constraint.trigger.replace("\\", "\\\\").replace('"', '\\"')
    return f'root ::= "{trigger}" airgate-json\n{body}'


def group_depth(gbnf: str) -> int:
    """How deeply the grammar's parentheses nest (outside literals and character classes)."""
    depth = deepest = 0
    quote: str | None = None
    escaped = False
    for ch in gbnf:
        if quote is not None:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
        elif ch == '"':
            quote = '"'
        elif ch == "[":
            quote = "]"
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest


_stderr_lock = threading.Lock()


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """While llama.cpp parses a grammar, its stderr goes nowhere: on a parse error it prints
    the whole grammar there (`fprintf(stderr, ...)`, not through its log callback), and a
    grammar holds the client's schema (property names, enum values, constants).  File
    descriptor 2 is the process's: another thread's write to it in this millisecond is lost,
    which is the price of never printing a schema."""
    with _stderr_lock:
        sys.stderr.flush()
        saved = os.dup(2)
        try:
            with open(os.devnull, "wb") as null:
                os.dup2(null.fileno(), 2)
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


class _Compiled:
    __slots__ = ("ptr", "seconds")

    def __init__(self, ptr: Any, seconds: float) -> None:
        self.ptr = ptr
        self.seconds = seconds


class GrammarCache:
    """Parsed grammar samplers by constraint, compiled in a worker thread under a budget."""

    def __init__(self, model: Model, *, budget_s: float = 5.0, size: int = 256) -> None:
        self._model = model
        self._budget_s = budget_s
        self._size = size
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="airgate-grammar")
        self._entries: OrderedDict[str, asyncio.Future[_Compiled]] = OrderedDict()
        self.compiles = 0  # grammars compiled (a cache hit compiles nothing)
        self.last_compile_s = 0.0

    async def sampler(self, constraint: OutputConstraint) -> Any:
        """A fresh grammar sampler for one sequence (its chain takes ownership)."""
        key = schema_key(f"{constraint.trigger}\x00{constraint.schema}")
        entry = self._entries.get(key)
        if entry is None:
            loop = asyncio.get_running_loop()
            entry = asyncio.wrap_future(self._pool.submit(self._compile, constraint), loop=loop)
            self._entries[key] = entry
            while len(self._entries) > self._size:
                _, old = self._entries.popitem(last=False)
                old.add_done_callback(_free)
        else:
            self._entries.move_to_end(key)
        try:
            compiled = await asyncio.wait_for(asyncio.shield(entry), self._budget_s)
        except TimeoutError:
            raise InvalidGenerationRequest(
                f"the output schema is too complex: its grammar did not compile within "
                f"{self._budget_s:g} s",
                param=constraint.param,
            ) from None
        return ll.llama_sampler_clone(compiled.ptr)

    def _compile(self, constraint: OutputConstraint) -> _Compiled:
        started = time.perf_counter()
        try:
            gbnf = gbnf_for(constraint)
        except InvalidGenerationRequest:
            raise
        except (AssertionError, ValueError, KeyError, TypeError, RecursionError):
            # the converter's own checks (an unsupported regex, a ref it cannot resolve)
            raise InvalidGenerationRequest(
                "the output schema cannot be turned into a grammar (an unsupported pattern or "
                "reference)",
                param=constraint.param,
            ) from None
        vocab = self._model.vocab
        with _stderr_silenced():
            ptr = self._parse(vocab, gbnf, constraint)
        if not ptr:
            raise InvalidGenerationRequest(
                "the output schema produced a grammar llama.cpp rejects", param=constraint.param
            )
        seconds = time.perf_counter() - started
        self.compiles += 1
        self.last_compile_s = seconds
        return _Compiled(ptr, seconds)

    @staticmethod
    def _parse(vocab: Any, gbnf: str, constraint: OutputConstraint) -> Any:
        if constraint.trigger is None:
            ptr = ll.llama_sampler_init_grammar(vocab, gbnf.encode(), b"root")
        else:
            # the grammar starts where the trigger does, anywhere in the text
            pattern = "^[\\s\\S]*?(" + re.escape(constraint.trigger) + ")[\\s\\S]*"
            patterns = (ctypes.c_char_p * 1)(pattern.encode())
            ptr = ll.llama_sampler_init_grammar_lazy_patterns(
                vocab, gbnf.encode(), b"root", patterns, 1, None, 0
            )
        return ptr

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for entry in self._entries.values():
            _free(entry)
        self._entries.clear()


def _free(entry: asyncio.Future[_Compiled]) -> None:
    if entry.done() and not entry.cancelled() and entry.exception() is None:
        ll.llama_sampler_free(entry.result().ptr)
