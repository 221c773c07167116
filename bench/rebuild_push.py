"""Rebuild + push after a one-line code change: layered pipeline vs a naive single-stage Dockerfile.

Both use the same content (wheelhouse, runtime, example project, spec) and the same local
registry, the bench's own (127.0.0.1:5057, its data in the bench's scratch directory, stopped at
the end: the project's registry on 5000 is left alone), in the same run. Also prints cold-build figures recorded by the layered build and
uncompressed image sizes. Run: .venv/bin/python bench/rebuild_push.py   (takes ~15 min cold)
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scratch import SPEC, make_settings  # noqa: E402
from toolchain import pipeline  # noqa: E402
from toolchain.docker_client import engine  # noqa: E402
from toolchain.progress import Reporter, human_bytes  # noqa: E402
from toolchain.publish.push import push_image  # noqa: E402
from toolchain.publish.local_registry import start_local, stop_local  # noqa: E402

REGISTRY = "127.0.0.1:5057"  # the bench's own local registry

NAIVE = """FROM {base}
COPY . /src
RUN python3 -m venv /opt/venv && /opt/venv/bin/pip install --no-index --find-links /src/wheelhouse -r /src/wheelhouse/requirements.lock
ENV PATH=/opt/venv/bin:$PATH PYTHONPATH=/src CLUSTER_SPEC_PATH=/src/spec.json
"""


def naive_build(client, ctx: Path, tag: str) -> float:
    t0 = time.monotonic()
    for ev in client.api.build(path=str(ctx), tag=tag, rm=True, decode=True):
        if "error" in ev:
            raise RuntimeError(ev["error"])
    return time.monotonic() - t0


def main() -> None:
    import argparse
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    client = engine()
    rep = Reporter(quiet=True)
    work = Path(tempfile.mkdtemp(prefix="bench-"))
    app = work / "app"
    shutil.copytree(ROOT / "examples" / "train", app)
    s = make_settings(work / "w", app, registry_address=REGISTRY, runtime_dir=ROOT / "runtime")
    start_local(s, rep)
    try:
        run(client, rep, work, app, s)
    finally:  # the bench's own registry, images and files go with it
        stop_local(s)
        for ref in ("bench-naive:1", "bench-naive:2"):
            try:
                client.images.remove(ref, force=True)
            except Exception:  # noqa: BLE001 - not made (the bench stopped before)
                pass
        shutil.rmtree(work, ignore_errors=True)


def run(client, rep, work: Path, app: Path, s) -> None:
    first = pipeline.build(s, str(SPEC), "cpu", rep)["images"]["cpu"]
    pipeline.push(s, str(SPEC), "cpu", rep)

    # naive: one context with everything, COPY . then pip install
    wh = next(p for p in (ROOT / "build" / "wheelhouse").iterdir() if (p / "manifest.json").exists())
    ctx = work / "naive"
    shutil.copytree(wh, ctx / "wheelhouse", copy_function=__import__("os").link)
    shutil.copytree(ROOT / "runtime", ctx / "runtime")
    shutil.copytree(app, ctx / "project")
    shutil.copyfile(SPEC, ctx / "spec.json")
    (ctx / "Dockerfile").write_text(NAIVE.format(base=first["base_ref"]))
    naive_cold = naive_build(client, ctx, "bench-naive:1")
    # (no push of the cold naive image: after a change its one big layer is new anyway, so the
    #  push below uploads everything, exactly as it would with the old image in the registry)

    # the one-line change, applied to both (unique, so no earlier run's cache can serve it)
    marker = time.time_ns()
    for f in (app / "train.py", ctx / "project" / "train.py"):
        f.write_text(f.read_text() + f"# one-line change {marker}\n")
    t0 = time.monotonic()
    layered = pipeline.build(s, str(SPEC), "cpu", rep)["images"]["cpu"]
    layered_build = time.monotonic() - t0
    lp = pipeline.push(s, str(SPEC), "cpu", rep)["images"]["cpu"]["push"]
    naive_rebuild = naive_build(client, ctx, "bench-naive:2")
    np_ = push_image(client, "naive", client.images.get("bench-naive:2").id, f"{REGISTRY}/bench-naive", ["2"], 0, 0, rep)

    size = lambda ref: client.images.get(ref).attrs["Size"]  # noqa: E731
    print("one-line code change          layered        naive     ratio (naive/layered)")
    print(f"  rebuild seconds        {layered_build:10.2f} {naive_rebuild:12.2f} {naive_rebuild / layered_build:10.1f}x")
    print(f"  push seconds           {lp['seconds']:10.2f} {np_.seconds:12.2f} {np_.seconds / max(lp['seconds'], 1e-3):10.1f}x")
    print(f"  bytes uploaded         {lp['bytes_uploaded']:10d} {np_.bytes_uploaded:12d}")
    total_l, total_n = layered_build + lp["seconds"], naive_rebuild + np_.seconds
    print(f"  rebuild+push           {total_l:10.2f} {total_n:12.2f} {total_n / total_l:10.1f}x")
    print(f"naive cold build: {naive_cold:.1f}s")
    print(f"image size (uncompressed): cpu {human_bytes(size(layered['local_ref']))}, "
          f"base {human_bytes(size(first['base_ref']))}, naive {human_bytes(size('bench-naive:2'))}")


if __name__ == "__main__":
    main()
