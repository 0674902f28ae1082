"""The OpenAI protocol adapter: decode the wire format into the pipeline's facts, encode its
events as OpenAI's JSON and SSE.

    chat         POST /v1/chat/completions
    completions  POST /v1/completions
    models       GET /v1/models, /v1/models/{id}
    types        the wire Structs;  sampling  the fields chat and completions share
    sse          SSE framing;  schema  the OpenAPI operations of these routes
"""

__all__: list[str] = []
