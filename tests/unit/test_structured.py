"""Output schemas are checked before anything is generated (backends/structured.py): what both
engines can enforce passes as canonical text; what they cannot is refused naming the keyword,
never the client's property names."""

from __future__ import annotations

import json
from typing import Any

import pytest

from backends.errors import InvalidGenerationRequest
from backends.structured import MAX_SCHEMA_BYTES, canonical, check_schema

PARAM = "response_format.json_schema.schema"


def refused(schema: Any) -> str:
    with pytest.raises(InvalidGenerationRequest) as caught:
        check_schema(schema, param=PARAM)
    assert caught.value.param == PARAM
    return str(caught.value)


def test_a_pydantic_style_schema_passes_with_its_key_order_kept() -> None:
    schema = {
        "title": "Person",
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "tags": {"type": "array", "items": {"$ref": "#/$defs/Tag"}, "maxItems": 3},
            "kind": {"enum": ["a", "b"]},
            "born": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
        },
        "required": ["name", "tags", "kind"],
        "additionalProperties": False,
        "$defs": {"Tag": {"type": "string", "pattern": "^[a-z]+$"}},
    }
    text = check_schema(schema, param=PARAM)
    assert text == canonical(schema)
    assert list(json.loads(text)["properties"]) == ["name", "tags", "kind", "born"]


@pytest.mark.parametrize(
    "keyword, value",
    [
        ("minimum", 0),
        ("maximum", 9),
        ("exclusiveMinimum", 0),
        ("multipleOf", 2),
        ("uniqueItems", True),
        ("minProperties", 1),
        ("patternProperties", {}),
        ("not", {"type": "string"}),
        ("if", {"type": "string"}),
        ("contains", {"type": "string"}),
    ],
)
def test_a_keyword_that_cannot_be_enforced_is_refused_by_name(keyword: str, value: Any) -> None:
    secret_name = "patient_ssn_field"
    message = refused({"type": "object", "properties": {secret_name: {keyword: value}}})
    assert f"'{keyword}'" in message
    assert secret_name not in message


@pytest.mark.parametrize(
    "schema, says",
    [
        ([1, 2], "not a JSON schema"),
        ("a string", "not a JSON schema"),
        ({"type": "color"}, "'type'"),
        ({"properties": []}, "'properties'"),
        ({"anyOf": []}, "'anyOf'"),
        ({"type": "string", "pattern": "[a-z]+"}, "anchored"),
        ({"type": "string", "format": "email"}, "'format'"),
        ({"$ref": "https://example.com/schema.json"}, "not local"),
        ({"$ref": "#/$defs/Missing"}, "points nowhere"),
        ({"x-private-extension": 1}, "does not know"),
        ({"type": "array", "maxItems": "3"}, "'maxItems'"),
    ],
)
def test_what_is_not_a_usable_schema_is_refused(schema: Any, says: str) -> None:
    assert says in refused(schema)


def test_a_recursive_reference_is_refused() -> None:
    tree = {
        "$ref": "#/$defs/Node",
        "$defs": {
            "Node": {
                "type": "object",
                "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
            }
        },
    }
    assert "recursive" in refused(tree)
    mutual = {
        "$ref": "#/$defs/A",
        "$defs": {"A": {"$ref": "#/$defs/B"}, "B": {"anyOf": [{"$ref": "#/$defs/A"}]}},
    }
    assert "recursive" in refused(mutual)


def test_a_reference_used_twice_is_not_recursion() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/X"}, "b": {"$ref": "#/$defs/X"}},
        "$defs": {"X": {"type": "integer"}},
    }
    assert check_schema(schema, param=PARAM)


def test_a_schema_over_the_size_cap_is_refused_before_it_is_walked() -> None:
    big = {"type": "object", "description": "x" * MAX_SCHEMA_BYTES}
    assert "too large" in refused(big)
    megabyte = {"enum": ["v" * 1000] * 1000}
    assert "too large" in refused(megabyte)


def test_nesting_and_subschema_counts_are_capped() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(40):
        deep = {"type": "array", "items": deep}
    assert "nested too deeply" in refused(deep)
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(5000)}}
    assert "too many" in refused(wide) or "too large" in refused(wide)


def test_nan_is_not_json() -> None:
    assert "not a JSON schema" in refused({"const": float("nan")})
