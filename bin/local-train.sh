#!/usr/bin/env bash
# Run a training image on this machine the way SageMaker runs a job: per host a fresh /opt/ml tree (the
# hyperparameters encoded as the SageMaker Python SDK encodes them, resource and input-data configs, one directory
# per channel) bind-mounted at /opt/ml, then `ENGINE run IMAGE train`. With --hosts N, N containers on a network
# of their own, named algo-1..algo-N as SageMaker names its hosts. The model, output data, checkpoints and any
# failure reason are left in the trees; the exit code is the job's.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [options] IMAGE [train|preflight]
  train                    run the job (default), as SageMaker's \`docker run IMAGE train\`
  preflight                only check the hosts (GPUs, network, /dev/shm, disks...) and exit 0, or 75 naming
                           what is wrong (docs/preflight.md)
  --hyperparameters FILE   a JSON object: the estimator's hyperparameters as you would write them in Python
                           ({"epochs": 2, "sagemaker_program": "train.py"}); every value is JSON-encoded as the
                           SDK does before the container sees it
  --channel NAME=DIR       an input channel, mounted read-only at /opt/ml/input/data/NAME; repeatable
  --source DIR             your code directory, mounted at /opt/ml/code (sets sagemaker_submit_directory)
  --entry-point FILE       the script in it to run (sets sagemaker_program)
  --processes-per-host N   MPI processes on each host (default: the launcher's: one per GPU, else 1)
  --mpi-options STRING     extra mpirun options (sagemaker_mpi_custom_mpi_options)
  --hosts N                N hosts (default 1): N containers on a network of their own, algo-1..algo-N, each
                           with its own /opt/ml tree, WORK/algo-K (with 1 host, WORK is the tree)
  --work DIR               where the job's files are made (default: a new directory under ./build/local-train);
                           it must not exist yet or be empty
  --engine E               docker or podman (default: docker when its daemon answers \`docker info\`, else
                           podman with the project's store, where bin/build.sh puts images; docs/images.md)
  --gpu                    give each container every GPU (docker: --gpus all; podman: CDI nvidia.com/gpu=all);
                           without an NVIDIA driver (or, for podman, a CDI spec) one line says what is missing
                           and the fix, exit 69
  --gpus-per-host G        with --gpu: split this machine's GPUs, G per container: algo-1 gets GPUs 0..G-1,
                           algo-2 the next G, ...
  --network NAME           container network (e.g. host, with 1 host); default: the engine's, or with --hosts N
                           a new one, removed at the end
  --shm-size SIZE          /dev/shm size for MPI's and NCCL's shared memory (default 1g)
  --env KEY=VALUE          extra environment variable for the containers; repeatable
  --run-arg ARG            extra argument for '\$ENGINE run'; repeatable
  --dry-run                write the /opt/ml trees and print the run commands; start no container
When this machine has extra CA certificates (/usr/local/share/ca-certificates/*.crt, e.g. for a proxy that
re-signs TLS), its CA bundle is mounted read-only and the job's pip and boto3 use it (docs/images.md).
  -h, --help               this help
Examples:
  $(basename "$0") --source examples/code --entry-point train.py --processes-per-host 2 \\
      --channel train=data/mnist sagemaker-horovod:cpu
  $(basename "$0") --hosts 2 --processes-per-host 2 --source examples/code --entry-point train.py \\
      sagemaker-horovod:cpu
  $(basename "$0") --gpu sagemaker-horovod:gpu preflight
  $(basename "$0") sagemaker-horovod:cpu preflight      # the same check of a host without a GPU
Exit: the job's exit code (its last line says it); 2: a bad argument; 69: --gpu and no GPU for a container.
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
hosts=1
gpu=0
gpus_per_host=""
network=""
shm_size=1g
envs=()
run_args=()
image=""
command=""
# shellcheck source=bin/lib/args.sh
source "$repo/bin/lib/args.sh"
while [ $# -gt 0 ]; do
  case "$1" in
    --hyperparameters) needs $# "$1" "a file"; hp_file=$2; shift ;;
    --channel) needs $# "$1" "NAME=DIR"; channels+=("$2"); shift ;;
    --source) needs $# "$1" "a directory"; source_dir=$2; shift ;;
    --entry-point) needs $# "$1" "a file name"; entry_point=$2; shift ;;
    --processes-per-host) needs $# "$1" "a number"; processes=$2; shift ;;
    --mpi-options) needs $# "$1" "a value (\"\" for none)"; mpi_options=$2; mpi_options_set=1; shift ;;
    --hosts) needs $# "$1" "a number"; hosts=$2; shift ;;
    --work) needs $# "$1" "a directory"; work=$2; shift ;;
    --engine) needs $# "$1" "a value (docker or podman)"; engine=$2; shift ;;
    --gpu) gpu=1 ;;
    --gpus-per-host) needs $# "$1" "a number"; gpus_per_host=$2; shift ;;
    --network) needs $# "$1" "a value"; network=$2; shift ;;
    --shm-size) needs $# "$1" "a value"; shm_size=$2; shift ;;
    --env) needs $# "$1" "KEY=VALUE"; envs+=("$2"); shift ;;
    --run-arg) needs $# "$1" "a value"; run_args+=("$2"); shift ;;
    --dry-run) dry_run=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) usage >&2; die "unknown option '$1'" ;;
    *)
      if [ -z "$image" ]; then
        image=$1
      elif [ -z "$command" ]; then
        [ "$1" = train ] || [ "$1" = preflight ] || die "'$1': expected train or preflight after the image"
        command=$1
      else
        die "one image and one command only (got $image $command $1)"
      fi
      ;;
  esac
  shift
done
[ -n "$image" ] || { usage >&2; die "missing the IMAGE to run"; }
command=${command:-train}

# Validate everything before creating anything: each failure is one line naming the option, exit 2.
int_in "$hosts" 1 64 || die "--hosts '$hosts': expected a number from 1 to 64"
if [ "$hosts" -gt 1 ] && [ "$network" = host ]; then
  die "--network host: $hosts hosts need a network of their own (each container is one host, algo-K)"
fi
if [ -n "$gpus_per_host" ]; then
  [ "$gpu" = 1 ] || die "--gpus-per-host needs --gpu"
  int_in "$gpus_per_host" 1 1024 || die "--gpus-per-host '$gpus_per_host': expected a number from 1 to 1024"
  if command -v nvidia-smi >/dev/null && gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU '); then
    [ "$((hosts * gpus_per_host))" -le "$gpus" ] ||
      die "--hosts $hosts x --gpus-per-host $gpus_per_host: this machine has $gpus GPU(s) (nvidia-smi -L)"
  fi
fi
# The launcher's own bound (sagemaker_mpi_num_of_processes_per_host): refused here rather than in the container.
[ -z "$processes" ] || int_in "$processes" 1 1024 ||
  die "--processes-per-host '$processes': expected a number from 1 to 1024"
[[ "$shm_size" =~ ^[1-9][0-9]{0,12}[bkmgBKMG]?$ ]] || die "--shm-size '$shm_size': expected a size such as 1g or 512m"
command -v python3 >/dev/null || die "python3 is needed to write the JSON configuration"
hp_text=""
if [ -n "$hp_file" ]; then
  # Read once (a process substitution, <(echo ...), can be read only once) and checked before anything exists.
  { [ -r "$hp_file" ] && [ ! -d "$hp_file" ] && hp_text=$(cat -- "$hp_file"); } 2>/dev/null ||
    die "--hyperparameters $hp_file: no such readable file"
  why=$(python3 -c '
import json, sys
try:
    loaded = json.loads(sys.stdin.read())
except ValueError as exc:
    sys.exit(f"not valid JSON ({exc})")
if not isinstance(loaded, dict):
    sys.exit(f"expected a JSON object, got {type(loaded).__name__}")
' <<<"$hp_text" 2>&1) || die "--hyperparameters $hp_file: $why"
fi
if [ -n "$source_dir" ]; then
  [ -d "$source_dir" ] || die "--source $source_dir: no such directory"
  [ -n "$entry_point" ] || die "--source needs --entry-point (the script to run in it)"
  [ -f "$source_dir/$entry_point" ] || die "--entry-point $entry_point: not found in $source_dir"
  source_dir=$(cd "$source_dir" && pwd)
  mountable --source "$source_dir"
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
  for seen in "${channel_names[@]}"; do
    [ "$seen" != "$cname" ] || die "--channel $cname: given twice (one directory a channel)"
  done
  channel_names+=("$cname")
  channel_dirs+=("$(cd "$cdir" && pwd)")
  mountable "--channel $cname" "${channel_dirs[-1]}"
done
for kv in "${envs[@]}"; do
  [[ "$kv" == [A-Za-z_]*=* ]] || die "--env '$kv' is not KEY=VALUE"
done
if [ -n "$work" ]; then
  mountable --work "$(absolute "$work")"
  [ ! -e "$work" ] || [ -d "$work" ] || die "--work $work: not a directory"
  [ ! -d "$work" ] || [ -z "$(ls -A "$work")" ] ||
    die "--work $work is not empty (a SageMaker job starts from a fresh /opt/ml)"
else
  mountable "the default work directory" "$repo/build/local-train"
fi

# shellcheck source=bin/lib/engine.sh
source "$repo/bin/lib/engine.sh"
pick_engine local-train.sh docker podman
# A short name missing from the store would reach podman's registry lookup ("short-name did not resolve").
first=${image%%/*}
if [ "$engine" = podman ] && ! podman image exists "$image" \
  && { [ "$first" = "$image" ] || ! [[ "$first" == *.* || "$first" == *:* || "$first" == localhost ]]; }; then
  die "image $image is not in the store above: build it with bin/build.sh (same engine choice, same store)"
fi

# --gpu on a machine that cannot give a container its GPUs: one line saying what is missing and the fix, exit
# EX_UNAVAILABLE (69), before anything is made (the engine's own error was podman's 126 "unresolvable CDI devices
# nvidia.com/gpu=all", or docker's 125, naming no fix). A dry run starts no container and is not checked.
EX_UNAVAILABLE=69
NVIDIA_DRIVER=/proc/driver/nvidia/version  # present when the driver is loaded
CDI_DIRS=(/etc/cdi /var/run/cdi)
# cdi_has_gpu: a CDI spec in CDI_DIRS names nvidia.com/gpu devices (what podman's --device nvidia.com/gpu=... needs).
cdi_has_gpu() {
  local dir spec
  for dir in "${CDI_DIRS[@]}"; do
    for spec in "$dir"/*; do
      if grep -qs 'nvidia.com/gpu' "$spec"; then return 0; fi
    done
  done
  return 1
}
# gpu_missing: why this machine cannot give the containers its GPUs under $engine; nothing when it can.
gpu_missing() {
  if [ ! -e "$NVIDIA_DRIVER" ]; then
    echo "no NVIDIA driver on this machine ($NVIDIA_DRIVER is missing): drop --gpu to check or run on the CPU" \
      "(e.g. $(basename "$0") $image $command)"
  elif [ "$engine" = podman ] && ! cdi_has_gpu; then
    echo "podman finds no CDI device nvidia.com/gpu (no spec in ${CDI_DIRS[*]}): generate one with" \
      "\`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml\` (NVIDIA Container Toolkit), or drop --gpu"
  fi
}
if [ "$gpu" = 1 ] && [ "$dry_run" = 0 ]; then
  why=$(gpu_missing)
  if [ -n "$why" ]; then
    echo "local-train.sh: --gpu: $why" >&2
    exit "$EX_UNAVAILABLE"
  fi
fi

# Hosts find each other by name (algo-K) through podman's netavark network backend and its DNS, aardvark-dns.
if [ "$engine" = podman ] && [ "$hosts" -gt 1 ] && [ -z "$network" ] &&
  ! [ -x /usr/lib/podman/aardvark-dns ] && ! [ -x /usr/libexec/podman/aardvark-dns ]; then
  die "--hosts $hosts with podman: aardvark-dns is not installed, algo-K would not resolve (bin/daemonless-env.sh --install)"
fi

if [ -z "$work" ]; then
  mkdir -p "$repo/build/local-train"
  work=$(mktemp -d "$repo/build/local-train/job-$(date +%Y%m%d-%H%M%S)-XXXX")
else
  mkdir -p "$work"
fi
work=$(cd "$work" && pwd)

# The hosts and their trees: with one host the work directory is its /opt/ml, as before; with several, one tree
# per host under it, as each SageMaker instance has its own disk.
host_names=()
trees=()
for ((k = 1; k <= hosts; k++)); do
  host_names+=("algo-$k")
  if [ "$hosts" = 1 ]; then trees+=("$work"); else trees+=("$work/algo-$k"); fi
done
all_hosts=$(IFS=,; echo "${host_names[*]}")

# Each tree: the project's one /opt/ml writer (dev/smhvd_dev/mltree.py, standard library only, run from this
# checkout): hyperparameters JSON-encoded as the SDK does; launcher keys set from the options win.
args=(--hosts "$all_hosts" --job-name "$(basename "$work")")
[ -z "$hp_file" ] || args+=(--hyperparameters /dev/stdin)  # hp_text, read once above
for cname in "${channel_names[@]}"; do args+=(--channel "$cname"); done
[ -z "$source_dir" ] || args+=(--hp sagemaker_submit_directory=/opt/ml/code --hp "sagemaker_program=$entry_point")
[ -z "$processes" ] || args+=(--hp-json "sagemaker_mpi_num_of_processes_per_host=$processes")
[ "$mpi_options_set" = 0 ] || args+=(--hp "sagemaker_mpi_custom_mpi_options=$mpi_options")
for k in "${!host_names[@]}"; do
  PYTHONPATH="$repo/dev:$repo/src" python3 -m smhvd_dev.mltree "${trees[$k]}" --current-host "${host_names[$k]}" \
    "${args[@]}" <<<"$hp_text"
done

ca_bundle=$(host_ca_bundle)
if [ -n "$ca_bundle" ]; then
  echo "local-train.sh: the job trusts this machine's CA bundle $ca_bundle (extra CAs in $HOST_CA_DIR)" >&2
fi
# No --rm: with it, podman's Docker-compatible API (docker CLI -> podman) reports exit code 0 for every
# container; the containers are removed at the end instead, once their exit codes are known.
prefix="smhvd-local-train-$$-$RANDOM"
owned_network=""
if [ "$hosts" -gt 1 ] && [ -z "$network" ]; then
  network=$prefix
  owned_network=$network
fi

# host_cmd K: set `cmd`, the run command of host K (0-based).
host_cmd() {
  local k=$1 host=${host_names[$1]} i first
  cmd=("$engine" run --name "$prefix-$host" --shm-size "$shm_size" --volume "${trees[$k]}:/opt/ml")
  [ -z "$network" ] || cmd+=(--network "$network")
  [ "$hosts" = 1 ] || cmd+=(--network-alias "$host")
  [ "$network" = host ] || cmd+=(--hostname "$host")
  if [ "$gpu" = 1 ] && [ -z "$gpus_per_host" ]; then
    if [ "$engine" = docker ]; then cmd+=(--gpus all); else cmd+=(--device nvidia.com/gpu=all); fi
  elif [ "$gpu" = 1 ]; then
    first=$((k * gpus_per_host))
    if [ "$engine" = docker ]; then
      # docker reads --gpus as CSV: a list of devices is one quoted field
      cmd+=(--gpus "\"device=$(seq -s, "$first" "$((first + gpus_per_host - 1))")\"")
    else
      for ((i = first; i < first + gpus_per_host; i++)); do cmd+=(--device "nvidia.com/gpu=$i"); done
    fi
  fi
  [ -z "$source_dir" ] || cmd+=(--volume "$source_dir:/opt/ml/code:ro")
  for i in "${!channel_names[@]}"; do
    cmd+=(--volume "${channel_dirs[$i]}:/opt/ml/input/data/${channel_names[$i]}:ro")
  done
  if [ -n "$ca_bundle" ]; then
    # The job's pip (requirements.txt), boto3 and Python's ssl trust what this machine trusts; the user's --env
    # entries come after and win.
    local mounted=/etc/ssl/certs/smhvd-host-ca-bundle.crt
    cmd+=(--volume "$ca_bundle:$mounted:ro" --env "PIP_CERT=$mounted" --env "AWS_CA_BUNDLE=$mounted"
          --env "REQUESTS_CA_BUNDLE=$mounted" --env "SSL_CERT_FILE=$mounted")
  fi
  for kv in "${envs[@]}"; do cmd+=(--env "$kv"); done
  cmd+=("${run_args[@]}" "$image" "$command")
}

if [ "$hosts" = 1 ]; then
  echo "local-train.sh: /opt/ml = $work" >&2
else
  echo "local-train.sh: $hosts hosts (${host_names[*]}) on network $network; /opt/ml of algo-K = $work/algo-K" >&2
fi
for k in "${!host_names[@]}"; do
  host_cmd "$k"
  if [ "$dry_run" = 1 ]; then echo "local-train.sh: dry run: ${cmd[*]@Q}" >&2; else echo "local-train.sh: ${cmd[*]}" >&2; fi
done
[ "$dry_run" = 0 ] || exit 0

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local host
  for host in "${host_names[@]}"; do "$engine" rm --force "$prefix-$host" >/dev/null 2>&1 || true; done
  [ -z "$owned_network" ] || "$engine" network rm "$owned_network" >/dev/null 2>&1 || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

codes=()
if [ "$hosts" = 1 ]; then
  host_cmd 0
  status=0
  "${cmd[@]}" || status=$?
  codes=("$status")
else
  [ -z "$owned_network" ] || "$engine" network create "$network" >/dev/null
  # Every host at once, as SageMaker starts them; each line of a host's output prefixed with its name.
  pids=()
  for k in "${!host_names[@]}"; do
    host_cmd "$k"
    ( "${cmd[@]}" 2>&1 | sed -u "s/^/${host_names[$k]} | /"; exit "${PIPESTATUS[0]}" ) &
    pids+=("$!")
  done
  for pid in "${pids[@]}"; do
    code=0
    wait "$pid" || code=$?
    codes+=("$code")
  done
fi

# The job's exit code: the first host's that is not 0, in host order (algo-1, the leader, ran mpirun).
status=0
for code in "${codes[@]}"; do
  if [ "$code" != 0 ]; then status=$code; break; fi
done
# Every host's exit code and failure line, then the first failure file in full (SageMaker's FailureReason).
first_failure=""
for k in "${!host_names[@]}"; do
  failure=${trees[$k]}/output/failure
  if [ "$hosts" -gt 1 ]; then
    line="local-train.sh: ${host_names[$k]} exited ${codes[$k]}"
    [ ! -s "$failure" ] || line+="; $failure: $(head -n 1 "$failure")"
    echo "$line" >&2
  fi
  if [ -z "$first_failure" ] && [ -s "$failure" ]; then first_failure=$failure; fi
done
if [ -n "$first_failure" ]; then
  echo "local-train.sh: the job failed (exit $status): $(head -c 1024 "$first_failure")" >&2
fi
echo "local-train.sh: exit $status; model: ${trees[0]}/model; output: ${trees[0]}/output/data" >&2
exit "$status"
