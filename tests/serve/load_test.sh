#!/usr/bin/env bash
# Load test of `baton serve` on loopback: N concurrent streaming clients (chat
# and completions, random lengths and temperatures) for S seconds against one
# server; zero failed requests, every stream ends with [DONE], and /metrics
# counts equal what the clients received. CI runs the short form (16 clients,
# 10 s) as part of test_cli_serve; --full is the acceptance run (64 clients,
# 2 minutes). Bounded in time and count; it talks only to 127.0.0.1.
#
#   tests/serve/load_test.sh [--full] [--clients N] [--seconds S] [--build DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
clients=16 seconds=10 build=build-test
while (($#)); do
  case "$1" in
    --full) clients=64 seconds=120 ;;
    --clients) clients="$2"; shift ;;
    --seconds) seconds="$2"; shift ;;
    --build) build="$2"; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if ((clients < 1 || clients > 256 || seconds < 1 || seconds > 600)); then
  echo "clients must be 1..256 and seconds 1..600" >&2
  exit 2
fi
bin="$build/tests/test_cli_serve"
[ -x "$bin" ] || { echo "build $bin first (scripts/test.sh, or cmake --build $build --target test_cli_serve)" >&2; exit 2; }
BATON_SERVE_LOAD_CLIENTS=$clients BATON_SERVE_LOAD_SECONDS=$seconds \
  exec "$bin" --gtest_filter=Serve.LoadStreamsAllFinishAndMetricsMatch
