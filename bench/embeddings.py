"""Scenario "embeddings": ``POST /v1/embeddings`` throughput, airgate against its peers.

all-MiniLM-L6-v2, inputs of exactly 64 tokens, embedded in requests of 1, 16 and 64 inputs by
4 concurrent clients, on the same threads (``--threads``, default 2) for everyone:

1. airgate serving its default embedding model over HTTP (``airgate serve``, no model
   configuration);
2. ``llama-server --embeddings --pooling mean`` on the same GGUF (airgate's converter writes it
   into the cache), built as in the edge scenario and packed as airgate's embedder packs.
   Target: airgate >= 0.9x llama-server at every batch size;
3. sentence-transformers in process (torch on the same number of threads), as a ratio.

Each round (``--runs``, one in ``--quick``) runs the two servers one at a time, the first
alternating, then sentence-transformers in a fresh process, on the round's own sentences. A round
during which other processes used more than ``--max-foreign-load`` of the CPUs is discarded and
repeated. Figures are medians over rounds; ratios are taken per round.

Modules: ``embeddings_inputs`` (the model's files, the 64-token sentences),
``embeddings_servers`` (the servers and the HTTP load), ``embeddings_st`` (the in-process
baseline's worker), ``embeddings_report`` (the section).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import msgspec

from bench._check import airgate_args, importable, policy_dir, shown
from bench._client import BenchError
from bench._report import cpu_sample, foreign_cpu_share, say
from bench._runs import add_run_options, quiet_runs
from bench.edge_servers import AIRGATE, Launch, gateway_launch
from bench.embeddings_inputs import (
    INPUT_TOKENS,
    MODEL_ID,
    InputMaker,
    ensure_gguf,
    ensure_model_dir,
    model_dir,
)
from bench.embeddings_report import ST, Results, Round, render
from bench.embeddings_servers import (
    BATCHES,
    airgate_config,
    embeddings_body,
    inputs_per_level,
    llama_server_embeddings_launch,
    run_embeddings,
)
from bench.embeddings_st import StJob, run_st, st_command
from bench.peers_llama import LLAMA_SERVER
from bench.peers_llama_server import llama_server_binary, llama_server_path

NAME = "embeddings"
WARMUP_INPUTS = 16
_KEY_NAME = "bench-embeddings"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "embeddings scenario (also: --threads, --api-key, --server-env, --server-arg of edge)"
    )
    group.add_argument(
        "--embedding-model",
        default=MODEL_ID,
        help=f"embedding model id to request from airgate (default {MODEL_ID})",
    )
    add_run_options(group)


def _inputs(maker: InputMaker, attempt: int, quick: bool) -> tuple[list[str], dict[int, list[str]]]:
    """The round's warm-up inputs and its inputs at each batch size (all distinct)."""
    n = inputs_per_level(quick)
    warmup = maker.sentences(f"embeddings/{attempt}/warm-up", WARMUP_INPUTS)
    levels = {b: maker.sentences(f"embeddings/{attempt}/{b}", n) for b in BATCHES}
    return warmup, levels


def _airgate_args(args: argparse.Namespace) -> argparse.Namespace:
    """``args`` with ``--config`` of ``airgate_config`` among the server's arguments."""
    config = airgate_config(args.cache_dir / "embeddings")
    server_arg = [*args.server_arg, "--config", str(config)]
    return argparse.Namespace(**{**vars(args), "server_arg": server_arg})


def _launch(args: argparse.Namespace, server: str, binary: Path, gguf: Path) -> Launch:
    if server == AIRGATE:
        return gateway_launch(_airgate_args(args), key_name=_KEY_NAME)
    return llama_server_embeddings_launch(server, binary, gguf, args.threads)


def run(args: argparse.Namespace) -> str:
    """Run the scenario; returns the markdown body of its BENCHMARKS.md section."""
    logs = args.cache_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    server_logs = {s: logs / f"embeddings-{s}.log" for s in (AIRGATE, LLAMA_SERVER)}
    st_log = logs / "embeddings-st.log"
    for log in (*server_logs.values(), st_log):
        log.write_bytes(b"")  # this invocation's output only
    say("embeddings: converting the packaged MiniLM to GGUF for llama-server")
    gguf, sha256 = ensure_gguf(args.cache_dir)
    st_dir = ensure_model_dir(args.cache_dir)
    binary = llama_server_binary(args.cache_dir)
    maker = InputMaker()
    runs = 1 if args.quick else args.runs
    results = Results(
        gguf_name=gguf.name, gguf_sha256=sha256, inputs_per_level=inputs_per_level(args.quick)
    )

    def one_run(done: int, attempt: int) -> Round:
        order = (AIRGATE, LLAMA_SERVER) if done % 2 == 0 else (LLAMA_SERVER, AIRGATE)
        say(f"embeddings: round {done + 1}/{runs} ({', '.join(order)}, then {ST})")
        warmup, levels = _inputs(maker, attempt, args.quick)
        before = cpu_sample()
        outcomes = {
            s: run_embeddings(args, _launch(args, s, binary, gguf), warmup, levels, server_logs[s])
            for s in order
        }
        st = run_st(StJob(model_dir=str(st_dir), threads=args.threads, warmup=warmup,
                          levels=levels), st_log)  # fmt: skip
        share = foreign_cpu_share(before, cpu_sample())
        return Round(first=order[0], airgate=outcomes[AIRGATE],
                     llama_server=outcomes[LLAMA_SERVER], st=st, foreign_share=share)  # fmt: skip

    results.rounds, results.discarded = quiet_runs(runs, args.max_foreign_load, one_run)
    dump = logs / "embeddings-results.json"
    dump.write_bytes(msgspec.json.encode(results))
    say(f"embeddings: per-round results: {dump}")
    return render(args, results)


def check(args: argparse.Namespace) -> str:
    """Set-up only (``--check``): the modules the servers and the worker import, the GGUF the
    peer would load (converted into the temporary cache), one round's inputs counted with the
    model's tokenizer, airgate's launch (an app key created, its command line parsed by
    airgate's CLI), llama-server's command line, the worker's job and the request bodies."""
    names = [
        "backends.llamacpp:LlamaCppEmbedder", "backends.llamacpp.bert_gguf:bert_to_gguf",
        "tokenizers:Tokenizer", "sentence_transformers:SentenceTransformer", "torch",
    ]  # fmt: skip
    lines = [importable(names)]
    gguf, sha256 = ensure_gguf(args.cache_dir)
    lines.append(f"{gguf.name} converted by airgate's converter (sha256 {sha256[:16]}…)")
    maker = InputMaker()
    warmup, levels = _inputs(maker, 0, args.quick)
    counted = {maker.count(t) for t in [*warmup, *(t for v in levels.values() for t in v)]}
    if counted != {INPUT_TOKENS}:
        raise BenchError(f"synthetic inputs of {sorted(counted)} tokens, not {INPUT_TOKENS}")
    lines.append(
        f"{WARMUP_INPUTS} warm-up and {len(BATCHES)} x {inputs_per_level(args.quick)} inputs "
        f"per round, each {INPUT_TOKENS} tokens (MiniLM tokenizer)"
    )
    launch = _launch(args, AIRGATE, Path(), gguf)
    version = policy_dir(args.cache_dir / "embeddings" / "policy")
    lines.append(f"policy version {version} (limits no run reaches)")
    lines.append(
        f"{AIRGATE}: {shown(launch.command)} parsed as `airgate {airgate_args(launch.command)}`; "
        + ("the --api-key given" if args.api_key else "an app key created in its data dir")
    )
    peer = _launch(args, LLAMA_SERVER, llama_server_path(args.cache_dir), gguf)
    lines.append(f"{LLAMA_SERVER}: {shown(peer.command)}")
    job = StJob(model_dir=str(model_dir(args.cache_dir)), threads=args.threads, warmup=warmup,
                levels=levels)  # fmt: skip
    if msgspec.json.decode(msgspec.json.encode(job), type=StJob) != job:
        raise BenchError("the sentence-transformers job does not survive its encoding")
    paths = Path(args.cache_dir, "job.json"), Path(args.cache_dir, "out.json")
    lines.append(f"{ST}: {shown(st_command(*paths))}")
    bodies = [embeddings_body(args.embedding_model, texts[i : i + batch])
              for batch, texts in levels.items() for i in range(0, len(texts), batch)]  # fmt: skip
    from gateway.openai.embedding_types import EmbeddingsRequest

    try:
        for body in bodies:
            msgspec.convert(body, EmbeddingsRequest)
    except msgspec.ValidationError as exc:
        raise BenchError(f"airgate would refuse a request body: {exc}") from exc
    lines.append(
        f"{len(bodies)} request bodies per round, decoded as airgate's EmbeddingsRequest, for "
        f"model {args.embedding_model!r}"
    )
    return "\n".join([f"## {NAME}: set-up checked, nothing started", *(f"- {x}" for x in lines)])
