#!/usr/bin/env bash
# The shared build step of run.sh and test.sh: installs what is missing, then builds Release into
# build/ with ccache. Extra arguments go to CMake (e.g. -DPDSERVE_CUDA=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${PDSERVE_SKIP_SETUP:-0}" != "1" ]; then
  scripts/setup.sh
fi
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
BUILD_DIR="${PDSERVE_BUILD_DIR:-build}"
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${PDSERVE_BUILD_TYPE:-Release}" "$@" >/dev/null
# Two cores and gRPC-sized translation units: keep the job count at the core count.
ninja -C "$BUILD_DIR" -j "$(nproc)"
