"""A fresh runner's push: an image built on a runner with no blob cache (a fresh CI runner), pushed to
a registry that holds it from a previous push, against the same push that compresses every layer to
learn the blob digests the registry names them by (the way before toolchain/image/previous_image.py), in the
same run.

It pushes this checkout's last cpu build (build/build.json: run the README's main command first) to the
bench's own registry (127.0.0.1:5058, its data in a scratch directory, removed at the end), once to
fill it, then twice more, each time with an empty blob cache and an empty user cache.
Run: .venv/bin/python bench/fresh_runner_push.py   (about 2 minutes after a build)
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scratch import forget_pulls, make_settings  # noqa: E402
from toolchain import cache
from toolchain.publish import push  # noqa: E402
from toolchain.docker_client import engine  # noqa: E402
from toolchain.image.images import layer_store  # noqa: E402
from toolchain.progress import Reporter, human_bytes  # noqa: E402
from toolchain.records import read_builds  # noqa: E402
from toolchain.publish.local_registry import start_local, stop_local  # noqa: E402

REGISTRY = "127.0.0.1:5058"


def fresh_push(client, image_id: str, work: Path, name: str, rep: Reporter, store) -> tuple[float, push.PushResult]:
    """One push as a fresh runner makes it: its own empty user cache and blob cache."""
    os.environ[cache.ENV] = str(work / f"cache-{name}")
    t0 = time.monotonic()
    res = push.push_image(client, "cpu", image_id, f"{REGISTRY}/bench-fresh", ["cpu-latest"], 2, 0.5, rep, 300,
                          layer_store=store, blob_cache=work / f"blobs-{name}")
    return time.monotonic() - t0, res


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    build = read_builds(ROOT / "build").get("cpu")
    if build is None:
        sys.exit("no cpu build in build/build.json: run the README's main command first")
    client = engine()
    rep = Reporter(quiet=True)
    work = Path(tempfile.mkdtemp(prefix="bench-fresh-"))
    settings = make_settings(work / "w", ROOT / "examples" / "train", registry_address=REGISTRY,
                             runtime_dir=ROOT / "runtime")
    store = layer_store(ROOT / "build")
    start_local(settings, rep)
    load = os.getloadavg()[0]
    try:
        fresh_push(client, build.image_id, work, "fill", rep, store)  # the previous push
        ours_s, ours = fresh_push(client, build.image_id, work, "ours", rep, store)
        held_layers = push.held_layers
        push.held_layers = lambda reg, tags, rep: {}  # the baseline: compress every layer to learn its digest
        try:
            base_s, base = fresh_push(client, build.image_id, work, "baseline", rep, store)
        finally:
            push.held_layers = held_layers
    finally:
        stop_local(settings)
        forget_pulls(REGISTRY)
        shutil.rmtree(work, ignore_errors=True)
    print(f"fresh runner's push of {build.local_ref} (load {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)")
    print("| way | seconds | layers compressed | bytes compressed | uploaded |")
    print("| --- | --- | --- | --- | --- |")
    for way, s, r in (("ours (the previous image's layers paired)", ours_s, ours),
                      ("baseline (every layer compressed)", base_s, base)):
        print(f"| {way} | {s:.1f} | {r.layers_compressed} | {human_bytes(r.bytes_compressed)} | "
              f"{human_bytes(r.bytes_uploaded)} |")
    print(f"ratio ours / baseline: {ours_s / base_s:.3f}")


if __name__ == "__main__":
    main()
