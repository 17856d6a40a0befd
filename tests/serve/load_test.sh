#!/usr/bin/env bash
# Load test of `baton serve` on loopback: N concurrent streaming clients (chat
# and completions, random lengths and temperatures) for S seconds against one
# server; zero failed requests, every stream ends with [DONE], /metrics counts
# equal what the clients received (one request in 16 leaves its stream early:
# counted once, no slot left busy), and the resident memory of the server and
# its workers is reported (and must grow under 1% on runs of 5 minutes or
# more). CI runs the short forms (16 clients, 10 s, in process and on 2 local
# workers) as part of test_cli_serve and test_cli_serve_cluster. Bounded in time and count; 127.0.0.1 only.
#
#   tests/serve/load_test.sh [--full | --soak] [--clients N] [--seconds S]
#                            [--workers K] [--in-process] [--build DIR]
#
#   --full   the serving acceptance run: 64 clients for 2 minutes
#   --soak   the reliability soak: 64 clients for 10 minutes on 2 workers
set -euo pipefail
cd "$(dirname "$0")/../.."
clients=16 seconds=10 build=build-test workers=2 suite=test_cli_serve_cluster
filter=ServeCluster.LoadStreamsAllFinishAndMetricsMatch
while (($#)); do
  case "$1" in
    --full) clients=64 seconds=120 ;;
    --soak) clients=64 seconds=600 ;;
    --clients) clients="$2"; shift ;;
    --seconds) seconds="$2"; shift ;;
    --workers) workers="$2"; shift ;;
    --in-process) suite=test_cli_serve filter=Serve.LoadStreamsAllFinishAndMetricsMatch ;;
    --build) build="$2"; shift ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
if ((clients < 1 || clients > 256 || seconds < 1 || seconds > 3600 || workers < 1 || workers > 5)); then
  echo "clients must be 1..256, seconds 1..3600 and workers 1..5" >&2
  exit 2
fi
bin="$build/tests/$suite"
[ -x "$bin" ] || { echo "build $bin first (scripts/test.sh, or cmake --build $build --target $suite)" >&2; exit 2; }
BATON_SERVE_LOAD_CLIENTS=$clients BATON_SERVE_LOAD_SECONDS=$seconds BATON_SERVE_LOAD_WORKERS=$workers \
  exec "$bin" --gtest_filter="$filter"
