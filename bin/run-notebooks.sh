#!/usr/bin/env bash
# Run both notebooks of examples/notebooks in local mode, SDK v2 first, then v3 (`make notebooks`): each in a
# Jupyter kernel of its SDK's own venv, against the CPU image, 2 containers each, no AWS account, region or
# network needed. Installs what they need first: the SDK venvs with a kernel (bin/sdk-venv.sh, sdk-v3-venv.sh
# --with-notebook), the engine's tools, the image (bin/build.sh cpu, layer cache) unless --image names one.
# The executed notebooks (outputs included) go to OUT_DIR.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [--image REF] [--parameters FILE] [--out DIR] [--sdk-dir DIR]
  --image REF        the image to train with (default: build it, bin/build.sh cpu: sagemaker-horovod:cpu-<gitsha>)
  --parameters FILE  a JSON object of notebook parameters (IMAGE, HYPERPARAMETERS, CONTAINER_ROOT...), assigned
                     after each notebook's \`parameters\` cell
  --out DIR          where the executed notebooks go (default: build/notebooks)
  --sdk-dir DIR      the SDK venvs and shims (default: build/sdk, as bin/sdk-venv.sh)
The engine is chosen as for every script (docs/images.md, "Which engine, which store").
USAGE
}

die() { echo "run-notebooks.sh: $*" >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
image=""
parameters=""
out=$repo/build/notebooks
sdk_dir=$repo/build/sdk
while [ $# -gt 0 ]; do
  case "$1" in
    --image) image=${2:?--image needs a value}; shift ;;
    --parameters) parameters=${2:?--parameters needs a file}; shift ;;
    --out) out=${2:?--out needs a directory}; shift ;;
    --sdk-dir) sdk_dir=${2:?--sdk-dir needs a directory}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
  shift
done
[ -z "$parameters" ] || [ -f "$parameters" ] || die "--parameters $parameters: no such file"
[ -z "$parameters" ] || parameters=$(cd "$(dirname "$parameters")" && pwd)/$(basename "$parameters")
mkdir -p "$out"
out=$(cd "$out" && pwd)

# shellcheck source=bin/lib/engine.sh
source "$repo/bin/lib/engine.sh"
# shellcheck source=bin/lib/phase.sh
source "$repo/bin/lib/phase.sh"
engine=""
pick_engine run-notebooks.sh docker podman
install=()
[ "$(id -u)" != 0 ] || install=(--install)
if [ "$engine" = podman ] && [ "$(id -u)" = 0 ]; then
  # netavark and aardvark-dns (containers resolve algo-1, algo-2...), debootstrap for the base image: installed
  # when missing (root only; otherwise they must be there already)
  phase run-notebooks.sh "podman's tools (bin/daemonless-env.sh --install)" \
    bash "$repo/bin/daemonless-env.sh" --install >/dev/null
fi
if [ "$engine" = podman ] && [ -z "$image" ] && [ -z "$(project_base_image)" ]; then
  phase run-notebooks.sh "the base image $PROJECT_BASE_IMAGE (bin/make-base-image.sh)" \
    bash "$repo/bin/make-base-image.sh" --tag "$PROJECT_BASE_IMAGE"
fi
if [ -z "$image" ]; then
  image=$(phase run-notebooks.sh "the CPU image (bin/build.sh cpu)" bash "$repo/bin/build.sh" --engine "$engine" cpu |
    head -n 1)
fi

v3=$(phase run-notebooks.sh "the SDK v3 venv with a Jupyter kernel ($sdk_dir/v3)" \
  bash "$repo/bin/sdk-v3-venv.sh" "${install[@]}" --with-notebook "$sdk_dir")
v2=$(phase run-notebooks.sh "the SDK v2 venv with a Jupyter kernel and the docker shims ($sdk_dir/v2)" \
  bash "$repo/bin/sdk-venv.sh" "${install[@]}" --with-notebook "$sdk_dir")
v2_python=$(sed -n 's/^PYTHON=//p' <<<"$v2")
shims=$(sed -n 's/^SHIMS=//p' <<<"$v2")
v3_python=$(sed -n 's/^PYTHON=//p' <<<"$v3")

# The image first, then the caller's parameters (which may name another).
params_file=$(mktemp "$out/parameters-XXXXXX.json")
trap 'rm -f "$params_file"' EXIT
"$v2_python" - "$image" "$parameters" "$params_file" <<'PY'
import json, sys
image, given, target = sys.argv[1:4]
values = {"IMAGE": image}
if given:
    extra = json.load(open(given))
    if not isinstance(extra, dict):
        sys.exit(f"run-notebooks.sh: --parameters {given}: expected a JSON object of NAME: value")
    values.update(extra)
json.dump(values, open(target, "w"))
PY

status=0
for pair in "mnist_sdk_v2:$v2_python" "mnist_sdk_v3:$v3_python"; do
  name=${pair%%:*}
  python=${pair#*:}
  echo "run-notebooks.sh: $name.ipynb with $python, image $image" >&2
  start=$SECONDS
  if ! PATH="$shims:$PATH" "$python" "$repo/examples/notebooks/run_notebook.py" \
      "$repo/examples/notebooks/$name.ipynb" --parameters "$params_file" --out "$out/$name.ipynb"; then
    status=1
    echo "run-notebooks.sh: $name.ipynb failed after $((SECONDS - start)) s (executed notebook: $out/$name.ipynb)" >&2
    continue
  fi
  echo "run-notebooks.sh: $name.ipynb done in $((SECONDS - start)) s" >&2
done
exit "$status"
