# shellcheck shell=bash
# The programs data/programs lists (the one registration place for installers, packaging and the
# guest tests). Sourced; needs the repository root as the working directory.

# programs [ROLE...]: the names, of every role or of those given.
# shellcheck disable=SC2120 # no roles means every program
programs() {
  awk -v roles=" $* " '!/^#/ && NF == 4 && (roles == "  " || index(roles, " " $3 " ")) {print $1}' data/programs
}

# program_line NAME: "MODE DEST" with $prefix and $multiarch replaced by the caller's values.
program_line() {
  local mode dest
  read -r mode dest < <(awk -v n="$1" '!/^#/ && $1 == n {print $2, $4}' data/programs)
  [ -n "$dest" ] || { echo "data/programs has no line for $1" >&2; return 1; }
  # The file's literal placeholders, not expansions:
  # shellcheck disable=SC2016
  dest=${dest//'$prefix'/${prefix:?}}
  # shellcheck disable=SC2016
  dest=${dest//'$multiarch'/${multiarch:?}}
  printf '%s %s\n' "$mode" "$dest"
}
