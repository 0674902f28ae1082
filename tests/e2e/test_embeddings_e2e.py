"""Embeddings and `n > 1` end to end: `airgate serve` with no model configuration serves the
default embedding model (all-MiniLM-L6-v2, sealed at first start) next to Gemma, and the
clients apps use get real vectors and real choices from it.

The retrieval round trip is what a RAG app does first: embed a corpus, embed a query, take the
nearest neighbour.  Fifty sentences on fifty different subjects, each with a paraphrase that
shares few words with it: the nearest sentence to each paraphrase must be its source for at
least 45 of the 50.
"""

from __future__ import annotations

import base64

import numpy as np
import openai
import pytest
from langchain_openai import OpenAIEmbeddings
from server_process import Server

EMBEDDER = "all-minilm-l6-v2"
CHAT = "gemma-3-270m"

PAIRS = [
    (
        "The bank raised its interest rates by half a percent.",
        "Borrowing money got more expensive after the lender's rate increase.",
    ),
    (
        "The patient was given antibiotics for a bacterial infection.",
        "Doctors treated the bacterial illness with antibiotic medicine.",
    ),
    (
        "Our flight to Lisbon was delayed by three hours.",
        "The plane to Portugal's capital left hours late.",
    ),
    (
        "She planted tomatoes and basil in the garden.",
        "Vegetables and herbs were sown in her backyard plot.",
    ),
    (
        "The server crashed because the disk was full.",
        "Running out of storage space brought the machine down.",
    ),
    (
        "He practices the violin every evening after dinner.",
        "Each night after eating he rehearses on his string instrument.",
    ),
    (
        "The museum opened a new exhibition of Roman coins.",
        "Ancient Roman currency is on display in a fresh gallery show.",
    ),
    (
        "Heavy snow closed the mountain pass for two days.",
        "A blizzard blocked the alpine road for a couple of days.",
    ),
    (
        "The committee approved next year's budget.",
        "The board signed off on the annual spending plan.",
    ),
    (
        "My cat sleeps on the windowsill in the afternoon sun.",
        "The kitten naps by the window when it is sunny after lunch.",
    ),
    (
        "The team won the championship in extra time.",
        "They clinched the title after the match went to overtime.",
    ),
    (
        "Inflation reduced the purchasing power of wages.",
        "Rising prices meant salaries bought less than before.",
    ),
    (
        "The chef seasoned the soup with salt and pepper.",
        "The cook added salt and pepper to flavour the broth.",
    ),
    (
        "Volcanic ash grounded flights across northern Europe.",
        "An eruption's dust cloud stopped air travel over the north of the continent.",
    ),
    (
        "The library extended its opening hours during exams.",
        "During the test period the reading rooms stayed open later.",
    ),
    (
        "A new vaccine reduced hospital admissions sharply.",
        "Far fewer people went to hospital after the immunisation was introduced.",
    ),
    (
        "The programmer fixed a memory leak in the parser.",
        "A developer repaired the bug that made the parsing code waste RAM.",
    ),
    (
        "Tourists crowded the beach during the heatwave.",
        "Visitors packed the seaside when temperatures soared.",
    ),
    (
        "The orchestra performed Beethoven's ninth symphony.",
        "Musicians played the famous choral symphony by Beethoven.",
    ),
    ("The company laid off two hundred employees.", "The firm cut two hundred jobs."),
    (
        "Rain flooded the basement of the old house.",
        "Water from the storm filled the cellar of the aging home.",
    ),
    (
        "The students built a robot that sorts recycling.",
        "Pupils made a machine that separates waste for recycling.",
    ),
    (
        "He renewed his passport before the trip abroad.",
        "Before travelling overseas he got a new travel document.",
    ),
    (
        "The bridge was closed for structural repairs.",
        "Engineers shut the crossing to fix its supports.",
    ),
    (
        "The election results were announced at midnight.",
        "Vote counts were published in the middle of the night.",
    ),
    (
        "She knitted a warm scarf for her grandson.",
        "Her grandchild received a woolly neck warmer she made by hand.",
    ),
    (
        "The telescope captured images of a distant galaxy.",
        "Pictures of a faraway star system were taken by the observatory instrument.",
    ),
    (
        "Traffic jams are worst on Friday afternoons.",
        "Congestion on the roads peaks at the end of the working week.",
    ),
    (
        "The bakery sells fresh bread every morning.",
        "Loaves are baked and sold daily at dawn in the shop.",
    ),
    (
        "The judge sentenced the fraudster to five years.",
        "A court gave the swindler a five-year prison term.",
    ),
    (
        "Bees pollinate the apple trees in spring.",
        "In springtime insects carry pollen between the orchard's blossoms.",
    ),
    (
        "The smartphone battery lasts two full days.",
        "The phone can run for forty-eight hours on one charge.",
    ),
    (
        "The river burst its banks after weeks of rain.",
        "Weeks of downpours made the waterway overflow.",
    ),
    (
        "He is learning Japanese with an online course.",
        "He studies the language of Japan through internet lessons.",
    ),
    (
        "The hospital hired more nurses for the night shift.",
        "Additional nursing staff were recruited to work overnight.",
    ),
    (
        "Wildfires destroyed thousands of hectares of forest.",
        "Huge areas of woodland burned in the blazes.",
    ),
    (
        "The startup raised ten million dollars from investors.",
        "The young company secured a ten-million funding round.",
    ),
    (
        "The children built a snowman in the park.",
        "Kids made a figure out of snow on the playground lawn.",
    ),
    (
        "The printer ran out of ink in the middle of the report.",
        "The cartridge went dry while the document was printing.",
    ),
    (
        "A strong earthquake shook the coastal city.",
        "The seaside town was hit by a powerful tremor.",
    ),
    (
        "They adopted a puppy from the animal shelter.",
        "The family took home a young dog from the rescue centre.",
    ),
    (
        "The train to Berlin leaves from platform four.",
        "Departures for Germany's capital are on track four.",
    ),
    (
        "The auditor found errors in the quarterly accounts.",
        "Mistakes were discovered in the three-monthly financial statements during the review.",
    ),
    (
        "Solar panels cover the roof of the school.",
        "The school's roof is fitted with photovoltaic modules.",
    ),
    (
        "The marathon runner collapsed near the finish line.",
        "An athlete fainted just before completing the long-distance race.",
    ),
    (
        "The software update added a dark mode.",
        "The latest release lets users switch to a black colour theme.",
    ),
    (
        "The farmer harvested wheat before the storm arrived.",
        "Grain was brought in from the fields ahead of the bad weather.",
    ),
    (
        "The ambassador met the foreign minister in Paris.",
        "In France's capital the envoy held talks with the head of diplomacy.",
    ),
    (
        "Coffee prices rose after a poor harvest in Brazil.",
        "A weak Brazilian crop made beans for espresso more expensive.",
    ),
    (
        "The password must be at least twelve characters long.",
        "Credentials need a minimum length of twelve symbols.",
    ),
]


def _sdk(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.key(), max_retries=0)


def test_the_default_embedding_model_is_listed(server: Server) -> None:
    ids = {m.id for m in _sdk(server).models.list().data}
    assert {EMBEDDER, CHAT} <= ids


@pytest.mark.parametrize("encoding", [None, "float", "base64"])
def test_embeddings_through_the_sdk(server: Server, encoding: str | None) -> None:
    """Left out, the SDK asks for base64 and decodes it; asked for explicitly, base64 comes
    back as the string (float32 little-endian); float as numbers.  All three agree."""
    texts = ["A first sentence.", "And another one, a little longer than the first."]
    sdk = _sdk(server)
    if encoding is None:
        reply = sdk.embeddings.create(model=EMBEDDER, input=texts)
    else:
        reply = sdk.embeddings.create(model=EMBEDDER, input=texts, encoding_format=encoding)  # type: ignore[arg-type]
    if encoding == "base64":
        rows = [np.frombuffer(base64.b64decode(str(d.embedding)), "<f4") for d in reply.data]
    else:
        rows = [np.array(d.embedding) for d in reply.data]
    vectors = np.array(rows)
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    reference = sdk.embeddings.create(model=EMBEDDER, input=texts, encoding_format="float")
    np.testing.assert_allclose(vectors, [d.embedding for d in reference.data], atol=1e-6)
    assert reply.usage.prompt_tokens == reply.usage.total_tokens > 10


def test_retrieval_round_trip(server: Server) -> None:
    """Embed 50 sentences and 50 paraphrases; each paraphrase's nearest sentence is its source
    for at least 45 of them (LangChain's client, as a RAG app would call it)."""
    lc = OpenAIEmbeddings(
        model=EMBEDDER,
        base_url=server.base_url + "/v1",
        api_key=server.key(),  # type: ignore[arg-type]
        check_embedding_ctx_length=False,
        tiktoken_enabled=False,
        max_retries=0,
    )
    corpus = np.array(lc.embed_documents([source for source, _ in PAIRS]))
    queries = np.array([lc.embed_query(paraphrase) for _, paraphrase in PAIRS])
    nearest = (queries @ corpus.T).argmax(axis=1)
    hits = int((nearest == np.arange(len(PAIRS))).sum())
    assert hits >= 45, f"{hits} of {len(PAIRS)} paraphrases found their source"


def test_a_chat_model_does_not_embed_and_the_embedder_does_not_chat(server: Server) -> None:
    sdk = _sdk(server)
    with pytest.raises(openai.BadRequestError) as embed:
        sdk.embeddings.create(model=CHAT, input="hello")
    assert embed.value.body["param"] == "model"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as chat:
        sdk.chat.completions.create(model=EMBEDDER, messages=[{"role": "user", "content": "hi"}])
    assert chat.value.body["param"] == "model"  # type: ignore[index]


def test_chat_choices_on_gemma(server: Server) -> None:
    """n = 4 with the SDK's defaults (no max_tokens): four choices, each finished, the prompt
    counted once; seeded, the choices differ from each other."""
    sdk = _sdk(server)
    messages = [{"role": "user", "content": "Name a colour."}]
    reply = sdk.chat.completions.create(model=CHAT, messages=messages, n=4, seed=7)  # type: ignore[arg-type]
    assert [c.index for c in reply.choices] == [0, 1, 2, 3]
    assert all(c.finish_reason in ("stop", "length") for c in reply.choices)
    one = sdk.chat.completions.create(
        model=CHAT,
        messages=messages,
        max_tokens=1,
        temperature=0,  # type: ignore[arg-type]
    )
    assert reply.usage is not None and one.usage is not None
    assert reply.usage.prompt_tokens == one.usage.prompt_tokens
    assert len({c.message.content for c in reply.choices}) > 1


def test_streamed_choices_on_gemma(server: Server) -> None:
    stream = _sdk(server).chat.completions.create(
        model=CHAT,
        messages=[{"role": "user", "content": "Count to five."}],
        n=2,
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts = ["", ""]
    finished = set()
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finished.add(choice.index)
    assert finished == {0, 1} and all(texts)
    assert usage is not None and usage.completion_tokens <= 24
