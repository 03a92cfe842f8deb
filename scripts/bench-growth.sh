#!/usr/bin/env bash
# How cost grows with the tree (issue 50): trees of 10^4, 10^5, 10^6 tiny files (≤ 512 B), of 1,
# 4, 16 GiB in 256 MiB files, and one of hard-linked files (two names each); for each, convert and
# decrypt in copy mode and in move mode, beside `cp -a` and `rsync -aHAXS` (+ sync) into an fscrypt
# directory. Caches dropped before each run. Prints one table: seconds, time per file and per
# GiB, peak RSS, the peak size of the conversion's work dir without its staging tree (journal and
# manifests), and the flushes (sync, syncfs, fsync, fdatasync calls, counted by perf's tracepoints).
# Record results in docs/performance.md, with the machine's load (printed at the end).
#
# Usage: sudo [LINKED_MODES="copy move"] scripts/bench-growth.sh [MAX_FILES=100000] [MAX_GIB=1] [LINKED=100000]
#   trees of 10^4 files up to MAX_FILES, of 1 GiB up to MAX_GIB (1, 4, 16), and LINKED hard-linked
#   files (0: none). A size whose scratch filesystem would leave less than 10 GB free on the disk
#   holding /tmp is skipped, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root" >&2; exit 1; }
max_files=${1:-100000} max_gib=${2:-1} linked=${3:-100000}
command -v perf >/dev/null || { echo "needs perf (linux-perf) to count flushes" >&2; exit 1; }
source scripts/lib/scratch.sh
keep_free_mib=10240

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
free_mib() { df -B1M --output=avail /tmp | tail -1 | tr -d ' '; }
workdir_bytes() {
  { find "$mnt/.dirseal/convert" -mindepth 2 -maxdepth 2 -type f -printf '%s\n' 2>/dev/null || true; } | awk '{ s += $1 } END { print s + 0 }'
}

# Runs "$@"; sets t (seconds), rss (KiB), wd (peak work dir bytes, sampled every 100 ms), fl
# (flushes).
run() {
  local pid w
  wd=0
  perf stat -x, -o "$work/perf" -e syscalls:sys_enter_sync,syscalls:sys_enter_syncfs,syscalls:sys_enter_fsync,syscalls:sys_enter_fdatasync \
    -- /usr/bin/time -f '%e %M' -o "$work/time" "$@" >"$work/out" 2>"$work/err" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    w=$(workdir_bytes)
    if [ "$w" -gt "$wd" ]; then wd=$w; fi
    sleep 0.1
  done
  wait "$pid" || { cat "$work/err" >&2; exit 1; }
  read -r t rss < "$work/time"
  fl=$(awk -F, '/sys_enter/ { s += $1 } END { print s + 0 }' "$work/perf")
}

rows=()
row() { # tree files bytes tool
  local per_file per_gib
  per_file=$(awk -v t="$t" -v n="$2" 'BEGIN { printf "%.1f", t * 1e6 / n }')
  per_gib=$(awk -v t="$t" -v b="$3" 'BEGIN { printf "%.2f", t * 1073741824 / (b ? b : 1) }')
  rows+=("$(printf '%-22s %-16s %8s %10s %9s %9s %10s %8s' "$1" "$4" "$t" "$per_file" "$per_gib" "$((rss / 1024))" "$((wd / 1024))" "$fl")")
}

# One tree: NAME FILES BYTES SIZE_MIB INODES BUILDER SIZE (the builder is called as BUILDER ROOT SIZE)
measure_tree() {
  local name=$1 files=$2 bytes=$3 size_mib=$4 inodes=$5
  shift 5
  if [ $(( $(free_mib) - size_mib )) -lt "$keep_free_mib" ]; then
    echo "skipping $name: its scratch filesystem (up to $size_mib MiB) would leave under 10 GB free" >&2
    return
  fi
  scratch_fs growth "$size_mib" "$inodes"
  echo "building $name" >&2
  "$1" "$mnt/tpl" "$2"
  chown -R 65000:65000 "$mnt/tpl"
  for mode in $modes; do
    cp -a "$mnt/tpl" "$mnt/t"
    drop; run sh -c "echo bench | '$bin' convert '$mnt/t' --yes --json --protector-name c$mode --mode $mode"
    row "$name" "$files" "$bytes" "convert $mode"
    drop; run "$bin" decrypt "$mnt/t" --yes --json --mode "$mode"
    row "$name" "$files" "$bytes" "decrypt $mode"
    rm -rf "$mnt/t"
  done
  for peer in "cp -a" "rsync"; do
    mkdir "$mnt/d"
    echo bench | "$bin" encrypt "$mnt/d" --protector-name "p$RANDOM" >/dev/null
    case $peer in
      "cp -a") drop; run sh -c "cp -a '$mnt/tpl/.' '$mnt/d/' && sync" ;;
      rsync) drop; run sh -c "rsync -aHAXS '$mnt/tpl/' '$mnt/d/' && sync" ;;
    esac
    row "$name" "$files" "$bytes" "$peer"
    rm -rf "$mnt/d"
  done
  scratch_cleanup
  trap - EXIT
}

tiny() { # ROOT N
  python3 -B - "$1" "$2" <<'PY'
import random, sys
sys.path.insert(0, "scripts/lib")
from trees import small_files
small_files(random.Random(42), sys.argv[1], int(sys.argv[2]), 512)
PY
}
large() { # ROOT GIB: 256 MiB files
  mkdir -p "$1"
  for i in $(seq 1 $(( $2 * 4 ))); do head -c 256M /dev/urandom > "$1/f$i.bin"; done
}
linked_tree() { # ROOT N: N files of ≤ 512 B, each with a second name in another directory
  python3 -B - "$1" "$2" <<'PY'
import os, random, sys
sys.path.insert(0, "scripts/lib")
from trees import small_files
root, n = sys.argv[1], int(sys.argv[2])
small_files(random.Random(42), root, n, 512)
other = os.path.join(root, "links")
os.makedirs(other)
for d, _, files in list(os.walk(root)):
    if d == other:
        continue
    for f in files:
        rel = os.path.relpath(os.path.join(d, f), root).replace("/", "_")
        os.link(os.path.join(d, f), os.path.join(other, rel))
PY
}

modes="copy move"
for n in 10000 100000 1000000; do
  [ "$n" -le "$max_files" ] || continue
  # Three copies (template, tree, staging) of ~5 KiB a file, and a margin.
  measure_tree "$n tiny files" "$n" $(( n * 306 )) $(( n * 15 / 1024 + 1024 )) $(( n * 4 + 100000 )) tiny "$n"
done
for g in 1 4 16; do
  [ "$g" -le "$max_gib" ] || continue
  measure_tree "$g GiB, 256 MiB files" $(( g * 4 )) $(( g << 30 )) $(( g * 3 * 1024 + 1024 )) 100000 large "$g"
done
if [ "$linked" -gt 0 ]; then
  # Copy mode only: move mode moves each hard-link group on its own, with its own records and
  # flushes (some 11 a group, 46 ms a file here at 2,000 groups), so 10^5 groups take an hour.
  modes=${LINKED_MODES:-copy}
  measure_tree "$linked hard-linked" "$linked" $(( linked * 306 )) $(( linked * 15 / 1024 + 1024 )) $(( linked * 4 + 100000 )) linked_tree "$linked"
fi

echo
printf '%-22s %-16s %8s %10s %9s %9s %10s %8s\n' tree tool seconds "µs/file" "s/GiB" "RSS MiB" "journal KiB" flushes
printf '%s\n' "${rows[@]}"
echo
echo "load average while measuring: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) CPUs"
