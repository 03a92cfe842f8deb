#!/usr/bin/env bash
# Privileged filesystem tests in a qemu guest (TCG): power cuts replayed from a dm-log-writes
# recording of a conversion (copy, move, one with a TPM2 protector, one on a casefold ext4; with
# --full or --cases /live one live: copied in use, changed, caught up, committed),
# disk faults under a conversion (device-mapper: a bad block in the original, failing writes, the device vanishing
# and coming back, the filesystem full at each phase, failing writes in a live catch-up pass; ext4
# and f2fs, copy and move),
# the main flows on f2fs, casefolded directories kept through convert, decrypt and portable (ext4
# and f2fs; the host kernel has no casefold), and TPM2 protectors through the guest
# kernel's resource manager (a host swtpm). The guest runs a Debian 6.1 kernel from
# the package archive (cached under the target dir) and the host's own userland, shared read-only
# over 9p, so it tests the binaries of this checkout. Prints a summary; exits non-zero on failure.
#
#   scripts/vm-test.sh            sampled crash points (what scripts/test.sh runs)
#   scripts/vm-test.sh --full     every flush point and every write between them
#   scripts/vm-test.sh [--full] --only RECORDING[,RECORDING...]   those power-cut recordings only
#                 (names: scripts/vm/guest.py --list-recordings). With --full the host's results
#                 are kept per point under TARGET/vm/full/, so the same command again resumes
#                 where an interrupted run stopped (same binaries: else it records anew).
#   scripts/vm-test.sh --cmd CMD  boot and run CMD in the guest (debugging), cwd = results dir
#   VM_GUEST_ARGS="--budget 600"  passed to scripts/vm/guest.py (--cases tpm2: only the matching
#                 recordings and fault scenarios); VM_OUT=DIR  results dir
#   VM_STALL=SECONDS  a guest silent on its console this long is taken for hung (default 600)
#   VM_HOST_BUDGET=SECONDS  sampled: the host's replays after their fixed points (default 300);
#                 VM_HOST_ARGS="--jobs 1"  passed to the host's replays (scripts/vm/guest.py --host-replay)
#
# The guest records every conversion (dm-log-writes). The ext4 recordings (all but casefold) are
# copied out through the results share and replayed here, natively, points in parallel (one per
# core, each in its own loop device, scratch copy, mount and pid namespace): scripts/vm/guest.py
# --host-replay, the same checks. f2fs and casefold ones replay in the guest (the host kernel
# mounts neither).
#
# The sampled run takes about as long on a slow or busy machine as on a fast one: the guest
# replays a fixed set of power-cut points, then as many more as fit its time budget. No overall
# time limit: only a guest that prints nothing for VM_STALL seconds is stopped (its console is in
# the results dir).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
if [ "$(id -u)" -ne 0 ]; then echo "scripts/vm-test.sh must run as root (apt, the guest's 9p share of /)" >&2; exit 1; fi

. scripts/lib/guest.sh
mode=sampled cmd="" only="" skip_deps=""
own_arg() {
  case $1 in
    --full) mode=full ;;
    *) return 1 ;;
  esac
}
guest_args "usage: scripts/vm-test.sh [--full] [--only powercut|faults|f2fs|tpm2|casefold|RECORDING,...] [--cmd CMD] [--no-deps]" own_arg "$@"
# --only ext4/copy,...: power-cut recordings by name.
recordings=""
case $only in */*) recordings=$only only=powercut ;; esac

guest_workdir vm
vm=$target/vm
cargo build -q --workspace --features fault-injection

guest_kernel "$vm/kernel"

# Initramfs: static busybox, an init script and the modules the tests need.
tmp=$(mktemp -d)
swtpm_pid="" qemu_pid="" tail_pid=""
# shellcheck disable=SC2154 # p is the loop's own variable (shellcheck does not see it in a trap)
trap 'for p in $qemu_pid $tail_pid $swtpm_pid; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"' EXIT
guest_initramfs "$tmp/initrd.img" scripts/vm/init dm-mod dm-log-writes dm-flakey ext4 f2fs quota_v2 loop virtio_pci virtio_blk \
  9p 9pnet_virtio aesni_intel xts cts ecb sha512_ssse3 sha512_generic crc32c_intel crc32c_generic

out=${VM_OUT:-$vm/out}
rm -rf "$out"; mkdir -p "$out"
# The binaries under test, frozen for this run (a rebuild during it must not change them); beside
# the results share, not in it: the guest caches the host root share only.
bin=$out-bin
rm -rf "$bin"; mkdir -p "$bin"
for f in $(programs command helper) replay-log; do cp "$target/debug/$f" "$bin/"; done

# What the host replays: the recordings of this run (sampled), or those kept across --full runs.
if [ "$mode" = full ]; then replays=$vm/full; else replays=$out/recordings; fi
mkdir -p "$replays" "$out/recordings"
# The frozen binaries' digest, kept with each recording: a resumed --full run goes on only with the
# binaries that made its results.
bins_id=$(cd "$bin" && sha256sum -- * | sha256sum | cut -c1-16)
slug() { echo "powercut-${1//\//-}"; }
cmd_given=$cmd boot=1
if [ "$mode" = full ] && [ -n "$recordings" ] && [ -z "$cmd" ]; then
  # Kept recordings of the same binaries are resumed on the host; the guest records the others.
  todo=""
  for r in ${recordings//,/ }; do
    k=$replays/$(slug "$r")
    if [ -f "$k/meta.json" ] && [ "$(cat "$k/binaries" 2>/dev/null)" = "$bins_id" ]; then
      echo "vm-test: $r: resuming the kept recording ($(wc -l <"$k/results" 2>/dev/null || echo 0) points done)"
    else
      todo=${todo:+$todo,}$r
    fi
  done
  [ -n "$todo" ] || boot=""
  recordings_guest=$todo
else
  recordings_guest=$recordings
fi

# A software TPM for the guest (its kernel's resource manager gives /dev/tpmrm0, dirseal's
# default TCTI). Fresh state each run.
tpm=$out/tpm
guest_swtpm "$tpm"
if [ -z "$cmd" ]; then
  # The checkout and the binaries reach the guest as shares of their own, mounted by the guest's init
  # at fixed paths: the host root share is seen under tmpfs mounts (/tmp, /root, …), and a checkout
  # may live under one of them (CI clones wherever it likes).
  cmd="python3 /run/dirseal-repo/scripts/vm/guest.py --bin /run/dirseal-bin --out /mnt --mode $mode${only:+ --only $only}${recordings_guest:+ --recordings $recordings_guest} --export /mnt/recordings ${VM_GUEST_ARGS:-}"
fi
# run_guest: boots the guest on $cmd; exits when it hung or failed to run (the reason printed),
# returns non-zero when its tests failed.
run_guest() {
  # A hung guest must not hang the suite, and a slow one must not fail it: the console is watched,
  # and only silence for $stall s stops the guest. `no_timer_check`: on a busy host the kernel's
  # boot-time check of the emulated timer can fail and panic ("IO-APIC + timer doesn't work").
  stall=${VM_STALL:-600}
  console=$out/console.log
  : >"$console"
  start=$(date +%s)
  guest_qemu_args "$tpm"
  qemu-system-x86_64 "${qemu_args[@]}" -m 1536 -serial stdio \
    -kernel "$kroot/boot/vmlinuz-$kver" -initrd "$tmp/initrd.img" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 no_timer_check dirseal.cmd=$(printf '%s' "$cmd" | base64 -w0)" \
    -virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on \
    -virtfs local,path="$out",mount_tag=results,security_model=none \
    -virtfs local,path="$repo",mount_tag=repo,security_model=none,readonly=on \
    -virtfs local,path="$bin",mount_tag=bin,security_model=none,readonly=on \
    </dev/null >"$console" 2>&1 &
  qemu_pid=$!
  tail -n +1 -f --pid="$qemu_pid" "$console" &
  tail_pid=$!
  guest_watch "$qemu_pid" "$stall" 0 "$console"
  set +e
  wait "$qemu_pid"
  qrc=$?
  set -e
  qemu_pid=""
  wait "$tail_pid" 2>/dev/null || true
  tail_pid=""
  echo "vm-test: guest ran $(( $(date +%s) - start )) s"
  if [ -n "$guest_verdict" ]; then
    echo "vm-test: FAILED: the guest printed nothing for $stall s; its console's last lines ($console, details in $out/guest.log):"
    tail -n 40 "$console" | sed 's/^/  | /'
    exit 1
  fi
  if [ $qrc -ne 0 ]; then echo "vm-test: qemu failed (status $qrc)"; exit 1; fi
  [ -f "$out/exit-status" ] || { echo "vm-test: the guest did not finish (no exit status)"; exit 1; }
  return "$(cat "$out/exit-status")"
}

guest_rc=0
if [ -n "$boot" ]; then run_guest || guest_rc=$?; else : >"$out/summary"; fi
# The recordings the guest exported, replayed here.
host_rc=0
for d in "$out"/recordings/*/; do
  [ -f "$d/meta.json" ] || continue
  echo "$bins_id" >"$d/binaries"
  if [ "$mode" = full ]; then rm -rf "${replays:?}/$(basename "$d")"; mv "$d" "$replays/"; fi
done
if [ -z "$cmd_given" ] && { [ -z "$only" ] || [ "$only" = powercut ]; }; then
  start=$(date +%s)
  # The names selected (all the mode's by default); only recordings of these binaries are replayed.
  [ -n "$recordings" ] || recordings=$(python3 scripts/vm/guest.py --list-recordings --mode "$mode" | awk '$2 == "host" {print $1}' | paste -sd,)
  # shellcheck disable=SC2086 # VM_HOST_ARGS: words (e.g. --jobs 1)
  python3 scripts/vm/guest.py --host-replay "$replays" --binaries "$bins_id" --bin "$bin" --out "$out" --mode "$mode" \
    --recordings "$recordings" --budget "${VM_HOST_BUDGET:-300}" ${VM_HOST_ARGS:-} || host_rc=$?
  echo "vm-test: host replays ran $(( $(date +%s) - start )) s"
fi
[ -f "$out/summary" ] && cat "$out/summary"
[ "$guest_rc" -eq 0 ] || { echo "vm-test: FAILED (guest status $guest_rc; log in $out)"; exit 1; }
[ "$host_rc" -eq 0 ] || { echo "vm-test: FAILED (host replays: status $host_rc; log in $out/host.log)"; exit 1; }
echo "vm-test: ok"
