"""Test trees for the conversion benchmarks (scripts/bench-convert.sh, scripts/syscalls-convert.sh):
the same seeded shape in both, so their figures describe the same kind of tree."""
import os


def small_files(rnd, root, n, mx):
    """n small files of 100..mx bytes (mx if smaller) under root, as a home's caches and
    documents lie: two thirds under .cache, 200 a directory, seven subdirectories each."""
    for i in range(n):
        d = os.path.join(root, ".cache" if i % 3 else "Documents", f"d{i // 200}", f"e{i % 7}")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"f{i}.txt"), "wb") as f:
            f.write(rnd.randbytes(rnd.randint(min(100, mx), mx)))
