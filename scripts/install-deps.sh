#!/usr/bin/env bash
# Installs the Debian packages ectransfer needs to build, test and fuzz.
# Quiet and quick when everything is present; one `apt-get update` then one
# `apt-get install -y` of what is missing otherwise.
set -euo pipefail

pkgs=(
  build-essential cmake pkg-config clang libclang-rt-dev
  libzmq3-dev libsodium-dev libmsgpack-dev libjansson-dev uthash-dev libcmocka-dev
  libucx-dev ucx-utils libxxhash-dev
  iproute2 python3
  python3-zmq
  python3-numpy python3-torch python3-pytest
  prometheus
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing Debian packages: ${missing[*]}" >&2
  echo "install-deps: run as root, or: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
