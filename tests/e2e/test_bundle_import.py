"""A laptop imports bundles from HQ, serves them with no configuration but the pinned HQ
signer, renews their offline window and removes them (`airgate bundle import | list | renew |
remove`, `bundle renewal create`, `airgate serve`).

One module-scoped laptop: a seeded data dir (the sealed defaults, its local KMS key, test API
keys) and bundles sealed "at HQ" for that KMS key with an HQ signing key pinned in the laptop's
airgate.toml: the real Gemma GGUF twice (fresh; and created 3 days ago with a 1-day offline
window), and small bundles for the refusals.  The tests run in order on that data dir.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import openai
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from server_process import (
    NO_END,
    airgate,
    free_port,
    ok,
    seed_data_dir,
    serve_command,
    start_server,
    stop_and_check,
)
from typer.testing import CliRunner

from bundles import (
    LocalKeyProvider,
    ModelInfo,
    SourceFile,
    create_renewal,
    create_signing_key,
    key_id,
    load_signing_key,
    read_manifest,
    seal_bundle,
    sources_from_path,
)
from gateway.cli.main import app

pytestmark = pytest.mark.e2e

HELLO = [{"role": "user", "content": "Reply with one word: hello."}]
SEED = 3  # as test_client_libraries: a seeded 270M model at temperature 1 stops
GEMMA = ModelInfo(
    name="hq-gemma",
    version="q4_k_m",
    architecture="gemma3",
    weight_format="gguf",
    quantisation="Q4_K_M",
    chat_template="gemma",
)
TINY = ModelInfo(name="tiny", version="1", weight_format="gguf")
RUNNER = CliRunner()


@dataclass(frozen=True)
class Laptop:
    data: Path
    config: Path  # HQ's key pinned; no [[models]]: the defaults and the imports are served
    echo_config: Path  # HQ's key pinned and one echo model: a start that loads no default
    hq_key: Path
    hq_pub: Path
    hq_id: str
    other_id: str
    own_id: str  # the data dir's own signing key (it seals the defaults)
    good: Path  # Gemma, fresh, 30 offline days
    lapsed: Path  # Gemma, created 3 days ago, 1 offline day
    tiny: Path  # a small HQ bundle (for refusals at start)
    tiny2: Path  # another one of the same model name
    unpinned: Path  # signed by a key nobody pinned
    own: Path  # signed by the data dir's own key
    tampered: Path  # HQ-signed, one payload byte flipped

    @property
    def imported(self) -> Path:
        return self.data / "bundles" / "imported"

    def entry(self, bundle: Path) -> Path:
        return self.imported / read_manifest(bundle, None).manifest.bundle_id


def write_config(path: Path, trusted: Path | Sequence[str], models: str = "") -> Path:
    keys = [str(trusted)] if isinstance(trusted, Path) else list(trusted)
    path.write_text(f"{models}[bundles]\ntrusted_keys = {json.dumps(keys)}\n")
    return path


@pytest.fixture(scope="module")
def laptop(tmp_path_factory: pytest.TempPathFactory, model_dir: Path, gguf_path: Path) -> Laptop:
    root = tmp_path_factory.mktemp("laptop")
    data = seed_data_dir(root / "data", model_dir)
    hq_pub = create_signing_key(root / "hq" / "signing.key")
    other_pub = create_signing_key(root / "other" / "signing.key")
    hq = load_signing_key(root / "hq" / "signing.key")
    own = load_signing_key(data / "keys" / "signing.key")
    providers = {"local": LocalKeyProvider(data / "keys" / "kms-local.json")}
    now = datetime.now(UTC)

    def seal(
        name: str,
        model: ModelInfo,
        sources: Sequence[SourceFile],
        signer: Ed25519PrivateKey,
        created: datetime = now,
        max_offline_days: int | None = None,
    ) -> Path:
        out = root / "hq" / f"{name}.bundle"
        seal_bundle(
            sources,
            out,
            model=model,
            recipients=["local:default"],
            providers=providers,
            signing_key=signer,
            now=created,
            max_offline_days=max_offline_days,
        )
        return out

    gemma = sources_from_path(gguf_path)
    blob = b"GGUF" + os.urandom(200_000)
    tiny = [SourceFile("tiny.gguf", len(blob), lambda: io.BytesIO(blob))]
    good = seal("good", GEMMA, gemma, hq, max_offline_days=30)
    old = msgspec.structs.replace(GEMMA, name="hq-old")
    lapsed = seal("lapsed", old, gemma, hq, created=now - timedelta(days=3), max_offline_days=1)
    small = seal("tiny", TINY, tiny, hq)
    tampered = root / "hq" / "tampered.bundle"
    shutil.copytree(small, tampered)
    flip(tampered / "data" / "tiny.gguf.enc", 1000)
    return Laptop(
        data=data,
        config=write_config(root / "airgate.toml", root / "hq" / "signing.key.pub"),
        echo_config=write_config(
            root / "echo.toml",
            root / "hq" / "signing.key.pub",
            '[[models]]\nid = "echo"\nengine = "echo"\n\n',
        ),
        hq_key=root / "hq" / "signing.key",
        hq_pub=root / "hq" / "signing.key.pub",
        hq_id=key_id(hq_pub),
        other_id=key_id(other_pub),
        own_id=key_id(own.public_key()),
        good=good,
        lapsed=lapsed,
        tiny=small,
        tiny2=seal("tiny2", TINY, tiny, hq),
        unpinned=seal("unpinned", TINY, tiny, load_signing_key(root / "other" / "signing.key")),
        own=seal("own", TINY, tiny, own),
        tampered=tampered,
    )


def flip(path: Path, offset: int) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def cli(*args: str | Path, code: int = 0) -> str:
    """`airgate ARGS` in process (typer's runner); its output with whitespace collapsed."""
    # rich reads COLUMNS at each print: one line per message, whole table cells
    result = RUNNER.invoke(app, [str(a) for a in args], env={"COLUMNS": "400"})
    text = " ".join(result.output.split())
    assert result.exit_code == code, f"{args}: exit {result.exit_code}\n{result.output}"
    assert "Traceback" not in result.output
    return text


def on(laptop: Laptop, *args: str | Path, config: Path | None = None, code: int = 0) -> str:
    """`cli` on the laptop's data dir and configuration."""
    return cli(*args, "--config", config or laptop.config, "--data-dir", laptop.data, code=code)


def serve_refused(laptop: Laptop, config: Path, code: int, *needles: str) -> str:
    """`airgate serve` that must refuse to serve and exit by itself with `code`."""
    result = airgate(*serve_command(free_port(), laptop.data, "--config", str(config))[3:])
    log = " ".join((result.stderr + result.stdout).split())
    assert result.returncode == code, f"exit {result.returncode}:\n{log[-4000:]}"
    for needle in needles:
        assert needle in log, f"{needle!r} not in:\n{log[-4000:]}"
    assert "Traceback" not in log
    return log


def entries(laptop: Laptop) -> list[str]:
    """Every name in the imported store (temporary ones included)."""
    return sorted(os.listdir(laptop.imported)) if laptop.imported.exists() else []


# ---- import: only what the pinned HQ key signed, intact ------------------------------------


def test_import_trusts_only_pinned_signers(laptop: Laptop, tmp_path: Path) -> None:
    # nothing pinned: refused, though the data dir's own key (which sealed the defaults)
    # signed this bundle
    text = cli("bundle", "import", laptop.own, "--data-dir", laptop.data, code=1)
    assert "no bundle signer is pinned" in text and "trusted_keys" in text
    text = on(laptop, "bundle", "import", laptop.own, code=1)
    assert f"signed by key {laptop.own_id}, which is not a trusted key" in text
    text = on(laptop, "bundle", "import", laptop.unpinned, code=1)
    assert f"signed by key {laptop.other_id}, which is not a trusted key" in text
    # the data dir's own key stays untrusted even when pinned, and no key file in the data dir
    # (whoever writes it could swap the file) is taken
    own_pub = laptop.data / "keys" / "signing.key.pub"
    pinned = write_config(tmp_path / "own.toml", [str(laptop.hq_pub), own_pub.read_text().strip()])
    text = on(laptop, "bundle", "import", laptop.own, config=pinned, code=1)
    assert f"signed by key {laptop.own_id}, which is not a trusted key" in text
    inside = write_config(tmp_path / "inside.toml", own_pub)
    text = on(laptop, "bundle", "import", laptop.own, config=inside, code=1)
    assert "inside the data dir" in text
    assert entries(laptop) == []


def test_a_tampered_bundle_is_refused_at_import(laptop: Laptop) -> None:
    text = on(laptop, "bundle", "import", laptop.tampered, code=1)
    assert "integrity check failed" in text and "[check: ciphertext digest]" in text
    assert entries(laptop) == []  # nothing placed, no temporary copy left


# ---- the offline window and its renewals ----------------------------------------------------


def test_a_lapsed_bundle_is_imported_only_with_a_renewal(laptop: Laptop, tmp_path: Path) -> None:
    text = on(laptop, "bundle", "import", laptop.lapsed, code=1)
    assert "lapsed at" in text and "--renewal FILE" in text
    renewal = tmp_path / "renewal.json"
    # at HQ, through the installed command
    made = ok(
        "bundle", "renewal", "create", "--bundle", laptop.lapsed,
        "--signing-key", laptop.hq_key, "--out", renewal,
    )  # fmt: skip
    said = " ".join(made.stdout.split())
    assert f"signed by {laptop.hq_id}" in said and "1 days offline" in said
    text = on(laptop, "bundle", "import", laptop.lapsed, "--renewal", renewal)
    assert text.startswith("imported: model hq-old") and f"signed by {laptop.hq_id}" in text
    stored = laptop.entry(laptop.lapsed) / "renewal.json"
    assert stored.read_bytes() == renewal.read_bytes()


def test_renewals_that_are_edited_misdirected_unpinned_future_or_older_are_refused(
    laptop: Laptop, tmp_path: Path
) -> None:
    stored = laptop.entry(laptop.lapsed) / "renewal.json"
    before = stored.read_bytes()
    head = read_manifest(laptop.lapsed, None)
    hq = load_signing_key(laptop.hq_key)
    now = datetime.now(UTC)

    def renew(data: bytes, code: int = 1) -> str:
        path = tmp_path / f"r{len(os.listdir(tmp_path))}.json"
        path.write_bytes(data)
        return on(laptop, "bundle", "renew", path, code=code)

    edited = before.replace(b'"max_offline_days":1', b'"max_offline_days":9')
    assert edited != before
    assert "signature is invalid" in renew(edited)
    good = read_manifest(laptop.good, None)  # signed by HQ, not imported (yet)
    assert "which is not imported here" in renew(
        create_renewal(good.manifest, good.digest, hq, issued=now)
    )
    # the right bundle id with another manifest digest (a re-signed manifest, say)
    wrong = create_renewal(head.manifest, good.digest, hq, issued=now)
    assert "the renewal is for bundle" in renew(wrong)
    other = load_signing_key(laptop.hq_key.parent.parent / "other" / "signing.key")
    unpinned = create_renewal(head.manifest, head.digest, other, issued=now)
    assert f"signed by key {laptop.other_id}, which is not a trusted key" in renew(unpinned)
    future = create_renewal(head.manifest, head.digest, hq, issued=now + timedelta(days=1))
    assert "in the future" in renew(future)
    older = create_renewal(head.manifest, head.digest, hq, issued=now - timedelta(hours=1))
    assert "older than the one already stored" in renew(older)
    assert stored.read_bytes() == before  # none of them was stored
    newer = create_renewal(head.manifest, head.digest, hq, issued=now + timedelta(seconds=2))
    assert renew(newer, code=0).startswith("renewed: model hq-old")
    assert stored.read_bytes() == newer


# ---- refused at start: the data dir is not trusted ------------------------------------------


def test_a_lapsed_window_stops_the_start_until_renewed(laptop: Laptop, tmp_path: Path) -> None:
    stored = laptop.entry(laptop.lapsed) / "renewal.json"
    shutil.move(stored, tmp_path / "renewal.json")  # as an attacker (or an accident) may
    serve_refused(laptop, laptop.echo_config, 1, "imported model 'hq-old'", "lapsed at", "renew")
    assert on(laptop, "bundle", "renew", tmp_path / "renewal.json").startswith("renewed:")


def test_an_id_served_by_the_configuration_stops_the_start(laptop: Laptop, tmp_path: Path) -> None:
    models = '[[models]]\nid = "hq-old"\nengine = "echo"\n\n'
    clash = write_config(tmp_path / "clash.toml", laptop.hq_pub, models)
    serve_refused(laptop, clash, 2, "imported model 'hq-old'", "already served")


def test_a_swapped_signature_or_payload_in_the_data_dir_stops_the_start(laptop: Laptop) -> None:
    on(laptop, "bundle", "import", laptop.tiny)
    bundle = laptop.entry(laptop.tiny) / "bundle"
    signature = (bundle / "manifest.sig").read_bytes()
    (bundle / "manifest.sig").write_bytes((laptop.good / "manifest.sig").read_bytes())
    serve_refused(laptop, laptop.echo_config, 1, "imported model 'tiny'", "signature is invalid")
    (bundle / "manifest.sig").write_bytes(signature)
    flip(bundle / "data" / "tiny.gguf.enc", 5000)  # same size: found when the engine loads
    serve_refused(laptop, laptop.echo_config, 1, "integrity check failed", "ciphertext digest")
    # a new version of the model replaces the old one only when asked to
    assert "--replace" in on(laptop, "bundle", "import", laptop.tiny2, code=1)
    assert on(laptop, "bundle", "import", laptop.tiny2, "--replace").startswith(
        "imported: model tiny"
    )
    assert not laptop.entry(laptop.tiny).exists() and laptop.entry(laptop.tiny2).is_dir()
    assert on(laptop, "bundle", "remove", "tiny").startswith("removed model tiny")
    assert entries(laptop) == [laptop.entry(laptop.lapsed).name]  # no temporary left


# ---- served -----------------------------------------------------------------------------------


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_imported_bundles_are_served_listed_and_removed(laptop: Laptop, tmp_path: Path) -> None:
    # through the installed command, as a user types it
    done = ok("bundle", "import", laptop.good, "--config", laptop.config, "--data-dir", laptop.data)
    said = " ".join(done.stdout.split())
    bundle_id = read_manifest(laptop.good, None).manifest.bundle_id
    assert said.startswith(f"imported: model hq-gemma, bundle {bundle_id}, signed by ")
    assert f"signed by {laptop.hq_id}, engine llama.cpp, usable until 20" in said
    assert on(laptop, "bundle", "import", laptop.good).startswith(
        "already imported: model hq-gemma"
    )
    assert "--replace" in on(laptop, "bundle", "import", laptop.tiny, "--id", "hq-gemma", code=1)
    text = on(laptop, "bundle", "import", laptop.tiny, "--id", "gemma-3-270m", code=1)
    assert "already served by airgate.toml or the embedded defaults" in text
    listed = on(laptop, "bundle", "list")
    assert "hq-gemma" in listed and "hq-old" in listed and "renewed" in listed
    for path in laptop.imported.rglob("*"):
        assert mode(path) == (0o700 if path.is_dir() else 0o600), path
        if path.is_file():
            with path.open("rb") as f:
                assert f.read(4) != b"GGUF", path  # nothing decrypted to disk

    server = start_server(
        laptop.data, tmp_path / "serve.log", {"AIRGATE_CONFIG": str(laptop.config)}
    )
    try:
        with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key()) as client:
            served = {m.id for m in client.models.list()}
            assert {"hq-gemma", "hq-old", "gemma-3-270m", "all-minilm-l6-v2"} <= served
            # the SDK's defaults (no max_tokens); seeded, it stops after 237 tokens
            reply = client.chat.completions.create(model="hq-gemma", messages=HELLO, seed=SEED)
            assert reply.model == "hq-gemma"
            assert reply.choices[0].message.content
            assert reply.choices[0].finish_reason == "stop"
            short = client.chat.completions.create(
                model="hq-old", messages=HELLO, max_tokens=4, logit_bias=NO_END
            )
            assert short.model == "hq-old" and short.usage and short.usage.completion_tokens == 4
        text = on(laptop, "bundle", "remove", "hq-gemma", code=1)  # the server holds the dir
        assert "stop it first" in text
    finally:
        stop_and_check(server)
    logged = [r["msg"] for r in server.log_records()]
    assert any(f"imported bundle {bundle_id}" in m and laptop.hq_id in m for m in logged), logged

    assert (
        on(laptop, "bundle", "remove", "hq-gemma") == f"removed model hq-gemma (bundle {bundle_id})"
    )
    assert "hq-gemma" not in on(laptop, "bundle", "list")
    server = start_server(
        laptop.data, tmp_path / "again.log", {"AIRGATE_CONFIG": str(laptop.echo_config)}
    )
    try:
        with openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=server.key()) as client:
            assert {m.id for m in client.models.list()} == {"echo", "hq-old"}
            with pytest.raises(openai.NotFoundError) as gone:
                client.chat.completions.create(model="hq-gemma", messages=HELLO)
            assert gone.value.code == "model_not_found"
    finally:
        stop_and_check(server)
