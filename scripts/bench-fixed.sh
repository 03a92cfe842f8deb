#!/usr/bin/env bash
# The fixed costs of a conversion (issue 24): a tiny tree (42 files, ~300 KB, as a new user's
# home) converted with `dirseal convert --yes`, against `cp -a` + `sync` of the same tree into an
# fscrypt directory, and against `dirseal encrypt` of an empty directory (process start, keystore
# and protector, KDF: what any conversion pays before its first file). ROUNDS rounds, caches not
# dropped (a tiny tree is always warm; no --json, which adds the estimate's probe); prints the medians, the ratio to cp -a, and convert's
# own time per phase. The aim: convert's time beyond `encrypt` (what the engine adds) < 0.1 s.
# Usage: sudo scripts/bench-fixed.sh [ROUNDS=7]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root" >&2; exit 1; }
rounds=${1:-7}
source scripts/lib/scratch.sh
scratch_fs fixed 256 20000

tpl=$mnt/template
python3 -B - "$tpl" <<'PY'
import os, random, sys
root, rnd = sys.argv[1], random.Random(7)
for i in range(42):
    d = os.path.join(root, ("Documents", ".config", ".local/share", "Pictures")[i % 4], f"d{i % 3}")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"f{i}"), "wb") as f:
        f.write(rnd.randbytes(rnd.randint(1000, 14000)))
PY
chown -R 65000:65000 "$tpl"
sync

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.4f", b - a }'; }
median() { sort -n | awk '{ v[NR] = $1 } END { printf "%.3f", v[int((NR + 1) / 2)] }'; }
: > "$work/conv" ; : > "$work/cp" ; : > "$work/enc" ; : > "$work/phases"
for i in $(seq "$rounds"); do
  cp -a "$tpl" "$mnt/c$i"; cp -a "$tpl" "$mnt/j$i"; mkdir "$mnt/cd$i" "$mnt/e$i"
  echo bench | "$bin" encrypt "$mnt/cd$i" --protector-name "cd$i" >/dev/null
  sync
  t=$(now); echo bench | "$bin" encrypt "$mnt/e$i" --protector-name "e$i" >/dev/null; sync; since "$t" >> "$work/enc"
  t=$(now); cp -a "$tpl/." "$mnt/cd$i/"; sync; since "$t" >> "$work/cp"
  t=$(now); echo bench | "$bin" convert "$mnt/c$i" --yes --protector-name "c$i" >/dev/null 2>&1; since "$t" >> "$work/conv"
  # The phases, from a run of its own: --json also measures the estimate's probe.
  echo bench | "$bin" convert "$mnt/j$i" --yes --json --protector-name "j$i" 2>/dev/null > "$work/out"
  tail -1 "$work/out" | python3 -c 'import json,sys; t=json.load(sys.stdin)["result"]["timings"]; print(" ".join(f"{k}={v*1000:.0f}ms" for k, v in sorted(t.items())))' >> "$work/phases"
done
conv=$(median < "$work/conv") cp=$(median < "$work/cp") enc=$(median < "$work/enc")
echo "tiny tree: 42 files, $(du -sk "$tpl" | cut -f1) KiB; medians of $rounds rounds (load $(cut -d' ' -f1-3 /proc/loadavg))"
printf '%-34s %7s s\n' "dirseal convert --yes" "$conv" "cp -a + sync into fscrypt" "$cp" "dirseal encrypt (empty dir) + sync" "$enc"
awk -v c="$conv" -v p="$cp" -v e="$enc" 'BEGIN {
  printf "convert vs cp -a + sync: %.2fx\n", c / p
  printf "convert beyond encrypt (the engine'"'"'s fixed cost and the copy): %.3f s (aim < 0.1 s)\n", c - e }'
echo "convert's phases, each round (a --json run beside the timed one):"
sed 's/^/  /' "$work/phases"
