#!/usr/bin/env bash
# Prepare a private, daemonless container toolchain (buildah/podman + runc, overlay storage) for building and
# running this project's images on a machine without a Docker engine, and print the environment that selects
# it as KEY=VALUE lines. Nothing outside STATE_DIR is configured: the machine's own /etc/containers is left alone.
#
#   eval "$(bin/daemonless-env.sh --export)"      # then: podman images, podman pod ls ...
# bin/build.sh, push.sh, local-train.sh and sdk-venv.sh need no eval: without a Docker daemon they use this
# configuration themselves (bin/lib/engine.sh).
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [--install] [--export] [--engine-only] [STATE_DIR]
  STATE_DIR  where configuration and image storage live (default: \$SMHVD_CONTAINERS_DIR, else
             \${XDG_CACHE_HOME:-~/.cache}/smhvd/containers-netavark: one layer cache per machine, shared by every
             checkout, so a fresh clone reuses the layers a previous build made)
  --install  apt-get install the missing tools first (buildah podman skopeo runc docker-registry debootstrap
             shellcheck); needs root
  --export   print 'export KEY=VALUE' lines (for eval) instead of KEY=VALUE
  --engine-only  check only what running the engine needs (runc, and podman or buildah), not the tools of
             the image tests and the base image (bin/lib/engine.sh: the scripts' own engine choice)
USAGE
}

# The directory name carries the network backend: podman keeps the backend it first ran with in its store, so
# a store made with CNI (earlier versions of this script) is left alone rather than half-switched.
state=${SMHVD_CONTAINERS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/smhvd/containers-netavark}
install=0
prefix=""
engine_only=0
while [ $# -gt 0 ]; do
  case "$1" in
    --install) install=1 ;;
    --export) prefix="export " ;;
    --engine-only) engine_only=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "daemonless-env: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) state=$1 ;;
  esac
  shift
done

tools=(buildah podman skopeo runc docker-registry debootstrap shellcheck)
# netavark + aardvark-dns: containers on one network resolve each other's aliases (algo-1, algo-2...), as on
# SageMaker and in the SDK's local mode; the CNI backend resolves no aliases.
packages=(buildah podman skopeo runc docker-registry debootstrap shellcheck uidmap containernetworking-plugins
  netavark aardvark-dns)
if [ "$install" = 1 ]; then
  missing=()
  for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$p")
    fi
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "daemonless-env: apt-get install ${missing[*]}" >&2
    # Another apt run (e.g. make setup in parallel) holds the dpkg lock for a while: wait for it, bounded.
    apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
      "${missing[@]}" >&2
  fi
fi
if [ "$engine_only" = 1 ]; then
  tools=(runc)
  if ! command -v podman >/dev/null && ! command -v buildah >/dev/null; then
    echo "daemonless-env: neither podman nor buildah found (apt-get install podman)" >&2
    exit 1
  fi
fi
for t in "${tools[@]}"; do
  if ! command -v "$t" >/dev/null; then
    echo "daemonless-env: $t not found (run with --install, or apt-get install $t)" >&2
    exit 1
  fi
done

mkdir -p "$state"
state=$(cd "$state" && pwd)

# write_conf FILE: stdin becomes FILE, replaced in one rename and only when it changed: podman processes of
# another run (the SDK shims call this script on every docker command) never read a half-written file.
write_conf() {
  local tmp
  tmp=$(mktemp "$1.XXXXXX")
  chmod 644 "$tmp"
  cat >"$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv -f "$tmp" "$1"; fi
}

# runc, not crun (crun fails on this kind of kernel/sandbox); ulimits lowered because the defaults inherited
# from the host can exceed what an unprivileged-looking sandbox allows; cgroupfs and file events need no systemd.
write_conf "$state/containers.conf" <<CONF
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
network_backend = "netavark"
CONF

# overlay is 3-4x faster than vfs for multi-GB layers and stores a third of the bytes.
write_conf "$state/storage.conf" <<CONF
[storage]
driver = "overlay"
runroot = "$state/run"
graphroot = "$state/storage"
CONF

# Only fully qualified names are resolved (no silent Docker Hub lookups); registries on the loopback interface are
# plain HTTP: 127.0.0.1:5000, and those bin/local-registry.sh started (listed in $state/local-registries).
local_registries=("127.0.0.1:5000")
if [ -f "$state/local-registries" ]; then
  while IFS= read -r addr; do
    if [[ "$addr" =~ ^127\.0\.0\.1:[0-9]+$ ]] && [ "$addr" != 127.0.0.1:5000 ]; then local_registries+=("$addr"); fi
  done <"$state/local-registries"
fi
{
  printf 'unqualified-search-registries = []\nshort-name-mode = "disabled"\n'
  printf '\n[[registry]]\nlocation = "%s"\ninsecure = true\n' "${local_registries[@]}"
} | write_conf "$state/registries.conf"

# Registry logins made through this environment stay here, away from the user's own credentials.
[ -s "$state/auth.json" ] || echo '{}' >"$state/auth.json"

printf '%s%s\n' \
  "$prefix" "CONTAINERS_CONF=$state/containers.conf" \
  "$prefix" "CONTAINERS_STORAGE_CONF=$state/storage.conf" \
  "$prefix" "CONTAINERS_REGISTRIES_CONF=$state/registries.conf" \
  "$prefix" "REGISTRY_AUTH_FILE=$state/auth.json" \
  "$prefix" "BUILDAH_ISOLATION=chroot"
