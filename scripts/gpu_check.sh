#!/usr/bin/env bash
# The device check, on a machine with an NVIDIA GPU (issue 13): every `gpu` test (each CUDA kernel
# against its CPU twin on the device, under compute-sanitizer's memcheck where it exists; the
# CUDA runner against the CPU runner: logits within bf16 tolerance and 32 greedy tokens), prefill
# and decode as two processes over cuda_ipc against colocated generation
# (scripts/gpu_tiers_check.sh), then gpu_bench's table of ratios to limits measured in the same
# run (bench/gpu_bench.cc) and bench-engine on an 8B shape with weights made on the GPU. Every stage runs even if one before it failed. Writes the log and the
# table to $OUT when it is set. Exits 77 where there is no GPU at all, 1 where one is there but
# the driver cannot use it (scripts/gpu_state.sh), or where a gpu test skipped beside a usable GPU.
#
# Two ways to get the binaries:
#   PDSERVE_GPU_BUNDLE=DIR  use what scripts/gpu_bundle.sh built and packed on a Debian machine
#                           (the lent GPU machines have CUDA but not gRPC, Abseil or OpenBLAS);
#   otherwise               build here with CUDA on (needs the Debian packages of scripts/setup.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-}"
log() { if [ -n "$OUT" ]; then tee -a "$OUT/gpu_check.log"; else cat; fi; }

# No GPU: nothing to check (exit 77, as a skipped test). A GPU the driver cannot use: a failure,
# not a skip (the gpu tests would otherwise all skip and pass).
state="$(scripts/gpu_state.sh)"
case "$state" in
  none)
    echo "gpu_check: no GPU on this machine (no /dev/nvidia<N>, none on the PCI bus): nothing checked" | log
    exit 77 ;;
  unusable)
    echo "gpu_check: FAILED: a GPU is here but the driver lists none (nvidia-smi -L):" | log
    nvidia-smi 2>&1 | head -5 | log
    exit 1 ;;
esac
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 | log || true
failed=0
# Every skip the gpu tests make is recorded; on a machine with a usable GPU a "needs gpu" skip
# fails the check (scripts/check_skips.py).
skips="$(mktemp -d)"
mkdir -p "$skips/skips"
export PDSERVE_SKIP_DIR="$skips/skips"
if [ -n "${PDSERVE_GPU_BUNDLE:-}" ]; then
  dir="$(cd "$PDSERVE_GPU_BUNDLE" && pwd)"
  work="$(mktemp -d)"
  tar -C "$work" -xJf "$dir/bundle.tar.xz"
  echo "bundle of commit $(cat "$dir/commit" 2>/dev/null)" | log
  # The toolkit's libraries: /usr/local/cuda, or the pip wheels of the image's python3.
  cuda_libs=/usr/local/cuda/lib64
  for pkg in nvidia/cu13/lib nvidia/cublas/lib nvidia/cuda_runtime/lib; do
    p="$(python3 -c "import os, nvidia; print(os.path.join(os.path.dirname(nvidia.__path__[0]), '$pkg'))" 2>/dev/null || true)"
    [ -n "$p" ] && [ -d "$p" ] && cuda_libs="$cuda_libs:$p"
  done
  export LD_LIBRARY_PATH="$work/lib:$cuda_libs:${LD_LIBRARY_PATH:-}"
  for t in kernels_cuda_test device_model_runner_gpu_test; do
    timeout 300 "$work/bin/$t" 2>&1 | log
    [ "${PIPESTATUS[0]}" = 0 ] || failed=1
  done
  if command -v compute-sanitizer >/dev/null; then
    echo "--- kernels under compute-sanitizer memcheck" | log
    timeout 300 compute-sanitizer --tool memcheck --error-exitcode 3 "$work/bin/kernels_cuda_test" \
      --gtest_brief=1 2>&1 | tail -20 | log
    [ "${PIPESTATUS[0]}" = 0 ] || failed=1
  fi
  pdserve="$work/bin/pdserve"
  bench="$work/bin/gpu_bench"
else
  PDSERVE_SKIP_SETUP="${PDSERVE_SKIP_SETUP:-1}" PDSERVE_BUILD_DIR=build-gpu \
    scripts/build.sh -DPDSERVE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 2>&1 | log
  [ "${PIPESTATUS[0]}" = 0 ] || exit 1
  rm -f build-gpu/skips/*.tsv
  skips=build-gpu  # ctest gives the tests build-gpu/skips.
  (cd build-gpu && ctest -L gpu --output-on-failure) 2>&1 | log
  [ "${PIPESTATUS[0]}" = 0 ] || failed=1
  pdserve=build-gpu/pdserve
  bench=build-gpu/bench/gpu_bench
fi
echo "--- skipped gpu tests" | log
python3 scripts/check_skips.py "$skips" --skips-only 2>&1 | log
[ "${PIPESTATUS[0]}" = 0 ] || failed=1
echo "--- prefill and decode over cuda_ipc" | log
timeout 240 scripts/gpu_tiers_check.sh "$pdserve" 2>&1 | log
[ "${PIPESTATUS[0]}" = 0 ] || failed=1
echo "--- prefill and decode over tcp, GPU pools staged through host memory" | log
PDSERVE_CHECK_TRANSPORT=tcp timeout 180 scripts/gpu_tiers_check.sh "$pdserve" 2>&1 | log
[ "${PIPESTATUS[0]}" = 0 ] || failed=1
echo "--- gpu_bench" | log
timeout 300 "$bench" 2>&1 | log
[ "${PIPESTATUS[0]}" = 0 ] || failed=1
# The engine on an 8B shape whose weights are made in GPU memory (no checkpoint), as a user runs it.
echo "--- bench-engine --random-weights llama3-8b --device cuda --kv-dtype bf16" | log
timeout 180 "$pdserve" bench-engine --random-weights llama3-8b --device cuda --kv-dtype bf16 --batch 64 \
  --input-len 512 --output-len 32 --kv-memory-gib 16 --bw-gib 1 --format json 2>&1 | log
[ "${PIPESTATUS[0]}" = 0 ] || failed=1
[ "$failed" = 0 ] && echo "gpu_check: all passed" | log || echo "gpu_check: FAILED (see above)" | log
exit "$failed"
