#!/usr/bin/env bash
# Installs (or with --uninstall removes) the whole product: the dirseal CLI, the D-Bus service
# dirsealed with its unit, bus policy and activation file, the PAM module and its pam-config
# profile, the autologin check run before display managers (dirseal-autologin.service, enabled),
# man pages and shell completions. --with-gui adds the desktop app dirseal-settings ("Encryption",
# docs/gui.md) with its .desktop file, AppStream metainfo and icon; without it nothing of GTK is
# built or installed (servers and handhelds without a desktop).
#
#   sudo scripts/install.sh [--with-gui] [--prefix /usr] [--destdir DIR] [--build-dir target/release]
#   sudo scripts/install.sh --uninstall [--prefix /usr] [--destdir DIR]
#
# Files that only one place is read from go there whatever the prefix: the PAM module into the
# multiarch security dir, the profile into /usr/share/pam-configs, the bus policy into
# /usr/share/dbus-1/system.d, the polkit action into /usr/share/polkit-1/actions. Every file and
# every directory the install created is recorded in PREFIX/share/dirseal/install-manifest, and
# --uninstall removes exactly those, so the system is left as before. A file that was already there
# (not from an earlier install) is copied to PREFIX/share/dirseal/backup first and put back by
# --uninstall. Never removed: the keystore and config (/var/lib/dirseal, /etc/dirseal), which hold
# the only keys to encrypted data.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/lib/programs.sh
. scripts/lib/programs.sh

prefix=/usr destdir='' build='' uninstall=0 gui=0
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) prefix=${2:?--prefix needs a directory}; shift 2 ;;
    --prefix=*) prefix=${1#*=}; shift ;;
    --destdir) destdir=${2:?--destdir needs a directory}; shift 2 ;;
    --destdir=*) destdir=${1#*=}; shift ;;
    --build-dir) build=${2:?--build-dir needs a directory}; shift 2 ;;
    --build-dir=*) build=${1#*=}; shift ;;
    --uninstall) uninstall=1; shift ;;
    --with-gui) gui=1; shift ;;
    -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case $prefix in /*) ;; *) echo "install.sh: --prefix must be absolute" >&2; exit 2 ;; esac
if [ -n "$destdir" ]; then destdir=$(realpath -m "$destdir"); fi
if [ -z "$destdir" ] && [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: installing into the system needs root (or pass --destdir DIR)" >&2; exit 1
fi

multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch 2>/dev/null || echo "$(uname -m)-linux-gnu")
manifest_rel=$prefix/share/dirseal/install-manifest
manifest=$destdir$manifest_rel
backup_rel=$prefix/share/dirseal/backup

live() { [ -z "$destdir" ]; }

if [ "$uninstall" = 1 ]; then
  [ -f "$manifest" ] || { echo "install.sh: no install manifest at $manifest; nothing to uninstall" >&2; exit 1; }
  # Backing out PAM first: removing a module the stack still names would break logins. The .deb's
  # prerm does the same (scripts/lib/pam-backout.sh): refused while PIN-login accounts have no
  # password, else every dirseal profile disabled.
  if live; then
    # shellcheck source=scripts/lib/pam-backout.sh
    . scripts/lib/pam-backout.sh
    dirseal_pam_backout "dirseal (install.sh --uninstall)" ||
      { echo "install.sh: nothing was removed" >&2; exit 1; }
  fi
  if live && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl stop dirsealed.service 2>/dev/null || true
  fi
  # The autologin check's drop-ins and runtime copies go before the binary that knows them.
  if [ "$(id -u)" -eq 0 ] && [ -x "$destdir$prefix/sbin/dirseal" ]; then
    "$destdir$prefix/sbin/dirseal" autologin clear --root "${destdir:-/}" >/dev/null ||
      echo "install.sh: could not remove dirseal's autologin drop-ins (dirseal autologin clear)" >&2
  fi
  # Files first, then directories deepest first (only if empty: something else may live there).
  created=$(grep '^d ' "$manifest.dirs" 2>/dev/null | cut -c3- | sort -r || true)
  restore=$(grep '^b ' "$manifest" | cut -c3- || true)
  grep '^f ' "$manifest" | cut -c3- | while IFS= read -r f; do rm -f -- "$destdir$f"; done
  # What was there before the install goes back.
  while IFS= read -r f; do
    [ -z "$f" ] || mv -f -- "$destdir$backup_rel$f" "$destdir$f" ||
      echo "install.sh: could not restore $f from $destdir$backup_rel$f" >&2
  done <<< "$restore"
  rm -rf -- "$destdir$backup_rel"
  rm -f -- "$manifest" "$manifest.dirs"
  while IFS= read -r d; do
    [ -n "$d" ] && { rmdir -- "$destdir$d" 2>/dev/null || true; }
  done <<< "$created"
  if live && command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then systemctl daemon-reload || true; fi
  if live && command -v systemctl >/dev/null && systemctl is-active --quiet dbus 2>/dev/null; then systemctl reload dbus || true; fi
  echo "uninstalled dirseal from ${destdir:-/} (kept: /etc/dirseal and /var/lib/dirseal, the keys to your encrypted data)"
  exit 0
fi

if [ -z "$build" ]; then
  # The desktop app links GTK 4: built only when asked for.
  if [ "$gui" = 1 ]; then cargo build --release --workspace --quiet
  else cargo build --release --workspace --exclude dirseal-settings --quiet; fi
  build=target/release
fi
for f in $(programs); do
  [ -f "$build/$f" ] || { echo "install.sh: $build/$f is missing; build the workspace first (cargo build --release --workspace)" >&2; exit 1; }
done
if [ "$gui" = 1 ] && [ ! -f "$build/dirseal-settings" ]; then
  echo "install.sh: $build/dirseal-settings is missing; build it first (cargo build --release -p dirseal-settings)" >&2; exit 1
fi

# The man pages and completions build.rs wrote beside the binaries when it built dirseal.
gen=$build/dirseal-docs
[ -f "$gen/man/dirseal.8" ] || { echo "install.sh: $gen is missing; build.rs writes it when it builds dirseal (cargo build --release -p dirseal-cli)" >&2; exit 1; }
docs=$(mktemp -d)
trap 'rm -rf "$docs"' EXIT

if [ -n "$destdir" ]; then mkdir -p "$destdir"; fi
files=()
# An earlier install's files are ours to overwrite; the directories it created and the files it
# backed up stay recorded.
old_manifest=$(cat "$manifest" 2>/dev/null || true)
mapfile -t backups < <(grep '^b ' <<<"$old_manifest" | cut -c3-)
mapfile -t dirs < <(grep '^d ' "$manifest.dirs" 2>/dev/null | cut -c3-)
# mkdir -p that records each directory it creates.
mkdirs() {
  local d=$1 missing=()
  while [ "$d" != / ] && [ ! -d "$destdir$d" ]; do missing+=("$d"); d=$(dirname "$d"); done
  for ((i=${#missing[@]}-1; i>=0; i--)); do
    mkdir -m 755 "$destdir${missing[i]}"
    dirs+=("${missing[i]}")
  done
}
# put MODE SOURCE DEST (DEST without destdir)
put() {
  mkdirs "$(dirname "$3")"
  if [ -e "$destdir$3" ] && ! grep -qxF "f $3" <<<"$old_manifest" && [ ! -e "$destdir$backup_rel$3" ]; then
    mkdirs "$backup_rel"
    mkdir -p "$(dirname "$destdir$backup_rel$3")"
    cp -a -- "$destdir$3" "$destdir$backup_rel$3"
    backups+=("$3")
  fi
  install -m "$1" "$2" "$destdir$3"
  files+=("$3")
}

# Every program as data/programs says; the hardware helpers, the only binaries that link libtss2-*
# and libfido2 (docs/architecture.md), go to PREFIX/libexec: dirseal finds them there, never
# through PATH.
for f in $(programs); do
  read -r mode dest < <(program_line "$f")
  put "$mode" "$build/$f" "$dest"
done
put 644 data/pam-configs/dirseal /usr/share/pam-configs/dirseal
put 644 data/pam-configs/dirseal-pin /usr/share/pam-configs/dirseal-pin
put 644 data/pam-configs/dirseal-mkhome /usr/share/pam-configs/dirseal-mkhome
put 644 data/dbus-1/system.d/org.dirseal.Dirseal1.conf /usr/share/dbus-1/system.d/org.dirseal.Dirseal1.conf
put 644 data/dbus-1/system-services/org.dirseal.Dirseal1.service "$prefix/share/dbus-1/system-services/org.dirseal.Dirseal1.service"
put 644 data/org.dirseal.Dirseal1.xml "$prefix/share/dbus-1/interfaces/org.dirseal.Dirseal1.xml"
put 644 data/polkit-1/actions/org.dirseal.Dirseal1.policy /usr/share/polkit-1/actions/org.dirseal.Dirseal1.policy
unit=$docs/dirsealed.service
sed "s|/usr/libexec/dirsealed|$prefix/libexec/dirsealed|" data/systemd/dirsealed.service > "$unit"
put 644 "$unit" "$prefix/lib/systemd/system/dirsealed.service"
unit=$docs/dirseal-autologin.service
sed "s|/usr/sbin/dirseal|$prefix/sbin/dirseal|" data/systemd/dirseal-autologin.service > "$unit"
put 644 "$unit" "$prefix/lib/systemd/system/dirseal-autologin.service"
# Enabled (its [Install] line by hand, so the link is in the manifest and --uninstall removes it):
# it runs at every boot before the display manager, and does nothing where no autologin is set.
wants=/etc/systemd/system/graphical.target.wants
mkdirs "$wants"
ln -sfn "$prefix/lib/systemd/system/dirseal-autologin.service" "$destdir$wants/dirseal-autologin.service"
files+=("$wants/dirseal-autologin.service")
# Network-bound unlock at boot: installed, not enabled (opt-in, docs/fleet.md).
unit=$docs/dirseal-unlock-boot.service
sed "s|/usr/sbin/dirseal|$prefix/sbin/dirseal|" data/systemd/dirseal-unlock-boot.service > "$unit"
put 644 "$unit" "$prefix/lib/systemd/system/dirseal-unlock-boot.service"
# The boot-time run of conversions scheduled with --at-next-boot, enabled the same way; its
# condition keeps it from starting while nothing is scheduled.
unit=$docs/dirseal-convert-boot.service
sed "s|/usr/sbin/dirseal|$prefix/sbin/dirseal|" data/systemd/dirseal-convert-boot.service > "$unit"
put 644 "$unit" "$prefix/lib/systemd/system/dirseal-convert-boot.service"
for target in graphical multi-user; do
  mkdirs "/etc/systemd/system/$target.target.wants"
  ln -sfn "$prefix/lib/systemd/system/dirseal-convert-boot.service" "$destdir/etc/systemd/system/$target.target.wants/dirseal-convert-boot.service"
  files+=("/etc/systemd/system/$target.target.wants/dirseal-convert-boot.service")
done
for m in "$gen"/man/*.8; do put 644 "$m" "$prefix/share/man/man8/$(basename "$m")"; done
put 644 "$gen/completions/dirseal.bash" "$prefix/share/bash-completion/completions/dirseal"
put 644 "$gen/completions/_dirseal" "$prefix/share/zsh/vendor-completions/_dirseal"
put 644 "$gen/completions/dirseal.fish" "$prefix/share/fish/vendor_completions.d/dirseal.fish"
if [ "$gui" = 1 ]; then
  put 755 "$build/dirseal-settings" "$prefix/bin/dirseal-settings"
  put 644 data/org.dirseal.Settings.desktop "$prefix/share/applications/org.dirseal.Settings.desktop"
  put 644 data/org.dirseal.Settings.metainfo.xml "$prefix/share/metainfo/org.dirseal.Settings.metainfo.xml"
  put 644 data/org.dirseal.Settings.svg "$prefix/share/icons/hicolor/scalable/apps/org.dirseal.Settings.svg"
  put 644 data/dirseal-settings.1 "$prefix/share/man/man1/dirseal-settings.1"
fi
# The config dir: root-only, kept on uninstall (it may hold the calibrated cost and settings).
if [ ! -d "$destdir/etc/dirseal" ]; then mkdirs /etc; install -d -m 700 "$destdir/etc/dirseal"; fi

mkdirs "$(dirname "$manifest_rel")"
printf 'f %s\n' "${files[@]}" > "$manifest"
printf 'f %s\n' "$manifest_rel" >> "$manifest"
{ [ ${#backups[@]} -eq 0 ] || printf 'b %s\n' "${backups[@]}"; } >> "$manifest"
{ [ ${#dirs[@]} -eq 0 ] || printf 'd %s\n' "${dirs[@]}"; } > "$manifest.dirs"

if live; then
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then systemctl daemon-reload; fi
  if command -v systemctl >/dev/null && systemctl is-active --quiet dbus 2>/dev/null; then systemctl reload dbus; fi
fi
echo "installed dirseal into ${destdir:-/} (prefix $prefix): ${#files[@]} files"
[ ${#backups[@]} -eq 0 ] || echo "kept a copy of ${#backups[@]} file(s) that were already there in $backup_rel; --uninstall puts them back"
echo "next: enable login unlocking with \`sudo pam-auth-update --enable dirseal\` (keep a root shell open while you try a login)"
