#!/usr/bin/env bash
# Make a minimal Debian base image from the Debian mirror with debootstrap and import it into podman's store,
# for machines that cannot pull from Docker Hub (the Dockerfile's default base is docker.io/library/debian).
# The root filesystem tarball is cached, so a second run only re-imports it (seconds), or does nothing when the
# image is already in the store.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [--suite SUITE] [--mirror URL] [--tag IMAGE] [--cache DIR] [--force]
  --suite   Debian suite (default bookworm: the Python 3.11 the stack is pinned for)
  --mirror  Debian mirror (default: the first deb.debian.org-style URI in /etc/apt/sources*, else
            http://deb.debian.org/debian)
  --tag     image name (default localhost/debian:SUITE)
  --cache   where the rootfs tarball is kept (default \${XDG_CACHE_HOME:-~/.cache}/smhvd/base-image)
  --force   rebuild the rootfs even if cached
The image goes into the project's podman store (bin/daemonless-env.sh, the one bin/build.sh uses without a
Docker daemon), or the store the environment names (CONTAINERS_STORAGE_CONF).
USAGE
}

suite=bookworm
mirror=""
tag=""
cache=${XDG_CACHE_HOME:-$HOME/.cache}/smhvd/base-image
force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --suite) suite=${2:?--suite needs a value}; shift ;;
    --mirror) mirror=${2:?--mirror needs a value}; shift ;;
    --tag) tag=${2:?--tag needs a value}; shift ;;
    --cache) cache=${2:?--cache needs a value}; shift ;;
    --force) force=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "make-base-image: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
tag=${tag:-localhost/debian:$suite}

# shellcheck source=bin/lib/engine.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/engine.sh"
use_project_store make-base-image
echo "make-base-image: store: $engine_store" >&2

host_mirror() {
  # deb822 files ("URIs: http://...") and one-line files ("deb http://... suite main").
  local f
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -r "$f" ] || continue
    sed -n -E 's/^URIs:[[:space:]]*(https?:\/\/[^[:space:]]+\/debian)\/?$/\1/p; s/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?(https?:\/\/[^[:space:]]+\/debian)\/?[[:space:]].*/\2/p' "$f"
  done | head -n 1
}
mirror=${mirror:-$(host_mirror)}
mirror=${mirror:-http://deb.debian.org/debian}

# The recipe's version: an image or tarball made by an older recipe is made again.
recipe=slim-1
slim_cfg=$(dirname "$(readlink -f "$0")")/../docker/dpkg-slim.cfg
if [ "$force" = 0 ] && podman image exists "$tag" &&
  [ "$(podman image inspect --format '{{index .Labels "smhvd.base-recipe"}}' "$tag")" = "$recipe" ]; then
  echo "make-base-image: $tag already present"
  exit 0
fi

tarball="$cache/debian-$suite-$recipe.tar"
if [ "$force" = 1 ] || [ ! -s "$tarball" ]; then
  mkdir -p "$cache"
  rootfs=$(mktemp -d "$cache/rootfs.XXXXXX")
  trap 'rm -rf "$rootfs"' EXIT
  echo "make-base-image: debootstrap $suite from $mirror (about a minute)"
  debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$cache/debootstrap.log" 2>&1 || {
    echo "make-base-image: debootstrap failed, last lines of $cache/debootstrap.log:" >&2
    tail -n 20 "$cache/debootstrap.log" >&2
    exit 1
  }
  printf 'deb %s %s main\ndeb %s %s-updates main\n' "$mirror" "$suite" "$mirror" "$suite" \
    >"$rootfs/etc/apt/sources.list"
  # As Debian's slim images: no package caches or lists; no translations, manuals or documentation but the
  # copyright files, now (what debootstrap unpacked) and for every package installed later (docker/dpkg-slim.cfg).
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  rm -rf "$rootfs"/usr/share/locale/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/usr/share/groff/* "$rootfs"/usr/share/lintian/overrides/*
  find "$rootfs"/usr/share/doc -mindepth 1 -not -type d -not -name copyright -delete
  find "$rootfs"/usr/share/doc -mindepth 1 -type d -empty -delete
  install -m 0644 "$slim_cfg" "$rootfs/etc/dpkg/dpkg.cfg.d/smhvd-slim"
  tar --numeric-owner -C "$rootfs" -cf "$tarball.partial" .
  mv "$tarball.partial" "$tarball"
fi

podman import --change 'CMD ["bash"]' --change "LABEL smhvd.base-recipe=$recipe" "$tarball" "$tag" >/dev/null
echo "make-base-image: imported $tag ($(du -h "$tarball" | cut -f1) rootfs)"
