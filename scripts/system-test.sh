#!/usr/bin/env bash
# The whole product on a booted system: a Debian 12 guest with systemd as PID 1 under qemu (TCG), a
# TPM (host swtpm over tpm-tis → the guest's /dev/tpmrm0), dirseal installed the way the README
# says, then scenarios with real logins (sshd, agetty + login on a serial port), bus activation,
# polkit, logind sessions and systemd --user (docs/architecture.md, "System test"). Prints
# `system: NAME ok|FAILED: why` per scenario and `system: N scenarios, M failed`.
#
#   scripts/system-test.sh                  every scenario
#   scripts/system-test.sh --quick          the subset scripts/test.sh runs (CI): one boot, install
#                                           activation logout demo (docs/architecture.md)
#   scripts/system-test.sh --only a,b       some scenarios (names as printed)
#   scripts/system-test.sh --cmd CMD        boot, run CMD as root in the guest instead (debugging)
#   scripts/system-test.sh --rebuild-image  build the guest image again (it is cached)
#   scripts/system-test.sh --image-only     build the guest image if it is not cached, nothing else
#   SYSTEM_DEMO_PIN=0                       without the TPM-PIN half of `demo`
#   SYSTEM_OUT=DIR                          results, console log and logs (default target/system/out)
#
# The guest's root filesystem is made by mmdebstrap from the Debian archive (cached under
# CARGO_TARGET_DIR/system, rebuilt when the package list below changes); each run boots a
# copy-on-write overlay of it, so runs do not see each other. Its kernel is vm-test.sh's (Debian's,
# fetched once for both) with a busybox initramfs, its modules copied into the image. The checkout and the binaries of this
# build reach the guest as read-only 9p shares, the results as a writable one. A guest that makes
# no progress (no console output, no step logged) for SYSTEM_STALL seconds (default 240) is stopped
# and its console log printed; a slow one that keeps moving is not.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
if [ "$(id -u)" -ne 0 ]; then echo "scripts/system-test.sh must run as root (mmdebstrap, qemu shares)" >&2; exit 1; fi

. scripts/lib/guest.sh
only="" cmd="" rebuild="" skip_deps="" image_only=""
own_arg() {
  case $1 in
    --quick) only=install,activation,logout,demo ;;
    --rebuild-image) rebuild=1 ;;
    --image-only) image_only=1 ;;
    *) return 1 ;;
  esac
}
guest_args "usage: scripts/system-test.sh [--quick] [--only NAME,...] [--cmd CMD] [--rebuild-image] [--image-only] [--no-deps]" own_arg "$@"

guest_workdir system
sys=$target/system

# --- The guest image -------------------------------------------------------------------------
# What the guest needs: systemd and logind (sessions, systemd --user), dbus, polkitd, sshd and the
# console login, the libraries dirseal links (libfido2, tss2), gdbus (busctl cannot pass file
# descriptors), expect and sshpass to type passwords, kmod to load the kernel's modules. Nothing
# more: every package is time to build on a clean machine (CI). No manuals, docs or translations.
guest_kernel "$target/vm/kernel"
pkgs=systemd,systemd-sysv,libpam-systemd,dbus,polkitd,pkexec,openssh-server,openssh-client,sshpass
pkgs+=,libpam-modules,libpam-runtime,libfido2-1,libtss2-esys-3.0.2-0,libtss2-tctildr0,libtss2-tcti-device0
pkgs+=,libtss2-mu0,libtss2-rc0,udev,e2fsprogs,login,passwd,expect,kmod,procps,libglib2.0-bin
img=$sys/image
# The `autologin` scenario needs a display manager: LightDM (the lightest in Debian) with its GTK
# greeter, a minimal Xorg (the modesetting driver of xserver-xorg-core on qemu's VGA) and pamtester
# (the greeter's PAM service). A second image, so runs without the scenario (--quick) stay as small.
desktop=""
if [ -z "$only" ] || [[ ,$only, == *,autologin,* ]]; then
  desktop=1 img=$sys/image-desktop
  pkgs+=,lightdm,lightdm-gtk-greeter,xserver-xorg-core,xserver-xorg-input-libinput,pamtester
fi
image_version="2 $pkgs $kver $(cat scripts/system/image-setup.sh scripts/system/init | sha256sum | cut -c1-16)"
if [ -n "$rebuild" ] || [ "$(cat "$img/version" 2>/dev/null)" != "$image_version" ]; then
  echo "system: building the guest image (mmdebstrap; cached in $img)"
  t0=$(date +%s)
  rm -rf "$img" "$sys/root.tmp"; mkdir -p "$img"
  mirror=$(grep -rhoE '^(URIs: *|deb +)https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ \
             2>/dev/null | head -1 | sed -E 's/^(URIs: *|deb +)//; s/ *$//') || true
  mirror=${mirror:-http://deb.debian.org/debian}
  mmdebstrap --quiet --variant=apt --mode=root --include="$pkgs" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --customize-hook="bash $repo/scripts/system/image-setup.sh \"\$1\" \"$kroot/lib/modules/$kver\"" \
    bookworm "$sys/root.tmp" "$mirror" >"$img/mmdebstrap.log" 2>&1 ||
    { tail -30 "$img/mmdebstrap.log"; echo "system: FAILED: mmdebstrap (log $img/mmdebstrap.log)"; exit 1; }
  # The disk (ext4 with the encrypt feature: the homes are converted in place on the root
  # filesystem) and the initramfs that mounts it.
  mke2fs -q -t ext4 -O encrypt -L guest -d "$sys/root.tmp" "$img/root.img" 4G
  rm -rf "$sys/root.tmp"
  guest_initramfs "$img/initrd.img" scripts/system/init virtio_pci virtio_blk ext4 crc32c_intel crc32c_generic
  echo "$image_version" >"$img/version"
  echo "system: image built in $(( $(date +%s) - t0 )) s"
fi
[ -z "$image_only" ] || exit 0
t0=$(date +%s)
cargo build -q --workspace --features fault-injection
echo "system: built in $(( $(date +%s) - t0 )) s"

# --- One run -----------------------------------------------------------------------------------
out=${SYSTEM_OUT:-$sys/out}
rm -rf "$out"; mkdir -p "$out/results" "$out/bin"
# The binaries under test, frozen for this run, without their debug info (a tenth of the size: the
# package is built and the guest reads them in seconds, not minutes).
for f in $(programs) softfido-uhid; do objcopy --strip-debug "$target/debug/$f" "$out/bin/$f"; done
# The man pages and completions dirseal's build wrote beside them, which install.sh installs.
cp -r "$target/debug/dirseal-docs" "$out/bin/"
bash scripts/build-deb.sh --build-dir "$out/bin" --out "$out/bin" --fast >/dev/null
qemu-img create -q -f qcow2 -b "$img/root.img" -F raw "$out/root.qcow2"
printf '%s\n' "$only" >"$out/results/only"
printf '%s\n' "$cmd" >"$out/results/cmd"
printf 'SYSTEM_DEMO_PIN=%q\n' "${SYSTEM_DEMO_PIN:-1}" >"$out/results/env"

tmp=$(mktemp -d)
swtpm_pid="" qemu_pid="" cut_pid=""
cleanup() {
  for p in $cut_pid $qemu_pid $swtpm_pid; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

console=$out/console.log
: >"$console"
start=$(date +%s)
guest_qemu_args "$out/tpm"
# A virtual VGA for Xorg (bochs-drm in the guest).
[ -z "$desktop" ] || qemu_args+=(-vga std)
# boot_guest: qemu on the run's disk (the same overlay at every boot of the run). ttyS0: the
# console (kernel, systemd, the test's lines), appended to across boots. ttyS1 and ttyS2 are wired
# to each other through a unix socket: agetty serves ttyS1, the test types a login on ttyS2.
boot_guest() {
  rm -f "$tmp/serial"
  qemu-system-x86_64 "${qemu_args[@]}" -m 2048 \
    -chardev file,id=con,path="$console",append=on -serial chardev:con \
    -chardev socket,id=s1,path="$tmp/serial",server=on,wait=off -serial chardev:s1 \
    -chardev socket,id=s2,path="$tmp/serial" -serial chardev:s2 \
    -kernel "$kroot/boot/vmlinuz-$kver" -initrd "$img/initrd.img" \
    -append "console=ttyS0 quiet loglevel=3 panic=-1 no_timer_check systemd.show_status=false" \
    -drive file="$out/root.qcow2",if=virtio,format=qcow2,cache=unsafe \
    -virtfs local,path="$repo",mount_tag=repo,security_model=none,readonly=on \
    -virtfs local,path="$out/bin",mount_tag=bin,security_model=none,readonly=on \
    -virtfs local,path="$out/results",mount_tag=results,security_model=none \
    >>"$out/qemu.log" 2>&1 &
  qemu_pid=$!
}
# power_cut REGEX FROM BOOT: in the background, the power of the running guest cut (qemu killed,
# nothing shut down) as soon as its console, from byte FROM on, shows a line matching REGEX; what
# it saw goes to the results (powercut, console.cut.log) for the scenario to check.
power_cut() {
  local re=$1 from=$2 n=$3 t0 line
  t0=$(date +%s)
  (
    set +o pipefail # grep's first match ends tail early
    while kill -0 "$qemu_pid" 2>/dev/null; do
      if line=$(tail -c +"$((from + 1))" "$console" | tr -d '\r' | grep -aE -m1 -- "$re"); then
        kill -KILL "$qemu_pid"
        tail -c +"$((from + 1))" "$console" >"$out/results/console.cut.log"
        printf 'cut_boot=%q cut_after=%q cut_line=%q\n' "$n" "$(( $(date +%s) - t0 ))" "$line" >"$out/results/powercut"
        exit 0
      fi
      sleep 0.2
    done
  ) &
  cut_pid=$!
}

# The stall watchdog: progress is console output, a step the guest logs or what a console dialog
# shows; lines of the test are echoed as they come. A scenario may end a boot (reboot_then in
# scenarios.sh: $out/results/reboot says so, and whether to cut the power of the next one): the
# same disk boots again, at most 8 times in a run.
shown=0
guest_tick() {
  [ -f "$out/results/log" ] || return 0
  local n; n=$(wc -l <"$out/results/log")
  if [ "$n" -gt "$shown" ]; then sed -n "$((shown + 1)),${n}p" "$out/results/log" | grep '^system: ' || true; shown=$n; fi
}
boot=0 cut="" limit=${SYSTEM_LIMIT:-3600}
while :; do
  boot=$((boot + 1))
  echo "$boot" >"$out/results/boot"
  [ "$boot" = 1 ] || printf '\n===== system-test: boot %s =====\n' "$boot" >>"$console"
  from=$(stat -c %s "$console")
  # The TPM is the same at every boot (its state kept); swtpm ends with each qemu.
  [ -z "$swtpm_pid" ] || wait "$swtpm_pid" 2>/dev/null || true
  guest_swtpm "$out/tpm"
  t_boot=$(date +%s)
  boot_guest
  if [ -n "$cut" ]; then power_cut "$cut" "$from" "$boot"; fi
  # SYSTEM_LIMIT bounds the whole run, over all its boots.
  left=0
  if [ "$limit" -gt 0 ]; then left=$((limit - ($(date +%s) - start))); [ "$left" -gt 0 ] || left=1; fi
  # (bash's "Killed" notice of a power-cut qemu is no news: not shown.)
  guest_watch "$qemu_pid" "${SYSTEM_STALL:-240}" "$left" "$console" "$out/results/log" \
    "$out/results/console-dialogs.log" 2>/dev/null
  if [ -n "$cut_pid" ]; then kill "$cut_pid" 2>/dev/null || true; wait "$cut_pid" 2>/dev/null || true; cut_pid=""; fi
  if [ -n "$guest_verdict" ]; then
    wait "$qemu_pid" 2>/dev/null || true; qemu_pid=""
    echo "system: FAILED: the guest stopped: $guest_verdict; its console log ($console) ends:"
    tail -60 "$console" | sed 's/^/  | /'
    [ ! -f "$out/results/log" ] || { echo "  last steps:"; tail -15 "$out/results/log" | sed 's/^/  | /'; }
    exit 1
  fi
  wait "$qemu_pid" 2>/dev/null || true; qemu_pid=""
  guest_tick
  if [ -n "$cut" ] && [ -f "$out/results/powercut" ] && grep -q "^cut_boot=$boot " "$out/results/powercut"; then
    # shellcheck source=/dev/null # written by power_cut above
    echo "system: boot $boot: power cut $(( $(date +%s) - t_boot )) s after it began, at: $(. "$out/results/powercut"; echo "${cut_line:-}")"
  elif [ -f "$out/results/reboot" ] && [ ! -f "$out/results/exit-status" ]; then
    echo "system: boot $boot: the guest rebooted after $(( $(date +%s) - t_boot )) s"
  else
    break
  fi
  cut=""
  if [ -f "$out/results/reboot" ]; then
    read -r what re <"$out/results/reboot" || true
    rm -f "$out/results/reboot"
    [ "$what" != cut ] || cut=$re
  fi
  [ "$boot" -lt 8 ] || { echo "system: FAILED: the guest asked for a ninth boot"; exit 1; }
done
echo "system: guest ran $(( $(date +%s) - start )) s"
if [ ! -f "$out/results/exit-status" ]; then
  echo "system: FAILED: the guest powered off without finishing; its console log ($console) ends:"
  tail -60 "$console" | sed 's/^/  | /'
  exit 1
fi
rc=$(cat "$out/results/exit-status")
[ "$rc" = 0 ] || { echo "system: FAILED (guest status $rc; logs in $out)"; exit 1; }
echo "system: ok"
