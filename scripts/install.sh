#!/usr/bin/env bash
# Builds `baton` (Release) and installs it into PREFIX/bin (default
# ~/.local, which needs no root; /usr/local for every user):
#   bash scripts/install.sh [PREFIX]
set -euo pipefail
cd "$(dirname "$0")/.."
prefix=${1:-$HOME/.local}
bash scripts/deps.sh
jobs=$(( $(nproc) < 2 ? $(nproc) : 2 ))
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBATON_TESTS=OFF >/dev/null
cmake --build build --target baton -j "$jobs"
cmake --install build --prefix "$prefix"
echo "installed $prefix/bin/baton"
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "add it to PATH: export PATH=\"$prefix/bin:\$PATH\"" ;;
esac
