#!/usr/bin/env bash
# Make a Python venv with the SageMaker Python SDK v2 and podman-compose, and a directory of `docker` and
# `docker-compose` commands backed by podman, so that the SDK's local mode (instance_type="local") runs the
# project's image on a machine without a Docker engine. Prints the venv's python and the shim directory.
#
# The SDK lives in its own venv (never in .venv): its pins conflict with TensorFlow's.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [--install] [DIR]
  DIR        where the venv (DIR/v2) and the shims (DIR/bin) are made (default: ./build/sdk)
  --install  apt-get install python3-venv when missing (needs root)
Prints two lines: PYTHON=<the venv's python> and SHIMS=<the directory to put first on PATH>.
The shims run podman with the environment of bin/daemonless-env.sh (private configuration and layer store):
  docker           -> podman (\`docker compose version\` fails, so the SDK uses docker-compose)
  docker-compose   -> podman-compose (--abort-on-container-exit becomes --abort-on-container-failure, so that a
                      failed job fails the SDK's fit(): podman-compose returns 0 for the former)
USAGE
}

# Versions: the SDK's v2 line (local mode with docker compose), and the compose tool the shim runs.
SAGEMAKER_VERSION=2.257.7
PODMAN_COMPOSE_VERSION=1.6.0

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bin/lib/pinned-venv.sh
. "$repo/bin/lib/pinned-venv.sh"
venv_args sdk-venv.sh "$repo" "$@"
mkdir -p "$dir/bin"
venv=$dir/v2
pinned_venv sdk-venv.sh "$install" "$venv" "sagemaker==$SAGEMAKER_VERSION" "podman-compose==$PODMAN_COMPOSE_VERSION"

# The shims carry the daemonless environment themselves: the SDK runs them without passing ours along
# unchanged in every case, and a user's shell needs no `eval` first.
engine_env=$(bash "$repo/bin/daemonless-env.sh" --export)
{
  echo '#!/usr/bin/env bash'
  echo '# docker -> podman (made by bin/sdk-venv.sh), with the private podman configuration.'
  echo "$engine_env"
  # The SDK asks `docker compose version` for Compose v2 first; podman has no such subcommand here, so the
  # SDK falls back to the docker-compose command below.
  cat <<'SH'
if [ "${1:-}" = compose ]; then echo "docker compose: not available here, use docker-compose" >&2; exit 1; fi
exec podman "$@"
SH
} >"$dir/bin/docker"
{
  echo '#!/usr/bin/env bash'
  echo '# docker-compose -> podman-compose (made by bin/sdk-venv.sh), with the private podman configuration.'
  echo "$engine_env"
  echo "podman_compose=$(printf '%q' "$venv/bin/podman-compose")"
  # The SDK runs `up --build --abort-on-container-exit` and fails the job when the exit code is not 0.
  # podman-compose returns 0 for that option whatever the containers' codes; with --abort-on-container-failure
  # it returns the first failing container's code (as Docker Compose does) and still stops every container.
  cat <<'SH'
args=()
for a in "$@"; do
  if [ "$a" = --abort-on-container-exit ]; then args+=(--abort-on-container-failure); else args+=("$a"); fi
done
exec "$podman_compose" "${args[@]}"
SH
} >"$dir/bin/docker-compose"
chmod 755 "$dir/bin/docker" "$dir/bin/docker-compose"

echo "PYTHON=$venv/bin/python"
echo "SHIMS=$dir/bin"
