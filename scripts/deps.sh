#!/usr/bin/env bash
# Installs the Debian packages Baton needs to build and test (only those missing).
# Each is used: the build tools; python3 (GGUF and oracle scripts the tests run); python3-jinja2
# (the reference renderer test_chat_jinja compares the chat template engine with); GoogleTest;
# Boost (headers for Asio and Beast, program_options); nlohmann-json, fmt, cereal (wire
# payloads), OpenSSL (HMAC), xxhash (split checksums), toml++ (cluster files); curl (the request
# of docs/QUICKSTART.md, which test_cli_quickstart runs).
set -euo pipefail
pkgs=(cmake ninja-build g++ python3 python3-jinja2 curl
      libgtest-dev
      libboost-program-options-dev nlohmann-json3-dev libfmt-dev
      libcereal-dev libboost-dev libssl-dev libxxhash-dev libtomlplusplus-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run the serving tests' official openai client (tests/serve/).
# A machine may have Node from elsewhere (bundling npm): install only when absent.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -q || true
  $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
