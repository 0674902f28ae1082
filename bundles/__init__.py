"""Signed, KMS-encrypted model bundles (lands with the bundle issue)."""

__all__: list[str] = []
