#!/usr/bin/env bash
# End-of-build smoke test: the launcher is on PATH, the stack imports, and Horovod reports the frameworks,
# controllers (and, for gpu, the NCCL operations) it was built with.
#
# usage: smoke-test.sh cpu|gpu
set -euo pipefail

flavor=${1:?usage: smoke-test.sh cpu|gpu}
required=(TensorFlow MPI Gloo)
case "$flavor" in
  cpu) ;;
  gpu) required+=(NCCL) ;;
  *) echo "smoke-test: flavor must be cpu or gpu, not '$flavor'" >&2; exit 2 ;;
esac

for cmd in train smhvd-train mpirun sshd ssh horovodrun; do
  if ! command -v "$cmd" >/dev/null; then
    echo "smoke-test: $cmd is not on PATH ($PATH)" >&2
    exit 1
  fi
done
python -c 'import smhvd, horovod.tensorflow, tensorpack, mpi4py, cv2, pycocotools, sagemaker_training'
report=$(horovodrun --check-build)
echo "$report"
for item in "${required[@]}"; do
  if ! grep -q -E "\[X\] $item\$" <<<"$report"; then
    echo "smoke-test: Horovod was not built with $item" >&2
    exit 1
  fi
done
echo "smoke-test: $flavor image OK"
