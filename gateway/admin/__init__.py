"""The admin API: API keys (create, list, revoke).  Admin role only; every call audited."""

__all__: list[str] = []
