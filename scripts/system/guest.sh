#!/bin/bash
# The scenarios of scripts/system-test.sh, run as root by a unit of the booted guest once it is up
# (docs/architecture.md, "System test"). Each prints `system: NAME ok` or `system: NAME FAILED: why`;
# the last line is `system: N scenarios, M failed`. Results and logs go to the results share; every
# step is logged there too, which is what the host's stall watchdog counts as progress.
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C.UTF-8
R=/run/dirseal-results B=/run/dirseal-bin S=/run/dirseal-repo
W=/var/tmp/system-test
mkdir -p "$W"
log() { echo "$*" >>"$R/log"; echo "$*"; }
# A step of the current scenario: progress for the watchdog, context for a failure.
step() { echo "  ${scenario:-setup}: $*" >>"$R/log"; }
fail() { echo "$*" >"$W/why"; exit 1; }
# check DESCRIPTION CMD...: CMD must succeed.
check() { local what=$1; shift; "$@" >"$W/out" 2>&1 || fail "$what ($(tail -c 300 "$W/out" | tr '\n' ' '))"; }

cmd=$(cat "$R/cmd" 2>/dev/null || true)
if [ -n "$cmd" ]; then
  (cd "$R" && bash -c "$cmd") >"$R/cmd.out" 2>&1
  echo $? >"$R/exit-status"; cat "$R/cmd.out" >>"$R/log"
  sync; systemctl poweroff --no-block; exit 0
fi

only=$(cat "$R/only" 2>/dev/null || true)
# Settings from the host (SYSTEM_DEMO_PIN).
# shellcheck source=/dev/null # written by the host for each run
[ ! -f "$R/env" ] || . "$R/env"
total=0 failed=0
# run NAME: the scenario function scenario_NAME in a subshell (set -e; the failing command is the why).
run() {
  local name=$1
  if [ -n "$only" ] && ! [[ ,$only, == *,$name,* ]]; then return 0; fi
  total=$((total + 1))
  rm -f "$W/why"
  scenario=$name
  (
    set -eE
    trap 'echo "line $LINENO: $BASH_COMMAND failed" >"$W/why"' ERR
    "scenario_$name"
  ) >"$R/$name.log" 2>&1
  local rc=$?
  after_scenario "$rc" 2>>"$R/$name.log"
  if [ $rc -eq 0 ]; then
    log "system: $name ok"
  else
    failed=$((failed + 1))
    log "system: $name FAILED: $(cat "$W/why" 2>/dev/null || echo "status $rc")"
    journalctl -b --no-pager -n 300 >"$R/$name.journal" 2>&1 || true
  fi
  scenario=""
}

. "$S/scripts/system/scenarios.sh"

start=$(date +%s)
log "system: guest up in $(cut -d' ' -f1 /proc/uptime | cut -d. -f1) s"
for s in $SCENARIOS; do run "$s"; done
log "system: $total scenarios, $failed failed ($(( $(date +%s) - start )) s in the guest)"
journalctl -b --no-pager >"$R/journal.txt" 2>&1 || true
echo $(( failed > 0 )) >"$R/exit-status"
sync
systemctl poweroff --no-block
