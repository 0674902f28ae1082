"""The BERT -> GGUF converter on a tiny synthetic model, read back with a GGUF reader written
here from the format's description: the metadata llama.cpp's BERT loader needs, the tensor
names, shapes and bytes, and the models it must refuse."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from safetensors.numpy import load as load_safetensors
from safetensors.numpy import save as save_safetensors

from backends.llamacpp.bert_gguf import BertConversionError, bert_to_gguf

HIDDEN, FF, LAYERS, HEADS = 8, 16, 2, 2
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s", "!", "a"]


def tiny_model(**changes: Any) -> dict[str, bytes]:
    """A 2-layer BERT sentence embedder in the sentence-transformers layout, as file -> bytes."""
    rng = np.random.default_rng(0)
    config = {
        "model_type": "bert",
        "hidden_size": HIDDEN,
        "intermediate_size": FF,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "max_position_embeddings": 32,
        "type_vocab_size": 2,
        "vocab_size": len(VOCAB),
        "layer_norm_eps": 1e-12,
        "hidden_act": "gelu",
    }
    tensors = {
        "embeddings.word_embeddings.weight": (len(VOCAB), HIDDEN),
        "embeddings.position_embeddings.weight": (32, HIDDEN),
        "embeddings.token_type_embeddings.weight": (2, HIDDEN),
        "embeddings.LayerNorm.weight": (HIDDEN,),
        "embeddings.LayerNorm.bias": (HIDDEN,),
        "embeddings.position_ids": None,
        "pooler.dense.weight": (HIDDEN, HIDDEN),
        "pooler.dense.bias": (HIDDEN,),
    }
    for i in range(LAYERS):
        for module, shape in [
            ("attention.self.query", (HIDDEN, HIDDEN)),
            ("attention.self.key", (HIDDEN, HIDDEN)),
            ("attention.self.value", (HIDDEN, HIDDEN)),
            ("attention.output.dense", (HIDDEN, HIDDEN)),
            ("attention.output.LayerNorm", None),
            ("intermediate.dense", (FF, HIDDEN)),
            ("output.dense", (HIDDEN, FF)),
            ("output.LayerNorm", None),
        ]:
            rows = shape[0] if shape else HIDDEN
            tensors[f"encoder.layer.{i}.{module}.weight"] = shape or (HIDDEN,)
            tensors[f"encoder.layer.{i}.{module}.bias"] = (rows,)
    arrays = {
        name: (
            np.arange(32, dtype=np.int64)[None, :]
            if shape is None
            else rng.standard_normal(shape).astype(np.float32)
        )
        for name, shape in tensors.items()
    }
    tokenizer = {
        "added_tokens": [{"id": i, "content": t, "special": True} for i, t in enumerate(VOCAB[:5])],
        "normalizer": {"type": "BertNormalizer", "lowercase": True, "strip_accents": None},
        "model": {
            "type": "WordPiece",
            "continuing_subword_prefix": "##",
            "vocab": {t: i for i, t in enumerate(VOCAB)},
        },
    }
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
        {
            "idx": 2,
            "name": "2",
            "path": "2_Normalize",
            "type": "sentence_transformers.models.Normalize",
        },
    ]
    pooling = {"word_embedding_dimension": HIDDEN, "pooling_mode_mean_tokens": True}
    files = {
        "config.json": config,
        "tokenizer.json": tokenizer,
        "modules.json": modules,
        "1_Pooling/config.json": pooling,
    }
    for name, change in changes.items():  # a file's keys to update, or a function
        if callable(change):
            change(files, arrays)
        else:
            files[name].update(change)
    out = {name: json.dumps(value).encode() for name, value in files.items()}
    out["model.safetensors"] = save_safetensors(arrays)
    return out


def reader(files: dict[str, bytes]) -> Callable[[str], bytes]:
    return lambda name: files[name]  # a missing file raises KeyError, as a zip does


class Gguf:
    """Just enough of a GGUF v3 reader for these tests."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0
        assert self._take(4) == b"GGUF"
        version, n_tensors, n_kv = self._unpack("<IQQ")
        assert version == 3
        self.kv: dict[str, Any] = {}
        self.kinds: dict[str, int] = {}
        for _ in range(n_kv):
            key = self._str()
            (kind,) = self._unpack("<I")
            self.kinds[key] = kind
            self.kv[key] = self._value(kind)
        infos = []
        for _ in range(n_tensors):
            name = self._str()
            (n_dims,) = self._unpack("<I")
            dims = self._unpack(f"<{n_dims}Q")
            ggml_type, offset = self._unpack("<IQ")
            infos.append((name, dims, ggml_type, offset))
        start = (self.at + 31) // 32 * 32
        self.tensors: dict[str, tuple[tuple[int, ...], int, npt.NDArray[Any]]] = {}
        for name, dims, ggml_type, offset in infos:
            assert offset % 32 == 0
            dtype = {0: np.float32, 1: np.float16}[ggml_type]
            count = int(np.prod(dims))
            array = np.frombuffer(data, dtype=dtype, count=count, offset=start + offset)
            self.tensors[name] = (dims, ggml_type, array.reshape(tuple(reversed(dims))))

    def _take(self, n: int) -> bytes:
        chunk = self.data[self.at : self.at + n]
        self.at += n
        return chunk

    def _unpack(self, fmt: str) -> tuple[Any, ...]:
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))

    def _str(self) -> str:
        (n,) = self._unpack("<Q")
        return self._take(n).decode()

    def _value(self, kind: int) -> Any:
        scalar = {4: "<I", 5: "<i", 6: "<f", 7: "<?"}
        if kind in scalar:
            return self._unpack(scalar[kind])[0]
        if kind == 8:
            return self._str()
        assert kind == 9
        item, n = self._unpack("<IQ")
        return [self._value(item) for _ in range(n)]


def test_metadata_is_what_llama_cpp_reads() -> None:
    g = Gguf(bert_to_gguf(reader(tiny_model()), name="tiny"))
    kv = g.kv
    assert kv["general.architecture"] == "bert"
    assert kv["general.name"] == "tiny"
    assert kv["bert.context_length"] == 32
    assert kv["bert.embedding_length"] == HIDDEN
    assert kv["bert.feed_forward_length"] == FF
    assert kv["bert.block_count"] == LAYERS
    assert kv["bert.attention.head_count"] == HEADS
    assert kv["bert.attention.layer_norm_epsilon"] == pytest.approx(1e-12)
    assert kv["bert.attention.causal"] is False
    assert kv["bert.pooling_type"] == 1  # mean
    # llama.cpp checks the types of what it reads: counts and ids are uint32, the eps float32
    scalars = [k for k in kv if g.kinds[k] != 9]
    assert {g.kinds[k] for k in scalars if k.endswith(("_id", "count", "length", "_type"))} == {4}
    assert g.kinds["bert.attention.layer_norm_epsilon"] == 6
    assert kv["tokenizer.ggml.model"] == "bert"
    assert kv["tokenizer.ggml.tokens"] == [
        *VOCAB[:5],
        "\u2581hello",
        "\u2581world",
        "s",
        "\u2581!",
        "\u2581a",
    ]
    assert kv["tokenizer.ggml.token_type"] == [3] * 5 + [1] * 5
    assert kv["tokenizer.ggml.token_type_count"] == 2
    assert kv["tokenizer.ggml.bos_token_id"] == 2  # [CLS]
    assert kv["tokenizer.ggml.seperator_token_id"] == 3
    assert kv["tokenizer.ggml.unknown_token_id"] == 1
    assert kv["tokenizer.ggml.padding_token_id"] == 0
    assert kv["tokenizer.ggml.mask_token_id"] == 4
    assert kv["tokenizer.ggml.normalizer.lowercase"] is True
    assert kv["tokenizer.ggml.normalizer.strip_accents"] is True


def test_tensors_are_renamed_and_keep_their_bytes() -> None:
    files = tiny_model()
    g = Gguf(bert_to_gguf(reader(files)))
    assert len(g.tensors) == 5 + 16 * LAYERS
    assert not any(n.startswith(("pooler", "cls")) or "position_ids" in n for n in g.tensors)
    dims, kind, up = g.tensors["blk.1.ffn_up.weight"]
    assert (dims, kind) == ((HIDDEN, FF), 0)  # ggml ne: (in, out) of a (out, in) Linear
    original = load_safetensors(files["model.safetensors"])
    assert np.array_equal(up, original["encoder.layer.1.intermediate.dense.weight"])
    assert np.array_equal(
        g.tensors["token_embd_norm.bias"][2], original["embeddings.LayerNorm.bias"]
    )
    assert np.array_equal(
        g.tensors["blk.0.attn_output_norm.weight"][2],
        original["encoder.layer.0.attention.output.LayerNorm.weight"],
    )
    expected = {"token_embd", "token_types", "position_embd", "token_embd_norm"}
    expected |= {
        f"blk.{i}.{m}"
        for i in range(LAYERS)
        for m in (
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "attn_output_norm",
            "ffn_up",
            "ffn_down",
            "layer_output_norm",
        )
    }
    assert {n.rsplit(".", 1)[0] for n in g.tensors} == expected


def test_f16_halves_the_matrices_only() -> None:
    files = tiny_model()
    g = Gguf(bert_to_gguf(reader(files), weights="f16"))
    assert g.kv["general.file_type"] == 1
    assert g.tensors["blk.0.attn_q.weight"][1] == 1
    assert g.tensors["token_embd.weight"][1] == 1
    # llama.cpp adds a token_types row to F32 activations: it stays F32, like norms and biases
    assert g.tensors["token_types.weight"][1] == 0
    assert g.tensors["blk.0.attn_q.bias"][1] == 0


def test_the_conversion_is_deterministic() -> None:
    files = tiny_model()
    assert bert_to_gguf(reader(files)) == bert_to_gguf(reader(files))


def _set_pooling(flags: dict[str, bool]) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    def change(files: dict[str, Any], _arrays: dict[str, Any]) -> None:
        files["1_Pooling/config.json"] = {"word_embedding_dimension": HIDDEN, **flags}

    return change


def _add_module(kind: str) -> Callable[[dict[str, Any], dict[str, Any]], None]:
    def change(files: dict[str, Any], _arrays: dict[str, Any]) -> None:
        files["modules.json"].append({"idx": 3, "path": "3", "type": f"x.models.{kind}"})

    return change


def _add_tensor(files: dict[str, Any], arrays: dict[str, Any]) -> None:
    arrays["cls.predictions.bias"] = np.zeros(3, np.float32)  # unused: dropped, not refused
    arrays["encoder.layer.0.attention.self.rotary.weight"] = np.zeros(3, np.float32)


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"config.json": {"model_type": "roberta"}}, "not a BERT model"),
        ({"config.json": {"position_embedding_type": "relative_key"}}, "absolute"),
        ({"x": _set_pooling({"pooling_mode_max_tokens": True})}, "pooling"),
        (
            {"x": _set_pooling({"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True})},
            "pooling",
        ),
        ({"x": _add_module("Dense")}, "module Dense"),
        ({"x": _add_tensor}, "unexpected tensor"),
    ],
)
def test_models_it_cannot_reproduce_are_refused(change: dict[str, Any], reason: str) -> None:
    with pytest.raises(BertConversionError, match=reason):
        bert_to_gguf(reader(tiny_model(**change)))


def test_cls_pooling_and_a_missing_file() -> None:
    files = tiny_model(x=_set_pooling({"pooling_mode_cls_token": True}))
    assert Gguf(bert_to_gguf(reader(files))).kv["bert.pooling_type"] == 2
    del files["modules.json"]
    with pytest.raises(BertConversionError, match=r"no modules\.json"):
        bert_to_gguf(reader(files))
