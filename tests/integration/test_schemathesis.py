"""Property-based API testing: schemathesis generates requests from our served OpenAPI document
and checks every operation in-process: no 5xx, every response conforming to the schema."""

from __future__ import annotations

import asyncio

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from backends.echo import EchoEngine
from gateway.app import create_app
from gateway.config import load_settings
from gateway.registry import ModelRegistry, ServedModel

_engine = EchoEngine(context_length=4096)
asyncio.run(_engine.start())  # the app's lifespan does not run under the ASGI transport
_registry = ModelRegistry([ServedModel("echo", _engine)])
_registry.ready = True
app = create_app(load_settings(None, environ={}), registry=_registry)

schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
def test_api_conforms_to_its_schema(case: schemathesis.Case) -> None:
    # Not `positive_data_acceptance`: a schema-valid body can still be refused for reasons a JSON
    # schema cannot state (n > 1, a prompt longer than the context, unknown model ids).
    case.call_and_validate(
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
            response_headers_conformance,
            negative_data_rejection,
        ]
    )
