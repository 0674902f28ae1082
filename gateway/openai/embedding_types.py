"""The embeddings wire types (`POST /v1/embeddings`), as msgspec Structs."""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

__all__ = ["Embedding", "EmbeddingList", "EmbeddingUsage", "EmbeddingsRequest", "Input"]

# A string, a list of strings, token ids, or lists of token ids (checked by the handler, which
# names the offending item: msgspec cannot tell the list shapes apart in a union).
Input = str | list[str | int | list[int]]


class EmbeddingsRequest(Struct, forbid_unknown_fields=True, kw_only=True):
    model: str
    input: Input
    encoding_format: Literal["float", "base64"] | None = None  # None: float
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    user: Annotated[str, Meta(max_length=256)] | None = None  # accepted, never kept


class Embedding(Struct):
    index: int
    embedding: list[float] | str  # base64: the float32 little-endian bytes
    object: Literal["embedding"] = "embedding"


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Struct):
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage
    object: Literal["list"] = "list"
