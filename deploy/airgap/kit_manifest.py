"""What a kit says about itself: its wheels, the hash-pinned lock, the CycloneDX SBOM and the
SHA256SUMS list that the signature covers (deploy/airgap/build_kit.py assembles them)."""

from __future__ import annotations

import hashlib
import re
import time
import uuid
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from email.message import Message
from email.parser import BytesHeaderParser
from pathlib import Path
from urllib.parse import quote

KIT_FORMAT = "1"


@dataclass(frozen=True)
class Wheel:
    path: Path
    name: str  # canonical project name
    version: str
    sha256: str


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_wheel(path: Path) -> Wheel:
    name, version, _ = path.name.split("-", 2)
    return Wheel(path, canonical(name), version, sha256_file(path))


def metadata(path: Path) -> Message:
    with zipfile.ZipFile(path) as zf:
        name = next(n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        return BytesHeaderParser().parsebytes(zf.read(name))


def lock_text(wheels: Iterable[Wheel], title: str) -> str:
    lines = [f"# {title}", "# install: pip install --no-index --require-hashes -r <this file>"]
    for w in sorted(wheels, key=lambda w: w.name):
        lines += [f"{w.name}=={w.version} \\", f"    --hash=sha256:{w.sha256}"]
    return "\n".join(lines) + "\n"


def _licenses(meta: Message) -> list[dict[str, object]]:
    expression = meta.get("License-Expression")
    if expression:
        return [{"expression": str(expression).strip()}]
    text = str(meta.get("License") or "").strip()
    if text and "\n" not in text and len(text) <= 100:  # some put the whole licence text here
        return [{"license": {"name": text}}]
    prefix = "License :: "
    names = [
        c.rsplit(" :: ", 1)[-1] for c in meta.get_all("Classifier") or () if c.startswith(prefix)
    ]
    return [{"license": {"name": n}} for n in names]


def purl(name: str, version: str) -> str:
    return f"pkg:pypi/{name}@{quote(version, safe='')}"


def _component(w: Wheel, kind: str) -> dict[str, object]:
    meta = metadata(w.path)
    component: dict[str, object] = {
        "type": kind,
        "bom-ref": purl(w.name, w.version),
        "name": w.name,
        "version": w.version,
        "purl": purl(w.name, w.version),
        "hashes": [{"alg": "SHA-256", "content": w.sha256}],
    }
    if meta.get("Summary"):
        component["description"] = str(meta["Summary"]).strip()
    if licenses := _licenses(meta):
        component["licenses"] = licenses
    return component


def sbom(wheels: Sequence[Wheel], epoch: int, version: str) -> dict[str, object]:
    """CycloneDX 1.5 JSON: airgate's wheel as the BOM's subject, every other wheel a component
    (a vLLM kit has no airgate wheel: its subject is airgate by name and version only)."""
    ordered = sorted(wheels, key=lambda w: w.name)
    ours = [w for w in ordered if w.name == "airgate"]
    subject = (
        _component(ours[0], "application")
        if ours
        else {
            "type": "application",
            "bom-ref": purl("airgate", version),
            "name": "airgate",
            "version": version,
            "purl": purl("airgate", version),
        }
    )
    seed = "".join(f"{w.name} {w.sha256}\n" for w in ordered)
    return {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "serialNumber": uuid.uuid5(uuid.NAMESPACE_URL, "airgate-kit:" + seed).urn,
        "version": 1,
        "metadata": {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch)),
            "tools": {
                "components": [
                    {"type": "application", "name": "airgate-kit-builder", "version": KIT_FORMAT}
                ]
            },
            "component": subject,
        },
        "components": [_component(w, "library") for w in ordered if w.name != "airgate"],
    }


def sums_text(root: Path) -> str:
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    return "".join(f"{sha256_file(root / f)}  {f}\n" for f in files)
