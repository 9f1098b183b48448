#!/usr/bin/env bash
# Put the EFA software that build-efa.sh built (copied to /opt/amazon) in use, so that nothing needs a setting:
#   libfabric  /opt/amazon/efa/lib's libfabric.so.1 becomes the image's only one. One process loads one
#              libfabric.so.1, and a Horovod rank loads Open MPI's ofi MTL and NCCL's plugin, so both must load the
#              same (AWS's images use their installer's for both). Debian's libfabric1 (1.17, without an efa
#              provider) stays installed, as Open MPI's packages depend on it, but its files are diverted
#              (dpkg-divert: an upgrade or reinstall writes them there too) out of the loader's reach and removed;
#              /opt/amazon/efa/lib is in the loader's cache instead. fi_info and fi_pingpong go on PATH.
#   nccl       (GPU image, after the venv) /opt/amazon/ofi-nccl/lib in the loader's cache: NCCL dlopens its network
#              plugin as `libnccl-net.so`. The venv's CUDA runtime also answers to `libcudart.so`: libfabric's CUDA
#              memory support and the plugin (--enable-cudart-dynamic) dlopen it by that name, and NVIDIA's wheel
#              names it only libcudart.so.12.
# Each part checks its result and stops the build when it does not hold.
#
# usage: install-efa.sh libfabric | install-efa.sh nccl
set -euo pipefail

die() { echo "install-efa: $*" >&2; exit 1; }
efa=/opt/amazon/efa
ofi_nccl=/opt/amazon/ofi-nccl

case "${1:-}" in
  libfabric)
    [ -x "$efa/bin/fi_info" ] || die "$efa/bin/fi_info missing: copy /opt/amazon/efa from the fabric stage first"
    diverted=/usr/share/smhvd/diverted
    mkdir -p "$diverted"
    while IFS= read -r file; do
      dpkg-divert --quiet --local --rename --divert "$diverted/$(basename "$file")" --add "$file"
      rm -f "$diverted/$(basename "$file")"
    done < <(dpkg -L libfabric1 | grep -E '/libfabric\.so')
    echo "$efa/lib" >/etc/ld.so.conf.d/amazon-efa.conf
    ldconfig
    ln -sf "$efa/bin/fi_info" "$efa/bin/fi_pingpong" /usr/local/bin/
    found=$(find / -xdev -name 'libfabric.so*' ! -path "$efa/*" 2>/dev/null || true)
    [ -z "$found" ] || die "another libfabric besides $efa: $found"
    mtl=$(find /usr/lib -name mca_mtl_ofi.so | head -n 1)
    [ -n "$mtl" ] || die "Open MPI's ofi MTL (mca_mtl_ofi.so) not found"
    ldd "$mtl" | grep -q "libfabric.so.1 => $efa/lib/" || die "$mtl does not load $efa's libfabric: $(ldd "$mtl")"
    fi_info -l | grep -qx 'efa:' || die "fi_info -l lists no efa provider"
    echo "install-efa: libfabric $(fi_info --version | sed -n 's/^libfabric: //p') in $efa, the only one;" \
      "Open MPI's ofi MTL loads it"
    ;;
  nccl)
    plugin="$ofi_nccl/lib/libnccl-net.so"
    [ -f "$plugin" ] || die "$plugin missing: copy /opt/amazon/ofi-nccl from the ofi-nccl stage first"
    cudart=$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/nvidia/cuda_runtime/lib/libcudart.so.12
    [ -f "$cudart" ] || die "$cudart missing: the GPU venv first"
    echo "$ofi_nccl/lib" >/etc/ld.so.conf.d/aws-ofi-nccl.conf
    ln -sf "$cudart" /usr/local/lib/libcudart.so
    ldconfig
    if ldd "$plugin" | grep -q 'not found'; then
      die "$plugin cannot resolve its libraries: $(ldd "$plugin" | grep 'not found')"
    fi
    for name in libnccl-net.so libcudart.so; do
      ldconfig -p | awk -v name="$name" '$1 == name {found = 1} END {exit !found}' ||
        die "the loader's cache has no $name"
    done
    echo "install-efa: NCCL finds $plugin as libnccl-net.so; libcudart.so is $cudart"
    ;;
  *) echo "usage: install-efa.sh libfabric|nccl" >&2; exit 2 ;;
esac
