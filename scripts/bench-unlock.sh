#!/usr/bin/env bash
# Unlock and lock latency of dirseal against google's `fscrypt` tool, at the same Argon2id cost,
# on the same scratch ext4. Prints per-operation medians and the dirseal/fscrypt ratios.
# Usage: sudo scripts/bench-unlock.sh [ROUNDS] [ARGON2_TIME] [ARGON2_MEMORY_KIB] [LANES]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root" >&2; exit 1; }
rounds=${1:-10} t=${2:-2} m=${3:-65536} p=${4:-1}
bash scripts/deps.sh >/dev/null
cargo build --quiet --release
bin=$(realpath "${CARGO_TARGET_DIR:-target}/release/dirseal")

work=$(mktemp -d /tmp/dirseal-bench.XXXXXX)
mnt=$work/mnt loopdev='' saved_conf=''
cleanup() {
  umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  if [ -n "$loopdev" ]; then losetup -d "$loopdev" 2>/dev/null || true; fi
  # fscrypt only reads /etc/fscrypt.conf: put back whatever was there.
  if [ -n "$saved_conf" ]; then mv "$saved_conf" /etc/fscrypt.conf; else rm -f /etc/fscrypt.conf; fi
  rm -rf "$work"
}
trap cleanup EXIT
if [ -e /etc/fscrypt.conf ]; then saved_conf=$work/fscrypt.conf.saved; cp -a /etc/fscrypt.conf "$saved_conf"; fi

truncate -s 256M "$work/fs.img"
mkfs.ext4 -q -O encrypt "$work/fs.img"
mkdir "$mnt"
loopdev=$(losetup --find --show "$work/fs.img")
mount "$loopdev" "$mnt"

export DIRSEAL_KEYSTORE=$work/keystore DIRSEAL_CONFIG=$work/config.toml
printf '[argon2]\ntime_cost = %s\nmemory_kib = %s\nparallelism = %s\n' "$t" "$m" "$p" > "$DIRSEAL_CONFIG"
chmod 600 "$DIRSEAL_CONFIG"
cat > /etc/fscrypt.conf <<CONF
{"source":"custom_passphrase","hash_costs":{"time":"$t","memory":"$m","parallelism":"$p"},
 "options":{"padding":"32","contents":"AES_256_XTS","filenames":"AES_256_CTS","policy_version":"2"},
 "use_fs_keyring_for_v1_policies":false}
CONF
fscrypt setup "$mnt" --quiet --force >/dev/null

mkdir "$mnt/ds" "$mnt/fs"
echo bench | "$bin" encrypt "$mnt/ds" --protector-name bench >/dev/null
echo bench | fscrypt encrypt "$mnt/fs" --source=custom_passphrase --name=bench --quiet
echo x > "$mnt/ds/f"; echo x > "$mnt/fs/f"
"$bin" lock "$mnt/ds" >/dev/null; fscrypt lock "$mnt/fs" --quiet

# Milliseconds of one command, run with a fresh stdin each time.
ms() { local s e; s=$(date +%s%N); "$@"; e=$(date +%s%N); echo $(( (e - s) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : int((a[NR/2]+a[NR/2+1])/2))}'; }

declare -a du dl fu fl
for _ in $(seq "$rounds"); do
  du+=("$(ms sh -c "echo bench | '$bin' unlock '$mnt/ds' >/dev/null")")
  dl+=("$(ms sh -c "'$bin' lock '$mnt/ds' >/dev/null")")
  fu+=("$(ms sh -c "echo bench | fscrypt unlock '$mnt/fs' --quiet")")
  fl+=("$(ms sh -c "fscrypt lock '$mnt/fs' --quiet")")
done
mdu=$(printf '%s\n' "${du[@]}" | median); mdl=$(printf '%s\n' "${dl[@]}" | median)
mfu=$(printf '%s\n' "${fu[@]}" | median); mfl=$(printf '%s\n' "${fl[@]}" | median)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) b = 1; printf "%.2f", a / b }'; }
echo "Argon2id t=$t m=${m}KiB p=$p, $rounds rounds, medians:"
printf '  %-8s %8s %8s %8s\n' op dirseal fscrypt ratio
printf '  %-8s %6sms %6sms %7sx\n' unlock "$mdu" "$mfu" "$(ratio "$mdu" "$mfu")"
printf '  %-8s %6sms %6sms %7sx\n' lock "$mdl" "$mfl" "$(ratio "$mdl" "$mfl")"
