"""What compliance officers use: the audit API (search, export, verify)."""

__all__: list[str] = []
