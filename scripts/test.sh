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
export PDSERVE_LOG_LEVEL="${PDSERVE_LOG_LEVEL:-warning}"
# What this run leaves out, reported (and, under PDSERVE_REQUIRE_ALL=1 as in CI, a failure).
left_out=()
if [ "$#" -gt 0 ]; then
  left_out+=(--left-out "nothing by itself, but the build ran with extra CMake arguments: $*")
fi
if [ "${PDSERVE_SKIP_FUZZ:-0}" = "1" ]; then
  left_out+=(--left-out "the sanitizer build's unit tests and the fuzzers (PDSERVE_SKIP_FUZZ=1)")
fi
rm -f "$BUILD_DIR"/skips/*.tsv
rc=0
(cd "$BUILD_DIR" && ctest --output-on-failure -j "$(nproc)" --timeout 900) || rc=$?
# Every skipped test with its reason; a skip this machine should not make, or a suite it should
# have built, fails the run (scripts/check_skips.py).
/usr/bin/python3 scripts/check_skips.py "$BUILD_DIR" "${left_out[@]}" || rc=1
[ "$rc" = 0 ] || exit "$rc"
# The sanitizer build: unit tests under ASan + UBSan, and each fuzzer for 45 s (set
# PDSERVE_SKIP_FUZZ=1 to leave it out of a local run).
if [ "${PDSERVE_SKIP_FUZZ:-0}" != "1" ]; then
  PDSERVE_SKIP_SETUP=1 scripts/fuzz.sh
fi
echo "test.sh: all tests passed in $(( $(date +%s) - start )) s"
