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
# A scenario that ends the boot (reboot_then, scenarios.sh) is continued in the next one: where
# (the scenario and its step) and the counts so far are kept in $R/resume, which the host leaves
# in place while it boots the same disk again.
resume_name="" resume_step="" start=$(date +%s)
# shellcheck source=/dev/null # written by this script in an earlier boot of the run
if [ -f "$R/resume" ]; then . "$R/resume"; rm -f "$R/resume"; fi
# run NAME: the scenario function scenario_NAME in a subshell (set -e; the failing command is the
# why). Status 1 when it ended the boot (status 100 from reboot_then): nothing more runs in it.
run() {
  local name=$1 step=""
  if [ -n "$only" ] && ! [[ ,$only, == *,$name,* ]]; then return 0; fi
  if [ -n "$resume_name" ]; then
    # Scenarios before the one continued ran in earlier boots.
    [ "$name" = "$resume_name" ] || return 0
    step=$resume_step resume_name=""
    log "system: $name continues after the reboot ($step)"
  else
    total=$((total + 1))
    : >"$R/$name.log"
  fi
  rm -f "$W/why"
  scenario=$name
  (
    set -eE
    trap 'echo "line $LINENO: $BASH_COMMAND failed" >"$W/why"' ERR
    SCENARIO_STEP=$step "scenario_$name"
  ) >>"$R/$name.log" 2>&1
  local rc=$?
  if [ $rc -eq 100 ] && [ -f "$R/reboot" ]; then
    printf 'resume_name=%q resume_step=%q total=%q failed=%q start=%q\n' \
      "$name" "$(cat "$W/reboot-step")" "$total" "$failed" "$start" >"$R/resume"
    log "system: $name: the guest reboots ($(cat "$R/reboot"))"
    return 1
  fi
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

log "system: guest up in $(cut -d' ' -f1 /proc/uptime | cut -d. -f1) s"
boot=$(cat "$R/boot" 2>/dev/null || echo 1) # the host counts them (a power cut's too)
for s in $SCENARIOS; do
  if ! run "$s"; then
    # The host sees the guest end with $R/reboot there and boots the same disk again.
    journalctl -b --no-pager >"$R/journal.boot$boot.txt" 2>&1 || true
    sync
    systemctl reboot --no-block
    exit 0
  fi
done
log "system: $total scenarios, $failed failed ($(( $(date +%s) - start )) s in the guest)"
journalctl -b --no-pager >"$R/journal.txt" 2>&1 || true
echo $(( failed > 0 )) >"$R/exit-status"
sync
systemctl poweroff --no-block
