# shellcheck shell=bash disable=SC2034 # only, cmd, swtpm_pid, qemu_args, ... are for the scripts that source this
# Sourced by scripts/vm-test.sh and scripts/system-test.sh (from the repository root): the options both take, the programs (data/programs), and what both qemu
# guests (TCG) are made of and run with: Debian's kernel, a busybox initramfs, a software TPM, the qemu options they share,
# and the watch that stops a guest which makes no progress (a slow one is left alone).

# shellcheck source=scripts/lib/programs.sh
. scripts/lib/programs.sh

# guest_args USAGE OWN ARG...: the options both guest tests take, --only NAME,... and --cmd CMD
# (into only and cmd) and --no-deps (skip_deps); every other argument goes, in order, to the
# script's function OWN, which returns non-zero for one it does not know: USAGE is printed then.
guest_args() {
  local usage=$1 own=$2
  shift 2
  while [ $# -gt 0 ]; do
    case $1 in
      --only | --cmd)
        [ $# -ge 2 ] || { echo "$usage" >&2; exit 2; }
        if [ "$1" = --only ]; then only=$2; else cmd=$2; fi
        shift ;;
      --no-deps) skip_deps=1 ;;
      *) "$own" "$1" || { echo "$usage" >&2; exit 2; } ;;
    esac
    shift
  done
}

# guest_workdir NAME: TARGET/NAME made if missing (TARGET: CARGO_TARGET_DIR, else target/), where a
# guest test keeps what outlives a run; then the host's packages unless --no-deps. Sets target.
guest_workdir() {
  target=$(realpath -m "${CARGO_TARGET_DIR:-target}")
  mkdir -p "$target/$1"
  [ -n "$skip_deps" ] || bash scripts/deps.sh
}

# guest_kernel DIR: Debian's kernel (the archive's linux-image-amd64), its package unpacked once into
# DIR/root and kept there (installing it would run a slow postinst for nothing). Both tests pass the
# same DIR, so it is fetched once. Sets kroot and kver.
guest_kernel() {
  local dir=$1 pkg
  kroot=$dir/root
  mkdir -p "$dir"
  exec 8>"$dir.lock"
  flock 8 # the system test may fetch it while vm-test does
  if ! ls "$kroot"/boot/vmlinuz-* >/dev/null 2>&1; then
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-6/ {print $2; exit}')
    if [ -z "$pkg" ]; then
      apt-get update -qq
      pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-6/ {print $2; exit}')
    fi
    [ -n "$pkg" ] || { echo "no linux-image-6.* package found in the apt lists" >&2; return 1; }
    rm -rf "$dir/dl" "$kroot.tmp"; mkdir -p "$dir/dl"
    (cd "$dir/dl" && { apt-get download -q "$pkg" 2>&1 | grep -v '^W: Download is performed unsandboxed' || true; })
    dpkg-deb -x "$dir"/dl/"$pkg"_*.deb "$kroot.tmp"
    rm -rf "$dir/dl"
    mv "$kroot.tmp" "$kroot"
  fi
  # shellcheck disable=SC2012 # one directory, named by the kernel's version
  kver=$(ls "$kroot/lib/modules" | head -1)
  [ -f "$kroot/lib/modules/$kver/modules.dep" ] || depmod -b "$kroot" "$kver"
  exec 8>&-
}

# guest_initramfs OUT INIT MODULE...: a gzip'd cpio at OUT with static busybox, INIT as /init and
# the modules with everything they need, in load order, listed in /modules.list. Needs guest_kernel.
guest_initramfs() {
  local out=$1 init=$2 ird ko; shift 2
  ird=$(mktemp -d)
  mkdir -p "$ird"/{bin,proc,sys,dev,mod}
  cp /bin/busybox "$ird/bin/busybox"
  cp "$init" "$ird/init"
  modprobe -d "$kroot" -S "$kver" --show-depends -a "$@" | awk '$1 == "insmod" {print $2}' | awk '!seen[$0]++' |
    while read -r ko; do
      cp "$ko" "$ird/mod/"; echo "/mod/$(basename "$ko")"
    done >"$ird/modules.list"
  (cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) >"$out"
  rm -rf "$ird"
}

# guest_swtpm DIR: a software TPM for the guest, its state in DIR (fresh, or an earlier boot's),
# its socket DIR/sock; it ends when qemu closes the connection. Sets swtpm_pid.
guest_swtpm() {
  mkdir -p "$1"
  rm -f "$1/sock" # an earlier boot's (the state is kept: the same TPM after a reboot)
  swtpm socket --tpm2 --tpmstate dir="$1" --ctrl type=unixio,path="$1/sock" --terminate --log file="$1/log" &
  swtpm_pid=$!
  for _ in $(seq 100); do [ -S "$1/sock" ] && return 0; sleep 0.1; done
  echo "swtpm did not start (see $1/log)" >&2
  return 1
}

# guest_qemu_args TPM_DIR: sets the array qemu_args, what both guests run with: TCG on both cores,
# no display and no default devices, the TPM of guest_swtpm as tpm-tis (the guest's /dev/tpmrm0).
guest_qemu_args() {
  # shellcheck disable=SC2054 # qemu's option values are comma lists
  qemu_args=(-accel tcg,thread=multi -cpu max -smp 2 -nographic -no-reboot -nodefaults
    -chardev socket,id=chrtpm,path="$1/sock" -tpmdev emulator,id=tpm0,chardev=chrtpm -device tpm-tis,tpmdev=tpm0)
}

# guest_watch PID STALL LIMIT FILE...: until the qemu process PID ends. Progress is any FILE
# growing; with none for STALL seconds, or still running after LIMIT seconds (0: no limit), the
# guest is stopped and guest_verdict says why (empty when it ended by itself). Calls the function
# guest_tick, when defined, every round (to show what the guest wrote).
guest_watch() {
  local pid=$1 stall=$2 limit=$3 start now size seen=-1 since f
  shift 3
  start=$(date +%s) since=$start guest_verdict=""
  while kill -0 "$pid" 2>/dev/null; do
    sleep 2
    size=0
    for f in "$@"; do size=$((size + $(stat -c %s "$f" 2>/dev/null || echo 0))); done
    now=$(date +%s)
    if [ "$size" != "$seen" ]; then seen=$size since=$now; fi
    if declare -F guest_tick >/dev/null; then guest_tick || true; fi
    if [ $((now - since)) -ge "$stall" ]; then guest_verdict="no progress for $stall s"; break; fi
    if [ "$limit" -gt 0 ] && [ $((now - start)) -ge "$limit" ]; then guest_verdict="still running after $limit s"; break; fi
  done
  if [ -n "$guest_verdict" ]; then kill "$pid" 2>/dev/null || true; fi
}
