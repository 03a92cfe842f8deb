#!/usr/bin/env python3
"""Guest side of scripts/vm-test.sh: runs as root inside the qemu guest, on the host's userland.

powercut: records a conversion with dm-log-writes (the tree, the keystore and the work dir all on
          the recorded ext4), then replays the log onto a fresh image at flush points and between
          them (ext4 ones on the host: --export here, --host-replay there, points in parallel,
          the same checks); each image is checked with e2fsck, mounted, the same convert command is run again,
          and the tree must be the untouched plaintext before and the complete encrypted tree after,
          opened through the keystore. `dirseal decrypt` (copy and move) is recorded the same
          way, the tree converted before the marks: encrypted before, the plaintext after. Move
          recordings add small files in several batches and a large hard-link group; one more
          recording uses a TPM2 protector with a PIN, and one a casefold+encrypt ext4 with a
          Proton-like prefix in a casefolded directory (lookups by wrong case, lsattr after each),
          and one a live conversion (copied in use, changed, one catch-up pass, committed).
faults:   a failing disk under a conversion (device-mapper: a bad block, failing writes, the
          device vanishing, failing writes in a live catch-up pass) and the filesystem full at
          each phase (ENOSPC): the run stops with a
          clear message, nothing is lost, and the same command finishes once the fault is gone.
f2fs:     encrypt, convert (with a crash and a resume), lock/unlock and recovery keys on f2fs.
tpm2:     TPM2 protectors through /dev/tpmrm0 (swtpm on the host), on f2fs.
casefold: a Proton prefix in casefolded directories on a casefold+encrypt ext4 (with project ids)
          and a casefold f2fs, through convert (crashed, resumed), decrypt and a portable convert:
          case-insensitive lookups, lsattr and fsck after each (the host kernel has no casefold).

Writes a line per result to OUT/summary and details to OUT/guest.log; exits non-zero on failure.
"""
import argparse
import contextlib
import ctypes
import errno
import fcntl
import hashlib
import io
import json
import multiprocessing
import os
import random
import shutil
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time

ARGS = None
LOG = None
FAST_CONFIG = "[argon2]\ntime_cost = 1\nmemory_kib = 1024\nparallelism = 1\n"
PASSWORD = "power-cut pw\n"
# The conversion modes the power-cut test records: name -> (extra `dirseal convert` arguments,
# whether the source stays untouched until the swap).
CONVERT_MODES = {
    "copy": ([], True),
    "move": (["--mode", "move"], False),
}
# `dirseal decrypt` recorded the same way (the tree converted first, outside the recording):
# name -> (its arguments, whether the encrypted source stays untouched until the swap).
DECRYPT_MODES = {
    "decrypt-copy": (["--mode", "copy"], True),
    "decrypt-move": (["--mode", "move"], False),
}
# The filesystems the power-cut test records on: name -> mkfs (no discards: the log must hold
# every block), fsck that changes nothing, and the share of the sampled points.
FILESYSTEMS = {
    "ext4": (["mkfs.ext4", "-q", "-b", "4096", "-O", "encrypt", "-E", "nodiscard"], ["e2fsck", "-fn"], 1.0),
    "f2fs": (["mkfs.f2fs", "-q", "-f", "-t", "0", "-O", "encrypt"], ["fsck.f2fs", "-f", "--dry-run"], 0.5),
}


def log(msg):
    print(msg, file=LOG, flush=True)


def say(msg):
    """A line for the console and the log."""
    print(msg, flush=True)
    log(msg)


def run(cmd, check=True, stdin=None, env=None):
    t0 = time.time()
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env)
    log(f"$ {' '.join(cmd)} -> {p.returncode} ({time.time() - t0:.2f} s)")
    if p.stdout.strip():
        log("  out: " + p.stdout.strip().replace("\n", "\n  out: "))
    if p.stderr.strip():
        log("  err: " + p.stderr.strip().replace("\n", "\n  err: "))
    if check and p.returncode != 0:
        raise Failure(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
    return p


class Failure(Exception):
    pass


class Dirseal:
    """The binary under test, with a private config and a keystore at `keystore` (and the TPM at
    `tcti`, when not the kernel's /dev/tpmrm0)."""

    def __init__(self, keystore, etc, tcti=None):
        self.bin = os.path.join(ARGS.bin, "dirseal")
        os.makedirs(etc, exist_ok=True)
        cfg = os.path.join(etc, "config.toml")
        with open(cfg, "w") as f:
            f.write(FAST_CONFIG + (f'[tpm2]\ntcti = "{tcti}"\n' if tcti else ""))
        self.env = dict(os.environ, DIRSEAL_CONFIG=cfg, DIRSEAL_KEYSTORE=keystore)

    def __call__(self, *args, stdin="", check=True):
        return run([self.bin, *args], check=check, stdin=stdin, env=self.env)


# ---------------------------------------------------------------- trees and manifests


def make_tree(root, seed):
    """A small tree with every entry kind: regular (empty, small, multi-block, sparse), nested
    dirs, symlinks (also dangling), hard links (files, a FIFO, a symlink), FIFO, char and block
    devices, a socket, user/trusted xattrs, an ACL, odd modes, several owners, ns mtimes."""
    rnd = random.Random(seed)
    os.makedirs(root)
    os.chown(root, 1000, 1000)
    os.chmod(root, 0o750)
    dirs = [root]
    for i in range(6):
        d = os.path.join(rnd.choice(dirs), f"dir {i}")
        os.mkdir(d)
        dirs.append(d)
    files = []
    for i in range(40):
        f = os.path.join(rnd.choice(dirs), f"file-{i}.dat")
        size = rnd.choice([0, 1, 100, 4095, 4096, 5000, 30000, 70000])
        with open(f, "wb") as fh:
            fh.write(rnd.randbytes(size))
        files.append(f)
    big = os.path.join(root, "big.bin")
    with open(big, "wb") as fh:
        fh.write(rnd.randbytes(600 * 1024))
    files.append(big)
    sparse = os.path.join(root, "dir 1", "sparse.img")
    # A chunk holds MOVE_CHUNK bytes of data, not of size: 2 MiB of data in four runs, so a
    # move recording takes it in two chunks.
    with open(sparse, "wb") as fh:
        fh.truncate(40 << 20)
        for off in (0, 3 << 20, 17 << 20, (40 << 20) - DATA_RUN):
            fh.seek(off)
            fh.write(rnd.randbytes(DATA_RUN))
    files.append(sparse)
    os.link(files[3], os.path.join(root, "hardlink-a"))
    os.link(files[3], os.path.join(dirs[2], "hardlink-b"))
    os.link(files[7], os.path.join(dirs[4], "another-link"))
    os.symlink("file-1.dat", os.path.join(root, "rel-link"))
    os.symlink("/nonexistent/target", os.path.join(dirs[3], "dangling"))
    os.symlink("../" * 3 + "x" * 200, os.path.join(root, "long-link"))
    os.link(os.path.join(root, "rel-link"), os.path.join(dirs[1], "linked-symlink"), follow_symlinks=False)
    fifo = os.path.join(root, "fifo")
    os.mkfifo(fifo)
    os.link(fifo, os.path.join(dirs[5], "fifo-link"))
    os.mknod(os.path.join(root, "null-dev"), 0o620 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(os.path.join(dirs[2], "loop-dev"), 0o600 | stat.S_IFBLK, os.makedev(7, 200))
    s = socket.socket(socket.AF_UNIX)
    s.bind(os.path.join(root, "sock"))
    s.close()
    os.setxattr(files[0], "user.comment", b"hello")
    os.setxattr(files[5], "user.big", rnd.randbytes(3000))
    os.setxattr(files[6], "trusted.secret", b"root only")
    os.setxattr(dirs[1], "user.dir", b"on a dir")
    run(["setfacl", "-m", "u:1001:rw", files[8]])
    os.chmod(files[9], 0o4755)
    os.chmod(dirs[6], 0o1777)
    owners = [(0, 0), (1000, 1000), (1001, 100), (65534, 65534)]
    for p in files + dirs[1:]:
        os.chown(p, *rnd.choice(owners))
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for n in filenames + dirnames:
            t = rnd.randrange(10**18, 2 * 10**18)
            os.utime(os.path.join(dirpath, n), ns=(t, t), follow_symlinks=False)
    t = 1_700_000_000_123_456_789
    os.utime(root, ns=(t, t))


def data_map(path, size):
    """The data ranges of a regular file, by SEEK_DATA/SEEK_HOLE."""
    ranges = []
    fd = os.open(path, os.O_RDONLY | os.O_NOATIME)
    try:
        off = 0
        while off < size:
            try:
                start = os.lseek(fd, off, os.SEEK_DATA)
            except OSError:
                break
            end = os.lseek(fd, start, os.SEEK_HOLE)
            ranges.append([start, end])  # lists: a manifest read back from JSON compares equal
            off = end
    finally:
        os.close(fd)
    return ranges


def manifest(root):
    """Everything a conversion must keep, per relative path (atime and ctime excepted)."""
    out = {}
    first_path = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        entries = [dirpath] if dirpath == root else []
        entries += [os.path.join(dirpath, n) for n in sorted(filenames + dirnames)]
        for p in entries:
            rel = os.path.relpath(p, root)
            st = os.lstat(p)
            e = {
                "mode": oct(st.st_mode),
                "uid": st.st_uid,
                "gid": st.st_gid,
                "mtime": st.st_mtime_ns,
                "xattrs": {
                    k: os.getxattr(p, k, follow_symlinks=False).hex()
                    for k in sorted(os.listxattr(p, follow_symlinks=False))
                    if not k.startswith("security.")
                },
            }
            if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                key = (st.st_dev, st.st_ino)
                e["link"] = first_path.setdefault(key, rel)
            if stat.S_ISREG(st.st_mode):
                e["size"] = st.st_size
                # Holes read as zeros: the data ranges and their bytes say it all (and are fast).
                e["data"] = data_map(p, st.st_size)
                h = hashlib.sha256()
                fd = os.open(p, os.O_RDONLY | os.O_NOATIME)
                try:
                    for start, end in e["data"]:
                        for off in range(start, end, 1 << 20):
                            h.update(os.pread(fd, min(1 << 20, end - off), off))
                finally:
                    os.close(fd)
                e["sha256"] = h.hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                e["target"] = os.readlink(p)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                e["rdev"] = st.st_rdev
            out[rel] = e
    return out


def diff(want, got):
    """The first few differences between two manifests, as text."""
    lines = []
    for k in sorted(set(want) | set(got)):
        if want.get(k) != got.get(k):
            lines.append(f"{k}: want {want.get(k)} got {got.get(k)}")
        if len(lines) >= 5:
            break
    return "; ".join(lines)


# ---------------------------------------------------------------- devices


def losetup(image):
    return run(["losetup", "--find", "--show", image]).stdout.strip()


def mount(dev, mnt, fstype="ext4"):
    os.makedirs(mnt, exist_ok=True)
    run(["mount", "-t", fstype, dev, mnt])


def umount(mnt):
    run(["umount", mnt])


FS_IOC_GET_ENCRYPTION_POLICY_EX = 0xC0096616


def is_encrypted(path):
    """Whether `path` has an fscrypt policy (ENODATA: none)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.ioctl(fd, FS_IOC_GET_ENCRYPTION_POLICY_EX, bytearray(struct.pack("<Q", 24) + bytes(24)))
        return True
    except OSError as e:
        if e.errno == errno.ENODATA:
            return False
        raise
    finally:
        os.close(fd)


# ---------------------------------------------------------------- power cut


class Recording:
    """A conversion recorded with dm-log-writes, and the state before it started."""

    TAG = ""  # what names a subclass's recordings (and --cases matches): fs/mode/TAG
    # Whether its ext4 recordings replay on the host (natively, points in parallel) rather than
    # in the guest: only what the host kernel can mount and check (it has no casefold, no f2fs).
    HOST = True

    def __init__(self, work, fstype, mode):
        self.work = work
        self.fstype = fstype
        self.mkfs, self.fsck_cmd, self.share = FILESYSTEMS[fstype]
        self.mode = mode
        self.name = f"{fstype}/{mode}{self.TAG}"
        self.mnt = os.path.join(work, "mnt")  # the same path for recording and replays
        self.src = os.path.join(self.mnt, "home", "alice")
        self.keystore = os.path.join(self.mnt, "keystore")
        self.size = 128 << 20
        self.data_img = os.path.join(work, "data.img")
        self.log_img = os.path.join(work, "log.img")
        self.replay_img = os.path.join(work, "replay.img")
        self.check_img = os.path.join(work, "check.img")
        self.ds = Dirseal(self.keystore, os.path.join(work, "etc"))
        self.secret = PASSWORD  # what the protector takes (a password, or a TPM PIN)
        if mode == "move":
            self.ds.env["DIRSEAL_MOVE_BATCH"] = str(MOVE_BATCH)
        if mode in ("move", "decrypt-move"):
            self.ds.env["DIRSEAL_MOVE_CHUNK"] = str(MOVE_CHUNK)
        self.decrypt = mode in DECRYPT_MODES

    @classmethod
    def on_host(cls, fstype):
        return fstype == "ext4" and cls.HOST

    def convert_args(self):
        if self.decrypt:
            return ["decrypt", self.src, "--yes", *DECRYPT_MODES[self.mode][0]]
        return ["convert", self.src, "--yes", "--protector-name", "owner", *CONVERT_MODES[self.mode][0]]

    def before_recording(self):
        """Set-up outside the recorded window (a subclass's)."""

    def at_start(self):
        """Right before the recorded window opens: what replays need of the state then, besides
        the disk (a subclass's)."""

    def workload(self):
        """What is recorded (between the marks): the conversion."""
        self.ds(*self.convert_args(), stdin=self.secret)

    def record(self):
        for img, size in ((self.data_img, self.size), (self.log_img, 1 << 30)):
            with open(img, "wb") as f:
                f.truncate(size)
        data_dev, log_dev = losetup(self.data_img), losetup(self.log_img)
        sectors = self.size // 512
        run(["dmsetup", "create", "--noudevsync", "lw", "--table", f"0 {sectors} log-writes {data_dev} {log_dev}"])
        lw = "/dev/mapper/lw"
        run([*self.mkfs, lw])
        mount(lw, self.mnt, self.fstype)
        os.makedirs(os.path.dirname(self.src))
        make_tree(self.src, seed=14)
        if self.mode == "move":
            add_move_batches(self.src, seed=25)
        self.before_recording()
        self.manifest = manifest(self.src)
        if self.decrypt:
            # Only the decrypt is recorded: the conversion before it is not cut.
            self.ds("convert", self.src, "--yes", "--protector-name", "owner", "--mode", "copy", stdin=PASSWORD)
        run(["sync"])
        self.at_start()
        run(["dmsetup", "message", "lw", "0", "mark", "convert-start"])
        t0 = time.time()
        self.workload()
        self.convert_secs = time.time() - t0
        run(["dmsetup", "message", "lw", "0", "mark", "convert-end"])
        self.check_done(self.mnt, "the recorded run")
        umount(self.mnt)
        run(["dmsetup", "remove", "--noudevsync", "lw"])
        run(["losetup", "-d", data_dev])
        run(["losetup", "-d", log_dev])
        self.read_log()
        # The replayer is checked against the kernel: the whole log gives the device's bytes.
        with open(self.replay_img, "wb") as f:
            f.truncate(self.size)
        run([self.replayer(), "replay", self.log_img, self.replay_img, "0", str(len(self.entries))])
        if sha256_file(self.replay_img) != sha256_file(self.data_img):
            raise Failure("replaying the whole log does not reproduce the recorded device")
        os.unlink(self.data_img)

    def read_log(self):
        """The log's entries (index, flags, sector, sectors, mark) and the window's marks."""
        entries = run([self.replayer(), "list", self.log_img]).stdout.splitlines()
        self.entries = [line.split(" ", 4) for line in entries]
        marks = {e[4]: int(e[0]) for e in self.entries if int(e[1]) & 8}
        self.start, self.end = marks["convert-start"], marks["convert-end"]

    # What travels from the guest to the host with the log: the recording's kind and paths, the
    # original tree's manifest (a subclass adds its own, with the files it copies beside).
    def export(self, dest):
        os.makedirs(dest)
        run(["cp", "--sparse=always", self.log_img, os.path.join(dest, "log.img")])
        meta = {"name": self.name, "tag": self.TAG, "fstype": self.fstype, "mode": self.mode,
                "work": self.work, "size": self.size, "manifest": self.manifest,
                "convert_secs": self.convert_secs}
        with open(os.path.join(dest, "meta.json.tmp"), "w") as f:
            json.dump(meta, f)
        os.rename(os.path.join(dest, "meta.json.tmp"), os.path.join(dest, "meta.json"))

    @staticmethod
    def load(src):
        """A recording exported to `src` (export), ready to replay."""
        with open(os.path.join(src, "meta.json")) as f:
            meta = json.load(f)
        kind = next(k for k in RECORDING_KINDS if k.TAG == meta["tag"])
        rec = kind(meta["work"], meta["fstype"], meta["mode"])
        rec.log_img = os.path.join(src, "log.img")
        rec.size, rec.manifest, rec.convert_secs = meta["size"], meta["manifest"], meta["convert_secs"]
        rec.loaded(src)
        rec.read_log()
        return rec

    def loaded(self, src):
        """What a subclass takes back from an exported recording."""

    @contextlib.contextmanager
    def point_env(self, scratch):
        """What a host replay needs around its check besides the disk (a subclass's: the TPM)."""
        yield

    def replayer(self):
        return os.path.join(ARGS.bin, "replay-log")

    def points(self):
        """Flush points within the conversion, and points between them (the unflushed tail of
        the log after them dropped); a point = the number of log entries applied."""
        flushes, between = [], []
        for e in self.entries[self.start + 1 : self.end + 1]:
            i, flags = int(e[0]), int(e[1])
            if flags & 8:
                continue
            (flushes if flags & 3 else between).append(i + 1)
        return flushes, between

    def all_points(self):
        flushes, between = self.points()
        return sorted(set(flushes) | set(between) | {self.start + 1, self.end + 1})

    def fixed_points(self, flushes):
        """The minimum set a sampled run always replays: the last point (the finished run) and
        flush points evenly spaced from the first (no randomness: every run covers them)."""
        k = max(2, round(ARGS.min_points * self.share))
        step = max(1, len(flushes) / k)
        even = {flushes[int(i * step)] for i in range(k) if int(i * step) < len(flushes)}
        return sorted(even | {self.end + 1})

    def check_done(self, mnt, what):
        """The directory is encrypted, opens through the keystore and holds the original tree
        (decrypt: it is plaintext, holds the original tree, and its policy record is gone), and
        nothing else is left on the filesystem."""
        if self.decrypt:
            if is_encrypted(self.src):
                raise Failure(f"{what}: {self.src} is still encrypted after the decrypt")
            policies = os.path.join(self.keystore, "policies")
            left = os.listdir(policies) if os.path.isdir(policies) else []
            if left:
                raise Failure(f"{what}: policy records left after the decrypt: {left}")
        elif not is_encrypted(self.src):
            raise Failure(f"{what}: {self.src} is not encrypted after the conversion")
        if not self.decrypt:
            # Through the key's removal and the protector: what the keystore holds must open it.
            self.ds("lock", self.src)
            self.ds("unlock", self.src, stdin=self.secret)
        got = manifest(self.src)
        if got != self.manifest:
            raise Failure(f"{what}: the tree differs from the original: {diff(self.manifest, got)}")
        left = leftovers(mnt, self.src, self.keystore)
        if left:
            raise Failure(f"{what}: leftovers on the filesystem: {left[:5]}")

    def fsck(self, image, what):
        p = run([*self.fsck_cmd, image], check=False)
        if p.returncode != 0 or "[FAIL]" in p.stdout:
            raise Failure(f"{what}: {self.fsck_cmd[0]} found problems (status {p.returncode}): {p.stdout.strip()[-400:]}")

    def check_point(self, n, image):
        """Power cut after `n` log entries, the disk then being `image`: fsck, mount, the
        directory is the untouched plaintext or an encrypted tree, then the same convert finishes
        the job."""
        what = f"point {n}"
        log(f"== {what}")
        dev = losetup(image)
        try:
            # The kernel replays the journal; only then must e2fsck find nothing.
            mount(dev, self.mnt, self.fstype)
            umount(self.mnt)
            self.fsck(image, what)
            mount(dev, self.mnt, self.fstype)
            state = "plaintext"
            if not os.path.isdir(self.src):
                raise Failure(f"{what}: {self.src} is gone")
            if self.decrypt:
                return self.check_decrypt_point(image, what)
            if is_encrypted(self.src):
                state = "encrypted"
            elif not CONVERT_MODES[self.mode][1]:
                state = "moving or plaintext"
            else:
                got = manifest(self.src)
                if got != self.manifest:
                    raise Failure(f"{what}: the plaintext was changed: {diff(self.manifest, got)}")
            again = self.ds(*self.convert_args(), stdin=self.secret, check=False)
            if again.returncode != 0:
                # Only a finished conversion may refuse a second run.
                if state != "encrypted" or "already encrypted" not in again.stderr:
                    raise Failure(f"{what}: running convert again failed: {again.stderr.strip()}")
                self.ds("unlock", self.src, stdin=self.secret)
            self.check_done(self.mnt, what)
            umount(self.mnt)
            self.fsck(image, what + " after the resume")
            return state
        finally:
            if os.path.ismount(self.mnt):
                run(["umount", "-l", self.mnt], check=False)
            run(["losetup", "-d", dev], check=False)

    def check_decrypt_point(self, image, what):
        """A decrypt cut by the power: the directory is the encrypted tree (before the swap; the
        key is gone, so it is checked once the same decrypt has finished) or the whole plaintext
        (after it); the same `dirseal decrypt` (asking the password to load the key) finishes."""
        state = "encrypted"
        if not is_encrypted(self.src):
            state = "plaintext"
            got = manifest(self.src)
            if got != self.manifest:
                raise Failure(f"{what}: the plaintext after the swap differs: {diff(self.manifest, got)}")
        again = self.ds(*self.convert_args(), stdin=self.secret, check=False)
        if again.returncode != 0:
            # Only a finished decrypt may refuse a second run.
            if state != "plaintext" or "not encrypted" not in again.stderr:
                raise Failure(f"{what}: running decrypt again failed: {again.stderr.strip()}")
        self.check_done(self.mnt, what)
        umount(self.mnt)
        self.fsck(image, what + " after the resume")
        return state


def leftovers(mnt, src, keystore):
    """Everything on the filesystem at `mnt` besides the tree, the keystore and each work dir's
    journal and lock (a finished run leaves nothing else: no staging, no stray copy of the
    plaintext), as paths relative to `mnt`."""
    keep = {os.path.relpath(src, mnt), os.path.relpath(keystore, mnt)}
    # The directories walked: those on the way to them, the work dirs' parents, lost+found.
    ways = {".", ".dirseal", ".dirseal/convert", "lost+found"}
    for p in keep:
        while p not in ("", "."):
            p = os.path.dirname(p)
            ways.add(p or ".")
    out = []
    for dirpath, dirnames, filenames in os.walk(mnt):
        rel = os.path.relpath(dirpath, mnt)
        walk = []
        for n in sorted(dirnames):
            p = os.path.normpath(os.path.join(rel, n))
            if p in keep:
                continue
            if p in ways or rel == ".dirseal/convert":
                walk.append(n)
            else:
                out.append(p)
        dirnames[:] = walk
        for n in sorted(filenames):
            if os.path.dirname(rel) == ".dirseal/convert" and n in ("journal.json", "lock"):
                continue
            out.append(os.path.normpath(os.path.join(rel, n)))
    return out


# Move recordings: files per batch (DIRSEAL_MOVE_BATCH), so add_move_batches' directory moves in
# several batches, each copied in parallel; bytes of data per chunk (DIRSEAL_MOVE_CHUNK), so the
# sparse file and the hard-link group (DATA_RUN-byte runs of data) move chunk by chunk.
MOVE_BATCH = 64
MOVE_CHUNK = 1 << 20
DATA_RUN = 512 << 10
TPM_PIN = "2580\n"


def add_move_batches(root, seed):
    """What a move recording adds to make_tree (issue 25): a directory of 300 small files (several
    batches of MOVE_BATCH, copied on the pool's threads) and a hard-link group of a file larger
    than a chunk, its three names in three directories (moved once, chunk by chunk, then linked)."""
    rnd = random.Random(seed)
    many = os.path.join(root, "many")
    os.mkdir(many)
    for i in range(300):
        with open(os.path.join(many, f"small-{i:03}"), "wb") as fh:
            fh.write(rnd.randbytes(rnd.choice([0, 10, 700, 4096, 9000])))
    grp = os.path.join(root, "group")
    os.mkdir(grp)
    large = os.path.join(grp, "linked-large.img")
    with open(large, "wb") as fh:
        fh.truncate(20 << 20)
        for off in (0, 5 << 20, 16 << 20, (20 << 20) - DATA_RUN):
            fh.seek(off)
            fh.write(rnd.randbytes(DATA_RUN))
    os.link(large, os.path.join(root, "linked-large-2"))
    os.link(large, os.path.join(many, "linked-large-3"))
    os.chown(large, 1000, 1000)
    t = 1_650_000_000_000_000_007
    for p in (many, grp, large):
        os.utime(p, ns=(t, t))


def tpm_owned(ds):
    """Takes the TPM's lockout once per guest (a PIN protector needs it); returns whether this
    call did."""
    if json.loads(ds("tpm2", "status", "--json").stdout).get("lockout_owned"):
        return False
    ds("tpm2", "setup", "--yes")
    return True


class TpmRecording(Recording):
    """A recorded conversion whose protector is a TPM2 protector with a PIN (through the guest's
    /dev/tpmrm0): after each replay the same command must finish and the PIN must unlock."""

    TAG = "/tpm2"
    # Of the sampled points, half an ext4 recording's share (the TPM's steps are the password's).
    SHARE = 0.5

    def __init__(self, work, fstype, mode):
        super().__init__(work, fstype, mode)
        self.secret = TPM_PIN
        self.share = self.SHARE

    def convert_args(self):
        return [*super().convert_args(), "--protector-type", "tpm2"]

    def before_recording(self):
        if not os.path.exists("/dev/tpmrm0"):
            raise Failure("the guest has no /dev/tpmrm0 (is swtpm attached?)")
        tpm_owned(self.ds)

    def at_start(self):
        # The TPM as the recording starts (its lockout owned, its seeds), from the host swtpm's
        # state dir (the results share): each host replay starts a swtpm of its own from it.
        self.tpm_saved = os.path.join(self.work, "tpm")
        os.makedirs(self.tpm_saved)
        shutil.copy(os.path.join(ARGS.tpm_state, SWTPM_STATE), self.tpm_saved)

    def export(self, dest):
        super().export(dest)
        shutil.copytree(self.tpm_saved, os.path.join(dest, "tpm"))

    def loaded(self, src):
        self.tpm_saved = os.path.join(src, "tpm")

    @contextlib.contextmanager
    def point_env(self, scratch):
        state = os.path.join(scratch, "tpm")
        os.makedirs(state)
        shutil.copy(os.path.join(self.tpm_saved, SWTPM_STATE), state)
        with swtpm(state) as tcti:
            own = Dirseal(self.keystore, os.path.join(scratch, "etc"), tcti)
            self.ds.env["DIRSEAL_CONFIG"] = own.env["DIRSEAL_CONFIG"]
            yield


# The file a swtpm keeps a TPM2's permanent state in (its seeds, NV, lockout), in its state dir.
SWTPM_STATE = "tpm2-00.permall"


@contextlib.contextmanager
def swtpm(state):
    """A swtpm on two free 127.0.0.1 ports with its state in `state`; yields its TCTI."""
    for _ in range(5):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65535:
            continue
        proc = subprocess.Popen(
            ["swtpm", "socket", "--tpm2", "--server", f"type=tcp,port={port},bindaddr=127.0.0.1",
             "--ctrl", f"type=tcp,port={port + 1},bindaddr=127.0.0.1", "--flags", "not-need-init,startup-clear",
             "--tpmstate", f"dir={state}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            t0 = time.time()
            while proc.poll() is None and time.time() - t0 < 10:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.02)
            if proc.poll() is not None:
                log(f"swtpm on port {port} exited: {proc.stderr.read().decode().strip()}")
                continue  # a port taken between the probe and its bind: another pair
            yield f"swtpm:host=127.0.0.1,port={port}"
            return
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
    raise Failure("swtpm did not start (5 tries)")


class CasefoldRecording(Recording):
    """A copy conversion recorded on a casefold+encrypt ext4, the tree holding a Proton-like
    prefix in a casefolded directory (issue 43): after each replay and resume, names are found
    in the wrong case and lsattr (the casefold flag F on the prefix's directories) is unchanged."""

    TAG = "/casefold"
    HOST = False  # the host kernel has no casefold
    # Of the sampled points, half an ext4 recording's share (the copy's steps are the plain
    # recording's; only what the directories are made with differs).
    SHARE = 0.5

    def __init__(self, work, fstype, mode):
        super().__init__(work, fstype, mode)
        self.share = self.SHARE
        self.mkfs = ["mkfs.ext4", "-q", "-b", "4096", "-O", "casefold,encrypt", "-E", "nodiscard"]

    def before_recording(self):
        proton_prefix(self.src, project_ids=False)
        self.flags = lsattr_of(self.src)
        pfx = os.path.join(self.src, "compatdata/123/pfx")
        casefolded = [l for l in self.flags if l.split(" ", 2)[2].startswith(pfx) and "F" in l.split()[1]]
        # The prefix and its 6 directories below: without them the checks after would prove nothing.
        if len(casefolded) < 7:
            raise Failure(f"the casefolded prefix was not made: {casefolded}")
        case_insensitive(self.src, "before the recording")

    def check_done(self, mnt, what):
        super().check_done(mnt, what)
        case_insensitive(self.src, what)
        got = lsattr_of(self.src)
        if got != self.flags:
            raise Failure(f"{what}: lsattr differs: {[l for l in got if l not in self.flags][:3]} "
                          f"instead of {[l for l in self.flags if l not in got][:3]}")


class LiveRecording(Recording):
    """A live conversion recorded (issue 42): `convert --live` copies while a program keeps the
    directory in use (its cwd inside) and stops caught up; the tree changes (each kind a catch-up
    pass must see); its background run, run again in the foreground, makes one catch-up pass; the
    program ends and the run commits. After each replay the boot-time run (`convert --scheduled`,
    the held key) finishes it, and the directory must hold the plaintext as the cut left it
    (with the changes or without them, as far as they had reached the disk); one cut before the
    conversion was prepared is converted anew."""

    TAG = "/live"
    # Replayed in the guest: its check (the boot-time run with the held key, the two trees it may
    # find) is its own, not yet the host's per-point one.
    HOST = False
    # Of the sampled points, half an ext4 recording's share (the copy's steps are the plain
    # recording's; the passes add their manifests and records).
    SHARE = 0.5

    def __init__(self, work, fstype, mode):
        super().__init__(work, fstype, mode)
        self.share = self.SHARE

    def before_recording(self):
        self.holder = subprocess.Popen(["sleep", "3600"], cwd=self.src)

    def status(self):
        p = self.ds("convert", "--status", "--json", self.src, check=False)
        return json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else {}

    def wait_for(self, what, ok, seconds=1800):
        end = time.time() + seconds
        while not ok(self.status()):
            if time.time() > end:
                raise Failure(f"the live conversion never got {what}: {self.status()}")
            time.sleep(1)

    def workload(self):
        self.original = self.manifest
        self.ds("convert", "--live", self.src, "--yes", "--protector-name", "owner", stdin=self.secret)
        self.wait_for("caught up", lambda st: st.get("state") == "caught up" and "waiting" in st.get("live", ""))
        # Its background run waits for the program to end; stopped (SIGTERM: it stays resumable).
        stop_live_run(self.src)
        self.wait_for("stopped", lambda st: st.get("running") is False)
        run(["dmsetup", "message", "lw", "0", "mark", "changing"])
        live_changes(self.src)
        self.manifest = manifest(self.src)
        worker = subprocess.Popen([self.ds.bin, "convert", "--live-worker", self.src], env=self.ds.env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in worker.stdout:
            log(f"  worker: {line.rstrip()}")
            if "caught up" in line:
                break
        self.holder.kill()
        self.holder.wait()
        rest = worker.communicate(timeout=1800)[0]
        log("  worker: " + rest.strip().replace("\n", "\n  worker: "))
        if worker.returncode != 0 or "is encrypted" not in rest:
            raise Failure(f"the live commit failed ({worker.returncode}): {rest.strip()[-400:]}")
        if self.status().get("passes", 0) < 3:
            raise Failure(f"no catch-up pass was recorded: {self.status()}")

    def points(self):
        flushes, between = super().points()
        self.changing_at = next(int(e[0]) for e in self.entries if int(e[1]) & 8 and e[4] == "changing")
        return flushes, between

    def fixed_points(self, flushes):
        """As many as the base class's, placed where a live conversion's steps are: the middle of
        the first copy (before the changes), the middle of what came after them (the catch-up
        pass and the commit), and the last point."""
        k = max(2, round(ARGS.min_points * self.share))
        before = [p for p in flushes if p <= self.changing_at]
        after = [p for p in flushes if p > self.changing_at]
        picks = {part[len(part) * i // (k // 2 + 1)] for part in (before, after) if part for i in range(1, k // 2 + 1)}
        return sorted(picks | {self.end + 1})

    def check_point(self, n, image):
        what = f"point {n}"
        log(f"== {what}")
        dev = losetup(image)
        changed = self.manifest
        try:
            mount(dev, self.mnt, self.fstype)
            umount(self.mnt)
            self.fsck(image, what)
            mount(dev, self.mnt, self.fstype)
            if not os.path.isdir(self.src):
                raise Failure(f"{what}: {self.src} is gone")
            if is_encrypted(self.src):
                state, want = "encrypted", changed
            else:
                want = manifest(self.src)
                state = {repr(self.original): "original", repr(changed): "changed"}.get(repr(want), "partly changed")
                if n <= self.changing_at and state != "original":
                    raise Failure(f"{what}: the plaintext was changed: {diff(self.original, want)}")
            self.ds("convert", "--scheduled")
            if not is_encrypted(self.src):
                if self.status().get("state") not in (None, "aborted"):
                    raise Failure(f"{what}: the boot-time run left it {self.status()}")
                state += ", not prepared"
                self.ds(*self.convert_args(), stdin=self.secret)
            self.manifest = want
            self.check_done(self.mnt, what)
            umount(self.mnt)
            self.fsck(image, what + " after the resume")
            return state
        finally:
            self.manifest = changed
            if os.path.ismount(self.mnt):
                run(["umount", "-l", self.mnt], check=False)
            run(["losetup", "-d", dev], check=False)


def stop_live_run(src):
    """SIGTERMs the background run of `src`'s live conversion (its lock names it): it stops at its
    next safe point, resumable."""
    lock = f"/run/dirseal/live-{hashlib.sha256(src.encode()).hexdigest()[:16]}.lock"
    with open(lock) as f:
        os.kill(int(f.read().strip()), 15)


def live_changes(root):
    """Each kind of change a catch-up pass must bring in, on a make_tree tree: an append, an
    in-place rewrite (same size and times), a rename across directories, a directory replaced
    by a file, a deletion, a new hard link, xattr and mode changes, a new file."""
    dirs = sorted(os.path.join(dp, n) for dp, dn, _ in os.walk(root) for n in dn)
    leaf = next(d for d in dirs if not any(os.path.isdir(os.path.join(d, n)) for n in os.listdir(d))
                and not os.path.exists(os.path.join(d, "sparse.img")))
    files = sorted(os.path.join(dp, n) for dp, _, fn in os.walk(root) for n in fn
                   if n.startswith("file-") and not dp.startswith(leaf) and os.path.getsize(os.path.join(dp, n)) > 0)
    with open(files[0], "ab") as f:
        f.write(b"appended while live")
    st = os.lstat(files[1])
    with open(files[1], "r+b") as f:
        f.write(b"X")
    os.utime(files[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    elsewhere = root if os.path.dirname(files[2]) != root else next(d for d in dirs if not d.startswith(leaf))
    os.rename(files[2], os.path.join(elsewhere, "moved-here"))
    shutil.rmtree(leaf)
    with open(leaf, "wb") as f:
        f.write(b"a file where a directory was")
    os.unlink(files[3])
    os.link(files[4], os.path.join(root, "new-link"))
    os.setxattr(files[5], "user.new", b"set while live")
    os.chmod(files[6], 0o640)
    with open(os.path.join(root, "new-file"), "wb") as f:
        f.write(b"written while live")

# Every kind of recording (what an exported one's tag names).
RECORDING_KINDS = (Recording, TpmRecording, CasefoldRecording, LiveRecording)


def spread(items, k, rnd):
    """Up to k items: evenly spaced, plus a few at random."""
    if len(items) <= k:
        return list(items)
    if k <= 0:
        return []
    even = max(1, k - k // 4)
    step = len(items) / even
    picked = {items[int(i * step)] for i in range(even)}
    picked |= set(rnd.sample(items, k // 4))
    return sorted(picked)


class Progress:
    """A console line at least every PERIOD seconds while points are replayed: the host's watchdog
    (scripts/vm-test.sh) takes a silent guest for a hung one."""

    PERIOD = 30

    def __init__(self):
        self.last = time.time()

    def tick(self, msg):
        if time.time() - self.last >= self.PERIOD:
            say(msg)
            self.last = time.time()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def replay_points(rec, name, points, progress, deadline, tally):
    """Replays `points` (ascending) onto a zeroed image, each checked on a copy; stops early,
    between points, once `deadline` (time.time()) is passed. Returns the seconds each point took."""
    with open(rec.replay_img, "wb") as f:
        f.truncate(rec.size)
    applied = 0
    took = []
    for n in points:
        if deadline is not None and time.time() >= deadline:
            break
        t = time.time()
        run([rec.replayer(), "replay", rec.log_img, rec.replay_img, str(applied), str(n)])
        applied = n
        tally["replayed"] += 1
        try:
            run(["cp", "--sparse=always", rec.replay_img, rec.check_img])
            st = rec.check_point(n, rec.check_img)
            tally["states"][st] = tally["states"].get(st, 0) + 1
        except Failure as e:
            tally["lost"] += 1
            say(f"powercut[{name}]: LOST at {e}")
        took.append(time.time() - t)
        progress.tick(f"powercut[{name}]: {tally['replayed']} points replayed so far, {tally['lost']} lost")
    return took


def recording_runs():
    """The recordings of this run: (filesystem, mode, kind), named fs/mode[TAG]."""
    runs = [(f, m, Recording) for f in FILESYSTEMS for m in [*CONVERT_MODES, *DECRYPT_MODES]]
    if ARGS.mode != "full":
        # The sample keeps CI's time: decrypt runs the engine's code paths of convert (which
        # both filesystems record), so its f2fs recordings are replayed with --full only.
        runs = [r for r in runs if not (r[0] == "f2fs" and r[1] in DECRYPT_MODES)]
    runs.append(("ext4", "copy", TpmRecording))
    runs.append(("ext4", "copy", CasefoldRecording))
    # The live recording is in full runs and when asked (`--cases /live`), not CI's sample: its
    # background run did not start in one of two guest runs (left "copying, not running" until
    # the stall watchdog stopped the guest), a flake not understood yet.
    if ARGS.mode == "full" or (ARGS.cases and "/live" in ARGS.cases):
        runs.append(("ext4", "copy", LiveRecording))
    if ARGS.cases:
        runs = [r for r in runs if ARGS.cases in f"{r[0]}/{r[1]}{r[2].TAG}"]
    if ARGS.recordings:
        runs = [r for r in runs if f"{r[0]}/{r[1]}{r[2].TAG}" in ARGS.recordings.split(",")]
    return runs


def exported(run_):
    """Whether this run's recording goes to the host (--export) instead of being replayed here."""
    fstype, _, kind = run_
    return bool(ARGS.export) and kind.on_host(fstype)


def powercut(summary):
    """Records each conversion. Those the host replays (--export) are copied out; the others are
    replayed here. Sampled: each recording replays its fixed points, then as many more (flush
    points and points between, 20:6) as fit its share of the time budget that is left, measured
    by its own points: a slow machine replays fewer, never fails for being slow. Full: every point."""
    tally = {"replayed": 0, "lost": 0, "states": {}}
    fixed_total = 0
    runs = recording_runs()
    t_all = time.time()
    deadline = t_all + ARGS.budget
    progress = Progress()
    for idx, (fstype, mode, kind) in enumerate(runs):
        tag = kind.TAG
        name = f"{fstype}/{mode}{tag}"
        work = f"/tmp/powercut-{fstype}-{mode}{tag.replace('/', '-')}"
        rec = kind(work, fstype, mode)
        t0 = time.time()
        say(f"powercut[{name}]: recording the conversion")
        rec.record()
        record_secs = time.time() - t0
        flushes, between = rec.points()
        tally["states"] = {}
        before = tally["replayed"]
        if exported((fstype, mode, kind)):
            rec.export(os.path.join(ARGS.export, os.path.basename(work)))
            say(f"powercut[{name}]: recorded {len(rec.entries)} log entries (conversion {rec.convert_secs:.1f} s, "
                f"{len(flushes)} flush points, {len(between)} between); replayed on the host")
        elif ARGS.mode == "full":
            pts = rec.all_points()
            say(f"powercut[{name}]: recorded {len(rec.entries)} log entries (conversion {rec.convert_secs:.1f} s); "
                f"replaying all {len(pts)} points ({len(flushes)} flush points)")
            replay_points(rec, name, pts, progress, None, tally)
        else:
            fixed = rec.fixed_points(flushes)
            fixed_total += len(fixed)
            say(f"powercut[{name}]: recorded {len(rec.entries)} log entries (conversion {rec.convert_secs:.1f} s, "
                f"{len(flushes)} flush points, {len(between)} between); replaying {len(fixed)} fixed points")
            took = replay_points(rec, name, fixed, progress, None, tally)
            # This recording's share of what is left (f2fs weighs half) among those replayed
            # here, keeping time to record the ones after it.
            later = runs[idx + 1 :]
            here = [r for r in later if not exported(r)]
            weight = rec.share / (rec.share + sum(getattr(k, "SHARE", FILESYSTEMS[f][2]) for f, _, k in here))
            mine = max(0.0, deadline - time.time() - record_secs * len(later)) * weight
            per_point = max(sum(took) / max(1, len(took)), 0.1)
            k = int(mine / per_point)
            rnd = random.Random(f"{ARGS.seed}-{name}")
            rest_f = [p for p in flushes if p not in fixed]
            rest_b = [p for p in between if p not in fixed]
            kb = min(len(rest_b), k * 6 // 26)
            kf = min(len(rest_f), k - kb)
            kb = min(len(rest_b), k - kf)
            extra = sorted(set(spread(rest_f, kf, rnd)) | set(spread(rest_b, kb, rnd)))
            if extra:
                say(f"powercut[{name}]: {per_point:.1f} s per point; {len(extra)} more points fit the budget")
                replay_points(rec, name, extra, progress, time.time() + mine, tally)
        if not exported((fstype, mode, kind)):
            say(f"powercut[{name}]: {tally['replayed'] - before} points {tally['states']} in {time.time() - t0:.0f} s")
        shutil.rmtree(work, ignore_errors=True)
    secs = time.time() - t_all
    how = "every point" if ARGS.mode == "full" else (
        f"{fixed_total} fixed + {tally['replayed'] - fixed_total} within the {ARGS.budget} s budget")
    if ARGS.export:
        # The host adds its replays to these and prints the one `powercut:` line (host_replay).
        with open(os.path.join(ARGS.out, "powercut-guest.json"), "w") as f:
            json.dump({"replayed": tally["replayed"], "lost": tally["lost"], "fixed": fixed_total,
                       "secs": round(secs), "budget": ARGS.budget}, f)
        summary.append(f"powercut in the guest: {tally['replayed']} points replayed, {tally['lost']} lost "
                       f"({how}, {secs:.0f} s with the recordings)")
        return tally["lost"] == 0
    summary.append(f"powercut: {tally['replayed']} points replayed, {tally['lost']} lost ({how}, {secs:.0f} s)")
    return tally["lost"] == 0 and tally["replayed"] > 0


# ---------------------------------------------------------------- power cut: replays on the host

# Set before the host's worker processes fork: the recordings by directory name, the time after
# which sampled points are skipped.
HOST_RECS = {}
HOST_DEADLINE = None
RESULTS = "results"  # per recording: a line per point, "N<TAB>STATE<TAB>SECONDS[<TAB>WHY LOST]"


def isolated(fn):
    """fn()'s result (JSON), fn run as pid 1 of a pid namespace and in a mount namespace of its
    own, with its own /proc: its point mounts at the recorded path, as the guest's did, while
    other workers' points are mounted there too, and dirseal's check that nothing uses the
    directory sees only this point's processes (it goes by path)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(0x00020000 | 0x20000000) != 0:  # CLONE_NEWNS | CLONE_NEWPID
                raise OSError(ctypes.get_errno(), "unshare")
            inner = os.fork()  # the namespace's pid 1 (its first child: the namespace ends with it)
            if inner == 0:
                try:
                    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
                    subprocess.run(["mount", "-t", "proc", "proc", "/proc"], check=True)
                    out = {"ok": fn()}
                except BaseException as e:  # noqa: BLE001 - reported to the parent
                    out = {"error": f"{type(e).__name__}: {e}"}
                with os.fdopen(w, "w") as f:
                    json.dump(out, f)
                os._exit(0)
            os.waitpid(inner, 0)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        data = f.read()
    os.waitpid(pid, 0)
    out = json.loads(data) if data else {"error": "the isolated check died"}
    if "error" in out:
        raise Failure(out["error"])
    return out["ok"]


def host_point(task):
    """One point on the host, in a scratch dir of its own: a sparse copy of the pre-image (the
    disk when the recording's window opened), the log's entries up to the point on top, then the
    checks the guest makes (isolated). Returns (recording, point, state or None when skipped,
    why lost, seconds, log)."""
    global LOG
    slug, n, fixed = task
    if not fixed and HOST_DEADLINE is not None and time.time() >= HOST_DEADLINE:
        return slug, n, None, None, 0.0, ""
    rec = HOST_RECS[slug]
    LOG = io.StringIO()
    t = time.time()
    scratch = os.path.join(ARGS.scratch, f"{slug}-{n}")
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    img = os.path.join(scratch, "disk.img")

    def check():
        global LOG
        LOG = io.StringIO()  # what the parent gets back: this point's log only
        try:
            with rec.point_env(scratch):
                return [rec.check_point(n, img), None, LOG.getvalue()]
        except Failure as e:
            return ["LOST", str(e), LOG.getvalue()]

    try:
        run(["cp", "--reflink=auto", "--sparse=always", rec.pre_img, img])
        run([rec.replayer(), "replay", rec.log_img, img, str(rec.start + 1), str(n)])
        state, lost, text = isolated(check)
        LOG.write(text)
    except Exception as e:  # noqa: BLE001 - a point that cannot be checked counts against the run
        state, lost = "LOST", f"point {n}: the check broke: {type(e).__name__}: {e}"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return slug, n, state, lost, time.time() - t, LOG.getvalue()


def read_results(path):
    """A recording's results file: point -> (state, seconds, why lost)."""
    done = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 3:
                    done[int(parts[0])] = (parts[1], float(parts[2]), parts[3] if len(parts) > 3 else "")
    return done


def sample_queue(recs, rnd):
    """Sampled points in the order they are replayed: every recording's fixed points, then the
    rest of its points shuffled (flush points and points between, 20:6), taken from the
    recordings in turn by their shares: whatever prefix fits the budget is a fair sample."""
    fixed, rest = [], {}
    for slug, rec in recs.items():
        flushes, between = rec.points()
        fx = rec.fixed_points(flushes)
        fixed += [(slug, n, True) for n in fx]
        f = [p for p in flushes if p not in fx]
        b = [p for p in between if p not in fx]
        rnd.shuffle(f)
        rnd.shuffle(b)
        mixed = []
        while f or b:
            mixed += f[:20] + b[:6]
            f, b = f[20:], b[6:]
        rest[slug] = mixed
    extra, credit = [], dict.fromkeys(recs, 0.0)
    while any(rest.values()):
        for slug, rec in recs.items():
            credit[slug] += rec.share
            while credit[slug] >= 1 and rest[slug]:
                extra.append((slug, rest[slug].pop(0), False))
                credit[slug] -= 1
    return fixed + extra


def host_replay(summary):
    """Replays the recordings the guest exported (in ARGS.host_replay, a dir per recording) here,
    ARGS.jobs points at a time, each point's result appended to the recording's results file.
    Full: every point not in that file yet (so an interrupted run resumes). Sampled: the fixed
    points, then a sample while ARGS.budget lasts."""
    global HOST_RECS, HOST_DEADLINE
    t_all = time.time()
    root = ARGS.host_replay
    for slug in sorted(os.listdir(root)):
        d = os.path.join(root, slug)
        if not os.path.exists(os.path.join(d, "meta.json")):
            continue
        rec = Recording.load(d)
        if ARGS.recordings and rec.name not in ARGS.recordings.split(","):
            continue
        if ARGS.binaries:
            with open(os.path.join(d, "binaries")) as f:
                if f.read().strip() != ARGS.binaries:
                    say(f"host: {rec.name}: recorded with other binaries, left out")
                    continue
        rec.dir = d
        rec.pre_img = os.path.join(d, "pre.img")
        if not os.path.exists(rec.pre_img):
            with open(rec.pre_img + ".tmp", "wb") as f:
                f.truncate(rec.size)
            run([rec.replayer(), "replay", rec.log_img, rec.pre_img + ".tmp", "0", str(rec.start + 1)])
            os.rename(rec.pre_img + ".tmp", rec.pre_img)
        os.makedirs(rec.mnt, exist_ok=True)
        HOST_RECS[slug] = rec
    if not HOST_RECS:
        say(f"host: no recordings to replay in {root}")
    done = {slug: read_results(os.path.join(rec.dir, RESULTS)) for slug, rec in HOST_RECS.items()}
    if ARGS.mode == "full":
        tasks = [(slug, n, True) for slug, rec in HOST_RECS.items() for n in rec.all_points() if n not in done[slug]]
    else:
        tasks = sample_queue(HOST_RECS, random.Random(ARGS.seed))
        HOST_DEADLINE = t_all + ARGS.budget
    say(f"host: replaying {len(tasks)} points of {', '.join(r.name for r in HOST_RECS.values())}, "
        f"{ARGS.jobs} at a time" + (f", within {ARGS.budget} s after the fixed ones" if HOST_DEADLINE else ""))
    os.makedirs(ARGS.scratch, exist_ok=True)
    tally = {slug: {"replayed": 0, "lost": 0, "secs": 0.0, "states": {}} for slug in HOST_RECS}
    files = {slug: open(os.path.join(rec.dir, RESULTS), "a") for slug, rec in HOST_RECS.items()}
    progress = Progress()
    fixed = sum(1 for t in tasks if t[2])
    with multiprocessing.get_context("fork").Pool(ARGS.jobs) as pool:
        for slug, n, state, lost, secs, text in pool.imap_unordered(host_point, tasks):
            if state is None:
                continue
            t = tally[slug]
            t["replayed"] += 1
            t["secs"] += secs
            t["states"][state] = t["states"].get(state, 0) + 1
            files[slug].write(f"{n}\t{state}\t{secs:.1f}" + (f"\t{lost}" if lost else "") + "\n")
            files[slug].flush()
            if lost:
                t["lost"] += 1
                say(f"powercut[{HOST_RECS[slug].name}] on the host: LOST at {lost}")
            if lost or ARGS.mode != "full":
                LOG.write(text)
            progress.tick(f"host: {sum(x['replayed'] for x in tally.values())} points replayed so far, "
                          f"{sum(x['lost'] for x in tally.values())} lost")
    for f in files.values():
        f.close()
    secs = time.time() - t_all
    for slug, rec in HOST_RECS.items():
        t = tally[slug]
        line = (f"powercut[{rec.name}] on the host: {t['replayed']} points {t['states']} in {t['secs']:.0f} s of "
                f"work, {t['secs'] / max(1, t['replayed']):.1f} s a point")
        if ARGS.mode == "full":
            got = read_results(os.path.join(rec.dir, RESULTS))
            want = rec.all_points()
            gone = sum(1 for s, _, _ in got.values() if s == "LOST")
            line += (f"; of all {len(want)} points {sum(1 for n in want if n in got)} done "
                     f"({'complete' if all(n in got for n in want) else 'not complete'}), {gone} lost")
        say(line)
    host_n = sum(t["replayed"] for t in tally.values())
    host_lost = sum(t["lost"] for t in tally.values())
    guest = {"replayed": 0, "lost": 0, "fixed": 0, "budget": 0}
    gj = os.path.join(ARGS.out, "powercut-guest.json")
    if os.path.exists(gj):
        with open(gj) as f:
            guest = json.load(f)
    n, lost = host_n + guest["replayed"], host_lost + guest["lost"]
    if ARGS.mode == "full":
        how = f"every point: {host_n} on the host in {secs:.0f} s, {guest['replayed']} in the guest"
    else:
        how = (f"{fixed + guest['fixed']} fixed + {n - fixed - guest['fixed']} within the budgets: {host_n} on the "
               f"host in {secs:.0f} s ({ARGS.budget} s budget, {ARGS.jobs} at a time), {guest['replayed']} in the "
               f"guest ({guest['budget']} s budget)")
    summary.append(f"powercut: {n} points replayed, {lost} lost ({how})")
    return lost == 0 and n > 0


# ---------------------------------------------------------------- faults


class FaultDisk:
    """A filesystem on a device-mapper device whose table is swapped to make the disk fail: a
    linear map of a loop device, with ranges or the whole device replaced by the `error` target
    (reads and writes fail) or by `flakey` with `error_writes` (writes fail, reads work)."""

    def __init__(self, work, fstype, mode):
        self.work, self.fstype, self.mode = work, fstype, mode
        self.mkfs, self.fsck_cmd, _ = FILESYSTEMS[fstype]
        os.makedirs(work)
        self.img = os.path.join(work, "disk.img")
        self.size = 160 << 20
        with open(self.img, "wb") as f:
            f.truncate(self.size)
        self.loop = losetup(self.img)
        self.sectors = self.size // 512
        self.name = os.path.basename(work)
        self.dev = f"/dev/mapper/{self.name}"
        run(["dmsetup", "create", "--noudevsync", self.name, "--table", self.linear()])
        run([*self.mkfs, self.dev])
        self.mnt = os.path.join(work, "mnt")
        mount(self.dev, self.mnt, fstype)
        self.src = os.path.join(self.mnt, "home", "alice")
        self.ds = Dirseal(os.path.join(self.mnt, "keystore"), os.path.join(work, "etc"))
        os.makedirs(os.path.dirname(self.src))
        make_tree(self.src, seed=26)
        self.manifest = manifest(self.src)
        run(["sync"])

    def linear(self, start=0, end=None):
        end = self.sectors if end is None else end
        return f"{start} {end - start} linear {self.loop} {start}"

    def table(self, lines):
        """Swaps the live table (resume suspends the device, lets queued I/O finish, swaps).
        `--nolockfs`: a disk that fails does not freeze its filesystem first, and f2fs refuses a
        freeze (EINVAL) while a conversion keeps it dirty, which failed the swap now and then."""
        run(["dmsetup", "load", self.name], stdin="".join(line + "\n" for line in lines))
        run(["dmsetup", "resume", "--noudevsync", "--nolockfs", self.name])

    def heal(self):
        self.table([self.linear()])

    def convert_args(self):
        return ["convert", self.src, "--yes", "--protector-name", "owner", *CONVERT_MODES[self.mode][0]]

    def drop_caches(self):
        run(["sync"], check=False)
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3")

    def replug(self):
        """The device back, as after pulling and plugging it in again: unmount what is left,
        restore the table, repair with fsck (the kernel's journal replay first), mount."""
        if os.path.ismount(self.mnt):
            p = run(["umount", self.mnt], check=False)
            if p.returncode != 0:
                run(["umount", "-l", self.mnt], check=False)
        self.heal()
        if self.fstype == "ext4":
            p = run(["e2fsck", "-fy", self.dev], check=False)
            if p.returncode not in (0, 1):
                raise Failure(f"e2fsck could not repair the filesystem (status {p.returncode})")
        else:
            run(["fsck.f2fs", "-f", "-y", self.dev], check=False)
        mount(self.dev, self.mnt, self.fstype)

    def finish(self, what):
        """The same command finishes the job: the tree is the original, encrypted, and opens."""
        again = self.ds(*self.convert_args(), stdin=PASSWORD, check=False)
        if again.returncode != 0:
            if "already encrypted" not in again.stderr:
                raise Lost(f"{what}: running the same command again failed: {again.stderr.strip()}")
            # Finished before the fault; the replug's unmount dropped the key.
            self.ds("unlock", self.src, stdin=PASSWORD)
        if not is_encrypted(self.src):
            raise Lost(f"{what}: {self.src} is not encrypted after the conversion finished")
        self.ds("lock", self.src)
        self.ds("unlock", self.src, stdin=PASSWORD)
        got = manifest(self.src)
        if got != self.manifest:
            raise Lost(f"{what}: the encrypted tree differs from the original: {diff(self.manifest, got)}")

    def close(self):
        if os.path.ismount(self.mnt):
            run(["umount", "-l", self.mnt], check=False)
        run(["dmsetup", "remove", "--noudevsync", self.name], check=False)
        run(["losetup", "-d", self.loop], check=False)
        shutil.rmtree(self.work, ignore_errors=True)


class Lost(Failure):
    """Data was lost (as opposed to a fault handled without a clear message)."""


def first_extent(path):
    """(physical block, blocks, block size) of the first extent of a file, by FIEMAP."""
    out = run(["filefrag", "-v", path]).stdout
    block = int(out.split("blocks of ")[1].split()[0])
    line = next(line for line in out.splitlines() if line.strip().startswith("0:"))
    fields = line.split(":")
    physical = int(fields[2].split("..")[0])
    length = int(fields[3].split()[0]) if len(fields) > 3 else 1
    return physical, length, block


def fault_unreadable(d):
    """A bad block in a source file: the conversion stops naming the file and the offset, the
    original is untouched (copy) or resumable (move), and once the block reads again the same
    command finishes."""
    victim = os.path.join(d.src, "big.bin")
    physical, length, block = first_extent(victim)
    if length < 3:
        raise Failure(f"{victim}: its first extent has {length} blocks, too few to put a bad one inside")
    bad = (physical + 2) * block // 512  # the file's third block
    d.table([d.linear(0, bad), f"{bad} {block // 512} error", d.linear(bad + block // 512)])
    d.drop_caches()
    p = d.ds(*d.convert_args(), stdin=PASSWORD, check=False)
    if p.returncode == 0:
        raise Failure("the conversion succeeded over an unreadable source block")
    if "big.bin" not in p.stderr or f"reading the original at byte {2 * block}" not in p.stderr:
        raise Failure(f"the error does not name the file and offset: {p.stderr.strip()}")
    d.heal()
    d.drop_caches()
    if CONVERT_MODES[d.mode][1]:
        got = manifest(d.src)
        if got != d.manifest:
            raise Lost(f"the original changed after the failed conversion: {diff(d.manifest, got)}")
    d.finish("after the block healed")


def wait_for_progress(d, proc, seconds=600):
    """Until the conversion has begun (its journal exists) and worked a moment, or exited."""
    wd = os.path.join(d.mnt, ".dirseal", "convert")
    t0 = time.time()
    while time.time() - t0 < seconds and proc.poll() is None:
        if any(os.path.exists(j) for j in glob_journals(wd)):
            time.sleep(random.uniform(0.3, 1.5))
            return
        time.sleep(0.1)


def glob_journals(wd):
    if not os.path.isdir(wd):
        return []
    return [os.path.join(wd, x, "journal.json") for x in os.listdir(wd)]


def fault_mid_run(d, table, what):
    """The disk fails while the conversion runs (`table` from then on), the run stops, the device
    comes back (replug: unmount, fsck, mount) and the same command finishes the job."""
    r, w = os.pipe()
    os.write(w, PASSWORD.encode())
    os.close(w)
    proc = subprocess.Popen([d.ds.bin, *d.convert_args()], stdin=r, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=d.ds.env)
    os.close(r)
    wait_for_progress(d, proc)
    if proc.poll() is None:
        d.table(table)
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise Failure(f"{what}: the conversion hung on the failing disk")
    log(f"  {what}: convert -> {proc.returncode}: {err.strip()[-600:]}")
    if proc.returncode == 0 and "already" not in out:
        # It may have finished before the fault reached it; the resume below still checks.
        log(f"  {what}: the conversion finished before the fault")
    d.replug()
    d.finish(f"after the {what}")


def fault_live(d):
    """Writes fail during a live conversion's catch-up pass (after the tree changed): the run stops
    with a clear message, the directory is untouched, and once the device is back the boot-time
    run (`convert --scheduled`) commits it: the tree as it was when the pass began."""
    holder = subprocess.Popen(["sleep", "3600"], cwd=d.src)  # so the background run cannot commit
    try:
        d.ds("convert", "--live", d.src, "--yes", "--protector-name", "owner", stdin=PASSWORD)
        t0 = time.time()

        def status():
            return json.loads(d.ds("convert", "--status", "--json", d.src).stdout)
        while not (status().get("state") == "caught up" and "waiting" in status().get("live", "")):
            if time.time() - t0 > 1800:
                raise Failure(f"the live conversion never caught up: {status()}")
            time.sleep(1)
        stop_live_run(d.src)
        while status().get("running") is not False:
            time.sleep(0.5)
        live_changes(d.src)
        run(["sync"])  # the changes on the disk before it fails (else the disk, not the run, loses them)
        want = manifest(d.src)
        hold = os.path.join(d.work, "hold")
        rc, err = run_held(d, ["convert", "--live-worker", d.src], "after-record-catching-up", hold,
                           lambda: d.table([f"0 {d.sectors} flakey {d.loop} 0 0 3600 1 error_writes"]))
    finally:
        holder.kill()
        holder.wait()
    if rc == 0 or rc == 99 or "panicked" in err:
        raise Failure(f"the catch-up pass on failing writes did not stop with an error (status {rc}): {err.strip()[-300:]}")
    if d.src not in err or "keystore" in err:
        raise Failure(f"the error does not name the directory and what failed there: {err.strip()}")
    d.replug()
    got = manifest(d.src)
    if is_encrypted(d.src) or got != want:
        raise Lost(f"the directory changed when writes failed in the catch-up pass: {diff(want, got)}")
    d.ds("convert", "--scheduled")
    if not is_encrypted(d.src):
        raise Lost(f"{d.src} is not encrypted after the boot-time run committed it")
    d.ds("lock", d.src)
    d.ds("unlock", d.src, stdin=PASSWORD)
    got = manifest(d.src)
    if got != want:
        raise Lost(f"the committed tree differs from the tree when the pass began: {diff(want, got)}")


def faults(summary):
    """Disk faults on ext4 and f2fs, copy and move: a bad block in the original, failing writes
    for a while, and the device vanishing mid-run then coming back. Sampled runs leave out the
    repetitive combinations (--mode full runs them all)."""
    kinds = ["unreadable", "write-eio", "vanish"]
    cases = [(f, m, k) for f in FILESYSTEMS for m in CONVERT_MODES for k in kinds]
    if ARGS.mode != "full":
        cases = [c for c in cases if c[2] == "unreadable" or (c[2], c[1]) in (("write-eio", "copy"), ("vanish", "move"))]
    cases += [(f, ENOSPC_PHASES[p][0], f"enospc-{p}") for f, p in enospc_cases()]
    cases.append(("ext4", "copy", "live-write-eio"))
    if ARGS.cases:
        cases = [c for c in cases if ARGS.cases in "/".join(c)]
    n = lost = failed = 0
    for fstype, mode, kind in cases:
        name = f"faults[{fstype}/{mode}/{kind}]"
        t0 = time.time()
        d = None
        try:
            d = FaultDisk(f"/tmp/faults-{fstype}-{mode}-{kind}", fstype, mode)
            if kind.startswith("enospc-"):
                fault_enospc(d, kind[len("enospc-"):])
            elif kind == "unreadable":
                fault_unreadable(d)
            elif kind == "live-write-eio":
                fault_live(d)
            elif kind == "write-eio":
                fault_mid_run(d, [f"0 {d.sectors} flakey {d.loop} 0 0 3600 1 error_writes"], "failing writes")
            else:
                fault_mid_run(d, [f"0 {d.sectors} error"], "vanished device")
            say(f"{name}: ok ({time.time() - t0:.0f} s)")
        except Lost as e:
            lost += 1
            say(f"{name}: LOST: {e}")
        except Exception as e:  # noqa: BLE001 - one broken scenario must not hide the others
            failed += 1
            say(f"{name}: FAILED: {type(e).__name__}: {e}")
        finally:
            n += 1
            if d is not None:
                d.close()
    summary.append(f"faults: {n} scenarios, {lost} lost" + (f", {failed} failed" if failed else ""))
    return lost == 0 and failed == 0


# ---------------------------------------------------------------- faults: a full filesystem

# ENOSPC at each phase of a conversion: phase -> (mode, the fault point where the run is held
# while the filesystem is filled, whether the run is an abort of a move). The run is held there
# (DIRSEAL_FAULT_HOLD), a filler file takes every free block, the run goes on into the phase and
# must stop there, with a message saying to free space.
ENOSPC_PHASES = {
    "copy": ("copy", "after-record-copying", False),  # copying into staging
    "verify": ("copy", "after-record-copied", False),  # verification and its record
    "swap": ("copy", "after-record-verified", False),  # the exchange and its record
    "dispose": ("copy", "after-record-swapped", False),  # the disposing record, the old tree
    "move": ("move", "after-record-moving", False),  # moving files into staging
    "move-back": ("move", "after-record-moving-back", True),  # an abort moving them back
}
# Sampled runs take these (phase, filesystem) pairs (a failing copy, a record failing after the
# exchange, an abort moving back; a move filling up is also tests/move_mode.rs); --full takes
# every phase on both.
ENOSPC_SAMPLED = {("copy", "ext4"), ("swap", "f2fs"), ("move-back", "ext4")}


def enospc_cases():
    cases = [(f, p) for p in ENOSPC_PHASES for f in FILESYSTEMS]
    if ARGS.mode != "full":
        cases = [(f, p) for f, p in cases if (p, f) in ENOSPC_SAMPLED]
    return cases


def fill_up(mnt):
    """A root-owned file that takes every free block of the filesystem at `mnt` (root's reserve
    too): fallocate most of it, then write and sync until writes fail with ENOSPC and a sync
    frees no more (ext4's delayed allocation reserves more than it finally uses)."""
    path = os.path.join(mnt, "filler")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        st = os.statvfs(mnt)
        big = st.f_bfree * st.f_frsize - (8 << 20)
        if big > 0:
            try:
                os.posix_fallocate(fd, 0, big)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
        off = os.fstat(fd).st_size
        for _ in range(20):
            wrote = 0
            for size in (1 << 20, 4096):
                while True:
                    try:
                        n = os.pwrite(fd, bytes(size), off)
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        break
                    off += n
                    wrote += n
            try:
                os.fsync(fd)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
            if wrote == 0:
                break
    finally:
        os.close(fd)
    log(f"  filled {mnt}: {off >> 20} MiB filler, {os.statvfs(mnt).f_bfree} blocks free")
    return path


def run_held(d, args, point, hold, action):
    """Runs `dirseal ARGS` held at fault point `point` (first arrival): once it is there, calls
    `action`, then lets it go on. Returns (status, stderr)."""
    env = dict(d.ds.env, DIRSEAL_FAULT=point, DIRSEAL_FAULT_HOLD=hold)
    r, w = os.pipe()
    os.write(w, PASSWORD.encode())
    os.close(w)
    proc = subprocess.Popen([d.ds.bin, *args], stdin=r, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    os.close(r)
    t0 = time.time()
    held = False
    while proc.poll() is None and time.time() - t0 < 600:
        if os.path.exists(hold):
            held = True
            action()
            os.unlink(hold)
            break
        time.sleep(0.05)
    try:
        out, err = proc.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise Failure(f"dirseal {' '.join(args)} hung on the full filesystem")
    log(f"  {' '.join(args)} -> {proc.returncode}: {err.strip()[-600:]}")
    if not held:
        raise Failure(f"the run never reached {point} (status {proc.returncode}): {err.strip()[-300:]}")
    return proc.returncode, err


def fault_enospc(d, phase):
    """The filesystem fills up when the run reaches `phase`: the run stops with a message that
    says to free space (naming where), nothing is lost, and once the filler is removed the same
    command finishes (an abort: the plaintext is back) with the tree equal to the original."""
    mode, point, abort = ENOSPC_PHASES[phase]
    hold = os.path.join(d.work, "hold")  # outside the filesystem that fills up
    if abort:
        # A move part way (stopped once two originals are gone), then its abort, which fills up.
        env = dict(d.ds.env, DIRSEAL_FAULT="move-entry-removed:2")
        p = run([d.ds.bin, *d.convert_args()], check=False, stdin=PASSWORD, env=env)
        if p.returncode != 99:
            raise Failure(f"the move did not stop at its fault point (status {p.returncode})")
        args = ["convert", "--abort", d.src]
    else:
        args = d.convert_args()
    filler = []
    rc, err = run_held(d, args, point, hold, lambda: filler.append(fill_up(d.mnt)))
    if rc == 0:
        raise Failure(f"the run finished on a full filesystem: the {phase} phase wrote nothing")
    if rc == 99 or "panicked" in err:
        raise Failure(f"the run crashed instead of stopping with a message: {err.strip()[-300:]}")
    if "free some space" not in err or d.mnt not in err:
        raise Failure(f"the message does not say to free space on {d.mnt}: {err.strip()}")
    if CONVERT_MODES[mode][1] and phase in ("copy", "verify", "swap"):
        # Until the swap the original is untouched (after it the encrypted tree is in place,
        # checked by finishing below).
        if not is_encrypted(d.src):
            got = manifest(d.src)
            if got != d.manifest:
                raise Lost(f"the original changed on the full filesystem: {diff(d.manifest, got)}")
    os.unlink(filler[0])
    if not abort:
        d.finish(f"after space was freed ({phase})")
        return
    p = d.ds("convert", "--abort", d.src, check=False)
    if p.returncode != 0:
        raise Lost(f"the abort did not finish after space was freed: {p.stderr.strip()}")
    if is_encrypted(d.src):
        raise Lost(f"{d.src} is still encrypted after the abort")
    got = manifest(d.src)
    if got != d.manifest:
        raise Lost(f"the tree differs from the original after the abort: {diff(d.manifest, got)}")


# ---------------------------------------------------------------- f2fs


@contextlib.contextmanager
def f2fs_scratch(work, size):
    """A fresh encrypt-capable f2fs on a loop device, with a dirseal whose keystore is on it."""
    os.makedirs(work)
    img = os.path.join(work, "f2fs.img")
    with open(img, "wb") as f:
        f.truncate(size)
    dev = losetup(img)
    mnt = os.path.join(work, "mnt")
    try:
        run(["mkfs.f2fs", "-q", "-f", "-O", "encrypt", dev])
        mount(dev, mnt, "f2fs")
        yield dev, mnt, Dirseal(os.path.join(mnt, "keystore"), os.path.join(work, "etc"))
    finally:
        if os.path.ismount(mnt):
            run(["umount", "-l", mnt], check=False)
        run(["losetup", "-d", dev], check=False)


def f2fs(summary):
    with f2fs_scratch("/tmp/f2fs", 256 << 20) as (dev, mnt, ds):
        steps = []

        # encrypt an empty dir, fill it, lock: names become ciphertext; unlock with the password.
        d = os.path.join(mnt, "vault")
        os.mkdir(d)
        ds("encrypt", d, "--protector-name", "vault", stdin="vault pw\n")
        with open(os.path.join(d, "note.txt"), "w") as f:
            f.write("kept on f2fs")
        ds("lock", d)
        if "note.txt" in os.listdir(d):
            raise Failure("a locked directory shows its plaintext names")
        if ds("unlock", d, stdin="wrong\n", check=False).returncode == 0:
            raise Failure("a wrong password unlocked")
        ds("unlock", d, stdin="vault pw\n")
        if open(os.path.join(d, "note.txt")).read() != "kept on f2fs":
            raise Failure("contents differ after unlock")
        steps.append("encrypt")

        # convert a full tree, killed at a fault point first, resumed, then locked and unlocked.
        home = os.path.join(mnt, "home")
        make_tree(home, seed=2)
        want = manifest(home)
        env = dict(ds.env, DIRSEAL_FAULT="copy-file:7")
        crashed = run([ds.bin, "convert", home, "--yes", "--protector-name", "home"], check=False,
                      stdin="home pw\n", env=env)
        if crashed.returncode != 99:
            raise Failure(f"the fault point did not stop the conversion (status {crashed.returncode})")
        if manifest(home) != want:
            raise Failure("the interrupted conversion changed the original")
        ds("convert", home, "--yes", "--protector-name", "home", stdin="home pw\n")
        ds("lock", home)
        ds("unlock", home, stdin="home pw\n")
        got = manifest(home)
        if got != want:
            raise Failure(f"the converted tree differs: {diff(want, got)}")
        steps.append("convert")

        # A recovery key opens the directory when the keystore is gone.
        r = os.path.join(mnt, "rec")
        os.mkdir(r)
        out = ds("encrypt", r, "--protector-name", "rec", "--recovery-key", stdin="rec pw\n").stdout
        key = next(w for w in out.split() if len(w) == 55 and w.count("-") == 7)
        with open(os.path.join(r, "x"), "w") as f:
            f.write("recover me")
        ds("lock", r)
        ds("lock", home)
        os.rename(ds.env["DIRSEAL_KEYSTORE"], os.path.join(mnt, "keystore.lost"))
        ds("unlock", "--recovery", r, stdin=key + "\n")
        if open(os.path.join(r, "x")).read() != "recover me":
            raise Failure("recovery key unlock gave different contents")
        ds("recovery", "restore", r, "--protector-name", "fresh", stdin=f"{key}\nfresh pw\n")
        ds("lock", r)
        ds("unlock", r, stdin="fresh pw\n")
        steps.append("recovery")

        # Locks survive a remount (keys gone), and the moved-back keystore opens the tree again.
        umount(mnt)
        mount(dev, mnt, "f2fs")
        os.rename(os.path.join(mnt, "keystore"), os.path.join(mnt, "keystore.new"))
        os.rename(os.path.join(mnt, "keystore.lost"), ds.env["DIRSEAL_KEYSTORE"])
        if os.path.exists(os.path.join(home, "big.bin")):
            raise Failure("the tree is readable after a remount without unlocking")
        ds("unlock", home, stdin="home pw\n")
        if manifest(home) != want:
            raise Failure("the tree differs after remount and unlock")
        steps.append("lock/unlock")
        umount(mnt)
        p = run(["fsck.f2fs", dev], check=False)
        if p.returncode != 0:
            raise Failure(f"fsck.f2fs failed: {p.stdout.strip()[-400:]}")
        say(f"f2fs: {', '.join(steps)} passed")
        summary.append("f2fs: ok")
        return True


def tpm2(summary):
    """TPM2 protectors through the guest kernel's resource manager (the default TCTI), on f2fs."""
    if not os.path.exists("/dev/tpmrm0"):
        raise Failure("the guest has no /dev/tpmrm0 (is swtpm attached?)")
    with f2fs_scratch("/tmp/tpm2", 128 << 20) as (dev, mnt, ds):
        # A PIN protector needs the TPM's lockout owned (else anyone could reset the count of
        # wrong PINs); --yes: the reset code is printed, not typed back.
        # (Unless the power-cut TPM recording took it earlier in this guest.)
        already = json.loads(ds("tpm2", "status", "--json").stdout).get("lockout_owned")
        out = ds("tpm2", "setup", "--yes").stdout
        if not already and "reset code" not in out:
            raise Failure(f"tpm2 setup printed no reset code: {out.strip()}")
        status = json.loads(ds("tpm2", "status", "--json").stdout)
        if not status.get("lockout_owned"):
            raise Failure(f"the lockout is not owned after setup: {status}")
        d = os.path.join(mnt, "vault")
        os.mkdir(d)
        ds("encrypt", d, "--protector-type", "tpm2", "--protector-name", "tpm", stdin="2580\n")
        with open(os.path.join(d, "f"), "w") as f:
            f.write("sealed by the TPM")
        ds("lock", d)
        wrong = ds("unlock", d, stdin="1111\n", check=False)
        if wrong.returncode == 0 or "wrong TPM PIN" not in wrong.stderr:
            raise Failure(f"a wrong PIN was not refused as such: {wrong.stderr.strip()}")
        ds("unlock", d, stdin="2580\n")
        if open(os.path.join(d, "f")).read() != "sealed by the TPM":
            raise Failure("contents differ after unlock")
        home = os.path.join(mnt, "home")
        make_tree(home, seed=3)
        want = manifest(home)
        ds("convert", home, "--yes", "--protector-type", "tpm2", "--protector-name", "home", stdin="2580\n")
        ds("lock", home)
        ds("unlock", home, stdin="2580\n")
        got = manifest(home)
        if got != want:
            raise Failure(f"the converted tree differs: {diff(want, got)}")
        say("tpm2: encrypt, wrong PIN, unlock, convert through /dev/tpmrm0 passed")
        summary.append("tpm2: ok")
        return True


# ---------------------------------------------------------------- casefold


# The filesystems a Steam Deck's SD card or home may be: mkfs (both features at once; ext4 with
# project quotas too, for project ids), fsck that changes nothing.
CASEFOLD_FS = {
    "ext4": (["mkfs.ext4", "-q", "-F", "-b", "4096", "-O", "casefold,encrypt,project,quota,verity"], ["e2fsck", "-fn"]),
    "f2fs": (["mkfs.f2fs", "-q", "-f", "-O", "encrypt,casefold", "-C", "utf8"], ["fsck.f2fs", "-f", "--dry-run"]),
}

PAK = "compatdata/123/pfx/drive_c/Program Files/Game/Data.PAK"


def lsattr_of(root):
    """`lsattr -R -a -p` of the tree and `-d` of its root, sorted, the filesystem's own flags
    (E encrypted, I indexed, N inline data) blanked: what a conversion must keep."""
    text = run(["lsattr", "-d", "-p", root]).stdout + run(["lsattr", "-R", "-a", "-p", root]).stdout
    lines = []
    for line in text.splitlines():
        parts = line.split(None, 2)
        if len(parts) != 3 or parts[2].endswith("/.") or parts[2].endswith("/.."):
            continue
        flags = "".join("-" if c in "EIN" else c for c in parts[1])
        lines.append(f"{parts[0]} {flags} {parts[2]}")
    return sorted(lines)


def proton_prefix(home, project_ids):
    """A Proton-like prefix in a casefolded directory (+F set while it is empty, as Steam does),
    names in mixed case; a nodump cache; with `project_ids` (an ext4 with project quotas) a
    project id inherited by the prefix."""
    pfx = os.path.join(home, "compatdata/123/pfx")
    os.makedirs(pfx)
    run(["chattr", "+F", pfx])
    game = os.path.join(pfx, "drive_c/Program Files/Game")
    os.makedirs(game)
    with open(os.path.join(home, PAK), "wb") as f:
        f.write(bytes(range(256)) * 4096)
    with open(os.path.join(game, "Config.INI"), "w") as f:
        f.write("[Video]\nWidth=1280\n")
    os.makedirs(os.path.join(pfx, "drive_c/users/steamuser/Saved Games"))
    with open(os.path.join(pfx, "drive_c/users/steamuser/Saved Games/Slot1.SAV"), "w") as f:
        f.write("level 3")
    os.makedirs(os.path.join(home, ".cache"))
    run(["chattr", "+d", os.path.join(home, ".cache")])
    if project_ids:
        run(["chattr", "-p", "123", "+P", os.path.join(home, "compatdata/123")])
        run(["chattr", "-R", "-p", "123", os.path.join(home, "compatdata/123")])


def case_insensitive(home, what):
    """Every casefolded directory still finds names whatever their case."""
    for p, want in ((PAK.lower(), bytes(range(256)) * 4096),
                    ("compatdata/123/pfx/DRIVE_C/program files/GAME/config.ini", b"[Video]\nWidth=1280\n"),
                    ("compatdata/123/pfx/drive_c/USERS/SteamUser/saved games/slot1.sav", b"level 3")):
        try:
            with open(os.path.join(home, p), "rb") as f:
                got = f.read()
        except OSError as e:
            raise Failure(f"{what}: {p} is not found case-insensitively ({e})")
        if got != want:
            raise Failure(f"{what}: {p} reads differently")


def enable_verity(path):
    """FS_IOC_ENABLE_VERITY (sha256, 4 KiB blocks) on a file: what `fsverity enable` does."""
    fd = os.open(path, os.O_RDONLY)
    try:
        arg = struct.pack("<IIIIQIIQ11Q", 1, 1, 4096, 0, 0, 0, 0, 0, *([0] * 11))
        fcntl.ioctl(fd, 0x40806685, arg)
    finally:
        os.close(fd)


def casefold(summary):
    """A casefold+encrypt ext4 (with project ids) and a casefold f2fs: a Proton prefix goes
    through convert (crashed once, resumed), decrypt and a portable convert; after each,
    case-insensitive lookups work, lsattr (flags and project ids) and the manifest match, and
    fsck is clean."""
    for fs, (mkfs, fsck) in CASEFOLD_FS.items():
        work = f"/tmp/casefold-{fs}"
        os.makedirs(work)
        img = os.path.join(work, "fs.img")
        with open(img, "wb") as f:
            f.truncate(256 << 20)
        dev = losetup(img)
        mnt = os.path.join(work, "mnt")
        try:
            run([*mkfs, dev])
            mount(dev, mnt, fs)
            ds = Dirseal(os.path.join(work, "keystore"), os.path.join(work, "etc"))
            home = os.path.join(mnt, "deck")
            proton_prefix(home, project_ids=fs == "ext4")
            if fs == "ext4":
                # A flag no copy can have (fs-verity) stops the conversion before anything is
                # written, naming the file.
                sealed = os.path.join(home, "compatdata/123/pfx/drive_c/Signed.EXE")
                with open(sealed, "w") as f:
                    f.write("signed")
                enable_verity(sealed)
                p = ds("convert", home, "--yes", "--protector-name", "deck", stdin="deck pw\n", check=False)
                if p.returncode == 0 or "verity (+V)" not in p.stderr or "Signed.EXE" not in p.stderr:
                    raise Failure(f"ext4: a file with fs-verity was not refused by name: {p.stderr.strip()}")
                if os.path.exists(os.path.join(mnt, ".dirseal/convert")) and any(
                        os.scandir(os.path.join(mnt, ".dirseal/convert"))):
                    raise Failure("ext4: the refusal of a verity file wrote a work dir")
                os.remove(sealed)
            want, flags = manifest(home), lsattr_of(home)
            case_insensitive(home, f"{fs} before")

            def same(what):
                case_insensitive(home, what)
                if lsattr_of(home) != flags:
                    got = lsattr_of(home)
                    raise Failure(f"{what}: lsattr differs: {[l for l in got if l not in flags][:3]} "
                                  f"instead of {[l for l in flags if l not in got][:3]}")
                if manifest(home) != want:
                    raise Failure(f"{what}: {diff(want, manifest(home))}")

            env = dict(ds.env, DIRSEAL_FAULT="copy-dir-made:3")
            crashed = run([ds.bin, "convert", home, "--yes", "--protector-name", "deck"], check=False,
                          stdin="deck pw\n", env=env)
            if crashed.returncode != 99:
                raise Failure(f"{fs}: the fault point did not stop the conversion ({crashed.returncode})")
            ds("convert", home, "--yes", "--protector-name", "deck", stdin="deck pw\n")
            if "E" not in run(["lsattr", "-d", home]).stdout.split()[0]:
                raise Failure(f"{fs}: not encrypted after convert")
            same(f"{fs} convert")
            ds("lock", home)
            ds("unlock", home, stdin="deck pw\n")
            same(f"{fs} lock and unlock")
            ds("decrypt", home, "--yes")
            same(f"{fs} decrypt")
            ds("convert", home, "--yes", "--portable", "--protector-name", "card", stdin="card pw\n")
            same(f"{fs} convert --portable")
            # A new casefolded, encrypted directory made empty, then filled.
            fresh = os.path.join(mnt, "fresh")
            os.mkdir(fresh)
            run(["chattr", "+F", fresh])
            ds("encrypt", fresh, "--portable", "--protector-name", "fresh", stdin="fresh pw\n")
            with open(os.path.join(fresh, "Save.DAT"), "w") as f:
                f.write("new")
            if open(os.path.join(fresh, "save.dat")).read() != "new":
                raise Failure(f"{fs}: encrypt --portable lost casefolding")
            umount(mnt)
            p = run([*fsck, dev], check=False)
            if p.returncode != 0:
                raise Failure(f"{fs}: fsck failed: {(p.stdout + p.stderr).strip()[-400:]}")
        finally:
            if os.path.ismount(mnt):
                run(["umount", "-l", mnt], check=False)
            run(["losetup", "-d", dev], check=False)
        say(f"casefold: {fs}: convert (crash, resume), lock, unlock, decrypt, portable: lookups, lsattr, fsck ok")
    summary.append("casefold: ok")
    return True


def main():
    global ARGS, LOG
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", help="where dirseal and replay-log are")
    ap.add_argument("--out", help="where the summary and the log go")
    ap.add_argument("--mode", choices=["sampled", "full"], default="sampled")
    ap.add_argument("--only", choices=["powercut", "faults", "f2fs", "tpm2", "casefold"])
    ap.add_argument("--min-points", type=int, default=3,
                    help="sampled: fixed flush points per ext4 recording (half on f2fs), always replayed")
    ap.add_argument("--budget", type=int, default=60,
                    help="sampled: seconds for the power-cut replays after the fixed points (in the guest: of "
                         "those replayed there; on the host: of its own); more points are replayed while it lasts")
    ap.add_argument("--cases", help="only the recordings (fs/mode[/tpm2|/casefold|/live]) and fault scenarios (fs/mode/kind) whose name contains this (debugging)")
    ap.add_argument("--recordings", help="only these recordings (names, comma-separated: ext4/copy,ext4/copy/tpm2)")
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--export", help="guest: copy the recordings the host replays to this dir, a dir each")
    ap.add_argument("--tpm-state", help="guest: the host swtpm's state dir (default OUT/tpm)")
    ap.add_argument("--host-replay", metavar="DIR", help="on the host: replay the recordings exported to DIR")
    ap.add_argument("--binaries", help="host: replay only recordings whose `binaries` file says this")
    ap.add_argument("--jobs", type=int, default=os.cpu_count(), help="host: points replayed at a time")
    ap.add_argument("--scratch", help="host: where each point's disk is made (default: a new dir in /dev/shm, "
                    "removed at the end: copies, replays and the rerun's I/O stay in memory)")
    ap.add_argument("--list-recordings", action="store_true",
                    help="print each recording of the mode: its name, and host or guest (where it replays)")
    ARGS = ap.parse_args()
    if ARGS.list_recordings:
        for f, m, k in recording_runs():
            print(f"{f}/{m}{k.TAG} {'host' if k.on_host(f) else 'guest'}")
        return 0
    if not ARGS.bin or not ARGS.out:
        ap.error("--bin and --out are needed")
    ARGS.tpm_state = ARGS.tpm_state or os.path.join(ARGS.out, "tpm")
    if ARGS.host_replay:
        # The host's part of the power-cut test: its lines are added to the guest's summary.
        LOG = open(os.path.join(ARGS.out, "host.log"), "a")
        summary = []
        own_scratch = not ARGS.scratch
        if own_scratch:
            ARGS.scratch = tempfile.mkdtemp(prefix="dirseal-replay.", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        try:
            ok = host_replay(summary)
        except Failure as e:
            say(f"powercut on the host: FAILED: {e}")
            summary.append("powercut: FAILED")
            ok = False
        finally:
            if own_scratch:
                shutil.rmtree(ARGS.scratch, ignore_errors=True)
        with open(os.path.join(ARGS.out, "summary"), "a") as f:
            f.write("\n".join(summary) + "\n")
        return 0 if ok else 1
    LOG = open(os.path.join(ARGS.out, "guest.log"), "w")
    say(f"guest: sampling seed {ARGS.seed}")
    summary = []
    ok = True
    t0 = time.time()
    for name, fn in (("powercut", powercut), ("faults", faults), ("f2fs", f2fs), ("tpm2", tpm2), ("casefold", casefold)):
        if ARGS.only and ARGS.only != name:
            continue
        say(f"{name}: starting")  # the host's watchdog hears from the guest at each suite
        try:
            ok = fn(summary) and ok
        except Failure as e:
            say(f"{name}: FAILED: {e}")
            summary.append(f"{name}: FAILED")
            ok = False
    summary.append(f"guest: {time.time() - t0:.0f} s")
    with open(os.path.join(ARGS.out, "summary"), "w") as f:
        f.write("\n".join(summary) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
