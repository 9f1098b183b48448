#!/usr/bin/env bash
# Stage COCO 2017 + pretrained weights to S3 for the Mask R-CNN channels (a thin wrapper around
# `python -m smhvd_stage.coco`, for a checkout without `pip install '.[stage]'`).
#   bin/stage-coco.sh /data/coco s3://BUCKET/coco2017 --weights ImageNet-R50-AlignPadding.npz
# Python: $PYTHON, else the repo's .venv, else python3 (needs boto3).
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: bin/stage-coco.sh SOURCE_DIR s3://BUCKET/PREFIX [--weights FILE.npz] [--endpoint-url URL]
                         [--region REGION] [--jobs N] [--dry-run] [--checksum-cache FILE|none]
                         [--download [--coco-base-url URL]]
SOURCE_DIR holds train2017/, val2017/, annotations/instances_{train,val}2017.json (as downloaded);
with --download the official archives are fetched and unpacked there first (resumable).
Writes s3://BUCKET/PREFIX/{train,val,annotations,pretrained}/ then PREFIX/annotations/_manifest.json; prints inputs={...}.
Exit codes: 2 usage, 65 bad data, 66 missing input, 69 bucket/endpoint unavailable, 70 verify failed,
74 local read error, 77 no credentials / access denied, 130 interrupted (re-run to resume).
USAGE
}

if [[ $# -eq 0 ]]; then
  usage >&2
  exit 2
fi
if [[ "$1" == "-h" || "$1" == "--help" ]]; then
  usage
  exit 0
fi

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-}"
if [[ -z "$python" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]]; then python="$repo/.venv/bin/python"; else python=python3; fi
fi
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m smhvd_stage.coco "$@"
