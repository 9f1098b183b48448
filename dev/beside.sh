#!/usr/bin/env bash
# Run a command (e.g. `make test`) while other work of the same kind runs beside it on the same machine: a second
# simulated cluster with a `train` job on it (make cluster-demo) and a `train` job on the host (make demo), each
# started again as soon as it ends, until the command ends. The suite must stay green under that: its tests may
# only ever see their own clusters, jobs, directories and processes (issue 28). Prints how often each ran
# beside it and how each ended; exits with the command's exit status.
#
# usage: dev/beside.sh [--checkout DIR] -- COMMAND...   (DIR: where the beside jobs run; default: this checkout)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
checkout=$here
if [ "${1:-}" = "--checkout" ]; then
  checkout=$(cd "${2:?--checkout needs a directory}" && pwd)
  shift 2
fi
[ "${1:-}" = "--" ] && shift
[ $# -gt 0 ] || { echo "usage: dev/beside.sh [--checkout DIR] -- COMMAND..." >&2; exit 2; }

logs=$(mktemp -d "${TMPDIR:-/tmp}/beside.XXXXXX")
stop="$logs/stop"

# One kind of beside job, again and again until $stop exists; one line per run in $logs/NAME.runs.
again() {
  local name=$1 n=0 rc
  shift
  while [ ! -e "$stop" ]; do
    n=$((n + 1))
    rc=0
    (cd "$checkout" && "$@") >"$logs/$name-$n.log" 2>&1 || rc=$?
    echo "$name run $n: exit $rc" >>"$logs/$name.runs"
  done
}

again cluster-demo make -s cluster-demo &
cluster_pid=$!
again demo make -s demo &
demo_pid=$!

status=0
"$@" || status=$?

touch "$stop"
wait "$cluster_pid" "$demo_pid" || true
for name in cluster-demo demo; do
  touch "$logs/$name.runs"
  awk -v name="$name" -v logs="$logs" '{ runs++ } !/exit 0$/ { failed++ }
    END { printf "beside: %s: %d runs, %d failed (logs: %s)\n", name, runs, failed, logs }' "$logs/$name.runs"
done
echo "beside: the command exited $status"
exit "$status"
