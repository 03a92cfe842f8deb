#!/usr/bin/env bash
# Installs every system package the build, the tests and the demo need. Idempotent.
# --demo: only what the demos (try.sh, try-dbus.sh) need: they build the command and the service
# alone (cargo build -p dirseal-cli / -p dirsealed), which compile against no C library's headers,
# so no development package; no test tools (swtpm, pamtester, fscrypt, ...), no VM or system-test
# packages and no qemu.
# --gui: the demos' packages and the desktop app's (its build and scripts/gui-test.sh) only.
set -euo pipefail
cd "$(dirname "$0")/.."
demo='' gui=''
case ${1:-} in --demo) demo=1 ;; --gui) demo=1 gui=1 ;; esac
# The demos: scratch ext4 images, users, a private bus with gdbus and polkit.
pkgs=(dbus libglib2.0-bin polkitd e2fsprogs util-linux passwd python3)
# The desktop app (gui/, docs/gui.md): GTK 4 and libadwaita to build it; to test it
# (scripts/gui-test.sh) an X server, the accessibility bus and its python client, screenshots, and
# the validators of its .desktop and metainfo files.
gui_pkgs=(libgtk-4-dev libadwaita-1-dev pkg-config xvfb at-spi2-core python3-pyatspi python3-gi dbus-x11
          imagemagick desktop-file-utils appstream)
if [ -z "$demo" ] || [ -n "$gui" ]; then pkgs+=("${gui_pkgs[@]}"); fi
if [ -z "$demo" ]; then
  pkgs+=(# Building the whole workspace: the hardware helpers (hw/, package dirseal-hw) link the TPM
         # and FIDO2 libraries, found by pkg-config and bindgen (libclang), and libfido2-sys links
         # libudev, libcrypto and zlib; the PAM module links libpam.
         libtss2-dev libfido2-dev libudev-dev libclang-dev pkg-config libssl-dev zlib1g-dev libpam0g-dev
         # The tests: a software TPM and an independent TPM client, PAM through pamtester, google's
         # fscrypt beside dirseal, xattrs and ACLs in test trees, python's fido2 (pip), benchmarks, age
         # (escrow records opened by the real age, tests/escrow.rs), tang and clevis (tang protectors
         # against a real tangd, their JWEs read by the real clevis, tests/tang.rs).
         swtpm swtpm-tools tpm2-tools pamtester fscrypt acl attr rsync time python3-pip age tang clevis
         # The VM tests (scripts/vm-test.sh): guest userland comes from the host root over 9p.
         busybox-static dmsetup f2fs-tools kmod cpio zstd
         # The system test (scripts/system-test.sh): its guest's root filesystem.
         mmdebstrap
         # scripts/lint.sh: the scripts and the .deb.
         shellcheck lintian)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# qemu-system-x86 must match the image's qemu-utils from bookworm-backports (bookworm's 7.2 is refused).
# The suite is added through a private source list and list dir; the machine's own sources stay as
# they are.
if [ -z "$demo" ] && ! command -v qemu-system-x86_64 >/dev/null; then
  apt_dir=$(realpath -m "${CARGO_TARGET_DIR:-target}/vm/apt")
  mkdir -p "$apt_dir/lists/partial"
  mirror=$(grep -rhoE '^(URIs: *|deb +)https?://[^ ]+/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d/ \
             2>/dev/null | head -1 | sed -E 's/^(URIs: *|deb +)//; s/ *$//') || true
  mirror=${mirror:-http://deb.debian.org/debian}
  {
    cat /etc/apt/sources.list 2>/dev/null || true
    echo "deb $mirror bookworm-backports main"
  } >"$apt_dir/backports.list"
  apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/backports.list" -o "Dir::State::Lists=$apt_dir/lists"
            -o "Dir::Cache::pkgcache=" -o "Dir::Cache::srcpkgcache=")
  echo "installing: qemu-system-x86 (bookworm-backports via $mirror)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get "${apt_opts[@]}" update -qq
  apt-get "${apt_opts[@]}" install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 >/dev/null
fi
