"""Policy-as-code: typed policy documents and a pure `decide()` (lands with the policy issue)."""

__all__: list[str] = []
