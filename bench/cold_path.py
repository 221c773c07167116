"""The cold path: the dependency layer and the first push of the ~7 GB image, the old way and the new, in one run.

  old dependency layer  the builder path this project used before issue 32 (OLD_DEPS below, as it was in
                        dockerfiles/deps.Dockerfile.j2): `pip install --no-index` from the wheelhouse in a builder
                        container, then `COPY --from` the venv into the final stage, built without cache;
  new build             `pipeline.build` of a scratch copy of the project from the same base and wheelhouse:
                        one layer per wheel written from the wheels and loaded as they are done, each wheel's
                        bytecode compiled meanwhile, the user stage built beside them, app and spec
                        (toolchain/image/images.py, toolchain/image/deps_stage.py, toolchain/image/venv_layer.py, toolchain/image/bytecode.py);
  old push              the engine's `docker push` of that image to an empty registry (gzip on one core);
  new push              `pipeline.push` of the same image to another empty registry, from an empty blob cache, so
                        its compression is counted; stored layers upload while compressed (toolchain/publish/push.py,
                        toolchain/publish/blobs.py).

Each step starts after a sync: what the step before left in the page cache is written back first, off the clock
(the old path leaves 14 GB); each dependency-layer step also starts with the wheels read through, cached as right after
their download. Both registries are the bench's own (127.0.0.1:5058 and :5059, data under the bench's scratch directory) and are
stopped and deleted at the end, with the bench's images and files. Preconditions: the wheelhouse is downloaded and
the base image exists (the README's main command made both). Needs about 24 GB free on the build directory's disk (each step's files go before the next).
Run: .venv/bin/python bench/cold_path.py    (20-40 minutes on 2 cores; prints its own conditions: load, cores)
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.scratch import SPEC, make_settings  # noqa: E402
from toolchain import pipeline  # noqa: E402
from toolchain.image.bootstrap import ensure_base  # noqa: E402
from toolchain.docker_client import engine  # noqa: E402
from toolchain.image.images import IMAGE_PATH, PROFILE_SCRIPT, Builder, profile_script  # noqa: E402
from toolchain.progress import Reporter, human_bytes  # noqa: E402
from toolchain.publish.local_registry import start_local, stop_local  # noqa: E402
from toolchain.wheels.wheelhouse import LOCK, Wheelhouse, ensure_wheelhouse  # noqa: E402
from runtime.contract import APP_ROOT, IMAGE_PYTHONPATH  # noqa: E402

OLD_REGISTRY, NEW_REGISTRY = "127.0.0.1:5058", "127.0.0.1:5059"
NEED_FREE = 24 << 30  # the old builder stage and its copy (14 GB), or the venv tar and its import
REPO = "bench-cold"

OLD_DEPS = """FROM {base} AS install
COPY wheelhouse /tmp/wheelhouse
RUN {python} -m venv /opt/venv \\
 && /opt/venv/bin/pip install --no-index --no-cache-dir --disable-pip-version-check \\
      --find-links /tmp/wheelhouse -r /tmp/wheelhouse/requirements.lock

FROM {base}
RUN groupadd --gid {gid} {user} \\
 && useradd --create-home --uid {uid} --gid {gid} --shell /bin/bash {user} \\
 && mkdir -p {app_root}/project
COPY --from=install /opt/venv /opt/venv
COPY {profile} /etc/profile.d/{profile}
ENV PATH={path} VIRTUAL_ENV=/opt/venv PYTHONPATH={pythonpath} PYTHONDONTWRITEBYTECODE=1
WORKDIR {app_root}/project
USER {uid}:{gid}
"""


def bench_spec(work: Path) -> Path:
    """The local spec with the bench's own image names, so the project's tags are left alone."""
    spec = json.loads(SPEC.read_text())
    spec.update(cpu_image=f"{REPO}-cpu", gpu_image=f"{REPO}-gpu")
    path = work / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def settings_for(work: Path, app: Path, address: str, base_ref: str, data: str):
    s = make_settings(work / "w", app, registry_address=address, runtime_dir=ROOT / "runtime")
    image = s.image.model_copy(update={"repository": REPO, "base_image": base_ref})
    registry = s.registry.model_copy(update={"data_dir": str(work / data)})
    return s.model_copy(update={"image": image, "registry": registry})


def old_deps(client, s, base_ref: str, wheelhouse: Wheelhouse, ctx: Path, tag: str) -> float:
    (ctx / "wheelhouse").mkdir(parents=True)
    for f in [*wheelhouse.files, wheelhouse.path / LOCK]:
        shutil.copy(f, ctx / "wheelhouse" / f.name)
    (ctx / PROFILE_SCRIPT).write_text(profile_script())
    u = s.image.user
    (ctx / "Dockerfile").write_text(OLD_DEPS.format(
        base=base_ref, python=s.image.python, uid=u.uid, gid=u.gid, user=u.name, app_root=APP_ROOT,
        profile=PROFILE_SCRIPT, path=IMAGE_PATH, pythonpath=IMAGE_PYTHONPATH))
    t0 = time.monotonic()
    for ev in client.api.build(path=str(ctx), tag=tag, rm=True, forcerm=True, nocache=True, decode=True):
        if "error" in ev:
            raise RuntimeError(ev["error"])
    return time.monotonic() - t0


def engine_push(client, image_id: str, target: str, tag: str) -> float:
    client.api.tag(image_id, target, tag)
    t0 = time.monotonic()
    for ev in client.api.push(target, tag=tag, stream=True, decode=True):
        if "error" in ev:
            raise RuntimeError(ev["error"])
    return time.monotonic() - t0


def cpu_times() -> list[int]:
    """The machine's CPU time so far, by kind (/proc/stat: user nice system idle iowait irq softirq steal)."""
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:9]]


def conditions(since: list[int] | None = None) -> str:
    """Cores and load; with SINCE (cpu_times at a phase's start), how the CPUs spent the phase: busy, waiting
    for the disk, and stolen by the hypervisor (time this VM's cores were not given to it)."""
    load = os.getloadavg()
    out = f"{os.cpu_count()} cores, load {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}"
    if since is not None:
        d = [b - a for a, b in zip(since, cpu_times())]
        total = max(sum(d), 1)
        out += (f"; CPU busy {100 * (d[0] + d[1] + d[2] + d[5] + d[6]) / total:.0f}%, iowait {100 * d[4] / total:.0f}%, "
                f"steal {100 * d[7] / total:.0f}%")
    return out


def settle(before: str, wheelhouse: Wheelhouse | None = None) -> None:
    """Write back what the last step left in the page cache before the next step's clock starts, so that
    one step's writeback is not charged to the next (the old builder path leaves 14 GB behind it); with
    WHEELHOUSE, read its wheels through first, so both dependency-layer steps find them cached as right
    after their download (the old path's 14 GB evict part of them: 5-8 s more for the venv's writer)."""
    t0 = time.monotonic()
    os.sync()
    warmed = 0
    for wheel in wheelhouse.files if wheelhouse is not None else []:
        with open(wheel, "rb") as f:
            while block := f.read(1 << 20):
                warmed += len(block)
    print(f"  (before {before}: sync" + (f" and {human_bytes(warmed)} of wheels read" if wheelhouse else "")
          + f", {time.monotonic() - t0:.1f}s)", flush=True)


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    client = engine()
    build_root = ROOT / "build"
    build_root.mkdir(exist_ok=True)
    free = shutil.disk_usage(build_root).free
    if free < NEED_FREE:
        sys.exit(f"cold_path: {human_bytes(free)} free on {build_root}'s disk, the bench needs {human_bytes(NEED_FREE)}; "
                 "free some space (docker image prune, old build directories) and run it again")
    work = Path(tempfile.mkdtemp(prefix="bench-cold-", dir=build_root))
    app = work / "app"
    shutil.copytree(ROOT / "examples" / "train", app)
    rep = Reporter()
    base = ensure_base(client, make_settings(work / "base", app), rep)  # the project's base, as the main command made it
    spec = bench_spec(work)
    old_s = settings_for(work, app, OLD_REGISTRY, base.ref, "registry-old")
    new_s = settings_for(work, app, NEW_REGISTRY, base.ref, "registry-new")
    made: list[str] = []
    try:
        print(f"before: {conditions()}", flush=True)
        old_ref = f"{REPO}-old-deps:1"
        made.append(old_ref)
        wheelhouse = ensure_wheelhouse(old_s, "cpu", Builder(client, old_s, Reporter(quiet=True)).python(base).minor,
                                       Reporter(quiet=True))
        settle("the old dependency layer", wheelhouse)
        c0 = cpu_times()
        t_old = old_deps(client, old_s, base.ref, wheelhouse, work / "old-ctx", old_ref)
        print(f"old dependency layer: {t_old:.0f}s ({conditions(c0)})", flush=True)
        client.images.remove(old_ref, force=True)  # 14 GB with its builder stage: gone before the next step
        client.images.prune(filters={"dangling": True})
        shutil.rmtree(work / "old-ctx", ignore_errors=True)

        settle("the new build", wheelhouse)
        t0, c0 = time.monotonic(), cpu_times()
        built = pipeline.build(new_s, str(spec), "cpu", rep)["images"]["cpu"]
        t_new = time.monotonic() - t0
        made += [built["local_ref"], built["human_ref"], built["deps_ref"], built["app_ref"], built["user_ref"]]
        print(f"new build (user, venv, deps, app, spec): {t_new:.0f}s ({conditions(c0)})", flush=True)

        start_local(old_s, rep)
        target = f"{OLD_REGISTRY}/{REPO}-cpu"
        made.append(f"{target}:old")
        settle("the engine's push")
        c0 = cpu_times()
        t_epush = engine_push(client, built["image_id"], target, "old")
        print(f"engine push: {t_epush:.0f}s ({conditions(c0)})", flush=True)
        stop_local(old_s)
        shutil.rmtree(old_s.registry.data_dir, ignore_errors=True)  # 4 GB of blobs, not needed any more

        settle("the new push")
        t0, c0 = time.monotonic(), cpu_times()
        pushed = pipeline.push(new_s, str(spec), "cpu", rep)["images"]["cpu"]["push"]
        t_npush = time.monotonic() - t0
        print(f"new push: {t_npush:.0f}s ({conditions(c0)})", flush=True)

        size = client.images.get(built["image_id"]).attrs["Size"]
        print(f"\nimage {built['local_ref']}: {human_bytes(size)} uncompressed; {human_bytes(pushed['bytes_uploaded'])} "
              "uploaded by the new push")
        print("                         old        new    old/new")
        print(f"  dependency layer  {t_old:8.0f}s {t_new:9.0f}s {t_old / t_new:9.1f}x   (new: the whole build from the base)")
        print(f"  push              {t_epush:8.0f}s {t_npush:9.0f}s {t_epush / t_npush:9.1f}x")
        print(f"  both              {t_old + t_epush:8.0f}s {t_new + t_npush:9.0f}s "
              f"{(t_old + t_epush) / (t_new + t_npush):9.1f}x")
        print(f"after: {conditions()}")
    finally:  # the bench's registries, images and files go with it
        for s in (old_s, new_s):
            stop_local(s)
        for ref in reversed(made):
            try:
                client.images.remove(ref, force=True)
            except Exception:  # noqa: BLE001 - not made (the bench stopped before), or gone with another tag
                pass
        for repo in (f"{REPO}-stages", f"{REPO}-cpu"):
            # only the bench's tags: an image the engine's build cache shares with the project (the user
            # stage) keeps the project's
            for ref in [t for img in client.images.list(name=repo) for t in img.tags if t.startswith(f"{repo}:")]:
                client.images.remove(ref, force=True)
        client.images.prune(filters={"dangling": True})
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
