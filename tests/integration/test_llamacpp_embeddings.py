"""The llama.cpp embedder on the real all-MiniLM-L6-v2, converted to GGUF by our own converter:
its vectors against sentence-transformers' on the same model, packing (many inputs, concurrent
requests) against one input at a time, and what it refuses before computing anything.  Also the
default embedding bundle: sealed from memory, opened, served.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from backends.errors import ContextLengthExceeded, EngineOverloaded, InvalidGenerationRequest
from backends.llamacpp import LlamaCppEmbedder, LlamaCppEmbedderOptions
from backends.llamacpp.bert_gguf import bert_to_gguf
from backends.types import EmbeddingRequest, GenerationRequest
from bundles import open_bundle
from gateway.config import load_settings
from gateway.engines.key_providers import KeyProviders
from gateway.engines.runtime import build_registry
from gateway.engines.sources import (
    DEFAULT_EMBEDDING_MODEL_ID,
    BundleSource,
    ensure_default_embedding_bundle,
    trusted_keys,
)

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A man is playing a guitar on stage.",
    "Quantum entanglement links particles across large distances.",
    "I love pizza with extra cheese!",
    "How do I reset my password?",
    "Le chat est assis sur le tapis.",
    "Naïve café résumé — accents and dashes",
    "1234 5678 90",
    "",
    "Short.",
    "Stock markets fell sharply on Tuesday after the central bank raised interest rates by half "
    "a point, surprising analysts who had expected a pause.",
    "def add(a, b): return a + b",
    "東京は日本の首都です。",
    "Emojis 🚀🔥 are fun",
    "The mitochondria is the powerhouse of the cell.",
    "Can you recommend a good book about history?",
    "THE WEATHER TODAY IS SUNNY, with a chance of rain in the evening.",
    "Photosynthesis converts light energy into chemical energy.",
    'He said: "Don\'t go there!" and left.',
    "  leading\tand trailing   whitespace \n",
]
CONTEXT = 512  # the engine's own tests: MiniLM's position embeddings
SERVED_CONTEXT = 256  # what the default bundle says: its declared max_seq_length
# Packing changes the order of some float sums in llama.cpp (measured: |diff| <= 1.5e-4 per
# component); a meaning-changing error would be orders of magnitude larger.
SAME_COSINE = 0.99999
SAME_ABS = 1e-3


def cosines(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return np.asarray((a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1))


def assert_same(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> None:
    assert a.shape == b.shape
    assert cosines(a, b).min() >= SAME_COSINE
    assert np.abs(a - b).max() <= SAME_ABS


def request(*inputs: str | tuple[int, ...], **kw: Any) -> EmbeddingRequest:
    return EmbeddingRequest(request_id="emb-test", inputs=tuple(inputs), **kw)


@pytest.fixture(scope="session")
def minilm_gguf(minilm_dir: Path) -> bytes:
    """The GGUF the default embedding bundle holds (converted as `sources` converts it)."""
    return bert_to_gguf(lambda name: (minilm_dir / name).read_bytes(), name="all-MiniLM-L6-v2")


@pytest.fixture(scope="session")
def sentence_transformer(minilm_dir: Path) -> Any:
    from sentence_transformers import SentenceTransformer  # imports torch: only here

    return SentenceTransformer(str(minilm_dir), device="cpu")


@pytest.fixture(scope="session")
async def embedder(minilm_gguf: bytes) -> AsyncIterator[LlamaCppEmbedder]:
    """The real llama.cpp embedder, once per session: 16 inputs or 512 tokens per decode, 4
    requests waiting at most; the GGUF comes from a memfd, as a bundle's would."""
    fd = os.memfd_create("airgate-test-minilm")
    try:
        os.write(fd, minilm_gguf)
        eng = LlamaCppEmbedder(
            fd,
            LlamaCppEmbedderOptions(batch_size=512, sequences=16, max_waiting=4, n_threads=2),
        )
        await eng.start()
        yield eng
        await eng.stop()
    finally:
        os.close(fd)


async def one_by_one(
    embedder: LlamaCppEmbedder, inputs: list[str | tuple[int, ...]]
) -> npt.NDArray[np.float32]:
    rows = [(await embedder.embed(request(item))).vectors[0] for item in inputs]
    return np.stack(rows)


async def test_what_the_engine_says_about_itself(embedder: LlamaCppEmbedder) -> None:
    assert (embedder.name, embedder.task) == ("llama.cpp", "embed")
    assert embedder.embedding_size == 384
    assert embedder.context_length == CONTEXT
    assert embedder.truncatable is False


async def test_vectors_match_sentence_transformers(
    embedder: LlamaCppEmbedder, sentence_transformer: Any
) -> None:
    reference = sentence_transformer.encode(SENTENCES, normalize_embeddings=True)
    result = await embedder.embed(request(*SENTENCES))
    assert result.vectors.dtype == np.float32
    assert result.vectors.shape == (len(SENTENCES), 384)
    assert np.allclose(np.linalg.norm(result.vectors, axis=1), 1.0, atol=1e-6)
    assert cosines(result.vectors, reference).min() >= 0.999
    # the same tokens as the model's own tokenizer ([CLS] ... [SEP] counted)
    hf_ids = sentence_transformer.tokenizer(SENTENCES)["input_ids"]
    assert result.prompt_tokens == tuple(len(ids) for ids in hf_ids)


async def test_token_ids_embed_like_their_text(
    embedder: LlamaCppEmbedder, sentence_transformer: Any
) -> None:
    ids = tuple(sentence_transformer.tokenizer(SENTENCES[0])["input_ids"])
    result = await embedder.embed(request(SENTENCES[0], ids))
    assert result.prompt_tokens == (len(ids), len(ids))
    assert_same(result.vectors[:1], result.vectors[1:])


async def test_special_tokens_in_text_are_plain_text(embedder: LlamaCppEmbedder) -> None:
    result = await embedder.embed(request("[SEP] [CLS]", "[ sep ] [ cls ]"))
    # "[SEP]" in text is the three words "[", "sep", "]", never the separator token
    assert result.prompt_tokens[0] == result.prompt_tokens[1] > 2 + 6
    assert_same(result.vectors[:1], result.vectors[1:])


async def test_many_inputs_in_one_request_match_one_by_one(
    embedder: LlamaCppEmbedder, sentence_transformer: Any
) -> None:
    long_text = " ".join(SENTENCES[:12]) * 3  # hundreds of tokens: a decode of its own
    ids = tuple(sentence_transformer.tokenizer(SENTENCES[3])["input_ids"])
    inputs: list[str | tuple[int, ...]] = [*SENTENCES, long_text, ids, (101, 7592, 102)]
    inputs = inputs * 2  # more inputs than one decode holds
    before = embedder.decodes
    together = await embedder.embed(request(*inputs))
    packed = embedder.decodes - before
    assert packed < len(inputs) // 4
    assert together.prompt_tokens[len(SENTENCES)] > 300
    assert_same(together.vectors, await one_by_one(embedder, inputs))
    assert_same(together.vectors[: len(inputs) // 2], together.vectors[len(inputs) // 2 :])


async def test_concurrent_requests_share_decodes(embedder: LlamaCppEmbedder) -> None:
    groups = [SENTENCES[i : i + 2] for i in range(0, 16, 2)]  # 8 requests of 2 inputs
    alone = [await one_by_one(embedder, list(g)) for g in groups]
    before = embedder.decodes
    results = await asyncio.gather(*(embedder.embed(request(*g)) for g in groups))
    # one request at a time would take 8 decodes; packed, the 7 behind the first share one
    assert embedder.decodes - before < len(groups)
    for result, expected in zip(results, alone, strict=True):
        assert_same(result.vectors, expected)
    assert (embedder.load().running, embedder.load().waiting) == (0, 0)


async def test_an_input_over_the_context_is_refused_before_anything_runs(
    embedder: LlamaCppEmbedder,
) -> None:
    too_long = "word " * 600
    before = embedder.decodes
    with pytest.raises(ContextLengthExceeded) as caught:
        await embedder.embed(request("fine", "also fine", too_long, "fine"))
    assert caught.value.index == 2
    assert caught.value.context_length == CONTEXT
    assert caught.value.prompt_tokens == 602
    assert "input[2] has 602 tokens" in caught.value.message("input")
    with pytest.raises(ContextLengthExceeded) as caught:
        await embedder.embed(request((101,) * (CONTEXT + 1), "fine"))
    assert (caught.value.index, caught.value.prompt_tokens) == (0, CONTEXT + 1)
    assert embedder.decodes == before
    # exactly the context is fine
    result = await embedder.embed(request((101,) + (1996,) * (CONTEXT - 2) + (102,)))
    assert result.prompt_tokens == (CONTEXT,)


@pytest.mark.parametrize("bad", [(101, 30522, 102), (-1,), ()])
async def test_a_bad_token_input_is_refused(
    embedder: LlamaCppEmbedder, bad: tuple[int, ...]
) -> None:
    before = embedder.decodes
    with pytest.raises(InvalidGenerationRequest) as caught:
        await embedder.embed(request("fine", bad))
    assert caught.value.param == "input"
    assert "input[1]" in str(caught.value)
    assert embedder.decodes == before


async def test_generation_and_dimensions_are_refused(embedder: LlamaCppEmbedder) -> None:
    with pytest.raises(InvalidGenerationRequest):
        await embedder.submit(GenerationRequest(request_id="gen", prompt="hello"))
    with pytest.raises(InvalidGenerationRequest) as caught:
        await embedder.embed(request("hello", dimensions=64))
    assert caught.value.param == "dimensions"


async def test_a_full_queue_is_overloaded_and_cancelled_requests_are_dropped(
    embedder: LlamaCppEmbedder,
) -> None:
    big = asyncio.ensure_future(embedder.embed(request(*(SENTENCES * 10))))  # 13 decodes
    # 16 requests may run at once (share a decode) and 4 more wait: 19 fit behind the big one
    small = [asyncio.ensure_future(embedder.embed(request(s))) for s in SENTENCES[:19]]
    await asyncio.sleep(0)  # one turn of the loop: every task above has queued its job
    load = embedder.load()
    assert load.running + load.waiting == 20
    assert (load.capacity, load.max_waiting) == (16, 4)
    with pytest.raises(EngineOverloaded) as caught:
        await embedder.embed(request("one too many"))
    assert caught.value.retry_after_s >= 1.0
    small[0].cancel()
    assert (await big).vectors.shape == (200, 384)
    for task in small[1:]:
        assert (await task).vectors.shape == (1, 384)
    with pytest.raises(asyncio.CancelledError):
        await small[0]
    assert (embedder.load().running, embedder.load().waiting) == (0, 0)


# ---- the default embedding bundle -----------------------------------------------------------


@pytest.fixture
def scratch_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temp dir of its own, so that anything written there can be scanned."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    yield scratch


def files_holding(roots: list[Path], windows: list[bytes]) -> list[Path]:
    found = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                data = path.read_bytes()
                if any(w in data for w in windows):
                    found.append(path)
    return found


def seal_default(data_dir: Path, scratch: Path, gguf: bytes) -> tuple[Any, KeyProviders]:
    """Seal the default embedding bundle into `data_dir`, check that no plaintext was written
    and that the bundle opens to `gguf`; its settings and key providers."""
    settings = load_settings(environ={}, overrides={"data_dir": str(data_dir)})
    providers = KeyProviders(settings)
    bundle = ensure_default_embedding_bundle(settings, providers)
    assert bundle == data_dir / "bundles" / f"{DEFAULT_EMBEDDING_MODEL_ID}.bundle"
    assert ensure_default_embedding_bundle(settings, providers) == bundle  # sealed once

    # no plaintext GGUF anywhere it could have been written (three 4 KiB windows of it)
    size = len(gguf)
    windows = [gguf[at : at + 4096] for at in (1 << 20, size // 2, size - 8192)]
    assert files_holding([data_dir, scratch], windows) == []

    opened = open_bundle(
        bundle, trusted_keys(settings), providers, now=datetime.now(UTC), engine="llama.cpp"
    )
    try:
        assert opened.manifest.model.architecture == "bert"
        assert opened.manifest.model.engine_hints == {
            "task": "embed",
            "context_length": SERVED_CONTEXT,
        }
        plaintext = Path(opened.path).read_bytes()
        assert hashlib.sha256(plaintext).digest() == hashlib.sha256(gguf).digest()
    finally:
        opened.release()
    return settings, providers


async def test_the_default_embedding_bundle_is_sealed_from_memory_and_served(
    tmp_path: Path, scratch_tmp: Path, minilm_gguf: bytes
) -> None:
    data_dir = tmp_path / "data"
    settings, providers = seal_default(data_dir, scratch_tmp, minilm_gguf)
    source = BundleSource(
        data_dir / "bundles" / f"{DEFAULT_EMBEDDING_MODEL_ID}.bundle",
        trusted=trusted_keys(settings),
        providers=providers,
        engine="llama.cpp",
        allowed_providers=None,
    )
    served = LlamaCppEmbedder(source, LlamaCppEmbedderOptions(n_threads=2))
    await served.start()
    try:
        result = await served.embed(request("hello world"))
        assert result.vectors.shape == (1, 384)
    finally:
        await served.stop()
        providers.close()


def test_with_no_models_configured_both_defaults_are_served(seeded_data_dir: Path) -> None:
    settings = load_settings(environ={}, overrides={"data_dir": str(seeded_data_dir)})
    registry = build_registry(settings)
    try:
        served = {m.id: m for m in registry.models}
        assert set(served) == {"gemma-3-270m", DEFAULT_EMBEDDING_MODEL_ID}
        embedding = served[DEFAULT_EMBEDDING_MODEL_ID]
        assert "all-minilm" in embedding.aliases
        (deployment,) = embedding.deployments
        assert isinstance(deployment.engine, LlamaCppEmbedder)
        assert deployment.engine.task == "embed"
        assert deployment.engine.context_length == SERVED_CONTEXT
        assert deployment.engine.options.batch_size >= SERVED_CONTEXT
        (chat,) = served["gemma-3-270m"].deployments
        assert chat.engine.task == "generate"
    finally:
        for close in registry.on_close:
            close()
