#!/usr/bin/env bash
# Build (once) and print the path of a portable llama-cpp-python wheel.
#
# llama-cpp-python ships no wheels, so pip compiles llama.cpp (6-8 min on 2 cores).  We build it
# once with a portable instruction set (never -march=native: a cached native build can die with
# SIGILL on another CPU) and keep the wheel in a cache keyed by version and flags, so every
# later set-up installs it in seconds.
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
python="${PYTHON:-python3}"

pyver=$("$python" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
key=$(printf '%s|%s|%s|%s' "$version" "$flags" "$pyver" "$(uname -m)" | sha256sum | cut -c1-16)
cache="${AIRGATE_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/airgate/wheels}/$key"

wheel=$(ls "$cache"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -n 1 || true)
if [[ -z "$wheel" ]]; then
    echo "building llama-cpp-python $version (portable; about 7 minutes on 2 cores, once)" >&2
    mkdir -p "$cache"
    tmp=$(mktemp -d "$cache/.build.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    # --no-cache-dir: pip's wheel cache ignores CMAKE_ARGS and would hand back an old build.
    CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
        "$python" -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-python \
        "llama-cpp-python==$version" -w "$tmp" >&2
    built=$(ls "$tmp"/llama_cpp_python-"$version"-*.whl)
    mv "$built" "$cache/"  # atomic within one filesystem: a half-built wheel is never cached
    wheel="$cache/$(basename "$built")"
fi
echo "$wheel"
