#!/usr/bin/env bash
# The checks that are not cargo's, run by scripts/test.sh: shellcheck on every script (with the
# files they source), and lintian on the packages (scripts/build-deb.sh --gui, from the debug build:
# what is checked is the packaging, not the code): dirseal's and the desktop app's. Each prints one
# line, `shellcheck: ok|FAILED ...` and `lintian: ok|FAILED ...`, with the findings before it; an
# error or a warning fails (the infos lintian finds now are overridden, each with its reason, in
# data/debian/lintian-overrides and lintian-overrides-settings).
#
#   scripts/lint.sh [shellcheck] [lintian]     both by default
#   --build-dir DIR                            the binaries to package (default: the debug build)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=${CARGO_TARGET_DIR:-target}/debug
checks=()
while [ $# -gt 0 ]; do
  case $1 in
    shellcheck|lintian) checks+=("$1"); shift ;;
    --build-dir) build=${2:?--build-dir needs a directory}; shift 2 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "lint.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ ${#checks[@]} -gt 0 ] || checks=(shellcheck lintian)
rc=0

run_shellcheck() {
  local files out n
  files=(scripts/*.sh scripts/*/*.sh)
  if out=$(shellcheck -x "${files[@]}" 2>&1); then
    echo "shellcheck: ok (${#files[@]} scripts)"
  else
    n=$(grep -c '^In .* line [0-9]*:$' <<<"$out")
    printf '%s\n' "$out"
    echo "shellcheck: FAILED ($n findings)"
    rc=1
  fi
}

run_lintian() {
  local dir debs out
  dir=$(mktemp -d)
  if ! debs=$(bash scripts/build-deb.sh --build-dir "$build" --out "$dir" --fast --gui); then
    echo "lintian: FAILED (scripts/build-deb.sh --build-dir $build --gui)"; rc=1; rm -rf "$dir"; return
  fi
  # -I: infos are shown too, so that a new one gets its override (or a fix) instead of going unseen;
  # only errors and warnings fail.
  mapfile -t debs <<<"$debs"
  # The point of two packages: dirseal's own pulls nothing of GTK onto a machine without a desktop.
  if dpkg-deb -f "${debs[0]}" Depends Recommends | grep -qi 'gtk\|adwaita'; then
    echo "lintian: FAILED (dirseal's package depends on GTK: $(dpkg-deb -f "${debs[0]}" Depends))"; rc=1; rm -rf "$dir"; return
  fi
  out=$(lintian -I "${debs[@]}" 2>&1 | grep -v '^running with root privileges')
  rm -rf "$dir"
  [ -z "$out" ] || printf '%s\n' "$out"
  if grep -q '^[EW]: ' <<<"$out"; then
    echo "lintian: FAILED ($(grep -c '^E: ' <<<"$out") errors, $(grep -c '^W: ' <<<"$out") warnings in ${#debs[@]} packages)"
    rc=1
  elif grep -q '^I: ' <<<"$out"; then
    echo "lintian: ok (${#debs[@]} packages; $(grep -c '^I: ' <<<"$out") infos without an override)"
  else
    echo "lintian: ok (${#debs[@]} packages)"
  fi
}

for c in "${checks[@]}"; do
  case $c in
    shellcheck) run_shellcheck ;;
    lintian) run_lintian ;;
  esac
done
exit "$rc"
