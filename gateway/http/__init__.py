"""The HTTP edge: what every request meets before and after a protocol adapter.

request_log  the request id, one metadata-only log line per request, the route template
decode       JSON bodies -> msgspec Structs, with the OpenAI error envelope on failure
health       /health, /ready, /metrics
tls          serving TLS and handing the client certificate to the app (mTLS)
"""

__all__: list[str] = []
