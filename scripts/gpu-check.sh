#!/usr/bin/env bash
# The GPU check of the CUDA backend, in two halves:
#
#   scripts/gpu-check.sh build        on a CPU machine with Rust: builds the check
#                                     (crates/models/examples/gpu_check/, release, feature cuda)
#                                     into target/gpu-check/gpu_check.xz, stripped and compressed
#   scripts/gpu-check.sh run [SIZE…]  on the GPU machine (NVIDIA driver, a Python
#                                     environment with the CUDA 13 libraries, no Rust,
#                                     no network): runs it; SIZE is small, medium or
#                                     large-bf16 (default: all three, then lean and
#                                     serve), `lean` (the lean step on CUDA against its
#                                     other forms), `serve` (serving a config, checked), or `remedies`:
#                                     the small size as it is, checkpointed, in bf16
#                                     and both, side by side (gpu-remedies.md)
#
# The run writes gpu-results.md, gpu-results.json and gpu-check.log into $OUT
# (or ./gpu-check-out), after every size. Sizes run smallest first; the check
# stops starting sizes when GPU_CHECK_SECONDS (default 300) is nearly spent,
# so `small` decides within five minutes and the rest runs if time remains.
#
# With the project's device tool (a task gets 15 minutes of device time in
# all, machine start included), after `scripts/gpu-check.sh build` here:
#
#   run(command="bash scripts/gpu-check.sh run small lean serve", carry=["target/gpu-check"], timeout_s=480)
#
# then, if time is left, the same with `medium large-bf16`. Copy
# gpu-results.md into docs/gpu.md's results with the date and the device.
set -euo pipefail
cd "$(dirname "$0")/.."

case "${1:-}" in
build)
  # link-time stubs are enough: the real libraries are loaded on the GPU machine;
  # their symbols come from cudarc's sources, fetched first
  cargo fetch --quiet
  LIGHT=${LIGHT:-1} source scripts/cuda-toolchain.sh
  cargo build --release -p autobatch-models --features cuda --example gpu_check
  mkdir -p target/gpu-check
  cp "${CARGO_TARGET_DIR:-target}/release/examples/gpu_check" target/gpu-check/gpu_check
  strip target/gpu-check/gpu_check
  # candle's PTX kernels make the binary some 65 MB, over what the device tool
  # carries: it travels compressed (PTX is text), and the run half unpacks it
  python3 -c 'import lzma, shutil, sys
with open(sys.argv[1], "rb") as raw, lzma.open(sys.argv[2], "wb", preset=9) as packed:
    shutil.copyfileobj(raw, packed)' target/gpu-check/gpu_check target/gpu-check/gpu_check.xz
  rm target/gpu-check/gpu_check
  ls -l target/gpu-check/gpu_check.xz
  # what the device tool carries: 64 MiB in all
  size=$(stat -c %s target/gpu-check/gpu_check.xz)
  limit=$((60 * 1024 * 1024))
  if [ "$size" -gt "$limit" ]; then
    echo "target/gpu-check/gpu_check.xz is $size bytes: over the $limit the carry leaves room for (64 MiB in all)" >&2
    exit 2
  fi
  ;;
run)
  shift
  out=${OUT:-gpu-check-out}
  mkdir -p "$out"
  packed=target/gpu-check/gpu_check.xz
  [ -e "$packed" ] || { echo "no $packed: run 'scripts/gpu-check.sh build' on a CPU machine and carry target/gpu-check" >&2; exit 2; }
  binary=$(mktemp -d)/gpu_check
  python3 -c 'import lzma, shutil, sys
with lzma.open(sys.argv[1], "rb") as packed, open(sys.argv[2], "wb") as raw:
    shutil.copyfileobj(packed, raw)' "$packed" "$binary"
  chmod +x "$binary"
  # the CUDA 13 libraries of the PyTorch environment (cuBLAS, cuBLASLt, cuRAND, the runtime)
  lib=$(python3 -c "import os, nvidia; print(os.path.join(nvidia.__path__[0], 'cu13', 'lib'))" 2>/dev/null) || lib=
  if [ -z "$lib" ] || [ ! -d "$lib" ]; then
    echo "no CUDA 13 library folder (python3 -c 'import nvidia' → ${lib:-nothing}/): the check needs the nvidia cu13 wheels" >&2
    exit 2
  fi
  for needed in libcublas.so.13 libcublasLt.so.13 libcurand.so.10; do
    ls "$lib"/$needed* >/dev/null 2>&1 || { echo "$lib has no $needed" >&2; exit 2; }
  done
  export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # every shared library the binary links (the CUDA runtime candle's kernels
  # need too, the driver's libcuda), found before anything starts
  if command -v ldd >/dev/null 2>&1; then
    missing=$(ldd "$binary" | awk '/not found/ {print $1}' | tr '\n' ' ')
    if [ -n "$missing" ]; then
      echo "$binary needs libraries not found with $lib on the path: $missing" >&2
      exit 2
    fi
  fi
  nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv | tee "$out/nvidia-smi.csv"
  # the driver must run CUDA 13 code: its CUDA version (nvidia-smi's header) at least 13.0
  cuda=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9][0-9]*\)\.\([0-9]*\).*/\1 \2/p' | head -n 1)
  if [ -z "$cuda" ] || [ "${cuda%% *}" -lt 13 ]; then
    echo "the driver supports CUDA ${cuda:-unknown} (nvidia-smi): the check is built for CUDA 13" >&2
    exit 2
  fi
  seconds=${GPU_CHECK_SECONDS:-300}
  # the binary stops starting sizes 20 s before the limit; timeout is the backstop
  OUT="$out" GPU_CHECK_DEADLINE_S=$((seconds - 20)) timeout "$seconds" "$binary" "$@" 2>&1 | tee "$out/gpu-check.log"
  ;;
*)
  echo "usage: scripts/gpu-check.sh build | run [small|medium|large-bf16|lean|serve ... | remedies]" >&2
  exit 2
  ;;
esac
