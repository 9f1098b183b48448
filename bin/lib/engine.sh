# shellcheck shell=bash
# Sourced by bin/build.sh and bin/push.sh: choose and check the container engine.
# Needs the caller's die(); sets the global `engine` (docker, podman or buildah).

pick_engine() {
  if [ -z "$engine" ]; then
    local candidate
    for candidate in docker podman buildah; do
      if command -v "$candidate" >/dev/null; then engine=$candidate; break; fi
    done
    [ -n "$engine" ] || die "no container engine found (install docker, podman or buildah, or pass --engine)"
  fi
  case "$engine" in
    docker|podman|buildah) command -v "$engine" >/dev/null || die "--engine $engine: $engine is not installed" ;;
    *) die "--engine must be docker, podman or buildah, not '$engine'" ;;
  esac
}
