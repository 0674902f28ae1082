"""Property-based API testing: schemathesis generates requests from our OpenAPI document and
checks every operation in-process: no 5xx, every response conforming to the schema.

The cases are generated at collection from the document the app serves (`openapi_document`; the
`app` fixture checks that it is the one served) and sent to an app on this module's own data dir
with one app key on every request, under a policy that keeps the shipped default's caps but
raises its rates: a few hundred generated requests in seconds would otherwise be answered 429
and test only the rate limiter.
"""

from __future__ import annotations

import ast
import asyncio
import linecache
import sys

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from litestar import Litestar
from litestar.testing import TestClient
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from backends.echo import EchoEngine
from gateway.access.keys import key_store
from gateway.app import create_app
from gateway.config import Settings, load_settings
from gateway.engines.registry import ModelRegistry, ServedModel
from gateway.routes import document as openapi_document

DOCUMENT = openapi_document("0")

POLICY = """
name = "schemathesis"
description = "The shipped default's caps; rates high enough for generated load."

[[rules]]
name = "inference"
roles = ["app"]
models = ["*"]
max_tokens = 4096
max_n = 1
max_prompt_bytes = 1048576
requests_per_minute = 600000
tokens_per_minute = 1000000000
concurrent_streams = 16
"""


@pytest.fixture(scope="module")
def api_settings(tmp_path_factory: pytest.TempPathFactory) -> Settings:
    data_dir = tmp_path_factory.mktemp("schemathesis-data")
    policy = data_dir / "policy.toml"
    policy.write_text(POLICY)
    return load_settings(
        None, environ={}, overrides={"data_dir": str(data_dir), "policy.path": str(policy)}
    )


@pytest.fixture(scope="module")
async def api_key(api_settings: Settings) -> str:
    async with key_store(api_settings) as store:
        key, _ = await store.create("app", name="test-schemathesis")
    return key


@pytest.fixture(scope="module")
def app(api_settings: Settings) -> Litestar:
    engine = EchoEngine(context_length=4096)
    # Started and marked ready up front: the app's lifespan (run by schemathesis's ASGI client)
    # loads engines in the background, and an early request would meet a 503.
    asyncio.run(engine.start())
    registry = ModelRegistry([ServedModel("echo", engine)])
    registry.ready = True
    app = create_app(api_settings, registry=registry)
    _parse_lambda_sources_up_front()
    served = TestClient(app).get("/openapi.json").json()  # public: no lifespan needed
    assert {**served, "info": None} == {**DOCUMENT, "info": None}
    return app


def _parse_lambda_sources_up_front() -> None:
    """Work around a CPython 3.11 bug that made this test flaky.

    Hypothesis describes a strategy's lambdas by parsing their source file, once per file, the
    first time it needs a description.  That can happen deep inside a draw, after hypothesis has
    raised the recursion limit, and there CPython 3.11.7's `ast.parse` can fail with
    "SystemError: AST constructor recursion depth mismatch" (seen once in three full runs).
    Parsing schemathesis's lambda-bearing modules into hypothesis's cache before the first case
    (the `app` fixture calls this) means no such parse happens mid-test.  Hypothesis's
    internals may move: then this does nothing."""
    try:
        from hypothesis.internal import lambda_sources
    except ImportError:
        return
    cache = getattr(lambda_sources, "AST_LAMBDAS_CACHE", None)
    extract = getattr(lambda_sources, "extract_all_lambdas", None)
    if cache is None or extract is None:
        return
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if name.split(".")[0] != "schemathesis" or not path.endswith(".py"):
            continue
        lines = tuple(linecache.getlines(path, module.__dict__))
        if lines and any("lambda" in line for line in lines):
            cache[lines] = extract(ast.parse("".join(lines)))


schema = schemathesis.openapi.from_dict(DOCUMENT)


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case: schemathesis.Case, app: Litestar, api_key: str) -> None:
    # Not `positive_data_acceptance`: a schema-valid body can still be refused for reasons a JSON
    # schema cannot state (n > 1, a prompt longer than the context, unknown model ids).
    case.call_and_validate(
        app=app,
        headers={"Authorization": f"Bearer {api_key}"},
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            response_headers_conformance,
            negative_data_rejection,
        ],
    )
