#!/usr/bin/env bash
# Prints what this machine's NVIDIA GPU state is, for scripts/gpu_check.sh:
#   usable    the driver lists at least one GPU (nvidia-smi -L)
#   unusable  a GPU is there (a /dev/nvidia<N> device node, or an NVIDIA device on the PCI bus)
#             but the driver lists none or fails: a broken driver or a device it cannot use
#   none      no GPU at all
# NVIDIA_SMI and PDSERVE_GPU_DEV_GLOB stand in for the tool and the device nodes in
# tests/check_skips_test.py (this machine has no GPU to break).
set -uo pipefail
smi="${NVIDIA_SMI:-nvidia-smi}"
if command -v "$smi" >/dev/null 2>&1 && "$smi" -L 2>/dev/null | grep -q '^GPU '; then
  echo usable
  exit 0
fi
shopt -s nullglob
nodes=(${PDSERVE_GPU_DEV_GLOB:-/dev/nvidia[0-9]*})
if [ "${#nodes[@]}" -gt 0 ]; then
  echo unusable
elif [ -z "${PDSERVE_GPU_DEV_GLOB:-}" ] && command -v lspci >/dev/null 2>&1 &&
    lspci 2>/dev/null | grep -qiE '(3d|vga).*nvidia'; then
  echo unusable
else
  echo none
fi
