#!/usr/bin/env bash
# Make sure the system services the integration and e2e tests start are installed.
#
# The KMS contract suite (tests/integration/kms) runs a real SoftHSM2 token, so it needs Debian's
# `softhsm2` (softhsm2-util, and libsofthsm2.so through its `libsofthsm2` dependency).  The
# replica e2e test (tests/e2e/test_replicas_haproxy.py) and the "replicas" benchmark put a real
# load balancer in front of several gateways: Debian's `haproxy`.  OpenBao (`bao`) and moto's
# server come from Python packages in the dev extra, not from here.  The console's browser test
# (tests/e2e/test_console_browser.py) drives Debian's `chromium` with Playwright (whose own
# browser download cannot work offline).
set -euo pipefail

# program -> the Debian package that provides it
declare -A packages=([softhsm2-util]=softhsm2 [haproxy]=haproxy [chromium]=chromium)
missing=()
for program in "${!packages[@]}"; do
    command -v "$program" >/dev/null 2>&1 || missing+=("${packages[$program]}")
done
if [[ ${#missing[@]} -eq 0 ]]; then
    exit 0
fi

if [[ "$(id -u)" -eq 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo=(sudo -n)
else
    echo "${missing[*]} missing; the integration and e2e tests need them. Install with:" >&2
    echo "    sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
    exit 1
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "${missing[*]} missing and this is not a Debian-like system: install SoftHSM2 (2.6)" >&2
    echo "and HAProxy (2.6 or newer) with your package manager, so that softhsm2-util," >&2
    echo "libsofthsm2.so and haproxy are present." >&2
    exit 1
fi

echo "installing ${missing[*]} (for the integration and e2e tests)" >&2
"${sudo[@]}" apt-get update
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    "${missing[@]}"
