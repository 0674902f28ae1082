"""The vLLM embedder (CPU build) on the real all-MiniLM-L6-v2: the vectors sentence-transformers
computes, inputs of any length and as token ids in one call, and inputs refused (by index)
before anything is computed."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest

from backends.errors import ContextLengthExceeded, EngineNotReady, InvalidGenerationRequest
from backends.types import EmbeddingRequest, EngineLoad, GenerationRequest
from backends.vllm import VllmEmbedder

pytestmark = pytest.mark.engine

SENTENCES = (
    "The cat sits on the mat.",
    "A dog is playing in the park.",
    "Quantum computers use qubits instead of bits.",
    "Paris is the capital of France.",
    "I love eating fresh strawberries in summer.",
    "The stock market fell sharply on Monday.",
    "She plays the violin beautifully.",
    "Photosynthesis converts light into chemical energy.",
    "The train to Berlin leaves at nine.",
    "Please restart the server after the update.",
    "Rain is expected throughout the weekend.",
    "He forgot his umbrella at the office.",
    "Neural networks learn from examples.",
    "The museum opens its new wing tomorrow.",
    "Coffee tastes better with a little cinnamon.",
    "The bridge was closed for repairs.",
    "Mount Everest is the highest mountain on Earth.",
    "Our team won the championship last night.",
    "Water boils at one hundred degrees Celsius.",
    "The library lends books for three weeks.",
)


class Reference:
    """sentence-transformers on the same directory, on the CPU."""

    def __init__(self, directory: Path) -> None:
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(str(directory), device="cpu")

    def vectors(self, texts: list[str]) -> Any:
        return self.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)

    def ids(self, text: str) -> list[int]:
        return list(self.model.tokenizer(text)["input_ids"])


@pytest.fixture(scope="module")
def reference(minilm_dir: Path) -> Reference:
    return Reference(minilm_dir)


@pytest.fixture(scope="module")
def embedder(vllm_embedder: VllmEmbedder) -> VllmEmbedder:
    """The session's embedder (tests/integration/conftest.py)."""
    return vllm_embedder


def req(*inputs: str | tuple[int, ...], **kw: Any) -> EmbeddingRequest:
    return EmbeddingRequest(request_id="e", inputs=inputs, **kw)


def cosines(a: Any, b: Any) -> list[float]:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    dots = (a * b).sum(axis=1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return [float(x) for x in dots]


def idle(embedder: VllmEmbedder) -> bool:
    load = embedder.load()
    return load.running == load.waiting == 0


async def test_describes_itself(embedder: VllmEmbedder) -> None:
    assert (embedder.name, embedder.task) == ("vllm", "embed")
    assert embedder.embedding_size == 384
    assert not embedder.truncatable
    assert embedder.context_length == 256  # sentence-transformers' max_seq_length, as vLLM reads


async def test_twenty_sentences_match_sentence_transformers(
    embedder: VllmEmbedder, reference: Reference
) -> None:
    result = await embedder.embed(req(*SENTENCES))
    assert result.vectors.dtype == np.float32
    assert result.vectors.shape == (20, 384)
    assert np.allclose(np.linalg.norm(result.vectors, axis=1), 1.0, atol=1e-5)
    assert min(cosines(result.vectors, reference.vectors(list(SENTENCES)))) >= 0.999
    assert result.prompt_tokens == tuple(len(reference.ids(s)) for s in SENTENCES)


async def test_inputs_of_different_lengths_in_one_call_equal_their_solo_vectors(
    embedder: VllmEmbedder, reference: Reference
) -> None:
    long = " ".join(SENTENCES[:16])  # ~150 tokens
    inputs = ("Hi", long, SENTENCES[2], long[: len(long) // 2])
    together = await embedder.embed(req(*inputs))
    solo = [(await embedder.embed(req(text))).vectors[0] for text in inputs]
    assert min(cosines(together.vectors, solo)) >= 0.9999
    assert min(cosines(together.vectors, reference.vectors(list(inputs)))) >= 0.999
    counts = together.prompt_tokens
    assert counts[0] == 3  # [CLS] hi [SEP]
    assert counts[0] < counts[2] < counts[3] < counts[1] <= embedder.context_length


async def test_token_id_inputs_embed_like_their_text(
    embedder: VllmEmbedder, reference: Reference
) -> None:
    ids = tuple(reference.ids(SENTENCES[5]))
    result = await embedder.embed(req(ids, SENTENCES[5]))
    assert result.prompt_tokens == (len(ids), len(ids))
    assert cosines(result.vectors[:1], result.vectors[1:])[0] >= 0.9999


async def test_special_token_text_stays_text(embedder: VllmEmbedder, reference: Reference) -> None:
    cls, sep = reference.ids("")
    ids = embedder.tokenize_inputs(req("left [SEP] right [CLS]"))[0]
    assert (ids[0], ids[-1]) == (cls, sep)
    assert sep not in ids[1:-1] and cls not in ids[1:-1]


async def test_a_too_long_input_is_refused_by_index_before_any_work(
    embedder: VllmEmbedder,
) -> None:
    too_long = " ".join(SENTENCES * 3)  # ~450 tokens
    with pytest.raises(ContextLengthExceeded) as info:
        await embedder.embed(req(SENTENCES[0], SENTENCES[1], too_long))
    assert info.value.index == 2
    assert info.value.context_length == 256
    assert info.value.prompt_tokens > 256
    assert "input[2] has" in info.value.message("input")
    assert idle(embedder)  # nothing was handed to vLLM
    with pytest.raises(ContextLengthExceeded) as ids_info:
        await embedder.embed(req((101,) + (1996,) * 300 + (102,)))
    assert (ids_info.value.index, ids_info.value.prompt_tokens) == (0, 302)


async def test_bad_token_ids_and_empty_inputs_are_refused(embedder: VllmEmbedder) -> None:
    with pytest.raises(InvalidGenerationRequest) as bad:
        await embedder.embed(req("fine", (101, 10**6, 102)))
    assert bad.value.param == "input"
    assert "input[1]" in str(bad.value)
    with pytest.raises(InvalidGenerationRequest) as negative:
        await embedder.embed(req((101, -1, 102)))
    assert negative.value.param == "input"
    with pytest.raises(InvalidGenerationRequest) as empty:
        await embedder.embed(req(()))
    assert empty.value.param == "input"
    assert idle(embedder)


async def test_shorter_vectors_are_refused_for_a_model_not_trained_for_them(
    embedder: VllmEmbedder,
) -> None:
    with pytest.raises(InvalidGenerationRequest) as info:
        await embedder.embed(req("x", dimensions=128))
    assert info.value.param == "dimensions"
    full = await embedder.embed(req("x", dimensions=384))
    assert full.vectors.shape == (1, 384)


async def test_generation_is_refused(embedder: VllmEmbedder) -> None:
    with pytest.raises(InvalidGenerationRequest):
        await embedder.submit(GenerationRequest(request_id="g", prompt="hello"))


async def test_concurrent_calls_all_complete_and_leave_it_idle(
    embedder: VllmEmbedder, reference: Reference
) -> None:
    calls = [req(*SENTENCES[i : i + 4]) for i in range(0, 12, 4)]
    results = await asyncio.gather(*(embedder.embed(c) for c in calls))
    expected = reference.vectors(list(SENTENCES[:12]))
    got = np.concatenate([r.vectors for r in results])
    assert min(cosines(got, expected)) >= 0.999
    assert idle(embedder)


class CopiedSource:
    """A ModelSource like a decrypted bundle: a private copy that release() deletes."""

    def __init__(self, model: Path, directory: Path) -> None:
        self.model = model
        self.directory = directory
        self.released = False

    def open(self) -> str:
        shutil.copytree(self.model, self.directory)
        return str(self.directory)

    def release(self) -> None:
        shutil.rmtree(self.directory)
        self.released = True


def children() -> set[psutil.Process]:
    """This process's descendants but multiprocessing's resource tracker (it outlives engines)."""
    out = set()
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(p.cmdline()):
                out.add(p)
        except psutil.NoSuchProcess:
            pass
    return out


def gone(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


async def test_serves_after_its_directory_is_deleted_and_stops_without_residue(
    minilm_dir: Path, tmp_path: Path, embedder: VllmEmbedder, reference: Reference
) -> None:
    """A second embedder beside the session's, on a ModelSource released once loaded."""
    options = embedder.options
    before = children()
    source = CopiedSource(minilm_dir, tmp_path / "plaintext")
    eng = VllmEmbedder(source, options)
    await eng.start()
    try:
        assert source.released
        assert not source.directory.exists()
        started = children() - before
        assert started  # the engine core runs in a child process
        assert eng.embedding_size == 384
        result = await eng.embed(req(*SENTENCES[:4]))
        assert min(cosines(result.vectors, reference.vectors(list(SENTENCES[:4])))) >= 0.999
    finally:
        await eng.stop()
    assert all(gone(p) for p in started)
    assert eng.load() == EngineLoad(0, 0, options.max_num_seqs, options.max_waiting, 0.0)
    with pytest.raises(EngineNotReady):
        await eng.embed(req("x"))
