#!/usr/bin/env bash
# Kill soak: SIGKILL `dirseal convert` at random moments, N times in all, across copy and move
# mode, and across aborts and rollbacks (which are killed too), on a hostile tree (odd names,
# hard links, sparse files, xattrs, every entry kind). Each tree must end as the original: the
# encrypted copy after the same command finished it, or the plaintext after an abort or a
# rollback. Prints `soak: N kills, M lost`; exits non-zero on any loss.
#
# Then live rounds, for SOAK_LIVE_SECONDS (default 20; 0: none): `convert --live` while a writer
# mutates the tree (appends, same-size rewrites, renames, a directory replaced by a file,
# deletions, hard links, xattrs, modes); its background run (`--live-worker`) SIGKILLed at random
# moments of its copy and its catch-up passes, then the commit (by that run, or the boot-time run
# `convert --scheduled`) killed once the writer stopped; then finished by the boot-time run, or
# aborted. The tree must end as it was when the commit began. Prints `soak live: N kills (where),
# M lost`; its kills count in the summary.
#
# `decrypt` mode: each tree is converted (not interrupted), then `dirseal decrypt` is killed at
# random moments (copy and move, and aborts), each resumed by the same command; a finished tree
# must be the original in plaintext (no E flag, its policy record gone), an aborted one the
# original still encrypted. Prints `soak decrypt: N kills, M lost`.
#
#   scripts/soak.sh [N] [convert|decrypt]   N kills (default 40), then the live rounds' time;
#                                           SOAK_SEED=S repeats a run
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then echo "scripts/soak.sh must run as root (loop mounts, fscrypt keys)" >&2; exit 1; fi
kills=${1:-40}
what=${2:-convert}
case $what in convert|decrypt) ;; *) echo "usage: scripts/soak.sh [N] [convert|decrypt]" >&2; exit 2 ;; esac
cargo build -q --workspace --features fault-injection
bin=$(realpath "${CARGO_TARGET_DIR:-target}/debug/dirseal")
work=$(mktemp -d /tmp/dirseal-soak.XXXXXX)
loop=""
cleanup() {
  umount "$work/mnt" 2>/dev/null || umount -l "$work/mnt" 2>/dev/null || true
  [ -z "$loop" ] || losetup -d "$loop" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
truncate -s 768M "$work/fs.img"
mkfs.ext4 -q -O encrypt "$work/fs.img"
mkdir "$work/mnt"
loop=$(losetup --find --show "$work/fs.img")
mount "$loop" "$work/mnt"
printf '[argon2]\ntime_cost = 1\nmemory_kib = 1024\nparallelism = 1\n' >"$work/config.toml"
chmod 600 "$work/config.toml"
DIRSEAL_CONFIG=$work/config.toml DIRSEAL_KEYSTORE=$work/keystore \
  python3 - "$bin" "$work/mnt" "$kills" "${SOAK_SEED:-$(date +%s)}" "$what" <<'EOF'
import hashlib, json, os, random, stat, subprocess, sys, time

BIN, MNT, WANT, SEED, WHAT = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
PW = "soak pw\n"
rnd = random.Random(SEED)
print(f"soak: seed {SEED}", flush=True)


def tree(root, seed):
    """Hostile names (newlines, invalid UTF-8, 255 bytes, leading dashes), deep dirs, hard links
    across dirs, symlinks, a FIFO, a sparse file larger than a move's chunk, xattrs, odd modes."""
    r = random.Random(seed)
    os.makedirs(root)
    os.chown(root, 4242, 4242)
    dirs = [root.encode()]
    for i in range(8):
        d = os.path.join(r.choice(dirs), f"d{i} \n\x01".encode() if i % 3 == 0 else f"dir-{i}".encode())
        os.mkdir(d)
        dirs.append(d)
    deep = os.path.join(root.encode(), *[b"deep"] * 30)
    os.makedirs(deep)
    files = []
    for i in range(150):
        name = r.choice([f"f{i}".encode(), b"-rf " + str(i).encode(), b"\xff\xfe" + bytes([48 + i % 10]) + str(i).encode(),
                         (b"L" * 250 + str(i).encode())[:255]])
        f = os.path.join(r.choice(dirs), name)
        with open(f, "wb") as fh:
            fh.write(r.randbytes(r.choice([0, 1, 4095, 4096, 9000, 70000, 300000])))
        files.append(f)
    with open(os.path.join(deep, b"bottom"), "wb") as fh:
        fh.write(b"deep")
    sparse = os.path.join(root.encode(), b"disk.img")
    with open(sparse, "wb") as fh:
        fh.truncate(36 << 20)
        for off in (0, 5 << 20, 17 << 20, (36 << 20) - 4096):
            fh.seek(off)
            fh.write(r.randbytes(4096))
    for i in range(6):
        os.link(files[i], os.path.join(r.choice(dirs), f"link-{i}".encode()))
    os.symlink(b"../\xff target", os.path.join(dirs[1], b"sym"))
    os.mkfifo(os.path.join(dirs[2], b"fifo"))
    os.setxattr(files[7], "user.k", b"v" * 500)
    os.chmod(files[8], 0o4711)
    for dp, dn, fn in os.walk(root.encode()):
        for n in dn + fn:
            p = os.path.join(dp, n)
            if not os.path.islink(p):
                os.chown(p, 4242, 4242)
    os.chmod(files[8], 0o4711)


def manifest(root):
    out = {}
    for dp, dn, fn in os.walk(root.encode()):
        for n in sorted(dn + fn) + ([b"."] if dp == root.encode() else []):
            p = os.path.normpath(os.path.join(dp, n))
            st = os.lstat(p)
            e = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns if not stat.S_ISDIR(st.st_mode) else 0,
                 tuple(sorted((k, os.getxattr(p, k, follow_symlinks=False)) for k in os.listxattr(p, follow_symlinks=False))))
            if stat.S_ISREG(st.st_mode):
                e += (st.st_size, st.st_nlink, hashlib.sha256(open(p, "rb").read()).hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                e += (os.readlink(p),)
            out[os.path.relpath(p, root.encode())] = e
    return out


def ds(*args, check=True):
    p = subprocess.run([BIN, *args], input=PW, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"dirseal {' '.join(args)}: {p.stderr.strip()}")
    return p


def killed(args, delay):
    """Runs dirseal, SIGKILLs it after `delay` s; whether it was still running (a kill)."""
    p = subprocess.Popen([BIN, *args], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    try:
        p.stdin.write(PW)
        p.stdin.close()
    except BrokenPipeError:  # it ended before reading (nothing to ask)
        pass
    time.sleep(delay)
    alive = p.poll() is None
    if alive:
        p.kill()
    p.wait()
    return alive


def differs(want, home):
    """Where the tree at `home` is not what `want` recorded (three paths at most), or None."""
    got = manifest(home)
    bad = [k for k in set(want) | set(got) if want.get(k) != got.get(k)][:3]
    return f"differs at {bad}" if bad else None


def judge(what, home, how, problem, homes, kills, lost):
    """A tree's verdict: with a problem it is lost (and stays for a look); else it goes, and every
    tenth says how the soak is doing. The count of lost trees after it."""
    if problem:
        print(f"{what}: LOST {home} ({how}): {problem}", flush=True)
        return lost + 1
    subprocess.run(["rm", "-rf", home], check=True)
    if homes % 10 == 0:
        print(f"{what}: {kills} kills so far ({homes} trees), {lost} lost", flush=True)
    return lost


def summary(what, kills, lost, homes, ends):
    print(f"{what}: {kills} kills, {lost} lost ({homes} trees, copy and move, {ends})", flush=True)
    sys.exit(1 if lost else 0)


def timed_or_killed(args, typical, what):
    """The first run (`typical` None) is timed and left to finish: (its time, None). Every later
    one is killed 1 to 4 times, each at a random point within 1.2 times that: (typical, kills)."""
    if typical is None:
        t0 = time.time()
        ds(*args)
        typical = max(0.5, time.time() - t0)
        print(f"{what} takes {typical:.1f} s here", flush=True)
        return typical, None
    kills = 0
    for _ in range(rnd.randint(1, 4)):
        if killed(args, rnd.uniform(0, typical * 1.2)):
            kills += 1
    return typical, kills


def state(home, cmd="convert"):
    p = ds(cmd, "--status", "--json", home, check=False)
    if p.returncode != 0 or not p.stdout.strip():
        return None
    return json.loads(p.stdout).get("state")


BEFORE_SWAP = ("prepared", "copying", "copied", "verified", "moving", "moved", "moving-back", "moving back")


def encrypted(path):
    out = subprocess.run(["lsattr", "-d", path], capture_output=True, text=True, check=True).stdout
    return "E" in out.split()[0]


def decrypt_soak():
    kills = lost = homes = 0
    typical = None
    keystore = os.environ["DIRSEAL_KEYSTORE"]
    while kills < WANT:
        homes += 1
        home = os.path.join(MNT, f"home{homes}")
        tree(home, rnd.randrange(1 << 30))
        want = manifest(home)
        ds("convert", home, "--yes", "--protector-name", f"soak{homes}", "--mode", "copy")
        policy = json.loads(ds("status", "--json", home).stdout)["policy"]
        mode = rnd.choice(["copy", "move"])
        end = rnd.choice(["finish", "finish", "finish", "abort"])
        args = ["decrypt", home, "--yes", "--mode", mode]
        try:
            typical, n = timed_or_killed(args, typical, "soak decrypt: one decrypt")
            if n is None:
                end = "finish"  # the timing run is never interrupted
            else:
                kills += n
                if end == "abort" and state(home, "decrypt") in BEFORE_SWAP:
                    if killed(["decrypt", "--abort", home], rnd.uniform(0, typical / 2)):
                        kills += 1
                    p = ds("decrypt", "--abort", home, check=False)
                    if p.returncode != 0:
                        if "roll back instead" in p.stderr:
                            ds("decrypt", "--rollback", home)
                        elif "again to finish" in p.stderr or "already swapped" in p.stderr:
                            end = "finish"
                        else:
                            raise RuntimeError(f"dirseal decrypt --abort {home}: {p.stderr.strip()}")
                else:
                    end = "finish"
                if end == "finish":
                    # Resumed by the same command; one that finds the tree plaintext already
                    # (a killed run had finished) says there is nothing to decrypt.
                    for attempt in range(2):
                        p = ds(*args, check=False)
                        if p.returncode == 0 or "is not encrypted" in p.stderr:
                            break
                        if attempt == 1:
                            raise RuntimeError(f"dirseal {' '.join(args)}: {p.stderr.strip()}")
        except RuntimeError as e:
            lost += 1
            print(f"soak decrypt: LOST {home} ({mode}, {end}): {e}", flush=True)
            continue
        problem = None
        if end == "finish" and encrypted(home):
            problem = "still encrypted after the decrypt"
        elif end == "finish" and os.path.exists(os.path.join(keystore, "policies", f"{policy}.json")):
            problem = f"policy {policy} still in the keystore"
        elif end == "abort" and not encrypted(home):
            problem = "not encrypted after the abort"
        lost = judge("soak decrypt", home, f"{mode}, {end}", problem or differs(want, home), homes, kills, lost)
    summary("soak decrypt", kills, lost, homes, "aborts")


def lock_pid(home):
    """The pid of the live run of `home` (its lock in /run/dirseal names it), or None."""
    name = hashlib.sha256(home.encode()).hexdigest()[:16]
    try:
        return int(open(f"/run/dirseal/live-{name}.lock").read().strip())
    except (OSError, ValueError):
        return None


class Writer:
    """Mutates a tree while a live conversion copies and catches up: appends, in-place rewrites
    (same size and times), renames across directories, a directory replaced by a file, deletions,
    new hard links, xattr and mode changes, new files. Never holds a file open between changes."""

    def __init__(self, root, seed):
        import threading
        self.root, self.r, self.stop = root.encode(), random.Random(seed), threading.Event()
        self.changes = 0
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def entries(self):
        files, dirs = [], [self.root]
        for dp, dn, fn in os.walk(self.root):
            dirs += [os.path.join(dp, n) for n in dn if not os.path.islink(os.path.join(dp, n))]
            files += [os.path.join(dp, n) for n in fn if os.path.isfile(os.path.join(dp, n))
                      and not os.path.islink(os.path.join(dp, n))]
        return files, dirs

    def one(self):
        r = self.r
        files, dirs = self.entries()
        f, d = r.choice(files), r.choice(dirs)
        new = os.path.join(d, f"w{self.changes}".encode())
        what = r.randrange(9)
        if what == 0:
            with open(f, "ab") as fh:
                fh.write(r.randbytes(r.choice([1, 100, 5000])))
        elif what == 1 and os.path.getsize(f) > 0:
            st = os.lstat(f)
            with open(f, "r+b") as fh:
                fh.write(r.randbytes(min(3, st.st_size)))
            os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
        elif what == 2:
            os.rename(f, new)
        elif what == 3 and d != self.root:
            subprocess.run(["rm", "-rf", d], check=True)
            with open(d, "wb") as fh:
                fh.write(b"a file where a directory was")
        elif what == 4:
            os.unlink(f)
        elif what == 5:
            os.link(f, new)
        elif what == 6:
            os.setxattr(f, "user.w", r.randbytes(20))
        elif what == 7:
            os.chmod(f, r.choice([0o600, 0o644, 0o640]))
        else:
            with open(new, "wb") as fh:
                fh.write(r.randbytes(r.choice([0, 10, 70000])))
        self.changes += 1

    def run(self):
        while not self.stop.wait(0.02):
            try:
                self.one()
            except (OSError, IndexError, subprocess.CalledProcessError):
                pass  # raced with itself (an entry gone meanwhile): the next change

    def end(self):
        self.stop.set()
        self.thread.join()


def worker(home):
    """Starts the background run of `home`'s live conversion in the foreground (as `convert
    --live` starts it), its output read line by line: (process, queue of (time, line))."""
    import queue, threading
    p = subprocess.Popen([BIN, "convert", "--live-worker", home], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = queue.Queue()

    def read():
        for line in p.stdout:
            lines.put((time.time(), line.strip()))
        lines.put((time.time(), None))
    threading.Thread(target=read, daemon=True).start()
    return p, lines


def kill_at(p, delay):
    """SIGKILLs `p` after `delay` s unless it ended first; whether it was killed."""
    try:
        p.wait(timeout=delay)
        return False
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        return True


def until(lines, word, timeout):
    """Waits for a line of the run containing `word`; False if the run ended or time ran out."""
    import queue
    end = time.time() + timeout
    while time.time() < end:
        try:
            _, line = lines.get(timeout=max(0.1, end - time.time()))
        except queue.Empty:
            return False
        if line is None:
            return False
        if word in line:
            return True
    return False


def live_rounds(budget, typical):
    """Live conversions killed at random moments of their first copy and catch-up passes (while a
    Writer mutates the tree) and of their commit, for `budget` seconds; each then resumed to the
    end (or aborted) and checked against the tree as it was when the commit began: (kills,
    lost, trees)."""
    lost = homes = 0
    kills = {"copy": 0, "passes": 0, "commit": 0}  # where the kills came
    deadline = time.time() + budget
    while time.time() < deadline:
        homes += 1
        home = os.path.join(MNT, f"live{homes}")
        tree(home, rnd.randrange(1 << 30))
        end = rnd.choice(["finish", "finish", "finish", "abort"])
        w = None
        try:
            # Prepared in the foreground, then its background run starts (the changes with it).
            ds("convert", "--live", home, "--yes", "--protector-name", f"live{homes}")
            w = Writer(home, rnd.randrange(1 << 30))
            pid = lock_pid(home)
            time.sleep(rnd.uniform(0, typical * 1.2))
            if pid and os.path.exists(f"/proc/{pid}"):
                os.kill(pid, 9)
                kills["copy"] += 1
            for _ in range(rnd.randint(0, 2)):
                p, _ = worker(home)
                kills["passes"] += kill_at(p, rnd.uniform(0, typical * 1.2))
            w.end()
            want = manifest(home)  # the tree when the commit begins: nothing changes it after
            if end == "abort":
                ds("convert", "--abort", home)
            else:
                # The commit, killed in it: by the background run (it waits a few seconds, sees
                # nobody, commits), or by the boot-time run (`--scheduled`, no wait); then the
                # boot-time run finishes it.
                if rnd.randrange(2):
                    p, lines = worker(home)
                    if until(lines, "committing", 120):
                        kills["commit"] += kill_at(p, rnd.uniform(0, typical))
                    else:
                        p.kill()
                    p.wait()
                elif killed(["convert", "--scheduled"], rnd.uniform(0, typical * 1.2)):
                    kills["commit"] += 1
                ds("convert", "--scheduled")
                if state(home) != "done":
                    raise RuntimeError(f"{home}: {state(home)} after the last run")
                ds("lock", home)
                ds("unlock", home)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            if w:
                w.end()
            lost += 1
            print(f"soak live: LOST {home} ({end}): {e}", flush=True)
            continue
        lost = judge("soak live", home, f"{end}, {w.changes} changes while live", differs(want, home), homes,
                     sum(kills.values()), lost)
    return kills, lost, homes


if WHAT == "decrypt":
    decrypt_soak()
LIVE_SECONDS = float(os.environ.get("SOAK_LIVE_SECONDS", "20"))

kills = lost = homes = 0
typical = None
while kills < WANT:
    homes += 1
    home = os.path.join(MNT, f"home{homes}")
    tree(home, rnd.randrange(1 << 30))
    want = manifest(home)
    mode = rnd.choice(["copy", "move"])
    end = rnd.choice(["finish", "finish", "abort", "rollback"])
    if end == "rollback" and mode == "move":
        end = "abort"
    args = ["convert", home, "--yes", "--protector-name", "soak", "--mode", mode]
    if end == "rollback":
        args.append("--keep-backup")
    typical, n = timed_or_killed(args, typical, "soak: one conversion")
    if n is None:
        end = "finish"  # the timing run is never interrupted
    else:
        kills += n
        try:
            if end == "abort":
                st = state(home)
                if st in ("prepared", "copying", "copied", "verified", "moving", "moved", "moving-back", "moving back"):
                    if killed(["convert", "--abort", home], rnd.uniform(0, typical / 2)):
                        kills += 1
                    p = ds("convert", "--abort", home, check=False)
                    if p.returncode != 0:
                        # A kill right after the swap, before its record: the abort finds the
                        # swap, records it and says to run the command again, which finishes.
                        if "already swapped into place" not in p.stderr:
                            raise RuntimeError(f"dirseal convert --abort {home}: {p.stderr.strip()}")
                        ds(*args)
                        end = "finish"
                else:
                    ds(*args, check=False)  # too late to abort (or done already): finish
                    end = "finish"
            elif end == "rollback":
                ds(*args)  # stops at Swapped, keeping the backup
                if killed(["convert", "--rollback", home], rnd.uniform(0, typical / 2)):
                    kills += 1
                ds("convert", "--rollback", home)
            else:
                ds(*args, check=False)
                ds(*args, check=False)
        except RuntimeError as e:
            lost += 1
            print(f"soak: LOST {home} ({mode}, {end}): {e}", flush=True)
            continue
    if end == "finish":
        try:
            ds("lock", home)
            ds("unlock", home)
        except RuntimeError as e:
            lost += 1
            print(f"soak: LOST {home} ({mode}): {e}", flush=True)
            continue
    lost = judge("soak", home, f"{mode}, {end}", differs(want, home), homes, kills, lost)
if LIVE_SECONDS > 0:
    where, m, trees = live_rounds(LIVE_SECONDS, typical or 1.5)
    n = sum(where.values())
    print(f"soak live: {n} kills ({', '.join(f'{v} in the {k}' for k, v in where.items())}), {m} lost "
          f"({trees} live trees in {LIVE_SECONDS:.0f} s)", flush=True)
    kills, lost, homes = kills + n, lost + m, homes + trees
summary("soak", kills, lost, homes, "aborts and rollbacks, live")
EOF
