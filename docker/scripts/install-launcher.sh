#!/usr/bin/env bash
# Install the launcher (the `train` console script) from the project copied to SRC, then drop the copied sources.
#
# usage: install-launcher.sh SRC
set -euo pipefail

src=${1:?usage: install-launcher.sh SRC}
python -m pip install --no-cache-dir --no-deps --no-build-isolation "$src"
rm -rf "$src"
