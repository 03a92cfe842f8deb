#!/usr/bin/env bash
# The D-Bus service in two minutes: a private system bus with the shipped policy, dirsealed on it,
# a scratch ext4 with a sample home owned by a throwaway user, and that user converting their own
# home through gdbus while the Progress signals scroll by. Then a status call, and one call for
# someone else's directory, which is refused. Touches nothing outside its temp dir except the
# throwaway user (removed at the end) and a loop device.
#
# Environment: DIRSEALED=<binary> uses that dirsealed instead of building one (the test suite runs
# the demo so); SAMPLE_MIB (default 40) and SAMPLE_FILES (default 3000) size the sample home.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root: sudo scripts/try-dbus.sh (loop mounts, kernel keys, a test user)" >&2; exit 1; }
# Bold headings on a terminal only: a pipe or a log gets plain text.
if [ -t 1 ]; then step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }; else step() { printf '\n== %s\n' "$*"; }; fi
sample_mib=${SAMPLE_MIB:-40} sample_files=${SAMPLE_FILES:-3000}
bash scripts/deps.sh --demo
if [ -n "${DIRSEALED:-}" ]; then
  bin=$DIRSEALED
else
  step "building dirsealed (cargo build --release; the first build takes several minutes)"
  cargo build --release -p dirsealed
  bin=$(realpath "${CARGO_TARGET_DIR:-target}/release/dirsealed")
fi

work=$(mktemp -d /tmp/dirseal-try-dbus.XXXXXX)
chmod 755 "$work"
mnt=$work/mnt loopdev='' bus_pid='' svc_pid='' mon_pid='' user=dstry$$
cleanup() {
  for p in $mon_pid $svc_pid $bus_pid; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  userdel "$user" 2>/dev/null || true
  umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  if [ -n "$loopdev" ]; then losetup -d "$loopdev" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

step "a private system bus with the shipped policy (data/dbus-1/system.d/org.dirseal.Dirseal1.conf)"
sed -e "s|@SOCKET@|$work/bus|" -e "s|@POLICY@|$PWD/data/dbus-1/system.d/org.dirseal.Dirseal1.conf|" \
  service/tests/private-bus.conf > "$work/bus.conf"
dbus-daemon --config-file="$work/bus.conf" --fork --print-pid=3 3>"$work/bus.pid" 2>/dev/null
bus_pid=$(cat "$work/bus.pid")
export DBUS_SYSTEM_BUS_ADDRESS=unix:path=$work/bus
echo "DBUS_SYSTEM_BUS_ADDRESS=$DBUS_SYSTEM_BUS_ADDRESS"

step "scratch ext4 (encrypt feature) with a sample home for user $user"
truncate -s 512M "$work/fs.img"
mkfs.ext4 -q -F -O encrypt "$work/fs.img"
mkdir "$mnt"
loopdev=$(losetup --find --show "$work/fs.img")
mount "$loopdev" "$mnt"
home=$mnt/$user
mkdir "$home"
useradd -M -d "$home" -s /usr/sbin/nologin "$user"
mkdir -p "$home/Documents" "$home/Saves"
for i in $(seq 1 "$sample_mib"); do head -c 1M /dev/urandom > "$home/Saves/slot-$i.sav"; done
# Many small files too: they make the copy take long enough to show its progress.
[ "$sample_files" -gt 0 ] && head -c $((sample_files * 4096)) /dev/urandom | split -b 4096 -a 5 -d - "$home/Documents/note-"
echo "dear diary" > "$home/Documents/diary.txt"
chown -R "$user:$user" "$home"; chmod 700 "$home"
echo "$(du -sh "$home" | cut -f1) in $(find "$home" -type f | wc -l) files"

step "dirsealed on the private bus (its own config and keystore)"
printf '[argon2]\ntime_cost = 2\nmemory_kib = 65536\nparallelism = 1\n' > "$work/config.toml"
chmod 600 "$work/config.toml"
"$bin" --config "$work/config.toml" --keystore "$work/keystore" --run-dir "$work/run" 2>"$work/dirsealed.log" &
svc_pid=$!
up=
for _ in $(seq 100); do
  gdbus introspect --system --dest org.dirseal.Dirseal1 --object-path /org/dirseal/Dirseal1 >/dev/null 2>&1 && { up=1; break; }
  kill -0 "$svc_pid" 2>/dev/null || break
  sleep 0.1
done
if [ -z "$up" ]; then
  echo "dirsealed ($bin) did not come up on the bus; its log:" >&2
  cat "$work/dirsealed.log" >&2
  exit 1
fi
echo "its methods (docs/dbus.md):"
gdbus introspect --system --dest org.dirseal.Dirseal1 --object-path /org/dirseal/Dirseal1 |
  sed -n '/interface org.dirseal.Dirseal1 {/,/^  };/p' | grep -oE '^ +[A-Z][A-Za-z0-9]+\(' | tr -d ' (' | xargs | fold -s -w 100

as_user() { setpriv --reuid="$user" --regid="$user" --clear-groups -- "$@"; }
call() { local m=$1; shift; gdbus call --system --dest org.dirseal.Dirseal1 --object-path /org/dirseal/Dirseal1 --method "org.dirseal.Dirseal1.$m" "$@"; }

step "watching job signals (gdbus monitor)"
gdbus monitor --system --dest org.dirseal.Dirseal1 2>/dev/null | grep --line-buffered -E 'Progress|Finished|Failed' &
mon_pid=$!
sleep 0.5

step "$user converts their own home; the password goes over a file descriptor (fd 3)"
echo "+ setpriv --reuid=$user gdbus call ... --method org.dirseal.Dirseal1.Convert \"'$home'\" '@h 3' '{}' 3<<<\"\$PASSWORD\""
job=$(as_user bash -c "$(declare -f call); call Convert \"'$home'\" '@h 3' '{}' 3<<<'correct horse'" | cut -d"'" -f2)
echo "job: $job"
for _ in $(seq 600); do
  state=$(gdbus call --system --dest org.dirseal.Dirseal1 --object-path "$job" \
    --method org.freedesktop.DBus.Properties.Get org.dirseal.Dirseal1.Job State | cut -d"'" -f2)
  [ "$state" = running ] || break
  sleep 0.2
done
sleep 0.3
echo "job state: $state"

step "$user asks for the status of their home"
as_user bash -c "$(declare -f call); call GetStatus \"'$home'\""

step "$user locks it: names become ciphertext"
as_user bash -c "$(declare -f call); call Lock \"'$home'\" false"
# shellcheck disable=SC2012 # the names as a user sees them: ls is the point
ls "$home" | head -3

step "and unlocks it with the password"
as_user bash -c "$(declare -f call); call Unlock \"'$home'\" \"''\" '@h 3' 3<<<'correct horse'"
cat "$home/Documents/diary.txt"

step "$user asks about a directory that is not theirs: refused"
as_user bash -c "$(declare -f call); call GetStatus \"'$mnt'\"" || true

step "the service's log (no secrets in it)"
cat "$work/dirsealed.log"
