#!/usr/bin/env bash
# Builds dirseal_VERSION_ARCH.deb with dpkg-deb: the files scripts/install.sh lays out (binaries, PAM
# module and its pam-auth-update profile, bus policy, activation file, unit, polkit action, man
# pages, completions), its dependencies read from the binaries, and maintainer scripts that run
# pam-auth-update. The profile is not enabled by installing the package (it is `Default: no`):
# `pam-auth-update --enable dirseal`, as after install.sh. Removing the package backs all three
# profiles out first, and is refused while PIN-login accounts have no password (docs/pam.md).
# Purging removes /etc/dirseal but keeps the keystore /var/lib/dirseal: it holds the only keys to
# the encrypted homes, and a reinstall opens them again.
#
# With --gui it also builds dirseal-settings_VERSION_ARCH.deb, the desktop app ("Encryption") in a
# package of its own, so that servers and handhelds without a desktop never pull GTK in.
# Prints the path of each package built, one a line, dirseal's first.
#
#   scripts/build-deb.sh [--build-dir target/release] [--out DIR] [--fast] [--gui]
#   --fast: gzip -1 instead of xz (tests: a debug build's package is large and xz takes minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/programs.sh
. scripts/lib/programs.sh
build="" out=$PWD compress=(-Zxz) gui=0
while [ $# -gt 0 ]; do
  case $1 in
    --build-dir) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --fast) compress=(-Zgzip -z1); shift ;;
    --gui) gui=1; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-deb.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
# The desktop app is not in dirseal's package (it would pull GTK onto servers and handhelds).
if [ -z "$build" ]; then
  if [ "$gui" = 1 ]; then cargo build --release --workspace --quiet
  else cargo build --release --workspace --exclude dirseal-settings --quiet; fi
  build=target/release
fi
if [ "$gui" = 1 ] && [ ! -x "$build/dirseal-settings" ]; then
  echo "build-deb.sh: $build/dirseal-settings is missing; build it first (cargo build -p dirseal-settings)" >&2; exit 1
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root=$stage/root
bash scripts/install.sh --destdir "$root" --build-dir "$build" >/dev/null
# dpkg keeps its own file list; the config dir is made by postinst (root-only), removed on purge.
rm -rf "${root:?}/usr/share/dirseal" "${root:?}/etc"
# Debian 12 still reads units from /lib/systemd/system first; /usr/lib is the same directory there.

# What debhelper would do, for the package tree ROOT of package NAME (lintian checks it:
# scripts/test.sh runs lintian on each package).
# dh_strip: the symbols go (a tenth of the size); no -dbgsym package is made. dh_compress: man pages
# gzip'd, without a name or time in the header (reproducible). dh_installdocs, dh_installchangelogs:
# the copyright file and, this being a native package (no Debian revision in the version),
# changelog.gz in Debian's format; the date is the commit's.
maintainer="${DEBFULLNAME:-dirseal maintainers} <${DEBEMAIL:-maintainers@users.noreply.a-seed-00d09919.example}>"
when=$(date -R -u -d "@${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}")
debhelper() { # ROOT NAME
  local root=$1 name=$2 f doc
  find "$root" -type f | while read -r f; do
    [ "$(head -c4 "$f" | tr -d '\177')" = ELF ] || continue
    case $f in
      *.so) strip --remove-section=.comment --remove-section=.note --strip-unneeded "$f" ;;
      *) strip --remove-section=.comment --remove-section=.note "$f" ;;
    esac
  done
  [ ! -d "$root/usr/share/man" ] || find "$root/usr/share/man" -type f ! -name '*.gz' -exec gzip -9n {} +
  doc=$root/usr/share/doc/$name
  install -d "$doc"
  install -m 644 data/debian/copyright "$doc/copyright"
  printf '%s (%s) unstable; urgency=medium\n\n  * Built from %s.\n\n -- %s  %s\n' \
    "$name" "$version" "$(git describe --always --dirty 2>/dev/null || echo "a source tree")" "$maintainer" "$when" |
    gzip -9n >"$doc/changelog.gz"
  chmod 644 "$doc/changelog.gz"
}
# dh_md5sums (what `dpkg --verify` and debsums check the installed files against), then the package.
pack() { # ROOT NAME
  (cd "$1" && find . -type f ! -path './DEBIAN/*' -printf '%P\0' | LC_ALL=C sort -z | xargs -0 md5sum >DEBIAN/md5sums)
  chmod 644 "$1/DEBIAN/md5sums"
  dpkg-deb --root-owner-group "${compress[@]}" --build "$1" "$out/${2}_${version}_${arch}.deb" >/dev/null
  echo "$out/${2}_${version}_${arch}.deb"
}
debhelper "$root" dirseal
install -d "$root/usr/share/lintian/overrides"
install -m 644 data/debian/lintian-overrides "$root/usr/share/lintian/overrides/dirseal"

# The packages that ship the libraries FILES link, one a line.
packages_of() {
  for f in "$@"; do objdump -p "$f" | awk '$1 == "NEEDED" {print $2}'; done | sort -u | while read -r lib; do
    path=$(ldconfig -p | awk -v l="$lib" '$1 == l {print $NF; exit}')
    if [ -n "$path" ]; then
      { dpkg -S "$path" 2>/dev/null || dpkg -S "$(realpath "$path")" 2>/dev/null; } | head -1 | cut -d: -f1 || true
    fi
  done | sort -u
}
# Depends: what the CLI, the service and the PAM module link. Recommends: what only the TPM and
# FIDO2 helpers link (libtss2-*, libfido2 and theirs): without them everything but those two kinds
# works, and the helpers say what to install (docs/architecture.md, "Hardware helpers").
# installed_of ROLE...: where data/programs puts those programs in the package's tree.
installed_of() {
  local f
  for f in $(programs "$@"); do
    (prefix=/usr multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo "$(uname -m)-linux-gnu")
      printf '%s\n' "$root$(program_line "$f" | cut -d' ' -f2)")
  done
}
mapfile -t main < <(installed_of command service pam)
mapfile -t helpers < <(installed_of helper)
depends=$(packages_of "${main[@]}")
recommends=$(packages_of "${helpers[@]}" | grep -vxF -f <(printf '%s\n' "$depends") || true)
deps=$(paste -sd, <<<"$depends" | sed 's/,/, /g')
recs=$({ [ -z "$recommends" ] || printf '%s\n' "$recommends"; echo polkitd; } | paste -sd, | sed 's/,/, /g')
mkdir -p "$root/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<EOF
Package: dirseal
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $size
Depends: $deps, libpam-runtime, dbus
Recommends: $recs
Section: admin
Priority: optional
Description: encrypt existing directories in place with fscrypt, unlock at login
 dirseal converts directories that hold data (home directories) to Linux native
 filesystem encryption (fscrypt v2 on ext4/f2fs) in place, keeps the keys behind
 password, TPM2 and FIDO2 protectors, and unlocks homes at login through its PAM
 module (pam-auth-update --enable dirseal). The D-Bus service dirsealed is
 started on demand.
EOF
cat >"$root/DEBIAN/postinst" <<'EOF'
#!/bin/sh
set -e
if [ "$1" = configure ]; then
  [ -d /etc/dirseal ] || install -d -m 700 /etc/dirseal
  # Registers the profile; it stays off until `pam-auth-update --enable dirseal` (Default: no),
  # and stays on across upgrades once enabled.
  pam-auth-update --package
  if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
  # The autologin check before the display manager (docs/pam.md); it changes nothing where no
  # autologin is configured.
  if command -v systemctl >/dev/null; then systemctl enable dirseal-autologin.service || true; fi
  # Conversions scheduled with --at-next-boot; it starts only while one is scheduled.
  if command -v systemctl >/dev/null; then systemctl enable dirseal-convert-boot.service || true; fi
  if [ -d /run/systemd/system ] && systemctl is-active --quiet dbus; then systemctl reload dbus || true; fi
fi
EOF
# prerm and postrm back PAM out with scripts/lib/pam-backout.sh, as install.sh --uninstall does.
backout=$(grep -v '^# shellcheck' scripts/lib/pam-backout.sh)
{
  printf '#!/bin/sh\nset -e\n%s\n\n' "$backout"
  cat <<'EOF'
if [ "$1" = remove ] || [ "$1" = deconfigure ]; then
  # PAM first: a stack that names a module that is gone breaks every login. Refused while
  # PIN-login accounts would be left without any way in.
  dirseal_pam_backout "the dirseal package"
  if [ -d /run/systemd/system ]; then systemctl stop dirsealed.service 2>/dev/null || true; fi
  # Its drop-ins and runtime copies go while the binary that knows them is still here.
  if command -v systemctl >/dev/null; then systemctl disable dirseal-autologin.service || true; fi
  if command -v systemctl >/dev/null; then systemctl disable dirseal-convert-boot.service || true; fi
  dirseal autologin clear >/dev/null || true
fi
EOF
} >"$root/DEBIAN/prerm"
{
  printf '#!/bin/sh\nset -e\n%s\n\n' "$backout"
  cat <<'EOF'
if [ "$1" = remove ] || [ "$1" = purge ]; then
  if [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
fi
if [ "$1" = purge ]; then
  # prerm disabled the profiles; forgetting them again is harmless and covers a removal forced
  # past a failed prerm (pam-auth-update drops what /usr/share/pam-configs no longer has).
  if command -v pam-auth-update >/dev/null; then
    # shellcheck disable=SC2086 # the list is words
    pam-auth-update --package --remove $DIRSEAL_PAM_PROFILES
  fi
  rm -rf /etc/dirseal
  if [ -d /var/lib/dirseal ]; then
    echo "dirseal: kept /var/lib/dirseal: it holds the only keys to your encrypted directories" >&2
  fi
fi
EOF
} >"$root/DEBIAN/postrm"
chmod 755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"
pack "$root" dirseal

[ "$gui" = 1 ] || exit 0
# The desktop app: what install.sh --with-gui adds to dirseal's files, and nothing else.
full=$stage/full groot=$stage/settings
bash scripts/install.sh --with-gui --destdir "$full" --build-dir "$build" >/dev/null
for f in usr/bin/dirseal-settings usr/share/applications/org.dirseal.Settings.desktop \
         usr/share/metainfo/org.dirseal.Settings.metainfo.xml \
         usr/share/icons/hicolor/scalable/apps/org.dirseal.Settings.svg usr/share/man/man1/dirseal-settings.1; do
  install -D -m "$(stat -c %a "$full/$f")" "$full/$f" "$groot/$f"
done
debhelper "$groot" dirseal-settings
install -D -m 644 data/debian/lintian-overrides-settings "$groot/usr/share/lintian/overrides/dirseal-settings"
gdeps=$(packages_of "$groot/usr/bin/dirseal-settings" | paste -sd, | sed 's/,/, /g')
mkdir -p "$groot/DEBIAN"
cat >"$groot/DEBIAN/control" <<EOF
Package: dirseal-settings
Version: $version
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $(du -sk --exclude=DEBIAN "$groot" | cut -f1)
Depends: dirseal (= $version), $gdeps
Recommends: polkitd
Section: utils
Priority: optional
Description: desktop app to encrypt your home folder in place with dirseal
 "Encryption" shows whether your home folder is encrypted, locked or unlocked,
 what opens it and whether it has a recovery key. One button encrypts it in
 place through the dirseal service (dirsealed), now, in the background while
 you keep working, or at the next boot, with progress you can watch and
 cancel. Usable with touch screens and game controllers.
EOF
pack "$groot" dirseal-settings
