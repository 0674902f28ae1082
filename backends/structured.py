"""JSON schemas a client asks the output to follow: checked once, before anything is generated.

Both engines enforce a schema while sampling (llama.cpp through a GBNF grammar converted from
it, vLLM through xgrammar).  A keyword the llama.cpp converter would silently drop (`minimum`,
`uniqueItems`, ...) would make the output *look* constrained while it is not, so every schema is
checked against one allowlist here and refused, naming the keyword, when it asks for what
neither engine can promise.  Checked schemas travel as canonical JSON text: the engines cache
compiled grammars by its hash.

Errors name the request field and, where it is a JSON-schema keyword we know, that keyword;
never a property name or any other client text.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from .errors import InvalidGenerationRequest

__all__ = [
    "ANY_JSON_OBJECT",
    "MAX_SCHEMA_BYTES",
    "canonical",
    "check_schema",
    "schema_key",
]

MAX_SCHEMA_BYTES = 64 * 1024  # canonical text; realistic schemas are a few KiB
MAX_DEPTH = 32  # nested schemas
MAX_NODES = 4096  # subschemas in one document
ANY_JSON_OBJECT = '{"type":"object"}'  # response_format json_object

# Keywords that change nothing about the output.
_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$schema",
        "$id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)
# Keywords both engines enforce.
_ENFORCED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "$defs",
        "definitions",
        "minLength",
        "maxLength",
        "pattern",
        "format",
    }
)
# Standard keywords the llama.cpp converter ignores or rejects: refused by name.
_NOT_ENFORCED = frozenset(
    {
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "uniqueItems",
        "minProperties",
        "maxProperties",
        "patternProperties",
        "propertyNames",
        "contains",
        "minContains",
        "maxContains",
        "dependentRequired",
        "dependentSchemas",
        "dependencies",
        "not",
        "if",
        "then",
        "else",
        "unevaluatedProperties",
        "unevaluatedItems",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
        "$anchor",
        "$dynamicRef",
        "$dynamicAnchor",
        "$recursiveRef",
        "$vocabulary",
    }
)
_TYPES = frozenset({"string", "number", "integer", "boolean", "object", "array", "null"})
_FORMATS = frozenset({"date", "time", "date-time", "uuid"})
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


def canonical(schema: Any) -> str:
    """Compact JSON text; key order kept (it is the order properties are generated in)."""
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def schema_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def check_schema(schema: Any, *, param: str) -> str:
    """The schema's canonical text, or InvalidGenerationRequest naming `param` (and the
    keyword) when it is not a schema, is too large, or asks for what cannot be enforced."""
    if not isinstance(schema, dict):
        raise _bad(param, "is not a JSON schema (a JSON object is expected)")
    try:
        text = canonical(schema)
    except (ValueError, TypeError):
        raise _bad(param, "is not a JSON schema (it holds a value JSON cannot carry)") from None
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise _bad(param, f"is too large (at most {MAX_SCHEMA_BYTES // 1024} KiB)")
    for nodes, (node, depth) in enumerate(_walk(schema, param), 1):
        if nodes > MAX_NODES:
            raise _bad(param, f"has too many subschemas (at most {MAX_NODES})")
        if depth > MAX_DEPTH:
            raise _bad(param, f"is nested too deeply (at most {MAX_DEPTH} levels)")
        _check_node(node, schema, param)
    _check_refs(schema, param)
    return text


def _bad(param: str, what: str) -> InvalidGenerationRequest:
    return InvalidGenerationRequest(f"'{param}' {what}.", param=param)


def _walk(schema: dict[str, Any], param: str) -> Iterator[tuple[dict[str, Any], int]]:
    stack: list[tuple[Any, int]] = [(schema, 0)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, bool):  # `true` / `false` are schemas too
            continue
        if not isinstance(node, dict):
            raise _bad(param, "holds a subschema that is not a JSON object")
        yield node, depth
        for key in _SCHEMA_MAPS:
            children = node.get(key)
            if children is None:
                continue
            if not isinstance(children, dict):
                raise _bad(param, f"has a '{key}' that is not an object")
            stack.extend((child, depth + 1) for child in children.values())
        for key in _SCHEMA_LISTS:
            children = node.get(key)
            if children is None:
                continue
            if not isinstance(children, list) or not children:
                raise _bad(param, f"has a '{key}' that is not a non-empty array")
            stack.extend((child, depth + 1) for child in children)
        for key in ("items", "additionalProperties"):
            child = node.get(key)
            if child is not None:
                stack.append((child, depth + 1))


def _check_node(node: dict[str, Any], root: dict[str, Any], param: str) -> None:
    for key in node:
        if key in _ENFORCED or key in _ANNOTATIONS:
            continue
        if key in _NOT_ENFORCED:
            raise _bad(
                param,
                f"uses the keyword '{key}', which constrained decoding cannot enforce "
                "(remove it, or check that constraint in your application)",
            )
        if key == "nullable" or key == "strict":  # OpenAPI 3.0 / OpenAI extras, harmless
            continue
        raise _bad(param, "uses a keyword this server does not know")
    kind = node.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if kind is not None else []
    if not all(isinstance(k, str) and k in _TYPES for k in kinds):
        raise _bad(param, "has a 'type' that is not a JSON-schema type")
    required = node.get("required")
    if required is not None and (
        not isinstance(required, list) or not all(isinstance(r, str) for r in required)
    ):
        raise _bad(param, "has a 'required' that is not an array of strings")
    for key in ("minItems", "maxItems", "minLength", "maxLength"):
        value = node.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise _bad(param, f"has a '{key}' that is not an integer")
        if isinstance(value, int) and not 0 <= value <= 100_000:
            raise _bad(param, f"has a '{key}' out of range")
    enum = node.get("enum")
    if enum is not None and (not isinstance(enum, list) or not enum):
        raise _bad(param, "has an 'enum' that is not a non-empty array")
    pattern = node.get("pattern")
    if pattern is not None and (
        not isinstance(pattern, str) or not pattern.startswith("^") or not pattern.endswith("$")
    ):
        raise _bad(param, "has a 'pattern' that is not anchored (it must start with ^, end with $)")
    fmt = node.get("format")
    if fmt is not None and fmt not in _FORMATS:
        raise _bad(
            param,
            "uses a 'format' that constrained decoding cannot enforce "
            f"(supported: {', '.join(sorted(_FORMATS))})",
        )
    ref = node.get("$ref")
    if ref is not None:
        if not isinstance(ref, str) or not ref.startswith("#/"):
            raise _bad(param, "has a '$ref' that is not local (only '#/...' references)")
        if _resolve(root, ref) is None:
            raise _bad(param, "has a '$ref' that points nowhere")


def _resolve(root: dict[str, Any], ref: str) -> Any:
    target: Any = root
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            return None
    return target


def _check_refs(root: dict[str, Any], param: str) -> None:
    """Refuse reference cycles: a recursive schema has no finite grammar in every engine."""
    edges: dict[str, set[str]] = {}

    def refs_in(node: Any) -> set[str]:
        found: set[str] = set()
        stack = [node]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                ref = item.get("$ref")
                if isinstance(ref, str):
                    found.add(ref)
                stack.extend(v for k, v in item.items() if k not in ("$defs", "definitions"))
            elif isinstance(item, list):
                stack.extend(item)
        return found

    pending = sorted(refs_in(root))
    while pending:
        ref = pending.pop()
        if ref in edges:
            continue
        edges[ref] = refs_in(_resolve(root, ref))
        pending.extend(edges[ref] - edges.keys())
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(ref: str) -> None:
        state[ref] = 1
        for nxt in edges.get(ref, ()):
            if state.get(nxt) == 1:
                raise _bad(param, "has a recursive '$ref' (recursive schemas are not supported)")
            if nxt not in state:
                visit(nxt)
        state[ref] = 2

    for ref in list(edges):
        if ref not in state:
            visit(ref)
