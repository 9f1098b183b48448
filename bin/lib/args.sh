# shellcheck shell=bash
# Sourced by bin/local-train.sh and bin/local-registry.sh: their arguments are checked before anything is
# created, each failure one line naming the option and what was expected, exit 2 (the caller's `die`).

# needs LEFT OPTION WHAT: OPTION has its value (LEFT: the arguments left, OPTION included), or "OPTION needs WHAT".
needs() {
  [ "$1" -ge 2 ] || die "$2 needs $3"
}

# int_in VALUE MIN MAX: VALUE is a decimal integer from MIN to MAX. The length is checked before any arithmetic:
# bash's `[ -gt ]` fails on a 20-digit number (read as false) and its arithmetic wraps around.
int_in() {
  local value=$1 min=$2 max=$3
  [[ "$value" =~ ^(0|[1-9][0-9]*)$ ]] && [ "${#value}" -le "${#max}" ] &&
    [ "$value" -ge "$min" ] && [ "$value" -le "$max" ]
}

# absolute PATH: PATH made absolute against the working directory, without touching the file system.
absolute() {
  case "$1" in
    /*) printf '%s\n' "$1" ;;
    *) printf '%s\n' "$PWD/$1" ;;
  esac
}

# mountable OPTION PATH: PATH (absolute) can be a bind mount's source: `ENGINE run --volume SRC:DST[:OPTIONS]`
# reads a ':' in it as the end of SRC, and the engine fails later with an error that names no option.
mountable() {
  case "$2" in
    *:*) die "$1 $2: a path with ':' cannot be mounted (--volume SRC:DST splits at ':'); rename or link it" ;;
  esac
}
