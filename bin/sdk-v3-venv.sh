#!/usr/bin/env bash
# Make a Python venv with the SageMaker Python SDK v3 (`pip install sagemaker` today: ModelTrainer, its local
# container mode in the sagemaker-train package), for running v3 jobs against the project's image locally.
# Prints the venv's python. The docker/docker-compose commands backed by podman come from bin/sdk-venv.sh.
#
# The SDK lives in its own venv (never in .venv): its pins conflict with TensorFlow's.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [--install] [--with-notebook] [DIR]
  DIR        where the venv (DIR/v3) is made (default: ./build/sdk)
  --install  apt-get install python3-venv when missing (needs root)
  --with-notebook  also a Jupyter kernel and nbclient in the venv (to run examples/notebooks: make notebooks)
Prints one line: PYTHON=<the venv's python>.
USAGE
}

# The SDK's v3 line; the meta-package pins sagemaker-train (ModelTrainer, local mode) to the same release.
SAGEMAKER_VERSION=3.27.0

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bin/lib/pinned-venv.sh
. "$repo/bin/lib/pinned-venv.sh"
venv_args sdk-v3-venv.sh "$repo" "$@"
venv=$dir/v3
pinned_venv sdk-v3-venv.sh "$install" "$venv" "sagemaker==$SAGEMAKER_VERSION"
[ "$notebook" = 0 ] || pinned_extra sdk-v3-venv.sh "$venv" "${NOTEBOOK_PINS[@]}"
echo "PYTHON=$venv/bin/python"
