#!/usr/bin/env bash
# Installs what is missing, builds, and runs every test: the GoogleTest binaries, the numpy
# reference parity test and the end-to-end tests (all registered with ctest), then the sanitizer
# build's unit tests and the fuzzers (scripts/fuzz.sh). Tests that need
# a GPU carry the label `gpu` and skip cleanly without one. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
scripts/build.sh "$@"
BUILD_DIR="${PDSERVE_BUILD_DIR:-build}"
cd "$BUILD_DIR"
export PDSERVE_LOG_LEVEL="${PDSERVE_LOG_LEVEL:-warning}"
ctest --output-on-failure -j "$(nproc)" --timeout 900
cd - >/dev/null
# The sanitizer build: unit tests under ASan + UBSan, and each fuzzer for 60 s (set
# PDSERVE_SKIP_FUZZ=1 to leave it out of a local run).
if [ "${PDSERVE_SKIP_FUZZ:-0}" != "1" ]; then
  PDSERVE_SKIP_SETUP=1 scripts/fuzz.sh
fi
echo "test.sh: all tests passed in $(( $(date +%s) - start )) s"
