#!/usr/bin/env bash
# Build EFA's user-space software from pinned sources, installed where AWS's EFA installer and Deep Learning
# Containers put it (so AWS's documentation and recipes apply as written):
#   libfabric     /opt/amazon/efa        bin/fi_info, fi_pingpong; lib/libfabric.so.1. Providers: efa (rdma-core's
#                                        libefa, Debian's), shm (efa's path between ranks of one host), tcp, rxm.
#                                        CUDA memory support is loaded at run time (--enable-cuda-dlopen): one build
#                                        serves the CPU image (no CUDA: the support stays off) and the GPU image
#                                        (GPU memory registered with EFA, which aws-ofi-nccl requires).
#   aws-ofi-nccl  /opt/amazon/ofi-nccl   lib/libnccl-net.so (NCCL's network plugin for libfabric, its tuner too) and
#                                        share/aws-ofi-nccl/xml (p4d/g5 topologies): --enable-platform-aws (AWS's
#                                        EFA protocol and tunings), the CUDA runtime loaded at run time.
# Only run-time files stay under a prefix: headers and the development link go to /usr/local, where the plugin's
# build finds them, and the images copy the prefixes alone. CUDA_HOME: CUDA headers (cuda-toolchain.sh headers).
#
# Sources: NAME-VERSION.tar.gz in SOURCES_DIR when it is there (bin/build.sh puts the vendored archives of
# $SMHVD_VENDOR_DIR or ../shared/vendor there), else downloaded from URL (the project's tag archive). Either way
# the unpacked tree must hash to the pinned TREE_SHA256 (tree_hash: every file's path and content, so compression
# and archive headers do not count, and the project's own archive of the tag matches a `git archive` snapshot of
# it). A wrong or changed archive stops the build, naming both hashes.
#
# usage: build-efa.sh libfabric|aws-ofi-nccl SOURCES_DIR
#        build-efa.sh tree-hash DIR     (prints DIR's tree hash: how to pin another version)
# env:   LIBFABRIC_VERSION, LIBFABRIC_TREE_SHA256, LIBFABRIC_URL; AWS_OFI_NCCL_VERSION, AWS_OFI_NCCL_TREE_SHA256,
#        AWS_OFI_NCCL_URL; CUDA_HOME
set -euo pipefail

usage="usage: build-efa.sh libfabric|aws-ofi-nccl SOURCES_DIR | build-efa.sh tree-hash DIR"
die() { echo "build-efa: $*" >&2; exit 1; }

# tree_hash DIR: sha256 over the sorted list of every file's sha256 and path, and every symlink's path and target.
# .release_version is left out: aws-ofi-nccl's release archives add it (its autogen reads the version there), and
# unpack_source writes it when absent.
tree_hash() {
  (cd "$1" && {
    find . -type f ! -path ./.release_version -print0 | LC_ALL=C sort -z | xargs -0 -r sha256sum
    find . -type l -print0 | LC_ALL=C sort -z | xargs -0 -r stat -c 'link %N'
  } | sha256sum | cut -c1-64)
}

# unpack_source NAME VERSION URL TREE_SHA256 SOURCES_DIR DEST: the checked source tree in DEST.
unpack_source() {
  local name=$1 version=$2 url=$3 pinned=$4 dir=$5 dest=$6 archive got
  archive="$dir/$name-$version.tar.gz"
  if [ -f "$archive" ]; then
    echo "build-efa: $name $version from $archive"
  else
    archive="$dest.tar.gz"
    echo "build-efa: $name $version: no $dir/$name-$version.tar.gz, downloading $url"
    if ! curl -fsSL --retry 3 --connect-timeout 30 -o "$archive" "$url"; then
      die "$name $version: download of $url failed; put $name-$version.tar.gz in docker/sources/ instead" \
        "(bin/build.sh copies it there from \$SMHVD_VENDOR_DIR or ../shared/vendor)"
    fi
  fi
  mkdir -p "$dest"
  tar -xzf "$archive" -C "$dest" --strip-components=1
  got=$(tree_hash "$dest")
  if [ "$got" != "$pinned" ]; then
    die "$name $version: the source tree of $archive hashes to $got, not the pinned $pinned" \
      "(another version: pin its tree hash, build-efa.sh tree-hash DIR)"
  fi
  [ -e "$dest/.release_version" ] || echo "$version" >"$dest/.release_version"
}

# quiet LOG COMMAND...: run COMMAND with its output in LOG, shown (the end of it) only when it fails.
quiet() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 || { tail -n 40 "$log" >&2; die "$* failed (above: the end of its output)"; }
}

build() {  # SRC PREFIX CONFIGURE_ARGS...: autogen (git archives have no configure), configure, make, install
  local src=$1 prefix=$2
  shift 2
  cd "$src"
  [ -x configure ] || quiet autogen.log ./autogen.sh
  quiet configure.log ./configure --prefix="$prefix" --includedir=/usr/local/include \
    --mandir=/usr/local/share/man --disable-static "$@"
  quiet make.log make -j"$(nproc)"
  quiet install.log make install
  rm -f "$prefix"/lib/*.la
}

case "${1:-}" in
  tree-hash) tree_hash "${2:?$usage}"; exit 0 ;;
  libfabric | aws-ofi-nccl) ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
sources=${2:?$usage}
: "${CUDA_HOME:?CUDA_HOME must point to CUDA headers (cuda-toolchain.sh headers)}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ "$1" = libfabric ]; then
  : "${LIBFABRIC_VERSION:?}" "${LIBFABRIC_TREE_SHA256:?}" "${LIBFABRIC_URL:?}"
  prefix=/opt/amazon/efa
  unpack_source libfabric "$LIBFABRIC_VERSION" "$LIBFABRIC_URL" "$LIBFABRIC_TREE_SHA256" "$sources" "$work/src"
  build "$work/src" "$prefix" --enable-only --enable-efa=yes --enable-shm=yes --enable-tcp=yes --enable-rxm=yes \
    --with-cuda="$CUDA_HOME" --enable-cuda-dlopen
  # The development link and pkg-config file: for builds against it (the plugin's), not for the images.
  ln -sf "$prefix/lib/libfabric.so.1" /usr/local/lib/libfabric.so
  rm -rf "$prefix/lib/libfabric.so" "$prefix/lib/pkgconfig"
  if ! "$prefix/bin/fi_info" -l | grep -qx 'efa:'; then
    die "libfabric $LIBFABRIC_VERSION was built without its efa provider: fi_info -l lists $("$prefix/bin/fi_info" -l | tr '\n' ' ')"
  fi
  echo "build-efa: libfabric $LIBFABRIC_VERSION in $prefix ($(du -sh "$prefix" | cut -f1)): $("$prefix/bin/fi_info" -l | grep -c ':$') providers, efa among them"
else
  : "${AWS_OFI_NCCL_VERSION:?}" "${AWS_OFI_NCCL_TREE_SHA256:?}" "${AWS_OFI_NCCL_URL:?}"
  prefix=/opt/amazon/ofi-nccl
  unpack_source aws-ofi-nccl "$AWS_OFI_NCCL_VERSION" "$AWS_OFI_NCCL_URL" "$AWS_OFI_NCCL_TREE_SHA256" "$sources" "$work/src"
  # Its configure links a test program against libcudart: the headers' directory has the wheel's (CUDA_HOME/lib64).
  build "$work/src" "$prefix" --with-libfabric=/opt/amazon/efa --with-cuda="$CUDA_HOME" --enable-cudart-dynamic \
    --enable-platform-aws --disable-tests
  plugin="$prefix/lib/libnccl-net.so"
  exported=$(nm -D --defined-only "$plugin" | awk '$3 ~ /^ncclNetPlugin_v[0-9]+$/ {print $3}' | sort -V | tr '\n' ' ')
  [ -n "$exported" ] || die "$plugin exports no ncclNetPlugin_vN"
  echo "build-efa: aws-ofi-nccl $AWS_OFI_NCCL_VERSION in $prefix ($(du -sh "$prefix" | cut -f1)); $plugin exports $exported"
fi
