#!/usr/bin/env bash
# Sets up a CUDA 13.0 toolchain on a CPU-only x86_64 Linux machine from NVIDIA's
# Python wheels, so that `cargo check/build --features cuda` compiles and links
# here. Nothing here can run CUDA code: the driver library is a link-time stub;
# the real one is loaded on a GPU machine.
#
#   source scripts/cuda-toolchain.sh           # nvcc + real cuBLAS/cuRAND/NVRTC (~675 MB)
#   LIGHT=1 source scripts/cuda-toolchain.sh   # nvcc + link stubs only (~105 MB), enough for `cargo check`
#   cargo check --features cuda --all-targets   # ~7 min the first time on 2 cores (candle-kernels)
#
# Why 13.0 exactly: driver 580 accepts PTX up to ISA 9.0 (CUDA 13.0); 12.x would
# link libcublas.so.12, absent from a cu13 PyTorch environment; 13.1+ writes PTX a
# 13.0 driver rejects. nvidia-nvvm is pinned with nvcc, or pip pulls a newer cicc
# whose output ptxas rejects.
# Needs: python3 with pip, gcc, awk. Prefix: $CUDA_PREFIX (default ~/.cache/cuda-13.0-wheels).
# Exports CUDA_HOME, PATH, CUDA_COMPUTE_CAP (default 90: H100/H200), CUDAFORGE_THREADS,
# CUDARC_CUDA_VERSION, and CUDA_STUB_RUNTIME_PATH (an LD_LIBRARY_PATH under which a
# cuda build's tests start on a CPU-only machine, every driver call failing).

_autobatch_cuda_setup() {
  local prefix=${CUDA_PREFIX:-$HOME/.cache/cuda-13.0-wheels}
  local light=${LIGHT:-0}
  local home="$prefix/nvidia/cu13"
  if [ ! -x "$home/bin/nvcc" ] || { [ "$light" != 1 ] && [ ! -e "$home/lib/libcublas.so.13" ]; }; then
    echo "cuda toolchain: installing CUDA 13.0 wheels into $prefix" >&2
    python3 -m pip install --disable-pip-version-check --no-cache-dir --quiet --target "$prefix" --upgrade \
      nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-crt==13.0.88 \
      nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 \
      $( [ "$light" = 1 ] || echo nvidia-cuda-nvrtc==13.0.48 nvidia-cublas==13.0.0.19 nvidia-curand==10.4.0.35 ) \
      || return 1
  fi
  # the linker wants unversioned names; the wheels ship only sonames
  local l so
  for l in cublas cublasLt curand nvrtc cudart; do
    so=$(cd "$home/lib" && ls lib$l.so.[0-9]* 2>/dev/null | head -n1) || true
    [ -n "$so" ] && ln -sfn "$so" "$home/lib/lib$l.so"
  done
  mkdir -p "$home/lib/stubs" || return 1
  # _stub SONAME OUT SYMFILE RET: a shared object exporting each name in SYMFILE as int f(void){return RET;}
  _stub() {
    awk -v r="$4" '{printf "int %s(void){return %s;}\n", $1, r}' "$3" > "$3.c" &&
      gcc -O0 -shared -fPIC -Wl,-soname,"$1" -o "$2" "$3.c"
  }
  if [ ! -e "$home/lib/stubs/libcuda.so" ]; then
    # every cu* entry point of the driver API; each returns CUDA_ERROR_STUB_LIBRARY (34)
    # should the stub ever be loaded by mistake
    gcc -E -P -I"$home/include" "$home/include/cuda.h" |
      grep -oE '\bcu[A-Za-z0-9_]+[[:space:]]*\(' | sed -E 's/[[:space:]]*\($//' | sort -u > "$prefix/libcuda_syms.txt"
    _stub libcuda.so.1 "$home/lib/stubs/libcuda.so" "$prefix/libcuda_syms.txt" 34 || return 1
  fi
  if [ "$light" = 1 ]; then
    # link-only stand-ins with the real sonames; symbol names from cudarc's bindings
    # in the cargo registry (`cargo fetch` first)
    local cudarc spec dir soname
    cudarc=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/cudarc-* 2>/dev/null | sort -V | tail -n1)
    for spec in cublas:libcublas.so.13:cublas cublasLt:libcublasLt.so.13:cublaslt \
                curand:libcurand.so.10:curand nvrtc:libnvrtc.so.13:nvrtc; do
      IFS=: read -r l soname dir <<<"$spec"
      # a placeholder stub (made before cudarc's sources were fetched) is made again
      if [ -e "$home/lib/stubs/lib$l.so" ] && ! grep -qs StubPlaceholder "$prefix/lib${l}_syms.txt"; then
        continue
      fi
      if [ -n "$cudarc" ] && [ -e "$cudarc/src/$dir/sys/mod.rs" ]; then
        grep -ohE "pub unsafe fn $l[A-Za-z0-9_]+" "$cudarc/src/$dir/sys/mod.rs" |
          awk '{print $4}' | sort -u > "$prefix/lib${l}_syms.txt"
      else
        echo "cuda toolchain: cudarc sources not found; LIGHT stubs are good for 'cargo check' only" >&2
        echo "${l}StubPlaceholder" > "$prefix/lib${l}_syms.txt"
      fi
      _stub "$soname" "$home/lib/stubs/lib$l.so" "$prefix/lib${l}_syms.txt" 1 || return 1
    done
  fi
  unset -f _stub
  # Soname links to the stubs, for *running* CPU-only tests of a cuda build
  # (e.g. is_oom on real error types): LD_LIBRARY_PATH=$CUDA_STUB_RUNTIME_PATH.
  # Every stubbed driver call returns CUDA_ERROR_STUB_LIBRARY; nothing runs on a GPU.
  local runtime="$home/lib/stubs/runtime"
  mkdir -p "$runtime" || return 1
  ln -sfn ../libcuda.so "$runtime/libcuda.so.1"
  for spec in cublas:libcublas.so.13 cublasLt:libcublasLt.so.13 curand:libcurand.so.10 nvrtc:libnvrtc.so.13; do
    IFS=: read -r l soname <<<"$spec"
    if [ -e "$home/lib/$soname" ]; then
      ln -sfn "../../$soname" "$runtime/$soname"
    elif [ -e "$home/lib/stubs/lib$l.so" ]; then
      ln -sfn "../lib$l.so" "$runtime/$soname"
    fi
  done
  export CUDA_STUB_RUNTIME_PATH="$runtime:$home/lib"
  export CUDA_HOME="$home"
  export PATH="$home/bin:$PATH"
  export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
  export CUDAFORGE_THREADS=${CUDAFORGE_THREADS:-$(nproc)}
  export CUDARC_CUDA_VERSION=13000
  echo "cuda toolchain: CUDA_HOME=$CUDA_HOME ($(nvcc --version | tail -n1))" >&2
}
_autobatch_cuda_setup
_autobatch_cuda_status=$?
unset -f _autobatch_cuda_setup
# sourced: report failure without killing the caller's shell; executed: exit with it
return $_autobatch_cuda_status 2>/dev/null || exit $_autobatch_cuda_status
