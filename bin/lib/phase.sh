# shellcheck shell=bash
# Sourced by bin/setup-host.sh, bin/build.sh, bin/run-notebooks.sh and bin/lib/pinned-venv.sh (the SDK venvs): a
# step that can take a while says what it does when it starts and how long it took when it ends, so that no long
# step is silent.

# phase NAME WHAT CMD...: "NAME: WHAT ..." on stderr, then CMD, then "NAME: WHAT: N s" (with its exit code when
# it failed); returns CMD's exit code.
phase() {
  local name=$1 what=$2 start=$SECONDS status=0
  shift 2
  echo "$name: $what ..." >&2
  "$@" || status=$?
  if [ "$status" = 0 ]; then
    echo "$name: $what: $((SECONDS - start)) s" >&2
  else
    echo "$name: $what: failed (exit $status) after $((SECONDS - start)) s" >&2
  fi
  return "$status"
}

# stamp_steps START: copy stdin to stdout, each build step's first line (podman/buildah `[stage/stages] STEP n/m: ...`,
# the docker legacy builder's `Step n/m : ...`) prefixed with the seconds since START (a value of $SECONDS).
stamp_steps() {
  local start=$1 line
  while IFS= read -r line || [ -n "$line" ]; do
    case "$line" in
      "STEP "* | "["*"] STEP "* | "Step "*) printf '[%5d s] %s\n' "$((SECONDS - start))" "$line" ;;
      *) printf '%s\n' "$line" ;;
    esac
  done
}

# own_tags NAME...: copy stdin to stdout but for the engine's "Successfully tagged X" lines of other names than
# NAME... (with or without podman's localhost/): podman prints one for every name the image already has, so a
# build served from the layer cache listed the names other builds gave it (the image tests' among them).
own_tags() {
  local line name tagged ours
  while IFS= read -r line || [ -n "$line" ]; do
    if [[ "$line" == "Successfully tagged "* ]]; then
      tagged=${line#Successfully tagged }
      ours=0
      for name in "$@"; do
        if [ "$tagged" = "$name" ] || [ "$tagged" = "localhost/$name" ]; then ours=1; fi
      done
      [ "$ours" = 1 ] || continue
    fi
    printf '%s\n' "$line"
  done
}
