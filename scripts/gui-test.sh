#!/usr/bin/env bash
# The desktop app (dirseal-settings, docs/gui.md) driven as a person would: a real window under
# Xvfb, the real dirsealed on a private system bus, a scratch ext4 holding a throwaway user's home.
# scripts/gui/driver.py clicks and types through the accessibility tree (AT-SPI) by the controls'
# names, as that user, and checks the window's text against the service's own answers; each
# scenario saves a screenshot. Needs root (loop mount, a user, kernel keys).
#
# Environment: BIN_DIR=<dir> takes dirseal, dirsealed and dirseal-settings from there instead of
# building them; OUT=<dir> keeps the screenshots there (default: a fresh directory, kept);
# SAMPLE_MIB (default 40) and SAMPLE_FILES (default 12000: small files make the copy last long
# enough for the cancel scenario to press Cancel while it runs) size the home.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "scripts/gui-test.sh must run as root (loop mounts, a test user, kernel keys)" >&2; exit 1; }
bash scripts/deps.sh --gui
# The app's desktop entry and AppStream metainfo, as software centres read them.
desktop-file-validate data/org.dirseal.Settings.desktop
appstreamcli validate --no-net --pedantic data/org.dirseal.Settings.metainfo.xml >/dev/null ||
  { appstreamcli validate --no-net data/org.dirseal.Settings.metainfo.xml; exit 1; }
if [ -z "${BIN_DIR:-}" ]; then
  cargo build --quiet -p dirsealed -p dirseal-cli -p dirseal-settings
  BIN_DIR=${CARGO_TARGET_DIR:-target}/debug
fi
bin_dir=$(realpath "$BIN_DIR")
for f in dirseal dirsealed dirseal-settings; do
  [ -x "$bin_dir/$f" ] || { echo "gui-test: $bin_dir/$f is missing (cargo build -p dirseal-cli -p dirsealed -p dirseal-settings)" >&2; exit 1; }
done
sample_mib=${SAMPLE_MIB:-40} sample_files=${SAMPLE_FILES:-12000}
out=${OUT:-$(mktemp -d /tmp/dirseal-gui-shots.XXXXXX)}
mkdir -p "$out"

work=$(mktemp -d /tmp/dirseal-gui.XXXXXX)
chmod 755 "$work"
mnt=$work/mnt loopdev='' bus_pid='' svc_pid='' x_pid='' user=dsgui$$
cleanup() {
  for p in $svc_pid $x_pid $bus_pid; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # The accessibility bus and its registry (the session's, started for the user) end with the
  # session bus, a moment after the driver: userdel refuses a user who still runs something.
  for _ in $(seq 50); do pgrep -u "$user" >/dev/null 2>&1 || break; sleep 0.1; done
  for p in $(pgrep -u "$user" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
  userdel "$user" 2>/dev/null || { sleep 1; userdel "$user" 2>/dev/null; } || echo "gui-test: could not remove user $user" >&2
  umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  if [ -n "$loopdev" ]; then losetup -d "$loopdev" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

# A private system bus with the shipped policy, as scripts/try-dbus.sh and service/tests/dbus.rs.
sed -e "s|@SOCKET@|$work/bus|" -e "s|@POLICY@|$PWD/data/dbus-1/system.d/org.dirseal.Dirseal1.conf|" \
  service/tests/private-bus.conf > "$work/bus.conf"
dbus-daemon --config-file="$work/bus.conf" --fork --print-pid=3 3>"$work/bus.pid" 2>/dev/null
bus_pid=$(cat "$work/bus.pid")
export DBUS_SYSTEM_BUS_ADDRESS=unix:path=$work/bus

# The scratch ext4 and the user's home on it, with data enough to watch a progress bar move.
truncate -s 512M "$work/fs.img"
mkfs.ext4 -q -F -O encrypt -N 65536 "$work/fs.img"
mkdir "$mnt"
loopdev=$(losetup --find --show "$work/fs.img")
mount "$loopdev" "$mnt"
home=$mnt/$user
mkdir "$home"
useradd -M -d "$home" -s /bin/sh "$user"
mkdir -p "$home/Documents" "$home/Pictures"
for i in $(seq 1 "$sample_mib"); do head -c 1M /dev/urandom > "$home/Pictures/photo-$i.jpg"; done
[ "$sample_files" -gt 0 ] && head -c $((sample_files * 4096)) /dev/urandom | split -b 4096 -a 5 -d - "$home/Documents/note-"
echo "dear diary" > "$home/Documents/diary.txt"
chown -R "$user:$user" "$home"; chmod 700 "$home"

# The service, its config and keystore in the scratch directory (a cheap Argon2: tests, not users).
printf '[argon2]\ntime_cost = 1\nmemory_kib = 8192\nparallelism = 1\n' > "$work/config.toml"
chmod 600 "$work/config.toml"
"$bin_dir/dirsealed" --config "$work/config.toml" --keystore "$work/keystore" --run-dir "$work/run" 2>"$work/dirsealed.log" &
svc_pid=$!
for _ in $(seq 100); do
  gdbus introspect --system --dest org.dirseal.Dirseal1 --object-path /org/dirseal/Dirseal1 >/dev/null 2>&1 && break
  kill -0 "$svc_pid" 2>/dev/null || { cat "$work/dirsealed.log" >&2; exit 1; }
  sleep 0.1
done

# An X server of our own; -ac: the driver and the app run as the test user.
Xvfb -displayfd 3 -screen 0 1024x900x24 -ac -nolisten tcp 3>"$work/display" 2>"$work/xvfb.log" &
x_pid=$!
for _ in $(seq 100); do [ -s "$work/display" ] && break; sleep 0.1; done
display=:$(cat "$work/display" 2>/dev/null)
if [ "$display" = : ] || ! kill -0 "$x_pid" 2>/dev/null || [ ! -S "/tmp/.X11-unix/X${display#:}" ]; then
  echo "gui-test: Xvfb did not start" >&2; cat "$work/xvfb.log" >&2; exit 1
fi

# The app must hold nothing open in the home it converts (the service refuses a busy home), so it
# runs from / with HOME and the XDG directories in a scratch directory of the user's, and GTK's
# settings in memory. A desktop session would be logged out of the home for the same reason.
app_home=$work/app-home
install -d -m 700 -o "$user" -g "$user" "$app_home" "$app_home/run"
as_user() { (cd / && setpriv --reuid="$user" --regid="$user" --clear-groups -- "$@"); }
# The display answers the user before the app is started (Xvfb writes its number when it listens).
x_ok=''
for i in $(seq 50); do
  if as_user env -i DISPLAY="$display" /usr/bin/python3 -c 'import gi, sys; gi.require_version("Gdk", "4.0"); from gi.repository import Gdk; sys.exit(Gdk.Display.open(sys.argv[1]) is None)' "$display" 2>>"$work/xprobe.log"; then x_ok=1; break; fi
  echo "probe $i failed" >> "$work/xprobe.log"
  sleep 0.2
done
cat "$work/xprobe.log" >&2 || true
[ -n "$x_ok" ] || { echo "gui-test: display $display does not answer the test user" >&2; cat "$work/xvfb.log" >&2; exit 1; }
chown "$user:$user" "$out"
rc=0 repo=$PWD
as_user env -i \
  PATH=/usr/bin:/bin HOME="$app_home" XDG_RUNTIME_DIR="$app_home/run" XDG_CONFIG_HOME="$app_home/config" \
  XDG_CACHE_HOME="$app_home/cache" XDG_DATA_HOME="$app_home/data" DISPLAY="$display" \
  DBUS_SYSTEM_BUS_ADDRESS="$DBUS_SYSTEM_BUS_ADDRESS" GSETTINGS_BACKEND=memory GDK_BACKEND=x11 \
  GSK_RENDERER=cairo NO_AT_BRIDGE=0 GTK_A11Y=atspi LANG=C.UTF-8 \
  dbus-run-session -- /usr/bin/python3 "$repo/scripts/gui/driver.py" --app "$bin_dir/dirseal-settings" --home "$home" --out "$out" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "gui-test: the driver failed ($rc) on display $display; Xvfb said:" >&2; cat "$work/xvfb.log" >&2; ls -la /tmp/.X11-unix >&2
  echo "dirsealed's log:" >&2
  tail -20 "$work/dirsealed.log" >&2
  exit "$rc"
fi

# What the window said after the encryption, against the CLI as root (its own reading of the
# keystore the service used).
status=$(DIRSEAL_KEYSTORE=$work/keystore DIRSEAL_CONFIG=$work/config.toml "$bin_dir/dirseal" status --json "$home")
python3 - "$out/overview-encrypted.json" "$status" <<'PY'
import json, sys
shown = json.load(open(sys.argv[1]))
cli = json.loads(sys.argv[2])
cli = cli[0] if isinstance(cli, list) else cli
assert cli["encrypted"] is True, cli
assert shown["Encryption"] == "Encrypted", shown
key = {"unlocked": "Unlocked", "locked": "Locked"}.get(cli.get("key"), cli.get("key"))
assert shown["Lock"] == key, (shown, cli.get("key"))
assert shown["Recovery key"] == ("Present" if cli.get("recovery_key") else "None"), (shown, cli)
PY
echo "screenshots: $out"
echo "gui: $(cat "$out/scenarios") scenarios ok"
