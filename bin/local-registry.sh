#!/usr/bin/env bash
# Start (or stop) a container registry on this machine's loopback interface, for pushing and pulling the images
# without a cloud account: the CNCF distribution registry (Debian's docker-registry), plain HTTP on
# 127.0.0.1:PORT, its data under build/registry/PORT. The project's podman configuration (bin/daemonless-env.sh)
# is told to reach it over plain HTTP, so push.sh, podman pull and podman run use it as they are. A Docker daemon
# needs nothing: it treats registries on 127.0.0.0/8 as plain HTTP by itself.
#
#   bin/local-registry.sh --port 5010               # prints 127.0.0.1:5010
#   bin/push.sh --registry 127.0.0.1:5010 sagemaker-horovod:cpu
#   bin/local-registry.sh --port 5010 --stop
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [--port N] [--dir DIR] [--stop] [--install]
  --port N   the port on 127.0.0.1 (default 5000)
  --dir DIR  the registry's data, configuration, log and pid file (default: build/registry/PORT)
  --stop     stop the registry started here on that port and forget it in the project's configuration (its
             data stays in DIR)
  --install  apt-get install docker-registry when missing (root)
Prints the registry's address (127.0.0.1:PORT) once it answers.
USAGE
}

die() { echo "local-registry.sh: $*" >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
port=5000
dir=""
stop=0
install=0
# shellcheck source=bin/lib/args.sh
source "$repo/bin/lib/args.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --port) needs $# "$1" "a number (1-65535)"; port=$2; shift ;;
    --dir) needs $# "$1" "a directory"; dir=$2; shift ;;
    --stop) stop=1 ;;
    --install) install=1 ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
  shift
done
# Validate everything before creating anything: each failure is one line naming the option, exit 2.
int_in "$port" 1 65535 || die "--port '$port': expected a port number (1-65535)"
addr=127.0.0.1:$port
[ -z "$dir" ] || [ ! -e "$dir" ] || [ -d "$dir" ] || die "--dir $dir: not a directory"
[ -n "$dir" ] || [ ! -e "$repo/build/registry/$port" ] || [ -d "$repo/build/registry/$port" ] ||
  die "$repo/build/registry/$port: not a directory (or give --dir)"
dir=${dir:-$repo/build/registry/$port}
[ "$stop" = 1 ] || command -v python3 >/dev/null || die "python3 is needed to ask the registry whether it answers"

# The project's configuration keeps the local registries it trusts in one list (one host:port a line), from which
# bin/daemonless-env.sh writes registries.conf.
state=$(bash "$repo/bin/daemonless-env.sh" --engine-only | sed -n 's/^CONTAINERS_REGISTRIES_CONF=//p')
state=$(dirname "$state")
trusted=$state/local-registries

# set_trust add|remove: the list with or without this address, then registries.conf written from it.
set_trust() {
  local tmp
  tmp=$(mktemp "$trusted.XXXXXX")
  { [ ! -f "$trusted" ] || grep -vxF "$addr" "$trusted" || true; } >"$tmp"
  [ "$1" = remove ] || echo "$addr" >>"$tmp"
  mv -f "$tmp" "$trusted"
  bash "$repo/bin/daemonless-env.sh" --engine-only >/dev/null
}

answers() {
  python3 - "$addr" <<'PY'
import sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never through a proxy
try:
    with opener.open(f"http://{sys.argv[1]}/v2/", timeout=2) as resp:
        sys.exit(0 if resp.status == 200 else 1)
except OSError:
    sys.exit(1)
PY
}

pidfile=$dir/registry.pid
# ours: the pid file names a running docker-registry (not another process that got its number since).
ours() {
  [ -s "$pidfile" ] && [ "$(ps -o comm= -p "$(cat "$pidfile")" 2>/dev/null)" = docker-registry ]
}
if [ "$stop" = 1 ]; then
  if ours && kill "$(cat "$pidfile")"; then
    echo "local-registry.sh: stopped the registry on $addr (data kept in $dir)" >&2
  else
    echo "local-registry.sh: no registry of this script runs on $addr" >&2
  fi
  rm -f "$pidfile"
  set_trust remove
  exit 0
fi

if ours && answers; then
  echo "local-registry.sh: already running on $addr (data in $dir)" >&2
  set_trust add
  echo "$addr"
  exit 0
fi
if ! command -v docker-registry >/dev/null; then
  [ "$install" = 1 ] || die "docker-registry is not installed (apt-get install docker-registry, or --install)"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends \
    docker-registry >&2
fi
if answers; then
  die "something else answers on $addr already: pick another --port"
fi

mkdir -p "$dir/data"
dir=$(cd "$dir" && pwd)
cat >"$dir/config.yml" <<CONF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $dir/data
  delete:
    enabled: true
http:
  addr: $addr
CONF
# The registry reads every REGISTRY_* variable as configuration: podman's REGISTRY_AUTH_FILE (the project's
# configuration sets it) would become its `auth` section. It gets none of them.
unset_registry=()
for name in $(compgen -e REGISTRY_ || true); do unset_registry+=(-u "$name"); done
# Its own session: it outlives this script (and a make that ran it) until --stop.
setsid env "${unset_registry[@]}" docker-registry serve "$dir/config.yml" >"$dir/registry.log" 2>&1 </dev/null &
echo "$!" >"$pidfile"
deadline=$((SECONDS + 30))
until answers; do
  if ! ours; then
    rm -f "$pidfile"
    die "the registry exited at start: $(tail -n 3 "$dir/registry.log" | tr '\n' ' ')"
  fi
  [ "$SECONDS" -lt "$deadline" ] || die "the registry on $addr did not answer within 30 s (log: $dir/registry.log)"
  sleep 0.2
done
set_trust add
echo "local-registry.sh: registry on $addr (plain HTTP, data in $dir; stop: $(basename "$0") --port $port --stop)" >&2
echo "$addr"
