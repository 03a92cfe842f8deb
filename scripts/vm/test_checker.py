#!/usr/bin/env python3
"""The power-cut checker against planted damage (scripts/test.sh runs it; root, the host's ext4).

scripts/vm/guest.py's check of a power-cut point (Recording.check_point: fsck, the state before
the rerun, the rerun, lock/unlock, the manifest, leftovers, fsck again) is the one the host and the
guest run on every replayed point. Here it checks real images made with the dirseal under test:
the tree before the conversion and after it, untouched (the check must pass: it can), then with
damage planted behind dirseal's back, each of which must fail the check: a changed byte (its
mtime put back), a missing file, a wrong mode, a stray plaintext copy beside the tree and one left
in the work dir, and a changed byte in the plaintext before the conversion.

    scripts/vm/test_checker.py --bin target/debug    prints `checker: N plantings caught, M missed`
"""
import argparse
import os
import shutil
import sys
import tempfile

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import guest  # noqa: E402 - after the path it is found on


def changed_byte(rec, mnt):
    p = os.path.join(rec.src, "big.bin")
    st = os.stat(p)
    with open(p, "r+b") as f:
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 0x40]))
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


def missing_file(rec, mnt):
    rel = next(k for k, e in sorted(rec.manifest.items()) if e.get("size") and "link" not in e)
    p = os.path.join(rec.src, rel)
    st = os.stat(os.path.dirname(p))
    os.unlink(p)
    os.utime(os.path.dirname(p), ns=(st.st_atime_ns, st.st_mtime_ns))  # only the file is missing


def wrong_mode(rec, mnt):
    p = os.path.join(rec.src, "big.bin")
    st = os.stat(p)
    os.chmod(p, (st.st_mode & 0o7777) ^ 0o004)
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))


def stray_copy(rec, mnt):
    shutil.copy2(os.path.join(rec.src, "big.bin"), os.path.join(os.path.dirname(rec.src), "big.bin"))


def stray_in_work_dir(rec, mnt):
    wd = os.path.join(mnt, ".dirseal", "convert", "0123456789abcdef", "staging")
    os.makedirs(wd)
    shutil.copy2(os.path.join(rec.src, "big.bin"), wd)


# (name, which image it is planted in, how); the encrypted tree is unlocked first.
PLANTINGS = [
    ("changed byte", "done", changed_byte),
    ("missing file", "done", missing_file),
    ("wrong mode", "done", wrong_mode),
    ("stray plaintext copy beside the tree", "done", stray_copy),
    ("stray plaintext copy in the work dir", "done", stray_in_work_dir),
    ("changed byte before the conversion", "plain", changed_byte),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="where dirseal is")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="dirseal-checker.")
    guest.ARGS = argparse.Namespace(bin=os.path.abspath(args.bin), min_points=3)
    guest.LOG = open(os.path.join(tmp, "log"), "w")
    rec = guest.Recording(os.path.join(tmp, "work"), "ext4", "copy")
    images = {"plain": os.path.join(tmp, "plain.img"), "done": os.path.join(tmp, "done.img")}
    caught = missed = 0
    try:
        with open(images["plain"], "wb") as f:
            f.truncate(rec.size)
        dev = guest.losetup(images["plain"])
        try:
            guest.run([*rec.mkfs, dev])
            guest.mount(dev, rec.mnt)
            os.makedirs(os.path.dirname(rec.src))
            guest.make_tree(rec.src, seed=14)
            rec.manifest = guest.manifest(rec.src)
            guest.umount(rec.mnt)
            guest.run(["cp", "--sparse=always", images["plain"], images["done"]])
        finally:
            guest.run(["losetup", "-d", dev], check=False)
        dev = guest.losetup(images["done"])
        try:
            guest.mount(dev, rec.mnt)
            rec.ds(*rec.convert_args(), stdin=rec.secret)
            guest.umount(rec.mnt)
        finally:
            guest.run(["losetup", "-d", dev], check=False)

        def check(image, what):
            scratch = os.path.join(tmp, "point.img")
            guest.run(["cp", "--sparse=always", image, scratch])
            try:
                return rec.check_point(0, scratch)
            finally:
                os.unlink(scratch)

        # Untouched, both pass: the check can pass, so its failures below mean something.
        for kind, want in (("plain", "plaintext"), ("done", "encrypted")):
            got = check(images[kind], kind)
            if got != want:
                raise guest.Failure(f"the untouched {kind} image was found {got}, not {want}")
        for name, kind, plant in PLANTINGS:
            img = os.path.join(tmp, "damaged.img")
            guest.run(["cp", "--sparse=always", images[kind], img])
            dev = guest.losetup(img)
            try:
                guest.mount(dev, rec.mnt)
                if kind == "done":
                    rec.ds("unlock", rec.src, stdin=rec.secret)
                plant(rec, rec.mnt)
                guest.umount(rec.mnt)
            finally:
                guest.run(["losetup", "-d", dev], check=False)
            try:
                state = check(img, name)
                missed += 1
                print(f"checker: MISSED: {name} (the point was found {state} and fine)")
            except guest.Failure as e:
                caught += 1
                print(f"checker: caught {name}: {str(e)[:160]}")
            os.unlink(img)
    except guest.Failure as e:
        print(f"checker: FAILED: {e} (log: {tmp}/log)")
        return 1
    finally:
        if os.path.ismount(rec.mnt):
            guest.run(["umount", "-l", rec.mnt], check=False)
    print(f"checker: {caught} plantings caught, {missed} missed")
    if missed == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        return 0
    print(f"checker: log in {tmp}/log")
    return 1


if __name__ == "__main__":
    sys.exit(main())
