#!/usr/bin/env bash
# Installs the Debian 12 packages pdserve needs that this machine lacks. Idempotent: does
# nothing (not even apt-get update) when everything is present.
#   scripts/setup.sh          what building, running and testing need
#   scripts/setup.sh --run    what building and running pdserve need (scripts/run.sh): no test
#                             oracles, sanitizer compiler, Prometheus, Redis server or Node.js
#   scripts/setup.sh --train  also what scripts/train_demo_model.py needs (torch, the KJV text)
set -euo pipefail

# Building (CMake configures the tests' libraries too: GoogleTest and Google Benchmark are small)
# and running pdserve, its Python client and the tour's curl.
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev
  libabsl-dev libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev libre2-dev libopenblas-dev libxxhash-dev libhiredis-dev libcpp-httplib-dev libucx-dev libzmq3-dev
  python3 python3-grpcio python3-protobuf libicu-dev libssl-dev curl
)
# Testing: the oracles (numpy, jsonschema, ...), the sanitizer build, the servers the tests start.
TEST_PACKAGES=(
  redis-server ucx-utils
  python3-numpy python3-yaml python3-jinja2 python3-zmq python3-msgpack python3-xxhash python3-jsonschema
  prometheus openssl clang libclang-rt-14-dev gnuplot-nox time
)

case "${1:-}" in
  --run) TEST_PACKAGES=() ;;
  --train) PACKAGES+=(python3-torch bible-kjv bible-kjv-text) ;;
esac
PACKAGES+=("${TEST_PACKAGES[@]}")

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
# Node.js and npm run the tokenizer oracle (tests/tokenizer); any install that provides them will do.
if [ ${#TEST_PACKAGES[@]} -gt 0 ] && { ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; }; then
  missing+=(nodejs npm)
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}" >&2
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
