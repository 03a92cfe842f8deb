#!/usr/bin/env bash
# The whole test suite: system packages, format, lints, build, shellcheck and lintian on the .deb
# (scripts/lint.sh), unit + integration tests on real loop-mounted ext4, a short kill soak
# (scripts/soak.sh), the desktop app driven through AT-SPI (scripts/gui-test.sh), then power cuts, disk faults and f2fs in a qemu guest (scripts/vm-test.sh,
# ~10 min), and the installed product on a booted Debian guest
# (scripts/system-test.sh --quick: one boot, the scenarios of docs/architecture.md's "System test";
# SYSTEM_TEST=full runs them all, SYSTEM_TEST=0 none).
# Needs root (loop devices, fscrypt ioctls, PAM). Prints a final tally.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then echo "scripts/test.sh must run as root (loop mounts, fscrypt keys)" >&2; exit 1; fi
bash scripts/deps.sh || exit 1
modprobe loop 2>/dev/null || true
# The system test's guest image (minutes of downloads and dpkg on a clean machine) is made while the
# build and the tests run: they leave a core idle most of the time (one test at a time).
img_log=$(mktemp) img_pid=""
case ${SYSTEM_TEST:-quick} in
  0) ;;
  # The image of the run below: full runs include `autologin` (the image with a display manager).
  full) bash scripts/system-test.sh --no-deps --image-only >"$img_log" 2>&1 & img_pid=$! ;;
  *) bash scripts/system-test.sh --no-deps --quick --image-only >"$img_log" 2>&1 & img_pid=$! ;;
esac
trap '[ -z "$img_pid" ] || wait "$img_pid" 2>/dev/null' EXIT # no mmdebstrap left behind
set -e
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --features fault-injection -- -D warnings
cargo build --workspace --features fault-injection
set +e
# Every script through shellcheck, the .deb of this build through lintian (scripts/lint.sh).
lint_log=$(mktemp)
bash scripts/lint.sh 2>&1 | tee "$lint_log"
lint_rc=${PIPESTATUS[0]}
log=$(mktemp)
# One test at a time: a command spawned by one test holds copies of every fd of the test
# process until it execs, so a parallel test could see its files "busy" (key removal) or "in use".
cargo test --workspace --no-fail-fast --features fault-injection -- --test-threads=1 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
pass=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s+=$1} END {print s+0}')
fail=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
skip=$(grep -Eo '[0-9]+ ignored' "$log" | awk '{s+=$1} END {print s+0}')
rm -f "$log"
# The power-cut checker (scripts/vm/guest.py) against planted damage: it must fail on each.
checker_log=$(mktemp)
python3 scripts/vm/test_checker.py --bin "${CARGO_TARGET_DIR:-target}/debug" 2>&1 | tee "$checker_log"
[ "${PIPESTATUS[0]}" -eq 0 ] || [ "$rc" -ne 0 ] || rc=1
# SIGKILLs at random moments across copy, move, abort and rollback, then 20 s of live rounds (a
# large run: docs/crash-safety.md); about a minute.
soak_log=$(mktemp)
bash scripts/soak.sh 15 2>&1 | tee "$soak_log"
soak_rc=${PIPESTATUS[0]}
[ "$rc" -ne 0 ] || rc=$soak_rc
[ "$rc" -ne 0 ] || rc=$lint_rc
# The desktop front end (dirseal-settings) driven through AT-SPI under Xvfb against dirsealed on a
# private bus and a scratch ext4: the overview, encrypt now, in the background (found again after
# closing the window) and at the next boot, cancel, errors, with screenshots.
gui_log=$(mktemp)
BIN_DIR=${CARGO_TARGET_DIR:-target}/debug bash scripts/gui-test.sh 2>&1 | tee "$gui_log"
gui_rc=${PIPESTATUS[0]}
[ "$rc" -ne 0 ] || rc=$gui_rc
# Power cuts (dm-log-writes replays) and f2fs, in a qemu guest: a sample of crash points.
vm_log=$(mktemp)
bash scripts/vm-test.sh --no-deps 2>&1 | tee "$vm_log"
vm_rc=${PIPESTATUS[0]}
# The whole product installed on a booted Debian guest with systemd: bus activation, logins and
# logouts, the key-touch and TPM-PIN demo; with SYSTEM_TEST=full also polkit, uninstall, the .deb.
sys_log=$(mktemp) sys_rc=0
if [ -n "$img_pid" ] && ! wait "$img_pid"; then cat "$img_log"; fi
rm -f "$img_log"
case ${SYSTEM_TEST:-quick} in
  0) ;;
  full) bash scripts/system-test.sh --no-deps 2>&1 | tee "$sys_log"; sys_rc=${PIPESTATUS[0]} ;;
  *) bash scripts/system-test.sh --no-deps --quick 2>&1 | tee "$sys_log"; sys_rc=${PIPESTATUS[0]} ;;
esac
echo "tests: $pass passed, $fail failed, $skip skipped"
grep -E '^(shellcheck|lintian): ' "$lint_log"
rm -f "$lint_log"
grep -E '^checker: ([0-9]+ plantings|FAILED)' "$checker_log" || echo "checker: FAILED (no result line)"
rm -f "$checker_log"
grep -E '^soak: [0-9]+ kills' "$soak_log"
rm -f "$soak_log"
grep -E '^gui: [0-9]+ scenarios' "$gui_log" || echo "gui: FAILED (no result line)"
rm -f "$gui_log"
grep -E '^(powercut: [0-9]+ points|faults: [0-9]+ scenarios|(f2fs|tpm2|casefold): (ok|FAILED)|vm-test: (ok|FAILED))' "$vm_log"
rm -f "$vm_log"
grep -E '^system: ([a-z0-9]+ (ok|FAILED)|[0-9]+ scenarios|ok|FAILED)' "$sys_log" || true
rm -f "$sys_log"
[ "$rc" -ne 0 ] && exit "$rc"
[ "$vm_rc" -ne 0 ] && exit "$vm_rc"
exit "$sys_rc"
