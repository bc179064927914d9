#!/usr/bin/env bash
# The GPU check of the CUDA backend, in two halves:
#
#   scripts/gpu-check.sh build        on a CPU machine with Rust: builds the check
#                                     (examples/gpu_check.rs, release, feature cuda)
#                                     into target/gpu-check/gpu_check, stripped
#   scripts/gpu-check.sh run [SIZE…]  on the GPU machine (NVIDIA driver, a Python
#                                     environment with the CUDA 13 libraries, no Rust,
#                                     no network): runs it; SIZE is small, medium or
#                                     large-bf16 (default: all three), or `remedies`:
#                                     the small size as it is, checkpointed, in bf16
#                                     and both, side by side (gpu-remedies.md)
#
# The run writes gpu-results.md, gpu-results.json and gpu-check.log into $OUT
# (or ./gpu-check-out). With the project's device tool: carry target/gpu-check
# and run `bash scripts/gpu-check.sh run` with a timeout_s that leaves room for
# a second try; copy gpu-results.md into docs/ with the date and the device.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
build)
  # link-time stubs are enough: the real libraries are loaded on the GPU machine
  LIGHT=${LIGHT:-1} source scripts/cuda-toolchain.sh
  cargo build --release --features cuda --example gpu_check
  mkdir -p target/gpu-check
  cp "${CARGO_TARGET_DIR:-target}/release/examples/gpu_check" target/gpu-check/gpu_check
  strip target/gpu-check/gpu_check
  ls -l target/gpu-check/gpu_check
  ;;
run)
  shift
  out=${OUT:-gpu-check-out}
  mkdir -p "$out"
  binary=target/gpu-check/gpu_check
  [ -x "$binary" ] || { echo "no $binary: run 'scripts/gpu-check.sh build' on a CPU machine and carry target/gpu-check" >&2; exit 2; }
  # the CUDA 13 libraries of the PyTorch environment (cuBLAS, cuBLASLt, cuRAND, the runtime)
  lib=$(python3 -c "import os, nvidia; print(os.path.join(nvidia.__path__[0], 'cu13', 'lib'))")
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$out/nvidia-smi.csv"
  # stop well inside the device tool's 10-minute limit so that the results come back
  OUT="$out" timeout "${GPU_CHECK_SECONDS:-480}" "$binary" "$@" 2>&1 | tee "$out/gpu-check.log"
  ;;
*)
  echo "usage: scripts/gpu-check.sh build | run [small|medium|large-bf16 ... | remedies]" >&2
  exit 2
  ;;
esac
