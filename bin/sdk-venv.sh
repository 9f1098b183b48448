#!/usr/bin/env bash
# Make a Python venv with the SageMaker Python SDK v2 and podman-compose, and a directory of `docker` and
# `docker-compose` commands backed by podman, so that the SDK's local mode (instance_type="local") runs the
# project's image on a machine without a Docker engine. Prints the venv's python and the shim directory.
#
# The SDK lives in its own venv (never in .venv): its pins conflict with TensorFlow's.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [--install] [--with-notebook] [--shims-only] [DIR]
  DIR          where the venv (DIR/v2) and the shims (DIR/bin) are made (default: ./build/sdk)
  --install    apt-get install python3-venv when missing (needs root)
  --with-notebook  also a Jupyter kernel and nbclient in the venv (to run examples/notebooks: make notebooks)
  --shims-only write the shims (or remove them, with a Docker daemon) and make no venv
Prints two lines: PYTHON=<the venv's python> and SHIMS=<the directory to put first on PATH>.
The engine is chosen as for bin/build.sh (docs/images.md, "Which engine, which store"): with a Docker daemon
that answers \`docker info\` the SDK uses docker itself and DIR/bin stays empty; otherwise the shims run podman
with the project's configuration and store (bin/daemonless-env.sh):
  docker           -> podman (\`docker compose version\` fails, so the SDK uses docker-compose)
  docker-compose   -> podman-compose --in-pod false (no pod left per job; --abort-on-container-exit becomes
                      --abort-on-container-failure, so that a failed job fails the SDK's fit(): podman-compose
                      returns 0 for the former; the containers' ids podman prints are left out)
USAGE
}

# Versions: the SDK's v2 line (local mode with docker compose), and the compose tool the shim runs.
SAGEMAKER_VERSION=2.257.7
PODMAN_COMPOSE_VERSION=1.6.0

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
shims_only=0
args=()
for a in "$@"; do
  if [ "$a" = --shims-only ]; then shims_only=1; else args+=("$a"); fi
done
# shellcheck source=bin/lib/pinned-venv.sh
. "$repo/bin/lib/pinned-venv.sh"
venv_args sdk-venv.sh "$repo" "${args[@]}"
mkdir -p "$dir/bin"
venv=$dir/v2
if [ "$shims_only" = 0 ]; then
  pinned_venv sdk-venv.sh "$install" "$venv" "sagemaker==$SAGEMAKER_VERSION" "podman-compose==$PODMAN_COMPOSE_VERSION"
  [ "$notebook" = 0 ] || pinned_extra sdk-venv.sh "$venv" "${NOTEBOOK_PINS[@]}"
fi

rm -f "$dir/bin/docker" "$dir/bin/docker-compose"
engine=""
pick_engine sdk-venv.sh docker podman
if [ "$engine" = docker ]; then
  echo "sdk-venv.sh: the SDK's local mode uses docker itself: no shims in $dir/bin" >&2
  echo "PYTHON=$venv/bin/python"
  echo "SHIMS=$dir/bin"
  exit 0
fi

# The shims find the project's store themselves, at each call (bin/lib/engine.sh, as every script does): the
# SDK runs them without passing our environment along in every case, and a user's shell needs no `eval`.
# An environment that already names a store (CONTAINERS_STORAGE_CONF, as the image tests set) keeps it.
engine_lib=$(printf '%q' "$repo/bin/lib/engine.sh")
{
  echo '#!/usr/bin/env bash'
  echo "# $SHIM_MARKER (made by bin/sdk-venv.sh): docker -> podman, with the project configuration and store."
  echo 'set -euo pipefail'
  echo "source $engine_lib"
  echo 'use_project_store docker'
  # The SDK asks `docker compose version` for Compose v2 first; podman has no such subcommand here, so the
  # SDK falls back to the docker-compose command below.
  cat <<'SH'
if [ "${1:-}" = compose ]; then echo "docker compose: not available here, use docker-compose" >&2; exit 1; fi
exec podman "$@"
SH
} >"$dir/bin/docker"
{
  echo '#!/usr/bin/env bash'
  echo "# $SHIM_MARKER (made by bin/sdk-venv.sh): docker-compose -> podman-compose, project configuration and store."
  echo 'set -euo pipefail'
  echo "source $engine_lib"
  echo 'use_project_store docker-compose'
  echo "podman_compose=$(printf '%q' "$venv/bin/podman-compose")"
  # The SDK runs `up --build --abort-on-container-exit` and fails the job when the exit code is not 0.
  # podman-compose returns 0 for that option whatever the containers' codes; with --abort-on-container-failure
  # it returns the first failing container's code (as Docker Compose does) and still stops every container.
  # --in-pod false: podman-compose would otherwise make a pod per compose project (pod_<project>) that nothing
  # removes (the SDK removes no container either): its jobs would leave empty pods in the store.
  # podman-compose passes on what `podman create` prints, each container's id alone on a line: left out (the
  # SDK shows every line of this command); the exit code stays podman-compose's.
  cat <<'SH'
args=()
for a in "$@"; do
  if [ "$a" = --abort-on-container-exit ]; then args+=(--abort-on-container-failure); else args+=("$a"); fi
done
set +e +o pipefail
"$podman_compose" --in-pod false "${args[@]}" | grep --line-buffered -v -E '^[0-9a-f]{64}$'
exit "${PIPESTATUS[0]}"
SH
} >"$dir/bin/docker-compose"
chmod 755 "$dir/bin/docker" "$dir/bin/docker-compose"

echo "PYTHON=$venv/bin/python"
echo "SHIMS=$dir/bin"
