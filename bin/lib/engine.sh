# shellcheck shell=bash
# Sourced by bin/build.sh, bin/push.sh, bin/local-train.sh and bin/sdk-venv.sh: the one choice of container
# engine and image store, and the one finding of the machine's extra CA certificates.
#
# The rule (docs/images.md, "Which engine, which store"):
#   - a `docker` whose daemon answers `docker info` is used, with that daemon's images;
#   - otherwise podman (buildah where a script can use it and podman is missing), with the project's own
#     configuration and layer store (bin/daemonless-env.sh): the store `make test` and the daemonless build fill.
#     An explicit --engine podman|buildah uses that store too. A caller that already chose a store
#     (CONTAINERS_STORAGE_CONF set, as the image tests do) keeps it.
# Each script prints one line saying which engine and which store were chosen.

_engine_lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The base image bin/make-base-image.sh puts in the project store (Docker Hub cannot be assumed reachable).
PROJECT_BASE_IMAGE=localhost/debian:bookworm

# The marker in the docker/docker-compose shims that bin/sdk-venv.sh writes (podman behind docker's name).
SHIM_MARKER="smhvd-shim: podman behind this name"

# docker_is_shim: true when the `docker` on PATH is one of this project's shims (it answers through podman).
docker_is_shim() {
  local path
  path=$(command -v docker) && grep -qsF "$SHIM_MARKER" "$path"
}

# docker_answers: true when a real `docker` is installed and a daemon answers it (bounded: a hung socket fails).
docker_answers() {
  command -v docker >/dev/null && ! docker_is_shim && timeout 30 docker info >/dev/null 2>&1
}

# use_project_store NAME: export the environment of the project's podman/buildah configuration unless the
# caller already chose a store; sets `engine_store` (a phrase for the one line).
use_project_store() {
  local name=$1 out line
  if [ -n "${CONTAINERS_STORAGE_CONF:-}" ]; then
    engine_store="$(store_root) (CONTAINERS_STORAGE_CONF=$CONTAINERS_STORAGE_CONF)"
    return
  fi
  if ! out=$(bash "$_engine_lib_dir/../daemonless-env.sh" --engine-only); then
    echo "$name: the project's podman configuration could not be made (bin/daemonless-env.sh failed)" >&2
    exit 2
  fi
  while IFS= read -r line; do
    [[ "$line" == [A-Z_]*=* ]] || continue
    export "${line?}"
  done <<<"$out"
  engine_store="$(store_root) (the project's store)"
}

# store_root: the graphroot of CONTAINERS_STORAGE_CONF.
store_root() {
  sed -n -E 's/^graphroot[[:space:]]*=[[:space:]]*"([^"]*)".*/\1/p' "$CONTAINERS_STORAGE_CONF" | head -n 1
}

# pick_engine NAME ALLOWED...: set `engine` (kept when the caller's --engine set it) to one of ALLOWED, set up
# its store and print the one line "NAME: engine: ...; store: ...". Exits 2 with a one-line reason otherwise.
pick_engine() {
  local name=$1 candidate why
  shift
  local allowed=" $* "
  if [ -z "${engine:-}" ]; then
    if ! command -v docker >/dev/null; then
      why="no docker command"
    elif docker_is_shim; then
      why="the docker on PATH is this project's podman shim"
    elif docker_answers; then
      engine=docker
      why="its daemon answers \`docker info\`"
    else
      why="docker is installed but no daemon answers \`docker info\`"
    fi
    if [ -z "${engine:-}" ]; then
      for candidate in podman buildah; do
        if [[ "$allowed" == *" $candidate "* ]] && command -v "$candidate" >/dev/null; then
          engine=$candidate
          break
        fi
      done
    fi
    if [ -z "${engine:-}" ]; then
      echo "$name: no container engine: $why, and neither podman nor buildah is installed" \
        "(apt-get install podman, or start the Docker daemon)" >&2
      exit 2
    fi
  else
    why="--engine $engine"
  fi
  if [[ "$allowed" != *" $engine "* ]]; then
    echo "$name: --engine must be one of:$allowed(got '$engine')" >&2
    exit 2
  fi
  command -v "$engine" >/dev/null || { echo "$name: --engine $engine: $engine is not installed" >&2; exit 2; }
  if [ "$engine" = docker ]; then
    if [ "$why" = "--engine docker" ] && ! timeout 30 docker info >/dev/null 2>&1; then
      echo "$name: --engine docker: no daemon answers \`docker info\` (without --engine: podman with the" \
        "project's store)" >&2
      exit 2
    fi
    engine_store="the Docker daemon's${DOCKER_HOST:+ at $DOCKER_HOST}"
  else
    use_project_store "$name"
  fi
  echo "$name: engine: $engine ($why); store: $engine_store" >&2
}

# project_base_image: PROJECT_BASE_IMAGE when it is in the chosen podman/buildah store, nothing otherwise.
project_base_image() {
  case "$engine" in
    podman) podman image exists "$PROJECT_BASE_IMAGE" 2>/dev/null && echo "$PROJECT_BASE_IMAGE" ;;
    buildah) buildah inspect --type image "$PROJECT_BASE_IMAGE" >/dev/null 2>&1 && echo "$PROJECT_BASE_IMAGE" ;;
  esac
  return 0
}

# The machine's extra CA certificates: those its administrator added to the system store (Debian/Ubuntu:
# /usr/local/share/ca-certificates/*.crt), e.g. for a proxy that re-signs TLS. Used the same way by every
# script: the image build trusts them while downloading, a local job's pip trusts the machine's CA bundle
# (which update-ca-certificates made from the system's and these), and so does the pip of the SDK venvs.
HOST_CA_DIR=/usr/local/share/ca-certificates
HOST_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt

# host_ca_dir: HOST_CA_DIR when it holds at least one *.crt, nothing otherwise.
host_ca_dir() {
  if compgen -G "$HOST_CA_DIR/*.crt" >/dev/null; then echo "$HOST_CA_DIR"; fi
  return 0
}

# host_ca_bundle: the machine's CA bundle when the machine has extra CAs (and the bundle exists).
host_ca_bundle() {
  if [ -n "$(host_ca_dir)" ] && [ -s "$HOST_CA_BUNDLE" ]; then echo "$HOST_CA_BUNDLE"; fi
  return 0
}
