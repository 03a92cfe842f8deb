#!/usr/bin/env bash
# `dirseal convert` against its peers on the same scratch ext4, same tree, caches dropped:
#   cp -a + sync and rsync -aHAXS + sync into an fscrypt directory, and dd of one large file.
# Prints wall time and peak RSS of each, and the ratios; convert's own time per phase (from its
# --json result); then convert's move mode (for nearly full disks) against its copy mode: time
# and peak extra space used on the filesystem; then `dirseal decrypt` of the two converted trees
# (copy and move mode) beside convert: time, per phase, and its ratio to convert's.
# Record results in docs/performance.md.
# Usage: sudo scripts/bench-convert.sh [SMALL_FILES=20000] [MEDIUM_FILES=200] [LARGE_MIB=64] [SMALL_MAX_BYTES=8192]
# (200000 0 0 512 measures peak RSS on a 200,000-file tree)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root" >&2; exit 1; }
small=${1:-20000} medium=${2:-200} large_mib=${3:-64} small_max=${4:-8192}
source scripts/lib/scratch.sh
# Room for four copies of the tree plus the conversion's staging copy.
size_mib=$(( (small * 8 / 1024 + medium + 3 * large_mib + 40) * 7 + 512 ))
scratch_fs bench "$size_mib" $(( small * 8 + 100000 ))

echo "building the tree: $small small files, $medium medium, 3 x ${large_mib} MiB, one sparse"
tpl=$mnt/template
python3 -B - "$tpl" "$small" "$medium" "$large_mib" "$small_max" <<'PY'
import os, random, sys
sys.path.insert(0, "scripts/lib")
from trees import small_files
root, small, medium, large, small_max = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
rnd = random.Random(42)
small_files(rnd, root, small, small_max)
os.makedirs(os.path.join(root, "Pictures"), exist_ok=True)
for i in range(medium):
    with open(os.path.join(root, "Pictures", f"p{i}.jpg"), "wb") as f:
        f.write(rnd.randbytes(rnd.randint(100_000, 1_000_000)))
os.makedirs(os.path.join(root, "Games"), exist_ok=True)
for i in range(3 if large else 0):
    with open(os.path.join(root, "Games", f"big{i}.pak"), "wb") as f:
        for _ in range(large):
            f.write(os.urandom(1 << 20))
with open(os.path.join(root, "Games", "sparse.img"), "wb") as f:
    f.truncate(1 << 30)
    for off in range(0, 1 << 30, 100 << 20):
        f.seek(off); f.write(os.urandom(1 << 20))
PY
chown -R 65000:65000 "$tpl"
du -sh "$tpl" | sed 's/^/tree: /'

drop() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# Runs "$@" and prints "<seconds> <peak RSS KiB>".
# (Its standard output is kept in $work/out.)
measure() { /usr/bin/time -f '%e %M' -o "$work/time" "$@" >"$work/out" 2>"$work/err" || { cat "$work/err" >&2; exit 1; }; cat "$work/time"; }
used_mib() { df -B1M --output=used "$mnt" | tail -1 | tr -d ' '; }
# Like measure, and also prints the peak of extra space used on the filesystem meanwhile (MiB,
# sampled every 50 ms).
measure_space() {
  local base peak u pid
  base=$(used_mib) peak=$base
  measure "$@" > "$work/m" &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    u=$(used_mib); [ "$u" -gt "$peak" ] && peak=$u
    sleep 0.05
  done
  wait "$pid"
  echo "$(cat "$work/m") $((peak - base))"
}

cp -a "$tpl" "$mnt/conv"; cp -a "$tpl" "$mnt/cpsrc"; cp -a "$tpl" "$mnt/rsrc"; cp -a "$tpl" "$mnt/mv"
mkdir "$mnt/cpdst" "$mnt/rdst" "$mnt/dddst"
for d in cpdst rdst dddst; do echo bench | "$bin" encrypt "$mnt/$d" --protector-name "$d" >/dev/null; done

drop; read -r t_conv m_conv s_conv < <(measure_space sh -c "echo bench | '$bin' convert '$mnt/conv' --yes --json --protector-name conv --mode copy")
tail -1 "$work/out" > "$work/conv.json"
drop; read -r t_mv m_mv s_mv < <(measure_space sh -c "echo bench | '$bin' convert '$mnt/mv' --yes --json --protector-name mv --mode move")
tail -1 "$work/out" > "$work/mv.json"
drop; read -r t_cp m_cp < <(measure sh -c "cp -a '$mnt/cpsrc/.' '$mnt/cpdst/' && sync")
drop; read -r t_rs m_rs < <(measure sh -c "rsync -aHAXS '$mnt/rsrc/' '$mnt/rdst/' && sync")
big=$tpl/Games/big0.pak
[ -e "$big" ] || { head -c 64M /dev/urandom > "$work/big"; mv "$work/big" "$mnt/bigfile"; big=$mnt/bigfile; }
drop; read -r t_dd _ < <(measure sh -c "dd if='$big' of='$mnt/dddst/big' bs=1M status=none && sync")
mib=$(( $(stat -c %s "$big") / 1048576 ))

# The large-file rate of convert itself: one large file alone.
mkdir "$mnt/one"; cp -a "$big" "$mnt/one/"; chown -R 65000:65000 "$mnt/one"
drop; read -r t_one _ < <(measure sh -c "echo bench | '$bin' convert '$mnt/one' --yes --protector-name one")

# The peers' trees are measured: they go, so that a decrypt's copy has the inodes and room it needs
# (a 200,000-file tree is some 227,000 inodes a copy; seven copies and a staging one overran the
# filesystem's inode count).
rm -rf "${mnt:?}/cpsrc" "$mnt/rsrc" "$mnt/cpdst" "$mnt/rdst" "$mnt/dddst" "$mnt/one"

# Decrypt beside convert: the trees just converted, back to plaintext (copy, then move).
drop; read -r t_dconv m_dconv s_dconv < <(measure_space sh -c "'$bin' decrypt '$mnt/conv' --yes --json --mode copy")
tail -1 "$work/out" > "$work/dconv.json"
drop; read -r t_dmv m_dmv s_dmv < <(measure_space sh -c "'$bin' decrypt '$mnt/mv' --yes --json --mode move")
tail -1 "$work/out" > "$work/dmv.json"

r() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == 0) b = 0.001; printf "%.2f", a / b }'; }
echo
printf '%-28s %8s %12s %10s\n' tool seconds "peak RSS" "vs cp -a"
printf '%-28s %8s %9s KiB %9sx\n' "dirseal convert" "$t_conv" "$m_conv" "$(r "$t_conv" "$t_cp")"
printf '%-28s %8s %9s KiB %9sx\n' "dirseal convert --mode move" "$t_mv" "$m_mv" "$(r "$t_mv" "$t_cp")"
printf '%-28s %8s %9s KiB %9sx\n' "dirseal decrypt" "$t_dconv" "$m_dconv" "$(r "$t_dconv" "$t_cp")"
printf '%-28s %8s %9s KiB %9sx\n' "dirseal decrypt --mode move" "$t_dmv" "$m_dmv" "$(r "$t_dmv" "$t_cp")"
printf '%-28s %8s %9s KiB %9sx\n' "cp -a + sync" "$t_cp" "$m_cp" 1.00
printf '%-28s %8s %9s KiB %9sx\n' "rsync -aHAXS + sync" "$t_rs" "$m_rs" "$(r "$t_rs" "$t_cp")"
phases() { python3 -c 'import json,sys; t=json.load(open(sys.argv[1]))["result"]["timings"]; print("  ".join(f"{k} {v:.2f}" for k, v in t.items()))' "$1"; }
echo
echo "dirseal convert, seconds per phase:               $(phases "$work/conv.json")"
echo "dirseal convert --mode move, seconds per phase:   $(phases "$work/mv.json")"
echo "dirseal decrypt, seconds per phase:               $(phases "$work/dconv.json")"
echo "dirseal decrypt --mode move, seconds per phase:   $(phases "$work/dmv.json")"
echo
best=$(awk -v a="$t_cp" -v b="$t_rs" 'BEGIN { print (a < b) ? a : b }')
echo "convert: $(r "$t_conv" "$t_cp")x cp -a, $(r "$t_conv" "$t_rs")x rsync, $(r "$t_conv" "$best")x the faster (aim <= 0.90)"
echo "large file (${mib} MiB): dd into fscrypt $(r "$mib" "$t_dd") MiB/s; dirseal convert of it alone $(r "$mib" "$t_one") MiB/s (includes verify and setup) = $(r "$t_dd" "$t_one")x of dd"
echo "move mode: $(r "$t_conv" "$t_mv")x the throughput of copy mode (target >= 0.80); peak extra space ${s_mv} MiB (copy mode ${s_conv} MiB, tree $(du -sm "$tpl" | cut -f1) MiB)"
echo "decrypt: $(r "$t_dconv" "$t_conv")x the time of convert in copy mode, $(r "$t_dmv" "$t_mv")x in move mode (aim <= 1.00); peak extra space ${s_dconv} MiB copying, ${s_dmv} MiB moving"
