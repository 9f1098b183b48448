#!/usr/bin/env bash
# End-of-build smoke tests, in two parts so that a src/ change re-runs only the quick one:
#   stack cpu|gpu  right after the venv lands in the runtime image: the stack imports there (its run-time libraries
#                  are present), tensorpack carries its TensorFlow 2 patch, MPI and SSH are on PATH, and Horovod
#                  reports the frameworks and controllers (and, for gpu, the NCCL operations) it was built with;
#   launcher       after the launcher is installed: `train` and `smhvd-train` are on PATH and start.
#
# usage: smoke-test.sh stack cpu|gpu | smoke-test.sh launcher
set -euo pipefail

usage="usage: smoke-test.sh stack cpu|gpu | smoke-test.sh launcher"

on_path() {
  local cmd
  for cmd in "$@"; do
    if ! command -v "$cmd" >/dev/null; then
      echo "smoke-test: $cmd is not on PATH ($PATH)" >&2
      exit 1
    fi
  done
}

case "${1:-}" in
  stack)
    required=(TensorFlow MPI Gloo)
    case "${2:-}" in
      cpu) ;;
      gpu) required+=(NCCL) ;;
      *) echo "smoke-test: flavor must be cpu or gpu, not '${2:-}'" >&2; exit 2 ;;
    esac
    on_path mpirun sshd ssh horovodrun py-spy
    python -c 'import horovod.tensorflow, tensorpack, mpi4py.MPI, cv2, pycocotools.mask'
    # Every requirement met but those left out on purpose (the script beside this one says which and why)
    "$(dirname "${BASH_SOURCE[0]}")/pip-check.sh"
    # tensorpack carries every edit of its TensorFlow 2 patch (the script beside this one)
    python "$(dirname "${BASH_SOURCE[0]}")/patch-tensorpack.py" --check
    report=$(horovodrun --check-build)
    echo "$report"
    for item in "${required[@]}"; do
      if ! grep -q -E "\[X\] $item\$" <<<"$report"; then
        echo "smoke-test: Horovod was not built with $item" >&2
        exit 1
      fi
    done
    echo "smoke-test: $2 stack OK"
    ;;
  launcher)
    on_path train smhvd-train preflight
    train --help >/dev/null
    smhvd-train --help >/dev/null
    preflight --help >/dev/null
    echo "smoke-test: launcher OK"
    ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
