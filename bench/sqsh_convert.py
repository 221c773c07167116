"""enroot .sqsh conversion of an image vs `mksquashfs` alone on the same tree, and vs a real enroot.

Run: .venv/bin/python bench/sqsh_convert.py [--image raytrain-cpu:cpu-latest] [--scratch DIR]
Same image, same options, same run:
  (1) deploy.enroot.convert end to end (docker export -> tar -x -> permission fix-up -> the four
      enroot files -> mksquashfs), with its phases;
  (2) the baseline: mksquashfs alone, timed on the tree (1) squashed, re-extracted the same way;
  (3) `enroot import dockerd://IMAGE` when an `enroot` command is installed (ENROOT_* from the env);
  (4) convert again (cache hit).
Prints seconds and the ratios (1)/(2) (target <= 1.3) and (1)/(3).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import docker

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from deploy import enroot  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default="raytrain-cpu:cpu-latest")
    ap.add_argument("--scratch", default=str(ROOT / "build"), help="where the trees are extracted")
    args = ap.parse_args()
    client = docker.from_env(timeout=900)
    img = client.images.get(args.image)
    work = Path(tempfile.mkdtemp(prefix="sqsh-bench-", dir=args.scratch))
    options = enroot.ENROOT_DEFAULT_OPTIONS
    try:
        res = enroot.convert(client, args.image, work / "out", options=options)
        size = res.path.stat().st_size
        print(f"(1) convert {args.image} ({img.attrs['Size'] / 2**30:.2f} GiB, {' '.join(options)}): "
              f"{res.seconds:.1f} s = export+extract+fix-up {res.export_seconds:.1f} s + mksquashfs "
              f"{res.squash_seconds:.1f} s -> {size / 2**30:.2f} GiB")
        tree = work / "tree"
        enroot.make_rootfs(client, img.id, img.attrs["Config"], tree)
        t0 = time.monotonic()
        enroot.mksquashfs(tree, work / "baseline.sqsh", options)
        base = time.monotonic() - t0
        shutil.rmtree(tree)
        print(f"(2) mksquashfs alone on the same tree: {base:.1f} s")
        print(f"    ratio (1)/(2): {res.seconds / base:.2f} (target <= 1.3)")
        if shutil.which("enroot"):
            out = work / "enroot.sqsh"
            t0 = time.monotonic()
            proc = subprocess.run(["enroot", "import", "-o", str(out), f"dockerd://{args.image}"],
                                  capture_output=True, text=True, env={**os.environ, "TMPDIR": str(work)})
            real = time.monotonic() - t0
            if proc.returncode == 0:
                print(f"(3) enroot import dockerd://: {real:.1f} s; ratio (1)/(3): {res.seconds / real:.2f}")
            else:
                print(f"(3) enroot import failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
        else:
            print("(3) enroot is not installed here: no comparison with a real enroot import")
        again = enroot.convert(client, args.image, work / "out", options=options)
        print(f"(4) second conversion of the same digest: {again.seconds * 1000:.1f} ms (cached: {again.cached})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
