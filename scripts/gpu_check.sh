#!/usr/bin/env bash
# The device check, run on a machine with an NVIDIA GPU: builds with CUDA on and runs the
# ctest label `gpu` (CUDA kernels against their CPU twins). Prints what it found either way.
set -euo pipefail
cd "$(dirname "$0")/.."

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || echo "no nvidia-smi"
PDSERVE_BUILD_DIR=build-gpu scripts/build.sh -DPDSERVE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
cd build-gpu
ctest -L gpu --output-on-failure
