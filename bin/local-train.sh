#!/usr/bin/env bash
# Run a training image on this machine the way SageMaker runs it on one instance: a fresh /opt/ml tree (the
# hyperparameters encoded as the SageMaker Python SDK encodes them, resource and input-data configs, one directory
# per channel) bind-mounted at /opt/ml, then `ENGINE run IMAGE train`. The model, output data, checkpoints and
# any failure reason are left in the tree; the exit code is the container's.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [options] IMAGE
  --hyperparameters FILE   a JSON object: the estimator's hyperparameters as you would write them in Python
                           ({"epochs": 2, "sagemaker_program": "train.py"}); every value is JSON-encoded as the
                           SDK does before the container sees it
  --channel NAME=DIR       an input channel, mounted read-only at /opt/ml/input/data/NAME; repeatable
  --source DIR             your code directory, mounted at /opt/ml/code (sets sagemaker_submit_directory)
  --entry-point FILE       the script in it to run (sets sagemaker_program)
  --processes-per-host N   MPI processes on this host (default: the launcher's: one per GPU, else 1)
  --mpi-options STRING     extra mpirun options (sagemaker_mpi_custom_mpi_options)
  --work DIR               where the /opt/ml tree is made (default: a new directory under ./build/local-train);
                           it must not exist yet or be empty
  --engine E               docker or podman (default: docker when its daemon answers \`docker info\`, else
                           podman with the project's store, where bin/build.sh puts images; docs/images.md)
  --gpu                    give the container every GPU (docker: --gpus all; podman: CDI nvidia.com/gpu=all)
  --network NAME           container network (e.g. host); default: the engine's
  --shm-size SIZE          /dev/shm size for MPI's shared memory (default 1g)
  --env KEY=VALUE          extra environment variable for the container; repeatable
  --run-arg ARG            extra argument for '\$ENGINE run'; repeatable
  --dry-run                write the /opt/ml tree and print the run command; start no container
When this machine has extra CA certificates (/usr/local/share/ca-certificates/*.crt, e.g. for a proxy that
re-signs TLS), its CA bundle is mounted read-only and the job's pip and boto3 use it (docs/images.md).
  -h, --help               this help
Example:
  $(basename "$0") --source examples/code --entry-point train.py --processes-per-host 2 \\
      --channel train=data/mnist sagemaker-horovod:cpu
USAGE
}

die() { echo "local-train.sh: $*" >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
engine=""
dry_run=0
hp_file=""
channels=()
source_dir=""
entry_point=""
processes=""
mpi_options=""
mpi_options_set=0
work=""
gpu=0
network=""
shm_size=1g
envs=()
run_args=()
image=""
while [ $# -gt 0 ]; do
  case "$1" in
    --hyperparameters) hp_file=${2:?--hyperparameters needs a file}; shift ;;
    --channel) channels+=("${2:?--channel needs NAME=DIR}"); shift ;;
    --source) source_dir=${2:?--source needs a directory}; shift ;;
    --entry-point) entry_point=${2:?--entry-point needs a file name}; shift ;;
    --processes-per-host) processes=${2:?--processes-per-host needs a number}; shift ;;
    --mpi-options) mpi_options=${2?--mpi-options needs a value}; mpi_options_set=1; shift ;;
    --work) work=${2:?--work needs a directory}; shift ;;
    --engine) engine=${2:?--engine needs a value}; shift ;;
    --gpu) gpu=1 ;;
    --network) network=${2:?--network needs a value}; shift ;;
    --shm-size) shm_size=${2:?--shm-size needs a value}; shift ;;
    --env) envs+=("${2:?--env needs KEY=VALUE}"); shift ;;
    --run-arg) run_args+=("${2:?--run-arg needs a value}"); shift ;;
    --dry-run) dry_run=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) usage >&2; die "unknown option '$1'" ;;
    *) [ -z "$image" ] || die "one image only (got $image and $1)"; image=$1 ;;
  esac
  shift
done
[ -n "$image" ] || { usage >&2; die "missing the IMAGE to run"; }

# shellcheck source=bin/lib/engine.sh
source "$repo/bin/lib/engine.sh"
pick_engine local-train.sh docker podman
# A short name missing from the store would reach podman's registry lookup ("short-name did not resolve").
first=${image%%/*}
if [ "$engine" = podman ] && ! podman image exists "$image" \
  && { [ "$first" = "$image" ] || ! [[ "$first" == *.* || "$first" == *:* || "$first" == localhost ]]; }; then
  die "image $image is not in the store above: build it with bin/build.sh (same engine choice, same store)"
fi
command -v python3 >/dev/null || die "python3 is needed to write the JSON configuration"

# Validate everything before creating anything.
[ -z "$hp_file" ] || [ -f "$hp_file" ] || die "--hyperparameters $hp_file: no such file"
[ -z "$processes" ] || [[ "$processes" =~ ^[1-9][0-9]*$ ]] || die "--processes-per-host '$processes' is not a positive integer"
if [ -n "$source_dir" ]; then
  [ -d "$source_dir" ] || die "--source $source_dir: no such directory"
  [ -n "$entry_point" ] || die "--source needs --entry-point (the script to run in it)"
  [ -f "$source_dir/$entry_point" ] || die "--entry-point $entry_point: not found in $source_dir"
  source_dir=$(cd "$source_dir" && pwd)
elif [ -n "$entry_point" ]; then
  die "--entry-point needs --source (or set sagemaker_program in the hyperparameters file)"
fi
channel_names=()
channel_dirs=()
for spec in "${channels[@]}"; do
  cname=${spec%%=*}
  cdir=${spec#*=}
  if [[ "$spec" != *=* ]] || ! [[ "$cname" =~ ^[A-Za-z0-9._-]+$ ]]; then
    die "--channel '$spec' is not NAME=DIR (NAME: letters, digits, . _ -)"
  fi
  [ -d "$cdir" ] || die "--channel $cname: no such directory $cdir"
  channel_names+=("$cname")
  channel_dirs+=("$(cd "$cdir" && pwd)")
done
for kv in "${envs[@]}"; do
  [[ "$kv" == [A-Za-z_]*=* ]] || die "--env '$kv' is not KEY=VALUE"
done

if [ -z "$work" ]; then
  mkdir -p "$repo/build/local-train"
  work=$(mktemp -d "$repo/build/local-train/job-$(date +%Y%m%d-%H%M%S)-XXXX")
else
  mkdir -p "$work"
  [ -z "$(ls -A "$work")" ] || die "--work $work is not empty (a SageMaker job starts from a fresh /opt/ml)"
fi
work=$(cd "$work" && pwd)

# The tree: the project's one /opt/ml writer (dev/smhvd_dev/mltree.py, standard library only, run from this
# checkout): hyperparameters JSON-encoded as the SDK does; launcher keys set from the options win.
args=("$work")
[ -z "$hp_file" ] || args+=(--hyperparameters "$hp_file")
for cname in "${channel_names[@]}"; do args+=(--channel "$cname"); done
[ -z "$source_dir" ] || args+=(--hp sagemaker_submit_directory=/opt/ml/code --hp "sagemaker_program=$entry_point")
[ -z "$processes" ] || args+=(--hp-json "sagemaker_mpi_num_of_processes_per_host=$processes")
[ "$mpi_options_set" = 0 ] || args+=(--hp "sagemaker_mpi_custom_mpi_options=$mpi_options")
PYTHONPATH="$repo/dev:$repo/src" python3 -m smhvd_dev.mltree "${args[@]}"

# No --rm: with it, podman's Docker-compatible API (docker CLI -> podman) reports exit code 0 for every
# container; the container is removed below instead, once its exit code is known.
container="smhvd-local-train-$$-$RANDOM"
cmd=("$engine" run --name "$container" --shm-size "$shm_size" --volume "$work:/opt/ml")
if [ -n "$network" ]; then
  cmd+=(--network "$network")
fi
if [ "$network" != host ]; then
  cmd+=(--hostname algo-1)
fi
if [ "$gpu" = 1 ]; then
  if [ "$engine" = docker ]; then cmd+=(--gpus all); else cmd+=(--device nvidia.com/gpu=all); fi
fi
[ -z "$source_dir" ] || cmd+=(--volume "$source_dir:/opt/ml/code:ro")
for i in "${!channel_names[@]}"; do
  cmd+=(--volume "${channel_dirs[$i]}:/opt/ml/input/data/${channel_names[$i]}:ro")
done
ca_bundle=$(host_ca_bundle)
if [ -n "$ca_bundle" ]; then
  # The job's pip (requirements.txt), boto3 and Python's ssl trust what this machine trusts; the user's --env
  # entries come after and win.
  mounted=/etc/ssl/certs/smhvd-host-ca-bundle.crt
  cmd+=(--volume "$ca_bundle:$mounted:ro" --env "PIP_CERT=$mounted" --env "AWS_CA_BUNDLE=$mounted"
        --env "REQUESTS_CA_BUNDLE=$mounted" --env "SSL_CERT_FILE=$mounted")
  echo "local-train.sh: the job trusts this machine's CA bundle $ca_bundle (extra CAs in $HOST_CA_DIR)" >&2
fi
for kv in "${envs[@]}"; do cmd+=(--env "$kv"); done
cmd+=("${run_args[@]}" "$image" train)

echo "local-train.sh: /opt/ml = $work" >&2
echo "local-train.sh: ${cmd[*]}" >&2
if [ "$dry_run" = 1 ]; then
  echo "local-train.sh: dry run: ${cmd[*]@Q}" >&2
  exit 0
fi
trap '"$engine" rm --force "$container" >/dev/null 2>&1 || true' EXIT
status=0
"${cmd[@]}" || status=$?
if [ -s "$work/output/failure" ]; then
  echo "local-train.sh: the job failed (exit $status): $(head -c 1024 "$work/output/failure")" >&2
fi
echo "local-train.sh: exit $status; model: $work/model; output: $work/output/data" >&2
exit "$status"
