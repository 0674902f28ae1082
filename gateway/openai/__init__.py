"""The OpenAI-compatible surface: one module per endpoint, wire types in `types`."""

__all__: list[str] = []
