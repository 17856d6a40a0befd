#!/usr/bin/env bash
# Installs what the aarch64 cross build and its qemu runs need (only what is missing):
# Debian's cross compiler, qemu-user, and the arm64 packages of the compiled
# dependencies beside the amd64 ones (multiarch). Header-only dependencies
# (nlohmann-json, cereal, toml++) come from scripts/deps.sh: their headers in
# /usr/include serve both architectures. libc6:arm64 is the glibc the tests run
# with under qemu (cmake/aarch64-linux-gnu.cmake says why not the cross copy).
# Exit status 3: this machine cannot install them (no apt-get, no root, no network).
set -euo pipefail
pkgs=(g++-aarch64-linux-gnu qemu-user libc6:arm64
      libgtest-dev:arm64 libboost-dev:arm64 libboost-program-options-dev:arm64
      libfmt-dev:arm64 libssl-dev:arm64 libxxhash-dev:arm64)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo"; else
    echo "aarch64: cannot install ${missing[*]} (not root, no sudo)"; exit 3; fi
fi
command -v apt-get >/dev/null 2>&1 || { echo "aarch64: cannot install ${missing[*]} (no apt-get)"; exit 3; }
echo "installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
dpkg --print-foreign-architectures | grep -qx arm64 || $sudo dpkg --add-architecture arm64
# The arm64 package lists are new after --add-architecture: without them (no
# network) nothing can be installed.
if ! $sudo apt-get update -q; then echo "aarch64: apt-get update failed (no network?)"; exit 3; fi
# Multiarch packages must have the same version on both architectures: this
# may upgrade the amd64 copies of the same libraries.
if ! $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"; then
  echo "aarch64: could not install ${missing[*]}"; exit 3
fi
