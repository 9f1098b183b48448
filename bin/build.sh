#!/usr/bin/env bash
# Build the CPU or GPU training image (docker/Dockerfile, target cpu|gpu) and tag it twice: NAME:FLAVOR-GITSHA
# (immutable: what an estimator should reference) and NAME:FLAVOR (moving). Images are made with Docker v2
# manifests and no attestation/OCI index, which SageMaker rejects. Prints the two image references on stdout.
set -euo pipefail

usage() {
  cat <<USAGE
usage: $(basename "$0") [options] cpu|gpu
  --engine E          docker, podman or buildah (default: docker when its daemon answers \`docker info\`, else
                      podman with the project's store; see docs/images.md, "Which engine, which store")
  --name NAME         image name (default: \$SMHVD_IMAGE_NAME or sagemaker-horovod)
  --base-image REF    base image (default: with podman/buildah, localhost/debian:bookworm when the project store
                      has it (bin/make-base-image.sh); else the Dockerfile's docker.io/library/debian:bookworm-slim)
  --extra-ca PATH     trust these CA certificates (a PEM file, or a directory of *.crt/*.pem) while downloading
                      during the build, e.g. behind an HTTPS-intercepting proxy; repeatable. Not stored in the image.
                      Default: the machine's own extra CAs, /usr/local/share/ca-certificates/*.crt, when there are
                      any (docs/images.md, "Behind a proxy that re-signs TLS")
  --dry-run           choose the engine, store, base image and CAs, print the build command, build nothing
  --build-arg K=V     any other Dockerfile ARG (versions, HOROVOD_BUILD_CUDA_CC_LIST...); repeatable
  --no-cache          rebuild every layer
  -h, --help          this help
Environment: SMHVD_VENDOR_DIR, a folder of EFA source archives (libfabric-*.tar.gz, aws-ofi-nccl-*.tar.gz) the
build takes instead of downloading them (default: ../shared/vendor beside the repository, when there)
The build context is the repository root. Examples:
  $(basename "$0") cpu
  $(basename "$0") --engine podman --extra-ca ./proxy-ca.pem gpu
USAGE
}

die() { echo "build.sh: $*" >&2; exit 2; }

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
engine=""
name=${SMHVD_IMAGE_NAME:-sagemaker-horovod}
base_image=""
extra_ca=()
build_args=()
no_cache=0
dry_run=0
flavor=""
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) engine=${2:?--engine needs a value}; shift ;;
    --name) name=${2:?--name needs a value}; shift ;;
    --base-image) base_image=${2:?--base-image needs a value}; shift ;;
    --extra-ca) extra_ca+=("${2:?--extra-ca needs a path}"); shift ;;
    --build-arg) build_args+=("${2:?--build-arg needs KEY=VALUE}"); shift ;;
    --no-cache) no_cache=1 ;;
    --dry-run) dry_run=1 ;;
    -h|--help) usage; exit 0 ;;
    cpu|gpu) [ -z "$flavor" ] || die "only one flavor per build (got $flavor and $1)"; flavor=$1 ;;
    *) usage >&2; die "unknown argument '$1'" ;;
  esac
  shift
done
[ -n "$flavor" ] || { usage >&2; die "missing the flavor: cpu or gpu"; }
# EFA's sources (libfabric, aws-ofi-nccl): the build takes their archives from docker/sources/ when there, else
# downloads them (docs/images.md, "EFA"). A local folder's archives are copied there: $SMHVD_VENDOR_DIR, else
# ../shared/vendor beside the repository.
vendor=${SMHVD_VENDOR_DIR:-}
[ -n "$vendor" ] || [ ! -d "$repo/../shared/vendor" ] || vendor=$(cd "$repo/../shared/vendor" && pwd)
[ -z "$vendor" ] || [ -d "$vendor" ] || die "SMHVD_VENDOR_DIR=$vendor: no such directory"

# shellcheck source=bin/lib/engine.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/engine.sh"
pick_engine build.sh docker podman buildah
if [ -z "$base_image" ] && [ "$engine" != docker ]; then
  base_image=$(project_base_image)
  if [ -n "$base_image" ]; then
    echo "build.sh: base image: $base_image (from the store above)" >&2
  else
    echo "build.sh: base image: the Dockerfile's docker.io/library/debian:bookworm-slim (no $PROJECT_BASE_IMAGE" \
      "in the store above: bin/make-base-image.sh makes it without Docker Hub)" >&2
  fi
fi
if [ "${#extra_ca[@]}" = 0 ] && [ -n "$(host_ca_dir)" ]; then
  extra_ca=("$(host_ca_dir)")
  echo "build.sh: trusting this machine's extra CA certificates while downloading: $HOST_CA_DIR/*.crt" >&2
fi
for arg in "${build_args[@]}"; do
  [[ "$arg" == [A-Za-z_]*=* ]] || die "--build-arg '$arg' is not KEY=VALUE"
done

# PEM text of the extra CAs; files are read here so the build context does not need them.
ca_pem=""
for path in "${extra_ca[@]}"; do
  if [ -d "$path" ]; then
    files=()
    while IFS= read -r -d '' f; do files+=("$f"); done \
      < <(find "$path" -maxdepth 1 -type f \( -name '*.crt' -o -name '*.pem' \) -print0 | sort -z)
    [ "${#files[@]}" -gt 0 ] || die "--extra-ca $path: no *.crt or *.pem file in this directory"
  elif [ -f "$path" ]; then
    files=("$path")
  else
    die "--extra-ca $path: no such file or directory"
  fi
  for f in "${files[@]}"; do
    grep -q -- '-----BEGIN CERTIFICATE-----' "$f" || die "--extra-ca $f: not a PEM certificate"
    ca_pem+=$(cat "$f")$'\n'
  done
done

commit=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
short=${commit:0:12}
# A tag named after a commit must not hide uncommitted changes to what goes into the image.
if [ "$commit" != unknown ] && [ -n "$(git -C "$repo" status --porcelain -- docker requirements src pyproject.toml)" ]; then
  short="$short-dirty"
fi
version=$(sed -n -E 's/^version[[:space:]]*=[[:space:]]*"([^"]+)".*/\1/p' "$repo/pyproject.toml" | head -n 1)
immutable="$name:$flavor-$short"
moving="$name:$flavor"

args=(--file "$repo/docker/Dockerfile" --target "$flavor" --tag "$immutable" --tag "$moving"
      --build-arg "VERSION=${version:-dev}" --build-arg "GIT_COMMIT=$commit"
      --label "org.opencontainers.image.version=${version:-dev}" --label "org.opencontainers.image.revision=$commit")
[ -z "$base_image" ] || args+=(--build-arg "BASE_IMAGE=$base_image")
[ -z "$ca_pem" ] || args+=(--build-arg "EXTRA_CA_CERTS=$ca_pem")
for arg in "${build_args[@]}"; do args+=(--build-arg "$arg"); done
[ "$no_cache" = 0 ] || args+=(--no-cache)

case "$engine" in
  docker)
    # BuildKit (buildx) would add a provenance attestation, i.e. an OCI index: SageMaker rejects those.
    if [ "${DOCKER_BUILDKIT:-}" != 0 ] && docker buildx version >/dev/null 2>&1; then
      cmd=(docker buildx build --load --provenance=false --sbom=false "${args[@]}" "$repo")
    else
      cmd=(docker build "${args[@]}" "$repo")
    fi
    ;;
  podman) cmd=(podman build --format docker --layers "${args[@]}" "$repo") ;;
  buildah) cmd=(buildah build --format docker --layers "${args[@]}" "$repo") ;;
esac

if [ "$dry_run" = 1 ]; then
  # The command with the CA text shortened: PEM blocks are long, and the command is for reading.
  shown=()
  for a in "${cmd[@]}"; do
    if [[ "$a" == EXTRA_CA_CERTS=* ]]; then
      a="EXTRA_CA_CERTS=<$(grep -c -- '-----BEGIN CERTIFICATE-----' <<<"$ca_pem") PEM certificate(s)>"
    fi
    shown+=("$a")
  done
  echo "build.sh: dry run: ${shown[*]@Q}" >&2
  exit 0
fi
if [ -n "$vendor" ]; then
  archives=()
  for f in "$vendor"/libfabric-*.tar.gz "$vendor"/aws-ofi-nccl-*.tar.gz; do
    [ -f "$f" ] || continue
    # Copied only when changed: the copy's time stamp would otherwise make the build's COPY look new.
    cmp -s "$f" "$repo/docker/sources/${f##*/}" || cp "$f" "$repo/docker/sources/"
    archives+=("${f##*/}")
  done
  echo "build.sh: EFA sources from $vendor: ${archives[*]:-none there (the build downloads them)}" >&2
fi
echo "build.sh: $engine: building $moving ($immutable); each step's line shows the seconds since the start" >&2
# shellcheck source=bin/lib/phase.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/phase.sh"
start=$SECONDS
"${cmd[@]}" 2>&1 | own_tags "$immutable" "$moving" | stamp_steps "$start" >&2
# buildah/podman 4.x reuse a fully cached image even when only the labels' build arguments changed: the image
# would then claim an older commit. Re-label it in that case (a config change plus one empty layer).
if [ "$engine" != docker ]; then
  if [ "$engine" = buildah ]; then
    label=$(buildah inspect --type image --format '{{index .OCIv1.Config.Labels "org.opencontainers.image.revision"}}' "$immutable")
  else
    label=$(podman image inspect --format '{{index .Labels "org.opencontainers.image.revision"}}' "$immutable")
  fi
  if [ "$label" != "$commit" ]; then
    echo "build.sh: the cached image says revision '$label': re-labelling it $commit" >&2
    if [ "$engine" = buildah ]; then
      ctr=$(buildah from --pull-never "$immutable")
      buildah config --label "org.opencontainers.image.revision=$commit" \
        --label "org.opencontainers.image.version=${version:-dev}" "$ctr"
      buildah commit -q --format docker "$ctr" "$immutable" >/dev/null
      buildah rm "$ctr" >/dev/null
    else
      ctr=$(podman create "$immutable")
      podman commit -q --format docker --change "LABEL org.opencontainers.image.revision=$commit" \
        --change "LABEL org.opencontainers.image.version=${version:-dev}" "$ctr" "$immutable" >/dev/null
      podman rm "$ctr" >/dev/null
    fi
    "$engine" tag "$immutable" "$moving"
  fi
fi
echo "build.sh: built in $((SECONDS - start)) s" >&2
printf '%s\n' "$immutable" "$moving"
