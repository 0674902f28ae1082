"""What is done to the converter's GBNF before llama.cpp parses it (backends/llamacpp/_grammar.py):
escapes llama.cpp would reject, raw control characters JSON forbids, nesting that would crash
its recursive parser."""

from __future__ import annotations

import json

import pytest

from backends.errors import InvalidGenerationRequest
from backends.llamacpp._grammar import MAX_GROUP_DEPTH, gbnf_for, group_depth, plain_escapes
from backends.types import OutputConstraint


def test_escapes_llama_cpp_does_not_know_become_plain_inside_literals_only() -> None:
    gbnf = 'root ::= "a\\.b" [\\.x] "\\"q\\\\" "\\n" "\\x41"'
    assert plain_escapes(gbnf) == 'root ::= "a.b" [\\.x] "\\"q\\\\" "\\n" "\\x41"'


def test_an_email_pattern_compiles_to_a_literal_dot() -> None:
    schema = {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"}
    gbnf = gbnf_for(OutputConstraint(json.dumps(schema)))
    assert '"@"' in gbnf or "@" in gbnf
    assert "\\." not in gbnf


def test_json_strings_admit_no_raw_control_characters() -> None:
    gbnf = gbnf_for(OutputConstraint('{"type":"string"}'))
    assert 'char ::= [^"\\\\\\x7F\\x00-\\x1F]' in gbnf


def test_depth_counts_groups_outside_literals_and_classes() -> None:
    assert group_depth('root ::= ((a) (b ("(((")) [(((]') == 3


@pytest.mark.parametrize(
    "schema",
    [{"type": "string", "maxLength": 20000}, {"type": "string", "pattern": "^a{0,5000}$"}],
)
def test_a_grammar_nested_too_deeply_is_refused(schema: dict[str, object]) -> None:
    with pytest.raises(InvalidGenerationRequest, match="too complex"):
        gbnf_for(OutputConstraint(json.dumps(schema)))
    assert MAX_GROUP_DEPTH >= 1000  # maxLength 1000 still compiles
    gbnf_for(OutputConstraint('{"type": "string", "maxLength": 1000}'))


def test_a_trigger_opens_the_grammar() -> None:
    gbnf = gbnf_for(OutputConstraint('{"type":"array"}', trigger="<tool_call>"))
    assert gbnf.startswith('root ::= "<tool_call>" airgate-json\n')
    assert "\nroot ::=" not in gbnf
