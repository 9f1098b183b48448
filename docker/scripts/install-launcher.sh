#!/usr/bin/env bash
# Install the launcher (the `train` console script) from the project copied to SRC, move the reference training
# scripts to DEST/scripts, and drop the copied sources.
#
# usage: install-launcher.sh SRC DEST
set -euo pipefail

src=${1:?usage: install-launcher.sh SRC DEST}
dest=${2:?usage: install-launcher.sh SRC DEST}
python -m pip install --no-cache-dir --no-deps --no-build-isolation "$src"
mkdir -p "$dest"
if [ -d "$src/src/scripts" ]; then
  rm -rf "$dest/scripts"
  cp -a "$src/src/scripts" "$dest/scripts"
  find "$dest/scripts" -name __pycache__ -prune -exec rm -rf {} +
fi
rm -rf "$src"
