# shellcheck shell=bash
# Sourced by bin/sdk-venv.sh and bin/sdk-v3-venv.sh: their command line, and a venv holding exactly the pinned
# packages, rebuilt only when the pins change (a stamp file names them).

# shellcheck source=bin/lib/engine.sh
. "$(dirname "${BASH_SOURCE[0]}")/engine.sh"
# shellcheck source=bin/lib/phase.sh
. "$(dirname "${BASH_SOURCE[0]}")/phase.sh"

# Running the notebooks (examples/notebooks, `make notebooks`): a Jupyter kernel and the library that executes a
# notebook, in the SDK's own venv (the notebook's code runs with the SDK it was written for).
# shellcheck disable=SC2034  # used by the scripts that source this file
NOTEBOOK_PINS=(nbclient==0.10.2 ipykernel==6.29.5)

# venv_args NAME REPO ARG...: the scripts' one command line, `[--install] [--with-notebook] [DIR]`. Sets
# `install` (1 with --install), `notebook` (1 with --with-notebook) and `dir` (DIR, default REPO/build/sdk;
# made, and absolute). -h prints the caller's usage.
# shellcheck disable=SC2034  # install, notebook: read by the caller
venv_args() {
  local name=$1 repo=$2
  shift 2
  dir=""
  install=0
  notebook=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --install) install=1 ;;
      --with-notebook) notebook=1 ;;
      -h|--help) usage; exit 0 ;;
      -*) usage >&2; echo "$name: unknown option '$1'" >&2; exit 2 ;;
      *) dir=$1 ;;
    esac
    shift
  done
  dir=${dir:-$repo/build/sdk}
  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd)
}

# pinned_venv NAME INSTALL VENV PACKAGE==VERSION...   (INSTALL=1: apt-get install python3-venv when missing)
pinned_venv() {
  local name=$1 install=$2 venv=$3
  shift 3
  local stamp
  stamp="$venv/.stamp-$(printf '%s-' "$@" | tr -c 'A-Za-z0-9._=-' '_')"
  if ! python3 -c 'import ensurepip' 2>/dev/null; then
    if [ "$install" != 1 ]; then
      echo "$name: python3-venv is missing (apt-get install python3-venv, or pass --install)" >&2
      exit 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
      python3-venv >&2
  fi
  if [ -e "$stamp" ]; then
    echo "$name: $venv is up to date ($*)" >&2
    return
  fi
  # Each long step says what it does when it starts and how long it took (pip: minutes the first time).
  rm -rf "$venv"
  phase "$name" "python3 -m venv $venv" python3 -m venv "$venv" >&2
  phase "$name" "pip install $* (minutes the first time: the SDK and its dependencies)" \
    venv_pip "$name" "$venv" "$@"
  touch "$stamp"
}

# pinned_extra NAME VENV PACKAGE==VERSION...: add packages to a venv of pinned_venv, once (a stamp of its own).
pinned_extra() {
  local name=$1 venv=$2
  shift 2
  local stamp
  stamp="$venv/.stamp-extra-$(printf '%s-' "$@" | tr -c 'A-Za-z0-9._=-' '_')"
  if [ ! -e "$stamp" ]; then
    phase "$name" "pip install $* into $venv" venv_pip "$name" "$venv" "$@"
    touch "$stamp"
  fi
}

# venv_pip NAME VENV PACKAGE...: pip install into VENV. pip brings its own CA list: behind a proxy that re-signs
# TLS it is given the machine's bundle (which holds the machine's extra CAs), unless the user's pip is set up
# already (PIP_CERT, or cert in pip.conf).
venv_pip() {
  local name=$1 venv=$2 bundle
  shift 2
  bundle=$(host_ca_bundle)
  if [ -n "$bundle" ] && [ -z "${PIP_CERT:-}" ] && ! "$venv/bin/pip" config get global.cert >/dev/null 2>&1; then
    echo "$name: pip trusts this machine's CA bundle $bundle (extra CAs in $HOST_CA_DIR)" >&2
    PIP_CERT=$bundle "$venv/bin/pip" install --quiet --disable-pip-version-check "$@" >&2
  else
    "$venv/bin/pip" install --quiet --disable-pip-version-check "$@" >&2
  fi
}
