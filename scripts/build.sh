#!/usr/bin/env bash
# The shared build step of run.sh and test.sh: installs what is missing, then builds Release into
# build/ with ccache. Extra arguments go to CMake (e.g. -DPDSERVE_CUDA=OFF). PDSERVE_TARGETS: the
# ninja targets to build (default: all of them, tests included; run.sh builds `pdserve` only).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${PDSERVE_SKIP_SETUP:-0}" != "1" ]; then
  # shellcheck disable=SC2086  # PDSERVE_SETUP_ARGS: setup.sh's mode (run.sh: --run).
  scripts/setup.sh ${PDSERVE_SETUP_ARGS:-}
fi
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
BUILD_DIR="${PDSERVE_BUILD_DIR:-build}"
# The CUDA backend: PDSERVE_CUDA (AUTO unless set; run.sh: OFF unless it serves --device cuda),
# given on every configure so a build dir run.sh configured without it gets it back for test.sh.
# A -DPDSERVE_CUDA=... among the arguments wins.
cuda=(-DPDSERVE_CUDA="${PDSERVE_CUDA:-AUTO}")
if [[ " $* " == *" -DPDSERVE_CUDA="* ]]; then cuda=(); fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE="${PDSERVE_BUILD_TYPE:-Release}" "${cuda[@]}" "$@" >/dev/null
# Two cores and gRPC-sized translation units: keep the job count at the core count.
# shellcheck disable=SC2086  # PDSERVE_TARGETS is a list of target names.
ninja -C "$BUILD_DIR" -j "$(nproc)" ${PDSERVE_TARGETS:-}
