#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: the GoogleTest binaries, the numpy
# reference parity test and the end-to-end CLI tests (all registered with ctest). Tests that need
# a GPU carry the label `gpu` and skip cleanly without one. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
scripts/build.sh "$@"
BUILD_DIR="${PDSERVE_BUILD_DIR:-build}"
cd "$BUILD_DIR"
export PDSERVE_LOG_LEVEL="${PDSERVE_LOG_LEVEL:-warning}"
ctest --output-on-failure -j "$(nproc)" --timeout 900
echo "test.sh: all tests passed in $(( $(date +%s) - start )) s"
