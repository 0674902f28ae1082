"""airgate's gateway: HTTP surface, configuration, CLI and everything request-scoped."""

__all__: list[str] = []
