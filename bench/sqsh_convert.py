"""enroot .sqsh conversion of an image vs `mksquashfs` alone on the same tree, and vs a real enroot.

Run: .venv/bin/python bench/sqsh_convert.py [--image raytrain-cpu:cpu-latest] [--scratch DIR]
Same image, same options, same run:
  (1) deploy.targets.pyxis.sqsh.convert end to end (docker export -> tar -x -> permission fix-up -> the four
      enroot files -> mksquashfs), with its phases;
  (2) the baseline: mksquashfs alone, timed on the tree (1) squashed, re-extracted the same way;
  (3) `enroot import dockerd://IMAGE` when an `enroot` command is installed (ENROOT_* from the env);
  (4) convert again (cache hit);
  (5) the incremental path (deploy/targets/pyxis/enroot_incremental.py) on a copy of the example project, built
      as `invoke build` does: the first conversion squashes the lower layers into the cache, then a
      one-line change to train.py is rebuilt and converted again (target < 10 s), against (1);
  (6) what must cross the network to a cluster that holds the previous .sqsh: the 1 MiB blocks
      that differ, and what `rsync --inplace --no-whole-file` sends onto a copy of the previous file.
Prints seconds and the ratios (1)/(2) (target <= 1.3), (1)/(3) and (1)/(5).
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

from bench.scratch import SPEC, make_settings  # noqa: E402
from deploy.targets.pyxis import enroot, sqsh  # noqa: E402
from toolchain import pipeline  # noqa: E402
from toolchain.image.images import LAYER_STORE  # noqa: E402
from toolchain.progress import Reporter  # noqa: E402


def differing_bytes(a: Path, b: Path, block: int = 1 << 20) -> int:
    """Bytes in the 1 MiB blocks where the two files differ (the superblock's block among them)."""
    n = 0
    with open(a, "rb") as fa, open(b, "rb") as fb:
        while True:
            x, y = fa.read(block), fb.read(block)
            if not x and not y:
                return n
            if x != y:
                n += max(len(x), len(y))


def incremental(client, work: Path, full_seconds: float) -> None:
    app = work / "app"
    shutil.copytree(ROOT / "examples" / "train", app)
    s = make_settings(work / "w", app, runtime_dir=ROOT / "runtime")
    rep = Reporter(quiet=True)
    store, out = s.build_dir / LAYER_STORE, work / "inc"
    ref = pipeline.build(s, str(SPEC), "cpu", rep)["images"]["cpu"]["local_ref"]
    said: list[str] = []
    first = sqsh.convert(client, ref, out, layer_store=store, progress=said.append)
    print(f"(5) incremental, first image (lower layers squashed into the cache): {first.seconds:.1f} s "
          f"= cache {first.export_seconds:.1f} s + stage/append {first.squash_seconds:.1f} s [{first.how}]")
    print(f"    {next((p for p in said if p.startswith('incremental')), '')} (no spare yet: what a change costs "
          "when the next one comes before the background copy is done)")
    t0 = time.monotonic()
    while not list(out.glob(".lower/*/spare-*.sqsh")) and time.monotonic() - t0 < 600:
        time.sleep(0.5)  # the developer edits code meanwhile
    print(f"    the spare copy for the next change was ready {time.monotonic() - t0:.1f} s later (in the background)")

    (app / "train.py").write_text((app / "train.py").read_text() + f"# one-line change {time.time_ns()}\n")
    t0 = time.monotonic()
    ref2 = pipeline.build(s, str(SPEC), "cpu", rep)["images"]["cpu"]["local_ref"]
    build_s = time.monotonic() - t0
    phases: list[str] = []
    second = sqsh.convert(client, ref2, out, layer_store=store, progress=phases.append)
    print(f"    after a one-line change: rebuild {build_s:.2f} s, .sqsh {second.seconds:.2f} s [{second.how}] "
          f"(target < 10 s); ratio (1)/(5): {full_seconds / second.seconds:.1f}x faster")
    print(f"    {next((p for p in phases if p.startswith('incremental')), '')}")
    size, diff = second.path.stat().st_size, differing_bytes(first.path, second.path)
    print(f"(6) new .sqsh {size / 2**30:.2f} GiB; 1 MiB blocks that differ from the previous one: "
          f"{diff / 2**20:.0f} MiB")
    if shutil.which("rsync"):  # the cluster holds the previous image: copy it there, then delta-transfer
        shared = work / "shared"
        shared.mkdir()
        os.rename(first.path, shared / second.path.name)  # the cluster's copy of the previous image
        t0 = time.monotonic()
        proc = subprocess.run(["rsync", "-I", "--inplace", "--no-whole-file", "--stats", str(second.path),
                               f"{shared}/"], capture_output=True, text=True)
        stats = [l for l in proc.stdout.splitlines() if l.startswith(("Literal data", "Total bytes sent"))]
        print(f"    rsync -I --inplace --no-whole-file onto a copy of the previous .sqsh: {'; '.join(stats) or proc.stderr}"
              f" ({time.monotonic() - t0:.1f} s)")
        shutil.rmtree(shared)
    else:
        print("    (rsync is not installed: no rsync figure)")
        first.path.unlink()
    second.path.unlink()


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
        res = sqsh.convert(client, img.id, work / "out", options=options)  # by ID: a rebuild meanwhile moves the tag
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
        (work / "baseline.sqsh").unlink()  # disk: every file here is the whole image
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
        again = sqsh.convert(client, img.id, work / "out", options=options)  # by ID: a rebuild meanwhile moves the tag
        print(f"(4) second conversion of the same digest: {again.seconds * 1000:.1f} ms (cached: {again.cached})")
        shutil.rmtree(work / "out")
        incremental(client, work, res.seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
