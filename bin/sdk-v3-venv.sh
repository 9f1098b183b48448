#!/usr/bin/env bash
# Make a Python venv with the SageMaker Python SDK v3 (`pip install sagemaker` today: ModelTrainer, its local
# container mode in the sagemaker-train package), for running v3 jobs against the project's image locally.
# Prints the venv's python. The docker/docker-compose commands backed by podman come from bin/sdk-venv.sh.
#
# The SDK lives in its own venv (never in .venv): its pins conflict with TensorFlow's.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [--install] [DIR]
  DIR        where the venv (DIR/v3) is made (default: ./build/sdk)
  --install  apt-get install python3-venv when missing (needs root)
Prints one line: PYTHON=<the venv's python>.
USAGE
}

# The SDK's v3 line; the meta-package pins sagemaker-train (ModelTrainer, local mode) to the same release.
SAGEMAKER_VERSION=3.27.0

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=""
install=0
while [ $# -gt 0 ]; do
  case "$1" in
    --install) install=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) usage >&2; echo "sdk-v3-venv.sh: unknown option '$1'" >&2; exit 2 ;;
    *) dir=$1 ;;
  esac
  shift
done
dir=${dir:-$repo/build/sdk}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
venv=$dir/v3
stamp=$venv/.stamp-$SAGEMAKER_VERSION

if ! python3 -c 'import ensurepip' 2>/dev/null; then
  if [ "$install" != 1 ]; then
    echo "sdk-v3-venv.sh: python3-venv is missing (apt-get install python3-venv, or pass --install)" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
    python3-venv >&2
fi

if [ ! -e "$stamp" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install --quiet --disable-pip-version-check "sagemaker==$SAGEMAKER_VERSION" >&2
  touch "$stamp"
fi
echo "PYTHON=$venv/bin/python"
