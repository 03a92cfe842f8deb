#!/usr/bin/env bash
# System calls per file of `dirseal convert`, phase by phase, beside rsync -aHAXS and cp -a
# copying the same tree into an fscrypt directory (strace -f; the phases are told apart by the
# JSON progress lines convert prints at each phase start). Small trees are enough: the counts
# per file do not depend on the tree's size, and strace slows everything down.
# Usage: sudo scripts/syscalls-convert.sh [FILES=20000] [MAX_BYTES=512]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "run as root" >&2; exit 1; }
files=${1:-20000} max=${2:-512}
source scripts/lib/scratch.sh
command -v strace >/dev/null || apt-get install -y -qq strace >/dev/null
scratch_fs syscalls $(( files * 4 * 6 / 1024 + 300 )) $(( files * 6 + 10000 ))

python3 -B - "$mnt/conv" "$files" "$max" <<'PY'
import random, sys
sys.path.insert(0, "scripts/lib")
from trees import small_files
small_files(random.Random(42), sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
PY
chown -R 65000:65000 "$mnt/conv"
entries=$(find "$mnt/conv" -mindepth 1 | wc -l)
cp -a "$mnt/conv" "$mnt/rsrc"; cp -a "$mnt/conv" "$mnt/csrc"
for d in rdst cdst; do mkdir "$mnt/$d"; echo bench | "$bin" encrypt "$mnt/$d" --protector-name "$d" >/dev/null; done
sync

echo bench | strace -f -qq -s 80 -o "$work/conv.trace" "$bin" convert "$mnt/conv" --yes --json --protector-name conv --mode copy > "$work/conv.out"
strace -f -qq -c -o "$work/rsync.sum" rsync -aHAXS "$mnt/rsrc/" "$mnt/rdst/"
strace -f -qq -c -o "$work/cp.sum" cp -a "$mnt/csrc/." "$mnt/cdst/"

python3 - "$entries" "$work/conv.trace" "$work/rsync.sum" "$work/cp.sum" <<'PY'
import collections, re, sys
entries = int(sys.argv[1])
phase, counts, order = "setup", collections.defaultdict(collections.Counter), ["setup"]
call = re.compile(r'^\d+\s+(?:<\.\.\. )?([a-z0-9_]+)[( ]')
marker = re.compile(r'"phase\\":\\"([a-z ]+)\\"')
for line in open(sys.argv[2]):
    m = call.match(line)
    if not m or "resumed>" in line:
        continue
    counts[phase][m.group(1)] += 1
    if m.group(1) == "write":
        p = marker.search(line)
        if p and p.group(1) != phase:
            phase = p.group(1)
            if phase not in order:
                order.append(phase)

def summary(c):
    top = ", ".join(f"{k} {v / entries:.2f}" for k, v in c.most_common(int(__import__("os").environ.get("TOP", "7"))))
    return f"{sum(c.values()) / entries:7.2f}  {top}"

def strace_c(path):
    c = collections.Counter()
    for line in open(path):
        f = line.split()
        if len(f) >= 5 and f[-1] not in ("total", "syscall") and f[3].isdigit():
            c[f[-1]] = int(f[3])
    return c

print(f"system calls per entry ({entries} entries; phase: calls/entry, then the commonest calls/entry)")
total = collections.Counter()
for p in order:
    print(f"  convert {p:<11}{summary(counts[p])}")
    total.update(counts[p])
print(f"  convert {'(all)':<11}{summary(total)}")
print(f"  {'rsync -aHAXS':<19}{summary(strace_c(sys.argv[3]))}")
print(f"  {'cp -a':<19}{summary(strace_c(sys.argv[4]))}")
PY
