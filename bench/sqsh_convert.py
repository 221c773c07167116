"""enroot .sqsh conversion of an image vs `mksquashfs` alone on the already extracted tree.

Run: .venv/bin/python bench/sqsh_convert.py [--image raytrain-cpu:cpu-latest] [--comp lzo]
Same image, same options, same run: (1) deploy.enroot.convert end to end (docker export streamed
through a tar filter into sqfstar: nothing extracted to disk); (2) the tree extracted, then only
mksquashfs timed on it (the baseline); (3) convert again (cache hit); (4) with --extract-path also
the fallback converter (extract + mksquashfs). Prints seconds and ratio (1)/(2). Target: <= 1.3.
"""
from __future__ import annotations

import argparse
import shutil
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
    ap.add_argument("--comp", default="lzo", help="lzo (enroot's default) or zstd, gzip, ...")
    ap.add_argument("--extract-path", action="store_true", help="also time the extract + mksquashfs fallback")
    args = ap.parse_args()
    options = ("-comp", args.comp, "-noD") if args.comp == "lzo" else ("-comp", args.comp)
    client = docker.from_env(timeout=900)
    img = client.images.get(args.image)
    work = Path(tempfile.mkdtemp(prefix="sqsh-bench-", dir=ROOT / "build"))
    try:
        res = enroot.convert(client, args.image, work / "out", options=options, stream=True)
        size = res.path.stat().st_size
        print(f"convert {args.image} ({img.attrs['Size'] / 2**30:.2f} GiB, {' '.join(options)}), streamed to sqfstar: "
              f"{res.seconds:.1f} s -> {size / 2**30:.2f} GiB")
        if args.extract_path:
            alt = enroot.convert(client, args.image, work / "alt", options=options, stream=False)
            print(f"fallback convert (extract {alt.export_seconds:.1f} s + mksquashfs {alt.squash_seconds:.1f} s): "
                  f"{alt.seconds:.1f} s")
            shutil.rmtree(work / "alt")
        tree = work / "tree"
        tree.mkdir()
        enroot.export_rootfs(client, img.id, tree)
        enroot.configure(tree, img.attrs["Config"])
        t0 = time.monotonic()
        enroot.mksquashfs(tree, work / "baseline.sqsh", options)
        base = time.monotonic() - t0
        print(f"mksquashfs alone on the extracted tree: {base:.1f} s")
        print(f"ratio convert / mksquashfs alone: {res.seconds / base:.2f} (target <= 1.3)")
        again = enroot.convert(client, args.image, work / "out", options=options)
        print(f"second conversion of the same digest: {again.seconds * 1000:.1f} ms (cached: {again.cached})")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
