#!/usr/bin/env bash
# The newcomer's first command: build dirseal, make a scratch ext4 image with a sample home,
# convert it in place, lock it (ciphertext names), unlock it (plaintext back), clean up.
# Touches nothing outside a temp dir: its own keystore, config and loop device.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root: sudo scripts/try.sh (loop mounts and kernel keys need it)" >&2; exit 1; }
bash scripts/deps.sh --demo
# Bold headings on a terminal only: a pipe or a log gets plain text.
if [ -t 1 ]; then step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }; else step() { printf '\n== %s\n' "$*"; }; fi

# The command alone: the demo needs no hardware helper, nor their development packages (deps.sh).
# Cargo's own progress shows while it builds: the first build takes a minute or more.
step "building dirseal (cargo build --release -p dirseal-cli; the first build takes a minute or more)"
cargo build --release -p dirseal-cli
bin=$(realpath "${CARGO_TARGET_DIR:-target}/release/dirseal")

work=$(mktemp -d /tmp/dirseal-try.XXXXXX)
mnt=$work/mnt
loopdev=
cleanup() {
  umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  if [ -n "$loopdev" ]; then losetup -d "$loopdev" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

export DIRSEAL_KEYSTORE=$work/keystore DIRSEAL_CONFIG=$work/config.toml
# A modest Argon2id cost so the demo is quick; real installs calibrate to ~1 s.
printf '[argon2]\ntime_cost = 2\nmemory_kib = 65536\nparallelism = 1\n' > "$DIRSEAL_CONFIG"
chmod 600 "$DIRSEAL_CONFIG"

step "scratch ext4 with the encrypt feature"
truncate -s 256M "$work/fs.img"
mkfs.ext4 -q -O encrypt "$work/fs.img"
mkdir "$mnt"
loopdev=$(losetup --find --show "$work/fs.img")
mount "$loopdev" "$mnt"

# A sample home owned by an unused uid (nobody is logged in as it, so convert does not refuse).
uid=$(awk -F: 'BEGIN{u=60000} {used[$3]=1} END{while (u in used) u++; print u}' /etc/passwd)
home=$mnt/home/alice
mkdir -p "$home/Documents" "$home/Pictures" "$home/.config/game"
echo "the plan: meet at noon" > "$home/Documents/plan.txt"
head -c 2000000 /dev/urandom > "$home/Pictures/holiday.jpg"
echo "volume=7" > "$home/.config/game/settings.ini"
ln -s Documents/plan.txt "$home/plan-link"
chown -R "$uid:$uid" "$home"
ls -la "$home"

step "dirseal convert $home   (password: demo-password)"
printf 'demo-password\n' | "$bin" convert "$home" --yes --protector-name alice --recovery-key | tee "$work/convert.out"
"$bin" status "$home"

step "dirseal lock: names and contents are ciphertext now"
"$bin" lock "$home"
ls -la "$home" || true
cat "$home/plan-link" 2>&1 || true

step "dirseal unlock: plaintext is back"
echo demo-password | "$bin" unlock "$home"
ls -la "$home"
cat "$home/Documents/plan.txt"

step "lost password? the recovery key printed above opens it too"
"$bin" lock "$home"
key=$(grep -Eo '[0-9]{6}(-[0-9]{6}){7}' "$work/convert.out" | head -1)
echo "$key" | "$bin" unlock --recovery "$home"
cat "$home/Documents/plan.txt"

step "done — everything was in $work and is being removed"
