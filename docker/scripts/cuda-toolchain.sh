#!/usr/bin/env bash
# Assemble CUDA 12 build pieces in one directory, without a GPU, a driver or an NVIDIA base image, in two steps:
#   headers  the CUDA runtime's headers and library, and NVML's header, from NVIDIA's PyPI wheels (DEST/include,
#            DEST/lib64): enough for what compiles against CUDA without nvcc (libfabric's CUDA memory support and
#            aws-ofi-nccl, docker/scripts/build-efa.sh);
#   nvcc     adds nvcc, cicc and friends from Debian's non-free nvidia-cuda-toolkit package (downloaded from the
#            Debian mirror and unpacked, never installed, so nothing else of the other suite enters the image) and
#            the CCCL and NVTX headers (wheels): the toolchain of Horovod's NCCL kernels. NVIDIA's CUDA PyPI
#            wheels carry no nvcc.
# Only builds use it: the runtime libraries (cudart, NCCL, cuDNN...) are the ones TensorFlow's [and-cuda] extra
# installs in the venv.
#
# usage: cuda-toolchain.sh headers DEST | cuda-toolchain.sh nvcc DEST (a DEST made by `headers`)
# env:   headers: CUDA_NVCC_WHEEL_VERSION (its crt/ headers), CUDA_RUNTIME_WHEEL_VERSION, NVML_WHEEL_VERSION
#        nvcc: CUDA_DEBIAN_SUITE, NVIDIA_CUDA_TOOLKIT_DEB_VERSION, CUDA_CCCL_WHEEL_VERSION, NVTX_WHEEL_VERSION,
#        DEBIAN_MIRROR (default: the image's own mirror)
set -euo pipefail

usage="usage: cuda-toolchain.sh headers|nvcc DEST"
step=${1:?$usage}
dest=${2:?$usage}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/whl" "$dest/include" "$dest/lib64"

# wheels_include PACKAGE==VERSION...: the packages' include/ directories merged into DEST/include.
wheels_include() {
  python3 -m pip download --quiet --no-deps --only-binary=:all: --dest "$work/whl" "$@"
  for w in "$work"/whl/*.whl; do
    python3 -m zipfile -e "$w" "$work/whl/tree"
  done
  cp -a "$work"/whl/tree/nvidia/*/include/. "$dest/include/"
  rm -f "$dest/include/__init__.py"
}

if [ "$step" = headers ]; then
  : "${CUDA_NVCC_WHEEL_VERSION:?}" "${CUDA_RUNTIME_WHEEL_VERSION:?}" "${NVML_WHEEL_VERSION:?}"
  wheels_include "nvidia-cuda-nvcc-cu12==$CUDA_NVCC_WHEEL_VERSION" \
    "nvidia-cuda-runtime-cu12==$CUDA_RUNTIME_WHEEL_VERSION" "nvidia-nvml-dev-cu12==$NVML_WHEEL_VERSION"
  cp "$work/whl/tree/nvidia/cuda_runtime/lib/libcudart.so.12" "$dest/lib64/"
  ln -sf libcudart.so.12 "$dest/lib64/libcudart.so"
  echo "cuda-toolchain: CUDA headers in $dest ($(du -sh "$dest" | cut -f1))"
  exit 0
fi
[ "$step" = nvcc ] || { echo "$usage" >&2; exit 2; }
: "${CUDA_DEBIAN_SUITE:?}" "${NVIDIA_CUDA_TOOLKIT_DEB_VERSION:?}" "${CUDA_CCCL_WHEEL_VERSION:?}" "${NVTX_WHEEL_VERSION:?}"
[ -e "$dest/include/cuda_runtime.h" ] || { echo "cuda-toolchain: $dest has no CUDA headers: run the headers step first" >&2; exit 1; }

image_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    sed -n -E 's/^URIs:[[:space:]]*(https?:\/\/[^[:space:]]+\/debian)\/?$/\1/p; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?(https?:\/\/[^[:space:]]+\/debian)\/?[[:space:]].*/\2/p' "$f"
  done | head -n 1
}
mirror=${DEBIAN_MIRROR:-$(image_mirror)}
mirror=${mirror:-http://deb.debian.org/debian}

# A private apt configuration: the image's own sources and package state stay untouched.
mkdir -p "$work/apt/lists/partial" "$work/apt/cache/archives/partial" "$work/deb"
echo "deb $mirror $CUDA_DEBIAN_SUITE main contrib non-free" >"$work/apt/sources.list"
cat >"$work/apt/apt.conf" <<CONF
Dir::Etc::SourceList "$work/apt/sources.list";
Dir::Etc::SourceParts "/dev/null";
Dir::State::Lists "$work/apt/lists";
Dir::Cache "$work/apt/cache";
APT::Sandbox::User "root";
CONF
export APT_CONFIG="$work/apt/apt.conf"
apt-get update -qq
(cd "$work" && apt-get download -qq "nvidia-cuda-toolkit=$NVIDIA_CUDA_TOOLKIT_DEB_VERSION")
dpkg-deb -x "$work"/nvidia-cuda-toolkit_*.deb "$work/deb"

wheels_include "nvidia-cuda-cccl-cu12==$CUDA_CCCL_WHEEL_VERSION" "nvidia-nvtx-cu12==$NVTX_WHEEL_VERSION"

tk="$work/deb/usr/lib/nvidia-cuda-toolkit"
mkdir -p "$dest/bin/crt" "$dest/nvvm/bin" "$dest/nvvm/libdevice"
cp "$tk/bin/nvcc" "$dest/bin/"
cp "$tk/bin/crt/link.stub" "$tk/bin/crt/prelink.stub" "$dest/bin/crt/"
for tool in bin2c cudafe++ fatbinary nvlink ptxas nvprune cuobjdump; do
  cp "$work/deb/usr/bin/$tool" "$dest/bin/"
done
cp "$tk/bin/cicc" "$dest/nvvm/bin/"
cp "$tk/libdevice/libdevice.10.bc" "$dest/nvvm/libdevice/"
# nvcc names libcudadevrt in every link it drives (CMake's compiler check links a test program). It serves only
# dynamic parallelism and relocatable device code, which Horovod's kernels do not use, and NVIDIA's wheels do
# not ship it: an empty archive stands in. (The CUDA runtime is linked shared: CUDAFLAGS=--cudart=shared.)
ar rcs "$dest/lib64/libcudadevrt.a"
# NVIDIA's own layout, relative to the directory nvcc lives in, so the toolchain can be moved.
cat >"$dest/bin/nvcc.profile" <<'PROFILE'
TOP              = $(_HERE_)/..
NVVMIR_LIBRARY_DIR = $(TOP)/nvvm/libdevice
LD_LIBRARY_PATH += $(TOP)/lib64:
PATH            += $(TOP)/nvvm/bin:$(_HERE_):
INCLUDES        +=  "-I$(TOP)/include" $(_SPACE_)
LIBRARIES        =+ $(_SPACE_) "-L$(TOP)/lib64"
CUDAFE_FLAGS    +=
PTXAS_FLAGS     +=
PROFILE

# Proof that the toolchain compiles device code here (no GPU needed to compile).
printf '__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n' >"$work/probe.cu"
"$dest/bin/nvcc" --version | tail -n 2
"$dest/bin/nvcc" -c -arch=sm_80 -o "$work/probe.o" "$work/probe.cu"
printf 'int main() { return 0; }\n' >"$work/main.cu"
"$dest/bin/nvcc" --cudart=shared -o "$work/probe" "$work/main.cu" "$work/probe.o"
echo "cuda-toolchain: $dest ready ($(du -sh "$dest" | cut -f1))"
