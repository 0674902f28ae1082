#!/usr/bin/env bash
# Make sure the system services the integration tests start are installed.
#
# The KMS contract suite (tests/integration/kms) runs a real SoftHSM2 token, so it needs Debian's
# `softhsm2` (softhsm2-util, and libsofthsm2.so through its `libsofthsm2` dependency).  OpenBao
# (`bao`) and moto's server come from Python packages in the dev extra, not from here.
set -euo pipefail

if command -v softhsm2-util >/dev/null 2>&1; then
    exit 0
fi

if [[ "$(id -u)" -eq 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "softhsm2 is missing; the KMS integration tests need it. Install it with:" >&2
    echo "    sudo apt-get update && sudo apt-get install -y softhsm2" >&2
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "softhsm2 is missing and this is not a Debian-like system: install SoftHSM2 (2.6)" >&2
    echo "with your package manager so that softhsm2-util and libsofthsm2.so are present." >&2
    exit 1
fi

echo "installing softhsm2 (for the KMS integration tests)" >&2
"${sudo[@]}" apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends softhsm2
