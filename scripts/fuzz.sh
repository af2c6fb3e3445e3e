#!/usr/bin/env bash
# The sanitizer build: clang with AddressSanitizer + UndefinedBehaviorSanitizer into build-fuzz/,
# runs every GoogleTest binary (ctest label `unit`) there, then each libFuzzer target in fuzz/
# on its committed seed corpus, one target a core at once. The fuzzers share a wall-clock budget,
# PDSERVE_FUZZ_BUDGET_SECONDS (default 210): each target gets budget x cores / targets seconds (at
# least 20; 30 s each for 14 targets on 2 cores, 240 s on 16), or PDSERVE_FUZZ_SECONDS each when
# set. Exits non-zero on a test failure, a sanitizer report or a fuzzer crash (the crashing input
# is kept in build-fuzz/crashes/).
#   scripts/fuzz.sh                      # what CI runs (scripts/test.sh calls it)
#   PDSERVE_FUZZ_SECONDS=600 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${PDSERVE_SKIP_SETUP:-0}" != "1" ]; then
  scripts/setup.sh
fi
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
BUILD_DIR=build-fuzz
# -O1 with line tables only: sanitizer reports keep file:line, and the build (every library with
# ASan, on 2 cores) is lighter than -O2 -g.
CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS_RELEASE="-O1 -gline-tables-only -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELEASE="-O1 -gline-tables-only -DNDEBUG" \
  -DPDSERVE_FUZZ=ON -DPDSERVE_SANITIZE=address,undefined -DPDSERVE_CUDA=OFF >/dev/null
ninja -C "$BUILD_DIR" -j "$(nproc)" unit_tests fuzzers

# Any UBSan finding is an error; leak checking stays on (ASan's default).
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export ASAN_OPTIONS="detect_stack_use_after_return=0:strict_string_checks=1"
# Third-party one-time allocations only (UCX's transport tables); see the file.
export LSAN_OPTIONS="suppressions=$(pwd)/fuzz/lsan_suppressions.txt"
export PDSERVE_LOG_LEVEL="${PDSERVE_LOG_LEVEL:-warning}"
# The *_reversed entries (the host execution layer's threads in reverse: races) run in the
# Release build of test.sh; under the sanitizers they would only repeat the same memory accesses.
rm -f "$BUILD_DIR"/skips/*.tsv
rc=0
(cd "$BUILD_DIR" && ctest -L unit -E '_reversed$' --output-on-failure -j "$(nproc)" --timeout 900) || rc=$?
# What the sanitizer build skipped, and why (it leaves CUDA out on purpose: skips only).
/usr/bin/python3 scripts/check_skips.py "$BUILD_DIR" --skips-only || rc=1
[ "$rc" = 0 ] || exit "$rc"

# Every fuzz target the build lists (fuzz/CMakeLists.txt) runs, each with its seed corpus; a
# target without one, or a corpus without a target, is an error, not a fuzzer left out.
targets=$(cat "$BUILD_DIR/fuzz/fuzzers.txt")
for target in $targets; do
  if [ ! -d "fuzz/corpus/$target" ] || [ -z "$(ls -A "fuzz/corpus/$target")" ]; then
    echo "fuzz.sh: fuzz target $target has no seed corpus in fuzz/corpus/$target (fuzz/make_corpus.py)" >&2
    exit 1
  fi
done
for dir in fuzz/corpus/*/; do
  if ! grep -qx "$(basename "$dir")" <<<"$targets"; then
    echo "fuzz.sh: fuzz/corpus/$(basename "$dir") belongs to no fuzz target in fuzz/CMakeLists.txt" >&2
    exit 1
  fi
done

mkdir -p "$BUILD_DIR/crashes"
budget="${PDSERVE_FUZZ_BUDGET_SECONDS:-210}"
n_targets=$(wc -w <<<"$targets")
if [ "$n_targets" -eq 0 ]; then
  echo "fuzz.sh: $BUILD_DIR/fuzz/fuzzers.txt lists no fuzz target" >&2
  exit 1
fi
SECONDS_EACH="${PDSERVE_FUZZ_SECONDS:-$(( budget * $(nproc) / n_targets ))}"
if [ -z "${PDSERVE_FUZZ_SECONDS:-}" ] && [ "$SECONDS_EACH" -lt 20 ]; then SECONDS_EACH=20; fi
# One fuzzer a core, each single-threaded for its full time: $(nproc) of them at once.
fuzz_one() {
  local target=$1 work="$BUILD_DIR/corpus/$1"
  mkdir -p "$work"
  "$BUILD_DIR/fuzz/$target" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 \
      -print_final_stats=1 -artifact_prefix="$BUILD_DIR/crashes/$target-" \
      "$work" "fuzz/corpus/$target" >"$BUILD_DIR/$target.log" 2>&1
}
report() {  # target exit-status
  if [ "$2" != 0 ]; then
    tail -n 60 "$BUILD_DIR/$1.log"
    echo "fuzz.sh: $1 failed; reproducer in $BUILD_DIR/crashes/" >&2
    return 1
  fi
  echo "fuzz.sh: $1 ${SECONDS_EACH}s: $(grep -E "^stat::number_of_executed_units|^stat::new_units_added" \
      "$BUILD_DIR/$1.log" | tr '\n' ' ')"
}
read -r -a queue <<<"$(echo $targets)"
jobs_at_once=$(nproc)
failed=0
for ((i = 0; i < ${#queue[@]}; i += jobs_at_once)); do
  batch=("${queue[@]:i:jobs_at_once}")
  pids=()
  for target in "${batch[@]}"; do
    fuzz_one "$target" &
    pids+=($!)
  done
  for k in "${!batch[@]}"; do
    status=0
    wait "${pids[$k]}" || status=$?
    report "${batch[$k]}" "$status" || failed=1
  done
  [ "$failed" = 0 ] || exit 1
done
echo "fuzz.sh: unit tests and fuzzers clean"
