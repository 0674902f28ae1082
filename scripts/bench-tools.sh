#!/usr/bin/env bash
# Make sure the system tools the benchmarks call are installed.
#
# The "http" scenario (bench/http_path.py) drives the servers with `wrk` (Debian's `wrk`, 4.1)
# and pins them to CPUs with `taskset` (util-linux, present on every Debian).  Python peers
# (LiteLLM, granian) are installed by the benchmark itself into its cache directory.
set -euo pipefail

if command -v wrk >/dev/null 2>&1; then
    exit 0
fi

if [[ "$(id -u)" -eq 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "wrk is missing; the http benchmark needs it. Install it with:" >&2
    echo "    sudo apt-get update && sudo apt-get install -y wrk" >&2
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "wrk is missing and this is not a Debian-like system: install wrk (4.1) with your" >&2
    echo "package manager, or build it from its source (github.com/wg/wrk)." >&2
    exit 1
fi

echo "installing wrk (for the http benchmark)" >&2
"${sudo[@]}" apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends wrk
