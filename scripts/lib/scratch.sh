# Sourced by the conversion benchmarks: builds the release binary and makes a scratch ext4
# (encrypt feature) mounted at $mnt, with a throwaway keystore and a cheap Argon2 cost, all
# removed on exit. Usage: scratch_fs NAME SIZE_MIB INODES   (sets bin, work, mnt)
# shellcheck shell=bash disable=SC2034 # bin, work and mnt are for the scripts that source this
scratch_fs() {
  bash scripts/deps.sh >/dev/null
  cargo build --quiet --release -p dirseal-cli
  bin=$(realpath "${CARGO_TARGET_DIR:-target}/release/dirseal")
  work=$(mktemp -d "/tmp/dirseal-$1.XXXXXX")
  mnt=$work/mnt scratch_loop=
  trap scratch_cleanup EXIT
  truncate -s "$2M" "$work/fs.img"
  mkfs.ext4 -q -O encrypt -N "$3" "$work/fs.img"
  mkdir "$mnt"
  scratch_loop=$(losetup --find --show "$work/fs.img")
  mount "$scratch_loop" "$mnt"
  export DIRSEAL_KEYSTORE=$work/keystore DIRSEAL_CONFIG=$work/config.toml
  printf '[argon2]\ntime_cost = 1\nmemory_kib = 1024\nparallelism = 1\n' > "$DIRSEAL_CONFIG"
  chmod 600 "$DIRSEAL_CONFIG"
}

scratch_cleanup() {
  umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
  if [ -n "$scratch_loop" ]; then losetup -d "$scratch_loop" 2>/dev/null || true; fi
  rm -rf "$work"
}
