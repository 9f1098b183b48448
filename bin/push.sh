#!/usr/bin/env bash
# Push local images to Amazon ECR (or, with --registry, to any registry you are logged in to) with Docker v2
# manifests, and print the pushed image URIs: the `image_uri` of a SageMaker estimator.
# ECR: account and region come from the environment or the AWS CLI; the repository is created when missing (with
# scan on push); login is `aws ecr get-login-password | ENGINE login --password-stdin`. Safe to re-run.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [options] LOCAL_IMAGE...
  LOCAL_IMAGE        NAME:TAG as printed by bin/build.sh; pushed as REGISTRY/REPOSITORY:TAG
  --engine E         docker, podman or buildah (default: docker when its daemon answers \`docker info\`, else
                     podman with the project's store; see docs/images.md, "Which engine, which store")
  --repository NAME  repository in the registry (default: the local image's name without its registry part)
  --registry HOST    push there instead of ECR (no AWS calls; log in yourself), e.g. 127.0.0.1:5000
                     (also \$SMHVD_REGISTRY). A registry on this machine, any port: bin/local-registry.sh
                     --port N (or make registry REGISTRY_PORT=N) starts one; one on 127.0.0.1 or localhost is
                     reached over plain HTTP, as Docker does
  --ecr              with --registry: it is an ECR registry under another name (e.g. an interface VPC
                     endpoint's DNS name): create the repository and log in as for ECR
  --region R         ECR region (default: \$AWS_REGION, \$AWS_DEFAULT_REGION, else 'aws configure get region')
  --account ID       AWS account (default: \$AWS_ACCOUNT_ID, else 'aws sts get-caller-identity')
  --dry-run          choose the engine and store, check the references, print the push commands, push nothing
                     (no AWS call: needs --registry)
  -h, --help         this help
Example: $(basename "$0") \$(bin/build.sh cpu)
USAGE
}

die() { echo "push.sh: $*" >&2; exit 2; }

engine=""
dry_run=0
repository=""
registry=${SMHVD_REGISTRY:-}
region=${AWS_REGION:-${AWS_DEFAULT_REGION:-}}
account=${AWS_ACCOUNT_ID:-}
ecr=0
images=()
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) engine=${2:?--engine needs a value}; shift ;;
    --repository) repository=${2:?--repository needs a value}; shift ;;
    --registry) registry=${2:?--registry needs a value}; shift ;;
    --region) region=${2:?--region needs a value}; shift ;;
    --account) account=${2:?--account needs a value}; shift ;;
    --ecr) ecr=1 ;;
    --dry-run) dry_run=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) usage >&2; die "unknown option '$1'" ;;
    *) images+=("$1") ;;
  esac
  shift
done
[ "${#images[@]}" -gt 0 ] || { usage >&2; die "no image to push"; }

# shellcheck source=bin/lib/engine.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/engine.sh"
pick_engine push.sh docker podman buildah

# NAME:TAG -> (name without registry host, tag). A first component with a dot, a colon or "localhost" is a host.
split_ref() {
  local ref=$1 path tag
  [[ "$ref" != *@* ]] || die "$ref: push a NAME:TAG, not a digest"
  path=${ref%:*}
  tag=${ref##*:}
  if [ "$path" = "$ref" ] || [[ "$tag" == */* ]]; then
    die "$ref: expected NAME:TAG (as printed by bin/build.sh)"
  fi
  local first=${path%%/*}
  if [ "$first" != "$path" ] && { [[ "$first" == *.* ]] || [[ "$first" == *:* ]] || [ "$first" = localhost ]; }; then
    path=${path#*/}
  fi
  printf '%s\n%s\n' "$path" "$tag"
}

for image in "${images[@]}"; do split_ref "$image" >/dev/null; done  # every reference valid before any AWS call
[ "$dry_run" = 0 ] || [ -n "$registry" ] || die "--dry-run needs --registry (it makes no AWS call)"

[ -n "$registry" ] || ecr=1
[[ "$registry" != *.dkr.ecr.*.amazonaws.com* ]] || ecr=1
[ "$dry_run" = 0 ] || ecr=0
if [ "$ecr" = 1 ]; then
  command -v aws >/dev/null || die "the AWS CLI is needed to push to ECR (or pass --registry HOST)"
  if [ -z "$region" ]; then
    region=$(aws configure get region || true)
    [ -n "$region" ] || die "no AWS region: set AWS_REGION or pass --region"
  fi
fi
if [ -z "$registry" ]; then
  if [ -z "$account" ]; then
    if ! account=$(aws sts get-caller-identity --query Account --output text); then
      die "cannot find the AWS account (aws sts get-caller-identity failed): set AWS_ACCOUNT_ID or pass --account"
    fi
  fi
  [[ "$account" =~ ^[0-9]{12}$ ]] || die "AWS account '$account' is not a 12-digit account id"
  registry="$account.dkr.ecr.$region.amazonaws.com"
  # China regions use another DNS suffix.
  [[ "$region" != cn-* ]] || registry="$registry.cn"
fi

if [ "$ecr" = 1 ]; then
  aws ecr get-login-password --region "$region" | "$engine" login --username AWS --password-stdin "$registry" >&2
fi
ensured=" "  # repositories already checked (a string, not an associative array: macOS ships bash 3.2)
for image in "${images[@]}"; do
  parts=$(split_ref "$image")  # exits here on a malformed reference
  name=${parts%%$'\n'*}
  tag=${parts#*$'\n'}
  repo_name=${repository:-$name}
  if [ "$ecr" = 1 ] && [[ "$ensured" != *" $repo_name "* ]]; then
    if ! aws ecr describe-repositories --region "$region" --repository-names "$repo_name" >/dev/null 2>&1; then
      echo "push.sh: creating ECR repository $repo_name in $region" >&2
      aws ecr create-repository --region "$region" --repository-name "$repo_name" \
        --image-scanning-configuration scanOnPush=true >/dev/null
    fi
    ensured+="$repo_name "
  fi
  remote="$registry/$repo_name:$tag"
  echo "push.sh: $engine: $image -> $remote" >&2
  if [ "$engine" = docker ]; then
    push=(docker push "$remote")
  else
    push=("$engine" push --format v2s2)
    # Docker treats registries on the loopback interface as plain HTTP; podman and buildah only those their
    # registries.conf names (bin/local-registry.sh adds its own): a user's registry on another port is too.
    [[ "$registry" != 127.* && "$registry" != localhost:* ]] || push+=(--tls-verify=false)
    push+=("$image" "docker://$remote")
  fi
  if [ "$dry_run" = 1 ]; then
    echo "push.sh: dry run: ${push[*]@Q}" >&2
  else
    [ "$engine" != docker ] || docker tag "$image" "$remote"
    "${push[@]}" >&2
  fi
  printf '%s\n' "$remote"
done
