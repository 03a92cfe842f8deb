#!/usr/bin/env bash
# Latency of dirsealed's read-only calls under load (issue 21): CLIENTS clients (default 50) call
# GetStatus in a loop, first on an idle service, then while one user's Argon2 unlock (repeated)
# and another user's conversion run. Prints p50/p99/max per round. The clients are threads of
# service/examples/getstatus_latency.rs, each with its own bus connection. Not a test: its numbers
# go to docs/performance.md. Touches nothing outside its temp dir except two
# throwaway users (removed at the end) and a loop device.
#
# Environment: DIRSEALED=<binary> and LATENCY=<getstatus_latency binary> (default: release
# builds), CLIENTS, CALLS (per client, default
# 20), SAMPLE_MIB (conversion's data, default 300), ARGON2_MIB (default 256).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root (loop mounts, kernel keys, test users)" >&2; exit 1; }
clients=${CLIENTS:-50} calls=${CALLS:-20} sample_mib=${SAMPLE_MIB:-300} argon_mib=${ARGON2_MIB:-256}
if [ -n "${DIRSEALED:-}" ]; then
  bin=$DIRSEALED
else
  cargo build --quiet --release -p dirsealed
  bin=$(realpath "${CARGO_TARGET_DIR:-target}/release/dirsealed")
fi
if [ -n "${LATENCY:-}" ]; then
  latency=$LATENCY
else
  cargo build --quiet --release -p dirsealed --example getstatus_latency
  latency=$(realpath "${CARGO_TARGET_DIR:-target}/release/examples/getstatus_latency")
fi
work=$(mktemp -d /tmp/dirseal-bench-dbus.XXXXXX)
chmod 755 "$work"
mnt=$work/mnt loopdev='' bus_pid='' svc_pid='' ua=dsba$$ ub=dsbb$$
cleanup() {
  for p in $svc_pid $bus_pid; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  userdel "$ua" 2>/dev/null || true
  userdel "$ub" 2>/dev/null || true
  umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  if [ -n "$loopdev" ]; then losetup -d "$loopdev" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

sed -e "s|@SOCKET@|$work/bus|" -e "s|@POLICY@|$PWD/data/dbus-1/system.d/org.dirseal.Dirseal1.conf|" \
  service/tests/private-bus.conf > "$work/bus.conf"
dbus-daemon --config-file="$work/bus.conf" --fork --print-pid=3 3>"$work/bus.pid" 2>/dev/null
bus_pid=$(cat "$work/bus.pid")
export DBUS_SYSTEM_BUS_ADDRESS=unix:path=$work/bus

truncate -s $((sample_mib * 2 + 512))M "$work/fs.img"
mkfs.ext4 -q -F -O encrypt "$work/fs.img"
mkdir "$mnt"
loopdev=$(losetup --find --show "$work/fs.img")
mount "$loopdev" "$mnt"
for u in "$ua" "$ub"; do
  mkdir "$mnt/$u"
  useradd -M -d "$mnt/$u" -s /usr/sbin/nologin "$u"
  chown "$u:$u" "$mnt/$u"; chmod 700 "$mnt/$u"
done
for i in $(seq 1 "$sample_mib"); do head -c 1M /dev/urandom > "$mnt/$ua/f$i"; done
chown -R "$ua:$ua" "$mnt/$ua"

printf '[argon2]\ntime_cost = 3\nmemory_kib = %d\nparallelism = 1\n' $((argon_mib * 1024)) > "$work/config.toml"
chmod 600 "$work/config.toml"
"$bin" --config "$work/config.toml" --keystore "$work/keystore" --run-dir "$work/run" 2>"$work/dirsealed.log" &
svc_pid=$!
for _ in $(seq 100); do
  busctl --system introspect org.dirseal.Dirseal1 /org/dirseal/Dirseal1 >/dev/null 2>&1 && break
  sleep 0.1
done
as() { setpriv --reuid="$1" --regid="$1" --clear-groups -- "${@:2}"; }
call() { gdbus call --system --dest org.dirseal.Dirseal1 --object-path /org/dirseal/Dirseal1 --method "org.dirseal.Dirseal1.$1" "${@:2}"; }
# Bob's home: encrypted (one Argon2 run), the target of the GetStatus calls and of the unlocks.
as "$ub" bash -c "$(declare -f call); call Encrypt \"'$mnt/$ub'\" \"''\" '@h 3' 3<<<'pw-b'" >/dev/null

round() {
  "$latency" "$mnt/$ub" "$clients" "$calls" | sort -n | awk -v name="$1" '{ a[NR] = $1 } END {
    printf "%-28s %5d calls  p50 %6.1f ms  p99 %6.1f ms  max %6.1f ms\n", name, NR,
      a[int(NR * 0.50)] / 1e6, a[int(NR * 0.99)] / 1e6, a[NR] / 1e6 }'
}
echo "dirsealed: $bin; $clients clients x $calls GetStatus; Argon2 ${argon_mib} MiB; conversion of ${sample_mib} MiB"
round "idle"

# Load: bob unlocks over and over (lock, unlock: one Argon2 each), alice converts her home.
(
  while [ ! -e "$work/stop" ]; do
    as "$ub" bash -c "$(declare -f call); call Lock \"'$mnt/$ub'\" false >/dev/null; call Unlock \"'$mnt/$ub'\" \"''\" '@h 3' 3<<<'pw-b' >/dev/null"
  done
) &
unlocker=$!
job=$(as "$ua" bash -c "$(declare -f call); call Convert \"'$mnt/$ua'\" '@h 3' \"{'mode': <'copy'>}\" 3<<<'pw-a'" | cut -d"'" -f2)
sleep 1
round "Argon2 unlock + conversion"
state=$(gdbus call --system --dest org.dirseal.Dirseal1 --object-path "$job" \
  --method org.freedesktop.DBus.Properties.Get org.dirseal.Dirseal1.Job State | cut -d"'" -f2)
touch "$work/stop"
wait "$unlocker" 2>/dev/null || true
echo "the conversion was still running at the end of the loaded round: $( [ "$state" = running ] && echo yes || echo "no ($state): use a larger SAMPLE_MIB")"
echo "unlocks during the round: $(grep -c 'Unlock(.*: ok' "$work/dirsealed.log")"
