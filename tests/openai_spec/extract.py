"""Extract the response schemas the gateway must match from OpenAI's OpenAPI document.

OpenAI publishes its API as one OpenAPI 3.1 document (repository `openai/openai-openapi`, file
`openapi.yaml`, about 3 MB).  The shape tests need a few of its component schemas: the
responses of the routes we serve and everything they `$ref`, transitively.  This script writes
that closure (20 kB of the 3 MB) as `openai-schemas.json` next to it, with a header
naming the commit it came from, so that the tests read a small vendored file and never the
network.

Usage, with `openapi.yaml` taken from the document's repository at the commit to vendor
(`git show <commit>:openapi.yaml > openapi.yaml` there):

    python tests/openai_spec/extract.py openapi.yaml \\
        --commit <commit id> --date <its commit date, YYYY-MM-DD>

Two rewrites:

- annotations (`description`, `title`, `example(s)`, `x-*` vendor extensions) are dropped:
  they are most of the bytes and none of the validation (no check changes);
- OpenAPI 3.0's `nullable: true`, which a few schemas still carry, is rewritten as
  `anyOf: [<schema>, {type: null}]`.  JSON Schema 2020-12 ignores `nullable`, so read
  literally those schemas would refuse the `finish_reason: null` of every streamed chunk
  OpenAI itself sends; generated clients (and the openai SDK's types) read it as "or null".
  The rewritten places are listed in the header.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOTS = (
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse",
    "ErrorResponse",
    "Error",
    "ListModelsResponse",
    "Model",
)
REPOSITORY = "openai/openai-openapi"
PREFIX = "#/components/schemas/"
OUTPUT = Path(__file__).with_name("openai-schemas.json")

# JSON Schema 2020-12 keywords whose value is a schema, a list of schemas, a map of schemas.
_SCHEMA = {
    "items",
    "additionalProperties",
    "not",
    "contains",
    "propertyNames",
    "if",
    "then",
    "else",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
}
_SCHEMA_LIST = {"anyOf", "oneOf", "allOf", "prefixItems"}
_SCHEMA_MAP = {"properties", "patternProperties", "$defs", "dependentSchemas"}
_ANNOTATIONS = {"description", "title", "example", "examples", "$comment"}


def load(path: Path) -> dict[str, Any]:
    """The document, from its YAML or JSON form (YAML needs PyYAML)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        doc: dict[str, Any] = json.loads(text)
        return doc
    import yaml

    class Loader(yaml.SafeLoader):
        """Dates stay strings, as they are in the JSON form of the same document."""

    Loader.yaml_implicit_resolvers = {
        first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    loaded: dict[str, Any] = yaml.load(text, Loader=Loader)  # a SafeLoader: data only
    return loaded


def clean(schema: Any, where: str, rewritten: list[str]) -> Any:
    """The schema without annotations, `nullable: true` rewritten (its place noted)."""
    if not isinstance(schema, dict):
        return schema  # a boolean schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _ANNOTATIONS or key.startswith("x-"):
            continue
        if key in _SCHEMA:
            value = clean(value, f"{where}/{key}", rewritten)
        elif key in _SCHEMA_LIST:
            value = [clean(s, f"{where}/{key}/{i}", rewritten) for i, s in enumerate(value)]
        elif key in _SCHEMA_MAP:
            value = {n: clean(s, f"{where}/{key}/{n}", rewritten) for n, s in value.items()}
        out[key] = value
    if out.pop("nullable", False):
        rewritten.append(where)
        return {"anyOf": [out, {"type": "null"}]}
    return out


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def closure(schemas: dict[str, Any], roots: tuple[str, ...]) -> dict[str, Any]:
    """The named schemas and every schema they reference, in the document's order."""
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for ref in refs(schemas[name]):
            if not ref.startswith(PREFIX):
                raise SystemExit(f"{name}: a reference outside the component schemas: {ref}")
            todo.append(ref.removeprefix(PREFIX))
    return {name: schema for name, schema in schemas.items() if name in seen}


def extract(doc: dict[str, Any], *, commit: str, date: str, source_path: str) -> dict[str, Any]:
    rewritten: list[str] = []
    picked = closure(doc["components"]["schemas"], ROOTS)
    schemas = {name: clean(s, f"{PREFIX}{name}", rewritten) for name, s in picked.items()}
    return {
        "$comment": (
            "A subset of OpenAI's OpenAPI document, written by tests/openai_spec/extract.py: "
            "the component schemas named in `source.roots` and all they reference. "
            "Annotations are dropped; `nullable: true` is rewritten as anyOf [schema, null] "
            "at the places listed in `source.nullable_rewritten`. Do not edit by hand."
        ),
        "source": {
            "repository": REPOSITORY,
            "commit": commit,
            "path": source_path,
            "commit_date": date,
            "openapi": doc["openapi"],
            "info_version": doc["info"]["version"],
            "extracted": dt.date.today().isoformat(),
            "roots": list(ROOTS),
            "nullable_rewritten": rewritten,
        },
        "components": {"schemas": schemas},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", type=Path, help="openapi.yaml (or .json) at the commit")
    parser.add_argument("--commit", required=True, help="the commit id the file comes from")
    parser.add_argument("--date", required=True, help="that commit's date (YYYY-MM-DD)")
    parser.add_argument("--source-path", default="openapi.yaml", help="its path in the repo")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    subset = extract(
        load(args.spec), commit=args.commit, date=args.date, source_path=args.source_path
    )
    args.output.write_text(json.dumps(subset, indent=1) + "\n", encoding="utf-8")
    print(f"{len(subset['components']['schemas'])} schemas -> {args.output.name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
