#!/usr/bin/env bash
# Build Horovod (requirements/horovod.txt) from source against the TensorFlow already in the venv (hence no build
# isolation) with MPI and Gloo controllers; gpu: also NCCL GPU operations, compiled with the toolchain at
# CUDA_HOME (see cuda-toolchain.sh) and linked to the CUDA runtime and NCCL of the venv's NVIDIA wheels through
# an RPATH, so the image needs neither /opt/cuda nor LD_LIBRARY_PATH at run time.
# The image build and the dev setup (bin/setup-host.sh, cpu) both build Horovod with this script. For gpu pip's
# cache is off: CPU and GPU Horovod wheels have the same name and cache key, and the GPU one must never be
# reused for a CPU build (for cpu, the caller's pip settings apply: the images set PIP_NO_CACHE_DIR=1).
#
# usage: build-horovod.sh cpu|gpu REQUIREMENTS_DIR
# env:   CUDA_HOME (gpu), HOROVOD_BUILD_CUDA_CC_LIST (gpu)
set -euo pipefail

flavor=${1:?usage: build-horovod.sh cpu|gpu REQUIREMENTS_DIR}
reqdir=${2:?usage: build-horovod.sh cpu|gpu REQUIREMENTS_DIR}

export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1
export HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=MPI
MAKEFLAGS=-j$(nproc)
export MAKEFLAGS

case "$flavor" in
  cpu) ;;
  gpu)
    : "${CUDA_HOME:?CUDA_HOME must point to the CUDA toolchain}" "${HOROVOD_BUILD_CUDA_CC_LIST:?}"
    nv=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia
    for f in "$nv/nccl/include/nccl.h" "$nv/nccl/lib/libnccl.so.2" "$nv/cuda_runtime/lib/libcudart.so.12"; do
      if [ ! -e "$f" ]; then
        echo "build-horovod: $f missing: install the stack with install-stack.sh gpu first" >&2
        exit 1
      fi
    done
    # The NCCL wheel ships only libnccl.so.2; CMake looks for libnccl.so.
    mkdir -p "$CUDA_HOME/nccl/lib" "$CUDA_HOME/lib64"
    ln -sfn "$nv/nccl/include" "$CUDA_HOME/nccl/include"
    ln -sf "$nv/nccl/lib/libnccl.so.2" "$CUDA_HOME/nccl/lib/libnccl.so"
    ln -sf "$nv/cuda_runtime/lib/libcudart.so.12" "$CUDA_HOME/lib64/libcudart.so"
    toolchain=$(mktemp --suffix=.cmake)
    # The wheels have no libcudart_static.a: CMake (its compiler check included) links the shared runtime, and
    # Horovod's libraries find it and NCCL in the venv through their RPATH.
    {
      echo 'set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)'
      printf 'set(CMAKE_SHARED_LINKER_FLAGS_INIT "-Wl,-rpath,%s:%s")\n' "$nv/cuda_runtime/lib" "$nv/nccl/lib"
    } >"$toolchain"
    # Horovod prefers an nvcc found on PATH over HOROVOD_CUDA_HOME: put ours first.
    export PATH="$CUDA_HOME/bin:$PATH" CUDACXX="$CUDA_HOME/bin/nvcc" CMAKE_TOOLCHAIN_FILE="$toolchain"
    export CUDAFLAGS=--cudart=shared
    export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_CUDA_HOME="$CUDA_HOME" HOROVOD_NCCL_HOME="$CUDA_HOME/nccl"
    export HOROVOD_NCCL_LINK=SHARED
    ;;
  *) echo "build-horovod: flavor must be cpu or gpu, not '$flavor'" >&2; exit 2 ;;
esac

cache=()
[ "$flavor" = cpu ] || cache=(--no-cache-dir)
python -m pip install "${cache[@]}" --no-build-isolation -r "$reqdir/horovod.txt"
hvd=$(python -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("horovod").origin))')
# Debug sections make the libraries 15x larger (17.5 MB -> 1.1 MB).
find "$hvd" -name '*.so' -exec strip --strip-debug {} +
if [ "$flavor" = gpu ]; then
  lib=$(find "$hvd/tensorflow" -name 'mpi_lib*.so' | head -n 1)
  if ldd "$lib" | grep -E 'libcudart|libnccl' | grep -q 'not found'; then
    echo "build-horovod: $lib cannot resolve the CUDA runtime or NCCL:" >&2
    ldd "$lib" >&2
    exit 1
  fi
fi
