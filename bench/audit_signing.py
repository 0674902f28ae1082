"""Audit signing: what one checkpoint signature costs through each key provider that can sign.

For each provider (``local``: an Ed25519 key file; ``pkcs11``: a SoftHSM2 token;
``vault-transit``: an OpenBao dev server; ``aws-kms``: moto's server, a FAKE AWS) a new key is
made by ``create_audit_signing_key`` and opened by ``open_audit_signer`` from an airgate
configuration file, as the gateway opens it.  Then ``--signs`` signs of a ``--message-bytes``
message per provider on one thread, after a warm-up, the providers interleaved sign by sign so
each sees the same machine.  A remote signer checks every signature against its pinned public
key inside ``sign``: the figures include that check; a second table gives its cost alone.  The
services run on this machine over loopback, so the remote figures are the client, the HTTP or
PKCS#11 path and the service's own work, without a network.  Not a test: nothing asserts a time.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from bench._check import importable
from bench._client import BenchError
from bench._report import (
    Spread,
    collect_environment,
    cpu_sample,
    foreign_cpu_share,
    markdown_table,
    percentile,
    say,
)
from bench._runs import add_run_options, quiet_runs
from bench.audit_signing_services import (
    aws_toml,
    find_program,
    find_softhsm_module,
    moto_server,
    openbao_server,
    pkcs11_toml,
    softhsm_token,
    vault_toml,
)

if TYPE_CHECKING:
    from bundles.kms.signer import Signer
    from gateway.config import Settings

NAME = "audit-signing"
PROVIDERS = ("local", "pkcs11", "vault-transit", "aws-kms")
_LABELS = {
    "local": "local (Ed25519 key file)",
    "pkcs11": "pkcs11 (SoftHSM2 token)",
    "vault-transit": "vault-transit (OpenBao dev server)",
    "aws-kms": "aws-kms (moto: a fake AWS KMS)",
}
_DISTRIBUTIONS = ("airgate", "cryptography", "python-pkcs11", "httpx", "boto3", "moto")
WARMUP = 20
MAX_MESSAGE = 4096  # what AWS KMS signs as a RAW message


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("audit-signing scenario")
    group.add_argument(
        "--signs", type=int, default=500, help="signs per provider per run (default 500)"
    )
    group.add_argument(
        "--message-bytes", type=int, default=200, help="checkpoint message size (default 200)"
    )
    group.add_argument(
        "--pkcs11-module",
        help="PKCS#11 library to sign through (default: SoftHSM2's, as the system lists it)",
    )
    add_run_options(group)


def _validated(args: argparse.Namespace) -> tuple[int, int]:
    signs = 50 if args.quick else args.signs
    if signs < 1 or not 1 <= args.message_bytes <= MAX_MESSAGE:
        raise BenchError(f"--signs must be >= 1 and --message-bytes 1..{MAX_MESSAGE}")
    return signs, args.message_bytes


def _key_ref(provider: str, work: Path, run: int) -> str:
    if provider == "local":
        return str(work / f"local-{run}" / "audit-signing.key")
    if provider == "aws-kms":
        return f"alias/bench-audit-{run}"
    return f"bench-audit-{run}"


def _settings(work: Path, provider: str, key_ref: str, kms_toml: str, run: int) -> Settings:
    """airgate's settings for one signer, from a configuration file as an operator writes it."""
    from gateway.config import ConfigError, load_settings

    path = work / f"{provider}-{run}.toml"
    path.write_text(
        f'data_dir = "{work / "data"}"\n\n[audit.signer]\nprovider = "{provider}"\n'
        f'key_ref = "{key_ref}"\n\n{kms_toml}'
    )
    try:
        return load_settings(path, environ={})
    except ConfigError as exc:
        raise BenchError(f"airgate refuses {path.name}: {exc}") from exc


@dataclass
class Run:
    foreign_share: float = 0.0  # of all CPUs, used by other processes during the run
    sign_ms: dict[str, list[float]] = field(default_factory=dict)
    open_ms: dict[str, float] = field(default_factory=dict)
    check_us: dict[str, list[float]] = field(default_factory=dict)  # VerifyKey.verify per alg


def _measure(signers: dict[str, Signer], signs: int, size: int, into: Run) -> None:
    base = bytes(range(256)) * (size // 256 + 1)
    into.sign_ms = {p: [] for p in signers}
    last: dict[str, tuple[bytes, bytes]] = {}
    names = list(signers)
    for i in range(WARMUP + signs):
        message = base[: size - 8] + i.to_bytes(8, "big") if size > 8 else base[:size]
        for name in names[i % len(names) :] + names[: i % len(names)]:
            start = time.perf_counter_ns()
            signature = signers[name].sign(message)
            elapsed = time.perf_counter_ns() - start
            if i >= WARMUP:
                into.sign_ms[name].append(elapsed / 1e6)
            last[name] = (signature, message)
    for name, (signature, message) in last.items():
        if not signers[name].verify_key.verify(signature, message):
            raise BenchError(f"{name}: a signature does not verify under the signer's key")
    by_alg = {signers[n].alg: (signers[n].verify_key, *last[n]) for n in names}
    for alg, (key, signature, message) in sorted(by_alg.items()):
        times = []
        for _ in range(WARMUP + signs):
            start = time.perf_counter_ns()
            key.verify(signature, message)
            times.append((time.perf_counter_ns() - start) / 1e3)
        into.check_us[alg] = times[WARMUP:]


def _one_run(work: Path, kms: dict[str, str], run: int, signs: int, size: int) -> Run:
    from gateway.access.audit_signer import create_audit_signing_key, open_audit_signer

    result = Run()
    signers: dict[str, Signer] = {}
    try:
        for provider in PROVIDERS:
            settings = _settings(work, provider, _key_ref(provider, work, run), kms[provider], run)
            create_audit_signing_key(settings)
            start = time.perf_counter()
            signers[provider] = open_audit_signer(settings)
            result.open_ms[provider] = (time.perf_counter() - start) * 1e3
        _measure(signers, signs, size, result)
    finally:
        for signer in signers.values():
            signer.close()
    return result


def _module(args: argparse.Namespace) -> str:
    module = args.pkcs11_module or find_softhsm_module()
    if module is None:
        raise BenchError("libsofthsm2.so not found: scripts/test-services.sh, or --pkcs11-module")
    return str(module)


def run(args: argparse.Namespace) -> str:
    signs, size = _validated(args)
    runs = 1 if args.quick else args.runs
    versions: list[str] = []
    with tempfile.TemporaryDirectory(prefix="airgate-bench-audit-signing-") as tmp:
        work = Path(tmp)
        # SoftHSM lives in this process (one token per process: it reads its configuration
        # once); OpenBao and moto are started per run and stopped before the run's last CPU
        # sample, so their CPU time counts as the run's own, not as a neighbour's.
        with softhsm_token(work / "softhsm", _module(args)) as hsm:

            def one_run(kept: int, attempt: int) -> Run:
                say(f"bench: audit-signing run {kept + 1}/{runs} (attempt {attempt + 1}): "
                    f"OpenBao and moto started, {signs} signs per provider")  # fmt: skip
                before = cpu_sample()
                with contextlib.ExitStack() as services:
                    bao = services.enter_context(openbao_server(work / f"openbao-{attempt}"))
                    aws = services.enter_context(moto_server(work / f"moto-{attempt}"))
                    kms = {"local": "", "pkcs11": hsm.kms_toml, "vault-transit": bao.kms_toml}
                    kms["aws-kms"] = aws.kms_toml
                    versions[:] = [hsm.version, bao.version, aws.version]
                    result = _one_run(work, kms, attempt, signs, size)
                result.foreign_share = foreign_cpu_share(before, cpu_sample())
                return result

            results, discarded = quiet_runs(runs, args.max_foreign_load, one_run)
    return _render(args, results, discarded, signs, size, versions)


def _render(
    args: argparse.Namespace,
    results: list[Run],
    discarded: int,
    signs: int,
    size: int,
    versions: list[str],
) -> str:
    env = collect_environment(args.command, _DISTRIBUTIONS)

    def spread(values: list[float], spec: str) -> str:
        return Spread.of(values).format(spec)

    rows = []
    for provider in PROVIDERS:
        samples = [r.sign_ms[provider] for r in results]
        rows.append(
            [
                _LABELS[provider],
                spread([statistics.median(s) for s in samples], ".3f"),
                spread([percentile(s, 99) for s in samples], ".3f"),
                spread([1e3 / statistics.fmean(s) for s in samples], ".0f"),
                spread([r.open_ms[provider] for r in results], ".1f"),
            ]
        )
    signing = markdown_table(
        ["Provider", "sign p50 (ms)", "sign p99 (ms)", "signs/s, one thread", "open (ms)"], rows
    )
    checks = markdown_table(
        ["Signature check alone (VerifyKey.verify)", "p50 (µs)", "p99 (µs)"],
        [
            [
                alg,
                spread([statistics.median(r.check_us[alg]) for r in results], ".1f"),
                spread([percentile(r.check_us[alg], 99) for r in results], ".1f"),
            ]
            for alg in sorted(results[0].check_us)
        ],
    )
    lines = [
        "## Audit signing: checkpoint-signing latency per key provider",
        "",
        env.markdown(),
        f"- Services on this machine, over loopback: {'; '.join(versions)}.",
        "- Per run and provider: a new key made by `create_audit_signing_key` (what "
        "`airgate audit-signer create` runs) and opened by `open_audit_signer` from an airgate "
        f"configuration file (open: reading the public key); {WARMUP} warm-up signs, then "
        f"{signs:,} signs of a {size}-byte message on one thread, the providers interleaved "
        "sign by sign. Remote signers check each signature against the pinned public key inside "
        "`sign` (included above; its cost alone below). aws-kms signs with ECDSA P-256 (moto has "
        "no Ed25519 keys); its figures are moto's, not AWS's: AWS's service time and the network "
        "to it are not measured.",
        f"- {len(results)} run(s) kept, {discarded} discarded (other processes used more than "
        f"{args.max_foreign_load:.0%} of the CPUs; at most "
        f"{max(r.foreign_share for r in results):.1%} in a kept run); figures: median "
        "(min–max) over runs.",
        "",
        signing,
        "",
        checks,
    ]
    return "\n".join(lines)


def check(args: argparse.Namespace) -> str:
    """Set-up only (``--check``): the signer modules and the services' programs found, and the
    configuration of each provider's signer loaded by airgate's settings code; nothing started,
    no key made."""
    signs, size = _validated(args)
    lines = [
        importable(
            [
                "gateway.access.audit_signer:open_audit_signer",
                "gateway.access.audit_signer:create_audit_signing_key",
                "bundles.kms.pkcs11_signer:Pkcs11Signer",
                "bundles.kms.vault_signer:VaultTransitSigner",
                "bundles.kms.aws_signer:AwsKmsSigner",
            ]
        )
    ]
    found = {
        "softhsm2-util": find_program("softhsm2-util"),
        "libsofthsm2.so": args.pkcs11_module or find_softhsm_module(),
        "bao": find_program("bao"),
        "moto_server": find_program("moto_server"),
    }
    missing = [name for name, where in found.items() if where is None]
    lines.append(
        "services: "
        + "; ".join(f"{name} {where}" for name, where in found.items() if where is not None)
        + (f"; not found: {', '.join(missing)} (scripts/test-services.sh, the dev extra)"
           if missing else "")
    )  # fmt: skip
    work = args.cache_dir / NAME
    work.mkdir(parents=True)
    kms = {
        "local": "",
        "pkcs11": pkcs11_toml(str(found["libsofthsm2.so"] or "libsofthsm2.so"), "airgate-bench"),
        "vault-transit": vault_toml("http://127.0.0.1:8200"),
        "aws-kms": aws_toml("http://127.0.0.1:5000"),
    }
    for provider in PROVIDERS:
        settings = _settings(work, provider, _key_ref(provider, work, 0), kms[provider], 0)
        if settings.audit.signer.provider != provider:
            raise BenchError(f"{provider}: the configuration names {settings.audit.signer}")
    lines.append(f"[audit.signer] configurations loaded by airgate: {', '.join(PROVIDERS)}")
    lines.append(
        f"{WARMUP} warm-up + {signs:,} signs of a {size}-byte message per provider and run"
    )
    return "\n".join([f"## {NAME}: set-up checked, nothing started", *(f"- {x}" for x in lines)])
