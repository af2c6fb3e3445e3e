#!/usr/bin/env bash
# Prepares the device check on a machine without a GPU: builds pdserve, the GPU test binaries
# and gpu_bench here (Debian 12, sm_80 and sm_90) and packs them with the Debian libraries they load
# into .gpu_bundle/ (git-ignored), to be carried to a lent GPU machine whose image lacks gRPC,
# Abseil and OpenBLAS. The CUDA runtime and cuBLASLt come from that machine's toolkit (the bundle
# would be 500 MB with them). Then, on the GPU machine: PDSERVE_GPU_BUNDLE=.gpu_bundle
# scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${PDSERVE_BUILD_DIR:-build}"
PDSERVE_SKIP_SETUP="${PDSERVE_SKIP_SETUP:-0}" PDSERVE_BUILD_DIR="$BUILD_DIR" scripts/build.sh -DPDSERVE_CUDA=ON
ninja -C "$BUILD_DIR" pdserve kernels_cuda_test device_model_runner_gpu_test gpu_bench >/dev/null

rm -rf .gpu_bundle
mkdir -p .gpu_bundle/stage/bin .gpu_bundle/stage/lib
cp "$BUILD_DIR/pdserve" "$BUILD_DIR/kernels/cuda/kernels_cuda_test" \
   "$BUILD_DIR/common/engine/device_model_runner_gpu_test" "$BUILD_DIR/bench/gpu_bench" .gpu_bundle/stage/bin/
strip .gpu_bundle/stage/bin/*
# Every shared library they load, except the C runtime (the GPU machine's is newer), the CUDA
# toolkit's and the driver's.
for bin in .gpu_bundle/stage/bin/*; do
  ldd "$bin" | awk '$3 ~ /^\// {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt)\.so' |
  while read -r lib; do cp -L "$lib" .gpu_bundle/stage/lib/; done
tar -C .gpu_bundle/stage -cJf .gpu_bundle/bundle.tar.xz bin lib
rm -rf .gpu_bundle/stage
git rev-parse HEAD > .gpu_bundle/commit
du -sh .gpu_bundle
